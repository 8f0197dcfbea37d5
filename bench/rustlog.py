"""RustLog over loopback: the gateway as a subprocess, the load from another.

Scenarios: produce with 1 and 100 records per request (100-byte records,
pipelined on 8 connections), and fetch of 64 KiB replies, each under
``fsync: never`` and the default ``interval``. Beside each figure: the ratio
to the raw-loopback baseline (``bench.echo`` answering canned replies of
the same size) measured in the same run.
"""
from twisted.internet import defer, threads

from bench.procs import Echo, Gateway, run_json


def load(port, *args):
    return run_json("bench.loadgen", *args, "--port", str(port))


def fetch_reply(records, size):
    values = ",".join("{\"offset\":%d,\"payload\":[%s]}" % (i, ",".join(["7"] * size))
                      for i in range(records))
    return ('{"Fetch":{"records":[%s],"next_offset":%d}}' % (values, records)).encode()


def produce_reply(records):
    return ('{"Produce":{"offsets":[%s]}}' % ",".join(str(1000000 + i)
                                                     for i in range(records))).encode()


def measure(runs, seconds):
    """Blocking: every scenario, ``runs`` times; returns table rows."""
    import statistics
    fetch_bytes = 64 * 1024
    per_fetch = fetch_bytes // 100
    scenarios = [
        ("produce 1 x 100 B", ["produce", "--records", "1"], produce_reply(1), 1),
        ("produce 100 x 100 B", ["produce", "--records", "100"], produce_reply(100), 100),
        ("fetch 64 KiB", ["fetch", "--fetch-bytes", str(fetch_bytes),
                          "--fetch-range", "200000", "--window", "4"],
         fetch_reply(per_fetch, 100), per_fetch),
    ]
    common = ["--seconds", str(seconds), "--connections", "8"]
    rows = []
    for name, args, reply, records in scenarios:
        base = []
        echo = Echo(reply)
        try:
            for _ in range(runs):
                r = load(echo.port, *args, *common, "--fixed-count", str(records))
                base.append(r["records_per_s"])
        finally:
            echo.stop()
        baseline = statistics.median(base)
        for fsync in ("never", "interval"):
            figures = []
            for _ in range(runs):
                gw = Gateway(fsync)
                try:
                    if args[0] == "fetch":
                        load(gw.port, "produce", "--records", "100", "--seconds", "2",
                             "--connections", "2", "--window", "8")
                    figures.append(load(gw.port, *args, *common))
                finally:
                    gw.stop()
            rps = statistics.median(f["requests_per_s"] for f in figures)
            recs = statistics.median(f["records_per_s"] for f in figures)
            rows.append((f"rustlog {name}", f"fsync {fsync}", rps, recs, recs * 100 / 1e6,
                         recs / baseline))
        rows.append((f"raw loopback {name}", "baseline", baseline / records, baseline,
                     baseline * 100 / 1e6, 1.0))
    return rows


@defer.inlineCallbacks
def table(reactor, runs, seconds):
    from bench.table import print_table
    rows = yield threads.deferToThread(measure, runs, seconds)
    print_table("RustLog over loopback, 8 connections pipelining (ratio to raw loopback)",
                ("scenario", "policy", "requests/s", "records/s", "MB/s", "ratio"), rows)
