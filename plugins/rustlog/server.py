"""RustLog server: frames <-> bus commands (protocols/rustlog.md).

Each frame is answered in the variant it came in (the seed's JSON, or the
real broker's binary format), strictly in arrival order even when a later
request completes first. Errors are answered in the dialect's own form and
keep the connection open, except a frame whose length cannot be trusted
(oversize, or an empty frame in binary mode), which is answered and then
closed.
"""
import struct

from twisted.internet import defer

from gateway import commands as c
from gateway.errors import (
    InvalidRequest, InvalidTopicName, LogError, NotAuthorized, OffsetOutOfRange,
    PartitionSealed, RecordTooLarge, TopicExists, UnknownPartition, UnknownTopic)
from gateway.framing import FramedProtocol
from gateway.protocol import DialectFactory, OrderedReplies, TrackedConnection
from gateway.records import RecordBatch
from plugins.rustlog import codec as rc
from plugins.rustlog.codec import BINARY, JSON

_PREFIX = struct.Struct(">I")
#: a binary Fetch reply counts this much per record against max_bytes (§7)
BINARY_RECORD_OVERHEAD = 12


def frame(payload):
    return _PREFIX.pack(len(payload)) + payload


def not_found(topic, partition):
    return f"partition not found: topic={topic}, partition={partition}"


def error_answer(error, topic, partition):
    """(JSON message, binary code) for a bus error on a produce or fetch: the
    dialect's one error table."""
    if isinstance(error, (UnknownTopic, UnknownPartition)):
        return not_found(topic, partition), rc.UNKNOWN_PARTITION
    if isinstance(error, InvalidTopicName):
        return f"invalid topic name: {topic!r}", rc.DECODE_ERROR
    if isinstance(error, RecordTooLarge):
        return f"record too large: {error.size} bytes, limit {error.limit}", rc.INTERNAL
    if isinstance(error, PartitionSealed):
        return f"partition sealed: topic={topic}, partition={partition}", rc.INTERNAL
    if isinstance(error, NotAuthorized):
        return f"not authorised: topic={topic}", rc.UNKNOWN_PARTITION
    if isinstance(error, OffsetOutOfRange):
        return (f"offset out of range: requested={error.offset}, log_start={error.log_start}",
                rc.FETCH_ERROR)
    if isinstance(error, InvalidRequest):
        return f"invalid request: {error}", rc.DECODE_ERROR
    return "internal error", rc.INTERNAL


class RustLogProtocol(TrackedConnection, FramedProtocol):
    header = _PREFIX
    max_frame_bytes = rc.MAX_FRAME_BYTES

    def connectionMade(self):
        super().connectionMade()
        self.bus = self.factory.bus
        self.binary_enabled = self.factory.binary
        self.last_variant = JSON
        self.replies = OrderedReplies(self.transport, self.factory.in_flight_limit())

    def connectionLost(self, reason):
        self.replies.cancel_all()
        super().connectionLost(reason)

    # -- framing -----------------------------------------------------------------

    def frameTooLarge(self, fields):
        self.log_protocol_error(f"frame of {fields[0]} bytes exceeds {self.max_frame_bytes}")
        self._answer_and_close("max frame size exceeded")

    def _answer_and_close(self, message):
        self.stopReading()
        variant = self.last_variant
        reply = rc.ErrorResponse(message, rc.FRAME_ERROR if variant == BINARY else None)
        self.replies.add(frame(rc.encode_response(variant, reply)))
        # Close once every answer before it (and it) is written.
        self.replies.add(defer.succeed(None).addCallback(
            lambda _: self.transport.loseConnection()))

    def frameReceived(self, fields, payload):
        try:
            variant, request = rc.decode_request(payload, self.binary_enabled)
        except rc.RustLogDecodeError as e:
            if e.variant is None and self.last_variant == BINARY:
                # An empty frame shows no variant; in binary it is a frame error.
                self.log_protocol_error("empty frame")
                self._answer_and_close(e.message)
                return
            variant = e.variant or self.last_variant
            self.last_variant = variant
            self.replies.add(frame(rc.encode_response(
                variant, rc.ErrorResponse(e.message, e.code if variant == BINARY else None))))
            return
        self.last_variant = variant
        handler = getattr(self, "do_" + type(request).__name__)
        result = handler(request, variant)
        if isinstance(result, defer.Deferred):
            result.addErrback(self._internal, variant)
        self.replies.add(result)

    def _reply(self, variant, response):
        return frame(rc.encode_response(variant, response))

    def _error(self, variant, message, code):
        return self._reply(variant, rc.ErrorResponse(message, code if variant == BINARY else None))

    def _internal(self, failure, variant):
        if failure.check(defer.CancelledError):
            return failure
        self.factory.log_failure(failure)
        return self._error(variant, "internal error", rc.INTERNAL)

    def _failed(self, failure, variant, topic, partition):
        failure.trap(LogError)
        message, code = error_answer(failure.value, topic, partition)
        return self._error(variant, message, code)

    # -- requests ----------------------------------------------------------------------

    def do_ProduceRequest(self, req, variant):
        d = self.bus.execute(c.Produce(req.topic, req.partition, RecordBatch(req.records)))
        d.addCallbacks(lambda a: self._reply(variant, rc.ProduceResponse(a.base_offset, a.count)),
                       self._failed, errbackArgs=(variant, req.topic, req.partition))
        return d

    def do_FetchRequest(self, req, variant):
        if req.group_id is None:
            return self._fetch(req, variant, req.offset)
        d = self.bus.execute(c.FetchCommittedOffset(req.group_id, req.topic, req.partition))

        def start_from(committed):
            if variant == BINARY:
                # The real broker: a group's fetch starts at its commit, and
                # without one there is nothing to read yet.
                if committed is None:
                    return self._reply(BINARY, rc.FetchResponse((), 0))
                return self._fetch(req, variant, committed[0])
            start = req.offset
            if committed is not None and committed[0] > start:
                start = committed[0]
            return self._fetch(req, variant, start)
        d.addCallbacks(start_from, self._failed, errbackArgs=(variant, req.topic, req.partition))
        return d

    def _fetch(self, req, variant, start):
        collector = _FetchCollector(self.bus, req, variant, start)
        d = collector.run()
        d.addErrback(self._failed, variant, req.topic, req.partition)
        return d

    def do_OffsetCommitRequest(self, req, variant):
        d = self.bus.execute(c.CommitOffset(req.group_id, req.topic, req.partition, req.offset))

        def failed(failure):
            if failure.check(UnknownTopic, UnknownPartition):
                return self._reply(variant, rc.OffsetCommitResponse(False))
            if failure.check(NotAuthorized, InvalidTopicName, InvalidRequest):
                message, code = error_answer(failure.value, req.topic, req.partition)
                return self._error(variant, message, code)
            failure.trap(LogError)
            return self._error(variant, "internal error: commit failed", rc.COMMIT_FAILED)
        d.addCallbacks(lambda _: self._reply(variant, rc.OffsetCommitResponse(True)), failed)
        return d

    def do_OffsetFetchRequest(self, req, variant):
        d = self.bus.execute(c.FetchCommittedOffset(req.group_id, req.topic, req.partition))

        def failed(failure):
            if failure.check(UnknownTopic, UnknownPartition, InvalidTopicName):
                return self._reply(variant, rc.OffsetFetchResponse(None))
            return self._failed(failure, variant, req.topic, req.partition)
        d.addCallbacks(lambda found: self._reply(
            variant, rc.OffsetFetchResponse(None if found is None else found[0])), failed)
        return d

    # -- binary-only requests ---------------------------------------------------------------

    def do_CreateTopicRequest(self, req, variant):
        if req.partition_count == 0:
            return self._error(variant, "partition count must be at least 1",
                               rc.ZERO_PARTITIONS)
        d = self.bus.execute(c.CreateTopic(req.topic, req.partition_count))

        def failed(failure):
            if failure.check(TopicExists):
                return self._error(variant, f"topic exists: {req.topic}", rc.TOPIC_EXISTS)
            return self._failed(failure, variant, req.topic, 0)
        d.addCallbacks(lambda _: self._reply(variant, rc.CreateTopicResponse(True)), failed)
        return d

    def do_ListTopicsRequest(self, req, variant):
        d = self.bus.execute(c.Metadata())
        d.addCallback(lambda topics: self._reply(variant, rc.ListTopicsResponse(
            tuple((t.name, t.info.partitions) for t in topics if t.info is not None))))
        return d

    def do_DescribeTopicRequest(self, req, variant):
        d = self.bus.execute(c.Metadata([req.topic]))

        def described(topics):
            info = topics[0].info
            if info is None:
                return self._error(variant, f"unknown topic: {req.topic}",
                                   rc.DESCRIBE_UNKNOWN_TOPIC)
            waits = [self.bus.execute(c.PartitionInfo(req.topic, p))
                     for p in range(info.partitions)]
            return defer.gatherResults(waits).addCallback(lambda states: self._reply(
                variant, rc.DescribeTopicResponse(req.topic, info.partitions, tuple(
                    (p, s.high_watermark) for p, s in enumerate(states)))))
        d.addCallback(described)
        return d

    def do_DescribePartitionRequest(self, req, variant):
        d = self.bus.execute(c.PartitionInfo(req.topic, req.partition))

        def failed(failure):
            if failure.check(UnknownTopic, InvalidTopicName):
                return self._error(variant, f"unknown topic: {req.topic}",
                                   rc.DESCRIBE_UNKNOWN_TOPIC)
            if failure.check(NotAuthorized):
                return self._failed(failure, variant, req.topic, req.partition)
            failure.trap(UnknownPartition)
            return self._error(variant, not_found(req.topic, req.partition),
                               rc.DESCRIBE_UNKNOWN_PARTITION)
        d.addCallbacks(lambda s: self._reply(variant, rc.DescribePartitionResponse(
            req.topic, req.partition, s.high_watermark)), failed)
        return d

    def do_MetricsFetchRequest(self, req, variant):
        return self._reply(variant, rc.MetricsResponse(self.bus.metrics_text()))

    def do_PingRequest(self, req, variant):
        return self._reply(variant, rc.PongResponse())


class _FetchCollector:
    """Gathers one Fetch reply's records from the bus, batch by batch.

    Values count against ``max_bytes`` as the variant says (JSON: payload
    bytes; binary: 12 + payload bytes per record), the first record always
    goes in, and the reply never passes the 10 MiB frame. Stored batches carry
    some bytes besides values, so when a read falls short of ``max_bytes`` the
    collector reads on from where it stopped.
    """

    def __init__(self, bus, req, variant, start):
        self.bus = bus
        self.req = req
        self.variant = variant
        self.start = start
        self.values = []
        self.counted = 0
        self.frame_bytes = (rc.JSON_FETCH_ENVELOPE_BYTES if variant == JSON
                            else rc.BINARY_FETCH_ENVELOPE_BYTES)
        self.next = start
        self.done = False

    def run(self):
        return self._read()

    def _read(self):
        req = self.req
        want = min(max(req.max_bytes - self.counted, 1), rc.MAX_FRAME_BYTES)
        d = self.bus.execute(c.Fetch([c.FetchPartition(req.topic, req.partition, self.next,
                                                       want)]))
        d.addCallback(self._got)
        return d

    def _got(self, parts):
        part = parts[0]
        if part.error is not None:
            if isinstance(part.error, OffsetOutOfRange) and self.variant == BINARY \
                    and not self.values:
                # gateway decision: an empty reply that points at the log start
                return self._finish(part.error.log_start)
            raise part.error
        if not part.batches:
            if self.values:
                return self._finish(self.next)
            # Nothing at or past the end: JSON points at the log end, the
            # binary variant (like the real broker) echoes the requested offset.
            return self._finish(self.start if self.variant == BINARY else part.high_watermark)
        req = self.req
        binary = self.variant == BINARY
        max_bytes = req.max_bytes
        for batch in part.batches:
            records = self.bus.decode(batch).since(self.next)
            offset = records.base_offset
            for value in records.values:
                size = len(value)
                cost = rc.binary_record_cost(size) if binary else rc.json_record_cost(offset, size)
                counted = size + (BINARY_RECORD_OVERHEAD if binary else 0)
                if self.values:
                    if self.counted + counted > max_bytes or \
                            self.frame_bytes + cost > rc.MAX_FRAME_BYTES:
                        return self._finish(offset)
                elif self.frame_bytes + cost > rc.MAX_FRAME_BYTES and (
                        binary or self.frame_bytes + rc.json_record_size(offset, value)
                        > rc.MAX_FRAME_BYTES):
                    return self._too_large(offset)
                self.values.append(value)
                self.counted += counted
                self.frame_bytes += cost
                offset += 1
            self.next = offset
        if self.counted >= max_bytes or self.next >= part.high_watermark:
            return self._finish(self.next)
        return self._read()

    def _too_large(self, offset):
        message = f"record too large: offset={offset}, max_frame_bytes={rc.MAX_FRAME_BYTES}"
        return frame(rc.encode_response(self.variant, rc.ErrorResponse(
            message, rc.FETCH_ERROR if self.variant == BINARY else None)))

    def _finish(self, next_offset):
        if self.variant == JSON:
            first = next_offset - len(self.values)
            return frame(rc.encode_json_fetch(first, self.values, next_offset))
        return frame(rc.encode_binary_fetch(self.values, next_offset))


class RustLogFactory(DialectFactory):
    protocol = RustLogProtocol

    def __init__(self, bus, listener):
        super().__init__(bus, listener)
        self.binary = listener.options.get("binary", True)

