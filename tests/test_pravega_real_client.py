"""The unmodified ``pravega`` client from PyPI (Rust core, wire version 15)
against the gateway: the conformance checklist of
protocols/pravega-clients.md §5, plus cross-dialect reads.

The client is blocking and runs its own Tokio runtime, so the gateway runs
as a subprocess (``gateway run``) with a Pravega, a controller, a Kafka, a
TANK and (where the dialect exists) a Figg listener, and the tests are plain
pytest functions. Most share one gateway (each with streams of its own);
the restart test runs its own on fixed ports, since a running client keeps
the addresses it was given.

Timing bounds are generous: the machine is shared.
"""
import asyncio
import importlib.util
import os
import selectors
import socket
import struct
import subprocess
import sys
import time

import pytest
from twisted.internet import reactor

from gateway.records import PRAVEGA_EVENTS, FormatRegistry
from plugins.kafka.client import KafkaClient, KafkaError
from plugins.pravega import decode_stored_events
from storage import LogStore, StoreSettings
from tests.support import GatewayProcess

pravega_client = pytest.importorskip(
    "pravega_client", reason="the pravega wheel (PyPI 'pravega', a Rust extension) is not "
                             "installed or has no build for this platform")

SCOPE = "rc"
MiB = 1024 * 1024
#: Figg is another dialect of this gateway; its listener is added where it exists
HAVE_FIGG = importlib.util.find_spec("plugins.figg") is not None


def free_ports(n):
    """``n`` ports free right now (bound to 0 and released)."""
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def config_text(data, pravega_port, controller_port, others=True, storage=""):
    listeners = [
        f'  - {{dialect: pravega, endpoint: "tcp:{pravega_port}:interface=127.0.0.1", '
        f'scope: {SCOPE}}}',
        f'  - {{dialect: pravega-controller, endpoint: "tcp:{controller_port}:interface='
        f'127.0.0.1", scope: {SCOPE}, segment_store: "127.0.0.1:{pravega_port}"}}']
    if others:
        listeners += ['  - {dialect: kafka, endpoint: "tcp:0:interface=127.0.0.1"}',
                      '  - {dialect: tank, endpoint: "tcp:0:interface=127.0.0.1"}']
        if HAVE_FIGG:
            listeners.append('  - {dialect: figg, endpoint: "tcp:0:interface=127.0.0.1"}')
    return (f"storage: {{path: {data}, fsync: interval{storage}}}\n"
            f"limits: {{max_record_bytes: {10 * MiB}}}\n"
            "listeners:\n" + "\n".join(listeners) + "\n")


class Gateway:
    """A gateway subprocess and the clients' addresses."""

    def __init__(self, directory, others=True, storage=""):
        self.directory = directory
        self.data = os.path.join(directory, "data")
        pravega, controller = free_ports(2)
        self.process = GatewayProcess(directory, config_text(self.data, pravega, controller,
                                                             others, storage))
        self.ports = self.process.start()
        self.controller = f"127.0.0.1:{controller}"

    def manager(self, uri=None):
        return pravega_client.StreamManager(uri or f"tcp://{self.controller}")

    def kafka(self):
        return KafkaClient("127.0.0.1", self.ports["kafka"], timeout=60)

    def stop(self):
        return self.process.stop()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    gw = Gateway(str(tmp_path_factory.mktemp("pravega-real")))
    yield gw
    assert gw.stop() == 0
    log = gw.process.read_log()
    assert "Traceback" not in log, log[-5000:]


@pytest.fixture
def manager(gateway):
    """A manager (with its own client runtime) per test, so that no test
    inherits another's background work."""
    return gateway.manager()


# -- helpers -------------------------------------------------------------------------------------

async def collect(reader, count, timeout=60):
    """The next ``count`` events of a reader, as slices come (per segment;
    a slice may be empty)."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"read {len(got)} of {count} events: {got[:20]}")
        piece = await asyncio.wait_for(reader.get_segment_slice_async(), left)
        got += [event.data() for event in piece]
        reader.release_segment(piece)
    return got


def read_events(reader, count, timeout=60):
    return asyncio.run(collect(reader, count, timeout))


def kafka_values(gateway, topic, partition=0, max_bytes=16 * MiB):
    with gateway.kafka() as kafka:
        return [m.value for m in kafka.read(topic, partition, 0, max_bytes=max_bytes)]


def raises_fast(exception, call, limit=20.0):
    """``call()`` raises ``exception`` within ``limit`` seconds (no retry loop)."""
    started = time.monotonic()
    with pytest.raises(exception) as info:
        call()
    assert time.monotonic() - started < limit
    return info.value


# The client routes a key with MurmurHash3 x64 128 (seed: Java's hash of
# "EventRouter") over the key's UTF-16LE bytes, into [0, 1).
_M64 = (1 << 64) - 1
_C1, _C2 = 0x87c37b91114253d5, 0x4cf5ad432745937f
ROUTER_SEED = 1741865571


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & _M64


def _fmix(k):
    k ^= k >> 33
    k = k * 0xff51afd7ed558ccd & _M64
    k ^= k >> 33
    k = k * 0xc4ceb9fe1a85ec53 & _M64
    return k ^ (k >> 33)


def murmur3_x64_128_high(data, seed):
    h1 = h2 = seed
    blocks = len(data) // 16
    for i in range(blocks):
        k1, k2 = struct.unpack_from("<QQ", data, 16 * i)
        h1 ^= _rotl(k1 * _C1 & _M64, 31) * _C2 & _M64
        h1 = (_rotl(h1, 27) + h2) * 5 + 0x52dce729 & _M64
        h2 ^= _rotl(k2 * _C2 & _M64, 33) * _C1 & _M64
        h2 = (_rotl(h2, 31) + h1) * 5 + 0x38495ab5 & _M64
    tail = data[16 * blocks:]
    if len(tail) > 8:
        h2 ^= _rotl(int.from_bytes(tail[8:], "little") * _C2 & _M64, 33) * _C1 & _M64
    if tail:
        h1 ^= _rotl(int.from_bytes(tail[:8], "little") * _C1 & _M64, 31) * _C2 & _M64
    h1 ^= len(data)
    h2 ^= len(data)
    h1 = (h1 + h2) & _M64
    h2 = (h2 + h1) & _M64
    h1, h2 = _fmix(h1), _fmix(h2)
    return (h1 + h2) & _M64


def key_hash(routing_key):
    high = murmur3_x64_128_high(routing_key.encode("utf-16-le"), ROUTER_SEED)
    bits = 0x3ff0000000000000 + ((high >> 12) & 0x000fffffffffffff)
    return struct.unpack("<d", struct.pack("<Q", bits))[0] - 1.0


def test_key_hash_matches_the_client():
    assert key_hash("hello") == 0.658716230571337


# -- §5 items 1, 2, 16, 19: manager, scopes, streams --------------------------------------------

def panics(call):
    """The binding turns some client errors into a Rust panic (pyo3's
    PanicException, a BaseException); it must come at once too."""
    error = raises_fast(BaseException, call)
    assert type(error).__name__ == "PanicException", repr(error)


def test_manager_scopes_and_streams(gateway, manager):
    other = gateway.manager(gateway.controller)        # "host:port" works too
    assert manager.create_scope(SCOPE) is False
    raises_fast(ValueError, lambda: other.create_scope("elsewhere"))
    assert manager.create_stream(SCOPE, "three", 3) is True
    assert manager.create_stream(SCOPE, "three", 5) is False
    with gateway.kafka() as kafka:
        assert kafka.partitions("three") == (0, 1, 2)
    manager.update_stream_with_policy(SCOPE, "three", tags=["alpha", "beta"])
    assert sorted(manager.get_stream_tags(SCOPE, "three")) == ["alpha", "beta"]
    with gateway.kafka() as kafka:
        assert kafka.partitions("three") == (0, 1, 2)
    # transactions and deleting a scope with streams fail at once
    error = raises_fast(ValueError, lambda: manager.create_transaction_writer(
        SCOPE, "three", 7).begin_txn())
    assert "transactions are not supported" in str(error)
    raises_fast(ValueError, lambda: manager.delete_scope(SCOPE))
    # a stream never created fails at once too
    writer = manager.create_writer(SCOPE, "never-created")
    raises_fast(ValueError, lambda: (writer.write_event("x"), writer.flush()))
    panics(lambda: manager.create_reader_group("rg-none", SCOPE, "never-created"))
    panics(lambda: manager.create_byte_stream(SCOPE, "never-created"))


def test_list_streams_spans_pages(gateway, manager):
    """More than one listStreamsInScope page (1000 streams): created through
    Kafka metadata auto-creation, listed through the client's paging."""
    names = [f"page-{i:04d}" for i in range(1001)]
    with gateway.kafka() as kafka:
        for start in range(0, len(names), 250):
            kafka.metadata(names[start:start + 250])
    listed = manager.list_stream(SCOPE)
    assert set(names) <= set(listed)
    assert len(listed) == len(set(listed))


# -- §5 items 3, 4, 5: writers --------------------------------------------------------------------

def test_events_without_and_with_routing_keys(gateway, manager):
    assert manager.create_stream(SCOPE, "one", 1)
    writer = manager.create_writer(SCOPE, "one")
    for value in ("event-0", "event-1", "event-22"):
        writer.write_event(value)
    writer.flush()
    assert kafka_values(gateway, "one") == [b"event-0", b"event-1", b"event-22"]
    # routed: every event in the partition whose key range holds its key's hash
    assert manager.create_stream(SCOPE, "routed", 3)
    routed = manager.create_writer(SCOPE, "routed")
    keys = [f"key-{i}" for i in range(12)]
    sent = []
    for i in range(36):
        key = keys[i % len(keys)]
        routed.write_event_bytes(f"{key}/{i}".encode(), key)
        sent.append((key, f"{key}/{i}".encode()))
    routed.flush()
    expected = {p: [value for key, value in sent if min(int(key_hash(key) * 3), 2) == p]
                for p in range(3)}
    assert {p: kafka_values(gateway, "routed", p) for p in range(3)} == expected
    assert all(expected.values())


def test_async_writes_are_stored_once(gateway, manager):
    """200 concurrent ``write_event_async``: each stored exactly once. The
    binding hands each call to its runtime as a task of its own, so the
    writer numbers them in the order the tasks run, not the order of the
    calls (observed: a-101 lands between a-059 and a-060); the gateway keeps
    the writer's order, which its compare-and-set on event numbers enforces.
    That the client batches many events per block is checked on the stored
    batches in test_restart_in_the_middle."""
    assert manager.create_stream(SCOPE, "async", 1)
    writer = manager.create_writer(SCOPE, "async")

    async def write():
        await asyncio.gather(*[writer.write_event_async(f"a-{i:03d}") for i in range(200)])
    asyncio.run(write())
    writer.flush()
    stored = kafka_values(gateway, "async")
    assert sorted(stored) == [f"a-{i:03d}".encode() for i in range(200)]


# -- §5 items 9, 10, 11, 13, 17: reader groups ----------------------------------------------------

def test_reader_group_on_one_segment_resumes_after_offline(gateway, manager):
    assert manager.create_stream(SCOPE, "rg-one", 1)
    writer = manager.create_writer(SCOPE, "rg-one")
    for i in range(3):
        writer.write_event(f"first-{i}")
    writer.flush()
    group = manager.create_reader_group("g1", SCOPE, "rg-one")
    reader = group.create_reader("r1")
    assert read_events(reader, 3) == [b"first-0", b"first-1", b"first-2"]
    reader.reader_offline()
    for i in range(2):
        writer.write_event(f"later-{i}")
    writer.flush()
    # another manager (a second process would do the same) opens the same group;
    # a manager must outlive what it made (its runtime runs them)
    second = gateway.manager()
    again = second.create_reader_group("g1", SCOPE, "rg-one").create_reader("r2")
    assert read_events(again, 2) == [b"later-0", b"later-1"]
    again.reader_offline()
    # deleting the group drops its table; a new group starts at the head
    manager.delete_reader_group("g1", SCOPE)
    fresh = manager.create_reader_group("g1", SCOPE, "rg-one").create_reader("r3")
    assert len(read_events(fresh, 5)) == 5
    fresh.reader_offline()
    # tables are no topics: not listed, not in Kafka metadata
    assert not [s for s in manager.list_stream(SCOPE) if "kvtable" in s]
    with gateway.kafka() as kafka:
        assert not [t for t in kafka.metadata()[1] if "kvtable" in t]


def test_reader_group_on_three_segments_reads_each_event_once(gateway, manager):
    assert manager.create_stream(SCOPE, "rg-three", 3)
    writer = manager.create_writer(SCOPE, "rg-three")
    values = [f"e{i}".encode() for i in range(7)]
    for i, value in enumerate(values):
        writer.write_event_bytes(value, f"route-{i}")
    writer.flush()
    reader = manager.create_reader_group("g3", SCOPE, "rg-three").create_reader("r1")
    got = read_events(reader, 7)
    assert sorted(got) == sorted(values)
    # nothing comes twice: the next event read is the next one written
    writer.write_event("e7", "route-0")
    writer.flush()
    assert read_events(reader, 1) == [b"e7"]
    reader.reader_offline()


GROUP_READER = """
import asyncio, sys, pravega_client
controller, scope, group, stream, name = sys.argv[1:6]
manager = pravega_client.StreamManager(controller)
reader = manager.create_reader_group(group, scope, stream).create_reader(name)
print("ready", flush=True)

async def read():
    while True:
        piece = await reader.get_segment_slice_async()
        for event in piece:
            print(event.data().decode(), flush=True)
        reader.release_segment(piece)
asyncio.run(read())
"""


def test_two_reader_processes_share_a_group(gateway, manager):
    """Two readers of one group, each in its own process, over 3 segments:
    together they read every event exactly once (their shared state is the
    group's table, under conditional updates). Each prints what it reads;
    once all events are in, a little longer shows that none comes twice."""
    assert manager.create_stream(SCOPE, "shared", 3)
    readers = [subprocess.Popen([sys.executable, "-c", GROUP_READER, gateway.controller, SCOPE,
                                 "g2", "shared", name], stdout=subprocess.PIPE)
               for name in ("r1", "r2")]
    try:
        for reader in readers:
            ready = b""
            while not ready.endswith(b"\n"):
                ready += os.read(reader.stdout.fileno(), 1)
            assert ready == b"ready\n"
        writer = manager.create_writer(SCOPE, "shared")
        values = [f"s{i}" for i in range(30)]
        for value in values:
            writer.write_event(value, value)
        writer.flush()
        output = {reader.pid: b"" for reader in readers}
        with selectors.DefaultSelector() as selector:
            for reader in readers:
                selector.register(reader.stdout.fileno(), selectors.EVENT_READ, reader.pid)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                for key, _ in selector.select(timeout=0.5):
                    output[key.data] += os.read(key.fd, 65536)
                if sum(text.count(b"\n") for text in output.values()) >= len(values):
                    deadline = min(deadline, time.monotonic() + 1.5)
        got = {pid: text.decode().split() for pid, text in output.items()}
    finally:
        for reader in readers:
            reader.kill()
            reader.wait()
    assert sorted(got[readers[0].pid] + got[readers[1].pid]) == sorted(values), got


def test_live_tail_sees_pravega_and_kafka_writes(gateway, manager):
    """A read parked at the tail is answered by appends of either dialect.
    Everything runs in one event loop: the binding holds the GIL in its
    blocking calls, so a blocking write in another thread while a read is
    pending stalls both until the client's timeouts (observed)."""
    assert manager.create_stream(SCOPE, "tail", 1)
    reader = manager.create_reader_group("gt", SCOPE, "tail").create_reader("r1")
    writer = manager.create_writer(SCOPE, "tail")

    def kafka_produce():
        with gateway.kafka() as kafka:
            kafka.produce("tail", 0, [(None, b"from kafka")])

    async def scenario():
        reading = asyncio.ensure_future(collect(reader, 2))
        await asyncio.sleep(1.0)
        assert not reading.done()
        await writer.write_event_async("from pravega")
        await asyncio.sleep(1.0)
        await asyncio.get_running_loop().run_in_executor(None, kafka_produce)
        return await reading
    assert asyncio.run(scenario()) == [b"from pravega", b"from kafka"]
    reader.reader_offline()


# -- §5 items 6, 7, 8: byte streams and kind clashes ---------------------------------------------

BYTE_READER = """
import sys, pravega_client
manager = pravega_client.StreamManager(sys.argv[1])
stream = manager.create_byte_stream(sys.argv[2], sys.argv[3])
got = b""
while len(got) < int(sys.argv[4]):
    piece = bytearray(int(sys.argv[4]) - len(got))
    got += bytes(piece[:stream.readinto(piece)])
sys.stdout.write(got.decode())
"""


def test_byte_stream_write_seek_read(gateway, manager):
    assert manager.create_stream(SCOPE, "bytes", 1)
    # a read started before any write waits and returns when the data arrives
    # (in a process of its own: the binding holds the GIL while it blocks)
    early = subprocess.Popen([sys.executable, "-c", BYTE_READER, gateway.controller, SCOPE,
                              "bytes", "27"], stdout=subprocess.PIPE, text=True)
    time.sleep(2.0)
    assert early.poll() is None
    stream = manager.create_byte_stream(SCOPE, "bytes")
    stream.write(b"byte-stream-1 ")
    stream.write(b"byte-stream-2")
    stream.flush()
    assert stream.current_tail_offset() == 27
    assert early.communicate(timeout=60)[0] == "byte-stream-1 byte-stream-2"
    stream.seek(0, 0)
    buffer = bytearray(27)
    assert stream.readinto(buffer) == 27 and bytes(buffer) == b"byte-stream-1 byte-stream-2"
    stream.seek(14, 0)
    buffer = bytearray(5)
    assert stream.readinto(buffer) == 5 and bytes(buffer) == b"byte-"
    # truncation is refused; the stream stays usable
    raises_fast(OSError, lambda: stream.truncate(5))
    stream.write(b"!")
    stream.flush()
    assert stream.current_tail_offset() == 28
    assert stream.current_head_offset() == 0
    # other dialects see a record per write chunk (the client's buffer cuts)
    assert b"".join(kafka_values(gateway, "bytes")) == b"byte-stream-1 byte-stream-2!"


def test_kind_clashes_fail_fast(gateway, manager):
    assert manager.create_stream(SCOPE, "events-only", 1)
    writer = manager.create_writer(SCOPE, "events-only")
    writer.write_event("an event")
    writer.flush()
    stream = manager.create_byte_stream(SCOPE, "events-only")
    stream.write(b"bytes")
    raises_fast(OSError, stream.flush)
    assert manager.create_stream(SCOPE, "bytes-only", 1)
    byte_stream = manager.create_byte_stream(SCOPE, "bytes-only")
    byte_stream.write(b"raw")
    byte_stream.flush()
    events = manager.create_writer(SCOPE, "bytes-only")
    raises_fast(ValueError, lambda: (events.write_event("e"), events.flush()))
    assert kafka_values(gateway, "events-only") == [b"an event"]
    assert kafka_values(gateway, "bytes-only") == [b"raw"]


# -- §5 item 12: large events ---------------------------------------------------------------------

def test_large_events(gateway, manager):
    assert manager.create_stream(SCOPE, "large", 1)
    writer = manager.create_writer(SCOPE, "large")
    big = bytes(range(256)) * (9 * 4096) + b"end"       # 9 MiB + 3 B
    for value in (b"twelve bytes", big, b"eleven byte"):
        writer.write_event_bytes(value)
    writer.flush()
    reader = manager.create_reader_group("gl", SCOPE, "large").create_reader("r1")
    got = read_events(reader, 3)
    assert [len(v) for v in got] == [12, len(big), 11] and got[1] == big
    reader.reader_offline()
    # other dialects see the big event as one record
    assert kafka_values(gateway, "large", max_bytes=12 * MiB) == [b"twelve bytes", big,
                                                                   b"eleven byte"]
    # above limits.max_record_bytes (10 MiB): refused at once, nothing stored
    too_big = manager.create_writer(SCOPE, "large")
    raises_fast(ValueError, lambda: (too_big.write_event_bytes(b"x" * (11 * MiB)),
                                     too_big.flush()))
    with gateway.kafka() as kafka:
        assert kafka.list_offset("large", 0) == 3
    assert not [s for s in manager.list_stream(SCOPE) if "transient" in s]


# -- §5 item 20: seal and delete ------------------------------------------------------------------

def test_seal_and_delete(gateway, manager):
    assert manager.create_stream(SCOPE, "sealme", 1)
    writer = manager.create_writer(SCOPE, "sealme")
    writer.write_event("before the seal")
    writer.flush()
    raises_fast(ValueError, lambda: manager.delete_stream(SCOPE, "sealme"))
    assert manager.seal_stream(SCOPE, "sealme") is True
    raises_fast(ValueError, lambda: (writer.write_event("after"), writer.flush()))
    reader = manager.create_reader_group("gs", SCOPE, "sealme").create_reader("r1")
    assert read_events(reader, 1) == [b"before the seal"]
    with gateway.kafka() as kafka:
        with pytest.raises(KafkaError):
            kafka.produce("sealme", 0, [(None, b"refused")])
    assert manager.delete_stream(SCOPE, "sealme") is True
    assert "sealme" not in manager.list_stream(SCOPE)
    with gateway.kafka() as kafka:
        assert "sealme" not in kafka.metadata()[1]
    assert manager.delete_stream(SCOPE, "sealme") is False


# -- cross-dialect ---------------------------------------------------------------------------------

def tank_tail(gateway, topic, count):
    out = subprocess.run(
        [sys.executable, "-m", "plugins.tank", "--port", str(gateway.ports["tank"]), "tail",
         topic, "--from", "beginning", "--count", str(count)],
        capture_output=True, timeout=60, check=True, text=True)
    return [line.split("\t", 1) for line in out.stdout.splitlines()]


def test_pravega_events_read_by_kafka_and_tank(gateway, manager):
    assert manager.create_stream(SCOPE, "x--to-uothers", 1)      # topic "to_others"
    writer = manager.create_writer(SCOPE, "x--to-uothers")
    values = [f"pravega-{i}" for i in range(5)]
    for value in values:
        writer.write_event(value)
    writer.flush()
    assert kafka_values(gateway, "to_others") == [v.encode() for v in values]
    assert tank_tail(gateway, "to_others", 5) == [[str(i + 1), v] for i, v in enumerate(values)]


@pytest.mark.skipif(not HAVE_FIGG, reason="the figg dialect (plugins/figg) is not in this tree")
def test_figg_records_read_by_a_reader_group(gateway, manager):
    assert manager.create_stream(SCOPE, "from-figg", 1)
    lines = [f"figg-{i}" for i in range(4)]
    subprocess.run([sys.executable, "-m", "plugins.figg", "publish", "from-figg", "--port",
                    str(gateway.ports["figg"])], input="\n".join(lines) + "\n", text=True,
                   capture_output=True, timeout=60, check=True)
    reader = manager.create_reader_group("gf", SCOPE, "from-figg").create_reader("r1")
    assert read_events(reader, 4) == [line.encode() for line in lines]
    reader.reader_offline()


# -- §5 items 14, 15: a gateway restart in the middle ---------------------------------------------

def stored_batches(data, topic):
    """The stored batches of ``topic``/0, read from the data directory while
    the gateway is stopped."""
    store = LogStore(StoreSettings(path=data, fsync="never"), reactor)
    store.open()
    try:
        return store.read(topic, 0, 0, 1 << 40)
    finally:
        store.close()


def stored_values(data, topic):
    formats = FormatRegistry()
    formats.register(PRAVEGA_EVENTS, decode_stored_events)
    return [value for batch in stored_batches(data, topic)
            for value in formats.decode(batch).values]


def test_restart_in_the_middle(tmp_path):
    gateway = Gateway(str(tmp_path), others=False)
    try:
        manager = gateway.manager()
        for stream in ("ev", "by", "batched"):
            assert manager.create_stream(SCOPE, stream, 1)
        writer = manager.create_writer(SCOPE, "ev")
        for i in range(3):
            writer.write_event(f"a{i}")
        writer.flush()
        stream = manager.create_byte_stream(SCOPE, "by")
        stream.write(b"12345")
        stream.flush()
        batched = manager.create_writer(SCOPE, "batched")

        async def write_async():
            await asyncio.gather(*[batched.write_event_async(f"b{i}") for i in range(200)])
        asyncio.run(write_async())
        batched.flush()
        reader = manager.create_reader_group("gr", SCOPE, "ev").create_reader("r1")
        assert read_events(reader, 3) == [b"a0", b"a1", b"a2"]
        reader.reader_offline()

        assert gateway.stop() == 0
        # the client batched many of the 200 async events into each append block
        batches = stored_batches(gateway.data, "batched")
        assert sum(b.count for b in batches) == 200 and len(batches) < 100
        gateway.ports = gateway.process.start()

        # the same writers go on: nothing lost, nothing twice
        for i in range(3, 6):
            writer.write_event(f"a{i}")
        writer.flush()
        stream.write(b"67890")
        stream.flush()
        assert stream.current_tail_offset() == 10
        second = gateway.manager()
        check = second.create_byte_stream(SCOPE, "by")
        buffer = bytearray(10)
        assert check.readinto(buffer) == 10 and bytes(buffer) == b"1234567890"
        # the group's positions survived: a new reader reads only what followed
        again = second.create_reader_group("gr", SCOPE, "ev").create_reader("r2")
        assert read_events(again, 3) == [b"a3", b"a4", b"a5"]
        again.reader_offline()
    finally:
        gateway.stop()
    assert stored_values(gateway.data, "ev") == [f"a{i}".encode() for i in range(6)]
    assert stored_values(gateway.data, "by") == [b"12345", b"67890"]


# -- §5 item 18: retention -------------------------------------------------------------------------

def test_retention_moves_the_head(tmp_path):
    """After retention drops old segments, a new reader group starts at the
    new head (getSegments answers start positions, so no read falls below
    it), and a byte stream's head offset is the new start."""
    gateway = Gateway(str(tmp_path), storage=", segment_bytes: 1024, retention_check_ms: 200, "
                                             "retention: {hours: null, bytes: 3000}")
    try:
        manager = gateway.manager()
        assert manager.create_stream(SCOPE, "kept", 1)
        writer = manager.create_writer(SCOPE, "kept")
        values = [f"event-{i:03d}-" + "x" * 80 for i in range(60)]
        for value in values:
            writer.write_event(value)
            writer.flush()          # one batch each, so segments roll often
        assert manager.create_stream(SCOPE, "kept-bytes", 1)
        stream = manager.create_byte_stream(SCOPE, "kept-bytes")
        data = bytes(range(256)) * 24
        for start in range(0, len(data), 500):
            stream.write(data[start:start + 500])
            stream.flush()
        with gateway.kafka() as kafka:
            deadline = time.monotonic() + 30
            while kafka.list_offset("kept", 0, -2) == 0 or \
                    kafka.list_offset("kept-bytes", 0, -2) == 0:
                assert time.monotonic() < deadline, "retention did not run"
                time.sleep(0.2)
            first = kafka.list_offset("kept", 0, -2)
        reader = manager.create_reader_group("gk", SCOPE, "kept").create_reader("r1")
        assert read_events(reader, len(values) - first) == [v.encode() for v in values[first:]]
        reader.reader_offline()
        head = stream.current_head_offset()
        assert 0 < head < len(data)
        stream.seek(head, 0)
        rest = bytearray(len(data) - head)
        got = 0
        while got < len(rest):
            piece = bytearray(len(rest) - got)
            n = stream.readinto(piece)
            rest[got:got + n] = piece[:n]
            got += n
        assert bytes(rest) == data[head:]
    finally:
        gateway.stop()
