"""Operating a running ``gateway run`` (a subprocess, blocking clients):
SIGHUP reloads config.yaml (listeners added and removed, new access rules
and limits, an invalid config refused with the running one kept), and
SIGTERM stops it cleanly (no new connections, in-flight produces answered,
the store flushed, exit status 0). The twistd plugin reloads on SIGHUP too.
"""
import json
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

import orjson
import pytest
from twisted.internet import defer

from gateway.config import parse_config
from gateway.dialects import find_dialects
from gateway.service import ReloadRejected
from plugins.kafka.client import KafkaClient
from tests.ops_support import OpsTest
from tests.support import GatewayProcess

LOCAL = "tcp:0:interface=127.0.0.1"


def rustlog_call(sock, request):
    payload = orjson.dumps(request)
    sock.sendall(struct.pack(">I", len(payload)) + payload)
    return orjson.loads(read_frame(sock))


def read_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed by the gateway")
        data += chunk
    return data


def read_frame(sock):
    (n,) = struct.unpack(">I", read_exact(sock, 4))
    return read_exact(sock, n)


def produce(topic, *values):
    return {"Produce": {"topic": topic, "partition": 0, "records": [list(v) for v in values]}}


def connect(port):
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return sock


def closed_by_peer(sock, timeout=10.0):
    """Whether the gateway closed ``sock`` (EOF or reset) within ``timeout``."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def refused(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


class Gateway(GatewayProcess):
    """``gateway run`` with helpers for rewriting its config and reloading."""

    def __init__(self, directory, config_text, *args):
        super().__init__(directory, config_text)
        self.args = args

    def ports_doc(self):
        with open(self.ports_file) as f:
            return json.load(f)

    def listeners(self):
        return [(e["dialect"], e["port"]) for e in self.ports_doc()["listeners"]]

    def rewrite(self, config_text):
        with open(self.config, "w") as f:
            f.write(config_text)

    def reload(self, config_text, expect_change=True, timeout=20.0):
        """Rewrite config.yaml and send SIGHUP; wait for the ports file to be
        rewritten (``expect_change``: returns it) or for the rejection in the
        log (returns the log since)."""
        inode = os.stat(self.ports_file).st_ino
        log_before = len(self.read_log())
        self.rewrite(config_text)
        self.proc.send_signal(signal.SIGHUP)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if expect_change and os.stat(self.ports_file).st_ino != inode:
                return self.ports_doc()
            if not expect_change and "reload rejected" in self.read_log()[log_before:]:
                return self.read_log()[log_before:]
            time.sleep(0.05)
        raise AssertionError(f"no reload seen; log: {self.read_log()[-3000:]}")


@pytest.fixture
def directory():
    path = tempfile.mkdtemp(prefix="gateway-reload-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def gateway(directory):
    started = []

    def start(config_text):
        process = Gateway(directory, config_text)
        process.start()
        started.append(process)
        return process
    yield start
    for process in started:
        if process.proc is not None:
            process.stop()


def config(*listeners, storage="", extra=""):
    lines = ["storage: {path: ./data, fsync: never%s}" % storage, "listeners:"]
    lines += [f"  - {listener}" for listener in listeners]
    return "\n".join(lines) + "\n" + extra


RUSTLOG = '{dialect: rustlog, endpoint: "%s"}' % LOCAL
TANK = '{dialect: tank, endpoint: "%s"}' % LOCAL
KAFKA = '{dialect: kafka, endpoint: "%s"}' % LOCAL


def test_reload_adds_and_removes_listeners(gateway):
    gw = gateway(config(RUSTLOG, TANK))
    (_, rustlog_port), (_, tank_port) = gw.listeners()
    kept = connect(rustlog_port)
    assert rustlog_call(kept, produce("r", b"1")) == {"Produce": {"offsets": [0]}}
    doomed = connect(tank_port)
    assert read_exact(doomed, 5)[0] == 0x03       # TANK's Ping on connect

    doc = gw.reload(config(RUSTLOG, KAFKA))
    assert [e["dialect"] for e in doc["listeners"]] == ["rustlog", "kafka"]
    assert doc["listeners"][0]["port"] == rustlog_port          # kept, not restarted
    # the kept listener's connection carries on; the removed one's is closed
    assert rustlog_call(kept, produce("r", b"2")) == {"Produce": {"offsets": [1]}}
    assert closed_by_peer(doomed)
    assert refused(tank_port)
    with KafkaClient("127.0.0.1", doc["listeners"][1]["port"]) as kafka:
        assert [m.value for m in kafka.fetch("r", 0, 0).messages] == [b"1", b"2"]
    log = gw.read_log()
    assert "config reloaded: 1 listener(s) kept, 1 added, 1 removed" in log
    assert "Traceback" not in log


def test_reload_applies_new_access_rules_and_limits(gateway):
    gw = gateway(config(RUSTLOG))
    [(_, port)] = gw.listeners()
    first = connect(port)
    assert rustlog_call(first, produce("t", b"a")) == {"Produce": {"offsets": [0]}}
    gw.reload(config('{dialect: rustlog, endpoint: "%s", access: {mode: read-only}, '
                     'limits: {max_connections: 1}}' % LOCAL))
    assert gw.listeners() == [("rustlog", port)]
    # the next request on the connection opened before is refused...
    assert rustlog_call(first, produce("t", b"b")) == {
        "Error": {"message": "not authorised: topic=t"}}
    assert rustlog_call(first, {"Fetch": {"topic": "t", "partition": 0, "offset": 0,
                                          "max_bytes": 100}})["Fetch"]["next_offset"] == 1
    # ...and a second connection is over the new limit
    second = connect(port)
    assert closed_by_peer(second)
    gw.reload(config(RUSTLOG))
    assert rustlog_call(first, produce("t", b"c")) == {"Produce": {"offsets": [1]}}


def test_an_invalid_config_is_rejected_and_the_running_one_stays(gateway):
    gw = gateway(config(RUSTLOG))
    [(_, port)] = gw.listeners()
    sock = connect(port)
    for bad, reason in [
        ("listeners: [{dialect: rustlog, endpoint: 'tcp:0', acces: {}}]\n",
         "listeners[0].acces: unknown key"),
        ("listeners: [\n", "invalid YAML"),
        (config(RUSTLOG, '{dialect: nope, endpoint: "tcp:0"}'), "unknown dialect 'nope'"),
    ]:
        log = gw.reload(bad, expect_change=False)
        assert re.search(r"reload rejected: .*" + re.escape(reason) +
                         r".*; the running config stays", log), log
        assert rustlog_call(sock, produce("t", b"x"))["Produce"]
    # a new listener that cannot bind: nothing of that config is applied
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    taken = busy.getsockname()[1]
    log = gw.reload(config('{dialect: tank, endpoint: "%s", access: {mode: read-only}}' % LOCAL,
                           '{dialect: kafka, endpoint: "tcp:%d:interface=127.0.0.1"}' % taken),
                    expect_change=False)
    assert "reload rejected: listeners[1]: cannot listen" in log
    busy.close()
    assert gw.listeners() == [("rustlog", port)]
    assert rustlog_call(sock, produce("t", b"y"))["Produce"]
    assert "Traceback" not in gw.read_log()


def test_reload_moves_the_metrics_endpoint(gateway):
    gw = gateway(config(RUSTLOG))
    assert "metrics" not in gw.ports_doc()
    doc = gw.reload(config(RUSTLOG, extra='metrics: {endpoint: "%s"}\n' % LOCAL))
    port = doc["metrics"]["port"]
    sock = connect(port)
    sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    assert answer.startswith(b"HTTP/1.0 200") and b"gateway_connections_open{" in answer


def test_sigterm_finishes_in_flight_produces_and_exits_0(gateway, directory):
    # fsync every 1.5 s: produces wait that long to be durable, so SIGTERM
    # lands while they are in flight
    gw = gateway(config(RUSTLOG, storage=", fsync: interval, fsync_interval_ms: 1500"))
    [(_, port)] = gw.listeners()
    sock = connect(port)
    # the first fsync runs at once: let it, so the next ones wait
    assert rustlog_call(sock, produce("t", b"first"))
    requests = []
    for i in range(20):
        payload = orjson.dumps(produce("t", b"r%d" % i))
        requests.append(struct.pack(">I", len(payload)) + payload)
    sock.sendall(b"".join(requests))
    time.sleep(0.2)
    gw.proc.send_signal(signal.SIGTERM)
    deadline = time.time() + 5
    while not refused(port):                 # stops accepting at once
        assert time.time() < deadline
        time.sleep(0.02)
    sock.settimeout(20)
    answers = [orjson.loads(read_frame(sock)) for _ in range(20)]
    assert answers == [{"Produce": {"offsets": [i + 1]}} for i in range(20)]
    assert closed_by_peer(sock)
    assert gw.proc.wait(30) == 0
    gw.proc = None
    log = gw.read_log()
    assert "Traceback" not in log
    # everything acknowledged is there after a restart
    again = gateway(config(RUSTLOG))
    [(_, port)] = again.listeners()
    reply = rustlog_call(connect(port), {"Fetch": {"topic": "t", "partition": 0, "offset": 0,
                                                   "max_bytes": 1 << 20}})
    assert reply["Fetch"]["next_offset"] == 21


def test_twistd_reloads_on_sighup(directory):
    twistd = os.path.join(os.path.dirname(sys.executable), "twistd")
    path = os.path.join(directory, "config.yaml")
    with open(path, "w") as f:
        f.write(config(RUSTLOG))
    out = open(os.path.join(directory, "twistd.out"), "wb")
    proc = subprocess.Popen([twistd, "-n", "--pidfile=", "gateway", "-c", path],
                            stdout=out, stderr=subprocess.STDOUT, cwd=directory)

    def log():
        with open(os.path.join(directory, "twistd.out"), "rb") as f:
            return f.read().decode("utf-8", "replace")

    def wait_for(pattern, count=1):
        deadline = time.time() + 30
        while len(re.findall(pattern, log())) < count:
            assert proc.poll() is None, log()
            assert time.time() < deadline, log()
            time.sleep(0.05)
        return re.findall(pattern, log())
    try:
        wait_for(r"rustlog listening on 127\.0\.0\.1:(\d+)")
        with open(path, "w") as f:
            f.write(config(RUSTLOG, TANK))
        proc.send_signal(signal.SIGHUP)
        [port] = wait_for(r"tank listening on 127\.0\.0\.1:(\d+)")
        sock = connect(int(port))
        assert read_exact(sock, 5)[0] == 0x03
        sock.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        # twistd re-raises SIGTERM on itself after a clean stop
        assert proc.wait(30) == -signal.SIGTERM
        out.close()
    assert "config reloaded: 1 listener(s) kept, 1 added, 0 removed" in log()


# -- in-process: what a reload changes inside a running gateway -------------------------


class InProcessReloadTests(OpsTest):

    def parsed(self, listeners, **sections):
        doc = {"storage": {"path": self.directory, "fsync": "never"},
               "listeners": listeners, **sections}
        return parse_config(doc, self.directory, find_dialects())

    @defer.inlineCallbacks
    def test_kept_listeners_take_new_limits_and_rules(self):
        yield self.start([{"dialect": "figg", "endpoint": LOCAL}])
        factory = self.listener(0).factory
        self.assertEqual((factory.max_unacked, factory.write_chunk), (1024, 1024 * 1024 - 65536))
        bound = yield self.service.reload(self.parsed(
            [{"dialect": "figg", "endpoint": LOCAL, "access": {"mode": "read-only"},
              "limits": {"max_in_flight": 16, "max_buffered_bytes": 262144}}],
            topics={"auto_create": False}))
        self.assertIs(self.listener(0).factory, factory)              # the same listener
        self.assertEqual(bound[0][1].port, self.ports[0])
        self.assertEqual((factory.max_unacked, factory.write_chunk), (16, 262144 - 65536))
        self.assertTrue(self.service.views[self.listener(0)].rules.read_only)
        self.assertFalse(self.service.bus.topics.auto_create)

    @defer.inlineCallbacks
    def test_a_listener_that_cannot_bind_changes_nothing(self):
        yield self.start([{"dialect": "rustlog", "endpoint": LOCAL}])
        before = list(self.service.listeners)
        taken = f"tcp:{self.ports[0]}:interface=127.0.0.1"
        with self.assertRaises(ReloadRejected) as caught:
            yield self.service.reload(self.parsed(
                [{"dialect": "rustlog", "endpoint": LOCAL, "access": {"mode": "read-only"}},
                 {"dialect": "tank", "endpoint": LOCAL},
                 {"dialect": "kafka", "endpoint": taken}]))
        self.assertIn("listeners[2]: cannot listen", str(caught.exception))
        self.assertEqual(self.service.listeners, before)
        self.assertEqual(len(list(self.service)), 3)           # store, groups, one listener
        self.assertIsNone(self.service.views[before[0]].rules)
