"""The ``gateway`` data source in a real Spark (local[2]) against a real
gateway subprocess on port 0: Spark's Python workers are other processes,
which reach the gateway over TCP like executors on other machines would.

One SparkSession serves the whole module (starting the JVM is most of the
cost); every test uses topics of its own.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from plugins.kafka.client import KafkaClient
from tests.support import GatewayProcess
from tests.test_spark_units import rustlog_create, rustlog_fetch, rustlog_produce

pytestmark = pytest.mark.spark

CONFIG = """storage: {path: ./data, fsync: never}
listeners:
  - {dialect: kafka, endpoint: "tcp:0:interface=127.0.0.1"}
  - {dialect: rustlog, endpoint: "tcp:0:interface=127.0.0.1"}
  - {dialect: tank, endpoint: "tcp:0:interface=127.0.0.1"}
  - {dialect: figg, endpoint: "tcp:0:interface=127.0.0.1"}
"""


def _require_java():
    """Spark needs Java 17 or later; say so plainly rather than let py4j fail."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        pytest.fail("the Spark tests need Java 17: no java on PATH or in JAVA_HOME "
                    "(install e.g. openjdk-17-jre-headless)", pytrace=False)
    out = subprocess.run([java, "-version"], capture_output=True, text=True,
                         check=False).stderr
    found = re.search(r'version "(\d+)', out)
    if not found or int(found.group(1)) < 17:
        pytest.fail(f"the Spark tests need Java 17 or later; {java} says: "
                    f"{out.strip().splitlines()[0] if out.strip() else 'nothing'}",
                    pytrace=False)


@pytest.fixture(scope="session")
def spark():
    _require_java()
    # Spark's Python workers must be this virtualenv's interpreter, which
    # imports the pipeline package and the dialect clients.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import pipeline
    session = (SparkSession.builder.master("local[2]").appName("gateway-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.memory", "1g")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    pipeline.register(session)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def gateway():
    directory = tempfile.mkdtemp(prefix="gw-spark-")
    process = GatewayProcess(directory, CONFIG)
    ports = process.start()
    ports["endpoint"] = f"127.0.0.1:{ports['kafka']}"
    ports["directory"] = directory
    yield ports
    process.stop()
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def scratch():
    directory = tempfile.mkdtemp(prefix="gw-spark-out-")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def read(spark, gateway, topics, **options):
    reader = spark.read.format("gateway").option("endpoint", gateway["endpoint"]) \
        .option("topics", topics)
    for name, value in options.items():
        reader = reader.option(name, value if isinstance(value, str) else json.dumps(value))
    return reader.load()


def rows(df):
    """(partition, offset, timestamp ms, key, value) per record, in log order."""
    from pyspark.sql import functions as F
    return [tuple(r) for r in df.select(
        "partition", "offset", F.unix_millis("timestamp"), "key", "value")
        .orderBy("partition", "offset").collect()]


def cli(*args, stdin=None):
    """Run a dialect's command line (``python -m plugins.tank ...``)."""
    done = subprocess.run([sys.executable, "-m", *args], input=stdin, capture_output=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


def now_ms():
    return int(time.time() * 1000)


def test_batch_read_of_records_written_by_several_dialects(spark, gateway):
    kafka = KafkaClient("127.0.0.1", gateway["kafka"])
    before = now_ms()
    with kafka:
        assert kafka.produce("mixed", 0, [(b"k0", b"kafka-0", 1700000000000),
                                          (None, b"kafka-1", 1700000000001)], magic=1) == 0
    assert rustlog_produce(gateway["rustlog"], "mixed", [b"rustlog-2", b"rustlog-3"]) == [2, 3]
    cli("plugins.tank", "--port", str(gateway["tank"]), "produce", "mixed", "tank-4")
    cli("plugins.figg", "publish", "mixed", "--port", str(gateway["figg"]), stdin=b"figg-5\n")
    with kafka:
        assert kafka.produce("mixed", 0, [(b"k6", b"kafka-6")]) == 6
    after = now_ms()

    got = rows(read(spark, gateway, "mixed"))
    assert [(p, o, k, v) for p, o, _, k, v in got] == [
        (0, 0, b"k0", b"kafka-0"), (0, 1, None, b"kafka-1"), (0, 2, None, b"rustlog-2"),
        (0, 3, None, b"rustlog-3"), (0, 4, None, b"tank-4"), (0, 5, None, b"figg-5"),
        (0, 6, b"k6", b"kafka-6")]
    # Kafka's magic-1 timestamps survive; the others carry their receive time
    # (TANK's CLI stamps its own clock, as TANK producers do).
    assert [t for _, _, t, _, _ in got[:2]] == [1700000000000, 1700000000001]
    assert all(before <= t <= after for _, _, t, _, _ in got[2:])

    middle = read(spark, gateway, "mixed", startingOffsets={"mixed": {"0": 2}},
                  endingOffsets={"mixed": {"0": 5}})
    assert [o for _, o, _, _, _ in rows(middle)] == [2, 3, 4]


def test_splits_read_exact_ranges_fixed_at_planning(spark, gateway):
    from pyspark.sql import functions as F
    rustlog_create(gateway["rustlog"], "split3", 3)
    with KafkaClient("127.0.0.1", gateway["kafka"]) as kafka:
        kafka.produce("split3", 1, [(None, b"p1-%d" % i) for i in range(10)])
        for start in range(0, 25, 5):     # several stored batches
            kafka.produce("split3", 2, [(None, b"p2-%d" % i) for i in range(start, start + 5)])

    df = read(spark, gateway, "split3", maxRecordsPerSplit="4")
    per_split = {}
    for r in df.select(F.spark_partition_id().alias("split"), "partition", "offset",
                       "value").collect():
        per_split.setdefault(r["split"], []).append((r["partition"], r["offset"], r["value"]))
    # Partition 0 is empty (no split); 10 records make 3 splits, 25 make 7.
    assert len(per_split) == 10
    for records in per_split.values():
        assert len(records) <= 4
        assert len({p for p, _, _ in records}) == 1
        offsets = sorted(o for _, o, _ in records)
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
    everything = sorted(rec for records in per_split.values() for rec in records)
    assert everything == [(1, i, b"p1-%d" % i) for i in range(10)] + \
        [(2, i, b"p2-%d" % i) for i in range(25)]

    # The ranges were fixed when the DataFrame was planned: records produced
    # since are not in it, and a new read sees them.
    with KafkaClient("127.0.0.1", gateway["kafka"]) as kafka:
        kafka.produce("split3", 0, [(None, b"late")] * 5)
    assert df.count() == 35
    assert read(spark, gateway, "split3").count() == 40

    # Nothing to read: Spark still runs one (empty) task.
    assert read(spark, gateway, "split3", startingOffsets="latest").count() == 0

    window = read(spark, gateway, "split3", maxRecordsPerSplit="4",
                  startingOffsets={"split3": {"2": 3}}, endingOffsets={"split3": {"2": 11,
                                                                                  "0": 0}})
    assert [(p, o) for p, o, _, _, _ in rows(window)] == \
        [(1, i) for i in range(10)] + [(2, i) for i in range(3, 11)]


def test_write_then_read_back_through_other_dialects(spark, gateway):
    from pyspark.sql import functions as F
    rustlog_create(gateway["rustlog"], "written", 2)
    data = [("a", b"one", 0, 1700000000000), (None, b"two", 1, 1700000000001),
            ("c", b"three", 0, None), ("d", b"four", 1, 1700000000003)]
    df = spark.createDataFrame(data, "key string, value binary, partition int, ts long") \
        .select("key", "value", "partition",
                F.timestamp_millis("ts").alias("timestamp")).coalesce(1)
    df.write.format("gateway").option("endpoint", gateway["endpoint"]) \
        .option("topic", "written").mode("append").save()

    # RustLog sees the values at their offsets, per partition.
    assert rustlog_fetch(gateway["rustlog"], "written", 0, 0) == [(0, b"one"), (1, b"three")]
    assert rustlog_fetch(gateway["rustlog"], "written", 0, 1) == [(0, b"two"), (1, b"four")]
    # A Kafka consumer sees the keys; timestamps were kept (a null one is the
    # receive time).
    with KafkaClient("127.0.0.1", gateway["kafka"]) as kafka:
        p0 = kafka.fetch("written", 0, 0, version=2).messages
        p1 = kafka.fetch("written", 1, 0, version=2).messages
    assert [(m.key, m.timestamp) for m in p1] == [(None, 1700000000001), (b"d", 1700000000003)]
    assert p0[0][1:] == (1700000000000, b"a", b"one")
    assert p0[1].key == b"c" and p0[1].timestamp > 1700000000003

    # Rows with neither topic nor partition columns: the option's topic, a
    # keyed row always in the same partition.
    spark.createDataFrame([("k", "text")] * 3, "key string, value string").coalesce(1) \
        .write.format("gateway").option("endpoint", gateway["endpoint"]) \
        .option("topic", "written").mode("append").save()
    back = read(spark, gateway, "written").where("key = 'k'")
    assert back.select("partition").distinct().count() == 1
    assert [r["value"] for r in back.collect()] == [b"text"] * 3


def test_invalid_reads_and_writes_fail_with_clear_errors(spark, gateway):
    with pytest.raises(Exception, match="topics: no-such-topic does not exist"):
        read(spark, gateway, "no-such-topic").count()
    # Spark lower-cases option names before the source sees them.
    with pytest.raises(Exception, match=re.escape("unknown option 'endingoffset' (did you "
                                                  "mean 'endingOffsets'?)")):
        read(spark, gateway, "mixed", endingOffset="latest").count()

    def write(df, mode="append", **options):
        writer = df.write.format("gateway").option("endpoint", gateway["endpoint"]) \
            .option("topic", "bad-writes").mode(mode)
        for name, value in options.items():
            writer = writer.option(name, value)
        writer.save()

    good = spark.createDataFrame([(b"v",)], "value binary")
    cases = [
        (spark.createDataFrame([(b"v",), (None,)], "value binary").coalesce(1), {},
         "row 1: value is null; every row needs a value"),
        (spark.createDataFrame([(b"v", 7)], "value binary, partition int"), {},
         "row 0: partition 7 does not exist in topic 'bad-writes' (1 partitions)"),
        (spark.createDataFrame([(1,)], "value int"), {},
         "column 'value' is int; it must be binary or string, required"),
        (spark.createDataFrame([(b"v",)], "vaule binary"), {},
         "the DataFrame needs a 'value' column"),
        (spark.createDataFrame([(b"v", "x")], "value binary, extra string"), {},
         "column 'extra': the gateway writer takes"),
        (spark.createDataFrame([(b"v", "no spaces")], "value binary, topic string"), {},
         "topic 'no spaces': invalid topic name"),
        (good, {"topics": "x"}, "unknown option 'topics' (did you mean 'topic'?)"),
    ]
    for df, options, message in cases:
        with pytest.raises(Exception, match=re.escape(message)):
            write(df, **options)
    with pytest.raises(Exception, match="append-only log"):
        write(good, mode="overwrite")
    # Rows are checked an Arrow batch at a time before any of it is produced:
    # the good row before the null one did not reach the log either.
    assert read(spark, gateway, "bad-writes").count() == 0


def test_stream_restarts_from_its_checkpoint_exactly_once(spark, gateway, scratch):
    rustlog_create(gateway["rustlog"], "stream", 2)
    expected = set()

    def produce(start, count):
        with KafkaClient("127.0.0.1", gateway["kafka"]) as kafka:
            for partition in (0, 1):
                base = kafka.produce("stream", partition, [
                    (None, b"%d-%d" % (partition, i), 1700000000000 + i)
                    for i in range(start, start + count)])
                expected.update((partition, o) for o in range(base, base + count))
    produce(0, 150)
    output = os.path.join(scratch, "out")
    checkpoint = os.path.join(scratch, "checkpoint")

    def start(**trigger):
        return (spark.readStream.format("gateway").option("endpoint", gateway["endpoint"])
                .option("topics", "stream").option("startingOffsets", "earliest")
                .option("maxRecordsPerTrigger", "50").load()
                .writeStream.format("parquet").option("path", output)
                .option("checkpointLocation", checkpoint).trigger(**trigger).start())

    query = start(processingTime="100 milliseconds")
    deadline = time.time() + 60
    while sum(p["numInputRows"] for p in query.recentProgress) < 100:
        assert time.time() < deadline, query.exception() or query.recentProgress
        time.sleep(0.05)
    query.stop()
    first = query.recentProgress
    done = sum(p["numInputRows"] for p in first)
    assert 100 <= done < 300, "stopped mid-stream"

    # More records while the query is down, from RustLog too.
    produce(150, 40)
    base = rustlog_produce(gateway["rustlog"], "stream", [b"rustlog"] * 10, partition=1)[0]
    expected.update((1, o) for o in range(base, base + 10))

    query = start(availableNow=True)
    query.awaitTermination(120)
    assert query.exception() is None
    second = query.recentProgress
    assert all(p["numInputRows"] <= 50 for p in first + second)

    got = [(r["partition"], r["offset"])
           for r in spark.read.parquet(output).select("partition", "offset").collect()]
    assert len(got) == len(set(got)) == len(expected) == 390
    assert set(got) == expected


def _example(name):
    import importlib
    return importlib.import_module(f"examples.pipeline.{name}")


def test_example_pipeline_end_to_end(spark, gateway, scratch):
    """Figg publishes JSON events (no key, no client timestamp: both are in
    the value); the example's streaming job aggregates them per key over 10 s
    event-time windows and writes the closed windows to a topic that a TANK
    consumer reads."""
    base = 1700000000000          # a multiple of 10 s
    events = [("a", 1000, 1.0), ("a", 2000, 2.0), ("b", 3000, 5.0), ("a", 12000, 1.0),
              ("b", 15000, 1.5), ("a", 9000, 0.5),
              # moves the watermark (max event time - 10 s) past 20 s
              ("c", 40000, 0.0)]
    lines = "".join(json.dumps({"key": k, "ts": base + t, "amount": x}) + "\n"
                    for k, t, x in events)
    cli("plugins.figg", "publish", "events", "--port", str(gateway["figg"]),
        stdin=(lines + "not json\n").encode())

    aggregate = _example("aggregate")
    query = aggregate.start(spark, gateway["endpoint"], "events", "event-counts",
                            os.path.join(scratch, "checkpoint"), once=True)
    query.awaitTermination(120)
    assert query.exception() is None

    out = cli("plugins.tank", "--port", str(gateway["tank"]), "tail", "event-counts",
              "--count", "4")
    got = sorted((d["key"], d["window_start"] - base, d["window_end"] - base, d["count"],
                  d["sum"]) for d in (json.loads(line.split("\t", 1)[1])
                                      for line in out.splitlines()))
    assert got == [("a", 0, 10000, 3, 3.5), ("a", 10000, 20000, 1, 1.0),
                   ("b", 0, 10000, 1, 5.0), ("b", 10000, 20000, 1, 1.5)]
    # The window of "c" is still open: nothing more was written.
    with KafkaClient("127.0.0.1", gateway["kafka"]) as kafka:
        written = kafka.fetch("event-counts", 0, 0, version=2).messages
    assert len(written) == 4
    assert {(m.key, m.timestamp - base) for m in written} == {
        (b"a", 10000), (b"a", 20000), (b"b", 10000), (b"b", 20000)}


def test_example_export_to_parquet(spark, gateway, scratch):
    with KafkaClient("127.0.0.1", gateway["kafka"]) as kafka:
        kafka.produce("exported", 0, [(b"k%d" % i, b"v%d" % i, 1700000000000 + i)
                                      for i in range(20)], magic=1)
    export = _example("export")
    first = os.path.join(scratch, "first")
    count, following = export.export(spark, gateway["endpoint"], "exported", first,
                                     ending=json.dumps({"exported": {"0": 12}}))
    assert (count, following) == (12, {"exported": {"0": 12}})
    second = os.path.join(scratch, "second")
    count, following = export.export(spark, gateway["endpoint"], "exported", second,
                                     starting=json.dumps(following))
    assert (count, following) == (8, {"exported": {"0": 20}})
    both = spark.read.parquet(first).unionByName(spark.read.parquet(second))
    assert sorted((r["offset"], r["key"], r["value"]) for r in both.collect()) == \
        [(i, b"k%d" % i, b"v%d" % i) for i in range(20)]
