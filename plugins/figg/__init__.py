"""The Figg dialect: attach/detach streaming subscriptions, windowed publish
with acks, ping/pong (shared/protocols/figg.md).

Listener options:

- ``max_payload_bytes`` (default 16 MiB): the largest ``payload_len`` a frame
  may announce; a larger one closes the connection before its body is read.
- ``max_buffered_bytes`` (default 1 MiB): the most DATA bytes the gateway
  holds for one connection whose client stops reading (beyond it, one DATA
  frame at most). Streaming to that connection pauses and later resumes by
  re-reading the log, so a stalled subscriber costs this much and no more.
- ``max_unacked`` (default 1024): PUBLISHes a connection may have waiting
  for their ACK before the gateway stops reading from it until half of them
  are acknowledged (the SDK's window is 256).
"""
from twisted.plugin import IPlugin
from zope.interface import implementer

from gateway.config import check_keys, opt_int
from gateway.interfaces import IDialect
from plugins.figg.codec import DEFAULT_MAX_PAYLOAD_BYTES, U32_MAX

#: bytes Twisted's TCP transport buffers before it pauses its producer
TRANSPORT_BUFFER_BYTES = 64 * 1024
DEFAULT_MAX_BUFFERED_BYTES = 1024 * 1024
DEFAULT_MAX_UNACKED = 1024


@implementer(IPlugin, IDialect)
class FiggDialect:
    name = "figg"
    formats = {}

    def validate(self, options):
        check_keys(options, ("max_payload_bytes", "max_buffered_bytes", "max_unacked"))
        return {
            # A PUBLISH of a 1-byte topic and no data is 16 bytes; anything
            # below a kilobyte is a typo, and u32 is the field's own limit.
            "max_payload_bytes": opt_int(options, "max_payload_bytes",
                                         DEFAULT_MAX_PAYLOAD_BYTES, minimum=1024,
                                         maximum=U32_MAX),
            # At least twice the transport's own buffer, so each write while
            # streaming can be as large as what the transport holds.
            "max_buffered_bytes": opt_int(options, "max_buffered_bytes",
                                          DEFAULT_MAX_BUFFERED_BYTES,
                                          minimum=2 * TRANSPORT_BUFFER_BYTES),
            "max_unacked": opt_int(options, "max_unacked", DEFAULT_MAX_UNACKED, minimum=1),
        }

    def makeService(self, bus, listener):
        from gateway.listeners import ListenerService
        from plugins.figg.server import FiggFactory
        return ListenerService(listener, FiggFactory(bus, listener), bus.reactor)


dialect = FiggDialect()
