"""The service tree: the store first, the listeners after, stopped in reverse.

::

    GatewayService
     ├── StoreService        opens (recovers) the store; retention timer; closes it last
     ├── GroupCoordinator    consumer groups of every dialect; cancels its timers on stop
     └── ListenerService x N one per listener, made by its dialect

Twisted's ``MultiService`` stops its children all at once; ours waits for
each child to stop before stopping the one before it, so every listener
and its connections are gone before the store makes its last fsync.
"""
from twisted.application.service import MultiService, Service
from twisted.internet import defer, task
from twisted.logger import Logger

from gateway.bus import CommandBus
from gateway.dialects import find_dialects
from storage import LogStore, StoreSettings

log = Logger()


def store_settings(storage):
    """StoreSettings from the ``storage:`` section of the config."""
    hours = storage.retention_hours
    return StoreSettings(
        path=storage.path, fsync=storage.fsync, fsync_interval_ms=storage.fsync_interval_ms,
        segment_bytes=storage.segment_bytes, segment_ms=storage.segment_ms,
        index_interval_bytes=storage.index_interval_bytes,
        retention_ms=None if hours is None else int(hours * 3600 * 1000),
        retention_bytes=storage.retention_bytes)


class StoreService(Service):
    name = "store"

    def __init__(self, store, retention_check_ms):
        self.store = store
        self.retention_check_ms = retention_check_ms
        self.retention = None

    def startService(self):
        super().startService()
        for topic, partition, cut in self.store.open():
            log.warn("recovery cut {cut} torn bytes from {topic}/{partition}",
                     cut=cut, topic=topic, partition=partition)
        log.info("store open at {path} (fsync: {fsync}), {n} topic(s)",
                 path=self.store.settings.path, fsync=self.store.settings.fsync,
                 n=len(self.store.topic_names()))
        self.retention = task.LoopingCall(self.store.enforce_retention)
        self.retention.clock = self.store.reactor
        self.retention.start(self.retention_check_ms / 1000.0, now=False)

    def stopService(self):
        super().stopService()
        if self.retention is not None and self.retention.running:
            self.retention.stop()
        return self.store.close()


class GatewayService(MultiService):
    """The whole gateway. ``store``, ``bus`` and ``listeners`` are exposed for
    tests and the CLI."""

    def __init__(self, config, reactor=None, dialects=None):
        super().__init__()
        if reactor is None:
            from twisted.internet import reactor
        if dialects is None:
            dialects = find_dialects()
        self.config = config
        self.store = LogStore(store_settings(config.storage), reactor)
        self.bus = CommandBus(self.store, config.topics, config.limits, reactor, config.groups)
        for dialect in dialects.values():
            for format_id, decoder in dialect.formats.items():
                self.bus.formats.register(format_id, decoder)
        StoreService(self.store, config.storage.retention_check_ms).setServiceParent(self)
        self.bus.groups.setServiceParent(self)
        self.listeners = []
        for listener in config.listeners:
            service = dialects[listener.dialect].makeService(
                self.bus.for_listener(listener), listener)
            service.setServiceParent(self)
            self.listeners.append(service)

    def whenListening(self):
        """Fires with ``[(ListenerConfig, address)]`` once every listener is
        bound, or fails with the first listener that could not bind."""
        return defer.gatherResults(
            [s.whenListening().addCallback(lambda addr, s=s: (s.listener, addr))
             for s in self.listeners], consumeErrors=True).addErrback(
                 lambda f: f.value.subFailure if isinstance(f.value, defer.FirstError) else f)

    @defer.inlineCallbacks
    def stopService(self):
        self.running = 0
        for service in reversed(list(self)):
            yield defer.maybeDeferred(service.stopService)
