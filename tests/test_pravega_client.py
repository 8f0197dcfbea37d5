"""The Pravega client (``plugins/pravega/client.py``) against the real
gateway: the idempotent writer (blocks, numbers, in-flight queue, re-sends
after a reconnect that never duplicate), the reader's reassembly of events
across replies, the command line, and a crash: the gateway process killed
between an append and its ack, then a re-send that is stored once.

Connections can go through ``CuttingProxy``, which forwards bytes and can
be told to cut a connection partway through a frame, to hold the
gateway's acks back, or to stop forwarding altogether: that is how "the
connection dropped after some blocks were stored and before their acks"
is made to happen exactly, without timing luck.
"""
import os
import shutil
import signal
import socket
import sys
import tempfile

from twisted.internet import defer, protocol, reactor, utils
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.trial.unittest import TestCase

from gateway import commands as cmd
from plugins.pravega import codec as pc
from plugins.pravega.client import EventReader, EventWriter, PravegaError, connect
from tests.support import GatewayProcess
from tests.test_pravega_server import PravegaTest, RawConnection, eventually, events, sleep

SEG = "s/t/0.#epoch.0"


class _ProxyServer(protocol.Protocol):
    """The client's side of one proxied connection; its flags are set by
    ``CuttingProxy`` for the connections open at that moment."""

    def connectionMade(self):
        self.proxy = self.factory
        self.proxy.pairs.append(self)
        self.peer = None
        self.hold_down = False      # drop the gateway's replies
        self.frozen = False         # forward nothing more to the gateway
        self.cut_after = None       # forward this many more bytes, then cut
        self.sent_up = 0
        self.transport.pauseProducing()
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", self.proxy.target)
        connectProtocol(endpoint, _ProxyClient(self)).addCallbacks(
            self._connected, lambda _: self.transport.loseConnection())

    def _connected(self, peer):
        self.peer = peer
        self.transport.resumeProducing()

    def dataReceived(self, data):
        if self.frozen:
            return
        if self.cut_after is not None and self.sent_up + len(data) > self.cut_after:
            self.peer.transport.write(data[:self.cut_after - self.sent_up])
            self.frozen = True
            self.peer.transport.loseConnection()
            self.transport.loseConnection()
            return
        self.sent_up += len(data)
        self.peer.transport.write(data)

    def connectionLost(self, reason):
        if self in self.proxy.pairs:
            self.proxy.pairs.remove(self)
        if self.peer is not None:
            self.peer.transport.loseConnection()


class _ProxyClient(protocol.Protocol):
    """The gateway's side of one proxied connection."""

    def __init__(self, server):
        self.server = server

    def dataReceived(self, data):
        if not self.server.hold_down:
            self.server.transport.write(data)

    def connectionLost(self, reason):
        self.server.transport.loseConnection()


class CuttingProxy(protocol.Factory):
    """A TCP proxy to ``target`` whose open connections can be told to drop
    the gateway's replies (``hold_replies``: acks never arrive), to stop
    forwarding the client's bytes (``freeze``), or to forward ``n`` more
    bytes and then close both sides (``cut``: the gateway sees a frame torn
    off there). Connections made later forward normally."""

    protocol = _ProxyServer
    noisy = False

    def __init__(self, target):
        self.target = target
        self.pairs = []

    def hold_replies(self):
        for pair in self.pairs:
            pair.hold_down = True

    def freeze(self):
        for pair in self.pairs:
            pair.frozen = True

    def cut(self, n):
        for pair in self.pairs:
            pair.cut_after = pair.sent_up + n

    def drop_all(self):
        for pair in list(self.pairs):
            pair.transport.abortConnection()
            if pair.peer is not None:
                pair.peer.transport.abortConnection()


class ClientTests(PravegaTest):

    @defer.inlineCallbacks
    def connection(self, port=None):
        proto = yield connect(reactor, "127.0.0.1", port or self.port)
        self.addCleanup(proto.close)
        return proto

    def writer(self, segment=SEG, port=None, **kw):
        port = port or self.port
        w = EventWriter(reactor, lambda: connect(reactor, "127.0.0.1", port), segment, **kw)
        self.addCleanup(w.close)
        return w

    @defer.inlineCallbacks
    def read_all(self, segment=SEG, offset=0):
        """Every event from ``offset`` to the current tail."""
        proto = yield self.connection()
        tail = (yield proto.segment_info(segment)).write_offset
        reader = EventReader(proto, segment, offset)
        got = []
        while reader.position < tail:
            got += (yield reader.read())
        return got

    @defer.inlineCallbacks
    def proxy(self):
        proxy = CuttingProxy(self.port)
        port = yield defer.maybeDeferred(reactor.listenTCP, 0, proxy, interface="127.0.0.1")

        def stop():
            proxy.drop_all()
            return port.stopListening()
        self.addCleanup(stop)
        return proxy, port.getHost().port

    # -- writer -------------------------------------------------------------------

    @defer.inlineCallbacks
    def test_writer_blocks_and_numbers(self):
        yield self.start()
        yield self.create()
        for standalone in (False, True):
            w = self.writer(standalone=standalone, block_bytes=200)
            values = [b"%d-%s" % (i, b"x" * (i % 50)) for i in range(100)]
            acks = [w.write(v) for v in values]
            yield w.flush()
            self.assertTrue(all(a.called for a in acks))
            self.assertEqual(w.next_number, 101)
            self.assertEqual(w.reconnects, 0)
            yield w.close()
        stored = self.values()
        self.assertEqual(stored, values * 2)
        positions = []
        pos = 0
        for v in stored:
            positions.append(pos)
            pos += 8 + len(v)
        self.assertEqual((yield self.read_all()), list(zip(positions, stored)))
        # several blocks per writer: AppendBlocks of at most 200 bytes
        self.assertGreater(self.service.store.read("t", 0, 0, 1 << 30)[0].count, 1)
        self.assertGreater(len(self.service.store.read("t", 0, 0, 1 << 30)), 20)

    @defer.inlineCallbacks
    def test_conditional_writes(self):
        yield self.start()
        yield self.create()
        w = self.writer()
        yield w.write(b"hi")
        self.assertTrue((yield w.write_conditional(b"abc", 10)))
        self.assertFalse((yield w.write_conditional(b"no", 10)))
        yield w.write(b"after")
        self.assertTrue((yield w.write_conditional(b"yes", 34)))
        self.assertEqual(self.values(), [b"hi", b"abc", b"after", b"yes"])

    @defer.inlineCallbacks
    def test_resend_after_a_connection_cut_mid_block_is_exactly_once(self):
        """The connection is cut partway through the stream of blocks: the
        blocks before the cut are stored (their acks are lost), the torn one
        and those after it are not. After the reconnect, AppendSetup tells
        the writer how far the gateway got; it drops those events and
        re-sends the rest under their numbers."""
        yield self.start()
        yield self.create()
        proxy, port = yield self.proxy()
        w = self.writer(port=port, block_bytes=300)
        yield eventually(lambda: w.ready)
        # what the gateway holds when the reconnected writer learns its number
        setups = []
        set_up = w._set_up
        w._set_up = lambda last: (setups.append((last, len(self.values()))), set_up(last))
        proxy.hold_replies()
        proxy.cut(1500)                           # inside the 5th or 6th block
        values = [b"event-%03d" % i for i in range(200)]
        acks = [w.write(v) for v in values]
        yield w.flush()
        [(last, stored)] = setups
        self.assertTrue(0 < stored < 100, stored)
        self.assertEqual(last, stored)            # event n has number n
        self.assertTrue(all(a.called for a in acks))
        self.assertEqual(self.values(), values)
        self.assertEqual(w.reconnects, 1)

    @defer.inlineCallbacks
    def test_resend_after_lost_acks_with_overlap(self):
        """Blocks are stored but no ack arrives, and later ones never reach
        the gateway; after the reconnect the writer re-sends only what is
        not stored, so everything is stored once."""
        yield self.start()
        yield self.create()
        proxy, port = yield self.proxy()
        w = self.writer(port=port, block_bytes=100)
        yield eventually(lambda: w.ready)
        proxy.hold_replies()
        first = [w.write(b"a%d" % i) for i in range(30)]
        yield eventually(lambda: len(self.values()) == 30)
        proxy.freeze()
        second = [w.write(b"b%d" % i) for i in range(30)]
        yield sleep(0.05)
        self.assertEqual(len(self.values()), 30)
        self.assertFalse(any(d.called for d in first + second))
        proxy.drop_all()
        yield w.flush()
        self.assertTrue(all(d.called for d in first + second))
        self.assertEqual(self.values(), [b"a%d" % i for i in range(30)] +
                         [b"b%d" % i for i in range(30)])
        self.assertEqual(w.reconnects, 1)

    @defer.inlineCallbacks
    def test_block_stored_by_a_dying_connection_is_not_stored_again(self):
        """The writer's event was stored through another connection of the
        same writer (a dying one whose block completed late): the writer's
        own send loses the compare-and-set, gets InvalidEventNumber and a
        close, reconnects, learns the number and does not store it again."""
        yield self.start()
        yield self.create()
        w = self.writer()
        yield w.write(b"one")
        twin = yield self.raw()
        self.assertEqual((yield twin.call(pc.SetupAppend(1, w.writer_id, SEG, ""))),
                         pc.AppendSetup(1, SEG, w.writer_id, 1))
        yield twin.call(pc.AppendBlockEnd(w.writer_id, 0, events(b"two"), 1, 2, 2))
        yield w.write(b"two")
        self.assertEqual(w.reconnects, 1)
        yield w.write(b"three")
        self.assertEqual(self.values(), [b"one", b"two", b"three"])

    @defer.inlineCallbacks
    def test_refusal_fails_at_once_without_reconnecting(self):
        """Checklist 15 for this client: a sealed segment's SegmentIsSealed
        fails the writer at once, with no reconnect loop."""
        yield self.start(topics={"auto_create": False})
        yield self.create()
        yield self.service.bus.execute(cmd.SealPartition("t", 0))
        factory = self.service.listeners[0].factory
        before = factory.total_connections
        w = self.writer()
        e = yield self.assertFailure(w.write(b"x"), PravegaError)
        self.assertIsInstance(e.reply, pc.SegmentIsSealed)
        yield self.assertFailure(w.write(b"y"), PravegaError)
        yield sleep(0.3)
        self.assertEqual(factory.total_connections - before, 1)
        missing = self.writer("s/absent/0.#epoch.0")
        e = yield self.assertFailure(missing.write(b"x"), PravegaError)
        self.assertIsInstance(e.reply, pc.NoSuchSegment)
        self.assertEqual(factory.total_connections - before, 2)

    # -- reader -------------------------------------------------------------------------

    @defer.inlineCallbacks
    def test_reader_reassembles_events_across_small_reads(self):
        yield self.start()
        yield self.create()
        values = [b"", b"x" * 100, b"short", bytes(range(256)) * 4, b""]
        w = self.writer()
        for v in values:
            w.write(v)
        yield w.flush()
        proto = yield self.connection()
        for size in (8, 9, 50, 1000):
            reader = EventReader(proto, SEG, 0, read_size=size)
            got = []
            while len(got) < len(values):
                got += (yield reader.read())
            self.assertEqual([v for _, v in got], values)
        # from a later event boundary
        reader = EventReader(proto, SEG, 8 + 8 + 100)
        self.assertEqual((yield reader.read())[0], (116, b"short"))

    @defer.inlineCallbacks
    def test_reader_waits_at_the_tail_and_ends_with_the_segment(self):
        yield self.start(pravega={"long_poll_ms": 200})
        yield self.create()
        proto = yield self.connection()
        reader = EventReader(proto, SEG)
        waiting = reader.read()
        yield sleep(0.5)          # past the long-poll limit: the reader asks again
        self.assertFalse(waiting.called)
        client = yield self.rustlog()
        yield client.produce("t", 0, [b"from rustlog"])
        self.assertEqual((yield waiting), [(0, b"from rustlog")])
        yield self.service.bus.execute(cmd.SealPartition("t", 0))
        self.assertEqual((yield reader.read()), [])
        self.assertTrue(reader.end_of_segment)

    @defer.inlineCallbacks
    def test_reader_reports_truncation_and_bad_positions(self):
        yield self.start()
        yield self.create()
        w = self.writer()
        yield w.write(b"abc")
        yield w.write(b"defgh")
        proto = yield self.connection()
        e = yield self.assertFailure(EventReader(proto, "s/t/1.#epoch.0").read(), PravegaError)
        self.assertIsInstance(e.reply, pc.NoSuchSegment)
        # not an event boundary: "00000003 616263 ..." is no event header
        yield self.assertFailure(EventReader(proto, SEG, 4).read(), ValueError)

    # -- command line ---------------------------------------------------------------------

    @defer.inlineCallbacks
    def test_cli_append_and_tail(self):
        yield self.start()
        base = [sys.executable, "-m", "plugins.pravega", "--port", str(self.port)]

        def run(*args):
            return utils.getProcessOutputAndValue(sys.executable, base[1:] + list(args),
                                                  env=dict(os.environ), path=os.getcwd())
        appended = yield self.feed(base + ["append", "s/x--cli-ulog/0.#epoch.0"],
                                   b"first line\nsecond\n\nlast\n")
        self.assertEqual(appended, (b"appended 4 event(s) to s/x--cli-ulog/0.#epoch.0\n", b"",
                                    0))
        self.assertEqual(self.values("cli_log"), [b"first line", b"second", b"", b"last"])
        out, err, code = yield run("tail", "s/x--cli-ulog/0.#epoch.0", "--to-tail")
        self.assertEqual((out, code), (b"0\tfirst line\n18\tsecond\n32\t\n40\tlast\n", 0), err)
        out, err, code = yield run("tail", "cli_log/0", "--from", "32", "--to-tail")
        self.assertEqual(out, b"32\t\n40\tlast\n")
        out, err, code = yield run("tail", "s/nope/0.#epoch.0", "--to-tail")
        self.assertEqual(code, 1)
        self.assertIn(b"NoSuchSegment", err)
        self.assertNotIn(b"Traceback", err)

    def feed(self, argv, data):
        """Run ``argv`` with ``data`` on stdin; fires with (out, err, code)."""
        done = defer.Deferred()

        class Collect(protocol.ProcessProtocol):
            def __init__(self):
                self.out, self.err = [], []

            def connectionMade(self):
                self.transport.write(data)
                self.transport.closeStdin()

            def outReceived(self, chunk):
                self.out.append(chunk)

            def errReceived(self, chunk):
                self.err.append(chunk)

            def processEnded(self, reason):
                done.callback((b"".join(self.out), b"".join(self.err), reason.value.exitCode))
        reactor.spawnProcess(Collect(), argv[0], argv, env=dict(os.environ), path=os.getcwd())
        return done


CRASH_CONFIG = """\
storage:
  path: ./data
  fsync: always
listeners:
  - {dialect: pravega, endpoint: "tcp:0:interface=127.0.0.1", scope: s}
"""


class CrashTests(TestCase):
    """``gateway run`` in a subprocess, killed with SIGKILL."""

    timeout = 120

    def tempdir(self):
        path = tempfile.mkdtemp(prefix="gateway-pravega-crash-")
        self.addCleanup(shutil.rmtree, path, True)
        return path

    @defer.inlineCallbacks
    def tail_of(self, port, segment=SEG):
        proto = yield connect(reactor, "127.0.0.1", port)
        try:
            return (yield proto.segment_info(segment)).write_offset
        finally:
            yield proto.close()

    @defer.inlineCallbacks
    def test_killed_between_append_and_ack_then_resend_is_not_duplicated(self):
        process = GatewayProcess(self.tempdir(), CRASH_CONFIG)
        self.addCleanup(process.log.close)
        self.addCleanup(lambda: process.stop("KILL"))
        ports = process.start()
        proxy = CuttingProxy(ports["pravega"])
        listening = reactor.listenTCP(0, proxy, interface="127.0.0.1")
        self.addCleanup(listening.stopListening)
        self.addCleanup(proxy.drop_all)
        proxy_port = listening.getHost().port
        writer = EventWriter(reactor, lambda: connect(reactor, "127.0.0.1", proxy_port), SEG,
                             block_bytes=120, retry_delay=0.05, max_delay=0.2)
        self.addCleanup(writer.close)
        yield writer.write(b"before")
        # Phase 1: blocks reach the gateway and are stored, their acks never
        # come back. Phase 2: later blocks never reach it at all.
        proxy.hold_replies()
        stored = [writer.write(b"stored-%02d" % i) for i in range(40)]
        expected_tail = 14 + 40 * 17
        yield eventually(lambda: bool(self._tail_reached(ports["pravega"], expected_tail)))
        proxy.freeze()
        unsent = [writer.write(b"unsent-%02d" % i) for i in range(40)]
        yield sleep(0.05)
        self.assertFalse(any(d.called for d in stored + unsent))
        # the crash, between append and ack
        self.assertEqual(process.stop("KILL"), -signal.SIGKILL)
        proxy.drop_all()
        ports = process.start()
        proxy.target = ports["pravega"]
        yield writer.flush()
        self.assertTrue(all(d.called for d in stored + unsent))
        self.assertGreaterEqual(writer.reconnects, 1)
        proto = yield connect(reactor, "127.0.0.1", ports["pravega"])
        self.addCleanup(proto.close)
        tail = (yield proto.segment_info(SEG)).write_offset
        reader = EventReader(proto, SEG)
        got = []
        while reader.position < tail:
            got += [v for _, v in (yield reader.read())]
        self.assertEqual(got, [b"before"] + [b"stored-%02d" % i for i in range(40)]
                         + [b"unsent-%02d" % i for i in range(40)])
        # and the writer's number survived the crash too
        raw = RawConnection()
        yield connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", ports["pravega"]), raw)
        self.addCleanup(raw.transport.loseConnection)
        reply = yield raw.call(pc.SetupAppend(1, writer.writer_id, SEG, ""))
        self.assertEqual(reply.last_event_number, 81)

    def _tail_reached(self, port, tail):
        """Blocking probe of the segment's length, for a gateway in a subprocess."""
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(pc.encode(pc.GetStreamSegmentInfo(1, SEG, "")))
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return False
                data += chunk
                if len(data) >= 8:
                    code, n = pc.HEADER.unpack_from(data)
                    if len(data) >= 8 + n:
                        info = pc.decode(code, data[8:8 + n])
                        return isinstance(info, pc.StreamSegmentInfo) and \
                            info.write_offset >= tail
