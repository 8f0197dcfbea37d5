"""RustLog codec: payloads <-> request and response objects.

Pure (no Twisted, no I/O) so that it can be fuzzed. It works on frame
*payloads*: the u32 BE length prefix belongs to the transport
(``gateway.framing.FramedProtocol`` on both sides), which also enforces
``MAX_FRAME_BYTES`` before buffering a body.

Two variants share one listener (shared/protocols/rustlog.md):

* **JSON** (primary, §3-§6): the seed's serde-style, externally tagged JSON.
* **binary** (§7): the real RustLog broker's tag-and-fields format.

The variant is chosen per frame by its first byte (``detect_variant``).

Entry points: ``decode_request`` / ``encode_response`` for the server,
``encode_request`` / ``decode_response`` for the client, plus the hot-path
helpers ``encode_json_fetch`` / ``encode_binary_fetch`` and the size
estimators ``json_record_cost`` / ``json_record_size`` / ``binary_record_cost``
that let a server stop a Fetch before its reply outgrows a frame.

Every decoder raises only ``RustLogDecodeError`` for bad input, whatever the
bytes; the fuzz tests hold it to that.
"""
import struct
from dataclasses import dataclass
from typing import Optional, Tuple

import orjson

#: largest payload of one frame, both directions (§2)
MAX_FRAME_BYTES = 10 * 1024 * 1024

JSON = "json"
BINARY = "binary"

# Binary error codes (§7).
FRAME_ERROR = 1
DECODE_ERROR = 2
FETCH_ERROR = 4
COMMIT_FAILED = 5
UNKNOWN_PARTITION = 10
TOPIC_EXISTS = 11
ZERO_PARTITIONS = 12
DESCRIBE_UNKNOWN_TOPIC = 13
DESCRIBE_UNKNOWN_PARTITION = 14
INTERNAL = 500

# Binary tags (§7). Requests and their responses share a tag; 0xFE is only
# ever a response (Error).
TAG_PRODUCE = 0x01
TAG_FETCH = 0x02
TAG_OFFSET_COMMIT = 0x03
TAG_OFFSET_FETCH = 0x04
TAG_CREATE_TOPIC = 0x05
TAG_LIST_TOPICS = 0x06
TAG_DESCRIBE_TOPIC = 0x07
TAG_DESCRIBE_PARTITION = 0x08
TAG_METRICS = 0x09
TAG_ERROR = 0xFE
TAG_PING = 0xFF

U32_MAX = 0xFFFFFFFF
U64_MAX = 0xFFFFFFFFFFFFFFFF

REQUEST_ERROR_PREFIX = "failed to parse request: "
RESPONSE_ERROR_PREFIX = "failed to parse response: "


class RustLogDecodeError(Exception):
    """A payload that is not a valid message.

    ``message`` is the text to send back (JSON: it starts with
    ``failed to parse request: ``), ``code`` the binary error code to use
    (``DECODE_ERROR``; ``FRAME_ERROR`` for an empty frame, which in the binary
    variant closes the connection), and ``variant`` the format the offending
    frame was in: ``"json"``, ``"binary"``, or ``None`` when the frame was
    empty and so showed no variant (§2: answer in the connection's last one).
    """

    def __init__(self, message, code=DECODE_ERROR, variant=None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.variant = variant


# --------------------------------------------------------------------------
# Data model
# --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ProduceRequest:
    topic: str
    partition: int
    records: Tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """``group_id`` is None for "no group": JSON null, a missing field, ""
    and the binary variant's "" all decode to None."""
    topic: str
    partition: int
    offset: int
    max_bytes: int
    group_id: Optional[str] = None


@dataclass(frozen=True, slots=True)
class OffsetCommitRequest:
    topic: str
    partition: int
    group_id: str
    offset: int


@dataclass(frozen=True, slots=True)
class OffsetFetchRequest:
    topic: str
    partition: int
    group_id: str


@dataclass(frozen=True, slots=True)
class CreateTopicRequest:
    topic: str
    partition_count: int


@dataclass(frozen=True, slots=True)
class ListTopicsRequest:
    pass


@dataclass(frozen=True, slots=True)
class DescribeTopicRequest:
    topic: str


@dataclass(frozen=True, slots=True)
class DescribePartitionRequest:
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class MetricsFetchRequest:
    pass


@dataclass(frozen=True, slots=True)
class PingRequest:
    pass


@dataclass(frozen=True, slots=True)
class ProduceResponse:
    """Offsets ``base_offset … base_offset + record_count - 1``.

    Kept as base and count (what the bus returns and what the binary variant
    sends) rather than a list; the JSON variant spells it out as ``offsets``.
    With ``record_count == 0`` the base is meaningless and is sent as 0.
    """
    base_offset: int
    record_count: int

    @property
    def offsets(self):
        return list(range(self.base_offset, self.base_offset + self.record_count))


@dataclass(frozen=True, slots=True)
class FetchResponse:
    """``records`` are ``(offset, payload)`` pairs. The binary variant carries
    no offsets, so there they must be ``next_offset - n … next_offset - 1``."""
    records: Tuple[Tuple[int, bytes], ...]
    next_offset: int


@dataclass(frozen=True, slots=True)
class OffsetCommitResponse:
    success: bool


@dataclass(frozen=True, slots=True)
class OffsetFetchResponse:
    offset: Optional[int]


@dataclass(frozen=True, slots=True)
class CreateTopicResponse:
    success: bool


@dataclass(frozen=True, slots=True)
class ListTopicsResponse:
    """``topics`` are ``(name, partition_count)`` pairs; the encoder sorts
    them by name as §7 requires."""
    topics: Tuple[Tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class DescribeTopicResponse:
    """``partitions`` are ``(partition, high_watermark)`` pairs."""
    topic: str
    partition_count: int
    partitions: Tuple[Tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class DescribePartitionResponse:
    topic: str
    partition: int
    high_watermark: int


@dataclass(frozen=True, slots=True)
class MetricsResponse:
    text: str


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """``code`` is the binary error code; the JSON variant has none (None),
    and the binary encoder sends None as ``INTERNAL``."""
    message: str
    code: Optional[int] = None


@dataclass(frozen=True, slots=True)
class PongResponse:
    pass


# --------------------------------------------------------------------------
# Variant detection
# --------------------------------------------------------------------------

def detect_variant(payload):
    """``"binary"`` if the first byte is a binary request tag (0x01-0x09 or
    0xFF), else ``"json"`` (§2). Only the first byte is looked at, so
    anything that is not a tag, including garbage, goes to the JSON parser
    and gets its parse Error. An empty payload shows no variant; it is
    reported as JSON, but ``decode_request`` rejects it before asking."""
    if payload:
        first = payload[0]
        if 0x01 <= first <= 0x09 or first == 0xFF:
            return BINARY
    return JSON


def decode_request(payload, binary=True):
    """Decode one request payload into ``(variant, request)``.

    ``binary=False`` (the listener has the binary variant off) reads every
    frame as JSON, so a binary frame gets a JSON parse Error.
    Raises ``RustLogDecodeError`` and nothing else.
    """
    if not payload:
        raise RustLogDecodeError(REQUEST_ERROR_PREFIX + "empty frame", FRAME_ERROR, None)
    if binary and detect_variant(payload) == BINARY:
        return BINARY, _decode_binary_request(payload)
    return JSON, _decode_json_request(payload)


def decode_response(payload):
    """Decode one response payload into ``(variant, response)`` (client side).

    A binary response starts with a response tag (0x01-0x09, 0xFE, 0xFF);
    anything else is read as JSON. ``ErrorResponse`` is returned, not raised:
    it is a valid answer. Raises ``RustLogDecodeError`` for a malformed one.
    """
    if not payload:
        raise RustLogDecodeError(RESPONSE_ERROR_PREFIX + "empty frame", FRAME_ERROR, None)
    first = payload[0]
    if 0x01 <= first <= 0x09 or first >= 0xFE:
        return BINARY, _decode_binary_response(payload)
    return JSON, _decode_json_response(payload)


def encode_request(variant, request):
    """Payload for ``request`` in ``variant`` (client side). Raises
    ``ValueError`` for a request the variant cannot express (the binary-only
    requests in JSON) or a field out of its range."""
    return _encode(variant, request, _JSON_REQUEST_ENCODERS, _BINARY_REQUEST_ENCODERS)


def encode_response(variant, response):
    """Payload for ``response`` in ``variant`` (server side). Raises
    ``ValueError`` for a response the variant cannot express or a field out
    of its range (a server bug, never the peer's fault)."""
    return _encode(variant, response, _JSON_RESPONSE_ENCODERS, _BINARY_RESPONSE_ENCODERS)


def _encode(variant, message, json_encoders, binary_encoders):
    if variant == JSON:
        encoder = json_encoders.get(type(message))
    elif variant == BINARY:
        encoder = binary_encoders.get(type(message))
    else:
        raise ValueError(f"unknown variant {variant!r}")
    if encoder is None:
        raise ValueError(f"{type(message).__name__} has no {variant} encoding")
    try:
        return encoder(message)
    except (struct.error, orjson.JSONEncodeError) as e:
        # struct: a number out of its field's range; orjson: an integer past
        # 64 bits or a string with a lone surrogate.
        raise ValueError(f"{type(message).__name__}: cannot encode: {e}") from None


# --------------------------------------------------------------------------
# Fetch reply sizing
# --------------------------------------------------------------------------

#: upper bound of a JSON Fetch reply without its records:
#: ``{"Fetch":{"records":[`` + ``],"next_offset":`` + 20 digits + ``}}``
JSON_FETCH_ENVELOPE_BYTES = 21 + 16 + 20 + 2

#: size of a binary Fetch reply without its records: tag, count, next_offset
BINARY_FETCH_ENVELOPE_BYTES = 1 + 4 + 8

# bytes(range(10)) deleted from a payload leaves the values with >= 2 digits.
_ONE_DIGIT = bytes(range(10))
_TWO_DIGITS_OR_LESS = bytes(range(100))


def json_record_cost(offset, value_len):
    """Upper bound of the JSON bytes one Fetch record adds to a reply,
    separating comma included: ``{"offset":O,"payload":[...]}``.

    Counts 4 bytes per value byte (``255,``), so it needs only the length;
    a server sums it to stop before the reply could pass
    ``MAX_FRAME_BYTES``. It overestimates payloads of small bytes by up to
    2x; ``json_record_size`` is exact where that matters.
    """
    return 25 + len(str(offset)) + 4 * value_len


def json_record_size(offset, payload):
    """Exact JSON bytes of one Fetch record, plus one separating comma
    (``payload`` must be ``bytes``).

    Digits are counted with two ``bytes.translate`` deletions (values >= 10
    and >= 100), which run in C, so even a multi-MiB record costs about a
    millisecond. Meant for the case the cheap bound refuses: a single record
    that the bound says cannot fit but whose real text might (§4 item 5).
    """
    n = len(payload)
    values = (2 * n - 1 + len(payload.translate(None, _ONE_DIGIT))
              + len(payload.translate(None, _TWO_DIGITS_OR_LESS))) if n else 0
    return 25 + len(str(offset)) + values


def binary_record_cost(value_len):
    """Exact bytes one record adds to a binary Fetch reply (length + value)."""
    return 4 + value_len


# --------------------------------------------------------------------------
# JSON: requests
# --------------------------------------------------------------------------

_MISSING = object()


def _json_error(detail):
    return RustLogDecodeError(REQUEST_ERROR_PREFIX + detail, DECODE_ERROR, JSON)


def _describe(value):
    """Short description of an unexpected JSON value for an error message
    (never its full repr: it may be a 10 MiB array)."""
    if value is True or value is False:
        return "a boolean"
    if value is None:
        return "null"
    if type(value) is int or type(value) is float:
        return f"number {value!r}"
    if type(value) is str:
        return "a string"
    if type(value) is list:
        return "an array"
    return "an object"


def _get(body, name, where):
    value = body.get(name, _MISSING)
    if value is _MISSING:
        raise _json_error(f"{where}: missing field `{name}`")
    return value


def _str_field(body, name, where):
    value = _get(body, name, where)
    if type(value) is not str:
        raise _json_error(f"{where}.{name}: expected a string, got {_describe(value)}")
    return value


def _int_field(body, name, where, limit):
    """An integer 0..limit. ``type(...) is int`` rejects floats and, because
    bool is a subclass of int but not int itself, booleans too."""
    value = _get(body, name, where)
    if type(value) is not int or not 0 <= value <= limit:
        raise _json_error(f"{where}.{name}: expected an integer 0..{limit}, got {_describe(value)}")
    return value


def _byte_arrays(arrays, payload, where, error):
    """Convert a list of JSON byte arrays to a tuple of ``bytes``.

    The hot path of a JSON Produce, so no Python loop runs over bytes:
    ``bytearray(list)`` checks every element in C (non-integers and floats
    raise TypeError, values outside 0..255 raise ValueError) and measured
    twice as fast as ``bytes(list)``; the extra ``bytes()`` copy keeps the
    result immutable. Two gaps remain, both closed here: ``bytearray(5)``
    is five zero bytes, so every element must be a list first; and
    ``bytearray([True])`` is ``b"\\x01"`` because bool is an int. A boolean
    can only be there if the raw text says ``true`` or ``false``
    (``_may_hold_bool``); only then do we walk the values with an identity
    test (``is True``; ``==`` would also match 1 and 0). Topic names that
    merely contain "true" take the slow path and still get the right answer.
    """
    for i, array in enumerate(arrays):
        if type(array) is not list:
            raise error(f"{where}[{i}]: expected an array of integers 0..255, "
                        f"got {_describe(array)}")
    try:
        converted = tuple(map(bytes, map(bytearray, arrays)))
    except (TypeError, ValueError):
        raise error(f"{where}[{_first_bad_array(arrays)}]: "
                    "expected an array of integers 0..255") from None
    if _may_hold_bool(payload):
        for i, array in enumerate(arrays):
            for v in array:
                if v is True or v is False:
                    raise error(f"{where}[{i}]: expected an array of integers 0..255, "
                                "got a boolean in it")
    return converted


def _may_hold_bool(payload):
    """Whether ``true`` or ``false`` occurs anywhere in the raw payload.

    ``b"true" in payload or b"false" in payload`` costs ~40 us on a 36 KB
    Produce (CPython's substring search runs at about a byte per cycle),
    40% on top of the whole ~95 us decode. Both words end in "e", which a digit array
    never contains, so we hop from "e" to "e" with ``find`` (memchr, ~0.3 us
    for the same payload) and look behind each. Valid requests hold only a
    few: the keys "Produce" and "records", and whatever the topic has. A
    payload with many (crafted, or long extra fields) falls back to the
    substring search after a few dozen hops, so the Python loop stays short.
    """
    find = payload.find
    i = find(b"e")
    for _ in range(32):
        if i < 0:
            return False
        if payload[i - 3:i] == b"tru" or payload[i - 4:i] == b"fals":
            return True
        i = find(b"e", i + 1)
    return i >= 0 and (b"true" in payload or b"false" in payload)


def _first_bad_array(arrays):
    """Index of the first array ``bytearray`` refuses (error path only)."""
    for i, array in enumerate(arrays):
        try:
            bytearray(array)
        except (TypeError, ValueError):
            return i


def _json_produce(body, payload):
    topic = _str_field(body, "topic", "Produce")
    partition = _int_field(body, "partition", "Produce", U32_MAX)
    records = _get(body, "records", "Produce")
    if type(records) is not list:
        raise _json_error(f"Produce.records: expected an array, got {_describe(records)}")
    return ProduceRequest(topic, partition, _byte_arrays(records, payload, "Produce.records", _json_error))


def _json_fetch(body, payload):
    topic = _str_field(body, "topic", "Fetch")
    partition = _int_field(body, "partition", "Fetch", U32_MAX)
    offset = _int_field(body, "offset", "Fetch", U64_MAX)
    max_bytes = _int_field(body, "max_bytes", "Fetch", U64_MAX)
    group_id = body.get("group_id")
    if group_id is not None and type(group_id) is not str:
        raise _json_error(f"Fetch.group_id: expected a string or null, got {_describe(group_id)}")
    return FetchRequest(topic, partition, offset, max_bytes, group_id or None)


def _json_offset_commit(body, payload):
    topic = _str_field(body, "topic", "OffsetCommit")
    partition = _int_field(body, "partition", "OffsetCommit", U32_MAX)
    group_id = _str_field(body, "group_id", "OffsetCommit")
    if not group_id:
        raise _json_error("OffsetCommit.group_id: must not be empty")
    offset = _int_field(body, "offset", "OffsetCommit", U64_MAX)
    return OffsetCommitRequest(topic, partition, group_id, offset)


def _json_offset_fetch(body, payload):
    topic = _str_field(body, "topic", "OffsetFetch")
    partition = _int_field(body, "partition", "OffsetFetch", U32_MAX)
    group_id = _str_field(body, "group_id", "OffsetFetch")
    return OffsetFetchRequest(topic, partition, group_id)


_JSON_REQUEST_PARSERS = {
    "Produce": _json_produce,
    "Fetch": _json_fetch,
    "OffsetCommit": _json_offset_commit,
    "OffsetFetch": _json_offset_fetch,
}


def _decode_json(payload, parsers, error, kind):
    """Parse ``{"Tag": {...}}`` and hand the inner object to the tag's parser,
    which also gets the raw payload for the boolean guard."""
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError as e:
        raise error(f"invalid JSON: {e}") from None
    if type(doc) is not dict or len(doc) != 1:
        raise error("expected an object with exactly one key naming the message type")
    ((tag, body),) = doc.items()
    parser = parsers.get(tag)
    if parser is None:
        raise error(f"unknown {kind} type {tag[:100]!r}")
    if type(body) is not dict:
        raise error(f"{tag}: expected an object, got {_describe(body)}")
    return parser(body, payload)


def _decode_json_request(payload):
    return _decode_json(payload, _JSON_REQUEST_PARSERS, _json_error, "request")


# --------------------------------------------------------------------------
# JSON: responses
# --------------------------------------------------------------------------

def _json_fetch_reply(pairs, next_offset):
    # Measured (100 records x 100 bytes, best of many runs): orjson over
    # dicts of list(payload) 70 us; orjson per payload spliced into
    # %-formatted record text 87 us; one orjson call for all payloads, split
    # on "],[" and spliced 99 us; joining a precomputed table of the 256
    # numbers 260 us. orjson over dicts it is: compact output in key
    # insertion order, hence byte-exact with §6.
    return orjson.dumps({"Fetch": {
        "records": [{"offset": o, "payload": list(p)} for o, p in pairs],
        "next_offset": next_offset}})


def encode_json_fetch(first_offset, values, next_offset):
    """JSON Fetch reply for consecutive records ``values`` starting at
    ``first_offset``: the shape the bus reads records in, so the server needs
    no per-record tuples."""
    return _json_fetch_reply(zip(range(first_offset, first_offset + len(values)), values),
                             next_offset)


def _json_produce_reply(r):
    count = r.record_count
    return orjson.dumps({"Produce": {
        "offsets": list(range(r.base_offset, r.base_offset + count))}})


_COMMIT_TRUE = b'{"OffsetCommit":{"success":true}}'
_COMMIT_FALSE = b'{"OffsetCommit":{"success":false}}'


def _json_error_reply(r):
    return orjson.dumps({"Error": {"message": _printable(r.message)}})


def _printable(text):
    """``text`` with lone surrogates replaced, so encoding an error message can
    never fail (UTF-8 has no form for them)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


_JSON_RESPONSE_ENCODERS = {
    ProduceResponse: _json_produce_reply,
    FetchResponse: lambda r: _json_fetch_reply(r.records, r.next_offset),
    OffsetCommitResponse: lambda r: _COMMIT_TRUE if r.success else _COMMIT_FALSE,
    OffsetFetchResponse: lambda r: orjson.dumps({"OffsetFetch": {"offset": r.offset}}),
    ErrorResponse: _json_error_reply,
}


def _json_response_error(detail):
    return RustLogDecodeError(RESPONSE_ERROR_PREFIX + detail, DECODE_ERROR, JSON)


def _response_u64(value, where):
    if type(value) is not int or not 0 <= value <= U64_MAX:
        raise _json_response_error(f"{where}: expected an integer 0..{U64_MAX}, "
                                   f"got {_describe(value)}")
    return value


def _json_produce_response(body, payload):
    offsets = body.get("offsets")
    if type(offsets) is not list:
        raise _json_response_error("Produce.offsets: expected an array")
    for o in offsets:
        _response_u64(o, "Produce.offsets")
    base = offsets[0] if offsets else 0
    if offsets != list(range(base, base + len(offsets))):
        raise _json_response_error("Produce.offsets: not consecutive")
    return ProduceResponse(base, len(offsets))


def _json_fetch_response(body, payload):
    records = body.get("records")
    if type(records) is not list:
        raise _json_response_error("Fetch.records: expected an array")
    offsets = []
    arrays = []
    for record in records:
        if type(record) is not dict:
            raise _json_response_error("Fetch.records: expected objects")
        offsets.append(_response_u64(record.get("offset"), "Fetch.records.offset"))
        arrays.append(record.get("payload"))
    next_offset = _response_u64(body.get("next_offset"), "Fetch.next_offset")
    payloads = _byte_arrays(arrays, payload, "Fetch.records.payload", _json_response_error)
    return FetchResponse(tuple(zip(offsets, payloads)), next_offset)


def _json_offset_commit_response(body, payload):
    success = body.get("success")
    if success is not True and success is not False:
        raise _json_response_error("OffsetCommit.success: expected a boolean")
    return OffsetCommitResponse(success)


def _json_offset_fetch_response(body, payload):
    # serde reads a missing Option field as None, and so do we.
    offset = body.get("offset")
    if offset is not None:
        _response_u64(offset, "OffsetFetch.offset")
    return OffsetFetchResponse(offset)


def _json_error_response(body, payload):
    message = body.get("message")
    if type(message) is not str:
        raise _json_response_error("Error.message: expected a string")
    return ErrorResponse(message)


_JSON_RESPONSE_PARSERS = {
    "Produce": _json_produce_response,
    "Fetch": _json_fetch_response,
    "OffsetCommit": _json_offset_commit_response,
    "OffsetFetch": _json_offset_fetch_response,
    "Error": _json_error_response,
}


def _decode_json_response(payload):
    return _decode_json(payload, _JSON_RESPONSE_PARSERS, _json_response_error, "response")


def _json_produce_request(r):
    return orjson.dumps({"Produce": {
        "topic": r.topic, "partition": r.partition,
        "records": [list(v) for v in r.records]}})


_JSON_REQUEST_ENCODERS = {
    ProduceRequest: _json_produce_request,
    FetchRequest: lambda r: orjson.dumps({"Fetch": {
        "topic": r.topic, "partition": r.partition, "offset": r.offset,
        "max_bytes": r.max_bytes, "group_id": r.group_id}}),
    OffsetCommitRequest: lambda r: orjson.dumps({"OffsetCommit": {
        "topic": r.topic, "partition": r.partition, "group_id": r.group_id,
        "offset": r.offset}}),
    OffsetFetchRequest: lambda r: orjson.dumps({"OffsetFetch": {
        "topic": r.topic, "partition": r.partition, "group_id": r.group_id}}),
}


# --------------------------------------------------------------------------
# Binary
# --------------------------------------------------------------------------

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_U32_U64 = struct.Struct(">IQ")
_U64_U32 = struct.Struct(">QI")
_U16_U16 = struct.Struct(">HH")


class _Truncated(Exception):
    pass


class _Invalid(Exception):
    """A well-formed field with a value the message cannot have."""


class _Reader:
    """Cursor over a binary payload, starting after the tag. Running off the
    end raises ``struct.error`` (from ``unpack_from``) or ``_Truncated``
    (from a length that points past the end); the caller turns both into a
    decode error."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf):
        self.buf = buf
        self.pos = 1

    def u8(self):
        (v,) = _U8.unpack_from(self.buf, self.pos)
        self.pos += 1
        return v

    def u16(self):
        (v,) = _U16.unpack_from(self.buf, self.pos)
        self.pos += 2
        return v

    def u32(self):
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self):
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def raw(self, n):
        start = self.pos
        end = start + n
        if end > len(self.buf):
            raise _Truncated
        self.pos = end
        return bytes(self.buf[start:end])

    def str16(self):
        return self.raw(self.u16()).decode("utf-8")

    def blob32(self):
        return self.raw(self.u32())

    def blobs32(self, count):
        """``count`` × (u32 length, bytes): the records of a Produce or a
        Fetch reply, the one loop per record, so it is kept tight. A huge
        ``count`` in a short frame ends at the first missing length."""
        buf = self.buf
        pos = self.pos
        size = len(buf)
        unpack = _U32.unpack_from
        blobs = []
        for _ in range(count):
            (n,) = unpack(buf, pos)
            pos += 4
            end = pos + n
            if end > size:
                raise _Truncated
            blobs.append(bytes(buf[pos:end]))
            pos = end
        self.pos = pos
        return blobs


def _binary_decode(payload, parsers, prefix):
    # Only payloads whose first byte is a known tag get here: every other
    # first byte is read as JSON (§2), so an unknown binary tag is answered
    # with a JSON parse Error, never with binary code 2.
    parser = parsers[payload[0]]
    reader = _Reader(payload)
    try:
        message = parser(reader)
    except (struct.error, _Truncated):
        raise RustLogDecodeError(f"{prefix}truncated {parser.__name__[3:]} frame",
                                 DECODE_ERROR, BINARY) from None
    except UnicodeDecodeError:
        raise RustLogDecodeError(f"{prefix}invalid UTF-8 in {parser.__name__[3:]} frame",
                                 DECODE_ERROR, BINARY) from None
    except _Invalid as e:
        raise RustLogDecodeError(f"{prefix}{e} in {parser.__name__[3:]} frame",
                                 DECODE_ERROR, BINARY) from None
    if reader.pos != len(payload):
        raise RustLogDecodeError(
            f"{prefix}{len(payload) - reader.pos} trailing bytes after {parser.__name__[3:]} frame",
            DECODE_ERROR, BINARY)
    return message


# Parsers are named _b_<Name> so that error messages can say which message
# was malformed.

def _b_Produce(r):
    topic = r.str16()
    partition = r.u32()
    return ProduceRequest(topic, partition, tuple(r.blobs32(r.u32())))


def _b_Fetch(r):
    group_id = r.str16()
    topic = r.str16()
    partition = r.u32()
    offset = r.u64()
    max_bytes = r.u32()
    return FetchRequest(topic, partition, offset, max_bytes, group_id or None)


def _b_OffsetCommit(r):
    group_id = r.str16()
    topic = r.str16()
    partition = r.u32()
    offset = r.u64()
    return OffsetCommitRequest(topic, partition, group_id, offset)


def _b_OffsetFetch(r):
    group_id = r.str16()
    topic = r.str16()
    partition = r.u32()
    return OffsetFetchRequest(topic, partition, group_id)


def _b_CreateTopic(r):
    topic = r.str16()
    return CreateTopicRequest(topic, r.u32())


def _b_ListTopics(r):
    return ListTopicsRequest()


def _b_DescribeTopic(r):
    return DescribeTopicRequest(r.str16())


def _b_DescribePartition(r):
    topic = r.str16()
    return DescribePartitionRequest(topic, r.u32())


def _b_MetricsFetch(r):
    return MetricsFetchRequest()


def _b_Ping(r):
    return PingRequest()


_BINARY_REQUEST_PARSERS = {
    TAG_PRODUCE: _b_Produce,
    TAG_FETCH: _b_Fetch,
    TAG_OFFSET_COMMIT: _b_OffsetCommit,
    TAG_OFFSET_FETCH: _b_OffsetFetch,
    TAG_CREATE_TOPIC: _b_CreateTopic,
    TAG_LIST_TOPICS: _b_ListTopics,
    TAG_DESCRIBE_TOPIC: _b_DescribeTopic,
    TAG_DESCRIBE_PARTITION: _b_DescribePartition,
    TAG_METRICS: _b_MetricsFetch,
    TAG_PING: _b_Ping,
}


def _decode_binary_request(payload):
    return _binary_decode(payload, _BINARY_REQUEST_PARSERS, REQUEST_ERROR_PREFIX)


def _b_ProduceReply(r):
    base, count = r.u64(), r.u32()
    return ProduceResponse(base, count)


def _b_FetchReply(r):
    count = r.u32()
    payloads = r.blobs32(count)
    next_offset = r.u64()
    first = next_offset - count
    if first < 0:
        # Offsets are derived from next_offset; fewer than count of them
        # exist below it, so the frame cannot be right.
        raise _Invalid(f"next_offset {next_offset} below record count {count}")
    return FetchResponse(tuple(zip(range(first, next_offset), payloads)), next_offset)


def _b_OffsetCommitReply(r):
    return OffsetCommitResponse(_flag(r.u8()))


def _flag(v):
    if v > 1:
        raise _Invalid(f"flag byte {v}")
    return v == 1


def _b_OffsetFetchReply(r):
    return OffsetFetchResponse(r.u64() if _flag(r.u8()) else None)


def _b_CreateTopicReply(r):
    return CreateTopicResponse(_flag(r.u8()))


def _b_ListTopicsReply(r):
    topics = []
    for _ in range(r.u32()):
        name = r.str16()
        topics.append((name, r.u32()))
    return ListTopicsResponse(tuple(topics))


def _b_DescribeTopicReply(r):
    topic = r.str16()
    partition_count = r.u32()
    partitions = []
    for _ in range(r.u32()):
        partition = r.u32()
        partitions.append((partition, r.u64()))
    return DescribeTopicResponse(topic, partition_count, tuple(partitions))


def _b_DescribePartitionReply(r):
    topic = r.str16()
    partition = r.u32()
    return DescribePartitionResponse(topic, partition, r.u64())


def _b_MetricsReply(r):
    return MetricsResponse(r.blob32().decode("utf-8"))


def _b_ErrorReply(r):
    code = r.u16()
    return ErrorResponse(r.str16(), code)


def _b_PongReply(r):
    return PongResponse()


_BINARY_RESPONSE_PARSERS = {
    TAG_PRODUCE: _b_ProduceReply,
    TAG_FETCH: _b_FetchReply,
    TAG_OFFSET_COMMIT: _b_OffsetCommitReply,
    TAG_OFFSET_FETCH: _b_OffsetFetchReply,
    TAG_CREATE_TOPIC: _b_CreateTopicReply,
    TAG_LIST_TOPICS: _b_ListTopicsReply,
    TAG_DESCRIBE_TOPIC: _b_DescribeTopicReply,
    TAG_DESCRIBE_PARTITION: _b_DescribePartitionReply,
    TAG_METRICS: _b_MetricsReply,
    TAG_ERROR: _b_ErrorReply,
    TAG_PING: _b_PongReply,
}


def _decode_binary_response(payload):
    return _binary_decode(payload, _BINARY_RESPONSE_PARSERS, RESPONSE_ERROR_PREFIX)


def _str16(text):
    data = text.encode("utf-8")
    return _U16.pack(len(data)) + data


def _blobs32(parts, values):
    """Append a u32 count and then (u32 length, bytes) per value to ``parts``."""
    pack = _U32.pack
    parts.append(pack(len(values)))
    for v in values:
        parts.append(pack(len(v)))
        parts.append(v)
    return parts


def encode_binary_fetch(values, next_offset):
    """Binary Fetch reply: ``values`` are the payloads of the records
    ``next_offset - len(values) … next_offset - 1`` (the variant carries no
    per-record offsets)."""
    parts = _blobs32([b"\x02"], values)
    parts.append(_U64.pack(next_offset))
    return b"".join(parts)


def _binary_produce_reply(r):
    count = r.record_count
    return b"\x01" + _U64_U32.pack(r.base_offset if count else 0, count)


def _binary_list_topics_reply(r):
    topics = sorted(r.topics)
    parts = [b"\x06", _U32.pack(len(topics))]
    for name, partition_count in topics:
        parts.append(_str16(name))
        parts.append(_U32.pack(partition_count))
    return b"".join(parts)


def _binary_describe_topic_reply(r):
    parts = [b"\x07", _str16(r.topic), _U32.pack(r.partition_count),
             _U32.pack(len(r.partitions))]
    parts.extend(_U32_U64.pack(p, hw) for p, hw in r.partitions)
    return b"".join(parts)


def _binary_metrics_reply(r):
    data = r.text.encode("utf-8")
    return b"\x09" + _U32.pack(len(data)) + data


def _binary_error_reply(r):
    """A message longer than a str16 is cut at a character boundary rather
    than refused: the error must get out whatever it says."""
    data = r.message.encode("utf-8", "replace")
    if len(data) > 0xFFFF:
        data = data[:0xFFFF].decode("utf-8", "ignore").encode("utf-8")
    code = INTERNAL if r.code is None else r.code
    return b"\xfe" + _U16_U16.pack(code, len(data)) + data


_BINARY_RESPONSE_ENCODERS = {
    ProduceResponse: _binary_produce_reply,
    FetchResponse: lambda r: encode_binary_fetch([p for _, p in r.records], r.next_offset),
    OffsetCommitResponse: lambda r: b"\x03\x01" if r.success else b"\x03\x00",
    OffsetFetchResponse: lambda r: (b"\x04\x00" if r.offset is None
                                    else b"\x04\x01" + _U64.pack(r.offset)),
    CreateTopicResponse: lambda r: b"\x05\x01" if r.success else b"\x05\x00",
    ListTopicsResponse: _binary_list_topics_reply,
    DescribeTopicResponse: _binary_describe_topic_reply,
    DescribePartitionResponse: lambda r: (b"\x08" + _str16(r.topic)
                                          + _U32_U64.pack(r.partition, r.high_watermark)),
    MetricsResponse: _binary_metrics_reply,
    ErrorResponse: _binary_error_reply,
    PongResponse: lambda r: b"\xff",
}


def _binary_produce_request(r):
    return b"".join(_blobs32([b"\x01", _str16(r.topic), _U32.pack(r.partition)], r.records))


_BINARY_REQUEST_ENCODERS = {
    ProduceRequest: _binary_produce_request,
    FetchRequest: lambda r: (b"\x02" + _str16(r.group_id or "") + _str16(r.topic)
                             + _U32.pack(r.partition) + _U64_U32.pack(r.offset, r.max_bytes)),
    OffsetCommitRequest: lambda r: (b"\x03" + _str16(r.group_id) + _str16(r.topic)
                                    + _U32_U64.pack(r.partition, r.offset)),
    OffsetFetchRequest: lambda r: (b"\x04" + _str16(r.group_id) + _str16(r.topic)
                                   + _U32.pack(r.partition)),
    CreateTopicRequest: lambda r: b"\x05" + _str16(r.topic) + _U32.pack(r.partition_count),
    ListTopicsRequest: lambda r: b"\x06",
    DescribeTopicRequest: lambda r: b"\x07" + _str16(r.topic),
    DescribePartitionRequest: lambda r: b"\x08" + _str16(r.topic) + _U32.pack(r.partition),
    MetricsFetchRequest: lambda r: b"\x09",
    PingRequest: lambda r: b"\xff",
}
