"""Per-listener limits over real sockets, each enforced for every dialect:
``max_connections``, ``max_frame_bytes``, ``max_in_flight`` and
``max_buffered_bytes`` (the listener's ``limits:``, applied by the shared
protocol classes, not by the dialects)."""
import socket
import struct
import time
import uuid

from twisted.internet import defer, threads
from twisted.internet.endpoints import connectProtocol

from gateway import commands as cmd
from gateway.protocol import unsent_bytes
from gateway.records import RecordBatch
from plugins.figg import codec as fc
from plugins.kafka import codec as kc
from plugins.kafka.client import KafkaClient
from plugins.pravega import codec as pc
from plugins.rustlog.client import RustLogClientProtocol
from plugins.tank import codec as tc
from plugins.tank.client import TankClientProtocol
from tests.figg_support import RawFigg
from tests.ops_support import (
    DIALECTS, LOCAL, MiB, OpsTest, client_endpoint, eventually, raw_connect, sleep)

SEGMENT = "gateway/{}/0.#epoch.0"
WRITER = uuid.UUID(int=7).bytes


# -- requests as bytes, per dialect ------------------------------------------------

def rustlog_frame(payload):
    return struct.pack(">I", len(payload)) + payload


def rustlog_produce(topic, value):
    return rustlog_frame(b'{"Produce":{"topic":"%s","partition":0,"records":[[%s]]}}'
                         % (topic.encode(), b",".join(b"%d" % b for b in value)))


def rustlog_binary_fetch(topic, offset, max_bytes):
    name = topic.encode()
    return rustlog_frame(b"\x02" + struct.pack(">H", 0) + struct.pack(">H", len(name)) + name
                         + struct.pack(">IQI", 0, offset, max_bytes))


def tank_produce(req_id, topic, value):
    return tc.encode_request(tc.ProduceRequest(req_id, (tc.ProduceTopic(topic, (
        tc.ProducePartition(0, tc.encode_bundle([value])),)),), required_acks=1))


def tank_consume(req_id, topic, seq, size):
    return tc.encode_request(tc.ConsumeRequest(req_id, (tc.ConsumeTopic(topic, (
        tc.ConsumePartition(0, seq, size),)),)))


def kafka_produce(correlation, topic, value):
    return kc.encode_request(kc.PRODUCE, 0, correlation, "ops", kc.ProduceRequest(
        1, 10000, ((topic, ((0, kc.encode_message_set([(None, value)])),)),)))


def kafka_fetch(correlation, topic, offset, max_bytes):
    return kc.encode_request(kc.FETCH, 0, correlation, "ops", kc.FetchRequest(
        -1, 0, 0, ((topic, ((0, offset, max_bytes),)),)))


def pravega_append(number, value):
    data = pc.frame_events([value])
    return pc.encode(pc.AppendBlockEnd(WRITER, len(data), data, 1, number, number))


# -- counting answers in a byte stream ------------------------------------------------

class FrameCounter:
    """Counts the whole frames of a byte stream as it arrives, for a fixed
    header holding the body length; ``greeting`` frames the gateway sends
    unasked (TANK's Ping, Pravega's Hello) are not counted."""

    def __init__(self, header=">I", length_at=0, greeting=0):
        self.header = struct.Struct(header)
        self.length_at = length_at
        self.greeting = greeting
        self.data = bytearray()
        self.pos = 0
        self.frames = 0

    def feed(self, data):
        self.data += data
        size = self.header.size
        while len(self.data) - self.pos >= size:
            length = self.header.unpack_from(self.data, self.pos)[self.length_at]
            if len(self.data) - self.pos - size < length:
                break
            self.pos += size + length
            self.frames += 1
        del self.data[:self.pos]
        self.pos = 0
        return max(self.frames - self.greeting, 0)


COUNTERS = {
    "rustlog": lambda: FrameCounter(),
    "kafka": lambda: FrameCounter(),
    "tank": lambda: FrameCounter("<BI", 1, greeting=1),
    "figg": lambda: FrameCounter(">HHI", 2),
    "pravega": lambda: FrameCounter(">iI", 1, greeting=1),
}


def count_frames(dialect, data):
    return COUNTERS[dialect]().feed(data)


class LimitsTest(OpsTest):

    @defer.inlineCallbacks
    def start_one(self, dialect, limits, **sections):
        yield self.start([{"dialect": dialect, "endpoint": LOCAL, "limits": limits}], **sections)
        self.port = self.ports[0]
        self.factory = self.listener(0).factory
        self.view = self.service.views[self.listener(0)]

    def produce(self, topic, values):
        return self.service.bus.execute(cmd.Produce(topic, 0, RecordBatch(values)))


class MaxConnectionsTests(LimitsTest):
    """The connection over the limit is closed at once, with nothing said;
    a place freed is taken again."""

    @defer.inlineCallbacks
    def check(self, dialect):
        yield self.start_one(dialect, {"max_connections": 2})
        first = yield raw_connect(self, self.port)
        second = yield raw_connect(self, self.port)
        yield eventually(lambda: len(self.factory.connections) == 2)
        third = yield raw_connect(self, self.port)
        yield third.lost
        self.assertEqual((bytes(third.data), self.factory.refused_connections), (b"", 1))
        self.assertFalse(first.closed or second.closed)
        first.transport.loseConnection()
        yield eventually(lambda: len(self.factory.connections) == 1)
        fourth = yield raw_connect(self, self.port)
        yield eventually(lambda: len(self.factory.connections) == 2)
        yield sleep(0.05)
        self.assertFalse(fourth.closed)


class MaxFrameBytesTests(LimitsTest):
    """A request under the listener's frame limit is served; a frame
    announcing more is refused as the dialect refuses oversized frames,
    before its body is read."""

    LIMIT = 4096

    @defer.inlineCallbacks
    def check(self, dialect, serve, oversized, answer=b""):
        yield self.start_one(dialect, {"max_frame_bytes": self.LIMIT})
        yield serve()
        conn = yield raw_connect(self, self.port)
        yield eventually(lambda: len(self.factory.connections) >= 1)
        greeting = {"tank": tc.PING_FRAME}.get(dialect, b"")
        conn.transport.write(oversized)
        yield conn.lost
        self.assertEqual(bytes(conn.data[len(greeting):])[:len(answer)], answer)
        self.assertEqual(self.factory.closed_frame_errors, 1)

    @defer.inlineCallbacks
    def connect(self, proto):
        yield connectProtocol(client_endpoint(self.port), proto)
        self.addCleanup(lambda: proto.transport.loseConnection())
        return proto


class MaxInFlightTests(LimitsTest):
    """Ten produces pipelined in one write, while fsyncs are pending: the
    gateway takes at most about ``max_in_flight`` of them at a time (it
    stops reading at the limit, and the requests already read wait too),
    and answers all ten, in order, as they become durable."""

    LIMIT = 2

    @defer.inlineCallbacks
    def check(self, dialect, requests, prepare=None):
        yield self.start_one(dialect, {"max_in_flight": self.LIMIT},
                             storage={"fsync": "interval", "fsync_interval_ms": 20})
        yield self.produce("inflight", [b"seed"])
        conn = yield raw_connect(self, self.port, proto=RawConn())
        if prepare is not None:
            yield prepare(conn)
        seen = []
        execute = self.view.execute

        def watching(command):
            d = execute(command)
            seen.append(self.view.producing)
            return d
        self.view.execute = watching
        start = len(conn.data)
        conn.transport.write(b"".join(requests))
        yield eventually(lambda: self.service.store.offsets("inflight", 0).high_watermark == 11)
        # Pravega acknowledges the ten appends with one DataAppended or more
        yield eventually(lambda: count_frames(dialect, bytes(conn.data[start:])) >= 10
                         if dialect != "pravega" else appended(conn.data[start:], 10))
        self.assertEqual(len(seen), 10, seen)
        # one read brings all ten; without the limit all would be in flight
        self.assertLessEqual(max(seen), self.LIMIT + 2, seen)
        # in order: the first after the seed is the first sent
        stored = self.service.bus.decode(self.service.store.read("inflight", 0, 1, 1 << 20)[0])
        self.assertEqual(stored.since(1).values[0], b"r0")

    @defer.inlineCallbacks
    def check_figg(self, frames):
        """Figg counts PUBLISHes in flight as unacknowledged ones."""
        yield self.start_one("figg", {"max_in_flight": self.LIMIT},
                             storage={"fsync": "interval", "fsync_interval_ms": 20})
        conn = yield raw_connect(self, self.port, proto=RawFigg())
        seen = []
        execute = self.view.execute

        def watching(command):
            d = execute(command)
            seen.append(self.view.producing)
            return d
        self.view.execute = watching
        conn.transport.write(b"".join(frames))
        acks = yield conn.take(20)
        self.assertEqual(acks, [fc.Ack(i) for i in range(20)])
        self.assertEqual(len(seen), 20)
        self.assertLessEqual(max(seen), self.LIMIT + 2, seen)


class MaxBufferedBytesTests(LimitsTest):
    """A client asks for 16 MiB and reads nothing: the gateway keeps at most
    ``max_buffered_bytes`` unsent for it, plus the answer (or DATA chunk)
    being written when the limit was reached, and stops taking its
    requests; once the client reads, every answer arrives whole."""

    LIMIT = 256 * 1024
    ANSWER = MiB

    @defer.inlineCallbacks
    def check(self, dialect, requests, answers, limit=LIMIT, bound=None):
        yield self.start_one(dialect, {"max_buffered_bytes": limit})
        for i in range(80):
            yield self.produce("big", [bytes([i % 251]) * 100_000])
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        sock.connect(("127.0.0.1", self.port))
        self.addCleanup(sock.close)
        sock.sendall(b"".join(requests))
        yield eventually(lambda: self.factory.connections)
        [proto] = self.factory.connections
        peak = 0
        for _ in range(40):
            peak = max(peak, unsent_bytes(proto.transport.wrapped))
            yield sleep(0.02)
        bound = limit + self.ANSWER + 64 * 1024 if bound is None else bound
        self.assertGreater(peak, 64 * 1024)         # the client really stalled the gateway
        self.assertLessEqual(peak, bound)
        got = yield threads.deferToThread(read_frames, sock, COUNTERS[dialect](), answers)
        self.assertEqual(got, answers)


class RawConn(RawFigg):
    """Bytes as they come (``data``), whatever the dialect."""

    def __init__(self):
        super().__init__()
        self.data = bytearray()

    def dataReceived(self, data):
        self.data += data


def read_frames(sock, counter, wanted, timeout=30.0):
    """Blocking, in a thread: read until ``wanted`` frames have arrived."""
    sock.settimeout(timeout)
    got = 0
    deadline = time.monotonic() + timeout
    while got < wanted and time.monotonic() < deadline:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        got = counter.feed(chunk)
    return got


def appended(data, number):
    """Whether a DataAppended for event ``number`` is among Pravega replies."""
    data = bytes(data)
    pos = 0
    while len(data) - pos >= pc.HEADER_SIZE:
        code, length = pc.HEADER.unpack_from(data, pos)
        end = pos + pc.HEADER_SIZE + length
        if end > len(data):
            return False
        reply = pc.decode(code, data[pos + pc.HEADER_SIZE:end])
        pos = end
        if isinstance(reply, pc.DataAppended) and reply.event_number == number:
            return True
    return False


def _for_each_dialect(cls, make):
    for dialect in DIALECTS:
        setattr(cls, f"test_{dialect}", make(dialect))


_for_each_dialect(MaxConnectionsTests, lambda d: lambda self: self.check(d))


# -- max_frame_bytes: what each dialect serves just under the limit, and its
#    answer to a frame over it -----------------------------------------------------

def _frame_cases():
    value = b"v" * 3000
    over = MaxFrameBytesTests.LIMIT + 1000

    def rustlog(self):
        @defer.inlineCallbacks
        def serve():
            client = yield self.connect(RustLogClientProtocol())
            yield client.produce("frames", 0, [b"a" * 900])
        return self.check("rustlog", serve, struct.pack(">I", over),
                          rustlog_frame(b'{"Error":{"message":"max frame size exceeded"}}'))

    def tank(self):
        @defer.inlineCallbacks
        def serve():
            client = yield self.connect(TankClientProtocol())
            yield client.produce("frames", 0, [value])
        return self.check("tank", serve, struct.pack("<BI", tc.PRODUCE, over))

    def kafka(self):
        def serve():
            def run():
                with KafkaClient("127.0.0.1", self.port) as client:
                    client.produce("frames", 0, [(None, value)])
            return threads.deferToThread(run)
        return self.check("kafka", serve, struct.pack(">I", over))

    def figg(self):
        @defer.inlineCallbacks
        def serve():
            conn = yield raw_connect(self, self.port, proto=RawFigg())
            conn.send(fc.Publish(b"frames", 1, value))
            self.assertEqual((yield conn.take(1)), [fc.Ack(1)])
        return self.check("figg", serve, struct.pack(">HHI", fc.PUBLISH, 1, over))

    def pravega(self):
        @defer.inlineCallbacks
        def serve():
            conn = yield raw_connect(self, self.port, proto=RawConn())
            conn.transport.write(pc.encode(pc.Hello()) + pc.encode(
                pc.CreateSegment(1, SEGMENT.format("frames"))) + pc.encode(
                pc.SetupAppend(2, WRITER, SEGMENT.format("frames"))) + pravega_append(1, value))
            yield eventually(lambda: self.service.store.topics.get("frames") and
                             self.service.store.offsets("frames", 0).high_watermark == 1)
        header = struct.pack(">iI", pc.APPEND_BLOCK_END, over)
        return self.check("pravega", serve, header, b"")
    return {"rustlog": rustlog, "tank": tank, "kafka": kafka, "figg": figg, "pravega": pravega}


for _dialect, _case in _frame_cases().items():
    setattr(MaxFrameBytesTests, f"test_{_dialect}", _case)


# -- max_in_flight ----------------------------------------------------------------------

def _in_flight_cases():
    values = [b"r%d" % i for i in range(10)]

    def rustlog(self):
        return self.check("rustlog", [rustlog_produce("inflight", v) for v in values])

    def tank(self):
        return self.check("tank", [tank_produce(i + 1, "inflight", v)
                                   for i, v in enumerate(values)])

    def kafka(self):
        return self.check("kafka", [kafka_produce(i + 1, "inflight", v)
                                    for i, v in enumerate(values)])

    def figg(self):
        # Consecutive PUBLISHes to one topic are one batch; alternating
        # topics makes each one its own produce.
        frames = []
        for i, v in enumerate(values):
            frames.append(fc.encode(fc.Publish(b"inflight", 2 * i, v)))
            frames.append(fc.encode(fc.Publish(b"other", 2 * i + 1, v)))
        return self.check_figg(frames)

    def pravega(self):
        @defer.inlineCallbacks
        def prepare(conn):
            conn.transport.write(pc.encode(pc.Hello()) + pc.encode(
                pc.SetupAppend(100, WRITER, SEGMENT.format("inflight"))))
            yield eventually(lambda: count_frames("pravega", bytes(conn.data)) >= 1)
        return self.check("pravega", [pravega_append(i + 1, v) for i, v in enumerate(values)],
                          prepare)
    return {"rustlog": rustlog, "tank": tank, "kafka": kafka, "figg": figg, "pravega": pravega}


for _dialect, _case in _in_flight_cases().items():
    setattr(MaxInFlightTests, f"test_{_dialect}", _case)


# -- max_buffered_bytes ---------------------------------------------------------------------

def _buffered_cases():
    n = 16

    def rustlog(self):
        return self.check("rustlog", [rustlog_binary_fetch("big", 0, self.ANSWER)] * n, n)

    def tank(self):
        return self.check("tank", [tank_consume(i + 1, "big", 1, self.ANSWER)
                                   for i in range(n)], n)

    def kafka(self):
        return self.check("kafka", [kafka_fetch(i + 1, "big", 0, self.ANSWER)
                                    for i in range(n)], n)

    def figg(self):
        # One subscriber catching up on 8 MiB: Figg's own bound (1 MiB by
        # default) gives way to the listener's smaller one, which its DATA
        # frames (100 KB each) fit in.
        return self.check("figg", [fc.encode(fc.Attach(b"big", 0, fc.FROM_OFFSET))], 81,
                          limit=128 * 1024, bound=128 * 1024)

    def pravega(self):
        reads = [pc.encode(pc.ReadSegment(SEGMENT.format("big"), (i % 8) * MiB, MiB, "", i))
                 for i in range(n)]
        return self.check("pravega", [pc.encode(pc.Hello())] + reads, n)
    return {"rustlog": rustlog, "tank": tank, "kafka": kafka, "figg": figg, "pravega": pravega}


for _dialect, _case in _buffered_cases().items():
    setattr(MaxBufferedBytesTests, f"test_{_dialect}", _case)
