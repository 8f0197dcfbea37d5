"""Figg with the other dialects on one topic, over real sockets (DESIGN's
cross-dialect rule): the same message is RustLog (and Kafka) offset n, TANK
seq n + 1 and Figg DATA offset n + 1; an ATTACH with that offset continues
after it. Records written elsewhere reach Figg subscribers live and from the
backlog, with their values byte for byte and their keys invisible; Figg's
records reach the others without a key, stamped with the receive time.
"""
import time

from twisted.internet import defer, reactor

from plugins.figg import codec as fc
from plugins.rustlog.client import connect as rustlog_connect
from plugins.tank.client import connect as tank_connect
from tests.figg_support import RUSTLOG, FiggTest, data_frames

TANK = {"dialect": "tank", "endpoint": "tcp:0:interface=127.0.0.1"}


class CrossDialectTests(FiggTest):

    @defer.inlineCallbacks
    def start_all(self):
        yield self.start(extra=[RUSTLOG, TANK])
        self.rust = yield rustlog_connect(reactor, "127.0.0.1", self.ports["rustlog"])
        self.addCleanup(self.rust.close)
        self.tank = yield tank_connect(reactor, "127.0.0.1", self.ports["tank"])
        self.addCleanup(self.tank.close)

    @defer.inlineCallbacks
    def test_the_same_message_at_offset_41(self):
        yield self.start_all()
        offsets = yield self.rust.produce("shared", 0, [b"r%d" % i for i in range(41)])
        self.assertEqual(offsets, list(range(41)))
        figg = yield self.raw()
        figg.send(fc.Publish(b"shared", 0, b"hello"))
        self.assertEqual((yield figg.take()), [fc.Ack(0)])
        # Figg: DATA offset 42 for record 41.
        figg.send(fc.Attach(b"shared", 41, fc.FROM_OFFSET))
        self.assertEqual((yield figg.take(2)), [fc.Attached(b"shared", 41),
                                                fc.Data(b"shared", 42, b"hello")])
        # RustLog: offset 41; TANK: seq 42, no key, the receive time.
        got = yield self.rust.fetch("shared", 0, 41)
        self.assertEqual(got.records, [(41, b"hello")])
        fetched = yield self.tank.fetch("shared", 0, 42)
        [message] = fetched.messages
        self.assertEqual((message.seq, message.key, message.value), (42, None, b"hello"))
        self.assertLessEqual(abs(message.ts - time.time() * 1000), 120000)
        # Resuming from DATA offset 42 continues after "hello".
        sub = yield self.raw()
        sub.send(fc.Attach(b"shared", 42, fc.FROM_OFFSET))
        self.assertEqual((yield sub.take()), [fc.Attached(b"shared", 42)])
        yield self.rust.produce("shared", 0, [b"next"])
        self.assertEqual((yield sub.take()), [fc.Data(b"shared", 43, b"next")])

    @defer.inlineCallbacks
    def test_other_dialects_records_reach_figg_from_the_backlog_and_live(self):
        yield self.start_all()
        yield self.rust.produce("mixed", 0, [b"rust-0", b"rust-1"])
        yield self.tank.produce("mixed", 0, [b"tank-2", b"tank-3"], keys=[b"k", None])
        yield self.tank.produce("mixed", 0, [b"tank-4"], compress=True)
        backlog = [b"rust-0", b"rust-1", b"tank-2", b"tank-3", b"tank-4"]
        from_start = yield self.raw()
        latest = yield self.raw()
        from_start.send(fc.Attach(b"mixed", 0, fc.FROM_OFFSET))
        latest.send(fc.Attach(b"mixed"))
        self.assertEqual((yield from_start.take(6)),
                         [fc.Attached(b"mixed", 0)] + data_frames(b"mixed", 1, backlog))
        self.assertEqual((yield latest.take()), [fc.Attached(b"mixed", 5)])
        yield self.tank.produce("mixed", 0, [b"tank-5"], keys=[b"key"])
        yield self.rust.produce("mixed", 0, [b"rust-6"])
        live = data_frames(b"mixed", 6, [b"tank-5", b"rust-6"])
        self.assertEqual((yield from_start.take(2)), live)
        self.assertEqual((yield latest.take(2)), live)

    @defer.inlineCallbacks
    def test_figg_records_reach_the_other_dialects(self):
        yield self.start_all()
        figg = yield self.raw()
        values = [b"", b"\x00\xff binary", b"x" * 5000]
        figg.send(*[fc.Publish(b"out", i, v) for i, v in enumerate(values)])
        yield figg.take(3)
        got = yield self.rust.fetch("out", 0, 0)
        self.assertEqual(got.records, list(enumerate(values)))
        fetched = yield self.tank.fetch("out", 0, 1)
        self.assertEqual([(m.seq, m.key, m.value) for m in fetched.messages],
                         [(o + 1, None, v) for o, v in enumerate(values)])
