"""The CLI's connections to a running gateway: one class per dialect, all of
one shape, so that ``gateway produce``, ``consume`` and ``topics`` work
through any listener.

The CLI is a client of the gateway like the examples are: it speaks each
dialect through that dialect's client in ``plugins/`` (imported when a
command needs it), never through the bus or the store.

Positions are each dialect's own (DESIGN.md "Records and offsets"), so what
``consume --show-position`` prints is what that dialect's clients see and
what ``consume --from`` takes back: the offset (Kafka, RustLog), the seq =
offset + 1 (TANK), the Figg offset (a record's DATA offset is its offset + 1
and an ATTACH from it continues after it) and the Pravega byte position.
Every position grows with the log, so "read until the end" is "until the
position reaches ``end()``" in every dialect.
"""
import importlib
import struct
import time

from twisted.internet import defer, task
from twisted.internet.endpoints import HostnameEndpoint, connectProtocol

from gateway.framing import FramedProtocol

#: the listeners of the shipped config.yaml
DEFAULT_PORTS = {"kafka": 9092, "rustlog": 9093, "tank": 11011, "pravega": 12345, "figg": 8119}
DIALECTS = tuple(DEFAULT_PORTS)
#: how long one read waits at the tail for new records (ms); TANK, Kafka,
#: Figg and Pravega readers are woken by a write at once anyway
TAIL_WAIT_MS = 5000
#: RustLog has no long-poll: at the tail, ``consume -f`` fetches again after
#: this long (seconds), which bounds the latency it adds
RUSTLOG_POLL_SECONDS = 0.005
#: the largest read the CLI asks for at once (a record is never cut)
READ_BYTES = 1 << 20

#: Kafka error codes an operator meets, in words
_KAFKA_ERRORS = {1: "offset out of range", 3: "unknown topic or partition",
                 10: "record too large", 17: "invalid topic name",
                 29: "not authorised for this topic"}


#: exit status when the gateway cannot be reached (or its data directory is
#: in use, for ``check``)
UNREACHABLE = 3


class CLIError(Exception):
    """A failure to report in one line; ``code`` is the exit status."""

    def __init__(self, message, code=1):
        super().__init__(message)
        self.code = code


class Unsupported(CLIError):
    """The dialect cannot do this at all: a usage error (exit status 2)."""

    def __init__(self, message):
        super().__init__(message, 2)


def parse_address(text, dialect):
    """``host:port``, ``:port`` or ``port`` (host 127.0.0.1); None gives the
    dialect's port in the shipped config."""
    if text is None:
        return "127.0.0.1", DEFAULT_PORTS[dialect]
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise CLIError(f"bad address {text!r}: expected HOST:PORT", 2)
    return host.strip("[]") or "127.0.0.1", int(port)


_CANNOT = {
    "list_topics": "the {} dialect cannot list topics; use --dialect tank, kafka or rustlog",
    "create_topic": "the {} dialect cannot create topics with a partition count; use "
                    "--dialect tank or rustlog",
    "offsets": "the {} dialect cannot tell a partition's log start; use --dialect tank, "
               "kafka or rustlog",
}


def _module(dialect, name):
    return importlib.import_module(f"plugins.{dialect}.{name}")


def now_ms():
    return int(time.time() * 1000)


class Client:
    """One connection to one listener. ``spec`` in ``start`` is
    ``"beginning"``, ``"end"`` or a position of the dialect."""

    name = None
    #: whether the dialect's records carry keys
    keyed = False
    #: the topic administration the dialect has, and why not where it has not
    admin = frozenset()
    cannot = {}

    def __init__(self, reactor, host, port, timeout, scope="gateway"):
        self.reactor = reactor
        self.host = host
        self.port = port
        self.timeout = timeout
        self.scope = scope

    def where(self):
        return f"{self.name} at {self.host}:{self.port}"

    def check_partition(self, partition):
        """Refuse, before connecting, a partition the dialect cannot name."""
        if partition < 0:
            raise Unsupported(f"no partition {partition}: partitions count from 0")

    def require(self, operation):
        """Refuse, before connecting, topic administration (``list_topics``,
        ``create_topic``, ``offsets``) the dialect does not have."""
        if operation not in self.admin:
            raise Unsupported(self.cannot.get(operation)
                              or _CANNOT[operation].format(self.name))


class _KafkaConnection(FramedProtocol):
    """One Kafka connection on the reactor, built on the dialect's pure
    codec: requests are pipelined and their answers matched by correlation
    id. (The project's Kafka client blocks, for processes without a reactor;
    on one, a thread per call would put two thread switches between a write
    and ``consume -f`` printing it.)"""

    header = struct.Struct(">i")
    max_frame_bytes = 256 * 1024 * 1024

    def __init__(self, codec):
        self.codec = codec
        self.waiting = {}
        self.correlation = 0
        self.lost = None

    def connectionMade(self):
        self.transport.setTcpNoDelay(True)

    def request(self, api_key, version, body):
        """Fires with the decoded answer's body."""
        if self.lost is not None:
            return defer.fail(self.lost)
        self.correlation += 1
        d = defer.Deferred()
        self.waiting[self.correlation] = (api_key, version, d)
        self.transport.write(self.codec.encode_request(api_key, version, self.correlation,
                                                       "gateway-cli", body))
        return d

    def frameReceived(self, fields, frame):
        correlation = struct.unpack_from(">i", frame)[0]
        waiting = self.waiting.pop(correlation, None)
        if waiting is None:
            self.transport.abortConnection()
            return
        api_key, version, d = waiting
        try:
            _, body = self.codec.decode_response(api_key, version, frame)
        except self.codec.KafkaDecodeError as e:
            d.errback(CLIError(f"kafka: undecodable answer: {e}"))
            return
        d.callback(body)

    def frameTooLarge(self, fields):
        self.transport.abortConnection()

    def connectionLost(self, reason):
        self.lost = reason
        waiting, self.waiting = self.waiting, {}
        for _, _, d in waiting.values():
            d.errback(reason)


class KafkaCLI(Client):
    name = "kafka"
    keyed = True
    admin = frozenset({"list_topics", "offsets"})
    cannot = {"create_topic": "Kafka 0.8 has no CreateTopics (a produce creates a topic with "
                              "topics.default_partitions); use --dialect tank or rustlog"}

    @defer.inlineCallbacks
    def open(self):
        self.codec = codec = _module("kafka", "codec")
        endpoint = HostnameEndpoint(self.reactor, self.host, self.port, timeout=self.timeout)
        self.conn = yield connectProtocol(endpoint, _KafkaConnection(codec))
        answer = yield self.conn.request(codec.API_VERSIONS, 0, codec.ApiVersionsRequest())
        self._check(answer.error, "ApiVersions")

    def close(self):
        self.conn.transport.loseConnection()
        return defer.succeed(None)

    @staticmethod
    def _check(code, where):
        if code:
            words = _KAFKA_ERRORS.get(code, f"error code {code}")
            raise CLIError(f"kafka: {words} ({where})")

    def _request(self, api_key, version, body):
        return self.conn.request(api_key, version, body)

    @defer.inlineCallbacks
    def _topics(self, names=()):
        """``{topic: (error, [partitions])}``; asking for no names asks for
        every topic, and creates none."""
        codec = self.codec
        answer = yield self._request(codec.METADATA, 0, codec.MetadataRequest(tuple(names)))
        return {name: (error, sorted(p[1] for p in partitions))
                for error, name, partitions in answer.topics}

    @defer.inlineCallbacks
    def produce(self, topic, partition, records):
        """Like a Kafka producer: metadata for the topic first (which
        creates it where the gateway auto-creates topics), then magic-1
        messages, which carry the timestamp."""
        codec = self.codec
        yield self._topics([topic])
        ts = now_ms()
        message_set = codec.encode_message_set([(k, v, ts) for k, v in records], magic=1)
        answer = yield self._request(codec.PRODUCE, 0, codec.ProduceRequest(
            1, int(self.timeout * 1000), ((topic, ((partition, message_set),)),)))
        _, error, base = answer.topics[0][1][0]
        self._check(error, f"{topic}/{partition}")
        return base

    @defer.inlineCallbacks
    def _list_offset(self, topic, partition, spec):
        codec = self.codec
        answer = yield self._request(codec.LIST_OFFSETS, 0, codec.ListOffsetsRequest(
            -1, ((topic, ((partition, spec, 1),)),)))
        _, error, offsets = answer.topics[0][1][0]
        self._check(error, f"{topic}/{partition}")
        return offsets[0]

    def start(self, topic, partition, spec):
        if spec == "beginning":
            return self._list_offset(topic, partition, self.codec.EARLIEST)
        if spec == "end":
            return self.end(topic, partition)
        return defer.succeed(spec)

    def end(self, topic, partition):
        return self._list_offset(topic, partition, self.codec.LATEST)

    @defer.inlineCallbacks
    def read(self, topic, partition, position, wait_ms):
        codec = self.codec
        answer = yield self._request(codec.FETCH, 0, codec.FetchRequest(
            -1, wait_ms, 0, ((topic, ((partition, position, READ_BYTES),)),)))
        _, error, _, data = answer.topics[0][1][0]
        self._check(error, f"{topic}/{partition}")
        records = [(m.offset, m.key, m.value) for m in codec.decode_message_set(data)
                   if m.offset >= position]
        return records, (records[-1][0] + 1 if records else position)

    @defer.inlineCallbacks
    def list_topics(self):
        topics = yield self._topics()
        return sorted((name, len(parts)) for name, (error, parts) in topics.items()
                      if not error)

    @defer.inlineCallbacks
    def _partitions(self, topic):
        """The partitions of an existing topic (asking for every topic, so
        that none is created)."""
        error, partitions = (yield self._topics()).get(topic, (3, []))
        self._check(error, topic)
        return partitions

    @defer.inlineCallbacks
    def offsets(self, topic):
        out = []
        for partition in (yield self._partitions(topic)):
            start = yield self._list_offset(topic, partition, self.codec.EARLIEST)
            end = yield self.end(topic, partition)
            out.append((start, end))
        return out

    # -- consumer groups (only Kafka speaks them on the wire) --------------------------

    @defer.inlineCallbacks
    def list_groups(self):
        """``[(group, protocol_type, state, members)]`` of the groups with
        live members (what ListGroups answers)."""
        codec = self.codec
        listed = yield self._request(codec.LIST_GROUPS, 0, codec.ListGroupsRequest())
        self._check(listed.error, "ListGroups")
        names = sorted(name for name, _ in listed.groups)
        if not names:
            return []
        described = yield self._request(codec.DESCRIBE_GROUPS, 0,
                                        codec.DescribeGroupsRequest(tuple(names)))
        return [(name, protocol_type, state, len(members))
                for _, name, state, protocol_type, _, members in described.groups]

    @defer.inlineCallbacks
    def describe_group(self, group, topics=None):
        """``(state, members, offsets)``: members as ``[(member, client,
        host)]``, offsets as ``[(topic, partition, committed, end,
        metadata)]`` for every partition (of ``topics``, or of every topic)
        the group has committed."""
        codec = self.codec
        described = yield self._request(codec.DESCRIBE_GROUPS, 0,
                                        codec.DescribeGroupsRequest((group,)))
        error, _, state, _, _, members = described.groups[0]
        self._check(error, f"group {group!r}")
        known = yield self._topics()
        wanted = sorted(known) if topics is None else list(topics)
        for topic in wanted:
            self._check(known.get(topic, (3, []))[0], topic)
        fetched = yield self._request(codec.OFFSET_FETCH, 1, codec.OffsetFetchRequest(
            group, tuple((t, tuple(known[t][1])) for t in wanted)))
        offsets = []
        for topic, partitions in fetched.topics:
            for partition, offset, metadata, error in partitions:
                if not error and offset >= 0:
                    end = yield self.end(topic, partition)
                    offsets.append((topic, partition, offset, end, metadata))
        return state, [(m[0], m[1], m[2]) for m in members], sorted(offsets)


class TankCLI(Client):
    name = "tank"
    keyed = True
    admin = frozenset({"list_topics", "create_topic", "offsets"})

    @defer.inlineCallbacks
    def open(self):
        client = _module("tank", "client")
        self.client = yield client.connect(self.reactor, self.host, self.port,
                                           client_id="gateway-cli", timeout=self.timeout)

    def close(self):
        return self.client.close()

    def produce(self, topic, partition, records):
        keys = [key for key, _ in records]
        return self.client.produce(topic, partition, [value for _, value in records],
                                   keys=keys if any(k is not None for k in keys) else None,
                                   timestamps=[now_ms()] * len(records))

    @defer.inlineCallbacks
    def _seqs(self, topic, partition):
        parts = yield self.client.discover_partitions(topic, [partition])
        if not parts:
            raise CLIError(f"tank: unknown topic {topic}")
        return parts[0]

    @defer.inlineCallbacks
    def start(self, topic, partition, spec):
        if spec == "beginning":
            seqs = yield self._seqs(topic, partition)
            return seqs.first_avail or 1
        if spec == "end":
            return (yield self.end(topic, partition))
        return spec

    @defer.inlineCallbacks
    def end(self, topic, partition):
        """The seq after the last one: hwMark + 1."""
        seqs = yield self._seqs(topic, partition)
        return seqs.hw_mark + 1

    @defer.inlineCallbacks
    def read(self, topic, partition, position, wait_ms):
        got = yield self.client.fetch(topic, partition, position, READ_BYTES, wait_ms)
        return [(m.seq, m.key, m.value) for m in got.messages], got.next_seq

    @defer.inlineCallbacks
    def list_topics(self):
        topics = yield self.client.discover_topics()
        return sorted((t.name, t.partitions) for t in topics)

    @defer.inlineCallbacks
    def create_topic(self, topic, partitions):
        codec = _module("tank", "codec")
        code = yield self.client.create_topic(topic, partitions)
        if code == codec.CREATE_EXISTS:
            raise CLIError(f"tank: topic {topic} exists")
        if code == codec.CREATE_INVALID:
            raise CLIError(f"tank: invalid topic name or partition count: {topic}, "
                           f"{partitions}")
        if code != codec.CREATE_OK:
            raise CLIError(f"tank: CreateTopic failed with code {code}")

    @defer.inlineCallbacks
    def offsets(self, topic):
        """TANK's first available seq is the log start + 1 (0 for a
        partition never written) and its hwMark the end offset."""
        parts = yield self.client.discover_partitions(topic)
        if not parts:
            raise CLIError(f"tank: unknown topic {topic}")
        return [(p.first_avail - 1 if p.first_avail else 0, p.hw_mark) for p in parts]


class RustLogCLI(Client):
    """The binary variant, which has topic administration; its records and
    offsets are the JSON variant's."""

    name = "rustlog"
    admin = frozenset({"list_topics", "create_topic", "offsets"})

    @defer.inlineCallbacks
    def open(self):
        client = _module("rustlog", "client")
        self.client = yield client.connect(self.reactor, self.host, self.port, binary=True,
                                           timeout=self.timeout)

    def close(self):
        return self.client.close()

    @defer.inlineCallbacks
    def produce(self, topic, partition, records):
        offsets = yield self.client.produce(topic, partition, [value for _, value in records])
        return offsets[0] if offsets else None

    def start(self, topic, partition, spec):
        if spec == "beginning":
            # a fetch below the log start answers nothing but the log start
            return defer.succeed(0)
        if spec == "end":
            return self.end(topic, partition)
        return defer.succeed(spec)

    def end(self, topic, partition):
        return self.client.describe_partition(topic, partition)

    @defer.inlineCallbacks
    def read(self, topic, partition, position, wait_ms):
        got = yield self.client.fetch(topic, partition, position, READ_BYTES)
        if not got.records and got.next_offset <= position and wait_ms:
            yield task.deferLater(self.reactor, RUSTLOG_POLL_SECONDS, lambda: None)
        return [(o, None, v) for o, v in got.records], max(got.next_offset, position)

    def list_topics(self):
        return self.client.list_topics()

    @defer.inlineCallbacks
    def create_topic(self, topic, partitions):
        if not (yield self.client.create_topic(topic, partitions)):
            raise CLIError(f"rustlog: topic {topic} exists")

    @defer.inlineCallbacks
    def offsets(self, topic):
        """The end from DescribeTopic; the start from a one-byte fetch at 0,
        which answers the first record or, below the log start, nothing but
        the log start."""
        described = yield self.client.describe_topic(topic)
        out = []
        for partition, end in sorted(described.partitions):
            got = yield self.client.fetch(topic, partition, 0, 1)
            out.append((got.records[0][0] if got.records else min(got.next_offset, end), end))
        return out


class FiggCLI(Client):
    """Figg pushes: ``read`` subscribes at the position asked for and hands
    out what has arrived, waiting up to ``wait_ms`` for the first DATA."""

    name = "figg"

    @defer.inlineCallbacks
    def open(self):
        client = _module("figg", "client")
        self.client = client.FiggClient(self.reactor, self.host, self.port,
                                        connect_timeout=self.timeout)
        yield self.client.connect()
        self.subscribed = None      # (topic, next position) of the live subscription
        self.queue = []
        self.arrived = None

    def close(self):
        return self.client.close()

    @defer.inlineCallbacks
    def produce(self, topic, partition, records):
        """Publishes pipeline through the window; ACKs are cumulative, so
        the last one's acknowledges them all."""
        for _, value in records[:-1]:
            yield self.client.publish(topic, value)
        yield self.client.publish_blocking(topic, records[-1][1])

    def check_partition(self, partition):
        if partition != 0:
            raise Unsupported("Figg topics have one partition, 0")

    def start(self, topic, partition, spec):
        if spec == "beginning":
            # an ATTACH below the log start is clamped up to it
            return defer.succeed(0)
        if spec == "end":
            return self.end(topic, partition)
        return defer.succeed(spec)

    @defer.inlineCallbacks
    def end(self, topic, partition):
        """ATTACHED to the latest message carries the next offset."""
        offset = yield self.client.subscribe(topic, lambda message: None)
        yield self.client.unsubscribe(topic)
        self.subscribed = None
        return offset

    def _received(self, message):
        self.queue.append(message)
        arrived, self.arrived = self.arrived, None
        if arrived is not None and not arrived.called:
            arrived.callback(None)

    @defer.inlineCallbacks
    def read(self, topic, partition, position, wait_ms):
        if self.subscribed != (topic, position):
            self.queue = []
            yield self.client.subscribe(topic, self._received, offset=position)
        if not self.queue and wait_ms:
            self.arrived = defer.Deferred()
            timer = self.reactor.callLater(wait_ms / 1000.0, self._received_nothing)
            yield self.arrived
            if timer.active():
                timer.cancel()
        got, self.queue = self.queue, []
        if got:
            position = got[-1].offset
        self.subscribed = (topic, position)
        return [(m.offset, None, m.data) for m in got], position

    def _received_nothing(self):
        arrived, self.arrived = self.arrived, None
        if arrived is not None:
            arrived.callback(None)


class PravegaCLI(Client):
    name = "pravega"

    @defer.inlineCallbacks
    def open(self):
        self.client = _module("pravega", "client")
        self.codec = _module("pravega", "codec")
        self.proto = yield self.client.connect(self.reactor, self.host, self.port,
                                               timeout=self.timeout)
        self.reader = None

    def close(self):
        return self.proto.close()

    def segment(self, topic, partition):
        """The scoped segment name, with the topic escaped as Pravega needs."""
        return self.codec.segment_name(self.scope, topic, partition)

    def produce(self, topic, partition, records):
        """One EventWriter per batch: its events are durable once flushed."""
        writer = self.client.EventWriter(
            self.reactor, lambda: self.client.connect(self.reactor, self.host, self.port,
                                                      timeout=self.timeout),
            self.segment(topic, partition), give_up_after=3)
        for _, value in records:
            writer.write(value)
        return writer.flush().addBoth(lambda result: writer.close().addBoth(lambda _: result))

    @defer.inlineCallbacks
    def info(self, topic, partition):
        return (yield self.proto.segment_info(self.segment(topic, partition)))

    @defer.inlineCallbacks
    def start(self, topic, partition, spec):
        if spec == "beginning":
            return (yield self.info(topic, partition)).start_offset
        if spec == "end":
            return (yield self.end(topic, partition))
        return spec

    @defer.inlineCallbacks
    def end(self, topic, partition):
        return (yield self.info(topic, partition)).write_offset

    @defer.inlineCallbacks
    def read(self, topic, partition, position, wait_ms):
        """Events from ``position`` (an event boundary); at the tail the
        gateway parks the read until a write."""
        segment = self.segment(topic, partition)
        reader = self.reader
        if reader is None or reader.segment != segment or reader.position != position:
            reader = self.reader = self.client.EventReader(self.proto, segment, position)
        events = yield reader.read()
        return [(p, None, v) for p, v in events], reader.position

    @defer.inlineCallbacks
    def positions(self, topic, partitions):
        """``[(start, end)]`` byte positions of each partition's segment."""
        out = []
        for partition in range(partitions):
            info = yield self.info(topic, partition)
            out.append((info.start_offset, info.write_offset))
        return out


CLIENTS = {cls.name: cls for cls in (KafkaCLI, TankCLI, RustLogCLI, FiggCLI, PravegaCLI)}


def make_client(reactor, dialect, address, timeout, scope="gateway"):
    host, port = parse_address(address, dialect)
    return CLIENTS[dialect](reactor, host, port, timeout, scope)


def session(reactor, client, work):
    """Connect ``client`` (within its timeout), run ``work()``, and close
    the client whatever happens; fires with ``work``'s result.

    Closing is chained with ``addBoth`` rather than written in a ``finally``
    of the caller's generator: a command interrupted by Ctrl-C leaves its
    generator suspended, and Python must be able to discard it."""
    def close(result):
        return client.close().addBoth(lambda _: result)

    d = client.open().addTimeout(client.timeout, reactor)
    d.addCallback(lambda _: defer.maybeDeferred(work).addBoth(close))
    return d
