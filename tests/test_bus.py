"""
Unit tests for the command bus (``gateway.bus.CommandBus``).

The bus runs on a ``task.Clock`` over a real store with ``fsync: never`` (no
threads), so every append is durable at once and long-polls, timeouts and
push subscriptions move only when a test advances the clock.
"""
import pytest
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from zope.interface import implementer
from zope.interface.verify import verifyObject

from gateway import commands as c
from gateway.bus import CommandBus
from gateway.config import LimitsConfig, TopicsConfig
from gateway.errors import (
    InvalidRequest, InvalidTopicName, OffsetOutOfRange, PartitionSealed, RecordTooLarge,
    UnknownPartition, UnknownTopic)
from gateway.interfaces import ISubscriber
from gateway.records import NEUTRAL, EncodedBatch, RecordBatch, Records
from storage import LogStore, StoreSettings

T0 = 1_700_000_000.0
T0_MS = int(T0 * 1000)
BIG = 1 << 30
#: a made-up payload format for the format-registry tests
TOY = 200


def clock_at(seconds=T0):
    clock = Clock()
    clock.advance(seconds)
    return clock


def fired(d):
    """The result of a Deferred that must already have fired (re-raising a failure)."""
    box = []
    d.addBoth(box.append)
    assert box, "the Deferred has not fired"
    if isinstance(box[0], Failure):
        box[0].raiseException()
    return box[0]


def failure_of(d):
    """The exception a Deferred that must already have failed carries."""
    box = []
    d.addBoth(box.append)
    assert box, "the Deferred has not fired"
    assert isinstance(box[0], Failure), f"expected a failure, got {box[0]!r}"
    return box[0].value


class Env:
    def __init__(self, path, topics=None, limits=None, **settings):
        settings.setdefault("fsync", "never")
        self.clock = clock_at()
        self.store = LogStore(StoreSettings(path=str(path), **settings), reactor=self.clock)
        self.store.open()
        self.bus = CommandBus(self.store, topics or TopicsConfig(), limits or LimitsConfig(),
                              reactor=self.clock)

    def run(self, command):
        return fired(self.bus.execute(command))

    def error(self, command):
        return failure_of(self.bus.execute(command))

    def produce(self, topic, values, partition=0, **kw):
        return self.run(c.Produce(topic, partition, RecordBatch(values, **kw)))

    def fetch_records(self, topic, partition=0, offset=0, max_bytes=BIG):
        """[(offset, timestamp, key, value)] from ``offset`` to the end."""
        [part] = self.run(c.Fetch([c.FetchPartition(topic, partition, offset, max_bytes)]))
        assert part.error is None
        out = []
        for batch in part.batches:
            out.extend(self.bus.decode(batch).since(offset))
        return out

    def waiters(self, topic, partition=0):
        return self.store.partitions[(topic, partition)].waiters

    def drain(self, limit=1000):
        """Run everything due now (subscriptions step with callLater(0))."""
        for _ in range(limit):
            if not any(call.getTime() <= self.clock.seconds()
                       for call in self.clock.getDelayedCalls()):
                return
            self.clock.advance(0)
        raise AssertionError("the bus never went idle")

    def close(self):
        fired(self.store.close())


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path / "data")
    yield e
    e.close()


def fp(topic, partition=0, offset=0, max_bytes=BIG):
    return c.FetchPartition(topic, partition, offset, max_bytes)


# -- produce and fetch ---------------------------------------------------------------------


def test_produce_values_only(env):
    a = env.produce("t", [b"a", b"bb", b""])
    assert (a.base_offset, a.count, a.stream_pos) == (0, 3, 0)
    assert env.produce("t", [b"ccc"]).base_offset == 3
    assert env.fetch_records("t") == [(0, T0_MS, None, b"a"), (1, T0_MS, None, b"bb"),
                                      (2, T0_MS, None, b""), (3, T0_MS, None, b"ccc")]
    [part] = env.run(c.Fetch([fp("t")]))
    assert (part.high_watermark, part.log_start, part.error) == (4, 0, None)
    assert [b.format for b in part.batches] == [NEUTRAL, NEUTRAL]
    records = env.bus.decode(part.batches[0])
    assert isinstance(records, Records)
    assert (records.base_offset, records.values, records.keys) == (0, [b"a", b"bb", b""], None)
    # stream positions: each record takes 8 + len(value)
    assert part.batches[1].stream_pos == 8 + 1 + 8 + 2 + 8 + 0


def test_produce_with_keys_and_timestamps(env):
    env.clock.advance(2.5)
    env.produce("t", [b"v1", b"v2", b"v3"], keys=[b"k1", None, b""])
    env.produce("t", [b"w1", b"w2", b"w3"], timestamps=[500, 300, 900])
    env.produce("t", [b"x1", b"x2"], keys=[b"kx", b"ky"], timestamps=[7, 8])
    now = T0_MS + 2500
    assert env.fetch_records("t") == [
        (0, now, b"k1", b"v1"), (1, now, None, b"v2"), (2, now, b"", b"v3"),
        (3, 500, None, b"w1"), (4, 300, None, b"w2"), (5, 900, None, b"w3"),
        (6, 7, b"kx", b"x1"), (7, 8, b"ky", b"x2")]
    batches = env.store.read("t", 0, 0, BIG)
    assert [(b.first_ts, b.max_ts) for b in batches] == [(now, now), (500, 900), (7, 8)]
    # fetching from the middle of a batch: since() drops the records before it
    assert [r[0] for r in env.fetch_records("t", offset=4)] == [4, 5, 6, 7]


def _toy_decoder(payload, batch):
    values = payload.split(b"|")
    return Records(batch.base_offset, [batch.first_ts] * len(values), None, values)


def test_foreign_format_decoded_through_the_registry(env):
    env.bus.formats.register(TOY, _toy_decoder)
    env.bus.formats.register(TOY, _toy_decoder)      # the same decoder again is fine
    with pytest.raises(ValueError):
        env.bus.formats.register(TOY, lambda p, b: None)
    env.produce("t", [b"neutral"], timestamps=[10])
    a = env.run(c.Produce("t", 0, EncodedBatch(TOY, b"x|yy|zzz", 3, 100, 300, 6, 3)))
    assert (a.base_offset, a.count, a.stream_pos) == (1, 3, 15)
    env.produce("t", [b"after"], timestamps=[400])
    [part] = env.run(c.Fetch([fp("t")]))
    assert [b.format for b in part.batches] == [NEUTRAL, TOY, NEUTRAL]
    assert part.batches[1].payload == b"x|yy|zzz"          # stored as sent
    assert (part.batches[1].first_ts, part.batches[1].max_ts) == (100, 300)
    assert part.batches[1].stream_len == 6 + 3 * 8
    assert [(o, v) for o, _, _, v in env.fetch_records("t")] == \
        [(0, b"neutral"), (1, b"x"), (2, b"yy"), (3, b"zzz"), (4, b"after")]
    # the toy batch's records carry its first timestamp (100)
    assert env.run(c.ListOffsets("t", 0, 50)) == 1
    assert env.run(c.ListOffsets("t", 0, 250)) == 4


def test_unknown_format_cannot_be_decoded(env):
    env.run(c.Produce("t", 0, EncodedBatch(201, b"??", 1, 0, 0, 2, 2)))
    [batch] = env.store.read("t", 0, 0, BIG)
    with pytest.raises(LookupError):
        env.bus.decode(batch)


# -- topics -------------------------------------------------------------------------------------


def test_auto_create_on_with_default_partitions(tmp_path):
    env = Env(tmp_path, topics=TopicsConfig(default_partitions=3))
    env.produce("new", [b"v"], partition=2)
    assert env.store.topic("new").partitions == 3
    assert env.store.topic("new").kind == "event"
    assert env.fetch_records("new", partition=2)[0][3] == b"v"
    # a dialect that does not create topics on produce
    assert isinstance(env.error(c.Produce("other", 0, RecordBatch([b"v"]), auto_create=False)),
                      UnknownTopic)
    assert "other" not in env.store.topic_names()
    assert isinstance(env.error(c.Produce("bad/name", 0, RecordBatch([b"v"]))),
                      InvalidTopicName)
    assert env.store.topic_names() == ["new"]
    env.close()


def test_auto_create_off(tmp_path):
    env = Env(tmp_path, topics=TopicsConfig(auto_create=False))
    error = env.error(c.Produce("new", 0, RecordBatch([b"v"])))
    assert isinstance(error, UnknownTopic) and error.topic == "new"
    assert env.store.topic_names() == []
    [part] = env.run(c.Fetch([fp("new")]))
    assert isinstance(part.error, UnknownTopic)
    assert env.store.topic_names() == []
    # explicit creation still works
    assert env.run(c.CreateTopic("new")).partitions == 1
    assert env.produce("new", [b"v"]).base_offset == 0
    env.close()


def test_create_topic_and_partition_limits(tmp_path):
    env = Env(tmp_path, topics=TopicsConfig(default_partitions=2, max_partitions=8))
    assert env.run(c.CreateTopic("a")).partitions == 2
    assert env.run(c.CreateTopic("b", 8, attrs={"x": 1})).attrs == {"x": 1}
    assert env.run(c.CreateTopic("u", 1, kind="undecided")).kind == "undecided"
    for count in (9, 0, -1):
        assert isinstance(env.error(c.CreateTopic(f"c{count}", count)), InvalidRequest)
    assert isinstance(env.error(c.CreateTopic("..", 1)), InvalidTopicName)
    assert env.store.topic_names() == ["a", "b", "u"]
    # grow, never shrink, never past the limit
    assert env.run(c.CreatePartitions("a", 5)).partitions == 5
    assert env.produce("a", [b"x"], partition=4).base_offset == 0
    assert isinstance(env.error(c.CreatePartitions("a", 3)), InvalidRequest)
    assert isinstance(env.error(c.CreatePartitions("a", 9)), InvalidRequest)
    assert isinstance(env.error(c.CreatePartitions("nope", 3)), UnknownTopic)
    assert env.store.topic("a").partitions == 5
    env.close()


def test_unknown_partition(env):
    env.run(c.CreateTopic("t", 2))
    error = env.error(c.Produce("t", 2, RecordBatch([b"v"])))
    assert isinstance(error, UnknownPartition) and error.partition == 2
    [ok, bad] = env.run(c.Fetch([fp("t", 1), fp("t", 7)], max_wait_ms=1000))
    assert ok.error is None and isinstance(bad.error, UnknownPartition)
    assert isinstance(env.error(c.ListOffsets("t", 5, c.LATEST)), UnknownPartition)
    assert isinstance(env.error(c.ListOffsets("nope", 0, c.LATEST)), UnknownTopic)


def test_record_too_large(tmp_path):
    env = Env(tmp_path, limits=LimitsConfig(max_record_bytes=100))
    env.run(c.CreateTopic("t"))
    error = env.error(c.Produce("t", 0, RecordBatch([b"ok", b"x" * 101])))
    assert isinstance(error, RecordTooLarge) and (error.size, error.limit) == (101, 100)
    error = env.error(c.Produce("t", 0, EncodedBatch(TOY, b"p", 2, 0, 0, 150, 101)))
    assert isinstance(error, RecordTooLarge)
    assert env.store.offsets("t", 0).high_watermark == 0
    assert env.store.read("t", 0, 0, BIG) == []
    assert env.produce("t", [b"x" * 100]).base_offset == 0
    # an auto-created topic stays empty too
    assert isinstance(env.error(c.Produce("auto", 0, RecordBatch([b"y" * 101]))), RecordTooLarge)
    assert "auto" not in env.store.topic_names()    # refused: no topic left behind
    env.close()


def test_sealed_partition(env):
    env.produce("t", [b"a"])
    env.run(c.SealPartition("t", 0))
    assert isinstance(env.error(c.Produce("t", 0, RecordBatch([b"b"]))), PartitionSealed)
    assert env.run(c.PartitionInfo("t", 0)).sealed is True
    assert [r[3] for r in env.fetch_records("t")] == [b"a"]


def test_delete_topic(env):
    env.produce("t", [b"a"])
    env.run(c.DeleteTopic("t"))
    assert env.store.topic_names() == []
    assert isinstance(env.error(c.DeleteTopic("t")), UnknownTopic)


# -- long-poll fetch ------------------------------------------------------------------------------


def test_fetch_parks_and_wakes_on_append(env):
    env.run(c.CreateTopic("t", 2))
    d = env.bus.execute(c.Fetch([fp("t", 0), fp("t", 1)], max_wait_ms=5000, min_bytes=1))
    assert not d.called
    assert env.bus.parked == 1
    assert len(env.waiters("t", 0)) == len(env.waiters("t", 1)) == 1
    env.clock.advance(1)
    assert not d.called
    env.produce("t", [b"hello"], partition=1)          # any producer, any partition
    p0, p1 = fired(d)
    assert (p0.batches, p0.high_watermark) == ([], 0)
    assert [env.bus.decode(b).values for b in p1.batches] == [[b"hello"]]
    assert p1.high_watermark == 1
    assert env.bus.parked == 0
    assert env.clock.getDelayedCalls() == []
    assert env.waiters("t", 0) == env.waiters("t", 1) == []


def test_fetch_answers_at_once_when_there_is_data(env):
    env.produce("t", [b"x"])
    d = env.bus.execute(c.Fetch([fp("t")], max_wait_ms=5000))
    assert [len(b.payload) > 0 for b in fired(d)[0].batches] == [True]
    assert env.bus.parked == 0 and env.clock.getDelayedCalls() == []
    # no wait asked: an empty answer at once
    [part] = env.run(c.Fetch([fp("t", offset=1)]))
    assert part.batches == [] and part.high_watermark == 1


def test_fetch_times_out_empty(env):
    env.produce("t", [b"old"])
    d = env.bus.execute(c.Fetch([fp("t", offset=1)], max_wait_ms=300))
    env.clock.advance(0.299)
    assert not d.called
    env.clock.advance(0.001)
    [part] = fired(d)
    assert (part.error, part.batches, part.high_watermark, part.offset) == (None, [], 1, 1)
    assert env.bus.parked == 0
    assert env.clock.getDelayedCalls() == []
    assert env.waiters("t") == []


def test_fetch_min_bytes(env):
    env.run(c.CreateTopic("t", 2))
    d = env.bus.execute(c.Fetch([fp("t", 0), fp("t", 1)], max_wait_ms=5000, min_bytes=300))
    env.produce("t", [b"s" * 10], partition=0)
    assert not d.called                              # about 20 stored bytes: not enough
    assert env.bus.parked == 1
    env.produce("t", [b"m" * 100], partition=1)
    assert not d.called
    env.produce("t", [b"b" * 200], partition=0)     # now over 300 in all
    p0, p1 = fired(d)
    assert [env.bus.decode(b).values[0][:1] for b in p0.batches] == [b"s", b"b"]
    assert [env.bus.decode(b).values[0][:1] for b in p1.batches] == [b"m"]
    assert p0.payload_bytes + p1.payload_bytes >= 300
    assert env.bus.parked == 0 and env.clock.getDelayedCalls() == []


def test_fetch_min_bytes_not_reached_answers_what_there_is_at_timeout(env):
    env.run(c.CreateTopic("t"))
    d = env.bus.execute(c.Fetch([fp("t")], max_wait_ms=1000, min_bytes=10_000))
    env.produce("t", [b"small"])
    env.clock.advance(1)
    [part] = fired(d)
    assert [env.bus.decode(b).values for b in part.batches] == [[b"small"]]


def test_fetch_errors_answer_at_once(env):
    env.produce("t", [b"x"])
    d = env.bus.execute(c.Fetch([fp("t", offset=1), fp("t", 3)], max_wait_ms=5000))
    ok, bad = fired(d)
    assert ok.error is None and isinstance(bad.error, UnknownPartition)
    [part] = fired(env.bus.execute(c.Fetch([fp("t", offset=-1)], max_wait_ms=5000)))
    assert isinstance(part.error, OffsetOutOfRange)
    [part] = fired(env.bus.execute(c.Fetch([fp("missing")], max_wait_ms=5000)))
    assert isinstance(part.error, UnknownTopic)
    assert env.bus.parked == 0 and env.clock.getDelayedCalls() == []


def test_cancelling_a_parked_fetch_forgets_it(env):
    env.run(c.CreateTopic("t", 2))
    d = env.bus.execute(c.Fetch([fp("t", 0), fp("t", 1)], max_wait_ms=5000))
    assert env.bus.parked == 1 and len(env.clock.getDelayedCalls()) == 1
    d.cancel()
    assert isinstance(failure_of(d), defer.CancelledError)
    assert env.bus.parked == 0
    assert env.clock.getDelayedCalls() == []
    assert env.waiters("t", 0) == env.waiters("t", 1) == []
    env.produce("t", [b"late"])                      # nothing is woken, nothing breaks
    env.clock.advance(10)
    assert env.bus.parked == 0


def test_parked_fetch_does_not_busy_loop(env):
    env.run(c.CreateTopic("t", 2))
    reads = []
    real_read = env.store.read

    def counting_read(*args, **kw):
        reads.append(args)
        return real_read(*args, **kw)
    env.store.read = counting_read
    d = env.bus.execute(c.Fetch([fp("t", 0), fp("t", 1)], max_wait_ms=10_000, min_bytes=10_000))
    assert len(reads) == 2                            # one look at each partition
    for _ in range(100):
        env.clock.advance(0.05)
    assert len(reads) == 2                            # time alone reads nothing
    for i in range(5):
        env.produce("t", [b"x"], partition=i % 2)
    # each append wakes the fetch once, and it looks at its two partitions again
    assert len(reads) == 2 + 5 * 2
    env.clock.advance(10)
    assert len(reads) == 2 + 5 * 2 + 2
    [p0, p1] = fired(d)
    assert len(p0.batches) == 3 and len(p1.batches) == 2


def test_parked_fetch_naming_a_partition_twice(env):
    env.run(c.CreateTopic("t"))
    d = env.bus.execute(c.Fetch([fp("t"), fp("t")], max_wait_ms=5000))
    assert len(env.waiters("t")) == 2
    # the append that wakes it succeeds, and the fetch answers once
    assert env.produce("t", [b"x"]).base_offset == 0
    a, b = fired(d)
    assert len(a.batches) == len(b.batches) == 1
    assert env.bus.parked == 0 and env.waiters("t") == []
    d = env.bus.execute(c.Fetch([fp("t", offset=1), fp("t", offset=1)], max_wait_ms=5000))
    env.run(c.SealPartition("t", 0))
    assert [p.batches for p in fired(d)] == [[], []]
    assert env.bus.parked == 0 and env.clock.getDelayedCalls() == []


def test_a_fetch_rearming_during_a_wake_is_not_lost(env):
    env.run(c.CreateTopic("t"))
    # A names the partition twice, B wants more bytes than one append brings:
    # the append wakes both; A's answer cancels its second waiter while B
    # re-arms on the same partition
    a = env.bus.execute(c.Fetch([fp("t"), fp("t")], max_wait_ms=5000))
    b = env.bus.execute(c.Fetch([fp("t")], max_wait_ms=5000, min_bytes=200))
    env.produce("t", [b"x"])
    assert a.called and not b.called
    assert len(env.waiters("t")) == 1
    env.produce("t", [b"y" * 300])
    assert [len(p.batches) for p in fired(b)] == [2]
    assert env.bus.parked == 0 and env.waiters("t") == []


def test_parked_fetch_on_a_sealed_partition_answers(env):
    env.produce("t", [b"x"])
    d = env.bus.execute(c.Fetch([fp("t", offset=1)], max_wait_ms=5000))
    assert not d.called
    env.run(c.SealPartition("t", 0))
    [part] = fired(d)                                 # nothing more can come
    assert (part.error, part.batches, part.high_watermark) == (None, [], 1)
    assert env.bus.parked == 0 and env.clock.getDelayedCalls() == []
    # and a new long-poll at the end of a sealed partition answers at once
    [part] = fired(env.bus.execute(c.Fetch([fp("t", offset=1)], max_wait_ms=5000)))
    assert part.batches == []
    assert env.bus.parked == 0 and env.clock.getDelayedCalls() == []


def test_fetch_waits_for_live_partitions_beside_a_sealed_one(env):
    env.run(c.CreateTopic("t", 2))
    env.run(c.SealPartition("t", 0))
    d = env.bus.execute(c.Fetch([fp("t", 0), fp("t", 1)], max_wait_ms=5000))
    assert not d.called and env.bus.parked == 1
    env.produce("t", [b"live"], partition=1)
    p0, p1 = fired(d)
    assert p0.batches == [] and len(p1.batches) == 1
    assert env.bus.parked == 0 and env.clock.getDelayedCalls() == []


def test_parked_fetch_on_a_deleted_topic_answers_the_error(env):
    env.run(c.CreateTopic("t"))
    d = env.bus.execute(c.Fetch([fp("t")], max_wait_ms=5000))
    env.run(c.DeleteTopic("t"))
    [part] = fired(d)
    assert isinstance(part.error, UnknownTopic)
    assert env.bus.parked == 0 and env.clock.getDelayedCalls() == []


# -- stream positions ---------------------------------------------------------------------------------


def test_read_position(env):
    env.produce("t", [b"abc", b"de"])                 # positions 0..11, 11..21
    env.produce("t", [b"fghij"])                      # 21..34
    part = env.run(c.ReadPosition("t", 0, 25, BIG))
    assert [b.stream_pos for b in part.batches] == [21]
    assert part.high_watermark == 3
    part = env.run(c.ReadPosition("t", 0, 0, BIG))
    assert [b.stream_pos for b in part.batches] == [0, 21]
    part = env.run(c.ReadPosition("t", 0, 34, BIG))
    assert part.batches == []
    assert isinstance(env.run(c.ReadPosition("nope", 0, 0, BIG)).error, UnknownTopic)


def test_read_position_long_poll(env):
    env.produce("t", [b"abc"])
    d = env.bus.execute(c.ReadPosition("t", 0, 11, BIG, max_wait_ms=2000))
    assert not d.called and len(env.waiters("t")) == 1
    env.clock.advance(1)
    env.produce("t", [b"more"])
    part = fired(d)
    assert [b.stream_pos for b in part.batches] == [11]
    assert env.bus.decode(part.batches[0]).values == [b"more"]
    assert env.clock.getDelayedCalls() == [] and env.waiters("t") == []


def test_read_position_times_out_and_cancels(env):
    env.run(c.CreateTopic("t"))
    d = env.bus.execute(c.ReadPosition("t", 0, 0, BIG, max_wait_ms=500))
    env.clock.advance(0.499)
    assert not d.called
    env.clock.advance(0.001)
    assert fired(d).batches == []
    assert env.clock.getDelayedCalls() == [] and env.waiters("t") == []
    d = env.bus.execute(c.ReadPosition("t", 0, 0, BIG, max_wait_ms=500))
    d.cancel()
    assert isinstance(failure_of(d), defer.CancelledError)
    assert env.clock.getDelayedCalls() == [] and env.waiters("t") == []
    # on a sealed partition there is nothing to wait for
    env.run(c.SealPartition("t", 0))
    d = env.bus.execute(c.ReadPosition("t", 0, 0, BIG, max_wait_ms=500))
    assert fired(d).batches == [] and env.clock.getDelayedCalls() == []


def test_lookup_position_event_topic(env):
    env.produce("t", [b"abc", b"", b"hello"])         # 0..11, 11..19, 19..32
    env.produce("t", [b"z"])                          # 32..41
    expect = {0: (0, 0), 10: (0, 0), 11: (1, 11), 18: (1, 11), 19: (2, 19), 31: (2, 19),
              32: (3, 32), 40: (3, 32), 41: (4, 41), 1000: (4, 41)}
    for position, answer in expect.items():
        assert env.run(c.LookupPosition("t", 0, position)) == answer, position


def test_lookup_position_bytes_topic(env):
    env.run(c.CreateTopic("b", 1, kind="bytes"))
    a = env.run(c.Produce("b", 0, RecordBatch([b"ab", b"", b"cde"]), kind="bytes"))
    assert a.stream_pos == 0
    assert env.run(c.Produce("b", 0, RecordBatch([b"fg"]), kind="bytes")).stream_pos == 5
    expect = {0: (0, 0), 1: (0, 0), 2: (2, 2), 4: (2, 2), 5: (3, 5), 6: (3, 5), 7: (4, 7)}
    for position, answer in expect.items():
        assert env.run(c.LookupPosition("b", 0, position)) == answer, position
    assert env.run(c.PartitionInfo("b", 0)).end_position == 7
    # the byte view of the same data
    part = env.run(c.ReadPosition("b", 0, 3, BIG))
    assert [b.stream_pos for b in part.batches] == [0, 5]
    # an event append to a byte topic is refused
    error = env.error(c.Produce("b", 0, RecordBatch([b"e"]), kind="event"))
    assert error.__class__.__name__ == "KindMismatch"


# -- list offsets -----------------------------------------------------------------------------------


def test_list_offsets(env):
    env.produce("t", [b"a", b"b", b"c"], timestamps=[100, 200, 300])
    env.produce("t", [b"d", b"e"], timestamps=[250, 400])
    env.produce("t", [b"f"], timestamps=[50])
    assert env.run(c.ListOffsets("t", 0, c.EARLIEST)) == 0
    assert env.run(c.ListOffsets("t", 0, c.LATEST)) == 6
    expect = {0: 0, 100: 0, 101: 1, 200: 1, 201: 2, 300: 2, 301: 4, 400: 4, 401: 6}
    for ts, offset in expect.items():
        assert env.run(c.ListOffsets("t", 0, ts)) == offset, ts
    assert isinstance(env.error(c.ListOffsets("t", 0, -3)), InvalidRequest)


def test_list_offsets_after_retention(tmp_path):
    env = Env(tmp_path, segment_bytes=200, retention_ms=1000)
    for i in range(6):
        env.produce("t", [b"v" * 50], timestamps=[10 * i])
    env.clock.advance(5)
    assert env.store.enforce_retention() > 0
    start = env.store.offsets("t", 0).log_start
    assert 0 < start < 6
    assert env.run(c.ListOffsets("t", 0, c.EARLIEST)) == start
    assert env.run(c.ListOffsets("t", 0, 0)) == start
    assert env.run(c.ListOffsets("t", 0, c.LATEST)) == 6
    env.close()


# -- subscriptions ------------------------------------------------------------------------------------


@implementer(ISubscriber)
class Collector:
    def __init__(self, bus, hook=None):
        self.bus = bus
        self.records = []
        self.deliveries = 0
        self.errors = []
        self.hook = hook

    def deliver(self, subscription, batches, offset):
        self.deliveries += 1
        for batch in batches:
            self.records.extend((o, v) for o, _, _, v in self.bus.decode(batch).since(offset))
        if self.hook is not None:
            self.hook(self, subscription)

    def failed(self, subscription, error):
        self.errors.append(error)

    def offsets(self):
        return [o for o, _ in self.records]


def test_subscribe_backlog_then_live(env):
    for i in range(0, 20, 2):
        env.produce("t", [b"v%d" % i, b"v%d" % (i + 1)])
    first = []

    def while_catching_up(sink, sub):
        if sink.deliveries == 1:
            first.extend(sink.offsets())
        if sink.deliveries == 2:
            # appends while the backlog is still being read
            env.produce("t", [b"v20"])
            env.produce("t", [b"v21", b"v22"])
    sink = Collector(env.bus, while_catching_up)
    verifyObject(ISubscriber, sink)
    # a small chunk size: one batch per delivery, each on its own reactor turn
    sub = env.run(c.Subscribe("t", 0, 3, sink, max_bytes=1))
    assert sub in env.bus.subscriptions
    assert sink.records == []                          # delivered on a later turn
    assert len(env.clock.getDelayedCalls()) == 1
    env.drain()
    assert first == [3]                               # batch 2..3, from 3
    assert sink.deliveries == 10 - 1 + 2               # batches 2..18, then the two new ones
    assert sink.offsets() == list(range(3, 23))
    assert [v for _, v in sink.records] == [b"v%d" % i for i in range(3, 23)]
    assert len(env.waiters("t")) == 1                 # parked at the end
    # live
    env.produce("t", [b"v23"])
    env.drain()
    env.produce("t", [b"v24", b"v25"])
    env.produce("t", [b"v26"])
    env.drain()
    assert sink.offsets() == list(range(3, 27))
    assert sink.errors == []


def test_subscribe_start_clamps(env):
    env.produce("t", [b"a", b"b"])
    past = Collector(env.bus)
    env.run(c.Subscribe("t", 0, 100, past))
    env.drain()
    assert past.records == []
    env.produce("t", [b"c"])
    env.drain()
    assert past.records == [(2, b"c")]                # starts at the end, not at 100
    below = Collector(env.bus)
    env.run(c.Subscribe("t", 0, -5, below))
    env.drain()
    assert below.offsets() == [0, 1, 2]
    assert isinstance(env.error(c.Subscribe("nope", 0, 0, Collector(env.bus))), UnknownTopic)


def test_subscribe_pause_and_resume(env):
    env.produce("t", [b"a"])
    sink = Collector(env.bus)
    sub = env.run(c.Subscribe("t", 0, 0, sink))
    sub.pause()
    env.drain()
    assert sink.records == []
    sub.resume()
    env.drain()
    assert sink.offsets() == [0]
    # paused while parked at the tail
    sub.pause()
    env.produce("t", [b"b"])
    env.produce("t", [b"c"])
    env.drain()
    assert sink.offsets() == [0]
    sub.resume()
    env.drain()
    assert sink.offsets() == [0, 1, 2]
    # paused in the middle of a backlog (by its consumer's transport)
    for i in range(3, 10):
        env.produce("t", [b"%d" % i])

    def pause_after_two(sink, sub):
        if sink.deliveries == 2:
            sub.pause()
    sub2_sink = Collector(env.bus, pause_after_two)
    sub2 = env.run(c.Subscribe("t", 0, 0, sub2_sink, max_bytes=1))
    env.drain()
    assert sub2_sink.offsets() == [0, 1]
    assert env.clock.getDelayedCalls() == [] and len(env.waiters("t")) == 1
    env.clock.advance(60)
    assert sub2_sink.offsets() == [0, 1]
    sub2.resume()
    env.drain()
    assert sub2_sink.offsets() == list(range(10))


def test_subscribe_cancel(env):
    env.produce("t", [b"a"])
    sink = Collector(env.bus)
    sub = env.run(c.Subscribe("t", 0, 0, sink))
    env.drain()
    assert len(env.waiters("t")) == 1
    sub.cancel()
    assert env.waiters("t") == []
    assert sub not in env.bus.subscriptions
    env.produce("t", [b"b"])
    env.drain()
    assert sink.offsets() == [0]
    assert sink.errors == []
    # cancelled before its first step
    other = Collector(env.bus)
    sub = env.run(c.Subscribe("t", 0, 0, other))
    sub.cancel()
    env.drain()
    assert other.records == [] and env.clock.getDelayedCalls() == []


def test_subscribe_below_log_start_after_retention(tmp_path):
    env = Env(tmp_path, segment_bytes=200, retention_ms=1000)
    sink = Collector(env.bus)
    for i in range(6):
        env.produce("t", [b"%d" % i * 50])
    paused = Collector(env.bus)
    sub = env.run(c.Subscribe("t", 0, 0, paused))
    sub.pause()                                       # stopped before reading anything
    env.clock.advance(5)
    assert env.store.enforce_retention() > 0
    start = env.store.offsets("t", 0).log_start
    assert start > 0
    env.run(c.Subscribe("t", 0, 0, sink))
    env.drain()
    assert sink.offsets() == list(range(start, 6))
    sub.resume()                                      # retention passed it: it skips ahead
    env.drain()
    assert paused.offsets() == list(range(start, 6))
    assert paused.errors == []
    env.close()


def test_subscription_fails_when_the_topic_is_deleted(env):
    env.produce("t", [b"a"])
    sink = Collector(env.bus)
    sub = env.run(c.Subscribe("t", 0, 0, sink))
    env.drain()
    env.run(c.DeleteTopic("t"))
    assert len(sink.errors) == 1 and isinstance(sink.errors[0], UnknownTopic)
    assert sub not in env.bus.subscriptions and sub.cancelled
    env.drain()
    assert len(sink.errors) == 1


def test_subscription_on_a_sealed_partition_goes_idle(env):
    env.produce("t", [b"a"])
    sink = Collector(env.bus)
    env.run(c.Subscribe("t", 0, 0, sink))
    env.drain()
    env.run(c.SealPartition("t", 0))
    env.drain()
    assert sink.offsets() == [0] and sink.errors == []
    assert env.clock.getDelayedCalls() == [] and env.waiters("t") == []


# -- groups ---------------------------------------------------------------------------------------


def test_committed_offsets(env):
    env.run(c.CreateTopic("t", 2))
    env.run(c.CreateTopic("u", 1))
    assert env.run(c.FetchCommittedOffset("g", "t", 0)) is None
    env.run(c.CommitOffset("g", "t", 0, 5, "meta"))
    env.run(c.CommitOffset("g", "t", 1, 7))
    env.run(c.CommitOffset("h", "u", 0, 1))
    env.run(c.CommitOffset("g", "t", 0, 6, "meta2"))   # replaces
    assert env.run(c.FetchCommittedOffset("g", "t", 0)) == (6, "meta2")
    assert env.run(c.FetchCommittedOffset("g", "t", 1)) == (7, None)
    assert env.run(c.FetchCommittedOffset("h", "t", 0)) is None
    assert env.run(c.ListGroups()) == ["g", "h"]
    assert env.run(c.GroupOffsets("g")) == {("t", 0): (6, "meta2"), ("t", 1): (7, None)}
    assert env.run(c.GroupOffsets("none")) == {}
    assert isinstance(env.error(c.CommitOffset("g", "nope", 0, 1)), UnknownTopic)
    assert isinstance(env.error(c.CommitOffset("g", "t", 2, 1)), UnknownPartition)
    assert isinstance(env.error(c.CommitOffset("g", "t", 0, -1)), InvalidRequest)
    assert isinstance(env.error(c.FetchCommittedOffset("g", "nope", 0)), UnknownTopic)
    assert isinstance(env.error(c.FetchCommittedOffset("g", "t", 2)), UnknownPartition)
    assert env.run(c.FetchCommittedOffset("g", "t", 0)) == (6, "meta2")
    assert "nope" not in env.store.topic_names()


# -- metadata -------------------------------------------------------------------------------------


def test_metadata(tmp_path):
    env = Env(tmp_path, topics=TopicsConfig(default_partitions=4))
    assert env.run(c.Metadata()) == []
    env.run(c.CreateTopic("b", 2))
    env.run(c.CreateTopic("a", 1))
    answer = env.run(c.Metadata())
    assert [(m.name, m.info.partitions, m.error) for m in answer] == [("a", 1, None),
                                                                     ("b", 2, None)]
    answer = env.run(c.Metadata(["b", "missing"]))
    assert answer[0].info.partitions == 2
    assert answer[1].info is None and isinstance(answer[1].error, UnknownTopic)
    assert "missing" not in env.store.topic_names()
    answer = env.run(c.Metadata(["missing", "a", "bad/name"], auto_create=True))
    assert [m.name for m in answer] == ["missing", "a", "bad/name"]
    assert (answer[0].info.partitions, answer[0].error) == (4, None)
    assert answer[1].info.partitions == 1
    assert isinstance(answer[2].error, InvalidTopicName)
    assert env.store.topic_names() == ["a", "b", "missing"]
    env.close()


def test_metadata_auto_create_needs_the_config_switch(tmp_path):
    env = Env(tmp_path, topics=TopicsConfig(auto_create=False))
    [m] = env.run(c.Metadata(["x"], auto_create=True))
    assert isinstance(m.error, UnknownTopic)
    assert env.store.topic_names() == []
    env.close()


# -- tables through the bus -------------------------------------------------------------------------


def test_table_commands(env):
    env.run(c.TableCreate("tb"))
    assert env.run(c.TableUpdate("tb", [(b"k", b"v", -1)])) == [0]
    assert env.run(c.TableRead("tb", [b"k", b"z"])) == [(b"v", 0), None]
    assert env.run(c.TableEntries("tb", 0, 10)) == ([(b"k", b"v", 0)], 1)
    env.run(c.TableRemove("tb", [(b"k", 0)]))
    assert env.run(c.TableRead("tb", [b"k"])) == [None]
    env.run(c.TableDelete("tb", must_be_empty=True))
    assert env.error(c.TableRead("tb", [b"k"])).__class__.__name__ == "UnknownTable"
