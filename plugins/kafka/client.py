"""A blocking Kafka 0.8.2 client built on ``plugins.kafka.codec``.

Made for processes that cannot run a reactor: Spark executors (the data
source in ``pipeline/`` plans with ``metadata`` and ``list_offset``, reads
with ``fetch_sets`` at Fetch v2, whose magic-1 messages carry timestamps,
and writes with ``produce_encoded``), scripts, benchmarks and tests that
need a second, independent encoder. It speaks to one broker
address (the gateway advertises itself as the only broker) over one
socket, one request at a time, with plain ``socket`` calls and a timeout
on each.

Errors: a Kafka error code in an answer raises ``KafkaError`` (``code``,
``retriable``); a broken or closed connection raises
``KafkaConnectionError`` and closes the socket, and the next call
connects again. Reads (metadata, offsets, fetch, committed offsets) are
retried once on a fresh connection after a connection error, since
repeating them is harmless; a produce or a commit is never repeated
behind the caller's back (it may have been applied).
"""
import socket
import struct
from collections import namedtuple

from plugins.kafka import codec as kc

__all__ = ["KafkaClient", "KafkaError", "KafkaConnectionError", "FetchResult", "Message",
           "TopicMetadata"]

Message = kc.Message

#: the codes a client may retry after a while (0.9's list, for what this
#: gateway sends)
RETRIABLE = frozenset({kc.CORRUPT_MESSAGE, kc.UNKNOWN_TOPIC_OR_PARTITION,
                       kc.GROUP_COORDINATOR_NOT_AVAILABLE, kc.REBALANCE_IN_PROGRESS})

_SIZE = struct.Struct(">i")


class KafkaError(Exception):
    """The broker answered with an error code."""

    def __init__(self, code, where=""):
        super().__init__(f"Kafka error {code}" + (f" ({where})" if where else ""))
        self.code = code
        self.retriable = code in RETRIABLE


class KafkaConnectionError(Exception):
    """The connection failed, closed, or answered out of turn."""


FetchResult = namedtuple("FetchResult", "high_watermark messages")
FetchResult.__doc__ = """One partition's fetch: ``messages`` (``Message(offset, timestamp,
key, value)``, from the requested offset on) and the high watermark (the
next offset to be assigned)."""

TopicMetadata = namedtuple("TopicMetadata", "error partitions")


class KafkaClient:
    """One connection to ``host:port``. Use as a context manager, or call
    ``close()``. ``timeout`` (seconds) bounds connecting and each answer;
    a fetch's own ``max_wait_ms`` is added to it."""

    def __init__(self, host, port, client_id="gateway-kafka-client", timeout=30.0,
                 max_response_bytes=256 * 1024 * 1024):
        self.host = host
        self.port = port
        self.client_id = client_id
        self.timeout = timeout
        self.max_response_bytes = max_response_bytes
        self._sock = None
        self._correlation = 0
        #: topics whose metadata this client asked for before producing
        self._announced = set()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    # -- the wire ----------------------------------------------------------------------

    def _connect(self):
        if self._sock is None:
            try:
                sock = socket.create_connection((self.host, self.port), self.timeout)
            except OSError as e:
                raise KafkaConnectionError(f"cannot connect to {self.host}:{self.port}: {e}") \
                    from None
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock = sock
        return self._sock

    def request(self, api_key, api_version, body, wait_ms=0, expect_response=True):
        """Send one request; return the decoded response body (None when
        ``expect_response`` is false: a produce with acks=0)."""
        self._correlation = (self._correlation + 1) & 0x7FFFFFFF
        correlation = self._correlation
        frame = kc.encode_request(api_key, api_version, correlation, self.client_id, body)
        sock = self._connect()
        try:
            sock.settimeout(self.timeout + wait_ms / 1000.0)
            sock.sendall(frame)
            if not expect_response:
                return None
            size = _SIZE.unpack(self._read(sock, 4))[0]
            if not 4 <= size <= self.max_response_bytes:
                raise KafkaConnectionError(f"answer of {size} bytes")
            answer = self._read(sock, size)
            got, body = kc.decode_response(api_key, api_version, answer)
        except (OSError, kc.KafkaDecodeError, KafkaConnectionError) as e:
            self.close()
            if isinstance(e, KafkaConnectionError):
                raise
            raise KafkaConnectionError(f"{self.host}:{self.port}: {e}") from None
        if got != correlation:
            self.close()
            raise KafkaConnectionError(f"answer for correlation id {got}, "
                                       f"expected {correlation}")
        return body

    @staticmethod
    def _read(sock, n):
        view = memoryview(bytearray(n))
        got = 0
        while got < n:
            chunk = sock.recv_into(view[got:], n - got)
            if not chunk:
                raise KafkaConnectionError("connection closed by the broker")
            got += chunk
        return view.obj

    def _read_request(self, api_key, api_version, body, wait_ms=0):
        """A request that is safe to repeat: retried once on a new
        connection if the first one breaks."""
        try:
            return self.request(api_key, api_version, body, wait_ms)
        except KafkaConnectionError:
            return self.request(api_key, api_version, body, wait_ms)

    # -- planning ----------------------------------------------------------------------------

    def metadata(self, topics=None):
        """``(brokers, {topic: TopicMetadata(error, partitions)})``; ``topics``
        None asks for every topic (and creates none). Named topics that do
        not exist are created if the gateway auto-creates topics."""
        body = self._read_request(kc.METADATA, 0, kc.MetadataRequest(tuple(topics or ())))
        return (list(body.brokers),
                {name: TopicMetadata(error, tuple(p[1] for p in partitions))
                 for error, name, partitions in body.topics})

    def partitions(self, topic):
        """The partition ids of ``topic``; KafkaError if it cannot be had."""
        error, partitions = self.metadata([topic])[1][topic]
        if error:
            raise KafkaError(error, topic)
        return partitions

    def list_offset(self, topic, partition, spec=kc.LATEST):
        """``spec``: ``codec.LATEST`` (-1: the high watermark), ``codec.EARLIEST``
        (-2: the log start), or a timestamp in ms (the first offset at or
        after it)."""
        body = self._read_request(kc.LIST_OFFSETS, 0, kc.ListOffsetsRequest(
            -1, ((topic, ((partition, spec, 1),)),)))
        _, error, offsets = body.topics[0][1][0]
        if error:
            raise KafkaError(error, f"{topic}/{partition}")
        return offsets[0]

    # -- reading ------------------------------------------------------------------------------

    def fetch_sets(self, wanted, max_wait_ms=0, min_bytes=0, version=0):
        """Fetch several partitions at once, without decoding: ``wanted`` is
        ``[(topic, partition, offset, max_bytes)]``; returns ``{(topic,
        partition): (high_watermark, message_set)}`` with the message set's
        bytes as answered, for callers that decode into a shape of their
        own (the Spark data source builds Arrow columns). ``version`` 2 asks
        for magic-1 messages, which carry timestamps. A partition's error
        raises KafkaError."""
        topics = {}
        for topic, partition, offset, max_bytes in wanted:
            topics.setdefault(topic, []).append((partition, offset, max_bytes))
        body = self._read_request(kc.FETCH, version, kc.FetchRequest(
            -1, max_wait_ms, min_bytes,
            tuple((name, tuple(parts)) for name, parts in topics.items())), max_wait_ms)
        results = {}
        for name, partitions in body.topics:
            for partition, error, high_watermark, data in partitions:
                if error:
                    raise KafkaError(error, f"{name}/{partition}")
                results[(name, partition)] = (high_watermark, data)
        return results

    def fetch_many(self, wanted, max_wait_ms=0, min_bytes=0, version=0):
        """Fetch several partitions at once: ``wanted`` is ``[(topic,
        partition, offset, max_bytes)]``; returns ``{(topic, partition):
        FetchResult}``. A partition's error raises KafkaError."""
        starts = {(t, p): o for t, p, o, _ in wanted}
        results = {}
        for (name, partition), (high_watermark, data) in self.fetch_sets(
                wanted, max_wait_ms, min_bytes, version).items():
            try:
                messages = kc.decode_message_set(data)
            except kc.CorruptMessage as e:
                raise KafkaError(kc.CORRUPT_MESSAGE, f"{name}/{partition}: {e}") from None
            start = starts[(name, partition)]
            results[(name, partition)] = FetchResult(
                high_watermark, [m for m in messages if m.offset >= start])
        return results

    def fetch(self, topic, partition, offset, max_bytes=1048576, max_wait_ms=0, min_bytes=0,
              version=0):
        """One partition's messages from ``offset``: a ``FetchResult``
        (``version`` 2: with timestamps)."""
        return self.fetch_many([(topic, partition, offset, max_bytes)], max_wait_ms,
                               min_bytes, version)[(topic, partition)]

    def read(self, topic, partition, start, stop=None, max_bytes=1048576, version=0):
        """Yield the messages at offsets ``start`` .. ``stop`` - 1 (``stop``
        None: up to the high watermark seen by the first fetch), fetching
        as it goes (``version`` 2: with timestamps). This is what a reader
        of a planned offset range needs."""
        offset = start
        while stop is None or offset < stop:
            result = self.fetch(topic, partition, offset, max_bytes, version=version)
            if stop is None:
                stop = result.high_watermark
            for message in result.messages:
                if message.offset >= stop:
                    return
                yield message
                offset = message.offset + 1
            if not result.messages:
                return

    # -- writing ----------------------------------------------------------------------------------

    def produce(self, topic, partition, records, acks=1, codec=kc.CODEC_NONE, magic=0,
                version=0, timeout_ms=10000):
        """Append ``records`` (``(key, value)`` or ``(key, value,
        timestamp)``; timestamps travel with ``magic=1`` only) as one message
        set; returns the offset of the first (None with ``acks=0``)."""
        return self.produce_encoded(topic, partition,
                                    kc.encode_message_set(records, magic, codec),
                                    acks, version, timeout_ms)

    def produce_encoded(self, topic, partition, message_set, acks=1, version=0,
                        timeout_ms=10000):
        """``produce`` with a message set encoded in advance. Like a Kafka
        producer, the first produce to a topic asks for its metadata first,
        which creates the topic where the gateway auto-creates topics."""
        if topic not in self._announced:
            self.metadata([topic])
            self._announced.add(topic)
        body = self.request(kc.PRODUCE, version, kc.ProduceRequest(
            acks, timeout_ms, ((topic, ((partition, message_set),)),)),
            expect_response=acks != 0)
        if body is None:
            return None
        _, error, base_offset = body.topics[0][1][0]
        if error:
            raise KafkaError(error, f"{topic}/{partition}")
        return base_offset

    # -- committed offsets --------------------------------------------------------------------------

    def commit(self, group, topic, partition, offset, metadata=""):
        """Commit ``offset`` (the next one to read) for ``group``, as a
        client outside group membership does (OffsetCommit v1, generation -1)."""
        body = self.request(kc.OFFSET_COMMIT, 1, kc.OffsetCommitRequest(
            group, ((topic, ((partition, offset, -1, metadata),)),), -1, ""))
        error = body.topics[0][1][0][1]
        if error:
            raise KafkaError(error, f"{group} {topic}/{partition}")

    def committed(self, group, topic, partition):
        """``(offset, metadata)`` committed by ``group``, or None."""
        body = self._read_request(kc.OFFSET_FETCH, 1, kc.OffsetFetchRequest(
            group, ((topic, (partition,)),)))
        _, offset, metadata, error = body.topics[0][1][0]
        if error:
            raise KafkaError(error, f"{group} {topic}/{partition}")
        return None if offset < 0 else (offset, metadata)

    def api_versions(self):
        """``{api_key: (min, max)}`` as the broker advertises them."""
        body = self._read_request(kc.API_VERSIONS, 0, kc.ApiVersionsRequest())
        if body.error:
            raise KafkaError(body.error, "ApiVersions")
        return {key: (low, high) for key, low, high in body.api_versions}
