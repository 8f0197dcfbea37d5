"""The twistd entry: ``twistd -n gateway -c config.yaml``.

SIGHUP reloads the config file, as under ``gateway run``. For JSON log
lines, give twistd ``--logger gateway.logs.json_observer``.
"""
from twisted.application.service import IServiceMaker
from twisted.plugin import IPlugin
from twisted.python import usage
from zope.interface import implementer


class Options(usage.Options):
    optParameters = [["config", "c", "config.yaml", "path to config.yaml"]]

    def postOptions(self):
        from gateway.config import ConfigError, load_config
        from gateway.dialects import find_dialects
        self.dialects = find_dialects()
        try:
            self.gateway_config = load_config(self["config"], self.dialects)
        except ConfigError as e:
            raise usage.UsageError(f"bad config: {e}")


@implementer(IServiceMaker, IPlugin)
class GatewayServiceMaker:
    tapname = "gateway"
    description = "Multi-protocol log gateway (TANK, Kafka 0.8, Figg, Pravega, RustLog)"
    options = Options

    def makeService(self, options):
        from twisted.internet import reactor

        from gateway.service import GatewayService, install_reload_signal
        service = GatewayService(options.gateway_config, reactor, options.dialects)
        install_reload_signal(service, reactor)
        return service


serviceMaker = GatewayServiceMaker()
