"""How one stored batch is framed on disk.

A frame is ``u32 size | u32 crc32c | header | [writer] | payload``: ``size``
counts everything after itself and the CRC covers everything after the CRC,
so a torn or corrupted tail is always detected. The header holds the facts
the store needs without looking into the payload (offsets, timestamps,
stream position, the payload's format id), so reads, retention, recovery and
same-format pass-through never decode records. The payload's encoding is the
producer's business: the store never interprets it.

All integers are little-endian. The writer block (a 16-byte writer id and
the event number stored with this append) is present only when flag bit 0 is
set, so batches without a writer do not pay for it.
"""
import struct

import crc32c

MAGIC = 1
FLAG_WRITER = 0x01

#: size, crc
FRAME_PREFIX = struct.Struct("<II")
#: magic, format, flags, reserved, base_offset, count, first_ts, max_ts,
#: append_ms, stream_pos, stream_len
HEADER = struct.Struct("<BBBxQIqqqQI")
WRITER = struct.Struct("<16sq")
PREFIX_AND_HEADER = struct.Struct("<II" + HEADER.format[1:])

PREFIX_SIZE = FRAME_PREFIX.size
HEADER_SIZE = HEADER.size
#: bytes of a frame before its payload, without / with the writer block
OVERHEAD = PREFIX_SIZE + HEADER_SIZE
WRITER_OVERHEAD = OVERHEAD + WRITER.size

_crc = crc32c.crc32c


class StoredBatch:
    """One batch as read back: the header facts plus the untouched payload.

    ``last_offset`` and ``next_offset`` are derived, ``position`` is where the
    frame starts in its segment file (used by the index and by recovery).
    """

    __slots__ = ("base_offset", "count", "first_ts", "max_ts", "append_ms",
                 "stream_pos", "stream_len", "format", "writer_id",
                 "event_number", "payload", "position", "frame_size")

    def __init__(self, base_offset, count, first_ts, max_ts, append_ms,
                 stream_pos, stream_len, format, writer_id, event_number,
                 payload, position=0, frame_size=0):
        self.base_offset = base_offset
        self.count = count
        self.first_ts = first_ts
        self.max_ts = max_ts
        self.append_ms = append_ms
        self.stream_pos = stream_pos
        self.stream_len = stream_len
        self.format = format
        self.writer_id = writer_id
        self.event_number = event_number
        self.payload = payload
        self.position = position
        self.frame_size = frame_size

    @property
    def next_offset(self):
        return self.base_offset + self.count

    @property
    def last_offset(self):
        return self.base_offset + self.count - 1

    @property
    def stream_end(self):
        return self.stream_pos + self.stream_len

    def __repr__(self):
        return (f"<StoredBatch base={self.base_offset} count={self.count} "
                f"format={self.format} pos={self.stream_pos}+{self.stream_len}>")


def encode_frame(fmt, base_offset, count, first_ts, max_ts, append_ms,
                 stream_pos, stream_len, payload, writer_id=None, event_number=0):
    """Return the complete frame for one batch, CRC included."""
    if writer_id is None:
        body = HEADER.pack(MAGIC, fmt, 0, base_offset, count, first_ts, max_ts,
                           append_ms, stream_pos, stream_len)
    else:
        body = HEADER.pack(MAGIC, fmt, FLAG_WRITER, base_offset, count, first_ts,
                           max_ts, append_ms, stream_pos, stream_len) + WRITER.pack(
                               writer_id, event_number)
    crc = _crc(payload, _crc(body))
    return FRAME_PREFIX.pack(len(body) + len(payload) + 4, crc) + body + payload


class FrameError(Exception):
    """The bytes at a position are not a whole, valid frame (torn or corrupt)."""


def decode_frame(buf, pos, file_position, verify=True):
    """Decode the frame starting at ``buf[pos:]``.

    Returns ``(batch, next_pos)``; ``next_pos`` is ``None`` when ``buf`` ends
    before the frame does (the caller reads more). Raises ``FrameError`` for
    a frame that can never become valid. ``file_position`` is recorded on the
    batch so callers can index it.
    """
    end_of_buf = len(buf)
    if end_of_buf - pos < OVERHEAD:
        return None, None
    size, crc = FRAME_PREFIX.unpack_from(buf, pos)
    if size < HEADER_SIZE + 4:
        raise FrameError(f"frame size {size} too small at {file_position}")
    end = pos + 4 + size
    if end > end_of_buf:
        return None, None
    body_start = pos + PREFIX_SIZE
    if verify and _crc(memoryview(buf)[body_start:end]) != crc:
        raise FrameError(f"crc mismatch at {file_position}")
    (magic, fmt, flags, base_offset, count, first_ts, max_ts, append_ms,
     stream_pos, stream_len) = HEADER.unpack_from(buf, body_start)
    if magic != MAGIC:
        raise FrameError(f"bad magic {magic} at {file_position}")
    payload_start = body_start + HEADER_SIZE
    writer_id = None
    event_number = 0
    if flags & FLAG_WRITER:
        if payload_start + WRITER.size > end:
            raise FrameError(f"writer block torn at {file_position}")
        writer_id, event_number = WRITER.unpack_from(buf, payload_start)
        payload_start += WRITER.size
    batch = StoredBatch(base_offset, count, first_ts, max_ts, append_ms,
                        stream_pos, stream_len, fmt, writer_id, event_number,
                        bytes(buf[payload_start:end]), file_position, end - pos)
    return batch, end
