"""Metrics over real sockets: /metrics on the ``metrics.endpoint`` listener
moves as every dialect's clients connect, produce, read, commit and make
mistakes; the status page's JSON says the same; without ``metrics:``
nothing is counted per command."""
import uuid

from twisted.internet import defer, reactor, threads
from twisted.internet.endpoints import connectProtocol

from gateway import commands as cmd
from gateway.records import RecordBatch
from plugins.figg.client import FiggClient
from plugins.kafka.client import KafkaClient
from plugins.pravega import codec as pc
from plugins.pravega.client import PravegaClientProtocol
from plugins.rustlog import codec as rc
from plugins.rustlog.client import RustLogClientProtocol, RustLogError
from plugins.tank.client import TankClientProtocol
from tests.figg_support import fast_backoff
from tests.ops_support import (
    DIALECTS, HTTP, LOCAL, OpsTest, client_endpoint, eventually, raw_connect, sample)

ALL = [{"dialect": d, "endpoint": LOCAL} for d in DIALECTS]
METRICS = {"endpoint": LOCAL}


class MetricsTests(OpsTest):

    @defer.inlineCallbacks
    def start_all(self, **sections):
        sections.setdefault("metrics", METRICS)
        yield self.start(ALL, **sections)
        self.port = dict(zip(DIALECTS, self.ports))

    def key(self, dialect):
        return {"listener": f"listeners[{DIALECTS.index(dialect)}]", "dialect": dialect}

    def connect(self, dialect, proto):
        return self.connect_port(self.port[dialect], proto)

    @defer.inlineCallbacks
    def connect_port(self, port, proto):
        yield connectProtocol(client_endpoint(port), proto)
        self.addCleanup(lambda: proto.transport.loseConnection())
        return proto

    @defer.inlineCallbacks
    def test_every_dialect_moves_its_listener_counters(self):
        yield self.start_all(storage={"fsync": "always"})
        before = yield self.scrape()
        for dialect in DIALECTS:
            self.assertEqual(sample(before, "gateway_connections_open", **self.key(dialect)), 0)
            self.assertEqual(sample(before, "gateway_listener_info", **self.key(dialect),
                                    endpoint=LOCAL,
                                    address=f"127.0.0.1:{self.port[dialect]}"), 1)

        rustlog = yield self.connect("rustlog", RustLogClientProtocol())
        yield rustlog.produce("m.rustlog", 0, [b"a", b"b"])
        tank = yield self.connect("tank", TankClientProtocol())
        yield tank.produce("m.tank", 0, [b"a", b"b", b"c"])
        with KafkaClient("127.0.0.1", self.port["kafka"]) as kafka:
            yield threads.deferToThread(kafka.produce, "m.kafka", 0, [(None, b"k")])
        figg = FiggClient(reactor, "127.0.0.1", self.port["figg"], backoff=fast_backoff)
        yield figg.connect()
        self.addCleanup(figg.close)
        yield figg.publish_blocking("m.figg", b"f")
        pravega = yield self.connect("pravega", PravegaClientProtocol())
        yield pravega.hello
        yield pravega.create_segment("gateway/m.pravega/0.#epoch.0")
        writer = uuid.uuid4().bytes
        yield pravega.setup_append("gateway/m.pravega/0.#epoch.0", writer)
        data = pc.frame_events([b"p1", b"p2"])
        acked = defer.Deferred()
        pravega.writers[writer] = _Ack(acked)
        pravega.send(pc.AppendBlockEnd(writer, len(data), data, 2, 1, 99))
        yield acked

        after = yield self.scrape()
        expected = {"rustlog": ("m.rustlog", 2), "tank": ("m.tank", 3), "kafka": ("m.kafka", 1),
                    "figg": ("m.figg", 1), "pravega": ("m.pravega", 2)}
        for dialect, (topic, records) in expected.items():
            key = self.key(dialect)
            self.assertEqual(sample(after, "gateway_connections_total", **key), 1, dialect)
            self.assertEqual(sample(after, "gateway_requests_total", **key, type="produce",
                                    outcome="ok"), 1, dialect)
            self.assertEqual(sample(after, "gateway_produced_records_total", **key), records)
            self.assertGreater(sample(after, "gateway_received_bytes_total", **key), 0, dialect)
            self.assertGreater(sample(after, "gateway_sent_bytes_total", **key), 0, dialect)
            self.assertEqual(sample(after, "gateway_partition_appended_records_total",
                                    topic=topic, partition="0"), records)
            self.assertEqual(sample(after, "gateway_partition_high_watermark",
                                    topic=topic, partition="0"), records)
        # the Kafka client closed its connection; the others are open
        self.assertEqual(sample(after, "gateway_connections_open", **self.key("kafka")), 0)
        self.assertEqual(sample(after, "gateway_connections_open", **self.key("rustlog")), 1)
        # fsync: always -> every produce waited for a group-commit fsync
        self.assertGreater(sample(after, "gateway_fsync_duration_seconds_count"), 0)
        self.assertEqual(sample(after, "gateway_fsync_duration_seconds_count"),
                         sample(after, "gateway_fsyncs_total"))
        self.assertEqual(sample(after, "gateway_topics"), 5)
        self.assertGreater(sample(after, "gateway_store_bytes"), 0)
        self.assertGreater(sample(after, "process_resident_memory_bytes"), 0)

    @defer.inlineCallbacks
    def test_counted_per_batch_not_per_record(self):
        yield self.start_all()
        rustlog = yield self.connect("rustlog", RustLogClientProtocol())
        yield rustlog.produce("batch", 0, [b"x" * 10] * 500)
        yield rustlog.produce("batch", 0, [b"y" * 10] * 500)
        got = yield self.scrape()
        self.assertEqual(sample(got, "gateway_requests_total", **self.key("rustlog"),
                                type="produce", outcome="ok"), 2)
        self.assertEqual(sample(got, "gateway_partition_appended_records_total",
                                topic="batch", partition="0"), 1000)
        self.assertEqual(sample(got, "gateway_partition_appended_bytes_total",
                                topic="batch", partition="0"), 10000)

    @defer.inlineCallbacks
    def test_outcomes_errors_and_bus_gauges(self):
        yield self.start_all()
        key = self.key("rustlog")
        rustlog = yield self.connect("rustlog", RustLogClientProtocol())
        with self.assertRaises(RustLogError):
            yield rustlog.fetch("nothing.here", 0, 0)
        yield rustlog.produce("g", 0, [b"1", b"2", b"3", b"4", b"5"])
        yield rustlog.commit("readers", "g", 0, 2)
        # a frame over the limit: one frame error, one protocol error
        raw = yield raw_connect(self, self.port["rustlog"])
        raw.transport.write((rc.MAX_FRAME_BYTES + 1).to_bytes(4, "big"))
        yield raw.lost
        # a TANK consume parked at the tail, a Figg subscriber
        tank = yield self.connect("tank", TankClientProtocol())
        parked = tank.fetch("g", 0, 6, max_wait_ms=10000)
        parked.addErrback(lambda f: None)
        figg = FiggClient(reactor, "127.0.0.1", self.port["figg"], backoff=fast_backoff)
        yield figg.connect()
        self.addCleanup(figg.close)
        yield figg.subscribe("g", lambda message: None)
        yield eventually(lambda: self.service.bus.parked == 1)

        got = yield self.scrape()
        self.assertEqual(sample(got, "gateway_requests_total", **key, type="fetch",
                                outcome="unknown_topic"), 1)
        self.assertEqual(sample(got, "gateway_requests_total", **key, type="commit_offset",
                                outcome="ok"), 1)
        self.assertEqual(sample(got, "gateway_frame_errors_total", **key), 1)
        self.assertEqual(sample(got, "gateway_protocol_errors_total", **key), 1)
        self.assertEqual(sample(got, "gateway_group_committed_offset", group="readers",
                                topic="g", partition="0"), 2)
        self.assertEqual(sample(got, "gateway_group_lag", group="readers", topic="g",
                                partition="0"), 3)
        self.assertEqual(sample(got, "gateway_parked_fetches"), 1)
        self.assertEqual(sample(got, "gateway_push_subscriptions"), 1)
        self.assertEqual(sample(got, "gateway_buffered_bytes", **key), 0)

        status = yield self.status()
        [topic] = [t for t in status["topics"] if t["name"] == "g"]
        self.assertEqual((topic["records"], topic["appended_records"], topic["partitions"]),
                         (5, 5, 1))
        self.assertEqual(status["groups"], [{"group": "readers", "lag": 3, "partitions": [
            {"topic": "g", "partition": 0, "committed": 2, "lag": 3}]}])
        listener = status["listeners"][DIALECTS.index("rustlog")]
        self.assertEqual((listener["dialect"], listener["connections"], listener["frame_errors"],
                          listener["records_in"]), ("rustlog", 1, 1, 5))
        self.assertEqual(listener["address"], f"127.0.0.1:{self.port['rustlog']}")
        self.assertEqual(status["bus"]["parked_fetches"], 1)
        self.assertEqual(status["bus"]["push_subscriptions"], 1)

    @defer.inlineCallbacks
    def test_the_status_page_is_served_self_contained(self):
        yield self.start_all()
        code, headers, body = yield HTTP().get(f"http://127.0.0.1:{self.metrics_port}/")
        self.assertEqual(code, 200)
        self.assertEqual(headers.getRawHeaders(b"content-type"), [b"text/html; charset=utf-8"])
        page = body.decode()
        self.assertIn("<canvas", page)
        # nothing is loaded from anywhere else
        for needle in ("http://", "https://", "//cdn", "<link rel=\"stylesheet\"",
                       "<script src"):
            self.assertNotIn(needle, page)
        code, _, _ = yield HTTP().get(f"http://127.0.0.1:{self.metrics_port}/nothing")
        self.assertEqual(code, 404)

    @defer.inlineCallbacks
    def test_rustlog_metrics_fetch_answers_the_whole_gateway(self):
        yield self.start_all()
        rustlog = yield self.connect("rustlog", RustLogClientProtocol(binary=True))
        text = yield rustlog.metrics()
        self.assertIn("gateway_connections_open{", text)
        self.assertIn("gateway_partition_high_watermark", text)

    @defer.inlineCallbacks
    def test_without_metrics_nothing_is_counted_per_command(self):
        yield self.start([{"dialect": "rustlog", "endpoint": LOCAL}])
        self.assertIsNone(self.service.status)
        self.assertIsNone(self.service.views[self.listener(0)].meter)
        rustlog = yield self.connect_port(self.ports[0], RustLogClientProtocol())
        yield rustlog.produce("quiet", 0, [b"x"])
        # the store's metrics are still there for RustLog's MetricsFetch
        self.assertIn("gateway_partition_high_watermark", self.service.bus.metrics_text())
        self.assertNotIn("gateway_requests_total", self.service.bus.metrics_text())

    @defer.inlineCallbacks
    def test_metrics_count_commands_through_the_bus_view(self):
        """A command straight on a listener's view counts like one from a client."""
        yield self.start_all()
        view = self.service.views[self.listener(0)]
        yield view.execute(cmd.Produce("direct", 0, RecordBatch([b"a", b"b"])))
        yield view.execute(cmd.Metadata(["direct"]))
        meter = view.meter
        self.assertEqual(meter.requests, {("produce", "ok"): 1, ("metadata", "ok"): 1})
        self.assertEqual((meter.records_in, meter.bytes_appended), (2, 2))


class _Ack:
    """Stands in for an EventWriter: fires on the writer's DataAppended."""

    def __init__(self, d):
        self.d = d

    def reply(self, proto, reply):
        if isinstance(reply, pc.DataAppended) and not self.d.called:
            self.d.callback(reply)

    def connection_lost(self, proto, reason):
        """Nothing to resend: the test is over."""
