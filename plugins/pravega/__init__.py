"""The Pravega dialect: the segment store's WireCommands (wire version 17)
for event appends and reads (shared/protocols/pravega.md), byte streams,
large events through transient segments and table segments for reader-group
state (shared/protocols/pravega-clients.md §3). Clients find it through the
``pravega-controller`` dialect.

Listener options:

- ``scope`` (default ``gateway``): the one Pravega scope this listener
  serves; segment names are ``<scope>/<stream>/<partition>.#epoch.0``. It
  must be a Pravega name (``[A-Za-z0-9.-]``), which also keeps Pravega's
  internal ``_system`` scope out.
- ``long_poll_ms`` (default 60000): how long a read at the tail is parked
  before it is answered empty with ``atTail``.
- ``max_frame_bytes`` (default and maximum 16,777,215, the wire's limit):
  the largest frame, header included; a larger one is answered with
  ErrorMessage and closes the connection before its body is read. The real
  clients send frames of up to 8,388,660 bytes (a full 8 MiB chunk of a
  large event), so a lower limit is for tests and special setups only.

Appended events are stored as the client framed them, under the
``PRAVEGA_EVENTS`` format: that payload is the segment's byte view, so reads
pass it through, and the decoder registered here gives every other dialect
the events' values as records.
"""
from twisted.plugin import IPlugin
from zope.interface import implementer

from gateway.config import ConfigError, check_keys, opt_int, opt_str
from gateway.interfaces import IDialect
from gateway.records import PRAVEGA_EVENTS, Records
from plugins.pravega.codec import MAX_FRAME_BYTES, NAME_CHARS, split_events

DEFAULT_SCOPE = "gateway"
DEFAULT_LONG_POLL_MS = 60000
#: a frame limit below this could not carry a SetupAppend with a long name
MIN_FRAME_BYTES = 4096


def decode_stored_events(payload, batch):
    """``Records`` of a stored PRAVEGA_EVENTS batch: the events' values, no
    keys, every timestamp the receive time (Pravega events carry none)."""
    values = split_events(payload)
    return Records(batch.base_offset, [batch.first_ts] * len(values), None, values)


@implementer(IPlugin, IDialect)
class PravegaDialect:
    name = "pravega"
    formats = {PRAVEGA_EVENTS: decode_stored_events}

    def validate(self, options):
        check_keys(options, ("scope", "long_poll_ms", "max_frame_bytes"))
        scope = opt_str(options, "scope", DEFAULT_SCOPE)
        if not NAME_CHARS.match(scope):
            raise ConfigError("scope", f"must be letters, digits, '.' and '-' "
                                       f"(a Pravega scope name), got {scope!r}")
        return {
            "scope": scope,
            "long_poll_ms": opt_int(options, "long_poll_ms", DEFAULT_LONG_POLL_MS,
                                    minimum=0, maximum=3600 * 1000),
            "max_frame_bytes": opt_int(options, "max_frame_bytes", MAX_FRAME_BYTES,
                                       minimum=MIN_FRAME_BYTES, maximum=MAX_FRAME_BYTES),
        }

    def makeService(self, bus, listener):
        from gateway.listeners import ListenerService
        from plugins.pravega.server import PravegaFactory
        return ListenerService(listener, PravegaFactory(bus, listener), bus.reactor)


dialect = PravegaDialect()
