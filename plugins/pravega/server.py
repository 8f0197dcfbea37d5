"""Pravega segment-store server: WireCommands <-> bus commands
(shared/protocols/pravega.md; §n below are that sheet's sections).

One connection carries any number of writers, reads and requests for any
segments, in any order (the Rust client pools connections), so nothing is
answered in global arrival order: replies are routed by requestId. What must
be ordered is ordered per writer: every append answer (DataAppended,
ConditionalCheckFailed, SegmentIsSealed, InvalidEventNumber) goes out in the
order the writer's appends arrived, and each DataAppended carries the
previous one's number.

Appends are pipelined: each block is handed to the bus as soon as it is
assembled, as one atomic Produce with the writer's compare-and-set
``(writer id, expected, new last event number)``, and the next block's
expected number is this block's (§6.3). The bus answers once the batch is
durable, which is when DataAppended is sent (§6.4). A conditional append is
a barrier: it waits for the writer's earlier appends, checks the tail, and
holds later appends until it is decided, because after a failed check the
writer's expected number must roll back (§6.5).

What an unmodified application needs beyond event appends and reads is
served as shared/protocols/pravega-clients.md (§n' below) specifies:

- byte streams: a ConditionalBlockEnd on a partition appends raw bytes to a
  byte topic (the first such append makes an undecided topic one); its
  segment view is the plain concatenation of the values (§3.2');
- large events: a transient segment lives in this connection's memory and
  collects ConditionalBlockEnd chunks; MergeSegments stores its event in the
  parent partition as one record (§3.3');
- table segments (reader-group state): the bus's durable key-value tables,
  keyed by the full segment name, never topics (§3.4').

Errors: frames no correct client sends get ErrorMessage and the connection
is closed (§9); refusals of well-formed requests keep it open (§6.6), except
a lost writer compare-and-set, which is answered InvalidEventNumber and
closed so that the client's reconnect resolves it (§6.3).

Flow control: the protocol is the transport's push producer. While the
transport's write buffer is full it stops reading requests, and reads about
to fetch data wait, so a client that stops reading costs at most about one
read reply beyond the buffer. At most ``max_in_flight`` requests (the
listener's limit, 1024 by default) may be pending per connection before
reading stops too.
"""
import math
import struct
import uuid
from collections import deque

from twisted.internet import defer
from twisted.internet.interfaces import IPushProducer
from twisted.logger import Logger
from zope.interface import implementer

from gateway import commands as c
from gateway.errors import (
    InvalidRequest, InvalidTopicName, KindMismatch, NotAuthorized,
    OffsetOutOfRange, PartitionSealed, RecordTooLarge, TableBadVersion, TableExists,
    TableKeyMissing, TableNotEmpty, TopicExists, UnknownPartition, UnknownTable,
    UnknownTopic, WriterConflict)
from gateway.framing import FramedProtocol
from gateway.protocol import DialectFactory, TrackedConnection
from gateway.records import PRAVEGA_EVENTS, EncodedBatch, RecordBatch
from plugins.pravega import DEFAULT_LONG_POLL_MS, DEFAULT_SCOPE
from plugins.pravega import codec as pc

log = Logger()

#: bus errors that mean "this segment does not exist" to a Pravega client
MISSING = (UnknownTopic, UnknownPartition, InvalidTopicName)
#: bus errors that refuse an event append; the writer gets SegmentIsSealed
#: (§6.6), the one refusal clients fail on at once (a topic deleted under a
#: writer included). A byte append refused for the same reasons gets
#: ConditionalCheckFailed instead (§4.2').
APPEND_REFUSALS = (PartitionSealed, KindMismatch, RecordTooLarge, NotAuthorized) + MISSING
#: live transient segments per connection (§3.3'). A client writes one large
#: event at a time per writer; beyond this many the oldest is dropped, which
#: bounds what a connection can hold in memory.
MAX_TRANSIENTS = 16
#: a transient segment untouched this long is dropped (a client that gave up
#: on a large write retries it whole, with a new transient)
TRANSIENT_IDLE_SECONDS = 60.0
#: an 8-byte continuation token of ReadTableKeys / ReadTableEntries
_POSITION = struct.Struct(">q")

_HELLO = pc.encode(pc.Hello(pc.WIRE_VERSION, pc.OLDEST_COMPATIBLE_VERSION))
_KEEP_ALIVE = pc.encode(pc.KeepAlive())


class _Writer:
    """One writer set up on this connection (§6.1).

    ``expected`` is the number the next append's compare-and-set expects
    (the last one handed to the bus), ``acked`` the last one acknowledged.
    ``refused`` is the answer every later append gets once one was refused
    (§6.6), until the next SetupAppend. ``transient`` is set for a writer on
    a transient segment (§3.3'): it appends chunks there, and its refusals
    name the parent.
    """

    __slots__ = ("writer_id", "segment", "topic", "partition", "expected", "acked",
                 "refused", "transient", "order", "inflight", "idle", "gated", "held")

    def __init__(self, writer_id):
        self.writer_id = writer_id
        self.order = deque()     # [Deferred, emit, done] in arrival order
        self.inflight = 0        # appends handed to the bus and not yet answered
        self.idle = []           # callables waiting for inflight to reach 0
        self.gated = False       # a conditional append holds later appends
        self.held = deque()      # (Deferred, submit) waiting for the gate
        self.segment = None
        self.topic = None
        self.partition = None
        self.expected = self.acked = pc.NO_EVENT_NUMBER
        self.refused = False
        self.transient = None

    def setup(self, segment, topic, partition, number, transient=None):
        self.segment = segment
        self.topic = topic
        self.partition = partition
        self.expected = self.acked = number
        self.refused = False
        self.transient = transient


class _Transient:
    """A transient segment (§3.3'): the chunks of one large event, in this
    connection's memory only, never durable and never a topic.

    ``checked`` says the first chunk passed the checks (the event's header,
    the parent's kind and seal), ``refused`` that a chunk was refused: every
    later chunk is refused the same way. ``expiry`` drops it when idle.
    """

    __slots__ = ("name", "parent", "topic", "partition", "chunks", "size", "checked",
                 "refused", "expiry")

    def __init__(self, name, parent, topic, partition):
        self.name = name
        self.parent = parent
        self.topic = topic
        self.partition = partition
        self.chunks = []
        self.size = 0
        self.checked = False
        self.refused = False
        self.expiry = None


@implementer(IPushProducer)
class PravegaProtocol(TrackedConnection, FramedProtocol):
    header = pc.HEADER
    length_field = 1

    _handlers = {
        pc.Hello: "do_Hello",
        pc.KeepAlive: "do_KeepAlive",
        pc.Padding: "do_Padding",
        pc.SetupAppend: "do_SetupAppend",
        pc.AppendBlock: "do_AppendBlock",
        pc.AppendBlockEnd: "do_AppendBlockEnd",
        pc.ConditionalAppend: "do_ConditionalAppend",
        pc.ConditionalBlockEnd: "do_ConditionalBlockEnd",
        pc.ReadSegment: "do_ReadSegment",
        pc.GetStreamSegmentInfo: "do_GetStreamSegmentInfo",
        pc.CreateSegment: "do_CreateSegment",
        pc.SealSegment: "do_SealSegment",
        pc.DeleteSegment: "do_DeleteSegment",
        pc.CreateTransientSegment: "do_CreateTransientSegment",
        pc.MergeSegments: "do_MergeSegments",
        pc.CreateTableSegment: "do_CreateTableSegment",
        pc.DeleteTableSegment: "do_DeleteTableSegment",
        pc.UpdateTableEntries: "do_UpdateTableEntries",
        pc.RemoveTableKeys: "do_RemoveTableKeys",
        pc.ReadTable: "do_ReadTable",
        pc.ReadTableKeys: "do_ReadTableKeys",
        pc.ReadTableEntries: "do_ReadTableEntries",
        pc.ReadTableEntriesDelta: "do_ReadTableEntriesDelta",
        pc.Unsupported: "do_Unsupported",
    }

    def connectionMade(self):
        super().connectionMade()
        factory = self.factory
        self.bus = factory.bus
        self.reactor = factory.bus.reactor
        self.scope = factory.scope
        self.long_poll = factory.long_poll_ms / 1000.0
        self.max_frame_bytes = factory.max_frame_bytes - pc.HEADER_SIZE
        self.max_in_flight = factory.in_flight_limit()
        self.writers = {}
        self.block = None           # an AppendBlock waiting for its AppendBlockEnd
        self.transients = {}        # transient segment name -> _Transient, oldest first
        self.requests = set()       # Deferreds of requests in progress (parked reads too)
        self.pending = 0            # requests and appends not yet answered
        self.paused_for = set()     # why the transport is not being read
        self.write_paused = False
        self.write_waiters = deque()
        self.closing = False
        set_no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if set_no_delay is not None:
            # Acks are small and a writer's flush waits for them.
            set_no_delay(True)
        self.transport.registerProducer(self, True)

    def connectionLost(self, reason):
        self.stopProducing()
        super().connectionLost(reason)

    # -- flow control ------------------------------------------------------------

    def pauseProducing(self):
        """The transport's write buffer is full: stop taking requests, and
        let reads wait before they fetch data."""
        self.write_paused = True
        self._pause("writes")

    def resumeProducing(self):
        self.write_paused = False
        self._resume("writes")
        waiters = self.write_waiters
        while waiters and not self.write_paused:
            d = waiters.popleft()
            if not d.called:
                d.callback(None)

    def stopProducing(self):
        """The connection is going away: cancel parked reads and requests,
        and drop its transient segments."""
        self.closing = True
        for transient in list(self.transients.values()):
            self._drop_transient(transient)
        requests, self.requests = self.requests, set()
        for d in requests:
            d.cancel()
        waiters, self.write_waiters = self.write_waiters, deque()
        for d in waiters:
            d.cancel()

    def _pause(self, reason):
        if not self.paused_for and not self.closing:
            self.transport.pauseProducing()
        self.paused_for.add(reason)

    def _resume(self, reason):
        if reason not in self.paused_for:
            return
        self.paused_for.discard(reason)
        if not self.paused_for and not self.closing:
            self.transport.resumeProducing()

    def _writable(self):
        """A Deferred that fires once the transport takes writes again."""
        d = defer.Deferred()
        self.write_waiters.append(d)
        return d

    def _begin(self):
        self.pending += 1
        if self.pending > self.max_in_flight:
            self._pause("requests")

    def _end(self):
        self.pending -= 1
        if self.pending <= self.max_in_flight // 2:
            self._resume("requests")

    # -- frames ------------------------------------------------------------------------

    def frameTooLarge(self, fields):
        length = fields[1]
        if length >= pc.NEGATIVE_LENGTH:
            self._protocol_error(f"negative frame length {length - (1 << 32)}")
        else:
            self._protocol_error(f"frame of {length + pc.HEADER_SIZE} bytes exceeds "
                                 f"{self.max_frame_bytes + pc.HEADER_SIZE}")

    def frameReceived(self, fields, body):
        code = fields[0]
        if self.block is not None and code != pc.APPEND_BLOCK_END:
            self._protocol_error(f"AppendBlock followed by type {code} instead of "
                                 f"AppendBlockEnd")
            return
        try:
            command = pc.decode(code, body)
        except pc.DecodeError as e:
            self._protocol_error(e.reason, e.request_id, e.segment)
            return
        handler = self._handlers.get(type(command))
        if handler is None:
            self._protocol_error(f"{type(command).__name__} (type {code}) is not a request")
            return
        getattr(self, handler)(command)

    def _protocol_error(self, reason, request_id=-1, segment=""):
        """Input no correct client sends (§9): ErrorMessage, then close."""
        self.log_protocol_error(reason)
        self._close_with(pc.encode(pc.ErrorMessage(request_id, segment, reason,
                                                   pc.ERROR_UNSPECIFIED)))

    def _close_with(self, frame):
        """Send ``frame`` (if any) and close; nothing after it is read."""
        if self.closing:
            return
        self.stopReading()
        self.block = None
        if frame is not None:
            self.transport.write(frame)
        self.closing = True
        self.transport.loseConnection()

    def _internal(self, failure, request_id, segment):
        """A bug or a storage failure behind a request: logged with its
        traceback; the client gets ErrorMessage and reconnects (a retry)."""
        self.factory.log_failure(failure)
        self._close_with(pc.encode(pc.ErrorMessage(request_id, segment, "internal error",
                                                   pc.ERROR_UNSPECIFIED)))

    def _write(self, reply):
        if reply is None or self.closing:
            return
        if isinstance(reply, list):
            self.transport.writeSequence(reply)
        else:
            self.transport.write(reply)

    # -- housekeeping ----------------------------------------------------------------------

    def do_Hello(self, hello):
        self.transport.write(_HELLO)
        if hello.low_version > pc.WIRE_VERSION or hello.high_version < pc.OLDEST_COMPATIBLE_VERSION:
            self.log_protocol_error(f"incompatible client versions {hello.low_version}.."
                                    f"{hello.high_version}")
            self._close_with(None)

    def do_KeepAlive(self, _):
        self.transport.write(_KEEP_ALIVE)

    def do_Padding(self, _):
        """A top-level Padding is ignored (§6.2)."""

    def do_Unsupported(self, request):
        self.transport.write(pc.encode(pc.OperationUnsupported(
            request.request_id, request.operation, "")))

    # -- requests answered whenever they complete ----------------------------------------------

    def _answer(self, d, request_id, segment, operation, offset=-1):
        """Send what ``d`` fires with (bytes, chunks or None) once it fires,
        with bus errors answered as a Pravega client expects them."""
        self.requests.add(d)
        self._begin()

        def done(result):
            self.requests.discard(d)
            self._end()
            return result
        d.addBoth(done)
        d.addErrback(self._request_failed, request_id, segment, operation, offset)
        d.addCallback(self._write)

    def _request_failed(self, failure, request_id, segment, operation, offset):
        if failure.check(defer.CancelledError):
            return None
        error = failure.value
        if isinstance(error, MISSING + (UnknownTable,)):
            return pc.encode(pc.NoSuchSegment(request_id, segment, "", offset))
        if isinstance(error, TableBadVersion):
            return pc.encode(pc.TableKeyBadVersion(request_id, segment, ""))
        if isinstance(error, TableKeyMissing):
            return pc.encode(pc.TableKeyDoesNotExist(request_id, segment, ""))
        if isinstance(error, TableNotEmpty):
            return pc.encode(pc.TableSegmentNotEmpty(request_id, segment, ""))
        if isinstance(error, NotAuthorized):
            return pc.encode(pc.AuthTokenCheckFailed(request_id, "", pc.AUTH_CHECK_FAILED))
        if isinstance(error, OffsetOutOfRange):
            return pc.encode(pc.SegmentIsTruncated(request_id, segment, error.log_start, "",
                                                   offset))
        if isinstance(error, InvalidRequest):
            log.info("pravega {operation} {segment}: {error}", operation=operation,
                     segment=segment, error=str(error))
            return pc.encode(pc.OperationUnsupported(request_id, operation, ""))
        self._internal(failure, request_id, segment)
        return None

    def _target(self, segment):
        return pc.parse_segment_name(segment, self.scope)

    def do_ReadSegment(self, read):
        target = self._target(read.segment)
        if target is None:
            self.transport.write(pc.encode(pc.NoSuchSegment(read.request_id, read.segment, "",
                                                            read.offset)))
            return
        self._answer(self._read(read, *target), read.request_id, read.segment, "readSegment",
                     read.offset)

    @defer.inlineCallbacks
    def _read(self, read, topic, partition):
        """§7.1: the bytes of the event-framed view from exactly ``offset``;
        parked at the tail until the tail passes it, the partition is sealed
        or the long-poll limit passes."""
        bus = self.bus
        offset = read.offset
        size = min(pc.MAX_READ_BYTES, max(pc.MIN_READ_BYTES, read.suggested_length))
        deadline = self.reactor.seconds() + self.long_poll
        while True:
            if self.write_paused:
                yield self._writable()
            state = yield bus.execute(c.PartitionInfo(topic, partition))
            if offset < state.start_position:
                return pc.encode(pc.SegmentIsTruncated(read.request_id, read.segment,
                                                       state.start_position, "", offset))
            if offset < state.end_position:
                chunks, at_tail = yield self._collect(topic, partition, offset, size)
                return pc.segment_read_chunks(read.segment, offset, at_tail,
                                              at_tail and state.sealed, chunks, read.request_id)
            if state.sealed:
                return pc.segment_read_chunks(read.segment, offset, True, True, [],
                                              read.request_id)
            wait = deadline - self.reactor.seconds()
            if wait <= 0:
                return pc.segment_read_chunks(read.segment, offset, True, False, [],
                                              read.request_id)
            # Parked in the bus until an append (from any dialect) or a seal
            # wakes the partition; then look again.
            yield bus.execute(c.ReadPosition(topic, partition, offset, 1,
                                             max_wait_ms=math.ceil(wait * 1000)))

    @defer.inlineCallbacks
    def _collect(self, topic, partition, offset, size):
        """Up to ``size`` bytes of the view from ``offset`` (which is below
        the tail): ``(chunks, at_tail)``. Batches written by Pravega event
        writers are their own view and pass through; others are framed from
        their records, or, in a byte topic, are the plain concatenation of
        their values (§1'). Reads continue past a short batch list, so a
        reply has exactly ``min(tail, offset + size) - offset`` bytes (§7.1)."""
        bus = self.bus
        chunks = []
        pos = offset
        want = size
        kind = None
        while True:
            part = yield bus.execute(c.ReadPosition(topic, partition, pos, want))
            if part.error is not None:
                raise part.error
            if not part.batches:
                return chunks, True
            for batch in part.batches:
                if batch.format == PRAVEGA_EVENTS:
                    view = batch.payload
                else:
                    if kind is None:
                        kind = (yield self._topic_info(topic)).kind
                    values = bus.decode(batch).values
                    view = b"".join(values) if kind == "bytes" else pc.frame_events(values)
                start = pos - batch.stream_pos
                piece = view[start:start + want]
                chunks.append(piece)
                pos += len(piece)
                want -= len(piece)
                if want == 0:
                    return chunks, (start + len(piece) == len(view)
                                    and batch.next_offset >= part.high_watermark)
            if part.batches[-1].next_offset >= part.high_watermark:
                return chunks, True

    def _segment_or_answer(self, request):
        """``(topic, partition)`` the request's segment names, or None after
        answering NoSuchSegment (§7)."""
        target = self._target(request.segment)
        if target is None:
            self.transport.write(pc.encode(pc.NoSuchSegment(request.request_id,
                                                            request.segment, "", -1)))
        return target

    def do_GetStreamSegmentInfo(self, request):
        target = self._segment_or_answer(request)
        if target is None:
            return
        self._answer(self._info(request, *target), request.request_id, request.segment,
                     "getStreamSegmentInfo")

    @defer.inlineCallbacks
    def _info(self, request, topic, partition):
        """§7.4; lastModified is the append time of the last batch, or the
        topic's creation time while the partition holds no records."""
        bus = self.bus
        state = yield bus.execute(c.PartitionInfo(topic, partition))
        if state.high_watermark > state.log_start:
            parts = yield bus.execute(c.Fetch([c.FetchPartition(
                topic, partition, state.high_watermark - 1, 1)]))
            if parts[0].error is not None:
                raise parts[0].error
            modified = parts[0].batches[-1].append_ms
        else:
            modified = (yield self._topic_info(topic)).created_ms
        return pc.encode(pc.StreamSegmentInfo(
            request.request_id, request.segment, True, state.sealed, False, modified,
            state.end_position, state.start_position))

    @defer.inlineCallbacks
    def _topic_info(self, topic):
        metas = yield self.bus.execute(c.Metadata([topic]))
        if metas[0].error is not None:
            raise metas[0].error
        return metas[0].info

    def do_CreateSegment(self, request):
        target = self._segment_or_answer(request)
        if target is None:
            return
        self._answer(self._create(request, *target), request.request_id, request.segment,
                     "createSegment")

    @defer.inlineCallbacks
    def _create(self, request, topic, partition):
        """§7.5: an existing partition is SegmentAlreadyExists; otherwise the
        topic is created with at least p+1 partitions, or grown to p+1.

        A topic created here starts ``undecided`` (pravega-clients.md §1):
        its first append, from any dialect, makes it an event topic (or,
        once byte streams exist, a byte topic)."""
        bus = self.bus
        try:
            yield bus.execute(c.PartitionInfo(topic, partition))
            return pc.encode(pc.SegmentAlreadyExists(request.request_id, request.segment, ""))
        except UnknownTopic:
            try:
                info = yield bus.execute(c.CreateTopic(topic, None, kind="undecided"))
            except TopicExists:
                info = yield self._topic_info(topic)
        except UnknownPartition:
            info = yield self._topic_info(topic)
        if partition >= info.partitions:
            yield bus.execute(c.CreatePartitions(topic, partition + 1))
        return pc.encode(pc.SegmentCreated(request.request_id, request.segment))

    def do_SealSegment(self, request):
        target = self._segment_or_answer(request)
        if target is None:
            return
        topic, partition = target
        d = self.bus.execute(c.SealPartition(topic, partition))
        d.addCallback(lambda _: pc.encode(pc.SegmentSealed(request.request_id, request.segment)))
        self._answer(d, request.request_id, request.segment, "sealSegment")

    def do_DeleteSegment(self, request):
        target = self._segment_or_answer(request)
        if target is None:
            return
        self._answer(self._delete(request, *target), request.request_id, request.segment,
                     "deleteSegment")

    @defer.inlineCallbacks
    def _delete(self, request, topic, partition):
        """§7.6: the bus deletes whole topics, so only a sealed topic of one
        partition is deleted; a stream is deleted through the controller."""
        bus = self.bus
        state = yield bus.execute(c.PartitionInfo(topic, partition))
        info = yield self._topic_info(topic)
        if info.partitions != 1 or not state.sealed:
            return pc.encode(pc.OperationUnsupported(request.request_id, "deleteSegment", ""))
        yield bus.execute(c.DeleteTopic(topic))
        return pc.encode(pc.SegmentDeleted(request.request_id, request.segment))

    # -- transient segments and merges (§3.3') ---------------------------------------------------

    def do_CreateTransientSegment(self, request):
        """A new transient segment of an existing partition, owned by this
        connection. Never refused once the parent exists: any other answer
        makes the client retry at once, forever (§4.1' rule 8), so every
        check waits for the first chunk."""
        target = self._target(request.parent_segment)
        if target is None:
            self.transport.write(pc.encode(pc.NoSuchSegment(
                request.request_id, request.parent_segment, "", -1)))
            return

        def created(_):
            name = f"{request.parent_segment}#transient.{uuid.uuid4().hex}"
            transient = _Transient(name, request.parent_segment, *target)
            transient.expiry = self.reactor.callLater(TRANSIENT_IDLE_SECONDS,
                                                      self._drop_transient, transient)
            self.transients[name] = transient
            if len(self.transients) > MAX_TRANSIENTS:
                self._drop_transient(next(iter(self.transients.values())))
            return pc.encode(pc.SegmentCreated(request.request_id, name))
        d = self.bus.execute(c.PartitionInfo(*target))
        d.addCallback(created)
        self._answer(d, request.request_id, request.parent_segment, "createTransientSegment")

    def _drop_transient(self, transient):
        """Forget a transient segment and its bytes (merged, idle, or its
        connection closed). A writer still set up on it has its later
        chunks refused."""
        self.transients.pop(transient.name, None)
        transient.chunks = []
        transient.refused = True
        if transient.expiry is not None and transient.expiry.active():
            transient.expiry.cancel()

    def _submit_chunk(self, writer, end):
        """One chunk of a large event (§3.3' step 4): appended to the
        transient in memory if it continues it exactly. The first chunk
        decides whether the event can be stored at all: it must start with
        an Event header of at most ``limits.max_record_bytes``, and the
        parent must be an open event partition; otherwise this chunk and
        every later one get SegmentIsSealed naming the parent, which makes
        the client fail at once (§4.2'). No chunk may take the transient
        past the largest event frame the record limit allows, which bounds
        the memory a large write holds."""
        transient = writer.transient
        if transient.refused or writer.refused:
            return self._refusal(writer, end.request_id)
        if end.expected_offset != transient.size:
            frame = pc.encode(pc.ConditionalCheckFailed(writer.writer_id, end.event_number,
                                                        end.request_id))
            return lambda: self._write(frame)
        if transient.checked:
            return self._take_chunk(writer, end)
        if len(end.data) < pc.EVENT_HEADER_SIZE:
            log.info("pravega large event for {segment} refused: a first chunk of {n} bytes",
                     segment=transient.parent, n=len(end.data))
            return self._refuse_transient(writer, end.request_id)
        kind, length = pc.EVENT_HEADER.unpack_from(end.data)
        limit = self.bus.limits.max_record_bytes
        if kind != pc.EVENT or not 0 <= length <= limit:
            log.warn("pravega large event for {segment} refused: type {kind}, {length} bytes "
                     "(limits.max_record_bytes {limit})", segment=transient.parent, kind=kind,
                     length=length, limit=limit)
            return self._refuse_transient(writer, end.request_id)
        writer.gated = True
        result = defer.Deferred()

        @defer.inlineCallbacks
        def check():
            state = yield self.bus.execute(c.PartitionInfo(transient.topic, transient.partition))
            info = yield self._topic_info(transient.topic)
            if state.sealed or info.kind == "bytes":
                log.info("pravega large event for {segment} refused: the partition is "
                         "{why}", segment=transient.parent,
                         why="sealed" if state.sealed else "a byte stream")
                return self._refuse_transient(writer, end.request_id)
            transient.checked = True
            return self._take_chunk(writer, end)

        def refused(failure):
            failure.trap(*APPEND_REFUSALS)
            return self._refuse_transient(writer, end.request_id)

        def decided(emit):
            result.callback(emit)
            self._release(writer)
        check().addErrback(refused).addErrback(self._chunk_failed, end).addBoth(decided)
        return result

    def _chunk_failed(self, failure, end):
        return lambda: self._internal(failure, end.request_id, "")

    def _refuse_transient(self, writer, request_id):
        writer.transient.refused = True
        writer.transient.chunks = []
        return self._refusal(writer, request_id)

    def _take_chunk(self, writer, end):
        transient = writer.transient
        if transient.refused:       # dropped while its first chunk was checked
            return self._refusal(writer, end.request_id)
        frame_limit = pc.EVENT_HEADER_SIZE + self.bus.limits.max_record_bytes
        if transient.size + len(end.data) > frame_limit:
            log.warn("pravega large event for {segment} refused: chunks beyond its "
                     "{limit}-byte frame", segment=transient.parent, limit=frame_limit)
            return self._refuse_transient(writer, end.request_id)
        transient.chunks.append(end.data)
        transient.size += len(end.data)
        transient.expiry.reset(TRANSIENT_IDLE_SECONDS)
        writer.expected = end.event_number
        frame = pc.encode_data_appended(writer.writer_id, end.event_number, writer.acked,
                                        end.request_id, transient.size)
        writer.acked = end.event_number
        return lambda: self._write(frame)

    def do_MergeSegments(self, request):
        """§3.3' step 5: the transient's events become records of the parent
        in one Produce (no writer compare-and-set), and SegmentsMerged
        reports the parent's new tail once they are durable. The transient
        is gone either way: a refused merge makes the client write the whole
        event again, and its first chunk is then refused cleanly."""
        transient = self.transients.get(request.source)
        if transient is None:
            self.transport.write(pc.encode(pc.NoSuchSegment(request.request_id, request.source,
                                                            "", -1)))
            return
        payload = None if transient.refused else b"".join(transient.chunks)
        self._drop_transient(transient)
        self._answer(self._merge(request, transient, payload), request.request_id,
                     request.target, "mergeSegments")

    @defer.inlineCallbacks
    def _merge(self, request, transient, payload):
        unsupported = pc.encode(pc.OperationUnsupported(request.request_id, "mergeSegments", ""))
        if request.target != transient.parent or payload is None:
            log.info("pravega merge of {source} into {target} refused: "
                     + ("not its parent" if payload is not None else "its chunks were refused"),
                     source=request.source, target=request.target)
            return unsupported
        try:
            count, largest = pc.scan_events(payload)
        except pc.NotEvents as e:
            log.info("pravega merge of {source} refused: not whole events ({problem})",
                     source=request.source, problem=str(e))
            return unsupported
        topic, partition = transient.topic, transient.partition
        if count == 0:
            state = yield self.bus.execute(c.PartitionInfo(topic, partition))
            tail = state.end_position
        else:
            try:
                appended = yield self.bus.execute(c.Produce(
                    topic, partition, self._event_batch(payload, count, largest),
                    kind="event", auto_create=False))
            except (PartitionSealed, KindMismatch, RecordTooLarge, NotAuthorized) as e:
                log.info("pravega merge of {source} refused: {error}", source=request.source,
                         error=str(e))
                return unsupported
            tail = appended.stream_pos + len(payload)
        return pc.encode(pc.SegmentsMerged(request.request_id, request.target, request.source,
                                           tail))

    # -- table segments (§3.4') -------------------------------------------------------------------
    # Tables are the bus's key-value tables, named by the full segment name.

    def do_CreateTableSegment(self, request):
        def exists(failure):
            failure.trap(TableExists)
            return pc.encode(pc.SegmentAlreadyExists(request.request_id, request.segment, ""))
        d = self.bus.execute(c.TableCreate(request.segment))
        d.addCallbacks(lambda _: pc.encode(pc.SegmentCreated(request.request_id,
                                                             request.segment)), exists)
        self._answer(d, request.request_id, request.segment, "createTableSegment")

    def do_DeleteTableSegment(self, request):
        d = self.bus.execute(c.TableDelete(request.segment, request.must_be_empty))
        d.addCallback(lambda _: pc.encode(pc.SegmentDeleted(request.request_id,
                                                            request.segment)))
        self._answer(d, request.request_id, request.segment, "deleteTableSegment")

    @staticmethod
    def _condition(version):
        """A key's version in a request as the bus's expected version:
        KEY_NO_VERSION is no condition, -1 "must not exist", else exactly it."""
        return None if version == pc.KEY_NO_VERSION else version

    @staticmethod
    def _table_offset(offset):
        return offset if offset >= 0 else None

    def do_UpdateTableEntries(self, request):
        entries = [(key, value, self._condition(version))
                   for key, version, value in request.entries]
        d = self.bus.execute(c.TableUpdate(request.segment, entries,
                                           self._table_offset(request.table_segment_offset)))
        d.addCallback(lambda versions: pc.encode(pc.TableEntriesUpdated(request.request_id,
                                                                        tuple(versions))))
        self._answer(d, request.request_id, request.segment, "updateTableEntries")

    def do_RemoveTableKeys(self, request):
        keys = [(key, self._condition(version)) for key, version in request.keys]
        d = self.bus.execute(c.TableRemove(request.segment, keys,
                                           self._table_offset(request.table_segment_offset)))
        d.addCallback(lambda _: pc.encode(pc.TableKeysRemoved(request.request_id,
                                                              request.segment)))
        self._answer(d, request.request_id, request.segment, "removeTableKeys")

    def do_ReadTable(self, request):
        """One entry per requested key; a missing one has version -1 and an
        empty value."""
        keys = [key for key, _ in request.keys]

        def found(answers):
            entries = tuple((key, pc.KEY_NOT_EXISTS, b"") if answer is None
                            else (key, answer[1], answer[0])
                            for key, answer in zip(keys, answers))
            return pc.encode(pc.TableRead(request.request_id, request.segment, entries))
        d = self.bus.execute(c.TableRead(request.segment, keys))
        d.addCallback(found)
        self._answer(d, request.request_id, request.segment, "readTable")

    def _scan(self, request, count, token):
        """ReadTableKeys / ReadTableEntries: entries by ascending version from
        the position the 8-byte continuation token names (empty: the start);
        the answer's token names where the next page starts."""
        if token and len(token) != _POSITION.size:
            self._protocol_error(f"table continuation token of {len(token)} bytes",
                                 request.request_id, request.segment)
            return None
        start = _POSITION.unpack(token)[0] if token else 0
        d = self.bus.execute(c.TableEntries(request.segment, start, max(1, count)))
        return d.addCallback(lambda page: (page[0], _POSITION.pack(page[1])))

    def do_ReadTableKeys(self, request):
        d = self._scan(request, request.suggested_key_count, request.continuation_token)
        if d is None:
            return
        d.addCallback(lambda page: pc.encode(pc.TableKeysRead(
            request.request_id, request.segment,
            tuple((key, version) for key, _, version in page[0]), page[1])))
        self._answer(d, request.request_id, request.segment, "readTableKeys")

    def do_ReadTableEntries(self, request):
        d = self._scan(request, request.suggested_entry_count, request.continuation_token)
        if d is None:
            return
        d.addCallback(lambda page: pc.encode(pc.TableEntriesRead(
            request.request_id, request.segment,
            tuple((key, version, value) for key, value, version in page[0]), page[1])))
        self._answer(d, request.request_id, request.segment, "readTableEntries")

    def do_ReadTableEntriesDelta(self, request):
        """Entries whose version is at least ``fromPosition``, ascending, at
        most max(1, suggestedEntryCount); ``lastPosition`` is where the next
        page starts. The client asks again until a page is empty (it ignores
        ``reachedEnd``), and removed keys are not reported."""
        limit = max(1, request.suggested_entry_count)

        def page(answer):
            entries, last = answer
            return pc.encode(pc.TableEntriesDeltaRead(
                request.request_id, request.segment,
                tuple((key, version, value) for key, value, version in entries),
                False, len(entries) < limit, last))
        d = self.bus.execute(c.TableEntries(request.segment, request.from_position, limit))
        d.addCallback(page)
        self._answer(d, request.request_id, request.segment, "readTableEntriesDelta")

    # -- appends (§6) ----------------------------------------------------------------------------

    def do_SetupAppend(self, setup):
        transient = self.transients.get(setup.segment)
        if transient is not None:
            # Always Long.MIN: any other number makes the client fail (§3.3').
            self._writer(setup.writer_id).setup(setup.segment, transient.topic,
                                                transient.partition, pc.NO_EVENT_NUMBER,
                                                transient)
            self.transport.write(pc.encode(pc.AppendSetup(
                setup.request_id, setup.segment, setup.writer_id, pc.NO_EVENT_NUMBER)))
            return
        target = self._target(setup.segment)
        if target is None:
            self.transport.write(pc.encode(pc.NoSuchSegment(setup.request_id, setup.segment,
                                                            "", -1)))
            return
        topic, partition = target
        key = (topic, partition, setup.writer_id)

        def ready(number, refused=False):
            writer = self._writer(setup.writer_id)
            writer.setup(setup.segment, topic, partition, number)
            writer.refused = refused
            return pc.encode(pc.AppendSetup(setup.request_id, setup.segment, setup.writer_id,
                                            number))

        def denied(failure):
            # The access rules refuse this writer: it is set up as usual and
            # its appends get SegmentIsSealed (§1).
            failure.trap(NotAuthorized)
            return ready(pc.NO_EVENT_NUMBER, refused=True)
        # The number reported must never be one a crash could take back: wait
        # for this writer's appends still in flight (a dying connection's).
        d = self.factory.settled(key)
        d.addCallback(lambda _: self._writer_number(topic, partition, setup.writer_id))
        d.addCallbacks(ready, denied)
        self._answer(d, setup.request_id, setup.segment, "setupAppend")

    def _writer(self, writer_id):
        writer = self.writers.get(writer_id)
        if writer is None:
            writer = self.writers[writer_id] = _Writer(writer_id)
        return writer

    def _writer_number(self, topic, partition, writer_id):
        """The writer's stored event number; an unknown topic is created first
        when ``topics.auto_create`` allows (the bus's Metadata decides), with
        at least ``partition + 1`` partitions."""
        bus = self.bus
        lookup = c.WriterEventNumber(topic, partition, writer_id)

        @defer.inlineCallbacks
        def create(failure):
            failure.trap(UnknownTopic)
            metas = yield bus.execute(c.Metadata([topic], auto_create=True))
            if metas[0].error is not None:
                raise metas[0].error
            if partition >= metas[0].info.partitions:
                try:
                    yield bus.execute(c.CreatePartitions(topic, partition + 1))
                except InvalidRequest:
                    # beyond topics.max_partitions: that segment cannot exist
                    raise UnknownPartition(topic, partition) from None
            return (yield bus.execute(lookup))
        return bus.execute(lookup).addErrback(create)

    def _setup_writer(self, writer_id, request_id, segment):
        """The writer an append names, or None after a protocol error: an
        append before SetupAppend on this connection (§6.1)."""
        writer = self.writers.get(writer_id)
        if writer is None:
            self._protocol_error(f"append for writer {writer_id.hex()} before SetupAppend",
                                 request_id, segment)
        return writer

    def do_AppendBlock(self, block):
        if self._setup_writer(block.writer_id, -1, "") is not None:
            self.block = block

    def do_AppendBlockEnd(self, end):
        block, self.block = self.block, None
        if block is not None and block.writer_id != end.writer_id:
            self._protocol_error(f"AppendBlockEnd for writer {end.writer_id.hex()} after an "
                                 f"AppendBlock of writer {block.writer_id.hex()}",
                                 end.request_id)
            return
        writer = self._setup_writer(end.writer_id, end.request_id, "")
        if writer is None:
            return
        try:
            payload = pc.assemble_block(None if block is None else block.data, end)
        except pc.BlockError as e:
            self._protocol_error(str(e), end.request_id, writer.segment)
            return
        number = end.last_event_number
        if number < writer.expected:
            self._protocol_error(f"event number {number} below the writer's last "
                                 f"{writer.expected}", end.request_id, writer.segment)
            return
        self._enqueue(writer, lambda: self._submit(writer, payload, number, end.request_id))

    def do_ConditionalAppend(self, append):
        writer = self._setup_writer(append.writer_id, append.request_id, "")
        if writer is None:
            return
        if append.event_number < writer.expected:
            self._protocol_error(f"event number {append.event_number} below the writer's last "
                                 f"{writer.expected}", append.request_id, writer.segment)
            return
        self._enqueue(writer, lambda: self._submit_conditional(writer, append))

    def do_ConditionalBlockEnd(self, end):
        """Raw bytes: a chunk of a large event on a transient segment
        (§3.3'), else a byte-stream append to a partition (§3.2')."""
        writer = self._setup_writer(end.writer_id, end.request_id, "")
        if writer is None:
            return
        if end.event_number < writer.expected:
            self._protocol_error(f"event number {end.event_number} below the writer's last "
                                 f"{writer.expected}", end.request_id, writer.segment)
            return
        if writer.transient is not None:
            self._enqueue(writer, lambda: self._submit_chunk(writer, end))
        else:
            self._enqueue(writer, lambda: self._submit_bytes(writer, end))

    # .. ordering ..................................................................................

    def _enqueue(self, writer, submit):
        """Run ``submit`` (which returns an emit callable, or a Deferred of
        one) now, or after the conditional append holding the writer; its
        emit runs in the writer's arrival order."""
        if writer.gated:
            d = defer.Deferred()
            writer.held.append((d, submit))
            self._in_order(writer, d)
        else:
            self._in_order(writer, submit())

    def _release(self, writer):
        """The conditional append is decided: submit what it held, until
        another conditional append holds the writer again."""
        writer.gated = False
        while writer.held and not writer.gated:
            d, submit = writer.held.popleft()
            result = submit()
            if isinstance(result, defer.Deferred):
                result.chainDeferred(d)
            else:
                d.callback(result)

    def _in_order(self, writer, result):
        order = writer.order
        if not isinstance(result, defer.Deferred):
            if not order:
                result()
                return
            result = defer.succeed(result)
        slot = [result, None, False]
        order.append(slot)
        self._begin()
        result.addCallbacks(self._emit_ready, self._emit_lost, callbackArgs=(writer, slot),
                            errbackArgs=(writer, slot))

    def _emit_ready(self, emit, writer, slot):
        slot[1] = emit
        slot[2] = True
        order = writer.order
        while order and order[0][2]:
            head = order.popleft()
            self._end()
            if head[1] is not None:
                head[1]()

    def _emit_lost(self, failure, writer, slot):
        failure.trap(defer.CancelledError)
        self._emit_ready(None, writer, slot)

    # .. appends ...................................................................................

    def _refusal(self, writer, request_id):
        """SegmentIsSealed for an append (§6.6), naming the parent segment
        for a transient writer; the writer's later appends get it too."""
        writer.refused = True
        segment = writer.segment if writer.transient is None else writer.transient.parent
        frame = pc.encode(pc.SegmentIsSealed(request_id, segment, "", -1))
        return lambda: self._write(frame)

    def _events(self, writer, payload):
        """``(count, largest)`` of the payload's events, or None (logged) if
        it is not one or more whole events, which the caller refuses."""
        try:
            count, largest = pc.scan_events(payload)
        except pc.NotEvents as e:
            log.info("pravega append to {segment} refused: not whole events ({problem})",
                     segment=writer.segment, problem=str(e))
            return None
        if count == 0:
            log.info("pravega append to {segment} refused: no event in the data",
                     segment=writer.segment)
            return None
        return count, largest

    def _event_batch(self, payload, count, largest):
        """Whole events, stored as framed: the payload is their segment view."""
        now = int(self.reactor.seconds() * 1000)
        return EncodedBatch(PRAVEGA_EVENTS, payload, count, now, now,
                            len(payload) - pc.EVENT_HEADER_SIZE * count, largest)

    def _produce(self, writer, records, number, kind="event", expected_offset=None):
        """One atomic, durable Produce of ``records`` with the writer's
        compare-and-set; answers the Deferred of ``Appended``."""
        expected = writer.expected
        writer.expected = number
        writer.inflight += 1
        key = (writer.topic, writer.partition, writer.writer_id)
        self.factory.append_started(key)
        d = self.bus.execute(c.Produce(
            writer.topic, writer.partition, records,
            writer=(writer.writer_id, expected, number), kind=kind, auto_create=False,
            expected_offset=expected_offset))
        d.addBoth(self._answered, writer, key)
        return d

    def _answered(self, result, writer, key):
        self.factory.append_done(key)
        writer.inflight -= 1
        if not writer.inflight and writer.idle:
            idle, writer.idle = writer.idle, []
            for run in idle:
                run()
        return result

    def _submit(self, writer, payload, number, request_id):
        if writer.refused or writer.transient is not None:
            return self._refusal(writer, request_id)
        events = self._events(writer, payload)
        if events is None:
            return self._refusal(writer, request_id)
        d = self._produce(writer, self._event_batch(payload, *events), number)
        d.addCallbacks(self._acked, self._append_failed,
                       callbackArgs=(writer, number, request_id, len(payload)),
                       errbackArgs=(writer, number, request_id))
        return d

    def _acked(self, appended, writer, number, request_id, length):
        return self._ack(writer, number, request_id, appended.stream_pos + length)

    def _ack(self, writer, number, request_id, tail):
        def emit():
            # Only a number above the last one acked is acknowledged; one ack
            # may cover several completed blocks (§6.4).
            if number > writer.acked:
                self._write(pc.encode_data_appended(writer.writer_id, number, writer.acked,
                                                    request_id, tail))
                writer.acked = number
        return emit

    def _append_failed(self, failure, writer, number, request_id):
        error = failure.value
        if isinstance(error, WriterConflict):
            if writer.refused:
                # A block pipelined behind a refused one expected its number.
                return self._refusal(writer, request_id)
            # Another connection moved the writer on: nothing is stored, and
            # nothing more is read from here; the client reconnects (§6.3).
            self.log_protocol_error(f"writer {writer.writer_id.hex()} on {writer.segment}: "
                                    f"event number {number} lost its compare-and-set "
                                    f"(stored {error.stored})")
            self.stopReading()
            frame = pc.encode(pc.InvalidEventNumber(writer.writer_id, request_id, "", number))
            return lambda: self._close_with(frame)
        if isinstance(error, APPEND_REFUSALS):
            if isinstance(error, RecordTooLarge):
                # SegmentIsSealed says "sealed" (§6.6); the log says why.
                log.warn("pravega append to {segment} refused: event of {size} bytes "
                         "exceeds limits.max_record_bytes {limit}", segment=writer.segment,
                         size=error.size, limit=error.limit)
            return self._refusal(writer, request_id)
        if failure.check(defer.CancelledError):
            return failure
        segment = writer.segment
        return lambda: self._internal(failure, request_id, segment)

    def _submit_conditional(self, writer, append):
        """§6.5: after the writer's earlier appends are answered, append the
        event only if the tail is ``expectedOffset``. The check is atomic
        with the append: the Produce names the durable end (the high
        watermark) as the offset its batch must start at, and the store
        checks that against its next offset. So the event is appended only
        if the tail is exactly ``expectedOffset`` with no other append still
        waiting for durability; racing another writer's pending append, the
        check fails, as it would a moment later anyway."""
        if writer.refused or writer.transient is not None:
            return self._refusal(writer, append.request_id)
        if append.event_type != pc.EVENT:
            log.info("pravega conditional append to {segment} refused: type {kind} is not "
                     "an event", segment=writer.segment, kind=append.event_type)
            return self._refusal(writer, append.request_id)
        writer.gated = True
        result = defer.Deferred()
        previous = writer.expected

        def check(state):
            if state.sealed:
                return self._refusal(writer, append.request_id)
            if append.expected_offset != state.end_position:
                return failed_check()
            payload = pc.frame_event(append.data)
            d = self._produce(writer, self._event_batch(payload, 1, len(append.data)),
                              append.event_number, expected_offset=state.high_watermark)
            d.addCallbacks(self._acked, conflict,
                           callbackArgs=(writer, append.event_number, append.request_id,
                                         len(payload)))
            return d

        def conflict(failure):
            if failure.check(OffsetOutOfRange):
                # Nothing was stored: the writer's next append expects the
                # number it had before (nothing else was in flight).
                writer.expected = previous
                return failed_check()
            return self._append_failed(failure, writer, append.event_number, append.request_id)

        def failed_check():
            frame = pc.encode(pc.ConditionalCheckFailed(writer.writer_id, append.event_number,
                                                        append.request_id))
            return lambda: self._write(frame)

        def start():
            d = self.bus.execute(c.PartitionInfo(writer.topic, writer.partition))
            d.addCallback(check)
            d.addErrback(self._append_failed, writer, append.event_number, append.request_id)
            d.addBoth(decided)

        def decided(emit):
            result.callback(emit)
            self._release(writer)

        if writer.inflight:
            writer.idle.append(start)
        else:
            start()
        return result

    def _submit_bytes(self, writer, end):
        """§3.2': append raw bytes to a byte topic if its byte tail is
        ``expectedOffset``. Like a conditional append it is a barrier: it
        waits for the writer's earlier appends and holds later ones until it
        is decided, and the tail check is atomic with the append (the
        Produce names the durable end as the offset its batch must start
        at). The bytes become one record, or consecutive records of at most
        ``limits.max_record_bytes`` in the same Produce; empty data stores
        nothing and decides no kind. Every refusal (an event topic, a sealed
        or vanished partition, the access rules, a tail that moved) is
        ConditionalCheckFailed, on which the client's ``flush`` fails at once
        and the connection stays usable (§4.2')."""
        number = end.event_number
        failed = pc.encode(pc.ConditionalCheckFailed(writer.writer_id, number, end.request_id))

        def failed_check():
            return lambda: self._write(failed)
        if writer.refused:
            # the access rules refused this writer at SetupAppend (§1)
            return failed_check()
        writer.gated = True
        result = defer.Deferred()
        previous = writer.expected

        @defer.inlineCallbacks
        def check():
            bus = self.bus
            try:
                state = yield bus.execute(c.PartitionInfo(writer.topic, writer.partition))
                info = yield self._topic_info(writer.topic)
                if state.sealed or info.kind == "event":
                    log.info("pravega byte append to {segment} refused: the partition is {why}",
                             segment=writer.segment,
                             why="sealed" if state.sealed else "an event stream")
                    return failed_check()
                if end.expected_offset != state.end_position:
                    return failed_check()
                if not end.data:
                    return self._ack(writer, number, end.request_id, state.end_position)
                limit = bus.limits.max_record_bytes
                data = end.data
                values = [data[i:i + limit] for i in range(0, len(data), limit)]
                appended = yield self._produce(writer, RecordBatch(values), number, kind="bytes",
                                               expected_offset=state.high_watermark)
            except OffsetOutOfRange:
                writer.expected = previous
                return failed_check()
            except APPEND_REFUSALS as e:
                writer.expected = previous
                log.info("pravega byte append to {segment} refused: {error}",
                         segment=writer.segment, error=str(e))
                return failed_check()
            return self._acked(appended, writer, number, end.request_id, len(end.data))

        def start():
            d = check()
            d.addErrback(self._append_failed, writer, number, end.request_id)
            d.addBoth(decided)

        def decided(emit):
            result.callback(emit)
            self._release(writer)

        if writer.inflight:
            writer.idle.append(start)
        else:
            start()
        return result


class PravegaFactory(DialectFactory):
    """The listener's connections, and the appends in flight on all of them.

    The store moves a writer's event number on when it takes an append,
    before the append is durable; AppendSetup reports that number, and the
    client then drops its copies of those events. So a SetupAppend waits
    (``settled``) until the writer's appends in flight on any connection of
    the listener are answered: a reconnecting writer is never told a number
    that a crash could still take back.
    """

    protocol = PravegaProtocol

    def __init__(self, bus, listener):
        super().__init__(bus, listener)
        options = listener.options
        self.scope = options.get("scope", DEFAULT_SCOPE)
        self.long_poll_ms = options.get("long_poll_ms", DEFAULT_LONG_POLL_MS)
        self.max_frame_bytes = options.get("max_frame_bytes", pc.MAX_FRAME_BYTES)
        self.appending = {}     # (topic, partition, writer id) -> [in flight, waiters]

    def append_started(self, key):
        entry = self.appending.get(key)
        if entry is None:
            entry = self.appending[key] = [0, []]
        entry[0] += 1

    def append_done(self, key):
        entry = self.appending[key]
        entry[0] -= 1
        if entry[0] == 0:
            del self.appending[key]
            for d in entry[1]:
                d.callback(None)

    def settled(self, key):
        """Fires once no append of ``key`` is in flight."""
        entry = self.appending.get(key)
        if entry is None:
            return defer.succeed(None)
        d = defer.Deferred()
        entry[1].append(d)
        return d
