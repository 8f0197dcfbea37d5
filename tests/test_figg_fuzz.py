"""The Figg decoder under hypothesis.

1. Whatever the bytes, the decoders return messages (or None for an unknown
   type) or raise ``FiggDecodeError``; nothing else escapes: random payloads
   of every type, and valid frames with bytes flipped, cut off, inserted or
   deleted.
2. Round trips: ``decode(encode(m)) == m`` for every message, and a stream of
   frames decodes the same however it is cut into reads.
"""
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugins.figg import codec as fc

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

u16 = st.integers(0, 2 ** 16 - 1)
u64 = st.integers(0, 2 ** 64 - 1)
topics = st.binary(max_size=20)
data = st.binary(max_size=64)

messages = st.one_of(
    st.builds(fc.Attach, topics, u64, u16),
    st.builds(fc.Attached, topics, u64),
    st.builds(fc.Detach, topics),
    st.builds(fc.Detached, topics),
    st.builds(fc.Publish, topics, u64, data),
    st.builds(fc.Ack, u64),
    st.builds(fc.Data, topics, u64, data),
    st.builds(fc.Ping, u64),
    st.builds(fc.Pong, u64))


def decode_or_reject(msg_type, payload):
    try:
        message = fc.decode_payload(msg_type, payload)
    except fc.FiggDecodeError:
        return "rejected"
    assert message is None or type(message) in fc._TYPES
    return message


@FUZZ
@given(st.integers(0, 12), st.binary(max_size=80))
def test_random_payloads_decode_or_fail_cleanly(msg_type, payload):
    result = decode_or_reject(msg_type, payload)
    if msg_type not in fc.NAMES:
        assert result is None


@FUZZ
@given(st.binary(max_size=120))
def test_random_publish_payloads(payload):
    try:
        topic, seq, value = fc.decode_publish(payload)
    except fc.FiggDecodeError:
        return
    assert 4 + len(topic) + 12 + len(value) <= len(payload)
    assert fc.decode_payload(fc.PUBLISH, payload) == fc.Publish(topic, seq, value)


@st.composite
def mangled_frames(draw):
    frame = bytearray(fc.encode(draw(messages)))
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        at = draw(st.integers(0, max(len(frame) - 1, 0)))
        if action == "flip" and frame:
            frame[at] ^= draw(st.integers(1, 255))
        elif action == "cut":
            del frame[at:]
        elif action == "insert":
            frame[at:at] = draw(st.binary(min_size=1, max_size=6))
        elif action == "delete" and frame:
            del frame[at:at + draw(st.integers(1, 6))]
    return bytes(frame)


@FUZZ
@given(mangled_frames())
def test_mangled_frames_decode_or_fail_cleanly(frame):
    try:
        decoded, rest = fc.decode_frames(frame, max_payload_bytes=1 << 20)
    except fc.FiggDecodeError:
        return
    assert all(type(m) in fc._TYPES for m in decoded)
    assert frame.endswith(rest)


@FUZZ
@given(messages)
def test_round_trip(message):
    frame = fc.encode(message)
    msg_type, version, length = fc.HEADER.unpack_from(frame)
    assert (version, length) == (1, len(frame) - 8)
    assert fc.decode_payload(msg_type, frame[8:]) == message
    assert fc.decode_frames(frame) == ([message], b"")


@FUZZ
@given(st.lists(messages, max_size=8), st.lists(st.integers(0, 400), max_size=6),
       st.binary(max_size=12))
def test_a_stream_decodes_the_same_however_it_is_cut(stream, cuts, junk_payload):
    # An unknown type in the middle is skipped, not fatal.
    unknown = fc.HEADER.pack(4242, 1, len(junk_payload)) + junk_payload
    wire = b"".join(fc.encode(m) for m in stream[:1]) + unknown + \
        b"".join(fc.encode(m) for m in stream[1:])
    points = sorted({min(c, len(wire)) for c in cuts}) + [len(wire)]
    decoded = []
    buffered = b""
    start = 0
    for point in points:
        out, buffered = fc.decode_frames(buffered + wire[start:point])
        decoded += out
        start = point
    assert decoded == stream
    assert buffered == b""


@FUZZ
@given(st.integers(0, 2 ** 32 - 1), st.binary(max_size=16))
def test_a_declared_length_is_never_trusted(length, tail):
    payload = struct.pack(">I", length) + tail
    for msg_type in (fc.DETACH, fc.DETACHED):
        result = decode_or_reject(msg_type, payload)
        if length <= len(tail):
            assert result.topic == tail[:length]
        else:
            assert result == "rejected"
