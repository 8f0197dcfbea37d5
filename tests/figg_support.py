"""What the Figg tests share (this module holds no tests): the real gateway
in-process on port 0, raw connections that send exact bytes and collect the
decoded answers, Figg clients, and a capture of the gateway's log lines."""
import shutil
import tempfile

from twisted.internet import defer, reactor, task
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol
from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial.unittest import TestCase

from plugins.figg import codec as fc
from plugins.figg.client import FiggClient
from tests.support import gateway_config, start_gateway

FIGG = {"dialect": "figg", "endpoint": "tcp:0:interface=127.0.0.1"}
RUSTLOG = {"dialect": "rustlog", "endpoint": "tcp:0:interface=127.0.0.1"}


def fast_backoff(attempts):
    """Reconnect at once, then every 50 ms: tests wait for reconnects."""
    return 0.0 if attempts == 0 else 0.05


class RawFigg(Protocol):
    """A connection that writes bytes as given and decodes what comes back,
    without judging it."""

    def __init__(self):
        self.buffer = b""
        self.messages = []
        self.taken = 0
        self.waiting = []
        self.lost = defer.Deferred()
        self.closed = False

    def connectionMade(self):
        self.transport.setTcpNoDelay(True)

    def dataReceived(self, data):
        messages, self.buffer = fc.decode_frames(self.buffer + data, 1 << 30)
        self.messages += messages
        self._check()

    def _check(self):
        waiting, self.waiting = self.waiting, []
        for test, d in waiting:
            result = test()
            if result is not None:
                d.callback(result)
            else:
                self.waiting.append((test, d))

    def connectionLost(self, reason):
        self.closed = True
        waiting, self.waiting = self.waiting, []
        for _, d in waiting:
            d.errback(AssertionError(f"connection closed; unread messages: "
                                     f"{self.messages[self.taken:]!r}"[:3000]))
        self.lost.callback(None)

    def send(self, *messages):
        self.transport.write(b"".join(fc.encode(m) for m in messages))

    def write(self, data):
        self.transport.write(data)

    def take(self, n=1):
        """Fires with the next ``n`` messages (a list)."""
        def test():
            if len(self.messages) - self.taken >= n:
                got = self.messages[self.taken:self.taken + n]
                self.taken += n
                return got
            return None
        return self._wait(test)

    def take_until(self, predicate):
        """Fires with the messages up to and including the first one (not yet
        taken) for which ``predicate`` is true."""
        def test():
            for i in range(self.taken, len(self.messages)):
                if predicate(self.messages[i]):
                    got = self.messages[self.taken:i + 1]
                    self.taken = i + 1
                    return got
            return None
        return self._wait(test)

    def _wait(self, test):
        d = defer.Deferred()
        result = test()
        if result is not None:
            d.callback(result)
        elif self.closed:
            d.errback(AssertionError("connection closed"))
        else:
            self.waiting.append((test, d))
        return d

    @defer.inlineCallbacks
    def ping(self, timestamp=1):
        """A PING round trip: fires with the messages that came before the PONG."""
        self.send(fc.Ping(timestamp))
        got = yield self.take_until(lambda m: m == fc.Pong(timestamp))
        return got[:-1]


def data_frames(topic, first_offset, values):
    """The DATA messages a subscriber expects: ``first_offset`` for the first."""
    return [fc.Data(topic, first_offset + i, v) for i, v in enumerate(values)]


def wait_until(condition, timeout=30.0, interval=0.005):
    """Fires once ``condition()`` is true; fails after ``timeout`` seconds."""
    deadline = reactor.seconds() + timeout

    @defer.inlineCallbacks
    def loop():
        while not condition():
            if reactor.seconds() > deadline:
                raise AssertionError("condition not met in time")
            yield task.deferLater(reactor, interval, lambda: None)
    return loop()


class LogCapture:
    """The gateway's log events while a test runs, as formatted lines."""

    def __init__(self, testcase):
        self.events = []
        globalLogPublisher.addObserver(self.events.append)
        testcase.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def lines(self, dialect="figg"):
        """Warnings and worse that name the dialect (the connection log lines)."""
        out = []
        for event in self.events:
            level = event.get("log_level")
            if level is not None and level.name in ("warn", "error", "critical") \
                    and event.get("dialect") == dialect:
                out.append(formatEvent(event))
        return out

    def failures(self):
        """Events carrying a traceback."""
        return [e for e in self.events if "log_failure" in e]


class FiggTest(TestCase):
    """Starts the gateway with a Figg listener (and others on request)."""

    timeout = 120

    def tempdir(self):
        # not self.mktemp(): under pytest that would write into the working tree
        path = tempfile.mkdtemp(prefix="gateway-figg-")
        self.addCleanup(shutil.rmtree, path, True)
        return path

    @defer.inlineCallbacks
    def start(self, figg=None, extra=(), directory=None, **sections):
        """``figg``: the Figg listener's own options; ``extra``: more listeners."""
        self.directory = directory or self.tempdir()
        listeners = [dict(FIGG, **(figg or {}))] + [dict(x) for x in extra]
        self.config = gateway_config(self.directory, listeners, **sections)
        self.service, self.ports = yield start_gateway(self, self.config)
        self.port = self.ports["figg"]
        return self.service

    @property
    def bus(self):
        return self.service.bus

    def factory(self):
        """The Figg listener's protocol factory (its open connections)."""
        return next(s for s in self.service.listeners if s.listener.dialect == "figg").factory

    @defer.inlineCallbacks
    def raw(self):
        proto = RawFigg()
        yield connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", self.port), proto)

        def close():
            if not proto.closed:
                proto.transport.abortConnection()
            return proto.lost
        self.addCleanup(close)
        return proto

    @defer.inlineCallbacks
    def client(self, **options):
        options.setdefault("backoff", fast_backoff)
        client = FiggClient(reactor, "127.0.0.1", self.port, **options)
        yield client.connect()
        self.addCleanup(client.close)
        return client
