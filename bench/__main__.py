"""``python -m bench [store] [rustlog] [--runs N] [--seconds S]``: print a table.

Every figure is the median of ``--runs`` runs. Beside it stands a ratio to
a baseline measured in the same invocation (store appends: the same shape
under ``fsync: never``; network scenarios: raw loopback through a Twisted
server that answers canned replies), because this machine is shared and
noisy and only ratios compare across runs.
"""
import argparse
import statistics
import sys

from twisted.internet import defer, task


@defer.inlineCallbacks
def _median(runs, make):
    results = []
    for _ in range(runs):
        results.append((yield make()))
    return tuple(statistics.median(r[i] for r in results) for i in range(len(results[0])))


def fmt(x):
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


@defer.inlineCallbacks
def store_table(reactor, runs, seconds):
    from bench.store import append_scenario
    rows = []
    base = {}
    for batch in (1, 100):
        for fsync, producers in (("never", 1), ("interval", 32), ("always", 32),
                                 ("always", 1)):
            if batch == 100 and producers == 1 and fsync == "always":
                continue
            rps, mbps = yield _median(runs, lambda: append_scenario(
                reactor, fsync, batch, producers=producers, seconds=seconds))
            if fsync == "never":
                base[batch] = rps
            rows.append((f"store append {batch} x 100 B", f"fsync {fsync}", producers,
                         rps, mbps, rps / base[batch]))
    print_table("Store appends (records/s; ratio to fsync never, same batch size)",
                ("scenario", "policy", "producers", "records/s", "MB/s", "ratio"), rows)


def print_table(title, header, rows):
    cells = [[str(h) for h in header]] + [
        [c if isinstance(c, str) else (f"{c:.2f}" if isinstance(c, float) and c < 10 else
                                        fmt(c) if isinstance(c, float) else str(c))
         for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n{title}")
    for i, r in enumerate(cells):
        print("| " + " | ".join(c.rjust(w) if j >= 2 else c.ljust(w)
                                for j, (c, w) in enumerate(zip(r, widths))) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    sys.stdout.flush()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("suites", nargs="*", default=["store", "rustlog"],
                        choices=["store", "rustlog"])
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (median)")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of one run")
    args = parser.parse_args(argv)

    @defer.inlineCallbacks
    def run(reactor):
        if "store" in args.suites:
            yield store_table(reactor, args.runs, args.seconds)
        if "rustlog" in args.suites:
            from bench.rustlog import rustlog_table
            yield rustlog_table(reactor, args.runs, args.seconds)
    task.react(lambda reactor: run(reactor))


if __name__ == "__main__":
    main()
