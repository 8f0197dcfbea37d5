"""Server subprocesses for network benchmarks: the gateway on a fresh data
directory, and the raw-loopback baseline (``bench.echo``)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

PYTHON = sys.executable


def wait_for(path, proc, timeout=30.0):
    deadline = time.time() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        if time.time() > deadline:
            raise RuntimeError(f"no {path} after {timeout}s")
        time.sleep(0.05)
    with open(path) as f:
        return json.load(f)


class Gateway:
    """A gateway subprocess on a fresh data directory."""

    def __init__(self, fsync, dialects=("rustlog",)):
        self.dir = tempfile.mkdtemp(prefix="gw-bench-")
        config = os.path.join(self.dir, "config.yaml")
        with open(config, "w") as f:
            f.write(f"storage: {{path: ./data, fsync: {fsync}}}\nlisteners:\n")
            for dialect in dialects:
                f.write(f"  - {{dialect: {dialect}, endpoint: \"tcp:0:interface=127.0.0.1\"}}\n")
        ports = os.path.join(self.dir, "ports.json")
        self.proc = subprocess.Popen([PYTHON, "-m", "gateway.cli", "run", "-c", config,
                                      "--ports-file", ports],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        listeners = wait_for(ports, self.proc)["listeners"]
        #: {dialect: port}; ``port`` is the first listener's
        self.ports = {entry["dialect"]: entry["port"] for entry in listeners}
        self.port = listeners[0]["port"]

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)
        shutil.rmtree(self.dir, ignore_errors=True)


class Echo:
    """``bench.echo``: the raw-loopback baseline answering ``reply`` to every frame."""

    def __init__(self, reply):
        self.dir = tempfile.mkdtemp(prefix="gw-echo-")
        reply_file = os.path.join(self.dir, "reply")
        with open(reply_file, "wb") as f:
            f.write(reply)
        ports = os.path.join(self.dir, "ports.json")
        self.proc = subprocess.Popen([PYTHON, "-m", "bench.echo", "--ports-file", ports,
                                      "--reply-file", reply_file])
        self.port = wait_for(ports, self.proc)["port"]

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)
        shutil.rmtree(self.dir, ignore_errors=True)
