"""The command bus's vocabulary: small immutable requests, one class each.

A dialect builds a command from a frame and hands it to ``bus.execute``; the
answer is a Deferred. Commands name topics and partitions, never files.
"""
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

#: ``ListOffsets.spec`` values besides a timestamp (ms, >= 0)
LATEST = -1
EARLIEST = -2


@dataclass(frozen=True, slots=True)
class Produce:
    """Append ``records`` (RecordBatch or EncodedBatch) as one atomic batch.

    ``writer`` is ``(writer_id: 16 bytes, expected event number, new event
    number)`` for Pravega's idempotent writers; ``kind`` the topic kind the
    append needs (``bytes`` for Pravega byte streams). ``auto_create`` says
    whether this dialect lets a produce create the topic (the config's
    ``topics.auto_create`` must allow it too). ``expected_offset`` makes the
    append conditional: it happens only if the batch would start exactly
    there (the partition's next offset, counting appends not yet durable),
    else it fails with ``OffsetOutOfRange`` and stores nothing; it is for
    producers that name their own positions (TANK's ProduceWithSeqnum and
    sparse bundles), where checking first and appending after would race
    with other writers. Answers ``Appended``.
    """
    topic: str
    partition: int
    records: Any
    writer: Optional[Tuple[bytes, int, int]] = None
    kind: Optional[str] = None
    auto_create: bool = True
    expected_offset: Optional[int] = None


@dataclass(frozen=True, slots=True)
class FetchPartition:
    topic: str
    partition: int
    offset: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class Fetch:
    """Read several partitions at once; park up to ``max_wait_ms`` until their
    stored payload bytes reach ``min_bytes``. Answers ``[PartitionData]`` in
    request order."""
    partitions: Sequence[FetchPartition]
    max_wait_ms: int = 0
    min_bytes: int = 0


@dataclass(frozen=True, slots=True)
class ReadPosition:
    """Read one partition from a stream position (Pravega's byte offset).
    Answers ``PartitionData``; ``max_wait_ms`` parks at the end like Fetch."""
    topic: str
    partition: int
    position: int
    max_bytes: int
    max_wait_ms: int = 0


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Push records from ``offset`` to ``consumer`` (an ISubscriber) with flow
    control; answers the ``Subscription``. Offsets below the log start are
    clamped up to it; past the end, the subscription starts at the end."""
    topic: str
    partition: int
    offset: int
    consumer: Any
    max_bytes: int = 256 * 1024


@dataclass(frozen=True, slots=True)
class ListOffsets:
    """``spec`` is LATEST, EARLIEST or a timestamp in ms: the first offset whose
    record timestamp is >= it (the high watermark if none). Answers an int."""
    topic: str
    partition: int
    spec: int


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """Answers the store's ``PartitionState`` (log start, high watermark,
    stream positions, sealed, size)."""
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class Metadata:
    """Answers ``[TopicMetadata]``; ``topics`` None means every topic. With
    ``auto_create`` unknown valid names are created (if the config allows)."""
    topics: Optional[Sequence[str]] = None
    auto_create: bool = False


@dataclass(frozen=True, slots=True)
class CreateTopic:
    """``partitions`` None means ``topics.default_partitions``. Answers TopicInfo."""
    topic: str
    partitions: Optional[int] = None
    kind: str = "event"
    attrs: Optional[dict] = None


@dataclass(frozen=True, slots=True)
class CreatePartitions:
    topic: str
    count: int


@dataclass(frozen=True, slots=True)
class SetTopicAttrs:
    """Merge ``attrs`` into the topic's stored attributes (each key given
    replaces that key; the others stay), durably. A dialect keeps its own
    facts about a topic under a key of its own (the Pravega controller's
    stream configuration, for example). Answers TopicInfo."""
    topic: str
    attrs: dict


@dataclass(frozen=True, slots=True)
class DeleteTopic:
    topic: str


@dataclass(frozen=True, slots=True)
class SealPartition:
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class CommitOffset:
    """Store a group's committed offset ("the next offset to read")."""
    group: str
    topic: str
    partition: int
    offset: int
    metadata: Optional[str] = None


@dataclass(frozen=True, slots=True)
class FetchCommittedOffset:
    """Answers ``(offset, metadata)`` or None."""
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class ListGroups:
    """Answers the names of the groups with committed offsets."""


@dataclass(frozen=True, slots=True)
class GroupOffsets:
    """Answers ``{(topic, partition): (offset, metadata)}``."""
    group: str


@dataclass(frozen=True, slots=True)
class LookupPosition:
    """Which record holds stream position ``position``: answers
    ``(offset, record_start_position)``; at the end, ``(high watermark, end position)``."""
    topic: str
    partition: int
    position: int


@dataclass(frozen=True, slots=True)
class WriterEventNumber:
    """The event number stored with ``writer_id``'s last append to the
    partition (Pravega's AppendSetup), or ``storage.NO_EVENT_NUMBER`` for a
    writer the partition has never seen. Answers an int."""
    topic: str
    partition: int
    writer_id: bytes


@dataclass(frozen=True, slots=True)
class TableCreate:
    table: str


@dataclass(frozen=True, slots=True)
class TableDelete:
    table: str
    must_be_empty: bool = False


@dataclass(frozen=True, slots=True)
class TableUpdate:
    """``entries`` are ``(key, value, expected_version or None)``; -1 = must not
    exist. All or nothing; answers the new versions."""
    table: str
    entries: Sequence[Tuple[bytes, bytes, Optional[int]]]
    table_offset: Optional[int] = None


@dataclass(frozen=True, slots=True)
class TableRemove:
    table: str
    keys: Sequence[Tuple[bytes, Optional[int]]]
    table_offset: Optional[int] = None


@dataclass(frozen=True, slots=True)
class TableRead:
    """Answers ``[(value, version) or None]`` per key."""
    table: str
    keys: Sequence[bytes]


@dataclass(frozen=True, slots=True)
class TableEntries:
    """Answers ``([(key, value, version)], next_version)`` for versions >= ``from_version``."""
    table: str
    from_version: int
    limit: int


class PartitionData:
    """One partition's part of a Fetch answer: stored batches, or an error."""

    __slots__ = ("topic", "partition", "offset", "error", "high_watermark", "log_start",
                 "batches")

    def __init__(self, topic, partition, offset, error=None, high_watermark=0,
                 log_start=0, batches=()):
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.error = error
        self.high_watermark = high_watermark
        self.log_start = log_start
        self.batches = batches

    @property
    def payload_bytes(self):
        return sum(len(b.payload) for b in self.batches)


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    """One topic in a Metadata answer: ``info`` (TopicInfo) or ``error``."""
    name: str
    info: Any = None
    error: Optional[Exception] = None
