"""One producer and one consumer per dialect, with a single shape, for the
cross-dialect tests (test_cross_*.py).

Every side is driven from the reactor thread and answers Deferreds, so one
test body runs any pair of dialects. RustLog, TANK, Figg and Pravega use the
project's Twisted clients; Kafka uses kafka-python, the real client, whose
blocking calls run in the reactor's thread pool (one call at a time per
object, so kafka-python's objects are never used concurrently).

What a consumer reports is ``Seen(position, key, timestamp, value)`` with
the position as its dialect names it: the offset (Kafka, RustLog), the seq
= offset + 1 (TANK), the Figg DATA offset = offset + 1 and the Pravega byte
position Σ(8 + len(value)) of the records before it. Fields a dialect does
not carry are None.
"""
import hashlib
import os
import time
from typing import NamedTuple, Optional

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from twisted.internet import defer, reactor, task, threads

from plugins.figg.client import FiggClient
from plugins.pravega.client import EventReader, EventWriter, connect as pravega_connect
from plugins.rustlog.client import connect as rustlog_connect
from plugins.tank.client import connect as tank_connect
from tests.support import gateway_config, start_gateway

HOST = "127.0.0.1"
DIALECTS = ("rustlog", "tank", "kafka", "figg", "pravega")
#: dialects whose records carry keys, and whose producers set timestamps
KEYED = frozenset({"tank", "kafka"})
TIMESTAMPED = frozenset({"tank", "kafka"})
#: how long a consumer parks at the tail: far above any wake-up we accept
TAIL_WAIT_MS = 20000
#: the longest a woken consumer may take to deliver, in the tests (seconds);
#: a woken one takes milliseconds, a timed-out one TAIL_WAIT_MS
WAKE_DEADLINE = 10.0


class Seen(NamedTuple):
    position: int
    key: Optional[bytes]
    timestamp: Optional[int]
    value: bytes


def sleep(seconds):
    return task.deferLater(reactor, seconds, lambda: None)


def pravega_segment(topic, partition=0, scope="gateway"):
    """The scoped segment name of a topic without ``_`` (README, "Escaping")."""
    return f"{scope}/{topic}/{partition}.#epoch.0"


def native_positions(dialect, values, first_offset=0, first_position=0):
    """Where each of ``values`` (consecutive records from ``first_offset``,
    the first at Pravega byte ``first_position``) is, as ``dialect`` says."""
    if dialect in ("kafka", "rustlog"):
        return [first_offset + i for i in range(len(values))]
    if dialect in ("tank", "figg"):
        return [first_offset + i + 1 for i in range(len(values))]
    positions = []
    at = first_position
    for value in values:
        positions.append(at)
        at += 8 + len(value)
    return positions


def summary(seen):
    """Records as short comparable tuples: a mismatch in a 1 MiB value shows
    as a different digest, not as two megabytes of diff."""
    return [(s.position, s.key, s.timestamp, len(s.value),
             hashlib.blake2b(s.value, digest_size=6).hexdigest()) for s in seen]


class _Side:
    """One dialect's client for one test. ``open()`` connects; ``close()``
    releases everything (tests register it as a cleanup)."""

    name = None

    def __init__(self, ports, host=HOST):
        self.ports = ports
        self.host = host
        self.port = ports[self.name]

    def open(self):
        return defer.succeed(None)

    def close(self):
        return defer.succeed(None)

    def written(self):
        """Called after a write the consumer waits for: only RustLog, which
        has no long-poll, acts on it (its first fetch after the write)."""

    def produce_acked(self, topic, values):
        """Positions the producer's acknowledgement names, or None when the
        dialect's acknowledgement names none."""
        return defer.succeed(None)


class RustLogSide(_Side):
    name = "rustlog"

    @defer.inlineCallbacks
    def open(self):
        self.client = yield rustlog_connect(reactor, self.host, self.port)
        self.next = 0
        self._tail = None

    def close(self):
        return self.client.close()

    @defer.inlineCallbacks
    def produce(self, topic, values, keys=None, timestamps=None):
        offsets = yield self.client.produce(topic, 0, values)
        return offsets

    @defer.inlineCallbacks
    def read(self, topic, count, offset=0):
        seen = []
        while len(seen) < count:
            got = yield self.client.fetch(topic, 0, offset, max_bytes=8 << 20)
            if not got.records:
                raise AssertionError(f"rustlog: {topic} ends at {got.next_offset}, "
                                     f"{count - len(seen)} record(s) short")
            seen += [Seen(o, None, None, v) for o, v in got.records]
            offset = got.next_offset
        self.next = offset
        return seen[:count]

    @defer.inlineCallbacks
    def wait_tail(self, topic):
        """RustLog has no long-poll (DESIGN): at the tail a fetch answers
        nothing; the first fetch after the write returns the record."""
        got = yield self.client.fetch(topic, 0, self.next)
        if got.records:
            raise AssertionError(f"rustlog: records past the tail: {got.records!r}")
        self._tail = defer.Deferred()
        yield self._tail
        return (yield self.read(topic, 1, self.next))

    def written(self):
        tail, self._tail = self._tail, None
        tail.callback(None)


class TankSide(_Side):
    name = "tank"

    @defer.inlineCallbacks
    def open(self):
        self.client = yield tank_connect(reactor, self.host, self.port)
        self.next_seq = 1

    def close(self):
        return self.client.close()

    def produce(self, topic, values, keys=None, timestamps=None):
        return self.client.produce(topic, 0, values, keys=keys, timestamps=timestamps)

    @defer.inlineCallbacks
    def produce_acked(self, topic, values):
        """A TANK Produce acknowledgement names no position; DiscoverPartitions
        does: hwMark = the last assigned seq = the next offset."""
        [seqs] = yield self.client.discover_partitions(topic)
        return seqs.hw_mark

    @defer.inlineCallbacks
    def read(self, topic, count, seq=1, max_wait_ms=0):
        seen = []
        while len(seen) < count:
            got = yield self.client.fetch(topic, 0, seq, fetch_size=2 << 20,
                                          max_wait_ms=max_wait_ms)
            if not got.messages:
                raise AssertionError(f"tank: {topic} ends at hwMark {got.hw_mark}, "
                                     f"{count - len(seen)} message(s) short")
            seen += [Seen(m.seq, m.key, m.ts, m.value) for m in got.messages]
            seq = got.next_seq
        self.next_seq = seq
        return seen[:count]

    def wait_tail(self, topic):
        """A Consume of the next seq (hwMark + 1) parks until a write."""
        return self.read(topic, 1, self.next_seq, max_wait_ms=TAIL_WAIT_MS)


class FiggSide(_Side):
    name = "figg"

    @defer.inlineCallbacks
    def open(self):
        self.client = FiggClient(reactor, self.host, self.port)
        yield self.client.connect()
        self.seen = []
        self._want = None

    def close(self):
        return self.client.close()

    @defer.inlineCallbacks
    def produce(self, topic, values, keys=None, timestamps=None):
        """PUBLISH through the window; the last one's ACK acknowledges all
        (ACKs are cumulative)."""
        for value in values[:-1]:
            yield self.client.publish(topic, value)
        yield self.client.publish_blocking(topic, values[-1])

    def _on_message(self, message):
        self.seen.append(Seen(message.offset, None, None, message.data))
        if self._want is not None and len(self.seen) >= self._want[0]:
            _, d = self._want
            self._want = None
            d.callback(None)

    def _until(self, count):
        if len(self.seen) >= count:
            return defer.succeed(None)
        d = defer.Deferred()
        self._want = (count, d)
        return d

    @defer.inlineCallbacks
    def read(self, topic, count, offset=0):
        """ATTACH from ``offset`` (the log offset to start at); the
        subscription stays live for ``wait_tail``."""
        self.seen = []
        yield self.client.subscribe(topic, self._on_message, offset=offset)
        yield self._until(count)
        return list(self.seen[:count])

    @defer.inlineCallbacks
    def wait_tail(self, topic):
        """The live subscription is woken by the write."""
        start = len(self.seen)
        yield self._until(start + 1)
        return self.seen[start:start + 1]


class PravegaSide(_Side):
    name = "pravega"

    @defer.inlineCallbacks
    def open(self):
        self.proto = yield pravega_connect(reactor, self.host, self.port)
        self.writers = {}
        self.reader = None

    @defer.inlineCallbacks
    def close(self):
        for writer in self.writers.values():
            yield writer.close()
        yield self.proto.close()

    def _writer(self, topic):
        writer = self.writers.get(topic)
        if writer is None:
            writer = self.writers[topic] = EventWriter(
                reactor, lambda: pravega_connect(reactor, self.host, self.port),
                pravega_segment(topic))
        return writer

    def produce(self, topic, values, keys=None, timestamps=None):
        writer = self._writer(topic)
        for value in values:
            writer.write(value)
        return writer.flush()

    @defer.inlineCallbacks
    def produce_acked(self, topic, values):
        """The segment's write offset: the byte position after the last event."""
        info = yield self.proto.segment_info(pravega_segment(topic))
        return info.write_offset

    @defer.inlineCallbacks
    def read(self, topic, count, position=0):
        self.reader = EventReader(self.proto, pravega_segment(topic), position)
        seen = []
        while len(seen) < count:
            seen += [Seen(p, None, None, v) for p, v in (yield self.reader.read())]
        return seen[:count]

    @defer.inlineCallbacks
    def wait_tail(self, topic):
        """A read at the segment's tail parks until a write."""
        return [Seen(p, None, None, v) for p, v in (yield self.reader.read())]


class KafkaSide(_Side):
    """kafka-python 3 at its defaults, except for sizes: a 1 MiB record
    needs a larger ``max_request_size`` and fetch size than its 1 MiB
    defaults, and ``fetch_max_wait_ms`` is long so that a consumer parked at
    the tail is demonstrably woken by the write, not by its own timeout."""

    name = "kafka"

    def open(self):
        self.bootstrap = f"{self.host}:{self.port}"
        self.producer = None
        self.consumer = None
        return defer.succeed(None)

    def _run(self, fn, *args, **kwargs):
        return threads.deferToThread(fn, *args, **kwargs)

    @defer.inlineCallbacks
    def close(self):
        if self.producer is not None:
            yield self._run(self.producer.close, 10)
        if self.consumer is not None:
            yield self._run(self.consumer.close)

    def _produce(self, topic, values, keys, timestamps):
        if self.producer is None:
            self.producer = KafkaProducer(
                bootstrap_servers=self.bootstrap, max_request_size=4 << 20,
                batch_size=4 << 20, linger_ms=1000, request_timeout_ms=10000)
        futures = [self.producer.send(topic, value=value,
                                      key=None if keys is None else keys[i],
                                      timestamp_ms=None if timestamps is None else timestamps[i])
                   for i, value in enumerate(values)]
        # flush() sends the whole batch now instead of after linger_ms
        self.producer.flush(10)
        return [f.get(10).offset for f in futures]

    def produce(self, topic, values, keys=None, timestamps=None):
        return self._run(self._produce, topic, values, keys, timestamps)

    def _read(self, topic, count, offset, deadline):
        if self.consumer is None:
            self.consumer = KafkaConsumer(
                bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                max_partition_fetch_bytes=4 << 20, fetch_max_wait_ms=TAIL_WAIT_MS,
                request_timeout_ms=TAIL_WAIT_MS + 10000)
            self.consumer.assign([TopicPartition(topic, 0)])
        if offset is not None:
            self.consumer.seek(TopicPartition(topic, 0), offset)
        got = []
        end = time.monotonic() + deadline
        while len(got) < count and time.monotonic() < end:
            for records in self.consumer.poll(timeout_ms=200, max_records=count - len(got)
                                              ).values():
                got += records
        if len(got) < count:
            raise AssertionError(f"kafka: {len(got)} of {count} record(s) in {deadline} s")
        # ConsumerRecord.timestamp is None for magic-0 messages (Fetch v0/v1)
        return [Seen(r.offset, r.key, r.timestamp, r.value) for r in got]

    def read(self, topic, count, offset=0):
        return self._run(self._read, topic, count, offset, 30)

    def wait_tail(self, topic):
        """poll() from where the last read stopped: the fetch parks at the
        gateway until the write."""
        return self._run(self._read, topic, 1, None, WAKE_DEADLINE)


SIDES = {side.name: side for side in (RustLogSide, TankSide, KafkaSide, FiggSide, PravegaSide)}


@defer.inlineCallbacks
def start_all(testcase, **sections):
    """The gateway in-process with a listener of every dialect on port 0;
    answers ``(service, {dialect: port})``. ``sections`` as for
    ``tests.support.gateway_config``."""
    directory = testcase.mktemp()
    os.makedirs(directory)
    listeners = [{"dialect": d, "endpoint": f"tcp:0:interface={HOST}"} for d in DIALECTS]
    config = gateway_config(directory, listeners, **sections)
    service, ports = yield start_gateway(testcase, config)
    return service, ports


@defer.inlineCallbacks
def open_side(testcase, dialect, ports, host=HOST):
    """A connected side of ``dialect``, closed when the test ends."""
    side = SIDES[dialect](ports, host)
    yield side.open()
    testcase.addCleanup(side.close)
    return side
