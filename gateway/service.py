"""The service tree: the store first, the listeners after, stopped in reverse.

::

    GatewayService
     ├── StoreService        opens (recovers) the store; retention timer; closes it last
     ├── GroupCoordinator    consumer groups of every dialect; cancels its timers on stop
     ├── StatusService       /metrics, the status page and its JSON (with ``metrics:``)
     └── ListenerService x N one per listener, made by its dialect

Twisted's ``MultiService`` stops its children all at once; ours first
drains the listeners (no new connections, no new requests, in-flight
produces answered), then stops each child after the one after it, so
every listener and its connections are gone before the store makes its
last fsync.

``reload`` applies a new config to the running gateway (SIGHUP, see
``install_reload_signal``): listeners are matched by dialect, endpoint and
dialect options; added ones start, removed ones drain and stop, kept ones
take their new access rules and limits. A config that cannot be applied
(a listener that cannot bind) changes nothing.
"""
import dataclasses
import signal

from twisted.application.service import MultiService, Service
from twisted.internet import defer, task
from twisted.logger import Logger

from gateway.bus import CommandBus
from gateway.config import ConfigError, load_config
from gateway.dialects import find_dialects
from gateway.metrics import Meters, gateway_registry
from gateway.protocol import DialectFactory
from storage import LogStore, StoreSettings

log = Logger()

#: how long stopping (or removing a listener) waits for in-flight produces
#: before closing their connections anyway
DRAIN_SECONDS = 10.0


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


class ReloadRejected(Exception):
    """A new config that cannot be applied; the running one stays."""


class GatewayService(MultiService):
    """The whole gateway. ``store``, ``bus``, ``listeners`` (their services,
    in config order), ``listener_configs`` and ``views`` (each listener's
    ``ListenerBus``, by service) are exposed for tests, the CLI and the
    metrics; ``status`` is the StatusService when ``metrics:`` is set."""

    def __init__(self, config, reactor=None, dialects=None):
        super().__init__()
        if reactor is None:
            from twisted.internet import reactor
        if dialects is None:
            dialects = find_dialects()
        self.config = config
        self.reactor = reactor
        self.dialects = dialects
        self.store = LogStore(store_settings(config.storage), reactor)
        self.bus = CommandBus(self.store, config.topics, config.limits, reactor, config.groups)
        for dialect in dialects.values():
            for format_id, decoder in dialect.formats.items():
                self.bus.formats.register(format_id, decoder)
        StoreService(self.store, config.storage.retention_check_ms).setServiceParent(self)
        self.bus.groups.setServiceParent(self)
        self.meters = None
        self.status = None
        self.listeners = []
        self.listener_configs = {}
        self.views = {}
        self._reloads = 0
        self._reloading = defer.succeed(None)
        if config.metrics.endpoint is not None:
            self._start_metrics(config.metrics.endpoint)
        for listener in config.listeners:
            self.listeners.append(self._add_listener(listener))

    # -- building ---------------------------------------------------------------------

    def _start_metrics(self, endpoint):
        """Count (from now on) and serve on ``endpoint``."""
        from gateway.web import StatusService
        if self.meters is None:
            self.meters = Meters()
            self.store.syncer.observers.append(self.meters.fsync.observe)
            self.bus.metrics_registry = gateway_registry(self)
            for view in self.views.values():
                view.meter = self.meters.listener_meter()
        self.status = StatusService(self, endpoint, self.reactor)
        self.status.setServiceParent(self)

    def _add_listener(self, listener):
        """Make a listener's service and add it (started if we are running)."""
        meter = self.meters.listener_meter() if self.meters is not None else None
        view = self.bus.for_listener(listener, meter)
        service = self.dialects[listener.dialect].makeService(view, listener)
        if service.name is not None and service.name in self.namedServices:
            # A reload reuses positions that running listeners were named after.
            self._reloads += 1
            service.setName(f"{service.name} (reload {self._reloads})")
        self.views[service] = view
        self.listener_configs[service] = listener
        service.setServiceParent(self)
        return service

    def _forget(self, service):
        self.views.pop(service, None)
        self.listener_configs.pop(service, None)

    def whenListening(self):
        """Fires with ``[(ListenerConfig, address)]`` once every listener is
        bound, or fails with the first listener that could not bind."""
        return self._bound(self.listeners)

    def _bound(self, services):
        return defer.gatherResults(
            [s.whenListening().addCallback(lambda addr, s=s: (self.listener_configs[s], addr))
             for s in services], consumeErrors=True).addErrback(
                 lambda f: f.value.subFailure if isinstance(f.value, defer.FirstError) else f)

    # -- stopping -----------------------------------------------------------------------

    def _drain(self, services):
        """Stop accepting and taking requests on ``services``; fires once
        their produces in flight are answered (or after DRAIN_SECONDS)."""
        waits = []
        for service in services:
            stop_accepting = getattr(service, "stop_accepting", None)
            if stop_accepting is not None:
                waits.append(stop_accepting())
            factory = getattr(service, "factory", None)
            if isinstance(factory, DialectFactory):
                factory.stop_requests()
            waits.append(self.views[service].idle())
        d = defer.DeferredList(waits, consumeErrors=True)
        d.addTimeout(DRAIN_SECONDS, self.reactor)

        def late(failure):
            failure.trap(defer.TimeoutError)
            producing = sum(self.views[s].producing for s in services)
            log.warn("{n} produce(s) still in flight after {seconds} s; closing their "
                     "connections anyway", n=producing, seconds=DRAIN_SECONDS)
        return d.addErrback(late)

    @defer.inlineCallbacks
    def stopService(self):
        self.running = 0
        yield self._drain(list(self.listeners))
        for service in reversed(list(self)):
            yield defer.maybeDeferred(service.stopService)

    # -- reload ---------------------------------------------------------------------------

    def reload_from_source(self):
        """Re-read the config file this gateway was started from and apply
        it; fires with the bound listeners, or None if it was rejected (one
        log line says why; the running config stays)."""
        def read_and_apply(_):
            try:
                config = load_config(self.config.source, self.dialects)
            except ConfigError as e:
                log.error("reload rejected: {error}; the running config stays", error=str(e))
                return None
            d = self.reload(config)

            def rejected(failure):
                failure.trap(ReloadRejected)
                log.error("reload rejected: {error}; the running config stays",
                          error=str(failure.value))
            return d.addErrback(rejected)
        # One reload at a time, in the order asked for.
        self._reloading = self._reloading.addCallback(read_and_apply)
        result = defer.Deferred()

        def done(value):
            result.callback(value)
        self._reloading.addBoth(done)
        return result

    @defer.inlineCallbacks
    def reload(self, config):
        """Apply ``config``; fires with ``[(ListenerConfig, address)]`` of
        every listener, or fails with ReloadRejected having changed nothing."""
        by_identity = {}
        for service in self.listeners:
            by_identity.setdefault(self.listener_configs[service].identity, []).append(service)
        kept = []
        added = []
        for listener in config.listeners:
            same = by_identity.get(listener.identity)
            if same:
                kept.append((same.pop(0), listener))
            else:
                added.append(listener)
        removed = [s for services in by_identity.values() for s in services]

        started = [self._add_listener(listener) for listener in added]
        try:
            yield self._bound(started)
        except Exception as e:
            failed = next((s for s in started if getattr(s, "error", None) is not None), None)
            where = "a new listener" if failed is None else self.listener_configs[failed].path
            yield defer.DeferredList([defer.maybeDeferred(s.disownServiceParent)
                                      for s in started])
            for service in started:
                self._forget(service)
            raise ReloadRejected(f"{where}: cannot listen: {e}") from None

        for service, listener in kept:
            self.views[service].configure(listener)
            self.listener_configs[service] = listener
            if getattr(service, "listener", None) is not None:
                service.listener = listener
            factory = getattr(service, "factory", None)
            if isinstance(factory, DialectFactory):
                factory.configure(listener)
        if removed:
            yield self._drain(removed)
            yield defer.DeferredList([defer.maybeDeferred(s.disownServiceParent)
                                      for s in removed])
            for service in removed:
                self._forget(service)
        order = {listener.index: service for service, listener in kept}
        order.update({self.listener_configs[s].index: s for s in started})
        self.listeners = [order[i] for i in sorted(order)]

        yield self._reconfigure_gateway(config)
        self.config = dataclasses.replace(config, source=config.source or self.config.source)
        log.info("config reloaded: {kept} listener(s) kept, {added} added, {removed} removed",
                 kept=len(kept), added=len(started), removed=len(removed))
        return (yield self.whenListening())

    @defer.inlineCallbacks
    def _reconfigure_gateway(self, config):
        """The sections besides ``listeners``: topics, limits and groups apply
        at once; the store's settings need a restart (said in the log); a
        changed metrics endpoint moves the status service."""
        self.bus.topics = config.topics
        self.bus.limits = config.limits
        self.bus.groups.min_session_timeout_ms = config.groups.min_session_timeout_ms
        self.bus.groups.max_session_timeout_ms = config.groups.max_session_timeout_ms
        if config.storage != self.config.storage:
            log.warn("reload: storage settings changed; they take effect at the next start")
        endpoint = config.metrics.endpoint
        if endpoint != self.config.metrics.endpoint:
            if self.status is not None:
                yield self.status.disownServiceParent()
                self.status = None
            if endpoint is not None:
                self._start_metrics(endpoint)


def install_reload_signal(service, reactor, reloaded=None):
    """Make SIGHUP reload ``service`` from its config file; ``reloaded`` is
    called with the bound listeners after each reload that was applied."""
    def reload():
        d = service.reload_from_source()
        if reloaded is not None:
            d.addCallback(lambda bound: bound is not None and reloaded(bound))
        d.addErrback(lambda f: log.failure("reload failed", f))

    def on_signal(signum, frame):
        # A signal handler may run between any two bytecodes of the reactor:
        # hand over the way Twisted's own SIGTERM handler does.
        reactor.callFromThread(reload)
    signal.signal(signal.SIGHUP, on_signal)
