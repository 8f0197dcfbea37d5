"""Starting the real gateway for tests: in-process on the reactor, or as a
subprocess with ``gateway run --ports-file`` for blocking clients."""
import json
import os
import struct
import subprocess
import sys
import time

from twisted.internet import defer, reactor
from twisted.internet.protocol import Protocol

from gateway.config import parse_config
from gateway.dialects import find_dialects
from gateway.service import GatewayService


def gateway_config(data_dir, listeners=None, **sections):
    """A validated GatewayConfig: a RustLog listener on port 0 unless told otherwise.

    ``sections`` are config.yaml sections as dicts, e.g. ``storage={"fsync": "never"}``.
    """
    doc = {"storage": {"path": data_dir, "fsync": "never", **sections.pop("storage", {})},
           "listeners": listeners or [{"dialect": "rustlog",
                                       "endpoint": "tcp:0:interface=127.0.0.1"}]}
    doc.update(sections)
    return parse_config(doc, data_dir, find_dialects())


@defer.inlineCallbacks
def start_gateway(testcase, config):
    """Start the whole service tree; returns (service, {dialect: port}).

    The gateway is stopped when the test ends (unless the test stopped it)."""
    service = GatewayService(config, reactor)
    service.startService()

    def stop():
        if service.running:
            return service.stopService()
    testcase.addCleanup(stop)
    bound = yield service.whenListening()
    ports = {}
    for listener, address in bound:
        ports.setdefault(listener.dialect, address.port)
    return service, ports


class GatewayProcess:
    """``gateway run`` in a subprocess, for clients that block."""

    def __init__(self, directory, config_text):
        self.directory = directory
        self.config = os.path.join(directory, "config.yaml")
        with open(self.config, "w") as f:
            f.write(config_text)
        self.ports_file = os.path.join(directory, "ports.json")
        self.log = open(os.path.join(directory, "gateway.log"), "ab")
        self.proc = None

    def start(self, timeout=30.0):
        if os.path.exists(self.ports_file):
            os.unlink(self.ports_file)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "run", "-c", self.config,
             "--ports-file", self.ports_file], stdout=self.log, stderr=self.log)
        deadline = time.time() + timeout
        while not os.path.exists(self.ports_file):
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}: "
                                   f"{self.read_log()[-2000:]}")
            if time.time() > deadline:
                raise RuntimeError("gateway did not start")
            time.sleep(0.05)
        with open(self.ports_file) as f:
            doc = json.load(f)
        return {entry["dialect"]: entry["port"] for entry in doc["listeners"]}

    def stop(self, sig="TERM"):
        if self.proc is None:
            return None
        if sig == "KILL":
            self.proc.kill()
        else:
            self.proc.terminate()
        code = self.proc.wait(30)
        self.proc = None
        return code

    def read_log(self):
        self.log.flush()
        with open(os.path.join(self.directory, "gateway.log"), "rb") as f:
            return f.read().decode("utf-8", "replace")


class RawFrames(Protocol):
    """A test connection that sends bytes as given and cuts what comes back
    into whole frames without judging them, so a test can check a server's
    exact answers. ``header`` and ``length_field`` describe the dialect's
    framing (default: a u32 BE length, as RustLog and Kafka frame);
    ``keep_header`` keeps each frame's header in what ``take_frames`` gives."""

    header = struct.Struct(">I")
    length_field = 0
    keep_header = False

    def __init__(self):
        self.buffer = bytearray()
        self.frames = []
        self.taken = 0
        self.waiting = []
        self.lost = defer.Deferred()
        self.closed = False

    def connectionMade(self):
        self.transport.setTcpNoDelay(True)

    def dataReceived(self, data):
        self.buffer += data
        size = self.header.size
        while len(self.buffer) >= size:
            n = self.header.unpack_from(self.buffer)[self.length_field]
            if len(self.buffer) < size + n:
                break
            self.frames.append(bytes(self.buffer[0 if self.keep_header else size:size + n]))
            del self.buffer[:size + n]
        self._check()

    def _check(self):
        waiting, self.waiting = self.waiting, []
        for n, d in waiting:
            if len(self.frames) - self.taken >= n:
                got = self.frames[self.taken:self.taken + n]
                self.taken += n
                d.callback(got)
            else:
                self.waiting.append((n, d))

    def describe(self, frame):
        """How an unexpected frame is shown when the connection closes early."""
        return frame

    def connectionLost(self, reason):
        self.closed = True
        waiting, self.waiting = self.waiting, []
        for n, d in waiting:
            d.errback(AssertionError(
                f"connection closed after {len(self.frames) - self.taken} of {n} awaited "
                f"frames: {[self.describe(f) for f in self.frames[self.taken:]]!r}"[:3000]))
        self.lost.callback(None)

    def take_frames(self, n=1):
        """Fires with the next ``n`` frames."""
        d = defer.Deferred()
        self.waiting.append((n, d))
        self._check()
        return d
