"""A partition: a directory of segments, appended at the end, read anywhere.

The partition keeps two ends. ``next_offset`` is where the next append goes;
``high_watermark`` is how far the data is durable under the fsync policy,
and only that far is ever served. Readers therefore never see a record that
a crash could take back, and a record seen once is seen forever.
"""
import bisect
import os

from twisted.logger import Logger

from storage.batch import encode_frame
from storage.errors import StorageError
from storage.segment import (NO_TIMESTAMP, SEGMENT_HEADER_SIZE, Segment)

log = Logger()

#: the event number of a writer the partition has never seen (Pravega's
#: "no event number", Long.MIN_VALUE)
NO_EVENT_NUMBER = -(1 << 63)


class Partition:
    def __init__(self, topic, index, directory, settings):
        self.topic = topic
        self.index = index
        self.directory = directory
        self.settings = settings
        self.segments = []
        self.bases = []
        self.next_offset = 0
        self.next_stream_pos = 0
        self.high_watermark = 0
        self.hw_stream_pos = 0
        self.writers = {}
        self.waiters = []
        self.sealed = False
        self.dirty = False
        self.rolled = False

    # -- opening ---------------------------------------------------------

    def open(self, now_ms):
        """Load the segments, check the tail, and return what recovery found."""
        os.makedirs(self.directory, exist_ok=True)
        bases = sorted(int(name[:-4]) for name in os.listdir(self.directory)
                       if name.endswith(".log") and name[:-4].isdigit())
        for name in os.listdir(self.directory):
            if name.endswith(".tmp"):
                os.unlink(os.path.join(self.directory, name))
        interval = self.settings.index_interval_bytes
        report = None
        for i, base in enumerate(bases):
            seg = Segment.open(self.directory, base)
            if seg is None:
                # A torn creation holds no data; anything after it cannot be trusted.
                log.warn("{dir}: dropping segment {base} with a torn header", dir=self.directory, base=base)
                for later in bases[i:]:
                    Segment(self.directory, later, 0, 0, None).delete()
                break
            last = i == len(bases) - 1
            report = seg.recover(interval) if last else seg.load_index(interval)
            if self.segments and seg.base_offset != self.segments[-1].next_offset:
                # A gap means the previous sealed segment lost its tail: keep the
                # consistent prefix only.
                log.error("{dir}: gap before segment {base}; dropping it and later ones",
                          dir=self.directory, base=base)
                seg.delete()
                for later in bases[i + 1:]:
                    Segment(self.directory, later, 0, 0, None).delete()
                break
            if report.truncated:
                log.warn("{dir}: truncated {cut} bytes of torn tail in segment {base} ({problem})",
                         dir=self.directory, cut=report.truncated, base=base,
                         problem=report.problem)
            if not last:
                seg.seal()
            self.segments.append(seg)
            self.bases.append(base)
        if self.segments and self.segments[-1].sealed:
            # The segment after this one was dropped (torn creation or a gap), so
            # this one is the active segment again: it was opened as a sealed one
            # (descriptors released, tail checked from its last index entry only),
            # so reopen it for appends and check it from the start.
            sealed = self.segments[-1]
            sealed.close()
            seg = Segment.open(self.directory, sealed.base_offset)
            report = seg.recover(interval)
            if report.truncated:
                log.warn("{dir}: truncated {cut} bytes of torn tail in segment {base} ({problem})",
                         dir=self.directory, cut=report.truncated, base=seg.base_offset,
                         problem=report.problem)
            self.segments[-1] = seg
        if not self.segments:
            self._roll(0, 0, now_ms)
        active = self.segments[-1]
        self.next_offset = self.high_watermark = active.next_offset
        self.next_stream_pos = self.hw_stream_pos = active.next_stream_pos
        return report

    def rebuild_writers(self, snapshot_offset, snapshot):
        """Writer states = the snapshot, corrected by the log after it.

        A snapshot taken past what the log holds now (a tail lost in an OS
        crash under ``fsync: never``) is dropped and the states are read from
        the whole retained log instead.
        """
        if snapshot_offset is None or snapshot_offset > self.next_offset:
            snapshot_offset, snapshot = self.log_start, {}
        self.writers = dict(snapshot)
        for batch in self.iter_batches(max(snapshot_offset, self.log_start)):
            if batch.writer_id is not None and batch.next_offset > snapshot_offset:
                self.writers[batch.writer_id] = batch.event_number

    # -- facts -------------------------------------------------------------

    @property
    def log_start(self):
        return self.segments[0].base_offset

    @property
    def start_stream_pos(self):
        return self.segments[0].base_stream_pos

    @property
    def size_bytes(self):
        return sum(seg.size for seg in self.segments)

    # -- appending -----------------------------------------------------------

    def append(self, fmt, payload, count, first_ts, max_ts, stream_len, append_ms,
               writer_id=None, event_number=0):
        """Write one batch; return its base offset and stream position.

        The caller has validated everything; the data is visible to readers
        only once ``mark_durable`` moves the high watermark past it.
        """
        settings = self.settings
        active = self.segments[-1]
        base = self.next_offset
        stream_pos = self.next_stream_pos
        frame = encode_frame(fmt, base, count, first_ts, max_ts, append_ms, stream_pos,
                             stream_len, payload, writer_id, event_number)
        if active.size > SEGMENT_HEADER_SIZE and (
                active.size + len(frame) > settings.segment_bytes
                or append_ms - active.created_ms >= settings.segment_ms):
            active = self._roll(base, stream_pos, append_ms)
        active.append(frame, base, count, stream_pos, stream_len, max_ts, append_ms,
                      settings.index_interval_bytes)
        self.next_offset = base + count
        self.next_stream_pos = stream_pos + stream_len
        if writer_id is not None:
            self.writers[writer_id] = event_number
        self.dirty = True
        return base, stream_pos

    def _roll(self, base, stream_pos, now_ms):
        if self.segments:
            self.segments[-1].seal()
        seg = Segment.create(self.directory, base, stream_pos, now_ms)
        self.segments.append(seg)
        self.bases.append(base)
        self.rolled = True
        return seg

    def mark_durable(self, offset, stream_pos):
        """Advance the high watermark and wake the readers waiting for it."""
        if offset <= self.high_watermark:
            return
        self.high_watermark = offset
        self.hw_stream_pos = stream_pos
        if self.waiters:
            self.wake(offset)

    def wake(self, offset):
        # Take the ready waiters off the list before calling anyone: a callback
        # may cancel another waiter (a fetch naming this partition twice) or
        # add a new one (a fetch that re-arms), and neither may be lost or
        # fired twice (which would fail the append that woke them).
        ready = [d for after, d in self.waiters if after < offset]
        if not ready:
            return
        self.waiters = [(after, d) for after, d in self.waiters if after >= offset]
        for d in ready:
            if not d.called:
                d.callback(offset)

    # -- reading ---------------------------------------------------------------

    def _segment_for(self, offset):
        i = bisect.bisect_right(self.bases, offset) - 1
        return max(i, 0)

    def iter_batches(self, offset, end_offset=None):
        """Yield stored batches from the one holding ``offset`` up to ``end_offset``."""
        end = self.high_watermark if end_offset is None else end_offset
        if offset >= end:
            return
        for seg in self.segments[self._segment_for(offset):]:
            start = seg.index_floor(seg.idx_offsets, offset)
            for batch in seg.scan(start):
                if batch.base_offset >= end:
                    return
                if batch.base_offset + batch.count > offset:
                    yield batch

    def iter_batches_at_position(self, stream_pos):
        """Yield stored batches from the one holding stream position ``stream_pos``."""
        if stream_pos >= self.hw_stream_pos:
            return
        positions = [seg.base_stream_pos for seg in self.segments]
        i = max(bisect.bisect_right(positions, stream_pos) - 1, 0)
        # Empty segments share their successor's stream position: take the last one.
        for seg in self.segments[i:]:
            start = seg.index_floor(seg.idx_stream, stream_pos)
            for batch in seg.scan(start):
                if batch.base_offset >= self.high_watermark:
                    return
                if batch.stream_pos + batch.stream_len > stream_pos:
                    yield batch

    def read(self, offset, max_bytes):
        """Whole batches from the one holding ``offset``; at least one if there is
        any, then up to ``max_bytes`` of payload in all."""
        return _take(self.iter_batches(offset), max_bytes)

    def read_at_position(self, stream_pos, max_bytes):
        """Like ``read``, from the batch holding stream position ``stream_pos``."""
        return _take(self.iter_batches_at_position(stream_pos), max_bytes)

    def first_batch_with_timestamp(self, timestamp):
        """The first batch whose largest timestamp is >= ``timestamp``, or None."""
        for seg in self.segments:
            if seg.max_ts == NO_TIMESTAMP or seg.max_ts < timestamp:
                continue
            for batch in seg.scan(seg.position_for_timestamp(timestamp)):
                if batch.base_offset >= self.high_watermark:
                    return None
                if batch.max_ts >= timestamp:
                    return batch
        return None

    # -- retention and lifecycle -------------------------------------------------

    def enforce_retention(self, now_ms, retention_ms, retention_bytes):
        """Delete whole sealed segments that are too old or over the size limit.

        Age is judged by the store's append time, never a client's timestamp.
        The active segment is never deleted, so the log start never passes
        the high watermark. Returns the number of segments deleted.
        """
        deleted = 0
        total = self.size_bytes if retention_bytes is not None else 0
        while len(self.segments) > 1:
            seg = self.segments[0]
            if self.segments[1].base_offset > self.high_watermark:
                break  # its successor holds data that is not durable yet
            too_old = retention_ms is not None and now_ms - seg.last_append_ms > retention_ms
            too_big = retention_bytes is not None and total > retention_bytes
            if not (too_old or too_big):
                break
            total -= seg.size
            self.segments.pop(0)
            self.bases.pop(0)
            seg.delete()
            deleted += 1
        return deleted

    def close(self):
        for seg in self.segments:
            seg.close()
        waiters, self.waiters = self.waiters, []
        for _, d in waiters:
            if not d.called:
                d.errback(StorageError("store closed"))


def _take(batches, max_bytes):
    """The first batch, then more while their payloads fit ``max_bytes``."""
    taken = []
    total = 0
    for batch in batches:
        size = len(batch.payload)
        if taken and total + size > max_bytes:
            break
        taken.append(batch)
        total += size
        if total >= max_bytes:
            break
    return taken
