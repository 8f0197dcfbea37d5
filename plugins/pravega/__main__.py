"""``python -m plugins.pravega``: append lines to a segment, or tail one.

    python -m plugins.pravega append gateway/orders/0.#epoch.0 < lines.txt
    python -m plugins.pravega tail gateway/orders/0.#epoch.0 [--from 0] [--to-tail]

``append`` writes each line of stdin (without its newline) as one event
through ``EventWriter`` and exits once all are durable, printing how many.
``tail`` prints each event as ``position<TAB>value`` (the value decoded as
UTF-8, undecodable bytes escaped) and follows the segment as it grows,
until it is sealed; ``--to-tail`` stops at the tail it finds at the start.
"""
import argparse
import sys

from twisted.internet import defer, error, task

from plugins.pravega.client import EventReader, EventWriter, PravegaError, connect


@defer.inlineCallbacks
def append(reactor, args):
    writer = EventWriter(reactor, lambda: connect(reactor, args.host, args.port),
                         args.segment, standalone=args.standalone, give_up_after=5)
    count = 0
    for line in sys.stdin.buffer:
        writer.write(line.rstrip(b"\r\n"))
        count += 1
    yield writer.flush()
    yield writer.close()
    print(f"appended {count} event(s) to {args.segment}")


@defer.inlineCallbacks
def tail(reactor, args):
    proto = yield connect(reactor, args.host, args.port)
    stop = None
    if args.to_tail:
        stop = (yield proto.segment_info(args.segment)).write_offset
    reader = EventReader(proto, args.segment, args.offset)
    out = sys.stdout
    while stop is None or reader.position < stop:
        events = yield reader.read()
        if not events:
            break           # the end of a sealed segment
        for position, value in events:
            out.write(f"{position}\t{value.decode('utf-8', 'backslashreplace')}\n")
        out.flush()
    yield proto.close()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m plugins.pravega")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=12345)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("append", help="append stdin's lines as events")
    p.add_argument("segment")
    p.add_argument("--standalone", action="store_true",
                   help="send blocks as the Rust client does (standalone AppendBlockEnd)")
    p = sub.add_parser("tail", help="print a segment's events as they arrive")
    p.add_argument("segment")
    p.add_argument("--from", dest="offset", type=int, default=0,
                   help="start position (an event boundary)")
    p.add_argument("--to-tail", action="store_true", help="stop at the tail found at the start")
    args = parser.parse_args(argv)
    run = append if args.command == "append" else tail

    def react(reactor):
        d = run(reactor, args)

        def failed(failure):
            failure.trap(PravegaError, ValueError, error.ConnectError, error.ConnectionLost,
                         error.ConnectionDone)
            print(f"pravega: {failure.getErrorMessage()}", file=sys.stderr)
            raise SystemExit(1)
        return d.addErrback(failed)
    task.react(react)


if __name__ == "__main__":
    main()
