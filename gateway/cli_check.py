"""``gateway check``: verify a data directory offline.

The check reads, and never writes: segment files are opened read-only
through ``storage.segment`` and framed with ``storage.batch`` (the same
code the store reads with), ``meta.db`` is opened with SQLite's read-only
mode. For every partition it verifies what recovery relies on and says
what recovery would do on the next start:

- each segment's header, and that segments follow each other with no gap
  in offsets or stream positions (recovery drops a torn or gapped segment
  and every later one);
- every frame's CRC32C, and that batches follow each other densely (a bad
  or torn frame is cut at start, with everything after it);
- the sparse index against the log: recovery rebuilds the last segment's
  index, but trusts a sealed segment's where it looks well-formed, so a
  wrong entry there would send reads to the wrong batch until repaired;
- with ``--deep``, that every batch decodes through the dialects' format
  registry into as many records, and as many stream bytes, as its header
  says (a batch another dialect cannot decode must never be in the log);
- the metadata: SQLite's quick_check, and that topics and partition
  directories match.

A running gateway appends while the check reads, so its live tails would
look torn: the check refuses a directory some process has files open in
(found through ``/proc``), unless ``--force``.

``--repair`` (which never runs on a directory in use) applies the store's
own recovery, exactly as a gateway start would, then rebuilds the sealed
segments' indexes the check found wrong, fsyncs what changed, and checks
again.
"""
import os
import sqlite3
import sys
import urllib.parse
from dataclasses import dataclass, field

from gateway.cli_admin import table
from gateway.cli_clients import UNREACHABLE, CLIError
from gateway.cli_progress import Progress, human_bytes
from gateway.config import ConfigError, load_config
from gateway.dialects import find_dialects
from gateway.records import FormatRegistry
from storage import LogStore, StoreSettings
from storage.batch import FrameError
from storage.segment import (
    INDEX_ENTRY, NO_TIMESTAMP, SEGMENT_HEADER, SEGMENT_HEADER_SIZE, SEGMENT_MAGIC, Segment,
    index_name)
from storage.store import FRAMING_OVERHEAD
from storage.syncer import fsync_paths


@dataclass
class PartitionReport:
    topic: str
    partition: int
    segments: int = 0
    batches: int = 0
    start: int = 0
    end: int = 0
    size: int = 0
    sealed: bool = False


@dataclass
class Report:
    path: str
    partitions: list = field(default_factory=list)
    #: (where, what): things recovery changes, or damage it cannot see
    problems: list = field(default_factory=list)
    #: (where, what): harmless findings the next start tidies up
    notes: list = field(default_factory=list)
    #: (partition directory, base offset) of sealed segments with a wrong index
    bad_indexes: list = field(default_factory=list)
    groups: int = 0


def holders(path):
    """``[(pid, command line)]`` of the processes with files open under
    ``path``, or None where ``/proc`` cannot tell (not Linux)."""
    if not os.path.isdir("/proc/self/fd"):
        return None
    root = os.path.realpath(path) + os.sep
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue        # gone, or another user's
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(root):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        command = f.read().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    command = "?"
                found.append((int(pid), command.strip()))
                break
    return found


def refuse_if_in_use(path, force, repair):
    users = holders(path)
    if users is None:
        print(f"gateway: cannot tell whether a gateway is using {path} (no /proc); "
              f"stop it before checking", file=sys.stderr)
        return
    if not users:
        return
    who = ", ".join(f"pid {pid} ({command[:60]})" for pid, command in users)
    if repair:
        raise CLIError(f"{path} is in use by {who}: stop the gateway before --repair",
                       UNREACHABLE)
    if not force:
        raise CLIError(f"{path} is in use by {who}: stop the gateway first (or pass --force "
                       f"to check anyway: its live tails will look torn)", UNREACHABLE)
    print(f"gateway: warning: {path} is in use by {who}; live tails may look torn",
          file=sys.stderr)


def read_meta(path, report):
    """``({topic: (partitions, kind)}, {(topic, partition)} sealed)`` from meta.db."""
    db_path = os.path.join(path, "meta.db")
    if not os.path.exists(db_path):
        report.problems.append(("meta.db", "missing: a start creates an empty one, and the "
                                           "gateway then knows no topic on disk"))
        return {}, set()
    # A gateway that stopped cleanly left no -wal file: the database is then
    # opened immutable, which creates no -shm/-wal beside it. After a crash
    # the -wal holds committed changes, and reading them needs SQLite's
    # shared-memory index (the -shm file, which holds no data).
    wal = os.path.join(path, "meta.db-wal")
    mode = "ro" if os.path.exists(wal) and os.path.getsize(wal) else "ro&immutable=1"
    uri = "file:" + urllib.parse.quote(db_path) + "?mode=" + mode
    try:
        db = sqlite3.connect(uri, uri=True)
        try:
            verdict = db.execute("PRAGMA quick_check").fetchone()[0]
            if verdict != "ok":
                report.problems.append(("meta.db", f"SQLite quick_check: {verdict}"))
            topics = {name: (partitions, kind) for name, partitions, kind in
                      db.execute("SELECT name, partitions, kind FROM topics")}
            sealed = set(db.execute("SELECT topic, partition FROM sealed"))
            report.groups = db.execute("SELECT COUNT(DISTINCT grp) FROM offsets").fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error as e:
        report.problems.append(("meta.db", f"unreadable: {e}"))
        return {}, set()
    return topics, sealed


def check_directory(path, deep=False, formats=None, progress_stream=None):
    """Check the data directory ``path``; returns a ``Report``. ``formats``
    (a ``FormatRegistry``) is needed for ``deep``."""
    report = Report(path)
    topics, sealed = read_meta(path, report)
    topics_dir = os.path.join(path, "topics")
    on_disk = set(os.listdir(topics_dir)) if os.path.isdir(topics_dir) else set()
    for name in sorted(on_disk - set(topics)):
        report.notes.append((f"topics/{name}", "not in meta.db: the gateway ignores it"))
    partitions = []
    for name, (count, kind) in sorted(topics.items()):
        topic_dir = os.path.join(topics_dir, name)
        present = set(os.listdir(topic_dir)) if os.path.isdir(topic_dir) else set()
        for extra in sorted(present - {str(p) for p in range(count)}):
            report.notes.append((f"topics/{name}/{extra}",
                                 f"not a partition of {name} ({count} in meta.db): ignored"))
        for p in range(count):
            partitions.append((name, p, kind, os.path.join(topic_dir, str(p))))
    progress = Progress("check", total=sum(_log_bytes(d) for *_, d in partitions),
                        unit="batches", stream=progress_stream)
    try:
        for name, p, kind, directory in partitions:
            part = PartitionReport(name, p, sealed=(name, p) in sealed)
            report.partitions.append(part)
            _check_partition(report, part, kind, directory, deep, formats, progress)
    finally:
        progress.close()
    return report


def _log_bytes(directory):
    if not os.path.isdir(directory):
        return 0
    return sum(os.path.getsize(os.path.join(directory, name))
               for name in os.listdir(directory) if name.endswith(".log"))


def _relative(report, path):
    return os.path.relpath(path, report.path)


def _check_partition(report, part, kind, directory, deep, formats, progress):
    where = _relative(report, directory)
    if not os.path.isdir(directory):
        report.problems.append((where, "partition directory missing: a start creates it "
                                       "empty"))
        return
    names = os.listdir(directory)
    for name in sorted(n for n in names if n.endswith(".tmp")):
        report.notes.append((f"{where}/{name}", "a segment creation cut short: a start "
                                                "deletes it"))
    bases = sorted(int(n[:-4]) for n in names if n.endswith(".log") and n[:-4].isdigit())
    if not bases:
        report.problems.append((where, "no segment: a start creates an empty one"))
        return
    part.start = bases[0]
    expected = None
    for i, base in enumerate(bases):
        later = len(bases) - i - 1
        seg_path = os.path.join(directory, f"{base:020d}.log")
        seg_where = _relative(report, seg_path)
        with open(seg_path, "rb") as f:
            head = f.read(SEGMENT_HEADER_SIZE)
        if len(head) < SEGMENT_HEADER_SIZE or SEGMENT_HEADER.unpack(head)[0] != SEGMENT_MAGIC \
                or SEGMENT_HEADER.unpack(head)[1] != base:
            report.problems.append((seg_where, f"torn or foreign header: a start drops this "
                                               f"segment and the {later} after it"))
            return
        _, _, stream_pos, created_ms = SEGMENT_HEADER.unpack(head)
        if expected is not None and expected != (base, stream_pos):
            report.problems.append((seg_where, f"gap: the previous segment ends at offset "
                                               f"{expected[0]}, position {expected[1]}; a "
                                               f"start drops this segment and the {later} "
                                               f"after it"))
            return
        ok, expected = _check_segment(report, part, kind, seg_path, base, stream_pos,
                                      created_ms, later, deep, formats, progress)
        part.segments += 1
        if expected is not None:
            part.end = expected[0]
        if not ok:
            return


def _check_segment(report, part, kind, seg_path, base, stream_pos, created_ms, later, deep,
                   formats, progress):
    """Scan one segment; returns (whether a start keeps the later segments,
    (next offset, next stream position), or None where the damage hides it)."""
    where = _relative(report, seg_path)
    seg = Segment(os.path.dirname(seg_path), base, stream_pos, created_ms, None)
    next_offset, next_pos = base, stream_pos
    end = SEGMENT_HEADER_SIZE
    frames = {}
    max_ts = NO_TIMESTAMP
    problem = None
    try:
        for batch in seg.scan(SEGMENT_HEADER_SIZE, verify=True):
            if (batch.base_offset, batch.stream_pos) != (next_offset, next_pos):
                problem = (f"batch at {batch.position} is offset {batch.base_offset}, position "
                           f"{batch.stream_pos}; expected offset {next_offset}, position "
                           f"{next_pos}")
                break
            frames[batch.position] = (batch.base_offset, batch.stream_pos, max_ts)
            if deep:
                _check_records(report, where, kind, batch, formats)
            max_ts = max(max_ts, batch.max_ts)
            next_offset, next_pos = batch.next_offset, batch.stream_end
            end = batch.position + batch.frame_size
            part.batches += 1
            progress.update(batch.frame_size, 1)
    except FrameError as e:
        problem = str(e)
    finally:
        seg.close()
    size = os.path.getsize(seg_path)
    part.size += size
    # the header and any torn tail, for the progress bar's byte count
    progress.update(SEGMENT_HEADER_SIZE + max(size - end, 0))
    index_path = os.path.join(os.path.dirname(seg_path), index_name(base))
    entries = _index_entries(index_path)
    last = later == 0
    if size > end:
        reason = problem or "an incomplete last frame"
        if last:
            report.problems.append((where, f"torn tail: a start cuts {size - end} byte(s) at "
                                           f"{end} ({reason})"))
        elif end >= _start_checks_from(entries, size):
            report.problems.append((where, f"damaged sealed segment: a start cuts "
                                           f"{size - end} byte(s) at {end} ({reason}) and "
                                           f"drops the {later} segment(s) after it"))
            return False, (next_offset, next_pos)
        else:
            report.problems.append((where, f"damaged sealed segment at {end} ({reason}), "
                                           f"before its last index entry, where a start "
                                           f"does not look: reads (which do not verify "
                                           f"CRCs) meet the damage; restore this segment "
                                           f"from a copy"))
            return True, None
    _check_index(report, index_path, entries, frames, size, last)
    return True, (next_offset, next_pos)


def _check_records(report, where, kind, batch, formats):
    try:
        records = formats.decode(batch)
        count = len(records)
        value_bytes = sum(map(len, records.values))
    except Exception as e:  # noqa: BLE001 - whatever a decoder raises is the finding
        report.problems.append((where, f"batch at offset {batch.base_offset} (format "
                                       f"{batch.format}) does not decode: {e}"))
        return
    stream = value_bytes + FRAMING_OVERHEAD.get(kind, 0) * count
    if count != batch.count or stream != batch.stream_len:
        report.problems.append((where, f"batch at offset {batch.base_offset} decodes to "
                                       f"{count} record(s), {stream} stream byte(s); its "
                                       f"header says {batch.count}, {batch.stream_len}"))


def _index_entries(index_path):
    """An index file's entries (a torn last one ignored, as the store does),
    or None if there is no index file."""
    try:
        with open(index_path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    return [INDEX_ENTRY.unpack_from(raw, i)
            for i in range(0, len(raw) - INDEX_ENTRY.size + 1, INDEX_ENTRY.size)]


def _start_checks_from(entries, file_size):
    """Where a start begins checking a sealed segment: at its last index
    entry when ``Segment.load_index`` takes the index as it is, else (the
    index is rebuilt) at the first frame."""
    if entries and entries[0][1] == SEGMENT_HEADER_SIZE and entries[-1][1] < file_size \
            and all(a[0] < b[0] and a[1] < b[1] for a, b in zip(entries, entries[1:])):
        return entries[-1][1]
    return SEGMENT_HEADER_SIZE


def _check_index(report, index_path, entries, frames, file_size, last):
    """Every index entry must name a batch start with its offset, stream
    position and the largest timestamp before it."""
    where = _relative(report, index_path)
    if entries is None:
        if not last:
            report.notes.append((where, "missing: a start rebuilds it"))
        return
    wrong = [n for n, (offset, position, stream_pos, prefix_ts) in enumerate(entries)
             if frames.get(position) != (offset, stream_pos, prefix_ts)]
    if not wrong:
        return
    what = f"{len(wrong)} of {len(entries)} entries disagree with the log (first: entry " \
           f"{wrong[0]})"
    # A start rebuilds the last segment's index, and a sealed one's when it
    # does not take it as it is or when checking from its last entry fails.
    trusted = _start_checks_from(entries, file_size) > SEGMENT_HEADER_SIZE
    if last or not trusted or wrong == [len(entries) - 1]:
        report.notes.append((where, f"{what}: a start rebuilds it"))
    else:
        report.problems.append((where, f"{what}: reads may start at the wrong batch; "
                                       f"--repair rebuilds it"))
        report.bad_indexes.append((os.path.dirname(index_path), int(
            os.path.basename(index_path)[:-len(".index")])))


def print_report(report, quiet, out=None):
    out = sys.stdout if out is None else out
    if not quiet and report.partitions:
        table([[p.topic, p.partition, p.segments, p.batches, p.start, p.end, p.end - p.start,
                human_bytes(p.size), "sealed" if p.sealed else ""] for p in report.partitions],
              ["topic", "partition", "segments", "batches", "start", "end", "records", "size",
               ""], out)
    for where, what in report.notes:
        out.write(f"note: {where}: {what}\n")
    for where, what in report.problems:
        out.write(f"PROBLEM: {where}: {what}\n")
    records = sum(p.end - p.start for p in report.partitions)
    size = sum(p.size for p in report.partitions)
    topics = len({p.topic for p in report.partitions})
    verdict = (f"{len(report.problems)} problem(s)" if report.problems else "no problems")
    out.write(f"{report.path}: {topics} topic(s), {len(report.partitions)} partition(s), "
              f"{records:,} record(s), {human_bytes(size)}, {report.groups} group(s) with "
              f"commits: {verdict}\n")


def repair(path, report, interval):
    """Apply the store's recovery (what a start does), rebuild the wrong
    sealed indexes, and make it all durable; returns lines describing what
    changed."""
    done = []
    store = LogStore(StoreSettings(path=path, fsync="never", index_interval_bytes=interval))
    for topic, partition, cut in store.open():
        done.append(f"cut {cut} torn byte(s) from {topic}/{partition}")
    store.close()
    for directory, base in report.bad_indexes:
        seg = Segment.open(directory, base)
        seg.recover(interval)
        seg.close()
        done.append(f"rebuilt the index of {_relative(report, directory)}/{base:020d}.log")
    touched = []
    for root, _, files in os.walk(path):
        touched.append(root)
        touched += [os.path.join(root, f) for f in files]
    fsync_paths(touched)
    return done


def command(args):
    """``gateway check``: returns the exit status."""
    path = args.path
    if path is None:
        try:
            path = load_config(args.config, find_dialects()).storage.path
        except ConfigError as e:
            print(f"gateway: bad config: {e}", file=sys.stderr)
            return 2
    if not os.path.isfile(os.path.join(path, "meta.db")) and \
            not os.path.isdir(os.path.join(path, "topics")):
        print(f"gateway: {path} is not a gateway data directory (no meta.db, no topics/)",
              file=sys.stderr)
        return 2
    try:
        refuse_if_in_use(path, args.force, args.repair)
    except CLIError as e:
        print(f"gateway: {e}", file=sys.stderr)
        return e.code
    formats = None
    if args.deep:
        formats = FormatRegistry()
        for dialect in find_dialects().values():
            for format_id, decoder in dialect.formats.items():
                formats.register(format_id, decoder)
    report = check_directory(path, args.deep, formats)
    if args.repair and (report.problems or report.notes):
        for line in repair(path, report, args.index_interval_bytes):
            print(f"repaired: {line}")
        report = check_directory(path, args.deep, formats)
    print_report(report, args.quiet)
    return 1 if report.problems else 0
