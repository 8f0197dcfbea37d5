"""Figg codec: frames <-> message objects (shared/protocols/figg.md §2-§3).

Pure (no Twisted, no I/O) so that it can be fuzzed. A frame is an 8-byte
big-endian header ``type u16 | version u16 | payload_len u32`` and a payload
of fields in a fixed order: integers are big-endian u16/u64, variable fields
(topic, data) are ``u32 length + bytes``. Version 1 is written and any version
is accepted. Bytes left in a payload after its last field are ignored (§2).

Topics stay ``bytes`` here: a DATA frame must carry the topic exactly as the
client sent it in ATTACH, and whether the bytes make a valid gateway topic
name is the bus's decision, not the wire format's.

Entry points: ``encode`` (any message to a whole frame), ``decode_payload``
(a payload of a known type to its message; None for an unknown type, which
both sides skip), ``decode_frames`` (a byte string cut into messages, for
tools and tests). The hot paths have helpers that skip building message
objects: ``decode_publish`` for the server's intake, ``encode_acks`` for its
acknowledgements and ``DataEncoder`` for streaming DATA.

Every decoder raises only ``FiggDecodeError`` for bad input, whatever the
bytes; the fuzz tests hold it to that.
"""
import struct
from dataclasses import dataclass
from itertools import islice

HEADER = struct.Struct(">HHI")
VERSION = 1

ATTACH = 1
ATTACHED = 2
DETACH = 3
DETACHED = 4
PUBLISH = 5
ACK = 6
DATA = 7
PING = 8
PONG = 9

#: ATTACH flag bits that mean "from the given offset": 0x8000 is what the real
#: client sends, 0x0001 the seed's "bit 1" reading; both are accepted (§1)
FROM_OFFSET = 0x8000
FROM_OFFSET_SEED = 0x0001
_FROM_OFFSET_BITS = FROM_OFFSET | FROM_OFFSET_SEED

#: the recommended default limit on ``payload_len`` (the original had none)
DEFAULT_MAX_PAYLOAD_BYTES = 16 * 1024 * 1024

U32_MAX = 0xFFFFFFFF
U64_MAX = 0xFFFFFFFFFFFFFFFF

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_U64_U32 = struct.Struct(">QI")
_ACK = struct.Struct(">HHIQ")

NAMES = {ATTACH: "ATTACH", ATTACHED: "ATTACHED", DETACH: "DETACH", DETACHED: "DETACHED",
         PUBLISH: "PUBLISH", ACK: "ACK", DATA: "DATA", PING: "PING", PONG: "PONG"}


class FiggDecodeError(ValueError):
    """A payload whose fields do not fit in it; the text says which field."""


@dataclass(frozen=True, slots=True)
class Attach:
    topic: bytes
    offset: int = 0
    flags: int = 0

    @property
    def from_offset(self):
        """Whether ``offset`` counts: either flag bit says so (§1)."""
        return bool(self.flags & _FROM_OFFSET_BITS)


@dataclass(frozen=True, slots=True)
class Attached:
    topic: bytes
    offset: int


@dataclass(frozen=True, slots=True)
class Detach:
    topic: bytes


@dataclass(frozen=True, slots=True)
class Detached:
    topic: bytes


@dataclass(frozen=True, slots=True)
class Publish:
    topic: bytes
    seq_num: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Ack:
    seq_num: int


@dataclass(frozen=True, slots=True)
class Data:
    topic: bytes
    offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Ping:
    timestamp: int


@dataclass(frozen=True, slots=True)
class Pong:
    timestamp: int


# -- encoding ---------------------------------------------------------------------


def _var(field):
    return _U32.pack(len(field)) + field


def _frame(msg_type, payload):
    return HEADER.pack(msg_type, VERSION, len(payload)) + payload


def _payload(message):
    kind = type(message)
    if kind is Attach:
        return _U16.pack(message.flags) + _var(message.topic) + _U64.pack(message.offset)
    if kind is Attached:
        return _var(message.topic) + _U64.pack(message.offset)
    if kind is Detach or kind is Detached:
        return _var(message.topic)
    if kind is Publish:
        return _var(message.topic) + _U64_U32.pack(message.seq_num, len(message.data)) \
            + message.data
    if kind is Ack:
        return _U64.pack(message.seq_num)
    if kind is Data:
        return _var(message.topic) + _U64_U32.pack(message.offset, len(message.data)) \
            + message.data
    return _U64.pack(message.timestamp)     # Ping, Pong


_TYPES = {Attach: ATTACH, Attached: ATTACHED, Detach: DETACH, Detached: DETACHED,
          Publish: PUBLISH, Ack: ACK, Data: DATA, Ping: PING, Pong: PONG}


def encode(message):
    """The whole frame (header and payload) for one message.

    Raises ``struct.error`` for a field out of range (an integer above its
    width, a variable field of 4 GiB or more): no frame is better than a
    corrupt one.
    """
    msg_type = _TYPES.get(type(message))
    if msg_type is None:
        raise TypeError(f"not a Figg message: {message!r}")
    return _frame(msg_type, _payload(message))


def encode_acks(seq_nums):
    """ACK frames for ``seq_nums``, in order, as one byte string."""
    pack = _ACK.pack
    return b"".join([pack(ACK, VERSION, 8, s) for s in seq_nums])


class DataEncoder:
    """DATA frames for one topic, many records at a time.

    The frame's fixed part (header, topic, offset, data length) is packed by
    one precompiled ``struct`` per record, so streaming costs one C call and
    two list appends per record.
    """

    __slots__ = ("_fixed", "_pack", "overhead", "topic")

    def __init__(self, topic):
        self.topic = topic
        n = len(topic)
        self._pack = struct.Struct(f">HHII{n}sQI").pack
        #: payload bytes besides the data: topic field, offset, data length
        self._fixed = 4 + n + 8 + 4
        #: frame bytes besides the data
        self.overhead = HEADER.size + self._fixed

    def encode_into(self, parts, first_offset, values, start, budget):
        """Append DATA frames for ``values[start:]`` to ``parts``; the first
        carries ``first_offset``, each next one the offset after.

        Stops once the frames appended add up to ``budget`` bytes or more
        (always after at least one frame). Returns ``(frames, bytes)``
        appended.
        """
        pack = self._pack
        topic = self.topic
        fixed = self._fixed
        n_topic = len(topic)
        overhead = self.overhead
        append = parts.append
        total = 0
        offset = first_offset
        for value in islice(values, start, None):
            size = len(value)
            append(pack(DATA, VERSION, fixed + size, n_topic, topic, offset, size))
            append(value)
            offset += 1
            total += overhead + size
            if total >= budget:
                break
        return offset - first_offset, total


# -- decoding ---------------------------------------------------------------------


def _var_at(payload, pos, what):
    """A ``u32 length + bytes`` field at ``pos``; returns (bytes, next pos)."""
    end = pos + 4
    if end > len(payload):
        raise FiggDecodeError(f"{what} length runs past the payload "
                              f"({len(payload)} bytes)")
    (n,) = _U32.unpack_from(payload, pos)
    if end + n > len(payload):
        raise FiggDecodeError(f"{what} of {n} bytes runs past the payload "
                              f"({len(payload)} bytes)")
    return payload[end:end + n], end + n


def _int_at(payload, pos, fmt, what):
    if pos + fmt.size > len(payload):
        raise FiggDecodeError(f"{what} runs past the payload ({len(payload)} bytes)")
    return fmt.unpack_from(payload, pos)[0], pos + fmt.size


def decode_publish(payload):
    """``(topic, seq_num, data)`` of a PUBLISH payload, without a message object."""
    topic, pos = _var_at(payload, 0, "PUBLISH topic")
    if pos + 12 > len(payload):
        raise FiggDecodeError(f"PUBLISH seq_num and data length run past the payload "
                              f"({len(payload)} bytes)")
    seq_num, n = _U64_U32.unpack_from(payload, pos)
    pos += 12
    if pos + n > len(payload):
        raise FiggDecodeError(f"PUBLISH data of {n} bytes runs past the payload "
                              f"({len(payload)} bytes)")
    return topic, seq_num, payload[pos:pos + n]


def _attach(p):
    flags, pos = _int_at(p, 0, _U16, "ATTACH flags")
    topic, pos = _var_at(p, pos, "ATTACH topic")
    offset, _ = _int_at(p, pos, _U64, "ATTACH offset")
    return Attach(topic, offset, flags)


def _attached(p):
    topic, pos = _var_at(p, 0, "ATTACHED topic")
    offset, _ = _int_at(p, pos, _U64, "ATTACHED offset")
    return Attached(topic, offset)


def _detach(p):
    return Detach(_var_at(p, 0, "DETACH topic")[0])


def _detached(p):
    return Detached(_var_at(p, 0, "DETACHED topic")[0])


def _publish(p):
    return Publish(*decode_publish(p))


def _ack(p):
    return Ack(_int_at(p, 0, _U64, "ACK seq_num")[0])


def _data(p):
    topic, pos = _var_at(p, 0, "DATA topic")
    offset, pos = _int_at(p, pos, _U64, "DATA offset")
    data, _ = _var_at(p, pos, "DATA data")
    return Data(topic, offset, data)


def _ping(p):
    return Ping(_int_at(p, 0, _U64, "PING timestamp")[0])


def _pong(p):
    return Pong(_int_at(p, 0, _U64, "PONG timestamp")[0])


_DECODERS = {ATTACH: _attach, ATTACHED: _attached, DETACH: _detach, DETACHED: _detached,
             PUBLISH: _publish, ACK: _ack, DATA: _data, PING: _ping, PONG: _pong}


def decode_payload(msg_type, payload):
    """The message of type ``msg_type`` in ``payload``; None for a type this
    protocol does not define (the receiver skips it, §4.5)."""
    decoder = _DECODERS.get(msg_type)
    if decoder is None:
        return None
    return decoder(payload)


def decode_frames(data, max_payload_bytes=DEFAULT_MAX_PAYLOAD_BYTES):
    """Cut ``data`` into frames; returns ``(messages, rest)``.

    ``messages`` are the decoded messages of the complete frames (unknown
    types left out), ``rest`` the bytes of an incomplete last frame. A header
    announcing more than ``max_payload_bytes`` raises ``FiggDecodeError``
    without looking at the body, as a receiver must (§1 Limits).
    """
    messages = []
    pos = 0
    size = HEADER.size
    while len(data) - pos >= size:
        msg_type, _, length = HEADER.unpack_from(data, pos)
        if length > max_payload_bytes:
            raise FiggDecodeError(f"payload_len {length} exceeds {max_payload_bytes}")
        end = pos + size + length
        if end > len(data):
            break
        message = decode_payload(msg_type, data[pos + size:end])
        if message is not None:
            messages.append(message)
        pos = end
    return messages, data[pos:]
