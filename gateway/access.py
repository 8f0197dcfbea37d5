"""A listener's access rules, applied to the commands its dialect sends.

The rules sit in the listener's view of the bus (``gateway.bus.ListenerBus``)
so that no dialect re-implements them: a dialect sees a refused command fail
with ``NotAuthorized`` (or, when only implicit creation is refused, with the
``UnknownTopic`` it would get under ``topics.auto_create: false``) and maps
that to its own wire answer in its one error table.

What the rules decide, per command:

- reads (Fetch, ReadPosition, Subscribe, ListOffsets, PartitionInfo,
  LookupPosition) and consumer-group offsets (CommitOffset,
  FetchCommittedOffset, GroupOffsets) need the topic to match a pattern; a
  read-only listener still commits offsets, since that is consumer state,
  not topic data;
- writes (Produce, CreateTopic, CreatePartitions, DeleteTopic,
  SealPartition, SetTopicAttrs, and WriterEventNumber, which a Pravega
  writer asks before its first append) need a matching topic and a
  read-write listener;
- Metadata leaves unmatched topics out of the full list and answers a named
  one with ``NotAuthorized`` without creating it;
- implicit creation (a Produce's or Metadata's ``auto_create``) happens only
  on a read-write listener whose ``access.auto_create`` is on;
- Fetch answers an unmatched partition with a ``NotAuthorized`` error in its
  place and serves the others, as the bus does for an unknown partition;
- everything else (group membership, Pravega's key-value tables, which hold
  reader-group state) is not about a topic and passes.

An invalid topic name is left to the bus, so that it is answered as invalid
rather than as refused.
"""
import dataclasses
import fnmatch
import re

from twisted.internet import defer

from gateway import commands as c
from gateway.errors import NotAuthorized
from storage import valid_topic_name

#: a listener that sees many distinct names (a client probing) must not grow
#: the verdict cache without bound: past this it starts over
_CACHE_LIMIT = 4096


class AccessRules:
    """The compiled ``access:`` of one listener (a ``gateway.config.AccessConfig``)."""

    def __init__(self, config):
        self.config = config
        self.read_only = config.read_only
        self.auto_create = config.auto_create and not config.read_only
        self._match = re.compile("|".join(
            f"(?:{fnmatch.translate(pattern)})" for pattern in config.topics)).match
        self._verdicts = {}
        self._handlers = {
            c.Produce: self._produce,
            c.Fetch: self._fetch,
            c.Metadata: self._metadata,
            c.GroupOffsets: self._group_offsets,
        }
        for kind in (c.ReadPosition, c.Subscribe, c.ListOffsets, c.PartitionInfo,
                     c.LookupPosition, c.CommitOffset, c.FetchCommittedOffset):
            self._handlers[kind] = self._read
        for kind in (c.CreateTopic, c.CreatePartitions, c.DeleteTopic, c.SealPartition,
                     c.SetTopicAttrs, c.WriterEventNumber):
            self._handlers[kind] = self._write

    def visible(self, topic):
        """Whether the listener may see ``topic`` at all (an invalid name is
        "visible", so the bus answers it as invalid)."""
        verdict = self._verdicts.get(topic)
        if verdict is None:
            if len(self._verdicts) >= _CACHE_LIMIT:
                self._verdicts.clear()
            verdict = self._verdicts[topic] = (
                not valid_topic_name(topic) or self._match(topic) is not None)
        return verdict

    def writable(self, topic):
        return not self.read_only and self.visible(topic)

    def execute(self, bus, command):
        """Run ``command`` on ``bus`` under these rules; a Deferred, like ``bus.execute``."""
        handler = self._handlers.get(type(command))
        if handler is None:
            return bus.execute(command)
        return handler(bus, command)

    def _refuse(self, topic, what):
        return defer.fail(NotAuthorized(f"listener may not {what} topic {topic!r}"))

    def _read(self, bus, command):
        if not self.visible(command.topic):
            return self._refuse(command.topic, "read")
        return bus.execute(command)

    def _write(self, bus, command):
        if not self.writable(command.topic):
            return self._refuse(command.topic, "write")
        return bus.execute(command)

    def _produce(self, bus, command):
        if not self.writable(command.topic):
            return self._refuse(command.topic, "write")
        if command.auto_create and not self.auto_create:
            command = dataclasses.replace(command, auto_create=False)
        return bus.execute(command)

    def _fetch(self, bus, command):
        parts = command.partitions
        refused = [i for i, part in enumerate(parts) if not self.visible(part.topic)]
        if not refused:
            return bus.execute(command)
        answers = {i: c.PartitionData(parts[i].topic, parts[i].partition, parts[i].offset,
                                      error=NotAuthorized(f"listener may not read topic "
                                                          f"{parts[i].topic!r}"))
                   for i in refused}
        allowed = [part for i, part in enumerate(parts) if i not in answers]
        if not allowed:
            return defer.succeed([answers[i] for i in range(len(parts))])

        def merge(served):
            it = iter(served)
            return [answers[i] if i in answers else next(it) for i in range(len(parts))]
        return bus.execute(dataclasses.replace(command, partitions=allowed)).addCallback(merge)

    def _metadata(self, bus, command):
        auto_create = command.auto_create and self.auto_create
        if command.topics is None:
            return bus.execute(c.Metadata(None, auto_create)).addCallback(
                lambda found: [meta for meta in found if self.visible(meta.name)])
        names = list(command.topics)
        allowed = [name for name in names if self.visible(name)]
        if len(allowed) == len(names):
            return bus.execute(c.Metadata(names, auto_create))

        def merge(found):
            served = {meta.name: meta for meta in found}
            return [served[name] if name in served else c.TopicMetadata(
                name, error=NotAuthorized(f"listener may not read topic {name!r}"))
                for name in names]
        if not allowed:
            return defer.succeed(merge([]))
        return bus.execute(c.Metadata(allowed, auto_create)).addCallback(merge)

    def _group_offsets(self, bus, command):
        return bus.execute(command).addCallback(lambda offsets: {
            key: value for key, value in offsets.items() if self.visible(key[0])})
