"""Logs: structured ``twisted.logger`` events (dialect, listener, peer,
topic as fields), one line per connection open and close and per protocol
error, never a traceback for a client's bad input, whatever the dialect;
``gateway run --log-format json`` writes one JSON event a line."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

from twisted.internet import defer

from plugins.rustlog import codec as rc
from tests.ops_support import DIALECTS, LOCAL, LogLines, OpsTest, eventually, raw_connect

#: bytes no dialect can make sense of: each answers or closes in its own way
GARBAGE = b"\xff\xfe\x00\x01garbage\xff" * 16


class LogTests(OpsTest):

    @defer.inlineCallbacks
    def test_connection_lines_carry_their_facts_as_fields(self):
        logs = LogLines(self)
        yield self.start([{"dialect": "rustlog", "endpoint": LOCAL}])
        conn = yield raw_connect(self, self.ports[0])
        peer = f"127.0.0.1:{conn.transport.getHost().port}"
        conn.transport.write(b"\x00\x00\x00\x02{]")
        yield eventually(lambda: len(conn.data) > 0)
        conn.transport.loseConnection()
        yield conn.lost
        yield eventually(lambda: logs.matching(log_namespace="gateway.protocol",
                                               bytes_out=len(conn.data)))
        [opened] = [e for e in logs.matching(log_namespace="gateway.protocol")
                    if "connection from" in e["log_format"] and "closed" not in e["log_format"]]
        [closed] = logs.matching(log_namespace="gateway.protocol", bytes_in=6)
        for event in (opened, closed):
            self.assertEqual((event["dialect"], event["listener"]), ("rustlog", "listeners[0]"))
            self.assertEqual(event["peer"], peer)
        self.assertEqual(closed["bytes_out"], len(conn.data))
        self.assertGreaterEqual(closed["seconds"], 0)
        self.assertEqual(logs.failures(), [])

    @defer.inlineCallbacks
    def test_a_protocol_error_is_one_line_without_traceback(self):
        logs = LogLines(self)
        yield self.start([{"dialect": "rustlog", "endpoint": LOCAL}])
        conn = yield raw_connect(self, self.ports[0])
        conn.transport.write((rc.MAX_FRAME_BYTES + 1).to_bytes(4, "big"))
        yield conn.lost
        [line] = [e for e in logs.events if e.get("problem")]
        self.assertEqual(line["log_level"].name, "warn")
        self.assertEqual(line["problem"], f"frame of {rc.MAX_FRAME_BYTES + 1} bytes exceeds "
                                          f"{rc.MAX_FRAME_BYTES}")
        self.assertEqual(logs.failures(), [])

    @defer.inlineCallbacks
    def test_garbage_never_gets_a_traceback_in_any_dialect(self):
        logs = LogLines(self)
        yield self.start([{"dialect": d, "endpoint": LOCAL} for d in DIALECTS])
        for port in self.ports:
            conn = yield raw_connect(self, port)
            conn.transport.write(GARBAGE)
            conn.transport.loseConnection()
            yield conn.lost
        yield eventually(lambda: sum(len(self.connections(i)) for i in range(5)) == 0)
        self.assertEqual(logs.failures(), [])
        for i, dialect in enumerate(DIALECTS):
            closes = [e for e in logs.matching(listener=f"listeners[{i}]", dialect=dialect)
                      if "closed after" in e["log_format"]]
            self.assertEqual(len(closes), 1, dialect)


def test_json_log_format(tmp_path):
    directory = str(tmp_path)
    config = os.path.join(directory, "config.yaml")
    with open(config, "w") as f:
        f.write("storage: {path: ./data, fsync: never}\n"
                f"listeners: [{{dialect: rustlog, endpoint: \"{LOCAL}\"}}]\n")
    ports = os.path.join(directory, "ports.json")
    stderr = open(os.path.join(directory, "stderr"), "wb")
    proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "run", "-c", config,
                             "--ports-file", ports, "--log-format", "json"],
                            stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.time() + 30
        while not os.path.exists(ports):
            assert proc.poll() is None and time.time() < deadline
            time.sleep(0.05)
        with open(ports) as f:
            port = json.load(f)["listeners"][0]["port"]
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"\x00\x00\x00\x02{]")
            sock.recv(1000)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        stderr.close()
    with open(os.path.join(directory, "stderr")) as f:
        lines = [line for line in f.read().splitlines() if line]
    events = [json.loads(line) for line in lines]      # every line is one JSON event
    connection = [e for e in events if e.get("log_namespace") == "gateway.protocol"]
    opened, closed = connection
    assert opened["dialect"] == closed["dialect"] == "rustlog"
    assert opened["peer"] == closed["peer"] and opened["listener"] == "listeners[0]"
    assert opened["log_level"]["name"] == "info"
    assert closed["bytes_in"] == 6
    assert not any("log_failure" in e for e in events)
