"""The gateway's metrics, collected from the store and the bus on demand.

Collected when scraped rather than counted on the hot path: the store
already knows every partition's offsets and sizes, and the syncer its fsync
totals, so nothing is added per message or per batch.
"""
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


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
        for topic in store.topic_names():
            for p in range(store.topic(topic).partitions):
                state = store.offsets(topic, p)
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


def exposition(bus):
    """The metrics in the Prometheus text exposition format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(bus))
    return generate_latest(registry).decode("utf-8")
