"""Edge semantics across dialects (issue 7), one test each, with the gateway
in-process and a listener of every dialect:

- a Kafka key longer than TANK's 255 bytes is left out for TANK consumers,
  never truncated, and kept for everyone else;
- a Pravega ConditionalAppend racing a Kafka produce: exactly one of them
  lands at the expected byte position, and nothing is lost or doubled;
- retention moving the log start under a Figg subscriber, a TANK consumer,
  a Kafka consumer and a Pravega reader: each gets its own dialect's answer;
- topic names valid in one dialect and not another;
- a record larger than a dialect's frame can carry, once the operator raised
  ``limits.max_record_bytes`` past it.
"""

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import OffsetOutOfRangeError
from twisted.internet import defer, reactor, threads
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.trial.unittest import TestCase

from plugins.figg import codec as fc
from plugins.kafka import codec as kc
from plugins.kafka.client import KafkaClient
from plugins.pravega import codec as pc
from plugins.pravega.client import EventReader, EventWriter, PravegaError
from plugins.pravega.client import connect as pravega_connect
from plugins.rustlog.client import RustLogError
from plugins.rustlog.client import connect as rustlog_connect
from plugins.tank import codec as tc
from plugins.tank.client import TankError
from tests.cross_support import HOST, Seen, open_side, pravega_segment, start_all
from tests.figg_support import RawFigg


class EdgeTests(TestCase):

    timeout = 60

    @defer.inlineCallbacks
    def start(self, **sections):
        self.service, self.ports = yield start_all(self, **sections)

    def side(self, dialect):
        return open_side(self, dialect, self.ports)

    # -- keys ----------------------------------------------------------------------

    @defer.inlineCallbacks
    def test_kafka_key_longer_than_255_bytes_is_omitted_for_tank(self):
        yield self.start()
        kafka = yield self.side("kafka")
        tank = yield self.side("tank")
        keys = [b"a" * 256, b"b" * 255, b"c" * 70000, None]
        values = [b"v-256", b"v-255", b"v-70000", b"v-none"]
        offsets = yield kafka.produce("long-keys", values, keys)
        self.assertEqual(offsets, [0, 1, 2, 3])
        # TANK: the message is there, its key is not (never a cut key)
        got = yield tank.read("long-keys", 4)
        self.assertEqual([(s.position, s.key, s.value) for s in got],
                         [(1, None, b"v-256"), (2, b"b" * 255, b"v-255"),
                          (3, None, b"v-70000"), (4, None, b"v-none")])
        # Kafka keeps every key as written
        got = yield kafka.read("long-keys", 4)
        self.assertEqual([(s.position, s.key, s.value) for s in got],
                         list(zip(range(4), keys, values)))

    # -- conditional appends -------------------------------------------------------------

    @defer.inlineCallbacks
    def test_pravega_conditional_append_racing_a_kafka_produce(self):
        yield self.start()
        topic = "race"
        segment = pravega_segment(topic)
        kafka = yield self.side("kafka")
        proto = yield pravega_connect(reactor, HOST, self.ports["pravega"])
        self.addCleanup(proto.close)
        writer = EventWriter(reactor, lambda: pravega_connect(reactor, HOST,
                                                               self.ports["pravega"]), segment)
        self.addCleanup(writer.close)
        yield writer.write(b"first")
        tail = 8 + len(b"first")

        # Kafka first: a conditional append still expecting the old tail fails
        self.assertEqual((yield kafka.produce(topic, [b"kafka-0"])), [1])
        self.assertFalse((yield writer.write_conditional(b"stale", tail)))
        tail += 8 + len(b"kafka-0")
        self.assertTrue((yield writer.write_conditional(b"fresh", tail)))
        tail += 8 + len(b"fresh")

        # Both at once: exactly one of them lands at the tail both aimed at
        expected = [b"first", b"kafka-0", b"fresh"]
        for i in range(12):
            info = yield proto.segment_info(segment)
            self.assertEqual(info.write_offset, tail)
            ours, theirs = b"cond-%d" % i, b"kafka-%d" % (i + 1)
            produced = kafka.produce(topic, [theirs])
            appended = yield writer.write_conditional(ours, tail)
            yield produced
            reader = EventReader(proto, segment, tail)
            first = (yield reader.read())[0]
            if appended:
                self.assertEqual(first, (tail, ours))
                expected += [ours, theirs]
            else:
                self.assertEqual(first, (tail, theirs))
                expected.append(theirs)
            tail += sum(8 + len(v) for v in expected[-1 - appended:])
        # nothing lost, nothing twice, the same order for every dialect
        everything = yield EventReader(proto, segment, 0).read()
        self.assertEqual([v for _, v in everything], expected)
        rustlog = yield self.side("rustlog")
        got = yield rustlog.read(topic, len(expected))
        self.assertEqual([(s.position, s.value) for s in got], list(enumerate(expected)))

    # -- retention -------------------------------------------------------------------------

    @defer.inlineCallbacks
    def test_retention_moves_the_log_start_under_every_reader(self):
        # 1 KiB segments, at most 3000 bytes kept; retention runs when told
        yield self.start(storage={"segment_bytes": 1024, "retention_check_ms": 3600000,
                                  "retention": {"hours": None, "bytes": 3000}})
        topic = "retained"
        values = [b"r%03d-" % i + b"." * 95 for i in range(40)]
        rustlog = yield rustlog_connect(reactor, HOST, self.ports["rustlog"])
        self.addCleanup(rustlog.close)
        for value in values:
            yield rustlog.produce(topic, 0, [value])

        # readers placed at the start, before retention runs
        figg = yield self.side("figg")
        live = yield figg.read(topic, 40)
        self.assertEqual(live[0].position, 1)
        pravega = yield self.side("pravega")
        reader = EventReader(pravega.proto, pravega_segment(topic), 0, read_size=108)
        self.assertEqual((yield reader.read()), [(0, values[0])])
        consumer = yield threads.deferToThread(
            KafkaConsumer, bootstrap_servers=f"{HOST}:{self.ports['kafka']}",
            enable_auto_commit=False, auto_offset_reset="none")
        self.addCleanup(threads.deferToThread, consumer.close)
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek(partition, 0)

        self.assertGreater(self.service.store.enforce_retention(), 0)
        state = self.service.store.offsets(topic, 0)
        start = state.log_start
        self.assertGreater(start, 0)
        start_position = sum(8 + len(v) for v in values[:start])
        self.assertEqual(state.start_position, start_position)

        # Figg: an ATTACH below the log start is clamped up to it
        again = yield self.side("figg")
        got = yield again.read(topic, 40 - start, offset=0)
        self.assertEqual(got[0], Seen(start + 1, None, None, values[start]))
        self.assertEqual(again.client.offset(topic), 40)
        # ... and a live subscriber goes on unharmed
        waiting = figg.wait_tail(topic)
        yield rustlog.produce(topic, 0, [b"after"])
        self.assertEqual((yield waiting), [Seen(41, None, None, b"after")])

        # TANK: a Consume below it is a boundary answer naming the first
        # available seq; the client starts again from there
        tank = yield self.side("tank")
        [answer] = yield tank.client.consume([(topic, 0, 1, 65536)])
        self.assertEqual((answer.flags, answer.first_avail, answer.hw_mark),
                         (tc.FETCH_BOUNDARY, start + 1, 41))
        got = yield tank.read(topic, 1, seq=1)
        self.assertEqual((got[0].position, got[0].value), (start + 1, values[start]))
        [seqs] = yield tank.client.discover_partitions(topic)
        self.assertEqual((seqs.first_avail, seqs.hw_mark), (start + 1, 41))

        # Kafka: OFFSET_OUT_OF_RANGE; earliest is the log start
        with self.assertRaises(OffsetOutOfRangeError):
            yield threads.deferToThread(consumer.poll, timeout_ms=5000)
        earliest = yield threads.deferToThread(consumer.beginning_offsets, [partition])
        self.assertEqual(earliest, {partition: start})
        kafka = yield self.side("kafka")
        got = yield kafka.read(topic, 1, offset=start)
        self.assertEqual((got[0].position, got[0].value), (start, values[start]))

        # Pravega: SegmentIsTruncated with the new start position
        with self.assertRaises(PravegaError) as caught:
            yield reader.read()
        self.assertEqual(type(caught.exception.reply), pc.SegmentIsTruncated)
        self.assertEqual(caught.exception.reply.start_offset, start_position)
        info = yield pravega.proto.segment_info(pravega_segment(topic))
        self.assertEqual(info.start_offset, start_position)
        got = yield pravega.read(topic, 1, position=start_position)
        self.assertEqual(got, [Seen(start_position, None, None, values[start])])

    # -- topic names -----------------------------------------------------------------------

    @defer.inlineCallbacks
    def test_underscore_names_are_escaped_for_pravega(self):
        """``user_events`` is a name everywhere but in Pravega, which forbids
        ``_``: its Pravega name is ``x--user-uevents``."""
        yield self.start()
        kafka = yield self.side("kafka")
        tank = yield self.side("tank")
        figg = yield self.side("figg")
        yield kafka.produce("user_events", [b"from-kafka"], [b"k"])
        yield tank.produce("user_events", [b"from-tank"])
        yield figg.produce("user_events", [b"from-figg"])
        pravega = yield self.side("pravega")
        with self.assertRaises(PravegaError) as caught:
            yield pravega.proto.segment_info(pravega_segment("user_events"))
        self.assertEqual(type(caught.exception.reply), pc.NoSuchSegment)
        reader = EventReader(pravega.proto, pravega_segment("x--user-uevents"))
        self.assertEqual((yield reader.read()),
                         [(0, b"from-kafka"), (18, b"from-tank"), (35, b"from-figg")])
        # and a Pravega writer's events reach the others under the plain name
        writer = EventWriter(reactor, lambda: pravega_connect(reactor, HOST,
                                                               self.ports["pravega"]),
                             pravega_segment("x--user-uevents"))
        self.addCleanup(writer.close)
        yield writer.write(b"from-pravega")
        got = yield tank.read("user_events", 4)
        self.assertEqual([s.value for s in got],
                         [b"from-kafka", b"from-tank", b"from-figg", b"from-pravega"])

    @defer.inlineCallbacks
    def test_a_name_valid_in_kafka_tank_and_figg_but_not_in_the_gateway(self):
        """201 characters: Kafka allows 249, TANK 255 and Figg any length, the
        gateway 200. Each dialect answers with its own "invalid", and no
        topic is created."""
        yield self.start()
        name = "n" * 201
        value = b"x"
        # RustLog: its error text
        rustlog = yield rustlog_connect(reactor, HOST, self.ports["rustlog"])
        self.addCleanup(rustlog.close)
        with self.assertRaises(RustLogError) as caught:
            yield rustlog.produce(name, 0, [value])
        self.assertTrue(caught.exception.message.startswith("invalid topic name"))
        # Kafka: INVALID_TOPIC_EXCEPTION (17) in Metadata and Produce
        with KafkaClient(HOST, self.ports["kafka"], timeout=10) as kafka:
            _, topics = yield threads.deferToThread(kafka.metadata, [name])
            self.assertEqual(topics[name].error, kc.INVALID_TOPIC)
            body = yield threads.deferToThread(
                kafka.request, kc.PRODUCE, 0, kc.ProduceRequest(1, 1000, (
                    (name, ((0, kc.encode_message_set([(None, value)])),)),)))
            self.assertEqual(body.topics[0][1][0][1], kc.INVALID_TOPIC)
        # TANK: the topic looks unknown (0x01)
        tank = yield self.side("tank")
        with self.assertRaises(TankError) as caught:
            yield tank.produce(name, [value])
        self.assertEqual(caught.exception.code, tc.ERR_UNKNOWN_TOPIC)
        # Figg has no error message: the connection is closed, with no ACK
        raw = RawFigg()
        yield connectProtocol(TCP4ClientEndpoint(reactor, HOST, self.ports["figg"]), raw)
        raw.send(fc.Publish(name.encode(), 0, value))
        yield raw.lost
        self.assertEqual(raw.messages, [])
        # Pravega: no such segment
        pravega = yield self.side("pravega")
        with self.assertRaises(PravegaError) as caught:
            yield pravega.proto.setup_append(pravega_segment(name), b"w" * 16)
        self.assertEqual(type(caught.exception.reply), pc.NoSuchSegment)
        self.assertEqual(self.service.store.topic_names(), [])

    # -- records larger than a frame ---------------------------------------------------------

    @defer.inlineCallbacks
    def test_a_record_larger_than_a_dialects_frame(self):
        """With ``limits.max_record_bytes`` raised to 12 MiB, an 11 MiB value
        written through TANK: Kafka, Figg, TANK and Pravega deliver it;
        RustLog's 10 MiB JSON frame cannot, and says so for that record
        (the next fetch, from the offset after it, goes on)."""
        yield self.start(limits={"max_record_bytes": 12 << 20})
        big = bytes(range(256)) * (11 << 12)
        tank = yield self.side("tank")
        yield tank.produce("big", [b"before", big, b"after"])
        rustlog = yield rustlog_connect(reactor, HOST, self.ports["rustlog"])
        self.addCleanup(rustlog.close)
        got = yield rustlog.fetch("big", 0, 0, max_bytes=64)
        self.assertEqual(got.records, [(0, b"before")])
        with self.assertRaises(RustLogError) as caught:
            yield rustlog.fetch("big", 0, 1)
        self.assertEqual(caught.exception.message,
                         "record too large: offset=1, max_frame_bytes=10485760")
        got = yield rustlog.fetch("big", 0, 2)
        self.assertEqual(got.records, [(2, b"after")])
        for dialect in ("kafka", "figg", "pravega", "tank"):
            side = yield self.side(dialect)
            got = yield side.read("big", 3)
            self.assertEqual([len(s.value) for s in got], [6, len(big), 5], dialect)
            self.assertEqual(got[1].value, big, dialect)
