"""Kafka 0.8.2 / 0.9 wire format: bytes <-> request and response objects,
and message sets (protocols/kafka.md §2). Pure: no Twisted, no I/O.

Every API is described once, as a schema per version (a list of named,
typed fields); one small engine reads and writes them all, in both
directions, so the server's decoders and the blocking client's encoders
cannot drift apart, and the fuzz tests cover both. Nested arrays are
tuples in field order, e.g. a Produce request's ``topics`` is
``((name, ((partition, message_set), ...)), ...)``.

Malformed requests raise ``KafkaDecodeError`` (the server closes the
connection: the 0.8 protocol has no generic error body); an API key or
version the gateway does not speak raises ``UnsupportedRequest``, which
carries the header fields for the log line.

Message sets are the heavy part. ``read_produced`` validates a produced
set completely (magic, CRC, framing, codec) and decides how it is stored:
a set of plain magic-0 messages — what 0.8 clients send, and what every
compressed magic-0 wrapper holds inside — is stored as it is, under
``KAFKA_MESSAGE_SET``, so a Kafka fetch only rewrites each entry's 8-byte
offset (the CRC does not cover it). Magic-1 messages carry per-record
timestamps that magic 0 cannot hold, and Fetch v0 and v1 answer magic 0
(§1), so they are stored as columns in the neutral format, like any other
dialect's records. ``message_set_for`` builds a fetch answer from stored
batches of any format: magic 0, or magic 1 with timestamps for Fetch v2.
"""
import gzip
import struct
import zlib
from collections import namedtuple

import cramjam
import lz4.frame
import xxhash

from gateway.records import KAFKA_MESSAGE_SET, Records

# -- API keys, versions and error codes -------------------------------------------------

PRODUCE = 0
FETCH = 1
LIST_OFFSETS = 2
METADATA = 3
OFFSET_COMMIT = 8
OFFSET_FETCH = 9
GROUP_COORDINATOR = 10
JOIN_GROUP = 11
HEARTBEAT = 12
LEAVE_GROUP = 13
SYNC_GROUP = 14
DESCRIBE_GROUPS = 15
LIST_GROUPS = 16
API_VERSIONS = 18

#: api key -> (min version, max version) the gateway advertises (§2.1); ApiVersions
#: answers every version > 0 too, with a v0 body and UNSUPPORTED_VERSION. One
#: more version is answered without being advertised: Fetch v2 (Kafka
#: 0.10's), whose answers carry magic-1 messages with timestamps. The Spark
#: data source asks for it by name, since "keys and timestamps survive"
#: (DESIGN) and magic 0 has no timestamp. It stays out of ApiVersions because
#: the negotiating clients would then move to it (librdkafka fetches with the
#: highest version offered) and away from the Fetch v1 / magic-0 behaviour the
#: interop checklist pins; a client pinned to 0.10 without probing gets
#: answers instead of a closed connection.
SUPPORTED = {
    PRODUCE: (0, 1), FETCH: (0, 1), LIST_OFFSETS: (0, 0), METADATA: (0, 0),
    OFFSET_COMMIT: (0, 2), OFFSET_FETCH: (0, 1), GROUP_COORDINATOR: (0, 0),
    JOIN_GROUP: (0, 0), HEARTBEAT: (0, 0), LEAVE_GROUP: (0, 0), SYNC_GROUP: (0, 0),
    DESCRIBE_GROUPS: (0, 0), LIST_GROUPS: (0, 0), API_VERSIONS: (0, 0),
}

NONE = 0
UNKNOWN = -1
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
MESSAGE_SIZE_TOO_LARGE = 10
OFFSET_METADATA_TOO_LARGE = 12
GROUP_COORDINATOR_NOT_AVAILABLE = 15
INVALID_TOPIC = 17
INVALID_REQUIRED_ACKS = 21
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
INVALID_GROUP_ID = 24
UNKNOWN_MEMBER_ID = 25
INVALID_SESSION_TIMEOUT = 26
REBALANCE_IN_PROGRESS = 27
TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
UNSUPPORTED_VERSION = 35

#: ListOffsets times
LATEST = -1
EARLIEST = -2

#: message attributes: the codec bits, and (magic 1) LogAppendTime
CODEC_MASK = 0x07
CODEC_NONE = 0
CODEC_GZIP = 1
CODEC_SNAPPY = 2
CODEC_LZ4 = 3
TIMESTAMP_LOG_APPEND = 0x08


class KafkaDecodeError(Exception):
    """Bytes that are not a well-formed request or response."""


class UnsupportedRequest(Exception):
    """A well-framed request whose (api key, version) the gateway does not
    speak; it carries the header for the log line."""

    def __init__(self, api_key, api_version, correlation_id, client_id):
        super().__init__(f"unsupported api key {api_key} version {api_version}")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.client_id = client_id


class CorruptMessage(Exception):
    """A produced message set that must not be stored (error 2)."""


# -- primitive types ----------------------------------------------------------------------

class _Int:
    __slots__ = ("struct", "size")

    def __init__(self, fmt):
        self.struct = struct.Struct(fmt)
        self.size = self.struct.size

    def read(self, buf, pos):
        end = pos + self.size
        if end > len(buf):
            raise KafkaDecodeError("truncated integer")
        return self.struct.unpack_from(buf, pos)[0], end

    def write(self, value, out):
        out.append(self.struct.pack(value))


INT8 = _Int(">b")
INT16 = _Int(">h")
INT32 = _Int(">i")
INT64 = _Int(">q")
_I16 = INT16.struct
_I32 = INT32.struct
_I64 = INT64.struct


class _Sized:
    """A length-prefixed field: ``int32`` length + data (bytes) by default.
    ``null`` says what length -1 means: ``None`` (nullable), a value to read
    it as (``""``, ``b""``), or malformed (``False``)."""

    __slots__ = ("null",)
    length = None       # INT32, set below the class
    what = "bytes"

    def __init__(self, null):
        self.null = null

    def read(self, buf, pos):
        n, pos = self.length.read(buf, pos)
        if n < 0:
            if n == -1 and self.null is not False:
                return self.null, pos
            raise KafkaDecodeError(f"bad {self.what} length {n}")
        end = pos + n
        if end > len(buf):
            raise KafkaDecodeError(f"truncated {self.what}")
        return self.convert(bytes(buf[pos:end])), end

    def convert(self, data):
        return data

    def encode(self, value):
        return value

    def write(self, value, out):
        if value is None:
            out.append(self.length.struct.pack(-1))
            return
        data = self.encode(value)
        out.append(self.length.struct.pack(len(data)))
        out.append(data)


class _String(_Sized):
    """int16 length + UTF-8."""

    __slots__ = ()
    what = "string"

    def convert(self, data):
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise KafkaDecodeError("string is not UTF-8") from None

    def encode(self, value):
        return value.encode("utf-8")


_Sized.length = INT32
_String.length = INT16

STRING = _String(False)
NULLABLE_STRING = _String(None)
#: commit metadata: null is read as ""
STRING_OR_EMPTY = _String("")
#: the group APIs' metadata and assignments: null is read as empty
BYTES = _Sized(b"")
#: a message set: ``message_set_size`` and the entries, never null
MESSAGE_SET = _Sized(False)


class _Array:
    __slots__ = ("item",)

    def __init__(self, item):
        self.item = item

    def read(self, buf, pos):
        n, pos = INT32.read(buf, pos)
        if n < 0 or n > len(buf) - pos:
            # Every item takes at least one byte: a larger count is a lie.
            raise KafkaDecodeError(f"bad array count {n}")
        read = self.item.read
        items = []
        for _ in range(n):
            value, pos = read(buf, pos)
            items.append(value)
        return tuple(items), pos

    def write(self, value, out):
        out.append(_I32.pack(len(value)))
        write = self.item.write
        for item in value:
            write(item, out)


class _Tuple:
    """Several fields in a row, read as a tuple (an array's item)."""

    __slots__ = ("fields",)

    def __init__(self, *fields):
        self.fields = fields

    def read(self, buf, pos):
        values = []
        for field in self.fields:
            value, pos = field.read(buf, pos)
            values.append(value)
        return tuple(values), pos

    def write(self, value, out):
        if len(value) != len(self.fields):
            raise ValueError(f"expected {len(self.fields)} fields, got {len(value)}")
        for field, item in zip(self.fields, value):
            field.write(item, out)


def ARRAY(*fields):
    return _Array(fields[0] if len(fields) == 1 else _Tuple(*fields))


# -- API schemas ---------------------------------------------------------------------------

def _body(name, fields, **defaults):
    """A body class; fields that some versions lack come last, with defaults."""
    names = fields.split()
    return namedtuple(name, names, defaults=[defaults[f] for f in names[len(names) - len(defaults):]])


ProduceRequest = _body("ProduceRequest", "acks timeout_ms topics")
FetchRequest = _body("FetchRequest", "replica_id max_wait_ms min_bytes topics")
ListOffsetsRequest = _body("ListOffsetsRequest", "replica_id topics")
MetadataRequest = _body("MetadataRequest", "topics")
#: ``topics`` partitions: v0/v2 ``(partition, offset, metadata)``, v1
#: ``(partition, offset, timestamp, metadata)``: metadata is always last
OffsetCommitRequest = _body("OffsetCommitRequest",
                            "group_id topics generation_id member_id retention_time_ms",
                            generation_id=-1, member_id="", retention_time_ms=-1)
OffsetFetchRequest = _body("OffsetFetchRequest", "group_id topics")
GroupCoordinatorRequest = _body("GroupCoordinatorRequest", "group_id")
JoinGroupRequest = _body("JoinGroupRequest",
                         "group_id session_timeout_ms member_id protocol_type protocols")
HeartbeatRequest = _body("HeartbeatRequest", "group_id generation_id member_id")
LeaveGroupRequest = _body("LeaveGroupRequest", "group_id member_id")
SyncGroupRequest = _body("SyncGroupRequest", "group_id generation_id member_id assignments")
DescribeGroupsRequest = _body("DescribeGroupsRequest", "groups")
ListGroupsRequest = _body("ListGroupsRequest", "")
ApiVersionsRequest = _body("ApiVersionsRequest", "")

ProduceResponse = _body("ProduceResponse", "topics throttle_time_ms", throttle_time_ms=0)
FetchResponse = _body("FetchResponse", "topics throttle_time_ms", throttle_time_ms=0)
ListOffsetsResponse = _body("ListOffsetsResponse", "topics")
MetadataResponse = _body("MetadataResponse", "brokers topics")
OffsetCommitResponse = _body("OffsetCommitResponse", "topics")
OffsetFetchResponse = _body("OffsetFetchResponse", "topics")
GroupCoordinatorResponse = _body("GroupCoordinatorResponse", "error node_id host port")
JoinGroupResponse = _body("JoinGroupResponse",
                          "error generation_id protocol leader_id member_id members")
HeartbeatResponse = _body("HeartbeatResponse", "error")
LeaveGroupResponse = _body("LeaveGroupResponse", "error")
SyncGroupResponse = _body("SyncGroupResponse", "error assignment")
DescribeGroupsResponse = _body("DescribeGroupsResponse", "groups")
ListGroupsResponse = _body("ListGroupsResponse", "error groups")
ApiVersionsResponse = _body("ApiVersionsResponse", "error api_versions")

_PRODUCE_REQ = [("acks", INT16), ("timeout_ms", INT32),
                ("topics", ARRAY(STRING, ARRAY(INT32, MESSAGE_SET)))]
_FETCH_REQ = [("replica_id", INT32), ("max_wait_ms", INT32), ("min_bytes", INT32),
              ("topics", ARRAY(STRING, ARRAY(INT32, INT64, INT32)))]
_COMMIT_V0_PARTS = ARRAY(STRING, ARRAY(INT32, INT64, STRING_OR_EMPTY))
_OFFSET_FETCH_REQ = [("group_id", STRING), ("topics", ARRAY(STRING, ARRAY(INT32)))]

#: (api key, version) -> (body class, [(field, type)])
REQUESTS = {
    (PRODUCE, 0): (ProduceRequest, _PRODUCE_REQ),
    (PRODUCE, 1): (ProduceRequest, _PRODUCE_REQ),
    (FETCH, 0): (FetchRequest, _FETCH_REQ),
    (FETCH, 1): (FetchRequest, _FETCH_REQ),
    (FETCH, 2): (FetchRequest, _FETCH_REQ),
    (LIST_OFFSETS, 0): (ListOffsetsRequest, [
        ("replica_id", INT32), ("topics", ARRAY(STRING, ARRAY(INT32, INT64, INT32)))]),
    (METADATA, 0): (MetadataRequest, [("topics", ARRAY(STRING))]),
    (OFFSET_COMMIT, 0): (OffsetCommitRequest, [
        ("group_id", STRING), ("topics", _COMMIT_V0_PARTS)]),
    (OFFSET_COMMIT, 1): (OffsetCommitRequest, [
        ("group_id", STRING), ("generation_id", INT32), ("member_id", STRING),
        ("topics", ARRAY(STRING, ARRAY(INT32, INT64, INT64, STRING_OR_EMPTY)))]),
    (OFFSET_COMMIT, 2): (OffsetCommitRequest, [
        ("group_id", STRING), ("generation_id", INT32), ("member_id", STRING),
        ("retention_time_ms", INT64), ("topics", _COMMIT_V0_PARTS)]),
    (OFFSET_FETCH, 0): (OffsetFetchRequest, _OFFSET_FETCH_REQ),
    (OFFSET_FETCH, 1): (OffsetFetchRequest, _OFFSET_FETCH_REQ),
    (GROUP_COORDINATOR, 0): (GroupCoordinatorRequest, [("group_id", STRING)]),
    (JOIN_GROUP, 0): (JoinGroupRequest, [
        ("group_id", STRING), ("session_timeout_ms", INT32), ("member_id", STRING),
        ("protocol_type", STRING), ("protocols", ARRAY(STRING, BYTES))]),
    (HEARTBEAT, 0): (HeartbeatRequest, [
        ("group_id", STRING), ("generation_id", INT32), ("member_id", STRING)]),
    (LEAVE_GROUP, 0): (LeaveGroupRequest, [("group_id", STRING), ("member_id", STRING)]),
    (SYNC_GROUP, 0): (SyncGroupRequest, [
        ("group_id", STRING), ("generation_id", INT32), ("member_id", STRING),
        ("assignments", ARRAY(STRING, BYTES))]),
    (DESCRIBE_GROUPS, 0): (DescribeGroupsRequest, [("groups", ARRAY(STRING))]),
    (LIST_GROUPS, 0): (ListGroupsRequest, []),
    (API_VERSIONS, 0): (ApiVersionsRequest, []),
}

_PRODUCE_RESP = ("topics", ARRAY(STRING, ARRAY(INT32, INT16, INT64)))
_FETCH_RESP = ("topics", ARRAY(STRING, ARRAY(INT32, INT16, INT64, MESSAGE_SET)))
_COMMIT_RESP = [("topics", ARRAY(STRING, ARRAY(INT32, INT16)))]
_OFFSET_FETCH_RESP = [("topics", ARRAY(STRING, ARRAY(INT32, INT64, STRING_OR_EMPTY, INT16)))]
_API_VERSIONS_RESP = [("error", INT16), ("api_versions", ARRAY(INT16, INT16, INT16))]

RESPONSES = {
    (PRODUCE, 0): (ProduceResponse, [_PRODUCE_RESP]),
    (PRODUCE, 1): (ProduceResponse, [_PRODUCE_RESP, ("throttle_time_ms", INT32)]),
    (FETCH, 0): (FetchResponse, [_FETCH_RESP]),
    (FETCH, 1): (FetchResponse, [("throttle_time_ms", INT32), _FETCH_RESP]),
    (FETCH, 2): (FetchResponse, [("throttle_time_ms", INT32), _FETCH_RESP]),
    (LIST_OFFSETS, 0): (ListOffsetsResponse, [
        ("topics", ARRAY(STRING, ARRAY(INT32, INT16, ARRAY(INT64))))]),
    (METADATA, 0): (MetadataResponse, [
        ("brokers", ARRAY(INT32, STRING, INT32)),
        ("topics", ARRAY(INT16, STRING, ARRAY(INT16, INT32, INT32, ARRAY(INT32),
                                              ARRAY(INT32))))]),
    (OFFSET_COMMIT, 0): (OffsetCommitResponse, _COMMIT_RESP),
    (OFFSET_COMMIT, 1): (OffsetCommitResponse, _COMMIT_RESP),
    (OFFSET_COMMIT, 2): (OffsetCommitResponse, _COMMIT_RESP),
    (OFFSET_FETCH, 0): (OffsetFetchResponse, _OFFSET_FETCH_RESP),
    (OFFSET_FETCH, 1): (OffsetFetchResponse, _OFFSET_FETCH_RESP),
    (GROUP_COORDINATOR, 0): (GroupCoordinatorResponse, [
        ("error", INT16), ("node_id", INT32), ("host", STRING), ("port", INT32)]),
    (JOIN_GROUP, 0): (JoinGroupResponse, [
        ("error", INT16), ("generation_id", INT32), ("protocol", STRING),
        ("leader_id", STRING), ("member_id", STRING), ("members", ARRAY(STRING, BYTES))]),
    (HEARTBEAT, 0): (HeartbeatResponse, [("error", INT16)]),
    (LEAVE_GROUP, 0): (LeaveGroupResponse, [("error", INT16)]),
    (SYNC_GROUP, 0): (SyncGroupResponse, [("error", INT16), ("assignment", BYTES)]),
    (DESCRIBE_GROUPS, 0): (DescribeGroupsResponse, [
        ("groups", ARRAY(INT16, STRING, STRING, STRING, STRING,
                         ARRAY(STRING, STRING, STRING, BYTES, BYTES)))]),
    (LIST_GROUPS, 0): (ListGroupsResponse, [
        ("error", INT16), ("groups", ARRAY(STRING, STRING))]),
    (API_VERSIONS, 0): (ApiVersionsResponse, _API_VERSIONS_RESP),
}


def _read_body(cls, schema, buf, pos):
    values = {}
    for name, kind in schema:
        values[name], pos = kind.read(buf, pos)
    return cls(**values), pos


def _write_body(schema, body, out):
    for name, kind in schema:
        kind.write(getattr(body, name), out)


# -- requests and responses ------------------------------------------------------------------

Request = namedtuple("Request", "api_key api_version correlation_id client_id body")

_HEADER = struct.Struct(">hhi")
_SIZE = struct.Struct(">i")


def decode_request(frame):
    """Decode one request frame (without its size prefix) into a ``Request``.

    Bytes after a fully parsed body are ignored (§2). ApiVersions of any
    version > 0 is read as far as its header only: its flexible body is
    not parsed, since the answer is the v0 body with UNSUPPORTED_VERSION.
    """
    try:
        api_key, api_version, correlation_id = _HEADER.unpack_from(frame, 0)
    except struct.error:
        raise KafkaDecodeError("truncated request header") from None
    try:
        client_id, pos = NULLABLE_STRING.read(frame, _HEADER.size)
    except KafkaDecodeError:
        if api_key == API_VERSIONS and api_version > 0:
            return Request(api_key, api_version, correlation_id, None, ApiVersionsRequest())
        raise
    if api_key == API_VERSIONS and api_version > 0:
        return Request(api_key, api_version, correlation_id, client_id, ApiVersionsRequest())
    spec = REQUESTS.get((api_key, api_version))
    if spec is None:
        raise UnsupportedRequest(api_key, api_version, correlation_id, client_id)
    body, _ = _read_body(spec[0], spec[1], frame, pos)
    return Request(api_key, api_version, correlation_id, client_id, body)


def encode_request(api_key, api_version, correlation_id, client_id, body):
    """One request frame, size prefix included (for clients and tests)."""
    out = [b"", _HEADER.pack(api_key, api_version, correlation_id)]
    NULLABLE_STRING.write(client_id, out)
    _write_body(REQUESTS[(api_key, api_version)][1], body, out)
    return _framed(out)


def encode_response(api_key, api_version, correlation_id, body):
    """One response frame, size prefix included. The header is the
    correlation id alone, for every API (there is no ResponseVersion)."""
    out = [b"", _I32.pack(correlation_id)]
    _write_body(RESPONSES[(api_key, api_version)][1], body, out)
    return _framed(out)


def _framed(out):
    out[0] = _SIZE.pack(sum(map(len, out)))
    return b"".join(out)


def decode_response(api_key, api_version, frame):
    """``(correlation_id, body)`` of one response frame (without its size
    prefix) to a request of this key and version."""
    correlation_id, pos = INT32.read(frame, 0)
    cls, schema = RESPONSES[(api_key, api_version)]
    body, _ = _read_body(cls, schema, frame, pos)
    return correlation_id, body


def api_versions_body(error=NONE):
    """The ApiVersions answer: exactly what the gateway implements."""
    return ApiVersionsResponse(error, tuple((key, low, high)
                                            for key, (low, high) in sorted(SUPPORTED.items())))


# -- message sets: produce --------------------------------------------------------------------

#: offset, message_size, crc, magic, attributes
_ENTRY = struct.Struct(">qiIBB")
#: the same and a magic-0 message's key length
_HEAD = struct.Struct(">qiIBBi")
#: the smallest valid entry: a magic-0 message with empty key and value
_SMALLEST_ENTRY = 12 + 14
#: an entry's bytes before its key: offset, size, crc, magic, attributes (+ timestamp)
_PREFIX = {0: 18, 1: 26}
#: the smallest message_size per magic: crc, magic, attributes, (timestamp), key, value lengths
_MIN_SIZE = {0: 14, 1: 22}
_MAGIC0_HEAD = b"\x00\x00"
_NULL = b"\xff\xff\xff\xff"


class ProducedSet:
    """A validated produced message set and how to store it.

    ``payload`` is a plain magic-0 message set (offsets meaningless) to
    store as ``KAFKA_MESSAGE_SET``; or it is None and ``keys``, ``values``
    and ``timestamps`` are columns for the neutral format. ``count``,
    ``value_bytes`` and ``max_value`` are the facts the bus needs.
    """

    __slots__ = ("payload", "count", "value_bytes", "max_value", "keys", "values",
                 "timestamps")

    def __init__(self, payload, count, value_bytes, max_value, keys=None, values=None,
                 timestamps=None):
        self.payload = payload
        self.count = count
        self.value_bytes = value_bytes
        self.max_value = max_value
        self.keys = keys
        self.values = values
        self.timestamps = timestamps


def read_produced(data, now_ms, max_inflated):
    """Validate a produced message set; returns a ``ProducedSet``.

    Raises ``CorruptMessage`` for anything §2.2 calls corrupt: a CRC
    mismatch, a bad magic (2 included), an entry cut off or inconsistent
    with its size, a codec other than 0-3, an undecodable or empty
    compressed payload, nested compression, an inner magic other than the
    wrapper's, or compressed payloads that inflate beyond ``max_inflated``
    bytes in all (the bound holds for a set of many small bombs too).
    Magic-1 timestamps of -1 (and LogAppendTime wrappers) get ``now_ms``.
    """
    clean = _scan_clean(data)
    if clean is not None:
        return ProducedSet(data, *clean)
    records = []     # (magic, key, value, timestamp)
    raw = []         # positions in ``records`` where clean magic-0 inner sets go
    budget = max_inflated
    pos = 0
    end = len(data)
    while pos < end:
        pos, magic, attributes, timestamp, key, value = _read_message(data, pos)
        codec = attributes & CODEC_MASK
        if codec == CODEC_NONE:
            records.append((magic, key, value, _timestamp(magic, attributes, timestamp,
                                                          now_ms)))
            continue
        if value is None:
            raise CorruptMessage("compressed message without a value")
        inner = _inflate(codec, value, budget)
        budget -= len(inner)
        if magic == 0:
            stats = _scan_clean(inner)
            if stats is not None and stats[0]:
                raw.append((len(records), inner, stats))
                continue
        count = 0
        log_append = magic == 1 and attributes & TIMESTAMP_LOG_APPEND
        ipos = 0
        while ipos < len(inner):
            ipos, imagic, iattributes, its, ikey, ivalue = _read_message(inner, ipos)
            if imagic != magic:
                raise CorruptMessage(f"magic {imagic} inside a magic {magic} wrapper")
            if iattributes & CODEC_MASK:
                raise CorruptMessage("nested compression")
            records.append((magic, ikey, ivalue, now_ms if log_append else
                            _timestamp(imagic, iattributes, its, now_ms)))
            count += 1
        if not count:
            raise CorruptMessage("empty compressed message")
    if all(r[0] == 0 for r in records):
        return _magic0_set(records, raw)
    return _columns(records, raw, now_ms)


def _timestamp(magic, attributes, timestamp, now_ms):
    if magic == 0 or attributes & TIMESTAMP_LOG_APPEND or timestamp < 0:
        return now_ms
    return timestamp


def _scan_clean(data):
    """``(count, value_bytes, max_value)`` if ``data`` is nothing but plain
    magic-0 messages (no codec, no other attribute bits, a non-null value)
    that can be stored as they are; None at the first message that is not.
    Raises ``CorruptMessage`` as ``read_produced`` does. This is the hot
    loop of every produce: two unpacks and one CRC per message."""
    end = len(data)
    view = memoryview(data)
    head = _HEAD.unpack_from
    length = _I32.unpack_from
    crc32 = zlib.crc32
    pos = count = total = largest = 0
    while pos < end:
        if end - pos < _SMALLEST_ENTRY:
            raise CorruptMessage("truncated message")
        _, size, crc, magic, attributes, key = head(data, pos)
        stop = pos + 12 + size
        if size < 14 or stop > end:
            raise CorruptMessage(f"bad message size {size}")
        if magic > 1:
            raise CorruptMessage(f"unsupported magic {magic}")
        if crc32(view[pos + 16:stop]) != crc:
            raise CorruptMessage("CRC mismatch")
        if magic or attributes:
            return None
        at = pos + 22 + (key if key > 0 else 0)
        if key < -1 or at + 4 > stop:
            raise CorruptMessage("bad key length")
        value = length(data, at)[0]
        if at + 4 + value != stop:
            if value == -1:
                return None
            raise CorruptMessage("value length disagrees with message size")
        count += 1
        total += value
        if value > largest:
            largest = value
        pos = stop
    return count, total, largest


def _read_message(data, pos):
    """Validate the entry at ``pos``; ``(next_pos, magic, attributes,
    timestamp, key, value)`` (timestamp -1 for magic 0; key and value may
    be None)."""
    end = len(data)
    if end - pos < 12:
        raise CorruptMessage("truncated message header")
    size = _I32.unpack_from(data, pos + 8)[0]
    stop = pos + 12 + size
    if size < 14 or stop > end:
        raise CorruptMessage(f"bad message size {size}")
    _, _, crc, magic, attributes = _ENTRY.unpack_from(data, pos)
    if magic > 1:
        raise CorruptMessage(f"unsupported magic {magic}")
    if size < _MIN_SIZE[magic]:
        raise CorruptMessage(f"message size {size} too small for magic {magic}")
    if zlib.crc32(memoryview(data)[pos + 16:stop]) != crc:
        raise CorruptMessage("CRC mismatch")
    if attributes & CODEC_MASK > CODEC_LZ4:
        raise CorruptMessage(f"unknown codec {attributes & CODEC_MASK}")
    timestamp = _I64.unpack_from(data, pos + 18)[0] if magic else -1
    at = pos + _PREFIX[magic]
    key, at = _field(data, at, stop)
    value, at = _field(data, at, stop)
    if at != stop:
        raise CorruptMessage("value length disagrees with message size")
    return stop, magic, attributes, timestamp, key, value


def _field(data, at, stop):
    if at + 4 > stop:
        raise CorruptMessage("truncated message")
    n = _I32.unpack_from(data, at)[0]
    at += 4
    if n < 0:
        if n == -1:
            return None, at
        raise CorruptMessage(f"bad length {n}")
    if at + n > stop:
        raise CorruptMessage("truncated message")
    return bytes(data[at:at + n]), at + n


def _magic0_set(records, raw):
    """The payload to store for magic-0 records, with the clean inner sets
    of compressed wrappers spliced in at their places as they are."""
    parts = []
    count = total = largest = 0
    at = 0
    for index, inner, (n, value_bytes, max_value) in raw + [(len(records), b"", (0, 0, 0))]:
        for _, key, value, _ in records[at:index]:
            value = value or b""
            parts.append(encode_entry(0, key, value))
            count += 1
            total += len(value)
            largest = max(largest, len(value))
        at = index
        parts.append(inner)
        count += n
        total += value_bytes
        largest = max(largest, max_value)
    return ProducedSet(b"".join(parts), count, total, largest)


def _columns(records, raw, now_ms):
    """Neutral columns for a set with magic-1 records (timestamps kept)."""
    keys, values, timestamps = [], [], []
    at = 0
    for index, inner, _ in raw + [(len(records), None, None)]:
        for _, key, value, timestamp in records[at:index]:
            keys.append(key)
            values.append(value or b"")
            timestamps.append(timestamp)
        at = index
        if inner is not None:
            for key, value in iter_stored(inner):
                keys.append(key)
                values.append(value)
                timestamps.append(now_ms)
    lengths = list(map(len, values))
    return ProducedSet(None, len(values), sum(lengths), max(lengths, default=0),
                       keys, values, timestamps)


# -- compression ---------------------------------------------------------------------------

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_LZ4_MAGIC = b"\x04\x22\x4d\x18"


def _inflate(codec, data, limit):
    """Decompress a wrapper's value; CorruptMessage if it is undecodable or
    inflates beyond ``limit`` bytes (a compression bomb is refused before
    it is allocated, wherever the format states the size up front)."""
    try:
        if codec == CODEC_GZIP:
            return _gunzip(data, limit)
        if codec == CODEC_SNAPPY:
            return _unsnappy(data, limit)
        return _unlz4(data, limit)
    except CorruptMessage:
        raise
    except Exception as e:
        raise CorruptMessage(f"undecodable compressed payload: {e}") from None


def _gunzip(data, limit):
    """RFC 1952, possibly several members (Java's GZIPInputStream reads them all)."""
    parts = []
    total = 0
    while data:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        chunk = d.decompress(data, limit + 1 - total)
        total += len(chunk)
        if total > limit:
            raise CorruptMessage(f"gzip payload inflates beyond {limit} bytes")
        if not d.eof:
            raise CorruptMessage("truncated gzip payload")
        parts.append(chunk)
        data = d.unused_data
    return b"".join(parts)


def _unsnappy(data, limit):
    """Xerial framing (kafka-python, the Java client) or one raw block
    (librdkafka, afkak)."""
    if len(data) > 16 and data[:8] == _XERIAL_MAGIC:
        parts = []
        total = 0
        pos = 16
        while pos < len(data):
            if pos + 4 > len(data):
                raise CorruptMessage("truncated xerial block")
            n = _I32.unpack_from(data, pos)[0]
            pos += 4
            if n < 0 or pos + n > len(data):
                raise CorruptMessage("truncated xerial block")
            block = data[pos:pos + n]
            total += _snappy_length(block)
            if total > limit:
                raise CorruptMessage(f"snappy payload inflates beyond {limit} bytes")
            parts.append(bytes(cramjam.snappy.decompress_raw(block)))
            pos += n
        return b"".join(parts)
    if _snappy_length(data) > limit:
        raise CorruptMessage(f"snappy payload inflates beyond {limit} bytes")
    return bytes(cramjam.snappy.decompress_raw(data))


def _snappy_length(block):
    """The uncompressed length a raw snappy block declares (a varint)."""
    result = shift = 0
    for i in range(min(len(block), 5)):
        byte = block[i]
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result
        shift += 7
    raise CorruptMessage("bad snappy length")


def _unlz4(data, limit):
    """An LZ4 frame. Kafka 0.8/0.9 clients compute the header checksum over
    the magic bytes too, which no LZ4 library accepts, so the checksum is
    recomputed and replaced before decoding (for a correct frame this
    changes nothing)."""
    decompressor = lz4.frame.LZ4FrameDecompressor()
    out = decompressor.decompress(fix_lz4_header(data), max_length=limit + 1)
    if len(out) > limit:
        raise CorruptMessage(f"lz4 payload inflates beyond {limit} bytes")
    if not decompressor.eof:
        raise CorruptMessage("truncated lz4 payload")
    return out


def fix_lz4_header(data):
    """The frame with its header checksum (HC) set to the correct value:
    the second byte of xxh32 over FLG .. the last descriptor byte."""
    if len(data) < 7 or data[:4] != _LZ4_MAGIC:
        raise CorruptMessage("not an LZ4 frame")
    flg = data[4]
    end = 6 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0)
    if len(data) <= end:
        raise CorruptMessage("truncated LZ4 frame header")
    hc = (xxhash.xxh32_intdigest(bytes(data[4:end])) >> 8) & 0xFF
    if data[end] == hc:
        return data
    return b"".join((data[:end], bytes((hc,)), data[end + 1:]))


def compress(codec, data, xerial=True, broken_lz4_header=False):
    """Compress an inner message set for a wrapper (clients, tests,
    benchmarks). ``xerial`` frames snappy the way kafka-python does (else
    one raw block, as librdkafka); ``broken_lz4_header`` writes the 0.8/0.9
    header checksum."""
    if codec == CODEC_GZIP:
        return gzip.compress(data)
    if codec == CODEC_SNAPPY:
        block = bytes(cramjam.snappy.compress_raw(data))
        if not xerial:
            return block
        return _XERIAL_MAGIC + _I32.pack(1) + _I32.pack(1) + _I32.pack(len(block)) + block
    if codec == CODEC_LZ4:
        frame = lz4.frame.compress(data, block_linked=False, content_checksum=False,
                                   store_size=False)
        if broken_lz4_header:
            hc = (xxhash.xxh32_intdigest(frame[:6]) >> 8) & 0xFF
            frame = frame[:6] + bytes((hc,)) + frame[7:]
        return frame
    raise ValueError(f"unknown codec {codec}")


# -- message sets: the stored format and fetch -------------------------------------------------

_ENTRY_HEAD = struct.Struct(">qiI")


def encode_entry(offset, key, value, magic=0, attributes=0, timestamp=-1):
    """One message-set entry (offset, size, crc, message)."""
    body = [bytes((magic, attributes))]
    if magic:
        body.append(_I64.pack(timestamp))
    for field in (key, value):
        if field is None:
            body.append(_NULL)
        else:
            body.append(_I32.pack(len(field)))
            body.append(field)
    message = b"".join(body)
    return _ENTRY_HEAD.pack(offset, len(message) + 4, zlib.crc32(message)) + message


def iter_stored(payload):
    """``(key, value)`` of each entry of a stored (validated, plain magic-0) set."""
    length = _I32.unpack_from
    pos = 0
    end = len(payload)
    while pos < end:
        stop = pos + 12 + length(payload, pos + 8)[0]
        key = length(payload, pos + 18)[0]
        at = pos + 22
        if key < 0:
            key = None
        else:
            key, at = payload[at:at + key], at + key
        yield key, payload[at + 4:stop]
        pos = stop


def decode_stored(payload, batch):
    """The format decoder registered for ``KAFKA_MESSAGE_SET``: the records
    of a stored set for every other dialect. Magic 0 has no timestamps, so
    every record has the batch's (the receive time)."""
    keys = []
    values = []
    for key, value in iter_stored(payload):
        keys.append(key)
        values.append(value)
    return Records(batch.base_offset, [batch.first_ts] * len(values), keys, values)


def _serve_stored(payload, base, start, room, first):
    """Entries of a stored set from offset ``start``, with absolute offsets,
    while they fit in ``room`` bytes (``first``: the response is still
    empty, so the first entry goes in whatever its size). Returns
    ``(data, full)``; ``full`` says the room ran out. Only the offset field
    of each entry is rewritten: the CRC does not cover it."""
    buf = bytearray(payload)
    length = _I32.unpack_from
    put = _I64.pack_into
    end = len(buf)
    pos = 0
    offset = base
    while offset < start and pos < end:
        pos += 12 + length(buf, pos + 8)[0]
        offset += 1
    begin = pos
    limit = begin + room
    while pos < end:
        stop = pos + 12 + length(buf, pos + 8)[0]
        if stop > limit and not (first and pos == begin):
            return buf[begin:pos], True
        put(buf, pos, offset)
        offset += 1
        pos = stop
    return (buf[begin:] if begin else buf), False


def _serve_stored_magic1(payload, base, start, room, first, timestamp):
    """``_serve_stored`` for a Fetch v2 answer: each stored magic-0 entry
    becomes a magic-1 entry carrying ``timestamp`` (the batch's receive
    time, which is every record's: magic 0 has none of its own). Only the
    head changes; the key and value bytes follow as stored, under a CRC
    continued from the new head's."""
    lead = b"\x01\x00" + _I64.pack(timestamp)
    lead_crc = zlib.crc32(lead)
    length = _I32.unpack_from
    head = _ENTRY_HEAD.pack
    crc32 = zlib.crc32
    end = len(payload)
    pos = 0
    offset = base
    while offset < start and pos < end:
        pos += 12 + length(payload, pos + 8)[0]
        offset += 1
    parts = []
    append = parts.append
    used = 0
    while pos < end:
        size = length(payload, pos + 8)[0]
        stop = pos + 12 + size
        if used + size + 20 > room and not (first and not parts):
            return b"".join(parts), True
        tail = payload[pos + 18:stop]
        append(head(offset, size + 8, crc32(tail, lead_crc)))
        append(lead)
        append(tail)
        used += size + 20
        offset += 1
        pos = stop
    return b"".join(parts), False


def _encode_records(records, room, first):
    """Magic-0 entries for decoded records (another format), whole ones
    while they fit in ``room``; returns ``(data, full)``. The CRC is
    computed over the message in two steps (head, then value) so that the
    value is never copied before the final join."""
    parts = []
    used = 0
    crc32 = zlib.crc32
    head = _ENTRY_HEAD.pack
    i32 = _I32.pack
    offset = records.base_offset
    keys = records.keys
    for i, value in enumerate(records.values):
        key = keys[i] if keys is not None else None
        if key is None:
            prefix = b"\x00\x00\xff\xff\xff\xff" + i32(len(value))
        else:
            prefix = _MAGIC0_HEAD + i32(len(key)) + key + i32(len(value))
        size = len(prefix) + len(value) + 4
        if used + size + 12 > room and not (first and not parts):
            return b"".join(parts), True
        parts.append(head(offset + i, size, crc32(value, crc32(prefix))))
        parts.append(prefix)
        parts.append(value)
        used += size + 12
    return b"".join(parts), False


def _encode_records_magic1(records, room, first):
    """``_encode_records`` for a Fetch v2 answer: magic-1 entries carrying
    each record's timestamp (CreateTime, attributes 0)."""
    parts = []
    used = 0
    crc32 = zlib.crc32
    head = _ENTRY_HEAD.pack
    i32 = _I32.pack
    i64 = _I64.pack
    offset = records.base_offset
    keys = records.keys
    timestamps = records.timestamps
    for i, value in enumerate(records.values):
        key = keys[i] if keys is not None else None
        if key is None:
            prefix = b"\x01\x00" + i64(timestamps[i]) + b"\xff\xff\xff\xff" + i32(len(value))
        else:
            prefix = b"\x01\x00" + i64(timestamps[i]) + i32(len(key)) + key + i32(len(value))
        size = len(prefix) + len(value) + 4
        if used + size + 12 > room and not (first and not parts):
            return b"".join(parts), True
        parts.append(head(offset + i, size, crc32(value, crc32(prefix))))
        parts.append(prefix)
        parts.append(value)
        used += size + 12
    return b"".join(parts), False


def message_set_for(batches, start, max_bytes, decode, magic=0):
    """The message set a fetch from offset ``start`` answers: uncompressed
    entries with absolute offsets, whole messages only, at most
    ``max_bytes`` of them except that the first message is always whole
    (§1: a client that gets a fragment cannot move on). ``decode`` turns a
    stored batch of another format into ``Records`` (the bus's registry).

    ``magic`` 0 (Fetch v0 and v1) serves stored Kafka sets as they are;
    ``magic`` 1 (Fetch v2) encodes every record with its timestamp, the
    receive time for records that had none."""
    if max_bytes <= 0:
        return b""
    parts = []
    used = 0
    for batch in batches:
        if batch.base_offset + batch.count <= start:
            continue
        if batch.format == KAFKA_MESSAGE_SET and magic:
            data, full = _serve_stored_magic1(batch.payload, batch.base_offset, start,
                                              max_bytes - used, not parts, batch.first_ts)
        elif batch.format == KAFKA_MESSAGE_SET:
            data, full = _serve_stored(batch.payload, batch.base_offset, start,
                                       max_bytes - used, not parts)
        elif magic:
            data, full = _encode_records_magic1(decode(batch).since(start), max_bytes - used,
                                                not parts)
        else:
            data, full = _encode_records(decode(batch).since(start), max_bytes - used,
                                         not parts)
        if data:
            parts.append(data)
            used += len(data)
        if full:
            break
    return b"".join(parts)


# -- message sets: what clients read -------------------------------------------------------------

Message = namedtuple("Message", "offset timestamp key value")


def decode_message_set(data):
    """The messages of a fetched message set, compressed wrappers expanded
    (magic 0: inner offsets absolute; magic 1: relative to the wrapper's,
    which is the last inner message's). A partial entry at the end (a
    broker cuts sets at ``max_bytes``) is dropped. Raises CorruptMessage for
    a CRC mismatch. ``timestamp`` is None for magic 0."""
    messages = []
    pos = 0
    end = len(data)
    while end - pos >= 12:
        size = _I32.unpack_from(data, pos + 8)[0]
        if pos + 12 + size > end:
            break
        offset = _I64.unpack_from(data, pos)[0]
        pos, magic, attributes, timestamp, key, value = _read_message(data, pos)
        codec = attributes & CODEC_MASK
        if codec == CODEC_NONE:
            messages.append(Message(offset, timestamp if magic else None, key, value))
            continue
        inner = decode_message_set(_inflate(codec, value or b"", 1 << 31))
        if magic and inner:
            shift = offset - inner[-1].offset
            inner = [m._replace(offset=m.offset + shift) for m in inner]
        messages.extend(inner)
    return messages


def encode_message_set(records, magic=0, codec=CODEC_NONE, xerial=True,
                       broken_lz4_header=None):
    """A message set to produce. ``records`` are ``(key, value)`` or
    ``(key, value, timestamp)``; with a codec, they go into one wrapper
    (inner offsets 0..n-1: absolute for magic 0 is the broker's business on
    produce, relative for magic 1). ``broken_lz4_header`` defaults to what
    clients do: broken under magic 0, correct under magic 1."""
    entries = []
    for i, record in enumerate(records):
        key, value = record[0], record[1]
        timestamp = record[2] if len(record) > 2 else -1
        entries.append(encode_entry(i, key, value, magic, 0, timestamp))
    inner = b"".join(entries)
    if codec == CODEC_NONE:
        return inner
    if broken_lz4_header is None:
        broken_lz4_header = magic == 0
    wrapped = compress(codec, inner, xerial, broken_lz4_header)
    stamp = max((r[2] for r in records if len(r) > 2), default=-1)
    return encode_entry(len(entries) - 1, None, wrapped, magic, codec, stamp)
