"""A Twisted client of the RustLog dialect, for tests, examples, benchmarks
and bridges.

One connection, requests pipelined freely: the gateway answers strictly in
arrival order (rustlog.md §1), so responses are matched to requests first in,
first out, with no correlation ids (the protocol has none). Every call returns
a Deferred; an Error reply fails it with ``RustLogError``, and a lost
connection fails every call still waiting with the reason it was lost.

``binary=True`` speaks the real broker's binary variant (§7) instead of
JSON; only that variant has topic administration, metrics and ping.
"""
import struct
from collections import deque
from dataclasses import dataclass
from typing import List, Tuple

from twisted.internet import defer
from twisted.internet.endpoints import HostnameEndpoint, connectProtocol

from gateway.framing import FramedProtocol
from plugins.rustlog.codec import (
    BINARY, JSON, MAX_FRAME_BYTES, CreateTopicRequest, CreateTopicResponse,
    DescribePartitionRequest, DescribePartitionResponse, DescribeTopicRequest,
    DescribeTopicResponse, ErrorResponse, FetchRequest, FetchResponse,
    ListTopicsRequest, ListTopicsResponse, MetricsFetchRequest, MetricsResponse,
    OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest,
    OffsetFetchResponse, PingRequest, PongResponse, ProduceRequest,
    ProduceResponse, RESPONSE_ERROR_PREFIX, RustLogDecodeError, decode_response,
    encode_request)

__all__ = ["RustLogError", "FetchResult", "RustLogClientProtocol", "connect"]


class RustLogError(Exception):
    """The gateway answered with an Error. ``code`` is the binary error code
    (None for a JSON reply, which has none)."""

    def __init__(self, message, code=None):
        super().__init__(message if code is None else f"[{code}] {message}")
        self.message = message
        self.code = code


@dataclass(frozen=True, slots=True)
class FetchResult:
    """``records`` are ``(offset, payload)`` pairs; fetch again from
    ``next_offset``."""
    records: List[Tuple[int, bytes]]
    next_offset: int


class RustLogClientProtocol(FramedProtocol):
    """The client side of one connection.

    The typed methods (``produce``, ``fetch``, ...) encode with the codec;
    ``send_raw`` sends a payload encoded in advance, which is how benchmarks
    keep encoding out of the measured loop.

    Frames are cut by the project's ``FramedProtocol`` (u32 BE length, at
    most ``MAX_FRAME_BYTES``), which buffers in linear time: Twisted's
    ``Int32StringReceiver`` re-joins its buffer on every TCP segment, which
    is quadratic for a 10 MiB reply.
    """

    header = struct.Struct(">I")
    max_frame_bytes = MAX_FRAME_BYTES

    def __init__(self, binary=False):
        self.binary = binary
        self._variant = BINARY if binary else JSON
        self._pending = deque()
        self._lost = None
        self._closed = []

    # -- connection ------------------------------------------------------

    def connectionMade(self):
        # Small requests answered one by one: without TCP_NODELAY, Nagle and
        # delayed ACKs stall a pipelined request for tens of milliseconds.
        set_no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if set_no_delay is not None:
            set_no_delay(True)

    def connectionLost(self, reason):
        self._lost = reason
        pending, self._pending = self._pending, deque()
        for d in pending:
            d.errback(reason)
        closed, self._closed = self._closed, []
        for d in closed:
            d.callback(None)

    def close(self):
        """Close the connection; the Deferred fires once it is closed (calls
        still waiting fail first)."""
        if self._lost is not None:
            return defer.succeed(None)
        d = defer.Deferred()
        self._closed.append(d)
        self.transport.loseConnection()
        return d

    # -- frames ------------------------------------------------------------

    def send_raw(self, payload):
        """Send one payload (without the length prefix) and return a Deferred
        that fires with the decoded response object (a codec ``*Response``).
        An Error reply fails it with ``RustLogError`` instead.

        No size check: the gateway's own "max frame size exceeded" answer is
        part of what tests send raw frames to see.
        """
        if self._lost is not None:
            return defer.fail(self._lost)
        d = defer.Deferred()
        self._pending.append(d)
        # writeSequence: no copy of a multi-megabyte payload to prepend 4 bytes
        self.transport.writeSequence([self.header.pack(len(payload)), payload])
        return d

    def frameTooLarge(self, fields):
        """A reply longer than the frame limit: the stream can no longer be
        trusted (``FramedProtocol`` reads nothing more), so the call it
        answers fails with a decode error and the connection is dropped,
        which fails every other call still waiting."""
        if self._pending:
            self._pending.popleft().errback(RustLogDecodeError(
                f"{RESPONSE_ERROR_PREFIX}frame of {fields[0]} bytes exceeds {MAX_FRAME_BYTES}"))
        abort = getattr(self.transport, "abortConnection", None)
        if abort is not None:
            abort()
        else:
            self.transport.loseConnection()

    def frameReceived(self, fields, payload):
        if not self._pending:
            # An answer nobody asked for: the stream can no longer be matched
            # to requests, so stop trusting it.
            self.transport.loseConnection()
            return
        d = self._pending.popleft()
        try:
            _, response = decode_response(payload)
        except RustLogDecodeError as e:
            d.errback(e)
            return
        if type(response) is ErrorResponse:
            d.errback(RustLogError(response.message, response.code))
        else:
            d.callback(response)

    def _call(self, request, expected, unwrap):
        try:
            payload = encode_request(self._variant, request)
        except ValueError:
            return defer.fail()
        d = self.send_raw(payload)

        def check(response):
            if type(response) is not expected:
                raise RustLogDecodeError(
                    f"{RESPONSE_ERROR_PREFIX}expected {expected.__name__}, "
                    f"got {type(response).__name__}")
            return unwrap(response)
        return d.addCallback(check)

    # -- both variants -------------------------------------------------------

    def produce(self, topic, partition, records):
        """Append ``records`` (bytes) as one batch; fires with their offsets."""
        return self._call(ProduceRequest(topic, partition, tuple(records)),
                          ProduceResponse, lambda r: r.offsets)

    def fetch(self, topic, partition, offset, max_bytes=1048576, group_id=None):
        """Read from ``offset``; fires with a ``FetchResult``. ``max_bytes``
        above 2^32-1 does not fit the binary variant and fails."""
        return self._call(FetchRequest(topic, partition, offset, max_bytes, group_id),
                          FetchResponse,
                          lambda r: FetchResult(list(r.records), r.next_offset))

    def commit(self, group_id, topic, partition, offset):
        """Commit ``offset`` (the next offset to read); fires with the
        gateway's success flag (False for an unknown topic or partition)."""
        return self._call(OffsetCommitRequest(topic, partition, group_id, offset),
                          OffsetCommitResponse, lambda r: r.success)

    def committed(self, group_id, topic, partition):
        """Fires with the group's committed offset, or None if it never
        committed for this partition."""
        return self._call(OffsetFetchRequest(topic, partition, group_id),
                          OffsetFetchResponse, lambda r: r.offset)

    # -- binary variant only (fail with ValueError in JSON mode) -------------

    def create_topic(self, topic, partition_count):
        return self._call(CreateTopicRequest(topic, partition_count),
                          CreateTopicResponse, lambda r: r.success)

    def list_topics(self):
        """Fires with ``[(name, partition_count), ...]`` sorted by name."""
        return self._call(ListTopicsRequest(), ListTopicsResponse,
                          lambda r: list(r.topics))

    def describe_topic(self, topic):
        """Fires with a ``DescribeTopicResponse`` (partitions as
        ``(partition, high_watermark)`` pairs)."""
        return self._call(DescribeTopicRequest(topic), DescribeTopicResponse,
                          lambda r: r)

    def describe_partition(self, topic, partition):
        """Fires with the partition's high watermark (its next offset)."""
        return self._call(DescribePartitionRequest(topic, partition),
                          DescribePartitionResponse, lambda r: r.high_watermark)

    def metrics(self):
        """Fires with the Prometheus exposition text."""
        return self._call(MetricsFetchRequest(), MetricsResponse, lambda r: r.text)

    def ping(self):
        """Fires with None when the Pong arrives."""
        return self._call(PingRequest(), PongResponse, lambda r: None)


def connect(reactor, host, port, binary=False, timeout=30):
    """Connect to a RustLog listener; fires with a ``RustLogClientProtocol``."""
    endpoint = HostnameEndpoint(reactor, host, port, timeout=timeout)
    return connectProtocol(endpoint, RustLogClientProtocol(binary=binary))
