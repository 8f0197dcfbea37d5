"""Kafka message sets <-> Arrow record batches, for the data source.

Reading: a Fetch v2 answer is a run of uncompressed magic-1 entries (the
gateway never compresses what it serves). ``fetched_batch`` walks it with
three ``struct`` unpacks per entry and builds the six columns in Arrow
directly, two to three times faster than making a ``Message`` per
record and letting Spark convert rows. The CRC is not recomputed: the
gateway checked every record on produce, stores batches under CRC32C and
computes the entry's CRC itself, and TCP guards the hop (librdkafka's
default, ``check.crcs=false``, trusts it the same way). The framing is
checked, and so is density: the log has no gaps, so an entry whose offset
is not the next expected one means records were deleted under the reader
(retention), which is an error rather than a silent gap.

Writing: ``encode_rows`` validates an Arrow batch's rows and groups them
into message sets per partition with the Kafka codec.
"""
import struct
import zlib

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.options import OptionError
from plugins.kafka import codec as kc

__all__ = ["ARROW_SCHEMA", "DataLossError", "encode_rows", "fetched_batch"]

#: what Spark expects a reader's batches to be for the data source's schema
#: (``to_arrow_schema(SCHEMA, timezone="UTC")``)
ARROW_SCHEMA = pa.schema([
    ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")), ("key", pa.binary()), ("value", pa.binary()),
])

#: an entry's offset and message_size
_START = struct.Struct(">qi").unpack_from
#: after the CRC and magic: attributes, timestamp (magic 1), key length
_HEAD1 = struct.Struct(">bqi")
_HEAD0 = struct.Struct(">bi")
_I32 = struct.Struct(">i").unpack_from


class DataLossError(Exception):
    """Records of a planned range are not in the log any more."""


def fetched_batch(data, topic, partition, offset, end):
    """The records of one fetched message set from ``offset`` up to
    ``end`` (exclusive) as an Arrow RecordBatch, and the next offset to
    fetch. Entries below ``offset`` (none from the gateway) are skipped; a
    partial entry at the end (a set cut at ``max_bytes``) is left for the
    next fetch. Magic-0 entries get a null timestamp."""
    offsets, timestamps, keys, values = [], [], [], []
    head1 = _HEAD1.unpack_from
    head0 = _HEAD0.unpack_from
    i32 = _I32
    pos = 0
    size = len(data)
    expected = offset
    while size - pos >= 12:
        at, length = _START(data, pos)
        stop = pos + 12 + length
        if stop > size or at >= end:
            break
        if at < offset:
            pos = stop
            continue
        if at != expected:
            raise DataLossError(
                f"{topic}/{partition}: expected offset {expected}, the gateway sent {at}: "
                f"records {expected} to {at - 1} are no longer in the log (retention)")
        if data[pos + 16]:
            attributes, timestamp, key_length = head1(data, pos + 17)
            field = pos + 30
        else:
            attributes, key_length = head0(data, pos + 17)
            timestamp = None
            field = pos + 22
        if attributes & kc.CODEC_MASK:
            raise ValueError(f"{topic}/{partition} offset {at}: a compressed message set; "
                             f"the gateway serves uncompressed messages only")
        if key_length < 0:
            keys.append(None)
        else:
            keys.append(data[field:field + key_length])
            field += key_length
        if field + 4 + max(i32(data, field)[0], 0) != stop:
            raise ValueError(f"{topic}/{partition} offset {at}: malformed message "
                             f"(its lengths disagree with its size)")
        values.append(data[field + 4:stop])
        timestamps.append(timestamp)
        offsets.append(at)
        expected = at + 1
        pos = stop
    count = len(offsets)
    millis = pa.array(timestamps, pa.int64())
    batch = pa.RecordBatch.from_arrays([
        pa.repeat(pa.scalar(topic, pa.string()), count),
        pa.repeat(pa.scalar(partition, pa.int32()), count),
        pa.array(offsets, pa.int64()),
        pc.multiply(millis, 1000).cast(ARROW_SCHEMA.field("timestamp").type),
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
    ], schema=ARROW_SCHEMA)
    return batch, expected


def _bytes_column(batch, name):
    """A binary or string column as a list of bytes (None for null)."""
    index = batch.schema.get_field_index(name)
    if index < 0:
        return None
    column = batch.column(index)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.binary() if pa.types.is_string(column.type)
                             else pa.large_binary())
    return column.to_pylist()


def _column(batch, name):
    index = batch.schema.get_field_index(name)
    return None if index < 0 else batch.column(index)


def encode_rows(batch, row_base, default_topic, partitions_of, fallback_partition):
    """Validate one Arrow batch of rows to write and group it into
    ``{(topic, partition): [(key, value, timestamp)]}`` in row order.

    ``row_base`` numbers the batch's first row within the task, for error
    messages. ``partitions_of(topic)`` says how many partitions a topic has
    (asking the gateway, which creates it where topics are auto-created).
    A row without a partition goes to ``crc32(key) % partitions`` when it
    has a key (a key always lands in the same partition), else to
    ``fallback_partition % partitions`` (one per task, so a task's keyless
    rows stay together and in order). A row's timestamp is kept when the
    batch has a timestamp column (-1, the receive time, where it is null).
    """
    values = _bytes_column(batch, "value")
    keys = _bytes_column(batch, "key")
    topics = _column(batch, "topic")
    topics = topics.to_pylist() if topics is not None else None
    partitions = _column(batch, "partition")
    partitions = partitions.to_pylist() if partitions is not None else None
    stamps = _column(batch, "timestamp")
    if stamps is not None:
        stamps = pc.divide(stamps.cast(pa.timestamp("us")).cast(pa.int64()), 1000) \
            .fill_null(-1).to_pylist()
    groups = {}
    for i, value in enumerate(values):
        if value is None:
            raise OptionError(f"row {row_base + i}: value is null; every row needs a value")
        topic = topics[i] if topics is not None and topics[i] is not None else default_topic
        if topic is None:
            raise OptionError(f"row {row_base + i}: no topic (the topic column is null and "
                              f"the 'topic' option is not set)")
        key = keys[i] if keys is not None else None
        count = partitions_of(topic)
        partition = partitions[i] if partitions is not None else None
        if partition is None:
            partition = (zlib.crc32(key) if key is not None else fallback_partition) % count
        elif not 0 <= partition < count:
            raise OptionError(f"row {row_base + i}: partition {partition} does not exist in "
                              f"topic {topic!r} ({count} partitions)")
        record = (key, value, stamps[i]) if stamps is not None else (key, value)
        groups.setdefault((topic, partition), []).append(record)
    return groups
