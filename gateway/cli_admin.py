"""``gateway topics`` and ``gateway groups``: administration through a
running gateway's listeners.

``topics describe`` shows, for each partition, where the log starts and
ends in every dialect's terms (DESIGN.md "Records and offsets"): the offset,
TANK's seqs (first available = log start + 1, 0 for a partition never
written; hwMark = the end offset), the Figg offsets an ATTACH would name
(the start, and the next offset ATTACHED reports at the end) and the
Pravega byte positions. Offsets come through ``--dialect`` (TANK, Kafka or
RustLog); byte positions are sums over the records, which only the
gateway knows, so they are asked of the Pravega listener (``--pravega``),
and shown as ``-`` without one.

Consumer groups live on the wire only in Kafka (ListGroups,
DescribeGroups, OffsetFetch), so ``groups`` talks to the Kafka listener.
Committed offsets are shared by every dialect, so ``groups describe``
shows a RustLog consumer's commits as well.
"""
import json
import sys

from twisted.internet import defer, error

from gateway.cli_clients import CLIError, make_client, session


def table(rows, header, out=None):
    """Columns padded to their widest cell; numbers right-aligned."""
    out = sys.stdout if out is None else out
    cells = [[str(c) for c in row] for row in [header] + rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    numeric = [bool(rows) and all(isinstance(row[i], int) or row[i] == "-" for row in rows)
               for i in range(len(header))]
    for row in cells:
        out.write("  ".join(c.rjust(w) if numeric[i] else c.ljust(w)
                            for i, (c, w) in enumerate(zip(row, widths))).rstrip() + "\n")


def with_client(reactor, args, work, operation=None):
    """Connect through ``args.dialect`` (if it can do ``operation``), run
    ``work(client)`` within ``args.timeout`` seconds, and close."""
    client = make_client(reactor, args.dialect, args.bootstrap, args.timeout, args.scope)
    if operation is not None:
        client.require(operation)
    return session(reactor, client, lambda: defer.maybeDeferred(work, client).addTimeout(
        args.timeout, reactor))


@defer.inlineCallbacks
def topics_list(reactor, args):
    topics = yield with_client(reactor, args, lambda client: client.list_topics(),
                               "list_topics")
    table([[name, count] for name, count in topics], ["topic", "partitions"])
    return 0


@defer.inlineCallbacks
def topics_create(reactor, args):
    yield with_client(reactor, args,
                      lambda client: client.create_topic(args.topic, args.partitions),
                      "create_topic")
    print(f"created topic {args.topic} with {args.partitions} partition(s)")
    return 0


def tank_first_seq(start, end):
    return start + 1 if end else 0


@defer.inlineCallbacks
def topics_describe(reactor, args):
    offsets = yield with_client(reactor, args, lambda client: client.offsets(args.topic),
                                "offsets")
    positions = None
    if args.pravega != "none":
        pravega = make_client(reactor, "pravega", args.pravega, args.timeout, args.scope)
        try:
            positions = yield session(reactor, pravega, lambda: pravega.positions(
                args.topic, len(offsets)).addTimeout(args.timeout, reactor))
        except error.ConnectError as e:
            print(f"gateway: no Pravega byte positions ({pravega.where()}: {e})",
                  file=sys.stderr)
    rows = []
    for partition, (start, end) in enumerate(offsets):
        start_pos, end_pos = positions[partition] if positions else (None, None)
        rows.append({"partition": partition, "records": end - start,
                     "start": {"offset": start, "tank_seq": tank_first_seq(start, end),
                               "figg_offset": start, "pravega_position": start_pos},
                     "end": {"offset": end, "tank_hwmark": end, "figg_offset": end,
                             "pravega_position": end_pos}})
    if args.json:
        json.dump({"topic": args.topic, "partitions": rows}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"topic {args.topic}: {len(rows)} partition(s)")
    table([[r["partition"],
            r["start"]["offset"], r["start"]["tank_seq"], r["start"]["figg_offset"],
            _shown(r["start"]["pravega_position"]),
            r["end"]["offset"], r["end"]["tank_hwmark"], r["end"]["figg_offset"],
            _shown(r["end"]["pravega_position"]), r["records"]] for r in rows],
          ["partition", "start offset", "tank seq", "figg", "pravega",
           "end offset", "tank hwMark", "figg", "pravega", "records"])
    return 0


def _shown(position):
    return "-" if position is None else position


@defer.inlineCallbacks
def groups_list(reactor, args):
    groups = yield with_client(reactor, args, lambda client: client.list_groups())
    table([list(g) for g in groups], ["group", "protocol type", "state", "members"])
    return 0


@defer.inlineCallbacks
def groups_describe(reactor, args):
    state, members, offsets = yield with_client(
        reactor, args, lambda client: client.describe_group(args.group, args.topic))
    if not members and not offsets:
        raise CLIError(f"group {args.group} has no members and no committed offsets"
                       + (f" for {', '.join(args.topic)}" if args.topic else ""))
    print(f"group {args.group}: {state}, {len(members)} member(s)")
    if members:
        table([list(m) for m in members], ["member", "client", "host"])
    if offsets:
        table([[t, p, committed, end, max(end - committed, 0), metadata]
               for t, p, committed, end, metadata in offsets],
              ["topic", "partition", "committed", "end", "lag", "metadata"])
    return 0
