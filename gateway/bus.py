"""The command bus: the one way from a dialect to the log store.

``execute(command)`` answers a Deferred. The bus owns what is the same for
every dialect: topic name rules, auto-creation, partition limits, the record
size limit, encoding records in the neutral format, long-polling, push
subscriptions and the format registry that lets any dialect read any batch.
It is the only caller of the store.
"""
from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from gateway import commands as c
from gateway.access import AccessRules
from gateway.config import GroupsConfig
from gateway.errors import (
    InvalidRequest, InvalidTopicName, LogError, RecordTooLarge,
    UnknownPartition, UnknownTopic)
from gateway.groups import GroupCoordinator
from gateway.records import NEUTRAL, EncodedBatch, FormatRegistry, encode_neutral
from gateway.subscription import Subscription
from storage import Appended, valid_topic_name
from storage.store import FRAMING_OVERHEAD

log = Logger()

#: the largest offset a commit may name (int64)
MAX_OFFSET = (1 << 63) - 1


class CommandBus:
    """Executes commands against ``store`` under the ``topics`` and ``limits`` config.

    ``groups`` (the ``groups:`` config, defaults if None) configures the
    process's one group coordinator, ``self.groups``: group membership is
    state in memory, not a store command, so dialects reach it directly
    through their bus view rather than through ``execute``.
    """

    def __init__(self, store, topics, limits, reactor=None, groups=None):
        if reactor is None:
            from twisted.internet import reactor
        self.store = store
        self.topics = topics
        self.limits = limits
        self.reactor = reactor
        self.groups = GroupCoordinator(groups or GroupsConfig(), reactor)
        self.formats = FormatRegistry()
        self.subscriptions = set()
        self.parked = 0
        self.metrics_registry = None
        self._creating = {}     # topic -> Deferreds waiting for its auto-creation
        self._handlers = {
            c.Produce: self._produce,
            c.Fetch: self._fetch,
            c.ReadPosition: self._read_position,
            c.Subscribe: self._subscribe,
            c.ListOffsets: self._list_offsets,
            c.PartitionInfo: self._partition_info,
            c.Metadata: self._metadata,
            c.CreateTopic: self._create_topic,
            c.CreatePartitions: self._create_partitions,
            c.SetTopicAttrs: self._set_topic_attrs,
            c.DeleteTopic: self._delete_topic,
            c.SealPartition: self._seal,
            c.CommitOffset: self._commit,
            c.FetchCommittedOffset: self._committed,
            c.ListGroups: lambda cmd: store.groups(),
            c.GroupOffsets: lambda cmd: store.group_offsets(cmd.group),
            c.LookupPosition: self._lookup_position,
            c.WriterEventNumber: lambda cmd: store.writer_event_number(
                cmd.topic, cmd.partition, cmd.writer_id),
            c.TableCreate: lambda cmd: store.table_create(cmd.table),
            c.TableDelete: lambda cmd: store.table_delete(cmd.table, cmd.must_be_empty),
            c.TableUpdate: lambda cmd: store.table_update(cmd.table, cmd.entries,
                                                          cmd.table_offset),
            c.TableRemove: lambda cmd: store.table_remove(cmd.table, cmd.keys, cmd.table_offset),
            c.TableRead: lambda cmd: store.table_read(cmd.table, cmd.keys),
            c.TableEntries: lambda cmd: store.table_entries(cmd.table, cmd.from_version,
                                                            cmd.limit),
        }

    def execute(self, command):
        """Run one command; always answers a Deferred (errors as failures)."""
        try:
            result = self._handlers[type(command)](command)
        except LogError as e:
            return defer.fail(e)
        except Exception:
            log.failure("command {command!r} failed", command=command)
            return defer.fail()
        if isinstance(result, defer.Deferred):
            return result
        return defer.succeed(result)

    def metrics_text(self):
        """The metrics in the Prometheus text format: the whole gateway's
        when the service has set ``metrics_registry`` (``metrics:`` is
        configured), else the store's."""
        if self.metrics_registry is not None:
            from prometheus_client import generate_latest
            return generate_latest(self.metrics_registry).decode("utf-8")
        from gateway.metrics import exposition
        return exposition(self)

    def for_listener(self, listener, meter=None):
        """The view of the bus one listener's dialect gets; ``meter`` (a
        ``gateway.metrics.ListenerMeter``) counts its commands."""
        return ListenerBus(self, listener, meter)

    def decode(self, batch):
        """``Records`` of a stored batch, whatever format it was stored in."""
        return self.formats.decode(batch)

    # -- topics ------------------------------------------------------------------

    def _check_name(self, topic):
        if not valid_topic_name(topic):
            raise InvalidTopicName(topic)

    def _check_partitions(self, count):
        if not 1 <= count <= self.topics.max_partitions:
            raise InvalidRequest(
                f"partition count {count} outside 1..{self.topics.max_partitions}")

    def _create_topic(self, cmd):
        self._check_name(cmd.topic)
        count = self.topics.default_partitions if cmd.partitions is None else cmd.partitions
        self._check_partitions(count)
        return self.store.create_topic(cmd.topic, count, cmd.kind, cmd.attrs)

    def _create_partitions(self, cmd):
        info = self.store.topic(cmd.topic)
        self._check_partitions(cmd.count)
        if cmd.count < info.partitions:
            raise InvalidRequest(f"topic {cmd.topic} has {info.partitions} partitions; "
                                 f"partition counts never shrink")
        return self.store.create_partitions(cmd.topic, cmd.count)

    def _set_topic_attrs(self, cmd):
        attrs = self.store.topic(cmd.topic).attrs
        attrs.update(cmd.attrs)
        return self.store.set_topic_attrs(cmd.topic, attrs)

    def _delete_topic(self, cmd):
        return self.store.delete_topic(cmd.topic)

    def _seal(self, cmd):
        return self.store.seal_partition(cmd.topic, cmd.partition)

    def _ensure_topic(self, topic, allowed):
        """None if the topic exists; else a Deferred creating it, if allowed.

        While an auto-creation is not yet durable, later commands for the
        topic queue behind it and are released in arrival order: a produce
        pipelined behind the one that creates the topic must not append
        first (the topic is in the store's table at once, so without the
        queue it would).
        """
        queue = self._creating.get(topic)
        if queue is not None:
            d = defer.Deferred()
            queue.append(d)
            return d
        if topic in self.store.topics:
            return None
        self._check_name(topic)
        if not (allowed and self.topics.auto_create):
            raise UnknownTopic(topic)
        created = self.store.create_topic(topic, self.topics.default_partitions)
        first = defer.Deferred()
        queue = self._creating[topic] = [first]

        def release(result):
            del self._creating[topic]
            for d in queue:
                if isinstance(result, Failure):
                    d.errback(result)
                else:
                    d.callback(result)
        created.addBoth(release)
        return first

    def _metadata(self, cmd):
        names = self.store.topic_names() if cmd.topics is None else list(cmd.topics)
        creating = []
        answers = []
        for name in names:
            try:
                created = self._ensure_topic(name, cmd.auto_create)
                if created is not None:
                    creating.append(created)
                answers.append(c.TopicMetadata(name, self.store.topic(name)))
            except LogError as e:
                answers.append(c.TopicMetadata(name, error=e))
        if not creating:
            return answers
        return defer.gatherResults(creating, consumeErrors=True).addCallback(lambda _: answers)

    # -- produce -------------------------------------------------------------------

    def _produce(self, cmd):
        if cmd.topic not in self.store.topics:
            # A produce refused for its size must not leave a new topic behind.
            self._check_size(cmd.records)
        created = self._ensure_topic(cmd.topic, cmd.auto_create)
        if created is not None:
            return created.addCallback(lambda _: self._append(cmd))
        return self._append(cmd)

    def _check_size(self, records):
        largest = (records.max_value_bytes if isinstance(records, EncodedBatch)
                   else max(map(len, records.values), default=0))
        if largest > self.limits.max_record_bytes:
            raise RecordTooLarge(largest, self.limits.max_record_bytes)

    def _append(self, cmd):
        records = cmd.records
        if len(records) == 0:
            # Nothing to store, but the partition must exist like for any produce.
            state = self.store.offsets(cmd.topic, cmd.partition)
            return Appended(state.high_watermark, 0, state.end_position)
        limit = self.limits.max_record_bytes
        if isinstance(records, EncodedBatch):
            if records.max_value_bytes > limit:
                raise RecordTooLarge(records.max_value_bytes, limit)
            return self.store.append(cmd.topic, cmd.partition, records.format, records.payload,
                                     records.count, records.first_ts, records.max_ts,
                                     records.value_bytes, cmd.writer, cmd.kind,
                                     cmd.expected_offset)
        payload, first_ts, max_ts, value_bytes, largest = encode_neutral(
            records, self.store.now_ms())
        if largest > limit:
            raise RecordTooLarge(largest, limit)
        return self.store.append(cmd.topic, cmd.partition, NEUTRAL, payload, len(records),
                                 first_ts, max_ts, value_bytes, cmd.writer, cmd.kind,
                                 cmd.expected_offset)

    # -- reading --------------------------------------------------------------------

    def _read_one(self, req):
        store = self.store
        try:
            batches = store.read(req.topic, req.partition, req.offset, req.max_bytes)
            state = store.offsets(req.topic, req.partition)
        except LogError as e:
            return c.PartitionData(req.topic, req.partition, req.offset, error=e)
        return c.PartitionData(req.topic, req.partition, req.offset, None,
                               state.high_watermark, state.log_start, batches)

    def _fetch(self, cmd):
        answer = [self._read_one(req) for req in cmd.partitions]
        if cmd.max_wait_ms <= 0 or self._enough(answer, cmd.min_bytes):
            return answer
        return self._park(cmd, answer)

    @staticmethod
    def _enough(answer, min_bytes):
        if any(part.error is not None for part in answer):
            return True
        return sum(part.payload_bytes for part in answer) >= max(min_bytes, 1)

    def _park(self, cmd, answer):
        """Wait until appends bring enough data or ``max_wait_ms`` passes.

        Each partition waits for its high watermark to pass the one just
        seen, so the fetch wakes only on new data (no busy loop). Cancelling
        the returned Deferred (the connection went away) forgets everything.
        """
        result = defer.Deferred(lambda d: cleanup())
        waits = []
        self.parked += 1

        def cleanup():
            if timer.active():
                timer.cancel()
            for w in waits:
                w.cancel()
            del waits[:]
            self.parked -= 1

        def woken(_):
            if result.called:
                return
            again = [self._read_one(req) for req in cmd.partitions]
            if self._enough(again, cmd.min_bytes):
                finish(again)
            else:
                rearm(again)

        def timed_out():
            finish([self._read_one(req) for req in cmd.partitions])

        def finish(final):
            cleanup()
            result.callback(final)

        def rearm(seen):
            for w in waits:
                w.cancel()
            del waits[:]
            for part in seen:
                if self.store.offsets(part.topic, part.partition).sealed:
                    # No append will ever come (and waiting on it would fire at
                    # once, every time): only the other partitions can wake us.
                    continue
                w = self.store.wait_for_append(part.topic, part.partition,
                                               max(part.high_watermark, part.offset))
                w.addCallbacks(woken, lambda f: None if f.check(defer.CancelledError)
                               else woken(None))
                waits.append(w)
            if not waits:
                finish(seen)    # every partition is sealed: readers see the end

        timer = self.reactor.callLater(cmd.max_wait_ms / 1000.0, timed_out)
        rearm(answer)
        return result

    def _read_position(self, cmd):
        def read():
            try:
                batches = self.store.read_at_position(cmd.topic, cmd.partition, cmd.position,
                                                      cmd.max_bytes)
                state = self.store.offsets(cmd.topic, cmd.partition)
            except LogError as e:
                return c.PartitionData(cmd.topic, cmd.partition, cmd.position, error=e)
            return c.PartitionData(cmd.topic, cmd.partition, cmd.position, None,
                                   state.high_watermark, state.log_start, batches)
        first = read()
        if first.error is not None or first.batches or cmd.max_wait_ms <= 0:
            return first
        state = self.store.offsets(cmd.topic, cmd.partition)
        if state.sealed:
            return first
        wait = self.store.wait_for_append(cmd.topic, cmd.partition, state.high_watermark)
        timer = self.reactor.callLater(cmd.max_wait_ms / 1000.0, wait.cancel)

        def done(_):
            if timer.active():
                timer.cancel()
            return read()

        def cancelled(failure):
            failure.trap(defer.CancelledError)
            if timer.active():      # cancelled by the caller, not by the timer
                timer.cancel()
                return failure
            return read()
        return wait.addCallbacks(done, cancelled)

    def _subscribe(self, cmd):
        state = self.store.offsets(cmd.topic, cmd.partition)
        start = min(max(cmd.offset, state.log_start), state.high_watermark)
        sub = Subscription(self, cmd.topic, cmd.partition, start, cmd.consumer, cmd.max_bytes)
        self.subscriptions.add(sub)
        sub.start()
        return sub

    def _list_offsets(self, cmd):
        state = self.store.offsets(cmd.topic, cmd.partition)
        if cmd.spec == c.LATEST:
            return state.high_watermark
        if cmd.spec == c.EARLIEST:
            return state.log_start
        if cmd.spec < 0:
            raise InvalidRequest(f"bad offset spec {cmd.spec}")
        batch = self.store.batch_for_timestamp(cmd.topic, cmd.partition, cmd.spec)
        if batch is None:
            return state.high_watermark
        for offset, ts, _, _ in self.decode(batch):
            if ts >= cmd.spec:
                return offset
        return batch.next_offset

    def _partition_info(self, cmd):
        return self.store.offsets(cmd.topic, cmd.partition)

    def _lookup_position(self, cmd):
        state = self.store.offsets(cmd.topic, cmd.partition)
        if cmd.position >= state.end_position:
            return state.high_watermark, state.end_position
        batches = self.store.read_at_position(cmd.topic, cmd.partition, cmd.position, 0)
        batch = batches[0]
        overhead = FRAMING_OVERHEAD.get(self.store.topic(cmd.topic).kind, 0)
        pos = batch.stream_pos
        for offset, _, _, value in self.decode(batch):
            end = pos + overhead + len(value)
            if end > cmd.position:
                return offset, pos
            pos = end
        return batch.next_offset, pos

    # -- groups ---------------------------------------------------------------------

    def _commit(self, cmd):
        if cmd.offset < 0:
            raise InvalidRequest(f"committed offset {cmd.offset} is negative")
        if cmd.offset > MAX_OFFSET:
            # Offsets are int64 (Kafka's, and SQLite's INTEGER): a larger one,
            # which RustLog's u64 can say, is a client's error, not a crash.
            raise InvalidRequest(f"committed offset {cmd.offset} is above {MAX_OFFSET}")
        return self.store.commit_offset(cmd.group, cmd.topic, cmd.partition, cmd.offset,
                                        cmd.metadata)

    def _committed(self, cmd):
        info = self.store.topic(cmd.topic)
        if not 0 <= cmd.partition < info.partitions:
            raise UnknownPartition(cmd.topic, cmd.partition)
        return self.store.committed_offset(cmd.group, cmd.topic, cmd.partition)


class ListenerBus:
    """One listener's view of the bus: what its dialect is given.

    It carries the listener's identity (for logs and metrics) and applies
    the listener's access rules (``gateway.access``), so no dialect
    re-implements them. It also knows the listener's produces in flight,
    which a stopping gateway lets finish, and, when metrics are on
    (``meter``), counts every command by type and outcome and every append
    by topic: once per command, which is once per batch, never per record.
    ``configure`` swaps the listener's config in (a reload): the rules
    apply from the next command on.
    """

    def __init__(self, bus, listener, meter=None):
        self.bus = bus
        self.decode = bus.decode
        self.formats = bus.formats
        self.reactor = bus.reactor
        self.groups = bus.groups
        self.meter = meter
        self.producing = 0
        self._idle = []
        self.configure(listener)

    def configure(self, listener):
        self.listener = listener
        self.rules = None if listener.access.unrestricted else AccessRules(listener.access)

    @property
    def limits(self):
        """The gateway-wide limits (``limits:``), as reloaded."""
        return self.bus.limits

    def execute(self, command):
        rules = self.rules
        d = self.bus.execute(command) if rules is None else rules.execute(self.bus, command)
        if type(command) is c.Produce:
            self.producing += 1
            d.addBoth(self._produced, command)
        elif self.meter is not None:
            self.meter.observe(command, d)
        return d

    def _produced(self, result, command):
        self.producing -= 1
        if self.meter is not None:
            self.meter.produced(command, result)
        if not self.producing and self._idle:
            # After this turn: the dialect's own callbacks, which follow this
            # one, write the answer first.
            idle, self._idle = self._idle, []
            self.reactor.callLater(0, lambda: [d.callback(None) for d in idle])
        return result

    def idle(self):
        """Fires once no produce of this listener is in flight and the
        answers of those that were have been written."""
        if not self.producing:
            return defer.succeed(None)
        d = defer.Deferred()
        self._idle.append(d)
        return d

    def metrics_text(self):
        """The gateway's metrics in the Prometheus text format."""
        return self.bus.metrics_text()
