"""The Pravega codec against the reference's worked examples, byte for byte
(protocols/pravega.md §10), plus its decoding rules (§1, §3, §5), append-block
assembly (§6.2), event framing (§6.3, §7.2) and segment names (§8)."""
import struct

import pytest

from gateway.config import ConfigError, parse_config
from gateway.dialects import find_dialects
from plugins.pravega import codec as pc
from plugins.pravega import decode_stored_events
from storage.batch import StoredBatch

W = bytes.fromhex("00112233445566778899aabbccddeeff")
SEG = "s/t/0.#epoch.0"
EV21 = "00 00 00 00 00 00 00 02 68 69 00 00 00 00 00 00 00 03 61 62 63"


def h(*parts):
    """Hex in the reference's notation: ``00 x7 02`` is seven zero bytes then
    02; ``<W>`` the writer id; ``<SEG>`` the segment with its u16 length;
    ``<EV21>`` the two events "hi" and "abc"; quoted text is its ASCII."""
    out = bytearray()
    for part in parts:
        if isinstance(part, bytes):
            out += part
            continue
        part = (part.replace("<W>", W.hex()).replace("<SEG>", "00 0e " + SEG.encode().hex())
                .replace("<EV21>", EV21))
        tokens = part.split()
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            repeat = tokens[i + 1] if i + 1 < len(tokens) else ""
            if repeat.startswith("x") and repeat[1:].isdigit():
                out += bytes.fromhex(tok) * int(repeat[1:])
                i += 2
                continue
            out += bytes.fromhex(tok)
            i += 1
    return bytes(out)


def s(text):
    return (struct.pack(">H", len(text)) + text.encode()).hex()


EVENTS = h("<EV21>")

# (command, frame) pairs of §10, each checked in both directions
GOLDEN = [
    (pc.Hello(17, 5), h("ff ff ff 81 00 00 00 08 00 00 00 11 00 00 00 05")),
    (pc.KeepAlive(), h("00 00 00 64 00 00 00 00")),
    (pc.SetupAppend(1, W, SEG, ""),
     h("00 00 00 01 00 00 00 2a 00 x7 01 <W> <SEG> 00 00")),
    (pc.AppendSetup(1, SEG, W, pc.NO_EVENT_NUMBER),
     h("00 00 00 02 00 00 00 30 00 x7 01 <SEG> <W> 80 00 x7")),
    (pc.AppendBlock(W, EVENTS), h("00 00 00 03 00 00 00 25 <W> <EV21>")),
    (pc.AppendBlockEnd(W, 21, b"", 2, 2, 1),
     h("00 00 00 04 00 00 00 2c <W> 00 00 00 15 00 00 00 00 00 00 00 02 00 x7 02 00 x7 01")),
    (pc.AppendBlockEnd(W, 21, EVENTS, 2, 2, 1),
     h("00 00 00 04 00 00 00 41 <W> 00 00 00 15 00 00 00 15 <EV21> 00 00 00 02 00 x7 02 "
       "00 x7 01")),
    (pc.DataAppended(W, 2, pc.NO_EVENT_NUMBER, 1, 21),
     h("00 00 00 07 00 00 00 30 <W> 00 x7 02 80 00 x7 00 x7 01 00 x7 15")),
    (pc.ReadSegment(SEG, 0, 1024, "", 2),
     h("00 00 00 09 00 00 00 26 <SEG> 00 x8 00 00 04 00 00 00 00 x7 02")),
    (pc.SegmentRead(SEG, 0, True, False, EVENTS, 2),
     h("00 00 00 0a 00 00 00 3b <SEG> 00 x8 01 00 00 00 00 15 <EV21> 00 x7 02")),
    (pc.ReadSegment(SEG, 12, 1024, "", 3),
     h("00 00 00 09 00 00 00 26 <SEG> 00 x7 0c 00 00 04 00 00 00 00 x7 03")),
    (pc.SegmentRead(SEG, 12, True, False, EVENTS[12:], 3),
     h("00 00 00 0a 00 00 00 2f <SEG> 00 x7 0c 01 00 00 00 00 09 "
       "00 00 00 00 00 03 61 62 63 00 x7 03")),
    (pc.AppendBlock(W, EVENTS + h("ff ff ff fe 00 00 00 0b 00 00 00 00 00 00 00 0a 30 31 32")),
     h("00 00 00 03 00 00 00 38 <W> <EV21> ff ff ff fe 00 00 00 0b "
       "00 00 00 00 00 00 00 0a 30 31 32")),
    (pc.AppendBlockEnd(W, 21, b"3456789", 3, 3, 5),
     h("00 00 00 04 00 00 00 33 <W> 00 00 00 15 00 00 00 07 33 34 35 36 37 38 39 "
       "00 00 00 03 00 x7 03 00 x7 05")),
    (pc.AppendBlock(W, EVENTS + h("ff ff ff ff 00 00 00 0b 00 x11")),
     h("00 00 00 03 00 00 00 38 <W> <EV21> ff ff ff ff 00 00 00 0b 00 x11")),
    (pc.AppendBlockEnd(W, 21, b"", 2, 2, 6),
     h("00 00 00 04 00 00 00 2c <W> 00 00 00 15 00 00 00 00 00 00 00 02 00 x7 02 00 x7 06")),
    (pc.ConditionalAppend(W, 3, 21, 0, b"xyz", 7),
     h("00 00 00 05 00 00 00 33 <W> 00 x7 03 00 x7 15 00 00 00 00 00 00 00 03 78 79 7a "
       "00 x7 07")),
    (pc.DataAppended(W, 3, 2, 7, 32),
     h("00 00 00 07 00 00 00 30 <W> 00 x7 03 00 x7 02 00 x7 07 00 x7 20")),
    (pc.ConditionalCheckFailed(W, 3, 7), h("00 00 00 08 00 00 00 20 <W> 00 x7 03 00 x7 07")),
    (pc.GetStreamSegmentInfo(4, SEG, ""), h("00 00 00 0b 00 00 00 1a 00 x7 04 <SEG> 00 00")),
    (pc.StreamSegmentInfo(4, SEG, True, False, False, 1700000000000, 21, 0),
     h("00 00 00 0c 00 00 00 33 00 x7 04 <SEG> 01 00 00 00 00 01 8b cf e5 68 00 "
       "00 x7 15 00 x8")),
    (pc.CreateSegment(5, SEG, 0, 0, "", 0),
     h("00 00 00 14 00 00 00 27 00 x7 05 <SEG> 00 00 00 00 00 00 00 00 x8")),
    (pc.SegmentCreated(5, SEG), h("00 00 00 15 00 00 00 18 00 x7 05 <SEG>")),
    (pc.NoSuchSegment(6, "s/nope/0.#epoch.0", "", -1),
     h("00 00 00 35 00 00 00 25 00 x7 06", s("s/nope/0.#epoch.0"), "00 00 ff x8")),
    (pc.SegmentIsTruncated(8, SEG, 10, "", 0),
     h("00 00 00 38 00 00 00 2a 00 x7 08 <SEG> 00 x7 0a 00 00 00 x8")),
    (pc.OperationUnsupported(9, "truncateSegment", ""),
     h("00 00 00 39 00 00 00 1b 00 x7 09", s("truncateSegment"), "00 00")),
    (pc.InvalidEventNumber(W, 1, "", 2), h("00 00 00 37 00 00 00 22 <W> 00 x7 01 00 00 00 x7 02")),
    (pc.SegmentIsSealed(1, SEG, "", -1),
     h("00 00 00 33 00 00 00 22 00 x7 01 <SEG> 00 00 ff x8")),
    (pc.AuthTokenCheckFailed(13, "", 0), h("00 00 00 3c 00 00 00 0e 00 x7 0d 00 00 00 00 00 00")),
    (pc.SealSegment(10, SEG, ""), h("00 00 00 1c 00 00 00 1a 00 x7 0a <SEG> 00 00")),
    (pc.SegmentSealed(10, SEG), h("00 00 00 1d 00 00 00 18 00 x7 0a <SEG>")),
    (pc.SegmentRead(SEG, 21, True, True, b"", 12),
     h("00 00 00 0a 00 00 00 26 <SEG> 00 x7 15 01 01 00 00 00 00 00 x7 0c")),
]


# -- pravega-clients.md §3.5: byte streams, large events, table segments ------------------------

WB = bytes.fromhex("4b96c0391b5465fdf2b2bad06e114779")     # byte writer <W>
WX = bytes.fromhex("2e5297206999ef00ef80261b60ff7bd2")     # large-event writer <X>
PARENT = "probe/large/0.#epoch.0"
TRANSIENT = PARENT + "#transient.15d329112b4641b4a11a58446c7c11c0"
RG1 = "probe/rg1_kvtable/0.#epoch.0"
RGS = "probe/rgs_kvtable/0.#epoch.0"
KEY1, KEY2 = b"v17assigned_segments/r1", b"s17assigned_segments"
VALUE1, VALUE2 = bytes(range(49)), bytes(range(100, 121))


def tk(key, version):
    return struct.pack(">ii", len(key) + 12, len(key)) + key + struct.pack(">q", version)


def tv(value):
    return struct.pack(">ii", len(value) + 4, len(value)) + value


ENTRIES = tk(KEY1, 810) + tv(VALUE1) + tk(KEY2, 1039) + tv(VALUE2)
UPDATED = tk(KEY1, 1246) + tv(VALUE1) + tk(KEY2, 1247) + tv(VALUE2)

# (command, frame) pairs of pravega-clients.md §3.5, each checked both ways
GOLDEN_CLIENTS = [
    (pc.ConditionalBlockEnd(WB, 1, 0, b"byte-stream-1 ", 4),
     h("00 00 00 59 00 00 00 3a", WB, "00 x7 01 00 x8 00 00 00 0e", b"byte-stream-1 ",
       "00 x7 04")),
    (pc.DataAppended(WB, 1, pc.NO_EVENT_NUMBER, 4, 14),
     h("00 00 00 07 00 00 00 30", WB, "00 x7 01 80 00 x7 00 x7 04 00 x7 0e")),
    (pc.ConditionalBlockEnd(WB, 2, 14, b"byte-stream-2", 5),
     h("00 00 00 59 00 00 00 39", WB, "00 x7 02 00 x7 0e 00 00 00 0d", b"byte-stream-2",
       "00 x7 05")),
    (pc.DataAppended(WB, 2, 1, 5, 27),
     h("00 00 00 07 00 00 00 30", WB, "00 x7 02 00 x7 01 00 x7 05 00 x7 1b")),
    (pc.CreateTransientSegment(3, WX, PARENT, ""),
     h("00 00 00 28 00 00 00 32 00 x7 03", WX, s(PARENT), "00 00")),
    (pc.SegmentCreated(3, TRANSIENT), h("00 00 00 15 00 00 00 4b 00 x7 03", s(TRANSIENT))),
    (pc.SetupAppend(4, WX, TRANSIENT, ""),
     h("00 00 00 01 00 00 00 5d 00 x7 04", WX, s(TRANSIENT), "00 00")),
    (pc.AppendSetup(4, TRANSIENT, WX, pc.NO_EVENT_NUMBER),
     h("00 00 00 02 00 00 00 63 00 x7 04", s(TRANSIENT), WX, "80 00 x7")),
    (pc.DataAppended(WX, 0, pc.NO_EVENT_NUMBER, 5, 0x800000),
     h("00 00 00 07 00 00 00 30", WX, "00 x8 80 00 x7 00 x7 05 00 00 00 00 00 80 00 00")),
    (pc.DataAppended(WX, 1, 0, 6, 0x90000b),
     h("00 00 00 07 00 00 00 30", WX, "00 x7 01 00 x8 00 x7 06 00 00 00 00 00 90 00 0b")),
    (pc.MergeSegments(7, PARENT, TRANSIENT, ""),
     h("00 00 00 3a 00 00 00 65 00 x7 07", s(PARENT), s(TRANSIENT), "00 00")),
    (pc.SegmentsMerged(7, PARENT, TRANSIENT, 0x90001f),
     h("00 00 00 3b 00 00 00 6b 00 x7 07", s(PARENT), s(TRANSIENT), "00 00 00 00 00 90 00 1f")),
    (pc.SegmentCreated(1, RG1), h("00 00 00 15 00 00 00 26 00 x7 01", s(RG1))),
    (pc.UpdateTableEntries(15, RGS, "", ((KEY1, 810, VALUE1), (KEY2, 1039, VALUE2)), -1),
     h("00 00 00 4a 00 00 00 d5 00 x7 0f", s(RGS), "00 00 00 00 00 02", ENTRIES, "ff x8")),
    (pc.TableEntriesUpdated(15, (1246, 1247)),
     h("00 00 00 4b 00 00 00 1c 00 x7 0f 00 00 00 02 00 x6 04 de 00 x6 04 df")),
    (pc.ReadTableEntriesDelta(16, RGS, "", 0x4a4, 10),
     h("00 00 00 58 00 00 00 34 00 x7 10", s(RGS), "00 00 00 x6 04 a4 00 00 00 0a")),
    (pc.TableEntriesDeltaRead(16, RGS, ((KEY1, 1246, VALUE1), (KEY2, 1247, VALUE2)), False,
                              True, 0x4e0),
     h("00 00 00 57 00 00 00 d5 00 x7 10", s(RGS), "00 00 00 02", UPDATED,
       "00 01 00 x6 04 e0")),
    (pc.TableEntriesDeltaRead(5, RG1, (), False, True, 0x335),
     h("00 00 00 57 00 00 00 34 00 x7 05", s(RG1), "00 00 00 00 00 01 00 x6 03 35")),
    (pc.TableKeyBadVersion(7, "probe/rg3_kvtable/0.#epoch.0", ""),
     h("00 00 00 52 00 00 00 28 00 x7 07", s("probe/rg3_kvtable/0.#epoch.0"), "00 00")),
    (pc.DeleteTableSegment(8, "misc/rgm_kvtable/0.#epoch.0", False, ""),
     h("00 00 00 47 00 00 00 28 00 x7 08", s("misc/rgm_kvtable/0.#epoch.0"), "00 00 00")),
    (pc.SegmentDeleted(8, "misc/rgm_kvtable/0.#epoch.0"),
     h("00 00 00 1f 00 00 00 25 00 x7 08", s("misc/rgm_kvtable/0.#epoch.0"))),
]


def decode_frame(frame):
    code, length = pc.HEADER.unpack_from(frame)
    assert length == len(frame) - pc.HEADER_SIZE
    return pc.decode(code, frame[pc.HEADER_SIZE:])


@pytest.mark.parametrize("command,frame", GOLDEN, ids=[type(c).__name__ for c, _ in GOLDEN])
def test_golden_vectors_encode_and_decode(command, frame):
    assert pc.encode(command) == frame
    assert decode_frame(frame) == command


def test_hot_path_encoders_match_the_generic_one():
    assert pc.encode_data_appended(W, 2, pc.NO_EVENT_NUMBER, 1, 21) == pc.encode(
        pc.DataAppended(W, 2, pc.NO_EVENT_NUMBER, 1, 21))
    chunks = pc.segment_read_chunks(SEG, 12, True, False, [EVENTS[12:15], EVENTS[15:]], 3)
    assert b"".join(chunks) == pc.encode(pc.SegmentRead(SEG, 12, True, False, EVENTS[12:], 3))
    assert b"".join(pc.segment_read_chunks(SEG, 21, True, True, [], 12)) == GOLDEN[-1][1]


def test_worked_example_payloads_assemble():
    """§10: the Java pre-sized block with a PartialEvent stores three whole
    events; the same block closed by Padding stores two."""
    partial_block = decode_frame(GOLDEN[12][1])
    partial_end = decode_frame(GOLDEN[13][1])
    three = pc.assemble_block(partial_block.data, partial_end)
    assert three == pc.frame_events([b"hi", b"abc", b"0123456789"])
    assert len(three) == 39
    padded_block = decode_frame(GOLDEN[14][1])
    assert pc.assemble_block(padded_block.data, decode_frame(GOLDEN[15][1])) == EVENTS
    # exact block and standalone end carry the same events
    assert pc.assemble_block(EVENTS, decode_frame(GOLDEN[5][1])) == EVENTS
    assert pc.assemble_block(None, decode_frame(GOLDEN[6][1])) == EVENTS


def test_positions_of_the_worked_example():
    """§10: "hi" and "abc" sit at 0 and 10, the tail is 21; an empty value
    next would sit at 21 and the record after it at 29."""
    view = pc.frame_events([b"hi", b"abc", b"", b"z"])
    assert pc.scan_events(view) == (4, 3)
    positions, pos = [], 0
    for value in pc.split_events(view):
        positions.append(pos)
        pos += 8 + len(value)
    assert positions == [0, 10, 21, 29]


# -- decoding rules ---------------------------------------------------------------------

def test_optional_trailing_fields_take_defaults():
    end = pc.encode(pc.AppendBlockEnd(W, 21, b"", 2, 2, 1))[pc.HEADER_SIZE:]
    assert pc.decode(pc.APPEND_BLOCK_END, end[:-8]) == pc.AppendBlockEnd(W, 21, b"", 2, 2, -1)
    # a partial optional field is absent, as in Java
    assert pc.decode(pc.APPEND_BLOCK_END, end[:-3]).request_id == -1
    read = pc.encode(pc.ReadSegment(SEG, 5, 10, "", 9))[pc.HEADER_SIZE:]
    assert pc.decode(pc.READ_SEGMENT, read[:-8]) == pc.ReadSegment(SEG, 5, 10, "", -1)
    create = pc.encode(pc.CreateSegment(5, SEG, 7, 1, "", 99))[pc.HEADER_SIZE:]
    assert pc.decode(pc.CREATE_SEGMENT, create[:-8]) == pc.CreateSegment(5, SEG, 7, 1, "", 0)
    cond = pc.encode(pc.ConditionalAppend(W, 3, 21, 0, b"xyz", 7))[pc.HEADER_SIZE:]
    assert pc.decode(pc.CONDITIONAL_APPEND, cond[:-8]).request_id == -1


def test_extra_trailing_bytes_are_ignored():
    body = pc.encode(pc.SetupAppend(1, W, SEG, "tok"))[pc.HEADER_SIZE:] + b"more"
    assert pc.decode(pc.SETUP_APPEND, body) == pc.SetupAppend(1, W, SEG, "tok")
    assert pc.decode(pc.KEEP_ALIVE, b"anything") == pc.KeepAlive(b"anything")


def test_booleans_read_any_nonzero_as_true():
    frame = bytearray(pc.encode(pc.SegmentRead(SEG, 0, True, False, b"", 1)))
    at = pc.HEADER_SIZE + 2 + len(SEG) + 8
    frame[at] = 0x7f
    frame[at + 1] = 0xff
    reply = decode_frame(bytes(frame))
    assert (reply.at_tail, reply.end_of_segment) == (True, True)


@pytest.mark.parametrize("command", [
    pc.SetupAppend(1, W, SEG, ""), pc.ReadSegment(SEG, 0, 10, "", 3),
    pc.AppendBlockEnd(W, 21, EVENTS, 2, 2, 1), pc.ConditionalAppend(W, 3, 21, 0, b"xyz", 7),
    pc.GetStreamSegmentInfo(4, SEG, ""), pc.CreateSegment(5, SEG, 0, 0, "", 0),
    pc.Hello(17, 5)])
def test_a_field_running_past_the_frame_is_a_decode_error(command):
    frame = pc.encode(command)
    code = command.code
    mandatory = command._optional_from
    # cut inside the last mandatory field
    body = frame[pc.HEADER_SIZE:]
    full = pc.decode(code, body)
    assert full == command
    for cut in range(len(body)):
        try:
            got = pc.decode(code, body[:cut])
        except pc.DecodeError:
            continue
        # only a cut in the optional tail may decode
        names = [name for name, _ in command._layout]
        assert all(getattr(got, n) == getattr(command, n) for n in names[:mandatory])


def test_decode_error_names_what_the_frame_gave():
    body = pc.encode(pc.SetupAppend(77, W, SEG, ""))[pc.HEADER_SIZE:]
    with pytest.raises(pc.DecodeError) as e:
        pc.decode(pc.SETUP_APPEND, body[:30])
    assert (e.value.request_id, e.value.segment) == (77, "")
    body = pc.encode(pc.GetStreamSegmentInfo(5, SEG, "tok"))[pc.HEADER_SIZE:]
    with pytest.raises(pc.DecodeError) as e:
        pc.decode(pc.GET_STREAM_SEGMENT_INFO, body[:-2])
    assert (e.value.request_id, e.value.segment) == (5, SEG)


@pytest.mark.parametrize("command,frame", GOLDEN_CLIENTS,
                         ids=[type(c).__name__ for c, _ in GOLDEN_CLIENTS])
def test_client_golden_vectors_encode_and_decode(command, frame):
    assert pc.encode(command) == frame
    assert decode_frame(frame) == command


def test_chunk_frames_of_a_large_event():
    """The first 8 MiB chunk of §3.5 (header only: its data is the framed
    9 MiB + 3 B event's first bytes), and the size of a full chunk frame."""
    data = struct.pack(">ii", 0, 0x900003) + b"L" * (0x800000 - 8)
    frame = pc.encode(pc.ConditionalBlockEnd(WX, 0, 0, data, 5))
    assert frame[:54] == h("00 00 00 59 00 80 00 2c", WX, "00 x8 00 x8 00 80 00 00 "
                           "00 00 00 00 00 90 00 03 4c 4c")
    assert len(frame) == 8388660 <= pc.MAX_FRAME_BYTES


def test_rust_create_table_segment_omits_the_options():
    frame = h("00 00 00 46 00 00 00 28 00 x7 01", s(RG1), "00 00")
    assert decode_frame(frame) == pc.CreateTableSegment(1, RG1, "")


def test_table_keys_and_entries_decoding_rules():
    body = struct.pack(">q", 3) + bytes.fromhex(s(RG1)) + bytes.fromhex(s(""))
    # ReadTable of two keys; a key's leading length bounds it (extra bytes skipped)
    keys = tk(b"a", 1) + struct.pack(">ii", 1 + 12 + 2, 1) + b"b" + struct.pack(">q", -1) + b"zz"
    assert pc.decode(pc.READ_TABLE, body + struct.pack(">i", 2) + keys) == pc.ReadTable(
        3, RG1, "", ((b"a", 1), (b"b", -1)))
    # an empty key is a protocol error, as is a count the frame cannot hold
    for bad in (struct.pack(">i", 1) + tk(b"", 1),
                struct.pack(">i", 1 << 30) + tk(b"a", 1),
                struct.pack(">i", 1) + tk(b"a", 1)[:-1]):
        with pytest.raises(pc.DecodeError):
            pc.decode(pc.READ_TABLE, body + bad)
    # UpdateTableEntries without its optional offset: unconditional (-1)
    assert pc.decode(pc.UPDATE_TABLE_ENTRIES, body + struct.pack(">i", 1) + tk(b"k", -1)
                     + tv(b"v")) == pc.UpdateTableEntries(3, RG1, "", ((b"k", -1, b"v"),), -1)
    # ReadTableKeys: the token is optional and Java's trailing buffers are ignored
    assert pc.decode(pc.READ_TABLE_KEYS, body + struct.pack(">i", 10)) == pc.ReadTableKeys(
        3, RG1, "", 10, b"")
    assert pc.decode(pc.READ_TABLE_ENTRIES, body + struct.pack(">ii", 10, 8) + b"\0" * 7 + b"\1"
                     + struct.pack(">iii", 0, 0, 0)) == pc.ReadTableEntries(
        3, RG1, "", 10, b"\0" * 7 + b"\1")


def test_negative_data_length_is_a_decode_error():
    body = W + struct.pack(">ii", 0, -1) + struct.pack(">iqq", 1, 1, 1)
    with pytest.raises(pc.DecodeError):
        pc.decode(pc.APPEND_BLOCK_END, body)


@pytest.mark.parametrize("code", [-3, -4, -5, -6, 6, 13, 50, 99, 101, 1 << 30, -(1 << 31)])
def test_unknown_and_admin_codes_are_decode_errors(code):
    with pytest.raises(pc.DecodeError):
        pc.decode(code, b"\x00" * 16)


def test_unsupported_operations_read_only_the_request_id():
    assert pc.decode(38, struct.pack(">q", 9) + b"whatever") == pc.Unsupported(38, 9)
    assert pc.Unsupported(38, 9).operation == "truncateSegment"
    # what pravega-clients.md §3.1 leaves unsupported
    for code in (68, 69, 72, 73, 90, 91):
        assert pc.decode(code, struct.pack(">q", 9)) == pc.Unsupported(code, 9)
    with pytest.raises(pc.DecodeError):
        pc.decode(38, b"\x00" * 7)


def test_strings_echo_exactly_even_when_not_utf8():
    raw = b"s/\xc0\x80/0.#epoch.0"       # Java's modified UTF-8 for NUL
    body = struct.pack(">q", 1) + W + struct.pack(">H", len(raw)) + raw + b"\x00\x00"
    setup = pc.decode(pc.SETUP_APPEND, body)
    assert pc.encode(pc.NoSuchSegment(1, setup.segment, "", -1))[pc.HEADER_SIZE + 8:][
        :2 + len(raw)] == struct.pack(">H", len(raw)) + raw


def test_encoder_refuses_what_cannot_be_framed():
    with pytest.raises(ValueError):
        pc.encode(pc.SegmentCreated(1, "x" * 70000))
    with pytest.raises(ValueError):
        pc.encode(pc.SetupAppend(1, b"short", SEG, ""))


# -- append blocks ------------------------------------------------------------------------

def end(size, data=b"", num_events=1, last=1, rid=1):
    return pc.AppendBlockEnd(W, size, data, num_events, last, rid)


def test_block_without_trailer_appends_end_data():
    ev = pc.frame_event(b"x")
    assert pc.assemble_block(EVENTS, end(21, ev)) == EVENTS + ev


@pytest.mark.parametrize("block,blockend,problem", [
    (EVENTS, end(21, num_events=0), "numEvents 0"),
    (EVENTS, end(21, num_events=-3), "numEvents -3"),
    (EVENTS, end(22), "sizeOfWholeEvents 22"),
    (EVENTS, end(-1), "sizeOfWholeEvents -1"),
    (EVENTS, end(15), "6 bytes after"),
    (EVENTS + h("ff ff ff ff 00 00 00 03 00 00"), end(21), "not exactly one command"),
    (EVENTS + h("ff ff ff ff 00 00 00 01 00 00"), end(21), "not exactly one command"),
    (EVENTS + h("00 00 00 00 00 00 00 01 41"), end(21), "neither PartialEvent nor Padding"),
    (EVENTS + h("ff ff ff ff 00 00 00 01 00"), end(21, b"x"), "Padding followed by 1 bytes"),
])
def test_malformed_blocks_are_block_errors(block, blockend, problem):
    with pytest.raises(pc.BlockError) as e:
        pc.assemble_block(block, blockend)
    assert problem in str(e.value)


def test_standalone_end_ignores_size_of_whole_events():
    assert pc.assemble_block(None, end(-5, EVENTS, num_events=9)) == EVENTS
    with pytest.raises(pc.BlockError):
        pc.assemble_block(None, end(21, EVENTS, num_events=0))


@pytest.mark.parametrize("payload,problem", [
    (h("00 00 00 01 00 00 00 00"), "type 1"),
    (h("00 00 00 00 ff ff ff ff"), "negative event length"),
    (h("00 00 00 00 00 00 00 05 41"), "runs past"),
    (EVENTS + h("00 00 00"), "not a whole event header"),
    (h("ff ff ff fe 00 00 00 00"), "type -2"),
])
def test_non_events_are_refused(payload, problem):
    with pytest.raises(pc.NotEvents) as e:
        pc.scan_events(payload)
    assert problem in str(e.value)


def test_stored_batches_decode_to_their_values():
    payload = pc.frame_events([b"a", b"", b"ccc"])
    batch = StoredBatch(7, 3, 1234, 1234, 1234, 100, len(payload), 3, None, 0, payload)
    records = decode_stored_events(payload, batch)
    assert list(records) == [(7, 1234, None, b"a"), (8, 1234, None, b""), (9, 1234, None, b"ccc")]


# -- segment names ------------------------------------------------------------------------------

@pytest.mark.parametrize("topic,stream", [
    ("orders", "orders"), ("user_events", "x--user-uevents"), ("a-b_c", "x--a--b-uc"),
    ("x--foo", "x--x----foo"), ("a.b-c", "a.b-c"), ("_", "x---u"), ("x-", "x-"),
    ("x--", "x--x----"), ("__", "x---u-u"), ("-_-", "x-----u--"),
])
def test_escaping_examples_round_trip(topic, stream):
    assert pc.escape_stream(topic) == stream
    assert pc.unescape_stream(stream) == topic
    assert pc.parse_segment_name(f"gateway/{stream}/3.#epoch.0", "gateway") == (topic, 3)


@pytest.mark.parametrize("stream", [
    "x--a-b", "x--a-", "x--abc", "x--", "x--a-x", "has_underscore", "a/b", "", "x--a-U",
])
def test_invalid_or_non_canonical_streams_name_nothing(stream):
    assert pc.unescape_stream(stream) is None


@pytest.mark.parametrize("name,expected", [
    ("s/t/0.#epoch.0", ("t", 0)),
    ("s/t/12.#epoch.0", ("t", 12)),
    ("s/x--user-uevents/1.#epoch.0", ("user_events", 1)),
    ("t/0", ("t", 0)),
    ("user_events/4", ("user_events", 4)),
    ("other/t/0.#epoch.0", None),           # another scope
    ("s/t/0.#epoch.1", None),               # another epoch
    ("s/t/00.#epoch.0", None),              # leading zero
    ("s/t/-1.#epoch.0", None),
    ("s/t/+1.#epoch.0", None),
    ("t/01", None),
    ("t/", None),
    ("s/t/0.#epoch.0#transaction.00000000000000000000000000000000", None),
    ("s/t/0.#epoch.0#index", None),
    ("s/t/0.#epoch.0#transient.0123456789abcdef0123456789abcdef", None),
    ("_system/_tables/0.#epoch.0", None),
    ("s/_tables/0.#epoch.0", None),
    ("s/t/0", None),
    ("t", None),
    ("s/t/99999999999.#epoch.0", None),
    ("s/t/0.#epoch.0\n", None),
])
def test_segment_names(name, expected):
    assert pc.parse_segment_name(name, "s") == expected


def test_segment_name_is_the_scoped_escaped_form():
    assert pc.segment_name("gateway", "user_events", 2) == "gateway/x--user-uevents/2.#epoch.0"
    assert pc.parse_segment_name(pc.segment_name("g", "a-b_c", 7), "g") == ("a-b_c", 7)


# -- listener options ---------------------------------------------------------------------------

def listener(**options):
    doc = {"listeners": [{"dialect": "pravega", "endpoint": "tcp:0", **options}]}
    return parse_config(doc, "/tmp", find_dialects()).listeners[0].options


def test_listener_options_and_defaults():
    assert dict(listener()) == {"scope": "gateway", "long_poll_ms": 60000,
                                "max_frame_bytes": pc.MAX_FRAME_BYTES}
    assert dict(listener(scope="s-1.x", long_poll_ms=0, max_frame_bytes=4096)) == {
        "scope": "s-1.x", "long_poll_ms": 0, "max_frame_bytes": 4096}


@pytest.mark.parametrize("options,message", [
    ({"scope": "_system"}, "listeners[0].scope: must be letters, digits"),
    ({"scope": "a/b"}, "listeners[0].scope: must be letters, digits"),
    ({"scope": ""}, "listeners[0].scope"),
    ({"long_poll_ms": -1}, "listeners[0].long_poll_ms"),
    ({"max_frame_bytes": pc.MAX_FRAME_BYTES + 1}, "listeners[0].max_frame_bytes"),
    ({"max_frame_bytes": 100}, "listeners[0].max_frame_bytes"),
    ({"scop": "x"}, "listeners[0].scop: unknown key (did you mean 'scope'?)"),
])
def test_listener_option_errors_name_the_key(options, message):
    with pytest.raises(ConfigError) as e:
        listener(**options)
    assert str(e.value).startswith(message)
