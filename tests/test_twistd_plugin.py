"""``twistd -n gateway -c config.yaml``: the twistd plugin starts the whole
gateway, serves, stops cleanly on SIGTERM, and refuses a bad config with the
config error in its output. Run as a subprocess with a blocking client."""
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

from twisted.trial.unittest import TestCase

from plugins.rustlog import codec as rc

TWISTD = os.path.join(os.path.dirname(sys.executable), "twistd")

CONFIG = """\
storage:
  path: ./data
  fsync: always
listeners:
  - {dialect: rustlog, endpoint: "tcp:0:interface=127.0.0.1"}
"""

LISTENING = re.compile(r"rustlog listening on 127\.0\.0\.1:(\d+)")


def call(sock, request):
    """One request and its response over a blocking socket."""
    payload = rc.encode_request(rc.JSON, request)
    sock.sendall(struct.pack(">I", len(payload)) + payload)

    def read(n):
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed by the gateway")
            data += chunk
        return data
    (n,) = struct.unpack(">I", read(4))
    return rc.decode_response(read(n))[1]


class TwistdPluginTests(TestCase):
    timeout = 60

    def setUp(self):
        self.directory = tempfile.mkdtemp(prefix="gateway-twistd-")
        self.addCleanup(shutil.rmtree, self.directory, True)
        self.output = os.path.join(self.directory, "twistd.out")

    def twistd(self, config_text):
        config = os.path.join(self.directory, "config.yaml")
        with open(config, "w") as f:
            f.write(config_text)
        with open(self.output, "wb") as out:
            proc = subprocess.Popen([TWISTD, "-n", "--pidfile=", "gateway", "-c", config],
                                    stdout=out, stderr=subprocess.STDOUT, cwd=self.directory)

        def kill():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.addCleanup(kill)
        return proc

    def read_output(self):
        with open(self.output, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def wait_for_port(self, proc, timeout=30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = LISTENING.search(self.read_output())
            if match:
                return int(match.group(1))
            if proc.poll() is not None:
                self.fail(f"twistd exited with {proc.returncode}:\n{self.read_output()}")
            time.sleep(0.05)
        self.fail(f"twistd did not start listening:\n{self.read_output()}")

    def test_serves_and_stops_on_sigterm(self):
        proc = self.twistd(CONFIG)
        port = self.wait_for_port(proc)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            self.assertEqual(call(sock, rc.ProduceRequest("t", 0, (b"hello", b"\x00\xff"))),
                             rc.ProduceResponse(0, 2))
            self.assertEqual(call(sock, rc.FetchRequest("t", 0, 0, 1024)),
                             rc.FetchResponse(((0, b"hello"), (1, b"\x00\xff")), 2))
        proc.terminate()
        # A clean stop. twistd (since Twisted 21.2) then re-raises the signal
        # on itself after its shutdown, so that its parent sees "terminated by
        # SIGTERM": that, not 0, is twistd's status for a clean SIGTERM stop
        # (``gateway run`` exits 0).
        self.assertEqual(proc.wait(30), -signal.SIGTERM, self.read_output())
        output = self.read_output()
        self.assertIn("Received SIGTERM, shutting down.", output)
        self.assertIn("Server Shut Down.", output)
        self.assertNotIn("Traceback", output)
        self.assertNotIn("recovery cut", output)
        # the data directory is relative to the config file
        self.assertTrue(os.path.isdir(os.path.join(self.directory, "data", "topics", "t", "0")))
        # started again on the same data: everything is there
        proc = self.twistd(CONFIG)
        port = self.wait_for_port(proc)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            self.assertEqual(call(sock, rc.FetchRequest("t", 0, 0, 1024)),
                             rc.FetchResponse(((0, b"hello"), (1, b"\x00\xff")), 2))
        proc.terminate()
        self.assertEqual(proc.wait(30), -signal.SIGTERM, self.read_output())
        self.assertNotIn("recovery cut", self.read_output())

    def test_bad_config_exits_non_zero_with_the_error(self):
        proc = self.twistd(CONFIG.replace("fsync: always", "fsync: sometimes"))
        code = proc.wait(30)
        output = self.read_output()
        self.assertNotEqual(code, 0, output)
        self.assertIn("bad config: storage.fsync: must be one of always, interval, never, "
                      "got 'sometimes'", output)
        self.assertFalse(os.path.exists(os.path.join(self.directory, "data")))

    def test_missing_config_exits_non_zero_with_the_error(self):
        proc = subprocess.run([TWISTD, "-n", "--pidfile=", "gateway", "-c", "nope.yaml"],
                              capture_output=True, text=True, timeout=30, cwd=self.directory,
                              check=False)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("bad config: cannot read nope.yaml: No such file or directory",
                      proc.stdout + proc.stderr)
