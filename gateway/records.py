"""Records as the bus sees them, and the payload formats batches are stored in.

A batch is handed to the bus either as a ``RecordBatch`` (columns of values,
optional keys, optional timestamps), which the bus encodes in the neutral
format, or as an ``EncodedBatch``: a producer's own batch bytes (a TANK
bundle, a Kafka message set), already validated by that dialect's codec, with
the facts the store needs. Readers get ``Records`` back: columns again, so a
dialect can frame a hundred values without building a hundred objects.

Format ids are written to disk: an id keeps its meaning forever. They are
allocated here, in one table, even for formats whose decoder a dialect
registers later.
"""
import struct
from itertools import accumulate

#: format ids on disk (never reuse or renumber)
NEUTRAL = 0
TANK_BUNDLE = 1
KAFKA_MESSAGE_SET = 2
#: Pravega event-framed data as appended (``int32 0, int32 len, value`` per
#: record): the payload *is* the segment's byte view, so reads pass it through
PRAVEGA_EVENTS = 3

_COUNT = struct.Struct("<BI")
_HAS_TIMESTAMPS = 0x01
_HAS_KEYS = 0x02


class RecordBatch:
    """Records to produce, as columns. ``keys`` and ``timestamps`` may be None
    (no keys; the bus stamps the receive time)."""

    __slots__ = ("values", "keys", "timestamps")

    def __init__(self, values, keys=None, timestamps=None):
        self.values = values
        self.keys = keys
        self.timestamps = timestamps

    def __len__(self):
        return len(self.values)


class EncodedBatch:
    """A producer's own batch bytes, validated by its dialect, with the facts
    the store keeps in the batch header."""

    __slots__ = ("format", "payload", "count", "first_ts", "max_ts", "value_bytes",
                 "max_value_bytes")

    def __init__(self, format, payload, count, first_ts, max_ts, value_bytes,
                 max_value_bytes):
        self.format = format
        self.payload = payload
        self.count = count
        self.first_ts = first_ts
        self.max_ts = max_ts
        self.value_bytes = value_bytes
        self.max_value_bytes = max_value_bytes

    def __len__(self):
        return self.count


class Records:
    """Decoded records of one stored batch, as columns starting at ``base_offset``."""

    __slots__ = ("base_offset", "timestamps", "keys", "values")

    def __init__(self, base_offset, timestamps, keys, values):
        self.base_offset = base_offset
        self.timestamps = timestamps
        self.keys = keys
        self.values = values

    def __len__(self):
        return len(self.values)

    def offsets(self):
        return range(self.base_offset, self.base_offset + len(self.values))

    def since(self, offset):
        """The records at ``offset`` and after."""
        skip = offset - self.base_offset
        if skip <= 0:
            return self
        return Records(offset, self.timestamps[skip:],
                       None if self.keys is None else self.keys[skip:], self.values[skip:])

    def __iter__(self):
        """(offset, timestamp, key, value) per record."""
        keys = self.keys if self.keys is not None else [None] * len(self.values)
        return zip(self.offsets(), self.timestamps, keys, self.values)


def encode_neutral(batch, now_ms):
    """Encode a RecordBatch; return ``(payload, first_ts, max_ts, value_bytes, max_value)``.

    Layout: ``u8 flags, u32 count, [count x i64 timestamps],
    [count x i32 key length (-1: none), keys], count x u32 value length, values``.
    Every column is packed by one ``struct`` call, so the cost per record is
    a few C-level operations.
    """
    values = batch.values
    n = len(values)
    lengths = list(map(len, values))
    parts = [None]
    flags = 0
    if batch.timestamps is not None:
        flags |= _HAS_TIMESTAMPS
        ts = batch.timestamps
        parts.append(struct.pack(f"<{n}q", *ts))
        first_ts, max_ts = (ts[0], max(ts)) if n else (now_ms, now_ms)
    else:
        first_ts = max_ts = now_ms
    if batch.keys is not None:
        flags |= _HAS_KEYS
        keys = batch.keys
        parts.append(struct.pack(f"<{n}i", *[-1 if k is None else len(k) for k in keys]))
        parts.append(b"".join([k for k in keys if k]))
    parts[0] = _COUNT.pack(flags, n)
    parts.append(struct.pack(f"<{n}I", *lengths))
    parts.extend(values)
    value_bytes = sum(lengths)
    return b"".join(parts), first_ts, max_ts, value_bytes, max(lengths, default=0)


def _split(payload, start, lengths):
    """Cut consecutive pieces of the given lengths out of ``payload``."""
    ends = list(accumulate(lengths, initial=start))
    return [payload[a:b] for a, b in zip(ends, ends[1:])], ends[-1]


def decode_neutral(payload, batch):
    flags, n = _COUNT.unpack_from(payload, 0)
    pos = _COUNT.size
    if n > (len(payload) - pos) // 4:
        # Every record has at least its 4-byte value length: a larger count is
        # damage, refused before struct allocates for it.
        raise ValueError(f"neutral batch claims {n} records in {len(payload)} bytes")
    if flags & _HAS_TIMESTAMPS:
        timestamps = list(struct.unpack_from(f"<{n}q", payload, pos))
        pos += 8 * n
    else:
        timestamps = [batch.first_ts] * n
    keys = None
    if flags & _HAS_KEYS:
        key_lengths = struct.unpack_from(f"<{n}i", payload, pos)
        pos += 4 * n
        present, pos = _split(payload, pos, [max(k, 0) for k in key_lengths])
        keys = [None if k < 0 else v for k, v in zip(key_lengths, present)]
    lengths = struct.unpack_from(f"<{n}I", payload, pos)
    values, _ = _split(payload, pos + 4 * n, lengths)
    return Records(batch.base_offset, timestamps, keys, values)


class FormatRegistry:
    """Decoders from a stored payload format to ``Records``.

    The neutral format is always known; a dialect that stores its producers'
    own batches registers a decoder for its format id when the bus is built,
    so every other dialect can read them.
    """

    def __init__(self):
        self.decoders = {NEUTRAL: decode_neutral}

    def register(self, format_id, decoder):
        known = self.decoders.get(format_id)
        if known is not None and known is not decoder:
            raise ValueError(f"format {format_id} already has a decoder")
        self.decoders[format_id] = decoder

    def decode(self, batch):
        """``Records`` of a StoredBatch, whatever its format."""
        try:
            decoder = self.decoders[batch.format]
        except KeyError:
            raise LookupError(f"no decoder for stored format {batch.format}") from None
        return decoder(batch.payload, batch)
