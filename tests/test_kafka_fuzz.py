"""Kafka codec under hypothesis.

1. Whatever the bytes, ``decode_request`` returns a ``Request`` or raises
   ``KafkaDecodeError`` / ``UnsupportedRequest`` (random frames, and valid
   frames of every API with bytes flipped, cut off, inserted or deleted);
   ``decode_response`` and ``read_produced`` likewise raise only their own
   errors.
2. Round trips: every valid request of every supported (key, version)
   decodes to what was encoded.
"""
from hypothesis import HealthCheck, given, settings, strategies as st

from plugins.kafka import codec as kc

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

i16 = st.integers(-2 ** 15, 2 ** 15 - 1)
i32 = st.integers(-2 ** 31, 2 ** 31 - 1)
i64 = st.integers(-2 ** 63, 2 ** 63 - 1)
text = st.text(max_size=10)
blob = st.binary(max_size=30)


def arr(item, size=3):
    return st.lists(item, max_size=size).map(tuple)


def topics(partition):
    return arr(st.tuples(text, arr(partition)))


message_sets = st.lists(st.tuples(st.none() | blob, st.none() | blob), max_size=3).map(
    lambda records: kc.encode_message_set(records))

BODIES = {
    (kc.PRODUCE, 0): st.builds(kc.ProduceRequest, i16, i32, topics(st.tuples(i32, message_sets))),
    (kc.PRODUCE, 1): st.builds(kc.ProduceRequest, i16, i32, topics(st.tuples(i32, blob))),
    (kc.FETCH, 0): st.builds(kc.FetchRequest, i32, i32, i32, topics(st.tuples(i32, i64, i32))),
    (kc.FETCH, 1): st.builds(kc.FetchRequest, i32, i32, i32, topics(st.tuples(i32, i64, i32))),
    (kc.LIST_OFFSETS, 0): st.builds(kc.ListOffsetsRequest, i32,
                                    topics(st.tuples(i32, i64, i32))),
    (kc.METADATA, 0): st.builds(kc.MetadataRequest, arr(text)),
    (kc.OFFSET_COMMIT, 0): st.builds(kc.OffsetCommitRequest, text,
                                     topics(st.tuples(i32, i64, text))),
    (kc.OFFSET_COMMIT, 1): st.builds(kc.OffsetCommitRequest, text,
                                     topics(st.tuples(i32, i64, i64, text)), i32, text),
    (kc.OFFSET_COMMIT, 2): st.builds(kc.OffsetCommitRequest, text,
                                     topics(st.tuples(i32, i64, text)), i32, text, i64),
    (kc.OFFSET_FETCH, 0): st.builds(kc.OffsetFetchRequest, text, topics(i32)),
    (kc.OFFSET_FETCH, 1): st.builds(kc.OffsetFetchRequest, text, topics(i32)),
    (kc.GROUP_COORDINATOR, 0): st.builds(kc.GroupCoordinatorRequest, text),
    (kc.JOIN_GROUP, 0): st.builds(kc.JoinGroupRequest, text, i32, text, text,
                                  arr(st.tuples(text, blob))),
    (kc.HEARTBEAT, 0): st.builds(kc.HeartbeatRequest, text, i32, text),
    (kc.LEAVE_GROUP, 0): st.builds(kc.LeaveGroupRequest, text, text),
    (kc.SYNC_GROUP, 0): st.builds(kc.SyncGroupRequest, text, i32, text,
                                  arr(st.tuples(text, blob))),
    (kc.DESCRIBE_GROUPS, 0): st.builds(kc.DescribeGroupsRequest, arr(text)),
    (kc.LIST_GROUPS, 0): st.just(kc.ListGroupsRequest()),
    (kc.API_VERSIONS, 0): st.just(kc.ApiVersionsRequest()),
}


@st.composite
def requests(draw):
    key, version = draw(st.sampled_from(sorted(BODIES)))
    body = draw(BODIES[(key, version)])
    correlation = draw(i32)
    client_id = draw(st.none() | text)
    return key, version, correlation, client_id, body


@st.composite
def mutated(draw):
    """A valid request frame (without its size prefix), then damaged."""
    key, version, correlation, client_id, body = draw(requests())
    frame = bytearray(kc.encode_request(key, version, correlation, client_id, body)[4:])
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        at = draw(st.integers(0, max(len(frame) - 1, 0)))
        if op == "flip" and frame:
            frame[at] ^= draw(st.integers(1, 255))
        elif op == "cut":
            del frame[at:]
        elif op == "insert":
            frame[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and frame:
            del frame[at:at + draw(st.integers(1, 8))]
    return bytes(frame)


def decode_or_refuse(frame):
    try:
        return kc.decode_request(frame)
    except (kc.KafkaDecodeError, kc.UnsupportedRequest):
        return None


class TestRequestDecoder:

    @FUZZ
    @given(requests())
    def test_round_trip(self, spec):
        key, version, correlation, client_id, body = spec
        frame = kc.encode_request(key, version, correlation, client_id, body)
        assert int.from_bytes(frame[:4], "big") == len(frame) - 4
        assert kc.decode_request(frame[4:]) == kc.Request(key, version, correlation,
                                                          client_id, body)

    @FUZZ
    @given(st.binary(max_size=200))
    def test_random_frames(self, frame):
        decode_or_refuse(frame)

    @FUZZ
    @given(mutated())
    def test_damaged_frames(self, frame):
        request = decode_or_refuse(frame)
        if request is not None and request.api_key == kc.PRODUCE:
            # whatever got through must be safe to validate too
            for _, partitions in request.body.topics:
                for _, data in partitions:
                    try:
                        kc.read_produced(data, 0, 1 << 16)
                    except kc.CorruptMessage:
                        pass

    @FUZZ
    @given(st.sampled_from(sorted(kc.RESPONSES)), st.binary(max_size=120))
    def test_random_responses(self, key_version, frame):
        try:
            kc.decode_response(*key_version, frame)
        except kc.KafkaDecodeError:
            pass

    @FUZZ
    @given(st.lists(st.tuples(st.none() | blob, st.none() | blob), min_size=1, max_size=4),
           st.sampled_from([0, 1]), st.sampled_from([0, 1, 2, 3]),
           st.lists(st.tuples(st.integers(0, 300), st.integers(0, 255)), max_size=3))
    def test_damaged_message_sets(self, records, magic, codec, damage):
        data = bytearray(kc.encode_message_set([r + (5,) for r in records], magic, codec))
        for at, value in damage:
            if at < len(data):
                data[at] = value
        try:
            produced = kc.read_produced(bytes(data), 0, 1 << 16)
        except kc.CorruptMessage:
            return
        assert produced.count == len(records) or damage
