"""The gateway's metrics: what is counted, and how it is collected.

Two kinds of numbers, kept apart so that the hot paths stay cheap:

- Counted as things happen, in plain integers, never through
  ``prometheus_client`` objects (whose labelled counters take a lock and a
  dict lookup per call): connection counters on each listener's
  ``DialectFactory`` and on each connection (``gateway.protocol``), and,
  with ``metrics:`` configured, each listener's commands by type and
  outcome and the records and bytes appended per partition (a
  ``ListenerMeter`` in the listener's bus view). Every count is per
  command, which is per batch on the produce path, never per record.
- Read when scraped: the store's offsets, sizes and segments, consumers'
  lag, the bus's parked fetches and subscriptions, bytes waiting in the
  connections' send buffers.

``GatewayCollector`` turns both into Prometheus families when ``/metrics``
is scraped; the status page's JSON (``gateway.web``) reads the same
helpers. ``StoreCollector`` alone is what RustLog's MetricsFetch answers
when ``metrics:`` is not configured.
"""
import bisect
import re
import time

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily)
from twisted.internet import defer
from twisted.python.failure import Failure

from gateway import commands as c
from gateway.errors import LogError
from gateway.protocol import DialectFactory, unsent_bytes
from gateway.records import EncodedBatch

#: fsync latency histogram buckets, seconds (SSD group commits to slow disks)
FSYNC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")
_COMMAND_NAMES = {}
_OUTCOMES = {}


def snake(name):
    return _CAMEL.sub("_", name).lower()


def command_name(kind):
    """``Produce`` -> ``produce``, ``FetchCommittedOffset`` -> ``fetch_committed_offset``."""
    name = _COMMAND_NAMES.get(kind)
    if name is None:
        name = _COMMAND_NAMES[kind] = snake(kind.__name__)
    return name


def outcome_of(error):
    """A command's outcome label for the error it failed with: the error
    class in snake case for the gateway's own errors (``unknown_topic``,
    ``not_authorized``, ...), ``cancelled`` for a request its client went
    away from, ``internal_error`` for anything else (a bug)."""
    kind = type(error)
    name = _OUTCOMES.get(kind)
    if name is None:
        if isinstance(error, defer.CancelledError):
            name = "cancelled"
        elif isinstance(error, LogError):
            name = snake(kind.__name__)
        else:
            name = "internal_error"
        _OUTCOMES[kind] = name
    return name


class LatencyHistogram:
    """Cumulative-at-read bucket counts, observed in plain integers."""

    def __init__(self, buckets):
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.total = 0.0

    def observe(self, seconds):
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.total += seconds

    @property
    def count(self):
        return sum(self.counts)

    def quantile(self, q):
        """The upper bound of the bucket holding quantile ``q`` (None: no data)."""
        count = self.count
        if not count:
            return None
        seen = 0
        for bound, n in zip(self.buckets + (float("inf"),), self.counts):
            seen += n
            if seen >= q * count:
                return bound
        return float("inf")

    def family(self, name, documentation):
        cumulative = []
        seen = 0
        for bound, n in zip(self.buckets, self.counts):
            seen += n
            cumulative.append((repr(bound), seen))
        cumulative.append(("+Inf", self.count))
        return HistogramMetricFamily(name, documentation, buckets=cumulative,
                                     sum_value=self.total)


class ListenerMeter:
    """One listener's command counters (see ``gateway.bus.ListenerBus``).

    ``requests`` maps ``(command, outcome)`` to a count; ``appended`` is the
    per-partition ``[records, bytes]`` table every listener shares.
    """

    def __init__(self, appended):
        self.requests = {}
        self.records_in = 0
        self.bytes_appended = 0
        self.appended = appended

    def _count(self, name, outcome):
        key = (name, outcome)
        self.requests[key] = self.requests.get(key, 0) + 1

    def observe(self, command, d):
        kind = type(command)
        d.addBoth(self._answered, command_name(kind), kind is c.Fetch)

    def _answered(self, result, name, fetch):
        if isinstance(result, Failure):
            self._count(name, outcome_of(result.value))
            return result
        outcome = "ok"
        if fetch:
            # A Fetch answers errors per partition; the first one names it.
            for part in result:
                if part.error is not None:
                    outcome = outcome_of(part.error)
                    break
        self._count(name, outcome)
        return result

    def produced(self, command, result):
        if isinstance(result, Failure):
            self._count("produce", outcome_of(result.value))
            return
        self._count("produce", "ok")
        records = command.records
        size = (records.value_bytes if isinstance(records, EncodedBatch)
                else sum(map(len, records.values)))
        self.records_in += result.count
        self.bytes_appended += size
        key = (command.topic, command.partition)
        entry = self.appended.get(key)
        if entry is None:
            entry = self.appended[key] = [0, 0]
        entry[0] += result.count
        entry[1] += size


class Meters:
    """Everything counted for the metrics endpoint; exists only when
    ``metrics:`` is configured, so that without it nothing is counted per
    command."""

    def __init__(self):
        self.appended = {}
        self.fsync = LatencyHistogram(FSYNC_BUCKETS)
        self.started = time.time()

    def listener_meter(self):
        return ListenerMeter(self.appended)


def connection_counts(factory):
    """A DialectFactory's connection counters, its live connections included."""
    live = list(factory.connections)
    return {
        "open": len(live),
        "opened": factory.total_connections,
        "refused": factory.refused_connections,
        "bytes_in": factory.closed_bytes_in + sum(p.bytes_in for p in live),
        "bytes_out": factory.closed_bytes_out + sum(p.transport.bytes_out for p in live),
        "frame_errors": factory.closed_frame_errors + sum(p.frame_errors for p in live),
        "protocol_errors": factory.protocol_errors,
        "buffered": sum(unsent_bytes(p.transport.wrapped) for p in live),
    }


def listener_factory(service):
    """The DialectFactory behind a listener's service, or None (a dialect
    served through a server library of its own)."""
    factory = getattr(service, "factory", None)
    return factory if isinstance(factory, DialectFactory) else None


def group_lags(store):
    """``[(group, topic, partition, committed, lag)]`` for every committed
    offset of a partition that still exists; lag = high watermark - commit."""
    lags = []
    for group in store.groups():
        for (topic, partition), (offset, _) in sorted(store.group_offsets(group).items()):
            try:
                high = store.offsets(topic, partition).high_watermark
            except LogError:
                continue
            lags.append((group, topic, partition, offset, max(high - offset, 0)))
    return lags


def partition_states(store):
    """``[(topic, partition, PartitionState)]`` of every partition."""
    states = []
    for topic in store.topic_names():
        for p in range(store.topic(topic).partitions):
            states.append((topic, p, store.offsets(topic, p)))
    return states


class StoreCollector:
    def __init__(self, bus):
        self.bus = bus

    def collect(self):
        store = self.bus.store
        labels = ["topic", "partition"]
        start = GaugeMetricFamily("gateway_partition_log_start_offset",
                                  "First offset still retained", labels=labels)
        end = GaugeMetricFamily("gateway_partition_high_watermark",
                                "Next offset to be assigned (durable end)", labels=labels)
        size = GaugeMetricFamily("gateway_partition_size_bytes", "Bytes on disk", labels=labels)
        segments = GaugeMetricFamily("gateway_partition_segments", "Segment files",
                                     labels=labels)
        for topic, p, state in partition_states(store):
            key = [topic, str(p)]
            start.add_metric(key, state.log_start)
            end.add_metric(key, state.high_watermark)
            size.add_metric(key, state.size_bytes)
            segments.add_metric(key, state.segments)
        yield from (start, end, size, segments)
        syncer = store.syncer
        yield CounterMetricFamily("gateway_fsyncs", "Group-commit fsyncs run",
                                  value=syncer.fsyncs)
        yield CounterMetricFamily("gateway_fsync_seconds", "Time spent in fsync",
                                  value=syncer.fsync_seconds)
        yield GaugeMetricFamily("gateway_parked_fetches", "Fetches waiting for data",
                                value=self.bus.parked)
        yield GaugeMetricFamily("gateway_push_subscriptions", "Live push subscriptions",
                                value=len(self.bus.subscriptions))


class GatewayCollector:
    """Per listener, per topic, per group, store and bus families, read from
    a running ``GatewayService`` at scrape time."""

    def __init__(self, gateway):
        self.gateway = gateway

    def collect(self):
        gateway = self.gateway
        meters = gateway.meters
        names = ["listener", "dialect"]

        def family(kind, name, documentation, extra=()):
            return kind(name, documentation, labels=names + list(extra))
        info = family(GaugeMetricFamily, "gateway_listener_info",
                      "A listener: its endpoint and bound address (value 1)",
                      ("endpoint", "address"))
        opened = family(GaugeMetricFamily, "gateway_connections_open", "Open connections")
        total = family(CounterMetricFamily, "gateway_connections",
                       "Connections accepted")
        refused = family(CounterMetricFamily, "gateway_connections_refused",
                         "Connections turned away by limits.max_connections")
        received = family(CounterMetricFamily, "gateway_received_bytes",
                          "Bytes received from clients")
        sent = family(CounterMetricFamily, "gateway_sent_bytes", "Bytes written to clients")
        frame_errors = family(CounterMetricFamily, "gateway_frame_errors",
                              "Frames over the listener's frame limit")
        protocol_errors = family(CounterMetricFamily, "gateway_protocol_errors",
                                 "Client protocol errors (one log line each)")
        buffered = family(GaugeMetricFamily, "gateway_buffered_bytes",
                          "Output written for clients and not yet taken by them")
        requests = family(CounterMetricFamily, "gateway_requests",
                          "Bus commands by type and outcome", ("type", "outcome"))
        records = family(CounterMetricFamily, "gateway_produced_records",
                         "Records appended through the listener")
        for service in gateway.listeners:
            listener = gateway.listener_configs[service]
            key = [listener.path, listener.dialect]
            address = getattr(service, "address", None)
            info.add_metric(key + [listener.endpoint, "" if address is None else
                                   f"{address.host}:{address.port}"], 1)
            factory = listener_factory(service)
            if factory is not None:
                counts = connection_counts(factory)
                opened.add_metric(key, counts["open"])
                total.add_metric(key, counts["opened"])
                refused.add_metric(key, counts["refused"])
                received.add_metric(key, counts["bytes_in"])
                sent.add_metric(key, counts["bytes_out"])
                frame_errors.add_metric(key, counts["frame_errors"])
                protocol_errors.add_metric(key, counts["protocol_errors"])
                buffered.add_metric(key, counts["buffered"])
            meter = gateway.views[service].meter
            if meter is not None:
                for (kind, outcome), n in sorted(meter.requests.items()):
                    requests.add_metric(key + [kind, outcome], n)
                records.add_metric(key, meter.records_in)
        yield from (info, opened, total, refused, received, sent, frame_errors,
                    protocol_errors, buffered, requests, records)

        if meters is not None:
            labels = ["topic", "partition"]
            appended = CounterMetricFamily("gateway_partition_appended_records",
                                           "Records appended since the gateway started",
                                           labels=labels)
            appended_bytes = CounterMetricFamily("gateway_partition_appended_bytes",
                                                 "Value bytes appended since the gateway "
                                                 "started", labels=labels)
            for (topic, partition), (n, size) in sorted(meters.appended.items()):
                appended.add_metric([topic, str(partition)], n)
                appended_bytes.add_metric([topic, str(partition)], size)
            yield appended
            yield appended_bytes
            yield meters.fsync.family("gateway_fsync_duration_seconds",
                                      "Duration of each group-commit fsync")

        store = gateway.store
        committed = GaugeMetricFamily("gateway_group_committed_offset",
                                      "A consumer group's committed offset (next to read)",
                                      labels=["group", "topic", "partition"])
        lag = GaugeMetricFamily("gateway_group_lag",
                                "High watermark minus the committed offset",
                                labels=["group", "topic", "partition"])
        for group, topic, partition, offset, behind in group_lags(store):
            committed.add_metric([group, topic, str(partition)], offset)
            lag.add_metric([group, topic, str(partition)], behind)
        yield committed
        yield lag

        states = partition_states(store)
        yield GaugeMetricFamily("gateway_store_bytes", "Bytes of all segments on disk",
                                value=sum(s.size_bytes for _, _, s in states))
        yield GaugeMetricFamily("gateway_store_segments", "Segment files of all partitions",
                                value=sum(s.segments for _, _, s in states))
        yield GaugeMetricFamily("gateway_topics", "Topics", value=len(store.topic_names()))
        yield GaugeMetricFamily("gateway_partitions", "Partitions of all topics",
                                value=len(states))
        yield GaugeMetricFamily("gateway_produces_in_flight",
                                "Produces waiting to be durable",
                                value=sum(v.producing for v in gateway.views.values()))


def gateway_registry(gateway):
    """The registry ``/metrics`` serves: the gateway's families, the
    store's, and the process's own (resident memory, CPU, open files)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(gateway.bus))
    registry.register(GatewayCollector(gateway))
    ProcessCollector(registry=registry)
    return registry


def exposition(bus):
    """The store's metrics in the Prometheus text exposition format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(bus))
    return generate_latest(registry).decode("utf-8")
