"""A one-line progress indicator for long CLI operations (``gateway check``,
a large ``gateway produce``).

It draws on stderr only, and only when stderr is a terminal: output piped
into a file or another program (and every test) stays free of control
characters. It waits half a second before drawing, so short operations
never flash a bar, and redraws at most ten times a second, so updating it
per item costs next to nothing.
"""
import sys
import time

#: seconds before the first draw, and between draws
DELAY = 0.5
INTERVAL = 0.1
WIDTH = 24


def human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


class Progress:
    """``update(nbytes, items)`` adds to the totals; ``close()`` erases the
    line. ``total`` (bytes) gives a bar and a percentage; without it the
    line shows the counts and the rate."""

    def __init__(self, label, total=None, unit="records", stream=None, clock=time.monotonic):
        self.stream = sys.stderr if stream is None else stream
        self.enabled = self.stream.isatty()
        self.label = label
        self.total = total
        self.unit = unit
        self.clock = clock
        self.started = clock()
        self.next_draw = self.started + DELAY
        self.bytes = 0
        self.items = 0
        self.drawn = False

    def update(self, nbytes=0, items=0):
        self.bytes += nbytes
        self.items += items
        if self.enabled:
            now = self.clock()
            if now >= self.next_draw:
                self.next_draw = now + INTERVAL
                self._draw(now)

    def line(self, now):
        """The text of the indicator at time ``now``."""
        rate = self.bytes / max(now - self.started, 1e-9)
        counts = f"{self.items:,} {self.unit}, {human_bytes(self.bytes)}"
        if self.total:
            fraction = min(self.bytes / self.total, 1.0)
            filled = int(fraction * WIDTH)
            bar = "#" * filled + "." * (WIDTH - filled)
            return f"{self.label} [{bar}] {fraction:4.0%} {counts} ({human_bytes(rate)}/s)"
        return f"{self.label} {counts} ({human_bytes(rate)}/s)"

    def _draw(self, now):
        self.stream.write("\r\x1b[K" + self.line(now))
        self.stream.flush()
        self.drawn = True

    def close(self):
        if self.drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.drawn = False
