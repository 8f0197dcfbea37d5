"""Per-listener access rules over real sockets, for every dialect: a
read-only listener, allowed topic name patterns, and auto-create turned
off. Each refusal is answered in the dialect's own form (its protocol
sheet's "Access rules" bullet), stores nothing, creates nothing, and
leaves the connection usable where the dialect keeps it open.

Every test starts two listeners of one dialect::

    listeners[0]  read-only, topics shared.* and ro.*
    listeners[1]  topics team-a.* only, no auto-create

over topics ``shared.data`` (2 records), ``team-a.known`` (1) and
``secret`` (1), written through the bus.
"""
import uuid

from twisted.internet import defer, threads
from twisted.internet.endpoints import connectProtocol

from gateway import commands as cmd
from gateway.errors import NotAuthorized
from gateway.records import RecordBatch
from plugins.figg import codec as fc
from plugins.kafka import codec as kc
from plugins.kafka.client import KafkaClient, KafkaError
from plugins.pravega import codec as pc
from plugins.pravega.client import PravegaClientProtocol, PravegaError
from plugins.rustlog import codec as rc
from plugins.rustlog.client import RustLogClientProtocol, RustLogError
from plugins.tank import codec as tc
from plugins.tank.client import TankClientProtocol, TankError
from tests.figg_support import RawFigg
from tests.ops_support import LOCAL, OpsTest, client_endpoint, raw_connect

READ_ONLY = {"mode": "read-only", "topics": ["shared.*", "ro.*"]}
SCOPED = {"topics": ["team-a.*"], "auto_create": False}
RO, SCOPE = 0, 1


class AccessTest(OpsTest):
    dialect = None

    @defer.inlineCallbacks
    def setUp(self):
        yield self.start([{"dialect": self.dialect, "endpoint": LOCAL, "access": READ_ONLY},
                          {"dialect": self.dialect, "endpoint": LOCAL, "access": SCOPED}])
        bus = self.service.bus
        yield bus.execute(cmd.Produce("shared.data", 0, RecordBatch([b"s0", b"s1"])))
        yield bus.execute(cmd.Produce("team-a.known", 0, RecordBatch([b"k0"])))
        yield bus.execute(cmd.Produce("secret", 0, RecordBatch([b"x0"])))

    def topics(self):
        return self.service.store.topic_names()

    def records(self, topic):
        return self.service.store.offsets(topic, 0).high_watermark

    @defer.inlineCallbacks
    def connect(self, index, proto):
        yield connectProtocol(client_endpoint(self.ports[index]), proto)
        self.addCleanup(lambda: proto.transport.loseConnection())
        return proto


class ViewTests(AccessTest):
    """The rules themselves, on a listener's view of the bus."""

    dialect = "rustlog"

    @defer.inlineCallbacks
    def test_fetch_serves_allowed_partitions_and_refuses_the_others(self):
        view = self.service.views[self.listener(SCOPE)]
        parts = yield view.execute(cmd.Fetch([cmd.FetchPartition("secret", 0, 0, 1000),
                                              cmd.FetchPartition("team-a.known", 0, 0, 1000),
                                              cmd.FetchPartition("secret", 0, 0, 1000)]))
        self.assertIsInstance(parts[0].error, NotAuthorized)
        self.assertIsNone(parts[1].error)
        self.assertEqual(self.service.bus.decode(parts[1].batches[0]).values, [b"k0"])
        self.assertIsInstance(parts[2].error, NotAuthorized)

    @defer.inlineCallbacks
    def test_metadata_hides_and_refuses(self):
        view = self.service.views[self.listener(SCOPE)]
        everything = yield view.execute(cmd.Metadata())
        self.assertEqual([m.name for m in everything], ["team-a.known"])
        named = yield view.execute(cmd.Metadata(["secret", "team-a.known", "team-a.new"],
                                                auto_create=True))
        self.assertIsInstance(named[0].error, NotAuthorized)
        self.assertEqual(named[1].info.partitions, 1)
        self.assertEqual(type(named[2].error).__name__, "UnknownTopic")
        self.assertNotIn("team-a.new", self.topics())

    @defer.inlineCallbacks
    def test_read_only_commits_offsets_but_writes_nothing(self):
        view = self.service.views[self.listener(RO)]
        yield view.execute(cmd.CommitOffset("g", "shared.data", 0, 1))
        for command in (cmd.CreateTopic("ro.new"), cmd.SealPartition("shared.data", 0),
                        cmd.DeleteTopic("shared.data"), cmd.CreatePartitions("shared.data", 2),
                        cmd.WriterEventNumber("shared.data", 0, b"w" * 16)):
            with self.assertRaises(NotAuthorized):
                yield view.execute(command)
        self.assertEqual(self.service.store.topic("shared.data").partitions, 1)

    @defer.inlineCallbacks
    def test_an_invalid_name_is_answered_as_invalid_not_refused(self):
        view = self.service.views[self.listener(SCOPE)]
        with self.assertRaises(Exception) as caught:
            yield view.execute(cmd.Produce("bad/name", 0, RecordBatch([b"x"])))
        self.assertEqual(type(caught.exception).__name__, "InvalidTopicName")


class RustLogAccessTests(AccessTest):
    """rustlog.md §1: ``not authorised: topic=…`` (binary: code 10); stays open."""

    dialect = "rustlog"

    @defer.inlineCallbacks
    def test_read_only(self):
        client = yield self.connect(RO, RustLogClientProtocol())
        with self.assertRaises(RustLogError) as caught:
            yield client.produce("shared.data", 0, [b"new"])
        self.assertEqual(caught.exception.message, "not authorised: topic=shared.data")
        with self.assertRaises(RustLogError):
            yield client.produce("ro.new", 0, [b"new"])
        got = yield client.fetch("shared.data", 0, 0)
        self.assertEqual([v for _, v in got.records], [b"s0", b"s1"])
        yield client.commit("readers", "shared.data", 0, 2)
        self.assertEqual((self.records("shared.data"), "ro.new" in self.topics()), (2, False))
        binary = yield self.connect(RO, RustLogClientProtocol(binary=True))
        with self.assertRaises(RustLogError) as caught:
            yield binary.produce("shared.data", 0, [b"new"])
        self.assertEqual(caught.exception.code, rc.UNKNOWN_PARTITION)

    @defer.inlineCallbacks
    def test_topic_patterns(self):
        client = yield self.connect(SCOPE, RustLogClientProtocol())
        with self.assertRaises(RustLogError) as caught:
            yield client.fetch("secret", 0, 0)
        self.assertEqual(caught.exception.message, "not authorised: topic=secret")
        with self.assertRaises(RustLogError):
            yield client.commit("readers", "secret", 0, 1)
        yield client.produce("team-a.known", 0, [b"k1"])
        binary = yield self.connect(SCOPE, RustLogClientProtocol(binary=True))
        self.assertEqual((yield binary.list_topics()), [("team-a.known", 1)])
        with self.assertRaises(RustLogError) as caught:
            yield binary.describe_partition("secret", 0)
        self.assertEqual(caught.exception.code, rc.UNKNOWN_PARTITION)
        self.assertEqual(self.records("team-a.known"), 2)

    @defer.inlineCallbacks
    def test_auto_create_off(self):
        client = yield self.connect(SCOPE, RustLogClientProtocol())
        with self.assertRaises(RustLogError) as caught:
            yield client.produce("team-a.new", 0, [b"n"])
        self.assertEqual(caught.exception.message,
                         "partition not found: topic=team-a.new, partition=0")
        self.assertNotIn("team-a.new", self.topics())


class TankAccessTests(AccessTest):
    """tank.md §1: a refused topic looks unknown (0xff, u16 0xFFFF, cnt 0, 10)."""

    dialect = "tank"

    @defer.inlineCallbacks
    def test_read_only(self):
        client = yield self.connect(RO, TankClientProtocol())
        with self.assertRaises(TankError) as caught:
            yield client.produce("shared.data", 0, [b"new"])
        self.assertEqual(caught.exception.code, tc.ERR_UNKNOWN_TOPIC)
        self.assertEqual((yield client.create_topic("ro.new", 1)), tc.CREATE_INVALID)
        got = yield client.fetch("shared.data", 0, 0)
        self.assertEqual([m.value for m in got.messages], [b"s0", b"s1"])
        self.assertEqual((self.records("shared.data"), "ro.new" in self.topics()), (2, False))

    @defer.inlineCallbacks
    def test_topic_patterns(self):
        client = yield self.connect(SCOPE, TankClientProtocol())
        with self.assertRaises(TankError) as caught:
            yield client.fetch("secret", 0, 0)
        self.assertEqual(caught.exception.code, tc.ERR_UNKNOWN_TOPIC)
        self.assertEqual((yield client.discover_partitions("secret")), [])
        self.assertEqual([t.name for t in (yield client.discover_topics())], ["team-a.known"])
        yield client.produce("team-a.known", 0, [b"k1"])
        self.assertEqual(self.records("team-a.known"), 2)

    @defer.inlineCallbacks
    def test_auto_create_off(self):
        client = yield self.connect(SCOPE, TankClientProtocol())
        with self.assertRaises(TankError) as caught:
            yield client.produce("team-a.new", 0, [b"n"])
        self.assertEqual(caught.exception.code, tc.ERR_UNKNOWN_TOPIC)
        self.assertNotIn("team-a.new", self.topics())


class KafkaAccessTests(AccessTest):
    """kafka.md §1: 29 for a refused produce or commit; a hidden topic reads as 3."""

    dialect = "kafka"

    def kafka(self, index):
        client = KafkaClient("127.0.0.1", self.ports[index])
        self.addCleanup(client.close)
        return client

    def code(self, call, *args):
        def run():
            try:
                call(*args)
            except KafkaError as e:
                return e.code
            return 0
        return threads.deferToThread(run)

    @defer.inlineCallbacks
    def test_read_only(self):
        client = self.kafka(RO)
        self.assertEqual((yield self.code(client.produce, "shared.data", 0, [(None, b"n")])),
                         kc.TOPIC_AUTHORIZATION_FAILED)
        got = yield threads.deferToThread(client.fetch, "shared.data", 0, 0)
        self.assertEqual([m.value for m in got.messages], [b"s0", b"s1"])
        self.assertEqual((yield self.code(client.commit, "g", "shared.data", 0, 2)), 0)
        _, topics = yield threads.deferToThread(client.metadata, ["ro.new"])
        self.assertEqual(topics["ro.new"].error, kc.UNKNOWN_TOPIC_OR_PARTITION)
        self.assertEqual((self.records("shared.data"), "ro.new" in self.topics()), (2, False))

    @defer.inlineCallbacks
    def test_topic_patterns(self):
        client = self.kafka(SCOPE)
        self.assertEqual((yield self.code(client.fetch, "secret", 0, 0)),
                         kc.UNKNOWN_TOPIC_OR_PARTITION)
        self.assertEqual((yield self.code(client.list_offset, "secret", 0)),
                         kc.UNKNOWN_TOPIC_OR_PARTITION)
        self.assertEqual((yield self.code(client.commit, "g", "secret", 0, 1)),
                         kc.TOPIC_AUTHORIZATION_FAILED)
        self.assertEqual((yield self.code(client.committed, "g", "secret", 0)),
                         kc.UNKNOWN_TOPIC_OR_PARTITION)
        _, everything = yield threads.deferToThread(client.metadata)
        self.assertEqual(sorted(everything), ["team-a.known"])
        _, named = yield threads.deferToThread(client.metadata, ["secret"])
        self.assertEqual(named["secret"].error, kc.UNKNOWN_TOPIC_OR_PARTITION)
        yield threads.deferToThread(client.produce, "team-a.known", 0, [(None, b"k1")])
        self.assertEqual(self.records("team-a.known"), 2)

    @defer.inlineCallbacks
    def test_auto_create_off(self):
        client = self.kafka(SCOPE)
        _, topics = yield threads.deferToThread(client.metadata, ["team-a.new"])
        self.assertEqual(topics["team-a.new"].error, kc.UNKNOWN_TOPIC_OR_PARTITION)
        self.assertEqual((yield self.code(client.produce, "team-a.new", 0, [(None, b"n")])),
                         kc.UNKNOWN_TOPIC_OR_PARTITION)
        self.assertNotIn("team-a.new", self.topics())


class FiggAccessTests(AccessTest):
    """figg.md §1, §4.3: no error message, so a refused ATTACH or PUBLISH
    closes the connection (after the ACKs owed) with one log line."""

    dialect = "figg"

    @defer.inlineCallbacks
    def raw(self, index):
        proto = yield raw_connect(self, self.ports[index], proto=RawFigg())
        return proto

    @defer.inlineCallbacks
    def test_read_only(self):
        conn = yield self.raw(RO)
        conn.send(fc.Attach(b"shared.data", 0, fc.FROM_OFFSET))
        got = yield conn.take(3)
        self.assertEqual(got, [fc.Attached(b"shared.data", 0), fc.Data(b"shared.data", 1, b"s0"),
                               fc.Data(b"shared.data", 2, b"s1")])
        conn.send(fc.Publish(b"shared.data", 7, b"new"))
        yield conn.lost
        self.assertEqual(self.records("shared.data"), 2)
        self.assertNotIn(fc.Ack(7), conn.messages)

    @defer.inlineCallbacks
    def test_topic_patterns(self):
        conn = yield self.raw(SCOPE)
        conn.send(fc.Publish(b"team-a.known", 1, b"k1"))
        self.assertEqual((yield conn.take(1)), [fc.Ack(1)])
        conn.send(fc.Attach(b"secret", 0, fc.FROM_OFFSET))
        yield conn.lost
        self.assertEqual(self.records("team-a.known"), 2)
        self.assertFalse(any(isinstance(m, fc.Attached) for m in conn.messages))

    @defer.inlineCallbacks
    def test_auto_create_off(self):
        conn = yield self.raw(SCOPE)
        conn.send(fc.Publish(b"team-a.new", 1, b"n"))
        yield conn.lost
        self.assertNotIn("team-a.new", self.topics())


class PravegaAccessTests(AccessTest):
    """pravega.md §1: AuthTokenCheckFailed(rid, "", 0) for a refused request
    other than an append; a refused writer is set up as usual and its
    appends get SegmentIsSealed."""

    dialect = "pravega"

    @defer.inlineCallbacks
    def client(self, index):
        proto = yield self.connect(index, PravegaClientProtocol())
        yield proto.hello
        return proto

    @defer.inlineCallbacks
    def append(self, client, segment):
        """One event on a new writer: the writer's reply to it."""
        writer = uuid.uuid4().bytes
        yield client.setup_append(segment, writer)
        replied = defer.Deferred()
        # DataAppended comes to the writer, a refusal to the request id
        client.writers[writer] = client.calls[77] = _FirstReply(replied)
        data = pc.frame_events([b"new"])
        client.send(pc.AppendBlockEnd(writer, len(data), data, 1, 1, 77))
        reply = yield replied
        return reply

    @defer.inlineCallbacks
    def test_read_only(self):
        client = yield self.client(RO)
        segment = "gateway/shared.data/0.#epoch.0"
        reply = yield self.append(client, segment)
        self.assertEqual(reply, pc.SegmentIsSealed(77, segment, "", -1))
        read = yield client.read_segment(segment, 0)
        self.assertEqual(read.data, pc.frame_events([b"s0", b"s1"]))
        with self.assertRaises(PravegaError) as caught:
            yield client.create_segment("gateway/ro.new/0.#epoch.0")
        self.assertIsInstance(caught.exception.reply, pc.AuthTokenCheckFailed)
        self.assertEqual(caught.exception.reply.error_code, pc.AUTH_CHECK_FAILED)
        self.assertEqual((self.records("shared.data"), "ro.new" in self.topics()), (2, False))

    @defer.inlineCallbacks
    def test_topic_patterns(self):
        client = yield self.client(SCOPE)
        for ask in (lambda: client.read_segment("gateway/secret/0.#epoch.0", 0),
                    lambda: client.segment_info("gateway/secret/0.#epoch.0")):
            with self.assertRaises(PravegaError) as caught:
                yield ask()
            self.assertEqual(caught.exception.reply,
                             pc.AuthTokenCheckFailed(caught.exception.reply.request_id, "",
                                                     pc.AUTH_CHECK_FAILED))
        reply = yield self.append(client, "gateway/team-a.known/0.#epoch.0")
        self.assertIsInstance(reply, pc.DataAppended)
        self.assertEqual(self.records("team-a.known"), 2)

    @defer.inlineCallbacks
    def test_auto_create_off(self):
        client = yield self.client(SCOPE)
        with self.assertRaises(PravegaError) as caught:
            yield client.setup_append("gateway/team-a.new/0.#epoch.0", uuid.uuid4().bytes)
        self.assertIsInstance(caught.exception.reply, pc.NoSuchSegment)
        self.assertNotIn("team-a.new", self.topics())


class _FirstReply:
    """Stands in for an EventWriter: fires with the writer's first reply."""

    def __init__(self, d):
        self.d = d

    def reply(self, proto, reply):
        if not self.d.called:
            self.d.callback(reply)

    def connection_lost(self, proto, reason):
        """The test has its answer."""
