"""Operations: what metrics and logging cost, and what idle connections weigh.

- Overhead: produce load (RustLog with 1 and 100 records a request, TANK
  bundles of 100 records; 8 connections pipelining, the load generator in its
  own process, ``fsync: never`` so that the gateway's CPU is what limits)
  against the gateway without ``metrics:`` and logging nowhere, then with
  ``metrics:``, JSON logs written to a file and a scraper reading
  ``/metrics`` and ``/api/status`` every second, as a Prometheus server and
  an open status page would. Runs alternate between the two so that the
  shared machine's drift hits both alike; figures are medians. Two ratios,
  with / without (target: at least 0.95): of throughput, and of the
  gateway's CPU time per record inverted. The second is what to trust on a
  busy machine: another process taking a core moves throughput by far more
  than 5%, while the CPU a record costs the gateway stays put.
- Idle connections: 200 per dialect (1,000 in all) opened by this process
  and left idle, against a gateway with every dialect and ``metrics:``; its
  resident memory (VmRSS) before and after (target: under 150 MB).
"""
import json
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request

from twisted.internet import defer, threads

from bench.procs import PYTHON, wait_for

LOCAL = "tcp:0:interface=127.0.0.1"
DIALECTS = ("rustlog", "tank", "kafka", "figg", "pravega")
IDLE_PER_DIALECT = 200


class Server:
    """``gateway run`` on a fresh data directory with the given listeners;
    ``metrics`` adds the metrics endpoint and sends JSON logs to a file."""

    def __init__(self, dialects, metrics):
        self.dir = tempfile.mkdtemp(prefix="gw-ops-bench-")
        config = os.path.join(self.dir, "config.yaml")
        with open(config, "w") as f:
            f.write("storage: {path: ./data, fsync: never}\nlisteners:\n")
            for dialect in dialects:
                f.write(f"  - {{dialect: {dialect}, endpoint: \"{LOCAL}\"}}\n")
            if metrics:
                f.write(f"metrics: {{endpoint: \"{LOCAL}\"}}\n")
        ports = os.path.join(self.dir, "ports.json")
        args = [PYTHON, "-m", "gateway.cli", "run", "-c", config, "--ports-file", ports]
        if metrics:
            self.log = open(os.path.join(self.dir, "gateway.log"), "wb")
            args += ["--log-format", "json"]
        else:
            self.log = subprocess.DEVNULL
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self.log)
        doc = wait_for(ports, self.proc)
        self.ports = {entry["dialect"]: entry["port"] for entry in doc["listeners"]}
        self.metrics_port = doc["metrics"]["port"] if metrics else None

    def cpu_seconds(self):
        """User + system CPU time the gateway has used so far."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_bytes(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def get(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}{path}",
                                    timeout=10) as answer:
            return answer.read()

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)
        if self.log is not subprocess.DEVNULL:
            self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Scraper:
    """Reads /metrics and /api/status every second, in a thread."""

    def __init__(self, server):
        self.server = server
        self.stopping = threading.Event()
        self.scrapes = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        self.thread.join(10)

    def _run(self):
        while not self.stopping.is_set():
            self.server.get("/metrics")
            self.server.get("/api/status")
            self.scrapes += 1
            self.stopping.wait(1.0)


def load(module, port, seconds, *args):
    out = subprocess.run([PYTHON, "-m", module, "produce", *args, "--port", str(port),
                          "--seconds", str(seconds), "--connections", "8"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["records_per_s"]


SCENARIOS = (
    ("rustlog produce 1 x 100 B", "rustlog", "bench.loadgen", ("--records", "1")),
    ("rustlog produce 100 x 100 B", "rustlog", "bench.loadgen", ("--records", "100")),
    ("tank produce 100 x 100 B", "tank", "bench.tank_loadgen", ()),
)


def measure(dialect, module, args, seconds, metrics):
    """One run: ``(records/s, gateway CPU microseconds per record, scrapes)``."""
    server = Server((dialect,), metrics)
    try:
        port = server.ports[dialect]
        cpu = server.cpu_seconds()
        if metrics:
            with Scraper(server) as scraper:
                rate = load(module, port, seconds, *args)
            scrapes = scraper.scrapes
        else:
            rate = load(module, port, seconds, *args)
            scrapes = 0
        cpu = server.cpu_seconds() - cpu
    finally:
        server.stop()
    return rate, cpu * 1e6 / (rate * seconds), scrapes


def overhead(runs, seconds):
    """Blocking: rows of (scenario, records/s without, with, ratio, CPU
    microseconds per record without, with, ratio, scrapes per run)."""
    rows = []
    for name, dialect, module, args in SCENARIOS:
        without, with_metrics = [], []
        for _ in range(runs):
            without.append(measure(dialect, module, args, seconds, False))
            with_metrics.append(measure(dialect, module, args, seconds, True))
        rate_a = statistics.median(r for r, _, _ in without)
        rate_b = statistics.median(r for r, _, _ in with_metrics)
        cpu_a = statistics.median(c for _, c, _ in without)
        cpu_b = statistics.median(c for _, c, _ in with_metrics)
        scrapes = statistics.median(n for _, _, n in with_metrics)
        rows.append((name, rate_a, rate_b, rate_b / rate_a, cpu_a, cpu_b, cpu_a / cpu_b,
                     f"{scrapes:.0f}"))
    return rows


def idle_connections():
    """Blocking: rows of (what, MB) for 1,000 idle connections."""
    server = Server(DIALECTS, True)
    sockets = []
    try:
        time.sleep(0.5)
        before = server.rss_bytes()
        for dialect in DIALECTS:
            for _ in range(IDLE_PER_DIALECT):
                sockets.append(socket.create_connection(("127.0.0.1", server.ports[dialect])))
        deadline = time.time() + 30
        while True:
            status = json.loads(server.get("/api/status"))
            if sum(listener["connections"] or 0 for listener in status["listeners"]) \
                    == len(sockets) or time.time() > deadline:
                break
            time.sleep(0.1)
        time.sleep(1.0)
        after = server.rss_bytes()
        open_now = sum(listener["connections"] or 0 for listener in status["listeners"])
    finally:
        for sock in sockets:
            sock.close()
        server.stop()
    mb = 1024 * 1024
    return [("gateway, every dialect, metrics on, no connection", before / mb),
            (f"with {open_now} idle connections ({IDLE_PER_DIALECT} per dialect)", after / mb),
            ("per connection (KiB)", (after - before) / max(open_now, 1) / 1024)]


@defer.inlineCallbacks
def table(reactor, runs, seconds):
    from bench.table import print_table
    rows = yield threads.deferToThread(overhead, runs, seconds)
    print_table("Metrics and logging overhead: produce without, and with metrics (scraped every "
                "second) and JSON logs; CPU = the gateway's microseconds per record",
                ("scenario", "", "records/s without", "with", "ratio", "CPU without",
                 "CPU with", "CPU ratio", "scrapes/run"),
                [(row[0], "") + row[1:] for row in rows])
    rows = yield threads.deferToThread(idle_connections)
    print_table("Resident memory (VmRSS)", ("what", "", "MB"),
                [(what, "", value) for what, value in rows])
