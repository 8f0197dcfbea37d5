"""Figg flow control over real sockets (figg.md §1 Backpressure, §7, §9.13).

A subscriber that stops reading holds at most ``max_buffered_bytes`` of DATA
in the gateway's transport (plus one frame) and one read chunk of held
records, while a fast subscriber and the publishers carry on; after it
reads again it gets every record in order. A publisher that stops reading
its ACKs is no longer read from. Retention that runs while a subscriber is
paused moves its stream up to the new log start.
"""
import itertools
import resource
import socket

from twisted.internet import defer, reactor, task

from gateway import commands as c
from gateway import protocol as gateway_protocol
from plugins.figg import codec as fc
from tests.figg_support import FiggTest, wait_until

KiB = 1024
MiB = 1024 * KiB


def buffered(transport):
    """Bytes a Twisted TCP transport holds, not yet handed to the kernel."""
    return len(transport.dataBuffer) - transport.offset + transport._tempDataLen


def slow_link(server, client):
    """Fix the kernel's buffers from the gateway to the client small (no
    autotuning), as on a slow link, so that a hundred kilobytes fill them."""
    server.getHandle().setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 * KiB)
    client.getHandle().setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * KiB)


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


class Sequence:
    """Checks a subscriber's messages as they come, keeping nothing: offsets
    contiguous from 1, and each publisher's records (``p:i:...``) in order
    with none missing or repeated."""

    def __init__(self):
        self.next = 1
        self.count = 0
        self.per_publisher = {}
        self.errors = []

    def __call__(self, message):
        p, i = message.data.split(b":")[:2]
        expected = self.per_publisher.get(p, 0)
        if message.offset != self.next or (i != b"done" and int(i) != expected):
            self.errors.append((self.next, message.offset, message.data[:20]))
        self.per_publisher[p] = expected + 1
        self.next = message.offset + 1
        self.count += 1


class FlowTests(FiggTest):

    def server_side(self, client):
        """The gateway's protocol for one of our client connections."""
        port = client._proto.transport.getHost().port
        [proto] = [p for p in self.factory().connections
                   if p.transport.getPeer().port == port]
        return proto

    @defer.inlineCallbacks
    def test_a_stalled_subscriber_is_bounded_while_everyone_else_carries_on(self):
        bound = 256 * KiB
        yield self.start(figg={"max_buffered_bytes": bound})
        publishers = 2
        per_publisher = 50000
        size = 1 * KiB
        total = publishers * per_publisher

        stalled = yield self.client(ping_interval=0)
        fast = yield self.client(ping_interval=0)
        stalled_seen = Sequence()
        fast_seen = Sequence()
        yield stalled.subscribe("flow", stalled_seen, offset=0)
        yield fast.subscribe("flow", fast_seen, offset=0)
        stalled.pause_reading()
        stalled_proto = self.server_side(stalled)

        samples = {"buffered": 0, "held": 0, "rss": 0}
        base_rss = rss_bytes()

        def sample():
            samples["buffered"] = max(samples["buffered"], buffered(stalled_proto.transport))
            held = sum(len(v) for a in stalled_proto.attachments.values() for v in a.held)
            samples["held"] = max(samples["held"], held)
            samples["rss"] = max(samples["rss"], rss_bytes() - base_rss)
        sampler = task.LoopingCall(sample)
        sampler.clock = reactor
        sampler.start(0.005)
        self.addCleanup(lambda: sampler.running and sampler.stop())

        # Records are values the test can recompute: "publisher:index" padded.
        def record(p, i):
            head = b"%d:%d:" % (p, i)
            return head + b"." * (size - len(head))

        @defer.inlineCallbacks
        def publish(p):
            client = yield self.client(ping_interval=0)
            for i in range(per_publisher):
                yield client.publish("flow", record(p, i))
            yield client.publish_blocking("flow", b"%d:done" % p)

        yield defer.gatherResults([publish(p) for p in range(publishers)])
        yield wait_until(lambda: fast_seen.count == total + publishers)
        sample()
        sampler.stop()

        # Everyone else finished while the stalled subscriber held back.
        self.assertEqual(fast_seen.errors, [])
        self.assertLess(stalled_seen.count, total // 4)
        self.assertTrue(stalled_proto.writing_paused)
        # Its memory in the gateway stayed under the bound: the transport's
        # buffer (plus one frame) and one read chunk of held records.
        frame = fc.DataEncoder(b"flow").overhead + size
        self.assertLessEqual(samples["buffered"], bound + frame)
        self.assertGreater(samples["buffered"], 0)
        self.assertLessEqual(samples["held"], self.factory().read_chunk + 64 * KiB)
        # ~100 MiB went through; an unbounded queue would have kept it all.
        self.assertLess(samples["rss"], 40 * MiB)

        stalled.resume_reading()
        yield wait_until(lambda: stalled_seen.count == total + publishers)
        self.assertEqual(stalled_seen.errors, [])
        self.assertEqual(stalled_seen.per_publisher, fast_seen.per_publisher)
        self.assertEqual(fast_seen.per_publisher, {b"0": per_publisher + 1,
                                                   b"1": per_publisher + 1})

    @defer.inlineCallbacks
    def test_a_publisher_that_reads_no_acks_is_no_longer_read(self):
        yield self.start()
        pub = yield self.raw()
        port = pub.transport.getHost().port
        [proto] = [p for p in self.factory().connections if p.transport.getPeer().port == port]
        slow_link(proto.transport, pub.transport)
        pub.transport.pauseProducing()
        n = 10000
        pub.send(*[fc.Publish(b"noread", i, b"x" * 100) for i in range(n)])
        yield wait_until(lambda: proto.reading_paused)

        def stored():
            return self.successResultOf(self.bus.execute(
                c.PartitionInfo("noread", 0))).high_watermark
        # Nothing more is taken in while the ACKs are not read.
        before = stored()
        yield task.deferLater(reactor, 0.3, lambda: None)
        self.assertEqual(stored(), before)
        self.assertLess(before, n)
        # The transport's 64 KiB, plus the ACKs of what one read (64 KiB,
        # at least 25 bytes a PUBLISH) had brought in before reading stopped.
        self.assertLessEqual(buffered(proto.transport), 64 * KiB + 64 * KiB // 25 * 16)

        pub.transport.resumeProducing()
        acks = yield pub.take(n)
        self.assertEqual(acks, [fc.Ack(i) for i in range(n)])
        self.assertEqual(stored(), n)

    @defer.inlineCallbacks
    def test_retention_while_paused_moves_the_stream_to_the_new_log_start(self):
        yield self.start(figg={"max_buffered_bytes": 128 * KiB},
                         storage={"segment_bytes": 32 * KiB,
                                  "retention": {"hours": None, "bytes": 128 * KiB}})
        sub = yield self.client(ping_interval=0)
        got = []
        yield sub.subscribe("ret", lambda m: got.append(m.offset), offset=0)
        proto = self.server_side(sub)
        slow_link(proto.transport, sub._proto.transport)
        sub.pause_reading()
        pub = yield self.raw()
        value = b"r" * 4000
        sent = 0
        # Enough that the socket buffers fill and the gateway pauses.
        while not proto.writing_paused or sent < 200:
            pub.send(*[fc.Publish(b"ret", sent + i, value) for i in range(50)])
            yield pub.take(50)
            sent += 50
            self.assertLess(sent, 100000)
        self.assertGreater(self.service.store.enforce_retention(), 0)
        state = yield self.bus.execute(c.PartitionInfo("ret", 0))
        self.assertGreater(state.log_start, len(got))
        sub.resume_reading()
        yield wait_until(lambda: got and got[-1] == sent)
        # In order, contiguous, except for one jump over what retention deleted.
        jumps = [(a, b) for a, b in itertools.pairwise(got) if b != a + 1]
        self.assertEqual(len(jumps), 1, jumps)
        self.assertEqual(got[0], 1)
        self.assertLess(jumps[0][0], state.log_start + 1)
        self.assertGreaterEqual(jumps[0][1], state.log_start + 1)

    @defer.inlineCallbacks
    def test_a_stalled_subscriber_does_not_hold_up_the_gateway_stopping(self):
        self.patch(gateway_protocol, "CLOSE_GRACE_SECONDS", 0.2)
        yield self.start()
        sub = yield self.raw()
        proto = self.factory().connections.copy().pop()
        slow_link(proto.transport, sub.transport)
        sub.send(fc.Attach(b"stop", 0, fc.FROM_OFFSET))
        yield sub.take()
        sub.transport.pauseProducing()
        pub = yield self.raw()
        while not proto.writing_paused:
            pub.send(*[fc.Publish(b"stop", i, b"s" * 1000) for i in range(100)])
            yield pub.take(100)
        started = reactor.seconds()
        yield self.service.stopService()
        self.assertLess(reactor.seconds() - started, 10)
        self.assertTrue(proto.lost)
