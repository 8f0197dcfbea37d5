"""The ``pravega-controller`` dialect: the Pravega controller's gRPC API
(shared/protocols/pravega-clients.md §2), which every Pravega client asks
first which segments a stream has and where they live.

gRPC has a well-kept server library, so this dialect wraps ``grpcio`` in a
Twisted service instead of a Protocol (DESIGN.md, "Layout"):
cleartext HTTP/2, unary calls, no TLS, no authentication (an
``authorization`` header is ignored; delegation tokens are ""). The
messages come from ``controller.proto``, written for this project, compiled
into the committed ``controller_pb2.py`` (``generate.py`` says how).

Listener options:

- ``segment_store`` (required): ``host:port`` of the gateway's ``pravega``
  listener as clients reach it; every getURI answers it.
- ``scope`` (default ``gateway``): the one scope served. It must be the
  scope of a ``pravega`` listener, whose segment names the clients then use.
- ``advertised_address`` (optional ``host:port``): this listener's address
  in getControllerServerList; by default the bound address (on a wildcard
  interface, with the segment store's host).

The endpoint must be ``tcp:`` or ``tcp6:``: grpcio listens itself.
"""
from twisted.plugin import IPlugin
from zope.interface import implementer

from gateway.config import REQUIRED, ConfigError, check_keys, opt_str
from gateway.interfaces import IDialect
from plugins.pravega import DEFAULT_SCOPE
from plugins.pravega.codec import NAME_CHARS

ENDPOINT_KINDS = ("tcp", "tcp6")


def host_port(options, key, default):
    """A ``host:port`` option as ``(host, port)`` (None if absent and not
    required). The host is kept as written, brackets of an IPv6 literal
    included, because clients parse it back from ``host:port``."""
    text = opt_str(options, key, default)
    if text is None:
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(key, f"must be host:port with a port in 1-65535, got {text!r}")
    return host, int(port)


@implementer(IPlugin, IDialect)
class PravegaControllerDialect:
    name = "pravega-controller"
    #: grpcio owns the connections and frames, so no per-listener limit can be
    #: enforced here: the config refuses ``limits:`` on this listener
    listener_limits = ()
    formats = {}

    def validate(self, options):
        check_keys(options, ("scope", "segment_store", "advertised_address"))
        scope = opt_str(options, "scope", DEFAULT_SCOPE)
        if not NAME_CHARS.match(scope):
            raise ConfigError("scope", f"must be letters, digits, '.' and '-' "
                                       f"(a Pravega scope name), got {scope!r}")
        return {
            "scope": scope,
            "segment_store": host_port(options, "segment_store", REQUIRED),
            "advertised_address": host_port(options, "advertised_address", None),
        }

    def check_listeners(self, listener, listeners):
        """The endpoint is one grpcio can listen on, and the scope is one a
        ``pravega`` listener serves: a client reads the segments of the
        scope it asked the controller about."""
        kind = listener.endpoint.split(":", 1)[0]
        if kind not in ENDPOINT_KINDS:
            raise ConfigError("endpoint", f"the controller listens with grpcio in cleartext: "
                                          f"use a tcp: or tcp6: endpoint, got {kind}:")
        scopes = sorted({other.options.get("scope", DEFAULT_SCOPE) for other in listeners
                         if other.dialect == "pravega"})
        if listener.options["scope"] not in scopes:
            served = ", ".join(repr(s) for s in scopes) or "none: there is no pravega listener"
            raise ConfigError("scope", f"must be the scope of a pravega listener "
                                       f"({served}), got {listener.options['scope']!r}")

    def makeService(self, bus, listener):
        from plugins.pravega_controller.server import ControllerService
        return ControllerService(listener, bus, listener.options, bus.reactor)


dialect = PravegaControllerDialect()
