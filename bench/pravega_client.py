"""The real Pravega client (PyPI ``pravega``) writing through the gateway.

Scenario (issue 10's target): ``write_event_async`` of 100 B events to a
one-segment stream, as fast as one client process goes, with a window of
events in flight. Figures: events/s, and the CPU of the server and of the
client (user + system seconds of the process per second of the run, from
/proc): the gateway must not be the bottleneck, i.e. stay below one core
at the client's maximum rate.

Baseline, measured in the same invocation: the same client against
"nothing else" on the data path, a stub segment store (``stub`` below) that
acknowledges every append block at once without storing it. The stub is
reached through the gateway's controller (its ``segment_store`` option
points at the stub), which is only asked for metadata before the clock
starts. The ratio column is the gateway's rate over the stub's.

This module is also the helper processes: ``python -m bench.pravega_client
load --controller H:P --stream S`` (the client; prints one JSON line) and
``python -m bench.pravega_client stub --ports-file F``.
"""
import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from bench.procs import PYTHON, wait_for
from plugins.pravega import codec as pc

SCOPE = "bench"
EVENT_BYTES = 100
#: events in flight per client: enough to keep its blocks full
WINDOW = 4096


# -- the client (its own process) -------------------------------------------------------------

def load(controller, stream, seconds, window, out):
    """Write 100 B events with ``write_event_async`` for ``seconds``,
    ``window`` in flight. Writes ``go`` to ``out`` when the clock starts and
    one JSON line (acknowledged events/s) when it stops, so that the parent
    can sample the server's CPU over exactly that time."""
    import pravega_client
    manager = pravega_client.StreamManager(f"tcp://{controller}")
    manager.create_stream(SCOPE, stream, 1)
    writer = manager.create_writer(SCOPE, stream)
    # write_event_async takes text: 100 ASCII characters are 100 B
    payload = ("0123456789" * (EVENT_BYTES // 10 + 1))[:EVENT_BYTES]
    writer.write_event(payload)         # connections set up before the clock starts
    writer.flush()

    async def run():
        slots = asyncio.Semaphore(window)
        acked = [0]

        def done(_):
            acked[0] += 1
            slots.release()
        out.write("go\n")
        out.flush()
        started = time.perf_counter()
        deadline = started + seconds
        sent = 0
        while True:
            if sent % 256 == 0 and time.perf_counter() >= deadline:
                break
            await slots.acquire()
            writer.write_event_async(payload).add_done_callback(done)
            sent += 1
        for _ in range(window):
            await slots.acquire()
        return acked[0], time.perf_counter() - started
    events, elapsed = asyncio.run(run())
    out.write(json.dumps({"events_per_s": events / elapsed, "events": events,
                          "seconds": elapsed}) + "\n")
    out.flush()
    writer.flush()


# -- the stub segment store (its own process) ----------------------------------------------------

def stub(ports_file):
    """Hello, AppendSetup (a new writer) and an immediate DataAppended for
    every AppendBlockEnd, with the numbers the client checks; nothing
    stored."""
    from twisted.internet import reactor
    from twisted.internet.protocol import Factory

    from gateway.framing import FramedProtocol

    class Stub(FramedProtocol):
        header = pc.HEADER
        length_field = 1
        max_frame_bytes = pc.MAX_FRAME_BYTES

        def connectionMade(self):
            self.transport.setTcpNoDelay(True)
            self.acked = {}

        def frameReceived(self, fields, body):
            code = fields[0]
            if code == pc.APPEND_BLOCK_END:
                end = pc.decode(code, body)
                previous = self.acked.get(end.writer_id, pc.NO_EVENT_NUMBER)
                self.acked[end.writer_id] = end.last_event_number
                self.transport.write(pc.encode_data_appended(
                    end.writer_id, end.last_event_number, previous, end.request_id, 0))
            elif code == pc.HELLO:
                self.transport.write(pc.encode(pc.Hello()))
            elif code == pc.SETUP_APPEND:
                setup = pc.decode(code, body)
                self.transport.write(pc.encode(pc.AppendSetup(
                    setup.request_id, setup.segment, setup.writer_id, pc.NO_EVENT_NUMBER)))
            elif code == pc.KEEP_ALIVE:
                self.transport.write(pc.encode(pc.KeepAlive()))

        def frameTooLarge(self, fields):
            self.transport.loseConnection()

    factory = Factory.forProtocol(Stub)
    factory.noisy = False
    port = reactor.listenTCP(0, factory, interface="127.0.0.1")
    with open(ports_file + ".tmp", "w") as f:
        json.dump({"port": port.getHost().port}, f)
    os.replace(ports_file + ".tmp", ports_file)
    reactor.run()


# -- the suite ------------------------------------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    """User + system CPU seconds of a process so far (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Process:
    def __init__(self, args, ports_file):
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.ports = wait_for(ports_file, self.proc)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)


class Setup:
    """A gateway with a Pravega and a controller listener; with ``stubbed``,
    the controller sends clients to a stub segment store instead."""

    def __init__(self, fsync, stubbed):
        self.dir = tempfile.mkdtemp(prefix="gw-bench-pravega-")
        self.stub = None
        pravega_port = _free_port()
        segment_store = pravega_port
        if stubbed:
            self.stub = _Process([PYTHON, "-m", "bench.pravega_client", "stub", "--ports-file",
                                  os.path.join(self.dir, "stub.json")],
                                 os.path.join(self.dir, "stub.json"))
            segment_store = self.stub.ports["port"]
        config = os.path.join(self.dir, "config.yaml")
        with open(config, "w") as f:
            f.write(f"storage: {{path: ./data, fsync: {fsync}}}\nlisteners:\n"
                    f"  - {{dialect: pravega, endpoint: \"tcp:{pravega_port}:interface="
                    f"127.0.0.1\", scope: {SCOPE}}}\n"
                    f"  - {{dialect: pravega-controller, endpoint: \"tcp:0:interface=127.0.0.1\","
                    f" scope: {SCOPE}, segment_store: \"127.0.0.1:{segment_store}\"}}\n")
        ports = os.path.join(self.dir, "ports.json")
        self.gateway = _Process([PYTHON, "-m", "gateway.cli", "run", "-c", config,
                                 "--ports-file", ports], ports)
        controller = [e for e in self.gateway.ports["listeners"]
                      if e["dialect"] == "pravega-controller"][0]
        self.controller = f"127.0.0.1:{controller['port']}"
        #: the process serving the data path
        self.server = self.stub.proc if stubbed else self.gateway.proc

    def run(self, stream, seconds):
        """One client run; returns (events/s, cores the server used meanwhile,
        cores the client used)."""
        client = subprocess.Popen([PYTHON, "-m", "bench.pravega_client", "load",
                                   "--controller", self.controller, "--stream", stream,
                                   "--seconds", str(seconds)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if client.stdout.readline() != "go\n":
            raise RuntimeError(f"the client did not start: {client.communicate()[1][-2000:]}")
        before = cpu_seconds(self.server.pid), cpu_seconds(client.pid)
        line = client.stdout.readline()
        server_used = cpu_seconds(self.server.pid) - before[0]
        client_used = cpu_seconds(client.pid) - before[1]
        _, errors = client.communicate(timeout=60)
        if client.returncode != 0:
            raise RuntimeError(f"the client exited with {client.returncode}: {errors[-2000:]}")
        result = json.loads(line)
        seconds = result["seconds"]
        return result["events_per_s"], server_used / seconds, client_used / seconds

    def stop(self):
        self.gateway.stop()
        if self.stub is not None:
            self.stub.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def measure(runs, seconds):
    rows = []
    results = {}
    for label, fsync, stubbed in (("stub segment store (nothing else)", "never", True),
                                  ("gateway", "never", False),
                                  ("gateway", "interval", False)):
        setup = Setup(fsync, stubbed)
        try:
            figures = [setup.run(f"s{i}", seconds) for i in range(runs)]
        finally:
            setup.stop()
        rate, server, client = (statistics.median(f[i] for f in figures) for i in range(3))
        results[(label, fsync)] = rate
        rows.append([label, "—" if stubbed else f"fsync {fsync}", rate,
                     rate * EVENT_BYTES / 1e6, server, client])
    base = results[("stub segment store (nothing else)", "never")]
    for row in rows:
        row.append(row[2] / base)
    return [tuple(row) for row in rows]


def table(reactor, runs, seconds):
    from twisted.internet import threads

    from bench.table import print_table

    def show(rows):
        print_table("Real Pravega client (PyPI pravega), write_event_async of 100 B events, one "
                    "client, one segment (CPU in cores: the process serving appends, and the "
                    "client; ratio to the stub)",
                    ("server", "policy", "events/s", "MB/s", "server CPU", "client CPU",
                     "ratio"), rows)
    return threads.deferToThread(measure, runs, seconds).addCallback(show)


def main():
    p = argparse.ArgumentParser(prog="python -m bench.pravega_client")
    sub = p.add_subparsers(dest="command", required=True)
    client = sub.add_parser("load")
    client.add_argument("--controller", required=True)
    client.add_argument("--stream", required=True)
    client.add_argument("--seconds", type=float, default=5.0)
    client.add_argument("--window", type=int, default=WINDOW)
    server = sub.add_parser("stub")
    server.add_argument("--ports-file", required=True)
    a = p.parse_args()
    if a.command == "stub":
        stub(a.ports_file)
    else:
        load(a.controller, a.stream, a.seconds, a.window, sys.stdout)
        # The binding's runtime threads call back into Python while the
        # interpreter finalizes after thousands of async writes, which aborts
        # the process (observed: "PyGILState_Release: thread state ... must
        # be current"); everything is written and flushed by now.
        os._exit(0)


if __name__ == "__main__":
    main()
