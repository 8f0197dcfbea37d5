"""The blocking client (plugins/kafka/client.py) against the gateway in
process: it runs in a worker thread (``deferToThread``) while the reactor
serves it, which is how a Spark executor would see the gateway."""
import socket
import time

from twisted.internet import defer, threads
from twisted.trial.unittest import TestCase

from plugins.kafka import codec as kc
from plugins.kafka.client import KafkaClient, KafkaConnectionError, KafkaError
from tests.support import start_gateway
from tests.test_kafka_support import data_dir, kafka_config


class BlockingClientTests(TestCase):

    timeout = 60

    @defer.inlineCallbacks
    def setUp(self):
        self.service, ports = yield start_gateway(self, kafka_config(data_dir(self)))
        self.port = ports["kafka"]
        self.client = KafkaClient("127.0.0.1", self.port, timeout=10)
        self.addCleanup(self.client.close)

    def blocking(self, function, *args, **kwargs):
        return threads.deferToThread(function, *args, **kwargs)

    @defer.inlineCallbacks
    def test_plan_read_write(self):
        c = self.client
        self.assertEqual((yield self.blocking(c.partitions, "t")), (0,))
        brokers, topics = yield self.blocking(c.metadata)
        self.assertEqual(brokers, [(0, "127.0.0.1", self.port)])
        self.assertEqual(topics, {"t": (0, (0,))})
        self.assertEqual((yield self.blocking(c.produce, "t", 0, [(b"a", b"1"), (None, b"2")])), 0)
        future = int(time.time() * 1000) + 86400000
        for codec in (kc.CODEC_GZIP, kc.CODEC_SNAPPY, kc.CODEC_LZ4):
            yield self.blocking(c.produce, "t", 0, [(b"z", b"c%d" % codec, future)], magic=1,
                           codec=codec, version=1)
        self.assertIsNone((yield self.blocking(c.produce, "t", 0, [(None, b"quiet")], acks=0)))
        self.assertEqual((yield self.blocking(c.list_offset, "t", 0)), 6)
        self.assertEqual((yield self.blocking(c.list_offset, "t", 0, kc.EARLIEST)), 0)
        self.assertEqual((yield self.blocking(c.list_offset, "t", 0, future)), 2)
        everything = yield self.blocking(lambda: list(c.read("t", 0, 0, max_bytes=40)))
        self.assertEqual([(m.offset, m.key, m.value) for m in everything], [
            (0, b"a", b"1"), (1, None, b"2"), (2, b"z", b"c1"), (3, b"z", b"c2"),
            (4, b"z", b"c3"), (5, None, b"quiet")])
        middle = yield self.blocking(lambda: list(c.read("t", 0, 2, 4)))
        self.assertEqual([m.offset for m in middle], [2, 3])
        result = yield self.blocking(c.fetch, "t", 0, 6, max_wait_ms=100, min_bytes=1)
        self.assertEqual(result, (6, []))

    @defer.inlineCallbacks
    def test_fetch_many_and_errors(self):
        c = self.client
        yield self.blocking(c.produce, "a", 0, [(None, b"x")])
        yield self.blocking(c.produce, "b", 0, [(None, b"y")])
        got = yield self.blocking(c.fetch_many, [("a", 0, 0, 1024), ("b", 0, 0, 1024)], version=1)
        self.assertEqual({k: [m.value for m in v.messages] for k, v in got.items()},
                         {("a", 0): [b"x"], ("b", 0): [b"y"]})
        e = yield self.assertFailure(self.blocking(c.fetch, "a", 0, 5), KafkaError)
        self.assertEqual(e.code, kc.OFFSET_OUT_OF_RANGE)
        e = yield self.assertFailure(self.blocking(c.partitions, "bad name"), KafkaError)
        self.assertEqual(e.code, kc.INVALID_TOPIC)
        e = yield self.assertFailure(self.blocking(c.produce, "a", 3, [(None, b"z")]), KafkaError)
        self.assertEqual((e.code, e.retriable), (kc.UNKNOWN_TOPIC_OR_PARTITION, True))

    @defer.inlineCallbacks
    def test_commits_and_api_versions(self):
        c = self.client
        yield self.blocking(c.partitions, "t")
        self.assertIsNone((yield self.blocking(c.committed, "g", "t", 0)))
        yield self.blocking(c.commit, "g", "t", 0, 7, "note")
        self.assertEqual((yield self.blocking(c.committed, "g", "t", 0)), (7, "note"))
        e = yield self.assertFailure(self.blocking(c.commit, "g", "t", 0, -5), KafkaError)
        self.assertEqual(e.code, kc.OFFSET_OUT_OF_RANGE)
        versions = yield self.blocking(c.api_versions)
        self.assertEqual(versions, dict((k, v) for k, v in kc.SUPPORTED.items()))

    @defer.inlineCallbacks
    def test_reads_reconnect_after_the_connection_breaks(self):
        c = self.client
        yield self.blocking(c.produce, "t", 0, [(None, b"v")])
        yield self.service.listeners[0].factory.close_connections()
        self.assertEqual((yield self.blocking(c.list_offset, "t", 0)), 1)

    @defer.inlineCallbacks
    def test_connection_refused(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        client = KafkaClient("127.0.0.1", port, timeout=2)
        yield self.assertFailure(self.blocking(client.metadata), KafkaConnectionError)
