"""The Pravega dialect end to end: the real service tree (store, bus,
listener) on a real socket on port 0, driven by raw WireCommands frames so
that every reply is checked byte for byte or field by field.

Organised by the conformance checklist of protocols/pravega.md §11 (items
1-11 and 13-20; item 12 is in test_pravega_cross.py; item 18's interim
answers are replaced by what test_pravega_bytes_tables.py checks), then what the
checklist leaves implicit: pipelining and ordering, several writers on one
connection, the conditional append as a barrier, parked reads cancelled
with their connection, flow control, and reads at every byte offset.
"""
import shutil
import struct
import tempfile

from twisted.internet import defer, reactor, task
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.trial.unittest import TestCase

from gateway import commands as cmd
from gateway.records import PRAVEGA_EVENTS, RecordBatch
from plugins.pravega import codec as pc
from plugins.rustlog.client import RustLogError, connect as rustlog_connect
from tests.support import RawFrames, gateway_config, start_gateway

W = bytes.fromhex("00112233445566778899aabbccddeeff")
W2 = bytes.fromhex("ffeeddccbbaa99887766554433221100")
SEG = "s/t/0.#epoch.0"
MIN = pc.NO_EVENT_NUMBER
MiB = 1024 * 1024


def events(*values):
    return pc.frame_events(list(values))


def sleep(seconds):
    return task.deferLater(reactor, seconds, lambda: None)


def eventually(check, timeout=30.0, step=0.02):
    """Poll ``check()`` on the reactor until it is true (generous timeout:
    the machine is shared)."""
    deadline = reactor.seconds() + timeout

    @defer.inlineCallbacks
    def loop():
        while not check():
            if reactor.seconds() > deadline:
                raise AssertionError("condition not reached in time")
            yield sleep(step)
    return loop()


class RawConnection(RawFrames):
    """Whole Pravega frames (header included) back, without judging them."""

    header = struct.Struct(">ii")
    length_field = 1
    keep_header = True

    def describe(self, frame):
        return decode(frame)

    def send(self, *commands):
        self.transport.write(b"".join(c if isinstance(c, bytes) else pc.encode(c)
                                      for c in commands))

    def take_raw(self, n=1):
        return self.take_frames(n)

    @defer.inlineCallbacks
    def take(self, n=1):
        """The next ``n`` replies, decoded (one, or a list of several)."""
        frames = yield self.take_raw(n)
        got = [decode(f) for f in frames]
        return got if n > 1 else got[0]

    @defer.inlineCallbacks
    def call(self, *commands):
        """Send commands; fires with one reply each (a list if more than
        one). An AppendBlock has no reply of its own: its AppendBlockEnd does."""
        self.send(*commands)
        return (yield self.take(sum(not isinstance(c, pc.AppendBlock) for c in commands)))

    def unanswered(self):
        return len(self.frames) - self.taken


def decode(frame):
    code, n = pc.HEADER.unpack_from(frame)
    return pc.decode(code, frame[8:8 + n])


class PravegaTest(TestCase):
    """Starts the gateway with a Pravega listener (scope ``s``) and a RustLog
    listener, and makes raw connections to it."""

    timeout = 60

    def tempdir(self):
        path = tempfile.mkdtemp(prefix="gateway-pravega-")
        self.addCleanup(shutil.rmtree, path, True)
        return path

    @defer.inlineCallbacks
    def start(self, directory=None, pravega=None, **sections):
        self.directory = directory or self.tempdir()
        listeners = [{"dialect": "pravega", "endpoint": "tcp:0:interface=127.0.0.1",
                      "scope": "s", **(pravega or {})},
                     {"dialect": "rustlog", "endpoint": "tcp:0:interface=127.0.0.1"}]
        self.config = gateway_config(self.directory, listeners, **sections)
        self.service, ports = yield start_gateway(self, self.config)
        self.port = ports["pravega"]
        self.rustlog_port = ports["rustlog"]
        return self.service

    @defer.inlineCallbacks
    def restart(self):
        yield self.service.stopService()
        self.service, ports = yield start_gateway(self, self.config)
        self.port = ports["pravega"]
        self.rustlog_port = ports["rustlog"]

    @defer.inlineCallbacks
    def raw(self):
        proto = RawConnection()
        yield connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", self.port), proto)

        def close():
            proto.transport.loseConnection()
            return proto.lost
        self.addCleanup(close)
        return proto

    @defer.inlineCallbacks
    def writer(self, segment=SEG, writer_id=W, last=MIN):
        """A raw connection with ``writer_id`` set up on ``segment``."""
        conn = yield self.raw()
        reply = yield conn.call(pc.SetupAppend(1, writer_id, segment, ""))
        self.assertEqual(reply, pc.AppendSetup(1, segment, writer_id, last))
        return conn

    @defer.inlineCallbacks
    def rustlog(self, binary=False):
        client = yield rustlog_connect(reactor, "127.0.0.1", self.rustlog_port, binary=binary)
        self.addCleanup(client.close)
        return client

    def values(self, topic="t", partition=0):
        """Every stored value of a partition, through the bus's decoders."""
        store = self.service.store
        state = store.offsets(topic, partition)
        out = []
        for batch in store.read(topic, partition, state.log_start, 1 << 40):
            out += self.service.bus.decode(batch).values
        return out

    def state(self, topic="t", partition=0):
        return self.service.store.offsets(topic, partition)

    def create(self, topic="t", partitions=1):
        return self.service.bus.execute(cmd.CreateTopic(topic, partitions))

    def produce(self, values, topic="t", partition=0):
        return self.service.bus.execute(cmd.Produce(topic, partition, RecordBatch(list(values))))


def block(writer_id, data, last, rid, count=None):
    """An exact block (Java): AppendBlock + AppendBlockEnd with no trailer."""
    n = count if count is not None else pc.scan_events(data)[0]
    return [pc.AppendBlock(writer_id, data), pc.AppendBlockEnd(writer_id, len(data), b"", n,
                                                               last, rid)]


def solo(writer_id, data, last, rid, count=None):
    """A standalone AppendBlockEnd (Rust/Python)."""
    n = count if count is not None else pc.scan_events(data)[0]
    return pc.AppendBlockEnd(writer_id, len(data), data, n, last, rid)


# ---------------------------------------------------------------------------
# §11 conformance checklist
# ---------------------------------------------------------------------------

class ConformanceTests(PravegaTest):

    @defer.inlineCallbacks
    def test_01_hello_answered_with_exact_bytes(self):
        yield self.start()
        conn = yield self.raw()
        conn.send(pc.Hello(17, 5))
        self.assertEqual((yield conn.take_raw()), [bytes.fromhex(
            "ffffff81000000080000001100000005")])
        conn.send(pc.Hello(15, 5))      # Rust
        self.assertEqual((yield conn.take()), pc.Hello(17, 5))

    @defer.inlineCallbacks
    def test_01_incompatible_hello_gets_hello_then_close(self):
        yield self.start()
        for high, low in ((4, 2), (30, 18)):
            conn = yield self.raw()
            conn.send(pc.Hello(high, low), pc.KeepAlive())
            self.assertEqual((yield conn.take()), pc.Hello(17, 5))
            yield conn.lost
            self.assertEqual(conn.unanswered(), 0)

    @defer.inlineCallbacks
    def test_02_keepalive_echoed_and_commands_before_hello_work(self):
        yield self.start()
        yield self.create()
        conn = yield self.raw()
        self.assertEqual((yield conn.call(pc.KeepAlive(b"ignored"))), pc.KeepAlive())
        self.assertEqual((yield conn.call(pc.GetStreamSegmentInfo(4, SEG, ""))).segment, SEG)
        conn.send(pc.KeepAlive())
        self.assertEqual((yield conn.take_raw()), [bytes.fromhex("0000006400000000")])

    @defer.inlineCallbacks
    def test_03_setup_append_of_a_new_writer(self):
        yield self.start()
        yield self.create()
        conn = yield self.raw()
        conn.send(pc.SetupAppend(1, W, SEG, ""))
        self.assertEqual((yield conn.take_raw()), [
            bytes.fromhex("00000002 00000030 0000000000000001 000e") + SEG.encode() + W
            + bytes.fromhex("8000000000000000")])
        # the requestId (flow id in its upper half) and the name are echoed exactly
        rid = (7 << 32) | 3
        for name in ("t/0", SEG):
            self.assertEqual((yield conn.call(pc.SetupAppend(rid, W2, name, "tok"))),
                             pc.AppendSetup(rid, name, W2, MIN))

    @defer.inlineCallbacks
    def test_04_block_forms_store_identical_records(self):
        yield self.start()
        yield self.create("a")
        yield self.create("b")
        data = events(b"one", b"", b"three" * 100)
        java = yield self.writer("s/a/0.#epoch.0")
        rust = yield self.writer("s/b/0.#epoch.0")
        ack_java = yield java.call(*block(W, data, 3, 1))
        ack_rust = yield rust.call(solo(W, data, 3, 1))
        self.assertEqual(ack_java, pc.DataAppended(W, 3, MIN, 1, len(data)))
        self.assertEqual(ack_rust, ack_java)
        self.assertEqual(self.values("a"), [b"one", b"", b"three" * 100])
        self.assertEqual(self.values("b"), self.values("a"))
        self.assertEqual(self.state("a").end_position, len(data))
        # stored as sent: the payload is the view
        batch = self.service.store.read("a", 0, 0, 1)[0]
        self.assertEqual((batch.format, batch.payload, batch.count), (PRAVEGA_EVENTS, data, 3))

    @defer.inlineCallbacks
    def test_05_partial_event_and_padding_blocks(self):
        yield self.start()
        yield self.create()
        conn = yield self.writer()
        ev21 = events(b"hi", b"abc")
        partial = pc.encode(pc.PartialEvent(events(b"0123456789")[:11]))
        self.assertEqual((yield conn.call(
            pc.AppendBlock(W, ev21 + partial),
            pc.AppendBlockEnd(W, 21, b"3456789", 3, 3, 5))), pc.DataAppended(W, 3, MIN, 5, 39))
        padding = struct.pack(">ii", pc.PADDING, 11) + bytes(11)
        self.assertEqual((yield conn.call(
            pc.AppendBlock(W, ev21 + padding),
            pc.AppendBlockEnd(W, 21, b"", 2, 5, 6))), pc.DataAppended(W, 5, 3, 6, 60))
        self.assertEqual(self.values(), [b"hi", b"abc", b"0123456789", b"hi", b"abc"])
        self.assertEqual(self.state().end_position, 60)

    @defer.inlineCallbacks
    def test_06_acks_carry_every_field_in_order(self):
        yield self.start()
        yield self.create()
        conn = yield self.writer()
        frames = []
        tail = 0
        expected = []
        previous = MIN
        for i in range(1, 41):
            data = events(*[b"%d-%d" % (i, j) for j in range(i % 3 + 1)])
            number = 10 * i
            frames += block(W, data, number, 1000 + i) if i % 2 else [solo(W, data, number,
                                                                          1000 + i)]
            tail += len(data)
            expected.append(pc.DataAppended(W, number, previous, 1000 + i, tail))
            previous = number
        conn.send(*frames)
        self.assertEqual((yield conn.take(40)), expected)

    @defer.inlineCallbacks
    def test_06_acks_only_after_durability(self):
        yield self.start(storage={"fsync": "always"})
        yield self.create()
        conn = yield self.writer()
        syncer = self.service.store.syncer
        held = []
        original = syncer.after_sync
        self.patch(syncer, "after_sync", lambda path, done: held.append((path, done)))
        conn.send(solo(W, events(b"x"), 1, 7))
        reader = yield self.raw()
        read = reader.call(pc.ReadSegment(SEG, 0, 100, "", 9))
        yield sleep(0.3)
        self.assertEqual(conn.unanswered(), 0)
        self.assertFalse(read.called)     # parked: the data is not durable yet
        self.assertEqual(self.state().high_watermark, 0)
        syncer.after_sync = original
        for path, done in held:
            original(path, done)
        self.assertEqual((yield conn.take()), pc.DataAppended(W, 1, MIN, 7, 9))
        self.assertEqual((yield read).data, events(b"x"))

    @defer.inlineCallbacks
    def test_07_reconnect_and_restart_report_the_last_number(self):
        yield self.start(storage={"fsync": "always"})
        yield self.create()
        conn = yield self.writer()
        yield conn.call(*block(W, events(b"a", b"b"), 2, 1))
        yield conn.call(solo(W, events(b"c"), 3, 2))
        # a block whose ack the client never saw: stored, then the connection drops
        conn.send(solo(W, events(b"d", b"e"), 5, 3))
        yield conn.take()
        conn.transport.loseConnection()
        again = yield self.writer(last=5)
        # the client drops events <= 5 and re-sends the rest under their numbers
        self.assertEqual((yield again.call(solo(W, events(b"f"), 6, 1))),
                         pc.DataAppended(W, 6, 5, 1, 54))
        again.transport.loseConnection()
        yield again.lost
        yield self.restart()
        after = yield self.writer(last=6)
        # a re-sent block at or below the stored number is a protocol error
        # (§6.3) and stores nothing
        after.send(solo(W, events(b"f"), 5, 2))
        reply = yield after.take()
        self.assertIsInstance(reply, pc.ErrorMessage)
        self.assertEqual((reply.request_id, reply.segment), (2, SEG))
        yield after.lost
        self.assertEqual(self.values(), [b"a", b"b", b"c", b"d", b"e", b"f"])

    @defer.inlineCallbacks
    def test_08_stale_writer_gets_invalid_event_number_and_close(self):
        yield self.start()
        yield self.create()
        old = yield self.writer()
        yield old.call(solo(W, events(b"1"), 1, 1))
        new = yield self.writer(last=1)
        yield new.call(solo(W, events(b"2"), 2, 1))
        # the old connection still expects 1: its block loses the compare-and-set
        old.send(solo(W, events(b"2"), 2, 4), solo(W, events(b"3"), 3, 5))
        self.assertEqual((yield old.take()), pc.InvalidEventNumber(W, 4, "", 2))
        yield old.lost
        self.assertEqual(old.unanswered(), 0)
        self.assertEqual(self.values(), [b"1", b"2"])
        # the client reconnects: SetupAppend says 2, and 3 is stored once
        again = yield self.writer(last=2)
        self.assertEqual((yield again.call(solo(W, events(b"3"), 3, 1))),
                         pc.DataAppended(W, 3, 2, 1, 27))
        self.assertEqual(self.values(), [b"1", b"2", b"3"])
        # the other connection was unaffected, though its number is now stale
        new.send(solo(W, events(b"x"), 3, 9))
        self.assertEqual((yield new.take()), pc.InvalidEventNumber(W, 9, "", 3))

    @defer.inlineCallbacks
    def test_09_conditional_append(self):
        yield self.start()
        yield self.create()
        conn = yield self.writer()
        yield conn.call(solo(W, events(b"hi", b"abc"), 2, 1))
        self.assertEqual((yield conn.call(pc.ConditionalAppend(W, 3, 21, 0, b"xyz", 7))),
                         pc.DataAppended(W, 3, 2, 7, 32))
        self.assertEqual((yield conn.call(pc.ConditionalAppend(W, 4, 21, 0, b"no", 8))),
                         pc.ConditionalCheckFailed(W, 4, 8))
        self.assertEqual((yield conn.call(pc.ConditionalAppend(W, 4, 33, 0, b"no", 9))),
                         pc.ConditionalCheckFailed(W, 4, 9))
        # the connection is open and the writer's number rolled back
        self.assertEqual((yield conn.call(pc.ConditionalAppend(W, 4, 32, 0, b"yes", 10))),
                         pc.DataAppended(W, 4, 3, 10, 43))
        self.assertEqual((yield conn.call(solo(W, events(b"z"), 5, 11))),
                         pc.DataAppended(W, 5, 4, 11, 52))
        self.assertEqual(self.values(), [b"hi", b"abc", b"xyz", b"yes", b"z"])

    @defer.inlineCallbacks
    def test_10_reads_at_zero_and_mid_event(self):
        yield self.start()
        yield self.create()
        conn = yield self.writer()
        yield conn.call(solo(W, events(b"hi", b"abc"), 2, 1))
        reader = yield self.raw()
        reader.send(pc.ReadSegment(SEG, 0, 1024, "", 2))
        self.assertEqual((yield reader.take()), pc.SegmentRead(SEG, 0, True, False,
                                                               events(b"hi", b"abc"), 2))
        reader.send(pc.ReadSegment(SEG, 12, 1024, "", 3))
        self.assertEqual((yield reader.take_raw()), [pc.encode(pc.SegmentRead(
            SEG, 12, True, False, bytes.fromhex("000000000003616263"), 3))])
        # bounded by the suggested length (at least 8), not at the tail
        self.assertEqual((yield reader.call(pc.ReadSegment(SEG, 3, 9, "", 4))),
                         pc.SegmentRead(SEG, 3, False, False, events(b"hi", b"abc")[3:12], 4))
        self.assertEqual((yield reader.call(pc.ReadSegment(SEG, 3, 2, "", 5))),
                         pc.SegmentRead(SEG, 3, False, False, events(b"hi", b"abc")[3:11], 5))

    @defer.inlineCallbacks
    def test_11_read_at_the_tail_parks_until_another_dialect_appends(self):
        yield self.start(pravega={"long_poll_ms": 20000})
        yield self.create()
        reader = yield self.raw()
        read = reader.call(pc.ReadSegment(SEG, 0, 1024, "", 1))
        beyond = reader.call(pc.ReadSegment(SEG, 20, 1024, "", 2))
        yield sleep(0.2)
        self.assertFalse(read.called)
        client = yield self.rustlog()
        yield client.produce("t", 0, [b"kafka-ish"])
        self.assertEqual((yield read), pc.SegmentRead(SEG, 0, True, False, events(b"kafka-ish"),
                                                      1))
        # a read beyond the tail waits until the tail passes its offset
        yield sleep(0.1)
        self.assertFalse(beyond.called)
        yield client.produce("t", 0, [b"12345"])
        self.assertEqual((yield beyond), pc.SegmentRead(
            SEG, 20, True, False, (events(b"kafka-ish") + events(b"12345"))[20:], 2))

    @defer.inlineCallbacks
    def test_11_timed_out_read_is_empty_at_tail(self):
        yield self.start(pravega={"long_poll_ms": 300})
        yield self.create()
        reader = yield self.raw()
        started = reactor.seconds()
        self.assertEqual((yield reader.call(pc.ReadSegment(SEG, 0, 1024, "", 1))),
                         pc.SegmentRead(SEG, 0, True, False, b"", 1))
        self.assertGreaterEqual(reactor.seconds() - started, 0.25)

    @defer.inlineCallbacks
    def test_13_truncation_after_retention(self):
        yield self.start(storage={"segment_bytes": 4096, "retention": {"hours": None,
                                                                       "bytes": 4096}})
        yield self.create()
        conn = yield self.writer()
        value = b"v" * 500
        for i in range(1, 31):
            yield conn.call(solo(W, events(value), i, i))
        self.assertGreater(self.service.store.enforce_retention(), 0)
        start = self.state().start_position
        self.assertGreater(start, 0)
        self.assertEqual(start % 508, 0)
        reader = yield self.raw()
        self.assertEqual((yield reader.call(pc.ReadSegment(SEG, start - 1, 100, "", 1))),
                         pc.SegmentIsTruncated(1, SEG, start, "", start - 1))
        self.assertEqual((yield reader.call(pc.ReadSegment(SEG, 0, 100, "", 2))),
                         pc.SegmentIsTruncated(2, SEG, start, "", 0))
        info = yield reader.call(pc.GetStreamSegmentInfo(3, SEG, ""))
        self.assertEqual((info.start_offset, info.write_offset), (start, 30 * 508))
        self.assertEqual((yield reader.call(pc.ReadSegment(SEG, start + 4, 8, "", 4))),
                         pc.SegmentRead(SEG, start + 4, False, False,
                                        events(value)[4:12], 4))

    @defer.inlineCallbacks
    def test_14_segment_names(self):
        yield self.start()
        client = yield self.rustlog(binary=True)
        yield client.create_topic("user_events", 2)
        yield client.produce("user_events", 1, [b"u"])
        conn = yield self.raw()
        for name in ("s/x--user-uevents/1.#epoch.0", "user_events/1"):
            self.assertEqual((yield conn.call(pc.ReadSegment(name, 0, 100, "", 1))),
                             pc.SegmentRead(name, 0, True, False, events(b"u"), 1))
        bad = ["other/x--user-uevents/1.#epoch.0",    # another scope
               "s/x--user-uevents/1.#epoch.1",        # another epoch
               "s/x--user-uevents/2.#epoch.0",        # no such partition
               "s/x--user-uevents/01.#epoch.0",
               "s/user_events/1.#epoch.0",            # not escaped
               "s/x--user-uevents-/1.#epoch.0",
               "user_events/1#index",
               "s/x--user-uevents/1.#epoch.0#transient.00000000000000000000000000000000",
               "../etc/0"]
        for i, name in enumerate(bad):
            self.assertEqual((yield conn.call(pc.ReadSegment(name, 5, 100, "", i))),
                             pc.NoSuchSegment(i, name, "", 5))
            self.assertEqual((yield conn.call(pc.SetupAppend(i, W, name, ""))),
                             pc.NoSuchSegment(i, name, "", -1))
            self.assertEqual((yield conn.call(pc.GetStreamSegmentInfo(i, name, ""))),
                             pc.NoSuchSegment(i, name, "", -1))
        # an unknown topic: no segment to read (SetupAppend would auto-create it)
        self.assertEqual((yield conn.call(pc.ReadSegment("s/nope/0.#epoch.0", 0, 9, "", 1))),
                         pc.NoSuchSegment(1, "s/nope/0.#epoch.0", "", 0))
        self.assertEqual(self.service.store.topic_names(), ["user_events"])

    @defer.inlineCallbacks
    def test_15_refusals_keep_the_connection_open(self):
        yield self.start(limits={"max_record_bytes": 1000})
        yield self.create()
        yield self.create("u")
        for i, bad in enumerate((b"not events at all", events(b"x" * 1001),
                                 events(b"ok") + b"\x00\x00\x00\x01\x00\x00\x00\x00")):
            w = bytes([10 + i]) * 16
            conn = yield self.writer(writer_id=w)
            conn.send(solo(w, bad, 1, 1, count=1), solo(w, events(b"later"), 2, 2))
            self.assertEqual((yield conn.take(2)), [pc.SegmentIsSealed(1, SEG, "", -1),
                                                    pc.SegmentIsSealed(2, SEG, "", -1)])
            # the same with the Java form and a conditional append
            conn.send(*block(w, events(b"more"), 3, 3))
            conn.send(pc.ConditionalAppend(w, 4, 0, 0, b"c", 4))
            self.assertEqual((yield conn.take(2)), [pc.SegmentIsSealed(3, SEG, "", -1),
                                                    pc.SegmentIsSealed(4, SEG, "", -1)])
            # other requests are still answered, and a new SetupAppend clears it
            self.assertEqual((yield conn.call(pc.KeepAlive())), pc.KeepAlive())
            yield conn.call(pc.SetupAppend(5, w, SEG, ""))
            self.assertEqual((yield conn.call(solo(w, events(b"fine"), 1, 6))).event_number, 1)
            self.assertEqual(self.values().pop(), b"fine")
            yield self.produce([b"reset"])
        conditional = yield self.writer("s/u/0.#epoch.0")
        self.assertEqual((yield conditional.call(pc.ConditionalAppend(W, 1, 0, 1, b"x", 1))),
                         pc.SegmentIsSealed(1, "s/u/0.#epoch.0", "", -1))
        large = yield self.writer("s/u/0.#epoch.0", writer_id=W2)
        self.assertEqual((yield large.call(pc.ConditionalAppend(W2, 1, 0, 0, b"y" * 1001, 2))),
                         pc.SegmentIsSealed(2, "s/u/0.#epoch.0", "", -1))
        self.assertEqual(self.values("u"), [])
        self.assertEqual(self.values(), [b"fine", b"reset"] * 3)

    @defer.inlineCallbacks
    def test_15_sealed_partition_refuses_appends(self):
        yield self.start()
        yield self.create()
        conn = yield self.writer()
        yield conn.call(solo(W, events(b"a"), 1, 1))
        yield self.service.bus.execute(cmd.SealPartition("t", 0))
        # SetupAppend still answers with the stored number
        again = yield self.writer(writer_id=W, last=1)
        again.send(*block(W, events(b"b"), 2, 2))
        again.send(solo(W, events(b"c"), 3, 3))
        self.assertEqual((yield again.take(2)), [pc.SegmentIsSealed(2, SEG, "", -1),
                                                 pc.SegmentIsSealed(3, SEG, "", -1)])
        self.assertEqual(self.values(), [b"a"])

    @defer.inlineCallbacks
    def test_16_malformed_frames_error_and_close_only_that_connection(self):
        yield self.start(pravega={"max_frame_bytes": 65536})
        yield self.create()
        good = yield self.writer(writer_id=W2)
        cases = [
            # (frames, (requestId, segment) of the ErrorMessage, reason fragment)
            ([pc.AppendBlock(W, events(b"a")), pc.KeepAlive()], (-1, ""), "AppendBlock followed"),
            ([pc.AppendBlock(W, events(b"a")), solo(W2, events(b"a"), 1, 3)], (3, ""),
             "after an AppendBlock of writer"),
            ([pc.AppendBlock(W, events(b"a")), pc.AppendBlockEnd(W, 10, b"", 1, 1, 4)],
             (4, SEG), "sizeOfWholeEvents 10"),
            ([pc.AppendBlock(W, events(b"a") + b"\x00\x00\x00\x05\x00\x00\x00\x00"),
              pc.AppendBlockEnd(W, 9, b"", 1, 1, 5)], (5, SEG), "neither PartialEvent"),
            ([pc.AppendBlock(W, events(b"a") + struct.pack(">ii", -1, 1) + b"\x00"),
              pc.AppendBlockEnd(W, 9, b"x", 1, 1, 6)], (6, SEG), "Padding followed"),
            ([solo(W, events(b"a"), 1, 7, count=0)], (7, SEG), "numEvents 0"),
            ([struct.pack(">ii", 99, 0)], (-1, ""), "type code 99"),
            ([struct.pack(">ii", -4, 0)], (-1, ""), "type code -4"),
            ([pc.DataAppended(W, 1, 1, 1, 1)], (-1, ""), "is not a request"),
            ([pc.encode(pc.Event(b"x"))], (-1, ""), "is not a request"),
            ([pc.encode(pc.PartialEvent(b"x"))], (-1, ""), "is not a request"),
            ([struct.pack(">ii", pc.SETUP_APPEND, 12) + struct.pack(">q", 9) + b"\x00\x00\x00\x00"],
             (9, ""), "field writer_id runs past"),
            ([struct.pack(">iI", pc.SETUP_APPEND, 65536 - 7)], (-1, ""), "exceeds 65536"),
            ([struct.pack(">ii", pc.SETUP_APPEND, -1)], (-1, ""), "negative frame length -1"),
        ]
        for frames, ids, reason in cases:
            conn = yield self.writer()
            conn.send(*frames)
            reply = yield conn.take()
            self.assertIsInstance(reply, pc.ErrorMessage, reason)
            self.assertEqual((reply.request_id, reply.segment, reply.error_code), (*ids, -1))
            self.assertIn(reason, reply.message)
            yield conn.lost
        # an append before SetupAppend, and an event number going backwards
        conn = yield self.raw()
        self.assertEqual((yield conn.call(solo(W, events(b"a"), 1, 11))).message,
                         f"append for writer {W.hex()} before SetupAppend")
        conn = yield self.raw()
        conn.send(pc.AppendBlock(W2, events(b"a")))
        self.assertIsInstance((yield conn.take()), pc.ErrorMessage)
        w = bytes([7]) * 16
        conn = yield self.writer(writer_id=w)
        yield conn.call(solo(w, events(b"a"), 5, 1))
        reply = yield conn.call(solo(w, events(b"b"), 4, 2))
        self.assertEqual((reply.request_id, reply.segment, reply.message),
                         (2, SEG, "event number 4 below the writer's last 5"))
        # exactly the maximum frame is read; the good connection never noticed
        conn = yield self.writer()
        big = events(b"x" * (65536 - 8 - 16 - 4 - 4 - 4 - 8 - 8 - 8))
        self.assertEqual((yield conn.call(solo(W, big, 6, 3))).event_number, 6)
        self.assertEqual((yield good.call(solo(W2, events(b"ok"), 1, 1))).event_number, 1)
        self.assertEqual(self.values(), [b"a", b"x" * (65536 - 60), b"ok"])

    @defer.inlineCallbacks
    def test_17_rust_style_writer(self):
        yield self.start()
        yield self.create()
        conn = yield self.raw()
        self.assertEqual((yield conn.call(pc.Hello(15, 5))), pc.Hello(17, 5))
        yield conn.call(pc.SetupAppend(1, W, SEG, ""))
        payloads = [bytes(range(256)) * 3, b"", b"\x00\xff" * 77]
        # numEvents is the writer's in-flight count, not the block's
        conn.send(pc.AppendBlockEnd(W, 0, events(*payloads[:2]), 17, 2, 2),
                  pc.AppendBlockEnd(W, 999, events(payloads[2]), 40, 3, 3))
        acks = yield conn.take(2)
        self.assertEqual([a.event_number for a in acks], [2, 3])
        read = yield conn.call(pc.ReadSegment(SEG, 0, 8 * MiB, "", 4))
        self.assertEqual(read.data, events(*payloads))
        self.assertEqual(self.values(), payloads)

    @defer.inlineCallbacks
    def test_18_unsupported_operations(self):
        """Byte streams, transient segments, merges and table segments are
        served (test_pravega_bytes_tables.py); what stays unsupported gets
        OperationUnsupported with the connection left open."""
        yield self.start()
        yield self.create()
        conn = yield self.writer()
        for code, name in ((38, "truncateSegment"), (41, "locateOffset"),
                           (32, "updateSegmentPolicy"), (68, "getTableSegmentInfo"),
                           (72, "mergeTableSegments"), (90, "mergeSegmentsBatch")):
            conn.send(struct.pack(">iiq", code, 8 + 3, 42 + code) + b"abc")
            self.assertEqual((yield conn.take()), pc.OperationUnsupported(42 + code, name, ""))
        # replies of the new commands are not requests
        for reply in (pc.SegmentsMerged(1, SEG, SEG, 0), pc.TableEntriesUpdated(1, ()),
                      pc.TableKeyBadVersion(1, SEG, "")):
            other = yield self.raw()
            self.assertIn("is not a request", (yield other.call(reply)).message)
        self.assertEqual((yield conn.call(solo(W, events(b"ok"), 1, 1))).event_number, 1)

    @defer.inlineCallbacks
    def test_19_seal_and_delete(self):
        yield self.start(pravega={"long_poll_ms": 20000})
        yield self.create()
        yield self.create("multi", 2)
        conn = yield self.writer()
        yield conn.call(solo(W, events(b"hi", b"abc"), 2, 1))
        reader = yield self.raw()
        parked = reader.call(pc.ReadSegment(SEG, 21, 1024, "", 11))
        admin = yield self.raw()
        self.assertEqual((yield admin.call(pc.DeleteSegment(9, SEG, ""))),
                         pc.OperationUnsupported(9, "deleteSegment", ""))
        admin.send(pc.SealSegment(10, SEG, ""))
        self.assertEqual((yield admin.take_raw()), [bytes.fromhex(
            "0000001d00000018000000000000000a000e") + SEG.encode()])
        self.assertEqual((yield parked), pc.SegmentRead(SEG, 21, True, True, b"", 11))
        reader.send(pc.ReadSegment(SEG, 21, 1024, "", 12))
        self.assertEqual((yield reader.take_raw()), [bytes.fromhex(
            "0000000a00000026000e") + SEG.encode() + bytes.fromhex(
            "0000000000000015010100000000000000000000000c")])
        self.assertEqual((yield reader.call(pc.ReadSegment(SEG, 10, 1024, "", 13))),
                         pc.SegmentRead(SEG, 10, True, True, events(b"abc"), 13))
        self.assertEqual((yield admin.call(pc.SealSegment(14, SEG, ""))),
                         pc.SegmentSealed(14, SEG))
        info = yield reader.call(pc.GetStreamSegmentInfo(15, SEG, ""))
        self.assertEqual((info.exists, info.is_sealed, info.write_offset), (True, True, 21))
        self.assertEqual((yield conn.call(solo(W, events(b"x"), 3, 16))),
                         pc.SegmentIsSealed(16, SEG, "", -1))
        client = yield self.rustlog()
        yield self.assertFailure(client.produce("t", 0, [b"k"]), RustLogError)
        # only a sealed topic of one partition can be deleted
        yield admin.call(pc.SealSegment(17, "s/multi/0.#epoch.0", ""))
        self.assertEqual((yield admin.call(pc.DeleteSegment(18, "s/multi/0.#epoch.0", ""))),
                         pc.OperationUnsupported(18, "deleteSegment", ""))
        self.assertEqual((yield admin.call(pc.DeleteSegment(19, SEG, ""))),
                         pc.SegmentDeleted(19, SEG))
        self.assertNotIn("t", self.service.store.topics)
        for request in (pc.DeleteSegment(20, SEG, ""), pc.SealSegment(20, SEG, ""),
                        pc.GetStreamSegmentInfo(20, SEG, "")):
            self.assertEqual((yield admin.call(request)), pc.NoSuchSegment(20, SEG, "", -1))
        self.assertEqual((yield admin.call(pc.ReadSegment(SEG, 3, 10, "", 21))),
                         pc.NoSuchSegment(21, SEG, "", 3))

    @defer.inlineCallbacks
    def test_20_create_segment_creates_and_grows(self):
        yield self.start(topics={"default_partitions": 2})
        conn = yield self.raw()
        self.assertEqual((yield conn.call(pc.CreateSegment(5, SEG, 0, 0, "", 0))),
                         pc.SegmentCreated(5, SEG))
        self.assertEqual(self.service.store.topic("t").partitions, 2)
        self.assertEqual((yield conn.call(pc.CreateSegment(6, "t/1", 0, 0, "", 0))),
                         pc.SegmentAlreadyExists(6, "t/1", ""))
        self.assertEqual((yield conn.call(pc.CreateSegment(7, "s/t/4.#epoch.0", 0, 0, "", 0))),
                         pc.SegmentCreated(7, "s/t/4.#epoch.0"))
        client = yield self.rustlog(binary=True)
        described = yield client.describe_topic("t")
        self.assertEqual(described.partition_count, 5)
        self.assertEqual((yield conn.call(pc.CreateSegment(8, "s/new/6.#epoch.0", 0, 0, "", 0))),
                         pc.SegmentCreated(8, "s/new/6.#epoch.0"))
        self.assertEqual(self.service.store.topic("new").partitions, 7)
        # beyond topics.max_partitions, or a name that is no topic
        self.assertEqual((yield conn.call(pc.CreateSegment(9, "s/t/5000.#epoch.0", 0, 0, "",
                                                           0))),
                         pc.OperationUnsupported(9, "createSegment", ""))
        self.assertEqual((yield conn.call(pc.CreateSegment(10, "x/t/0.#epoch.0", 0, 0, "", 0))),
                         pc.NoSuchSegment(10, "x/t/0.#epoch.0", "", -1))
        self.assertEqual((yield conn.call(pc.CreateSegment(11, "../0", 0, 0, "", 0))),
                         pc.NoSuchSegment(11, "../0", "", -1))
        # a new topic is undecided until its first append, which makes it events
        self.assertEqual(self.service.store.topic("new").kind, "undecided")
        writer = yield self.writer("s/new/6.#epoch.0")
        yield writer.call(solo(W, events(b"e"), 1, 1))
        self.assertEqual(self.service.store.topic("new").kind, "event")


# ---------------------------------------------------------------------------
# Beyond the checklist
# ---------------------------------------------------------------------------

class BehaviourTests(PravegaTest):

    @defer.inlineCallbacks
    def test_setup_append_auto_creates_only_when_allowed(self):
        yield self.start(topics={"auto_create": False})
        conn = yield self.raw()
        self.assertEqual((yield conn.call(pc.SetupAppend(1, W, SEG, ""))),
                         pc.NoSuchSegment(1, SEG, "", -1))
        self.assertNotIn("t", self.service.store.topics)
        yield self.service.stopService()
        self.config = gateway_config(self.directory, [
            {"dialect": "pravega", "endpoint": "tcp:0:interface=127.0.0.1", "scope": "s"}])
        self.service, ports = yield start_gateway(self, self.config)
        self.port = ports["pravega"]
        conn = yield self.raw()
        self.assertEqual((yield conn.call(pc.SetupAppend(1, W, "s/auto/3.#epoch.0", ""))),
                         pc.AppendSetup(1, "s/auto/3.#epoch.0", W, MIN))
        self.assertEqual(self.service.store.topic("auto").partitions, 4)
        # an existing topic is not grown by SetupAppend
        self.assertEqual((yield conn.call(pc.SetupAppend(2, W, "s/auto/4.#epoch.0", ""))),
                         pc.NoSuchSegment(2, "s/auto/4.#epoch.0", "", -1))

    @defer.inlineCallbacks
    def test_setup_append_waits_for_the_writers_appends_in_flight(self):
        """A reconnecting writer is told a number only once the appends it
        covers are durable: its old connection's block is still waiting for
        fsync, so the new connection's AppendSetup waits too."""
        yield self.start(storage={"fsync": "always"})
        yield self.create()
        old = yield self.writer()
        syncer = self.service.store.syncer
        held = []
        original = syncer.after_sync
        self.patch(syncer, "after_sync", lambda path, done: held.append((path, done)))
        old.send(solo(W, events(b"x"), 1, 7))
        new = yield self.raw()
        setup = new.call(pc.SetupAppend(2, W, SEG, ""))
        unrelated = yield self.raw()
        other = yield unrelated.call(pc.SetupAppend(3, W2, SEG, ""))   # another writer: at once
        self.assertEqual(other, pc.AppendSetup(3, SEG, W2, MIN))
        yield sleep(0.2)
        self.assertFalse(setup.called)
        syncer.after_sync = original
        for path, done in held:
            original(path, done)
        self.assertEqual((yield setup), pc.AppendSetup(2, SEG, W, 1))
        self.assertEqual((yield old.take()), pc.DataAppended(W, 1, MIN, 7, 9))

    @defer.inlineCallbacks
    def test_several_writers_on_one_connection(self):
        yield self.start()
        yield self.create("t", 2)
        conn = yield self.raw()
        writers = [bytes([i]) * 16 for i in range(1, 5)]
        for i, w in enumerate(writers):
            yield conn.call(pc.SetupAppend(i, w, f"s/t/{i % 2}.#epoch.0", ""))
        frames = []
        for n in range(1, 11):
            for i, w in enumerate(writers):
                frames.append(solo(w, events(b"%d/%d" % (i, n)), n, 100 * i + n))
        conn.send(*frames)
        acks = yield conn.take(40)
        for i, w in enumerate(writers):
            mine = [a for a in acks if a.writer_id == w]
            self.assertEqual([(a.event_number, a.previous_event_number, a.request_id)
                              for a in mine],
                             [(n, n - 1 if n > 1 else MIN, 100 * i + n) for n in range(1, 11)])
        for p in (0, 1):
            stored = self.values("t", p)
            self.assertEqual(len(stored), 20)
            for i in (p, p + 2):
                self.assertEqual([v for v in stored if v.startswith(b"%d/" % i)],
                                 [b"%d/%d" % (i, n) for n in range(1, 11)])

    @defer.inlineCallbacks
    def test_conditional_append_is_a_barrier_in_a_pipeline(self):
        yield self.start(storage={"fsync": "interval", "fsync_interval_ms": 20})
        yield self.create()
        conn = yield self.writer()
        e = events(b"12345678")     # 16 bytes each
        conn.send(solo(W, e, 1, 1), solo(W, e, 2, 2),
                  pc.ConditionalAppend(W, 3, 32, 0, b"12345678", 3),     # tail 32: succeeds
                  solo(W, e, 4, 4),
                  pc.ConditionalAppend(W, 5, 32, 0, b"12345678", 5),     # stale: fails
                  solo(W, e, 6, 6),
                  pc.ConditionalAppend(W, 7, 80, 0, b"12345678", 7))     # succeeds
        replies = yield conn.take(7)
        self.assertEqual(replies, [
            pc.DataAppended(W, 1, MIN, 1, 16), pc.DataAppended(W, 2, 1, 2, 32),
            pc.DataAppended(W, 3, 2, 3, 48), pc.DataAppended(W, 4, 3, 4, 64),
            pc.ConditionalCheckFailed(W, 5, 5), pc.DataAppended(W, 6, 4, 6, 80),
            pc.DataAppended(W, 7, 6, 7, 96)])
        self.assertEqual(len(self.values()), 6)

    @defer.inlineCallbacks
    def test_reads_at_every_offset(self):
        """Every byte offset from 0 to the tail, with several read sizes, over
        batches written by Pravega (as sent) and by RustLog (framed from
        records): each reply is exactly that slice of the view."""
        yield self.start()
        yield self.create()
        conn = yield self.writer()
        values = []
        yield conn.call(solo(W, events(b"hi", b"abc", b""), 3, 1))
        values += [b"hi", b"abc", b""]
        client = yield self.rustlog()
        yield client.produce("t", 0, [b"x" * 20, b"", b"yz"])
        values += [b"x" * 20, b"", b"yz"]
        yield conn.call(*block(W, events(b"tail-event"), 4, 2))
        values.append(b"tail-event")
        view = events(*values)
        self.assertEqual(self.state().end_position, len(view))
        reader = yield self.raw()
        requests = []
        expected = []
        rid = 0
        for offset in range(len(view)):
            for size in (1, 8, 13, 1000):
                rid += 1
                requests.append(pc.ReadSegment(SEG, offset, size, "", rid))
                end = min(len(view), offset + max(8, size))
                expected.append(pc.SegmentRead(SEG, offset, end == len(view), False,
                                               view[offset:end], rid))
        reader.send(*requests)
        got = yield reader.take(len(requests))
        self.assertEqual(sorted(got, key=lambda r: r.request_id), expected)

    @defer.inlineCallbacks
    def test_large_reads_are_clamped_and_span_batches(self):
        yield self.start()
        yield self.create()
        conn = yield self.writer()
        value = bytes(range(256)) * 40         # 10,240 bytes per event
        frames = [solo(W, events(value, value), 2 * i, i) for i in range(1, 151)]
        conn.send(*frames)
        yield conn.take(150)
        view = events(*[value] * 300)
        reader = yield self.raw()
        got = yield reader.call(pc.ReadSegment(SEG, 5, 8 * MiB, "", 1))
        self.assertEqual(len(got.data), pc.MAX_READ_BYTES)
        self.assertEqual(got.data, view[5:5 + pc.MAX_READ_BYTES])
        self.assertFalse(got.at_tail)
        rest = yield reader.call(pc.ReadSegment(SEG, 5 + pc.MAX_READ_BYTES, 8 * MiB, "", 2))
        self.assertEqual(rest.data, view[5 + pc.MAX_READ_BYTES:])
        self.assertTrue(rest.at_tail)

    @defer.inlineCallbacks
    def test_parked_reads_are_cancelled_with_their_connection(self):
        yield self.start()
        yield self.create()
        reader = yield self.raw()
        for i in range(5):
            reader.send(pc.ReadSegment(SEG, i, 100, "", i))
        part = self.service.store.partitions[("t", 0)]
        yield eventually(lambda: len(part.waiters) == 5)
        reader.transport.loseConnection()
        yield reader.lost
        yield eventually(lambda: part.waiters == [])
        conn = yield self.writer()
        self.assertEqual((yield conn.call(solo(W, events(b"a"), 1, 1))).event_number, 1)

    @defer.inlineCallbacks
    def test_a_client_that_stops_reading_is_paused(self):
        yield self.start()
        yield self.create()
        conn = yield self.writer()
        value = b"v" * 10000
        conn.send(*[solo(W, events(*[value] * 20), i, i) for i in range(1, 21)])
        yield conn.take(20)
        reader = yield self.raw()
        reader.transport.pauseProducing()          # stop reading replies
        reader.send(*[pc.ReadSegment(SEG, 0, 512 * 1024, "", i) for i in range(64)])
        server = [p for p in self.service.listeners[0].factory.connections
                  if p.transport.getPeer().port == reader.transport.getHost().port][0]
        # the gateway stops at a full write buffer: the reads not yet begun
        # wait (held unread, or at the write gate), none is lost
        yield eventually(lambda: server.write_paused)
        reader.transport.resumeProducing()
        got = yield reader.take(64)
        self.assertEqual(sorted(r.request_id for r in got), list(range(64)))
        self.assertTrue(all(len(r.data) == 512 * 1024 for r in got))

    @defer.inlineCallbacks
    def test_info_reports_positions_and_times(self):
        yield self.start()
        yield self.create()
        conn = yield self.raw()
        info = yield conn.call(pc.GetStreamSegmentInfo(1, SEG, ""))
        created = self.service.store.topic("t").created_ms
        self.assertEqual(info, pc.StreamSegmentInfo(1, SEG, True, False, False, created, 0, 0))
        yield sleep(0.02)
        yield self.produce([b"abc"])
        appended = self.service.store.read("t", 0, 0, 1)[0].append_ms
        self.assertGreater(appended, created)
        info = yield conn.call(pc.GetStreamSegmentInfo(2, SEG, ""))
        self.assertEqual(info, pc.StreamSegmentInfo(2, SEG, True, False, False, appended, 11, 0))
