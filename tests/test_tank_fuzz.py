"""TANK codec and server under hypothesis.

1. Whatever the bytes, the request and response decoders return a message
   or raise ``TankDecodeError``, and the bundle decoder returns a ``Bundle``
   or raises ``BundleError``; nothing else escapes (random payloads, and
   valid ones with bytes flipped, cut off, inserted or deleted).
2. Round trips for generated requests, responses and bundles.
3. The server protocol fed arbitrary frame streams (on a ``task.Clock`` bus
   over a real store): it never raises, closes a connection only for bad
   framing, stores nothing from an invalid bundle, and a fresh connection
   on the same bus still produces and consumes.
"""
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from gateway import commands as cmd
from plugins.tank import codec as c
from tests.test_tank_longpoll import Env

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SOME = settings(max_examples=60, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

u8 = st.integers(0, 255)
u16 = st.integers(0, 2 ** 16 - 1)
u32 = st.integers(0, 2 ** 32 - 1)
u64 = st.integers(0, 2 ** 64 - 1)
names = st.text(st.characters(max_codepoint=255), max_size=12)
small_bytes = st.binary(max_size=40)


@st.composite
def bundles(draw):
    n = draw(st.integers(1, 20))
    values = draw(st.lists(small_bytes, min_size=n, max_size=n))
    keys = draw(st.none() | st.lists(st.none() | st.binary(max_size=10), min_size=n, max_size=n))
    stamps = draw(st.none() | st.lists(st.integers(0, 2 ** 63 - 1), min_size=n, max_size=n))
    seqs = None
    if draw(st.booleans()):
        first = draw(st.integers(1, 2 ** 40))
        gaps = draw(st.lists(st.integers(0, 3), min_size=n - 1, max_size=n - 1))
        seqs = [first]
        for g in gaps:
            seqs.append(seqs[-1] + g + 1)
    return values, keys, stamps, draw(st.booleans()), seqs


def encoded(spec):
    values, keys, stamps, compress, seqs = spec
    return c.encode_bundle(values, keys, stamps, compress, seqs)


produce_requests = st.builds(
    c.ProduceRequest, u32,
    st.lists(st.builds(c.ProduceTopic, names, st.lists(st.builds(
        c.ProducePartition, u16, small_bytes, u64), max_size=3).map(tuple)), max_size=3).map(tuple),
    st.booleans(), names, u8, u32, u16)
consume_requests = st.builds(
    c.ConsumeRequest, u32,
    st.lists(st.builds(c.ConsumeTopic, names, st.lists(st.builds(
        c.ConsumePartition, u16, u64, u32), max_size=3).map(tuple)), max_size=3).map(tuple),
    u64, u32, st.integers(0, 5), u8, names)
requests = st.one_of(
    produce_requests, consume_requests,
    st.builds(c.DiscoverPartitionsRequest, u32, names, st.lists(u16, max_size=4).map(tuple)),
    st.builds(c.CreateTopicRequest, u32, names, u16, small_bytes),
    st.builds(c.ReloadConfRequest, u32, names, u16),
    st.builds(c.StatusRequest, u32),
    st.builds(c.DiscoverTopicsRequest, u32, u8),
    st.builds(c.DiscoverTopologyRequest, u32, u8))


def normalised(req):
    """What a request decodes to: 0x05's seqs only exist with the flag, and
    opFlags only from version 3."""
    if type(req) is c.ProduceRequest and not req.with_seqnum:
        return c.ProduceRequest(req.req_id, tuple(c.ProduceTopic(t.name, tuple(
            c.ProducePartition(p.partition, p.bundle, 0) for p in t.partitions))
            for t in req.topics), False, req.client_id, req.required_acks, req.ack_timeout_ms,
            req.client_version)
    if type(req) is c.ConsumeRequest and req.client_version < 3:
        return c.ConsumeRequest(req.req_id, req.topics, req.max_wait_ms, req.min_bytes,
                                req.client_version, 0, req.client_id)
    return req


def mutations(data):
    """Strategies of byte strings near ``data``."""
    return st.one_of(
        st.integers(0, max(len(data) - 1, 0)).map(lambda n: data[:n]),
        st.tuples(st.integers(0, max(len(data) - 1, 0)), u8).map(
            lambda t: data[:t[0]] + bytes([t[1]]) + data[t[0] + 1:]),
        st.tuples(st.integers(0, len(data)), st.binary(min_size=1, max_size=4)).map(
            lambda t: data[:t[0]] + t[1] + data[t[0]:]),
        st.tuples(st.integers(0, max(len(data) - 1, 0)), st.integers(1, 4)).map(
            lambda t: data[:t[0]] + data[t[0] + t[1]:]))


# -- requests ------------------------------------------------------------------------------

@FUZZ
@given(u8, st.binary(max_size=200))
def test_request_decoder_on_random_bytes(msg_id, payload):
    try:
        c.decode_request(msg_id, payload)
    except c.TankDecodeError:
        pass


@FUZZ
@given(requests)
def test_request_round_trip(req):
    frame = c.encode_request(req)
    msg_id, size = c.FRAME_HEADER.unpack_from(frame)
    assert size == len(frame) - 5
    assert c.decode_request(msg_id, frame[5:]) == normalised(req)


@FUZZ
@given(requests.flatmap(lambda r: st.tuples(st.just(c.encode_request(r)),
                                            mutations(c.encode_request(r)[5:]))))
def test_request_decoder_on_mutated_requests(pair):
    frame, mutated = pair
    try:
        c.decode_request(frame[0], mutated)
    except c.TankDecodeError:
        pass


# -- bundles ---------------------------------------------------------------------------------

@FUZZ
@given(st.binary(min_size=1, max_size=200))
def test_bundle_decoder_on_random_bytes(data):
    try:
        c.decode_bundle(data)
    except c.BundleError:
        pass


@FUZZ
@given(bundles())
def test_bundle_round_trip(spec):
    values, keys, stamps, compress, seqs = spec
    bundle = c.decode_bundle(encoded(spec))
    assert bundle.values == values
    if keys is None or all(k is None for k in keys):
        assert bundle.keys is None
    else:
        assert bundle.keys == keys
    assert bundle.timestamps == (stamps or [0] * len(values))
    assert bundle.seqs == seqs
    assert bundle.dense == (seqs is None or seqs == list(range(seqs[0], seqs[0] + len(seqs))))
    assert c.bundle_count(encoded(spec)) == len(values)


@FUZZ
@given(bundles().flatmap(lambda s: mutations(encoded(s))))
def test_bundle_decoder_on_mutated_bundles(data):
    if not data:
        return
    try:
        c.decode_bundle(data)
    except c.BundleError:
        pass


@FUZZ
@given(bundles().flatmap(lambda s: mutations(encoded(s)[1:])))
def test_bundle_decoder_on_mutated_snappy_message_sets(message_set):
    try:
        c.decode_bundle(b"\x05" + c.encode_varint(len(message_set)) + message_set)
    except c.BundleError:
        pass


# -- responses and chunks -------------------------------------------------------------------------

@FUZZ
@given(st.sampled_from(sorted(c._RESPONSE_DECODERS)), st.binary(max_size=200))
def test_response_decoder_on_random_bytes(msg_id, payload):
    try:
        c.decode_response(msg_id, payload)
    except c.TankDecodeError:
        pass


@FUZZ
@given(st.binary(max_size=200), st.none() | u32)
def test_chunk_decoder_on_random_bytes(chunk, base):
    try:
        messages, _ = c.decode_chunk(chunk, base)
    except c.TankDecodeError:
        pass


@FUZZ
@given(st.lists(bundles().filter(lambda s: s[4] is None), min_size=1, max_size=4),
       st.integers(1, 2 ** 40), st.integers(0, 400))
def test_chunk_round_trip_and_cut(specs, base, cut):
    chunk = b"".join(c.encode_varint(len(b)) + b for b in map(encoded, specs))
    messages, complete = c.decode_chunk(chunk, base)
    values = [v for s in specs for v in s[0]]
    assert complete and [m[3] for m in messages] == values
    assert [m[0] for m in messages] == list(range(base, base + len(values)))
    cut_messages, _ = c.decode_chunk(chunk[:max(len(chunk) - cut, 0)], base)
    assert cut_messages == messages[:len(cut_messages)]


# -- the server protocol -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def env():
    path = tempfile.mkdtemp(prefix="tank-fuzz-")
    e = Env(path)
    yield e
    e.store.close()
    shutil.rmtree(path, ignore_errors=True)


valid_frames = st.one_of(
    st.builds(lambda spec, p, rid: c.encode_request(c.ProduceRequest(rid, (c.ProduceTopic(
        "fz", (c.ProducePartition(p, encoded(spec)),)),))), bundles(), st.integers(0, 2), u32),
    st.builds(lambda p, s, rid: c.encode_request(c.ConsumeRequest(rid, (c.ConsumeTopic(
        "fz", (c.ConsumePartition(p, s, 4096),)),))), st.integers(0, 2), st.integers(0, 30), u32),
    requests.filter(lambda r: type(r) is not c.ConsumeRequest or r.max_wait_ms == 0).map(
        c.encode_request))


@SOME
@given(st.lists(st.one_of(
    valid_frames,
    valid_frames.flatmap(lambda f: mutations(f)),
    st.builds(lambda m, p: c.frame(m, p), u8, st.binary(max_size=60))), min_size=1, max_size=6))
def test_server_survives_any_frames(env, frames):
    proto, transport = env.connect()
    proto.dataReceived(b"".join(frames))
    env.clock.advance(3600)             # any parked consume times out
    assert transport.value().startswith(c.PING_FRAME)
    env.drop(proto)
    # every stored batch still decodes for any dialect
    for topic in env.store.topic_names():
        for p in range(env.store.topic(topic).partitions):
            [part] = env.run(cmd.Fetch([cmd.FetchPartition(topic, p, 0, 1 << 30)]))
            for batch in part.batches:
                assert len(env.bus.decode(batch)) == batch.count
    # and another connection is unaffected
    other, out = env.connect()
    other.dataReceived(c.encode_request(c.ProduceRequest(7, (c.ProduceTopic(
        "ok", (c.ProducePartition(0, c.encode_bundle([b"v"], timestamps=[1])),)),))))
    other.dataReceived(c.encode_request(c.ConsumeRequest(8, (c.ConsumeTopic(
        "ok", (c.ConsumePartition(0, c.TAIL_SEQ, 100),)),))))
    data = out.value()
    assert data.startswith(c.PING_FRAME + c.encode_produce_response(7, [0]))
    assert not out.disconnecting
    env.drop(other)
