"""A Twisted client of the TANK dialect, for tests, examples, benchmarks and
bridges.

One connection, requests pipelined freely. Responses may come back out of
order (a parked Consume is overtaken, §2), so each is matched to its request
by reqId; the Ping a broker sends on connect is noted (``pinged``) and
otherwise ignored. Every call returns a Deferred; a lost connection fails
every call still waiting with the reason it was lost.

``fetch`` is the consumer's loop body: it retries a boundary error from the
first available seq when the requested one was retained away, and when a
chunk ends in a cut bundle (as a real broker sends at ``fetchSize``) with no
whole message before it, it fetches again with twice the room.
"""
from dataclasses import dataclass
from typing import List, Optional, Tuple

from twisted.internet import defer
from twisted.internet.endpoints import HostnameEndpoint, connectProtocol

from gateway.framing import FramedProtocol
from plugins.tank import codec as tc
from plugins.tank.codec import (
    FETCH_BOUNDARY, FETCH_OK, FETCH_SPARSE, MAX_FETCH_BYTES, TAIL_SEQ, TankDecodeError)

__all__ = ["TankError", "Message", "Fetched", "FetchResult", "TankClientProtocol",
           "connect"]

#: a response may carry up to 64 MiB per partition; allow the real broker's frame limit
MAX_RESPONSE_BYTES = 256 * 1024 * 1024
DEFAULT_FETCH_SIZE = 1024 * 1024


class TankError(Exception):
    """The broker answered with an error ``code`` (a Produce error byte, a
    Consume errorOrFlags, or a CreateTopic/ReloadConf error)."""

    def __init__(self, message, code):
        super().__init__(f"{message} (code {code:#04x})")
        self.code = code


@dataclass(frozen=True, slots=True)
class Message:
    seq: int
    ts: int
    key: Optional[bytes]
    value: bytes


@dataclass(frozen=True, slots=True)
class Fetched:
    """One partition of a Consume answer, decoded. ``messages`` are those at
    or after the requested seq and not above ``hw_mark``; ``complete`` is
    False when the chunk ended in a cut bundle. ``flags`` is errorOrFlags
    (``FETCH_OK``/``FETCH_SPARSE`` for data), or None for an unknown topic."""
    topic: str
    partition: int
    flags: Optional[int]
    hw_mark: int = 0
    first_avail: int = 0
    base_seq: Optional[int] = None
    messages: Tuple[Message, ...] = ()
    complete: bool = True

    @property
    def ok(self):
        return self.flags in (FETCH_OK, FETCH_SPARSE)


@dataclass(frozen=True, slots=True)
class FetchResult:
    """What ``fetch`` read; continue from ``next_seq``."""
    messages: List[Message]
    next_seq: int
    hw_mark: int


class TankClientProtocol(FramedProtocol):
    """The client side of one connection."""

    header = tc.FRAME_HEADER
    length_field = 1
    max_frame_bytes = MAX_RESPONSE_BYTES

    def __init__(self, client_id=""):
        self.client_id = client_id
        self.pinged = defer.Deferred()
        self._pending = {}
        self._next_id = 0
        self._lost = None
        self._closed = []

    # -- connection ------------------------------------------------------

    def connectionMade(self):
        set_no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if set_no_delay is not None:
            set_no_delay(True)

    def connectionLost(self, reason):
        self._lost = reason
        pending, self._pending = self._pending, {}
        for d, _ in pending.values():
            d.errback(reason)
        closed, self._closed = self._closed, []
        for d in closed:
            d.callback(None)

    def close(self):
        """Close the connection; fires once it is closed (waiting calls fail first)."""
        if self._lost is not None:
            return defer.succeed(None)
        d = defer.Deferred()
        self._closed.append(d)
        self.transport.loseConnection()
        return d

    def _drop(self, problem):
        """The stream can no longer be trusted: fail everything, close."""
        pending, self._pending = self._pending, {}
        for d, _ in pending.values():
            d.errback(TankDecodeError(problem))
        self.transport.loseConnection()

    # -- frames ------------------------------------------------------------

    def next_req_id(self):
        self._next_id = (self._next_id + 1) & 0xFFFFFFFF
        return self._next_id

    def send_raw(self, frame, req_id, msg_id=None):
        """Send a frame encoded in advance; fires with the decoded response
        whose reqId is ``req_id`` (``msg_id`` None: any message id)."""
        if self._lost is not None:
            return defer.fail(self._lost)
        if req_id in self._pending:
            return defer.fail(ValueError(f"reqId {req_id} is already waiting"))
        d = defer.Deferred()
        self._pending[req_id] = (d, msg_id)
        self.transport.write(frame)
        return d

    def send(self, request):
        return self.send_raw(tc.encode_request(request), request.req_id,
                             tc.PRODUCE if type(request) is tc.ProduceRequest else
                             _RESPONSE_IDS[type(request)])

    def frameTooLarge(self, fields):
        self._drop(f"response of {fields[1]} bytes exceeds {self.max_frame_bytes}")

    def frameReceived(self, fields, payload):
        msg_id = fields[0]
        if msg_id == tc.PING:
            if not self.pinged.called:
                self.pinged.callback(None)
            return
        try:
            req_id = tc.response_req_id(payload, msg_id)
        except TankDecodeError as e:
            self._drop(str(e))
            return
        waiting = self._pending.pop(req_id, None)
        if waiting is None or (waiting[1] is not None and waiting[1] != msg_id):
            self._drop(f"response {msg_id:#04x} to unknown reqId {req_id}")
            return
        d = waiting[0]
        try:
            response = tc.decode_response(msg_id, payload)
        except TankDecodeError as e:
            d.errback(e)
            return
        d.callback(response)

    # -- produce ---------------------------------------------------------------

    def produce_bundles(self, items, with_seqnum=False, required_acks=1, ack_timeout_ms=0):
        """Send pre-encoded bundles in one request. ``items``: ``(topic,
        partition, bundle)`` or, with ``with_seqnum``, ``(topic, partition,
        bundle, first_seq)``, in request order (a topic's items are grouped
        where it first appears). Fires with ``{(topic, partition): code}``."""
        topics = {}
        for item in items:
            topic, partition, bundle = item[:3]
            first_seq = item[3] if with_seqnum else 0
            topics.setdefault(topic, []).append(tc.ProducePartition(partition, bundle, first_seq))
        req = tc.ProduceRequest(self.next_req_id(), tuple(
            tc.ProduceTopic(name, tuple(parts)) for name, parts in topics.items()),
            with_seqnum, self.client_id, required_acks, ack_timeout_ms)
        names = [(t.name, [p.partition for p in t.partitions]) for t in req.topics]
        return self.send(req).addCallback(lambda r: tc.produce_results(names, r.codes))

    def produce(self, topic, partition, values, keys=None, timestamps=None, compress=None,
                first_seq=None):
        """Produce ``values`` as one bundle; fires with None, or fails with
        ``TankError``. ``first_seq`` sends ProduceWithSeqnum (0x05)."""
        bundle = tc.encode_bundle(values, keys, timestamps, compress)
        if first_seq is None:
            d = self.produce_bundles([(topic, partition, bundle)])
        else:
            d = self.produce_bundles([(topic, partition, bundle, first_seq)], with_seqnum=True)
        return d.addCallback(_check_produced, topic, partition)

    # -- consume ---------------------------------------------------------------

    def consume(self, partitions, max_wait_ms=0, min_bytes=0, version=2, op_flags=0):
        """One Consume request. ``partitions``: ``(topic, partition, seq,
        fetch_size)`` in request order. Fires with a list of ``Fetched`` in
        the same order."""
        topics = {}
        for topic, partition, seq, fetch_size in partitions:
            topics.setdefault(topic, []).append(tc.ConsumePartition(partition, seq, fetch_size))
        req = tc.ConsumeRequest(self.next_req_id(), tuple(
            tc.ConsumeTopic(name, tuple(parts)) for name, parts in topics.items()),
            max_wait_ms, min_bytes, version, op_flags if version >= 3 else 0, self.client_id)
        return self.send(req).addCallback(self._fetched, req)

    @staticmethod
    def _fetched(resp, req):
        out = []
        for asked, got in zip(req.topics, resp.topics):
            if got.entries is None:
                out.extend(Fetched(asked.name, p.partition, None) for p in asked.partitions)
                continue
            for p, entry in zip(asked.partitions, got.entries):
                out.append(_decode_entry(asked.name, p.seq, entry))
        return out

    @defer.inlineCallbacks
    def fetch(self, topic, partition, seq, fetch_size=DEFAULT_FETCH_SIZE, max_wait_ms=0,
              min_bytes=0):
        """Read one partition from ``seq`` (0: first available; ``TAIL_SEQ``:
        only what comes next). Retries a boundary error from the first
        available seq when ``seq`` is below it, and a chunk whose only bundle
        was cut with more room. Fires with a ``FetchResult``; fails with
        ``TankError`` for an unknown topic or partition, or a seq past the end."""
        while True:
            [got] = yield self.consume([(topic, partition, seq, fetch_size)], max_wait_ms,
                                       min_bytes)
            if got.flags is None:
                raise TankError(f"unknown topic {topic}", tc.ERR_UNKNOWN_TOPIC)
            if got.flags == FETCH_BOUNDARY:
                if seq and seq < got.first_avail:
                    seq = got.first_avail
                    continue
                raise TankError(f"seq {seq} outside {topic}/{partition} "
                                f"(first available {got.first_avail}, hwMark {got.hw_mark})",
                                FETCH_BOUNDARY)
            if not got.ok:
                raise TankError(f"cannot read {topic}/{partition}", got.flags)
            if not got.messages and not got.complete:
                if fetch_size >= MAX_FETCH_BYTES:
                    raise TankError(f"a bundle of {topic}/{partition} exceeds the largest "
                                    f"fetch size", tc.ERR_INVALID_BUNDLE)
                fetch_size = min(fetch_size * 2, MAX_FETCH_BYTES)
                continue
            messages = list(got.messages)
            if messages:
                next_seq = messages[-1].seq + 1
            elif seq in (0, TAIL_SEQ):
                next_seq = got.hw_mark + 1
            else:
                next_seq = seq
            return FetchResult(messages, next_seq, got.hw_mark)

    # -- administration ----------------------------------------------------------

    def discover_partitions(self, topic, partitions=()):
        """Fires with ``[PartitionSeqs]`` (empty: unknown topic)."""
        req = tc.DiscoverPartitionsRequest(self.next_req_id(), topic, tuple(partitions))
        return self.send(req).addCallback(lambda r: list(r.partitions))

    def create_topic(self, topic, partitions, config=b""):
        """Fires with the CreateTopic code (0 ok, 1 exists, 10 invalid, ...)."""
        req = tc.CreateTopicRequest(self.next_req_id(), topic, partitions, config)
        return self.send(req).addCallback(lambda r: r.error)

    def reload_conf(self, topic, partition):
        req = tc.ReloadConfRequest(self.next_req_id(), topic, partition)
        return self.send(req).addCallback(lambda r: r.error)

    def status(self):
        """Fires with the ``StatusResponse``."""
        return self.send(tc.StatusRequest(self.next_req_id()))

    def discover_topics(self):
        """Fires with ``[TopicSummary]``."""
        return self.send(tc.DiscoverTopicsRequest(self.next_req_id())).addCallback(
            lambda r: list(r.topics))

    def discover_topology(self):
        """Fires with True for a standalone broker (the only kind this client knows)."""
        return self.send(tc.DiscoverTopologyRequest(self.next_req_id())).addCallback(
            lambda r: True)


_RESPONSE_IDS = {
    tc.ConsumeRequest: tc.CONSUME,
    tc.DiscoverPartitionsRequest: tc.DISCOVER_PARTITIONS,
    tc.CreateTopicRequest: tc.CREATE_TOPIC,
    tc.ReloadConfRequest: tc.RELOAD_CONF,
    tc.StatusRequest: tc.STATUS,
    tc.DiscoverTopicsRequest: tc.DISCOVER_TOPICS,
    tc.DiscoverTopologyRequest: tc.DISCOVER_TOPOLOGY,
}


def _check_produced(codes, topic, partition):
    code = codes[(topic, partition)]
    if code != tc.ERR_OK:
        raise TankError(f"produce to {topic}/{partition} failed", code)


def _decode_entry(topic, seq, entry):
    if entry.flags not in (FETCH_OK, FETCH_SPARSE):
        return Fetched(topic, entry.partition, entry.flags, entry.hw_mark, entry.first_avail)
    found, complete = tc.decode_chunk(entry.chunk, entry.base_seq)
    low = seq if seq not in (0, TAIL_SEQ) else 0
    hw = entry.hw_mark
    messages = tuple(Message(s, ts, key, value) for s, ts, key, value in found
                     if low <= s <= hw)
    return Fetched(topic, entry.partition, entry.flags, hw, entry.first_avail,
                   entry.base_seq, messages, complete)


def connect(reactor, host, port, client_id="", timeout=30):
    """Connect to a TANK listener; fires with a ``TankClientProtocol``."""
    endpoint = HostnameEndpoint(reactor, host, port, timeout=timeout)
    return connectProtocol(endpoint, TankClientProtocol(client_id))
