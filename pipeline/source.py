"""The ``gateway`` Spark data source: gateway topics as DataFrames, batch
and streaming, read and write (PySpark's Python Data Source API).

Every network call goes through the blocking Kafka client
(``plugins.kafka.client``) to the gateway's Kafka listener named by the
``endpoint`` option: Spark's Python workers cannot run a reactor, and any
executor that can reach the listener can read and write, on this machine
or another. Planning (Metadata, ListOffsets) runs on the driver; each task
opens its own connection.

Reads use Fetch v2, whose magic-1 messages carry the records' timestamps
(the gateway answers it without advertising it; see ``plugins.kafka.codec``),
so that keys and timestamps survive whichever dialect wrote the records.
A planned range [start, end) is read exactly: offsets are fixed when the
batch or micro-batch is planned, a task stops at ``end`` however much more
arrives meanwhile, and a gap (records removed by retention while a query
ran) is an error, never a silent skip.

Writes produce each task's rows with acks=-1 and wait for every answer
before the task reports success: a task that succeeds has its records in
the log, durable under the gateway's fsync policy. A task Spark retries
produces its rows again, so writes are at-least-once; exactly-once output
needs an idempotent sink downstream (a file sink, as in the tests).
"""
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from pipeline.arrow import encode_rows, fetched_batch
from pipeline.options import (
    OptionError,
    ReadOptions,
    WriteOptions,
    cap_offsets,
    check_named_partitions,
    resolve,
    split_ranges,
)
from plugins.kafka import codec as kc
from plugins.kafka.client import KafkaClient, KafkaError

__all__ = ["SCHEMA", "GatewayDataSource", "GatewaySplit", "register"]

SCHEMA = StructType([
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
])

#: bytes asked for per Fetch: large enough that a fetch's fixed costs
#: vanish, small enough to be one Arrow batch of a sensible size (~30,000
#: records of 100 B)
FETCH_MAX_BYTES = 4 * 1024 * 1024
#: value bytes per Produce request of a writer
PRODUCE_MAX_BYTES = 1024 * 1024
CLIENT_ID = "spark-gateway"

#: what a writer accepts per column: Spark types, and what is wanted of them
_WRITE_COLUMNS = {
    "value": ((BinaryType, StringType), "binary or string, required"),
    "key": ((BinaryType, StringType), "binary or string"),
    "topic": ((StringType,), "string"),
    "partition": ((ByteType, ShortType, IntegerType, LongType), "an integer"),
    "timestamp": ((TimestampType, TimestampNTZType), "a timestamp"),
    # A DataFrame read from the gateway can be written back as it is: the
    # log assigns new offsets.
    "offset": ((LongType, IntegerType), "ignored: the log assigns offsets"),
}


def register(spark):
    """Make ``spark.read.format("gateway")`` (and writes, and streams)
    available in this session."""
    spark.dataSource.register(GatewayDataSource)


def _client(endpoint):
    host, port = endpoint
    return KafkaClient(host, port, client_id=CLIENT_ID)


def _explain(error, what):
    """A Kafka error from the gateway, in words."""
    words = {
        kc.UNKNOWN_TOPIC_OR_PARTITION: "unknown topic or partition",
        kc.OFFSET_OUT_OF_RANGE: "offset out of range (outside the log)",
        kc.MESSAGE_SIZE_TOO_LARGE: "a record is larger than the gateway's "
                                   "limits.max_record_bytes",
        kc.INVALID_TOPIC: "invalid topic name (1 to 200 characters of [A-Za-z0-9._-], "
                          "not . or ..)",
        kc.TOPIC_AUTHORIZATION_FAILED: "not authorised by the listener's access rules",
    }.get(error.code, f"Kafka error {error.code}")
    return f"{what}: {words}"


class GatewaySplit(InputPartition):
    """Offsets [start, end) of one partition: one Spark task's read."""

    def __init__(self, topic, partition, start, end):
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end


def _read_split(endpoint, split):
    """Yield Arrow batches of exactly the records [start, end) of a split."""
    if not isinstance(split, GatewaySplit):
        # Spark hands a reader with nothing to read one empty partition.
        return
    topic, partition, offset, end = split.topic, split.partition, split.start, split.end
    with _client(endpoint) as client:
        while offset < end:
            try:
                high_watermark, data = client.fetch_sets(
                    [(topic, partition, offset, FETCH_MAX_BYTES)], version=2)[(topic, partition)]
            except KafkaError as e:
                raise RuntimeError(_explain(e, f"reading {topic}/{partition} at {offset}")) \
                    from None
            batch, following = fetched_batch(data, topic, partition, offset, end)
            if following == offset:
                raise RuntimeError(
                    f"{topic}/{partition}: no record at offset {offset} although the planned "
                    f"range ends at {end} (high watermark {high_watermark})")
            offset = following
            yield batch


class _Planner:
    """Driver-side questions to the gateway: which partitions the selected
    topics have, and where their logs start and end."""

    def __init__(self, options):
        self.options = options

    def partitions(self, client, must_exist):
        """``{topic: [partition, ...]}`` of the selected topics. A named topic
        that does not exist is an error for a batch read (``must_exist``)
        and not yet there for a stream, which picks it up once it is
        created. Never creates a topic: a read asks for the whole topic list."""
        _, topics = client.metadata()
        existing = {name for name, meta in topics.items() if not meta.error}
        chosen, missing = self.options.topics.select(existing)
        if missing and must_exist:
            raise OptionError(f"topics: {', '.join(missing)} "
                              f"{'does' if len(missing) == 1 else 'do'} not exist")
        return {topic: sorted(topics[topic].partitions) for topic in chosen}

    @staticmethod
    def bounds(client, partitions):
        """``{(topic, partition): (log start, high watermark)}``."""
        try:
            return {(t, p): (client.list_offset(t, p, kc.EARLIEST),
                             client.list_offset(t, p, kc.LATEST))
                    for t, parts in partitions.items() for p in parts}
        except KafkaError as e:
            raise RuntimeError(_explain(e, "listing offsets")) from None


class GatewayBatchReader(DataSourceReader):
    """A batch read: ranges fixed once, at planning, from the options."""

    def __init__(self, options):
        self.options = options

    def partitions(self):
        options = self.options
        planner = _Planner(options)
        with _client(options.endpoint) as client:
            partitions = planner.partitions(client, must_exist=True)
            bounds = planner.bounds(client, partitions)
        for name, spec in (("startingOffsets", options.starting),
                           ("endingOffsets", options.ending)):
            check_named_partitions(spec, partitions, name)
        ranges = []
        for (topic, partition), (earliest, latest) in bounds.items():
            start = resolve(options.starting, topic, partition, earliest, latest,
                            "startingOffsets")
            end = resolve(options.ending, topic, partition, earliest, latest, "endingOffsets")
            if end < start:
                raise OptionError(f"endingOffsets: {topic}/{partition} ends at {end}, before "
                                  f"its starting offset {start}")
            ranges.append((topic, partition, start, end))
        return [GatewaySplit(*r) for r in split_ranges(ranges, options.max_records_per_split)]

    def read(self, partition):
        return _read_split(self.options.endpoint, partition)


def _offsets(pairs):
    """``{(topic, partition): offset}`` -> ``{topic: {"partition": offset}}``."""
    doc = {}
    for (topic, partition), offset in sorted(pairs.items()):
        doc.setdefault(topic, {})[str(partition)] = offset
    return doc


class GatewayStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A stream: offsets ``{topic: {partition: offset}}`` (the next offset
    to read per partition), the latest ones from the gateway's high
    watermarks. Spark checkpoints the offsets of each micro-batch before
    running it and plans a restarted batch from the checkpoint, and a
    range always reads the same records, so a restarted query reads every
    record exactly once into an idempotent sink.

    Topics and partitions that appear while the stream runs (a pattern's
    new topic, a grown topic) are read from their log start.
    """

    def __init__(self, options):
        self.options = options
        #: set by ``prepareForTriggerAvailableNow``: the high watermarks the
        #: query stops at
        self.ceiling = None

    def _latest(self):
        planner = _Planner(self.options)
        with _client(self.options.endpoint) as client:
            return planner.bounds(client, planner.partitions(client, must_exist=False))

    def initialOffset(self):
        options = self.options
        bounds = self._latest()
        partitions = {}
        for topic, partition in bounds:
            partitions.setdefault(topic, []).append(partition)
        check_named_partitions(options.starting, partitions, "startingOffsets")
        return _offsets({(t, p): resolve(options.starting, t, p, earliest, latest,
                                         "startingOffsets")
                         for (t, p), (earliest, latest) in bounds.items()})

    def getDefaultReadLimit(self):
        limit = self.options.max_records_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self):
        self.ceiling = {tp: latest for tp, (_, latest) in self._latest().items()}

    def latestOffset(self, start, limit):
        bounds = self._latest()
        begin = {}
        latest = {}
        for (topic, partition), (earliest, high_watermark) in bounds.items():
            known = start.get(topic, {}).get(str(partition))
            first = earliest if known is None else known
            if high_watermark < first:
                raise RuntimeError(
                    f"{topic}/{partition}: the log ends at {high_watermark}, before offset "
                    f"{first} this query has reached (was the topic deleted and created "
                    f"again?)")
            if self.ceiling is not None:
                high_watermark = max(first, min(high_watermark,
                                                self.ceiling.get((topic, partition), first)))
            begin.setdefault(topic, {})[str(partition)] = first
            latest.setdefault(topic, {})[str(partition)] = high_watermark
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = cap_offsets(begin, latest, cap)
        # Partitions the query knew and the gateway no longer lists (a
        # deleted topic) keep their last offset, so offsets never go back.
        for topic, parts in start.items():
            for partition, offset in parts.items():
                end.setdefault(topic, {}).setdefault(partition, offset)
        return end

    def partitions(self, start, end):
        new = {}
        for topic, parts in end.items():
            for partition in parts:
                if partition not in start.get(topic, {}):
                    new.setdefault(topic, []).append(int(partition))
        bounds = {}
        if new:
            with _client(self.options.endpoint) as client:
                bounds = _Planner.bounds(client, new)
        ranges = []
        for topic, parts in sorted(end.items()):
            for partition, stop in sorted(parts.items(), key=lambda item: int(item[0])):
                begin = start.get(topic, {}).get(partition)
                if begin is None:
                    # New since the last micro-batch: from its log start.
                    begin = min(bounds[(topic, int(partition))][0], stop)
                ranges.append((topic, int(partition), begin, stop))
        return [GatewaySplit(*r)
                for r in split_ranges(ranges, self.options.max_records_per_split)]

    def read(self, partition):
        return _read_split(self.options.endpoint, partition)


class WriteSummary(WriterCommitMessage):
    """A task's answer to the driver (Spark requires one): the ranges its
    produces were acknowledged at, ``{(topic, partition): [(base offset,
    count), ...]}``."""

    def __init__(self, written):
        self.written = written


class _Writer:
    """The write path shared by batch and streaming writes."""

    def __init__(self, options):
        self.options = options

    def write(self, iterator):
        context = TaskContext.get()
        task = context.partitionId() if context is not None else 0
        counts = {}
        written = {}
        with _client(self.options.endpoint) as client:

            def partitions_of(topic):
                count = counts.get(topic)
                if count is None:
                    try:
                        count = counts[topic] = len(client.partitions(topic))
                    except KafkaError as e:
                        raise OptionError(_explain(e, f"topic {topic!r}")) from None
                return count

            rows = 0
            for batch in iterator:
                groups = encode_rows(batch, rows, self.options.topic, partitions_of, task)
                rows += batch.num_rows
                for (topic, partition), records in groups.items():
                    magic = 1 if len(records[0]) == 3 else 0
                    for chunk in _chunks(records):
                        try:
                            base = client.produce_encoded(
                                topic, partition, kc.encode_message_set(chunk, magic), acks=-1)
                        except KafkaError as e:
                            raise RuntimeError(_explain(
                                e, f"producing {len(chunk)} records to {topic}/{partition}")) \
                                from None
                        written.setdefault((topic, partition), []).append(
                            (base, len(chunk)))
        # Every produce above was answered: the rows are in the log.
        return WriteSummary(written)


def _chunks(records):
    """Consecutive runs of records of at most PRODUCE_MAX_BYTES of values
    (at least one record each)."""
    chunk = []
    size = 0
    for record in records:
        if chunk and size + len(record[1]) > PRODUCE_MAX_BYTES:
            yield chunk
            chunk = []
            size = 0
        chunk.append(record)
        size += len(record[1])
    if chunk:
        yield chunk


class GatewayWriter(_Writer, DataSourceArrowWriter):
    """``df.write.format("gateway")``: every task produces its rows."""


class GatewayStreamWriter(_Writer, DataSourceStreamArrowWriter):
    """``df.writeStream.format("gateway")``: every micro-batch's tasks
    produce their rows; a batch Spark runs again is produced again."""


def _check_write_schema(schema):
    names = [field.name for field in schema.fields]
    if "value" not in names:
        raise OptionError(f"the DataFrame needs a 'value' column (binary or string); it has "
                          f"{', '.join(names) or 'none'}")
    for field in schema.fields:
        accepted = _WRITE_COLUMNS.get(field.name)
        if accepted is None:
            raise OptionError(f"column {field.name!r}: the gateway writer takes "
                              f"{', '.join(_WRITE_COLUMNS)} only")
        types, wanted = accepted
        if not isinstance(field.dataType, types):
            raise OptionError(f"column {field.name!r} is {field.dataType.simpleString()}; "
                              f"it must be {wanted}")


class GatewayDataSource(DataSource):
    """Short name ``gateway``. Options: ``endpoint`` (the gateway's Kafka
    listener, ``host:port``, default 127.0.0.1:9092); for reads ``topics``
    (names or glob patterns, comma-separated), ``startingOffsets`` /
    ``endingOffsets`` (earliest, latest, or JSON ``{"topic": {"0": 42}}``
    with -2 earliest, -1 latest), ``maxRecordsPerSplit``,
    ``maxRecordsPerTrigger`` (streams); for writes ``topic`` (for rows
    without a topic column or with a null topic)."""

    @classmethod
    def name(cls):
        return "gateway"

    def schema(self):
        return SCHEMA

    def _read_options(self, schema, streaming):
        if schema != SCHEMA:
            raise OptionError(f"the gateway source has a fixed schema ({SCHEMA.simpleString()}); "
                              f"drop .schema(...)")
        return ReadOptions.parse(self.options, streaming)

    def reader(self, schema):
        return GatewayBatchReader(self._read_options(schema, streaming=False))

    def streamReader(self, schema):
        return GatewayStreamReader(self._read_options(schema, streaming=True))

    def writer(self, schema, overwrite):
        return GatewayWriter(self._write_options(schema, overwrite))

    def streamWriter(self, schema, overwrite):
        return GatewayStreamWriter(self._write_options(schema, overwrite))

    def _write_options(self, schema, overwrite):
        if overwrite:
            raise OptionError("a gateway topic is an append-only log: write with "
                              "mode('append'), not overwrite")
        _check_write_schema(schema)
        options = WriteOptions.parse(self.options)
        if "topic" not in schema.fieldNames() and options.topic is None:
            raise OptionError("no topic: set the 'topic' option or give the DataFrame a "
                              "'topic' column")
        return options
