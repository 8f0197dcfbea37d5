"""TANK codec: frames, requests, responses and bundles <-> objects.

Pure (no Twisted, no I/O) so that it can be fuzzed. The byte-level reference
is ``shared/protocols/tank.md`` (TANK 4.0 as the gateway speaks it); section
numbers below (§) point into it.

Entry points:

* server side: ``decode_request(msg_id, payload)`` and ``encode_response``,
  plus the hot-path helpers ``encode_consume_response`` and
  ``encode_produce_response``;
* client side: ``encode_request`` and ``decode_response(msg_id, payload)``,
  ``produce_results`` (turns the flat Produce error list into per-partition
  codes) and ``decode_chunk`` (a Consume chunk's messages, tolerating a cut
  last bundle as a real broker sends it);
* bundles: ``encode_bundle`` and ``decode_bundle`` (the full validation of
  §3.3), ``bundle_count`` (a bundle's message count from its header alone).

Every request or response decoder raises only ``TankDecodeError`` for bad
input, and ``decode_bundle`` only ``BundleError``; the fuzz tests hold them
to that. Topic names travel as ``str`` decoded as Latin-1, which maps every
byte string to a distinct string and back, so a name the gateway refuses is
still echoed byte for byte.

Snappy is the raw block format through ``cramjam``: it is well kept (regular
releases, wheels for every platform we run on) and binds a compiled Snappy
that works at C speed, where a pure-Python Snappy would cost more per byte
than all the rest of a Produce.
"""
import struct
from dataclasses import dataclass
from typing import Optional, Tuple

import cramjam

# -- message ids (§2) -----------------------------------------------------------

PRODUCE = 0x01
CONSUME = 0x02
PING = 0x03
PRODUCE_WITH_SEQNUM = 0x05
DISCOVER_PARTITIONS = 0x06
CREATE_TOPIC = 0x07
RELOAD_CONF = 0x08
STATUS = 0x0A
DISCOVER_TOPICS = 0x0B
DISCOVER_TOPOLOGY = 0x0C

#: ``msgId:u8 | payloadLen:u32`` (little-endian, like every TANK integer)
FRAME_HEADER = struct.Struct("<BI")
PING_FRAME = FRAME_HEADER.pack(PING, 0)

U64_MAX = (1 << 64) - 1
#: Consume seq meaning "from the tail" (§5.3)
TAIL_SEQ = U64_MAX
#: recommended frame payload limit (§1; the real broker allows 256 MiB)
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
#: ``fetchSize`` and ``minBytes`` are capped at this (§1)
MAX_FETCH_BYTES = 64 * 1024 * 1024
#: what Status reports as the broker version (TANK 4.0)
TANK_VERSION = 400
#: longest key a message can carry (``keyLen`` is a u8)
MAX_KEY_BYTES = 255
#: timestamps are stored signed: a TANK ts at or above this is refused
MAX_TIMESTAMP = (1 << 63) - 1

# -- error codes (§8) -----------------------------------------------------------

# Produce, per partition or per topic
ERR_OK = 0x00
ERR_UNKNOWN_PARTITION = 0x01
ERR_INVALID_BUNDLE = 0x02
ERR_INVALID_SEQ = 0x0A
ERR_READ_ONLY = 0xFE
ERR_UNKNOWN_TOPIC = 0xFF
#: codes that stand for a whole topic: one byte, none for its partitions
TOPIC_CODES = frozenset((ERR_READ_ONLY, ERR_UNKNOWN_TOPIC))

# Consume ``errorOrFlags``
FETCH_OK = 0x00
FETCH_BOUNDARY = 0x01
FETCH_SYSTEM_ERROR = 0xFB
FETCH_SPARSE = 0xFE
FETCH_UNKNOWN_PARTITION = 0xFF
#: ``u16`` in place of a topic's entries: unknown topic
UNKNOWN_TOPIC_MARK = 0xFFFF

# CreateTopic
CREATE_OK = 0
CREATE_EXISTS = 1
CREATE_SYSTEM_ERROR = 2
CREATE_BAD_CONFIG = 4
CREATE_INVALID = 10

# ReloadConf
RELOAD_OK = 0
RELOAD_UNKNOWN_PARTITION = 10
RELOAD_UNKNOWN_TOPIC = 11
RELOAD_UNSUPPORTED = 12

#: DiscoverPartitions: a partition answered with (2^64-1, 2^64-1) + this reason
DISCOVER_SYSTEM_ERROR = 0xFB
#: DiscoverTopology's node count for a standalone broker
STANDALONE = 0xFFFF

# -- bundle and message flags (§3) ------------------------------------------------

CODEC_MASK = 0x03
CODEC_NONE = 0
CODEC_SNAPPY = 1
COUNT_SHIFT = 2
COUNT_MASK = 0x0F
SPARSE = 0x40
BUNDLE_RESERVED = 0x80

HAVE_KEY = 0x01
USE_LAST_TS = 0x02
SEQ_PREV_PLUS_ONE = 0x04
MESSAGE_FLAGS = HAVE_KEY | USE_LAST_TS | SEQ_PREV_PLUS_ONE

#: the real client compresses a bundle with more messages or content bytes than these (§3.4)
SNAPPY_MIN_MESSAGES = 512
SNAPPY_MIN_BYTES = 1024
#: no raw Snappy block expands more than this (a 3-byte copy makes 64 bytes), so
#: a header claiming more is refused before anything is allocated
_SNAPPY_MAX_RATIO = 22

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_unpack_u64 = _U64.unpack_from

_PRODUCE_HEAD = struct.Struct("<HI")          # clientVersion, reqId
_ACKS = struct.Struct("<BI")                  # requiredAcks, ackTimeoutMs
_CONSUME_WAIT = struct.Struct("<QI")          # maxWaitMs, minBytes
_CONSUME_PART = struct.Struct("<HQI")         # partition, seq, fetchSize
_ENTRY_DATA = struct.Struct("<HBQQI")         # partition, 00, baseSeq, hwMark, chunkLen
_ENTRY_SPARSE = struct.Struct("<HBQI")        # partition, fe, hwMark, chunkLen
_ENTRY_BOUNDARY = struct.Struct("<HBQQIQ")    # partition, 01, 0, hwMark, 0, firstAvailSeq
_ENTRY_ERROR = struct.Struct("<HB")           # partition, ff/fb
_DATA_TAIL = struct.Struct("<QQI")
_SPARSE_TAIL = struct.Struct("<QI")
_BOUNDARY_TAIL = struct.Struct("<QQIQ")
_SEQ_PAIR = struct.Struct("<QQ")
_STATUS = struct.Struct("<IBBIIIIII")
_DISCOVER_TOPICS_HEAD = struct.Struct("<IIB")
_TOPIC_ENTRY_TAIL = struct.Struct("<BH")


class TankDecodeError(Exception):
    """A frame that is not a valid request or response. The server closes the
    connection on it (§7): the framing can no longer be trusted."""


class BundleError(Exception):
    """A bundle that fails the validation of §3.3; the partition gets 0x02."""


class _Short(Exception):
    """Internal: input ended, or a varint ran on, inside a structure."""


# --------------------------------------------------------------------------
# Varints (§2): unsigned LEB128, 32 bits, at most 5 bytes
# --------------------------------------------------------------------------

_SMALL_VARINTS = [bytes((i,)) for i in range(0x80)]


def encode_varint(n):
    if n < 0x80:
        return _SMALL_VARINTS[n]
    if n > 0xFFFFFFFF:
        raise ValueError(f"varint {n} does not fit 32 bits")
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def decode_varint(buf, pos):
    """``(value, next_pos)``; raises ``_Short`` if ``buf`` ends first, or the
    varint does not end within 5 bytes or exceeds 32 bits."""
    value = 0
    shift = 0
    end = len(buf)
    for _ in range(5):
        if pos >= end:
            raise _Short("varint cut short")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            if value > 0xFFFFFFFF:
                raise _Short("varint exceeds 32 bits")
            return value, pos
        shift += 7
    raise _Short("varint longer than 5 bytes")


def varint_size(n):
    size = 1
    while n >= 0x80:
        n >>= 7
        size += 1
    return size


# --------------------------------------------------------------------------
# Bundles (§3)
# --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Bundle:
    """A decoded bundle. ``keys`` is None when no message has one; ``seqs``
    (absolute, one per message) and ``first_seq``/``last_seq`` only for a
    sparse bundle, whose messages name their own sequence numbers."""
    timestamps: list
    keys: Optional[list]
    values: list
    codec: int = CODEC_NONE
    first_seq: Optional[int] = None
    last_seq: Optional[int] = None
    seqs: Optional[list] = None

    def __len__(self):
        return len(self.values)

    @property
    def sparse(self):
        return self.first_seq is not None

    @property
    def dense(self):
        """True unless the bundle is sparse and its seqs are not consecutive
        (a gap, or a middle message past the last)."""
        seqs = self.seqs
        return seqs is None or seqs == list(range(seqs[0], seqs[0] + len(seqs)))


def _key_prefix(key):
    if len(key) > MAX_KEY_BYTES:
        raise ValueError(f"key of {len(key)} bytes exceeds {MAX_KEY_BYTES}")
    return _U8.pack(len(key)) + key


def _same_ts_prefixes():
    """``flags=UseLastSpecifiedTS, varint(len)`` for short values: the whole
    per-message overhead of a gateway-encoded bundle of keyless records with
    one timestamp (what RustLog, Figg and Pravega write)."""
    return [bytes((USE_LAST_TS,)) + encode_varint(n) for n in range(0x80)]


_SAME_TS = _same_ts_prefixes()


def _message_set(values, keys, timestamps, seqs):
    """The uncompressed message set (§3.2)."""
    n = len(values)
    first_ts = timestamps[0] if timestamps is not None else 0
    if keys is None and seqs is None and (timestamps is None or
                                          timestamps.count(first_ts) == n):
        # One timestamp, no keys: every message after the first is
        # ``02 varint(len) value``; build it with one join.
        parts = [None] * (2 * n)
        parts[0] = b"\x00" + _U64.pack(first_ts) + encode_varint(len(values[0]))
        small = _SAME_TS
        parts[2::2] = [small[m] if m < 0x80 else b"\x02" + encode_varint(m)
                       for m in map(len, values[1:])]
        parts[1::2] = values
        return b"".join(parts)
    parts = []
    last_ts = None
    for i in range(n):
        flags = 0
        head = b""
        if seqs is not None and 0 < i < n - 1:
            gap = seqs[i] - seqs[i - 1] - 1
            if gap < 0:
                raise ValueError("sparse seqs must increase")
            if gap == 0:
                flags |= SEQ_PREV_PLUS_ONE
            else:
                head = encode_varint(gap)
        ts = timestamps[i] if timestamps is not None else 0
        if ts == last_ts:
            flags |= USE_LAST_TS
        else:
            head += _U64.pack(ts)
            last_ts = ts
        key = keys[i] if keys is not None else None
        if key is not None:
            flags |= HAVE_KEY
            head += _key_prefix(key)
        value = values[i]
        parts.append(_U8.pack(flags) + head + encode_varint(len(value)))
        parts.append(value)
    return b"".join(parts)


def wants_snappy(values, keys=None):
    """The real client's rule (§3.4): compress past 512 messages or 1024
    bytes of keys and contents."""
    if len(values) > SNAPPY_MIN_MESSAGES:
        return True
    size = sum(map(len, values))
    if keys is not None:
        size += sum(len(k) for k in keys if k is not None)
    return size > SNAPPY_MIN_BYTES


def encode_bundle(values, keys=None, timestamps=None, compress=False, seqs=None):
    """One bundle of ``values`` (at least one).

    ``keys``: None, or per message None (no key) or bytes (up to 255; ``b""``
    is an empty key). ``timestamps``: ms per message (None: all 0, as the
    real ``benchmark`` sends). ``compress``: True for raw Snappy, None for the
    real client's rule (``wants_snappy``). ``seqs``: absolute seqs, one per
    message, for a sparse bundle (increasing; the gateway accepts only dense
    ones, but any increasing run encodes).
    """
    n = len(values)
    if n == 0:
        raise ValueError("a bundle holds at least one message")
    if compress is None:
        compress = wants_snappy(values, keys)
    flags = CODEC_SNAPPY if compress else CODEC_NONE
    head = b""
    if n <= COUNT_MASK:
        flags |= n << COUNT_SHIFT
    else:
        head = encode_varint(n)
    if seqs is not None:
        if len(seqs) != n:
            raise ValueError("one seq per message")
        flags |= SPARSE
        head += _U64.pack(seqs[0])
        if n != 1:
            head += encode_varint(seqs[-1] - seqs[0] - 1)
    message_set = _message_set(values, keys, timestamps, seqs)
    if compress:
        message_set = bytes(cramjam.snappy.compress_raw(message_set))
    return _U8.pack(flags) + head + message_set


def bundle_count(bundle):
    """The message count in a bundle's header (no validation beyond it)."""
    count = (bundle[0] >> COUNT_SHIFT) & COUNT_MASK
    if count:
        return count
    return decode_varint(bundle, 1)[0]


def _snappy_decompress(data, max_bytes):
    try:
        declared, _ = decode_varint(data, 0)
    except _Short:
        raise BundleError("bad Snappy length header") from None
    if declared > _SNAPPY_MAX_RATIO * len(data) or declared > max_bytes:
        raise BundleError(f"Snappy block claims {declared} bytes from {len(data)}")
    try:
        out = bytes(cramjam.snappy.decompress_raw(data))
    except Exception as e:  # cramjam raises its own DecompressionError and others
        raise BundleError(f"bad Snappy block: {e}") from None
    if len(out) != declared:
        raise BundleError("Snappy block shorter than its header says")
    return out


def decode_bundle(bundle, max_bytes=DEFAULT_MAX_FRAME_BYTES):
    """Decode and validate one bundle (§3.3); raises ``BundleError``.

    Checks: codec 0 or 1, bit 7 clear, count >= 1, Snappy decompresses (to
    at most ``max_bytes``), exactly ``count`` messages that consume the
    message set, a ts on the first message, no varint over 5 bytes, no
    length past the end, no unknown message flag, no ts at or above 2^63
    (timestamps are stored signed). The record-size limit is the caller's.
    """
    try:
        return _decode_bundle(bundle, max_bytes)
    except (_Short, IndexError, struct.error):
        raise BundleError("bundle cut short or malformed") from None


def _decode_bundle(bundle, max_bytes):
    flags = bundle[0]
    if flags & BUNDLE_RESERVED:
        raise BundleError("bundle flag bit 7 set")
    codec = flags & CODEC_MASK
    if codec > CODEC_SNAPPY:
        raise BundleError(f"unknown codec {codec}")
    count = (flags >> COUNT_SHIFT) & COUNT_MASK
    pos = 1
    if count == 0:
        count, pos = decode_varint(bundle, pos)
        if count == 0:
            raise BundleError("bundle holds no message")
    first_seq = last_seq = None
    sparse = flags & SPARSE
    if sparse:
        first_seq = _unpack_u64(bundle, pos)[0]
        pos += 8
        last_seq = first_seq
        if count != 1:
            delta, pos = decode_varint(bundle, pos)
            last_seq = first_seq + delta + 1
    ms = bundle[pos:]
    if codec == CODEC_SNAPPY:
        ms = _snappy_decompress(ms, max_bytes)
    elif type(ms) is not bytes:
        ms = bytes(ms)
    # Every message takes at least two bytes (flags, length): a count beyond
    # that is refused before the loop allocates anything for it.
    if count > len(ms) // 2:
        raise BundleError(f"count {count} cannot fit {len(ms)} bytes")
    end = len(ms)
    timestamps = []
    values = []
    keys = None
    seqs = [first_seq] if sparse else None
    last_ts = None
    last = count - 1
    p = 0
    for i in range(count):
        mflags = ms[p]
        p += 1
        if mflags & ~MESSAGE_FLAGS:
            raise BundleError(f"unknown message flags {mflags:#04x}")
        if sparse and i:
            if i == last:
                seqs.append(last_seq)
            elif mflags & SEQ_PREV_PLUS_ONE:
                seqs.append(seqs[-1] + 1)
            else:
                delta, p = decode_varint(ms, p)
                seqs.append(seqs[-1] + delta + 1)
        if mflags & USE_LAST_TS:
            if last_ts is None:
                raise BundleError("first message reuses a timestamp it does not have")
            timestamps.append(last_ts)
        else:
            last_ts = _unpack_u64(ms, p)[0]
            if last_ts > MAX_TIMESTAMP:
                raise BundleError(f"timestamp {last_ts} out of range")
            p += 8
            timestamps.append(last_ts)
        if mflags & HAVE_KEY:
            klen = ms[p]
            key = ms[p + 1:p + 1 + klen]
            p += 1 + klen
            if keys is None:
                keys = [None] * i
            keys.append(key)
        elif keys is not None:
            keys.append(None)
        b = ms[p]
        if b < 0x80:
            p += 1
            q = p + b
        else:
            vlen, p = decode_varint(ms, p)
            q = p + vlen
        if q > end:
            raise BundleError("message runs past the end of the bundle")
        values.append(ms[p:q])
        p = q
    if p != end:
        raise BundleError(f"{end - p} bytes after the last message")
    return Bundle(timestamps, keys, values, codec, first_seq, last_seq, seqs)


def decode_chunk(chunk, base_seq):
    """Messages of one Consume chunk: ``([(seq, ts, key, value)], complete)``.

    ``base_seq`` is the header's baseSeq (None when the first bundle is
    sparse and names its own). ``complete`` is False when the chunk ends in
    a cut bundle, as a real broker sends at ``fetchSize`` (§5.3): the whole
    messages before it are kept, and the caller fetches again with more
    room. A bundle that is whole but invalid raises ``TankDecodeError``.
    """
    out = []
    seq = base_seq
    pos = 0
    end = len(chunk)
    while pos < end:
        try:
            size, start = decode_varint(chunk, pos)
        except _Short:
            return out, False
        if start + size > end:
            return out, False
        try:
            bundle = decode_bundle(chunk[start:start + size])
        except BundleError as e:
            raise TankDecodeError(f"bad bundle in chunk: {e}") from None
        if bundle.seqs is not None:
            seqs = bundle.seqs
        elif seq is None:
            raise TankDecodeError("chunk without baseSeq starts with a plain bundle")
        else:
            seqs = range(seq, seq + len(bundle))
        keys = bundle.keys or [None] * len(bundle)
        out.extend(zip(seqs, bundle.timestamps, keys, bundle.values))
        seq = seqs[-1] + 1
        pos = start + size
    return out, True


def chunk_append(parts, bundle):
    """Add one bundle to a chunk being built as a list of byte strings;
    returns the bytes added."""
    prefix = encode_varint(len(bundle))
    parts.append(prefix)
    parts.append(bundle)
    return len(prefix) + len(bundle)


# --------------------------------------------------------------------------
# Requests (§4-§6)
# --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ProducePartition:
    """``first_seq`` is ProduceWithSeqnum's ``firstMsgSeq`` (0: not given)."""
    partition: int
    bundle: bytes
    first_seq: int = 0


@dataclass(frozen=True, slots=True)
class ProduceTopic:
    name: str
    partitions: Tuple[ProducePartition, ...]


@dataclass(frozen=True, slots=True)
class ProduceRequest:
    """Produce (0x01), or ProduceWithSeqnum (0x05) when ``with_seqnum``."""
    req_id: int
    topics: Tuple[ProduceTopic, ...]
    with_seqnum: bool = False
    client_id: str = ""
    required_acks: int = 0
    ack_timeout_ms: int = 0
    client_version: int = 2


@dataclass(frozen=True, slots=True)
class ConsumePartition:
    partition: int
    seq: int
    fetch_size: int


@dataclass(frozen=True, slots=True)
class ConsumeTopic:
    name: str
    partitions: Tuple[ConsumePartition, ...]


@dataclass(frozen=True, slots=True)
class ConsumeRequest:
    """As sent: ``max_wait_ms``, ``min_bytes`` and fetch sizes are normalised
    by the server (``normalize_max_wait``, ``MAX_FETCH_BYTES``).
    ``op_flags`` is on the wire only for ``client_version`` >= 3."""
    req_id: int
    topics: Tuple[ConsumeTopic, ...]
    max_wait_ms: int = 0
    min_bytes: int = 0
    client_version: int = 2
    op_flags: int = 0
    client_id: str = ""


@dataclass(frozen=True, slots=True)
class DiscoverPartitionsRequest:
    """``partitions`` empty means all of them."""
    req_id: int
    topic: str
    partitions: Tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class CreateTopicRequest:
    req_id: int
    topic: str
    partitions: int
    config: bytes = b""


@dataclass(frozen=True, slots=True)
class ReloadConfRequest:
    req_id: int
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class StatusRequest:
    req_id: int


@dataclass(frozen=True, slots=True)
class DiscoverTopicsRequest:
    req_id: int
    flags: int = 0


@dataclass(frozen=True, slots=True)
class DiscoverTopologyRequest:
    req_id: int
    flags: int = 0


def normalize_max_wait(ms):
    """§5.4: 0 stays 0 (answer now); anything else is clamped to
    [320 ms, 1 h] and rounded up to a multiple of 64 ms."""
    if ms == 0:
        return 0
    ms = min(max(ms, 320), 3600 * 1000)
    return -(-ms // 64) * 64


class _Reader:
    """A cursor over a payload; every read past the end raises ``_Short``."""

    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf):
        self.buf = buf
        self.pos = 0
        self.end = len(buf)

    def take(self, n):
        pos = self.pos
        if pos + n > self.end:
            raise _Short("payload too short")
        self.pos = pos + n
        return self.buf[pos:pos + n]

    def unpack(self, st):
        pos = self.pos
        if pos + st.size > self.end:
            raise _Short("payload too short")
        self.pos = pos + st.size
        return st.unpack_from(self.buf, pos)

    def u8(self):
        pos = self.pos
        if pos >= self.end:
            raise _Short("payload too short")
        self.pos = pos + 1
        return self.buf[pos]

    def u16(self):
        return self.unpack(_U16)[0]

    def u32(self):
        return self.unpack(_U32)[0]

    def u64(self):
        return self.unpack(_U64)[0]

    def str8(self):
        return self.take(self.u8()).decode("latin-1")

    def varint(self):
        value, self.pos = decode_varint(self.buf, self.pos)
        return value

    def rest(self):
        return self.end - self.pos


def _decode_produce(r, with_seqnum):
    version, req_id = r.unpack(_PRODUCE_HEAD)
    client_id = r.str8()
    acks, ack_timeout = r.unpack(_ACKS)
    topics = []
    for _ in range(r.u8()):
        name = r.str8()
        parts = []
        for _ in range(r.u8()):
            partition = r.u16()
            size = r.varint()
            first_seq = r.u64() if with_seqnum else 0
            parts.append(ProducePartition(partition, r.take(size), first_seq))
        topics.append(ProduceTopic(name, tuple(parts)))
    return ProduceRequest(req_id, tuple(topics), with_seqnum, client_id, acks, ack_timeout,
                          version)


def _decode_consume(r):
    version, req_id = r.unpack(_PRODUCE_HEAD)
    client_id = r.str8()
    max_wait, min_bytes = r.unpack(_CONSUME_WAIT)
    op_flags = r.u8() if version >= 3 else 0
    topics = []
    for _ in range(r.u8()):
        name = r.str8()
        parts = tuple(ConsumePartition(*r.unpack(_CONSUME_PART)) for _ in range(r.u8()))
        topics.append(ConsumeTopic(name, parts))
    return ConsumeRequest(req_id, tuple(topics), max_wait, min_bytes, version, op_flags,
                          client_id)


def _decode_discover_partitions(r):
    req_id = r.u32()
    topic = r.str8()
    partitions = tuple(r.u16() for _ in range(r.rest() // 2))
    return DiscoverPartitionsRequest(req_id, topic, partitions)


def _decode_create_topic(r):
    req_id = r.u32()
    topic = r.str8()
    partitions = r.u16()
    return CreateTopicRequest(req_id, topic, partitions, r.take(r.varint()))


_REQUEST_DECODERS = {
    PRODUCE: lambda r: _decode_produce(r, False),
    PRODUCE_WITH_SEQNUM: lambda r: _decode_produce(r, True),
    CONSUME: _decode_consume,
    DISCOVER_PARTITIONS: _decode_discover_partitions,
    CREATE_TOPIC: _decode_create_topic,
    RELOAD_CONF: lambda r: ReloadConfRequest(r.u32(), r.str8(), r.u16()),
    STATUS: lambda r: StatusRequest(r.u32()),
    DISCOVER_TOPICS: lambda r: DiscoverTopicsRequest(r.u32(), r.u8()),
    DISCOVER_TOPOLOGY: lambda r: DiscoverTopologyRequest(r.u32(), r.u8()),
}


def decode_request(msg_id, payload):
    """The request in one frame; raises ``TankDecodeError`` for an unknown or
    unsupported ``msg_id`` or a payload too short for its fields and counts.
    Bytes after the last field are ignored, as the real broker does."""
    decoder = _REQUEST_DECODERS.get(msg_id)
    if decoder is None:
        raise TankDecodeError(f"unsupported message id {msg_id:#04x}")
    try:
        return decoder(_Reader(payload))
    except _Short as e:
        raise TankDecodeError(f"malformed request {msg_id:#04x}: {e}") from None


def frame(msg_id, payload):
    return FRAME_HEADER.pack(msg_id, len(payload)) + payload


def _str8(name):
    raw = name.encode("latin-1")
    if len(raw) > 255:
        raise ValueError(f"name of {len(raw)} bytes does not fit a str8")
    return _U8.pack(len(raw)) + raw


def _count8(items, what):
    if len(items) > 255:
        raise ValueError(f"more than 255 {what} in one request")
    return _U8.pack(len(items))


def _encode_produce(req):
    out = [_PRODUCE_HEAD.pack(req.client_version, req.req_id), _str8(req.client_id),
           _ACKS.pack(req.required_acks, req.ack_timeout_ms), _count8(req.topics, "topics")]
    for topic in req.topics:
        out.append(_str8(topic.name))
        out.append(_count8(topic.partitions, "partitions"))
        for part in topic.partitions:
            out.append(_U16.pack(part.partition) + encode_varint(len(part.bundle)))
            if req.with_seqnum:
                out.append(_U64.pack(part.first_seq))
            out.append(part.bundle)
    return b"".join(out)


def _encode_consume(req):
    out = [_PRODUCE_HEAD.pack(req.client_version, req.req_id), _str8(req.client_id),
           _CONSUME_WAIT.pack(req.max_wait_ms, req.min_bytes)]
    if req.client_version >= 3:
        out.append(_U8.pack(req.op_flags))
    out.append(_count8(req.topics, "topics"))
    for topic in req.topics:
        out.append(_str8(topic.name))
        out.append(_count8(topic.partitions, "partitions"))
        out.extend(_CONSUME_PART.pack(p.partition, p.seq, p.fetch_size)
                   for p in topic.partitions)
    return b"".join(out)


def encode_request(req):
    """The complete frame for a request object."""
    kind = type(req)
    if kind is ProduceRequest:
        return frame(PRODUCE_WITH_SEQNUM if req.with_seqnum else PRODUCE, _encode_produce(req))
    if kind is ConsumeRequest:
        return frame(CONSUME, _encode_consume(req))
    if kind is DiscoverPartitionsRequest:
        return frame(DISCOVER_PARTITIONS, _U32.pack(req.req_id) + _str8(req.topic) +
                     b"".join(_U16.pack(p) for p in req.partitions))
    if kind is CreateTopicRequest:
        return frame(CREATE_TOPIC, _U32.pack(req.req_id) + _str8(req.topic) +
                     _U16.pack(req.partitions) + encode_varint(len(req.config)) + req.config)
    if kind is ReloadConfRequest:
        return frame(RELOAD_CONF, _U32.pack(req.req_id) + _str8(req.topic) +
                     _U16.pack(req.partition))
    if kind is StatusRequest:
        return frame(STATUS, _U32.pack(req.req_id))
    if kind is DiscoverTopicsRequest:
        return frame(DISCOVER_TOPICS, _U32.pack(req.req_id) + _U8.pack(req.flags))
    if kind is DiscoverTopologyRequest:
        return frame(DISCOVER_TOPOLOGY, _U32.pack(req.req_id) + _U8.pack(req.flags))
    raise TypeError(f"not a TANK request: {req!r}")


def parse_topic_config(text):
    """CreateTopic's ``key=value`` lines (``#`` comments, blank lines); returns
    ``{key: value}`` or raises ``ValueError`` for a line that is neither."""
    try:
        lines = text.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise ValueError("config is not UTF-8") from None
    out = {}
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"line {number}: expected key=value")
        out[key.strip()] = value.strip()
    return out


# --------------------------------------------------------------------------
# Responses
# --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ProduceResponse:
    """``codes``: the flat error list in request order (§4); see
    ``produce_results`` for what each byte belongs to."""
    req_id: int
    codes: bytes


@dataclass(frozen=True, slots=True)
class ConsumeEntry:
    """One partition of a Consume response. ``flags`` is the errorOrFlags
    byte; ``chunk`` the bundles (bytes, or a list of byte strings while the
    server builds it; ``chunk_len`` is then their total)."""
    partition: int
    flags: int
    base_seq: Optional[int] = None
    hw_mark: int = 0
    first_avail: int = 0
    chunk: object = b""
    chunk_len: int = 0


@dataclass(frozen=True, slots=True)
class ConsumeTopicResult:
    """``entries`` None: unknown topic (``requested`` is echoed as partsCnt)."""
    name: str
    requested: int
    entries: Optional[Tuple[ConsumeEntry, ...]]


@dataclass(frozen=True, slots=True)
class ConsumeResponse:
    req_id: int
    topics: Tuple[ConsumeTopicResult, ...]


@dataclass(frozen=True, slots=True)
class PartitionSeqs:
    """DiscoverPartitions: ``reason`` is set only when both seqs are 2^64-1."""
    first_avail: int
    hw_mark: int
    reason: Optional[int] = None


@dataclass(frozen=True, slots=True)
class DiscoverPartitionsResponse:
    """``partitions`` empty: unknown topic."""
    req_id: int
    topic: str
    partitions: Tuple[PartitionSeqs, ...]


@dataclass(frozen=True, slots=True)
class CreateTopicResponse:
    req_id: int
    topic: str
    error: int


@dataclass(frozen=True, slots=True)
class ReloadConfResponse:
    req_id: int
    topic: str
    partition: int
    error: int


@dataclass(frozen=True, slots=True)
class StatusResponse:
    req_id: int
    topics: int
    partitions: int
    open_partitions: int
    startup_ts: int
    version: int = TANK_VERSION
    global_flags: int = 0
    cluster_aware: int = 0
    open_partitions_time: int = 0


@dataclass(frozen=True, slots=True)
class TopicSummary:
    name: str
    partitions: int
    enabled: int = 1


@dataclass(frozen=True, slots=True)
class DiscoverTopicsResponse:
    req_id: int
    topics: Tuple[TopicSummary, ...]
    cluster_aware: int = 0


@dataclass(frozen=True, slots=True)
class DiscoverTopologyResponse:
    """Only the standalone answer exists (§1)."""
    req_id: int


def encode_produce_response(req_id, codes):
    """Frame of a Produce (or ProduceWithSeqnum) response: always msgId 0x01."""
    return frame(PRODUCE, _U32.pack(req_id) + bytes(codes))


def _entry_header(entry):
    flags = entry.flags
    if flags == FETCH_OK:
        return _ENTRY_DATA.pack(entry.partition, flags, entry.base_seq, entry.hw_mark,
                                entry.chunk_len)
    if flags == FETCH_SPARSE:
        return _ENTRY_SPARSE.pack(entry.partition, flags, entry.hw_mark, entry.chunk_len)
    if flags == FETCH_BOUNDARY:
        return _ENTRY_BOUNDARY.pack(entry.partition, flags, 0, entry.hw_mark, 0,
                                    entry.first_avail)
    return _ENTRY_ERROR.pack(entry.partition, flags)


def encode_consume_response(req_id, topics):
    """A Consume response as a list of byte strings (frame header, header,
    then every chunk), for ``writeSequence``: a chunk of stored bundles is
    never copied to prepend the header.

    ``topics``: ``ConsumeTopicResult``s whose entries carry ``chunk`` as a
    list of byte strings and ``chunk_len`` as their total size.
    """
    head = [_U32.pack(req_id), _U8.pack(len(topics))]
    chunks = []
    body = 0
    for topic in topics:
        head.append(_str8(topic.name))
        head.append(_U8.pack(topic.requested))
        if topic.entries is None:
            head.append(_U16.pack(UNKNOWN_TOPIC_MARK))
            continue
        for entry in topic.entries:
            head.append(_entry_header(entry))
            if entry.chunk_len and entry.flags in (FETCH_OK, FETCH_SPARSE):
                chunks.extend(entry.chunk)
                body += entry.chunk_len
    header = b"".join(head)
    return [FRAME_HEADER.pack(CONSUME, 4 + len(header) + body) + _U32.pack(len(header)),
            header] + chunks


def encode_response(resp):
    """The complete frame for a response object."""
    kind = type(resp)
    if kind is ProduceResponse:
        return encode_produce_response(resp.req_id, resp.codes)
    if kind is ConsumeResponse:
        topics = tuple(ConsumeTopicResult(t.name, t.requested, None if t.entries is None else
                                          tuple(_as_parts(e) for e in t.entries))
                       for t in resp.topics)
        return b"".join(encode_consume_response(resp.req_id, topics))
    if kind is DiscoverPartitionsResponse:
        out = [_U32.pack(resp.req_id), _str8(resp.topic), _U16.pack(len(resp.partitions))]
        for p in resp.partitions:
            out.append(_SEQ_PAIR.pack(p.first_avail, p.hw_mark))
            if p.first_avail == U64_MAX and p.hw_mark == U64_MAX:
                out.append(_U8.pack(p.reason or 0))
        return frame(DISCOVER_PARTITIONS, b"".join(out))
    if kind is CreateTopicResponse:
        return frame(CREATE_TOPIC, _U32.pack(resp.req_id) + _str8(resp.topic) +
                     _U8.pack(resp.error))
    if kind is ReloadConfResponse:
        return frame(RELOAD_CONF, _U32.pack(resp.req_id) + _str8(resp.topic) +
                     _U16.pack(resp.partition) + _U8.pack(resp.error))
    if kind is StatusResponse:
        return frame(STATUS, _STATUS.pack(
            resp.req_id, resp.global_flags, resp.cluster_aware, resp.topics, resp.partitions,
            resp.open_partitions, resp.open_partitions_time, resp.startup_ts, resp.version))
    if kind is DiscoverTopicsResponse:
        out = [_DISCOVER_TOPICS_HEAD.pack(resp.req_id, len(resp.topics), resp.cluster_aware)]
        for t in resp.topics:
            out.append(_str8(t.name) + _TOPIC_ENTRY_TAIL.pack(t.enabled, t.partitions))
        return frame(DISCOVER_TOPICS, b"".join(out))
    if kind is DiscoverTopologyResponse:
        return frame(DISCOVER_TOPOLOGY, _U32.pack(resp.req_id) + _U16.pack(STANDALONE))
    raise TypeError(f"not a TANK response: {resp!r}")


def _as_parts(entry):
    """A decoded entry (chunk as bytes) in the server's list-of-parts form."""
    chunk = entry.chunk if isinstance(entry.chunk, (bytes, bytearray)) else b"".join(entry.chunk)
    return ConsumeEntry(entry.partition, entry.flags, entry.base_seq, entry.hw_mark,
                        entry.first_avail, [chunk] if chunk else [], len(chunk))


def _decode_consume_response(r):
    header_len = r.u32()
    header_end = r.pos + header_len
    if header_end > r.end:
        raise _Short("header longer than the payload")
    req_id = r.u32()
    topics = []
    pending = []
    for _ in range(r.u8()):
        name = r.str8()
        requested = r.u8()
        if requested and r.end - r.pos >= 2 and _U16.unpack_from(r.buf, r.pos)[0] == \
                UNKNOWN_TOPIC_MARK:
            r.pos += 2
            topics.append(ConsumeTopicResult(name, requested, None))
            continue
        entries = []
        for _ in range(requested):
            partition, flags = r.unpack(_ENTRY_ERROR)
            if flags == FETCH_SPARSE:
                hw_mark, chunk_len = r.unpack(_SPARSE_TAIL)
                entries.append([partition, flags, None, hw_mark, 0, chunk_len])
            elif flags == FETCH_BOUNDARY:
                _, hw_mark, _, first_avail = r.unpack(_BOUNDARY_TAIL)
                entries.append([partition, flags, None, hw_mark, first_avail, 0])
            elif flags in (FETCH_UNKNOWN_PARTITION, FETCH_SYSTEM_ERROR):
                entries.append([partition, flags, None, 0, 0, 0])
            elif flags == FETCH_OK:
                base_seq, hw_mark, chunk_len = r.unpack(_DATA_TAIL)
                entries.append([partition, flags, base_seq, hw_mark, 0, chunk_len])
            else:
                raise _Short(f"errorOrFlags {flags:#04x} is not a TANK 4.0 value")
        topics.append((name, requested, entries))
        pending.append(entries)
    if r.pos != header_end:
        raise _Short("headerLen disagrees with the header")
    out = []
    for topic in topics:
        if isinstance(topic, ConsumeTopicResult):
            out.append(topic)
            continue
        name, requested, entries = topic
        done = []
        for partition, flags, base_seq, hw_mark, first_avail, chunk_len in entries:
            chunk = r.take(chunk_len) if chunk_len else b""
            done.append(ConsumeEntry(partition, flags, base_seq, hw_mark, first_avail, chunk,
                                     chunk_len))
        out.append(ConsumeTopicResult(name, requested, tuple(done)))
    if r.rest():
        raise _Short("bytes after the last chunk")
    return ConsumeResponse(req_id, tuple(out))


def _decode_discover_partitions_response(r):
    req_id = r.u32()
    topic = r.str8()
    parts = []
    for _ in range(r.u16()):
        first, hw = r.unpack(_SEQ_PAIR)
        reason = r.u8() if first == U64_MAX and hw == U64_MAX else None
        parts.append(PartitionSeqs(first, hw, reason))
    return DiscoverPartitionsResponse(req_id, topic, tuple(parts))


def _decode_status_response(r):
    (req_id, global_flags, cluster_aware, topics, partitions, open_partitions,
     open_time, startup, version) = r.unpack(_STATUS)
    return StatusResponse(req_id, topics, partitions, open_partitions, startup, version,
                          global_flags, cluster_aware, open_time)


def _decode_discover_topics_response(r):
    req_id, count, cluster_aware = r.unpack(_DISCOVER_TOPICS_HEAD)
    topics = []
    for _ in range(count):
        name = r.str8()
        enabled, partitions = r.unpack(_TOPIC_ENTRY_TAIL)
        topics.append(TopicSummary(name, partitions, enabled))
    return DiscoverTopicsResponse(req_id, tuple(topics), cluster_aware)


def _decode_topology_response(r):
    req_id = r.u32()
    nodes = r.u16()
    if nodes != STANDALONE:
        raise _Short("a cluster topology (this client knows standalone brokers only)")
    return DiscoverTopologyResponse(req_id)


_RESPONSE_DECODERS = {
    PRODUCE: lambda r: ProduceResponse(r.u32(), r.take(r.rest())),
    CONSUME: _decode_consume_response,
    DISCOVER_PARTITIONS: _decode_discover_partitions_response,
    CREATE_TOPIC: lambda r: CreateTopicResponse(r.u32(), r.str8(), r.u8()),
    RELOAD_CONF: lambda r: ReloadConfResponse(r.u32(), r.str8(), r.u16(), r.u8()),
    STATUS: _decode_status_response,
    DISCOVER_TOPICS: _decode_discover_topics_response,
    DISCOVER_TOPOLOGY: _decode_topology_response,
}


def decode_response(msg_id, payload):
    """The response in one frame (not a Ping: the caller skips those);
    raises ``TankDecodeError``."""
    decoder = _RESPONSE_DECODERS.get(msg_id)
    if decoder is None:
        raise TankDecodeError(f"unexpected response message id {msg_id:#04x}")
    try:
        return decoder(_Reader(payload))
    except _Short as e:
        raise TankDecodeError(f"malformed response {msg_id:#04x}: {e}") from None


def response_req_id(payload, msg_id):
    """The reqId of a response payload, for matching before decoding. A
    Consume response puts it after ``headerLen``."""
    pos = 4 if msg_id == CONSUME else 0
    if len(payload) < pos + 4:
        raise TankDecodeError("response too short for a reqId")
    return _U32.unpack_from(payload, pos)[0]


def produce_results(topics, codes):
    """``{(topic, partition): code}`` from a Produce request's topics (as
    ``(name, [partition, ...])`` pairs in request order) and the response's
    flat codes: 0xff/0xfe stand for every partition of their topic. A
    partition named twice keeps the worse (non-zero) code. Raises
    ``TankDecodeError`` if the codes do not fit the request."""
    out = {}
    pos = 0
    for name, partitions in topics:
        if pos >= len(codes):
            raise TankDecodeError("produce response shorter than the request")
        if codes[pos] in TOPIC_CODES:
            for p in partitions:
                out[(name, p)] = codes[pos]
            pos += 1
            continue
        if pos + len(partitions) > len(codes):
            raise TankDecodeError("produce response shorter than the request")
        for p in partitions:
            out[(name, p)] = out.get((name, p)) or codes[pos]
            pos += 1
    if pos != len(codes):
        raise TankDecodeError("produce response longer than the request")
    return out
