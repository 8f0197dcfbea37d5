"""A Twisted client of the Figg dialect that behaves like the reference SDK,
for tests, examples, benchmarks and bridges.

- **Publish** through a sliding window (256 by default). ``publish`` fires
  once the message has its place in the window, at once while there is
  room, so a loop that waits on it pipelines and blocks only when the
  window is full, like the SDK's ``Publish``; ``publish_blocking`` fires on
  the message's ACK, like the SDK's "publish blocking". ACKs are cumulative:
  an ACK acknowledges every message with a smaller or equal seq_num.
- **Subscribe** (ATTACH) from the latest message or from an offset; the
  client tracks the offset of the last DATA (or of ATTACHED) per topic.
  ``unsubscribe`` sends DETACH and fires on DETACHED.
- **Ping** every ``ping_interval`` seconds; after ``max_ping_out`` pings
  without a PONG the connection counts as dead and is dropped.
- **Reconnect** whenever a connection drops, with the SDK's backoff (at
  once, then 1, 2, 4 ... 30 seconds with 20% jitter). On every connection,
  in this order: ATTACH for topics still waiting for ATTACHED, ATTACH from
  the tracked offset for attached topics, DETACH for topics still waiting
  for DETACHED, then every unacknowledged PUBLISH, oldest first, with its
  original seq_num (at-least-once, figg.md §4.6).
"""
import random
import time
from collections import OrderedDict, deque
from typing import NamedTuple

from twisted.internet import defer, task
from twisted.internet.endpoints import HostnameEndpoint, connectProtocol
from twisted.logger import Logger

from gateway.framing import FramedProtocol
from plugins.figg import codec as fc

__all__ = ["FiggClient", "FiggClientClosed", "Message", "default_backoff"]

log = Logger()

DEFAULT_WINDOW_SIZE = 256
DEFAULT_PING_INTERVAL = 2.0
DEFAULT_MAX_PING_OUT = 2

ATTACHING = "attaching"
ATTACHED = "attached"
DETACHING = "detaching"


class FiggClientClosed(Exception):
    """The client was closed while the call was still waiting."""


class Message(NamedTuple):
    """One DATA: ``offset`` is the opaque "offset of the next message" to
    subscribe from to continue after this one."""
    topic: str
    offset: int
    data: bytes


def default_backoff(attempts):
    """The SDK's reconnect delay in seconds after ``attempts`` failed dials:
    none before the first, then doubling from 1 s up to 30 s, +-20% jitter so
    that many clients do not come back in step."""
    if attempts == 0:
        return 0.0
    return min(1 << (attempts - 1), 30) * random.uniform(0.8, 1.2)


class _Pending:
    __slots__ = ("data", "on_ack", "topic", "waiter")

    def __init__(self, topic, data, on_ack, waiter):
        self.topic = topic
        self.data = data
        self.on_ack = on_ack
        self.waiter = waiter


class _Topic:
    __slots__ = (
        "attached",
        "detached",
        "from_offset",
        "name",
        "offset",
        "on_message",
        "state",
        "topic",
    )

    def __init__(self, name, on_message, from_offset, offset):
        self.name = name
        self.topic = name.encode()
        self.on_message = on_message
        self.state = ATTACHING
        self.from_offset = from_offset
        self.offset = offset
        self.attached = []
        self.detached = []

    def attach_frame(self):
        flags = fc.FROM_OFFSET if self.from_offset else 0
        return fc.encode(fc.Attach(self.topic, self.offset if self.from_offset else 0, flags))


class FiggClient:
    """One logical client over a succession of TCP connections.

    ``connect()`` makes the first connection; after it, the client keeps
    reconnecting until ``close()``. ``on_state`` (optional) is called with
    ``"connected"`` or ``"disconnected"``. ``backoff(attempts)`` gives the
    delay before the next dial (``default_backoff``). ``connections`` counts
    the connections made so far.
    """

    def __init__(self, reactor, host, port, window_size=DEFAULT_WINDOW_SIZE,
                 ping_interval=DEFAULT_PING_INTERVAL, max_ping_out=DEFAULT_MAX_PING_OUT,
                 backoff=default_backoff, connect_timeout=5.0,
                 max_payload_bytes=fc.DEFAULT_MAX_PAYLOAD_BYTES, on_state=None):
        self.reactor = reactor
        self.endpoint = HostnameEndpoint(reactor, host, port, timeout=connect_timeout)
        self.window_size = window_size
        self.ping_interval = ping_interval
        self.max_ping_out = max_ping_out
        self.backoff = backoff
        self.max_payload_bytes = max_payload_bytes
        self.on_state = on_state
        self.connections = 0
        self._proto = None
        self._seq = 0
        self._window = OrderedDict()
        self._queued = deque()
        self._topics = {}
        self._pings = {}
        self._pings_out = 0
        self._ping_loop = None
        self._attempts = 0
        self._redial = None
        self._closed = False
        self._closing = []
        self._reading_paused = False

    # -- connection --------------------------------------------------------------------

    def connect(self):
        """Make the first connection; fires with the client once connected,
        or fails if that first dial fails."""
        return connectProtocol(self.endpoint, _Connection(self)).addCallback(lambda _: self)

    @property
    def connected(self):
        return self._proto is not None

    def close(self):
        """Stop for good; fires once the connection is closed. Calls still
        waiting (a publish for window room, a blocking publish, an attach,
        a ping) fail with ``FiggClientClosed``."""
        if self._closed:
            return defer.succeed(None)
        self._closed = True
        if self._redial is not None and self._redial.active():
            self._redial.cancel()
        self._stop_pinging()
        closed = FiggClientClosed()
        queued, self._queued = self._queued, deque()
        for *_, d in queued:
            d.errback(closed)
        for pending in self._window.values():
            waiter, pending.waiter = pending.waiter, None
            if waiter is not None:
                waiter.errback(closed)
        for t in self._topics.values():
            waiting = t.attached + t.detached
            t.attached, t.detached = [], []
            for d in waiting:
                d.errback(closed)
        pings, self._pings = self._pings, {}
        for _, d in pings.values():
            d.errback(closed)
        if self._proto is None:
            return defer.succeed(None)
        d = defer.Deferred()
        self._closing.append(d)
        self._proto.transport.loseConnection()
        return d

    def pause_reading(self):
        """Stop reading from the connection (the gateway's flow control then
        holds DATA back); ``resume_reading`` undoes it."""
        self._reading_paused = True
        if self._proto is not None:
            self._proto.transport.pauseProducing()

    def resume_reading(self):
        self._reading_paused = False
        if self._proto is not None:
            self._proto.transport.resumeProducing()

    def drop_connection(self):
        """Abort the current connection, as a network failure would; the
        client reconnects."""
        if self._proto is not None:
            self._proto.transport.abortConnection()

    def _connected(self, proto):
        if self._closed:
            # Closed while this dial was under way.
            proto.transport.loseConnection()
            return
        self._proto = proto
        self.connections += 1
        self._attempts = 0
        self._pings_out = 0
        if self._reading_paused:
            proto.transport.pauseProducing()
        if self.on_state is not None:
            self.on_state("connected")
        frames = []
        topics = list(self._topics.values())
        frames += [t.attach_frame() for t in topics if t.state == ATTACHING]
        for t in topics:
            if t.state == ATTACHED:
                frames.append(fc.encode(fc.Attach(t.topic, t.offset, fc.FROM_OFFSET)))
        frames += [fc.encode(fc.Detach(t.topic)) for t in topics if t.state == DETACHING]
        frames += [fc.encode(fc.Publish(p.topic, seq, p.data))
                   for seq, p in self._window.items()]
        if frames:
            proto.transport.write(b"".join(frames))
        if self.ping_interval:
            self._ping_loop = task.LoopingCall(self._ping_tick)
            self._ping_loop.clock = self.reactor
            self._ping_loop.start(self.ping_interval, now=False)

    def _lost(self, proto, reason):
        if proto is not self._proto:
            return
        self._proto = None
        self._stop_pinging()
        # A PONG never crosses connections: the pings sent on this one are lost.
        pings, self._pings = self._pings, {}
        for _, d in pings.values():
            d.errback(reason)
        if self._closed:
            closing, self._closing = self._closing, []
            for d in closing:
                d.callback(None)
            return
        if self.on_state is not None:
            self.on_state("disconnected")
        self._schedule_dial()

    def _schedule_dial(self):
        self._redial = self.reactor.callLater(self.backoff(self._attempts), self._dial)

    def _dial(self):
        self._redial = None
        if self._closed:
            return
        connectProtocol(self.endpoint, _Connection(self)).addErrback(self._dial_failed)

    def _dial_failed(self, failure):
        if self._closed:
            return
        self._attempts += 1
        log.info("figg client: reconnect attempt {n} failed: {error}", n=self._attempts,
                 error=failure.getErrorMessage())
        self._schedule_dial()

    def _send(self, frame):
        if self._proto is not None:
            self._proto.transport.write(frame)

    # -- publish -------------------------------------------------------------------------

    def publish(self, topic, data, on_ack=None):
        """Publish ``data`` to ``topic``; fires with its seq_num once the
        message is in the window (at once while there is room).
        ``on_ack(seq_num)`` is called when the gateway has it durably."""
        return self._publish(topic.encode(), data, on_ack, None)

    def publish_blocking(self, topic, data):
        """Publish and fire with the seq_num once the gateway has acknowledged it."""
        acked = defer.Deferred()
        self._publish(topic.encode(), data, None, acked).addErrback(acked.errback)
        return acked

    def _publish(self, topic, data, on_ack, waiter):
        if self._closed:
            return defer.fail(FiggClientClosed())
        if len(self._window) < self.window_size and not self._queued:
            return defer.succeed(self._enter(topic, data, on_ack, waiter))
        d = defer.Deferred()
        self._queued.append((topic, data, on_ack, waiter, d))
        return d

    def _enter(self, topic, data, on_ack, waiter):
        seq = self._seq
        self._seq += 1
        self._window[seq] = _Pending(topic, data, on_ack, waiter)
        self._send(fc.encode(fc.Publish(topic, seq, data)))
        return seq

    @property
    def unacked(self):
        """Messages published and not yet acknowledged."""
        return len(self._window) + len(self._queued)

    def _acked(self, seq_num):
        window = self._window
        while window:
            seq = next(iter(window))
            if seq > seq_num:
                break
            pending = window.pop(seq)
            if pending.on_ack is not None:
                pending.on_ack(seq)
            if pending.waiter is not None:
                pending.waiter.callback(seq)
        queued = self._queued
        while queued and len(window) < self.window_size:
            topic, data, on_ack, waiter, d = queued.popleft()
            d.callback(self._enter(topic, data, on_ack, waiter))

    # -- subscribe -------------------------------------------------------------------------

    def subscribe(self, topic, on_message, offset=None):
        """Attach to ``topic``: from the latest message, or from ``offset``
        (an offset from an earlier DATA or ATTACHED). ``on_message`` gets each
        ``Message``. Fires with the offset ATTACHED reports."""
        if self._closed:
            return defer.fail(FiggClientClosed())
        t = _Topic(topic, on_message, offset is not None, offset or 0)
        old = self._topics.get(topic)
        if old is not None:
            # Re-attaching supersedes a pending DETACH, which is not re-sent.
            t.attached = old.attached
            for d in old.detached:
                d.callback(None)
        self._topics[topic] = t
        d = defer.Deferred()
        t.attached.append(d)
        self._send(t.attach_frame())
        return d

    def unsubscribe(self, topic):
        """Detach from ``topic``; fires on DETACHED."""
        t = self._topics.get(topic)
        if t is None:
            return defer.succeed(None)
        d = defer.Deferred()
        t.detached.append(d)
        if t.state != DETACHING:
            t.state = DETACHING
            self._send(fc.encode(fc.Detach(t.topic)))
        return d

    def offset(self, topic):
        """The tracked offset of ``topic``: the last DATA's, or ATTACHED's."""
        return self._topics[topic].offset

    # -- ping ------------------------------------------------------------------------------

    def ping(self):
        """Send a PING now; fires with the round trip in seconds on its PONG."""
        if self._closed:
            return defer.fail(FiggClientClosed())
        timestamp = time.time_ns()
        while timestamp in self._pings:
            timestamp += 1
        d = defer.Deferred()
        self._pings[timestamp] = (time.perf_counter(), d)
        self._send(fc.encode(fc.Ping(timestamp)))
        return d

    def _ping_tick(self):
        if self._pings_out >= self.max_ping_out:
            log.info("figg client: {n} pings unanswered, reconnecting", n=self._pings_out)
            self.drop_connection()
            return
        self._pings_out += 1
        self._send(fc.encode(fc.Ping(time.time_ns())))

    def _stop_pinging(self):
        if self._ping_loop is not None and self._ping_loop.running:
            self._ping_loop.stop()
        self._ping_loop = None

    # -- received --------------------------------------------------------------------------

    def _received(self, message):
        kind = type(message)
        if kind is fc.Data:
            t = self._topics.get(message.topic.decode("utf-8", "replace"))
            if t is not None and t.state == ATTACHED:
                t.offset = message.offset
                try:
                    t.on_message(Message(t.name, message.offset, message.data))
                except Exception:
                    log.failure("figg client: on_message for {topic} failed", topic=t.name)
        elif kind is fc.Ack:
            self._acked(message.seq_num)
        elif kind is fc.Attached:
            t = self._topics.get(message.topic.decode("utf-8", "replace"))
            if t is not None:
                if t.state != DETACHING:
                    t.state = ATTACHED
                    t.offset = message.offset
                # Attached, even if a DETACH has been sent since.
                waiting, t.attached = t.attached, []
                for d in waiting:
                    d.callback(message.offset)
        elif kind is fc.Detached:
            name = message.topic.decode("utf-8", "replace")
            t = self._topics.get(name)
            if t is not None and t.state == DETACHING:
                del self._topics[name]
                for d in t.detached:
                    d.callback(None)
        elif kind is fc.Pong:
            self._pings_out = 0
            waiting = self._pings.pop(message.timestamp, None)
            if waiting is not None:
                started, d = waiting
                d.callback(time.perf_counter() - started)


class _Connection(FramedProtocol):
    """One TCP connection of a ``FiggClient``."""

    header = fc.HEADER
    length_field = 2

    def __init__(self, client):
        self.client = client
        self.max_frame_bytes = client.max_payload_bytes

    def connectionMade(self):
        set_no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if set_no_delay is not None:
            set_no_delay(True)
        self.client._connected(self)

    def connectionLost(self, reason):
        self.client._lost(self, reason)

    def frameReceived(self, fields, payload):
        try:
            message = fc.decode_payload(fields[0], payload)
        except fc.FiggDecodeError as e:
            self._bad(str(e))
            return
        if message is not None:
            self.client._received(message)

    def frameTooLarge(self, fields):
        self._bad(f"payload_len {fields[2]} exceeds {self.max_frame_bytes}")

    def _bad(self, problem):
        """The gateway's stream can no longer be trusted: drop it and reconnect."""
        log.warn("figg client: bad frame from the gateway: {problem}", problem=problem)
        self.stopReading()
        self.transport.abortConnection()
