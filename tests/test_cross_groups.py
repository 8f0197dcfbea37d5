"""Consumer groups shared between dialects (DESIGN "Committed offsets are
shared by all dialects"): a RustLog group's commit is what a kafka-python
consumer of the same group starts from, a kafka-python commit is what
RustLog's OffsetFetch and group Fetch see, and both survive a restart.

The gateway runs in-process; kafka-python (the real client) runs in the
reactor's thread pool.
"""
from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata
from twisted.internet import defer, reactor, threads
from twisted.trial.unittest import TestCase

from plugins.rustlog.client import connect as rustlog_connect
from tests.cross_support import DIALECTS, HOST
from tests.support import gateway_config, start_gateway

TOPIC = "orders"
VALUES = [b"order-%d" % i for i in range(10)]


class SharedGroups(TestCase):

    timeout = 60

    @defer.inlineCallbacks
    def setUp(self):
        directory = self.mktemp()
        listeners = [{"dialect": d, "endpoint": f"tcp:0:interface={HOST}"} for d in DIALECTS]
        self.config = gateway_config(directory, listeners,
                                     groups={"min_session_timeout_ms": 1000})
        yield self.start()
        offsets = yield self.rustlog.produce(TOPIC, 0, VALUES)
        self.assertEqual(offsets, list(range(10)))

    @defer.inlineCallbacks
    def start(self):
        self.service, self.ports = yield start_gateway(self, self.config)
        self.rustlog = yield rustlog_connect(reactor, HOST, self.ports["rustlog"])
        self.addCleanup(self.rustlog.close)

    @defer.inlineCallbacks
    def restart(self):
        yield self.rustlog.close()
        yield self.service.stopService()
        yield self.start()

    def kafka_consumer(self, group, subscribe=False):
        """A kafka-python consumer of ``group``: by ``subscribe`` (group
        membership, JoinGroup/SyncGroup) or by ``assign``."""
        def make():
            consumer = KafkaConsumer(
                bootstrap_servers=f"{HOST}:{self.ports['kafka']}", group_id=group,
                enable_auto_commit=False, auto_offset_reset="earliest",
                session_timeout_ms=6000, heartbeat_interval_ms=1000)
            if subscribe:
                consumer.subscribe([TOPIC])
            else:
                consumer.assign([TopicPartition(TOPIC, 0)])
            return consumer
        d = threads.deferToThread(make)
        d.addCallback(lambda consumer: (self.addCleanup(threads.deferToThread, consumer.close),
                                        consumer)[1])
        return d

    @staticmethod
    def poll(consumer, count):
        def poll():
            got = []
            for _ in range(100):
                for records in consumer.poll(timeout_ms=100, max_records=count - len(got)
                                             ).values():
                    got += records
                if len(got) == count:
                    break
            return [(r.offset, r.value) for r in got]
        return threads.deferToThread(poll)

    @defer.inlineCallbacks
    def test_a_rustlog_commit_is_what_a_kafka_group_starts_from(self):
        self.assertTrue((yield self.rustlog.commit("billing", TOPIC, 0, 4)))
        partition = TopicPartition(TOPIC, 0)
        assigned = yield self.kafka_consumer("billing")
        self.assertEqual((yield threads.deferToThread(assigned.committed, partition)), 4)
        self.assertEqual((yield self.poll(assigned, 2)), [(4, VALUES[4]), (5, VALUES[5])])
        # a member of the group (JoinGroup, SyncGroup) starts there as well
        member = yield self.kafka_consumer("billing", subscribe=True)
        self.assertEqual((yield self.poll(member, 6)), list(enumerate(VALUES))[4:])

    @defer.inlineCallbacks
    def test_a_kafka_commit_is_what_rustlog_fetches(self):
        consumer = yield self.kafka_consumer("audit", subscribe=True)
        self.assertEqual(len((yield self.poll(consumer, 6))), 6)
        yield threads.deferToThread(consumer.commit)
        self.assertEqual((yield self.rustlog.committed("audit", TOPIC, 0)), 6)
        # RustLog's group rule: the commit wins over a smaller requested offset
        got = yield self.rustlog.fetch(TOPIC, 0, 0, group_id="audit")
        self.assertEqual(got.records, list(enumerate(VALUES))[6:])

    @defer.inlineCallbacks
    def test_committed_offsets_survive_a_restart(self):
        yield self.rustlog.commit("from-rustlog", TOPIC, 0, 3)
        consumer = yield self.kafka_consumer("from-kafka")
        partition = TopicPartition(TOPIC, 0)
        yield threads.deferToThread(consumer.commit, {partition: OffsetAndMetadata(7, "m", -1)})
        yield threads.deferToThread(consumer.close)
        yield self.restart()
        self.assertEqual((yield self.rustlog.committed("from-rustlog", TOPIC, 0)), 3)
        self.assertEqual((yield self.rustlog.committed("from-kafka", TOPIC, 0)), 7)
        for group, offset in (("from-rustlog", 3), ("from-kafka", 7)):
            consumer = yield self.kafka_consumer(group)
            self.assertEqual((yield threads.deferToThread(consumer.committed, partition)),
                             offset)
            self.assertEqual((yield self.poll(consumer, 1)), [(offset, VALUES[offset])])
