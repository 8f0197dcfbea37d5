"""RustLog codec under hypothesis.

1. Whatever the bytes, the decoders return a message object or raise
   ``RustLogDecodeError``; nothing else escapes (random payloads, and valid
   frames with bytes flipped, cut off, inserted or deleted).
2. Round trips: for every valid message of either variant,
   ``decode(encode(m)) == m``.
"""
from hypothesis import HealthCheck, given, settings, strategies as st

from plugins.rustlog import codec as c
from plugins.rustlog.codec import BINARY, JSON, RustLogDecodeError

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

REQUEST_TYPES = (
    c.ProduceRequest, c.FetchRequest, c.OffsetCommitRequest, c.OffsetFetchRequest,
    c.CreateTopicRequest, c.ListTopicsRequest, c.DescribeTopicRequest,
    c.DescribePartitionRequest, c.MetricsFetchRequest, c.PingRequest)
RESPONSE_TYPES = (
    c.ProduceResponse, c.FetchResponse, c.OffsetCommitResponse, c.OffsetFetchResponse,
    c.CreateTopicResponse, c.ListTopicsResponse, c.DescribeTopicResponse,
    c.DescribePartitionResponse, c.MetricsResponse, c.ErrorResponse, c.PongResponse)

u16 = st.integers(0, 2 ** 16 - 1)
u32 = st.integers(0, 2 ** 32 - 1)
u64 = st.integers(0, 2 ** 64 - 1)
# Text without surrogates (hypothesis' default), which UTF-8 cannot carry.
names = st.text(max_size=12)
groups = st.text(min_size=1, max_size=8)
records = st.lists(st.binary(max_size=40), max_size=6).map(tuple)

json_requests = st.one_of(
    st.builds(c.ProduceRequest, names, u32, records),
    st.builds(c.FetchRequest, names, u32, u64, u64, st.none() | groups),
    st.builds(c.OffsetCommitRequest, names, u32, groups, u64),
    st.builds(c.OffsetFetchRequest, names, u32, st.text(max_size=8)))

binary_requests = st.one_of(
    st.builds(c.ProduceRequest, names, u32, records),
    st.builds(c.FetchRequest, names, u32, u64, u32, st.none() | groups),
    st.builds(c.OffsetCommitRequest, names, u32, st.text(max_size=8), u64),
    st.builds(c.OffsetFetchRequest, names, u32, st.text(max_size=8)),
    st.builds(c.CreateTopicRequest, names, u32),
    st.just(c.ListTopicsRequest()),
    st.builds(c.DescribeTopicRequest, names),
    st.builds(c.DescribePartitionRequest, names, u32),
    st.just(c.MetricsFetchRequest()),
    st.just(c.PingRequest()))


@st.composite
def produce_responses(draw):
    count = draw(st.integers(0, 5))
    base = draw(st.integers(0, 2 ** 64 - 5)) if count else 0
    return c.ProduceResponse(base, count)


@st.composite
def binary_fetch_responses(draw):
    """Offsets are implied: the n records end just below next_offset."""
    payloads = draw(st.lists(st.binary(max_size=40), max_size=5))
    next_offset = draw(st.integers(len(payloads), 2 ** 64 - 1))
    first = next_offset - len(payloads)
    return c.FetchResponse(tuple((first + i, p) for i, p in enumerate(payloads)), next_offset)


json_responses = st.one_of(
    produce_responses(),
    st.builds(c.FetchResponse, st.lists(st.tuples(u64, st.binary(max_size=40)), max_size=5)
              .map(tuple), u64),
    st.builds(c.OffsetCommitResponse, st.booleans()),
    st.builds(c.OffsetFetchResponse, st.none() | u64),
    st.builds(c.ErrorResponse, st.text(max_size=30)))

binary_responses = st.one_of(
    produce_responses(),
    binary_fetch_responses(),
    st.builds(c.OffsetCommitResponse, st.booleans()),
    st.builds(c.OffsetFetchResponse, st.none() | u64),
    st.builds(c.CreateTopicResponse, st.booleans()),
    st.builds(c.ListTopicsResponse, st.lists(st.tuples(names, u32), max_size=4)
              .map(sorted).map(tuple)),
    st.builds(c.DescribeTopicResponse, names, u32,
              st.lists(st.tuples(u32, u64), max_size=4).map(tuple)),
    st.builds(c.DescribePartitionResponse, names, u32, u64),
    st.builds(c.MetricsResponse, st.text(max_size=40)),
    st.builds(c.ErrorResponse, st.text(max_size=30), u16),
    st.just(c.PongResponse()))

valid_request_payloads = st.one_of(
    json_requests.map(lambda r: c.encode_request(JSON, r)),
    binary_requests.map(lambda r: c.encode_request(BINARY, r)))

valid_response_payloads = st.one_of(
    json_responses.map(lambda r: c.encode_response(JSON, r)),
    binary_responses.map(lambda r: c.encode_response(BINARY, r)))


@st.composite
def mutated(draw, payloads):
    """A valid payload with a few random edits."""
    data = bytearray(draw(payloads))
    for _ in range(draw(st.integers(1, 4))):
        edit = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "replace"]))
        at = draw(st.integers(0, len(data)))
        if edit == "flip" and at < len(data):
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif edit == "truncate":
            del data[at:]
        elif edit == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif edit == "delete":
            del data[at:at + draw(st.integers(1, 8))]
        elif at < len(data):
            # JSON tokens that tempt a sloppy decoder.
            data[at:at + 1] = draw(st.sampled_from(
                [b"true", b"false", b"null", b"1.5", b"-1", b"256", b"1e400", b'"x"', b"[]",
                 b"{}", b"18446744073709551616", b"\xff", b"\\ud800"]))
    return bytes(data)


def decodes_or_refuses_request(payload, binary):
    try:
        variant, request = c.decode_request(payload, binary=binary)
    except RustLogDecodeError as e:
        assert e.code in (c.DECODE_ERROR, c.FRAME_ERROR)
        assert e.message.startswith("failed to parse request: ")
        return
    assert variant in (JSON, BINARY)
    assert isinstance(request, REQUEST_TYPES)
    # A decoded request is well-formed, so it can always be encoded again.
    c.encode_request(variant, request)


def decodes_or_refuses_response(payload):
    try:
        variant, response = c.decode_response(payload)
    except RustLogDecodeError:
        return
    assert isinstance(response, RESPONSE_TYPES)


@FUZZ
@given(st.binary(max_size=300), st.booleans())
def test_random_bytes_as_request(payload, binary):
    decodes_or_refuses_request(payload, binary)


@FUZZ
@given(st.sampled_from([1, 2, 3, 4, 5, 6, 7, 8, 9, 0xFF]), st.binary(max_size=100))
def test_random_bytes_after_a_binary_tag(tag, rest):
    decodes_or_refuses_request(bytes([tag]) + rest, True)


@FUZZ
@given(mutated(valid_request_payloads), st.booleans())
def test_mutated_requests(payload, binary):
    decodes_or_refuses_request(payload, binary)


@FUZZ
@given(st.binary(max_size=300) | mutated(valid_response_payloads))
def test_random_and_mutated_responses(payload):
    decodes_or_refuses_response(payload)


@FUZZ
@given(json_requests)
def test_json_request_round_trip(request):
    assert c.decode_request(c.encode_request(JSON, request)) == (JSON, request)


@FUZZ
@given(binary_requests)
def test_binary_request_round_trip(request):
    assert c.decode_request(c.encode_request(BINARY, request)) == (BINARY, request)


@FUZZ
@given(json_responses)
def test_json_response_round_trip(response):
    assert c.decode_response(c.encode_response(JSON, response)) == (JSON, response)


@FUZZ
@given(binary_responses)
def test_binary_response_round_trip(response):
    assert c.decode_response(c.encode_response(BINARY, response)) == (BINARY, response)
