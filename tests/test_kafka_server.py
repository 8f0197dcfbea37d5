"""The Kafka dialect end to end, in process: the real service tree on a
real socket on port 0, driven by raw frames (``RawKafka``), so every answer
is checked as the wire carries it. Organised by the conformance checklist
of protocols/kafka.md §5; the real clients are in test_kafka_clients.py.
"""
import struct
import time

from twisted.internet import defer, reactor
from twisted.trial.unittest import TestCase

from gateway import commands as cmd
from gateway.config import ConfigError
from plugins.kafka import codec as kc
from plugins.rustlog.client import connect as rustlog_connect
from tests.support import gateway_config, start_gateway
from tests.test_kafka_support import (
    connect_raw, data_dir, fetch_body, kafka_config, only_partition, produce_body, sleep)


def _sized(body):
    return struct.pack(">i", len(body)) + body


class KafkaServerTests(TestCase):

    timeout = 60

    @defer.inlineCallbacks
    def start(self, kafka_options=None, **sections):
        self.dir = getattr(self, "dir", None) or data_dir(self)
        self.service, ports = yield start_gateway(
            self, kafka_config(self.dir, kafka_options, **sections))
        self.port = ports["kafka"]
        self.rustlog_port = ports["rustlog"]
        self.client = yield connect_raw(self, self.port)
        return self.client

    @defer.inlineCallbacks
    def produce(self, topic, partition, records, **kw):
        body = yield self.client.call(kc.PRODUCE, 0, produce_body(topic, partition, records,
                                                                  **kw))
        return only_partition(body)

    @defer.inlineCallbacks
    def create(self, topic, partitions):
        yield self.service.bus.execute(cmd.CreateTopic(topic, partitions))

    @defer.inlineCallbacks
    def rustlog(self):
        client = yield rustlog_connect(reactor, "127.0.0.1", self.rustlog_port)
        self.addCleanup(client.close)
        return client

    # -- 1-4: framing, headers, unknown APIs, ApiVersions ----------------------------------

    @defer.inlineCallbacks
    def test_split_and_coalesced_frames(self):
        client = yield self.start()
        _, one = client.frame(kc.METADATA, 0, kc.MetadataRequest(("a",)))
        _, two = client.frame(kc.API_VERSIONS, 0, kc.ApiVersionsRequest())
        data = one + two
        for i in range(len(data)):      # one byte per write
            client.send(data[i:i + 1])
        while len(client.frames) < 2:
            yield sleep(0.01)
        _, three = client.frame(kc.METADATA, 0, kc.MetadataRequest(("b",)))
        _, four = client.frame(kc.METADATA, 0, kc.MetadataRequest(("c",)))
        client.send(three + four)
        while len(client.frames) < 4:
            yield sleep(0.01)
        correlations = [struct.unpack_from(">i", f)[0] for f in client.frames]
        self.assertEqual(correlations, [1, 2, 3, 4])

    @defer.inlineCallbacks
    def test_unknown_key_or_version_closes_only_that_connection(self):
        yield self.start()
        other = yield connect_raw(self, self.port)
        for key, version, body in ((kc.METADATA, 1, b"\x00\x00\x00\x00"),
                                   (kc.PRODUCE, 2, b""), (17, 0, b"\x00\x03abc")):
            victim = yield connect_raw(self, self.port)
            header = struct.pack(">hhih", key, version, 5, 4) + b"test" + body
            victim.send(struct.pack(">i", len(header)) + header)
            yield victim.closed
            self.assertEqual(victim.frames, [])
        answer = yield other.call(kc.API_VERSIONS, 0, kc.ApiVersionsRequest())
        self.assertEqual(answer.error, 0)

    @defer.inlineCallbacks
    def test_frame_size_bounds_and_malformed_bodies_close(self):
        yield self.start({"max_frame_bytes": 1000})
        cases = [struct.pack(">i", 5) + b"\x00" * 5,               # shorter than a header
                 struct.pack(">i", 1001),                          # over max_frame_bytes
                 struct.pack(">i", -1),                            # negative
                 _sized(struct.pack(">hhih", 0, 0, 1, -1) + struct.pack(">hii", 1, 0, 2 ** 31 - 1)),
                 _sized(struct.pack(">hhih", 3, 0, 1, -1) + struct.pack(">ih", 1, -1))]
        # (the last two: an array count beyond the body, a null topic name)
        for data in cases:
            victim = yield connect_raw(self, self.port)
            victim.send(data)
            yield victim.closed
            self.assertEqual(victim.frames, [])
        answer = yield self.client.call(kc.METADATA, 0, kc.MetadataRequest(()))
        self.assertEqual(answer.topics, ())

    @defer.inlineCallbacks
    def test_api_versions(self):
        client = yield self.start()
        expected = tuple((k, lo, hi) for k, (lo, hi) in sorted(kc.SUPPORTED.items()))
        answer = yield client.call(kc.API_VERSIONS, 0, kc.ApiVersionsRequest())
        self.assertEqual((answer.error, answer.api_versions), (0, expected))
        for correlation, version in ((11, 1), (13, 3), (14, 4)):
            # a flexible header's tags and body are never parsed
            frame = struct.pack(">hhih", kc.API_VERSIONS, version, correlation, 4) + \
                b"test\x00\x01\x02"
            client.send(struct.pack(">i", len(frame)) + frame)
            while not client.frames or struct.unpack_from(">i", client.frames[-1])[0] \
                    != correlation:
                yield sleep(0.01)
            _, body = kc.decode_response(kc.API_VERSIONS, 0, client.frames[-1])
            self.assertEqual((body.error, body.api_versions),
                             (kc.UNSUPPORTED_VERSION, expected))

    # -- 5: Metadata -------------------------------------------------------------------------

    @defer.inlineCallbacks
    def test_metadata_advertises_the_bound_port_and_auto_creates(self):
        client = yield self.start()
        answer = yield client.call(kc.METADATA, 0, kc.MetadataRequest(()))
        self.assertEqual(answer.brokers, ((0, "127.0.0.1", self.port),))
        self.assertEqual(answer.topics, ())
        answer = yield client.call(kc.METADATA, 0, kc.MetadataRequest(("new", "bad/name")))
        self.assertEqual(answer.topics, ((0, "new", ((0, 0, 0, (0,), (0,)),)),
                                         (kc.INVALID_TOPIC, "bad/name", ())))
        answer = yield client.call(kc.METADATA, 0, kc.MetadataRequest(()))
        self.assertEqual([t[1] for t in answer.topics], ["new"])
        coordinator = yield client.call(kc.GROUP_COORDINATOR, 0, kc.GroupCoordinatorRequest("g"))
        self.assertEqual(coordinator, kc.GroupCoordinatorResponse(0, 0, "127.0.0.1", self.port))

    @defer.inlineCallbacks
    def test_metadata_without_auto_create(self):
        client = yield self.start(topics={"auto_create": False, "default_partitions": 3})
        answer = yield client.call(kc.METADATA, 0, kc.MetadataRequest(("missing",)))
        self.assertEqual(answer.topics, ((kc.UNKNOWN_TOPIC_OR_PARTITION, "missing", ()),))
        yield self.create("made", None)
        answer = yield client.call(kc.METADATA, 0, kc.MetadataRequest(("made",)))
        self.assertEqual([p[1] for p in answer.topics[0][2]], [0, 1, 2])

    @defer.inlineCallbacks
    def test_advertised_options(self):
        client = yield self.start({"advertised_host": "kafka.example", "advertised_port": 1234,
                                   "node_id": 7})
        answer = yield client.call(kc.METADATA, 0, kc.MetadataRequest(("t",)))
        self.assertEqual(answer.brokers, ((7, "kafka.example", 1234),))
        self.assertEqual(answer.topics[0][2], ((0, 0, 7, (7,), (7,)),))
        coordinator = yield client.call(kc.GROUP_COORDINATOR, 0, kc.GroupCoordinatorRequest("g"))
        self.assertEqual(coordinator, kc.GroupCoordinatorResponse(0, 7, "kafka.example", 1234))

    @defer.inlineCallbacks
    def test_wildcard_listener_needs_advertised_host(self):
        config = gateway_config(data_dir(self), [{"dialect": "kafka", "endpoint": "tcp:0"}])
        with self.assertRaises(ConfigError) as caught:
            yield start_gateway(self, config)
        self.assertEqual(caught.exception.path, "listeners[0].advertised_host")

    # -- 6-9: Produce ---------------------------------------------------------------------------

    @defer.inlineCallbacks
    def test_produce_then_fetch_v0_and_v1(self):
        client = yield self.start()
        yield client.call(kc.METADATA, 0, kc.MetadataRequest(("t",)))
        first = yield self.produce("t", 0, [(b"k", b"v"), (None, b"w")])
        second = yield self.produce("t", 0, [(b"", b"x")])
        self.assertEqual((first, second), ((0, 0, 0), (0, 0, 2)))
        for version in (0, 1):
            answer = yield client.call(kc.FETCH, version, fetch_body("t", 0, 1))
            partition, error, hw, data = only_partition(answer)
            self.assertEqual((partition, error, hw), (0, 0, 3))
            self.assertEqual([tuple(m) for m in kc.decode_message_set(data)],
                             [(1, None, None, b"w"), (2, None, b"", b"x")])
        v1 = client.frames[-1]
        self.assertEqual(v1[4:8], b"\x00\x00\x00\x00")      # throttle first in v1

    @defer.inlineCallbacks
    def test_acks_zero_gets_no_answer_and_acks_two_is_refused(self):
        client = yield self.start()
        yield client.call(kc.METADATA, 0, kc.MetadataRequest(("t",)))
        frames_before = len(client.frames)
        _, silent = client.frame(kc.PRODUCE, 0, produce_body("t", 0, [(None, b"a")], acks=0))
        client.send(silent)
        answer = yield client.call(kc.LIST_OFFSETS, 0, kc.ListOffsetsRequest(
            -1, (("t", ((0, -1, 1),)),)))
        self.assertEqual(only_partition(answer), (0, 0, (1,)))
        self.assertEqual(len(client.frames), frames_before + 1)
        refused = yield self.produce("t", 0, [(None, b"b")], acks=2)
        self.assertEqual(refused, (0, kc.INVALID_REQUIRED_ACKS, -1))
        answer = yield client.call(kc.LIST_OFFSETS, 0, kc.ListOffsetsRequest(
            -1, (("t", ((0, -1, 1),)),)))
        self.assertEqual(only_partition(answer), (0, 0, (1,)))

    @defer.inlineCallbacks
    def test_bad_partition_does_not_block_the_others(self):
        client = yield self.start(limits={"max_record_bytes": 100})
        yield self.create("two", 3)
        good = kc.encode_message_set([(None, b"fine")])
        corrupt = bytearray(good)
        corrupt[-1] ^= 0xFF
        too_large = kc.encode_message_set([(None, b"x" * 101)])
        truncated = good + good[:-3]
        answer = yield client.call(kc.PRODUCE, 1, kc.ProduceRequest(1, 1000, (
            ("two", ((0, bytes(corrupt)), (1, good), (2, too_large), (0, truncated))),
            ("nope", ((0, good),)))))
        self.assertEqual(answer.topics, (
            ("two", ((0, kc.CORRUPT_MESSAGE, -1), (1, 0, 0), (2, kc.MESSAGE_SIZE_TOO_LARGE, -1),
                     (0, kc.CORRUPT_MESSAGE, -1))),
            ("nope", ((0, kc.UNKNOWN_TOPIC_OR_PARTITION, -1),))))
        self.assertEqual(answer.throttle_time_ms, 0)
        for partition, hw in ((0, 0), (1, 1), (2, 0)):
            state = yield self.service.bus.execute(cmd.PartitionInfo("two", partition))
            self.assertEqual(state.high_watermark, hw)

    @defer.inlineCallbacks
    def test_empty_set_and_magic2(self):
        client = yield self.start()
        yield client.call(kc.METADATA, 0, kc.MetadataRequest(("t",)))
        answer = yield client.call(kc.PRODUCE, 0, kc.ProduceRequest(1, 0, (("t", ((0, b""),)),)))
        self.assertEqual(only_partition(answer), (0, 0, -1))
        record_batch = bytearray(kc.encode_entry(0, None, b"v"))
        record_batch[16] = 2
        answer = yield client.call(kc.PRODUCE, 1, kc.ProduceRequest(
            1, 0, (("t", ((0, bytes(record_batch)),)),)))
        self.assertEqual(only_partition(answer), (0, kc.CORRUPT_MESSAGE, -1))

    @defer.inlineCallbacks
    def test_sealed_partition_refuses_produce_but_serves_fetch(self):
        client = yield self.start()
        yield self.produce_after_metadata("t", [(None, b"a")])
        yield self.service.bus.execute(cmd.SealPartition("t", 0))
        self.assertEqual((yield self.produce("t", 0, [(None, b"b")])), (0, kc.UNKNOWN, -1))
        answer = yield client.call(kc.FETCH, 0, fetch_body("t", 0, 0, max_wait_ms=20000,
                                                           min_bytes=1 << 20))
        partition, error, hw, data = only_partition(answer)
        self.assertEqual((error, hw, len(kc.decode_message_set(data))), (0, 1, 1))

    @defer.inlineCallbacks
    def test_produce_is_acknowledged_once_durable(self):
        client = yield self.start(storage={"fsync": "always"})
        yield client.call(kc.METADATA, 0, kc.MetadataRequest(("t",)))
        syncs = self.service.store.syncer.fsyncs
        answer = yield self.produce("t", 0, [(None, b"v")])
        self.assertEqual(answer, (0, 0, 0))
        self.assertGreater(self.service.store.syncer.fsyncs, syncs)

    # -- 12-16: Fetch ------------------------------------------------------------------------------

    @defer.inlineCallbacks
    def test_long_poll_times_out_empty(self):
        client = yield self.start()
        yield self.produce_after_metadata("t", [(None, b"a")])
        started = time.monotonic()
        answer = yield client.call(kc.FETCH, 0, fetch_body("t", 0, 1, max_wait_ms=300,
                                                           min_bytes=1))
        self.assertGreaterEqual(time.monotonic() - started, 0.25)
        self.assertEqual(only_partition(answer), (0, 0, 1, b""))
        self.assertEqual(self.service.bus.parked, 0)

    @defer.inlineCallbacks
    def produce_after_metadata(self, topic, records):
        yield self.client.call(kc.METADATA, 0, kc.MetadataRequest((topic,)))
        answer = yield self.produce(topic, 0, records)
        return answer

    @defer.inlineCallbacks
    def test_long_poll_is_woken_by_another_dialect(self):
        client = yield self.start()
        yield self.produce_after_metadata("t", [(None, b"a")])
        parked = client.call(kc.FETCH, 0, fetch_body("t", 0, 1, max_wait_ms=20000, min_bytes=1))
        yield sleep(0.1)
        self.assertFalse(parked.called)
        self.assertEqual(self.service.bus.parked, 1)
        rustlog = yield self.rustlog()
        offsets = yield rustlog.produce("t", 0, [b"from rustlog"])
        self.assertEqual(offsets, [1])
        answer = yield parked
        _, error, hw, data = only_partition(answer)
        self.assertEqual((error, hw), (0, 2))
        self.assertEqual([(m.offset, m.value) for m in kc.decode_message_set(data)],
                         [(1, b"from rustlog")])

    @defer.inlineCallbacks
    def test_min_bytes_zero_and_errors_answer_at_once(self):
        client = yield self.start()
        yield self.produce_after_metadata("t", [(None, b"a")])
        started = time.monotonic()
        answer = yield client.call(kc.FETCH, 0, fetch_body("t", 0, 1, max_wait_ms=20000,
                                                           min_bytes=0))
        self.assertEqual(only_partition(answer), (0, 0, 1, b""))
        answer = yield client.call(kc.FETCH, 0, kc.FetchRequest(-1, 20000, 1, (
            ("t", ((0, 1, 1024), (0, 5, 1024), (9, 0, 1024))), ("nope", ((0, 0, 1024),)))))
        self.assertEqual(answer.topics, (
            ("t", ((0, 0, 1, b""), (0, kc.OFFSET_OUT_OF_RANGE, -1, b""),
                   (9, kc.UNKNOWN_TOPIC_OR_PARTITION, -1, b""))),
            ("nope", ((0, kc.UNKNOWN_TOPIC_OR_PARTITION, -1, b""),))))
        self.assertLess(time.monotonic() - started, 5)
        answer = yield client.call(kc.METADATA, 0, kc.MetadataRequest(()))
        self.assertEqual([t[1] for t in answer.topics], ["t"])      # fetch created nothing

    @defer.inlineCallbacks
    def test_answers_keep_request_order(self):
        client = yield self.start()
        yield self.produce_after_metadata("t", [(None, b"a")])
        parked = client.call(kc.FETCH, 0, fetch_body("t", 0, 1, max_wait_ms=300, min_bytes=1))
        metadata = client.call(kc.METADATA, 0, kc.MetadataRequest(("t",)))
        order = []
        parked.addCallback(lambda _: order.append("fetch"))
        metadata.addCallback(lambda _: order.append("metadata"))
        yield defer.gatherResults([parked, metadata])
        self.assertEqual(order, ["fetch", "metadata"])

    @defer.inlineCallbacks
    def test_large_message_is_returned_whole(self):
        client = yield self.start()
        yield self.produce_after_metadata("t", [(None, b"x" * 5000), (None, b"y")])
        answer = yield client.call(kc.FETCH, 0, fetch_body("t", 0, 0, max_bytes=1024))
        data = only_partition(answer)[3]
        self.assertEqual([len(m.value) for m in kc.decode_message_set(data)], [5000])

    @defer.inlineCallbacks
    def test_parked_fetch_is_cancelled_when_the_connection_closes(self):
        client = yield self.start()
        yield self.produce_after_metadata("t", [(None, b"a")])
        parked = client.call(kc.FETCH, 0, fetch_body("t", 0, 1, max_wait_ms=20000, min_bytes=1))
        parked.addErrback(lambda f: None)
        yield sleep(0.05)
        self.assertEqual(self.service.bus.parked, 1)
        yield client.close()
        yield sleep(0.05)
        self.assertEqual(self.service.bus.parked, 0)

    @defer.inlineCallbacks
    def test_below_the_log_start_after_retention(self):
        client = yield self.start(storage={"segment_bytes": 1024,
                                           "retention": {"hours": None, "bytes": 1024}})
        yield client.call(kc.METADATA, 0, kc.MetadataRequest(("t",)))
        for i in range(6):
            yield self.produce("t", 0, [(None, bytes([i]) * 600)])
        self.assertGreater(self.service.store.enforce_retention(), 0)
        answer = yield client.call(kc.LIST_OFFSETS, 0, kc.ListOffsetsRequest(
            -1, (("t", ((0, -2, 1), (0, -1, 1))),)))
        (_, _, (start,)), (_, _, (end,)) = answer.topics[0][1]
        self.assertEqual(end, 6)
        self.assertTrue(0 < start < 6)
        answer = yield client.call(kc.FETCH, 0, fetch_body("t", 0, 0, max_wait_ms=20000,
                                                           min_bytes=1))
        self.assertEqual(only_partition(answer), (0, kc.OFFSET_OUT_OF_RANGE, -1, b""))
        answer = yield client.call(kc.FETCH, 0, fetch_body("t", 0, start))
        self.assertEqual(kc.decode_message_set(only_partition(answer)[3])[0].offset, start)

    # -- 17: ListOffsets ------------------------------------------------------------------------------

    @defer.inlineCallbacks
    def test_list_offsets(self):
        client = yield self.start()
        yield self.produce_after_metadata("t", [(None, b"a"), (None, b"b")])
        timestamp = int(reactor.seconds() * 1000) + 60000
        answer = yield client.call(kc.LIST_OFFSETS, 0, kc.ListOffsetsRequest(-1, (
            ("t", ((0, -1, 1), (0, -2, 5), (0, 0, 1), (0, timestamp, 1), (0, -3, 1),
                   (4, -1, 1))),
            ("nope", ((0, -1, 1),)))))
        self.assertEqual(answer.topics, (
            ("t", ((0, 0, (2,)), (0, 0, (0,)), (0, 0, (0,)), (0, 0, (2,)), (0, kc.UNKNOWN, ()),
                   (4, kc.UNKNOWN_TOPIC_OR_PARTITION, ()))),
            ("nope", ((0, kc.UNKNOWN_TOPIC_OR_PARTITION, ()),))))

    # -- 18-19: committed offsets ---------------------------------------------------------------------

    @defer.inlineCallbacks
    def test_offset_commit_and_fetch_every_version(self):
        client = yield self.start()
        yield client.call(kc.METADATA, 0, kc.MetadataRequest(("t",)))
        commits = {
            0: kc.OffsetCommitRequest("g0", (("t", ((0, 5, "m0"),)),)),
            1: kc.OffsetCommitRequest("g1", (("t", ((0, 6, -1, "m1"),)),), -1, ""),
            2: kc.OffsetCommitRequest("g2", (("t", ((0, 7, "m2"),)),), -1, "", -1),
        }
        for version, body in commits.items():
            answer = yield client.call(kc.OFFSET_COMMIT, version, body)
            self.assertEqual(answer.topics, (("t", ((0, 0),)),))
        for version in (0, 1):
            for group, offset in (("g0", 5), ("g1", 6), ("g2", 7)):
                answer = yield client.call(kc.OFFSET_FETCH, version, kc.OffsetFetchRequest(
                    group, (("t", (0,)),)))
                self.assertEqual(answer.topics, (("t", ((0, offset, f"m{offset - 5}", 0),)),))
        answer = yield client.call(kc.OFFSET_FETCH, 1, kc.OffsetFetchRequest(
            "never", (("t", (0, 3)), ("nope", (0,)))))
        self.assertEqual(answer.topics, (("t", ((0, -1, "", 0), (3, -1, "", 3))),
                                         ("nope", ((0, -1, "", 3),))))

    @defer.inlineCallbacks
    def test_offset_commit_errors(self):
        client = yield self.start()
        yield client.call(kc.METADATA, 0, kc.MetadataRequest(("t",)))
        answer = yield client.call(kc.OFFSET_COMMIT, 0, kc.OffsetCommitRequest("g", (
            ("t", ((0, -1, ""), (0, 1, "x" * 4097), (0, 1, "x" * 4096), (7, 1, ""))),
            ("nope", ((0, 1, ""),)))))
        self.assertEqual(answer.topics, (
            ("t", ((0, kc.OFFSET_OUT_OF_RANGE), (0, kc.OFFSET_METADATA_TOO_LARGE), (0, 0),
                   (7, kc.UNKNOWN_TOPIC_OR_PARTITION))),
            ("nope", ((0, kc.UNKNOWN_TOPIC_OR_PARTITION),))))
        answer = yield client.call(kc.OFFSET_COMMIT, 0, kc.OffsetCommitRequest(
            "", (("t", ((0, 1, ""),)),)))
        self.assertEqual(answer.topics, (("t", ((0, kc.INVALID_GROUP_ID),)),))
        answer = yield client.call(kc.OFFSET_COMMIT, 2, kc.OffsetCommitRequest(
            "lonely", (("t", ((0, 1, ""),)),), 3, "someone", -1))
        self.assertEqual(answer.topics, (("t", ((0, kc.ILLEGAL_GENERATION),)),))

    @defer.inlineCallbacks
    def test_commits_are_shared_with_rustlog(self):
        client = yield self.start()
        yield client.call(kc.METADATA, 0, kc.MetadataRequest(("t",)))
        rustlog = yield self.rustlog()
        yield rustlog.commit("shared", "t", 0, 41)
        answer = yield client.call(kc.OFFSET_FETCH, 1, kc.OffsetFetchRequest(
            "shared", (("t", (0,)),)))
        self.assertEqual(answer.topics, (("t", ((0, 41, "", 0),)),))
        yield client.call(kc.OFFSET_COMMIT, 1, kc.OffsetCommitRequest(
            "shared", (("t", ((0, 42, -1, "kafka"),)),), -1, ""))
        self.assertEqual((yield rustlog.committed("shared", "t", 0)), 42)

    @defer.inlineCallbacks
    def test_commits_survive_a_restart(self):
        client = yield self.start()
        yield client.call(kc.METADATA, 0, kc.MetadataRequest(("t",)))
        yield client.call(kc.OFFSET_COMMIT, 2, kc.OffsetCommitRequest(
            "g", (("t", ((0, 9, "meta"),)),), -1, "", -1))
        yield client.close()
        yield self.service.stopService()
        client = yield self.start()
        answer = yield client.call(kc.OFFSET_FETCH, 0, kc.OffsetFetchRequest("g", (("t", (0,)),)))
        self.assertEqual(answer.topics, (("t", ((0, 9, "meta", 0),)),))

    # -- 20-22: group APIs on the wire --------------------------------------------------------------

    @defer.inlineCallbacks
    def test_group_lifecycle_on_the_wire(self):
        client = yield self.start()
        join = kc.JoinGroupRequest("grp", 10000, "", "consumer", (("range", b"sub"),))
        joined = yield client.call(kc.JOIN_GROUP, 0, join, client_id="alpha")
        self.assertEqual((joined.error, joined.generation_id, joined.protocol), (0, 1, "range"))
        self.assertTrue(joined.member_id.startswith("alpha-"))
        self.assertEqual(joined.members, ((joined.member_id, b"sub"),))
        member = joined.member_id
        synced = yield client.call(kc.SYNC_GROUP, 0, kc.SyncGroupRequest(
            "grp", 1, member, ((member, b"assignment"),)))
        self.assertEqual(synced, kc.SyncGroupResponse(0, b"assignment"))
        beat = yield client.call(kc.HEARTBEAT, 0, kc.HeartbeatRequest("grp", 1, member))
        self.assertEqual(beat.error, 0)
        described = yield client.call(kc.DESCRIBE_GROUPS, 0, kc.DescribeGroupsRequest(
            ("grp", "other")))
        self.assertEqual(described.groups, (
            (0, "grp", "Stable", "consumer", "range",
             ((member, "alpha", "127.0.0.1", b"sub", b"assignment"),)),
            (0, "other", "Dead", "", "", ())))
        listed = yield client.call(kc.LIST_GROUPS, 0, kc.ListGroupsRequest())
        self.assertEqual(listed, kc.ListGroupsResponse(0, (("grp", "consumer"),)))
        # commits: a 0.8-style commit (generation -1) while members exist -> 25
        answer = yield client.call(kc.OFFSET_COMMIT, 1, kc.OffsetCommitRequest(
            "grp", (("t", ((0, 1, -1, ""),)),), -1, ""))
        self.assertEqual(answer.topics, (("t", ((0, kc.UNKNOWN_MEMBER_ID),)),))
        yield client.call(kc.METADATA, 0, kc.MetadataRequest(("t",)))
        answer = yield client.call(kc.OFFSET_COMMIT, 2, kc.OffsetCommitRequest(
            "grp", (("t", ((0, 1, ""),)),), 1, member, -1))
        self.assertEqual(answer.topics, (("t", ((0, 0),)),))
        # errors
        stale = yield client.call(kc.HEARTBEAT, 0, kc.HeartbeatRequest("grp", 0, member))
        self.assertEqual(stale.error, kc.ILLEGAL_GENERATION)
        unknown = yield client.call(kc.SYNC_GROUP, 0, kc.SyncGroupRequest("grp", 1, "who", ()))
        self.assertEqual(unknown, kc.SyncGroupResponse(kc.UNKNOWN_MEMBER_ID, b""))
        bad_timeout = yield client.call(kc.JOIN_GROUP, 0, join._replace(session_timeout_ms=10))
        self.assertEqual(bad_timeout, kc.JoinGroupResponse(kc.INVALID_SESSION_TIMEOUT, -1, "",
                                                           "", "", ()))
        disjoint = yield client.call(kc.JOIN_GROUP, 0, join._replace(protocols=(("x", b""),)))
        self.assertEqual(disjoint.error, kc.INCONSISTENT_GROUP_PROTOCOL)
        no_group = yield client.call(kc.JOIN_GROUP, 0, join._replace(group_id=""))
        self.assertEqual(no_group.error, kc.INVALID_GROUP_ID)
        left = yield client.call(kc.LEAVE_GROUP, 0, kc.LeaveGroupRequest("grp", member))
        self.assertEqual(left.error, 0)
        again = yield client.call(kc.LEAVE_GROUP, 0, kc.LeaveGroupRequest("grp", member))
        self.assertEqual(again.error, kc.UNKNOWN_MEMBER_ID)

    @defer.inlineCallbacks
    def test_second_member_rebalances_over_two_connections(self):
        first = yield self.start()
        second = yield connect_raw(self, self.port)
        join = kc.JoinGroupRequest("split", 10000, "", "consumer", (("range", b"s"),))
        a = yield first.call(kc.JOIN_GROUP, 0, join)
        yield first.call(kc.SYNC_GROUP, 0, kc.SyncGroupRequest("split", 1, a.member_id, ()))
        joining = second.call(kc.JOIN_GROUP, 0, join)
        while self.service.bus.groups.describe("split").state != "PreparingRebalance":
            yield sleep(0.01)
        beat = yield first.call(kc.HEARTBEAT, 0, kc.HeartbeatRequest("split", 1, a.member_id))
        self.assertEqual(beat.error, kc.REBALANCE_IN_PROGRESS)
        a2 = yield first.call(kc.JOIN_GROUP, 0, join._replace(member_id=a.member_id))
        b = yield joining
        self.assertEqual((a2.generation_id, b.generation_id), (2, 2))
        self.assertEqual(len(a2.members), 2)
        self.assertEqual(b.members, ())
        waiting = second.call(kc.SYNC_GROUP, 0, kc.SyncGroupRequest("split", 2, b.member_id, ()))
        yield first.call(kc.SYNC_GROUP, 0, kc.SyncGroupRequest(
            "split", 2, a.member_id, ((a.member_id, b"0"), (b.member_id, b"1"))))
        self.assertEqual((yield waiting).assignment, b"1")
