"""``gateway produce`` and ``gateway consume``: records in and out through
any dialect's listener.

``produce`` turns each line of standard input into one record (the line
without its end; with ``--key-separator``, the part before the first
separator is the key, for the dialects that have keys). Lines are sent as
they arrive, batched by what one read of standard input brings (up to
``MAX_BATCH_RECORDS`` records or ``MAX_BATCH_BYTES`` bytes), with one batch
in flight at a time: typed lines go out one by one, a file goes out in large
batches.

``consume`` writes one line per record to standard output: the value,
preceded by the dialect's position and the key when asked, tab-separated.
Without ``-f`` it stops once it has read up to the end it found when it
started; with ``-f`` it waits at the tail and prints records as they are
written, through whichever dialect, until interrupted.
"""
import argparse
import os
import stat
import sys

from twisted.internet import defer, threads

from gateway.cli_clients import TAIL_WAIT_MS, Unsupported, make_client, session
from gateway.cli_progress import Progress

MAX_BATCH_RECORDS = 1000
MAX_BATCH_BYTES = 1 << 20
READ_CHUNK = 1 << 16


class LineSource:
    """Standard input as batches of ``(key, value)`` records; ``next_batch``
    blocks, so it runs in a thread."""

    def __init__(self, fd, key_separator=None):
        self.fd = fd
        self.key_separator = key_separator
        self.buffer = bytearray()
        self.scanned = 0            # buffer[:scanned] holds no newline
        self.consumed = 0           # bytes of input turned into records so far
        self.eof = False
        st = os.fstat(fd)
        self.size = (st.st_size - os.lseek(fd, 0, os.SEEK_CUR)
                     if stat.S_ISREG(st.st_mode) else None)

    def _record(self, line):
        if line.endswith(b"\r"):
            line = line[:-1]
        if self.key_separator is not None:
            key, sep, value = line.partition(self.key_separator)
            if sep:
                return key, value
        return None, line

    def next_batch(self):
        """The complete lines read so far (reading once more if there are
        none), as records; the last line may lack its newline at the end of
        the input. ``[]`` once the input is exhausted."""
        while True:
            batch = []
            size = 0
            start = 0
            buf = self.buffer
            while len(batch) < MAX_BATCH_RECORDS and (size < MAX_BATCH_BYTES or not batch):
                end = buf.find(b"\n", max(start, self.scanned))
                if end < 0:
                    self.scanned = len(buf)
                    break
                batch.append(self._record(bytes(buf[start:end])))
                size += end + 1 - start
                start = end + 1
            if batch:
                del buf[:start]
                self.scanned = 0
                self.consumed += start
                return batch
            if self.eof:
                if buf:
                    rest = bytes(buf)
                    buf.clear()
                    self.consumed += len(rest)
                    return [self._record(rest)]
                return []
            chunk = os.read(self.fd, READ_CHUNK)
            if chunk:
                buf += chunk
            else:
                self.eof = True


def produce(reactor, args):
    client = make_client(reactor, args.dialect, args.bootstrap, args.timeout, args.scope)
    if args.key_separator is not None and not client.keyed:
        raise Unsupported(f"{args.dialect} records have no keys: drop --key-separator")
    separator = None if args.key_separator is None else args.key_separator.encode()
    client.check_partition(args.partition)
    source = LineSource(sys.stdin.fileno(), separator)
    progress = Progress(f"produce {args.topic}", total=source.size)

    @defer.inlineCallbacks
    def send():
        count = 0
        first = None
        while True:
            batch = yield threads.deferToThread(source.next_batch)
            if not batch:
                break
            position = yield client.produce(args.topic, args.partition, batch).addTimeout(
                args.timeout, reactor)
            if first is None:
                first = position
            count += len(batch)
            progress.update(source.consumed - progress.bytes, len(batch))
        progress.close()
        where = "" if first is None else f", the first at position {first}"
        print(f"produced {count} record(s) to {args.topic}/{args.partition} through "
              f"{client.where()}{where}")
        return 0
    def failed(failure):
        progress.close()
        return failure
    return session(reactor, client, send).addErrback(failed)


def parse_start(text):
    """``--from``: beginning, end, or a position of the dialect."""
    if text in ("beginning", "end"):
        return text
    if text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(f"expected beginning, end or a position (an integer "
                                     f">= 0), not {text!r}")


def consume(reactor, args):
    client = make_client(reactor, args.dialect, args.bootstrap, args.timeout, args.scope)
    if args.show_key and not client.keyed:
        raise Unsupported(f"{args.dialect} records have no keys: drop --show-key")
    client.check_partition(args.partition)
    out = sys.stdout.buffer

    @defer.inlineCallbacks
    def read():
        position = yield client.start(args.topic, args.partition, args.start).addTimeout(
            args.timeout, reactor)
        stop = None
        if not args.follow:
            stop = yield client.end(args.topic, args.partition).addTimeout(args.timeout,
                                                                          reactor)
        # before the end, the records are there: a read waits only for them
        wait_ms = TAIL_WAIT_MS if args.follow else int(args.timeout * 1000)
        printed = 0
        while args.count is None or printed < args.count:
            if stop is not None and position >= stop:
                break
            before = position
            records, position = yield client.read(args.topic, args.partition, position,
                                                  wait_ms)
            if args.count is not None:
                records = records[:args.count - printed]
            try:
                out.write(b"".join(format_record(args, *record) for record in records))
                out.flush()
            except BrokenPipeError:
                break       # the reader went away (``| head``): done
            printed += len(records)
            if stop is not None and not records and position == before:
                break       # nothing where records should be: do not spin
        return 0
    return session(reactor, client, read)


def format_record(args, position, key, value):
    """One output line: [position TAB] [key TAB] value."""
    fields = []
    if args.show_position:
        fields.append(b"%d" % position)
    if args.show_key:
        fields.append(key or b"")
    fields.append(value)
    return b"\t".join(fields) + b"\n"
