"""A Twisted client of the Pravega dialect, for tests, examples, benchmarks
and bridges (shared/protocols/pravega.md).

- ``PravegaClientProtocol``: one connection. It sends Hello first, gives
  every request its own requestId and routes replies by it (the gateway
  answers whenever a request completes, not in arrival order), and routes
  a writer's replies (DataAppended, ConditionalCheckFailed,
  InvalidEventNumber) by writerId.
- ``EventWriter``: an idempotent writer of one segment, the way the real
  clients write. Every event gets an event number; blocks of events go out
  pipelined and stay in an in-flight queue until a DataAppended covers
  them. When the connection is lost (or the gateway closes it after
  InvalidEventNumber) it reconnects, sends SetupAppend with the same
  writerId, drops the events the gateway reports as stored, and re-sends
  the rest under their original numbers, which makes the whole exactly-once.
- ``EventReader``: reads a segment from an event boundary and reassembles
  events across SegmentRead replies (which may start and end inside
  events); at the tail the gateway parks the read, so ``read()`` waits for
  data without polling.

Errors the gateway answers are ``PravegaError`` with the reply as ``reply``.
"""
import uuid
from collections import deque

from twisted.internet import defer
from twisted.internet.endpoints import HostnameEndpoint, connectProtocol
from twisted.logger import Logger

from gateway.framing import FramedProtocol
from plugins.pravega import codec as pc

__all__ = ["PravegaError", "PravegaClientProtocol", "EventWriter", "EventReader", "connect"]

log = Logger()


class PravegaError(Exception):
    """The gateway answered a request with an error reply (``reply``)."""

    def __init__(self, reply):
        super().__init__(f"{type(reply).__name__}: {reply}")
        self.reply = reply


#: replies that carry a writerId and belong to a writer, not to one request
_WRITER_REPLIES = (pc.DataAppended, pc.ConditionalCheckFailed, pc.InvalidEventNumber)
#: replies that fail the request they answer
_ERRORS = (pc.NoSuchSegment, pc.SegmentIsSealed, pc.SegmentIsTruncated,
           pc.OperationUnsupported, pc.AuthTokenCheckFailed, pc.ErrorMessage,
           pc.SegmentAlreadyExists)


class PravegaClientProtocol(FramedProtocol):
    """The client side of one connection.

    ``hello`` fires with the gateway's Hello. ``request(make)`` builds a
    request with a fresh requestId (``make(request_id)``) and fires with its
    reply; an error reply fails it with ``PravegaError``. A lost connection
    fails every request still waiting, with the reason it was lost.
    """

    header = pc.HEADER
    length_field = 1
    max_frame_bytes = pc.MAX_FRAME_BYTES - pc.HEADER_SIZE

    def __init__(self):
        self.hello = defer.Deferred()
        self.calls = {}           # requestId -> Deferred, or the EventWriter of an append
        self.writers = {}         # writerId -> EventWriter
        self.lost = None
        self.on_lost = defer.Deferred()
        self._next_id = 0

    def connectionMade(self):
        set_no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if set_no_delay is not None:
            set_no_delay(True)
        self.send(pc.Hello(pc.WIRE_VERSION, pc.OLDEST_COMPATIBLE_VERSION))

    def connectionLost(self, reason):
        self.lost = reason
        calls, self.calls = self.calls, {}
        for target in calls.values():
            if isinstance(target, defer.Deferred):
                target.errback(reason)
        if not self.hello.called:
            self.hello.errback(reason)
        writers, self.writers = self.writers, {}
        for writer in set(writers.values()):
            writer.connection_lost(self, reason)
        self.on_lost.callback(None)

    def close(self):
        """Close the connection; fires once it is closed."""
        if self.lost is None:
            self.transport.loseConnection()
        return self.on_lost if not self.on_lost.called else defer.succeed(None)

    def next_request_id(self):
        self._next_id += 1
        return self._next_id

    def send(self, command):
        self.transport.write(pc.encode(command))

    def request(self, make):
        """Send ``make(request_id)``; fires with the reply."""
        if self.lost is not None:
            return defer.fail(self.lost)
        request_id = self.next_request_id()
        d = self.calls[request_id] = defer.Deferred()
        self.send(make(request_id))
        return d

    def frameTooLarge(self, fields):
        self.transport.abortConnection()

    def frameReceived(self, fields, body):
        try:
            reply = pc.decode(fields[0], body)
        except pc.DecodeError as e:
            log.warn("pravega client: undecodable reply ({reason}); closing", reason=e.reason)
            self.transport.abortConnection()
            return
        kind = type(reply)
        if kind is pc.Hello:
            if not self.hello.called:
                self.hello.callback(reply)
            return
        if kind is pc.KeepAlive:
            return
        if kind in _WRITER_REPLIES:
            writer = self.writers.get(reply.writer_id)
            if writer is not None:
                writer.reply(self, reply)
            return
        target = self.calls.pop(getattr(reply, "request_id", None), None)
        if isinstance(target, defer.Deferred):
            if kind in _ERRORS:
                target.errback(PravegaError(reply))
            else:
                target.callback(reply)
        elif target is not None:
            target.reply(self, reply)

    # -- requests ----------------------------------------------------------------

    def setup_append(self, segment, writer_id):
        """Fires with the writer's last stored event number (NO_EVENT_NUMBER if new)."""
        d = self.request(lambda rid: pc.SetupAppend(rid, writer_id, segment, ""))
        return d.addCallback(lambda reply: reply.last_event_number)

    def read_segment(self, segment, offset, length=pc.MAX_READ_BYTES):
        """Fires with the SegmentRead (the gateway parks it at the tail)."""
        return self.request(lambda rid: pc.ReadSegment(segment, offset, length, "", rid))

    def segment_info(self, segment):
        """Fires with the StreamSegmentInfo."""
        return self.request(lambda rid: pc.GetStreamSegmentInfo(rid, segment, ""))

    def create_segment(self, segment):
        """Fires with True if created, False if it existed already."""
        d = self.request(lambda rid: pc.CreateSegment(rid, segment, 0, 0, "", 0))

        def existed(failure):
            failure.trap(PravegaError)
            if isinstance(failure.value.reply, pc.SegmentAlreadyExists):
                return False
            return failure
        return d.addCallbacks(lambda _: True, existed)

    def seal_segment(self, segment):
        return self.request(lambda rid: pc.SealSegment(rid, segment, ""))

    def delete_segment(self, segment):
        return self.request(lambda rid: pc.DeleteSegment(rid, segment, ""))


def connect(reactor, host, port, timeout=30):
    """Connect to a Pravega listener; fires with a ``PravegaClientProtocol``
    once the gateway's Hello has arrived."""
    endpoint = HostnameEndpoint(reactor, host, port, timeout=timeout)
    d = connectProtocol(endpoint, PravegaClientProtocol())
    return d.addCallback(lambda proto: proto.hello.addCallback(lambda _: proto))


class _Pending:
    """One event (or a conditional append) from ``write`` to its ack."""

    __slots__ = ("framed", "number", "expected_offset", "done")

    def __init__(self, framed, expected_offset=None):
        self.framed = framed
        self.number = None
        self.expected_offset = expected_offset
        self.done = defer.Deferred()


class EventWriter:
    """Writes events to one segment exactly once, across reconnects.

    ``connect()`` returns a Deferred of a connected ``PravegaClientProtocol``
    (e.g. ``lambda: connect(reactor, host, port)``); it is called again for
    every reconnect, with a backoff from ``retry_delay`` up to ``max_delay``
    seconds; after ``give_up_after`` failed attempts in a row (None: never)
    the writer fails with the connection error. ``standalone=True`` sends
    blocks as the Rust and Python clients do (a standalone AppendBlockEnd),
    else as the Java client does (AppendBlock + AppendBlockEnd). Events
    written in one reactor turn go out together, in blocks of at most
    ``block_bytes``.

    ``write(value)`` fires once the event is durable. ``write_conditional(
    value, expected_offset)`` fires True once appended, False if the tail
    was not ``expected_offset``. A refusal (SegmentIsSealed, NoSuchSegment)
    fails every pending and later write with ``PravegaError``: the writer is
    then unusable, like the real client's.
    """

    def __init__(self, reactor, connect, segment, writer_id=None, standalone=False,
                 block_bytes=1024 * 1024, retry_delay=0.05, max_delay=2.0, give_up_after=None):
        self.reactor = reactor
        self.connect = connect
        self.segment = segment
        self.writer_id = writer_id or uuid.uuid4().bytes
        self.standalone = standalone
        self.block_bytes = block_bytes
        self.retry_delay = retry_delay
        self.max_delay = max_delay
        self.give_up_after = give_up_after
        self._attempts = 0
        self.proto = None
        self.ready = False
        self.failed = None
        self.closed = False
        self.unsent = deque()       # written, not yet numbered and sent
        self.inflight = deque()     # sent, waiting for an ack, in number order
        self.routes = deque()       # requestIds of the appends sent on ``proto``
        self.next_number = None
        self.reconnects = 0
        self._flush_call = None
        self._delay = retry_delay
        self._start()

    # -- connection --------------------------------------------------------------

    def _start(self):
        d = defer.maybeDeferred(self.connect)
        d.addCallbacks(self._connected, self._retry)

    def _retry(self, failure):
        if self.closed or self.failed is not None:
            return
        self._attempts += 1
        if self.give_up_after is not None and self._attempts >= self.give_up_after:
            self._fail(failure.value)
            return
        log.info("pravega writer {segment}: reconnecting in {delay}s ({why})",
                 segment=self.segment, delay=self._delay, why=failure.getErrorMessage())
        self.reactor.callLater(self._delay, self._start)
        self._delay = min(self._delay * 2, self.max_delay)

    def _connected(self, proto):
        if self.closed:
            proto.close()
            return
        if proto.lost is not None:
            # lost between its Hello and now: nobody else will retry
            self._retry(proto.lost)
            return
        self.proto = proto
        self.routes.clear()
        proto.writers[self.writer_id] = self
        d = proto.setup_append(self.segment, self.writer_id)
        d.addCallbacks(self._set_up, self._setup_failed, errbackArgs=(proto,))

    def _setup_failed(self, failure, proto):
        if failure.check(PravegaError):
            self._fail(failure.value)
            proto.close()
        # a lost connection: connection_lost retries

    def _set_up(self, last):
        """Drop what the gateway has stored already and re-send the rest
        under the same numbers, then the events not sent yet."""
        self._delay = self.retry_delay
        self._attempts = 0
        if self.next_number is None:
            self.next_number = max(last, 0) + 1
        while self.inflight and self.inflight[0].number <= last:
            pending = self.inflight.popleft()
            pending.done.callback(True)
        self.ready = True
        resend, self.inflight = self.inflight, deque()
        self.unsent.extendleft(reversed(resend))
        self._send()

    def connection_lost(self, proto, reason):
        if proto is not self.proto:
            return
        self.proto = None
        self.ready = False
        if self.closed or self.failed is not None:
            return
        self.reconnects += 1
        self._retry(reason)

    # -- writing -------------------------------------------------------------------

    def write(self, value):
        """Append one event; fires once it is durable."""
        return self._queue(_Pending(pc.frame_event(value))).addCallback(lambda _: None)

    def write_conditional(self, value, expected_offset):
        """Append one event only if the segment's tail is ``expected_offset``;
        fires True if appended, False if the check failed."""
        return self._queue(_Pending(pc.frame_event(value), expected_offset))

    def _queue(self, pending):
        if self.failed is not None:
            return defer.fail(self.failed)
        if self.closed:
            return defer.fail(RuntimeError("writer closed"))
        self.unsent.append(pending)
        if self.ready and self._flush_call is None:
            self._flush_call = self.reactor.callLater(0, self._send)
        return pending.done

    def flush(self):
        """Fires once everything written so far is acknowledged."""
        waits = [p.done for p in list(self.inflight) + list(self.unsent)]
        return defer.DeferredList(waits, fireOnOneErrback=True, consumeErrors=True).addCallback(
            lambda _: None)

    def _send(self):
        """Send the unsent events, numbering those sent for the first time:
        runs of plain events as blocks, conditional ones on their own."""
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None
        if not self.ready:
            return
        proto = self.proto
        unsent = self.unsent
        while unsent:
            if unsent[0].expected_offset is not None:
                pending = unsent.popleft()
                self._number(pending)
                self.inflight.append(pending)
                self._send_conditional(proto, pending)
                continue
            block = []
            size = 0
            while unsent and unsent[0].expected_offset is None and (
                    not block or size + len(unsent[0].framed) <= self.block_bytes):
                pending = unsent.popleft()
                self._number(pending)
                block.append(pending)
                size += len(pending.framed)
            self.inflight.extend(block)
            self._send_block(proto, block)

    def _number(self, pending):
        if pending.number is None:
            pending.number = self.next_number
            self.next_number += 1

    def _route(self, proto):
        """A requestId for an append: refusals (SegmentIsSealed, ...) answer
        it and are routed to this writer."""
        request_id = proto.next_request_id()
        proto.calls[request_id] = self
        self.routes.append(request_id)
        return request_id

    def _send_block(self, proto, block):
        data = b"".join(p.framed for p in block)
        request_id = self._route(proto)
        last = block[-1].number
        if self.standalone:
            end = pc.AppendBlockEnd(self.writer_id, len(data), data, len(block), last, request_id)
            proto.send(end)
        else:
            proto.transport.writeSequence([
                pc.encode(pc.AppendBlock(self.writer_id, data)),
                pc.encode(pc.AppendBlockEnd(self.writer_id, len(data), b"", len(block), last,
                                            request_id))])

    def _send_conditional(self, proto, pending):
        request_id = self._route(proto)
        # the framed event minus its 8-byte header is the value
        proto.send(pc.ConditionalAppend(self.writer_id, pending.number, pending.expected_offset,
                                        pc.EVENT, pending.framed[pc.EVENT_HEADER_SIZE:],
                                        request_id))

    # -- replies ----------------------------------------------------------------------

    def reply(self, proto, reply):
        kind = type(reply)
        if kind is pc.DataAppended:
            self._forget(proto, reply.request_id)
            inflight = self.inflight
            while inflight and inflight[0].number <= reply.event_number:
                inflight.popleft().done.callback(True)
        elif kind is pc.ConditionalCheckFailed:
            self._forget(proto, reply.request_id)
            for pending in self.inflight:
                if pending.number == reply.event_number:
                    self.inflight.remove(pending)
                    pending.done.callback(False)
                    break
        elif kind in (pc.InvalidEventNumber, pc.ErrorMessage):
            # The gateway closes the connection next; the writer reconnects
            # and re-sends after SetupAppend.
            log.info("pravega writer {segment}: {reply}; re-sending after a reconnect",
                     segment=self.segment, reply=reply)
        else:
            # SegmentIsSealed, NoSuchSegment, ...: the writer is unusable
            self._fail(PravegaError(reply))

    def _forget(self, proto, up_to):
        """Acks are cumulative: drop the routes of the requests they cover."""
        routes = self.routes
        while routes and routes[0] <= up_to:
            proto.calls.pop(routes.popleft(), None)

    def _fail(self, reason):
        if self.failed is not None:
            return
        self.failed = reason
        self.ready = False
        waiting = list(self.inflight) + list(self.unsent)
        self.inflight.clear()
        self.unsent.clear()
        for pending in waiting:
            pending.done.errback(reason)

    def close(self):
        """Stop writing (pending events fail) and close the connection."""
        self.closed = True
        self._fail(RuntimeError("writer closed"))
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        proto, self.proto = self.proto, None
        return proto.close() if proto is not None else defer.succeed(None)


class EventReader:
    """Reads the events of one segment from ``offset`` (an event boundary).

    ``read()`` fires with a list of ``(position, value)``: the events that
    are complete in what the gateway returned, after as many reads as it
    takes to complete at least one (an event can span replies). At the tail
    the gateway parks each read; an empty ``atTail`` reply (its long-poll
    limit) is simply asked again. At the end of a sealed segment ``read()``
    fires with ``[]``.
    """

    def __init__(self, proto, segment, offset=0, read_size=pc.MAX_READ_BYTES):
        self.proto = proto
        self.segment = segment
        self.position = offset          # where ``buffer`` starts: an event boundary
        self.buffer = bytearray()
        self.read_size = read_size
        self.end_of_segment = False

    @defer.inlineCallbacks
    def read(self):
        while True:
            events = self._take()
            if events or self.end_of_segment:
                return events
            offset = self.position + len(self.buffer)
            reply = yield self.proto.read_segment(self.segment, offset, self.read_size)
            if reply.offset != offset:
                raise ValueError(f"read at {offset} answered at {reply.offset}")
            self.buffer += reply.data
            if reply.end_of_segment and not reply.data:
                self.end_of_segment = True
                if self.buffer:
                    raise ValueError(f"segment {self.segment} ends inside an event at "
                                     f"{self.position}")

    def _take(self):
        """The complete events at the head of the buffer."""
        buf = self.buffer
        events = []
        pos = 0
        unpack = pc.EVENT_HEADER.unpack_from
        while len(buf) - pos >= pc.EVENT_HEADER_SIZE:
            kind, length = unpack(buf, pos)
            if kind != pc.EVENT or length < 0:
                raise ValueError(f"no event at position {self.position + pos} of "
                                 f"{self.segment} (type {kind}, length {length})")
            end = pos + pc.EVENT_HEADER_SIZE + length
            if end > len(buf):
                break
            events.append((self.position + pos, bytes(buf[pos + pc.EVENT_HEADER_SIZE:end])))
            pos = end
        if pos:
            del buf[:pos]
            self.position += pos
        return events

