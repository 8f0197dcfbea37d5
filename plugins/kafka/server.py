"""Kafka server: frames <-> bus commands (protocols/kafka.md).

Each request is decoded, turned into bus commands in arrival order, and
answered through ``OrderedReplies``: Kafka clients match answers to
requests first in, first out, so a parked Fetch delays the answers behind
it on its connection, as on a real broker. A Produce with acks=0 gets no
answer bytes and takes no place in that queue.

The 0.8 protocol has no generic error body: a frame whose size is out of
bounds, a body that cannot be parsed, or an API key or version the gateway
does not speak is logged and closes the connection (after the answers
already owed are written). Everything else is answered with the API's own
error codes, per partition where the API has partitions, through one table
(``error_code``).
"""
from twisted.internet import defer
from twisted.python.failure import Failure

from gateway import commands as c
from gateway.config import ConfigError
from gateway.errors import (
    InvalidRequest, InvalidTopicName, NotAuthorized, OffsetOutOfRange, RecordTooLarge,
    StorageError, UnknownPartition, UnknownTopic)
from gateway.framing import FramedProtocol
from gateway.groups import (
    GroupError, IllegalGeneration, InconsistentProtocol, InvalidGroupId,
    InvalidSessionTimeout, RebalanceInProgress, UnknownMember)
from gateway.listeners import ListenerService
from gateway.protocol import DialectFactory, OrderedReplies, TrackedConnection
from gateway.records import KAFKA_MESSAGE_SET, EncodedBatch, RecordBatch
from plugins.kafka import codec as kc

#: the smallest request: api_key, api_version, correlation_id, client_id length
MIN_REQUEST_BYTES = 10
#: answers a connection may owe before the gateway stops reading from it (§1)
MAX_PENDING = 100
#: hosts that say "every interface": not an address a client can connect to
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
#: an answer not known yet
_PENDING = object()

_GROUP_CODES = {
    InvalidGroupId: kc.INVALID_GROUP_ID,
    InvalidSessionTimeout: kc.INVALID_SESSION_TIMEOUT,
    InconsistentProtocol: kc.INCONSISTENT_GROUP_PROTOCOL,
    UnknownMember: kc.UNKNOWN_MEMBER_ID,
    IllegalGeneration: kc.ILLEGAL_GENERATION,
    RebalanceInProgress: kc.REBALANCE_IN_PROGRESS,
}


def _settled(d):
    """The value of a Deferred that has already fired, else the Deferred:
    most answers are ready at once, and ``OrderedReplies`` writes a ready
    answer straight away when nothing is ahead of it."""
    box = []

    def keep(value):
        box.append(value)
        return value
    d.addCallback(keep)
    return box[0] if box else d


def _put(answer, answers, i):
    answers[i] = answer


def error_code(error, read=False):
    """The dialect's one error table: a bus or group error -> Kafka code.

    ``read`` is for reads (Fetch, ListOffsets, OffsetFetch, Metadata), where
    a topic the listener may not see is answered as if it did not exist.
    """
    if isinstance(error, (UnknownTopic, UnknownPartition)):
        return kc.UNKNOWN_TOPIC_OR_PARTITION
    if isinstance(error, OffsetOutOfRange):
        return kc.OFFSET_OUT_OF_RANGE
    if isinstance(error, RecordTooLarge):
        return kc.MESSAGE_SIZE_TOO_LARGE
    if isinstance(error, InvalidTopicName):
        return kc.INVALID_TOPIC
    if isinstance(error, NotAuthorized):
        return kc.UNKNOWN_TOPIC_OR_PARTITION if read else kc.TOPIC_AUTHORIZATION_FAILED
    if isinstance(error, GroupError):
        return _GROUP_CODES.get(type(error), kc.UNKNOWN)
    # PartitionSealed (0.8 has no read-only code), StorageError, the rest
    return kc.UNKNOWN


def _code_of(failure, read=False):
    return error_code(_unwrap(failure), read)


def _unwrap(failure):
    """The error behind a failure, through ``gatherResults``' FirstError."""
    error = failure.value
    while isinstance(error, defer.FirstError):
        error = error.subFailure.value
    return error


class KafkaProtocol(TrackedConnection, FramedProtocol):

    def connectionMade(self):
        super().connectionMade()
        factory = self.factory
        self.bus = factory.bus
        self.max_frame_bytes = factory.max_frame_bytes
        self.replies = OrderedReplies(self.transport, factory.in_flight_limit(MAX_PENDING))
        self.peer_host = getattr(self.transport.getPeer(), "host", "")
        self.closing = False

    def connectionLost(self, reason):
        self.replies.cancel_all()
        super().connectionLost(reason)

    # -- framing ---------------------------------------------------------------------

    def frameTooLarge(self, fields):
        self.log_protocol_error(f"frame of {fields[0]} bytes exceeds {self.max_frame_bytes}; "
                                f"closing")
        self.transport.loseConnection()

    def frameReceived(self, fields, frame):
        if fields[0] < MIN_REQUEST_BYTES:
            self._close(f"frame of {fields[0]} bytes is shorter than a request header")
            return
        try:
            request = kc.decode_request(frame)
        except kc.UnsupportedRequest as e:
            self._close(f"unsupported api key {e.api_key} version {e.api_version} "
                        f"(correlation id {e.correlation_id}, client {e.client_id!r})")
            return
        except kc.KafkaDecodeError as e:
            self._close(f"malformed request: {e}")
            return
        try:
            answer = self._handlers[request.api_key](self, request)
        except Exception:
            self.factory.log_failure(Failure())
            self._close("request failed")
            return
        if isinstance(answer, defer.Deferred):
            answer = _settled(answer.addErrback(self._failed))
        if answer is not None:
            self.replies.add(answer)

    def _close(self, problem):
        """Log, read nothing more, and close once the answers already owed
        are written (the 0.8 protocol has no error body to send instead)."""
        self.log_protocol_error(problem)
        if self.closing:
            return
        self.closing = True
        self.stopReading()
        self.replies.add(defer.succeed(None).addCallback(
            lambda _: self.transport.loseConnection()))

    def _failed(self, failure):
        """A bug or an unexpected failure behind an answer: logged with its
        traceback; the connection cannot be answered correctly any more."""
        if failure.check(defer.CancelledError):
            return failure
        self.factory.log_failure(failure)
        self.transport.loseConnection()
        return None

    def _respond(self, request, body, version=None):
        return kc.encode_response(request.api_key,
                                  request.api_version if version is None else version,
                                  request.correlation_id, body)

    def now_ms(self):
        return int(self.bus.reactor.seconds() * 1000)

    # -- produce ----------------------------------------------------------------------------

    def do_produce(self, request):
        body = request.body
        if body.acks not in (0, 1, -1):
            self.log_protocol_error(f"produce with acks={body.acks}")
            return self._respond(request, kc.ProduceResponse(tuple(
                (name, tuple((p, kc.INVALID_REQUIRED_ACKS, -1) for p, _ in partitions))
                for name, partitions in body.topics)))
        now = self.now_ms()
        topics = []
        pending = []
        for name, partitions in body.topics:
            answers = [_PENDING] * len(partitions)
            for i, (partition, data) in enumerate(partitions):
                d = self._produce_partition(name, partition, data, now)
                d.addCallback(_put, answers, i)
                if answers[i] is _PENDING:
                    pending.append(d)
            topics.append((name, answers))

        def respond(_=None):
            return self._respond(request, kc.ProduceResponse(tuple(
                (name, tuple(answers)) for name, answers in topics)))
        if body.acks == 0:
            defer.gatherResults(pending, consumeErrors=True).addErrback(self._failed)
            return None
        if not pending:
            # Appends acknowledged at once (fsync never, or errors): answer
            # without a Deferred, the common case under load.
            return respond()
        return defer.gatherResults(pending, consumeErrors=True).addCallback(respond)

    def _produce_partition(self, topic, partition, data, now):
        """Validate and append one partition's set; fires with its
        ``(partition, error, base_offset)`` (errors are answers, not failures)."""
        try:
            produced = kc.read_produced(data, now, self.max_frame_bytes)
        except kc.CorruptMessage as e:
            self.log_protocol_error(f"corrupt message set for {topic}/{partition}: {e}")
            return defer.succeed((partition, kc.CORRUPT_MESSAGE, -1))
        if produced.count == 0:
            # Nothing to store; the partition must exist all the same.
            d = self.bus.execute(c.PartitionInfo(topic, partition))
            return d.addCallbacks(lambda _: (partition, kc.NONE, -1), self._produce_failed,
                                  errbackArgs=(topic, partition))
        if produced.payload is not None:
            records = EncodedBatch(KAFKA_MESSAGE_SET, produced.payload, produced.count,
                                   now, now, produced.value_bytes, produced.max_value)
        else:
            records = RecordBatch(produced.values, produced.keys, produced.timestamps)
        d = self.bus.execute(c.Produce(topic, partition, records, auto_create=False))
        return d.addCallbacks(lambda appended: (partition, kc.NONE, appended.base_offset),
                              self._produce_failed, errbackArgs=(topic, partition))

    def _produce_failed(self, failure, topic, partition):
        error = _unwrap(failure)
        code = error_code(error)
        if code == kc.UNKNOWN:
            # A sealed partition, a storage failure: worth a line in the log,
            # since the client sees only "unknown".
            self.log_protocol_error(f"produce to {topic}/{partition} failed: {error}")
        return partition, code, -1

    # -- fetch --------------------------------------------------------------------------------

    def do_fetch(self, request):
        body = request.body
        wanted = [c.FetchPartition(name, partition, offset, max_bytes)
                  for name, partitions in body.topics
                  for partition, offset, max_bytes in partitions]
        d = self.bus.execute(c.Fetch(wanted))
        d.addCallback(self._fetched, request, wanted, False)
        return d

    def _fetched(self, answer, request, wanted, waited):
        """Answer from what the bus read; or, if that is not enough yet and
        the client is willing to wait, park one bus Fetch naming every
        partition (it wakes on appends from any dialect) and answer from
        what it reads. "Enough" counts stored payload bytes, as the bus's
        long-poll does. Offsets above the high watermark are errors, found
        here before parking: waiting would not make them valid."""
        body = request.body
        if not waited and body.max_wait_ms > 0 and body.min_bytes > 0 and not any(
                part.error is not None or part.offset > part.high_watermark
                for part in answer) and \
                sum(part.payload_bytes for part in answer) < body.min_bytes:
            d = self.bus.execute(c.Fetch(wanted, body.max_wait_ms, body.min_bytes))
            return d.addCallback(self._fetched, request, wanted, True)
        parts = []
        for part, want in zip(answer, wanted):
            if part.error is not None:
                parts.append((part.partition, error_code(part.error, read=True), -1, b""))
            elif part.offset > part.high_watermark:
                parts.append((part.partition, kc.OFFSET_OUT_OF_RANGE, -1, b""))
            else:
                parts.append((part.partition, kc.NONE, part.high_watermark, kc.message_set_for(
                    part.batches, part.offset, want.max_bytes, self.bus.decode,
                    magic=1 if request.api_version >= 2 else 0)))
        topics = []
        at = 0
        for name, partitions in body.topics:
            topics.append((name, tuple(parts[at:at + len(partitions)])))
            at += len(partitions)
        return self._respond(request, kc.FetchResponse(tuple(topics)))

    # -- offsets and metadata -------------------------------------------------------------------

    def do_list_offsets(self, request):
        topics = []
        waits = []
        for name, partitions in request.body.topics:
            answers = []
            for partition, timestamp, _ in partitions:
                if timestamp < 0 and timestamp not in (kc.LATEST, kc.EARLIEST):
                    d = defer.succeed((partition, kc.UNKNOWN, ()))
                else:
                    d = self.bus.execute(c.ListOffsets(name, partition, timestamp))
                    d.addCallbacks(lambda offset, p=partition: (p, kc.NONE, (offset,)),
                                   lambda f, p=partition: (p, _code_of(f, read=True), ()))
                d.addCallback(answers.append)
                waits.append(d)
            topics.append((name, answers))
        return defer.gatherResults(waits, consumeErrors=True).addCallback(
            lambda _: self._respond(request, kc.ListOffsetsResponse(tuple(
                (name, tuple(answers)) for name, answers in topics))))

    def do_metadata(self, request):
        named = list(request.body.topics)
        d = self.bus.execute(c.Metadata(named or None, auto_create=bool(named)))

        def answered(found):
            node = self.factory.broker[0]
            topics = []
            for meta in found:
                if meta.info is not None:
                    topics.append((kc.NONE, meta.name, tuple(
                        (kc.NONE, p, node, (node,), (node,))
                        for p in range(meta.info.partitions))))
                elif named or not isinstance(meta.error, NotAuthorized):
                    topics.append((error_code(meta.error, read=True), meta.name, ()))
            return self._metadata_response(request, topics)

        def failed(failure):
            code = _code_of(failure, read=True)
            return self._metadata_response(request, [(code, name, ()) for name in named])
        return d.addCallbacks(answered, failed)

    def _metadata_response(self, request, topics):
        return self._respond(request, kc.MetadataResponse((self.factory.broker,), tuple(topics)))

    # -- committed offsets ------------------------------------------------------------------------

    def do_offset_commit(self, request):
        body = request.body
        generation = body.generation_id if request.api_version > 0 else -1
        try:
            self.bus.groups.check_commit(body.group_id, generation, body.member_id)
        except GroupError as e:
            code = error_code(e)
            return self._respond(request, kc.OffsetCommitResponse(tuple(
                (name, tuple((p[0], code) for p in partitions))
                for name, partitions in body.topics)))
        limit = self.factory.offset_metadata_max_bytes
        topics = []
        waits = []
        for name, partitions in body.topics:
            answers = []
            for entry in partitions:
                partition, offset, metadata = entry[0], entry[1], entry[-1]
                if offset < 0:
                    d = defer.succeed((partition, kc.OFFSET_OUT_OF_RANGE))
                elif len(metadata) > limit:
                    d = defer.succeed((partition, kc.OFFSET_METADATA_TOO_LARGE))
                else:
                    d = self.bus.execute(c.CommitOffset(body.group_id, name, partition,
                                                        offset, metadata))
                    d.addCallbacks(lambda _, p=partition: (p, kc.NONE),
                                   lambda f, p=partition: (p, self._commit_code(f)))
                d.addCallback(answers.append)
                waits.append(d)
            topics.append((name, answers))
        return defer.gatherResults(waits, consumeErrors=True).addCallback(
            lambda _: self._respond(request, kc.OffsetCommitResponse(tuple(
                (name, tuple(answers)) for name, answers in topics))))

    @staticmethod
    def _commit_code(failure):
        error = _unwrap(failure)
        if isinstance(error, StorageError):
            return kc.GROUP_COORDINATOR_NOT_AVAILABLE
        if isinstance(error, InvalidTopicName):
            return kc.UNKNOWN_TOPIC_OR_PARTITION
        if isinstance(error, InvalidRequest):
            return kc.OFFSET_OUT_OF_RANGE
        return error_code(error)

    def do_offset_fetch(self, request):
        body = request.body
        if not body.group_id:
            return self._respond(request, kc.OffsetFetchResponse(tuple(
                (name, tuple((p, -1, "", kc.INVALID_GROUP_ID) for p in partitions))
                for name, partitions in body.topics)))
        topics = []
        waits = []
        for name, partitions in body.topics:
            answers = []
            for partition in partitions:
                d = self.bus.execute(c.FetchCommittedOffset(body.group_id, name, partition))
                d.addCallbacks(
                    lambda found, p=partition: (p, -1, "", kc.NONE) if found is None
                    else (p, found[0], found[1] or "", kc.NONE),
                    lambda f, p=partition: (p, -1, "", self._offset_fetch_code(f)))
                d.addCallback(answers.append)
                waits.append(d)
            topics.append((name, answers))
        return defer.gatherResults(waits, consumeErrors=True).addCallback(
            lambda _: self._respond(request, kc.OffsetFetchResponse(tuple(
                (name, tuple(answers)) for name, answers in topics))))

    @staticmethod
    def _offset_fetch_code(failure):
        error = _unwrap(failure)
        if isinstance(error, StorageError):
            return kc.GROUP_COORDINATOR_NOT_AVAILABLE
        if isinstance(error, InvalidTopicName):
            return kc.UNKNOWN_TOPIC_OR_PARTITION
        return error_code(error, read=True)

    # -- groups --------------------------------------------------------------------------------------

    def do_group_coordinator(self, request):
        node, host, port = self.factory.broker
        return self._respond(request, kc.GroupCoordinatorResponse(kc.NONE, node, host, port))

    def do_join_group(self, request):
        body = request.body
        d = self.bus.groups.join(body.group_id, body.member_id, request.client_id,
                                 self.peer_host, body.session_timeout_ms, body.protocol_type,
                                 body.protocols)
        d.addCallbacks(
            lambda r: kc.JoinGroupResponse(kc.NONE, r.generation, r.protocol, r.leader_id,
                                           r.member_id, tuple(r.members)),
            lambda f: kc.JoinGroupResponse(self._group_code(f), -1, "", "", "", ()))
        return d.addCallback(lambda response: self._respond(request, response))

    def do_sync_group(self, request):
        body = request.body
        d = self.bus.groups.sync(body.group_id, body.generation_id, body.member_id,
                                 body.assignments)
        d.addCallbacks(lambda assignment: kc.SyncGroupResponse(kc.NONE, assignment),
                       lambda f: kc.SyncGroupResponse(self._group_code(f), b""))
        return d.addCallback(lambda response: self._respond(request, response))

    def do_heartbeat(self, request):
        body = request.body
        d = self.bus.groups.heartbeat(body.group_id, body.generation_id, body.member_id)
        d.addCallbacks(lambda _: kc.HeartbeatResponse(kc.NONE),
                       lambda f: kc.HeartbeatResponse(self._group_code(f)))
        return d.addCallback(lambda response: self._respond(request, response))

    def do_leave_group(self, request):
        body = request.body
        d = self.bus.groups.leave(body.group_id, body.member_id)
        d.addCallbacks(lambda _: kc.LeaveGroupResponse(kc.NONE),
                       lambda f: kc.LeaveGroupResponse(self._group_code(f)))
        return d.addCallback(lambda response: self._respond(request, response))

    @staticmethod
    def _group_code(failure):
        """Group errors are answers; a cancelled call (the connection went
        away) and bugs go on as failures."""
        failure.trap(GroupError)
        return error_code(failure.value)

    def do_describe_groups(self, request):
        groups = []
        for group_id in request.body.groups:
            if not group_id:
                groups.append((kc.INVALID_GROUP_ID, group_id, "", "", "", ()))
                continue
            g = self.bus.groups.describe(group_id)
            groups.append((kc.NONE, g.group_id, g.state, g.protocol_type, g.protocol,
                           tuple(g.members)))
        return self._respond(request, kc.DescribeGroupsResponse(tuple(groups)))

    def do_list_groups(self, request):
        return self._respond(request, kc.ListGroupsResponse(
            kc.NONE, tuple(self.bus.groups.list_groups())))

    def do_api_versions(self, request):
        error = kc.NONE if request.api_version == 0 else kc.UNSUPPORTED_VERSION
        return self._respond(request, kc.api_versions_body(error), version=0)

    _handlers = {
        kc.PRODUCE: do_produce,
        kc.FETCH: do_fetch,
        kc.LIST_OFFSETS: do_list_offsets,
        kc.METADATA: do_metadata,
        kc.OFFSET_COMMIT: do_offset_commit,
        kc.OFFSET_FETCH: do_offset_fetch,
        kc.GROUP_COORDINATOR: do_group_coordinator,
        kc.JOIN_GROUP: do_join_group,
        kc.SYNC_GROUP: do_sync_group,
        kc.HEARTBEAT: do_heartbeat,
        kc.LEAVE_GROUP: do_leave_group,
        kc.DESCRIBE_GROUPS: do_describe_groups,
        kc.LIST_GROUPS: do_list_groups,
        kc.API_VERSIONS: do_api_versions,
    }


class KafkaFactory(DialectFactory):
    protocol = KafkaProtocol

    def __init__(self, bus, listener):
        super().__init__(bus, listener)
        options = listener.options
        self.max_frame_bytes = options["max_frame_bytes"]
        self.offset_metadata_max_bytes = options["offset_metadata_max_bytes"]
        #: (node_id, host, port) this listener advertises; set once it listens
        self.broker = None


class KafkaListenerService(ListenerService):
    """A listener that advertises itself as the cluster's one broker.

    The advertised address is settled once the port is bound, so that a
    listener on port 0 advertises the port it actually got. A listener on
    every interface has no address a client could use, so it needs
    ``advertised_host``; without one it fails to start with a config error.
    """

    def _listening(self, port):
        options = self.listener.options
        address = port.getHost()
        host = options["advertised_host"] or address.host
        if host in WILDCARD_HOSTS:
            port.stopListening()
            self._failed(Failure(ConfigError(
                f"{self.listener.path}.advertised_host",
                f"required: the endpoint listens on every interface ({address.host}), "
                f"which is no address a Kafka client can connect to")))
            return
        self.factory.broker = (options["node_id"], host,
                               options["advertised_port"] or address.port)
        super()._listening(port)
