"""``python -m bench [SUITE ...] [--runs N] [--seconds S]``: print tables.

A suite is a module ``bench/<name>.py`` with ``table(reactor, runs,
seconds)``; adding a dialect's benchmark needs no edit here. Every figure is
the median of ``--runs`` runs. Beside it stands a ratio to a baseline
measured in the same invocation (store appends: the same shape under
``fsync: never``; network scenarios: raw loopback through a Twisted server
that answers canned replies), because this machine is shared and noisy and
only ratios compare across runs.
"""
import argparse
import importlib
import pkgutil

from twisted.internet import defer, task

import bench


def suites():
    return sorted(name for _, name, _ in pkgutil.iter_modules(bench.__path__)
                  if hasattr(importlib.import_module(f"bench.{name}"), "table"))


def main(argv=None):
    known = suites()
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("suites", nargs="*", default=known, choices=known)
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (median)")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of one run")
    args = parser.parse_args(argv)

    @defer.inlineCallbacks
    def run(reactor):
        for name in args.suites:
            yield importlib.import_module(f"bench.{name}").table(reactor, args.runs, args.seconds)
    task.react(run)


if __name__ == "__main__":
    main()
