"""The cross-dialect conformance matrix (issue 7): every ordered pair of the
five dialects, same-dialect included, on one topic per cell.

In each cell a producer of the first dialect writes one mixed batch: an
empty value, a 1-byte one, one with every byte value, 64 KiB of random
bytes, the largest record the gateway takes (``limits.max_record_bytes``,
1 MiB: the binding limit, since every dialect's frame is larger at the
default settings) and a line of text; with keys (some absent, one empty,
one of TANK's maximum 255 bytes) and timestamps where the writer has them.
A consumer of the second dialect reads it back and must see the same
values in the same order, the keys and timestamps where both sides carry
them, and each record at its position as DESIGN.md maps it: offset
(Kafka, RustLog), seq = offset + 1 (TANK), DATA offset = offset + 1 (Figg),
byte position Σ(8 + len) (Pravega).

Then the consumer waits at the tail (a TANK or Kafka long-poll, a Pravega
read, a live Figg subscription; RustLog, which has no long-poll, fetches
once after the write) and the producer writes one more record: the waiting
consumer must be woken by it, well before its own wait would end.

One gateway (``gateway run`` in a subprocess, with the shipped defaults
except for port 0) serves all 25 cells; the test process runs the Twisted
clients, and kafka-python in the reactor's thread pool.
"""
import random
import shutil
import tempfile
import time

from twisted.internet import defer, reactor
from twisted.trial.unittest import TestCase

from tests.cross_support import (
    DIALECTS, KEYED, TIMESTAMPED, WAKE_DEADLINE, Seen, native_positions, open_side, sleep,
    summary)
from tests.support import GatewayProcess

MAX_RECORD_BYTES = 1048576

VALUES = [
    b"",
    b"\x01",
    bytes(range(256)),
    random.Random(64).randbytes(64 * 1024),
    bytes(range(256)) * (MAX_RECORD_BYTES // 256),
    b"one topic, five dialects",
]
KEYS = [None, b"", b"k2", b"\x00\xff" * 20, None, b"K" * 255]
TIMESTAMPS = [1700000000000 + 1000 * i for i in range(len(VALUES))]
WAKE = (b"wake-up", b"wake-key", 1700000099000)

CONFIG = """
storage: {path: ./data}
listeners:
  - {dialect: rustlog, endpoint: "tcp:0:interface=127.0.0.1"}
  - {dialect: tank,    endpoint: "tcp:0:interface=127.0.0.1"}
  - {dialect: kafka,   endpoint: "tcp:0:interface=127.0.0.1"}
  - {dialect: figg,    endpoint: "tcp:0:interface=127.0.0.1"}
  - {dialect: pravega, endpoint: "tcp:0:interface=127.0.0.1"}
"""

#: wake-up latency per cell (ms): from the write's start to the waiting
#: consumer's delivery
LATENCY_MS = {}


def expected(producer, consumer, values, keys, timestamps, first_offset=0, first_position=0,
             received=None):
    """What ``consumer`` must see of ``values`` written by ``producer``.

    Keys: only when both sides carry them. Timestamps: a TANK reader sees
    the writer's where it set them, else the gateway's receive time (checked
    apart, as a range: ``received``); a Kafka reader sees none, because the
    gateway answers Fetch v0/v1 with magic-0 messages; the others have none.
    """
    positions = native_positions(consumer, values, first_offset, first_position)
    both_keyed = producer in KEYED and consumer in KEYED
    out = []
    for i, value in enumerate(values):
        key = keys[i] if both_keyed else None
        if consumer == "tank":
            ts = timestamps[i] if producer in TIMESTAMPED else received
        else:
            ts = None
        out.append(Seen(positions[i], key, ts, value))
    return out


class ConformanceMatrix(TestCase):
    """One generated test per ordered pair of dialects (see the module end)."""

    timeout = 60

    @classmethod
    def setUpClass(cls):
        cls.directory = tempfile.mkdtemp(prefix="gateway-matrix-")
        cls.gateway = GatewayProcess(cls.directory, CONFIG)
        cls.ports = cls.gateway.start()

    @classmethod
    def tearDownClass(cls):
        code = cls.gateway.stop()
        shutil.rmtree(cls.directory, ignore_errors=True)
        assert code == 0, f"gateway exited with {code}"
        # shown with ``pytest -s``: the table of the closing note
        print("\nwake-up latency (ms), producer down, consumer across")
        print("".join(f"{c:>9}" for c in ("",) + DIALECTS))
        for p in DIALECTS:
            print(f"{p:>9}" + "".join(f"{LATENCY_MS[(p, c)]:9.1f}" if (p, c) in LATENCY_MS
                                      else f"{'-':>9}" for c in DIALECTS))

    def check(self, producer, consumer, got, values, keys, timestamps, before, after,
              **where):
        """Compare ``got`` with ``expected``; receive times must fall between
        ``before`` and ``after`` (ms, the writer's wall clock; same host)."""
        want = expected(producer, consumer, values, keys, timestamps, **where)
        if consumer == "tank" and producer not in TIMESTAMPED:
            for seen in got:
                self.assertTrue(before - 1000 <= seen.timestamp <= after + 1000,
                                f"receive time {seen.timestamp} not in [{before}, {after}]")
            got = [s._replace(timestamp=None) for s in got]
        self.assertEqual(summary(got), summary(want))

    @defer.inlineCallbacks
    def run_cell(self, producer_name, consumer_name):
        topic = f"matrix-{producer_name}-{consumer_name}"
        producer = yield open_side(self, producer_name, self.ports)
        consumer = yield open_side(self, consumer_name, self.ports)
        keys = KEYS if producer_name in KEYED else None
        timestamps = TIMESTAMPS if producer_name in TIMESTAMPED else None
        n = len(VALUES)

        before = int(time.time() * 1000)
        acked = yield producer.produce(topic, VALUES, keys, timestamps)
        after = int(time.time() * 1000)
        # what the producer's own dialect says about where the batch went
        if producer_name in ("rustlog", "kafka"):
            self.assertEqual(acked, list(range(n)))
        elif producer_name == "tank":
            self.assertEqual((yield producer.produce_acked(topic, VALUES)), n)
        elif producer_name == "pravega":
            self.assertEqual((yield producer.produce_acked(topic, VALUES)),
                             sum(8 + len(v) for v in VALUES))

        got = yield consumer.read(topic, n)
        self.check(producer_name, consumer_name, got, VALUES, keys, timestamps, before, after)

        # a consumer waiting at the tail is woken by the producer's write
        waiting = consumer.wait_tail(topic)
        yield sleep(0.05)
        self.assertFalse(waiting.called, "the consumer did not wait at the tail")
        value, key, ts = WAKE
        before = int(time.time() * 1000)
        started = time.perf_counter()
        yield producer.produce(topic, [value], [key] if keys else None,
                               [ts] if timestamps else None)
        consumer.written()
        woken = yield waiting.addTimeout(WAKE_DEADLINE, reactor)
        LATENCY_MS[(producer_name, consumer_name)] = (time.perf_counter() - started) * 1000
        after = int(time.time() * 1000)
        self.check(producer_name, consumer_name, woken, [value], [key], [ts], before, after,
                   first_offset=n, first_position=sum(8 + len(v) for v in VALUES))


def _cell(producer, consumer):
    def test(self):
        return self.run_cell(producer, consumer)
    test.__name__ = f"test_{producer}_to_{consumer}"
    test.__doc__ = f"{producer} writes, {consumer} reads and is woken at the tail"
    return test


for _producer in DIALECTS:
    for _consumer in DIALECTS:
        _test = _cell(_producer, _consumer)
        setattr(ConformanceMatrix, _test.__name__, _test)
del _producer, _consumer, _test
