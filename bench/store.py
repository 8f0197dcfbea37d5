"""Store benchmarks: appends straight into ``LogStore``, no network, no bus.

Each scenario runs ``producers`` concurrent producers; each keeps one append
in flight and sends the next when its acknowledgement (durability under the
policy) arrives. The payload is pre-encoded once, so only the store is
measured.
"""
import shutil
import tempfile
import time

from twisted.internet import defer

from bench.table import median_of, print_table
from gateway.records import NEUTRAL, RecordBatch, encode_neutral
from storage import LogStore, StoreSettings


def make_payload(records, size):
    values = [bytes([i % 251]) * size for i in range(records)]
    return encode_neutral(RecordBatch(values), 0)


@defer.inlineCallbacks
def append_scenario(reactor, fsync, batch, size=100, producers=1, seconds=2.0):
    """Returns (records/s, MB/s of values) for one run."""
    path = tempfile.mkdtemp(prefix="gw-bench-")
    store = LogStore(StoreSettings(path=path, fsync=fsync), reactor)
    try:
        store.open()
        yield store.create_topic("bench", 1)
        payload, first_ts, max_ts, value_bytes, _ = make_payload(batch, size)
        deadline = time.perf_counter() + seconds
        counts = [0]

        if fsync == "never":
            # Acks are immediate: a tight loop measures the store, not Deferred chains.
            started = time.perf_counter()
            n = 0
            append = store.append
            while True:
                for _ in range(1000):
                    append("bench", 0, NEUTRAL, payload, batch, first_ts, max_ts, value_bytes)
                n += 1000
                if time.perf_counter() >= deadline:
                    break
            elapsed = time.perf_counter() - started
            records = n * batch
        else:
            done = defer.Deferred()
            running = [producers]
            started = time.perf_counter()

            def produce(_=None):
                if time.perf_counter() >= deadline:
                    running[0] -= 1
                    if running[0] == 0:
                        done.callback(None)
                    return
                counts[0] += 1
                store.append("bench", 0, NEUTRAL, payload, batch, first_ts, max_ts,
                             value_bytes).addCallback(produce)
            for _ in range(producers):
                produce()
            yield done
            elapsed = time.perf_counter() - started
            records = counts[0] * batch
        return records / elapsed, records * size / elapsed / 1e6
    finally:
        yield store.close()
        shutil.rmtree(path, ignore_errors=True)


@defer.inlineCallbacks
def table(reactor, runs, seconds):
    rows = []
    base = {}
    for batch in (1, 100):
        for fsync, producers in (("never", 1), ("interval", 32), ("always", 32),
                                 ("always", 1)):
            if batch == 100 and producers == 1 and fsync == "always":
                continue
            rps, mbps = yield median_of(runs, lambda: append_scenario(
                reactor, fsync, batch, producers=producers, seconds=seconds))
            if fsync == "never":
                base[batch] = rps
            rows.append((f"store append {batch} x 100 B", f"fsync {fsync}", producers,
                         rps, mbps, rps / base[batch]))
    print_table("Store appends (records/s; ratio to fsync never, same batch size)",
                ("scenario", "policy", "producers", "records/s", "MB/s", "ratio"), rows)
