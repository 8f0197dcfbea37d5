"""Kafka over loopback: the gateway as a subprocess, the load from another.

Scenarios (100-byte values, 8 connections pipelining, requests encoded
once before the clock starts):

- produce: Produce v0 (acks 1) of 100 messages per partition, cycling over
  4 partitions, uncompressed and in one gzip wrapper;
- fetch of Kafka-written data: Fetch v0 of 64 KiB from offsets spread over
  the first 200,000 records (stored message sets, offsets rewritten);
- fetch of RustLog-written data: the same over records another dialect
  wrote (decoded and re-encoded as magic-0 messages);
- an idle consumer long-polling at the tail (``max_wait_ms`` 500): the
  gateway's CPU time per second of wall time, for 1 and 100 consumers,
  beside the idle gateway with none (CPU time is counted in clock ticks
  of 10 ms, so one tick in a 3 s window reads as 0.33%);
- kafka-python's own producer and consumer end to end, for reference.

Beside each network figure is the ratio to the raw-loopback baseline
(``bench.echo`` answering canned replies of the same size, measured with
the same load generator in the same run). Every figure is the median of
``runs`` runs.

``python -m bench.kafka loadgen ...`` is the load generator's entry point
(``bench.loadgen.run`` with Kafka frames and record counting).
"""
import argparse
import json
import socket
import statistics
import struct
import subprocess
import sys
import time

from twisted.internet import defer, threads

from bench.procs import PYTHON, Echo, Gateway, cpu_seconds, run_json

TOPIC = "bench"
PARTITIONS = 4
RECORDS = 100
VALUE_BYTES = 100
#: one magic-0 entry with a null key and a 100-byte value: offset, size, crc,
#: magic, attributes, key length, value length, value
ENTRY_BYTES = 8 + 4 + 4 + 1 + 1 + 4 + 4 + VALUE_BYTES
FETCH_BYTES = 64 * 1024
FETCH_RANGE = 200000


# -- the load generator (runs in its own process) -------------------------------------

def produce_frames(codec):
    from plugins.kafka import codec as kc
    frames = []
    for partition in range(PARTITIONS):
        records = [(None, bytes([(partition + i) % 256]) * VALUE_BYTES) for i in range(RECORDS)]
        message_set = kc.encode_message_set(records, 0, codec)
        frames.append(kc.encode_request(kc.PRODUCE, 0, partition, "bench", kc.ProduceRequest(
            1, 10000, ((TOPIC, ((partition, message_set),)),))))
    return frames


def fetch_frames(topic, offsets):
    from plugins.kafka import codec as kc
    return [kc.encode_request(kc.FETCH, 0, i, "bench", kc.FetchRequest(
        -1, 0, 0, ((topic, ((0, offset, FETCH_BYTES),)),))) for i, offset in enumerate(offsets)]


def fetch_count(topic):
    """Records in a one-partition Fetch v0 reply, from its message_set_size
    (every entry has the same size), without parsing the entries."""
    at = 4 + 4 + 2 + len(topic.encode()) + 4 + 4 + 2 + 8
    return lambda i, reply: struct.unpack_from(">i", reply, at)[0] // ENTRY_BYTES


def loadgen_main(argv):
    from bench.loadgen import run
    p = argparse.ArgumentParser(prog="python -m bench.kafka loadgen")
    p.add_argument("mode", choices=["produce", "produce-gzip", "fetch"])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--topic", default=TOPIC)
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--window", type=int, default=32)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--fixed-count", type=int, default=0,
                   help="records per reply, for the canned-reply baseline")
    a = p.parse_args(argv)
    if a.mode == "fetch":
        step = FETCH_BYTES // ENTRY_BYTES
        frames = fetch_frames(a.topic, range(0, FETCH_RANGE - step, step))
        count = fetch_count(a.topic)
    else:
        frames = produce_frames(1 if a.mode == "produce-gzip" else 0)
        count = (lambda i, r: RECORDS)
    if a.fixed_count:
        count = (lambda i, r: a.fixed_count)
    print(json.dumps(run("127.0.0.1", a.port, frames, count, a.connections, a.window,
                         a.seconds)))


# -- helpers for the measuring side -----------------------------------------------------

def load(port, *args):
    return run_json("bench.kafka", "loadgen", *args, "--port", str(port))


def create_topic(rustlog_port, topic, partitions):
    from plugins.rustlog import codec as rc
    payload = rc.encode_request(rc.BINARY, rc.CreateTopicRequest(topic, partitions))
    with socket.create_connection(("127.0.0.1", rustlog_port), 10) as s:
        s.sendall(struct.pack(">I", len(payload)) + payload)
        size = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
        s.recv(size, socket.MSG_WAITALL)


def kafka_gateway(fsync):
    gw = Gateway(fsync, dialects=("kafka", "rustlog"))
    create_topic(gw.ports["rustlog"], TOPIC, PARTITIONS)
    return gw


def fill(gw, writer, records):
    """Write ``records`` records of VALUE_BYTES to partition 0 of TOPIC,
    RECORDS per request (as the produce scenarios store them), through
    Kafka (the blocking client) or RustLog (JSON)."""
    values = [bytes([i % 256]) * VALUE_BYTES for i in range(RECORDS)]
    if writer == "kafka":
        from plugins.kafka.client import KafkaClient
        with KafkaClient("127.0.0.1", gw.ports["kafka"]) as client:
            for _ in range(0, records, RECORDS):
                client.produce(TOPIC, 0, [(None, v) for v in values])
        return
    from plugins.rustlog import codec as rc
    payload = rc.encode_request(rc.JSON, rc.ProduceRequest(TOPIC, 0, tuple(values)))
    frame = struct.pack(">I", len(payload)) + payload
    with socket.create_connection(("127.0.0.1", gw.ports["rustlog"]), 30) as s:
        for _ in range(0, records, RECORDS):
            s.sendall(frame)
            size = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
            s.recv(size, socket.MSG_WAITALL)


def canned_produce_reply():
    from plugins.kafka import codec as kc
    return kc.encode_response(kc.PRODUCE, 0, 0, kc.ProduceResponse(
        ((TOPIC, ((0, 0, 1000000),)),)))[4:]


def canned_fetch_reply(topic):
    from plugins.kafka import codec as kc
    count = FETCH_BYTES // ENTRY_BYTES
    data = b"".join(kc.encode_entry(1000 + i, None, b"7" * VALUE_BYTES) for i in range(count))
    return kc.encode_response(kc.FETCH, 0, 0, kc.FetchResponse(
        ((topic, ((0, 0, 2000000, data),)),)))[4:]


def idle_long_poll_cpu(consumers, seconds):
    """The gateway's CPU share while ``consumers`` connections each keep a
    Fetch parked at the tail (max_wait_ms 500, min_bytes 1), re-sending it
    whenever it is answered: what idle consumers cost."""
    from plugins.kafka import codec as kc
    gw = kafka_gateway("never")
    try:
        frame = kc.encode_request(kc.FETCH, 0, 1, "idle", kc.FetchRequest(
            -1, 500, 1, ((TOPIC, ((0, 0, 1 << 20),)),)))
        socks = [socket.create_connection(("127.0.0.1", gw.ports["kafka"])) for _ in
                 range(consumers)]
        for s in socks:
            s.sendall(frame)
        time.sleep(0.6)
        before = cpu_seconds(gw.proc.pid)
        started = time.monotonic()
        import selectors
        sel = selectors.DefaultSelector()
        for s in socks:
            sel.register(s, selectors.EVENT_READ)
        answers = 0
        while time.monotonic() - started < seconds:
            for key, _ in sel.select(timeout=0.1):
                s = key.fileobj
                size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
                s.recv(size, socket.MSG_WAITALL)
                answers += 1
                s.sendall(frame)
        share = (cpu_seconds(gw.proc.pid) - before) / (time.monotonic() - started)
        for s in socks:
            s.close()
        return share, answers
    finally:
        gw.stop()


E2E_SCRIPT = """
import sys, time, json
from kafka import KafkaProducer, KafkaConsumer, TopicPartition
bootstrap, n = sys.argv[1], int(sys.argv[2])
value = b"v" * 100
producer = KafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=5)
started = time.perf_counter()
for _ in range(n):
    producer.send("e2e", value)
producer.flush()
produced = n / (time.perf_counter() - started)
producer.close()
consumer = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
consumer.assign([TopicPartition("e2e", 0)])
got = 0
started = time.perf_counter()
while got < n:
    for records in consumer.poll(timeout_ms=500).values():
        got += len(records)
consumed = n / (time.perf_counter() - started)
consumer.close()
print(json.dumps({"produce": produced, "consume": consumed}))
"""


def kafka_python_end_to_end(records):
    gw = kafka_gateway("never")
    try:
        out = subprocess.run([PYTHON, "-c", E2E_SCRIPT, f"127.0.0.1:{gw.ports['kafka']}",
                              str(records)], check=True, capture_output=True, text=True,
                             timeout=600).stdout
        return json.loads(out)
    finally:
        gw.stop()


# -- the table ---------------------------------------------------------------------------

def measure(runs, seconds):
    """Blocking: every scenario, ``runs`` times; returns the three tables' rows."""
    common = ["--seconds", str(seconds), "--connections", "8"]
    per_fetch = FETCH_BYTES // ENTRY_BYTES
    rows = []

    def baseline(reply, args, records):
        echo = Echo(reply)
        try:
            return statistics.median(
                load(echo.port, *args, *common, "--fixed-count", str(records))["records_per_s"]
                for _ in range(runs))
        finally:
            echo.stop()

    def add(name, policy, figures, base):
        rps = statistics.median(f["requests_per_s"] for f in figures)
        recs = statistics.median(f["records_per_s"] for f in figures)
        rows.append((name, policy, rps, recs, recs * VALUE_BYTES / 1e6, recs / base))

    produce_base = baseline(canned_produce_reply(), ["produce"], RECORDS)
    for mode, label in (("produce", "none"), ("produce-gzip", "gzip")):
        for fsync in ("never", "interval"):
            figures = []
            for _ in range(runs):
                gw = kafka_gateway(fsync)
                try:
                    figures.append(load(gw.ports["kafka"], mode, *common))
                finally:
                    gw.stop()
            add(f"kafka produce {RECORDS} x {VALUE_BYTES} B, {label}", f"fsync {fsync}",
                figures, produce_base)
    rows.append((f"raw loopback produce {RECORDS} x {VALUE_BYTES} B", "baseline",
                 produce_base / RECORDS, produce_base, produce_base * VALUE_BYTES / 1e6, 1.0))

    fetch_base = baseline(canned_fetch_reply(TOPIC), ["fetch", "--window", "4"], per_fetch)
    for writer in ("kafka", "rustlog"):
        figures = []
        for _ in range(runs):
            gw = kafka_gateway("never")
            try:
                fill(gw, writer, FETCH_RANGE)
                figures.append(load(gw.ports["kafka"], "fetch", "--window", "4", *common))
            finally:
                gw.stop()
        add(f"kafka fetch 64 KiB of {writer}-written data", "fsync never", figures, fetch_base)
    rows.append(("raw loopback fetch 64 KiB", "baseline", fetch_base / per_fetch, fetch_base,
                 fetch_base * VALUE_BYTES / 1e6, 1.0))

    idle = []
    window = max(seconds, 3.0)
    for consumers in (0, 1, 100):
        shares = [idle_long_poll_cpu(consumers, window) for _ in range(runs)]
        idle.append((f"{consumers} consumer(s) parked at the tail", "max_wait_ms 500",
                     statistics.median(a for _, a in shares) / window,
                     statistics.median(s for s, _ in shares) * 100))

    e2e = [kafka_python_end_to_end(20000) for _ in range(runs)]
    end_to_end = [("kafka-python 3 defaults, acks 1, 20,000 x 100 B", "fsync never",
                   statistics.median(r["produce"] for r in e2e),
                   statistics.median(r["consume"] for r in e2e))]
    return rows, idle, end_to_end


@defer.inlineCallbacks
def table(reactor, runs, seconds):
    from bench.table import print_table
    rows, idle, end_to_end = yield threads.deferToThread(measure, runs, seconds)
    print_table("Kafka over loopback, 8 connections pipelining (ratio to raw loopback)",
                ("scenario", "policy", "requests/s", "records/s", "MB/s", "ratio"), rows)
    print_table("Kafka long-poll at the tail: the gateway's CPU while consumers idle",
                ("scenario", "fetch", "fetches answered/s", "gateway CPU, % of a core"), idle)
    print_table("kafka-python's own producer and consumer, end to end (for reference)",
                ("scenario", "policy", "produce records/s", "consume records/s"), end_to_end)


if __name__ == "__main__":
    if sys.argv[1:2] == ["loadgen"]:
        loadgen_main(sys.argv[2:])
    else:
        raise SystemExit("usage: python -m bench.kafka loadgen MODE --port PORT ...")
