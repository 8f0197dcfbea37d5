"""Group commit: one fsync for every write that arrived while the last one ran.

Writes go to the OS on the reactor thread (a page-cache copy, microseconds);
``fsync`` goes to one dedicated thread, never the reactor. Whoever needs a
write durable asks with ``after_sync(path, done)``; ``done(error)`` runs on
the reactor (``error`` is None on success) once an fsync of ``path`` that *started after the
request* has finished. While one fsync runs, new requests pile up and are
all covered by the next one, so under load the number of fsyncs stays
bounded however many producers there are.

Policies:

- ``always``: an fsync starts as soon as one is asked for and none runs;
- ``interval``: fsyncs start at most every ``interval_ms``; a request waits
  for the next one (so even a power loss loses nothing acknowledged);
- ``never``: nothing waits; the OS writes back when it likes. A process
  crash still loses nothing, because the data is in the page cache.

Files are fsynced by path (open, fsync, close), so a segment that retention
deletes meanwhile is simply skipped, and no file descriptor is shared with
the reactor thread.
"""
import errno
import os
import time

from twisted.internet import threads
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.threadpool import ThreadPool

from storage.errors import StorageError

log = Logger()

POLICIES = ("always", "interval", "never")


def fsync_paths(paths):
    """Run in the sync thread: fsync each file or directory; return seconds taken."""
    started = time.perf_counter()
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            if e.errno == errno.ENOENT:
                continue  # deleted meanwhile: nothing left to make durable
            raise
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return time.perf_counter() - started


class Syncer:
    def __init__(self, reactor, policy, interval_ms):
        if policy not in POLICIES:
            raise ValueError(f"unknown fsync policy {policy!r}")
        self.reactor = reactor
        self.policy = policy
        self.interval = interval_ms / 1000.0
        self.pending_paths = set()
        self.pending = []
        self.running = False
        self.timer = None
        self.last_start = 0.0
        self.pool = None
        self.fsyncs = 0
        self.fsync_seconds = 0.0
        #: callables given each fsync's duration in seconds (the gateway's
        #: latency histogram); the store itself keeps only the totals
        self.observers = []
        self.closed_deferred = None
        self.acknowledging = False

    @property
    def waits(self):
        """Whether acknowledgements wait for fsync under this policy."""
        return self.policy != "never"

    def start(self):
        if self.waits:
            self.pool = ThreadPool(minthreads=1, maxthreads=1, name="gateway-fsync")
            self.pool.start()

    def after_sync(self, path, done):
        """Call ``done(None)`` on the reactor once ``path`` is durable, or
        ``done(error)`` if the fsync failed."""
        self.pending_paths.add(path)
        self.pending.append(done)
        if self.running or self.timer is not None or self.acknowledging:
            return
        self._schedule()

    def sync_soon(self, path):
        """Make ``path`` durable with the next fsync, without waiting for it
        (new directories, index files, a rolled segment)."""
        if self.waits:
            self.pending_paths.add(path)

    def _schedule(self):
        if self.policy == "always":
            self._start()
        else:
            delay = max(0.0, self.last_start + self.interval - self.reactor.seconds())
            self.timer = self.reactor.callLater(delay, self._start)

    def _start(self):
        self.timer = None
        if self.running or not (self.pending or self.pending_paths):
            return
        self.running = True
        self.last_start = self.reactor.seconds()
        paths, self.pending_paths = self.pending_paths, set()
        waiting, self.pending = self.pending, []
        d = threads.deferToThreadPool(self.reactor, self.pool, fsync_paths, list(paths))
        d.addCallbacks(self._done, self._failed, callbackArgs=(waiting,),
                       errbackArgs=(waiting, paths))

    def _done(self, seconds, waiting):
        self.running = False
        self.fsyncs += 1
        self.fsync_seconds += seconds
        for observe in self.observers:
            observe(seconds)
        # Producers acknowledged here usually append again at once: hold the
        # next fsync until all of them have, so it covers them all.
        self.acknowledging = True
        try:
            for done in waiting:
                done(None)
        finally:
            self.acknowledging = False
        self._next()

    def _failed(self, failure, waiting, paths):
        # After a failed fsync the kernel may have dropped the dirty pages: the
        # data is not durable and must not be acknowledged.
        self.running = False
        log.critical("fsync failed: {error}", error=failure.getErrorMessage())
        error = StorageError(f"fsync failed: {failure.getErrorMessage()}")
        self.acknowledging = True
        try:
            for done in waiting:
                done(error)
        finally:
            self.acknowledging = False
        self._next()

    def _next(self):
        if self.pending or self.pending_paths:
            self._schedule()
        elif self.closed_deferred is not None:
            d, self.closed_deferred = self.closed_deferred, None
            d.callback(None)

    def flush(self, paths=()):
        """Fsync everything now (on stop). Returns a Deferred, or None if there is nothing to do."""
        self.pending_paths.update(paths)
        if not self.waits:
            if self.pending_paths:
                fsync_paths(list(self.pending_paths))
                self.pending_paths = set()
            return None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not (self.running or self.pending or self.pending_paths):
            return None
        self.closed_deferred = Deferred()
        if not self.running:
            self._start()
        return self.closed_deferred

    def stop(self):
        if self.pool is not None:
            self.pool.stop()
            self.pool = None
