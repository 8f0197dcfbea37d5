"""The TANK dialect end to end: the real service tree (store, bus, listener)
on real sockets on port 0, driven by ``plugins/tank/client.py`` and, where a
test needs bytes the client will not send or wants the exact bytes back, by
raw frames.

Organised by the conformance checklist of protocols/tank.md §11, then the
rest: ProduceWithSeqnum, sealed partitions, admin requests, out-of-order
answers, flow control and a restart. Long-poll tests use the shortest
maxWait the protocol allows (320 ms) and only assert generous bounds.
"""
import shutil
import struct
import tempfile
import time

from twisted.internet import defer, reactor, task
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol
from twisted.trial.unittest import TestCase

from gateway import commands as cmd
from gateway.records import RecordBatch
from plugins.tank import codec as c
from plugins.tank.client import FETCH_BOUNDARY, TankError, connect
from tests.support import gateway_config, start_gateway
from tests.test_tank_codec import CONSUME_DATA, HELLO, PRODUCE_HELLO, SPARSE_DENSE, TS, hx

TANK = {"dialect": "tank", "endpoint": "tcp:0:interface=127.0.0.1"}
RUSTLOG = {"dialect": "rustlog", "endpoint": "tcp:0:interface=127.0.0.1"}


def sleep(seconds):
    return task.deferLater(reactor, seconds, lambda: None)


class Raw(Protocol):
    """A client that sends bytes as given and collects what comes back."""

    def __init__(self):
        self.buf = bytearray()
        self.lost = defer.Deferred()
        self._waiting = []

    def dataReceived(self, data):
        self.buf += data
        self._check()

    def connectionLost(self, reason):
        if not self.lost.called:
            self.lost.callback(None)
        self._check()

    def frames(self):
        out = []
        pos = 0
        while len(self.buf) - pos >= 5:
            msg_id, size = c.FRAME_HEADER.unpack_from(self.buf, pos)
            if len(self.buf) - pos - 5 < size:
                break
            out.append(bytes(self.buf[pos:pos + 5 + size]))
            pos += 5 + size
        return out

    def _check(self):
        for n, d in list(self._waiting):
            if len(self.frames()) >= n or self.lost.called:
                self._waiting.remove((n, d))
                d.callback(self.frames())

    def wait_frames(self, n):
        """Fires with every frame so far once there are ``n`` (or the connection is gone)."""
        d = defer.Deferred()
        self._waiting.append((n, d))
        self._check()
        return d

    def send(self, data):
        self.transport.write(data)


class TankCase(TestCase):
    timeout = 60

    @defer.inlineCallbacks
    def start(self, **sections):
        path = tempfile.mkdtemp(prefix="tank-test-")
        self.addCleanup(shutil.rmtree, path, True)
        self.path = path
        listeners = sections.pop("listeners", [TANK, RUSTLOG])
        self.config = gateway_config(path, listeners=listeners, **sections)
        self.service, self.ports = yield start_gateway(self, self.config)
        self.bus = self.service.bus

    @defer.inlineCallbacks
    def client(self):
        client = yield connect(reactor, "127.0.0.1", self.ports["tank"])
        self.addCleanup(client.close)
        return client

    @defer.inlineCallbacks
    def raw(self, port=None):
        proto = Raw()
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port or self.ports["tank"])
        yield connectProtocol(endpoint, proto)

        def close():
            proto.transport.loseConnection()
            return proto.lost
        self.addCleanup(close)
        return proto

    @defer.inlineCallbacks
    def rustlog(self):
        from plugins.rustlog.client import connect as rconnect
        client = yield rconnect(reactor, "127.0.0.1", self.ports["rustlog"])
        self.addCleanup(client.close)
        return client

    def records(self, topic, partition=0, offset=0):
        """``[(offset, ts, key, value)]`` as the bus (any other dialect) reads them."""
        d = self.bus.execute(cmd.Fetch([cmd.FetchPartition(topic, partition, offset, 1 << 30)]))
        out = []
        [part] = self.successResultOf(d)
        assert part.error is None, part.error
        for batch in part.batches:
            out.extend(self.bus.decode(batch).since(offset))
        return out

    def state(self, topic, partition=0):
        return self.successResultOf(self.bus.execute(cmd.PartitionInfo(topic, partition)))


def produce_frame(req_id, topics, with_seqnum=False):
    """``topics``: [(name, [(partition, bundle[, first_seq])])]."""
    return c.encode_request(c.ProduceRequest(req_id, tuple(
        c.ProduceTopic(name, tuple(c.ProducePartition(*p) for p in parts))
        for name, parts in topics), with_seqnum))


def consume_frame(req_id, partitions, max_wait_ms=0, min_bytes=0, version=2):
    """``partitions``: [(topic, partition, seq, fetch_size)], one topic each."""
    return c.encode_request(c.ConsumeRequest(req_id, tuple(
        c.ConsumeTopic(t, (c.ConsumePartition(p, s, f),)) for t, p, s, f in partitions),
        max_wait_ms, min_bytes, version, 1 if version >= 3 else 0))


def bundle(*values, ts=TS, **kw):
    return c.encode_bundle(list(values), timestamps=[ts] * len(values), **kw)


class ChecklistTests(TankCase):
    """protocols/tank.md §11, item by item."""

    @defer.inlineCallbacks
    def test_01_ping_on_connect(self):
        yield self.start()
        raw = yield self.raw()
        frames = yield raw.wait_frames(1)
        self.assertEqual(frames[0], hx("03 00 00 00 00"))

    @defer.inlineCallbacks
    def test_02_six_byte_varint_in_a_produce_closes_only_that_connection(self):
        yield self.start()
        bad = yield self.raw()
        good = yield self.client()
        payload = bytearray(hx(PRODUCE_HELLO, bundle=hx(HELLO))[5:])
        at = payload.index(0x10, 20)
        payload[at:at + 1] = b"\x90\x80\x80\x80\x80\x00"
        bad.send(c.frame(c.PRODUCE, bytes(payload)))
        yield bad.lost
        self.assertEqual(bad.frames(), [c.PING_FRAME])
        yield good.produce("t", 0, [b"still here"])
        self.assertEqual([r[3] for r in self.records("t")], [b"still here"])

    @defer.inlineCallbacks
    def test_03_hello_is_stored_with_seq_offset_plus_one(self):
        yield self.start()
        raw = yield self.raw()
        raw.send(hx(PRODUCE_HELLO, bundle=hx(HELLO)))
        frames = yield raw.wait_frames(2)
        self.assertEqual(frames[1], hx("01 05 00 00 00 01 00 00 00 00"))
        self.assertEqual(self.records("t"), [(0, TS, None, b"hello")])
        # served as stored, byte for byte (§10 "Consume response with data")
        raw.send(consume_frame(7, [("t", 0, 1, 65536)]))
        # boundary fault: seq 50 with hwMark 1
        raw.send(consume_frame(9, [("t", 0, 50, 65536)]))
        frames = yield raw.wait_frames(4)
        self.assertEqual(frames[2], hx(CONSUME_DATA, b=hx(HELLO)))
        self.assertEqual(frames[3], hx(
            "02 2b 00 00 00 27 00 00 00 09 00 00 00 01 01 74 01 00 00 | 01 | 00 x8 |"
            " 01 00 00 00 00 00 00 00 | 00 00 00 00 | 01 00 00 00 00 00 00 00"))
        client = yield self.client()
        [got] = yield client.consume([("t", 0, 1, 65536)])
        self.assertEqual([(m.seq, m.value) for m in got.messages], [(1, b"hello")])

    @defer.inlineCallbacks
    def test_04_offset_41_is_seq_42(self):
        yield self.start()
        rust = yield self.rustlog()
        offsets = yield rust.produce("t", 0, [b"r%d" % i for i in range(42)])
        self.assertEqual(offsets[-1], 41)
        raw = yield self.raw()
        raw.send(consume_frame(13, [("t", 0, 42, 65536)]))
        frames = yield raw.wait_frames(2)
        resp = c.decode_response(*_split(frames[1]))
        entry = resp.topics[0].entries[0]
        self.assertEqual((entry.flags, entry.base_seq, entry.hw_mark), (0, 42, 42))
        messages, complete = c.decode_chunk(entry.chunk, entry.base_seq)
        self.assertEqual([(s, v) for s, _, _, v in messages], [(42, b"r41")])
        self.assertTrue(complete)

    @defer.inlineCallbacks
    def test_05_snappy_and_dense_sparse_accepted_gaps_refused(self):
        yield self.start()
        client = yield self.client()
        snappy = bundle(b"abc" * 8, b"abc" * 8, compress=True)
        codes = yield client.produce_bundles([("t", 0, snappy)])
        self.assertEqual(codes, {("t", 0): 0})
        self.assertEqual([r[3] for r in self.records("t")], [b"abc" * 8] * 2)
        # hwMark is 2: a sparse bundle must start at seq 3
        for seqs in ([3, 4, 8], [4, 5, 6], [2, 3, 4]):
            codes = yield client.produce_bundles(
                [("t", 0, bundle(b"a", b"b", b"c", seqs=seqs))])
            self.assertEqual(codes, {("t", 0): c.ERR_INVALID_SEQ}, seqs)
        self.assertEqual(self.state("t").high_watermark, 2)
        dense = bundle(b"a", b"b", b"c", seqs=[3, 4, 5])
        codes = yield client.produce_bundles([("t", 0, dense)])
        self.assertEqual(codes, {("t", 0): 0})
        self.assertEqual([(r[0], r[3]) for r in self.records("t", offset=2)],
                         [(2, b"a"), (3, b"b"), (4, b"c")])

    @defer.inlineCallbacks
    def test_05_sparse_first_bundle_is_served_as_stored_with_flag_fe(self):
        yield self.start()
        rust = yield self.rustlog()
        yield rust.produce("t", 0, [b"r"] * 99)
        client = yield self.client()
        codes = yield client.produce_bundles([("t", 0, hx(SPARSE_DENSE))])
        self.assertEqual(codes, {("t", 0): 0})
        raw = yield self.raw()
        raw.send(consume_frame(12, [("t", 0, 100, 65536)]))
        frames = yield raw.wait_frames(2)
        self.assertEqual(frames[1], hx(
            "02 37 00 00 00 17 00 00 00 0c 00 00 00 01 01 74 01 00 00 fe | 66 00 00 00 00 00 00 00"
            " | 1c 00 00 00 || 1b <b>", b=hx(SPARSE_DENSE)))
        fetched = yield client.fetch("t", 0, 101)
        self.assertEqual([(m.seq, m.value) for m in fetched.messages], [(101, b"b"), (102, b"c")])

    @defer.inlineCallbacks
    def test_06_malformed_bundles_fail_only_their_partition(self):
        yield self.start(topics={"default_partitions": 6})
        client = yield self.client()
        good = hx(HELLO)
        bad_count = bytes([0x08]) + good[1:]
        bad_snappy = bytes([0x05]) + b"\x10\x7f\x00"
        trailing = good + b"\x00"
        bit7 = bytes([good[0] | 0x80]) + good[1:]
        items = [("t", 0, good), ("t", 1, bad_count), ("t", 2, bad_snappy), ("t", 3, trailing),
                 ("t", 4, bit7), ("t", 5, good)]
        codes = yield client.produce_bundles(items)
        self.assertEqual(codes, {("t", 0): 0, ("t", 1): 2, ("t", 2): 2, ("t", 3): 2,
                                 ("t", 4): 2, ("t", 5): 0})
        for p, count in enumerate([1, 0, 0, 0, 0, 1]):
            self.assertEqual(len(self.records("t", p)), count)

    @defer.inlineCallbacks
    def test_07_unknown_topic_is_one_byte_and_seqnum_replies_as_produce(self):
        yield self.start(topics={"auto_create": False})
        yield self.bus.execute(cmd.CreateTopic("t", 1))
        raw = yield self.raw()
        frame = produce_frame(2, [("t", [(0, hx(HELLO)), (1, hx(HELLO))]),
                                  ("zz", [(0, hx(HELLO)), (1, hx(HELLO)), (2, hx(HELLO))])])
        raw.send(frame)
        frames = yield raw.wait_frames(2)
        self.assertEqual(frames[1], hx("01 07 00 00 00 | 02 00 00 00 | 00 01 | ff"))
        raw.send(produce_frame(3, [("t", [(0, hx(HELLO), 2)])], with_seqnum=True))
        frames = yield raw.wait_frames(3)
        self.assertEqual(frames[2], hx("01 05 00 00 00 | 03 00 00 00 | 00"))
        self.assertEqual([r[0] for r in self.records("t")], [0, 1])

    @defer.inlineCallbacks
    def test_07_invalid_topic_name_is_unknown_and_never_created(self):
        yield self.start()
        client = yield self.client()
        codes = yield client.produce_bundles([("bad/name", 0, hx(HELLO)), ("..", 0, hx(HELLO))])
        self.assertEqual(codes, {("bad/name", 0): 0xFF, ("..", 0): 0xFF})
        self.assertEqual(self.service.store.topic_names(), [])

    @defer.inlineCallbacks
    def test_08_v2_and_v3_answer_the_same(self):
        yield self.start()
        client = yield self.client()
        yield client.produce("t", 0, [b"a", b"b"])
        raw = yield self.raw()
        raw.send(consume_frame(7, [("t", 0, 1, 65536)], version=2))
        raw.send(consume_frame(7, [("t", 0, 1, 65536)], version=3))
        frames = yield raw.wait_frames(3)
        self.assertEqual(frames[1], frames[2])

    @defer.inlineCallbacks
    def test_09_seq_zero_and_boundaries_after_retention(self):
        yield self.start(storage={"segment_bytes": 1024, "retention": {"bytes": 1}})
        client = yield self.client()
        for i in range(8):
            yield client.produce("t", 0, [b"%d" % i + b"x" * 300])
        self.assertGreater(self.service.store.enforce_retention(), 0)
        state = self.state("t")
        first_avail = state.log_start + 1
        self.assertGreater(first_avail, 1)
        [got] = yield client.consume([("t", 0, 0, 1 << 20)])
        self.assertEqual(got.messages[0].seq, first_avail)
        self.assertEqual(got.messages[0].value[:1], b"%d" % (first_avail - 1))
        [got] = yield client.consume([("t", 0, 1, 1 << 20)])
        self.assertEqual((got.flags, got.hw_mark, got.first_avail), (FETCH_BOUNDARY, 8,
                                                                       first_avail))
        [got] = yield client.consume([("t", 0, 10, 1 << 20)])
        self.assertEqual((got.flags, got.first_avail), (FETCH_BOUNDARY, first_avail))
        # the client's fetch retries from the first available seq
        fetched = yield client.fetch("t", 0, 1)
        self.assertEqual(fetched.messages[0].seq, first_avail)
        self.assertEqual(fetched.next_seq, 9)
        with self.assertRaises(TankError):
            yield client.fetch("t", 0, 10)
        # DiscoverPartitions agrees
        [seqs] = yield client.discover_partitions("t")
        self.assertEqual((seqs.first_avail, seqs.hw_mark), (first_avail, 8))

    @defer.inlineCallbacks
    def test_09_tail_and_next_seq_are_eof(self):
        yield self.start()
        client = yield self.client()
        yield client.produce("t", 0, [b"a"])
        for seq in (2, c.TAIL_SEQ):
            [got] = yield client.consume([("t", 0, seq, 1 << 20)])
            self.assertEqual((got.flags, got.base_seq, got.hw_mark, got.messages),
                             (0, 1, 1, ()))

    @defer.inlineCallbacks
    def test_10_unknown_topic_and_partition_over_the_socket(self):
        yield self.start(topics={"auto_create": False})
        yield self.bus.execute(cmd.CreateTopic("t", 1))
        raw = yield self.raw()
        raw.send(consume_frame(10, [("nope", 0, 1, 100)]))
        raw.send(consume_frame(11, [("t", 5, 1, 100)]))
        frames = yield raw.wait_frames(3)
        self.assertEqual(frames[1], hx(
            "02 11 00 00 00 0d 00 00 00 0a 00 00 00 01 04 6e 6f 70 65 01 ff ff"))
        self.assertEqual(frames[2], hx("02 0f 00 00 00 0b 00 00 00 0b 00 00 00 01 01 74 01 05 00 ff"))

    @defer.inlineCallbacks
    def test_11_long_poll_wakes_on_append(self):
        yield self.start()
        client = yield self.client()
        yield client.produce("t", 0, [b"old"])
        started = time.monotonic()
        parked = client.consume([("t", 0, 2, 65536)], max_wait_ms=30000)
        yield sleep(0.05)
        self.assertFalse(parked.called)
        self.assertEqual(self.bus.parked, 1)
        other = yield self.client()
        yield other.produce("t", 0, [b"new"])
        [got] = yield parked
        self.assertLess(time.monotonic() - started, 20)
        self.assertEqual((got.base_seq, got.hw_mark), (2, 2))
        self.assertEqual([(m.seq, m.value) for m in got.messages], [(2, b"new")])

    @defer.inlineCallbacks
    def test_11_long_poll_times_out_with_zero_base(self):
        yield self.start()
        client = yield self.client()
        yield client.produce("t", 0, [b"a"])
        raw = yield self.raw()
        started = time.monotonic()
        raw.send(consume_frame(8, [("t", 0, 2, 65536)], max_wait_ms=1))
        frames = yield raw.wait_frames(2)
        self.assertGreaterEqual(time.monotonic() - started, 0.3)   # clamped up to 320 ms
        self.assertEqual(frames[1], hx(
            "02 23 00 00 00 1f 00 00 00 08 00 00 00 01 01 74 01 00 00 00 | 00 x8 |"
            " 01 00 00 00 00 00 00 00 | 00 00 00 00"))
        self.assertEqual(self.bus.parked, 0)

    @defer.inlineCallbacks
    def test_11_max_wait_zero_answers_at_once(self):
        yield self.start()
        client = yield self.client()
        [got] = yield client.consume([("t0", 0, 0, 100)])
        self.assertIsNone(got.flags)        # consume never creates a topic
        yield client.produce("t", 0, [b"a"])
        [got] = yield client.consume([("t", 0, 2, 100)], max_wait_ms=0)
        self.assertEqual((got.flags, got.base_seq, got.hw_mark), (0, 1, 1))
        self.assertEqual(self.bus.parked, 0)

    @defer.inlineCallbacks
    def test_11_min_bytes_waits_for_enough_then_timeout_returns_what_came(self):
        yield self.start()
        client = yield self.client()
        writer = yield self.client()
        yield client.produce("t", 0, [b"a"])
        parked = client.consume([("t", 0, 2, 1 << 20)], max_wait_ms=30000, min_bytes=2000)
        yield sleep(0.05)
        yield writer.produce("t", 0, [b"small"])
        yield sleep(0.1)
        self.assertFalse(parked.called)
        yield writer.produce("t", 0, [b"x" * 3000], compress=False)
        [got] = yield parked
        self.assertEqual([m.seq for m in got.messages], [2, 3])
        self.assertEqual(got.base_seq, 2)
        # below minBytes at the timeout: what arrived is delivered
        parked = client.consume([("t", 0, 4, 1 << 20)], max_wait_ms=320, min_bytes=1 << 20)
        yield sleep(0.05)
        yield writer.produce("t", 0, [b"tiny"])
        [got] = yield parked
        self.assertEqual([(m.seq, m.value) for m in got.messages], [(4, b"tiny")])

    @defer.inlineCallbacks
    def test_11_several_partitions_park_together(self):
        yield self.start(topics={"default_partitions": 3})
        client = yield self.client()
        writer = yield self.client()
        yield writer.produce("t", 0, [b"a"])
        parked = client.consume([("t", 0, 2, 65536), ("t", 1, 0, 65536), ("t", 2, c.TAIL_SEQ, 100)],
                                max_wait_ms=30000)
        yield sleep(0.05)
        self.assertFalse(parked.called)
        yield writer.produce("t", 2, [b"two"])
        got = yield parked
        self.assertEqual([(g.partition, g.base_seq, g.hw_mark) for g in got],
                         [(0, 0, 1), (1, 0, 0), (2, 1, 1)])
        self.assertEqual([m.value for m in got[2].messages], [b"two"])

    @defer.inlineCallbacks
    def test_11_parked_consumer_does_no_work_while_idle(self):
        yield self.start()
        client = yield self.client()
        yield client.produce("t", 0, [b"a"])
        reads = []
        store = self.service.store
        original = store.read
        store.read = lambda *a: (reads.append(a), original(*a))[1]
        self.addCleanup(setattr, store, "read", original)
        calls_before = len(reactor.getDelayedCalls())
        parked = client.consume([("t", 0, 2, 65536)], max_wait_ms=60000)
        yield sleep(0.05)
        reads.clear()
        yield sleep(0.3)
        self.assertEqual(reads, [])
        self.assertLessEqual(len(reactor.getDelayedCalls()), calls_before + 1)   # its timeout
        yield client.produce("t", 0, [b"b"])
        [got] = yield parked
        self.assertEqual([m.value for m in got.messages], [b"b"])

    @defer.inlineCallbacks
    def test_11_closing_the_connection_cancels_the_parked_consume(self):
        yield self.start()
        yield self.bus.execute(cmd.CreateTopic("t", 1))
        client = yield connect(reactor, "127.0.0.1", self.ports["tank"])
        parked = client.consume([("t", 0, c.TAIL_SEQ, 100)], max_wait_ms=60000)
        parked.addErrback(lambda f: None)
        yield sleep(0.05)
        self.assertEqual(self.bus.parked, 1)
        yield client.close()
        for _ in range(50):
            if self.bus.parked == 0:
                break
            yield sleep(0.02)
        self.assertEqual(self.bus.parked, 0)

    @defer.inlineCallbacks
    def test_12_eof_partition_beside_data_answers_at_once(self):
        yield self.start(topics={"default_partitions": 2})
        client = yield self.client()
        yield client.produce("t", 0, [b"a", b"b"])
        yield client.produce("t", 1, [b"c"])
        got = yield client.consume([("t", 0, 3, 65536), ("t", 1, 1, 65536)], max_wait_ms=60000,
                                   min_bytes=1 << 20)
        self.assertEqual([(g.base_seq, g.hw_mark, len(g.messages)) for g in got],
                         [(1, 2, 0), (1, 1, 1)])

    @defer.inlineCallbacks
    def test_13_fetch_size_is_honoured_at_bundle_boundaries(self):
        yield self.start()
        client = yield self.client()
        big = bundle(b"x" * 500, compress=False)
        small = [bundle(b"s%d" % i, compress=False) for i in range(3)]
        for b in [big] + small:
            codes = yield client.produce_bundles([("t", 0, b)])
            self.assertEqual(codes, {("t", 0): 0})
        # the first bundle is whole even though it exceeds fetchSize
        [got] = yield client.consume([("t", 0, 1, 100)])
        self.assertEqual([m.seq for m in got.messages], [1])
        self.assertTrue(got.complete)
        # later bundles only while the chunk stays within fetchSize
        each = 1 + len(small[0])
        for room, seqs in ((each, [2]), (2 * each, [2, 3]), (2 * each + 1, [2, 3]),
                           (3 * each, [2, 3, 4])):
            [got] = yield client.consume([("t", 0, 2, room)])
            self.assertEqual([m.seq for m in got.messages], seqs, room)
            self.assertTrue(got.complete)

    @defer.inlineCallbacks
    def test_13_foreign_batches_are_cut_at_records_to_fit(self):
        yield self.start()
        rust = yield self.rustlog()
        yield rust.produce("t", 0, [b"%03d" % i + b"y" * 96 for i in range(100)])
        raw = yield self.raw()
        raw.send(consume_frame(1, [("t", 0, 11, 1000)]))
        frames = yield raw.wait_frames(2)
        entry = c.decode_response(*_split(frames[1])).topics[0].entries[0]
        self.assertLessEqual(len(entry.chunk), 1000)
        messages, complete = c.decode_chunk(entry.chunk, entry.base_seq)
        self.assertTrue(complete)
        self.assertEqual(entry.base_seq, 11)
        self.assertGreater(len(messages), 5)
        self.assertEqual([m[3][:3] for m in messages],
                         [b"%03d" % (10 + i) for i in range(len(messages))])
        # with no room at all, one record still goes out
        raw.send(consume_frame(2, [("t", 0, 50, 1)]))
        frames = yield raw.wait_frames(3)
        entry = c.decode_response(*_split(frames[2])).topics[0].entries[0]
        messages, _ = c.decode_chunk(entry.chunk, entry.base_seq)
        self.assertEqual([(s, v[:3]) for s, _, _, v in messages], [(50, b"049")])

    @defer.inlineCallbacks
    def test_14_no_message_above_hw_mark(self):
        yield self.start()
        client = yield self.client()
        for i in range(5):
            yield client.produce("t", 0, [b"%d" % i] * 3)
        raw = yield self.raw()
        raw.send(consume_frame(1, [("t", 0, 0, 1 << 20)]))
        frames = yield raw.wait_frames(2)
        entry = c.decode_response(*_split(frames[1])).topics[0].entries[0]
        messages, _ = c.decode_chunk(entry.chunk, entry.base_seq)
        self.assertEqual(max(s for s, _, _, _ in messages), entry.hw_mark)
        self.assertEqual(entry.hw_mark, 15)

    @defer.inlineCallbacks
    def test_15_long_kafka_keys_arrive_as_no_key(self):
        yield self.start()
        yield self.bus.execute(cmd.Produce("t", 0, RecordBatch(
            [b"v1", b"v2", b"v3"], keys=[b"k" * 300, b"", None], timestamps=[5, 5, 6])))
        client = yield self.client()
        fetched = yield client.fetch("t", 0, 0)
        self.assertEqual([(m.seq, m.ts, m.key, m.value) for m in fetched.messages],
                         [(1, 5, None, b"v1"), (2, 5, b"", b"v2"), (3, 6, None, b"v3")])

    @defer.inlineCallbacks
    def test_16_create_topic_and_discover_topics(self):
        yield self.start()
        client = yield self.client()
        raw = yield self.raw()
        raw.send(hx("07 0e 00 00 00 06 00 00 00 06 65 76 65 6e 74 73 04 00 00"))
        frames = yield raw.wait_frames(2)
        self.assertEqual(frames[1], hx("07 0c 00 00 00 06 00 00 00 06 65 76 65 6e 74 73 00"))
        self.assertEqual((yield client.create_topic("events", 4)), c.CREATE_EXISTS)
        self.assertEqual((yield client.create_topic("zero", 0)), c.CREATE_INVALID)
        self.assertEqual((yield client.create_topic("a/b", 1)), c.CREATE_INVALID)
        self.assertEqual((yield client.create_topic("many", 5000)), c.CREATE_INVALID)
        self.assertEqual((yield client.create_topic("cfg", 1, b"retention=1\nbroken")),
                         c.CREATE_BAD_CONFIG)
        self.assertEqual((yield client.create_topic("t", 1, b"# ok\nretention.segments.cnt=2")),
                         c.CREATE_OK)
        raw.send(hx("0b 05 00 00 00 08 00 00 00 00"))
        frames = yield raw.wait_frames(3)
        self.assertEqual(frames[2], hx(
            "0b 18 00 00 00 08 00 00 00 02 00 00 00 00 06 65 76 65 6e 74 73 01 04 00 01 74 01 01 00"))

    @defer.inlineCallbacks
    def test_17_discover_partitions(self):
        yield self.start(topics={"default_partitions": 2})
        rust = yield self.rustlog()
        yield rust.produce("t", 0, [b"x"] * 42)
        raw = yield self.raw()
        raw.send(hx("06 06 00 00 00 05 00 00 00 01 74"))
        frames = yield raw.wait_frames(2)
        self.assertEqual(frames[1], hx(
            "06 28 00 00 00 05 00 00 00 01 74 02 00 | 01 00 x7 2a 00 x7 | 00 x16"))
        client = yield self.client()
        self.assertEqual((yield client.discover_partitions("nope")), [])
        self.assertEqual((yield client.discover_partitions("a/b")), [])
        seqs = yield client.discover_partitions("t", [1, 7])
        self.assertEqual(seqs, [c.PartitionSeqs(0, 0), c.PartitionSeqs(c.U64_MAX, c.U64_MAX, 0xFB)])
        self.assertEqual(self.service.store.topic_names(), ["t"])

    @defer.inlineCallbacks
    def test_18_bad_frames_close_only_their_connection(self):
        yield self.start()
        client = yield self.client()
        for data in (c.frame(0x04, b"\x00" * 8), c.frame(0x09, b""), c.frame(0x42, b"x"),
                     c.FRAME_HEADER.pack(c.PRODUCE, c.DEFAULT_MAX_FRAME_BYTES + 1),
                     c.frame(c.CONSUME, hx("02 00 07 00 00 00 00 e8 03")),
                     c.frame(c.STATUS, b"\x01")):
            raw = yield self.raw()
            raw.send(data)
            yield raw.lost
            self.assertEqual(raw.frames(), [c.PING_FRAME])
            yield client.produce("t", 0, [b"ok"])
        self.assertEqual(len(self.records("t")), 6)

    @defer.inlineCallbacks
    def test_18_client_pings_are_ignored(self):
        yield self.start()
        raw = yield self.raw()
        raw.send(c.PING_FRAME + c.encode_request(c.StatusRequest(4)))
        frames = yield raw.wait_frames(2)
        self.assertEqual(frames[1][:9], hx("0a 1e 00 00 00 04 00 00 00"))

    @defer.inlineCallbacks
    def test_20_pipelined_produces_before_the_ping_and_a_partition_named_twice(self):
        yield self.start()
        raw = yield self.raw()
        hello = hx(PRODUCE_HELLO, bundle=hx(HELLO))
        world = produce_frame(2, [("t", [(0, bundle(b"world"))])])
        twice = produce_frame(3, [("t", [(0, bundle(b"b1", ts=0)), (0, bundle(b"b2", ts=0))])])
        raw.send(hello + world + twice)
        frames = yield raw.wait_frames(4)
        self.assertEqual(frames[1:], [hx("01 05 00 00 00 01 00 00 00 00"),
                                      hx("01 05 00 00 00 02 00 00 00 00"),
                                      hx("01 06 00 00 00 03 00 00 00 00 00")])
        self.assertEqual([(r[0], r[1], r[3]) for r in self.records("t")],
                         [(0, TS, b"hello"), (1, TS, b"world"), (2, 0, b"b1"), (3, 0, b"b2")])

    @defer.inlineCallbacks
    def test_21_record_over_the_limit_fails_its_partition(self):
        yield self.start(limits={"max_record_bytes": 1000}, topics={"default_partitions": 2})
        client = yield self.client()
        codes = yield client.produce_bundles([("t", 0, bundle(b"ok", b"z" * 1001)),
                                              ("t", 1, bundle(b"fine"))])
        self.assertEqual(codes, {("t", 0): c.ERR_INVALID_BUNDLE, ("t", 1): 0})
        self.assertEqual(self.records("t", 0), [])
        self.assertEqual([r[3] for r in self.records("t", 1)], [b"fine"])


class DurabilityTests(TankCase):

    @defer.inlineCallbacks
    def test_19_acknowledged_under_fsync_always_and_served_after_restart(self):
        yield self.start(storage={"fsync": "always"})
        client = yield self.client()
        synced = []
        syncer = self.service.store.syncer
        original = syncer.after_sync
        syncer.after_sync = lambda path, cb: original(path, lambda err: (synced.append(path),
                                                                         cb(err)))
        yield client.produce("t", 0, [b"a", b"b"])
        self.assertTrue(synced)
        yield client.close()
        yield self.service.stopService()
        self.service, self.ports = yield start_gateway(self, self.config)
        client = yield self.client()
        fetched = yield client.fetch("t", 0, 0)
        self.assertEqual([(m.seq, m.value) for m in fetched.messages], [(1, b"a"), (2, b"b")])


class SeqnumTests(TankCase):
    """ProduceWithSeqnum (0x05): a dense continuation only (§4)."""

    @defer.inlineCallbacks
    def test_first_seq_must_be_hw_mark_plus_one(self):
        yield self.start()
        client = yield self.client()
        yield client.produce("t", 0, [b"a"], first_seq=1)
        yield client.produce("t", 0, [b"b", b"c"], first_seq=2)
        for seq in (1, 3, 5):
            with self.assertRaises(TankError) as caught:
                yield client.produce("t", 0, [b"x"], first_seq=seq)
            self.assertEqual(caught.exception.code, c.ERR_INVALID_SEQ)
        yield client.produce("t", 0, [b"d"], first_seq=4)
        # 0 means "not given"
        codes = yield client.produce_bundles([("t", 0, bundle(b"e"), 0)], with_seqnum=True)
        self.assertEqual(codes, {("t", 0): 0})
        self.assertEqual([(r[0], r[3]) for r in self.records("t")],
                         [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d"), (4, b"e")])

    @defer.inlineCallbacks
    def test_sparse_bundle_must_agree_with_first_msg_seq(self):
        yield self.start()
        client = yield self.client()
        codes = yield client.produce_bundles([("t", 0, bundle(b"a", b"b", seqs=[1, 2]), 2)],
                                             with_seqnum=True)
        self.assertEqual(codes, {("t", 0): c.ERR_INVALID_SEQ})
        codes = yield client.produce_bundles([("t", 0, bundle(b"a", b"b", seqs=[1, 2]), 1)],
                                             with_seqnum=True)
        self.assertEqual(codes, {("t", 0): 0})

    @defer.inlineCallbacks
    def test_pipelined_continuations_before_fsync(self):
        """The check is against the next offset, not the durable end: a
        client that pipelines 0x05 frames is not refused for being fast."""
        yield self.start(storage={"fsync": "interval", "fsync_interval_ms": 50})
        client = yield self.client()
        results = yield defer.gatherResults([
            client.produce_bundles([("t", 0, bundle(b"%d" % i), i + 1)], with_seqnum=True)
            for i in range(20)])
        self.assertEqual([r[("t", 0)] for r in results], [0] * 20)
        self.assertEqual([r[3] for r in self.records("t")], [b"%d" % i for i in range(20)])


class SealedTests(TankCase):

    @defer.inlineCallbacks
    def test_read_only_topic_and_sealed_partition(self):
        yield self.start(topics={"default_partitions": 2})
        client = yield self.client()
        yield client.produce("t", 0, [b"a"])
        yield self.bus.execute(cmd.SealPartition("t", 0))
        codes = yield client.produce_bundles([("t", 0, hx(HELLO)), ("t", 1, hx(HELLO))])
        self.assertEqual(codes, {("t", 0): c.ERR_INVALID_BUNDLE, ("t", 1): 0})
        yield self.bus.execute(cmd.SealPartition("t", 1))
        raw = yield self.raw()
        raw.send(produce_frame(9, [("t", [(0, hx(HELLO)), (1, hx(HELLO))])]))
        frames = yield raw.wait_frames(2)
        self.assertEqual(frames[1], hx("01 05 00 00 00 09 00 00 00 fe"))
        fetched = yield client.fetch("t", 0, 0)
        self.assertEqual([m.value for m in fetched.messages], [b"a"])


class AdminTests(TankCase):

    @defer.inlineCallbacks
    def test_status_reload_conf_and_topology(self):
        yield self.start(topics={"default_partitions": 2})
        client = yield self.client()
        yield client.produce("a", 0, [b"x"])
        yield client.create_topic("b", 3)
        status = yield client.status()
        self.assertEqual((status.topics, status.partitions, status.open_partitions,
                          status.version, status.cluster_aware), (2, 5, 5, 400, 0))
        self.assertLessEqual(abs(status.startup_ts - time.time()), 120)
        self.assertEqual((yield client.reload_conf("a", 1)), c.RELOAD_OK)
        self.assertEqual((yield client.reload_conf("a", 2)), c.RELOAD_UNKNOWN_PARTITION)
        self.assertEqual((yield client.reload_conf("zz", 0)), c.RELOAD_UNKNOWN_TOPIC)
        self.assertEqual((yield client.reload_conf("a/b", 0)), c.RELOAD_UNKNOWN_TOPIC)
        raw = yield self.raw()
        raw.send(hx("0c 05 00 00 00 09 00 00 00 00"))
        frames = yield raw.wait_frames(2)
        self.assertEqual(frames[1], hx("0c 06 00 00 00 09 00 00 00 ff ff"))

    @defer.inlineCallbacks
    def test_parked_consume_is_overtaken_by_later_answers(self):
        yield self.start()
        client = yield self.client()
        yield client.produce("t", 0, [b"a"])
        order = []
        parked = client.consume([("t", 0, 2, 100)], max_wait_ms=30000)
        parked.addCallback(lambda r: order.append("consume"))
        status = client.status().addCallback(lambda r: order.append("status"))
        yield status
        yield client.produce("t", 0, [b"b"])
        yield parked
        self.assertEqual(order, ["status", "consume"])

    @defer.inlineCallbacks
    def test_listener_frame_limit_option(self):
        yield self.start(listeners=[dict(TANK, max_frame_bytes=2048)])
        raw = yield self.raw()
        raw.send(produce_frame(1, [("t", [(0, bundle(b"x" * 3000))])]))
        yield raw.lost
        self.assertEqual(raw.frames(), [c.PING_FRAME])
        client = yield self.client()
        yield client.produce("t", 0, [b"x" * 1000])


def _split(frame_bytes):
    msg_id, size = struct.unpack_from("<BI", frame_bytes)
    return msg_id, frame_bytes[5:5 + size]
