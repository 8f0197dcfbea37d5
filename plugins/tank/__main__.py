"""``python -m plugins.tank``: a small TANK command line, like ``tank-cli``.

::

    python -m plugins.tank [--host H] [--port P] produce TOPIC [-p N] [MESSAGE ...]
    python -m plugins.tank [--host H] [--port P] tail TOPIC [-p N] [--from beginning|end|SEQ]
                                                 [--count N]
    python -m plugins.tank [--host H] [--port P] topics | partitions TOPIC | create TOPIC [-n N]

``produce`` sends its messages (or, with none given, one per line of
standard input) as one bundle; ``tail`` prints ``seq<TAB>value`` per message
and follows the partition with long-polls until ``--count`` messages (or
forever). Errors print one line and exit with status 1.
"""
import argparse
import sys
import time

from twisted.internet import defer

from plugins.tank.client import TankError, connect
from plugins.tank.codec import TAIL_SEQ

#: how long one long-poll of ``tail`` parks at the broker
TAIL_WAIT_MS = 5000


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m plugins.tank", description="TANK client")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=11011)
    sub = p.add_subparsers(dest="command", required=True)
    produce = sub.add_parser("produce", help="produce messages as one bundle")
    produce.add_argument("topic")
    produce.add_argument("-p", "--partition", type=int, default=0)
    produce.add_argument("messages", nargs="*", help="default: one per line of stdin")
    tail = sub.add_parser("tail", help="print a partition's messages, following it")
    tail.add_argument("topic")
    tail.add_argument("-p", "--partition", type=int, default=0)
    tail.add_argument("--from", dest="start", default="beginning",
                      help="beginning, end, or a sequence number")
    tail.add_argument("--count", type=int, default=0, help="stop after N messages (0: never)")
    sub.add_parser("topics", help="list topics")
    partitions = sub.add_parser("partitions", help="first available seq and hwMark per partition")
    partitions.add_argument("topic")
    create = sub.add_parser("create", help="create a topic")
    create.add_argument("topic")
    create.add_argument("-n", "--partitions", type=int, default=1)
    args = p.parse_args(argv)
    if args.command == "tail":
        if args.start in ("beginning", "end"):
            args.seq = 0 if args.start == "beginning" else TAIL_SEQ
        elif args.start.isdigit():
            args.seq = int(args.start)
        else:
            p.error("--from takes beginning, end or a sequence number")
    return args


@defer.inlineCallbacks
def run(reactor, args, out):
    client = yield connect(reactor, args.host, args.port, client_id="plugins.tank")
    try:
        if args.command == "produce":
            messages = args.messages or [line.rstrip("\n") for line in sys.stdin]
            now = int(time.time() * 1000)
            yield client.produce(args.topic, args.partition, [m.encode() for m in messages],
                                 timestamps=[now] * len(messages))
            out.write(f"produced {len(messages)} message(s)\n")
        elif args.command == "tail":
            seq = args.seq
            seen = 0
            while not args.count or seen < args.count:
                got = yield client.fetch(args.topic, args.partition, seq, max_wait_ms=TAIL_WAIT_MS)
                for m in got.messages[:args.count - seen if args.count else None]:
                    out.write(f"{m.seq}\t{m.value.decode('utf-8', 'replace')}\n")
                    seen += 1
                out.flush()
                seq = got.next_seq
        elif args.command == "topics":
            for t in (yield client.discover_topics()):
                out.write(f"{t.name}\t{t.partitions}\n")
        elif args.command == "partitions":
            parts = yield client.discover_partitions(args.topic)
            if not parts:
                raise TankError(f"unknown topic {args.topic}", 0xFF)
            for i, p in enumerate(parts):
                out.write(f"{i}\t{p.first_avail}\t{p.hw_mark}\n")
        elif args.command == "create":
            code = yield client.create_topic(args.topic, args.partitions)
            if code:
                raise TankError(f"cannot create {args.topic}", code)
            out.write(f"created {args.topic} with {args.partitions} partition(s)\n")
    finally:
        yield client.close()


def main(argv=None):
    args = parse_args(argv)
    from twisted.internet import reactor
    status = []

    def done(_):
        status.append(0)

    def failed(failure):
        print(f"tank: {failure.getErrorMessage()}", file=sys.stderr)
        status.append(1)

    def start():
        d = run(reactor, args, sys.stdout)
        d.addCallbacks(done, failed)
        d.addBoth(lambda _: reactor.stop())
    reactor.callWhenRunning(start)
    reactor.run()
    return status[0] if status else 1


if __name__ == "__main__":
    sys.exit(main())
