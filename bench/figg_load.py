"""The Figg load generator: raw sockets in their own process, so the gateway
keeps a core to itself, and frames encoded before the clock starts.

``python -m bench.figg_load MODE --port P [options]`` prints one JSON line.

- ``publish``: each of ``--connections`` keeps ``--window`` PUBLISHes of
  ``--size`` bytes in flight, sending one more per ACK (every frame the
  gateway sends a publisher is a 16-byte ACK); reports ACKs per second.
- ``subscribe``: ``--connections`` subscribers ATTACH from offset 0 at once
  and read ``--count`` DATA frames each; reports DATA per second, all
  subscribers together, from the ATTACH to the last frame.
- ``fanout``: ``--connections`` subscribers ATTACH (latest), then one
  publisher publishes as in ``publish`` for ``--seconds``; reports the
  publisher's ACKs and the DATA delivered per second.
- ``latency``: one subscriber attached (latest), one publisher sending
  ``--rate`` PUBLISHes a second for ``--seconds``, each carrying its send
  time; reports the publish-to-DATA latency percentiles (after a warm-up
  of ``--warmup`` seconds, which is not counted).
"""
import argparse
import json
import selectors
import socket
import struct
import time

from plugins.figg import codec as fc

HEADER = fc.HEADER
_TS = struct.Struct(">Q")


def connect(host, port):
    s = socket.create_connection((host, port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def send_all(sock, data):
    sock.setblocking(True)
    sock.sendall(data)
    sock.setblocking(False)


class Frames:
    """Cuts a byte stream into frames; ``feed`` returns the complete ones as
    ``(type, payload_start, payload_end)`` into ``self.buffer``."""

    def __init__(self):
        self.buffer = b""

    def feed(self, data):
        buf = self.buffer + data if self.buffer else data
        frames = []
        pos = 0
        end = len(buf)
        unpack = HEADER.unpack_from
        while end - pos >= 8:
            msg_type, _, n = unpack(buf, pos)
            if end - pos - 8 < n:
                break
            frames.append((msg_type, pos + 8, pos + 8 + n))
            pos += 8 + n
        self.current = buf
        self.buffer = buf[pos:]
        return frames


def wait_attached(sock):
    frames = Frames()
    sock.setblocking(True)
    while True:
        for msg_type, _, _ in frames.feed(sock.recv(1 << 16)):
            if msg_type == fc.ATTACHED:
                sock.setblocking(False)
                return frames.buffer


def publish(a):
    frame = fc.encode(fc.Publish(a.topic.encode(), 0, b"p" * a.size))
    ack = 16
    sel = selectors.DefaultSelector()
    conns = []
    for _ in range(a.connections):
        s = connect(a.host, a.port)
        s.setblocking(False)
        conn = {"sock": s, "rest": 0, "inflight": a.window}
        conns.append(conn)
        sel.register(s, selectors.EVENT_READ, conn)
    started = time.perf_counter()
    deadline = started + a.seconds
    for conn in conns:
        send_all(conn["sock"], frame * a.window)
    acked = 0
    stopping = False
    while True:
        if not stopping and time.perf_counter() >= deadline:
            stopping = True
        if stopping and all(c["inflight"] == 0 for c in conns):
            break
        for key, _ in sel.select(timeout=1.0):
            conn = key.data
            data = conn["sock"].recv(1 << 20)
            if not data:
                raise SystemExit("gateway closed the connection")
            got = conn["rest"] + len(data)
            n, conn["rest"] = divmod(got, ack)
            acked += n
            conn["inflight"] -= n
            if not stopping and n:
                send_all(conn["sock"], frame * n)
                conn["inflight"] += n
    elapsed = time.perf_counter() - started
    for conn in conns:
        conn["sock"].close()
    return {"messages_per_s": acked / elapsed, "messages": acked}


def count_data(conn, data):
    frames = conn["frames"].feed(data)
    conn["count"] += sum(1 for t, _, _ in frames if t == fc.DATA)


def subscribe(a):
    sel = selectors.DefaultSelector()
    conns = []
    attach = fc.encode(fc.Attach(a.topic.encode(), 0, fc.FROM_OFFSET))
    for _ in range(a.connections):
        s = connect(a.host, a.port)
        conns.append({"sock": s, "frames": Frames(), "count": 0})
    started = time.perf_counter()
    for conn in conns:
        conn["sock"].sendall(attach)
        conn["sock"].setblocking(False)
        sel.register(conn["sock"], selectors.EVENT_READ, conn)
    open_ = len(conns)
    while open_:
        events = sel.select(timeout=30.0)
        if not events:
            raise SystemExit(f"no DATA for 30 s; got {[c['count'] for c in conns]}")
        for key, _ in events:
            conn = key.data
            data = conn["sock"].recv(1 << 20)
            if not data:
                raise SystemExit("gateway closed the connection")
            count_data(conn, data)
            if conn["count"] >= a.count:
                sel.unregister(conn["sock"])
                open_ -= 1
    elapsed = time.perf_counter() - started
    total = sum(c["count"] for c in conns)
    for conn in conns:
        conn["sock"].close()
    return {"messages_per_s": total / elapsed, "messages": total}


def fanout(a):
    sel = selectors.DefaultSelector()
    subs = []
    attach = fc.encode(fc.Attach(a.topic.encode()))
    for _ in range(a.connections):
        s = connect(a.host, a.port)
        s.sendall(attach)
        conn = {"sock": s, "frames": Frames(), "count": 0, "sub": True}
        conn["frames"].feed(wait_attached(s))
        subs.append(conn)
        sel.register(s, selectors.EVENT_READ, conn)
    frame = fc.encode(fc.Publish(a.topic.encode(), 0, b"f" * a.size))
    pub = {"sock": connect(a.host, a.port), "rest": 0, "sub": False, "acked": 0}
    pub["sock"].setblocking(False)
    sel.register(pub["sock"], selectors.EVENT_READ, pub)
    started = time.perf_counter()
    deadline = started + a.seconds
    send_all(pub["sock"], frame * a.window)
    while time.perf_counter() < deadline:
        for key, _ in sel.select(timeout=0.5):
            conn = key.data
            data = conn["sock"].recv(1 << 20)
            if not data:
                raise SystemExit("gateway closed the connection")
            if conn["sub"]:
                count_data(conn, data)
                continue
            n, conn["rest"] = divmod(conn["rest"] + len(data), 16)
            conn["acked"] += n
            if n:
                send_all(conn["sock"], frame * n)
    elapsed = time.perf_counter() - started
    delivered = sum(c["count"] for c in subs)
    for conn in subs + [pub]:
        conn["sock"].close()
    return {"published_per_s": pub["acked"] / elapsed, "delivered_per_s": delivered / elapsed}


def latency(a):
    topic = a.topic.encode()
    sub = connect(a.host, a.port)
    sub.sendall(fc.encode(fc.Attach(topic)))
    frames = Frames()
    frames.feed(wait_attached(sub))
    pub = connect(a.host, a.port)
    pub.setblocking(False)
    pad = b"l" * (a.size - 8)
    sel = selectors.DefaultSelector()
    sel.register(sub, selectors.EVENT_READ, "sub")
    sel.register(pub, selectors.EVENT_READ, "pub")
    samples = []
    interval = 1.0 / a.rate
    started = time.perf_counter()
    measure_from = started + a.warmup
    deadline = measure_from + a.seconds
    sent = 0
    received = 0
    while True:
        now = time.perf_counter()
        if now < deadline:
            due = int((now - started) / interval) + 1 - sent
            if due > 0:
                stamp = time.perf_counter_ns()
                out = b"".join(fc.encode(fc.Publish(topic, sent + i, _TS.pack(stamp) + pad))
                               for i in range(due))
                send_all(pub, out)
                sent += due
        elif received >= sent:
            break
        elif now > deadline + 10:
            raise SystemExit(f"only {received} of {sent} messages arrived")
        wait = max(0.0, started + sent * interval - time.perf_counter())
        for key, _ in sel.select(timeout=min(wait, 0.05) if now < deadline else 0.05):
            if key.data == "pub":
                if not pub.recv(1 << 20):
                    raise SystemExit("gateway closed the connection")
                continue
            data = sub.recv(1 << 20)
            if not data:
                raise SystemExit("gateway closed the connection")
            arrived = time.perf_counter_ns()
            for msg_type, start, end in frames.feed(data):
                if msg_type != fc.DATA:
                    continue
                received += 1
                buf = frames.current
                (n,) = struct.unpack_from(">I", buf, start)
                (stamp,) = _TS.unpack_from(buf, start + 4 + n + 12)
                if stamp >= measure_from * 1e9:
                    samples.append((arrived - stamp) / 1e6)
    sub.close()
    pub.close()
    samples.sort()

    def pct(p):
        return samples[min(len(samples) - 1, int(p / 100 * len(samples)))]
    return {"p50_ms": pct(50), "p99_ms": pct(99), "max_ms": samples[-1],
            "messages": len(samples), "rate": len(samples) / a.seconds}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["publish", "subscribe", "fanout", "latency"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--topic", default="bench")
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--connections", type=int, default=1)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--count", type=int, default=0, help="subscribe: DATA per subscriber")
    p.add_argument("--rate", type=float, default=5000.0, help="latency: PUBLISHes per second")
    p.add_argument("--warmup", type=float, default=0.5)
    a = p.parse_args()
    result = {"publish": publish, "subscribe": subscribe, "fanout": fanout,
              "latency": latency}[a.mode](a)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
