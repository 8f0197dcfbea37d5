"""``python -m plugins.figg``: publish lines to a topic, or tail one.

::

    python -m plugins.figg publish TOPIC [--host H] [--port P] < lines
    python -m plugins.figg tail TOPIC [--offset N] [--count N] [--host H] [--port P]

``publish`` sends each line of standard input (without its newline) as one
message, as it arrives, and exits once every message is acknowledged.
``tail`` prints ``offset<TAB>data`` per message, from the latest message or
from ``--offset`` (an offset printed earlier continues after that message),
and exits after ``--count`` messages if given. Both reconnect like the SDK
when the connection drops.
"""
import argparse
import sys

from twisted.internet import defer, stdio, task
from twisted.protocols.basic import LineReceiver

from plugins.figg.client import FiggClient

DEFAULT_PORT = 8119


class _Lines(LineReceiver):
    """Standard input, line by line, published with the window's backpressure:
    while the window is full, standard input is not read."""

    delimiter = b"\n"
    MAX_LENGTH = 1 << 30

    def __init__(self, client, topic, done):
        self.client = client
        self.topic = topic
        self.done = done
        self.sent = 0
        self.acked = 0
        self.eof = False

    def lineReceived(self, line):
        self.sent += 1
        d = self.client.publish(self.topic, line, on_ack=self._acked)
        if not d.called:
            self.transport.pauseProducing()
            d.addCallback(lambda _: self.transport.resumeProducing())
        d.addErrback(self.done.errback)

    def _acked(self, _):
        self.acked += 1
        self._maybe_done()

    def connectionLost(self, reason):
        rest = self.clearLineBuffer()
        if rest:
            self.lineReceived(rest)
        self.eof = True
        self._maybe_done()

    def _maybe_done(self):
        if self.eof and self.acked == self.sent and not self.done.called:
            self.done.callback(self.sent)


@defer.inlineCallbacks
def publish(reactor, client, args):
    done = defer.Deferred()
    stdio.StandardIO(_Lines(client, args.topic, done), reactor=reactor)
    count = yield done
    print(f"published {count} messages to {args.topic}")


@defer.inlineCallbacks
def tail(reactor, client, args):
    done = defer.Deferred()
    out = sys.stdout.buffer
    seen = [0]

    def show(message):
        out.write(b"%d\t%s\n" % (message.offset, message.data))
        out.flush()
        seen[0] += 1
        if args.count is not None and seen[0] == args.count and not done.called:
            done.callback(None)
    yield client.subscribe(args.topic, show, args.offset)
    if args.count != 0:
        yield done


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m plugins.figg")
    parser.add_argument("command", choices=["publish", "tail"])
    parser.add_argument("topic")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--offset", type=int, default=None,
                        help="tail: start after the message that had this offset")
    parser.add_argument("--count", type=int, default=None,
                        help="tail: exit after this many messages")
    args = parser.parse_args(argv)
    run = publish if args.command == "publish" else tail

    @defer.inlineCallbacks
    def session(reactor):
        client = FiggClient(reactor, args.host, args.port)
        try:
            yield client.connect()
        except Exception as e:
            print(f"cannot connect to {args.host}:{args.port}: {e}", file=sys.stderr)
            raise SystemExit(1)
        try:
            yield run(reactor, client, args)
        finally:
            yield client.close()
    task.react(session)


if __name__ == "__main__":
    main()
