"""TANK codec: the worked examples of protocols/tank.md §10 byte for byte,
varints (§2), bundle validation (§3.3) and the codec-level items of the §11
checklist. Snappy bytes are never compared (§3.4): decoded messages are."""
import re

import cramjam
import pytest

from gateway.records import Records
from plugins.tank import codec as c
from plugins.tank.server import records_bundle

TS = 1700000000000
TS_HEX = "00 68 e5 cf 8b 01 00 00"
HELLO = "04 | 00 | 00 68 e5 cf 8b 01 00 00 | 05 | 68 65 6c 6c 6f"
KEYED = "08 | 01 00 68 e5 cf 8b 01 00 00 02 6b 31 02 76 31 | 03 02 6b 32 02 76 32"
SPARSE_GAP = "4c | 64 00 00 00 00 00 00 00 | 04 | 00 <ts> 01 61 | 06 01 62 | 02 01 63"
SPARSE_DENSE = "4c | 64 00 00 00 00 00 00 00 | 01 | 00 <ts> 01 61 | 06 01 62 | 02 01 63"
SNAPPY = ("09 | 3c | 30 00 00 68 e5 cf 8b 01 00 00 18 61 62 63 | 52 03 00 | 00 02 | 62 1a 00")


def hx(spec, **subst):
    """Bytes from the reference's notation: hex pairs, ``|``/``||`` separators,
    ``x7`` = the previous byte 7 times in all, ``<name>`` = ``subst[name]``
    (``<ts>`` is the reference timestamp)."""
    subst.setdefault("ts", hx(TS_HEX) if spec != TS_HEX else b"")
    out = bytearray()
    for name, repeat, byte in re.findall(r"<([^>]+)>|x(\d+)|([0-9a-fA-F]{2})", spec):
        if byte:
            out.append(int(byte, 16))
        elif repeat:
            out.extend(out[-1:] * (int(repeat) - 1))
        else:
            out.extend(subst[name])
    return bytes(out)


def payload_of(frame_bytes):
    msg_id, length = c.FRAME_HEADER.unpack_from(frame_bytes)
    assert length == len(frame_bytes) - 5
    return msg_id, frame_bytes[5:]


def test_ping_frame():
    assert c.PING_FRAME == hx("03 00 00 00 00")


# -- varints (§2) ------------------------------------------------------------------------

@pytest.mark.parametrize("value, spec", [
    (0, "00"), (127, "7f"), (128, "80 01"), (300, "ac 02"), (16384, "80 80 01"),
    (2 ** 32 - 1, "ff ff ff ff 0f")])
def test_varint_examples(value, spec):
    assert c.encode_varint(value) == hx(spec)
    assert c.decode_varint(hx(spec), 0) == (value, len(hx(spec)))
    assert c.varint_size(value) == len(hx(spec))


@pytest.mark.parametrize("spec", ["80 80 80 80 80 01", "ff ff ff ff 1f", "80", ""])
def test_bad_varints(spec):
    with pytest.raises(c._Short):
        c.decode_varint(hx(spec), 0)


def test_varint_over_32_bits_does_not_encode():
    with pytest.raises(ValueError):
        c.encode_varint(2 ** 32)


# -- bundles (§3, §10) -------------------------------------------------------------------

def test_hello_bundle():
    data = hx(HELLO)
    assert len(data) == 16
    assert c.encode_bundle([b"hello"], timestamps=[TS]) == data
    bundle = c.decode_bundle(data)
    assert (bundle.values, bundle.timestamps, bundle.keys, bundle.sparse) == (
        [b"hello"], [TS], None, False)


def test_keyed_bundle_reuses_the_timestamp():
    data = hx(KEYED)
    assert len(data) == 23
    assert c.encode_bundle([b"v1", b"v2"], [b"k1", b"k2"], [TS, TS]) == data
    bundle = c.decode_bundle(data)
    assert (bundle.keys, bundle.values, bundle.timestamps) == (
        [b"k1", b"k2"], [b"v1", b"v2"], [TS, TS])


def test_sparse_bundle_with_a_gap():
    data = hx(SPARSE_GAP)
    assert len(data) == 27
    assert c.encode_bundle([b"a", b"b", b"c"], timestamps=[TS] * 3, seqs=[100, 101, 105]) == data
    bundle = c.decode_bundle(data)
    assert bundle.seqs == [100, 101, 105]
    assert (bundle.first_seq, bundle.last_seq, bundle.dense) == (100, 105, False)


def test_dense_sparse_bundle():
    data = hx(SPARSE_DENSE)
    assert c.encode_bundle([b"a", b"b", b"c"], timestamps=[TS] * 3, seqs=[100, 101, 102]) == data
    bundle = c.decode_bundle(data)
    assert (bundle.seqs, bundle.dense, bundle.values) == ([100, 101, 102], True,
                                                         [b"a", b"b", b"c"])


def test_sparse_single_message_has_no_last_delta():
    data = c.encode_bundle([b"z"], timestamps=[TS], seqs=[7])
    assert data == hx("44 | 07 00 00 00 00 00 00 00 | 00 <ts> 01 7a")
    assert c.decode_bundle(data).seqs == [7]


def test_reference_snappy_bundle_decodes():
    data = hx(SNAPPY)
    assert len(data) == 24
    bundle = c.decode_bundle(data)
    assert bundle.codec == c.CODEC_SNAPPY
    assert bundle.values == [b"abc" * 8] * 2
    assert bundle.timestamps == [TS, TS]


def test_snappy_round_trip_compares_messages_not_bytes():
    values = [b"abc" * 8, b"abc" * 8]
    data = c.encode_bundle(values, timestamps=[TS, TS], compress=True)
    assert data[0] == 0x09
    assert c.decode_bundle(data).values == values


def test_varint_count_from_16_messages():
    values = [bytes([i]) for i in range(16)]
    data = c.encode_bundle(values, timestamps=[TS] * 16)
    assert data[0] == 0x00 and data[1] == 16
    assert c.bundle_count(data) == 16
    assert c.decode_bundle(data).values == values
    assert c.bundle_count(hx(HELLO)) == 1


def test_real_client_snappy_rule():
    assert not c.wants_snappy([b"x" * 1024])
    assert c.wants_snappy([b"x" * 1025])
    assert c.wants_snappy([b""] * 513)
    assert c.encode_bundle([b"x" * 2000], timestamps=[TS], compress=None)[0] & 0x03 == 1


def test_empty_key_differs_from_no_key():
    data = c.encode_bundle([b"a", b"b"], [b"", None], [TS, TS + 1])
    bundle = c.decode_bundle(data)
    assert bundle.keys == [b"", None]
    assert bundle.timestamps == [TS, TS + 1]


def test_long_key_is_refused_by_the_encoder():
    with pytest.raises(ValueError):
        c.encode_bundle([b"v"], [b"k" * 256], [TS])


def test_many_keyed_messages_with_mixed_timestamps_round_trip():
    values = [bytes([i % 256]) * (i % 300) for i in range(40)]
    keys = [None if i % 3 else b"key%d" % i for i in range(40)]
    stamps = [TS + i // 4 for i in range(40)]
    for compress in (False, True):
        bundle = c.decode_bundle(c.encode_bundle(values, keys, stamps, compress=compress))
        assert (bundle.values, bundle.keys, bundle.timestamps) == (values, keys, stamps)


def message_set(bundle_hex):
    """(header byte, message set) of a plain one-message bundle."""
    data = hx(bundle_hex)
    return data[:1], data[1:]


@pytest.mark.parametrize("mutate, why", [
    (lambda b: bytes([b[0] | 0x80]) + b[1:], "bit 7"),
    (lambda b: bytes([(b[0] & ~0x03) | 0x02]) + b[1:], "codec 2"),
    (lambda b: bytes([(b[0] & ~0x03) | 0x03]) + b[1:], "codec 3"),
    (lambda b: bytes([b[0] & 0xC3]) + b"\x00" + b[1:], "varint count 0"),
    (lambda b: bytes([(b[0] & 0xC3) | (2 << 2)]) + b[1:], "count says 2, one message"),
    (lambda b: b + b"\x00", "trailing byte"),
    (lambda b: b[:-1], "value cut short"),
    (lambda b: b[:5], "timestamp cut short"),
    (lambda b: b[:1], "no message"),
    (lambda b: b[:1] + b"\x02" + b[10:], "first message reuses a ts"),
    (lambda b: b[:1] + b"\x08" + b[2:], "unknown message flag"),
    (lambda b: b[:10] + b"\x85\x80\x80\x80\x80\x00" + b[11:], "6-byte varint length"),
    (lambda b: b[:2] + b"\xff" * 8 + b[10:], "timestamp above 2^63"),
])
def test_invalid_bundles(mutate, why):
    with pytest.raises(c.BundleError):
        c.decode_bundle(mutate(hx(HELLO)))


def test_bad_snappy_is_invalid():
    data = bytearray(hx(SNAPPY))
    data[-1] = 0x7F            # a copy from before the start
    with pytest.raises(c.BundleError):
        c.decode_bundle(bytes(data))
    with pytest.raises(c.BundleError):
        c.decode_bundle(b"\x05" + b"\xff\xff\xff\xff\x0f" + b"\x00" * 8)


def test_snappy_claiming_a_huge_size_is_refused_before_allocating():
    block = c.encode_varint(2 ** 32 - 1) + b"\x00\x61"
    with pytest.raises(c.BundleError, match="claims"):
        c.decode_bundle(b"\x05" + block)


def test_snappy_message_set_must_parse_too():
    compressed = bytes(cramjam.snappy.compress_raw(hx(HELLO)[1:] + b"\x00"))
    with pytest.raises(c.BundleError):
        c.decode_bundle(b"\x05" + compressed)


# -- requests (§4-§6, §10) -----------------------------------------------------------------

PRODUCE_HELLO = ("01 26 00 00 00 | 02 00 | 01 00 00 00 | 03 63 2b 2b | 00 | 00 00 00 00 | 01 | "
                 "01 74 | 01 | 00 00 | 10 | <bundle>")
PRODUCE_SEQNUM = ("05 2e 00 00 00 02 00 03 00 00 00 03 63 2b 2b 00 00 00 00 00 01 01 74 01 00 00 10"
                  " | 02 00 00 00 00 00 00 00 | <bundle>")
CONSUME_V2 = ("02 25 00 00 00 | 02 00 | 07 00 00 00 | 00 | e8 03 00 00 00 00 00 00 | 00 00 00 00 |"
              " 01 | 01 74 | 01 | 00 00 | 01 00 00 00 00 00 00 00 | 00 00 01 00")
CONSUME_V3 = ("02 26 00 00 00 | 03 00 | 07 00 00 00 | 00 | e8 03 00 00 00 00 00 00 | 00 00 00 00 |"
              " 01 | 01 | 01 74 | 01 | 00 00 | 01 00 00 00 00 00 00 00 | 00 00 01 00")


def hello_produce(req_id=1, **kw):
    return c.ProduceRequest(req_id, (c.ProduceTopic("t", (
        c.ProducePartition(0, hx(HELLO), kw.pop("first_seq", 0)),)),),
        client_id="c++", required_acks=0, **kw)


def test_produce_request():
    data = hx(PRODUCE_HELLO, bundle=hx(HELLO))
    assert len(data) == 43
    assert c.encode_request(hello_produce()) == data
    assert c.decode_request(*payload_of(data)) == hello_produce()


def test_produce_with_seqnum_request():
    data = hx(PRODUCE_SEQNUM, bundle=hx(HELLO))
    assert len(data) == 51
    req = hello_produce(3, first_seq=2, with_seqnum=True)
    assert c.encode_request(req) == data
    assert c.decode_request(*payload_of(data)) == req


def test_consume_v2_and_v3_decode_to_the_same_request():
    v2, v3 = hx(CONSUME_V2), hx(CONSUME_V3)
    assert (len(v2), len(v3)) == (42, 43)
    r2 = c.decode_request(*payload_of(v2))
    r3 = c.decode_request(*payload_of(v3))
    assert r2 == c.ConsumeRequest(7, (c.ConsumeTopic("t", (c.ConsumePartition(0, 1, 65536),)),),
                                  1000, 0, 2, 0, "")
    assert (r3.client_version, r3.op_flags) == (3, 1)
    assert (r3.topics, r3.max_wait_ms, r3.min_bytes) == (r2.topics, r2.max_wait_ms, r2.min_bytes)
    assert c.encode_request(r2) == v2 and c.encode_request(r3) == v3


def test_tank_cli_frames():
    produce = hx("01 2d 00 00 00 02 00 01 00 00 00 03 63 2b 2b 00 00 00 00 00 01 01 74 01 00 00 17 |"
                 " 08 00 <ts> 05 68 65 6c 6c 6f 02 05 77 6f 72 6c 64")
    assert len(produce) == 50
    req = c.decode_request(*payload_of(produce))
    bundle = c.decode_bundle(req.topics[0].partitions[0].bundle)
    assert bundle.values == [b"hello", b"world"] and bundle.timestamps == [TS, TS]
    get = hx("02 25 00 00 00 02 00 01 00 00 00 00 | 00 x8 | 00 00 00 00 | 01 01 74 01 00 00 |"
             " 00 x8 | 00 00 00 08")
    req = c.decode_request(*payload_of(get))
    assert (req.max_wait_ms, req.topics[0].partitions[0]) == (0, c.ConsumePartition(0, 0, 2 ** 27))
    reply = hx("02 3b 00 00 00 1f 00 00 00 01 00 00 00 01 01 74 01 00 00 00 | 01 00 x7 | 02 00 x7 |"
               " 18 00 00 00 || 17 08 00 <ts> 05 68 65 6c 6c 6f 02 05 77 6f 72 6c 64")
    resp = c.decode_response(*payload_of(reply))
    entry = resp.topics[0].entries[0]
    assert (entry.base_seq, entry.hw_mark) == (1, 2)
    messages, complete = c.decode_chunk(entry.chunk, entry.base_seq)
    assert complete and [(s, v) for s, _, _, v in messages] == [(1, b"hello"), (2, b"world")]


def test_admin_requests():
    cases = [
        ("06 06 00 00 00 05 00 00 00 01 74", c.DiscoverPartitionsRequest(5, "t")),
        ("07 0e 00 00 00 06 00 00 00 06 65 76 65 6e 74 73 04 00 00",
         c.CreateTopicRequest(6, "events", 4)),
        ("0a 04 00 00 00 07 00 00 00", c.StatusRequest(7)),
        ("0b 05 00 00 00 08 00 00 00 00", c.DiscoverTopicsRequest(8, 0)),
        ("0c 05 00 00 00 09 00 00 00 00", c.DiscoverTopologyRequest(9, 0)),
    ]
    for spec, req in cases:
        assert c.decode_request(*payload_of(hx(spec))) == req
        assert c.encode_request(req) == hx(spec)
    req = c.DiscoverPartitionsRequest(5, "t", (0, 3))
    assert c.decode_request(*payload_of(c.encode_request(req))) == req
    req = c.ReloadConfRequest(4, "t", 2)
    assert c.decode_request(*payload_of(c.encode_request(req))) == req


@pytest.mark.parametrize("msg_id", [0x00, 0x03, 0x04, 0x09, 0x0d, 0xff])
def test_unsupported_message_ids(msg_id):
    with pytest.raises(c.TankDecodeError, match="unsupported"):
        c.decode_request(msg_id, b"\x00" * 16)


def test_truncated_requests():
    data = payload_of(hx(PRODUCE_HELLO, bundle=hx(HELLO)))[1]
    for cut in range(len(data)):
        with pytest.raises(c.TankDecodeError):
            c.decode_request(c.PRODUCE, data[:cut])
    data = payload_of(hx(CONSUME_V3))[1]
    for cut in range(len(data)):
        with pytest.raises(c.TankDecodeError):
            c.decode_request(c.CONSUME, data[:cut])


def test_six_byte_bundle_length_varint_is_malformed():
    data = bytearray(payload_of(hx(PRODUCE_HELLO, bundle=hx(HELLO)))[1])
    at = data.index(0x10, 20)
    data[at:at + 1] = b"\x90\x80\x80\x80\x80\x00"
    with pytest.raises(c.TankDecodeError):
        c.decode_request(c.PRODUCE, bytes(data))


def test_max_wait_normalisation():
    assert [c.normalize_max_wait(ms) for ms in (0, 1, 320, 321, 1000, 2 ** 64 - 1)] == [
        0, 320, 320, 384, 1024, 3600000]


def test_topic_config_syntax():
    assert c.parse_topic_config(b"# retention\nretention.segments.cnt=4\n\n a = b \n") == {
        "retention.segments.cnt": "4", "a": "b"}
    for bad in (b"no equals sign", b"=value", b"\xff=1"):
        with pytest.raises(ValueError):
            c.parse_topic_config(bad)


# -- responses (§4-§6, §10) ----------------------------------------------------------------

def test_produce_responses():
    assert c.encode_produce_response(1, [0]) == hx("01 05 00 00 00 | 01 00 00 00 | 00")
    data = hx("01 07 00 00 00 | 02 00 00 00 | 00 01 | ff")
    assert c.encode_produce_response(2, [0, 1, 0xFF]) == data
    resp = c.decode_response(*payload_of(data))
    assert c.produce_results([("t", [0, 1]), ("zz", [0, 1, 2])], resp.codes) == {
        ("t", 0): 0, ("t", 1): 1, ("zz", 0): 0xFF, ("zz", 1): 0xFF, ("zz", 2): 0xFF}
    with pytest.raises(c.TankDecodeError):
        c.produce_results([("t", [0, 1, 2, 3])], resp.codes)
    with pytest.raises(c.TankDecodeError):
        c.produce_results([("t", [0])], resp.codes)


def consume_frame(req_id, topics):
    return b"".join(c.encode_consume_response(req_id, topics))


def entry(partition, flags, base_seq=None, hw=0, first_avail=0, chunk=b""):
    parts = [chunk] if chunk else []
    return c.ConsumeEntry(partition, flags, base_seq, hw, first_avail, parts, len(chunk))


CONSUME_DATA = ("02 34 00 00 00 | 1f 00 00 00 | 07 00 00 00 | 01 | 01 74 | 01 | 00 00 | 00 |"
                " 01 00 00 00 00 00 00 00 | 01 00 00 00 00 00 00 00 | 11 00 00 00 || 10 | <b>")


def test_consume_response_with_data():
    data = hx(CONSUME_DATA, b=hx(HELLO))
    chunk = b"\x10" + hx(HELLO)
    frame_bytes = consume_frame(7, [c.ConsumeTopicResult("t", 1, (entry(0, 0, 1, 1, 0, chunk),))])
    assert frame_bytes == data
    resp = c.decode_response(*payload_of(data))
    got = resp.topics[0].entries[0]
    assert (got.base_seq, got.hw_mark, got.chunk) == (1, 1, chunk)
    assert c.decode_chunk(got.chunk, 1) == ([(1, TS, None, b"hello")], True)


@pytest.mark.parametrize("spec, topics", [
    ("02 23 00 00 00 1f 00 00 00 08 00 00 00 01 01 74 01 00 00 00 | 00 00 00 00 00 00 00 00 |"
     " 01 00 00 00 00 00 00 00 | 00 00 00 00",
     [c.ConsumeTopicResult("t", 1, (entry(0, 0, 0, 1),))]),
    ("02 2b 00 00 00 27 00 00 00 09 00 00 00 01 01 74 01 00 00 | 01 | 00 x8 |"
     " 01 00 00 00 00 00 00 00 | 00 00 00 00 | 01 00 00 00 00 00 00 00",
     [c.ConsumeTopicResult("t", 1, (entry(0, 1, None, 1, 1),))]),
    ("02 11 00 00 00 0d 00 00 00 0a 00 00 00 01 04 6e 6f 70 65 01 ff ff",
     [c.ConsumeTopicResult("nope", 1, None)]),
    ("02 0f 00 00 00 0b 00 00 00 0b 00 00 00 01 01 74 01 05 00 ff",
     [c.ConsumeTopicResult("t", 1, (entry(5, 0xFF),))]),
], ids=["long-poll timeout", "boundary", "unknown topic", "unknown partition"])
def test_consume_response_examples(spec, topics):
    req_id = c.response_req_id(hx(spec)[5:], c.CONSUME)
    assert consume_frame(req_id, topics) == hx(spec)
    resp = c.decode_response(*payload_of(hx(spec)))
    assert resp == c.ConsumeResponse(req_id, tuple(
        c.ConsumeTopicResult(t.name, t.requested, None if t.entries is None else tuple(
            c.ConsumeEntry(e.partition, e.flags, e.base_seq, e.hw_mark, e.first_avail, b"", 0)
            for e in t.entries)) for t in topics))


def test_sparse_first_bundle_response():
    bundle = hx(SPARSE_DENSE)
    spec = ("02 37 00 00 00 17 00 00 00 0c 00 00 00 01 01 74 01 00 00 fe | 66 00 00 00 00 00 00 00 |"
            " 1c 00 00 00 || 1b <b>")
    chunk = b"\x1b" + bundle
    topics = [c.ConsumeTopicResult("t", 1, (entry(0, 0xFE, None, 102, 0, chunk),))]
    assert consume_frame(12, topics) == hx(spec, b=bundle)
    got = c.decode_response(*payload_of(hx(spec, b=bundle))).topics[0].entries[0]
    assert got.base_seq is None
    messages, _ = c.decode_chunk(got.chunk, None)
    assert [(s, v) for s, _, _, v in messages] == [(100, b"a"), (101, b"b"), (102, b"c")]


def test_cross_dialect_gateway_encoded_bundle():
    """A Figg record at offset 41, value "x", no key, received at ts+5."""
    bundle = records_bundle(Records(41, [TS + 5], None, [b"x"]))
    assert bundle == hx("04 00 05 68 e5 cf 8b 01 00 00 01 78")
    spec = ("02 30 00 00 00 1f 00 00 00 0d 00 00 00 01 01 74 01 00 00 00 | 2a 00 x7 | 2a 00 x7 |"
            " 0d 00 00 00 || 0c | 04 00 05 68 e5 cf 8b 01 00 00 01 78")
    topics = [c.ConsumeTopicResult("t", 1, (entry(0, 0, 42, 42, 0, b"\x0c" + bundle),))]
    assert consume_frame(13, topics) == hx(spec)


def test_gateway_encoded_bundle_omits_long_keys_and_clamps_negative_ts():
    bundle = c.decode_bundle(records_bundle(Records(0, [-1, TS], [b"k" * 256, b"ok"],
                                                    [b"a", b"b"])))
    assert (bundle.keys, bundle.timestamps, bundle.values) == ([None, b"ok"], [0, TS],
                                                               [b"a", b"b"])


def test_cut_last_bundle_keeps_whole_messages():
    chunk = hx("10 <b> | 10 04 00 00 68 e5 cf 8b", b=hx(HELLO))
    assert c.decode_chunk(chunk, 1) == ([(1, TS, None, b"hello")], False)
    assert c.decode_chunk(chunk[:3], 1) == ([], False)
    assert c.decode_chunk(b"\x90", 1) == ([], False)


def test_chunk_with_a_bad_whole_bundle_is_a_decode_error():
    with pytest.raises(c.TankDecodeError):
        c.decode_chunk(b"\x02\x04\x00", 1)


def test_discover_partitions_response():
    spec = ("06 28 00 00 00 05 00 00 00 01 74 02 00 | 01 00 x7 2a 00 x7 | 00 x16")
    resp = c.DiscoverPartitionsResponse(5, "t", (c.PartitionSeqs(1, 42), c.PartitionSeqs(0, 0)))
    assert c.encode_response(resp) == hx(spec)
    assert c.decode_response(*payload_of(hx(spec))) == resp
    err = c.DiscoverPartitionsResponse(5, "t", (c.PartitionSeqs(c.U64_MAX, c.U64_MAX, 0xFB),))
    assert c.decode_response(*payload_of(c.encode_response(err))) == err


def test_admin_responses():
    cases = [
        ("07 0c 00 00 00 06 00 00 00 06 65 76 65 6e 74 73 00",
         c.CreateTopicResponse(6, "events", 0)),
        ("0a 1e 00 00 00 07 00 00 00 00 00 02 00 00 00 05 00 00 00 05 00 00 00 00 00 00 00"
         " 00 f1 53 65 90 01 00 00", c.StatusResponse(7, 2, 5, 5, 1700000000)),
        ("0b 18 00 00 00 08 00 00 00 02 00 00 00 00 06 65 76 65 6e 74 73 01 04 00 01 74 01 01 00",
         c.DiscoverTopicsResponse(8, (c.TopicSummary("events", 4), c.TopicSummary("t", 1)))),
        ("0c 06 00 00 00 09 00 00 00 ff ff", c.DiscoverTopologyResponse(9)),
    ]
    for spec, resp in cases:
        assert c.encode_response(resp) == hx(spec)
        assert c.decode_response(*payload_of(hx(spec))) == resp
    resp = c.ReloadConfResponse(3, "t", 1, c.RELOAD_OK)
    assert c.decode_response(*payload_of(c.encode_response(resp))) == resp


def test_response_req_id():
    assert c.response_req_id(hx("02 00 00 00 05 00 00 00"), c.CONSUME) == 5
    assert c.response_req_id(hx("05 00 00 00 00"), c.PRODUCE) == 5
    with pytest.raises(c.TankDecodeError):
        c.response_req_id(b"\x00\x00", c.STATUS)


def test_consume_response_header_length_must_agree():
    data = bytearray(hx(CONSUME_DATA, b=hx(HELLO)))
    data[5] += 1
    with pytest.raises(c.TankDecodeError):
        c.decode_response(*payload_of(bytes(data)))
    bad_flag = hx(CONSUME_DATA, b=hx(HELLO)).replace(b"\x00\x00\x00\x01\x00", b"\x00\x00\x05\x01\x00", 1)
    with pytest.raises(c.TankDecodeError):
        c.decode_response(*payload_of(bad_flag))
