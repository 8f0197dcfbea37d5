"""Unmodified Kafka clients against the gateway (protocols/kafka.md §3):
kafka-python 3 and confluent-kafka (librdkafka) against ``gateway run`` in a
subprocess, since they block; afkak in process, on the reactor.

Clients get short timeouts and metadata ages so that a failure shows up in
seconds, not in their 30-second defaults; every wait polls a condition
with a generous deadline and returns as soon as it holds.
"""
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest
from confluent_kafka import Consumer as CConsumer, KafkaError as CKafkaError, \
    Producer as CProducer, TopicPartition as CTopicPartition
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from twisted.internet import defer, reactor
from twisted.trial.unittest import TestCase

import afkak
from gateway import commands as cmd
from plugins.kafka.client import KafkaClient
from plugins.rustlog import codec as rc
from tests.support import GatewayProcess, start_gateway
from tests.test_kafka_support import data_dir, kafka_config, sleep

DEADLINE = 60

GATEWAY_CONFIG = """
storage: {path: ./data, fsync: never}
groups: {min_session_timeout_ms: 1000, max_session_timeout_ms: 60000}
listeners:
  - {dialect: kafka, endpoint: "tcp:0:interface=127.0.0.1"}
  - {dialect: rustlog, endpoint: "tcp:0:interface=127.0.0.1"}
"""


class Gateway:
    def __init__(self, directory):
        self.process = GatewayProcess(directory, GATEWAY_CONFIG)
        self.start()

    def start(self):
        self.ports = self.process.start()
        self.bootstrap = f"127.0.0.1:{self.ports['kafka']}"

    def create_topic(self, topic, partitions):
        """Through RustLog's binary CreateTopic: Kafka 0.8 cannot create one."""
        payload = rc.encode_request(rc.BINARY, rc.CreateTopicRequest(topic, partitions))
        with socket.create_connection(("127.0.0.1", self.ports["rustlog"]), 10) as s:
            s.sendall(struct.pack(">I", len(payload)) + payload)
            size = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
            _, answer = rc.decode_response(s.recv(size, socket.MSG_WAITALL))
        assert answer == rc.CreateTopicResponse(True), answer

    def client(self):
        return KafkaClient("127.0.0.1", self.ports["kafka"], timeout=10)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    gw = Gateway(str(tmp_path_factory.mktemp("kafka-clients")))
    yield gw
    gw.process.stop()


def wait_until(condition, what, deadline=DEADLINE):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def kp_common(gateway, api_version):
    config = {"bootstrap_servers": gateway.bootstrap, "request_timeout_ms": 10000,
              "metadata_max_age_ms": 1000, "retry_backoff_ms": 50, "reconnect_backoff_ms": 50}
    if api_version is not None:
        config["api_version"] = api_version
    return config


def kp_read(consumer, count):
    """Poll until ``count`` messages arrived."""
    got = []
    end = time.monotonic() + DEADLINE
    while len(got) < count and time.monotonic() < end:
        for records in consumer.poll(timeout_ms=200).values():
            got.extend(records)
    return got


API_VERSIONS = [(0, 8, 2), (0, 9), (0, 10, 0), None]
CODECS = [None, "gzip", "snappy", "lz4"]


def name(*parts):
    return "-".join(str(p).replace(", ", ".").strip("()") for p in parts)


# -- kafka-python -----------------------------------------------------------------------

@pytest.mark.parametrize("api_version", API_VERSIONS)
@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_produce_and_consume(gateway, api_version, codec):
    """K1, K2, K5, K6: every codec, offsets and keys (null, empty) as produced,
    read back with assign + seek_to_beginning and seek_to_end."""
    topic = name("kp", api_version, codec)
    common = kp_common(gateway, api_version)
    producer = KafkaProducer(compression_type=codec, linger_ms=5, **common)
    keys = [b"k0", None, b"", b"k3", b"k4"]
    futures = [producer.send(topic, key=k, value=b"value-%d" % i) for i, k in enumerate(keys)]
    producer.flush()
    assert [f.get(10).offset for f in futures] == [0, 1, 2, 3, 4]
    producer.close()
    consumer = KafkaConsumer(group_id=None, auto_offset_reset="earliest", **common)
    partition = TopicPartition(topic, 0)
    consumer.assign([partition])
    consumer.seek_to_beginning()
    got = kp_read(consumer, 5)
    assert [(m.offset, m.key, m.value) for m in got] == [
        (i, k, b"value-%d" % i) for i, k in enumerate(keys)]
    consumer.seek_to_end()
    assert consumer.position(partition) == 5
    consumer.close()


@pytest.mark.parametrize("acks", [0, 1, "all"])
def test_kafka_python_acks(gateway, acks):
    topic = name("kp-acks", acks)
    common = kp_common(gateway, (0, 8, 2))
    producer = KafkaProducer(acks=acks, **common)
    for i in range(3):
        producer.send(topic, value=b"%d" % i)
    producer.flush()
    producer.close()
    with gateway.client() as client:
        wait_until(lambda: client.list_offset(topic, 0) == 3, "three records")
        assert [m.value for m in client.read(topic, 0, 0)] == [b"0", b"1", b"2"]


def test_kafka_python_large_message_at_small_max_bytes(gateway):
    """§1: a message larger than max_partition_fetch_bytes comes whole."""
    topic = "kp-large"
    common = kp_common(gateway, (0, 8, 2))
    producer = KafkaProducer(**common)
    producer.send(topic, value=b"x" * 5000).get(10)
    producer.close()
    consumer = KafkaConsumer(auto_offset_reset="earliest", max_partition_fetch_bytes=1024,
                             **common)
    consumer.assign([TopicPartition(topic, 0)])
    got = kp_read(consumer, 1)
    assert [len(m.value) for m in got] == [5000]
    consumer.close()


def test_kafka_python_082_group_commits_without_joining(gateway):
    """K3: 0.8.2 consumers with a group commit through OffsetCommit v1
    (generation -1) and never join: each instance gets every partition."""
    topic = "kp-082-group"
    gateway.create_topic(topic, 2)
    common = kp_common(gateway, (0, 8, 2))
    producer = KafkaProducer(**common)
    for i in range(4):
        producer.send(topic, value=b"%d" % i, partition=i % 2)
    producer.flush()
    producer.close()
    consumers = [KafkaConsumer(topic, group_id="g082", auto_offset_reset="earliest",
                               enable_auto_commit=False, **common) for _ in range(2)]
    for consumer in consumers:
        assert len(kp_read(consumer, 4)) == 4
        assert consumer.assignment() == {TopicPartition(topic, 0), TopicPartition(topic, 1)}
    consumers[0].commit()
    with gateway.client() as client:
        assert client.committed("g082", topic, 0)[0] == 2
        assert client.committed("g082", topic, 1)[0] == 2
    for consumer in consumers:
        consumer.close()


class GroupMember(threading.Thread):
    """A subscribing kafka-python consumer polling in its own thread."""

    def __init__(self, gateway, topic, group, api_version, **extra):
        super().__init__(daemon=True)
        self.consumer = KafkaConsumer(
            topic, group_id=group, auto_offset_reset="earliest", session_timeout_ms=6000,
            heartbeat_interval_ms=200, **extra, **kp_common(gateway, api_version))
        self.stopping = threading.Event()
        self.assigned = set()
        self.messages = []
        self.start()

    def run(self):
        while not self.stopping.is_set():
            for records in self.consumer.poll(timeout_ms=100).values():
                self.messages.extend(records)
            self.assigned = {tp.partition for tp in self.consumer.assignment()}

    def stop(self):
        self.stopping.set()
        self.join(30)
        self.consumer.close()


def split(members, partitions):
    """The members' assignments are disjoint, none empty, and cover all."""
    sets = [m.assigned for m in members]
    return (all(sets) and sum(map(len, sets)) == partitions
            and set().union(*sets) == set(range(partitions)))


@pytest.mark.parametrize("api_version", [(0, 9), None])
def test_kafka_python_group_split_and_rebalance(gateway, api_version):
    """K4, K5: two members split four partitions 2+2; a third joining and
    then one leaving each cause a new split."""
    topic = name("kp-group", api_version)
    group = topic + "-g"
    gateway.create_topic(topic, 4)
    first = GroupMember(gateway, topic, group, api_version)
    second = GroupMember(gateway, topic, group, api_version)
    try:
        wait_until(lambda: split([first, second], 4) and len(first.assigned) == 2,
                   "a 2+2 split")
        third = GroupMember(gateway, topic, group, api_version)
        wait_until(lambda: split([first, second, third], 4), "a split over three members")
        third.stop()                                          # LeaveGroup
        wait_until(lambda: split([first, second], 4), "a split after one left")
    finally:
        first.stop()
        second.stop()


KILLABLE_MEMBER = """
import sys, time
from kafka import KafkaConsumer
c = KafkaConsumer(sys.argv[2], group_id=sys.argv[3], bootstrap_servers=sys.argv[1],
                  api_version=(0, 9), session_timeout_ms=3000, heartbeat_interval_ms=200,
                  request_timeout_ms=10000, metadata_max_age_ms=1000)
while True:
    c.poll(timeout_ms=100)
    if c.assignment():
        print("assigned", flush=True)
"""


def test_kafka_python_killed_member_expires(gateway):
    """§5.21: a member killed without LeaveGroup is removed when its
    session expires, and the survivor takes over every partition."""
    topic, group = "kp-expiry", "kp-expiry-g"
    gateway.create_topic(topic, 2)
    survivor = GroupMember(gateway, topic, group, (0, 9))
    wait_until(lambda: survivor.assigned == {0, 1}, "the survivor alone")
    victim = subprocess.Popen([sys.executable, "-c", KILLABLE_MEMBER, gateway.bootstrap, topic,
                               group], stdout=subprocess.PIPE)
    try:
        assert victim.stdout.readline() == b"assigned\n"
        wait_until(lambda: len(survivor.assigned) == 1, "a split with the victim")
        os.kill(victim.pid, signal.SIGKILL)
        wait_until(lambda: survivor.assigned == {0, 1}, "the victim's session to expire")
    finally:
        victim.kill()
        victim.wait()
        survivor.stop()


def test_kafka_python_restart_resumes_from_committed(tmp_path):
    """A group member commits, the gateway restarts, and a new member of
    the group reads on from the commit."""
    gateway = Gateway(str(tmp_path))
    try:
        topic, group = "kp-restart", "kp-restart-g"
        producer = KafkaProducer(**kp_common(gateway, (0, 9)))
        for i in range(10):
            producer.send(topic, value=b"%d" % i)
        producer.flush()
        producer.close()
        member = GroupMember(gateway, topic, group, (0, 9), enable_auto_commit=False)
        wait_until(lambda: len(member.messages) == 10, "ten messages")
        member.stopping.set()
        member.join(30)
        member.consumer.commit()
        member.consumer.close()
        gateway.process.stop()
        gateway.start()
        producer = KafkaProducer(**kp_common(gateway, (0, 9)))
        for i in range(10, 13):
            producer.send(topic, value=b"%d" % i)
        producer.flush()
        producer.close()
        member = GroupMember(gateway, topic, group, (0, 9))
        wait_until(lambda: len(member.messages) >= 3, "the new messages")
        time.sleep(0.5)
        member.stop()
        assert [(m.offset, m.value) for m in member.messages] == [
            (10, b"10"), (11, b"11"), (12, b"12")]
    finally:
        gateway.process.stop()


# -- confluent-kafka (librdkafka) ----------------------------------------------------------

PINNED = {"0.8.2.2": {"api.version.request": False, "broker.version.fallback": "0.8.2.2"},
          "0.9.0.1": {"api.version.request": False, "broker.version.fallback": "0.9.0.1"},
          "defaults": {}}


def ck_common(gateway, pinned):
    return {"bootstrap.servers": gateway.bootstrap, "topic.metadata.refresh.interval.ms": 1000,
            "socket.timeout.ms": 10000, "log_level": 3, **PINNED[pinned]}


def ck_produce(gateway, pinned, topic, records, codec="none"):
    delivered = []
    producer = CProducer({**ck_common(gateway, pinned), "compression.codec": codec,
                          "linger.ms": 5})
    for key, value in records:
        producer.produce(topic, key=key, value=value,
                         on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
    assert producer.flush(DEADLINE) == 0
    assert [err for err, _ in delivered] == [None] * len(records)
    return [offset for _, offset in delivered]


def ck_read(consumer, count):
    got = []
    end = time.monotonic() + DEADLINE
    while len(got) < count and time.monotonic() < end:
        message = consumer.poll(0.2)
        if message is not None:
            assert message.error() is None, message.error()
            got.append(message)
    return got


@pytest.mark.parametrize("pinned", sorted(PINNED))
@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4"])
def test_confluent_produce_and_consume(gateway, pinned, codec):
    """C1, C2, C4: each codec; assign() with an offset, auto-commit on."""
    topic = name("ck", pinned, codec)
    records = [(b"k%d" % i if i % 2 else None, b"value-%d" % i) for i in range(5)]
    assert ck_produce(gateway, pinned, topic, records, codec) == [0, 1, 2, 3, 4]
    consumer = CConsumer({**ck_common(gateway, pinned), "group.id": topic + "-g",
                          "auto.offset.reset": "earliest", "enable.auto.commit": True,
                          "auto.commit.interval.ms": 100})
    consumer.assign([CTopicPartition(topic, 0, 0)])
    got = ck_read(consumer, 5)
    assert [(m.offset(), m.key(), m.value()) for m in got] == [
        (i, k, v) for i, (k, v) in enumerate(records)]
    with gateway.client() as client:
        wait_until(lambda: client.committed(topic + "-g", topic, 0) == (5, ""),
                   "the auto-commit")
    consumer.close()


def test_confluent_082_assign_without_offset_uses_the_commit(gateway):
    """C2: assign() without an offset starts at the group's commit
    (OffsetFetch v1), or by auto.offset.reset (ListOffsets) without one."""
    topic = "ck-082-committed"
    ck_produce(gateway, "0.8.2.2", topic, [(None, b"%d" % i) for i in range(6)])
    with gateway.client() as client:
        client.commit("ck-082-g", topic, 0, 4)
    for group, first in (("ck-082-g", 4), ("ck-082-fresh", 0)):
        consumer = CConsumer({**ck_common(gateway, "0.8.2.2"), "group.id": group,
                              "auto.offset.reset": "earliest"})
        consumer.assign([CTopicPartition(topic, 0)])
        got = ck_read(consumer, 6 - first)
        assert [m.offset() for m in got] == list(range(first, 6))
        consumer.close()


def test_confluent_082_subscribe_is_unsupported(gateway):
    """C2: librdkafka refuses subscribe() itself under 0.8.2 (no group
    APIs); the failure is local and documented, not a gateway error."""
    consumer = CConsumer({**ck_common(gateway, "0.8.2.2"), "group.id": "ck-082-sub"})
    consumer.subscribe(["ck-082-sub"])
    end = time.monotonic() + DEADLINE
    error = None
    while error is None and time.monotonic() < end:
        message = consumer.poll(0.2)
        if message is not None and message.error():
            error = message.error()
    consumer.close()
    assert error.code() == CKafkaError._UNSUPPORTED_FEATURE


@pytest.mark.parametrize("pinned", ["0.9.0.1", "defaults"])
def test_confluent_group_split(gateway, pinned):
    """C3, C4: two subscribing consumers split four partitions 2+2 (librdkafka
    uses session timeout 45000, within the gateway's bounds)."""
    topic = name("ck-group", pinned)
    gateway.create_topic(topic, 4)
    ck_produce(gateway, pinned, topic, [(None, b"%d" % i) for i in range(8)])
    assigned = [set(), set()]

    def watcher(i):
        def on_assign(consumer, partitions):
            assigned[i] = {p.partition for p in partitions}

        def on_revoke(consumer, partitions):
            assigned[i] = set()
        return on_assign, on_revoke

    consumers = []
    for i in range(2):
        consumer = CConsumer({**ck_common(gateway, pinned), "group.id": topic + "-g",
                              "auto.offset.reset": "earliest",
                              "heartbeat.interval.ms": 300, "session.timeout.ms": 45000})
        on_assign, on_revoke = watcher(i)
        consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
        consumers.append(consumer)
    messages = []
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end and not (
            len(messages) == 8 and all(len(a) == 2 for a in assigned)
            and assigned[0] | assigned[1] == {0, 1, 2, 3}):
        for consumer in consumers:
            message = consumer.poll(0.1)
            if message is not None and not message.error():
                messages.append(message.value())
    final = [set(a) for a in assigned]     # closing revokes them
    for consumer in consumers:
        consumer.close()
    assert sorted(messages) == [b"%d" % i for i in range(8)]
    assert final[0] | final[1] == {0, 1, 2, 3}
    assert len(final[0]) == len(final[1]) == 2


# -- the blocking client as a second encoder, and RustLog on the same topic ----------------

def test_blocking_client_round_trip_and_rustlog_view(gateway):
    topic = "blocking"
    with gateway.client() as client:
        assert client.partitions(topic) == (0,)
        assert client.api_versions()[0] == (0, 1)
        base = client.produce(topic, 0, [(b"k", b"a"), (None, b"b")])
        assert base == 0
        future = int(time.time() * 1000) + 10 * 86400000
        assert client.produce(topic, 0, [(b"k2", b"c", future)], magic=1, codec=2) == 2
        assert client.list_offset(topic, 0, -2) == 0
        assert client.list_offset(topic, 0, future) == 2
        assert [(m.offset, m.key, m.value) for m in client.read(topic, 0, 0)] == [
            (0, b"k", b"a"), (1, None, b"b"), (2, b"k2", b"c")]
        payload = rc.encode_request(rc.JSON, rc.FetchRequest(topic, 0, 1, 1 << 20, None))
        with socket.create_connection(("127.0.0.1", gateway.ports["rustlog"]), 10) as s:
            s.sendall(struct.pack(">I", len(payload)) + payload)
            size = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
            _, answer = rc.decode_response(s.recv(size, socket.MSG_WAITALL))
        assert answer == rc.FetchResponse(((1, b"b"), (2, b"c")), 3)


# -- afkak (Twisted, in process) ---------------------------------------------------------------

class AfkakTests(TestCase):
    """Each afkak client is one connection, and the gateway, like a Kafka
    broker, answers a connection's requests in order: a parked JoinGroup
    holds up everything behind it. So every group member gets its own
    client, as it would against Kafka."""

    timeout = 120

    @defer.inlineCallbacks
    def setUp(self):
        self.service, ports = yield start_gateway(self, kafka_config(data_dir(self)))
        self.hosts = f"127.0.0.1:{ports['kafka']}"
        self.client = self.new_client()

    def new_client(self):
        client = afkak.KafkaClient(self.hosts, timeout=10000)
        self.addCleanup(client.close)
        return client

    @defer.inlineCallbacks
    def produce(self, topic, values, codec=None, key=None):
        yield self.client.load_metadata_for_topics(topic)
        producer = afkak.Producer(self.client, codec=codec)
        yield producer.send_messages(topic, key=key, msgs=values)
        yield producer.stop()

    @defer.inlineCallbacks
    def consume(self, topic, start, count, **kwargs):
        """Messages from ``start`` until ``count`` arrived; a consumer with a
        group commits what it processed before it stops."""
        got = []
        done = defer.Deferred()

        def processor(consumer, messages):
            got.extend(messages)
            if len(got) >= count and not done.called:
                # after this returns: afkak records what was processed then
                reactor.callLater(0, done.callback, None)

        consumer = afkak.Consumer(self.client, topic, 0, processor, fetch_max_wait_time=100,
                                  **kwargs)
        consumer.start(start).addErrback(lambda f: None)
        yield done
        if kwargs.get("consumer_group"):
            yield consumer.shutdown()       # commits, then stops
        else:
            consumer.stop()
        return got

    @defer.inlineCallbacks
    def test_produce_every_codec_and_consume(self):
        """A1: none, gzip and snappy (afkak has no lz4 producer); afkak sends
        inner offsets 0, which the gateway ignores."""
        for codec in (afkak.CODEC_NONE, afkak.CODEC_GZIP, afkak.CODEC_SNAPPY):
            topic = f"afkak-{codec}"
            yield self.produce(topic, [b"m0", b"m1", b"m2"], codec, key=b"key")
            got = yield self.consume(topic, afkak.OFFSET_EARLIEST, 3)
            self.assertEqual([(m.offset, m.message.key, m.message.value) for m in got],
                             [(0, b"key", b"m0"), (1, b"key", b"m1"), (2, b"key", b"m2")])

    @defer.inlineCallbacks
    def test_consume_from_committed_offset(self):
        """afkak commits the last offset it processed (not the next one, as
        other clients do) and resumes after it; the gateway stores what it
        is sent."""
        topic = "afkak-committed"
        yield self.produce(topic, [b"0", b"1", b"2"])
        first = yield self.consume(topic, afkak.OFFSET_EARLIEST, 3, consumer_group="ag")
        self.assertEqual([m.offset for m in first], [0, 1, 2])
        committed = yield self.service.bus.execute(cmd.FetchCommittedOffset("ag", topic, 0))
        self.assertEqual(committed[0], 2)
        yield self.produce(topic, [b"3", b"4"])
        rest = yield self.consume(topic, afkak.OFFSET_COMMITTED, 2, consumer_group="ag")
        self.assertEqual([(m.offset, m.message.value) for m in rest], [(3, b"3"), (4, b"4")])

    @defer.inlineCallbacks
    def test_consumer_group_splits_partitions(self):
        topic = "afkak-group"
        yield self.service.bus.execute(cmd.CreateTopic(topic, 4))
        groups = []
        for _ in range(2):
            group = afkak.ConsumerGroup(self.new_client(), "afkak-g", [topic],
                                        lambda consumer, messages: None,
                                        heartbeat_interval_ms=200)
            group.start().addErrback(lambda f: None)
            groups.append(group)
        try:
            for _ in range(1200):
                owned = [sorted(c.partition for cs in g.consumers.values() for c in cs)
                         for g in groups]
                if sorted(owned[0] + owned[1]) == [0, 1, 2, 3] and all(owned):
                    break
                yield sleep(0.05)
            self.assertEqual(sorted(owned[0] + owned[1]), [0, 1, 2, 3])
            self.assertEqual([len(o) for o in owned], [2, 2])
        finally:
            for group in groups:
                yield group.stop()
