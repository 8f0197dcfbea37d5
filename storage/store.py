"""The embedded log store: topics of partitions of segments, plus metadata.

This is the only implementation of ``ILogStore`` for now. Everything runs on
the reactor thread except fsync (``storage.syncer``). Appends and metadata
changes answer with Deferreds that fire once the change is durable under the
fsync policy; reads answer at once from the page cache and never go past a
partition's high watermark (the durable end).
"""
import os
import re
import shutil
from dataclasses import dataclass, field
from typing import Optional

from twisted.internet import defer
from twisted.logger import Logger
from zope.interface import implementer

from storage.errors import (
    InvalidTopicName, KindMismatch, OffsetOutOfRange, PartitionSealed, StorageError,
    TableBadVersion, TableExists, TableKeyMissing, TableNotEmpty, TopicExists,
    UnknownPartition, UnknownTable, UnknownTopic, WriterConflict)
from storage.interfaces import ILogStore
from storage.metadata import MetadataDB, TopicRow
from storage.partition import NO_EVENT_NUMBER, Partition
from storage.syncer import Syncer

log = Logger()

TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}\Z")
#: bytes of stream position each record occupies beyond its value, per kind
#: (a Pravega event is framed as ``int32 type, int32 length, value``)
FRAMING_OVERHEAD = {"event": 8, "bytes": 0}
KINDS = ("event", "bytes", "undecided")


def valid_topic_name(name):
    return isinstance(name, str) and bool(TOPIC_NAME.match(name)) and name not in (".", "..")


@dataclass
class StoreSettings:
    """What the store needs to know; built from ``storage:`` in config.yaml."""
    path: str
    fsync: str = "interval"
    fsync_interval_ms: int = 5
    segment_bytes: int = 128 * 1024 * 1024
    segment_ms: int = 7 * 24 * 3600 * 1000
    index_interval_bytes: int = 4096
    retention_ms: Optional[int] = 168 * 3600 * 1000
    retention_bytes: Optional[int] = None


@dataclass(frozen=True)
class TopicInfo:
    name: str
    partitions: int
    kind: str
    created_ms: int
    attrs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Appended:
    """Where an append landed: its first offset and stream position."""
    base_offset: int
    count: int
    stream_pos: int


@dataclass(frozen=True)
class PartitionState:
    log_start: int
    high_watermark: int
    start_position: int
    end_position: int
    sealed: bool
    size_bytes: int
    segments: int


@implementer(ILogStore)
class LogStore:
    def __init__(self, settings, reactor=None):
        if reactor is None:
            from twisted.internet import reactor
        self.settings = settings
        self.reactor = reactor
        self.syncer = Syncer(reactor, settings.fsync, settings.fsync_interval_ms)
        self.topics_dir = os.path.join(settings.path, "topics")
        self.meta = None
        self.topics = {}
        self.partitions = {}
        self.failed = None
        self.closed = True

    def now_ms(self):
        return int(self.reactor.seconds() * 1000)

    # -- lifecycle -------------------------------------------------------------

    def open(self):
        """Open the data directory, recovering every partition's tail.

        Returns a list of ``(topic, partition, truncated_bytes)`` for the
        partitions whose tail had to be cut.
        """
        os.makedirs(self.topics_dir, exist_ok=True)
        self.meta = MetadataDB(os.path.join(self.settings.path, "meta.db"),
                               synchronous=self.syncer.waits)
        self.syncer.start()
        rows = self.meta.load_topics()
        sealed = self.meta.load_sealed()
        now = self.now_ms()
        cut = []
        for name, row in sorted(rows.items()):
            self.topics[name] = row
            for p in range(row.partitions):
                part = self._partition_object(name, p)
                report = part.open(now)
                part.sealed = (name, p) in sealed
                part.rebuild_writers(*self.meta.load_writer_snapshot(name, p))
                if report is not None and report.truncated:
                    cut.append((name, p, report.truncated))
        self.closed = False
        return cut

    def _partition_object(self, topic, index):
        part = Partition(topic, index, os.path.join(self.topics_dir, topic, str(index)),
                         self.settings)
        self.partitions[(topic, index)] = part
        return part

    def close(self):
        """Make everything durable, snapshot writer states, release files."""
        if self.closed:
            return defer.succeed(None)
        self.closed = True
        d = defer.maybeDeferred(self.syncer.flush)

        def snapshot(_):
            for (topic, index), part in self.partitions.items():
                if part.writers:
                    self.meta.save_writer_snapshot(topic, index, part.next_offset, part.writers)
                part.close()
            return self.syncer.flush([self.meta.wal_path])

        def release(_):
            self.meta.close()
            self.syncer.stop()
        d.addCallback(snapshot)
        d.addBoth(lambda result: (release(None), result)[1])
        return d

    def _durably(self, paths, result):
        """A Deferred that fires with ``result`` once ``paths`` are durable."""
        if not self.syncer.waits:
            return defer.succeed(result)
        d = defer.Deferred()
        *rest, last = paths
        for path in rest:
            self.syncer.sync_soon(path)
        self.syncer.after_sync(last, lambda err: d.errback(err) if err else d.callback(result))
        return d

    def _check_usable(self):
        if self.closed:
            raise StorageError("store closed")
        if self.failed is not None:
            raise StorageError(f"store failed earlier and refuses writes: {self.failed}")

    # -- topics ------------------------------------------------------------------

    def topic_names(self):
        return sorted(self.topics)

    def topic(self, name):
        row = self.topics.get(name)
        if row is None:
            raise UnknownTopic(name)
        return TopicInfo(row.name, row.partitions, row.kind, row.created_ms, dict(row.attrs))

    def create_topic(self, name, partitions, kind="event", attrs=None):
        self._check_usable()
        if not valid_topic_name(name):
            raise InvalidTopicName(name)
        if name in self.topics:
            raise TopicExists(name)
        if kind not in KINDS or partitions < 1:
            raise ValueError(f"bad topic spec: kind={kind!r}, partitions={partitions}")
        row = TopicRow(name, partitions, kind, self.now_ms(), dict(attrs or {}))
        paths = self._make_partitions(name, 0, partitions)
        self.meta.insert_topic(row)
        self.topics[name] = row
        return self._durably(paths + [self.meta.wal_path], self.topic(name))

    def _make_partitions(self, name, first, last):
        """Create partition directories; return the paths that must become durable."""
        topic_dir = os.path.join(self.topics_dir, name)
        paths = [self.topics_dir, topic_dir]
        now = self.now_ms()
        for p in range(first, last):
            part = self._partition_object(name, p)
            part.open(now)
            paths += [part.directory, part.segments[0].path]
        return paths

    def create_partitions(self, name, count):
        """Grow a topic to ``count`` partitions (never shrink)."""
        self._check_usable()
        row = self.topics.get(name)
        if row is None:
            raise UnknownTopic(name)
        if count < row.partitions:
            raise ValueError(f"topic {name} has {row.partitions} partitions; cannot shrink to {count}")
        paths = self._make_partitions(name, row.partitions, count)
        row.partitions = count
        self.meta.update_topic(row)
        return self._durably(paths + [self.meta.wal_path], self.topic(name))

    def set_topic_attrs(self, name, attrs):
        self._check_usable()
        row = self.topics.get(name)
        if row is None:
            raise UnknownTopic(name)
        row.attrs = dict(attrs)
        self.meta.update_topic(row)
        return self._durably([self.meta.wal_path], self.topic(name))

    def delete_topic(self, name):
        self._check_usable()
        row = self.topics.pop(name, None)
        if row is None:
            raise UnknownTopic(name)
        for p in range(row.partitions):
            part = self.partitions.pop((name, p))
            waiters, part.waiters = part.waiters, []
            part.close()
            for _, d in waiters:
                if not d.called:        # a callback may have cancelled it meanwhile
                    d.errback(UnknownTopic(name))
        self.meta.delete_topic(name)
        shutil.rmtree(os.path.join(self.topics_dir, name), ignore_errors=True)
        return self._durably([self.topics_dir, self.meta.wal_path], None)

    def seal_partition(self, name, partition):
        self._check_usable()
        part = self._partition(name, partition)
        if not part.sealed:
            part.sealed = True
            self.meta.seal(name, partition)
            # Readers parked at the end learn that no more is coming.
            waiters, part.waiters = part.waiters, []
            for _, d in waiters:
                if not d.called:        # a callback may have cancelled it meanwhile
                    d.callback(part.high_watermark)
        return self._durably([self.meta.wal_path], None)

    def _partition(self, topic, partition):
        part = self.partitions.get((topic, partition))
        if part is None:
            if topic not in self.topics:
                raise UnknownTopic(topic)
            raise UnknownPartition(topic, partition)
        return part

    # -- data ----------------------------------------------------------------------

    def append(self, topic, partition, fmt, payload, count, first_ts, max_ts, value_bytes,
               writer=None, kind=None, expected_offset=None):
        """Store one batch atomically; fires with ``Appended`` once durable.

        ``writer`` is ``(writer_id, expected, new)``: the append happens only
        if the writer's stored event number is ``expected``, and ``new`` is
        stored with the batch. ``kind`` is the topic kind this append needs
        (None: event, or whatever the topic already is for non-Pravega use).
        ``expected_offset``: the append happens only if the batch would start
        at this offset (``OffsetOutOfRange`` otherwise, naming the next offset
        as ``log_end``); checked against the next offset, not the durable
        end, so pipelined conditional appends follow each other.
        """
        self._check_usable()
        part = self._partition(topic, partition)
        if part.sealed:
            raise PartitionSealed(topic, partition)
        if expected_offset is not None and expected_offset != part.next_offset:
            raise OffsetOutOfRange(topic, partition, expected_offset, part.log_start,
                                   part.next_offset)
        row = self.topics[topic]
        paths = []
        if row.kind != (kind or row.kind):
            if row.kind != "undecided":
                raise KindMismatch(topic, row.kind, kind)
        writer_id = None
        event_number = 0
        if writer is not None:
            writer_id, expected, event_number = writer
            stored = part.writers.get(writer_id, NO_EVENT_NUMBER)
            if stored != expected:
                raise WriterConflict(writer_id, expected, stored)
        if row.kind == "undecided":
            # The first append decides, durably before (and with) its data; a
            # refused append (checked above) decides nothing.
            row.kind = kind or "event"
            self.meta.update_topic(row)
            paths.append(self.meta.wal_path)
        stream_len = value_bytes + FRAMING_OVERHEAD[row.kind] * count
        base, stream_pos = part.append(fmt, payload, count, first_ts, max_ts, stream_len,
                                       self.now_ms(), writer_id, event_number)
        if part.rolled:
            part.rolled = False
            self._after_roll(part, paths)
        result = Appended(base, count, stream_pos)
        if not self.syncer.waits:
            part.mark_durable(part.next_offset, part.next_stream_pos)
            return defer.succeed(result)
        end, end_pos = part.next_offset, part.next_stream_pos
        d = defer.Deferred()

        def durable(error):
            if error is None:
                part.mark_durable(end, end_pos)
                d.callback(result)
            else:
                self.failed = error
                d.errback(error)
        for path in paths:
            self.syncer.sync_soon(path)
        self.syncer.after_sync(part.segments[-1].path, durable)
        return d

    def _after_roll(self, part, paths):
        """A new segment exists: make its directory entry and the sealed
        segment's index durable, and snapshot the writer states."""
        sealed = part.segments[-2] if len(part.segments) > 1 else None
        paths.append(part.directory)
        if sealed is not None:
            paths += [sealed.path, sealed.index_path]
        if part.writers:
            self.meta.save_writer_snapshot(part.topic, part.index, part.next_offset, part.writers)
            paths.append(self.meta.wal_path)

    def read(self, topic, partition, offset, max_bytes):
        """Stored batches from the one holding ``offset``, up to ``max_bytes`` of
        payload (at least one batch if there is any). The first batch may
        start before ``offset``. Raises ``OffsetOutOfRange`` below the log start;
        at or past the high watermark the answer is empty."""
        part = self._partition(topic, partition)
        if offset < part.log_start:
            raise OffsetOutOfRange(topic, partition, offset, part.log_start, part.high_watermark)
        return part.read(offset, max_bytes)

    def read_at_position(self, topic, partition, position, max_bytes):
        """Like ``read``, from the batch that holds stream position ``position``."""
        part = self._partition(topic, partition)
        if position < part.start_stream_pos:
            raise OffsetOutOfRange(topic, partition, position, part.start_stream_pos,
                                   part.hw_stream_pos)
        return part.read_at_position(position, max_bytes)

    def batch_for_timestamp(self, topic, partition, timestamp):
        """The first batch whose largest timestamp is >= ``timestamp``, or None."""
        return self._partition(topic, partition).first_batch_with_timestamp(timestamp)

    def offsets(self, topic, partition):
        part = self._partition(topic, partition)
        return PartitionState(part.log_start, part.high_watermark, part.start_stream_pos,
                              part.hw_stream_pos, part.sealed, part.size_bytes,
                              len(part.segments))

    def wait_for_append(self, topic, partition, offset):
        """Fires (with the new high watermark) once the partition's durable end
        passes ``offset``, or once it is sealed. Cancelling it forgets the waiter."""
        part = self._partition(topic, partition)
        if part.high_watermark > offset or part.sealed:
            return defer.succeed(part.high_watermark)

        def cancel(d):
            part.waiters = [(o, w) for o, w in part.waiters if w is not d]
        d = defer.Deferred(cancel)
        part.waiters.append((offset, d))
        return d

    def writer_event_number(self, topic, partition, writer_id):
        return self._partition(topic, partition).writers.get(writer_id, NO_EVENT_NUMBER)

    # -- committed offsets ---------------------------------------------------------------

    def commit_offset(self, group, topic, partition, offset, metadata=None):
        self._check_usable()
        self._partition(topic, partition)
        self.meta.commit_offset(group, topic, partition, offset, metadata, self.now_ms())
        return self._durably([self.meta.wal_path], None)

    def committed_offset(self, group, topic, partition):
        return self.meta.committed_offset(group, topic, partition)

    def groups(self):
        return self.meta.groups()

    def group_offsets(self, group):
        return self.meta.group_offsets(group)

    # -- key-value tables ------------------------------------------------------------------

    def _table_version(self, name):
        version = self.meta.table_next_version(name)
        if version is None:
            raise UnknownTable(name)
        return version

    def table_create(self, name):
        self._check_usable()
        if self.meta.table_next_version(name) is not None:
            raise TableExists(name)
        self.meta.table_create(name)
        return self._durably([self.meta.wal_path], None)

    def table_delete(self, name, must_be_empty=False):
        self._check_usable()
        self._table_version(name)
        if must_be_empty and not self.meta.table_is_empty(name):
            raise TableNotEmpty(name)
        self.meta.table_delete(name)
        return self._durably([self.meta.wal_path], None)

    def _table_check(self, name, table_offset, items, missing=TableKeyMissing):
        """Check ``[(key, expected_version or None)]`` against the table.

        ``expected`` None is unconditional; ``NO_EVENT_NUMBER``... is not used
        here: ``-1`` means "the key must not exist", any other value means
        "the key must exist with exactly this version". A version given for a
        missing key raises ``missing``: an update answers TableBadVersion for
        it, a removal TableKeyMissing (pravega-clients.md §3.4). Returns the
        table's counter and the set of the keys that exist.
        """
        version = self._table_version(name)
        if table_offset is not None and table_offset >= 0 and table_offset != version:
            raise TableBadVersion(name, None)
        current = self.meta.table_versions(name, [k for k, _ in items])
        for key, expected in items:
            if expected is None:
                continue
            have = current.get(key)
            if expected == -1:
                if have is not None:
                    raise TableBadVersion(name, key)
            elif have is None:
                raise missing(name, key)
            elif have != expected:
                raise TableBadVersion(name, key)
        return version, current.keys()

    def table_update(self, name, entries, table_offset=None):
        """Write ``[(key, value, expected_version or None)]`` all or nothing.

        Each written entry gets the next version from the table's counter;
        fires with the new versions in request order.
        """
        self._check_usable()
        version, _ = self._table_check(name, table_offset, [(k, e) for k, _, e in entries],
                                       missing=TableBadVersion)
        puts = []
        for key, value, _ in entries:
            puts.append((key, value, version))
            version += 1
        self.meta.table_write(name, puts, [], version)
        return self._durably([self.meta.wal_path], [v for _, _, v in puts])

    def table_remove(self, name, keys, table_offset=None):
        """Remove ``[(key, expected_version or None)]`` all or nothing.

        Each key removed advances the table's counter, like a write, so a
        conditional ``table_offset`` sees the change; removing a missing key
        unconditionally is a no-op."""
        self._check_usable()
        version, present = self._table_check(name, table_offset, keys)
        removed = {k for k, _ in keys if k in present}
        self.meta.table_write(name, [], list(removed), version + len(removed))
        return self._durably([self.meta.wal_path], None)

    def table_read(self, name, keys):
        """``[(value, version) or None]`` for each key, in order."""
        self._table_version(name)
        return self.meta.table_get(name, keys)

    def table_entries(self, name, from_version, limit):
        """``(entries [(key, value, version)], next_version)`` with version >= ``from_version``.

        ``next_version`` is where the next page starts: the last returned
        version + 1, or the table's counter when nothing is returned (so a
        page cut by ``limit`` skips nothing)."""
        version = self._table_version(name)
        entries = self.meta.table_scan(name, from_version, limit)
        return entries, (entries[-1][2] + 1 if entries else version)

    # -- maintenance -----------------------------------------------------------------------

    def enforce_retention(self):
        """Apply the retention settings to every partition; return segments deleted."""
        now = self.now_ms()
        deleted = 0
        for part in list(self.partitions.values()):
            deleted += part.enforce_retention(now, self.settings.retention_ms,
                                              self.settings.retention_bytes)
        if deleted:
            log.info("retention deleted {count} segment(s)", count=deleted)
        return deleted
