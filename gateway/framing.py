"""Length-prefixed framing, shared by every dialect's server and client.

Each dialect's frames start with a fixed header that holds the body length
(RustLog and Kafka: ``u32 BE``; TANK: ``u8 id, u32 LE``; Pravega: ``int32
type, int32 length``; Figg: an 8-byte header). The length is checked
against the limit *before* any of the body is buffered, and bytes are
accumulated in one ``bytearray``, so a large frame arriving in many TCP
segments costs linear time (Twisted's ``IntNStringReceiver`` re-joins its
buffer on every segment, which is quadratic for multi-megabyte frames).
"""
import struct

from twisted.internet.protocol import Protocol


class FramedProtocol(Protocol):
    """Cuts the byte stream into frames.

    Subclasses set ``header`` (a ``struct.Struct``), ``length_field`` (the
    index of the body length among the header's fields) and
    ``max_frame_bytes``, and implement ``frameReceived(fields, body)`` and
    ``frameTooLarge(fields)``. After ``frameTooLarge`` nothing more is read
    from the connection: its framing can no longer be trusted.

    ``hold_frames()`` stops handing frames to ``frameReceived`` at once, even
    in the middle of what one read brought (pausing the transport alone
    stops only the next read, and a read can hold hundreds of pipelined
    requests); ``release_frames`` hands them on again. A server uses this
    to bound what one connection has in flight. ``bytes_in`` and
    ``frame_errors`` (frames over the limit) count this connection's input
    for the gateway's metrics.
    """

    header = struct.Struct(">I")
    length_field = 0
    max_frame_bytes = 1 << 20
    bytes_in = 0
    frame_errors = 0

    _buffer = None
    _discarding = False
    _held = False

    def dataReceived(self, data):
        if self._discarding:
            return
        self.bytes_in += len(data)
        buf = self._buffer
        if buf is None:
            buf = self._buffer = bytearray()
        buf += data
        if self._held:
            return
        header = self.header
        size = header.size
        unpack = header.unpack_from
        field = self.length_field
        limit = self.max_frame_bytes
        pos = 0
        have = len(buf)
        while have - pos >= size:
            fields = unpack(buf, pos)
            length = fields[field]
            if length > limit:
                self._discarding = True
                self._buffer = None
                self.frame_errors += 1
                self.frameTooLarge(fields)
                return
            end = pos + size + length
            if end > have:
                break
            body = bytes(buf[pos + size:end])
            pos = end
            self.frameReceived(fields, body)
            if self._discarding or self._buffer is not buf:
                return
            if self._held:
                break
        if pos:
            del buf[:pos]

    def stopReading(self):
        """Ignore everything that arrives from now on (closing)."""
        self._discarding = True
        self._buffer = None

    def hold_frames(self):
        """Hand no more frames to ``frameReceived`` until ``release_frames``;
        what arrives meanwhile is kept."""
        self._held = True

    def release_frames(self, clock):
        """Hand frames on again. Those kept meanwhile are handed on at the
        next reactor turn of ``clock``, never from inside the caller, which
        may be in the middle of answering an earlier request."""
        self._held = False
        if self._buffer:
            clock.callLater(0, self._dispatch_kept)

    def _dispatch_kept(self):
        if not self._held and self._buffer and not self._discarding:
            # Through dataReceived, so that a subclass that acts once per
            # read (Figg flushes its PUBLISH run) does so for these too.
            self.dataReceived(b"")

    def frameReceived(self, fields, body):
        raise NotImplementedError

    def frameTooLarge(self, fields):
        raise NotImplementedError
