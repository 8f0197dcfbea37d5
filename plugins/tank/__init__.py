"""The TANK dialect: TANK 4.0 clients (``TankClient``, ``tank-cli``) against
the gateway as a standalone broker (shared/protocols/tank.md).

Listener options: ``max_frame_bytes`` (default 64 MiB, at most 256 MiB like
the real broker): a frame whose payload is larger closes the connection.

Produced bundles are stored as sent, under the ``TANK_BUNDLE`` format, so a
TANK consumer gets them back byte for byte; the decoder registered here
lets every other dialect read them as records.
"""
from twisted.plugin import IPlugin
from zope.interface import implementer

from gateway.config import check_keys, opt_int
from gateway.interfaces import IDialect
from gateway.records import TANK_BUNDLE, Records
from plugins.tank.codec import DEFAULT_MAX_FRAME_BYTES, decode_bundle

#: the real broker's frame limit, and so the most a listener may allow
MAX_FRAME_LIMIT = 256 * 1024 * 1024
#: a stored bundle passed validation under some listener's frame limit, so
#: reading it back needs no tighter cap than the largest one a listener can have
_STORED_MAX_BYTES = 1 << 32


def decode_stored_bundle(payload, batch):
    """``Records`` of a stored TANK bundle. Its messages are numbered from the
    batch's base offset: a sparse bundle's own seqs were checked to equal
    offset + 1 when it was appended (a conditional append), so they agree."""
    bundle = decode_bundle(payload, _STORED_MAX_BYTES)
    return Records(batch.base_offset, bundle.timestamps, bundle.keys, bundle.values)


@implementer(IPlugin, IDialect)
class TankDialect:
    name = "tank"
    formats = {TANK_BUNDLE: decode_stored_bundle}

    def validate(self, options):
        check_keys(options, ("max_frame_bytes",))
        return {"max_frame_bytes": opt_int(options, "max_frame_bytes", DEFAULT_MAX_FRAME_BYTES,
                                           minimum=1024, maximum=MAX_FRAME_LIMIT)}

    def makeService(self, bus, listener):
        from gateway.listeners import ListenerService
        from plugins.tank.server import TankFactory
        return ListenerService(listener, TankFactory(bus, listener), bus.reactor)


dialect = TankDialect()
