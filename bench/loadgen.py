"""A load generator that measures the server, not itself.

Runs in its own process (``python -m bench.loadgen ...``), so the gateway
keeps a core to itself. Requests are encoded once before the clock starts;
each connection keeps ``--window`` requests in flight; replies are counted
from their length prefixes, and for fetches the record count comes from the
reply's ``next_offset`` (the batch header, so to speak) instead of parsing
records. Prints one JSON line: requests/s, records/s, bytes/s.
"""
import argparse
import json
import selectors
import socket
import struct
import time

_LEN = struct.Struct(">I")


def fetch_count(request_offsets):
    """Records in a JSON fetch reply: next_offset minus the requested offset."""
    def count(i, reply):
        at = reply.rfind(b'"next_offset":')
        nxt = int(reply[at + 14:reply.index(b"}", at)])
        return nxt - request_offsets[i]
    return count


def run(host, port, frames, per_reply, connections, window, seconds, header=_LEN,
        length_field=0, skip=None):
    """Send ``frames`` round-robin on each connection; ``per_reply(i, reply)``
    says how many records reply ``i`` (of frame ``i``) carried.

    Replies are cut with ``header`` (a ``struct.Struct`` whose field
    ``length_field`` is the body length: ``u32 BE`` by default, as RustLog and
    Kafka frame); a reply for which ``skip(fields)`` is true (a TANK ping)
    answers no request."""
    sel = selectors.DefaultSelector()
    conns = []
    for _ in range(connections):
        s = socket.create_connection((host, port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        conn = {"sock": s, "buf": bytearray(), "sent": 0, "inflight": [], "next": 0}
        conns.append(conn)
        sel.register(s, selectors.EVENT_READ, conn)
    requests = records = nbytes = 0
    started = time.perf_counter()
    deadline = started + seconds

    def fill(conn):
        out = []
        while len(conn["inflight"]) < window:
            i = conn["next"]
            conn["next"] = (i + 1) % len(frames)
            conn["inflight"].append(i)
            out.append(frames[i])
        if out:
            conn["sock"].setblocking(True)
            conn["sock"].sendall(b"".join(out))
            conn["sock"].setblocking(False)

    for conn in conns:
        fill(conn)
    stopping = False
    while True:
        now = time.perf_counter()
        if now >= deadline:
            stopping = True
        if stopping and all(not c["inflight"] for c in conns):
            break
        for key, _ in sel.select(timeout=1.0):
            conn = key.data
            try:
                data = conn["sock"].recv(1 << 20)
            except BlockingIOError:
                continue
            if not data:
                raise SystemExit("server closed the connection")
            buf = conn["buf"]
            buf += data
            pos = 0
            size = header.size
            while len(buf) - pos >= size:
                fields = header.unpack_from(buf, pos)
                n = fields[length_field]
                if len(buf) - pos - size < n:
                    break
                reply = bytes(buf[pos + size:pos + size + n])
                pos += size + n
                if skip is not None and skip(fields):
                    continue
                i = conn["inflight"].pop(0)
                requests += 1
                records += per_reply(i, reply)
                nbytes += n + size
            del buf[:pos]
            if not stopping:
                fill(conn)
    elapsed = time.perf_counter() - started
    for conn in conns:
        conn["sock"].close()
    return {"requests_per_s": requests / elapsed, "records_per_s": records / elapsed,
            "reply_bytes_per_s": nbytes / elapsed}


def json_produce(topic, partition, record_size, records):
    values = [[(i + j) % 256 for j in range(record_size)] for i in range(records)]
    body = json.dumps({"Produce": {"topic": topic, "partition": partition, "records": values}},
                      separators=(",", ":")).encode()
    return _LEN.pack(len(body)) + body


def json_fetch(topic, partition, offset, max_bytes):
    body = json.dumps({"Fetch": {"topic": topic, "partition": partition, "offset": offset,
                                 "max_bytes": max_bytes, "group_id": None}},
                      separators=(",", ":")).encode()
    return _LEN.pack(len(body)) + body


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["produce", "fetch"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--topic", default="bench")
    p.add_argument("--partitions", type=int, default=1)
    p.add_argument("--records", type=int, default=1, help="records per produce request")
    p.add_argument("--record-size", type=int, default=100)
    p.add_argument("--fetch-bytes", type=int, default=64 * 1024)
    p.add_argument("--fetch-range", type=int, default=0, help="offsets to cycle through")
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--window", type=int, default=32)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--fixed-count", type=int, default=0,
                   help="records per reply, for the canned-reply baseline")
    a = p.parse_args()
    if a.mode == "produce":
        frames = [json_produce(a.topic, i % a.partitions, a.record_size, a.records)
                  for i in range(a.partitions)]
        result = run(a.host, a.port, frames, lambda i, r: a.records, a.connections, a.window,
                     a.seconds)
    else:
        step = max(1, a.fetch_bytes // a.record_size)
        offsets = list(range(0, max(a.fetch_range - step, 1), step))
        frames = [json_fetch(a.topic, 0, o, a.fetch_bytes) for o in offsets]
        count = (lambda i, r: a.fixed_count) if a.fixed_count else fetch_count(offsets)
        result = run(a.host, a.port, frames, count, a.connections, a.window, a.seconds)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
