"""Pravega WireCommands (wire version 17): bytes <-> command objects.

Pure: no Twisted, no I/O, so that hypothesis can fuzz every decoder. The
byte-level reference is ``shared/protocols/pravega.md``; the section numbers
below (§n) are that sheet's.

A frame is ``int32 type | int32 length | payload`` (§3). Commands are frozen
dataclasses; each class names its type code and its layout, and one generic
reader and writer walk the layout, so a layout is written down exactly once
and both directions agree by construction. The encoder is strict (every
field, optional trailing ones included); the decoder is lenient the way the
Java server is: absent optional trailing fields take their defaults and
extra trailing bytes are ignored (§1). A field that runs past its frame is a
``DecodeError`` (a protocol error, §9).

The module also holds the other pure pieces of the dialect: the event
framing of the segment view (``frame_events``, ``scan_events``,
``split_events``), the assembly of an append block's payload from
AppendBlock + AppendBlockEnd (``assemble_block``, §6.2), and the mapping
between segment names and topics with the reversible escaping of names
Pravega forbids (§8).
"""
import re
import struct
from dataclasses import dataclass, fields

WIRE_VERSION = 17
OLDEST_COMPATIBLE_VERSION = 5
#: the largest frame, its 8-byte header included (§3)
MAX_FRAME_BYTES = 0xFFFFFF
#: ``int32 type, int32 length``. The length is read unsigned so that a
#: negative one looks like an oversize frame to the framing layer, which
#: checks it before buffering anything (``NEGATIVE_LENGTH`` tells them apart).
HEADER = struct.Struct(">iI")
HEADER_SIZE = HEADER.size
NEGATIVE_LENGTH = 1 << 31
#: Long.MIN_VALUE: the event number of a writer the segment has never seen
NO_EVENT_NUMBER = -(1 << 63)
#: a ReadSegment is served at most this much at a time (§7.1)
MAX_READ_BYTES = 2 * 1024 * 1024
MIN_READ_BYTES = 8
#: an event's header inside block data: ``int32 0 (type), int32 length``
EVENT_HEADER = struct.Struct(">ii")
EVENT_HEADER_SIZE = EVENT_HEADER.size

# -- type codes (§4) -----------------------------------------------------------

HELLO = -127
PADDING = -1
PARTIAL_EVENT = -2
EVENT = 0
SETUP_APPEND = 1
APPEND_SETUP = 2
APPEND_BLOCK = 3
APPEND_BLOCK_END = 4
CONDITIONAL_APPEND = 5
DATA_APPENDED = 7
CONDITIONAL_CHECK_FAILED = 8
READ_SEGMENT = 9
SEGMENT_READ = 10
GET_STREAM_SEGMENT_INFO = 11
STREAM_SEGMENT_INFO = 12
CREATE_SEGMENT = 20
SEGMENT_CREATED = 21
SEAL_SEGMENT = 28
SEGMENT_SEALED = 29
DELETE_SEGMENT = 30
SEGMENT_DELETED = 31
TRUNCATE_SEGMENT = 38
CREATE_TRANSIENT_SEGMENT = 40
SEGMENT_IS_SEALED = 51
SEGMENT_ALREADY_EXISTS = 52
NO_SUCH_SEGMENT = 53
INVALID_EVENT_NUMBER = 55
SEGMENT_IS_TRUNCATED = 56
OPERATION_UNSUPPORTED = 57
MERGE_SEGMENTS = 58
SEGMENTS_MERGED = 59
AUTH_TOKEN_CHECK_FAILED = 60
ERROR_MESSAGE = 61
CREATE_TABLE_SEGMENT = 70
DELETE_TABLE_SEGMENT = 71
UPDATE_TABLE_ENTRIES = 74
TABLE_ENTRIES_UPDATED = 75
REMOVE_TABLE_KEYS = 76
TABLE_KEYS_REMOVED = 77
READ_TABLE = 78
TABLE_READ = 79
TABLE_SEGMENT_NOT_EMPTY = 80
TABLE_KEY_DOES_NOT_EXIST = 81
TABLE_KEY_BAD_VERSION = 82
READ_TABLE_KEYS = 83
TABLE_KEYS_READ = 84
READ_TABLE_ENTRIES = 85
TABLE_ENTRIES_READ = 86
TABLE_ENTRIES_DELTA_READ = 87
READ_TABLE_ENTRIES_DELTA = 88
CONDITIONAL_BLOCK_END = 89
KEEP_ALIVE = 100

#: a table key's version meaning "whatever the key's version" (Long.MIN)
KEY_NO_VERSION = NO_EVENT_NUMBER
#: a table key's version meaning "the key must not exist" (and a missing
#: key's version in a TableRead)
KEY_NOT_EXISTS = -1

#: ErrorMessage / AuthTokenCheckFailed error codes
ERROR_UNSPECIFIED = -1
AUTH_CHECK_FAILED = 0

#: Requests the gateway answers with OperationUnsupported (§4 and
#: pravega-clients.md §3.1): each begins with ``int64 requestId``, the only
#: field read. The names are the Java client's operation names, which it puts
#: in its exception message.
UNSUPPORTED_OPERATIONS = {
    32: "updateSegmentPolicy", 33: "segmentPolicyUpdated",
    34: "getSegmentAttribute", 35: "segmentAttribute",
    36: "updateSegmentAttribute", 37: "segmentAttributeUpdated",
    38: "truncateSegment", 39: "segmentTruncated",
    41: "locateOffset", 42: "offsetLocated",
    90: "mergeSegmentsBatch", 91: "segmentsBatchMerged",
    68: "getTableSegmentInfo", 69: "tableSegmentInfo",
    72: "mergeTableSegments", 73: "sealTableSegment",
}


class DecodeError(Exception):
    """A frame no correct client sends (§9). ``request_id`` and ``segment``
    are the frame's own when its fields were read far enough to give them,
    so the ErrorMessage can name them; else -1 and ""."""

    def __init__(self, reason, request_id=-1, segment=""):
        super().__init__(reason)
        self.reason = reason
        self.request_id = request_id
        self.segment = segment


# -- field kinds ----------------------------------------------------------------------

_LONG = struct.Struct(">q")
_INT = struct.Struct(">i")
_BYTE = struct.Struct(">b")
_U16 = struct.Struct(">H")


class _Truncated(Exception):
    """A field runs past the end of its frame."""


class _BadTable(Exception):
    """A table key no client sends (an empty one)."""


def _read_long(buf, pos, end):
    if pos + 8 > end:
        raise _Truncated
    return _LONG.unpack_from(buf, pos)[0], pos + 8


def _read_int(buf, pos, end):
    if pos + 4 > end:
        raise _Truncated
    return _INT.unpack_from(buf, pos)[0], pos + 4


def _read_byte(buf, pos, end):
    if pos + 1 > end:
        raise _Truncated
    return _BYTE.unpack_from(buf, pos)[0], pos + 1


def _read_bool(buf, pos, end):
    if pos + 1 > end:
        raise _Truncated
    return buf[pos] != 0, pos + 1


def _read_uuid(buf, pos, end):
    if pos + 16 > end:
        raise _Truncated
    return bytes(buf[pos:pos + 16]), pos + 16


def _read_string(buf, pos, end):
    if pos + 2 > end:
        raise _Truncated
    (n,) = _U16.unpack_from(buf, pos)
    pos += 2
    if pos + n > end:
        raise _Truncated
    # Java writes modified UTF-8; names are ASCII in practice. surrogateescape
    # keeps any other bytes, so a string echoed back is byte-identical.
    return bytes(buf[pos:pos + n]).decode("utf-8", "surrogateescape"), pos + n


def _read_data(buf, pos, end):
    if pos + 4 > end:
        raise _Truncated
    (n,) = _INT.unpack_from(buf, pos)
    pos += 4
    if n < 0 or pos + n > end:
        raise _Truncated
    return bytes(buf[pos:pos + n]), pos + n


def _read_rest(buf, pos, end):
    return bytes(buf[pos:end]), end


def _read_key(buf, pos, end):
    """A table key (pravega-clients.md §3.1 ``TK``): ``I 4+keyLen+8, I keyLen,
    D[keyLen], L version``. The leading length bounds the key's fields; a
    key whose version is absent (Java omits it for an empty key) or empty
    is refused: no client sends an empty key for reader-group state."""
    total, pos = _read_int(buf, pos, end)
    stop = pos + total
    if total < 4 or stop > end:
        raise _Truncated
    key, inner = _read_data(buf, pos, stop)
    if not key:
        raise _BadTable("empty table key")
    version, _ = _read_long(buf, inner, stop)
    return (key, version), stop


def _read_value(buf, pos, end):
    """A table value (``TV``): ``I 4+valLen, I valLen, D[valLen]``."""
    total, pos = _read_int(buf, pos, end)
    stop = pos + total
    if total < 4 or stop > end:
        raise _Truncated
    value, _ = _read_data(buf, pos, stop)
    return value, stop


def _read_count(buf, pos, end, smallest):
    """A list's ``I count``, checked against the bytes left (each item takes
    at least ``smallest``), so a forged count never allocates."""
    count, pos = _read_int(buf, pos, end)
    if count < 0 or count * smallest > end - pos:
        raise _Truncated
    return count, pos


def _read_entries(buf, pos, end):
    """``TE``: ``I count, count x (TK, TV)`` as ``((key, version, value), ...)``."""
    count, pos = _read_count(buf, pos, end, 25)
    entries = []
    for _ in range(count):
        (key, version), pos = _read_key(buf, pos, end)
        value, pos = _read_value(buf, pos, end)
        entries.append((key, version, value))
    return tuple(entries), pos


def _read_keys(buf, pos, end):
    """``KL``: ``I count, count x TK`` as ``((key, version), ...)``."""
    count, pos = _read_count(buf, pos, end, 17)
    keys = []
    for _ in range(count):
        key, pos = _read_key(buf, pos, end)
        keys.append(key)
    return tuple(keys), pos


def _read_longs(buf, pos, end):
    """``I count, count x L`` (TableEntriesUpdated's versions)."""
    count, pos = _read_count(buf, pos, end, 8)
    values = struct.unpack_from(f">{count}q", buf, pos)
    return tuple(values), pos + 8 * count


def _write_key(key, version):
    return _INT.pack(len(key) + 12) + _INT.pack(len(key)) + key + _LONG.pack(version)


def _write_entries(entries):
    parts = [_INT.pack(len(entries))]
    for key, version, value in entries:
        parts += [_write_key(key, version), _INT.pack(len(value) + 4), _INT.pack(len(value)),
                  value]
    return b"".join(parts)


def _write_keys(keys):
    return _INT.pack(len(keys)) + b"".join([_write_key(k, v) for k, v in keys])


def _write_longs(values):
    return _INT.pack(len(values)) + struct.pack(f">{len(values)}q", *values)


def _write_string(text):
    data = text.encode("utf-8", "surrogateescape")
    if len(data) > 0xFFFF:
        raise ValueError(f"string of {len(data)} bytes does not fit a u16 length")
    return _U16.pack(len(data)) + data


def _write_uuid(value):
    if len(value) != 16:
        raise ValueError(f"a UUID is 16 bytes, got {len(value)}")
    return bytes(value)


_KINDS = {
    "L": (_read_long, _LONG.pack),
    "I": (_read_int, _INT.pack),
    "b": (_read_byte, _BYTE.pack),
    "B": (_read_bool, lambda v: b"\x01" if v else b"\x00"),
    "U": (_read_uuid, _write_uuid),
    "S": (_read_string, _write_string),
    "D": (_read_data, lambda v: _INT.pack(len(v)) + v),
    "R": (_read_rest, bytes),
    "E": (_read_entries, _write_entries),
    "K": (_read_keys, _write_keys),
    "V": (_read_longs, _write_longs),
}

#: type code -> command class, filled by ``_command``
COMMANDS = {}


def _command(code, layout, optional_from=None):
    """Class decorator: ``layout`` gives one kind letter per dataclass field,
    in wire order; fields from index ``optional_from`` on may be absent on
    input (they take the dataclass defaults)."""
    def register(cls):
        names = [f.name for f in fields(cls)]
        if len(names) != len(layout):
            raise TypeError(f"{cls.__name__}: layout {layout!r} does not match its fields")
        cls.code = code
        cls._layout = tuple(zip(names, (_KINDS[k] for k in layout)))
        cls._optional_from = len(names) if optional_from is None else optional_from
        COMMANDS[code] = cls
        return cls
    return register


def encode(command):
    """The whole frame of one command, header included."""
    body = b"".join([write(getattr(command, name)) for name, (_, write) in command._layout])
    return HEADER.pack(command.code, len(body)) + body


def decode(code, body):
    """The command of one frame's body. Raises ``DecodeError`` for an unknown
    type code or a field that runs past the frame."""
    cls = COMMANDS.get(code)
    if cls is None:
        if code in UNSUPPORTED_OPERATIONS:
            try:
                request_id, _ = _read_long(body, 0, len(body))
            except _Truncated:
                raise DecodeError(f"{UNSUPPORTED_OPERATIONS[code]} frame too short "
                                  f"for its requestId") from None
            return Unsupported(code, request_id)
        raise DecodeError(f"unknown or unsupported type code {code}")
    values = {}
    pos = 0
    end = len(body)
    optional_from = cls._optional_from
    for i, (name, (read, _)) in enumerate(cls._layout):
        if i >= optional_from and pos >= end:
            break
        try:
            values[name], pos = read(body, pos, end)
        except _Truncated:
            if i >= optional_from:
                break       # a partial optional field is absent, like in Java
            raise DecodeError(f"{cls.__name__}: field {name} runs past the end of the frame",
                              values.get("request_id", -1), values.get("segment", "")) from None
        except _BadTable as e:
            raise DecodeError(f"{cls.__name__}: {e}", values.get("request_id", -1),
                              values.get("segment", "")) from None
    return cls(**values)


# -- commands (§5) ---------------------------------------------------------------------

@_command(HELLO, "II")
@dataclass(frozen=True, slots=True)
class Hello:
    high_version: int = WIRE_VERSION
    low_version: int = OLDEST_COMPATIBLE_VERSION


@_command(KEEP_ALIVE, "R", optional_from=0)
@dataclass(frozen=True, slots=True)
class KeepAlive:
    """Empty; any payload received is ignored (it is not echoed)."""
    data: bytes = b""


@_command(PADDING, "R")
@dataclass(frozen=True, slots=True)
class Padding:
    data: bytes


@_command(PARTIAL_EVENT, "R")
@dataclass(frozen=True, slots=True)
class PartialEvent:
    """The first bytes of one Event frame, the last thing in an AppendBlock."""
    data: bytes


@_command(EVENT, "R")
@dataclass(frozen=True, slots=True)
class Event:
    """One event as a frame of its own; valid only inside block data."""
    data: bytes


@_command(SETUP_APPEND, "LUSS")
@dataclass(frozen=True, slots=True)
class SetupAppend:
    request_id: int
    writer_id: bytes
    segment: str
    token: str = ""


@_command(APPEND_SETUP, "LSUL")
@dataclass(frozen=True, slots=True)
class AppendSetup:
    request_id: int
    segment: str
    writer_id: bytes
    last_event_number: int


@_command(APPEND_BLOCK, "UR")
@dataclass(frozen=True, slots=True)
class AppendBlock:
    writer_id: bytes
    data: bytes


@_command(APPEND_BLOCK_END, "UIDILL", optional_from=5)
@dataclass(frozen=True, slots=True)
class AppendBlockEnd:
    writer_id: bytes
    size_of_whole_events: int
    data: bytes
    num_events: int
    last_event_number: int
    request_id: int = -1


@_command(CONDITIONAL_APPEND, "ULLIDL", optional_from=5)
@dataclass(frozen=True, slots=True)
class ConditionalAppend:
    """``event_type`` and ``data`` are the embedded Event's ``int32 0, int32
    len, payload``; a type other than 0 is not an event (§6.6)."""
    writer_id: bytes
    event_number: int
    expected_offset: int
    event_type: int
    data: bytes
    request_id: int = -1


@_command(DATA_APPENDED, "ULLLL")
@dataclass(frozen=True, slots=True)
class DataAppended:
    writer_id: bytes
    event_number: int
    previous_event_number: int
    request_id: int
    current_segment_write_offset: int


@_command(CONDITIONAL_CHECK_FAILED, "ULL")
@dataclass(frozen=True, slots=True)
class ConditionalCheckFailed:
    writer_id: bytes
    event_number: int
    request_id: int


@_command(READ_SEGMENT, "SLISL", optional_from=4)
@dataclass(frozen=True, slots=True)
class ReadSegment:
    segment: str
    offset: int
    suggested_length: int
    token: str = ""
    request_id: int = -1


@_command(SEGMENT_READ, "SLBBDL")
@dataclass(frozen=True, slots=True)
class SegmentRead:
    segment: str
    offset: int
    at_tail: bool
    end_of_segment: bool
    data: bytes
    request_id: int


@_command(GET_STREAM_SEGMENT_INFO, "LSS")
@dataclass(frozen=True, slots=True)
class GetStreamSegmentInfo:
    request_id: int
    segment: str
    token: str = ""


@_command(STREAM_SEGMENT_INFO, "LSBBBLLL")
@dataclass(frozen=True, slots=True)
class StreamSegmentInfo:
    request_id: int
    segment: str
    exists: bool
    is_sealed: bool
    is_deleted: bool
    last_modified: int
    write_offset: int
    start_offset: int


@_command(CREATE_SEGMENT, "LSIbSL", optional_from=5)
@dataclass(frozen=True, slots=True)
class CreateSegment:
    request_id: int
    segment: str
    target_rate: int = 0
    scale_type: int = 0
    token: str = ""
    rollover_size_bytes: int = 0


@_command(SEGMENT_CREATED, "LS")
@dataclass(frozen=True, slots=True)
class SegmentCreated:
    request_id: int
    segment: str


@_command(SEAL_SEGMENT, "LSS")
@dataclass(frozen=True, slots=True)
class SealSegment:
    request_id: int
    segment: str
    token: str = ""


@_command(SEGMENT_SEALED, "LS")
@dataclass(frozen=True, slots=True)
class SegmentSealed:
    request_id: int
    segment: str


@_command(DELETE_SEGMENT, "LSS")
@dataclass(frozen=True, slots=True)
class DeleteSegment:
    request_id: int
    segment: str
    token: str = ""


@_command(SEGMENT_DELETED, "LS")
@dataclass(frozen=True, slots=True)
class SegmentDeleted:
    request_id: int
    segment: str


@_command(CREATE_TRANSIENT_SEGMENT, "LUSS")
@dataclass(frozen=True, slots=True)
class CreateTransientSegment:
    request_id: int
    writer_id: bytes
    parent_segment: str
    token: str = ""


@_command(SEGMENT_IS_SEALED, "LSSL", optional_from=3)
@dataclass(frozen=True, slots=True)
class SegmentIsSealed:
    request_id: int
    segment: str
    stack_trace: str = ""
    offset: int = -1


@_command(SEGMENT_ALREADY_EXISTS, "LSS", optional_from=2)
@dataclass(frozen=True, slots=True)
class SegmentAlreadyExists:
    request_id: int
    segment: str
    stack_trace: str = ""


@_command(NO_SUCH_SEGMENT, "LSSL", optional_from=3)
@dataclass(frozen=True, slots=True)
class NoSuchSegment:
    request_id: int
    segment: str
    stack_trace: str = ""
    offset: int = -1


@_command(INVALID_EVENT_NUMBER, "ULSL", optional_from=2)
@dataclass(frozen=True, slots=True)
class InvalidEventNumber:
    writer_id: bytes
    request_id: int
    stack_trace: str = ""
    event_number: int = -1


@_command(SEGMENT_IS_TRUNCATED, "LSLSL", optional_from=3)
@dataclass(frozen=True, slots=True)
class SegmentIsTruncated:
    request_id: int
    segment: str
    start_offset: int
    stack_trace: str = ""
    offset: int = -1


@_command(OPERATION_UNSUPPORTED, "LSS", optional_from=2)
@dataclass(frozen=True, slots=True)
class OperationUnsupported:
    request_id: int
    operation_name: str
    stack_trace: str = ""


@_command(AUTH_TOKEN_CHECK_FAILED, "LSI", optional_from=2)
@dataclass(frozen=True, slots=True)
class AuthTokenCheckFailed:
    request_id: int
    stack_trace: str = ""
    error_code: int = ERROR_UNSPECIFIED


@_command(ERROR_MESSAGE, "LSSI", optional_from=3)
@dataclass(frozen=True, slots=True)
class ErrorMessage:
    request_id: int
    segment: str
    message: str
    error_code: int = ERROR_UNSPECIFIED


@_command(CONDITIONAL_BLOCK_END, "ULLDL")
@dataclass(frozen=True, slots=True)
class ConditionalBlockEnd:
    writer_id: bytes
    event_number: int
    expected_offset: int
    data: bytes
    request_id: int


@_command(MERGE_SEGMENTS, "LSSS", optional_from=3)
@dataclass(frozen=True, slots=True)
class MergeSegments:
    """Java may append attribute updates after the token: ignored."""
    request_id: int
    target: str
    source: str
    token: str = ""


@_command(SEGMENTS_MERGED, "LSSL")
@dataclass(frozen=True, slots=True)
class SegmentsMerged:
    request_id: int
    target: str
    source: str
    new_target_write_offset: int


# -- table segments (pravega-clients.md §3.1) ----------------------------------------------
# Entries are ``((key, version, value), ...)`` and key lists ``((key, version), ...)``.

@_command(CREATE_TABLE_SEGMENT, "LSSBIL", optional_from=2)
@dataclass(frozen=True, slots=True)
class CreateTableSegment:
    """The trailing options (Java's) are read and ignored."""
    request_id: int
    segment: str
    token: str = ""
    sorted_deprecated: bool = False
    key_length: int = 0
    rollover_size_bytes: int = 0


@_command(DELETE_TABLE_SEGMENT, "LSBS", optional_from=3)
@dataclass(frozen=True, slots=True)
class DeleteTableSegment:
    request_id: int
    segment: str
    must_be_empty: bool
    token: str = ""


@_command(UPDATE_TABLE_ENTRIES, "LSSEL", optional_from=4)
@dataclass(frozen=True, slots=True)
class UpdateTableEntries:
    """``table_segment_offset`` < 0: unconditional."""
    request_id: int
    segment: str
    token: str
    entries: tuple
    table_segment_offset: int = -1


@_command(TABLE_ENTRIES_UPDATED, "LV")
@dataclass(frozen=True, slots=True)
class TableEntriesUpdated:
    request_id: int
    updated_versions: tuple


@_command(REMOVE_TABLE_KEYS, "LSSKL", optional_from=4)
@dataclass(frozen=True, slots=True)
class RemoveTableKeys:
    request_id: int
    segment: str
    token: str
    keys: tuple
    table_segment_offset: int = -1


@_command(TABLE_KEYS_REMOVED, "LS")
@dataclass(frozen=True, slots=True)
class TableKeysRemoved:
    request_id: int
    segment: str


@_command(READ_TABLE, "LSSK")
@dataclass(frozen=True, slots=True)
class ReadTable:
    request_id: int
    segment: str
    token: str
    keys: tuple


@_command(TABLE_READ, "LSE")
@dataclass(frozen=True, slots=True)
class TableRead:
    request_id: int
    segment: str
    entries: tuple


@_command(TABLE_SEGMENT_NOT_EMPTY, "LSS", optional_from=2)
@dataclass(frozen=True, slots=True)
class TableSegmentNotEmpty:
    request_id: int
    segment: str
    stack_trace: str = ""


@_command(TABLE_KEY_DOES_NOT_EXIST, "LSS", optional_from=2)
@dataclass(frozen=True, slots=True)
class TableKeyDoesNotExist:
    request_id: int
    segment: str
    stack_trace: str = ""


@_command(TABLE_KEY_BAD_VERSION, "LSS", optional_from=2)
@dataclass(frozen=True, slots=True)
class TableKeyBadVersion:
    request_id: int
    segment: str
    stack_trace: str = ""


@_command(READ_TABLE_KEYS, "LSSID", optional_from=4)
@dataclass(frozen=True, slots=True)
class ReadTableKeys:
    """``continuation_token``: empty = from the start, else the 8-byte
    position to go on from. Java appends three more buffers: ignored."""
    request_id: int
    segment: str
    token: str
    suggested_key_count: int
    continuation_token: bytes = b""


@_command(TABLE_KEYS_READ, "LSKD")
@dataclass(frozen=True, slots=True)
class TableKeysRead:
    request_id: int
    segment: str
    keys: tuple
    continuation_token: bytes


@_command(READ_TABLE_ENTRIES, "LSSID", optional_from=4)
@dataclass(frozen=True, slots=True)
class ReadTableEntries:
    request_id: int
    segment: str
    token: str
    suggested_entry_count: int
    continuation_token: bytes = b""


@_command(TABLE_ENTRIES_READ, "LSED")
@dataclass(frozen=True, slots=True)
class TableEntriesRead:
    request_id: int
    segment: str
    entries: tuple
    continuation_token: bytes


@_command(TABLE_ENTRIES_DELTA_READ, "LSEBBL")
@dataclass(frozen=True, slots=True)
class TableEntriesDeltaRead:
    request_id: int
    segment: str
    entries: tuple
    should_clear: bool
    reached_end: bool
    last_position: int


@_command(READ_TABLE_ENTRIES_DELTA, "LSSLI")
@dataclass(frozen=True, slots=True)
class ReadTableEntriesDelta:
    request_id: int
    segment: str
    token: str
    from_position: int
    suggested_entry_count: int


@dataclass(frozen=True, slots=True)
class Unsupported:
    """A request the gateway answers with OperationUnsupported (§4); only its
    requestId is read."""
    code: int
    request_id: int

    @property
    def operation(self):
        return UNSUPPORTED_OPERATIONS[self.code]


#: what a client may send; every other decodable command is a reply, and a
#: reply received from a client is a protocol error (§4)
REQUESTS = (Hello, KeepAlive, Padding, SetupAppend, AppendBlock, AppendBlockEnd,
            ConditionalAppend, ReadSegment, GetStreamSegmentInfo, CreateSegment,
            SealSegment, DeleteSegment, CreateTransientSegment, ConditionalBlockEnd,
            MergeSegments, CreateTableSegment, DeleteTableSegment, UpdateTableEntries,
            RemoveTableKeys, ReadTable, ReadTableKeys, ReadTableEntries,
            ReadTableEntriesDelta, Unsupported)


# -- hot paths --------------------------------------------------------------------------
# The generic writer above is exact but walks a layout; the two replies sent
# once per append and per read are packed in one step instead (the golden
# vectors check that both ways agree).

_DATA_APPENDED = struct.Struct(">iI16sqqqq")
_DATA_APPENDED_SIZE = _DATA_APPENDED.size - HEADER_SIZE


def encode_data_appended(writer_id, event_number, previous, request_id, write_offset):
    return _DATA_APPENDED.pack(DATA_APPENDED, _DATA_APPENDED_SIZE, writer_id, event_number,
                               previous, request_id, write_offset)


_READ_FIXED = struct.Struct(">q??i")


def segment_read_chunks(segment, offset, at_tail, end_of_segment, chunks, request_id):
    """A SegmentRead frame as a list of byte strings whose concatenation is
    the frame, so that a reply of many slices of stored batches is handed to
    the transport without first being copied into one string."""
    name = _write_string(segment)
    size = sum(map(len, chunks))
    head = name + _READ_FIXED.pack(offset, at_tail, end_of_segment, size)
    body_len = len(head) + size + 8
    return [HEADER.pack(SEGMENT_READ, body_len) + head, *chunks, _LONG.pack(request_id)]


# -- events --------------------------------------------------------------------------------

class NotEvents(Exception):
    """Append data that is not a sequence of whole Events (§6.3)."""


def frame_event(value):
    """One value as an Event: ``int32 0, int32 len, value``."""
    return EVENT_HEADER.pack(EVENT, len(value)) + value


def frame_events(values):
    """The event-framed view of consecutive values (§7.2)."""
    pack = EVENT_HEADER.pack
    parts = []
    append = parts.append
    for value in values:
        append(pack(EVENT, len(value)))
        append(value)
    return b"".join(parts)


def scan_events(payload):
    """Check that ``payload`` is whole Events; return ``(count, largest)``.

    Every event must have type 0, a length >= 0 and all its bytes, and the
    payload must end exactly on an event boundary; raises ``NotEvents``.
    """
    unpack = EVENT_HEADER.unpack_from
    end = len(payload)
    pos = 0
    count = 0
    largest = 0
    while pos < end:
        if end - pos < EVENT_HEADER_SIZE:
            raise NotEvents(f"{end - pos} bytes at position {pos} are not a whole event header")
        kind, length = unpack(payload, pos)
        if kind != EVENT:
            raise NotEvents(f"type {kind} instead of an Event at position {pos}")
        if length < 0:
            raise NotEvents(f"negative event length {length} at position {pos}")
        pos += EVENT_HEADER_SIZE + length
        if pos > end:
            raise NotEvents(f"event of {length} bytes at position "
                            f"{pos - EVENT_HEADER_SIZE - length} runs past the data")
        count += 1
        if length > largest:
            largest = length
    return count, largest


def split_events(payload):
    """The values of a payload that ``scan_events`` accepted."""
    unpack = EVENT_HEADER.unpack_from
    values = []
    pos = 0
    end = len(payload)
    while pos < end:
        _, length = unpack(payload, pos)
        start = pos + EVENT_HEADER_SIZE
        pos = start + length
        values.append(payload[start:pos])
    return values


# -- append blocks (§6.2) ----------------------------------------------------------------------

class BlockError(Exception):
    """An AppendBlockEnd (with or without its AppendBlock) no correct client
    sends: a protocol error (§9)."""


def assemble_block(block, end):
    """The payload an append block carries: ``block`` is the AppendBlock's
    data, or None for a standalone AppendBlockEnd ``end``.

    After an AppendBlock the payload is ``block[:sizeOfWholeEvents]``; any
    bytes left must be exactly one PartialEvent (whose bytes, then
    ``end.data``, complete the payload) or one Padding (and then
    ``end.data`` must be empty). Without a trailer the payload is the whole
    events followed by ``end.data``. Standalone, the payload is ``end.data``
    and sizeOfWholeEvents is ignored (the Rust client sends only this form,
    and its numEvents is an in-flight count: only > 0 is checked).
    Whether the payload is whole Events is checked separately
    (``scan_events``): that is a refusal, not a protocol error (§6.6).
    """
    if end.num_events <= 0:
        raise BlockError(f"numEvents {end.num_events} is not positive")
    if block is None:
        return end.data
    size = end.size_of_whole_events
    if not 0 <= size <= len(block):
        raise BlockError(f"sizeOfWholeEvents {size} outside 0..{len(block)}")
    remaining = len(block) - size
    if remaining == 0:
        return block + end.data if end.data else block
    if remaining < HEADER_SIZE:
        raise BlockError(f"{remaining} bytes after the whole events are not a command")
    code, length = HEADER.unpack_from(block, size)
    if length != remaining - HEADER_SIZE:
        raise BlockError(f"the {remaining} bytes after the whole events are not exactly "
                         f"one command (type {code}, length {length})")
    if code == PARTIAL_EVENT:
        return b"".join((block[:size], block[size + HEADER_SIZE:], end.data))
    if code == PADDING:
        if end.data:
            raise BlockError(f"Padding followed by {len(end.data)} bytes in AppendBlockEnd")
        return block[:size]
    raise BlockError(f"type {code} after the whole events is neither PartialEvent nor Padding")


# -- segment names (§8) ----------------------------------------------------------------------

#: Pravega scope and stream names: letters, digits, '.' and '-'
NAME_CHARS = re.compile(r"[A-Za-z0-9.\-]+\Z")
_PARTITION = r"(0|[1-9][0-9]{0,9})"
_SCOPED = re.compile(r"([A-Za-z0-9.\-]+)/([A-Za-z0-9.\-]+)/" + _PARTITION + r"\.#epoch\.0\Z")
_PLAIN = re.compile(r"([A-Za-z0-9._\-]+)/" + _PARTITION + r"\Z")
ESCAPE_PREFIX = "x--"


def escape_stream(topic):
    """The Pravega stream name of a gateway topic.

    Pravega names allow only ``[A-Za-z0-9.-]``, gateway topics also ``_``. A
    topic without ``_`` that does not start with ``x--`` is its own stream
    name; any other becomes ``x--`` + the name with ``-`` as ``--`` and
    ``_`` as ``-u``. ``orders`` -> ``orders``, ``user_events`` ->
    ``x--user-uevents``, ``a-b_c`` -> ``x--a--b-uc``, ``x--foo`` ->
    ``x--x----foo``.
    """
    if "_" not in topic and not topic.startswith(ESCAPE_PREFIX):
        return topic
    return ESCAPE_PREFIX + topic.replace("-", "--").replace("_", "-u")


def unescape_stream(stream):
    """The topic of a stream name, or None if it is not one ``escape_stream``
    produces: after ``x--`` a ``-`` must be followed by ``-`` or ``u``, and
    only the canonical spelling of a topic is accepted (``x--abc`` is not
    ``abc``), so that names and topics correspond one to one."""
    if not NAME_CHARS.match(stream):
        return None
    if not stream.startswith(ESCAPE_PREFIX):
        return stream
    out = []
    rest = stream[len(ESCAPE_PREFIX):]
    i = 0
    n = len(rest)
    while i < n:
        ch = rest[i]
        if ch == "-":
            nxt = rest[i + 1] if i + 1 < n else ""
            if nxt == "-":
                out.append("-")
            elif nxt == "u":
                out.append("_")
            else:
                return None
            i += 2
        else:
            out.append(ch)
            i += 1
    topic = "".join(out)
    return topic if escape_stream(topic) == stream else None


def segment_name(scope, topic, partition):
    """The scoped segment name of a partition: ``scope/stream/p.#epoch.0``."""
    return f"{scope}/{escape_stream(topic)}/{partition}.#epoch.0"


def parse_segment_name(name, scope):
    """``(topic, partition)`` of a segment name, or None if it names nothing.

    Accepted: ``<scope>/<stream>/<p>.#epoch.0`` with this listener's scope
    and an escaped stream name, and plain ``<topic>/<p>``. ``<p>`` is decimal
    without sign or leading zeros. Other epochs, internal suffixes
    (``#transaction.``, ``#index``, ``#transient.``) and other scopes name
    nothing. Whether the topic and partition exist is the bus's answer.
    """
    m = _SCOPED.match(name)
    if m is not None:
        if m.group(1) != scope:
            return None
        topic = unescape_stream(m.group(2))
        return None if topic is None else (topic, int(m.group(3)))
    m = _PLAIN.match(name)
    if m is not None:
        return m.group(1), int(m.group(2))
    return None
