"""The Figg client: against a scripted fake gateway on a real socket (the
window, cumulative ACKs, what is re-sent on reconnect and in which order,
backoff, ping timeouts, closing), and against the real gateway (resuming
without gaps while connections keep dropping)."""
from twisted.internet import defer, reactor, task
from twisted.internet.protocol import Factory
from twisted.trial.unittest import TestCase

from gateway import commands as c
from gateway.framing import FramedProtocol
from plugins.figg import codec as fc
from plugins.figg.client import FiggClient, FiggClientClosed, Message, default_backoff
from tests.figg_support import FiggTest, fast_backoff, wait_until


class FakeConnection(FramedProtocol):
    header = fc.HEADER
    length_field = 2
    max_frame_bytes = 1 << 24

    def connectionMade(self):
        self.received = []
        self.factory.connections.append(self)

    def frameReceived(self, fields, payload):
        message = fc.decode_payload(fields[0], payload)
        self.received.append(message)
        if type(message) is fc.Ping and self.factory.answer_pings:
            self.send(fc.Pong(message.timestamp))

    def frameTooLarge(self, fields):
        self.transport.loseConnection()

    def send(self, *messages):
        self.transport.write(b"".join(fc.encode(m) for m in messages))


class FakeGateway(Factory):
    protocol = FakeConnection

    def __init__(self):
        self.connections = []
        self.answer_pings = True


class ClientTests(TestCase):
    timeout = 60

    @defer.inlineCallbacks
    def setUp(self):
        self.fake = FakeGateway()
        self.listening = reactor.listenTCP(0, self.fake, interface="127.0.0.1")
        self.port = self.listening.getHost().port
        self.addCleanup(lambda: self.listening and self.listening.stopListening())
        yield None

    @defer.inlineCallbacks
    def client(self, **options):
        options.setdefault("backoff", fast_backoff)
        options.setdefault("ping_interval", 0)
        client = FiggClient(reactor, "127.0.0.1", self.port, **options)
        yield client.connect()
        self.addCleanup(self.drop_all)
        self.addCleanup(client.close)
        return client

    def drop_all(self):
        for conn in self.fake.connections:
            conn.transport.abortConnection()

    def received(self, n, conn=-1):
        """Fires with the first ``n`` messages the fake got on one connection."""
        def enough():
            return len(self.fake.connections) > (max(conn, 0)) and \
                len(self.fake.connections[conn].received) >= n
        return wait_until(enough).addCallback(lambda _: self.fake.connections[conn].received[:n])

    @defer.inlineCallbacks
    def test_publish_fills_the_window_then_waits_for_acks(self):
        client = yield self.client(window_size=4)
        acked = []
        calls = [client.publish("w", b"%d" % i, on_ack=acked.append) for i in range(6)]
        self.assertEqual([d.called for d in calls], [True] * 4 + [False] * 2)
        self.assertEqual([self.successResultOf(d) for d in calls[:4]], [0, 1, 2, 3])
        got = yield self.received(4)
        self.assertEqual(got, [fc.Publish(b"w", i, b"%d" % i) for i in range(4)])
        self.assertEqual(client.unacked, 6)
        # One ACK acknowledges everything up to it.
        self.fake.connections[0].send(fc.Ack(1))
        self.assertEqual((yield calls[4]), 4)
        self.assertEqual((yield calls[5]), 5)
        self.assertEqual(acked, [0, 1])
        got = yield self.received(6)
        self.assertEqual(got[4:], [fc.Publish(b"w", 4, b"4"), fc.Publish(b"w", 5, b"5")])
        self.fake.connections[0].send(fc.Ack(5))
        yield wait_until(lambda: client.unacked == 0)
        self.assertEqual(acked, [0, 1, 2, 3, 4, 5])

    @defer.inlineCallbacks
    def test_publish_blocking_fires_on_the_ack(self):
        client = yield self.client()
        d = client.publish_blocking("b", b"x")
        yield self.received(1)
        self.assertFalse(d.called)
        self.fake.connections[0].send(fc.Ack(0))
        self.assertEqual((yield d), 0)

    @defer.inlineCallbacks
    def test_subscribe_tracks_the_offset_and_unsubscribe_waits_for_detached(self):
        client = yield self.client()
        got = []
        attached = client.subscribe("t", got.append, offset=4)
        self.assertEqual((yield self.received(1)), [fc.Attach(b"t", 4, fc.FROM_OFFSET)])
        conn = self.fake.connections[0]
        conn.send(fc.Attached(b"t", 5), fc.Data(b"t", 6, b"a"), fc.Data(b"t", 9, b"b"),
                  fc.Data(b"other", 3, b"not ours"))
        self.assertEqual((yield attached), 5)
        yield wait_until(lambda: len(got) == 2)
        self.assertEqual(got, [Message("t", 6, b"a"), Message("t", 9, b"b")])
        self.assertEqual(client.offset("t"), 9)
        detached = client.unsubscribe("t")
        self.assertEqual((yield self.received(2))[1], fc.Detach(b"t"))
        conn.send(fc.Data(b"t", 10, b"late"), fc.Detached(b"t"))
        yield detached
        self.assertEqual(len(got), 2)
        latest = client.subscribe("u", got.append)
        self.assertEqual((yield self.received(3))[2], fc.Attach(b"u", 0, 0))
        conn.send(fc.Attached(b"u", 77))
        self.assertEqual((yield latest), 77)

    @defer.inlineCallbacks
    def test_a_reconnect_resends_attachments_detaches_and_unacked_publishes_in_order(self):
        client = yield self.client()
        client.subscribe("attached", lambda m: None, offset=1)
        for waiting in (client.subscribe("latest", lambda m: None),
                        client.subscribe("from5", lambda m: None, offset=5)):
            # Never answered: they fail when the client closes.
            waiting.addErrback(lambda f: f.trap(FiggClientClosed))
        client.subscribe("leaving", lambda m: None)
        for i in range(3):
            client.publish("p", b"%d" % i)
        yield self.received(7)
        conn = self.fake.connections[0]
        conn.send(fc.Attached(b"attached", 1), fc.Data(b"attached", 2, b"x"),
                  fc.Data(b"attached", 8, b"y"), fc.Attached(b"leaving", 3), fc.Ack(0))
        yield wait_until(lambda: client.offset("attached") == 8 and client.unacked == 2)
        client.unsubscribe("leaving").addErrback(lambda f: f.trap(FiggClientClosed))
        yield self.received(8)
        states = []
        client.on_state = states.append
        conn.transport.abortConnection()
        got = yield self.received(6, conn=1)
        self.assertEqual(got, [
            fc.Attach(b"latest", 0, 0),                     # still waiting for ATTACHED
            fc.Attach(b"from5", 5, fc.FROM_OFFSET),
            fc.Attach(b"attached", 8, fc.FROM_OFFSET),      # from the last DATA
            fc.Detach(b"leaving"),                          # still waiting for DETACHED
            fc.Publish(b"p", 1, b"1"),                      # unacked, oldest first
            fc.Publish(b"p", 2, b"2"),
        ])
        self.assertEqual(states, ["disconnected", "connected"])
        self.assertEqual(client.connections, 2)

    def test_default_backoff(self):
        self.assertEqual(default_backoff(0), 0)
        for attempts, base in [(1, 1), (2, 2), (3, 4), (5, 16), (6, 30), (50, 30)]:
            for _ in range(20):
                delay = default_backoff(attempts)
                self.assertTrue(0.8 * base <= delay <= 1.2 * base, (attempts, delay))

    @defer.inlineCallbacks
    def test_reconnects_with_backoff_while_the_gateway_is_away(self):
        asked = []

        def backoff(attempts):
            asked.append(attempts)
            return 0.0 if attempts == 0 else 0.02
        client = yield self.client(backoff=backoff)
        client.publish("away", b"kept")
        yield self.received(1)
        yield self.listening.stopListening()
        self.fake.connections[0].transport.abortConnection()
        yield wait_until(lambda: len(asked) >= 4)
        self.listening = reactor.listenTCP(self.port, self.fake, interface="127.0.0.1")
        got = yield self.received(1, conn=1)
        self.assertEqual(got, [fc.Publish(b"away", 0, b"kept")])
        self.assertEqual(asked[:4], [0, 1, 2, 3])
        # A successful connection starts the count again.
        self.fake.connections[1].transport.abortConnection()
        yield self.received(1, conn=2)
        self.assertEqual(asked[-1], 0)

    @defer.inlineCallbacks
    def test_unanswered_pings_drop_the_connection(self):
        self.fake.answer_pings = False
        client = yield self.client(ping_interval=0.05, max_ping_out=2)
        yield wait_until(lambda: client.connections >= 2)
        pings = [m for m in self.fake.connections[0].received if type(m) is fc.Ping]
        self.assertEqual(len(pings), 2)

    @defer.inlineCallbacks
    def test_answered_pings_keep_the_connection(self):
        client = yield self.client(ping_interval=0.02, max_ping_out=2)
        yield task.deferLater(reactor, 0.3, lambda: None)
        self.assertEqual(client.connections, 1)
        self.assertGreater(len(self.fake.connections[0].received), 5)
        rtt = yield client.ping()
        self.assertTrue(0 <= rtt < 5)

    @defer.inlineCallbacks
    def test_a_bad_frame_from_the_gateway_makes_the_client_reconnect(self):
        client = yield self.client()
        self.fake.connections[0].transport.write(fc.HEADER.pack(fc.ACK, 1, 4) + b"\x00" * 4)
        yield wait_until(lambda: client.connections == 2)

    @defer.inlineCallbacks
    def test_close_fails_the_calls_still_waiting(self):
        client = yield self.client(window_size=1)
        client.publish("c", b"in window")
        queued = client.publish("c", b"queued")
        blocking = client.publish_blocking("c", b"queued too")
        attaching = client.subscribe("c", lambda m: None)
        pinging = client.ping()
        yield client.close()
        for d in (queued, blocking, attaching, pinging):
            yield self.assertFailure(d, FiggClientClosed)
        yield self.assertFailure(client.publish("c", b"after"), FiggClientClosed)


class ResumeTests(FiggTest):

    @defer.inlineCallbacks
    def test_resume_without_gaps_while_connections_keep_dropping(self):
        yield self.start()
        sub = yield self.client(ping_interval=0)
        pub = yield self.client(ping_interval=0)
        got = []
        yield sub.subscribe("resume", got.append, offset=0)
        total = 5000
        for i in range(total):
            if i % 1000 == 500:
                for proto in list(self.factory().connections):
                    proto.transport.abortConnection()
            yield pub.publish("resume", b"%d" % i)
        yield pub.publish_blocking("resume", b"end")
        [part] = yield self.bus.execute(c.Fetch([c.FetchPartition("resume", 0, 0, 1 << 30)]))
        stored = [v for b in part.batches for v in self.bus.decode(b).values]
        yield wait_until(lambda: len(got) == len(stored))
        # The subscriber saw the log exactly: no gap, no duplicate.
        self.assertEqual([m.offset for m in got], list(range(1, len(stored) + 1)))
        self.assertEqual([m.data for m in got], stored)
        # At least once: every message is there, in order of first appearance.
        first_seen = list(dict.fromkeys(stored))
        self.assertEqual(first_seen, [b"%d" % i for i in range(total)] + [b"end"])
        self.assertGreaterEqual(sub.connections, 5)
        self.assertGreaterEqual(pub.connections, 5)
