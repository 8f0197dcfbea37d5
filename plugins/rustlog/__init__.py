"""The RustLog dialect: the seed's JSON protocol, plus the real broker's
binary format on the same listener (protocols/rustlog.md).

Listener options: ``binary`` (default true) also accepts the binary variant,
told apart from JSON frame by frame by the first payload byte.
"""
from twisted.plugin import IPlugin
from zope.interface import implementer

from gateway.config import check_keys, opt_bool
from gateway.interfaces import IDialect


@implementer(IPlugin, IDialect)
class RustLogDialect:
    name = "rustlog"
    formats = {}

    def validate(self, options):
        check_keys(options, ("binary",))
        return {"binary": opt_bool(options, "binary", True)}

    def makeService(self, bus, listener):
        from gateway.listeners import ListenerService
        from plugins.rustlog.server import RustLogFactory
        return ListenerService(listener, RustLogFactory(bus, listener), bus.reactor)


dialect = RustLogDialect()
