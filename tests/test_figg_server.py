"""The Figg dialect end to end: the real service tree on a real socket,
driven by raw frames (exact bytes in, decoded messages out) and by
``plugins/figg/client.py``.

Organised by what protocols/figg.md asks: ATTACH (latest, from an offset,
from 0, backlog and live, the switch-over under concurrent publishing,
clamping after retention, auto-creation), DETACH, several topics and
subscribers, PUBLISH/ACK (order, windows, durability, no dedup, refusals),
PING/PONG, bad input, the listener's options, and resuming across a
restart and a crash.
"""
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import time

from twisted.internet import defer, reactor, task

from gateway import commands as c
from gateway.config import ConfigError
from gateway.records import RecordBatch
from plugins.figg import codec as fc
from tests.support import GatewayProcess, gateway_config
from tests.figg_support import (
    FIGG,
    FiggTest,
    LogCapture,
    data_frames,
    wait_until,
)

U64_MAX = 2 ** 64 - 1


def values(n, prefix=b"v"):
    return [prefix + b"%d" % i for i in range(n)]


class Base(FiggTest):

    @defer.inlineCallbacks
    def publish(self, topic, vals, conn=None):
        """PUBLISH ``vals`` (seq 0..) on a raw connection; fires after their ACKs."""
        conn = conn or (yield self.raw())
        conn.send(*[fc.Publish(topic, i, v) for i, v in enumerate(vals)])
        acks = yield conn.take(len(vals))
        self.assertEqual(acks, [fc.Ack(i) for i in range(len(vals))])

    def produce(self, topic, vals, partition=0, **kw):
        """Append through the bus, as any other dialect would."""
        return self.bus.execute(c.Produce(topic, partition, RecordBatch(vals, **kw)))

    def log_records(self, topic, partition=0):
        """[(offset, value)] of the whole partition, read through the bus."""
        [part] = self.successResultOf(self.bus.execute(c.Fetch(
            [c.FetchPartition(topic, partition, 0, 1 << 30)])))
        out = []
        for batch in part.batches:
            records = self.bus.decode(batch)
            out += list(zip(records.offsets(), records.values))
        return out


class AttachTests(Base):

    @defer.inlineCallbacks
    def test_attach_latest_reports_the_next_offset_and_streams_only_new_records(self):
        yield self.start()
        yield self.publish(b"foo", values(5))
        sub = yield self.raw()
        sub.send(fc.Attach(b"foo"))
        self.assertEqual((yield sub.take()), [fc.Attached(b"foo", 5)])
        yield self.publish(b"foo", [b"bar"])
        self.assertEqual((yield sub.take()), [fc.Data(b"foo", 6, b"bar")])

    @defer.inlineCallbacks
    def test_offset_mapping_worked_through(self):
        # figg.md §5: records 0..4, then "bar" at 5.
        yield self.start()
        yield self.publish(b"foo", values(5))
        yield self.publish(b"foo", [b"bar"])
        cases = [
            (fc.Attach(b"foo", 6, 0x8000), [fc.Attached(b"foo", 6)]),
            (fc.Attach(b"foo", 5, 0x8000), [fc.Attached(b"foo", 5), fc.Data(b"foo", 6, b"bar")]),
            (fc.Attach(b"foo", 5, 0x0001), [fc.Attached(b"foo", 5), fc.Data(b"foo", 6, b"bar")]),
            (fc.Attach(b"foo", 99, 0x8000), [fc.Attached(b"foo", 6)]),
            (fc.Attach(b"foo", 2, 0x4000), [fc.Attached(b"foo", 6)]),      # unknown bits only
            (fc.Attach(b"foo", 3, 0x0000), [fc.Attached(b"foo", 6)]),
            (fc.Attach(b"foo", U64_MAX, 0x8000), [fc.Attached(b"foo", 6)]),
            (fc.Attach(b"foo", 4, 0x8001), [fc.Attached(b"foo", 4), fc.Data(b"foo", 5, b"v4"),
                                            fc.Data(b"foo", 6, b"bar")]),
        ]
        for attach, expected in cases:
            sub = yield self.raw()
            sub.send(attach)
            self.assertEqual((yield sub.take(len(expected))), expected, attach)
            self.assertEqual((yield sub.ping()), [], attach)

    @defer.inlineCallbacks
    def test_attach_from_zero_streams_the_backlog_then_live_records(self):
        yield self.start()
        backlog = values(1000)
        yield self.publish(b"foo", backlog)
        sub = yield self.raw()
        sub.send(fc.Attach(b"foo", 0, fc.FROM_OFFSET))
        got = yield sub.take(1001)
        self.assertEqual(got, [fc.Attached(b"foo", 0)] + data_frames(b"foo", 1, backlog))
        live = values(10, b"live")
        yield self.publish(b"foo", live)
        self.assertEqual((yield sub.take(10)), data_frames(b"foo", 1001, live))

    @defer.inlineCallbacks
    def test_attached_comes_first_with_a_large_backlog_and_racing_appends(self):
        yield self.start()
        for i in range(20):
            yield self.produce("foo", values(1000, b"%d-" % i))
        publisher = yield self.raw()
        sub = yield self.raw()
        # Appends race with the ATTACH: some in the same read as it, on its
        # own connection, some on another connection in the same turn.
        publisher.send(*[fc.Publish(b"foo", i, b"p%d" % i) for i in range(200)])
        sub.send(fc.Publish(b"foo", 0, b"mine"), fc.Attach(b"foo", 0, fc.FROM_OFFSET),
                 fc.Publish(b"foo", 1, b"mine too"))
        first = yield sub.take_until(lambda m: type(m) is not fc.Ack)
        self.assertEqual(first[-1], fc.Attached(b"foo", 0))
        yield publisher.take(200)
        total = len(self.log_records("foo"))
        got = yield sub.take_until(lambda m: type(m) is fc.Data and m.offset == total)
        data = [m for m in got if type(m) is fc.Data]
        self.assertEqual([(m.offset - 1, m.data) for m in data], self.log_records("foo"))

    @defer.inlineCallbacks
    def test_switch_over_under_concurrent_publishing_has_no_gap_and_no_duplicate(self):
        yield self.start()
        publisher = yield self.client()
        total = 20000
        received = {"from0": [], "latest": []}
        attached = {}

        @defer.inlineCallbacks
        def subscribe_midway():
            for name, offset in (("from0", 0), ("latest", None)):
                sub = yield self.client()
                attached[name] = yield sub.subscribe("seq", received[name].append, offset)

        # Another dialect appends to the same topic meanwhile, through the bus.
        other = task.LoopingCall(lambda: self.produce("seq", [b"other"] * 3))
        other.clock = reactor
        for i in range(total):
            if i == total // 4:
                subscribing = subscribe_midway()
                other.start(0.002)
            yield publisher.publish("seq", b"%d" % i)
        yield publisher.publish_blocking("seq", b"end")
        other.stop()
        yield subscribing
        end = len(self.log_records("seq"))
        yield wait_until(lambda: all(r and r[-1].offset == end for r in received.values()))
        log = self.log_records("seq")
        figg_values = [v for _, v in log if v != b"other"]
        self.assertEqual(figg_values, [b"%d" % i for i in range(total)] + [b"end"])
        self.assertEqual([(m.offset - 1, m.data) for m in received["from0"]], log)
        self.assertEqual(attached["from0"], 0)
        start = attached["latest"]
        self.assertGreater(start, 0)
        self.assertEqual([(m.offset - 1, m.data) for m in received["latest"]], log[start:])

    @defer.inlineCallbacks
    def test_a_second_attach_replaces_the_first(self):
        yield self.start()
        yield self.publish(b"foo", values(50))
        sub = yield self.raw()
        sub.send(fc.Attach(b"foo", 0, fc.FROM_OFFSET))
        yield sub.take_until(lambda m: m == fc.Data(b"foo", 10, b"v9"))
        sub.send(fc.Attach(b"foo", 45, fc.FROM_OFFSET))
        got = yield sub.take_until(lambda m: m == fc.Attached(b"foo", 45))
        # Whatever the first stream wrote came before the second ATTACHED...
        self.assertEqual(got[:-1], data_frames(b"foo", 11, values(50)[10:])[:len(got) - 1])
        # ...and after it, only the second stream, once.
        self.assertEqual((yield sub.take(5)), data_frames(b"foo", 46, values(50)[45:]))
        self.assertEqual((yield sub.ping()), [])
        # Replaced in the same read, the first stream never writes at all.
        other = yield self.raw()
        other.send(fc.Attach(b"foo", 0, fc.FROM_OFFSET), fc.Attach(b"foo", 48, fc.FROM_OFFSET))
        self.assertEqual((yield other.take(4)), [fc.Attached(b"foo", 0), fc.Attached(b"foo", 48)]
                         + data_frames(b"foo", 49, [b"v48", b"v49"]))

    @defer.inlineCallbacks
    def test_attach_creates_the_topic_when_auto_create_is_on(self):
        yield self.start()
        sub = yield self.raw()
        sub.send(fc.Attach(b"fresh", 7, fc.FROM_OFFSET))
        self.assertEqual((yield sub.take()), [fc.Attached(b"fresh", 0)])
        [meta] = self.successResultOf(self.bus.execute(c.Metadata(["fresh"])))
        self.assertEqual(meta.info.partitions, 1)
        yield self.produce("fresh", [b"x"])
        self.assertEqual((yield sub.take()), [fc.Data(b"fresh", 1, b"x")])

    @defer.inlineCallbacks
    def test_attach_to_an_unknown_topic_waits_when_auto_create_is_off(self):
        yield self.start(topics={"auto_create": False})
        sub = yield self.raw()
        sub.send(fc.Attach(b"later", 5, fc.FROM_OFFSET))
        self.assertEqual((yield sub.take()), [fc.Attached(b"later", 0)])
        [meta] = self.successResultOf(self.bus.execute(c.Metadata(["later"])))
        self.assertIsNone(meta.info)
        yield self.bus.execute(c.CreateTopic("later", 1))
        yield self.produce("later", [b"a", b"b"])
        self.assertEqual((yield sub.take(2)), data_frames(b"later", 1, [b"a", b"b"]))
        # DETACH while waiting works like any other.
        sub.send(fc.Attach(b"other"), fc.Detach(b"other"))
        self.assertEqual((yield sub.ping()), [fc.Attached(b"other", 0), fc.Detached(b"other")])

    @defer.inlineCallbacks
    def test_figg_sees_only_partition_0(self):
        yield self.start()
        yield self.bus.execute(c.CreateTopic("multi", 3))
        yield self.produce("multi", [b"p1"], partition=1)
        yield self.produce("multi", [b"p0"], partition=0)
        yield self.produce("multi", [b"p2"], partition=2)
        sub = yield self.raw()
        sub.send(fc.Attach(b"multi", 0, fc.FROM_OFFSET))
        self.assertEqual((yield sub.take(2)), [fc.Attached(b"multi", 0),
                                               fc.Data(b"multi", 1, b"p0")])
        self.assertEqual((yield sub.ping()), [])

    @defer.inlineCallbacks
    def test_offsets_below_the_log_start_are_clamped_after_retention(self):
        yield self.start(storage={"segment_bytes": 1024,
                                  "retention": {"hours": None, "bytes": 3000}})
        records = [b"%03d" % i + b"." * 97 for i in range(100)]
        for i in range(0, 100, 5):
            # One batch per round trip (a read's PUBLISHes make one batch).
            yield self.publish(b"old", records[i:i + 5])
        self.assertGreater(self.service.store.enforce_retention(), 0)
        state = yield self.bus.execute(c.PartitionInfo("old", 0))
        start, end = state.log_start, state.high_watermark
        self.assertGreater(start, 0)
        self.assertEqual(end, 100)
        sub = yield self.raw()
        sub.send(fc.Attach(b"old", 0, fc.FROM_OFFSET))
        got = yield sub.take(1 + 100 - start)
        self.assertEqual(got[0], fc.Attached(b"old", start))
        self.assertEqual([m.offset for m in got[1:]], list(range(start + 1, 101)))
        self.assertEqual(got[1].data, b"%03d" % start + b"." * 97)
        sub.send(fc.Attach(b"old", 10 ** 9, fc.FROM_OFFSET))
        self.assertEqual((yield sub.ping()), [fc.Attached(b"old", 100)])


class DetachTests(Base):

    @defer.inlineCallbacks
    def test_detach_is_answered_and_no_data_follows(self):
        yield self.start()
        sub = yield self.raw()
        witness = yield self.raw()
        sub.send(fc.Attach(b"foo"))
        witness.send(fc.Attach(b"foo"))
        yield sub.take()
        yield witness.take()
        yield self.publish(b"foo", [b"a"])
        self.assertEqual((yield sub.take()), [fc.Data(b"foo", 1, b"a")])
        sub.send(fc.Detach(b"foo"))
        self.assertEqual((yield sub.take()), [fc.Detached(b"foo")])
        yield self.publish(b"foo", [b"b", b"c"])
        # The witness got them, so a stream still running for ``sub`` would
        # have written before the PONG.
        self.assertEqual((yield witness.take(3)),
                         data_frames(b"foo", 1, [b"a", b"b", b"c"]))
        self.assertEqual((yield sub.ping()), [])

    @defer.inlineCallbacks
    def test_detach_of_a_topic_not_attached_is_still_answered(self):
        yield self.start()
        sub = yield self.raw()
        sub.send(fc.Detach(b"never"), fc.Detach(b"never"))
        self.assertEqual((yield sub.ping()), [fc.Detached(b"never")] * 2)

    @defer.inlineCallbacks
    def test_topics_on_one_connection_attach_and_detach_independently(self):
        yield self.start()
        sub = yield self.raw()
        sub.send(fc.Attach(b"a"), fc.Attach(b"b"), fc.Attach(b"c"))
        self.assertEqual(sorted((yield sub.take(3)), key=repr),
                         [fc.Attached(t, 0) for t in (b"a", b"b", b"c")])
        yield self.publish(b"a", [b"a1"])
        yield self.publish(b"b", [b"b1"])
        yield self.publish(b"c", [b"c1"])
        got = yield sub.take(3)
        self.assertEqual(sorted(got, key=repr), [fc.Data(b"a", 1, b"a1"), fc.Data(b"b", 1, b"b1"),
                                                 fc.Data(b"c", 1, b"c1")])
        sub.send(fc.Detach(b"b"))
        self.assertEqual((yield sub.take()), [fc.Detached(b"b")])
        for t in (b"a", b"b", b"c"):
            yield self.publish(t, [t + b"2"])
        got = yield sub.ping()
        self.assertEqual(sorted(got, key=repr), [fc.Data(b"a", 2, b"a2"), fc.Data(b"c", 2, b"c2")])

    @defer.inlineCallbacks
    def test_subscribers_keep_receiving_when_another_disconnects(self):
        yield self.start()
        subs = []
        for _ in range(3):
            sub = yield self.raw()
            sub.send(fc.Attach(b"fan"))
            yield sub.take()
            subs.append(sub)
        yield self.publish(b"fan", [b"1"])
        for sub in subs:
            self.assertEqual((yield sub.take()), [fc.Data(b"fan", 1, b"1")])
        subs[1].transport.abortConnection()
        yield subs[1].lost
        yield self.publish(b"fan", [b"2", b"3"])
        for sub in (subs[0], subs[2]):
            self.assertEqual((yield sub.take(2)), data_frames(b"fan", 2, [b"2", b"3"]))


class PublishTests(Base):

    @defer.inlineCallbacks
    def test_pipelined_publishes_get_one_ack_each_in_order(self):
        yield self.start()
        pub = yield self.raw()
        rng = random.Random(5)
        sent = [(rng.choice([b"x", b"y", b"z"]), rng.randrange(2 ** 64), b"%d" % i)
                for i in range(600)]
        pub.send(*[fc.Publish(t, s, d) for t, s, d in sent])
        acks = yield pub.take(600)
        self.assertEqual(acks, [fc.Ack(s) for _, s, _ in sent])
        for topic in (b"x", b"y", b"z"):
            self.assertEqual([v for _, v in self.log_records(topic.decode())],
                             [d for t, _, d in sent if t == topic])
            stamps = yield self.bus.execute(c.Fetch([c.FetchPartition(topic.decode(), 0, 0,
                                                                      1 << 20)]))
            for batch in stamps[0].batches:
                self.assertIsNone(self.bus.decode(batch).keys)

    @defer.inlineCallbacks
    def test_acks_follow_durability_under_fsync_always(self):
        yield self.start(storage={"fsync": "always"})
        client = yield self.client()
        late = []

        def check(seq):
            durable = self.service.store.offsets("durable", 0).high_watermark
            if durable <= seq:
                late.append((seq, durable))
        for i in range(500):
            yield client.publish("durable", b"%d" % i, on_ack=check)
        yield client.publish_blocking("durable", b"last")
        self.assertEqual(late, [])
        self.assertEqual(len(self.log_records("durable")), 501)

    @defer.inlineCallbacks
    def test_acks_stay_in_order_with_a_tiny_unacked_bound(self):
        yield self.start(figg={"max_unacked": 4}, storage={"fsync": "always"})
        pub = yield self.raw()
        pub.send(*[fc.Publish(b"t%d" % (i % 3), i, b"%d" % i) for i in range(300)])
        self.assertEqual((yield pub.take(300)), [fc.Ack(i) for i in range(300)])

    @defer.inlineCallbacks
    def test_acks_keep_arrival_order_when_a_later_batch_is_durable_first(self):
        # The first PUBLISH creates its topic (a metadata fsync, then the
        # append's); the second's topic exists, so its batch is durable first.
        yield self.start(storage={"fsync": "always"})
        yield self.bus.execute(c.CreateTopic("exists", 1))
        pub = yield self.raw()
        pub.send(fc.Publish(b"created", 0, b"a"), fc.Publish(b"exists", 1, b"b"),
                 fc.Publish(b"created", 2, b"c"))
        self.assertEqual((yield pub.take(3)), [fc.Ack(0), fc.Ack(1), fc.Ack(2)])

    @defer.inlineCallbacks
    def test_a_repeated_publish_is_stored_twice(self):
        yield self.start()
        pub = yield self.raw()
        pub.send(fc.Publish(b"dup", 7, b"same"), fc.Publish(b"dup", 7, b"same"))
        self.assertEqual((yield pub.take(2)), [fc.Ack(7), fc.Ack(7)])
        self.assertEqual(self.log_records("dup"), [(0, b"same"), (1, b"same")])

    @defer.inlineCallbacks
    def test_a_record_over_the_limit_closes_without_storing_or_acking_it(self):
        logs = LogCapture(self)
        yield self.start(limits={"max_record_bytes": 1000})
        pub = yield self.raw()
        pub.send(fc.Publish(b"big", 0, b"ok"), fc.Publish(b"big", 1, b"x" * 1001),
                 fc.Publish(b"big", 2, b"after"))
        yield pub.lost
        self.assertEqual(pub.messages, [fc.Ack(0)])
        self.assertEqual(self.log_records("big"), [(0, b"ok")])
        [line] = logs.lines()
        self.assertIn("PUBLISH to 'big': record of 1001 bytes exceeds "
                      "limits.max_record_bytes (1000)", line)
        self.assertEqual(logs.failures(), [])

    @defer.inlineCallbacks
    def test_publish_to_an_unknown_topic_closes_when_auto_create_is_off(self):
        logs = LogCapture(self)
        yield self.start(topics={"auto_create": False})
        yield self.bus.execute(c.CreateTopic("known", 1))
        pub = yield self.raw()
        pub.send(fc.Publish(b"known", 0, b"a"), fc.Publish(b"unknown", 1, b"b"),
                 fc.Publish(b"known", 2, b"c"))
        yield pub.lost
        self.assertEqual(pub.messages, [fc.Ack(0)])
        self.assertEqual(self.log_records("known"), [(0, b"a")])
        [line] = logs.lines()
        self.assertIn("PUBLISH to 'unknown': unknown topic: unknown", line)

    @defer.inlineCallbacks
    def test_publish_to_a_sealed_partition_closes(self):
        logs = LogCapture(self)
        yield self.start()
        yield self.produce("sealed", [b"a"])
        yield self.bus.execute(c.SealPartition("sealed", 0))
        pub = yield self.raw()
        pub.send(fc.Publish(b"sealed", 0, b"b"))
        yield pub.lost
        self.assertEqual(pub.messages, [])
        [line] = logs.lines()
        self.assertIn("PUBLISH to 'sealed': partition sealed", line)


class PingTests(Base):

    @defer.inlineCallbacks
    def test_pong_echoes_the_identical_bytes(self):
        yield self.start()
        conn = yield self.raw()
        conn.write(bytes.fromhex("00 08 00 01 00 00 00 08 17 97 9c fe 3d 85 cd 15"))
        yield conn.take()
        self.assertEqual(conn.messages, [fc.Pong(1700000000123456789)])
        conn.write(fc.HEADER.pack(fc.PING, 1, 8) + b"\xff" * 8)
        self.assertEqual((yield conn.take()), [fc.Pong(U64_MAX)])

    @defer.inlineCallbacks
    def test_pong_comes_behind_answers_already_queued(self):
        yield self.start()
        conn = yield self.raw()
        conn.send(fc.Publish(b"p", 0, b"a"), fc.Attach(b"p"), fc.Detach(b"q"), fc.Ping(3))
        self.assertEqual((yield conn.take(4)), [fc.Ack(0), fc.Attached(b"p", 1),
                                                fc.Detached(b"q"), fc.Pong(3)])


class BadInputTests(Base):

    @defer.inlineCallbacks
    def check_closes(self, data, problem, **start):
        """``data`` closes its connection with one log line naming ``problem``,
        while another connection carries on."""
        logs = LogCapture(self)
        yield self.start(**start)
        bystander = yield self.raw()
        bystander.send(fc.Attach(b"ok"))
        yield bystander.take()
        bad = yield self.raw()
        bad.write(data)
        yield bad.lost
        [line] = logs.lines()
        self.assertIn(problem, line)
        self.assertEqual(logs.failures(), [])
        yield self.publish(b"ok", [b"still here"])
        self.assertEqual((yield bystander.take()), [fc.Data(b"ok", 1, b"still here")])
        return bad

    @defer.inlineCallbacks
    def test_truncated_attach_from_the_reference(self):
        bad = yield self.check_closes(
            bytes.fromhex("00 01 00 01 00 00 00 09 80 00 00 00 00 03 66 6f 6f"),
            "ATTACH offset runs past the payload (9 bytes)")
        self.assertEqual(bad.messages, [])

    @defer.inlineCallbacks
    def test_a_field_length_beyond_the_payload(self):
        payload = struct.pack(">I", 1000) + b"foo" + bytes(12)
        frame = fc.HEADER.pack(fc.PUBLISH, 1, len(payload)) + payload
        yield self.check_closes(frame, "PUBLISH topic of 1000 bytes runs past the payload")
        self.assertEqual(self.successResultOf(self.bus.execute(c.Metadata()))[0].name, "ok")

    @defer.inlineCallbacks
    def test_an_oversize_payload_len_closes_before_the_body(self):
        # Only the header is sent: the gateway must judge it on that alone.
        yield self.check_closes(fc.HEADER.pack(fc.PUBLISH, 1, 4097),
                                "PUBLISH frame with payload_len 4097 exceeds 4096",
                                figg={"max_payload_bytes": 4096})

    @defer.inlineCallbacks
    def test_an_invalid_topic_name_on_attach(self):
        yield self.check_closes(fc.encode(fc.Attach(b"no/slashes")),
                                "ATTACH 'no/slashes': invalid topic name")

    @defer.inlineCallbacks
    def test_an_invalid_topic_name_on_publish(self):
        yield self.check_closes(fc.encode(fc.Publish(b"..", 0, b"x")),
                                "PUBLISH to '..': invalid topic name")

    @defer.inlineCallbacks
    def test_an_invalid_topic_name_on_detach(self):
        yield self.check_closes(fc.encode(fc.Detach(b"")), "DETACH: invalid topic name")

    @defer.inlineCallbacks
    def test_acks_owed_before_a_bad_frame_are_still_written(self):
        bad = yield self.check_closes(
            fc.encode(fc.Publish(b"ok2", 1, b"a")) + fc.encode(fc.Publish(b"ok2", 2, b"b"))
            + fc.HEADER.pack(fc.DETACH, 1, 2) + b"\x00\x00", "DETACH topic length runs past")
        self.assertEqual(bad.messages, [fc.Ack(1), fc.Ack(2)])

    @defer.inlineCallbacks
    def test_unknown_and_server_to_client_types_are_skipped(self):
        yield self.start()
        conn = yield self.raw()
        junk = [fc.HEADER.pack(t, 1, 5) + b"12345" for t in (0, 10, 300, 65535)]
        junk += [fc.encode(m) for m in (fc.Attached(b"a", 1), fc.Detached(b"a"), fc.Ack(3),
                                        fc.Data(b"a", 1, b"x"), fc.Pong(4))]
        junk.append(fc.HEADER.pack(fc.DATA, 1, 2) + b"\x00\x00")    # malformed, yet skipped
        conn.write(b"".join(junk))
        conn.send(fc.Publish(b"skip", 0, b"x"))
        self.assertEqual((yield conn.take()), [fc.Ack(0)])
        self.assertEqual((yield conn.ping()), [])

    @defer.inlineCallbacks
    def test_any_header_version_is_accepted(self):
        yield self.start()
        conn = yield self.raw()
        frame = bytearray(fc.encode(fc.Publish(b"ver", 9, b"x")))
        frame[2:4] = b"\x00\x07"
        conn.write(bytes(frame))
        self.assertEqual((yield conn.take()), [fc.Ack(9)])

    @defer.inlineCallbacks
    def test_random_garbage_never_takes_the_gateway_down(self):
        logs = LogCapture(self)
        yield self.start(figg={"max_payload_bytes": 65536})
        rng = random.Random(11)
        conns = []
        for _ in range(30):
            conn = yield self.raw()
            conn.write(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))))
            conns.append(conn)
        yield self.publish(b"alive", [b"yes"])
        for conn in conns:
            if not conn.closed:
                conn.transport.abortConnection()
        self.assertEqual(logs.failures(), [])


class ConfigTests(FiggTest):

    def parse(self, **options):
        return gateway_config(self.tempdir(), [dict(FIGG, **options)])

    def test_defaults(self):
        config = self.parse()
        self.assertEqual(dict(config.listeners[0].options), {
            "max_payload_bytes": 16 * 1024 * 1024, "max_buffered_bytes": 1024 * 1024,
            "max_unacked": 1024})

    def test_listener_options_are_checked(self):
        for options, message in [
            ({"max_payload": 5}, "listeners[0].max_payload: unknown key "
                                 "(did you mean 'max_payload_bytes'?)"),
            ({"max_payload_bytes": 100}, "listeners[0].max_payload_bytes: must be an integer "
                                         "from 1024 to 4294967295, got 100"),
            ({"max_buffered_bytes": 65536}, "listeners[0].max_buffered_bytes: must be an "
                                            "integer >= 131072, got 65536"),
            ({"max_unacked": True}, "listeners[0].max_unacked: must be an integer >= 1, "
                                    "got true"),
        ]:
            with self.assertRaises(ConfigError) as caught:
                self.parse(**options)
            self.assertEqual(str(caught.exception), message)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class RestartTests(Base):

    @defer.inlineCallbacks
    def test_resume_across_a_restart_with_no_gap_and_no_duplicate(self):
        port = free_port()
        yield self.start(figg={"endpoint": f"tcp:{port}:interface=127.0.0.1"})
        got = []
        sub = yield self.client(ping_interval=0)
        pub = yield self.client(ping_interval=0)
        self.assertEqual((yield sub.subscribe("r", got.append, offset=0)), 0)
        for i in range(100):
            yield pub.publish("r", b"%d" % i)
        yield pub.publish_blocking("r", b"99+")
        yield wait_until(lambda: len(got) == 101)
        self.assertEqual(sub.offset("r"), 101)

        yield self.service.stopService()
        yield wait_until(lambda: not sub.connected and not pub.connected)
        # Published while the gateway is down: resent after reconnecting.
        later = [pub.publish_blocking("r", b"after %d" % i) for i in range(5)]
        yield task.deferLater(reactor, 0.2, lambda: None)
        yield self.start(figg={"endpoint": f"tcp:{port}:interface=127.0.0.1"},
                         directory=self.directory)
        yield defer.gatherResults(later)
        yield wait_until(lambda: len(got) == 106)
        self.assertEqual([m.offset for m in got], list(range(1, 107)))
        self.assertEqual([m.data for m in got[-5:]], [b"after %d" % i for i in range(5)])
        self.assertGreaterEqual(sub.connections, 2)

    def test_acked_publishes_survive_a_crash_under_fsync_always(self):
        directory = self.tempdir()
        gateway = GatewayProcess(directory, (
            "storage: {path: ./data, fsync: always}\n"
            "listeners:\n  - {dialect: figg, endpoint: \"tcp:0:interface=127.0.0.1\"}\n"))
        self.addCleanup(gateway.stop, "KILL")
        port = gateway.start()["figg"]
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"".join(fc.encode(fc.Publish(b"crash", i, b"%d" % i))
                               for i in range(300)))
            acks = recv_messages(s, 300)
        self.assertEqual(acks, [fc.Ack(i) for i in range(300)])
        gateway.stop("KILL")
        port = gateway.start()["figg"]
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(fc.encode(fc.Attach(b"crash", 0, fc.FROM_OFFSET)))
            got = recv_messages(s, 301)
        self.assertEqual(got, [fc.Attached(b"crash", 0)] + data_frames(
            b"crash", 1, [b"%d" % i for i in range(300)]))


def recv_messages(sock, n, timeout=30.0):
    """Blocking: the next ``n`` messages from ``sock``."""
    sock.settimeout(timeout)
    buffer = b""
    out = []
    while len(out) < n:
        chunk = sock.recv(1 << 16)
        if not chunk:
            raise AssertionError(f"closed after {len(out)} messages")
        messages, buffer = fc.decode_frames(buffer + chunk)
        out += messages
    return out


class CommandLineTests(Base):

    @defer.inlineCallbacks
    def run_cli(self, *args, stdin=b""):
        proc = subprocess.Popen([sys.executable, "-m", "plugins.figg", *args,
                                 "--port", str(self.port)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        # The gateway runs on this reactor: wait for the process without blocking it.
        deadline = time.time() + 60
        proc.stdin.write(stdin)
        proc.stdin.close()
        while proc.poll() is None:
            if time.time() > deadline:
                proc.kill()
                raise AssertionError("CLI did not finish")
            yield task.deferLater(reactor, 0.05, lambda: None)
        out = proc.stdout.read()
        err = proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
        return proc.returncode, out, err

    @defer.inlineCallbacks
    def test_publish_lines_then_tail_them(self):
        yield self.start()
        code, out, err = yield self.run_cli("publish", "cli", stdin=b"one\ntwo\n\nthree\n")
        self.assertEqual((code, err), (0, b""))
        self.assertEqual(out, b"published 4 messages to cli\n")
        self.assertEqual([v for _, v in self.log_records("cli")], [b"one", b"two", b"", b"three"])
        code, out, err = yield self.run_cli("tail", "cli", "--offset", "1", "--count", "3")
        self.assertEqual((code, err), (0, b""))
        self.assertEqual(out, b"2\ttwo\n3\t\n4\tthree\n")

    @defer.inlineCallbacks
    def test_tail_follows_live_messages(self):
        yield self.start()
        proc = subprocess.Popen([sys.executable, "-m", "plugins.figg", "tail", "live",
                                 "--count", "2", "--port", str(self.port)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.addCleanup(lambda: proc.poll() is None and os.kill(proc.pid, signal.SIGKILL))
        yield wait_until(lambda: any(a.attachments for a in self.factory().connections))
        yield self.publish(b"live", [b"hello", b"world"])
        yield wait_until(lambda: proc.poll() is not None)
        self.assertEqual(proc.stdout.read(), b"1\thello\n2\tworld\n")
        proc.stdout.close()
        proc.stderr.close()
