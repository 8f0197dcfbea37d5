"""What every dialect's server protocol shares: connection tracking, a log
line per connection, and answers kept in request order.

Twisted's words and mail packages keep the same split: the wire format in
each protocol, the bookkeeping in one place.
"""
from collections import deque

from twisted.internet import defer
from twisted.internet.protocol import Factory
from twisted.logger import Logger

log = Logger()

#: requests a connection may have in flight before the gateway stops reading
#: from it; the client is slowed down by TCP, and memory stays bounded
MAX_IN_FLIGHT = 1024
#: how long a stopping listener waits for its connections to close before
#: dropping them
CLOSE_GRACE_SECONDS = 2.0


class DialectFactory(Factory):
    """A factory that knows its open connections, so a listener can close
    them when it stops (the store must close last)."""

    noisy = False

    def __init__(self, bus, listener):
        self.bus = bus
        self.listener = listener
        self.connections = set()
        self.total_connections = 0

    def connection_opened(self, proto):
        self.connections.add(proto)
        self.total_connections += 1
        peer = proto.transport.getPeer()
        log.info("{dialect} listener {listener}: connection from {peer}",
                 dialect=self.listener.dialect, listener=self.listener.path,
                 peer=f"{getattr(peer, 'host', peer)}:{getattr(peer, 'port', '')}")

    def connection_closed(self, proto, reason):
        self.connections.discard(proto)

    def log_failure(self, failure):
        """A bug or a storage failure behind a request: logged with its
        traceback (unlike a client's bad input, which never gets one)."""
        log.failure("{dialect} listener {listener}: request failed", failure,
                    dialect=self.listener.dialect, listener=self.listener.path)

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


class TrackedConnection:
    """Mixin for a dialect's Protocol: registers with its DialectFactory and
    offers ``closed``, a Deferred that fires when the connection is gone."""

    def connectionMade(self):
        self.closed = defer.Deferred()
        self.factory.connection_opened(self)

    def connectionLost(self, reason):
        self.factory.connection_closed(self, reason)
        closed, self.closed = self.closed, None
        if closed is not None:
            closed.callback(None)

    def log_protocol_error(self, problem):
        """One line per protocol error a client causes; never a traceback."""
        peer = self.transport.getPeer()
        log.warn("{dialect} {listener} {peer}: {problem}",
                 dialect=self.factory.listener.dialect, listener=self.factory.listener.path,
                 peer=f"{getattr(peer, 'host', peer)}:{getattr(peer, 'port', '')}",
                 problem=problem)


class OrderedReplies:
    """Write answers in the order their requests arrived, whatever order
    they complete in.

    ``add(result)`` takes the answer's bytes or a Deferred of them (None:
    nothing to send); the dialect turns errors into its own error answers
    before they get here. An answer that is ready while nothing is ahead of
    it is written at once, without a Deferred. With more than
    ``max_in_flight`` answers pending, the transport stops reading until
    half of them have drained.
    """

    def __init__(self, transport, max_in_flight=MAX_IN_FLIGHT):
        self.transport = transport
        self.max_in_flight = max_in_flight
        self.pending = deque()
        self.reading_paused = False

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
        if len(self.pending) > self.max_in_flight and not self.reading_paused:
            self.reading_paused = True
            self.transport.pauseProducing()

    def _done(self, data, slot):
        slot.data = data
        slot.done = True
        pending = self.pending
        while pending and pending[0].done:
            head = pending.popleft()
            if head.data is not None:
                self.transport.write(head.data)
        if self.reading_paused and len(pending) <= self.max_in_flight // 2:
            self.reading_paused = False
            self.transport.resumeProducing()

    @staticmethod
    def _dropped(failure):
        failure.trap(defer.CancelledError)

    def cancel_all(self):
        """The connection is gone: cancel what is pending (parked fetches)."""
        pending, self.pending = self.pending, deque()
        for slot in pending:
            if not slot.done:
                slot.deferred.cancel()


class _Slot:
    __slots__ = ("deferred", "data", "done")

    def __init__(self, deferred):
        self.deferred = deferred
        self.data = None
        self.done = False
