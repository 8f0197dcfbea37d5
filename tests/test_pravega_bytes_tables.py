"""The segment-store commands an unmodified Pravega application needs
beyond event appends (protocols/pravega-clients.md §3), on the real
service tree over a real socket, driven by raw WireCommands frames:

- byte streams: ConditionalBlockEnd appends to a partition (§3.2), the byte
  view, the topic kind they decide, and what other dialects see;
- large events: transient segments, chunks and MergeSegments (§3.3);
- table segments: versions, conditions, delta reads, durability (§3.4).

The real client's traffic is in test_pravega_real_client.py; these tests
pin each rule down frame by frame, including the refusals a client must
survive (§4.2).
"""
import re
import struct

from twisted.internet import defer

from gateway import commands as cmd
from plugins.pravega import codec as pc
from plugins.pravega import server as pravega_server
from tests.test_pravega_server import MIN, SEG, W, W2, PravegaTest, events, sleep, solo

X = bytes.fromhex("2e5297206999ef00ef80261b60ff7bd2")
TABLE = "s/rg1_kvtable/0.#epoch.0"
NO_VERSION = pc.KEY_NO_VERSION


def cbe(writer_id, number, offset, data, rid):
    return pc.ConditionalBlockEnd(writer_id, number, offset, data, rid)


class ByteStreamTests(PravegaTest):
    """§3.2: raw bytes appended at an expected byte tail."""

    def undecided(self, topic="t", partitions=1):
        return self.service.bus.execute(cmd.CreateTopic(topic, partitions, kind="undecided"))

    @defer.inlineCallbacks
    def test_byte_appends_follow_the_tail_and_decide_the_kind(self):
        yield self.start()
        yield self.undecided()
        conn = yield self.writer()
        # the exact exchange of pravega-clients.md §3.5
        self.assertEqual((yield conn.call(cbe(W, 1, 0, b"byte-stream-1 ", 4))),
                         pc.DataAppended(W, 1, MIN, 4, 14))
        self.assertEqual(self.service.store.topic("t").kind, "bytes")
        self.assertEqual((yield conn.call(cbe(W, 2, 14, b"byte-stream-2", 5))),
                         pc.DataAppended(W, 2, 1, 5, 27))
        # a stale tail stores nothing and leaves the connection usable
        self.assertEqual((yield conn.call(cbe(W, 3, 14, b"late", 6))),
                         pc.ConditionalCheckFailed(W, 3, 6))
        self.assertEqual((yield conn.call(cbe(W, 3, 27, b"!", 7))),
                         pc.DataAppended(W, 3, 2, 7, 28))
        # the byte view is the plain concatenation, readable from any byte
        self.assertEqual((yield conn.call(pc.ReadSegment(SEG, 0, 1000, "", 8))),
                         pc.SegmentRead(SEG, 0, True, False, b"byte-stream-1 byte-stream-2!", 8))
        self.assertEqual((yield conn.call(pc.ReadSegment(SEG, 20, 1000, "", 9))).data,
                         b"tream-2!")
        info = yield conn.call(pc.GetStreamSegmentInfo(10, SEG, ""))
        self.assertEqual((info.write_offset, info.start_offset), (28, 0))
        # other dialects see one record per append
        self.assertEqual(self.values(), [b"byte-stream-1 ", b"byte-stream-2", b"!"])
        self.assertEqual(self.state().end_position, 28)

    @defer.inlineCallbacks
    def test_empty_append_stores_nothing_and_decides_nothing(self):
        yield self.start()
        yield self.undecided()
        conn = yield self.writer()
        self.assertEqual((yield conn.call(cbe(W, 1, 0, b"", 1))), pc.DataAppended(W, 1, MIN, 1, 0))
        self.assertEqual(self.service.store.topic("t").kind, "undecided")
        self.assertEqual((yield conn.call(cbe(W, 2, 0, b"ab", 2))), pc.DataAppended(W, 2, 1, 2, 2))
        self.assertEqual(self.values(), [b"ab"])

    @defer.inlineCallbacks
    def test_pipelined_byte_appends_are_decided_in_order(self):
        yield self.start(storage={"fsync": "interval", "fsync_interval_ms": 20})
        yield self.undecided()
        conn = yield self.writer()
        conn.send(cbe(W, 1, 0, b"aaaa", 1), cbe(W, 2, 4, b"bbbb", 2), cbe(W, 3, 4, b"xx", 3),
                  cbe(W, 4, 8, b"cc", 4))
        self.assertEqual((yield conn.take(4)), [
            pc.DataAppended(W, 1, MIN, 1, 4), pc.DataAppended(W, 2, 1, 2, 8),
            pc.ConditionalCheckFailed(W, 3, 3), pc.DataAppended(W, 4, 2, 4, 10)])
        self.assertEqual(self.values(), [b"aaaa", b"bbbb", b"cc"])

    @defer.inlineCallbacks
    def test_chunk_above_the_record_limit_is_stored_as_several_records(self):
        yield self.start(limits={"max_record_bytes": 1000})
        yield self.undecided()
        conn = yield self.writer()
        data = bytes(range(250)) * 10
        self.assertEqual((yield conn.call(cbe(W, 1, 0, data, 1))),
                         pc.DataAppended(W, 1, MIN, 1, 2500))
        self.assertEqual(self.values(), [data[:1000], data[1000:2000], data[2000:]])
        # one atomic batch, and the byte view is unchanged
        self.assertEqual(len(self.service.store.read("t", 0, 0, 1 << 20)), 1)
        self.assertEqual((yield conn.call(pc.ReadSegment(SEG, 999, 4096, "", 2))).data,
                         data[999:])

    @defer.inlineCallbacks
    def test_other_dialects_write_raw_into_the_byte_view(self):
        yield self.start()
        yield self.undecided()
        conn = yield self.writer()
        yield conn.call(cbe(W, 1, 0, b"pravega|", 1))
        client = yield self.rustlog()
        yield client.produce("t", 0, [b"rustlog|"])
        self.assertEqual((yield conn.call(pc.ReadSegment(SEG, 0, 100, "", 2))).data,
                         b"pravega|rustlog|")
        # the byte writer must name the new tail
        self.assertEqual((yield conn.call(cbe(W, 2, 8, b"x", 3))),
                         pc.ConditionalCheckFailed(W, 2, 3))
        self.assertEqual((yield conn.call(cbe(W, 2, 16, b"end", 4))),
                         pc.DataAppended(W, 2, 1, 4, 19))
        self.assertEqual((yield self.service.bus.execute(cmd.LookupPosition("t", 0, 17))),
                         (2, 16))

    @defer.inlineCallbacks
    def test_kind_clashes_and_seals_fail_cleanly(self):
        yield self.start()
        yield self.create("t")          # an event topic
        yield self.undecided("b")
        conn = yield self.writer()
        self.assertEqual((yield conn.call(cbe(W, 1, 0, b"bytes", 1))),
                         pc.ConditionalCheckFailed(W, 1, 1))
        self.assertEqual((yield conn.call(solo(W, events(b"ev"), 2, 2))).event_number, 2)
        byte_seg = "s/b/0.#epoch.0"
        byte_writer = yield self.writer(byte_seg, writer_id=W2)
        yield byte_writer.call(cbe(W2, 1, 0, b"raw", 1))
        # an event append to a byte topic: SegmentIsSealed (the writer fails at once)
        self.assertEqual((yield byte_writer.call(solo(W2, events(b"ev"), 2, 2))),
                         pc.SegmentIsSealed(2, byte_seg, "", -1))
        # a sealed byte partition refuses byte appends with ConditionalCheckFailed
        other = yield self.writer(byte_seg, writer_id=X, last=MIN)
        yield self.service.bus.execute(cmd.SealPartition("b", 0))
        self.assertEqual((yield other.call(cbe(X, 1, 3, b"more", 3))),
                         pc.ConditionalCheckFailed(X, 1, 3))
        self.assertEqual(self.values("b"), [b"raw"])
        self.assertEqual(self.values(), [b"ev"])

    @defer.inlineCallbacks
    def test_byte_read_parked_before_any_data(self):
        yield self.start(pravega={"long_poll_ms": 20000})
        yield self.undecided()
        reader = yield self.raw()
        parked = reader.call(pc.ReadSegment(SEG, 0, 524288, "", 1))
        yield sleep(0.1)
        self.assertFalse(parked.called)
        conn = yield self.writer()
        yield conn.call(cbe(W, 1, 0, b"first bytes", 2))
        self.assertEqual((yield parked), pc.SegmentRead(SEG, 0, True, False, b"first bytes", 1))

    @defer.inlineCallbacks
    def test_writer_number_and_kind_survive_a_restart(self):
        yield self.start()
        yield self.undecided()
        conn = yield self.writer()
        yield conn.call(cbe(W, 1, 0, b"one", 1))
        yield conn.call(cbe(W, 2, 3, b"two", 2))
        yield self.restart()
        again = yield self.writer(writer_id=W, last=2)
        self.assertEqual(self.service.store.topic("t").kind, "bytes")
        self.assertEqual((yield again.call(cbe(W, 3, 6, b"three", 3))),
                         pc.DataAppended(W, 3, 2, 3, 11))
        self.assertEqual(self.values(), [b"one", b"two", b"three"])


class LargeEventTests(PravegaTest):
    """§3.3: CreateTransientSegment, chunks, MergeSegments. Chunks here are
    small; the logic does not depend on their size (the real client's 8 MiB
    chunks are in test_pravega_real_client.py)."""

    @defer.inlineCallbacks
    def transient(self, conn, parent=SEG, rid=1):
        created = yield conn.call(pc.CreateTransientSegment(rid, X, parent, ""))
        self.assertIsInstance(created, pc.SegmentCreated)
        self.assertRegex(created.segment, r"\A" + re.escape(parent) + r"#transient\.[0-9a-f]{32}\Z")
        self.assertEqual((yield conn.call(pc.SetupAppend(rid + 1, X, created.segment, ""))),
                         pc.AppendSetup(rid + 1, created.segment, X, MIN))
        return created.segment

    @defer.inlineCallbacks
    def test_chunks_merge_into_one_record(self):
        yield self.start(limits={"max_record_bytes": 4000})
        yield self.create()
        conn = yield self.writer()
        yield conn.call(solo(W, events(b"twelve bytes"), 1, 1))
        big = bytes(range(256)) * 11 + b"end"       # 2819 bytes
        framed = events(big)
        name = yield self.transient(conn, rid=2)
        chunks = [framed[:1000], framed[1000:2000], framed[2000:]]
        offset = 0
        for n, chunk in enumerate(chunks):
            reply = yield conn.call(cbe(X, n, offset, chunk, 10 + n))
            offset += len(chunk)
            self.assertEqual(reply, pc.DataAppended(X, n, n - 1 if n else MIN, 10 + n, offset))
        self.assertEqual(self.values(), [b"twelve bytes"])      # nothing stored yet
        merged = yield conn.call(pc.MergeSegments(20, SEG, name, ""))
        self.assertEqual(merged, pc.SegmentsMerged(20, SEG, name, 20 + len(framed)))
        self.assertEqual(self.values(), [b"twelve bytes", big])
        # one record, read back through the event-framed view
        self.assertEqual((yield conn.call(pc.ReadSegment(SEG, 20, 8 << 20, "", 21))).data,
                         framed)
        # the transient is gone; the normal writer's numbers are untouched
        self.assertEqual((yield conn.call(pc.MergeSegments(22, SEG, name, ""))),
                         pc.NoSuchSegment(22, name, "", -1))
        self.assertEqual((yield conn.call(solo(W, events(b"eleven byte"), 2, 23))),
                         pc.DataAppended(W, 2, 1, 23, 20 + len(framed) + 19))

    @defer.inlineCallbacks
    def test_refusals_at_the_first_chunk_name_the_parent(self):
        yield self.start(limits={"max_record_bytes": 4000})
        yield self.create()
        conn = yield self.raw()
        too_big = struct.pack(">ii", 0, 4001) + b"x" * 100
        not_event = struct.pack(">ii", 7, 10) + b"x" * 10
        for i, first in enumerate((too_big, not_event, b"\x00\x00\x00")):
            name = yield self.transient(conn, rid=10 * i + 1)
            self.assertEqual((yield conn.call(cbe(X, 0, 0, first, 10 * i + 3))),
                             pc.SegmentIsSealed(10 * i + 3, SEG, "", -1))
            # every later chunk too, and the merge is not applied
            self.assertEqual((yield conn.call(cbe(X, 1, len(first), b"more", 10 * i + 4))),
                             pc.SegmentIsSealed(10 * i + 4, SEG, "", -1))
            self.assertEqual((yield conn.call(pc.MergeSegments(10 * i + 5, SEG, name, ""))),
                             pc.OperationUnsupported(10 * i + 5, "mergeSegments", ""))
        # chunks beyond the largest event frame the record limit allows
        name = yield self.transient(conn, rid=41)
        yield conn.call(cbe(X, 0, 0, events(b"y" * 3990)[:3000], 43))
        self.assertEqual((yield conn.call(cbe(X, 1, 3000, b"z" * 1009, 44))),
                         pc.SegmentIsSealed(44, SEG, "", -1))
        self.assertEqual(self.values(), [])
        self.assertEqual(self.state().end_position, 0)

    @defer.inlineCallbacks
    def test_a_sealed_or_byte_parent_refuses_large_events(self):
        yield self.start()
        yield self.create()
        yield self.service.bus.execute(cmd.CreateTopic("b", 1, kind="undecided"))
        byte_writer = yield self.writer("s/b/0.#epoch.0", writer_id=W2)
        yield byte_writer.call(cbe(W2, 1, 0, b"raw", 1))
        conn = yield self.raw()
        yield self.transient(conn, parent="s/b/0.#epoch.0")
        self.assertEqual((yield conn.call(cbe(X, 0, 0, events(b"e"), 5))),
                         pc.SegmentIsSealed(5, "s/b/0.#epoch.0", "", -1))
        yield self.transient(conn, rid=6)
        yield self.service.bus.execute(cmd.SealPartition("t", 0))
        self.assertEqual((yield conn.call(cbe(X, 0, 0, events(b"e"), 8))),
                         pc.SegmentIsSealed(8, SEG, "", -1))
        self.assertEqual(self.values(), [])

    @defer.inlineCallbacks
    def test_a_seal_between_chunk_and_merge_refuses_the_merge(self):
        yield self.start()
        yield self.create()
        conn = yield self.raw()
        name = yield self.transient(conn)
        yield conn.call(cbe(X, 0, 0, events(b"e" * 50), 3))
        yield self.service.bus.execute(cmd.SealPartition("t", 0))
        self.assertEqual((yield conn.call(pc.MergeSegments(4, SEG, name, ""))),
                         pc.OperationUnsupported(4, "mergeSegments", ""))
        self.assertEqual(self.values(), [])

    @defer.inlineCallbacks
    def test_merge_needs_whole_events_and_the_parent(self):
        yield self.start()
        yield self.create("t", 2)
        conn = yield self.raw()
        name = yield self.transient(conn)
        yield conn.call(cbe(X, 0, 0, events(b"e" * 50)[:30], 3))
        self.assertEqual((yield conn.call(pc.MergeSegments(4, SEG, name, ""))),
                         pc.OperationUnsupported(4, "mergeSegments", ""))
        name = yield self.transient(conn, rid=5)
        yield conn.call(cbe(X, 0, 0, events(b"e"), 7))
        self.assertEqual((yield conn.call(pc.MergeSegments(8, "s/t/1.#epoch.0", name, ""))),
                         pc.OperationUnsupported(8, "mergeSegments", ""))
        # an empty transient merges nothing and reports the tail
        name = yield self.transient(conn, rid=9)
        self.assertEqual((yield conn.call(pc.MergeSegments(11, SEG, name, ""))),
                         pc.SegmentsMerged(11, SEG, name, 0))
        self.assertEqual(self.values(), [])

    @defer.inlineCallbacks
    def test_transients_belong_to_their_connection(self):
        yield self.start()
        yield self.create()
        conn = yield self.raw()
        name = yield self.transient(conn)
        yield conn.call(cbe(X, 0, 0, events(b"e"), 3))
        other = yield self.raw()
        self.assertEqual((yield other.call(pc.SetupAppend(4, X, name, ""))),
                         pc.NoSuchSegment(4, name, "", -1))
        self.assertEqual((yield other.call(pc.MergeSegments(5, SEG, name, ""))),
                         pc.NoSuchSegment(5, name, "", -1))
        # a wrong expected offset is a failed check, not a refusal
        self.assertEqual((yield conn.call(cbe(X, 1, 0, b"x", 6))),
                         pc.ConditionalCheckFailed(X, 1, 6))
        self.assertEqual((yield conn.call(pc.MergeSegments(7, SEG, name, ""))),
                         pc.SegmentsMerged(7, SEG, name, 9))
        # a missing parent: NoSuchSegment (the only answer besides SegmentCreated)
        self.assertEqual((yield conn.call(pc.CreateTransientSegment(8, X, "s/t/3.#epoch.0", ""))),
                         pc.NoSuchSegment(8, "s/t/3.#epoch.0", "", -1))

    @defer.inlineCallbacks
    def test_idle_and_surplus_transients_are_dropped(self):
        self.patch(pravega_server, "TRANSIENT_IDLE_SECONDS", 0.2)
        yield self.start()
        yield self.create()
        conn = yield self.raw()
        idle = yield self.transient(conn)
        yield sleep(0.5)
        self.assertEqual((yield conn.call(pc.MergeSegments(3, SEG, idle, ""))),
                         pc.NoSuchSegment(3, idle, "", -1))
        self.patch(pravega_server, "TRANSIENT_IDLE_SECONDS", 60)
        names = []
        for i in range(pravega_server.MAX_TRANSIENTS + 1):
            names.append((yield conn.call(pc.CreateTransientSegment(10 + i, X, SEG, ""))).segment)
        self.assertEqual((yield conn.call(pc.MergeSegments(50, SEG, names[0], ""))),
                         pc.NoSuchSegment(50, names[0], "", -1))
        self.assertEqual((yield conn.call(pc.MergeSegments(51, SEG, names[-1], ""))),
                         pc.SegmentsMerged(51, SEG, names[-1], 0))


class TableSegmentTests(PravegaTest):
    """§3.4: reader-group state in durable, versioned tables."""

    @defer.inlineCallbacks
    def table(self):
        conn = yield self.raw()
        self.assertEqual((yield conn.call(pc.CreateTableSegment(1, TABLE, ""))),
                         pc.SegmentCreated(1, TABLE))
        return conn

    @defer.inlineCallbacks
    def test_create_delete_and_unknown_tables(self):
        yield self.start()
        conn = yield self.table()
        self.assertEqual((yield conn.call(pc.CreateTableSegment(2, TABLE, ""))),
                         pc.SegmentAlreadyExists(2, TABLE, ""))
        missing = "s/none_kvtable/0.#epoch.0"
        for request in (pc.UpdateTableEntries(3, missing, "", ((b"k", -1, b"v"),), -1),
                        pc.ReadTableEntriesDelta(3, missing, "", 0, 10),
                        pc.ReadTable(3, missing, "", ((b"k", NO_VERSION),)),
                        pc.RemoveTableKeys(3, missing, "", ((b"k", NO_VERSION),), -1),
                        pc.ReadTableKeys(3, missing, "", 10, b""),
                        pc.DeleteTableSegment(3, missing, False, "")):
            self.assertEqual((yield conn.call(request)), pc.NoSuchSegment(3, missing, "", -1))
        yield conn.call(pc.UpdateTableEntries(4, TABLE, "", ((b"k", -1, b"v"),), -1))
        self.assertEqual((yield conn.call(pc.DeleteTableSegment(5, TABLE, True, ""))),
                         pc.TableSegmentNotEmpty(5, TABLE, ""))
        self.assertEqual((yield conn.call(pc.DeleteTableSegment(6, TABLE, False, ""))),
                         pc.SegmentDeleted(6, TABLE))
        self.assertEqual((yield conn.call(pc.ReadTable(7, TABLE, "", ((b"k", NO_VERSION),)))),
                         pc.NoSuchSegment(7, TABLE, "", -1))
        # tables are not topics: no segment to read, nothing in the metadata
        self.assertEqual((yield conn.call(pc.ReadSegment(TABLE, 0, 10, "", 8))),
                         pc.NoSuchSegment(8, TABLE, "", 0))
        self.assertEqual(self.service.store.topic_names(), [])

    @defer.inlineCallbacks
    def test_versions_and_conditions(self):
        yield self.start()
        conn = yield self.table()
        # the client creates a group with the same key thrice, each "must not exist"
        reply = yield conn.call(pc.UpdateTableEntries(
            2, TABLE, "", ((b"a", -1, b"1"), (b"a", -1, b"2"), (b"a", -1, b"3"),
                           (b"b", NO_VERSION, b"x")), -1))
        self.assertEqual(reply, pc.TableEntriesUpdated(2, (0, 1, 2, 3)))
        self.assertEqual((yield conn.call(pc.ReadTable(3, TABLE, "", ((b"a", NO_VERSION),
                                                                      (b"zz", NO_VERSION))))),
                         pc.TableRead(3, TABLE, ((b"a", 2, b"3"), (b"zz", -1, b""))))
        # every entry is checked against the table before the batch: all or nothing
        bad = [((b"a", 2, b"4"), (b"b", 2, b"y")),        # b is at 3
               ((b"a", -1, b"4"),),                          # a exists
               ((b"c", 5, b"z"),)]                           # c does not exist
        for i, entries in enumerate(bad):
            self.assertEqual((yield conn.call(pc.UpdateTableEntries(10 + i, TABLE, "", entries,
                                                                    -1))),
                             pc.TableKeyBadVersion(10 + i, TABLE, ""))
        self.assertEqual((yield conn.call(pc.UpdateTableEntries(
            20, TABLE, "", ((b"a", 2, b"4"), (b"b", 3, b"y")), -1))),
            pc.TableEntriesUpdated(20, (4, 5)))
        # tableSegmentOffset must be the table's counter when given
        self.assertEqual((yield conn.call(pc.UpdateTableEntries(
            21, TABLE, "", ((b"c", NO_VERSION, b"z"),), 5))), pc.TableKeyBadVersion(21, TABLE, ""))
        self.assertEqual((yield conn.call(pc.UpdateTableEntries(
            22, TABLE, "", ((b"c", NO_VERSION, b"z"),), 6))), pc.TableEntriesUpdated(22, (6,)))
        # removals: conditions, a missing key, the counter moves on
        self.assertEqual((yield conn.call(pc.RemoveTableKeys(23, TABLE, "", ((b"a", 3),), -1))),
                         pc.TableKeyBadVersion(23, TABLE, ""))
        self.assertEqual((yield conn.call(pc.RemoveTableKeys(24, TABLE, "", ((b"q", 1),), -1))),
                         pc.TableKeyDoesNotExist(24, TABLE, ""))
        self.assertEqual((yield conn.call(pc.RemoveTableKeys(
            25, TABLE, "", ((b"a", 4), (b"q", NO_VERSION)), -1))),
            pc.TableKeysRemoved(25, TABLE))
        self.assertEqual((yield conn.call(pc.UpdateTableEntries(
            26, TABLE, "", ((b"a", -1, b"again"),), -1))), pc.TableEntriesUpdated(26, (8,)))

    @defer.inlineCallbacks
    def test_delta_reads_page_by_version(self):
        yield self.start()
        conn = yield self.table()
        for i in range(5):
            yield conn.call(pc.UpdateTableEntries(10 + i, TABLE, "",
                                                  ((b"k%d" % i, NO_VERSION, b"v%d" % i),), -1))
        yield conn.call(pc.UpdateTableEntries(20, TABLE, "", ((b"k1", 1, b"new"),), -1))
        yield conn.call(pc.RemoveTableKeys(21, TABLE, "", ((b"k3", 3),), -1))
        # versions now: k0 0, k2 2, k4 4, k1 5; k3 removed; counter 7
        page = yield conn.call(pc.ReadTableEntriesDelta(22, TABLE, "", 0, 2))
        self.assertEqual(page, pc.TableEntriesDeltaRead(
            22, TABLE, ((b"k0", 0, b"v0"), (b"k2", 2, b"v2")), False, False, 3))
        page = yield conn.call(pc.ReadTableEntriesDelta(23, TABLE, "", 3, 10))
        self.assertEqual(page, pc.TableEntriesDeltaRead(
            23, TABLE, ((b"k4", 4, b"v4"), (b"k1", 5, b"new")), False, True, 6))
        # the end is always an empty page; a count of 0 still reads one
        self.assertEqual((yield conn.call(pc.ReadTableEntriesDelta(24, TABLE, "", 6, 10))),
                         pc.TableEntriesDeltaRead(24, TABLE, (), False, True, 7))
        self.assertEqual((yield conn.call(pc.ReadTableEntriesDelta(25, TABLE, "", 0, 0))).entries,
                         ((b"k0", 0, b"v0"),))
        # ReadTableKeys / ReadTableEntries: 8-byte position tokens, an empty list ends
        keys = yield conn.call(pc.ReadTableKeys(26, TABLE, "", 3, b""))
        self.assertEqual(keys, pc.TableKeysRead(26, TABLE, ((b"k0", 0), (b"k2", 2), (b"k4", 4)),
                                                struct.pack(">q", 5)))
        entries = yield conn.call(pc.ReadTableEntries(27, TABLE, "", 3, keys.continuation_token))
        self.assertEqual(entries, pc.TableEntriesRead(27, TABLE, ((b"k1", 5, b"new"),),
                                                      struct.pack(">q", 6)))
        end = yield conn.call(pc.ReadTableEntries(28, TABLE, "", 3, entries.continuation_token))
        self.assertEqual(end.entries, ())
        bad = yield conn.call(pc.ReadTableKeys(29, TABLE, "", 3, b"abc"))
        self.assertIsInstance(bad, pc.ErrorMessage)

    @defer.inlineCallbacks
    def test_tables_and_their_counters_survive_a_restart(self):
        yield self.start()
        conn = yield self.table()
        yield conn.call(pc.UpdateTableEntries(2, TABLE, "", ((b"pos", -1, b"10"),), -1))
        yield conn.call(pc.UpdateTableEntries(3, TABLE, "", ((b"pos", 0, b"20"),), -1))
        yield self.restart()
        conn = yield self.raw()
        self.assertEqual((yield conn.call(pc.ReadTable(4, TABLE, "", ((b"pos", NO_VERSION),)))),
                         pc.TableRead(4, TABLE, ((b"pos", 1, b"20"),)))
        self.assertEqual((yield conn.call(pc.UpdateTableEntries(
            5, TABLE, "", ((b"pos", 1, b"30"),), -1))), pc.TableEntriesUpdated(5, (2,)))
        self.assertEqual((yield conn.call(pc.CreateTableSegment(6, TABLE, ""))),
                         pc.SegmentAlreadyExists(6, TABLE, ""))

    @defer.inlineCallbacks
    def test_an_empty_key_is_a_protocol_error(self):
        yield self.start()
        conn = yield self.table()
        body = (struct.pack(">q", 9) + struct.pack(">H", len(TABLE)) + TABLE.encode()
                + b"\x00\x00" + struct.pack(">iii", 1, 12, 0) + struct.pack(">q", -1)
                + struct.pack(">ii", 4, 0) + struct.pack(">q", -1))
        conn.send(struct.pack(">ii", pc.UPDATE_TABLE_ENTRIES, len(body)) + body)
        reply = yield conn.take()
        self.assertEqual((reply.request_id, reply.segment), (9, TABLE))
        self.assertIn("empty table key", reply.message)
        yield conn.lost
