"""Kafka, RustLog and TANK on one topic (DESIGN "Records and offsets"): the
same message is offset n to Kafka and RustLog and seq n + 1 to TANK, with
the same key (TANK and Kafka have keys; RustLog reads values only) and the
same value, whichever dialect wrote it. Kafka writes every way it can:
plain magic 0 (stored as sent), a compressed wrapper, and magic 1 with
timestamps (stored as columns)."""
from twisted.internet import defer, reactor
from twisted.trial.unittest import TestCase

from plugins.kafka import codec as kc
from plugins.rustlog.client import connect as rustlog_connect
from plugins.tank.client import connect as tank_connect
from tests.support import gateway_config, start_gateway
from tests.test_kafka_support import LOCAL, connect_raw, data_dir, fetch_body, only_partition

TS = 1700000000123


class CrossDialectTests(TestCase):

    timeout = 60

    @defer.inlineCallbacks
    def setUp(self):
        config = gateway_config(data_dir(self), [
            {"dialect": "kafka", "endpoint": LOCAL},
            {"dialect": "rustlog", "endpoint": LOCAL},
            {"dialect": "tank", "endpoint": LOCAL}])
        self.service, ports = yield start_gateway(self, config)
        self.kafka = yield connect_raw(self, ports["kafka"])
        self.rustlog = yield rustlog_connect(reactor, "127.0.0.1", ports["rustlog"])
        self.addCleanup(self.rustlog.close)
        self.tank = yield tank_connect(reactor, "127.0.0.1", ports["tank"])
        self.addCleanup(self.tank.close)
        yield self.kafka.call(kc.METADATA, 0, kc.MetadataRequest(("shared",)))

    @defer.inlineCallbacks
    def kafka_produce(self, records, magic=0, codec=kc.CODEC_NONE):
        body = yield self.kafka.call(kc.PRODUCE, 1, kc.ProduceRequest(1, 1000, (
            ("shared", ((0, kc.encode_message_set(records, magic, codec)),)),)))
        _, error, base = only_partition(body)
        self.assertEqual(error, 0)
        return base

    @defer.inlineCallbacks
    def kafka_fetch(self, offset):
        body = yield self.kafka.call(kc.FETCH, 0, fetch_body("shared", 0, offset))
        return [(m.offset, m.key, m.value) for m in kc.decode_message_set(only_partition(body)[3])]

    @defer.inlineCallbacks
    def test_kafka_writes_every_way_and_the_others_read_the_same(self):
        bases = []
        bases.append((yield self.kafka_produce([(b"k0", b"plain-0"), (None, b"plain-1")])))
        bases.append((yield self.kafka_produce([(b"k2", b"gzip-2"), (b"k3", b"gzip-3")],
                                               codec=kc.CODEC_GZIP)))
        bases.append((yield self.kafka_produce([(b"k4", b"ts-4", TS), (None, b"ts-5", TS + 1)],
                                               magic=1, codec=kc.CODEC_SNAPPY)))
        self.assertEqual(bases, [0, 2, 4])
        expected = [(0, b"k0", b"plain-0"), (1, None, b"plain-1"), (2, b"k2", b"gzip-2"),
                    (3, b"k3", b"gzip-3"), (4, b"k4", b"ts-4"), (5, None, b"ts-5")]
        self.assertEqual((yield self.kafka_fetch(0)), expected)
        rustlog = yield self.rustlog.fetch("shared", 0, 0)
        self.assertEqual(rustlog.records, [(o, v) for o, _, v in expected])
        self.assertEqual(rustlog.next_offset, 6)
        tank = yield self.tank.fetch("shared", 0, 1)
        self.assertEqual([(m.seq, m.key or None, m.value) for m in tank.messages],
                         [(o + 1, k, v) for o, k, v in expected])
        self.assertEqual([m.ts for m in tank.messages][4:], [TS, TS + 1])
        self.assertEqual(tank.hw_mark, 6)

    @defer.inlineCallbacks
    def test_other_dialects_write_and_kafka_reads_the_same(self):
        yield self.tank.produce("shared", 0, [b"tank-0", b"tank-1"], keys=[b"tk", None])
        offsets = yield self.rustlog.produce("shared", 0, [b"rustlog-2"])
        self.assertEqual(offsets, [2])
        yield self.kafka_produce([(b"kk", b"kafka-3")])
        got = yield self.kafka_fetch(0)
        self.assertEqual([(o, v) for o, _, v in got],
                         [(0, b"tank-0"), (1, b"tank-1"), (2, b"rustlog-2"), (3, b"kafka-3")])
        self.assertEqual(got[0][1], b"tk")
        self.assertEqual([k for _, k, _ in got][1:], [None, None, b"kk"])
        self.assertEqual((yield self.kafka_fetch(2))[0], (2, None, b"rustlog-2"))
        # what ListOffsets says is what the others say
        body = yield self.kafka.call(kc.LIST_OFFSETS, 0, kc.ListOffsetsRequest(
            -1, (("shared", ((0, -1, 1),)),)))
        self.assertEqual(only_partition(body), (0, 0, (4,)))
        tank = yield self.tank.fetch("shared", 0, 4)
        self.assertEqual(tank.hw_mark, 4)
