"""``ILogStore``: what the command bus needs from a log store.

It is drawn so that a second backend (an existing distributed log, for
users who outgrow one machine) could stand behind the bus without any
dialect noticing: positions are offsets and stream positions, payloads are
opaque bytes tagged with a format id, and every change answers with a
Deferred that fires once it is durable. Reads answer synchronously here
because the embedded store serves them from the page cache; the bus is the
one place that would wrap a remote backend's reads.
"""
from zope.interface import Attribute, Interface


class ILogStore(Interface):
    settings = Attribute("the StoreSettings the store was opened with")

    def open():
        """Open the data, recovering torn tails; returns [(topic, partition, bytes cut)]."""

    def close():
        """Make everything durable and release files; returns a Deferred."""

    def topic_names():
        """Sorted names of all topics."""

    def topic(name):
        """TopicInfo for ``name``; raises UnknownTopic."""

    def create_topic(name, partitions, kind="event", attrs=None):
        """Create a topic; Deferred[TopicInfo] once durable. Raises TopicExists, InvalidTopicName."""

    def create_partitions(name, count):
        """Grow a topic to ``count`` partitions; Deferred[TopicInfo]."""

    def set_topic_attrs(name, attrs):
        """Replace a topic's free-form attributes; Deferred[TopicInfo]."""

    def delete_topic(name):
        """Delete a topic, its data and its committed offsets; Deferred."""

    def seal_partition(name, partition):
        """Refuse further appends to a partition; Deferred."""

    def append(topic, partition, fmt, payload, count, first_ts, max_ts, value_bytes,
               writer=None, kind=None, expected_offset=None):
        """Store one batch atomically; Deferred[Appended] once durable. With
        ``expected_offset``, only if the batch would start at that offset
        (else OffsetOutOfRange, nothing stored)."""

    def read(topic, partition, offset, max_bytes):
        """[StoredBatch] from the batch holding ``offset``, up to the high watermark."""

    def read_at_position(topic, partition, position, max_bytes):
        """[StoredBatch] from the batch holding stream position ``position``."""

    def batch_for_timestamp(topic, partition, timestamp):
        """The first StoredBatch whose largest timestamp is >= ``timestamp``, or None."""

    def offsets(topic, partition):
        """PartitionState: log start, high watermark, stream positions, sealed."""

    def wait_for_append(topic, partition, offset):
        """A cancellable Deferred that fires once the high watermark passes ``offset``."""

    def writer_event_number(topic, partition, writer_id):
        """The writer's stored event number, or NO_EVENT_NUMBER."""

    def commit_offset(group, topic, partition, offset, metadata=None):
        """Store a group's committed offset; Deferred once durable."""

    def committed_offset(group, topic, partition):
        """(offset, metadata) or None."""

    def groups():
        """Names of the groups with committed offsets."""

    def group_offsets(group):
        """{(topic, partition): (offset, metadata)} for one group."""

    def table_create(name):
        """Create a key-value table; Deferred. Raises TableExists."""

    def table_delete(name, must_be_empty=False):
        """Delete a key-value table; Deferred."""

    def table_update(name, entries, table_offset=None):
        """Conditional all-or-nothing puts; Deferred[list of new versions]."""

    def table_remove(name, keys, table_offset=None):
        """Conditional all-or-nothing removes; Deferred."""

    def table_read(name, keys):
        """[(value, version) or None] per key."""

    def table_entries(name, from_version, limit):
        """([(key, value, version)] with version >= from_version, next version)."""

    def enforce_retention():
        """Delete whole segments past the retention limits; returns how many."""
