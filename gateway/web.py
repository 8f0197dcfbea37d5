"""The operator's window: ``/metrics``, a live status page and its JSON.

One ``twisted.web`` site on the ``metrics.endpoint`` listener (any Twisted
endpoint string, ``ssl:`` included):

- ``/metrics``: the Prometheus text exposition (``gateway.metrics``);
- ``/``: the status page (``status_page.html``, one self-contained file:
  inline CSS and script, charts drawn on a canvas, nothing fetched from
  anywhere else, so it works on a machine without internet access);
- ``/api/status``: what the page polls every second: listeners,
  connections, topics, groups with lag, store and bus figures. Counters
  are totals; the page turns them into rates.

Everything is read when asked for; serving the page costs the gateway
nothing between requests.
"""
import dataclasses
import os
import resource
import time

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.endpoints import serverFromString
from twisted.logger import Logger
from twisted.web import pages
from twisted.web.resource import Resource
from twisted.web.server import Site

from gateway.listeners import ReportsAddress
from gateway.metrics import connection_counts, group_lags, listener_factory

log = Logger()

PAGE_FILE = os.path.join(os.path.dirname(__file__), "status_page.html")
#: topics listed on the page, most appended first (the JSON says how many exist)
MAX_TOPICS = 500


def resident_bytes():
    """The process's resident memory now (``ru_maxrss``, the peak, where
    /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _listener_status(gateway, service):
    listener = gateway.listener_configs[service]
    factory = listener_factory(service)
    counts = connection_counts(factory) if factory is not None else {}
    meter = gateway.views[service].meter
    requests = errors = refused = 0
    if meter is not None:
        for (_, outcome), n in meter.requests.items():
            requests += n
            if outcome == "not_authorized":
                refused += n
            elif outcome not in ("ok", "cancelled"):
                errors += n
    address = getattr(service, "address", None)
    return {
        "path": listener.path,
        "dialect": listener.dialect,
        "address": None if address is None else f"{address.host}:{address.port}",
        "tls": listener.endpoint.split(":", 1)[0] == "ssl",
        "connections": counts.get("open"),
        "connections_total": counts.get("opened"),
        "connections_refused": counts.get("refused"),
        "bytes_in": counts.get("bytes_in", 0),
        "bytes_out": counts.get("bytes_out", 0),
        "buffered_bytes": counts.get("buffered", 0),
        "frame_errors": counts.get("frame_errors", 0),
        "protocol_errors": counts.get("protocol_errors", 0),
        "requests": requests,
        "errors": errors,
        "refused_requests": refused,
        "records_in": 0 if meter is None else meter.records_in,
        "access": {"mode": listener.access.mode, "topics": list(listener.access.topics),
                   "auto_create": listener.access.auto_create},
        "limits": dataclasses.asdict(listener.limits),
    }


def _topics_status(gateway):
    store = gateway.store
    appended = gateway.meters.appended if gateway.meters is not None else {}
    topics = []
    for name in store.topic_names():
        info = store.topic(name)
        states = [store.offsets(name, p) for p in range(info.partitions)]
        counted = [appended.get((name, p), (0, 0)) for p in range(info.partitions)]
        topics.append({
            "name": name,
            "kind": info.kind,
            "partitions": info.partitions,
            "records": sum(s.high_watermark - s.log_start for s in states),
            "log_start": sum(s.log_start for s in states),
            "high_watermark": sum(s.high_watermark for s in states),
            "size_bytes": sum(s.size_bytes for s in states),
            "segments": sum(s.segments for s in states),
            "sealed": sum(1 for s in states if s.sealed),
            "appended_records": sum(n for n, _ in counted),
            "appended_bytes": sum(b for _, b in counted),
        })
    topics.sort(key=lambda t: (-t["appended_records"], t["name"]))
    return len(topics), topics[:MAX_TOPICS]


def _groups_status(store):
    groups = {}
    for group, topic, partition, committed, lag in group_lags(store):
        entry = groups.setdefault(group, {"group": group, "lag": 0, "partitions": []})
        entry["lag"] += lag
        entry["partitions"].append({"topic": topic, "partition": partition,
                                    "committed": committed, "lag": lag})
    return sorted(groups.values(), key=lambda g: (-g["lag"], g["group"]))


def status(gateway):
    """The status page's data: a JSON-able dict of totals."""
    store = gateway.store
    listeners = [_listener_status(gateway, s) for s in gateway.listeners]
    topic_count, topics = _topics_status(gateway)
    syncer = store.syncer
    fsync = gateway.meters.fsync if gateway.meters is not None else None
    started = gateway.meters.started if gateway.meters is not None else None
    now = time.time()
    return {
        "time": now,
        "uptime_s": None if started is None else now - started,
        "process": {"pid": os.getpid(), "rss_bytes": resident_bytes()},
        "listeners": listeners,
        "topics_total": topic_count,
        "topics": topics,
        "groups": _groups_status(store),
        "store": {
            "path": store.settings.path,
            "fsync": store.settings.fsync,
            "bytes": sum(t["size_bytes"] for t in topics),
            "segments": sum(t["segments"] for t in topics),
            "fsyncs": syncer.fsyncs,
            "fsync_seconds": syncer.fsync_seconds,
            "fsync_p50_s": None if fsync is None else fsync.quantile(0.5),
            "fsync_p99_s": None if fsync is None else fsync.quantile(0.99),
        },
        "bus": {
            "parked_fetches": gateway.bus.parked,
            "push_subscriptions": len(gateway.bus.subscriptions),
            "buffered_bytes": sum(entry["buffered_bytes"] for entry in listeners),
            "produces_in_flight": sum(v.producing for v in gateway.views.values()),
        },
    }


class _Leaf(Resource):
    isLeaf = True

    def __init__(self, content_type, render):
        super().__init__()
        self.content_type = content_type
        self.render_body = render

    def render_GET(self, request):
        request.setHeader(b"content-type", self.content_type)
        request.setHeader(b"cache-control", b"no-store")
        return self.render_body()


class _Directory(Resource):
    """A path with children; anything else below it is a plain 404."""

    def getChild(self, path, request):
        return pages.notFound()


class StatusSite(Site):
    """No access log: a scraper and the page poll every second or so, and
    that would drown the gateway's own log lines."""

    noisy = False

    def log(self, request):
        """Access lines are not logged."""


def make_site(gateway):
    with open(PAGE_FILE, "rb") as f:
        page = f.read()
    root = _Directory()
    root.putChild(b"", _Leaf(b"text/html; charset=utf-8", lambda: page))
    root.putChild(b"metrics", _Leaf(CONTENT_TYPE_LATEST.encode(),
                                    lambda: generate_latest(gateway.bus.metrics_registry)))
    api = _Directory()
    api.putChild(b"status", _Leaf(b"application/json", lambda: orjson.dumps(status(gateway))))
    root.putChild(b"api", api)
    return StatusSite(root)


class StatusService(ReportsAddress, Service):
    """Serves the site on ``endpoint``; ``whenListening()`` fires with the
    bound address (or fails if the endpoint cannot be bound)."""

    name = "status"

    def __init__(self, gateway, endpoint, reactor):
        self.gateway = gateway
        self.endpoint = endpoint
        self.reactor = reactor
        self.port = None
        self.address = None
        self.error = None
        self._waiting = []

    def startService(self):
        super().startService()
        d = serverFromString(self.reactor, self.endpoint).listen(make_site(self.gateway))
        d.addCallbacks(self._listening, self._failed)

    def _listening(self, port):
        self.port = port
        self.address = port.getHost()
        log.info("metrics and status page on http{s}://{host}:{port}/",
                 s="s" if self.endpoint.startswith("ssl:") else "",
                 host=self.address.host, port=self.address.port)
        self._notify()

    def _failed(self, failure):
        self.error = failure
        log.error("metrics endpoint {endpoint}: cannot listen: {error}",
                  endpoint=self.endpoint, error=failure.getErrorMessage())
        self._notify()

    def stopService(self):
        super().stopService()
        port, self.port = self.port, None
        if port is None:
            return defer.succeed(None)
        return defer.maybeDeferred(port.stopListening)
