"""TANK and RustLog on one topic, both ways, over real sockets (DESIGN's
cross-dialect rule): the same message is RustLog offset n and TANK seq n+1.

TANK-written bundles (plain, keyed, Snappy, sparse) are read by RustLog
through the decoder the TANK dialect registers; RustLog-written records are
served to TANK as gateway-encoded bundles; a TANK consumer parked at the
tail is woken by a RustLog append.
"""
import time

from twisted.internet import defer

from plugins.tank import codec as c
from tests.test_tank_server import TankCase, bundle, sleep


class CrossDialectTests(TankCase):

    @defer.inlineCallbacks
    def test_tank_produce_rustlog_fetch(self):
        yield self.start()
        tank = yield self.client()
        rust = yield self.rustlog()
        items = [
            ("t", 0, bundle(b"plain-1", b"plain-2")),
            ("t", 0, c.encode_bundle([b"keyed"], [b"k"], [5])),
            ("t", 0, bundle(*[b"snappy-%d" % i for i in range(20)], compress=True)),
            ("t", 0, bundle(b"sparse-a", b"sparse-b", seqs=[24, 25])),
        ]
        for item in items:
            codes = yield tank.produce_bundles([item])
            self.assertEqual(codes, {("t", 0): 0})
        got = yield rust.fetch("t", 0, 0, max_bytes=1 << 20)
        values = [b"plain-1", b"plain-2", b"keyed"] + [b"snappy-%d" % i for i in range(20)] + [
            b"sparse-a", b"sparse-b"]
        self.assertEqual(got.records, list(enumerate(values)))
        self.assertEqual(got.next_offset, 25)
        fetched = yield tank.fetch("t", 0, 1)
        self.assertEqual([(m.seq, m.value) for m in fetched.messages],
                         [(o + 1, v) for o, v in enumerate(values)])

    @defer.inlineCallbacks
    def test_rustlog_produce_tank_consume(self):
        yield self.start()
        tank = yield self.client()
        rust = yield self.rustlog()
        offsets = yield rust.produce("t", 0, [b"r%d" % i for i in range(41)])
        self.assertEqual(offsets, list(range(41)))
        [offset] = yield rust.produce("t", 0, [b"x"])
        self.assertEqual(offset, 41)
        fetched = yield tank.fetch("t", 0, 42)
        [message] = fetched.messages
        self.assertEqual((message.seq, message.key, message.value), (42, None, b"x"))
        self.assertLessEqual(abs(message.ts - time.time() * 1000), 120000)
        [seqs] = yield tank.discover_partitions("t")
        self.assertEqual((seqs.first_avail, seqs.hw_mark), (1, 42))

    @defer.inlineCallbacks
    def test_interleaved_writers_agree_on_positions(self):
        yield self.start()
        tank = yield self.client()
        rust = yield self.rustlog()
        yield tank.produce("t", 0, [b"t0", b"t1"])
        yield rust.produce("t", 0, [b"r2", b"r3", b"r4"])
        yield tank.produce("t", 0, [b"t5"], compress=True)
        yield rust.produce("t", 0, [b"r6"])
        from_rust = yield rust.fetch("t", 0, 0)
        from_tank = yield tank.fetch("t", 0, 0)
        self.assertEqual([(o + 1, v) for o, v in from_rust.records],
                         [(m.seq, m.value) for m in from_tank.messages])
        self.assertEqual([m.seq for m in from_tank.messages], list(range(1, 8)))
        # reading from the middle of a stored TANK bundle and of a RustLog batch
        mid = yield tank.fetch("t", 0, 2)
        self.assertEqual([m.value for m in mid.messages][:2], [b"t1", b"r2"])
        mid = yield tank.fetch("t", 0, 4)
        self.assertEqual([m.value for m in mid.messages], [b"r3", b"r4", b"t5", b"r6"])
        part = yield rust.fetch("t", 0, 5)
        self.assertEqual(part.records, [(5, b"t5"), (6, b"r6")])

    @defer.inlineCallbacks
    def test_tank_consumer_at_the_tail_is_woken_by_rustlog(self):
        yield self.start()
        tank = yield self.client()
        rust = yield self.rustlog()
        yield rust.produce("t", 0, [b"first"])
        parked = tank.fetch("t", 0, c.TAIL_SEQ, max_wait_ms=30000)
        yield sleep(0.05)
        self.assertFalse(parked.called)
        [offset] = yield rust.produce("t", 0, [b"second"])
        fetched = yield parked
        self.assertEqual([(m.seq, m.value) for m in fetched.messages], [(offset + 1, b"second")])
        self.assertEqual(fetched.next_seq, 3)
