"""Figg over loopback: the gateway as a subprocess, the load from another
(``bench.figg_load``).

Scenarios (issue 5), 100-byte messages on topic ``bench``:

- publish, window 256, on 1 connection (one SDK client) and on 8, under
  ``fsync: never`` and ``interval``: ACKs per second;
- DATA pushed from a backlog to 1 and to 10 subscribers attached from offset
  0 (``fsync: never``): the backlog stored as Figg publishes store it
  (batches of 256, one per read of a pipelining client) and as one record
  per batch (what single-record produces of other dialects leave);
- live fan-out: one publisher at full window, 1 and 10 subscribers
  attached at the tail: ACKs and DATA per second;
- publish-to-DATA latency at a fixed 5,000 messages a second, p50 and p99,
  under ``fsync: never`` and ``interval``.

Beside each figure: the ratio to the raw-loopback baseline
(``bench.figg_echo``: a Twisted server with the same framing that ACKs at
once, relays PUBLISH as DATA and streams a canned backlog) measured in the
same run with the same load generator. For throughput a ratio of 1 means as
fast as the bare transport; for latency it is gateway p99 over baseline p99.
"""
import shutil
import statistics
import tempfile

from twisted.internet import defer, threads

from bench.procs import Gateway, ServerProcess, run_json
from bench.table import print_table
from gateway.records import NEUTRAL, RecordBatch, encode_neutral
from storage import LogStore, StoreSettings

SIZE = 100
WINDOW = 256
RATE = 5000


def start_server(fsync=None, data=None, backlog=0):
    """The gateway (a Figg listener on ``data``, or on a fresh directory) or,
    with no ``fsync``, the ``bench.figg_echo`` baseline."""
    if fsync is None:
        return ServerProcess("bench.figg_echo", "--backlog", str(backlog), "--size", str(SIZE),
                             prefix="figg-echo-", quiet=True)
    return Gateway(fsync, ("figg",), data)


def load(port, *args):
    return run_json("bench.figg_load", *args, "--port", str(port))


def preload(records, per_batch):
    """A data directory whose topic ``bench`` holds ``records`` values of
    SIZE bytes (a multiple of ``per_batch``) in batches of ``per_batch``,
    written straight into the store."""
    from twisted.internet import reactor
    path = tempfile.mkdtemp(prefix="figg-backlog-")
    store = LogStore(StoreSettings(path=path, fsync="never"), reactor)
    store.open()
    store.create_topic("bench", 1)
    payload, first_ts, max_ts, value_bytes, _ = encode_neutral(
        RecordBatch([b"b" * SIZE] * per_batch), store.now_ms())
    for _ in range(records // per_batch):
        store.append("bench", 0, NEUTRAL, payload, per_batch, first_ts, max_ts, value_bytes)
    store.close()
    return path


def on_server(runs, server_args, run, key):
    """Median of ``runs`` runs, each on a fresh server."""
    figures = []
    for _ in range(runs):
        server = start_server(**server_args)
        try:
            figures.append(run(server.port)[key])
        finally:
            server.stop()
    return statistics.median(figures)


def measure(runs, seconds):
    """Blocking: every scenario; returns (throughput rows, latency rows)."""
    rows = []
    common = ["--seconds", str(seconds), "--size", str(SIZE)]

    for connections in (1, 8):
        name = f"publish {SIZE} B, window {WINDOW}, {connections} conn"
        args = ["publish", "--connections", str(connections), "--window", str(WINDOW), *common]
        base = on_server(runs, {}, lambda port, args=args: load(port, *args), "messages_per_s")
        for fsync in ("never", "interval"):
            rate = on_server(runs, {"fsync": fsync}, lambda port, args=args: load(port, *args),
                             "messages_per_s")
            rows.append((f"figg {name}", f"fsync {fsync}", rate, rate * SIZE / 1e6,
                         rate / base))
        rows.append((f"raw loopback {name}", "baseline", base, base * SIZE / 1e6, 1.0))

    # Enough backlog for about `seconds` at the target rate.
    backlog = max(100000, int(300000 * seconds)) // (256 * 5) * (256 * 5)
    for per_batch, label in ((256, "batches of 256"), (1, "1 record per batch")):
        data = preload(backlog, per_batch)
        try:
            for subscribers in (1, 10):
                count = backlog if subscribers == 1 else backlog // 5
                args = ["subscribe", "--connections", str(subscribers), "--count", str(count)]
                rate = on_server(runs, {"fsync": "never", "data": data},
                                 lambda port, args=args: load(port, *args), "messages_per_s")
                base = on_server(runs, {"backlog": count}, lambda port, args=args: load(port, *args),
                                 "messages_per_s")
                name = f"backlog -> {subscribers} sub, {label}"
                rows.append((f"figg {name}", "fsync never", rate, rate * SIZE / 1e6,
                             rate / base))
                if per_batch == 1:
                    rows.append((f"raw loopback backlog -> {subscribers} sub", "baseline",
                                 base, base * SIZE / 1e6, 1.0))
        finally:
            shutil.rmtree(data, ignore_errors=True)

    for subscribers in (1, 10):
        args = ["fanout", "--connections", str(subscribers), "--window", str(WINDOW), *common]
        for server_args, label in (({"fsync": "never"}, "fsync never"), ({}, "baseline")):
            figures = [None] * runs
            for i in range(runs):
                server = start_server(**server_args)
                try:
                    figures[i] = load(server.port, *args)
                finally:
                    server.stop()
            published = statistics.median(f["published_per_s"] for f in figures)
            delivered = statistics.median(f["delivered_per_s"] for f in figures)
            if label == "baseline":
                base = delivered
                rows.append((f"raw loopback live fan-out -> {subscribers} sub "
                             f"({published:,.0f} pub/s)", label, delivered,
                             delivered * SIZE / 1e6, 1.0))
            else:
                gateway = (published, delivered)
        published, delivered = gateway
        rows.append((f"figg live fan-out -> {subscribers} sub ({published:,.0f} pub/s)",
                     "fsync never", delivered, delivered * SIZE / 1e6, delivered / base))

    latency_rows = []
    args = ["latency", "--rate", str(RATE), *common]
    base = None
    for server_args, label in (({}, "baseline"), ({"fsync": "never"}, "fsync never"),
                               ({"fsync": "interval"}, "fsync interval")):
        figures = []
        for _ in range(runs):
            server = start_server(**server_args)
            try:
                figures.append(load(server.port, *args))
            finally:
                server.stop()
        p50 = statistics.median(f["p50_ms"] for f in figures)
        p99 = statistics.median(f["p99_ms"] for f in figures)
        if base is None:
            base = p99
        who = "raw loopback relay" if label == "baseline" else "figg"
        latency_rows.append((f"{who} publish -> DATA at {RATE:,}/s", label, p50, p99,
                             p99 / base))
    return rows, latency_rows


@defer.inlineCallbacks
def table(reactor, runs, seconds):
    rows, latency_rows = yield threads.deferToThread(measure, runs, seconds)
    print_table("Figg over loopback, 100 B messages (ratio to raw loopback, same run)",
                ("scenario", "policy", "messages/s", "MB/s", "ratio"), rows)
    print_table("Figg publish -> DATA latency (ratio: p99 / raw loopback p99)",
                ("scenario", "policy", "p50 ms", "p99 ms", "ratio"), latency_rows)
