"""A TANK load generator that measures the server, not itself.

Runs in its own process (``python -m bench.tank_loadgen ...``), so the
gateway keeps a core to itself. Requests are encoded once before the clock
starts; each connection keeps ``--window`` requests in flight and matches
answers first in, first out (nothing here parks, so a TANK broker answers in
order). Produce replies count the messages their bundle held; Consume
replies are counted from the bundle headers of their chunk (the messages at
or after the requested seq), without decoding messages. Prints one JSON
line: requests/s, records/s, reply bytes/s.

``idle`` mode parks ``--connections`` consumers at the tail for
``--seconds`` and prints nothing but ``{}``: the benchmark measures the
gateway's CPU meanwhile.
"""
import argparse
import json
import random
import socket
import struct
import time

from bench import loadgen
from plugins.tank import codec as c

_ENTRY = struct.Struct("<HBQQI")


def consume_count(requested):
    """Messages in a Consume reply at or after the seq request ``i`` asked for."""
    def count(i, reply):
        header_len = struct.unpack_from("<I", reply, 0)[0]
        pos = 4 + 4 + 1
        pos += 1 + reply[pos]           # topic str8
        pos += 1                        # partsCnt
        _, flags, base, _, chunk_len = _ENTRY.unpack_from(reply, pos)
        if flags != c.FETCH_OK or not chunk_len:
            return 0
        pos = 4 + header_len
        end = pos + chunk_len
        total = 0
        while pos < end:
            size, pos = c.decode_varint(reply, pos)
            total += c.bundle_count(reply[pos:pos + 6])
            pos += size
        return max(base + total - requested[i], 0)
    return count


def connect(host, port):
    s = socket.create_connection((host, port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def run(host, port, frames, per_reply, connections, window, seconds):
    """``bench.loadgen.run`` with TANK framing; the broker's pings answer nothing."""
    return loadgen.run(host, port, frames, per_reply, connections, window, seconds,
                       header=c.FRAME_HEADER, length_field=1,
                       skip=lambda fields: fields[0] == c.PING)


def bundle_100(i, record_size, compress):
    """100 messages of random bytes (so Snappy gains nothing), one timestamp."""
    rand = random.Random(i)
    values = [rand.randbytes(record_size) for _ in range(100)]
    return c.encode_bundle(values, timestamps=[1_700_000_000_000] * 100, compress=compress)


def produce_frames(topic, record_size, compress, count=16):
    return [c.encode_request(c.ProduceRequest(i, (c.ProduceTopic(topic, (c.ProducePartition(
        0, bundle_100(i, record_size, compress)),)),))) for i in range(count)]


def high_watermark(host, port, topic):
    s = connect(host, port)
    s.sendall(c.encode_request(c.DiscoverPartitionsRequest(1, topic, (0,))))
    buf = b""
    while True:
        buf += s.recv(1 << 16)
        while len(buf) >= 5:
            msg_id, n = c.FRAME_HEADER.unpack_from(buf)
            if len(buf) < 5 + n:
                break
            if msg_id == c.DISCOVER_PARTITIONS:
                s.close()
                return c.decode_response(msg_id, buf[5:5 + n]).partitions[0].hw_mark
            buf = buf[5 + n:]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["produce", "consume", "idle"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--topic", default="bench")
    p.add_argument("--record-size", type=int, default=100)
    p.add_argument("--snappy", action="store_true")
    p.add_argument("--fetch-bytes", type=int, default=64 * 1024)
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--window", type=int, default=32)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--fixed-count", type=int, default=0,
                   help="records per reply, for the canned-reply baseline")
    p.add_argument("--fetch-range", type=int, default=0,
                   help="seqs to cycle through (default: the partition's hwMark)")
    a = p.parse_args()
    if a.mode == "produce":
        frames = produce_frames(a.topic, a.record_size, a.snappy)
        result = run(a.host, a.port, frames, lambda i, r: a.fixed_count or 100, a.connections,
                     a.window, a.seconds)
    elif a.mode == "consume":
        top = a.fetch_range or high_watermark(a.host, a.port, a.topic)
        step = max(1, a.fetch_bytes // (a.record_size + 2))
        seqs = list(range(1, max(top - step, 2), step))
        frames = [c.encode_request(c.ConsumeRequest(i, (c.ConsumeTopic(a.topic, (
            c.ConsumePartition(0, s, a.fetch_bytes),)),))) for i, s in enumerate(seqs)]
        count = (lambda i, r: a.fixed_count) if a.fixed_count else consume_count(seqs)
        result = run(a.host, a.port, frames, count, a.connections, a.window, a.seconds)
    else:
        socks = []
        for i in range(a.connections):
            s = connect(a.host, a.port)
            s.sendall(c.encode_request(c.ConsumeRequest(i, (c.ConsumeTopic(a.topic, (
                c.ConsumePartition(0, c.TAIL_SEQ, 4096),)),), 3600 * 1000)))
            socks.append(s)
        time.sleep(a.seconds)
        for s in socks:
            s.close()
        result = {}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
