"""Printing benchmark tables, and taking medians of repeated runs."""
import statistics
import sys

from twisted.internet import defer


@defer.inlineCallbacks
def median_of(runs, make):
    """Run ``make()`` (a Deferred of a tuple of numbers) ``runs`` times; the
    element-wise median."""
    results = []
    for _ in range(runs):
        results.append((yield make()))
    return tuple(statistics.median(r[i] for r in results) for i in range(len(results[0])))


def fmt(x):
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


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


