"""RustLog codec: the worked examples of shared/protocols/rustlog.md §6 and §7,
byte for byte, and the codec-level items of its §8 checklist."""
import re
import struct

import pytest

from plugins.rustlog import codec as c
from plugins.rustlog.codec import (
    BINARY, JSON, CreateTopicRequest, CreateTopicResponse, DescribePartitionRequest,
    DescribePartitionResponse, DescribeTopicRequest, DescribeTopicResponse,
    ErrorResponse, FetchRequest, FetchResponse, ListTopicsRequest, ListTopicsResponse,
    MetricsFetchRequest, MetricsResponse, OffsetCommitRequest, OffsetCommitResponse,
    OffsetFetchRequest, OffsetFetchResponse, PingRequest, PongResponse, ProduceRequest,
    ProduceResponse, RustLogDecodeError, decode_request, decode_response,
    encode_request, encode_response)


def hexframe(spec):
    """Bytes from the reference's hex notation: two-digit hex bytes, ``|``
    separators, ``x7`` = the previous byte 7 times in all, ``"text"`` = ASCII."""
    out = bytearray()
    for text, repeat, byte in re.findall(r'"([^"]*)"|x(\d+)|([0-9a-fA-F]{2})', spec):
        if byte:
            out.append(int(byte, 16))
        elif repeat:
            out.extend(out[-1:] * (int(repeat) - 1))
        else:
            out.extend(text.encode("ascii"))
    return bytes(out)


def split_frame(frame):
    """Check a complete frame's length prefix and return its payload."""
    (length,) = struct.unpack(">I", frame[:4])
    assert length == len(frame) - 4
    return frame[4:]


def json_payload(text, prefix):
    """A §6 example given as text plus its length prefix: check the prefix."""
    payload = text.encode()
    assert len(payload) == prefix
    return payload


def parse_error(payload):
    with pytest.raises(RustLogDecodeError) as info:
        decode_request(payload)
    assert info.value.message.startswith("failed to parse request: ")
    return info.value


# --- §6: JSON worked examples ---------------------------------------------

PRODUCE_FRAME = hexframe("""
  00 00 00 45 7b 22 50 72 6f 64 75 63 65 22 3a 7b 22 74 6f 70 69 63 22 3a 22 74 22 2c 22 70 61 72 74 69 74 69 6f 6e
  22 3a 30 2c 22 72 65 63 6f 72 64 73 22 3a 5b 5b 31 30 34 2c 31 30 35 5d 2c 5b 30 2c 32 35 35 5d 5d 7d 7d""")
PRODUCE = ProduceRequest("t", 0, (b"hi", b"\x00\xff"))


def test_json_produce_request_example():
    payload = split_frame(PRODUCE_FRAME)
    assert payload == b'{"Produce":{"topic":"t","partition":0,"records":[[104,105],[0,255]]}}'
    assert decode_request(payload) == (JSON, PRODUCE)
    assert encode_request(JSON, PRODUCE) == payload


def test_json_produce_reply_example():
    """§8 item 1: two records at b = 41 answer exactly these bytes."""
    frame = hexframe("""00 00 00 1f 7b 22 50 72 6f 64 75 63 65 22 3a 7b 22 6f 66 66 73 65 74 73 22 3a
                        5b 34 31 2c 34 32 5d 7d 7d""")
    payload = split_frame(frame)
    assert payload == b'{"Produce":{"offsets":[41,42]}}'
    assert encode_response(JSON, ProduceResponse(41, 2)) == payload
    assert decode_response(payload) == (JSON, ProduceResponse(41, 2))
    assert ProduceResponse(41, 2).offsets == [41, 42]


def test_json_produce_reply_empty():
    assert encode_response(JSON, ProduceResponse(0, 0)) == b'{"Produce":{"offsets":[]}}'
    assert decode_response(b'{"Produce":{"offsets":[]}}') == (JSON, ProduceResponse(0, 0))


def test_json_fetch_request_example():
    payload = json_payload(
        '{"Fetch":{"topic":"t","partition":0,"offset":41,"max_bytes":1048576,"group_id":null}}', 0x55)
    request = FetchRequest("t", 0, 41, 1048576, None)
    assert decode_request(payload) == (JSON, request)
    assert encode_request(JSON, request) == payload


FETCH_REPLY = ('{"Fetch":{"records":[{"offset":41,"payload":[104,105]},'
               '{"offset":42,"payload":[0,255]}],"next_offset":43}}')


def test_json_fetch_reply_example():
    payload = json_payload(FETCH_REPLY, 0x6A)
    response = FetchResponse(((41, b"hi"), (42, b"\x00\xff")), 43)
    assert encode_response(JSON, response) == payload
    assert c.encode_json_fetch(41, [b"hi", b"\x00\xff"], 43) == payload
    assert decode_response(payload) == (JSON, response)


def test_json_fetch_reply_at_end_of_log():
    payload = json_payload('{"Fetch":{"records":[],"next_offset":43}}', 0x29)
    assert payload.startswith(hexframe("7b 22 46 65 74 63 68"))
    assert encode_response(JSON, FetchResponse((), 43)) == payload
    assert c.encode_json_fetch(43, [], 43) == payload
    assert decode_response(payload) == (JSON, FetchResponse((), 43))


def test_json_commit_example():
    payload = json_payload(
        '{"OffsetCommit":{"topic":"t","partition":0,"group_id":"g","offset":43}}', 0x47)
    request = OffsetCommitRequest("t", 0, "g", 43)
    assert decode_request(payload) == (JSON, request)
    assert encode_request(JSON, request) == payload
    reply = split_frame(hexframe("""00 00 00 21 7b 22 4f 66 66 73 65 74 43 6f 6d 6d 69 74 22 3a 7b 22 73
                                    75 63 63 65 73 73 22 3a 74 72 75 65 7d 7d"""))
    assert encode_response(JSON, OffsetCommitResponse(True)) == reply
    assert decode_response(reply) == (JSON, OffsetCommitResponse(True))
    assert encode_response(JSON, OffsetCommitResponse(False)) == \
        b'{"OffsetCommit":{"success":false}}'
    assert decode_response(b'{"OffsetCommit":{"success":false}}') == \
        (JSON, OffsetCommitResponse(False))


def test_json_offset_fetch_example():
    payload = json_payload('{"OffsetFetch":{"topic":"t","partition":0,"group_id":"g"}}', 0x3A)
    request = OffsetFetchRequest("t", 0, "g")
    assert decode_request(payload) == (JSON, request)
    assert encode_request(JSON, request) == payload
    found = json_payload('{"OffsetFetch":{"offset":43}}', 0x1D)
    none = json_payload('{"OffsetFetch":{"offset":null}}', 0x1F)
    assert encode_response(JSON, OffsetFetchResponse(43)) == found
    assert encode_response(JSON, OffsetFetchResponse(None)) == none
    assert decode_response(found) == (JSON, OffsetFetchResponse(43))
    assert decode_response(none) == (JSON, OffsetFetchResponse(None))


def test_json_group_rule_requests_carry_the_group():
    """The group rule itself is the server's; the codec must deliver both the
    requested offset and the group."""
    for offset in (0, 50):
        payload = ('{"Fetch":{"topic":"t","partition":0,"offset":%d,"max_bytes":1048576,'
                   '"group_id":"g"}}' % offset).encode()
        assert decode_request(payload) == (JSON, FetchRequest("t", 0, offset, 1048576, "g"))


def test_json_error_example():
    payload = json_payload('{"Error":{"message":"partition not found: topic=nope, partition=0"}}',
                           0x44)
    response = ErrorResponse("partition not found: topic=nope, partition=0")
    assert encode_response(JSON, response) == payload
    assert decode_response(payload) == (JSON, response)


# --- §7: binary worked examples --------------------------------------------

def check_binary_request(frame, request):
    payload = split_frame(hexframe(frame))
    assert decode_request(payload) == (BINARY, request)
    assert encode_request(BINARY, request) == payload


def check_binary_response(frame, response):
    payload = split_frame(hexframe(frame))
    assert encode_response(BINARY, response) == payload
    assert decode_response(payload) == (BINARY, response)


def test_binary_produce_example():
    """§8 item 15 (Produce)."""
    check_binary_request("00 00 00 12 | 01 | 00 01 74 | 00 00 00 00 | 00 00 00 01 | 00 00 00 02 61 62",
                         ProduceRequest("t", 0, (b"ab",)))
    check_binary_response("00 00 00 0d | 01 | 00 00 00 00 00 00 00 29 | 00 00 00 01",
                          ProduceResponse(41, 1))


def test_binary_fetch_example():
    """§8 item 15 (Fetch); the empty group is "no group"."""
    check_binary_request("00 00 00 16 | 02 | 00 00 | 00 01 74 | 00 00 00 00 | 00 x7 29 | 00 01 00 00",
                         FetchRequest("t", 0, 41, 65536, None))
    check_binary_response("00 00 00 13 | 02 | 00 00 00 01 | 00 00 00 02 61 62 | 00 x7 2a",
                          FetchResponse(((41, b"ab"),), 42))
    assert c.encode_binary_fetch([b"ab"], 42) == \
        split_frame(hexframe("00 00 00 13 | 02 | 00 00 00 01 | 00 00 00 02 61 62 | 00 x7 2a"))


def test_binary_offset_commit_example():
    check_binary_request("00 00 00 13 | 03 | 00 01 67 | 00 01 74 | 00 00 00 00 | 00 x7 2a",
                         OffsetCommitRequest("t", 0, "g", 42))
    check_binary_response("00 00 00 02 03 01", OffsetCommitResponse(True))
    check_binary_response("00 00 00 02 03 00", OffsetCommitResponse(False))


def test_binary_offset_fetch_example():
    check_binary_request("00 00 00 0b | 04 | 00 01 67 | 00 01 74 | 00 00 00 00",
                         OffsetFetchRequest("t", 0, "g"))
    check_binary_response("00 00 00 0a 04 01 00 x7 2a", OffsetFetchResponse(42))
    check_binary_response("00 00 00 02 04 00", OffsetFetchResponse(None))


def test_binary_create_and_list_topics_examples():
    check_binary_request("00 00 00 08 | 05 | 00 01 74 | 00 00 00 03", CreateTopicRequest("t", 3))
    check_binary_response("00 00 00 02 05 01", CreateTopicResponse(True))
    check_binary_request("00 00 00 01 06", ListTopicsRequest())
    check_binary_response("00 00 00 0c | 06 | 00 00 00 01 | 00 01 74 | 00 00 00 03",
                          ListTopicsResponse((("t", 3),)))


def test_binary_describe_examples():
    check_binary_request("00 00 00 08 | 08 | 00 01 74 | 00 00 00 00", DescribePartitionRequest("t", 0))
    check_binary_response("00 00 00 10 | 08 | 00 01 74 | 00 00 00 00 | 00 x7 2b",
                          DescribePartitionResponse("t", 0, 43))
    check_binary_request("00 00 00 04 | 07 | 00 01 74", DescribeTopicRequest("t"))
    check_binary_response("""00 00 00 24 | 07 | 00 01 74 | 00 00 00 02 | 00 00 00 02
                             | 00 00 00 00 | 00 x7 2b | 00 00 00 01 | 00 x8""",
                          DescribeTopicResponse("t", 2, ((0, 43), (1, 0))))


def test_binary_metrics_ping_error_examples():
    check_binary_request("00 00 00 01 09", MetricsFetchRequest())
    check_binary_response('00 00 00 0a | 09 | 00 00 00 05 "up 1" 0a', MetricsResponse("up 1\n"))
    check_binary_request("00 00 00 01 ff", PingRequest())
    check_binary_response("00 00 00 01 ff", PongResponse())
    check_binary_response('00 00 00 16 | fe | 00 0a | 00 11 "unknown partition"',
                          ErrorResponse("unknown partition", c.UNKNOWN_PARTITION))


def test_binary_list_topics_sorted_by_name():
    payload = encode_response(BINARY, ListTopicsResponse((("b", 1), ("a", 2))))
    assert decode_response(payload) == (BINARY, ListTopicsResponse((("a", 2), ("b", 1))))


def test_binary_error_message_is_never_refused():
    long_message = "é" * 40000  # 80,000 UTF-8 bytes: more than a str16 holds
    _, decoded = decode_response(encode_response(BINARY, ErrorResponse(long_message, 500)))
    assert decoded.message == "é" * 32767 and decoded.code == 500
    _, decoded = decode_response(encode_response(BINARY, ErrorResponse("bad \ud800", None)))
    assert decoded == ErrorResponse("bad ?", c.INTERNAL)
    assert decode_response(encode_response(JSON, ErrorResponse("bad \ud800"))) == \
        (JSON, ErrorResponse("bad ?"))


# --- variant detection ---------------------------------------------------------

@pytest.mark.parametrize("first, variant", [
    (b"{", JSON), (b" ", JSON), (b"[", JSON), (b"\x00", JSON), (b"\x0a", JSON), (b"\xfe", JSON),
    (b"\x01", BINARY), (b"\x05", BINARY), (b"\x09", BINARY), (b"\xff", BINARY)])
def test_detect_variant(first, variant):
    assert c.detect_variant(first + b"rest") == variant


def test_binary_variant_can_be_switched_off():
    payload = encode_request(BINARY, PingRequest())
    assert decode_request(payload) == (BINARY, PingRequest())
    with pytest.raises(RustLogDecodeError) as info:
        decode_request(payload, binary=False)
    assert info.value.variant == JSON


def test_json_with_leading_tab_is_binary_metrics():
    """§2: 0x09 is a binary tag, so a JSON text starting with TAB is not JSON."""
    with pytest.raises(RustLogDecodeError) as info:
        decode_request(b'\t{"OffsetFetch":{"topic":"t","partition":0,"group_id":"g"}}')
    assert info.value.variant == BINARY


# --- §8 item 2: bytes ----------------------------------------------------------

def test_every_byte_value_round_trips():
    every = bytes(range(256))
    request = ProduceRequest("t", 0, (every, b"", every[::-1]))
    payload = encode_request(JSON, request)
    assert b"[]" in payload
    assert decode_request(payload) == (JSON, request)
    response = FetchResponse(((7, every),), 8)
    assert decode_response(encode_response(JSON, response)) == (JSON, response)


@pytest.mark.parametrize("value", [
    "256", "-1", "1.0", "1e2", "0.5", "true", "false", "null", '"a"', "[1]", "{}", "18446744073709551616"])
def test_bad_byte_values_are_parse_errors(value):
    payload = ('{"Produce":{"topic":"t","partition":0,"records":[[1,2],[3,%s]]}}' % value).encode()
    error = parse_error(payload)
    assert "records[1]" in error.message
    assert error.variant == JSON


@pytest.mark.parametrize("record", ["5", "true", '"ab"', "null", "{}", "1.5"])
def test_records_must_be_arrays(record):
    parse_error(('{"Produce":{"topic":"t","partition":0,"records":[%s]}}' % record).encode())


def test_booleans_found_even_among_many_e():
    """The bool guard hops over "e"s; a payload with more of them than it
    hops over still has its booleans found."""
    topic = "e" * 100
    payload = ('{"Produce":{"topic":"%s","partition":0,"records":[[1,true]]}}' % topic).encode()
    parse_error(payload)
    payload = ('{"Produce":{"topic":"%s","partition":0,"records":[[1,1]]}}' % topic).encode()
    assert decode_request(payload)[1].records == (b"\x01\x01",)
    payload = b'{"Produce":{"topic":"true","partition":0,"records":[[1,0]]}}'
    assert decode_request(payload)[1] == ProduceRequest("true", 0, (b"\x01\x00",))


@pytest.mark.parametrize("field, value", [
    ("partition", "-1"), ("partition", "4294967296"), ("partition", "1.0"), ("partition", "true"),
    ("partition", '"0"'), ("partition", "null"),
    ("offset", "-1"), ("offset", "18446744073709551616"), ("offset", "41.0"), ("offset", "false"),
    ("offset", "4.1e1"),
    ("max_bytes", "-1"), ("max_bytes", "1e6"), ("max_bytes", "true"), ("max_bytes", "[]"),
    ("topic", "1"), ("topic", "null"), ("group_id", "1"), ("group_id", "false"), ("group_id", "[]")])
def test_bad_fetch_fields(field, value):
    fields = {"topic": '"t"', "partition": "0", "offset": "41", "max_bytes": "100",
              "group_id": "null"}
    fields[field] = value
    body = ",".join('"%s":%s' % kv for kv in fields.items())
    error = parse_error(('{"Fetch":{%s}}' % body).encode())
    assert field in error.message


def test_number_limits_accepted():
    payload = (b'{"Fetch":{"topic":"t","partition":4294967295,"offset":18446744073709551615,'
               b'"max_bytes":0}}')
    assert decode_request(payload) == (JSON, FetchRequest("t", 4294967295, 2 ** 64 - 1, 0, None))


@pytest.mark.parametrize("request_text", [
    '{"Produce":{"partition":0,"records":[]}}',
    '{"Produce":{"topic":"t","records":[]}}',
    '{"Produce":{"topic":"t","partition":0}}',
    '{"Fetch":{"topic":"t","partition":0,"max_bytes":1}}',
    '{"Fetch":{"topic":"t","partition":0,"offset":1}}',
    '{"OffsetCommit":{"topic":"t","partition":0,"group_id":"g"}}',
    '{"OffsetCommit":{"topic":"t","partition":0,"offset":1}}',
    '{"OffsetFetch":{"topic":"t","partition":0}}'])
def test_missing_fields(request_text):
    assert "missing field" in parse_error(request_text.encode()).message


# --- structure -------------------------------------------------------------------

@pytest.mark.parametrize("payload", [
    b'{"Delete":{"topic":"t"}}',                                  # unknown tag
    b'{"produce":{"topic":"t","partition":0,"records":[]}}',      # tags are case-sensitive
    b'{"Produce":{"topic":"t","partition":0,"records":[]},"Fetch":{}}',  # two keys
    b'{}', b'[]', b'"Produce"', b'42', b'null',                   # not one tagged object
    b'{"Produce":[]}', b'{"Produce":null}', b'{"OffsetFetch":"x"}',
    b'{"Produce":', b'not json', b'\xff\xfe', b'{"Produce":{"topic":"\xc3\x28"}}',
    b' ', b'{"OffsetFetch":{"topic":"t","partition":0,"group_id":"g"}} x'])
def test_not_a_request(payload):
    assert parse_error(payload).code == c.DECODE_ERROR


def test_empty_frame():
    with pytest.raises(RustLogDecodeError) as info:
        decode_request(b"")
    assert info.value.message == "failed to parse request: empty frame"
    assert info.value.code == c.FRAME_ERROR
    assert info.value.variant is None


def test_unknown_extra_fields_ignored():
    payload = (b'{"Produce":{"topic":"t","extra":{"nested":[true,1.5]},"partition":0,'
               b'"records":[[104,105],[0,255]],"more":null}}')
    assert decode_request(payload) == (JSON, PRODUCE)
    payload = b'{"OffsetCommit":{"offset":43,"group_id":"g","partition":0,"topic":"t","x":1}}'
    assert decode_request(payload) == (JSON, OffsetCommitRequest("t", 0, "g", 43))


def test_whitespace_is_allowed():
    payload = (b'  {\n "Produce" : { "topic" : "t", "partition" : 0,\r\n'
               b' "records" : [ [104 , 105], [0,255] ] } }\n')
    assert decode_request(payload) == (JSON, PRODUCE)


@pytest.mark.parametrize("group", ['"group_id":null,', '"group_id":"",', ''])
def test_no_group_three_ways(group):
    payload = ('{"Fetch":{%s"topic":"t","partition":0,"offset":5,"max_bytes":9}}' % group).encode()
    assert decode_request(payload) == (JSON, FetchRequest("t", 0, 5, 9, None))


def test_offset_commit_needs_a_group():
    error = parse_error(b'{"OffsetCommit":{"topic":"t","partition":0,"group_id":"","offset":1}}')
    assert "group_id" in error.message
    parse_error(b'{"OffsetCommit":{"topic":"t","partition":0,"group_id":null,"offset":1}}')


def test_offset_fetch_with_empty_group_is_decoded():
    """Only OffsetCommit refuses the empty group (§3); an OffsetFetch for it
    is well-formed and simply finds no commit."""
    payload = b'{"OffsetFetch":{"topic":"t","partition":0,"group_id":""}}'
    assert decode_request(payload) == (JSON, OffsetFetchRequest("t", 0, ""))


def test_request_with_true_in_a_string_is_fine():
    payload = b'{"Fetch":{"topic":"true","partition":0,"offset":0,"max_bytes":1,"group_id":"false"}}'
    assert decode_request(payload) == (JSON, FetchRequest("true", 0, 0, 1, "false"))


# --- binary decode errors ----------------------------------------------------

PRODUCE_BINARY = split_frame(hexframe(
    "00 00 00 12 | 01 | 00 01 74 | 00 00 00 00 | 00 00 00 01 | 00 00 00 02 61 62"))


@pytest.mark.parametrize("payload, words", [
    (PRODUCE_BINARY[:-1], "truncated"),
    (PRODUCE_BINARY[:3], "truncated"),
    (b"\x01", "truncated"),
    (PRODUCE_BINARY + b"\x00", "trailing"),
    (b"\xff\x00", "trailing"),
    (b"\x06\x06", "trailing"),
    (b"\x01\x00\x01\xff\x00\x00\x00\x00\x00\x00\x00\x00", "UTF-8"),
    (b"\x07\x00\x02\xed\xa0", "UTF-8"),                     # an encoded surrogate
    (b"\x02\x00\x00\x00\x01t\x00\x00\x00\x00" + b"\x00" * 8 + b"\x00\x01", "truncated"),
    (b"\x01\x00\x01t\x00\x00\x00\x00\xff\xff\xff\xff\x00\x00\x00\x00", "truncated"),
])
def test_binary_decode_errors(payload, words):
    with pytest.raises(RustLogDecodeError) as info:
        decode_request(payload)
    assert info.value.code == c.DECODE_ERROR
    assert info.value.variant == BINARY
    assert words in info.value.message


def test_binary_offset_commit_group_may_be_empty():
    payload = encode_request(BINARY, OffsetCommitRequest("t", 0, "", 1))
    assert decode_request(payload) == (BINARY, OffsetCommitRequest("t", 0, "", 1))


# --- encoders refuse what they cannot express ------------------------------------

def test_encoders_refuse_what_the_variant_cannot_say():
    with pytest.raises(ValueError):
        encode_request(JSON, CreateTopicRequest("t", 1))
    with pytest.raises(ValueError):
        encode_response(JSON, PongResponse())
    with pytest.raises(ValueError):
        encode_request(BINARY, FetchRequest("t", 0, 0, 2 ** 32, None))
    with pytest.raises(ValueError):
        encode_request(BINARY, DescribeTopicRequest("x" * 70000))
    with pytest.raises(ValueError):
        encode_request(JSON, FetchRequest("t", 0, 2 ** 64, 1, None))
    with pytest.raises(ValueError):
        encode_request("xml", PingRequest())


# --- response decoding (client side) --------------------------------------------

@pytest.mark.parametrize("payload", [
    b'{"Produce":{"offsets":[1,3]}}', b'{"Produce":{"offsets":[-1]}}', b'{"Produce":{}}',
    b'{"Fetch":{"records":[{"offset":1,"payload":[256]}],"next_offset":2}}',
    b'{"Fetch":{"records":[{"offset":1,"payload":[true]}],"next_offset":2}}',
    b'{"Fetch":{"records":[{"offset":1}],"next_offset":2}}',
    b'{"Fetch":{"records":[1],"next_offset":2}}',
    b'{"Fetch":{"records":[]}}',
    b'{"OffsetCommit":{"success":1}}', b'{"OffsetFetch":{"offset":1.5}}',
    b'{"Error":{"message":5}}', b'{"Pong":{}}', b'',
    b'\x02\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01',
    b'\x03\x02', b'\x04\x01\x00', b'\xfe\x00\x01\x00\x05abc'])
def test_bad_responses(payload):
    with pytest.raises(RustLogDecodeError) as info:
        decode_response(payload)
    assert info.value.message.startswith("failed to parse response: ")


def test_offset_fetch_reply_without_offset_is_none():
    assert decode_response(b'{"OffsetFetch":{}}') == (JSON, OffsetFetchResponse(None))


# --- sizing ------------------------------------------------------------------------

SIZING_PAYLOADS = [b"", b"\x00", b"\x09\x0a", b"\x63\x64\xff", bytes(range(256)) * 3, b"\xff" * 1000]


@pytest.mark.parametrize("count", [0, 1, 2, 6])
@pytest.mark.parametrize("first", [0, 9, 10, 12345, 2 ** 64 - 10])
def test_json_fetch_sizes(first, count):
    values = SIZING_PAYLOADS[:count]
    next_offset = first + count
    reply = c.encode_json_fetch(first, values, next_offset)
    exact = [c.json_record_size(first + i, v) for i, v in enumerate(values)]
    bounds = [c.json_record_cost(first + i, len(v)) for i, v in enumerate(values)]
    # Each record counts one separating comma; the last needs none.
    assert len(reply) == 39 + len(str(next_offset)) + sum(exact) - (1 if values else 0)
    assert all(b >= e for b, e in zip(bounds, exact))
    assert len(reply) <= c.JSON_FETCH_ENVELOPE_BYTES + sum(bounds)


def test_json_cost_bound_is_tight_for_255():
    value = b"\xff" * 1000
    assert c.json_record_size(5, value) == c.json_record_cost(5, len(value)) - 1


def test_binary_fetch_sizes():
    values = SIZING_PAYLOADS
    reply = c.encode_binary_fetch(values, 100)
    assert len(reply) == c.BINARY_FETCH_ENVELOPE_BYTES + sum(c.binary_record_cost(len(v)) for v in values)
