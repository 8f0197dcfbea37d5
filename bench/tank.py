"""TANK over loopback: the gateway as a subprocess, the load from another
(``bench.tank_loadgen``).

Scenarios (issue 3): produce of pre-encoded bundles of 100 messages x 100 B,
uncompressed (under ``fsync: never`` and ``interval``) and Snappy; consume of
the same data in 64 KiB fetches, written by TANK (stored bundles passed
through) and written by RustLog (bundles the gateway encodes); and the CPU a
gateway spends with 100 consumers parked in long-poll. Message bytes are
random, so Snappy gains nothing and only costs. Beside each figure: the
ratio to the raw-loopback baseline (``bench.tank_echo`` answering canned
replies of the same size) measured in the same run.
"""
import statistics
import subprocess
import time

from twisted.internet import defer, threads

from bench.procs import PYTHON, Echo, Gateway, cpu_seconds, run_json
from plugins.tank import codec as c

FETCH_BYTES = 64 * 1024
PARKED = 100


def tank_load(port, *args):
    return run_json("bench.tank_loadgen", *args, "--port", str(port))


def canned_consume(fetch_bytes):
    """A Consume reply of plain 100 x 100 B bundles filling ``fetch_bytes``;
    returns (frame, messages)."""
    from bench.tank_loadgen import bundle_100
    parts, size, messages = [], 0, 0
    while True:
        bundle = bundle_100(messages, 100, False)
        piece = c.encode_varint(len(bundle)) + bundle
        if parts and size + len(piece) > fetch_bytes:
            break
        parts.append(piece)
        size += len(piece)
        messages += 100
    entry = c.ConsumeEntry(0, c.FETCH_OK, 1, 10 ** 6, 0, parts, size)
    return b"".join(c.encode_consume_response(1, [c.ConsumeTopicResult("bench", 1, (entry,))])), \
        messages


def baseline(reply, runs, args):
    echo = Echo(reply, "bench.tank_echo")
    try:
        return statistics.median(tank_load(echo.port, *args)["records_per_s"]
                                 for _ in range(runs))
    finally:
        echo.stop()


def row(name, policy, figures, base):
    rps = statistics.median(f["requests_per_s"] for f in figures)
    recs = statistics.median(f["records_per_s"] for f in figures)
    return (name, policy, rps, recs, recs * 100 / 1e6, recs / base)


def measure(runs, seconds):
    """Blocking: every scenario, ``runs`` times; returns table rows."""
    common = ["--seconds", str(seconds), "--connections", "8"]
    rows = []
    produce_reply = c.encode_produce_response(1, [0])
    for name, extra, policies in (("produce 100 x 100 B", [], ("never", "interval")),
                                  ("produce 100 x 100 B Snappy", ["--snappy"], ("never",))):
        base = baseline(produce_reply, runs, ["produce", *extra, *common, "--fixed-count", "100"])
        for fsync in policies:
            figures = []
            for _ in range(runs):
                gw = Gateway(fsync, dialects=("tank",))
                try:
                    figures.append(tank_load(gw.port, "produce", *extra, *common))
                finally:
                    gw.stop()
            rows.append(row(f"tank {name}", f"fsync {fsync}", figures, base))
        rows.append((f"raw loopback {name}", "baseline", base / 100, base, base * 100 / 1e6, 1.0))

    reply, per_reply = canned_consume(FETCH_BYTES)
    consume = ["consume", "--fetch-bytes", str(FETCH_BYTES), "--window", "4", *common]
    base = baseline(reply, runs, [*consume, "--fetch-range", "1000000",
                                  "--fixed-count", str(per_reply)])
    for name, writer in (("consume 64 KiB, TANK-written", "tank"),
                         ("consume 64 KiB, TANK Snappy-written", "snappy"),
                         ("consume 64 KiB, RustLog-written", "rustlog")):
        gw = Gateway("never", dialects=("tank", "rustlog"))
        try:
            if writer == "rustlog":
                run_json("bench.loadgen", "--port", str(gw.ports["rustlog"]), "produce", "--records", "100",
                     "--seconds", "3", "--connections", "2", "--window", "8")
            else:
                tank_load(gw.ports["tank"], "produce", "--seconds", "1.5", "--connections", "2",
                          "--window", "8", *(["--snappy"] if writer == "snappy" else []))
            figures = [tank_load(gw.ports["tank"], *consume) for _ in range(runs)]
        finally:
            gw.stop()
        rows.append(row(f"tank {name}", "fsync never", figures, base))
    rows.append(("raw loopback consume 64 KiB", "baseline", base / per_reply, base,
                 base * 100 / 1e6, 1.0))

    gw = Gateway("never", dialects=("tank",))
    try:
        tank_load(gw.port, "produce", "--seconds", "0.2", "--connections", "1", "--window", "1")
        idle = subprocess.Popen([PYTHON, "-m", "bench.tank_loadgen", "idle", "--port",
                                 str(gw.port), "--connections", str(PARKED), "--seconds",
                                 str(seconds + 2)], stdout=subprocess.DEVNULL)
        time.sleep(1.5)
        before = cpu_seconds(gw.proc.pid)
        time.sleep(seconds)
        used = cpu_seconds(gw.proc.pid) - before
        idle.wait(60)
    finally:
        gw.stop()
    rows.append((f"tank {PARKED} consumers parked (CPU % of one core)", "fsync never",
                 0.0, 0.0, 0.0, 100 * used / seconds))
    return rows


@defer.inlineCallbacks
def table(reactor, runs, seconds):
    from bench.table import print_table
    rows = yield threads.deferToThread(measure, runs, seconds)
    print_table("TANK over loopback, 8 connections pipelining (ratio to raw loopback; "
                "last row: gateway CPU % while idle)",
                ("scenario", "policy", "requests/s", "messages/s", "MB/s", "ratio"), rows)
