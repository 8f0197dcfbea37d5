"""Pravega over loopback: the gateway as a subprocess, the load from another.

Scenarios (issue 6 targets, fsync never):

- append: blocks of 100 events x 100 B, each an AppendBlock + AppendBlockEnd
  as the Java client sends them, pipelined on 8 connections (one writer
  each, one segment); target at least 500,000 events/s. Also under the
  default ``interval`` policy.
- read: ReadSegment of the event-framed view with the Rust client's 8 MiB
  ask (served as 2 MiB replies) and with 64 KiB asks, pipelined on 4
  connections over a segment filled first; target at least 150 MB/s.

Beside each figure: the ratio to a raw-loopback baseline measured in the same
run with the same load generator, a Twisted server with the gateway's
framing that answers canned replies of the same size (``echo`` below).

This module is also the two helper processes:
``python -m bench.pravega load {append,read} --port P ...`` (the load
generator; prints one JSON line) and ``python -m bench.pravega echo
--ports-file F`` (the baseline server).
"""
import argparse
import json
import os
import selectors
import socket
import statistics
import struct
import time

from bench.procs import Gateway, ServerProcess, run_json, serve_port0
from plugins.pravega import codec as pc

SEGMENT = "gateway/bench/0.#epoch.0"
EVENTS_PER_BLOCK = 100
EVENT_BYTES = 100
MiB = 1024 * 1024

_END = struct.Struct(">ii16siiiqq")        # AppendBlockEnd with empty data


# -- load generator (its own process) ----------------------------------------------------

class _Conn:
    def __init__(self, host, port):
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.inflight = 0

    def call(self, command):
        """Blocking request/reply, for the setup before the clock starts."""
        self.sock.sendall(pc.encode(command))
        while True:
            frame = self._frame()
            if frame is not None:
                return frame
            data = self.sock.recv(1 << 20)
            if not data:
                raise SystemExit("server closed the connection")
            self.buf += data

    def _frame(self):
        if len(self.buf) < 8:
            return None
        code, n = pc.HEADER.unpack_from(self.buf)
        if len(self.buf) < 8 + n:
            return None
        body = bytes(self.buf[8:8 + n])
        del self.buf[:8 + n]
        return pc.decode(code, body)


def _run(conns, send_more, on_reply, window, seconds):
    """Keep ``window`` requests in flight per connection for ``seconds``;
    ``on_reply(code, length)`` counts each reply frame by its header only."""
    sel = selectors.DefaultSelector()
    for conn in conns:
        conn.sock.setblocking(False)
        sel.register(conn.sock, selectors.EVENT_READ, conn)
    started = time.perf_counter()
    deadline = started + seconds
    for conn in conns:
        send_more(conn, window)
    stopping = False
    while True:
        if time.perf_counter() >= deadline:
            stopping = True
        if stopping and all(c.inflight == 0 for c in conns):
            break
        for key, _ in sel.select(timeout=1.0):
            conn = key.data
            try:
                data = conn.sock.recv(4 << 20)
            except BlockingIOError:
                continue
            if not data:
                raise SystemExit("server closed the connection")
            buf = conn.buf
            buf += data
            pos = 0
            have = len(buf)
            answered = 0
            while have - pos >= 8:
                code, n = pc.HEADER.unpack_from(buf, pos)
                if have - pos - 8 < n:
                    break
                on_reply(code, n)
                pos += 8 + n
                answered += 1
            del buf[:pos]
            conn.inflight -= answered
            if answered and not stopping:
                send_more(conn, answered)
    elapsed = time.perf_counter() - started
    for conn in conns:
        conn.sock.close()
    return elapsed


def load_append(host, port, connections, window, seconds):
    """Blocks of EVENTS_PER_BLOCK events; returns events/s and bytes/s."""
    value = bytes(range(EVENT_BYTES))
    data = pc.frame_events([value] * EVENTS_PER_BLOCK)
    conns = []
    for _ in range(connections):
        conn = _Conn(host, port)
        conn.call(pc.Hello())
        conn.writer = os.urandom(16)
        setup = conn.call(pc.SetupAppend(1, conn.writer, SEGMENT, ""))
        conn.number = max(setup.last_event_number, 0)
        conn.block = pc.encode(pc.AppendBlock(conn.writer, data))
        conns.append(conn)
    counts = {"acks": 0}

    def send_more(conn, n):
        out = []
        for _ in range(n):
            conn.number += EVENTS_PER_BLOCK
            out.append(conn.block)
            out.append(_END.pack(pc.APPEND_BLOCK_END, _END.size - 8, conn.writer, len(data), 0,
                                 EVENTS_PER_BLOCK, conn.number, conn.number))
        conn.inflight += n
        conn.sock.setblocking(True)
        conn.sock.sendall(b"".join(out))
        conn.sock.setblocking(False)

    def on_reply(code, n):
        if code != pc.DATA_APPENDED:
            raise SystemExit(f"unexpected reply type {code}")
        counts["acks"] += 1
    elapsed = _run(conns, send_more, on_reply, window, seconds)
    events = counts["acks"] * EVENTS_PER_BLOCK
    return {"events_per_s": events / elapsed,
            "bytes_per_s": events * EVENT_BYTES / elapsed}


def load_read(host, port, connections, window, seconds, read_bytes):
    """ReadSegments of ``read_bytes`` across the segment; returns bytes/s of
    SegmentRead data."""
    conns = []
    for _ in range(connections):
        conn = _Conn(host, port)
        conn.call(pc.Hello())
        conns.append(conn)
    info = conns[0].call(pc.GetStreamSegmentInfo(1, SEGMENT, ""))
    tail = info.write_offset
    if tail == 0:
        raise SystemExit("nothing to read")
    serve = min(read_bytes, pc.MAX_READ_BYTES)
    # odd offsets too: reads start and end inside events
    offsets = list(range(0, max(tail - serve, 1), serve - 13))
    frames = [pc.encode(pc.ReadSegment(SEGMENT, o, read_bytes, "", i + 1))
              for i, o in enumerate(offsets)]
    overhead = len(pc.encode(pc.SegmentRead(SEGMENT, 0, False, False, b"", 0))) - 8
    counts = {"bytes": 0, "next": 0}

    def send_more(conn, n):
        out = []
        for _ in range(n):
            out.append(frames[counts["next"] % len(frames)])
            counts["next"] += 1
        conn.inflight += n
        conn.sock.setblocking(True)
        conn.sock.sendall(b"".join(out))
        conn.sock.setblocking(False)

    def on_reply(code, n):
        if code != pc.SEGMENT_READ:
            raise SystemExit(f"unexpected reply type {code}")
        counts["bytes"] += n - overhead
    elapsed = _run(conns, send_more, on_reply, window, seconds)
    return {"bytes_per_s": counts["bytes"] / elapsed}


# -- the raw-loopback baseline (its own process) ------------------------------------------

def echo(ports_file, read_reply_bytes):
    """A Twisted server with the Pravega framing answering canned replies:
    Hello and AppendSetup to the setup, a DataAppended to each
    AppendBlockEnd, a SegmentRead of ``read_reply_bytes`` to each read."""
    from twisted.internet.protocol import Factory

    from gateway.framing import FramedProtocol

    data_appended = pc.encode(pc.DataAppended(bytes(16), 100, 0, 1, 10800))
    segment_read = b"".join(pc.segment_read_chunks(SEGMENT, 0, False, False,
                                                   [bytes(read_reply_bytes)], 1))

    class Canned(FramedProtocol):
        header = pc.HEADER
        length_field = 1
        max_frame_bytes = pc.MAX_FRAME_BYTES

        def connectionMade(self):
            self.transport.setTcpNoDelay(True)

        def frameReceived(self, fields, body):
            code = fields[0]
            if code == pc.APPEND_BLOCK_END:
                self.transport.write(data_appended)
            elif code == pc.READ_SEGMENT:
                self.transport.write(segment_read)
            elif code == pc.HELLO:
                self.transport.write(pc.encode(pc.Hello()))
            elif code == pc.SETUP_APPEND:
                setup = pc.decode(code, body)
                self.transport.write(pc.encode(pc.AppendSetup(
                    setup.request_id, setup.segment, setup.writer_id, pc.NO_EVENT_NUMBER)))
            elif code == pc.GET_STREAM_SEGMENT_INFO:
                info = pc.decode(code, body)
                self.transport.write(pc.encode(pc.StreamSegmentInfo(
                    info.request_id, info.segment, True, False, False, 0, 64 * MiB, 0)))

        def frameTooLarge(self, fields):
            self.transport.loseConnection()

    serve_port0(Factory.forProtocol(Canned), ports_file)


# -- the suite ------------------------------------------------------------------------------

def _load(port, *args):
    return run_json("bench.pravega", "load", *args, "--port", str(port))


def _echo(read_reply_bytes=0):
    """The baseline server as a subprocess."""
    return ServerProcess("bench.pravega", "echo", "--read-reply-bytes", str(read_reply_bytes),
                         prefix="gw-echo-")


def measure(runs, seconds):
    """Blocking: every scenario ``runs`` times; returns table rows."""
    rows = []
    append_args = ["append", "--connections", "8", "--window", "8", "--seconds", str(seconds)]
    echo = _echo()
    try:
        base = statistics.median(_load(echo.port, *append_args)["events_per_s"]
                                 for _ in range(runs))
    finally:
        echo.stop()
    for fsync in ("never", "interval"):
        figures = []
        for _ in range(runs):
            gw = Gateway(fsync, dialects=("pravega",))
            try:
                figures.append(_load(gw.port, *append_args)["events_per_s"])
            finally:
                gw.stop()
        events = statistics.median(figures)
        rows.append(("pravega append 100 x 100 B blocks", f"fsync {fsync}", events,
                     events * EVENT_BYTES / 1e6, events / base,
                     "≥ 500,000 events/s" if fsync == "never" else ""))
    rows.append(("raw loopback, same load", "baseline", base, base * EVENT_BYTES / 1e6, 1.0, ""))

    for ask, served, label in ((8 * MiB, pc.MAX_READ_BYTES, "8 MiB asks (2 MiB replies)"),
                               (64 * 1024, 64 * 1024, "64 KiB asks")):
        read_args = ["read", "--connections", "4", "--window", "4", "--seconds", str(seconds),
                     "--read-bytes", str(ask)]
        echo = _echo(served)
        try:
            base = statistics.median(_load(echo.port, *read_args)["bytes_per_s"]
                                     for _ in range(runs))
        finally:
            echo.stop()
        figures = []
        for _ in range(runs):
            gw = Gateway("never", dialects=("pravega",))
            try:
                _load(gw.port, "append", "--connections", "2", "--window", "8",
                      "--seconds", "1.5")
                figures.append(_load(gw.port, *read_args)["bytes_per_s"])
            finally:
                gw.stop()
        rate = statistics.median(figures)
        rows.append((f"pravega read, {label}", "fsync never", rate / (EVENT_BYTES + 8),
                     rate / 1e6, rate / base, "≥ 150 MB/s"))
        rows.append((f"raw loopback, {label}", "baseline", base / (EVENT_BYTES + 8), base / 1e6,
                     1.0, ""))
    return rows


def table(reactor, runs, seconds):
    from twisted.internet import threads

    from bench.table import print_table

    def show(rows):
        print_table("Pravega over loopback, fsync never unless said (ratio to raw loopback; "
                    "read events/s = MB/s / 108 B)",
                    ("scenario", "policy", "events/s", "MB/s", "ratio", "target"), rows)
    return threads.deferToThread(measure, runs, seconds).addCallback(show)


def main():
    p = argparse.ArgumentParser(prog="python -m bench.pravega")
    sub = p.add_subparsers(dest="command", required=True)
    load = sub.add_parser("load")
    load.add_argument("mode", choices=["append", "read"])
    load.add_argument("--host", default="127.0.0.1")
    load.add_argument("--port", type=int, required=True)
    load.add_argument("--connections", type=int, default=8)
    load.add_argument("--window", type=int, default=8)
    load.add_argument("--seconds", type=float, default=2.0)
    load.add_argument("--read-bytes", type=int, default=8 * MiB)
    server = sub.add_parser("echo")
    server.add_argument("--ports-file", required=True)
    server.add_argument("--read-reply-bytes", type=int, default=0)
    a = p.parse_args()
    if a.command == "echo":
        echo(a.ports_file, a.read_reply_bytes)
    elif a.mode == "append":
        print(json.dumps(load_append(a.host, a.port, a.connections, a.window, a.seconds)))
    else:
        print(json.dumps(load_read(a.host, a.port, a.connections, a.window, a.seconds,
                                   a.read_bytes)))


if __name__ == "__main__":
    main()
