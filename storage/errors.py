"""The store's errors: the root of the gateway's one error hierarchy.

``storage`` imports nothing from ``gateway``, so the errors the store can raise
live here; ``gateway.errors`` re-exports them and adds the bus-level ones.
Every dialect maps these classes (never message texts) to its own wire codes.
"""


class LogError(Exception):
    """Base of every error a command can fail with; ``str()`` is for humans."""


class UnknownTopic(LogError):
    def __init__(self, topic):
        super().__init__(f"unknown topic: {topic}")
        self.topic = topic


class UnknownPartition(LogError):
    def __init__(self, topic, partition):
        super().__init__(f"unknown partition: topic={topic}, partition={partition}")
        self.topic = topic
        self.partition = partition


class TopicExists(LogError):
    def __init__(self, topic):
        super().__init__(f"topic exists: {topic}")
        self.topic = topic


class InvalidTopicName(LogError):
    """A name outside ``[A-Za-z0-9._-]{1,200}`` (or ``.``/``..``): never a path on disk."""

    def __init__(self, topic):
        super().__init__(f"invalid topic name: {topic!r}")
        self.topic = topic


class OffsetOutOfRange(LogError):
    def __init__(self, topic, partition, offset, log_start, log_end):
        super().__init__(
            f"offset out of range: topic={topic}, partition={partition}, "
            f"requested={offset}, log_start={log_start}, log_end={log_end}")
        self.offset = offset
        self.log_start = log_start
        self.log_end = log_end


class RecordTooLarge(LogError):
    def __init__(self, size, limit, offset=None):
        where = "" if offset is None else f" at offset {offset}"
        super().__init__(f"record too large{where}: {size} bytes, limit {limit}")
        self.size = size
        self.limit = limit
        self.offset = offset


class PartitionSealed(LogError):
    def __init__(self, topic, partition):
        super().__init__(f"partition sealed: topic={topic}, partition={partition}")
        self.topic = topic
        self.partition = partition


class KindMismatch(LogError):
    """An append of one topic kind (``event``/``bytes``) to a topic of the other."""

    def __init__(self, topic, kind, wanted):
        super().__init__(f"topic {topic} is a {kind} topic, not {wanted}")
        self.topic = topic
        self.kind = kind
        self.wanted = wanted


class WriterConflict(LogError):
    """The writer compare-and-set failed: ``stored`` is the writer's stored event number."""

    def __init__(self, writer_id, expected, stored):
        super().__init__(
            f"writer {writer_id.hex()}: expected event number {expected}, stored {stored}")
        self.writer_id = writer_id
        self.expected = expected
        self.stored = stored


class TableError(LogError):
    """Base of the key-value table errors (Pravega table segments)."""


class UnknownTable(TableError):
    def __init__(self, table):
        super().__init__(f"unknown table: {table}")
        self.table = table


class TableExists(TableError):
    def __init__(self, table):
        super().__init__(f"table exists: {table}")
        self.table = table


class TableNotEmpty(TableError):
    def __init__(self, table):
        super().__init__(f"table not empty: {table}")
        self.table = table


class TableKeyMissing(TableError):
    def __init__(self, table, key):
        super().__init__(f"table {table}: key does not exist")
        self.table = table
        self.key = key


class TableBadVersion(TableError):
    def __init__(self, table, key):
        super().__init__(f"table {table}: version check failed")
        self.table = table
        self.key = key


class StorageError(LogError):
    """The store could not do its job (I/O error, disk full, closed): nothing was stored."""
