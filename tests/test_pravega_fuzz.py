"""The Pravega codec under hypothesis.

1. Whatever the bytes, ``decode`` returns a command or raises
   ``DecodeError``; nothing else escapes (random bodies for every type code,
   and valid frames cut, extended or with bytes flipped).
2. Round trips: ``decode(encode(c)) == c`` for every command.
3. Append-block assembly: events split into every block shape a client
   sends (exact, exact + trailing data, pre-sized with a PartialEvent or
   Padding, standalone) assemble to exactly those events; arbitrary blocks
   only ever assemble or raise ``BlockError``; ``scan_events`` accepts
   exactly whole events.
4. Segment names: every topic escapes to a Pravega name and back.
"""
import struct

from hypothesis import HealthCheck, assume, given, settings, strategies as st

from plugins.pravega import codec as pc

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

CODES = sorted(set(pc.COMMANDS) | set(pc.UNSUPPORTED_OPERATIONS)) + [-6, -3, 6, 13, 101]

_VALUES = {
    "L": st.integers(-(1 << 63), (1 << 63) - 1),
    "I": st.integers(-(1 << 31), (1 << 31) - 1),
    "b": st.integers(-128, 127),
    "B": st.booleans(),
    "U": st.binary(min_size=16, max_size=16),
    "S": st.text(max_size=20),
    "D": st.binary(max_size=64),
    "R": st.binary(max_size=64),
    # table entries and keys (pravega-clients.md §3.1): keys are never empty
    "E": st.lists(st.tuples(st.binary(min_size=1, max_size=16),
                            st.integers(-(1 << 63), (1 << 63) - 1),
                            st.binary(max_size=16)), max_size=4).map(tuple),
    "K": st.lists(st.tuples(st.binary(min_size=1, max_size=16),
                            st.integers(-(1 << 63), (1 << 63) - 1)), max_size=4).map(tuple),
    "V": st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=4).map(tuple),
}
_KIND_OF = {read: kind for kind, (read, _) in pc._KINDS.items()}


def command_strategy(cls):
    kinds = [_KIND_OF[read] for _, (read, _) in cls._layout]
    names = [name for name, _ in cls._layout]
    return st.tuples(*[_VALUES[k] for k in kinds]).map(
        lambda values: cls(**dict(zip(names, values))))


commands = st.one_of([command_strategy(cls) for cls in pc.COMMANDS.values()])


def decodes_or_refuses(code, body):
    try:
        command = pc.decode(code, body)
    except pc.DecodeError as e:
        assert isinstance(e.reason, str) and e.reason
        return None
    assert isinstance(command, tuple(pc.COMMANDS.values()) + (pc.Unsupported,))
    return command


@FUZZ
@given(st.sampled_from(CODES), st.binary(max_size=200))
def test_decode_random_bodies(code, body):
    decodes_or_refuses(code, body)


@FUZZ
@given(commands, st.data())
def test_decode_mutated_frames(command, data):
    body = bytearray(pc.encode(command)[pc.HEADER_SIZE:])
    action = data.draw(st.sampled_from(["cut", "extend", "flip", "insert", "delete"]))
    if action == "cut":
        body = body[:data.draw(st.integers(0, len(body)))]
    elif action == "extend":
        body += data.draw(st.binary(min_size=1, max_size=20))
    elif body:
        at = data.draw(st.integers(0, len(body) - 1))
        if action == "flip":
            body[at] ^= data.draw(st.integers(1, 255))
        elif action == "insert":
            body[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        else:
            del body[at]
    decodes_or_refuses(command.code, bytes(body))


@FUZZ
@given(commands)
def test_round_trip(command):
    frame = pc.encode(command)
    code, length = pc.HEADER.unpack_from(frame)
    assert (code, length) == (command.code, len(frame) - pc.HEADER_SIZE)
    assert pc.decode(code, frame[pc.HEADER_SIZE:]) == command


@FUZZ
@given(st.binary(min_size=16, max_size=16), st.integers(-(1 << 63), (1 << 63) - 1),
       st.integers(-(1 << 63), (1 << 63) - 1), st.integers(-(1 << 63), (1 << 63) - 1),
       st.integers(-(1 << 63), (1 << 63) - 1))
def test_data_appended_fast_path(writer, number, previous, rid, offset):
    assert pc.encode_data_appended(writer, number, previous, rid, offset) == pc.encode(
        pc.DataAppended(writer, number, previous, rid, offset))


@FUZZ
@given(st.text(max_size=30), st.integers(0, 1 << 40), st.booleans(), st.booleans(),
       st.lists(st.binary(max_size=30), max_size=5), st.integers(-(1 << 63), (1 << 63) - 1))
def test_segment_read_chunks(segment, offset, at_tail, eos, chunks, rid):
    assert b"".join(pc.segment_read_chunks(segment, offset, at_tail, eos, chunks, rid)) == \
        pc.encode(pc.SegmentRead(segment, offset, at_tail, eos, b"".join(chunks), rid))


# -- append blocks -------------------------------------------------------------------------

W = bytes(range(16))
values = st.lists(st.binary(max_size=40), min_size=1, max_size=12)


def block_end(size, data, count, last=7):
    return pc.AppendBlockEnd(W, size, data, count, last, 1)


@FUZZ
@given(values, st.data())
def test_every_block_shape_assembles_the_events(events, data):
    framed = [pc.frame_event(v) for v in events]
    whole = b"".join(framed)
    n = len(events)
    shape = data.draw(st.sampled_from(["exact", "exact+end", "partial", "padding", "standalone"]))
    if shape == "exact":
        block, end = whole, block_end(len(whole), b"", n)
    elif shape == "exact+end":
        k = data.draw(st.integers(0, n))
        head = b"".join(framed[:k])
        block, end = head, block_end(len(head), b"".join(framed[k:]), n)
    elif shape == "partial":
        # pre-sized: whole events, then the first bytes of the next one as a
        # PartialEvent; its rest (and any later events) in AppendBlockEnd
        k = data.draw(st.integers(0, n - 1))
        head = b"".join(framed[:k])
        cut = data.draw(st.integers(0, len(framed[k]) - 1))
        partial = framed[k][:cut]
        block = head + struct.pack(">ii", pc.PARTIAL_EVENT, len(partial)) + partial
        end = block_end(len(head), framed[k][cut:] + b"".join(framed[k + 1:]), n)
    elif shape == "padding":
        pad = data.draw(st.integers(0, 50))
        block = whole + struct.pack(">ii", pc.PADDING, pad) + bytes(pad)
        end = block_end(len(whole), b"", n)
    else:
        block, end = None, block_end(data.draw(st.integers(-5, 5)), whole, n)
    payload = pc.assemble_block(block, end)
    assert payload == whole
    assert pc.scan_events(payload) == (n, max(map(len, events)))
    assert pc.split_events(payload) == events


@FUZZ
@given(st.none() | st.binary(max_size=80), st.integers(-10, 90), st.binary(max_size=40),
       st.integers(-2, 3))
def test_arbitrary_blocks_assemble_or_are_block_errors(block, size, data, count):
    try:
        payload = pc.assemble_block(block, block_end(size, data, count))
    except pc.BlockError as e:
        assert str(e)
        return
    assert count > 0
    assert isinstance(payload, bytes)
    if block is not None:
        # only data of the client's own: nothing beyond the block and the end
        assert len(payload) <= len(block) + len(data)


@FUZZ
@given(st.binary(max_size=120))
def test_scan_events_accepts_exactly_whole_events(payload):
    try:
        count, largest = pc.scan_events(payload)
    except pc.NotEvents:
        return
    values = pc.split_events(payload)
    assert len(values) == count
    assert pc.frame_events(values) == payload
    assert largest == max(map(len, values), default=0)


# -- names -----------------------------------------------------------------------------------

topics = st.text(alphabet="abcXYZ019._-", min_size=1, max_size=30)


@FUZZ
@given(topics, st.integers(0, 1023))
def test_names_round_trip(topic, partition):
    stream = pc.escape_stream(topic)
    assert pc.NAME_CHARS.match(stream)
    assert pc.unescape_stream(stream) == topic
    name = pc.segment_name("sc", topic, partition)
    assert pc.parse_segment_name(name, "sc") == (topic, partition)
    assert pc.parse_segment_name(f"{topic}/{partition}", "sc") == (topic, partition)


@FUZZ
@given(st.text(alphabet="xu-ab", max_size=12))
def test_unescape_is_the_inverse_of_escape(stream):
    topic = pc.unescape_stream(stream)
    assume(topic is not None)
    assert pc.escape_stream(topic) == stream
