"""What the network benchmarks share: server subprocesses listening on port
0 (the gateway on a fresh data directory, or a raw-loopback baseline that
answers canned replies), load generators run as their own processes, and
reading a process's CPU time.

Servers, baselines and load generators run in separate processes so that
each has a core's worth of scheduling to itself and the figures measure the
server, not the harness.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

PYTHON = sys.executable


def wait_for(path, proc, timeout=30.0):
    """The JSON a server writes to ``path`` once it listens."""
    deadline = time.time() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        if time.time() > deadline:
            raise RuntimeError(f"no {path} after {timeout}s")
        time.sleep(0.05)
    with open(path) as f:
        return json.load(f)


def serve_port0(factory, ports_file):
    """Run in a baseline server process: listen on 127.0.0.1:0, write
    ``{"port": N}`` to ``ports_file`` atomically, run the reactor."""
    from twisted.internet import reactor
    factory.noisy = False
    port = reactor.listenTCP(0, factory, interface="127.0.0.1")
    with open(ports_file + ".tmp", "w") as f:
        json.dump({"port": port.getHost().port}, f)
    os.replace(ports_file + ".tmp", ports_file)
    reactor.run()


def run_json(module, *args):
    """Run ``python -m module args`` to the end; its stdout is one JSON document."""
    out = subprocess.run([PYTHON, "-m", module, *args], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out)


def cpu_seconds(pid):
    """User + system CPU seconds a process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ServerProcess:
    """``python -m <args> --ports-file F`` in its own temporary directory."""

    def __init__(self, *args, prefix="gw-bench-", quiet=False):
        self.dir = tempfile.mkdtemp(prefix=prefix)
        ports = os.path.join(self.dir, "ports.json")
        out = subprocess.DEVNULL if quiet else None
        self.proc = subprocess.Popen([PYTHON, "-m", *self.arguments(*args),
                                      "--ports-file", ports], stdout=out, stderr=out)
        #: what the server wrote once listening
        self.found = wait_for(ports, self.proc)
        self.port = self.found.get("port")

    def arguments(self, *args):
        return list(args)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)
        shutil.rmtree(self.dir, ignore_errors=True)


class Gateway(ServerProcess):
    """A gateway subprocess on a fresh data directory (or ``data``), with one
    port-0 listener per dialect named."""

    def __init__(self, fsync, dialects=("rustlog",), data=None):
        self.fsync = fsync
        self.dialects = dialects
        self.data = data
        super().__init__(quiet=True)
        listeners = self.found["listeners"]
        #: {dialect: port}; ``port`` is the first listener's
        self.ports = {entry["dialect"]: entry["port"] for entry in listeners}
        self.port = listeners[0]["port"]

    def arguments(self):
        config = os.path.join(self.dir, "config.yaml")
        with open(config, "w") as f:
            f.write(f"storage: {{path: {self.data or './data'}, fsync: {self.fsync}}}\n"
                    "listeners:\n")
            for dialect in self.dialects:
                f.write(f"  - {{dialect: {dialect}, endpoint: \"tcp:0:interface=127.0.0.1\"}}\n")
        return ["gateway.cli", "run", "-c", config]


class Echo(ServerProcess):
    """A raw-loopback baseline (``module``, default ``bench.echo``: u32 BE
    framing) answering ``reply`` to every frame."""

    def __init__(self, reply, module="bench.echo"):
        self.reply = reply
        self.module = module
        super().__init__(prefix="gw-echo-")

    def arguments(self):
        reply_file = os.path.join(self.dir, "reply")
        with open(reply_file, "wb") as f:
            f.write(self.reply)
        return [self.module, "--reply-file", reply_file]
