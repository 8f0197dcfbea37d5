"""The TANK client against a scripted fake broker on a real socket: responses
matched by reqId whatever their order, a cut last bundle (as a real broker
sends at fetchSize) kept or re-fetched with more room, boundary retry, and
connection loss; then the command line against the real gateway."""
import os
import subprocess
import sys

from twisted.internet import defer, reactor, threads
from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Factory
from twisted.trial.unittest import TestCase

from gateway.framing import FramedProtocol
from plugins.tank import codec as c
from plugins.tank.client import FETCH_BOUNDARY, TankError, connect
from tests.test_tank_codec import HELLO, TS, hx
from tests.test_tank_server import TANK, TankCase

CLOSE = object()


class ScriptedBroker(FramedProtocol):
    """Sends a Ping, then for the n-th request calls ``script[n](request)``,
    which returns frames to send (possibly ending in CLOSE); None holds the
    answer back until a later step sends it."""

    header = c.FRAME_HEADER
    length_field = 1
    max_frame_bytes = 1 << 20

    def connectionMade(self):
        self.transport.write(c.PING_FRAME)

    def frameReceived(self, fields, payload):
        factory = self.factory
        request = c.decode_request(fields[0], payload)
        factory.received.append(request)
        for reply in factory.script[len(factory.received) - 1](request) or ():
            if reply is CLOSE:
                self.transport.loseConnection()
            else:
                self.transport.write(reply)

    def frameTooLarge(self, fields):
        self.transport.loseConnection()


def data_response(req, chunk, base_seq, hw_mark):
    topic = req.topics[0]
    entry = c.ConsumeEntry(topic.partitions[0].partition, c.FETCH_OK, base_seq, hw_mark, 0,
                           [chunk], len(chunk))
    return b"".join(c.encode_consume_response(req.req_id, [
        c.ConsumeTopicResult(topic.name, 1, (entry,))]))


class ClientTests(TestCase):

    @defer.inlineCallbacks
    def connect(self, script):
        factory = Factory.forProtocol(ScriptedBroker)
        factory.script = script
        factory.received = []
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        client = yield connect(reactor, "127.0.0.1", port.getHost().port)
        self.addCleanup(client.close)
        yield client.pinged
        return client, factory

    @defer.inlineCallbacks
    def test_out_of_order_responses_are_matched_by_req_id(self):
        held = []

        def hold(req):
            held.append(req)

        def answer_both(req):
            status = c.encode_response(c.StatusResponse(req.req_id, 1, 2, 2, 3))
            late = data_response(held[0], b"\x10" + hx(HELLO), 1, 1)
            return [status, late]
        client, _ = yield self.connect([hold, answer_both])
        consumed = client.consume([("t", 0, 1, 100)], max_wait_ms=5000)
        status = yield client.status()
        self.assertEqual((status.topics, status.partitions), (1, 2))
        [got] = yield consumed
        self.assertEqual([(m.seq, m.ts, m.value) for m in got.messages], [(1, TS, b"hello")])

    @defer.inlineCallbacks
    def test_a_cut_last_bundle_keeps_the_whole_messages(self):
        world = c.encode_bundle([b"world"], timestamps=[TS])
        chunk = b"\x10" + hx(HELLO) + bytes([len(world)]) + world[:8]
        client, _ = yield self.connect([lambda req: [data_response(req, chunk, 1, 2)]])
        fetched = yield client.fetch("t", 0, 1, fetch_size=25)
        self.assertEqual([(m.seq, m.value) for m in fetched.messages], [(1, b"hello")])
        self.assertEqual(fetched.next_seq, 2)

    @defer.inlineCallbacks
    def test_a_cut_only_bundle_is_fetched_again_with_more_room(self):
        whole = b"\x10" + hx(HELLO)
        sizes = []

        def cut(req):
            sizes.append(req.topics[0].partitions[0].fetch_size)
            return [data_response(req, whole[:10], 1, 1)]

        def full(req):
            sizes.append(req.topics[0].partitions[0].fetch_size)
            return [data_response(req, whole, 1, 1)]
        client, _ = yield self.connect([cut, cut, full])
        fetched = yield client.fetch("t", 0, 1, fetch_size=10)
        self.assertEqual([m.value for m in fetched.messages], [b"hello"])
        self.assertEqual(sizes, [10, 20, 40])

    @defer.inlineCallbacks
    def test_boundary_error_retries_from_first_available(self):
        def boundary(req):
            entry = c.ConsumeEntry(0, FETCH_BOUNDARY, None, 9, 5)
            return [b"".join(c.encode_consume_response(req.req_id, [
                c.ConsumeTopicResult("t", 1, (entry,))]))]
        bundle = c.encode_bundle([b"five"], timestamps=[TS])
        client, factory = yield self.connect([
            boundary,
            lambda req: [data_response(req, bytes([len(bundle)]) + bundle, 5, 9)],
            boundary])
        fetched = yield client.fetch("t", 0, 2)
        self.assertEqual([(m.seq, m.value) for m in fetched.messages], [(5, b"five")])
        self.assertEqual(factory.received[1].topics[0].partitions[0].seq, 5)
        with self.assertRaises(TankError) as caught:
            yield client.fetch("t", 0, 20)
        self.assertEqual(caught.exception.code, FETCH_BOUNDARY)

    @defer.inlineCallbacks
    def test_messages_below_the_requested_seq_or_above_hw_mark_are_dropped(self):
        stored = c.encode_bundle([b"a", b"b", b"c", b"d"], timestamps=[TS] * 4)
        chunk = bytes([len(stored)]) + stored
        client, _ = yield self.connect([lambda req: [data_response(req, chunk, 10, 12)]])
        [got] = yield client.consume([("t", 0, 11, 1000)])
        self.assertEqual([(m.seq, m.value) for m in got.messages], [(11, b"b"), (12, b"c")])

    @defer.inlineCallbacks
    def test_connection_loss_fails_waiting_calls(self):
        client, _ = yield self.connect([lambda req: [CLOSE]])
        with self.assertRaises(ConnectionDone):
            yield client.status()
        with self.assertRaises(ConnectionDone):
            yield client.status()

    @defer.inlineCallbacks
    def test_produce_error_codes(self):
        def answer(req):
            return [c.encode_produce_response(req.req_id, [0xFF])]
        client, _ = yield self.connect([answer])
        with self.assertRaises(TankError) as caught:
            yield client.produce("zz", 0, [b"x"])
        self.assertEqual(caught.exception.code, 0xFF)


class CommandLineTests(TankCase):

    def cli(self, *args, stdin=""):
        env = dict(os.environ, PYTHONPATH=os.getcwd())
        return threads.deferToThread(
            subprocess.run, [sys.executable, "-m", "plugins.tank", "--port",
                             str(self.ports["tank"]), *args],
            input=stdin, capture_output=True, text=True, timeout=60, env=env)

    @defer.inlineCallbacks
    def test_produce_tail_and_admin(self):
        yield self.start(listeners=[TANK])
        done = yield self.cli("produce", "t", "hello", "world")
        self.assertEqual((done.returncode, done.stdout), (0, "produced 2 message(s)\n"))
        done = yield self.cli("produce", "t", stdin="third\nfourth\n")
        self.assertEqual(done.returncode, 0)
        done = yield self.cli("tail", "t", "--count", "3")
        self.assertEqual(done.stdout, "1\thello\n2\tworld\n3\tthird\n")
        done = yield self.cli("tail", "t", "--from", "4", "--count", "1")
        self.assertEqual(done.stdout, "4\tfourth\n")
        done = yield self.cli("create", "events", "-n", "3")
        self.assertEqual(done.returncode, 0)
        done = yield self.cli("topics")
        self.assertEqual(done.stdout, "events\t3\nt\t1\n")
        done = yield self.cli("partitions", "t")
        self.assertEqual(done.stdout, "0\t1\t4\n")
        done = yield self.cli("create", "events")
        self.assertEqual(done.returncode, 1)
        self.assertIn("cannot create events (code 0x01)", done.stderr)
        self.assertNotIn("Traceback", done.stderr)
