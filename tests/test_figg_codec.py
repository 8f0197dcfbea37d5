"""The Figg codec: the worked examples of protocols/figg.md §6 byte for byte,
round trips, the ATTACH flag readings, and how bad payloads fail."""
import struct

import pytest

from plugins.figg import codec as fc


def hx(text):
    return bytes.fromhex(text.replace("|", ""))


TS = 1700000000123456789

# (message, frame) pairs straight from §6.
EXAMPLES = [
    (fc.Attach(b"foo", 5, 0x8000),
     "00 01 00 01 00 00 00 11 | 80 00 | 00 00 00 03 66 6f 6f | 00 00 00 00 00 00 00 05"),
    (fc.Attach(b"foo", 5, 0x0001),
     "00 01 00 01 00 00 00 11 | 00 01 | 00 00 00 03 66 6f 6f | 00 00 00 00 00 00 00 05"),
    (fc.Attach(b"foo", 0, 0),
     "00 01 00 01 00 00 00 11 | 00 00 | 00 00 00 03 66 6f 6f | 00 00 00 00 00 00 00 00"),
    (fc.Attached(b"foo", 5),
     "00 02 00 01 00 00 00 0f | 00 00 00 03 66 6f 6f | 00 00 00 00 00 00 00 05"),
    (fc.Data(b"foo", 6, b"bar"),
     "00 07 00 01 00 00 00 16 | 00 00 00 03 66 6f 6f | 00 00 00 00 00 00 00 06 "
     "| 00 00 00 03 62 61 72"),
    (fc.Data(b"foo", 42, b"hello"),
     "00 07 00 01 00 00 00 18 | 00 00 00 03 66 6f 6f | 00 00 00 00 00 00 00 2a "
     "| 00 00 00 05 68 65 6c 6c 6f"),
    (fc.Publish(b"foo", 0, b"bar"),
     "00 05 00 01 00 00 00 16 | 00 00 00 03 66 6f 6f | 00 00 00 00 00 00 00 00 "
     "| 00 00 00 03 62 61 72"),
    (fc.Ack(0), "00 06 00 01 00 00 00 08 | 00 00 00 00 00 00 00 00"),
    (fc.Detach(b"foo"), "00 03 00 01 00 00 00 07 | 00 00 00 03 66 6f 6f"),
    (fc.Detached(b"foo"), "00 04 00 01 00 00 00 07 | 00 00 00 03 66 6f 6f"),
    (fc.Ping(TS), "00 08 00 01 00 00 00 08 | 17 97 9c fe 3d 85 cd 15"),
    (fc.Pong(TS), "00 09 00 01 00 00 00 08 | 17 97 9c fe 3d 85 cd 15"),
]


@pytest.mark.parametrize("message, frame", EXAMPLES, ids=[type(m).__name__ + str(i)
                                                         for i, (m, _) in enumerate(EXAMPLES)])
def test_worked_examples_encode_byte_exact(message, frame):
    assert fc.encode(message) == hx(frame)


@pytest.mark.parametrize("message, frame", EXAMPLES, ids=[type(m).__name__ + str(i)
                                                         for i, (m, _) in enumerate(EXAMPLES)])
def test_worked_examples_decode(message, frame):
    assert fc.decode_frames(hx(frame)) == ([message], b"")


def test_ping_and_pong_carry_the_same_eight_bytes():
    ping, pong = fc.encode(fc.Ping(TS)), fc.encode(fc.Pong(TS))
    assert ping[8:] == pong[8:] == hx("17 97 9c fe 3d 85 cd 15")


def test_malformed_example_attach_without_offset():
    frame = hx("00 01 00 01 00 00 00 09 | 80 00 | 00 00 00 03 66 6f 6f")
    with pytest.raises(fc.FiggDecodeError, match="ATTACH offset runs past the payload"):
        fc.decode_frames(frame)


@pytest.mark.parametrize("flags, from_offset", [
    (0x8000, True), (0x0001, True), (0x8001, True), (0xFFFF, True),
    (0x0000, False), (0x4000, False), (0x0002, False), (0x7FFE, False)])
def test_attach_flag_readings(flags, from_offset):
    assert fc.Attach(b"t", 9, flags).from_offset is from_offset


def test_version_is_written_as_1_and_ignored_on_read():
    frame = bytearray(fc.encode(fc.Ack(7)))
    assert frame[2:4] == b"\x00\x01"
    frame[2:4] = b"\x00\x07"
    assert fc.decode_frames(bytes(frame)) == ([fc.Ack(7)], b"")


def test_bytes_after_the_last_field_are_ignored():
    payload = struct.pack(">I", 3) + b"foo" + b"extra"
    frame = fc.HEADER.pack(fc.DETACH, 1, len(payload)) + payload
    assert fc.decode_frames(frame) == ([fc.Detach(b"foo")], b"")


def test_unknown_types_are_skipped():
    unknown = fc.HEADER.pack(77, 1, 3) + b"abc"
    empty_unknown = fc.HEADER.pack(0, 1, 0)
    assert fc.decode_payload(77, b"abc") is None
    assert fc.decode_frames(unknown + empty_unknown + fc.encode(fc.Ack(1))) == \
        ([fc.Ack(1)], b"")


def test_incomplete_frames_are_left_for_later():
    frame = fc.encode(fc.Publish(b"foo", 3, b"bar"))
    for cut in range(len(frame)):
        assert fc.decode_frames(frame[:cut]) == ([], frame[:cut])
    assert fc.decode_frames(frame + frame[:5]) == ([fc.Publish(b"foo", 3, b"bar")], frame[:5])


def test_oversize_payload_len_fails_on_the_header_alone():
    header = fc.HEADER.pack(fc.PUBLISH, 1, 1025)
    with pytest.raises(fc.FiggDecodeError, match="payload_len 1025 exceeds 1024"):
        fc.decode_frames(header, max_payload_bytes=1024)


@pytest.mark.parametrize("msg_type, payload, problem", [
    (fc.ATTACH, b"\x80", "ATTACH flags runs past"),
    (fc.ATTACH, b"\x80\x00\x00\x00", "ATTACH topic length runs past"),
    (fc.ATTACH, b"\x80\x00\x00\x01\x00\x00x", "ATTACH topic of 65536 bytes runs past"),
    (fc.ATTACHED, b"\x00\x00\x00\x01x\x00", "ATTACHED offset runs past"),
    (fc.DETACH, b"", "DETACH topic length runs past"),
    (fc.DETACHED, b"\xff\xff\xff\xff", "DETACHED topic of 4294967295 bytes runs past"),
    (fc.PUBLISH, b"\x00\x00\x00\x01x" + bytes(11), "PUBLISH seq_num and data length run past"),
    (fc.PUBLISH, b"\x00\x00\x00\x01x" + bytes(8) + b"\x00\x00\x00\x05abcd",
     "PUBLISH data of 5 bytes runs past"),
    (fc.ACK, bytes(7), "ACK seq_num runs past"),
    (fc.DATA, b"\x00\x00\x00\x01x" + bytes(8), "DATA data length runs past"),
    (fc.DATA, b"\x00\x00\x00\x01x" + bytes(4), "DATA offset runs past"),
    (fc.PING, b"", "PING timestamp runs past"),
    (fc.PONG, bytes(3), "PONG timestamp runs past"),
])
def test_fields_running_past_the_payload(msg_type, payload, problem):
    with pytest.raises(fc.FiggDecodeError, match=problem):
        fc.decode_payload(msg_type, payload)


def test_decode_publish_matches_the_message():
    payload = fc.encode(fc.Publish(b"t.1", 2 ** 64 - 1, b"\x00\xff"))[8:]
    assert fc.decode_publish(payload) == (b"t.1", 2 ** 64 - 1, b"\x00\xff")
    assert fc.decode_payload(fc.PUBLISH, payload) == fc.Publish(b"t.1", 2 ** 64 - 1, b"\x00\xff")


def test_encode_acks_is_a_run_of_ack_frames():
    assert fc.encode_acks([3, 1, 2 ** 64 - 1]) == b"".join(
        fc.encode(fc.Ack(s)) for s in (3, 1, 2 ** 64 - 1))
    assert fc.encode_acks([]) == b""


def test_data_encoder_matches_encode_and_stops_at_the_budget():
    encoder = fc.DataEncoder(b"foo")
    values = [b"a" * 10, b"", b"c" * 100, b"d"]
    frames = [fc.encode(fc.Data(b"foo", 42 + i, v)) for i, v in enumerate(values)]
    assert encoder.overhead == len(frames[1])

    parts = []
    assert encoder.encode_into(parts, 42, values, 0, 1 << 30) == (4, sum(map(len, frames)))
    assert b"".join(parts) == b"".join(frames)

    # The frame that reaches the budget is the last one.
    parts = []
    budget = len(frames[0]) + len(frames[1])
    assert encoder.encode_into(parts, 42, values, 0, budget) == (2, budget)
    assert b"".join(parts) == frames[0] + frames[1]

    # At least one frame, whatever the budget.
    parts = []
    assert encoder.encode_into(parts, 42, values, 0, 1) == (1, len(frames[0]))

    # From the middle of the values; nothing past the end.
    parts = []
    tail = frames[2] + fc.encode(fc.Data(b"foo", 45, b"d"))
    assert encoder.encode_into(parts, 44, values, 2, 1 << 30) == (2, len(tail))
    assert b"".join(parts) == tail
    assert encoder.encode_into([], 46, values, 4, 1 << 30) == (0, 0)


def test_out_of_range_fields_are_not_encoded():
    with pytest.raises(struct.error):
        fc.encode(fc.Ack(2 ** 64))
    with pytest.raises(struct.error):
        fc.encode(fc.Attach(b"t", -1, 0))
    with pytest.raises(TypeError):
        fc.encode("not a message")
