"""
Unit tests for the embedded log store (``storage.store.LogStore``).

Most tests run the store with ``fsync: never`` on a ``task.Clock``: no
threads are involved, every Deferred has fired by the time the call returns,
and time (segment age, retention) moves only when a test says so. The fsync
policies that really wait (``always``, ``interval``) use a thread for fsync
and are tested with trial's real reactor at the end of the file.
"""
import os
import shutil
import tempfile

import pytest
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial import unittest as trial

from storage import (
    NO_EVENT_NUMBER, InvalidTopicName, KindMismatch, LogStore, OffsetOutOfRange,
    PartitionSealed, StoreSettings, TableBadVersion, TableExists, TableKeyMissing,
    TableNotEmpty, TopicExists, UnknownPartition, UnknownTable, UnknownTopic,
    WriterConflict)
from storage.batch import OVERHEAD, WRITER_OVERHEAD
from storage.segment import (
    INDEX_ENTRY, SEGMENT_HEADER, SEGMENT_HEADER_SIZE, SEGMENT_MAGIC, index_name,
    segment_name)

#: the clock's start: 2023-11-14, so append times look like real ones
T0 = 1_700_000_000.0
T0_MS = int(T0 * 1000)
BIG = 1 << 30
W1 = b"W" * 16
W2 = b"V" * 16


def clock_at(seconds=T0):
    clock = Clock()
    clock.advance(seconds)
    return clock


def open_store(path, clock=None, **settings):
    settings.setdefault("fsync", "never")
    store = LogStore(StoreSettings(path=str(path), **settings),
                     reactor=clock if clock is not None else clock_at())
    store.recovered = store.open()
    return store


def fired(d):
    """The result of a Deferred that must already have fired (re-raising a failure)."""
    box = []
    d.addBoth(box.append)
    assert box, "the Deferred has not fired"
    if isinstance(box[0], Failure):
        box[0].raiseException()
    return box[0]


def put(store, topic, payload, partition=0, count=1, ts=None, max_ts=None,
        value_bytes=None, writer=None, kind=None):
    """Append one batch with an opaque payload and wait for it (fsync never)."""
    first = store.now_ms() if ts is None else ts
    last = first if max_ts is None else max_ts
    vbytes = len(payload) if value_bytes is None else value_bytes
    return fired(store.append(topic, partition, 0, payload, count, first, last, vbytes,
                              writer=writer, kind=kind))


def crash(store):
    """Let a store go the way a killed process does: no flush, no writer
    snapshot, no close() -- only its file descriptors are released (the data
    written so far stays in the page cache, as after ``kill -9``)."""
    for part in store.partitions.values():
        for seg in part.segments:
            seg.close()
    store.meta.db.close()


def payloads(batches):
    return [b.payload for b in batches]


def seg_path(root, topic, partition, base):
    return os.path.join(str(root), "topics", topic, str(partition), segment_name(base))


def seg_files(root, topic, partition=0, suffix=".log"):
    d = os.path.join(str(root), "topics", topic, str(partition))
    return sorted(n for n in os.listdir(d) if n.endswith(suffix))


@pytest.fixture
def clock():
    return clock_at()


@pytest.fixture
def root(tmp_path):
    return tmp_path / "data"


@pytest.fixture
def store(root, clock):
    s = open_store(root, clock)
    yield s
    fired(s.close())


# -- append and read ------------------------------------------------------------------


def test_append_read_round_trip_dense_offsets(store):
    info = fired(store.create_topic("t", 1))
    assert (info.name, info.partitions, info.kind) == ("t", 1, "event")
    sent = [bytes([65 + i]) * (i + 1) for i in range(10)]
    answers = [put(store, "t", p, count=3) for p in sent]
    assert [a.base_offset for a in answers] == list(range(0, 30, 3))
    assert all(a.count == 3 for a in answers)
    batches = store.read("t", 0, 0, BIG)
    assert payloads(batches) == sent
    assert [(b.base_offset, b.count) for b in batches] == [(o, 3) for o in range(0, 30, 3)]
    state = store.offsets("t", 0)
    assert (state.log_start, state.high_watermark, state.sealed) == (0, 30, False)


def test_read_returns_whole_batches_starting_before_offset(store):
    fired(store.create_topic("t", 1))
    for i in range(5):
        put(store, "t", b"batch%d" % i, count=4)
    # offset 9 lives in the batch 8..11: the answer starts there
    batches = store.read("t", 0, 9, BIG)
    assert [b.base_offset for b in batches] == [8, 12, 16]
    assert batches[0].payload == b"batch2"
    assert store.read("t", 0, 19, BIG)[0].base_offset == 16


def test_read_max_bytes(store):
    fired(store.create_topic("t", 1))
    for i in range(10):
        put(store, "t", bytes([48 + i]) * 100)
    assert len(store.read("t", 0, 0, 0)) == 1      # at least one batch
    assert len(store.read("t", 0, 0, 1)) == 1
    assert len(store.read("t", 0, 0, 100)) == 1
    assert len(store.read("t", 0, 0, 250)) == 2    # a third would pass 250
    assert len(store.read("t", 0, 0, 300)) == 3
    assert len(store.read("t", 0, 0, 399)) == 3
    assert [b.base_offset for b in store.read("t", 0, 4, 200)] == [4, 5]
    big = put(store, "t", b"x" * 5000)
    assert big.base_offset == 10
    got = store.read("t", 0, 10, 10)                # larger than max_bytes: still served
    assert len(got) == 1 and got[0].payload == b"x" * 5000


def test_read_at_or_past_end_is_empty_and_below_start_raises(store):
    fired(store.create_topic("t", 1))
    assert store.read("t", 0, 0, BIG) == []
    put(store, "t", b"a", count=2)
    assert store.read("t", 0, 2, BIG) == []
    assert store.read("t", 0, 1000, BIG) == []
    with pytest.raises(OffsetOutOfRange) as e:
        store.read("t", 0, -1, BIG)
    assert (e.value.log_start, e.value.log_end, e.value.offset) == (0, 2, -1)


def test_unknown_topic_and_partition(store):
    fired(store.create_topic("t", 2))
    with pytest.raises(UnknownTopic):
        store.read("nope", 0, 0, 10)
    with pytest.raises(UnknownPartition):
        store.read("t", 2, 0, 10)
    with pytest.raises(UnknownPartition):
        store.append("t", 5, 0, b"x", 1, 0, 0, 1)
    with pytest.raises(UnknownTopic):
        store.append("nope", 0, 0, b"x", 1, 0, 0, 1)
    with pytest.raises(TopicExists):
        store.create_topic("t", 1)
    assert store.topic_names() == ["t"]


def test_partitions_are_independent(store):
    fired(store.create_topic("t", 3))
    put(store, "t", b"p2-a", partition=2)
    put(store, "t", b"p0-a", partition=0)
    assert put(store, "t", b"p2-b", partition=2).base_offset == 1
    assert payloads(store.read("t", 2, 0, BIG)) == [b"p2-a", b"p2-b"]
    assert payloads(store.read("t", 0, 0, BIG)) == [b"p0-a"]
    assert store.read("t", 1, 0, BIG) == []


# -- stream positions and topic kinds -----------------------------------------------------


def test_event_topic_stream_positions(store):
    fired(store.create_topic("ev", 1))
    lengths = [5, 0, 17, 3, 1]
    answers = [put(store, "ev", b"v" * n) for n in lengths]
    expected, pos = [], 0
    for n in lengths:
        expected.append(pos)
        pos += 8 + n
    assert [a.stream_pos for a in answers] == expected == [0, 13, 21, 46, 57]
    # a batch of 3 records with 10 value bytes in all occupies 3*8 + 10
    a = put(store, "ev", b"abcdefghij", count=3)
    assert a.stream_pos == 66
    state = store.offsets("ev", 0)
    assert (state.start_position, state.end_position) == (0, 66 + 34)
    assert [(b.stream_pos, b.stream_len) for b in store.read("ev", 0, 0, BIG)] == \
        [(0, 13), (13, 8), (21, 25), (46, 11), (57, 9), (66, 34)]


def test_bytes_topic_stream_positions(store):
    fired(store.create_topic("by", 1, kind="bytes"))
    lengths = [5, 0, 17, 3]
    answers = [put(store, "by", b"b" * n, kind="bytes") for n in lengths]
    assert [a.stream_pos for a in answers] == [0, 5, 5, 22]
    assert store.offsets("by", 0).end_position == 25
    assert store.offsets("by", 0).high_watermark == 4


@pytest.mark.parametrize("kind, overhead", [("event", 8), ("bytes", 0)])
def test_read_at_position_finds_holding_batch(root, clock, kind, overhead):
    # small segments and index interval: positions are found across segments
    store = open_store(root, clock, segment_bytes=400, index_interval_bytes=50)
    fired(store.create_topic("t", 1, kind=kind))
    lengths = [7, 30, 1, 12, 50, 3, 9, 21, 4, 40, 2, 18]
    spans = []
    for i, n in enumerate(lengths):
        a = put(store, "t", bytes([97 + i]) * n, kind=kind)
        spans.append((a.stream_pos, a.stream_pos + n + overhead, a.base_offset))
    assert store.offsets("t", 0).segments > 2
    end = spans[-1][1]
    assert store.offsets("t", 0).end_position == end
    for p in range(end):
        batch = store.read_at_position("t", 0, p, 1)[0]
        start, stop, offset = next(s for s in spans if s[0] <= p < s[1])
        assert (batch.stream_pos, batch.stream_end, batch.base_offset) == (start, stop, offset), p
    assert store.read_at_position("t", 0, end, BIG) == []
    assert store.read_at_position("t", 0, end + 100, BIG) == []
    # max_bytes bounds the answer like read() does
    assert len(store.read_at_position("t", 0, 0, 1)) == 1
    assert len(store.read_at_position("t", 0, 0, BIG)) == len(lengths)
    with pytest.raises(OffsetOutOfRange):
        store.read_at_position("t", 0, -1, BIG)
    fired(store.close())


def test_undecided_topic_decided_by_first_append(root, clock):
    store = open_store(root, clock)
    fired(store.create_topic("u-bytes", 1, kind="undecided"))
    fired(store.create_topic("u-event", 1, kind="undecided"))
    assert store.topic("u-bytes").kind == "undecided"
    a = put(store, "u-bytes", b"12345", kind="bytes")
    b = put(store, "u-bytes", b"678", kind="bytes")
    assert (a.stream_pos, b.stream_pos) == (0, 5)
    assert store.topic("u-bytes").kind == "bytes"
    put(store, "u-event", b"12345")                 # kind None: an event append
    assert store.topic("u-event").kind == "event"
    assert put(store, "u-event", b"x").stream_pos == 13
    fired(store.close())

    store = open_store(root, clock)
    assert store.topic("u-bytes").kind == "bytes"
    assert store.topic("u-event").kind == "event"
    with pytest.raises(KindMismatch) as e:
        store.append("u-bytes", 0, 0, b"x", 1, 0, 0, 1, kind="event")
    assert (e.value.kind, e.value.wanted) == ("bytes", "event")
    with pytest.raises(KindMismatch):
        store.append("u-event", 0, 0, b"x", 1, 0, 0, 1, kind="bytes")
    # nothing was stored by the refused appends
    assert store.offsets("u-bytes", 0).high_watermark == 2
    assert store.offsets("u-event", 0).high_watermark == 2
    # an append without a kind (another dialect) is a record like any other
    assert put(store, "u-bytes", b"zz").stream_pos == 8
    assert store.offsets("u-bytes", 0).end_position == 10
    fired(store.close())


def test_refused_append_does_not_decide_an_undecided_topic(store):
    fired(store.create_topic("u", 1, kind="undecided"))
    with pytest.raises(WriterConflict):
        store.append("u", 0, 0, b"x", 1, 0, 0, 1, writer=(W1, 5, 6), kind="bytes")
    assert store.topic("u").kind == "undecided"
    put(store, "u", b"x")
    assert store.topic("u").kind == "event"


# -- segments, index and timestamps ---------------------------------------------------------


def test_segment_roll_by_size(root, clock):
    # frames of OVERHEAD + 40 = 100 bytes; a segment holds its header and 3 frames
    store = open_store(root, clock, segment_bytes=SEGMENT_HEADER_SIZE + 300)
    fired(store.create_topic("t", 1))
    for i in range(10):
        put(store, "t", bytes([65 + i]) * 40, count=2)
    state = store.offsets("t", 0)
    assert state.segments == 4
    assert seg_files(root, "t") == [segment_name(b) for b in (0, 6, 12, 18)]
    assert os.path.getsize(seg_path(root, "t", 0, 0)) == SEGMENT_HEADER_SIZE + 300
    assert os.path.getsize(seg_path(root, "t", 0, 18)) == SEGMENT_HEADER_SIZE + 100
    assert state.size_bytes == 3 * (SEGMENT_HEADER_SIZE + 300) + SEGMENT_HEADER_SIZE + 100
    # reads cross segment boundaries
    assert payloads(store.read("t", 0, 0, BIG)) == [bytes([65 + i]) * 40 for i in range(10)]
    for offset in range(20):
        assert store.read("t", 0, offset, 1)[0].base_offset == offset - offset % 2
    # max_bytes counts payload bytes (40 a batch)
    assert [b.base_offset for b in store.read("t", 0, 5, 100)] == [4, 6]
    assert [b.base_offset for b in store.read("t", 0, 5, 120)] == [4, 6, 8]
    fired(store.close())


def test_a_batch_larger_than_a_segment_gets_its_own(root, clock):
    store = open_store(root, clock, segment_bytes=200)
    fired(store.create_topic("t", 1))
    put(store, "t", b"a" * 10)
    put(store, "t", b"b" * 1000)
    put(store, "t", b"c" * 10)
    assert store.offsets("t", 0).segments == 3
    assert payloads(store.read("t", 0, 0, BIG)) == [b"a" * 10, b"b" * 1000, b"c" * 10]
    fired(store.close())


def test_segment_roll_by_age(root, clock):
    store = open_store(root, clock, segment_ms=1000)
    fired(store.create_topic("t", 1))
    put(store, "t", b"a")
    clock.advance(0.5)
    put(store, "t", b"b")
    assert store.offsets("t", 0).segments == 1
    clock.advance(0.6)                      # the segment is now 1.1 s old
    put(store, "t", b"c")
    assert store.offsets("t", 0).segments == 2
    assert seg_files(root, "t") == [segment_name(0), segment_name(2)]
    clock.advance(0.9)
    put(store, "t", b"d")
    assert store.offsets("t", 0).segments == 2
    clock.advance(0.2)
    put(store, "t", b"e")
    assert seg_files(root, "t") == [segment_name(0), segment_name(2), segment_name(4)]
    assert payloads(store.read("t", 0, 0, BIG)) == [b"a", b"b", b"c", b"d", b"e"]
    fired(store.close())


def _check_index(store, topic):
    """Every in-memory index entry points at the frame it claims to."""
    part = store.partitions[(topic, 0)]
    entries = 0
    for seg in part.segments:
        for off, pos, spos, pts in zip(seg.idx_offsets, seg.idx_positions, seg.idx_stream,
                                       seg.idx_prefix_ts):
            batch = next(seg.scan(pos))
            assert (batch.base_offset, batch.position, batch.stream_pos) == (off, pos, spos)
            entries += 1
        # the prefix maximum of timestamps only grows
        assert list(seg.idx_prefix_ts) == sorted(seg.idx_prefix_ts)
        # the index file holds exactly the same entries
        with open(seg.index_path, "rb") as f:
            raw = f.read()
        on_disk = [INDEX_ENTRY.unpack_from(raw, i) for i in range(0, len(raw), INDEX_ENTRY.size)]
        assert on_disk == list(zip(seg.idx_offsets, seg.idx_positions, seg.idx_stream,
                                   seg.idx_prefix_ts))
    return entries


def test_index_and_timestamps_across_many_segments(root, clock):
    settings = dict(segment_bytes=SEGMENT_HEADER_SIZE + 5 * (OVERHEAD + 20),
                    index_interval_bytes=150)
    store = open_store(root, clock, **settings)
    fired(store.create_topic("t", 1))
    # max timestamps are not monotonic: a late batch may carry an old time
    max_ts = [10, 50, 20, 30, 60, 5, 70, 70, 65, 100, 90, 95, 40, 120, 110,
              130, 125, 3, 140, 150, 149, 160, 155, 170, 10, 180]
    for i, m in enumerate(max_ts):
        put(store, "t", bytes([65 + i]) * 20, count=3, ts=m - 2, max_ts=m)
    state = store.offsets("t", 0)
    assert state.segments == 6
    # every second frame (150 bytes apart from the last entry) is indexed
    assert _check_index(store, "t") == 6 * 3 - 2

    def expected_batch(t):
        for i, m in enumerate(max_ts):
            if m >= t:
                return 3 * i
        return None

    def check_all(s):
        for offset in range(3 * len(max_ts)):
            assert s.read("t", 0, offset, 1)[0].base_offset == offset - offset % 3
        for t in range(0, 200, 1):
            b = s.batch_for_timestamp("t", 0, t)
            assert (None if b is None else b.base_offset) == expected_batch(t), t

    check_all(store)
    before = [(list(seg.idx_offsets), seg.max_ts) for seg in store.partitions[("t", 0)].segments]
    fired(store.close())
    # sealed segments come back from their index files, the active one is rescanned
    store = open_store(root, clock, **settings)
    after = [(list(seg.idx_offsets), seg.max_ts) for seg in store.partitions[("t", 0)].segments]
    assert after == before
    check_all(store)
    _check_index(store, "t")
    assert put(store, "t", b"next", count=1).base_offset == 3 * len(max_ts)
    fired(store.close())


def test_damaged_index_file_is_rebuilt(root, clock):
    settings = dict(segment_bytes=SEGMENT_HEADER_SIZE + 3 * (OVERHEAD + 10),
                    index_interval_bytes=1)
    store = open_store(root, clock, **settings)
    fired(store.create_topic("t", 1))
    for i in range(9):
        put(store, "t", bytes([65 + i]) * 10)
    fired(store.close())
    index = os.path.join(str(root), "topics", "t", "0", index_name(3))
    with open(index, "r+b") as f:       # entries out of order: not trusted
        f.seek(INDEX_ENTRY.size)
        f.write(INDEX_ENTRY.pack(0, 0, 0, 0))
    os.unlink(os.path.join(str(root), "topics", "t", "0", index_name(0)))
    store = open_store(root, clock, **settings)
    assert _check_index(store, "t") == 9
    for offset in range(9):
        assert store.read("t", 0, offset, 1)[0].payload == bytes([65 + offset]) * 10
    fired(store.close())


# -- restart -------------------------------------------------------------------------------------


def test_everything_survives_a_restart(root, clock):
    store = open_store(root, clock, segment_bytes=300)
    fired(store.create_topic("multi", 3, attrs={"owner": "me"}))
    fired(store.create_topic("bytes", 1, kind="bytes"))
    fired(store.create_topic("undecided", 2, kind="undecided"))
    fired(store.create_topic("grown", 1))
    fired(store.create_partitions("grown", 4))
    for i in range(12):
        put(store, "multi", b"m%d" % i, partition=i % 3, count=2)
    put(store, "bytes", b"abc", kind="bytes")
    put(store, "bytes", b"defgh", kind="bytes")
    put(store, "grown", b"g3", partition=3)
    put(store, "multi", b"w1", partition=1, writer=(W1, NO_EVENT_NUMBER, 4))
    put(store, "multi", b"w2", partition=1, writer=(W2, NO_EVENT_NUMBER, 9))
    put(store, "multi", b"w1b", partition=1, writer=(W1, 4, 5))
    fired(store.seal_partition("multi", 2))
    fired(store.commit_offset("g1", "multi", 0, 5, "meta-a"))
    fired(store.commit_offset("g1", "multi", 1, 7, None))
    fired(store.commit_offset("g2", "bytes", 0, 1, "x"))
    fired(store.table_create("tbl"))
    fired(store.table_update("tbl", [(b"k1", b"v1", None), (b"k2", b"v2", None)]))
    fired(store.table_create("empty"))
    before = {(t, p): (store.offsets(t, p), payloads(store.read(t, p, 0, BIG)))
              for t in store.topic_names() for p in range(store.topic(t).partitions)}
    infos = {t: store.topic(t) for t in store.topic_names()}
    fired(store.close())

    clock.advance(60)
    store = open_store(root, clock, segment_bytes=300)
    assert store.recovered == []
    assert store.topic_names() == ["bytes", "grown", "multi", "undecided"]
    assert {t: store.topic(t) for t in store.topic_names()} == infos
    assert store.topic("multi").attrs == {"owner": "me"}
    assert store.topic("grown").partitions == 4
    assert store.topic("bytes").kind == "bytes"
    assert store.topic("undecided").kind == "undecided"
    after = {(t, p): (store.offsets(t, p), payloads(store.read(t, p, 0, BIG)))
             for t in store.topic_names() for p in range(store.topic(t).partitions)}
    assert after == before
    assert store.offsets("multi", 2).sealed is True
    assert store.offsets("multi", 1).sealed is False
    with pytest.raises(PartitionSealed):
        store.append("multi", 2, 0, b"x", 1, 0, 0, 1)
    assert store.offsets("bytes", 0).end_position == 8
    assert store.committed_offset("g1", "multi", 0) == (5, "meta-a")
    assert store.committed_offset("g1", "multi", 1) == (7, None)
    assert store.committed_offset("g1", "multi", 2) is None
    assert store.groups() == ["g1", "g2"]
    assert store.group_offsets("g2") == {("bytes", 0): (1, "x")}
    assert store.writer_event_number("multi", 1, W1) == 5
    assert store.writer_event_number("multi", 1, W2) == 9
    assert store.writer_event_number("multi", 0, W1) == NO_EVENT_NUMBER
    assert store.table_read("tbl", [b"k1", b"k2", b"k3"]) == [(b"v1", 0), (b"v2", 1), None]
    assert store.table_entries("empty", 0, 10)[0] == []
    assert fired(store.table_update("tbl", [(b"k3", b"v3", None)])) == [2]
    # appends continue where they stopped
    assert put(store, "multi", b"more", partition=0).base_offset == 8
    assert put(store, "bytes", b"ij", kind="bytes").stream_pos == 8
    fired(store.close())


# -- torn tails -----------------------------------------------------------------------------------

#: the sweep's batches: (payload, count); the first and last carry a writer block
SWEEP = [(b"AAAAA", 2), (b"BBBBB", 2), (b"CCCCC", 2)]
SWEEP_FRAMES = [WRITER_OVERHEAD + 5, OVERHEAD + 5, WRITER_OVERHEAD + 5]


def _write_sweep_pristine(path):
    store = open_store(path, index_interval_bytes=1)
    fired(store.create_topic("t", 1))
    put(store, "t", SWEEP[0][0], count=2, writer=(W1, NO_EVENT_NUMBER, 3))
    put(store, "t", SWEEP[1][0], count=2)
    put(store, "t", SWEEP[2][0], count=2, writer=(W1, 3, 7))
    fired(store.close())


def _check_recovered(path, expect_last, expect_cut):
    """Reopen after damage; check the first two batches, the last one's fate, the next append."""
    store = open_store(path, index_interval_bytes=1)
    seg = seg_path(path, "t", 0, 0)
    last_start = SEGMENT_HEADER_SIZE + SWEEP_FRAMES[0] + SWEEP_FRAMES[1]
    batches = store.read("t", 0, 0, BIG)
    if expect_last:
        assert payloads(batches) == [p for p, _ in SWEEP]
        assert store.offsets("t", 0).high_watermark == 6
        assert store.writer_event_number("t", 0, W1) == 7
        assert os.path.getsize(seg) == last_start + SWEEP_FRAMES[2]
        next_offset, next_pos = 6, 3 * (16 + 5)
    else:
        assert payloads(batches) == [SWEEP[0][0], SWEEP[1][0]]
        assert [(b.base_offset, b.count) for b in batches] == [(0, 2), (2, 2)]
        assert store.read("t", 0, 4, BIG) == []
        state = store.offsets("t", 0)
        assert (state.high_watermark, state.end_position) == (4, 2 * (16 + 5))
        # the writer's number comes from the log, not from the snapshot taken at close
        assert store.writer_event_number("t", 0, W1) == 3
        assert os.path.getsize(seg) == last_start
        next_offset, next_pos = 4, 2 * (16 + 5)
    assert store.recovered == ([("t", 0, expect_cut)] if expect_cut else [])
    a = put(store, "t", b"NEXT", count=1, writer=(W1, store.writer_event_number("t", 0, W1), 8))
    assert (a.base_offset, a.stream_pos) == (next_offset, next_pos)
    assert payloads(store.read("t", 0, next_offset, BIG)) == [b"NEXT"]
    assert store.read("t", 0, 0, BIG)[0].payload == SWEEP[0][0]
    fired(store.close())


def test_torn_tail_sweep(tmp_path):
    pristine = tmp_path / "pristine"
    _write_sweep_pristine(pristine)
    seg_name = seg_path(pristine, "t", 0, 0)
    with open(seg_name, "rb") as f:
        original = f.read()
    last_start = SEGMENT_HEADER_SIZE + SWEEP_FRAMES[0] + SWEEP_FRAMES[1]
    frame = SWEEP_FRAMES[2]
    assert len(original) == last_start + frame

    def case(name, data, expect_last, expect_cut):
        path = tmp_path / name
        shutil.copytree(pristine, path)
        with open(seg_path(path, "t", 0, 0), "wb") as f:
            f.write(data)
        _check_recovered(path, expect_last, expect_cut)
        shutil.rmtree(path)

    case("intact", original, True, 0)
    for i in range(frame):
        # (a) the write stopped i bytes into the last frame
        case(f"cut{i}", original[:last_start + i], False, i)
        # (b) one byte of the last frame is damaged
        damaged = bytearray(original)
        damaged[last_start + i] ^= 0xFF
        case(f"flip{i}", bytes(damaged), False, frame)


def test_corrupt_frame_in_the_middle_of_the_active_segment(root, clock):
    store = open_store(root, clock)
    fired(store.create_topic("t", 1))
    for i in range(5):
        put(store, "t", bytes([65 + i]) * 10)
    fired(store.close())
    seg = seg_path(root, "t", 0, 0)
    with open(seg, "r+b") as f:
        f.seek(SEGMENT_HEADER_SIZE + (OVERHEAD + 10) + OVERHEAD + 3)   # payload of batch 1
        f.write(b"?")
    store = open_store(root, clock)
    assert store.recovered == [("t", 0, 4 * (OVERHEAD + 10))]
    assert payloads(store.read("t", 0, 0, BIG)) == [b"A" * 10]
    assert store.offsets("t", 0).high_watermark == 1
    assert os.path.getsize(seg) == SEGMENT_HEADER_SIZE + OVERHEAD + 10
    assert put(store, "t", b"new").base_offset == 1
    assert payloads(store.read("t", 0, 0, BIG)) == [b"A" * 10, b"new"]
    fired(store.close())


def test_garbage_after_the_last_frame_is_cut(root, clock):
    store = open_store(root, clock)
    fired(store.create_topic("t", 1))
    put(store, "t", b"one")
    fired(store.close())
    seg = seg_path(root, "t", 0, 0)
    with open(seg, "ab") as f:
        f.write(b"\x00" * 3)                   # shorter than a frame prefix
    store = open_store(root, clock)
    assert store.recovered == [("t", 0, 3)]
    assert os.path.getsize(seg) == SEGMENT_HEADER_SIZE + OVERHEAD + 3
    assert put(store, "t", b"two").base_offset == 1
    assert payloads(store.read("t", 0, 0, BIG)) == [b"one", b"two"]
    fired(store.close())


def _two_segments(root, clock):
    """Segment 0 holding offsets 0..2, with room for one more batch (so a roll to
    segment 3 can only have happened by age)."""
    settings = dict(segment_bytes=SEGMENT_HEADER_SIZE + 4 * (OVERHEAD + 4))
    store = open_store(root, clock, **settings)
    fired(store.create_topic("t", 1))
    for i in range(3):
        put(store, "t", b"old%d" % i)
    state = store.offsets("t", 0)
    fired(store.close())
    return settings, state


@pytest.mark.parametrize("head", [SEGMENT_HEADER_SIZE, 0, 10, SEGMENT_HEADER_SIZE - 1])
def test_torn_segment_creation(root, clock, head):
    settings, state = _two_segments(root, clock)
    assert state.segments == 1
    # a roll to segment 3 got (part of) the way to disk
    header = SEGMENT_HEADER.pack(SEGMENT_MAGIC, 3, state.end_position, T0_MS)
    with open(seg_path(root, "t", 0, 3), "wb") as f:
        f.write(header[:head])
    store = open_store(root, clock, **settings)
    whole = head == SEGMENT_HEADER_SIZE
    assert store.offsets("t", 0).segments == (2 if whole else 1)
    assert seg_files(root, "t") == [segment_name(0)] + ([segment_name(3)] if whole else [])
    assert store.offsets("t", 0).high_watermark == 3
    assert store.offsets("t", 0).end_position == state.end_position
    a = put(store, "t", b"new3")
    assert (a.base_offset, a.stream_pos) == (3, state.end_position)
    put(store, "t", b"new4")
    assert payloads(store.read("t", 0, 0, BIG)) == [b"old0", b"old1", b"old2", b"new3", b"new4"]
    fired(store.close())
    store = open_store(root, clock, **settings)
    assert store.recovered == []
    assert payloads(store.read("t", 0, 0, BIG)) == [b"old0", b"old1", b"old2", b"new3", b"new4"]
    assert put(store, "t", b"new5").base_offset == 5
    fired(store.close())


def test_sealed_segment_that_lost_its_tail_becomes_active_again(root, clock):
    # segment 0 held 0..2, segment 3 followed; segment 0 lost its last batch
    # (a crash under fsync: never): segment 3 no longer follows it and goes
    settings = dict(segment_bytes=SEGMENT_HEADER_SIZE + 3 * (OVERHEAD + 4))
    store = open_store(root, clock, **settings)
    fired(store.create_topic("t", 1))
    for i in range(4):
        put(store, "t", b"old%d" % i)
    assert store.offsets("t", 0).segments == 2
    fired(store.close())
    with open(seg_path(root, "t", 0, 0), "r+b") as f:
        f.truncate(SEGMENT_HEADER_SIZE + 2 * (OVERHEAD + 4) + 7)
    store = open_store(root, clock, **settings)
    assert seg_files(root, "t") == [segment_name(0)]
    assert store.offsets("t", 0).high_watermark == 2
    assert os.path.getsize(seg_path(root, "t", 0, 0)) == SEGMENT_HEADER_SIZE + 2 * (OVERHEAD + 4)
    assert put(store, "t", b"new2").base_offset == 2
    assert put(store, "t", b"new3").base_offset == 3          # rolls
    assert payloads(store.read("t", 0, 0, BIG)) == [b"old0", b"old1", b"new2", b"new3"]
    fired(store.close())
    store = open_store(root, clock, **settings)
    assert payloads(store.read("t", 0, 0, BIG)) == [b"old0", b"old1", b"new2", b"new3"]
    fired(store.close())


def test_tmp_files_of_a_torn_roll_are_removed(root, clock):
    settings, state = _two_segments(root, clock)
    tmp = seg_path(root, "t", 0, 3) + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"half")
    store = open_store(root, clock, **settings)
    assert not os.path.exists(tmp)
    assert store.offsets("t", 0).high_watermark == 3
    fired(store.close())


# -- retention ------------------------------------------------------------------------------


RET_SEGMENT = SEGMENT_HEADER_SIZE + 3 * (OVERHEAD + 40)     # 3 batches of 40 bytes per segment


def test_retention_by_age_uses_append_time(root, clock):
    settings = dict(segment_bytes=RET_SEGMENT, retention_ms=3600 * 1000)
    store = open_store(root, clock, **settings)
    fired(store.create_topic("t", 1))
    # client timestamps from 1970: they must not make anything look old
    for i in range(3):
        put(store, "t", bytes([65 + i]) * 40, ts=1000 + i)
    clock.advance(1800)
    for i in range(3, 7):
        put(store, "t", bytes([65 + i]) * 40, ts=1000 + i)
    assert store.offsets("t", 0).segments == 3
    assert store.enforce_retention() == 0
    clock.advance(1799)                          # segment 0's last append: 3599 s ago
    assert store.enforce_retention() == 0
    assert store.offsets("t", 0).log_start == 0
    clock.advance(2)
    assert store.enforce_retention() == 1
    state = store.offsets("t", 0)
    assert (state.log_start, state.high_watermark, state.segments) == (3, 7, 2)
    assert seg_files(root, "t") == [segment_name(3), segment_name(6)]
    assert seg_files(root, "t", suffix=".index") == [index_name(3), index_name(6)]
    with pytest.raises(OffsetOutOfRange) as e:
        store.read("t", 0, 2, BIG)
    assert (e.value.log_start, e.value.log_end) == (3, 7)
    assert store.read("t", 0, 3, BIG)[0].payload == b"D" * 40
    assert state.start_position == 3 * (8 + 40)
    with pytest.raises(OffsetOutOfRange):
        store.read_at_position("t", 0, 3 * 48 - 1, BIG)
    # the active segment is never deleted, however old
    clock.advance(10 * 3600)
    assert store.enforce_retention() == 1
    assert store.offsets("t", 0).log_start == 6
    assert store.enforce_retention() == 0
    assert store.offsets("t", 0).segments == 1
    assert payloads(store.read("t", 0, 6, BIG)) == [b"G" * 40]
    fired(store.close())

    store = open_store(root, clock, **settings)
    state = store.offsets("t", 0)
    assert (state.log_start, state.high_watermark, state.start_position) == (6, 7, 6 * 48)
    with pytest.raises(OffsetOutOfRange):
        store.read("t", 0, 5, BIG)
    assert put(store, "t", b"after").base_offset == 7
    fired(store.close())


def test_retention_by_bytes(root, clock):
    settings = dict(segment_bytes=RET_SEGMENT, retention_ms=None, retention_bytes=500)
    store = open_store(root, clock, **settings)
    fired(store.create_topic("t", 2))
    for i in range(10):
        put(store, "t", bytes([65 + i]) * 40)
    put(store, "t", b"small", partition=1)
    # sizes 332, 332, 332, 132 = 1128: two segments must go to get to 464
    assert store.offsets("t", 0).size_bytes == 1128
    assert store.enforce_retention() == 2
    state = store.offsets("t", 0)
    assert (state.log_start, state.size_bytes, state.segments) == (6, 464, 2)
    assert store.offsets("t", 1).log_start == 0
    assert seg_files(root, "t") == [segment_name(6), segment_name(9)]
    with pytest.raises(OffsetOutOfRange):
        store.read("t", 0, 5, BIG)
    assert [b.base_offset for b in store.read("t", 0, 6, BIG)] == [6, 7, 8, 9]
    assert store.enforce_retention() == 0
    fired(store.close())
    store = open_store(root, clock, **settings)
    assert store.offsets("t", 0).log_start == 6
    assert store.offsets("t", 0).size_bytes == 464
    assert put(store, "t", b"z").base_offset == 10
    fired(store.close())


def test_retention_never_deletes_a_lone_active_segment(root, clock):
    store = open_store(root, clock, retention_ms=1000, retention_bytes=1)
    fired(store.create_topic("t", 1))
    put(store, "t", b"x" * 100)
    clock.advance(3600)
    assert store.enforce_retention() == 0
    assert store.offsets("t", 0).log_start == 0
    assert payloads(store.read("t", 0, 0, BIG)) == [b"x" * 100]
    fired(store.close())


# -- writer compare-and-set ------------------------------------------------------------------------


def test_writer_compare_and_set(store):
    fired(store.create_topic("t", 2))
    assert store.writer_event_number("t", 0, W1) == NO_EVENT_NUMBER
    with pytest.raises(WriterConflict) as e:
        store.append("t", 0, 0, b"x", 1, 0, 0, 1, writer=(W1, 0, 1))
    assert (e.value.expected, e.value.stored) == (0, NO_EVENT_NUMBER)
    assert put(store, "t", b"a", writer=(W1, NO_EVENT_NUMBER, 1)).base_offset == 0
    assert store.writer_event_number("t", 0, W1) == 1
    assert put(store, "t", b"b", writer=(W1, 1, 5)).base_offset == 1
    for expected in (1, 4, 6, NO_EVENT_NUMBER):
        with pytest.raises(WriterConflict) as e:
            store.append("t", 0, 0, b"dup", 1, 0, 0, 3, writer=(W1, expected, 6))
        assert e.value.stored == 5
    # nothing was stored by the refused appends
    assert store.offsets("t", 0).high_watermark == 2
    assert payloads(store.read("t", 0, 0, BIG)) == [b"a", b"b"]
    assert store.writer_event_number("t", 0, W1) == 5
    # writers are per partition, and independent of each other
    assert store.writer_event_number("t", 1, W1) == NO_EVENT_NUMBER
    put(store, "t", b"c", partition=1, writer=(W1, NO_EVENT_NUMBER, 100))
    put(store, "t", b"d", writer=(W2, NO_EVENT_NUMBER, 2))
    put(store, "t", b"e")                       # appends without a writer change nothing
    assert store.writer_event_number("t", 0, W1) == 5
    assert store.writer_event_number("t", 0, W2) == 2
    assert store.writer_event_number("t", 1, W1) == 100
    batches = store.read("t", 0, 0, BIG)
    assert [(b.writer_id, b.event_number) for b in batches] == \
        [(W1, 1), (W1, 5), (W2, 2), (None, 0)]


def test_writer_numbers_survive_a_crash_like_reopen(root, clock):
    store = open_store(root, clock)
    fired(store.create_topic("t", 1))
    put(store, "t", b"a", writer=(W1, NO_EVENT_NUMBER, 1))
    put(store, "t", b"b", writer=(W1, 1, 2))
    put(store, "t", b"c", writer=(W2, NO_EVENT_NUMBER, 10))
    # no close(): the process "dies" with the data in the page cache only
    crash(store)
    store = open_store(root, clock)
    assert store.writer_event_number("t", 0, W1) == 2
    assert store.writer_event_number("t", 0, W2) == 10
    with pytest.raises(WriterConflict):
        store.append("t", 0, 0, b"x", 1, 0, 0, 1, writer=(W1, 1, 2))
    assert put(store, "t", b"d", writer=(W1, 2, 3)).base_offset == 3
    fired(store.close())


def test_writer_numbers_survive_many_rolls_and_crashes(root, clock):
    settings = dict(segment_bytes=SEGMENT_HEADER_SIZE + 2 * (WRITER_OVERHEAD + 4))
    store = open_store(root, clock, **settings)
    fired(store.create_topic("t", 1))
    numbers = {W1: NO_EVENT_NUMBER, W2: NO_EVENT_NUMBER}
    for i in range(30):
        w = W1 if i % 3 else W2
        put(store, "t", b"e%03d" % i, writer=(w, numbers[w], i + 1))
        numbers[w] = i + 1
        if i % 7 == 6:
            crash(store)
            store = open_store(root, clock, **settings)
            assert store.writer_event_number("t", 0, W1) == numbers[W1]
            assert store.writer_event_number("t", 0, W2) == numbers[W2]
    assert store.offsets("t", 0).segments == 15
    put(store, "t", b"last")                     # no writer in the last batch
    crash(store)
    store = open_store(root, clock, **settings)
    assert store.writer_event_number("t", 0, W1) == 30
    assert store.writer_event_number("t", 0, W2) == 28
    assert store.offsets("t", 0).high_watermark == 31
    fired(store.close())


def test_writer_snapshot_past_a_lost_tail_is_dropped(root, clock):
    # rolls snapshot the writers; if the OS then loses the tail, the snapshot
    # is ahead of the log and the numbers must come from the log instead
    settings = dict(segment_bytes=SEGMENT_HEADER_SIZE + 2 * (WRITER_OVERHEAD + 1))
    store = open_store(root, clock, **settings)
    fired(store.create_topic("t", 1))
    put(store, "t", b"a", writer=(W1, NO_EVENT_NUMBER, 1))
    put(store, "t", b"b", writer=(W1, 1, 2))
    put(store, "t", b"c", writer=(W1, 2, 3))       # rolls: snapshot says W1 = 3 at offset 3
    assert store.offsets("t", 0).segments == 2
    crash(store)
    with open(seg_path(root, "t", 0, 2), "r+b") as f:
        f.truncate(SEGMENT_HEADER_SIZE + 10)        # the tail is lost
    store = open_store(root, clock, **settings)
    assert store.offsets("t", 0).high_watermark == 2
    assert store.writer_event_number("t", 0, W1) == 2
    assert put(store, "t", b"c2", writer=(W1, 2, 3)).base_offset == 2
    fired(store.close())


# -- seal, waiters, delete ----------------------------------------------------------------------------


def test_sealed_partition_refuses_appends(store):
    fired(store.create_topic("t", 2))
    put(store, "t", b"a")
    fired(store.seal_partition("t", 0))
    fired(store.seal_partition("t", 0))         # sealing twice is fine
    with pytest.raises(PartitionSealed):
        store.append("t", 0, 0, b"x", 1, 0, 0, 1)
    state = store.offsets("t", 0)
    assert (state.sealed, state.high_watermark) == (True, 1)
    assert payloads(store.read("t", 0, 0, BIG)) == [b"a"]
    assert put(store, "t", b"b", partition=1).base_offset == 0
    with pytest.raises(UnknownPartition):
        store.seal_partition("t", 9)


def test_wait_for_append(store):
    fired(store.create_topic("t", 1))
    got = []
    store.wait_for_append("t", 0, 0).addCallback(got.append)
    later = []
    store.wait_for_append("t", 0, 1).addCallback(later.append)
    assert got == [] and later == []
    put(store, "t", b"a")
    assert got == [1] and later == []
    put(store, "t", b"b", count=2)
    assert later == [3]
    # already past: fires at once
    now = []
    store.wait_for_append("t", 0, 2).addCallback(now.append)
    assert now == [3]
    assert store.partitions[("t", 0)].waiters == []


def test_wait_for_append_fires_on_seal(store):
    fired(store.create_topic("t", 1))
    put(store, "t", b"a")
    got = []
    store.wait_for_append("t", 0, 1).addCallback(got.append)
    assert got == []
    fired(store.seal_partition("t", 0))
    assert got == [1]
    again = []
    store.wait_for_append("t", 0, 5).addCallback(again.append)
    assert again == [1]


def test_cancelled_waiter_is_removed(store):
    fired(store.create_topic("t", 1))
    d = store.wait_for_append("t", 0, 0)
    keep = store.wait_for_append("t", 0, 0)
    assert len(store.partitions[("t", 0)].waiters) == 2
    errors = []
    d.addErrback(errors.append)
    d.cancel()
    assert errors[0].check(defer.CancelledError)
    assert [w for _, w in store.partitions[("t", 0)].waiters] == [keep]
    put(store, "t", b"a")
    assert fired(keep) == 1
    assert store.partitions[("t", 0)].waiters == []


def test_delete_topic(root, store):
    fired(store.create_topic("t", 2))
    fired(store.create_topic("other", 1))
    put(store, "t", b"a")
    fired(store.commit_offset("g", "t", 0, 1))
    fired(store.commit_offset("g", "other", 0, 0))
    errors = []
    for p in (0, 1):
        store.wait_for_append("t", p, 5).addErrback(errors.append)
    fired(store.delete_topic("t"))
    assert [f.check(UnknownTopic) for f in errors] == [UnknownTopic, UnknownTopic]
    assert errors[0].value.topic == "t"
    assert store.topic_names() == ["other"]
    assert not os.path.exists(os.path.join(str(root), "topics", "t"))
    with pytest.raises(UnknownTopic):
        store.read("t", 0, 0, BIG)
    with pytest.raises(UnknownTopic):
        store.delete_topic("t")
    assert store.committed_offset("g", "t", 0) is None
    assert store.group_offsets("g") == {("other", 0): (0, None)}
    # the name can be used again, from offset 0
    fired(store.create_topic("t", 1))
    assert put(store, "t", b"fresh").base_offset == 0
    assert payloads(store.read("t", 0, 0, BIG)) == [b"fresh"]


def test_topic_attrs_and_committed_offsets(store):
    fired(store.create_topic("t", 2))
    assert fired(store.set_topic_attrs("t", {"a": 1})).attrs == {"a": 1}
    with pytest.raises(UnknownTopic):
        store.set_topic_attrs("nope", {})
    fired(store.commit_offset("g", "t", 1, 42, "m"))
    fired(store.commit_offset("g", "t", 1, 43, None))     # replaces
    assert store.committed_offset("g", "t", 1) == (43, None)
    assert store.committed_offset("h", "t", 1) is None
    with pytest.raises(UnknownTopic):
        store.commit_offset("g", "nope", 0, 1)
    with pytest.raises(UnknownPartition):
        store.commit_offset("g", "t", 2, 1)


def test_create_partitions(store):
    fired(store.create_topic("t", 1))
    put(store, "t", b"a")
    assert fired(store.create_partitions("t", 3)).partitions == 3
    assert put(store, "t", b"new", partition=2).base_offset == 0
    assert payloads(store.read("t", 0, 0, BIG)) == [b"a"]
    with pytest.raises(ValueError):
        store.create_partitions("t", 2)
    with pytest.raises(UnknownTopic):
        store.create_partitions("nope", 2)


# -- key-value tables --------------------------------------------------------------------------------


def test_table_create_and_exists(store):
    fired(store.table_create("tb"))
    with pytest.raises(TableExists):
        store.table_create("tb")
    with pytest.raises(UnknownTable):
        store.table_read("nope", [b"k"])
    with pytest.raises(UnknownTable):
        store.table_update("nope", [(b"k", b"v", None)])
    with pytest.raises(UnknownTable):
        store.table_entries("nope", 0, 10)
    assert store.table_read("tb", [b"k"]) == [None]
    assert store.table_entries("tb", 0, 10) == ([], 0)
    # tables are not topics
    assert store.topic_names() == []


def test_table_conditional_updates(store):
    fired(store.table_create("tb"))
    assert fired(store.table_update("tb", [(b"k1", b"v1", None), (b"k2", b"v2", -1)])) == [0, 1]
    assert fired(store.table_update("tb", [(b"k1", b"v1b", 0)])) == [2]
    assert store.table_read("tb", [b"k1", b"k2", b"zz"]) == [(b"v1b", 2), (b"v2", 1), None]

    def refused(entries, error, table_offset=None):
        with pytest.raises(error):
            store.table_update("tb", entries, table_offset)
        # nothing applied, and the counter did not move
        assert store.table_read("tb", [b"k1", b"k2", b"k3"]) == [(b"v1b", 2), (b"v2", 1), None]
        assert store.table_entries("tb", 0, 100)[1] == 3

    refused([(b"k1", b"x", 0)], TableBadVersion)                 # stale version
    refused([(b"k2", b"x", -1)], TableBadVersion)                # must not exist, does
    refused([(b"k3", b"x", None), (b"k1", b"x", 1)], TableBadVersion)   # all or nothing
    # a version for a missing key is a bad version too (pravega-clients.md §3.4)
    refused([(b"k3", b"x", 4)], TableBadVersion)
    refused([(b"k3", b"x", None)], TableBadVersion, table_offset=2)
    # the table offset must equal the counter; -1 means unconditional
    assert fired(store.table_update("tb", [(b"k3", b"v3", -1)], table_offset=3)) == [3]
    assert fired(store.table_update("tb", [(b"k3", b"v3b", 3)], table_offset=-1)) == [4]
    # a key several times in one batch: every check is against the table before
    # the batch, each entry gets a version, the last one wins
    assert fired(store.table_update("tb", [(b"k4", b"a", -1), (b"k4", b"b", -1),
                                           (b"k4", b"c", -1)])) == [5, 6, 7]
    assert store.table_read("tb", [b"k4"]) == [(b"c", 7)]


def test_table_entries_delta_reads(store):
    fired(store.table_create("tb"))
    fired(store.table_update("tb", [(b"a", b"1", None), (b"b", b"2", None),
                                    (b"c", b"3", None), (b"d", b"4", None)]))
    fired(store.table_update("tb", [(b"b", b"2b", 1)]))          # b: 1 -> 4
    entries, nxt = store.table_entries("tb", 0, 100)
    assert entries == [(b"a", b"1", 0), (b"c", b"3", 2), (b"d", b"4", 3), (b"b", b"2b", 4)]
    assert nxt == 5
    assert store.table_entries("tb", 3, 100) == ([(b"d", b"4", 3), (b"b", b"2b", 4)], 5)
    # a limited page continues from its last version + 1, so nothing is skipped
    page, nxt = store.table_entries("tb", 0, 2)
    assert (page, nxt) == ([(b"a", b"1", 0), (b"c", b"3", 2)], 3)
    page, nxt = store.table_entries("tb", nxt, 2)
    assert (page, nxt) == ([(b"d", b"4", 3), (b"b", b"2b", 4)], 5)
    assert store.table_entries("tb", nxt, 2) == ([], 5)


def test_table_removes(store):
    fired(store.table_create("tb"))
    fired(store.table_update("tb", [(b"a", b"1", None), (b"b", b"2", None)]))   # 0, 1
    for keys, error in (([(b"a", 5)], TableBadVersion),
                        ([(b"zz", 3)], TableKeyMissing),
                        ([(b"a", 0), (b"zz", 3)], TableKeyMissing),
                        ([(b"a", 0), (b"b", 0)], TableBadVersion)):
        with pytest.raises(error):
            store.table_remove("tb", keys)
        assert store.table_read("tb", [b"a", b"b"]) == [(b"1", 0), (b"2", 1)]
    with pytest.raises(TableBadVersion):
        store.table_remove("tb", [(b"a", None)], table_offset=7)
    fired(store.table_remove("tb", [(b"zz", None)]))      # unconditional, missing: no-op
    assert store.table_entries("tb", 0, 10)[1] == 2
    fired(store.table_remove("tb", [(b"a", 0)], table_offset=2))
    assert store.table_read("tb", [b"a", b"b"]) == [None, (b"2", 1)]
    # a removal advances the counter (pravega-clients.md §3.4) and is not reported
    assert store.table_entries("tb", 0, 10) == ([(b"b", b"2", 1)], 2)
    assert store.table_entries("tb", 2, 10) == ([], 3)
    assert fired(store.table_update("tb", [(b"a", b"again", -1)])) == [3]


def test_table_delete(root, clock):
    store = open_store(root, clock)
    fired(store.table_create("tb"))
    fired(store.table_update("tb", [(b"a", b"1", None)]))
    with pytest.raises(TableNotEmpty):
        store.table_delete("tb", must_be_empty=True)
    assert store.table_read("tb", [b"a"]) == [(b"1", 0)]
    fired(store.table_create("empty"))
    fired(store.table_delete("empty", must_be_empty=True))
    fired(store.table_delete("tb"))
    with pytest.raises(UnknownTable):
        store.table_read("tb", [b"a"])
    with pytest.raises(UnknownTable):
        store.table_delete("tb")
    fired(store.table_create("tb"))                      # a new table starts afresh
    assert store.table_read("tb", [b"a"]) == [None]
    assert fired(store.table_update("tb", [(b"b", b"2", None)])) == [0]
    fired(store.close())
    store = open_store(root, clock)
    assert store.table_read("tb", [b"a", b"b"]) == [None, (b"2", 0)]
    with pytest.raises(UnknownTable):
        store.table_read("empty", [b"a"])
    fired(store.close())


# -- topic names ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../x", "/abs", "x" * 201, "café",
                                  "a b", "a\x00b", "tab\t", None, 7])
def test_invalid_topic_names(root, store, name):
    with pytest.raises(InvalidTopicName):
        store.create_topic(name, 1)
    assert store.topic_names() == []
    assert os.listdir(os.path.join(str(root), "topics")) == []


def test_valid_topic_names(store):
    for name in ["x" * 200, "A-b_c.9", "...", ".hidden", "-"]:
        assert fired(store.create_topic(name, 1)).name == name
        assert put(store, name, b"v").base_offset == 0
    assert len(store.topic_names()) == 5


# -- fsync policies, with the real reactor ---------------------------------------------------------------


class FsyncPolicyTests(trial.TestCase):
    """Under ``always`` and ``interval`` an append is acknowledged, and its data
    served, only after an fsync that started after the write."""

    def tempdir(self):
        # not self.mktemp(): under pytest that would write into the working tree
        path = tempfile.mkdtemp(prefix="gateway-store-")
        self.addCleanup(shutil.rmtree, path, True)
        return os.path.join(path, "data")

    def open(self, policy, interval_ms=5, path=None):
        store = LogStore(StoreSettings(path=path or self.tempdir(), fsync=policy,
                                       fsync_interval_ms=interval_ms))
        store.open()
        self.addCleanup(store.close)
        return store

    @defer.inlineCallbacks
    def _acknowledged_after_fsync(self, policy):
        store = self.open(policy, interval_ms=20)
        yield store.create_topic("t", 1)
        before = store.syncer.fsyncs
        woken = []
        store.wait_for_append("t", 0, 0).addCallback(
            lambda hw: woken.append((hw, store.syncer.fsyncs)))
        d = store.append("t", 0, 0, b"hello", 1, 5, 5, 5)
        at_ack = []
        d.addCallback(lambda a: at_ack.append(store.syncer.fsyncs) or a)
        self.assertFalse(d.called)
        # not durable yet: not served, watermark unmoved, no waiter woken
        self.assertEqual(store.offsets("t", 0).high_watermark, 0)
        self.assertEqual(store.read("t", 0, 0, 100), [])
        self.assertEqual(woken, [])
        appended = yield d
        self.assertEqual((appended.base_offset, appended.count), (0, 1))
        self.assertGreater(at_ack[0], before)
        self.assertEqual(woken, [(1, at_ack[0])])
        self.assertEqual(store.offsets("t", 0).high_watermark, 1)
        self.assertEqual([b.payload for b in store.read("t", 0, 0, 100)], [b"hello"])
        yield store.commit_offset("g", "t", 0, 1)
        self.assertEqual(store.committed_offset("g", "t", 0), (1, None))

    def test_always(self):
        return self._acknowledged_after_fsync("always")

    def test_interval(self):
        return self._acknowledged_after_fsync("interval")

    @defer.inlineCallbacks
    def test_group_commit(self):
        path = self.tempdir()
        store = self.open("always", path=path)
        yield store.create_topic("t", 1)
        before = store.syncer.fsyncs
        ds = [store.append("t", 0, 0, b"v%02d" % i, 1, i, i, 3) for i in range(32)]
        results = yield defer.gatherResults(ds)
        self.assertEqual([a.base_offset for a in results], list(range(32)))
        fsyncs = store.syncer.fsyncs - before
        self.assertGreaterEqual(fsyncs, 1)
        self.assertLessEqual(fsyncs, 4)
        yield store.close()
        # and the data is there after a restart
        store = self.open("always", path=path)
        self.assertEqual([b.payload for b in store.read("t", 0, 0, BIG)],
                         [b"v%02d" % i for i in range(32)])
        self.assertEqual(store.offsets("t", 0).high_watermark, 32)

    @defer.inlineCallbacks
    def test_interval_batches_appends_into_one_fsync(self):
        store = self.open("interval", interval_ms=30)
        yield store.create_topic("t", 1)
        before = store.syncer.fsyncs
        ds = [store.append("t", 0, 0, b"x", 1, i, i, 1) for i in range(10)]
        yield defer.gatherResults(ds)
        self.assertEqual(store.syncer.fsyncs - before, 1)
