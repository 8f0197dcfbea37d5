"""TANK long-poll and flow control on a ``task.Clock`` (protocols/tank.md
§5.4, §7): the server protocol over a ``StringTransport``, its bus over a
real store with ``fsync: never``, so time moves only when a test says and
every bound is exact without being timing-fragile."""
import shutil

import pytest
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from gateway import commands as cmd
from gateway.bus import CommandBus
from gateway.config import LimitsConfig, ListenerConfig, TopicsConfig
from gateway.protocol import MAX_IN_FLIGHT
from gateway.records import RecordBatch
from plugins.tank import codec as c
from plugins.tank import dialect
from plugins.tank.server import TankFactory
from storage import LogStore, StoreSettings


class Env:
    """A TANK factory on a Clock-driven bus over a real store (fsync never)."""

    def __init__(self, path):
        self.clock = Clock()
        self.clock.advance(1_700_000_000)
        self.store = LogStore(StoreSettings(path=path, fsync="never"), reactor=self.clock)
        self.store.open()
        bus = CommandBus(self.store, TopicsConfig(default_partitions=2), LimitsConfig(),
                         reactor=self.clock)
        for fmt, decoder in dialect.formats.items():
            bus.formats.register(fmt, decoder)
        listener = ListenerConfig(0, "tank", "tcp:0", dialect.validate({}))
        self.bus = bus
        self.factory = TankFactory(bus.for_listener(listener), listener)

    def run(self, command):
        box = []
        self.bus.execute(command).addBoth(box.append)
        return box[0]

    def connect(self):
        proto = self.factory.buildProtocol(None)
        transport = StringTransport()
        proto.makeConnection(transport)
        return proto, transport

    def drop(self, proto):
        if proto.open:
            proto.connectionLost(None)


@pytest.fixture
def env(tmp_path):
    e = Env(str(tmp_path))
    yield e
    e.store.close()
    shutil.rmtree(str(tmp_path), ignore_errors=True)


def frames(data):
    """Decoded responses in ``data`` (the Ping skipped)."""
    out = []
    pos = 0
    while pos < len(data):
        msg_id, size = c.FRAME_HEADER.unpack_from(data, pos)
        if msg_id != c.PING:
            out.append(c.decode_response(msg_id, data[pos + 5:pos + 5 + size]))
        pos += 5 + size
    return out


def consume(req_id, parts, max_wait_ms, min_bytes=0):
    return c.encode_request(c.ConsumeRequest(req_id, (c.ConsumeTopic("t", tuple(
        c.ConsumePartition(p, seq, 1 << 20) for p, seq in parts)),), max_wait_ms, min_bytes))


def write(env, values, partition=0):
    """An append from another dialect, through the bus."""
    env.run(cmd.Produce("t", partition, RecordBatch(values)))


def entries(response):
    return [(e.partition, e.flags, e.base_seq, e.hw_mark, e.chunk_len)
            for e in response.topics[0].entries]


@pytest.mark.parametrize("asked, waits", [(1, 0.320), (320, 0.320), (321, 0.384),
                                          (1000, 1.024), (2 ** 64 - 1, 3600.0)])
def test_max_wait_is_clamped_and_rounded(env, asked, waits):
    write(env, [b"a"])
    proto, transport = env.connect()
    proto.dataReceived(consume(1, [(0, 2)], asked))
    env.clock.advance(waits - 0.0005)
    assert frames(transport.value()) == []
    env.clock.advance(0.001)
    [resp] = frames(transport.value())
    assert entries(resp) == [(0, 0, 0, 1, 0)]
    assert env.bus.parked == 0


def test_append_from_another_dialect_wakes_the_parked_consume(env):
    write(env, [b"a"], 0)
    write(env, [b"z"], 1)
    proto, transport = env.connect()
    proto.dataReceived(consume(1, [(0, 2), (1, c.TAIL_SEQ)], 60000))
    env.clock.advance(10)
    assert frames(transport.value()) == [] and env.bus.parked == 1
    write(env, [b"b", b"c"], 0)
    [resp] = frames(transport.value())
    assert entries(resp)[1] == (1, 0, 0, 1, 0)
    part0 = resp.topics[0].entries[0]
    assert (part0.flags, part0.base_seq, part0.hw_mark) == (0, 2, 3)
    messages, _ = c.decode_chunk(part0.chunk, part0.base_seq)
    assert [(s, v) for s, _, _, v in messages] == [(2, b"b"), (3, b"c")]


def test_min_bytes_counts_stored_bytes_across_partitions(env):
    write(env, [b"a"], 0)
    write(env, [b"a"], 1)
    proto, transport = env.connect()
    proto.dataReceived(consume(1, [(0, 2), (1, 2)], 60000, min_bytes=300))
    write(env, [b"x" * 100], 0)
    write(env, [b"y" * 100], 1)
    assert frames(transport.value()) == []
    write(env, [b"z" * 100], 1)
    [resp] = frames(transport.value())
    assert [(e.base_seq, e.hw_mark) for e in resp.topics[0].entries] == [(2, 2), (2, 3)]


def test_parked_consume_costs_nothing_while_idle(env):
    write(env, [b"a"])
    proto, transport = env.connect()
    reads = []
    original = env.store.read
    env.store.read = lambda *a: (reads.append(a), original(*a))[1]
    proto.dataReceived(consume(1, [(0, 2)], 3600 * 1000))
    reads.clear()
    assert len(env.clock.getDelayedCalls()) == 1         # the maxWait timer, nothing else
    for _ in range(100):
        env.clock.advance(1)
    assert reads == [] and frames(transport.value()) == []


def test_connection_loss_cancels_parked_consumes(env):
    write(env, [b"a"])
    proto, transport = env.connect()
    proto.dataReceived(consume(1, [(0, 2)], 60000) + consume(2, [(1, 1)], 60000))
    assert env.bus.parked == 2
    env.drop(proto)
    assert env.bus.parked == 0
    assert env.clock.getDelayedCalls() == []
    write(env, [b"b"])                       # nothing to answer, nothing breaks


def test_too_many_parked_requests_stop_reading(env):
    write(env, [b"a"])
    proto, transport = env.connect()
    proto.dataReceived(b"".join(consume(i, [(0, 2)], 60000) for i in range(MAX_IN_FLIGHT + 1)))
    assert transport.producerState == "paused"
    write(env, [b"b"])
    assert len(frames(transport.value())) == MAX_IN_FLIGHT + 1
    assert transport.producerState == "producing"


def test_full_send_buffer_stops_reading_until_it_drains(env):
    proto, transport = env.connect()
    assert transport.producer is proto
    proto.pauseProducing()              # what the transport does over its high-water mark
    assert transport.producerState == "paused"
    proto.resumeProducing()
    assert transport.producerState == "producing"


def test_answers_overtake_a_parked_consume(env):
    write(env, [b"a"])
    proto, transport = env.connect()
    proto.dataReceived(consume(1, [(0, 2)], 60000) +
                       c.encode_request(c.StatusRequest(2)))
    [status] = frames(transport.value())
    assert (type(status), status.req_id) == (c.StatusResponse, 2)
    write(env, [b"b"])
    consumed = frames(transport.value())[1]
    assert consumed.req_id == 1
