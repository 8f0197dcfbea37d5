"""One segment file of a partition, with its sparse index.

A segment file starts with a 32-byte header (magic, base offset, base stream
position, creation time) so that even an empty segment knows where the
partition stands; then frames (``storage.batch``) follow back to back. The
file name is the base offset, zero-padded, so a directory listing sorts them.

The sparse index (``.index`` beside the log) holds one entry per
``index_interval_bytes`` of log: the batch's base offset, its file position,
its stream position and the largest timestamp of every batch *before* it.
Offsets, positions and that prefix maximum only grow, so each can be
searched with ``bisect``. The index is a hint: recovery checks the log itself
and rewrites the index to match.
"""
import bisect
import errno
import os
import struct
from array import array
from collections import OrderedDict

from storage.batch import FrameError, OVERHEAD, decode_frame
from storage.errors import StorageError

SEGMENT_MAGIC = b"GWSEG\x00\x00\x01"
SEGMENT_HEADER = struct.Struct("<8sQQq")
SEGMENT_HEADER_SIZE = SEGMENT_HEADER.size
INDEX_ENTRY = struct.Struct("<QQQq")
NO_TIMESTAMP = -(1 << 63)

#: how much a scan reads at once when it has no better idea
SCAN_CHUNK = 256 * 1024
#: sealed segments whose file stays open for reads, least recently used first;
#: bounded so a store with many partitions and segments stays far below the
#: process's file limit
MAX_OPEN_SEALED = 128
_open_sealed = OrderedDict()


def segment_name(base_offset):
    return f"{base_offset:020d}.log"


def index_name(base_offset):
    return f"{base_offset:020d}.index"


class Segment:
    """An open segment: appends at the end, scans from any indexed point."""

    def __init__(self, directory, base_offset, base_stream_pos, created_ms, fd):
        self.directory = directory
        self.base_offset = base_offset
        self.base_stream_pos = base_stream_pos
        self.created_ms = created_ms
        self.fd = fd
        self.path = os.path.join(directory, segment_name(base_offset))
        self.index_path = os.path.join(directory, index_name(base_offset))
        self.size = SEGMENT_HEADER_SIZE
        self.next_offset = base_offset
        self.next_stream_pos = base_stream_pos
        self.max_ts = NO_TIMESTAMP
        self.last_append_ms = created_ms
        self.idx_offsets = array("Q")
        self.idx_positions = array("Q")
        self.idx_stream = array("Q")
        self.idx_prefix_ts = array("q")
        self.last_indexed = -1 << 62
        self.index_fd = None
        self.sealed = False

    # -- creating and opening -------------------------------------------

    @classmethod
    def create(cls, directory, base_offset, base_stream_pos, created_ms):
        """Create an empty segment atomically (temp file + rename)."""
        path = os.path.join(directory, segment_name(base_offset))
        tmp = path + ".tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(SEGMENT_HEADER.pack(SEGMENT_MAGIC, base_offset,
                                            base_stream_pos, created_ms))
            os.replace(tmp, path)
            fd = os.open(path, os.O_RDWR | os.O_APPEND)
        except OSError as e:
            raise StorageError(f"cannot create segment {path}: {e}") from e
        seg = cls(directory, base_offset, base_stream_pos, created_ms, fd)
        seg._open_index(truncate=True)
        return seg

    @classmethod
    def open(cls, directory, base_offset):
        """Open an existing segment; the caller then calls ``load_index`` or ``recover``.

        Returns ``None`` when the header itself is missing or wrong, which can
        only happen to a file whose creation was torn: it holds no data.
        """
        path = os.path.join(directory, segment_name(base_offset))
        fd = os.open(path, os.O_RDWR | os.O_APPEND)
        head = os.pread(fd, SEGMENT_HEADER_SIZE, 0)
        if len(head) < SEGMENT_HEADER_SIZE:
            os.close(fd)
            return None
        magic, base, stream_pos, created_ms = SEGMENT_HEADER.unpack(head)
        if magic != SEGMENT_MAGIC or base != base_offset:
            os.close(fd)
            return None
        return cls(directory, base_offset, stream_pos, created_ms, fd)

    def _open_index(self, truncate):
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND
        if truncate:
            flags |= os.O_TRUNC
        self.index_fd = os.open(self.index_path, flags, 0o644)

    def _add_index_entry(self, offset, position, stream_pos, write=True):
        self.idx_offsets.append(offset)
        self.idx_positions.append(position)
        self.idx_stream.append(stream_pos)
        self.idx_prefix_ts.append(self.max_ts)
        self.last_indexed = position
        if write:
            os.write(self.index_fd, INDEX_ENTRY.pack(offset, position, stream_pos, self.max_ts))

    def _note(self, batch, interval, write_index):
        """Account for a batch that is (now) part of this segment."""
        if batch.position - self.last_indexed >= interval:
            self._add_index_entry(batch.base_offset, batch.position, batch.stream_pos,
                                  write_index)
        self.size = batch.position + batch.frame_size
        self.next_offset = batch.base_offset + batch.count
        self.next_stream_pos = batch.stream_pos + batch.stream_len
        if batch.max_ts > self.max_ts:
            self.max_ts = batch.max_ts
        self.last_append_ms = batch.append_ms

    def load_index(self, interval):
        """Open a sealed segment: trust the index file where it agrees with the log.

        The entries are checked for order and bounds; the last one's batch and
        everything after it are read to learn where the segment ends. Any
        disagreement falls back to a full ``recover``.
        """
        file_size = os.fstat(self.fd).st_size
        try:
            with open(self.index_path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raw = b""
        entries = [INDEX_ENTRY.unpack_from(raw, i)
                   for i in range(0, len(raw) - INDEX_ENTRY.size + 1, INDEX_ENTRY.size)]
        ordered = all(a[0] < b[0] and a[1] < b[1] for a, b in zip(entries, entries[1:]))
        if not entries or not ordered or entries[-1][1] >= file_size \
                or entries[0][1] != SEGMENT_HEADER_SIZE:
            return self.recover(interval)
        for offset, position, stream_pos, prefix_ts in entries:
            self.idx_offsets.append(offset)
            self.idx_positions.append(position)
            self.idx_stream.append(stream_pos)
            self.idx_prefix_ts.append(prefix_ts)
        last_offset, last_position, last_stream, self.max_ts = entries[-1]
        self.last_indexed = last_position
        self.next_offset = last_offset
        self.next_stream_pos = last_stream
        self._open_index(truncate=False)
        tail = self._check_from(last_position, interval, write_index=False)
        if tail.truncated:
            # A sealed segment with a bad frame: redo it from the start.
            self._reset_index()
            return self.recover(interval)
        return tail

    def _reset_index(self):
        self.next_offset = self.base_offset
        self.next_stream_pos = self.base_stream_pos
        for arr in (self.idx_offsets, self.idx_positions, self.idx_stream, self.idx_prefix_ts):
            del arr[:]
        self.last_indexed = -1 << 62
        self.max_ts = NO_TIMESTAMP
        if self.index_fd is not None:
            os.close(self.index_fd)
            self.index_fd = None

    def recover(self, interval):
        """Check every frame from the start, truncate a torn or corrupt tail,
        and rewrite the index to match what is really there."""
        self._reset_index()
        self._open_index(truncate=True)
        return self._check_from(SEGMENT_HEADER_SIZE, interval, write_index=True)

    def _check_from(self, position, interval, write_index):
        result = RecoveryResult()
        self.size = position
        try:
            for batch in self.scan(position, verify=True):
                if batch.base_offset != self.next_offset or batch.stream_pos != self.next_stream_pos:
                    raise FrameError(f"discontinuity at {batch.position}")
                self._note(batch, interval, write_index)
                result.batches += 1
                if batch.writer_id is not None:
                    result.writers[batch.writer_id] = batch.event_number
        except FrameError as e:
            result.problem = str(e)
        file_size = os.fstat(self.fd).st_size
        if file_size > self.size:
            result.truncated = file_size - self.size
            os.ftruncate(self.fd, self.size)
        return result

    # -- writing ---------------------------------------------------------

    def append(self, frame, base_offset, count, stream_pos, stream_len, max_ts,
               append_ms, interval):
        """Write one frame at the end; on any failure the file is cut back."""
        position = self.size
        if position - self.last_indexed >= interval:
            self._add_index_entry(base_offset, position, stream_pos)
        try:
            written = os.write(self.fd, frame)
            while written < len(frame):
                written += os.write(self.fd, frame[written:])
        except OSError as e:
            try:
                os.ftruncate(self.fd, position)
            except OSError:
                pass
            raise StorageError(f"write to {self.path} failed: {e}") from e
        self.size = position + len(frame)
        self.next_offset = base_offset + count
        self.next_stream_pos = stream_pos + stream_len
        if max_ts > self.max_ts:
            self.max_ts = max_ts
        self.last_append_ms = append_ms

    # -- reading ---------------------------------------------------------

    def seal(self):
        """The segment will never be written again: let go of its descriptors
        (reads reopen the log on demand)."""
        self.close()
        self.sealed = True

    def _read_fd(self):
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDONLY)
            _open_sealed[self] = None
            if len(_open_sealed) > MAX_OPEN_SEALED:
                oldest, _ = _open_sealed.popitem(last=False)
                oldest.close()
        elif self.sealed:
            _open_sealed.move_to_end(self)
        return self.fd

    def scan(self, position, verify=False, chunk=SCAN_CHUNK):
        """Yield the batches from file ``position`` to the end of the file.

        A frame that can never be valid raises ``FrameError``; a torn last
        frame ends the scan quietly; ``verify`` checks CRCs.
        """
        fd = self._read_fd()
        buf = b""
        buf_pos = position      # file position of buf[0]
        i = 0
        while True:
            batch, nxt = decode_frame(buf, i, buf_pos + i, verify)
            if batch is None:
                # Need more bytes: keep the unconsumed rest, read past it.
                rest = buf[i:]
                need = chunk
                if len(rest) >= 4:
                    need = max(chunk, struct.unpack_from("<I", rest)[0] + 4 + OVERHEAD)
                more = os.pread(fd, need, buf_pos + len(buf))
                if not more:
                    return
                buf_pos += i
                buf = rest + more
                i = 0
                continue
            yield batch
            i = nxt

    def index_floor(self, keys, key):
        """File position of the last index entry whose key is <= ``key``."""
        i = bisect.bisect_right(keys, key) - 1
        return self.idx_positions[i] if i >= 0 else SEGMENT_HEADER_SIZE

    def position_for_timestamp(self, timestamp):
        """A file position from which a scan finds the first batch with max_ts >= timestamp."""
        j = bisect.bisect_left(self.idx_prefix_ts, timestamp)
        return self.idx_positions[j - 1] if j > 0 else SEGMENT_HEADER_SIZE

    # -- lifecycle -------------------------------------------------------

    def close(self):
        _open_sealed.pop(self, None)
        for fd in (self.fd, self.index_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.fd = self.index_fd = None

    def delete(self):
        self.close()
        for path in (self.path, self.index_path):
            try:
                os.unlink(path)
            except OSError as e:
                if e.errno != errno.ENOENT:
                    raise


class RecoveryResult:
    """What checking a segment found: batches seen, bytes cut, writer states."""

    __slots__ = ("batches", "truncated", "problem", "writers")

    def __init__(self):
        self.batches = 0
        self.truncated = 0
        self.problem = None
        self.writers = {}
