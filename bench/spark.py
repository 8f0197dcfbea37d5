"""Spark over the gateway: the ``gateway`` data source in local[2].

Scenarios, 1,000,000 records of 100 B in one partition of a gateway
subprocess (fsync never), every figure the median of ``runs`` timed runs
after one untimed warm-up (the first job of a session starts the Python
workers):

- read: ``spark.read.format("gateway")...load().count()`` of all the
  records, written beforehand by the blocking Kafka client, in 2 splits
  (``maxRecordsPerSplit`` 500,000): one task per core;
- write: ``df.write.format("gateway")`` of a cached DataFrame of 1,000,000
  100-byte values in 2 tasks (each produces 1 MiB message sets, acks -1).

Baselines, measured in the same run: the blocking Kafka client outside
Spark over one connection, reading the same records with Fetch v2 (what
the data source asks for: magic 1, with timestamps) in 4 MiB fetches
(``KafkaClient.read``), and producing the same values in 1 MiB message sets
with acks -1, encoding included. The ratio is Spark's figure over its
baseline's: what the data source makes of what one plain client gets.

The workload is a fixed size, so ``--seconds`` does not apply. Targets
(issue 8): read at least 300,000 records/s, write at least 200,000.
"""
import os
import statistics
import sys
import time

from twisted.internet import defer, threads

from bench.procs import Gateway

RECORDS = 1000000
VALUE_BYTES = 100
SPLIT = 500000
READ_TOPIC = "spark-read"
WRITE_TOPIC = "spark-write"
#: records per produce when filling and in the baseline's message sets (~1 MiB)
PRODUCE_BATCH = 8000
READ_TARGET = 300000
WRITE_TARGET = 200000


def _values():
    return [b"%099d" % i + b"\n" for i in range(PRODUCE_BATCH)]


def _fill(client):
    from plugins.kafka import codec as kc
    message_set = kc.encode_message_set([(None, v) for v in _values()])
    for _ in range(RECORDS // PRODUCE_BATCH):
        client.produce_encoded(READ_TOPIC, 0, message_set)


def _client_read(client):
    started = time.perf_counter()
    count = sum(1 for _ in client.read(READ_TOPIC, 0, 0, RECORDS, max_bytes=4 << 20,
                                       version=2))
    assert count == RECORDS, count
    return RECORDS / (time.perf_counter() - started)


def _client_write(client):
    from plugins.kafka import codec as kc
    values = _values()
    started = time.perf_counter()
    for _ in range(RECORDS // PRODUCE_BATCH):
        client.produce_encoded("baseline-write", 0,
                               kc.encode_message_set([(None, v) for v in values]), acks=-1)
    return RECORDS / (time.perf_counter() - started)


def _session():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import pipeline
    spark = (SparkSession.builder.master("local[2]").appName("bench-spark")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    pipeline.register(spark)
    return spark


def measure(runs):
    """Blocking: ``{scenario: median records/s}``."""
    from pyspark.sql import functions as F

    from plugins.kafka.client import KafkaClient
    gw = Gateway("never", dialects=("kafka",))
    spark = None
    try:
        endpoint = f"127.0.0.1:{gw.ports['kafka']}"
        with KafkaClient("127.0.0.1", gw.ports["kafka"]) as client:
            _fill(client)
            client_read = [_client_read(client) for _ in range(runs)]
            client_write = [_client_write(client) for _ in range(runs)]
        spark = _session()
        reader = (spark.read.format("gateway").option("endpoint", endpoint)
                  .option("topics", READ_TOPIC).option("maxRecordsPerSplit", SPLIT))
        source = spark.range(RECORDS, numPartitions=2).select(
            F.encode(F.concat(F.lpad(F.col("id").cast("string"), VALUE_BYTES - 1, "0"),
                              F.lit("\n")), "utf-8").alias("value")).cache()
        assert source.count() == RECORDS

        def spark_read():
            df = reader.load()
            started = time.perf_counter()
            count = df.count()
            assert count == RECORDS, count
            return RECORDS / (time.perf_counter() - started)

        def spark_write():
            started = time.perf_counter()
            source.write.format("gateway").option("endpoint", endpoint) \
                .option("topic", WRITE_TOPIC).mode("append").save()
            return RECORDS / (time.perf_counter() - started)

        results = {}
        for name, job in (("read", spark_read), ("write", spark_write)):
            job()
            results[name] = [job() for _ in range(runs)]
        source.unpersist()
        return {"read": statistics.median(results["read"]),
                "write": statistics.median(results["write"]),
                "client read": statistics.median(client_read),
                "client write": statistics.median(client_write)}
    finally:
        if spark is not None:
            spark.stop()
        gw.stop()


@defer.inlineCallbacks
def table(reactor, runs, seconds):
    from bench.table import print_table
    figures = yield threads.deferToThread(measure, runs)
    mb = VALUE_BYTES / 1e6

    def row(name, key, base, target):
        rps = figures[key]
        return (name, rps, rps * mb, rps / figures[base], target)
    print_table(f"Spark data source, local[2], {RECORDS:,} x {VALUE_BYTES} B "
                f"(ratio to the blocking Kafka client outside Spark)",
                ("scenario", "records/s", "MB/s", "ratio", "target records/s"), [
                    row("Spark count(), 2 splits", "read", "client read", f"{READ_TARGET:,}"),
                    row("blocking client read, Fetch v2, 1 connection", "client read",
                        "client read", "baseline"),
                    row("Spark write, 2 tasks, acks -1", "write", "client write",
                        f"{WRITE_TARGET:,}"),
                    row("blocking client produce, 1 MiB sets, acks -1, 1 connection",
                        "client write", "client write", "baseline"),
                ])
