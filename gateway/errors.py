"""The gateway's one error hierarchy: the store's errors plus the bus's own.

Dialects map these classes to their wire error codes in one table each.
"""
from storage.errors import (  # noqa: F401  (re-exported for dialects)
    InvalidTopicName, KindMismatch, LogError, OffsetOutOfRange, PartitionSealed,
    RecordTooLarge, StorageError, TableBadVersion, TableError, TableExists,
    TableKeyMissing, TableNotEmpty, TopicExists, UnknownPartition, UnknownTable,
    UnknownTopic, WriterConflict)


class InvalidRequest(LogError):
    """The request is well-formed on the wire but asks for something invalid
    (a partition count beyond ``topics.max_partitions``, a shrink, ...)."""


class NotAuthorized(LogError):
    """The listener's access rules refuse this request."""
