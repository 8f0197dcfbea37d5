"""What every dialect's server protocol shares: connection tracking, a log
line per connection, answers kept in request order, and the listener's
limits and counters.

Twisted's words and mail packages keep the same split: the wire format in
each protocol, the bookkeeping in one place. The listener's ``limits:``
(``gateway.config.ListenerLimits``) are applied here, once for every
dialect:

- ``max_connections``: ``DialectFactory.buildProtocol`` turns the
  connection away (closed at once, one log line);
- ``max_frame_bytes``: ``TrackedConnection.makeConnection`` lowers the
  frame limit the dialect set in ``connectionMade``, which
  ``FramedProtocol`` checks before buffering a body;
- ``max_in_flight``: ``DialectFactory.in_flight_limit`` tightens the bound
  each dialect keeps on requests awaiting their answers;
- ``max_buffered_bytes``: the connection's transport pauses its producer
  (the dialect, or ``OrderedReplies``) once that much output is unsent, and
  the connection takes no more requests until the client has read it.

Pausing a connection's transport through ``MeteredTransport`` also holds
the frames already read, so a limit takes effect at the next request, not
the next read.
"""
from collections import deque

from twisted.internet import defer
from twisted.internet.interfaces import IHandshakeListener, IPushProducer
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOProtocol
from zope.interface import implementer

log = Logger()

#: requests a connection may have in flight before the gateway stops reading
#: from it; the client is slowed down by TCP, and memory stays bounded
MAX_IN_FLIGHT = 1024
#: how long a stopping listener waits for its connections to close before
#: dropping them
CLOSE_GRACE_SECONDS = 2.0


def describe_peer(transport):
    peer = transport.getPeer()
    return f"{getattr(peer, 'host', peer)}:{getattr(peer, 'port', '')}"


def lowest_transport(transport):
    """The transport under any wrapping protocols (TLS): the one holding the
    socket and its send buffer."""
    while True:
        inner = getattr(transport, "transport", None)
        if inner is None:
            return transport
        transport = inner


def unsent_bytes(transport):
    """Bytes written to ``transport`` that the client has not taken yet.

    Read from Twisted's ``FileDescriptor`` buffers (and a TLS wrapper's
    not-yet-encrypted ones); there is no public accessor, and this is read
    only when metrics are collected, never per write.
    """
    total = 0
    while True:
        waiting = getattr(transport, "_appSendBuffer", None)
        if waiting:
            total += sum(map(len, waiting))
        inner = getattr(transport, "transport", None)
        if inner is None:
            break
        transport = inner
    data = getattr(transport, "dataBuffer", b"")
    if isinstance(data, (bytes, bytearray)):
        total += len(data) - getattr(transport, "offset", 0)
    later = getattr(transport, "_tempDataLen", 0)
    return total + (later if isinstance(later, int) else 0)


class MeteredTransport:
    """A connection's transport as its protocol sees it.

    Everything is the wrapped transport's, except that writes are counted
    (``bytes_out``), that pausing and resuming also holds and releases
    the protocol's frames already read (``FramedProtocol.hold_frames``), so
    every way a dialect stops reading stops at the next request, and that
    closing lets go of the registered producer. After ``stop_requests``
    (the gateway is stopping, or the listener is removed) nothing resumes
    it.
    """

    def __init__(self, transport, protocol, clock):
        self.wrapped = transport
        self.protocol = protocol
        self.clock = clock
        self.bytes_out = 0
        self.stopped = False
        self.producer = None
        self.streaming = True
        # Twisted's TLS pauses a registered producer for every write it must
        # buffer while the handshake runs (TANK greets at once), and a
        # dialect stops reading when paused, which stalls the handshake
        # itself: so during a handshake the producer is only noted, and
        # registered once it is done (``handshake_done``).
        self.handshaking = isinstance(transport, TLSMemoryBIOProtocol)

    def write(self, data):
        self.bytes_out += len(data)
        self.wrapped.write(data)

    def writeSequence(self, data):
        if not isinstance(data, list):
            data = list(data)
        self.bytes_out += sum(map(len, data))
        self.wrapped.writeSequence(data)

    def pauseProducing(self):
        self.protocol.hold_frames()
        self.wrapped.pauseProducing()

    def resumeProducing(self):
        if self.stopped:
            return
        self.wrapped.resumeProducing()
        self.protocol.release_frames(self.clock)

    def registerProducer(self, producer, streaming):
        self.producer = producer
        self.streaming = streaming
        if not self.handshaking:
            self.wrapped.registerProducer(producer, streaming)

    def unregisterProducer(self):
        self.producer = None
        if not self.handshaking:
            self.wrapped.unregisterProducer()

    def handshake_done(self):
        self.handshaking = False
        if self.producer is not None:
            self.wrapped.registerProducer(self.producer, self.streaming)

    def loseConnection(self):
        """Close once what is written is sent; nothing more is read as a
        request. A registered producer is let go of first: a transport waits
        for its producer to unregister before it closes (TLS always, TCP when
        paused). And the transport reads again if it was paused: TLS closes
        with a handshake of its own that needs the peer's answer."""
        self.protocol.stopReading()
        if self.producer is not None:
            self.unregisterProducer()
        self.wrapped.resumeProducing()
        self.wrapped.loseConnection()

    def stop_requests(self):
        """Take no more requests, for good; answers still go out."""
        self.stopped = True
        self.protocol.hold_frames()
        self.wrapped.pauseProducing()

    def __getattr__(self, name):
        return getattr(self.wrapped, name)


class _Refused(Protocol):
    """A connection over the listener's ``max_connections``: closed at once."""

    def connectionMade(self):
        self.transport.loseConnection()


class DialectFactory(Factory):
    """A factory that knows its open connections, so a listener can close
    them when it stops (the store must close last), and that keeps the
    listener's connection counters: totals of the connections already
    closed here, the live ones' in the connections themselves, so nothing
    shared is touched per read or write."""

    noisy = False

    def __init__(self, bus, listener):
        self.bus = bus
        self.connections = set()
        self.total_connections = 0
        self.refused_connections = 0
        self.closed_bytes_in = 0
        self.closed_bytes_out = 0
        self.closed_frame_errors = 0
        self.protocol_errors = 0
        self.configure(listener)

    def configure(self, listener):
        """Take this listener's config, at start and on a reload (same
        dialect, endpoint and options; access rules, limits and position may
        differ). A factory that derives values from the limits derives them
        here, so that connections opened after a reload get the new ones."""
        self.listener = listener

    def buildProtocol(self, addr):
        limit = self.listener.limits.max_connections
        if limit is not None and len(self.connections) >= limit:
            self.refused_connections += 1
            log.warn("{dialect} listener {listener}: connection from {peer} refused: "
                     "{limit} connections open (limits.max_connections)",
                     dialect=self.listener.dialect, listener=self.listener.path,
                     peer=f"{getattr(addr, 'host', addr)}:{getattr(addr, 'port', '')}",
                     limit=limit)
            return _Refused()
        return super().buildProtocol(addr)

    def in_flight_limit(self, own=MAX_IN_FLIGHT):
        """The most requests a connection may have awaiting answers: the
        dialect's own bound ``own``, or the listener's if that is smaller."""
        limit = self.listener.limits.max_in_flight
        return own if limit is None else min(own, limit)

    def send_buffer_bytes(self):
        """Unsent output at which a connection's transport pauses its
        producer; None keeps Twisted's default (64 KiB). A dialect that
        bounds its output itself, counting on that default, overrides this."""
        return self.listener.limits.max_buffered_bytes

    def connection_opened(self, proto):
        self.connections.add(proto)
        self.total_connections += 1
        log.info("{dialect} listener {listener}: connection from {peer}",
                 dialect=self.listener.dialect, listener=self.listener.path, peer=proto.peer)

    def connection_closed(self, proto, reason):
        self.connections.discard(proto)
        bytes_out = proto.transport.bytes_out
        self.closed_bytes_in += proto.bytes_in
        self.closed_bytes_out += bytes_out
        self.closed_frame_errors += proto.frame_errors
        log.info("{dialect} listener {listener}: connection from {peer} closed after "
                 "{seconds:.1f} s ({bytes_in} bytes in, {bytes_out} out)",
                 dialect=self.listener.dialect, listener=self.listener.path, peer=proto.peer,
                 seconds=self.bus.reactor.seconds() - proto.opened_at,
                 bytes_in=proto.bytes_in, bytes_out=bytes_out)

    def log_failure(self, failure):
        """A bug or a storage failure behind a request: logged with its
        traceback (unlike a client's bad input, which never gets one)."""
        log.failure("{dialect} listener {listener}: request failed", failure,
                    dialect=self.listener.dialect, listener=self.listener.path)

    def stop_requests(self):
        """Every open connection takes no more requests (its answers still
        go out): the first step of stopping, before in-flight produces are
        waited for."""
        for proto in self.connections:
            proto.transport.stop_requests()

    def close_connections(self):
        """Close every open connection; fires when all are gone.

        A client that stopped reading never lets its transport write out what
        it holds, so a plain close would wait for it forever and hold up the
        gateway's shutdown: after ``CLOSE_GRACE_SECONDS`` the connections still
        open are dropped.
        """
        waits = []
        for proto in list(self.connections):
            waits.append(proto.closed)
            proto.transport.loseConnection()
        if not waits:
            return defer.succeed(None)
        drop = self.bus.reactor.callLater(CLOSE_GRACE_SECONDS, self._drop_remaining)

        def done(result):
            if drop.active():
                drop.cancel()
            return result
        return defer.DeferredList(waits).addBoth(done)

    def _drop_remaining(self):
        for proto in list(self.connections):
            proto.transport.abortConnection()


@implementer(IHandshakeListener)
class TrackedConnection:
    """Mixin for a dialect's Protocol (before ``FramedProtocol`` in its
    bases): registers with its DialectFactory, offers ``closed``, a Deferred
    that fires when the connection is gone, counts its output through a
    ``MeteredTransport`` and applies the listener's limits."""

    peer = "?"
    opened_at = 0.0

    def makeConnection(self, transport):
        factory = self.factory
        high_water = factory.send_buffer_bytes()
        if high_water is not None:
            lowest_transport(transport).bufferSize = high_water
        super().makeConnection(MeteredTransport(transport, self, factory.bus.reactor))
        # After connectionMade, where the dialect set its own frame limit.
        cap = factory.listener.limits.max_frame_bytes
        if cap is not None and cap < self.max_frame_bytes:
            self.max_frame_bytes = cap

    def connectionMade(self):
        self.closed = defer.Deferred()
        self.peer = describe_peer(self.transport)
        self.opened_at = self.factory.bus.reactor.seconds()
        self.factory.connection_opened(self)

    def connectionLost(self, reason):
        self.factory.connection_closed(self, reason)
        closed, self.closed = self.closed, None
        if closed is not None:
            closed.callback(None)

    def handshakeCompleted(self):
        """A TLS listener's handshake is done (see ``MeteredTransport``)."""
        self.transport.handshake_done()

    def log_protocol_error(self, problem):
        """One line per protocol error a client causes; never a traceback."""
        self.factory.protocol_errors += 1
        log.warn("{dialect} {listener} {peer}: {problem}",
                 dialect=self.factory.listener.dialect, listener=self.factory.listener.path,
                 peer=self.peer, problem=problem)


@implementer(IPushProducer)
class OrderedReplies:
    """Write answers in the order their requests arrived, whatever order
    they complete in.

    ``add(result)`` takes the answer's bytes or a Deferred of them (None:
    nothing to send); the dialect turns errors into its own error answers
    before they get here. An answer that is ready while nothing is ahead of
    it is written at once, without a Deferred.

    It stops reading from the transport (``pauseProducing``, which also
    holds the requests already read) for two reasons: more than
    ``max_in_flight`` answers pending (until half of them have drained), or
    the transport's send buffer full (it is the transport's producer: a
    client that stops reading its answers gets no more of them computed).
    """

    def __init__(self, transport, max_in_flight=MAX_IN_FLIGHT):
        self.transport = transport
        self.max_in_flight = max_in_flight
        self.pending = deque()
        self.paused_for = set()
        transport.registerProducer(self, True)

    @property
    def reading_paused(self):
        return bool(self.paused_for)

    def _pause(self, reason):
        if not self.paused_for:
            self.transport.pauseProducing()
        self.paused_for.add(reason)

    def _resume(self, reason):
        if reason in self.paused_for:
            self.paused_for.discard(reason)
            if not self.paused_for:
                self.transport.resumeProducing()

    def add(self, result):
        if not isinstance(result, defer.Deferred):
            if not self.pending:
                if result is not None:
                    self.transport.write(result)
                return
            result = defer.succeed(result)
        slot = _Slot(result)
        self.pending.append(slot)
        result.addCallbacks(self._done, self._dropped, callbackArgs=(slot,))
        if len(self.pending) > self.max_in_flight:
            self._pause("requests")

    def _done(self, data, slot):
        slot.data = data
        slot.done = True
        pending = self.pending
        while pending and pending[0].done:
            head = pending.popleft()
            if head.data is not None:
                self.transport.write(head.data)
        if len(pending) <= self.max_in_flight // 2:
            self._resume("requests")

    @staticmethod
    def _dropped(failure):
        failure.trap(defer.CancelledError)

    def cancel_all(self):
        """The connection is gone: cancel what is pending (parked fetches)."""
        pending, self.pending = self.pending, deque()
        for slot in pending:
            if not slot.done:
                slot.deferred.cancel()

    # -- IPushProducer: the transport's send buffer ------------------------------

    def pauseProducing(self):
        self._pause("output")

    def resumeProducing(self):
        if getattr(self.transport, "disconnecting", False):
            # Closing: while a producer is registered the transport asks it
            # for more instead of closing, so let go.
            self.transport.unregisterProducer()
            return
        self._resume("output")

    def stopProducing(self):
        """The connection is gone; the protocol cancels what is pending."""


class _Slot:
    __slots__ = ("deferred", "data", "done")

    def __init__(self, deferred):
        self.deferred = deferred
        self.data = None
        self.done = False
