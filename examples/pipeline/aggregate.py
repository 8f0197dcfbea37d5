"""Streaming job: per-key counts and sums over event-time windows.

Reads a topic that legacy clients write (any dialect), aggregates per key
over tumbling event-time windows with a watermark, and writes one record per
closed window to another topic, which clients of every dialect consume::

    .venv/bin/python examples/pipeline/aggregate.py            # against `make run`
    .venv/bin/python examples/pipeline/aggregate.py --once     # what is there, then stop

Input records are JSON objects such as
``{"key": "sensor-1", "ts": 1700000000000, "amount": 2.5}`` (``ts`` in ms since
the epoch, ``amount`` optional: it defaults to 0). Figg, RustLog and Pravega
writers have no keys and no client timestamps — the gateway stamps their
records with the receive time — so the key and the event time are read from
the value; a record whose value lacks them falls back to the record's own
key and timestamp (what Kafka and TANK writers set). Records with no key
either way, or no JSON object, are dropped.

Output: once the watermark (the latest event time seen, minus
``--watermark``) passes a window's end, one record per key and window:
key = the event key, timestamp = the window's end, value =
``{"key": ..., "window_start": ms, "window_end": ms, "count": n, "sum": x}``.
A window's late records (older than the watermark) are dropped, as Spark's
append mode does. The query's progress lives in ``--checkpoint``: stop it
and start it again and it goes on where it was, reading every input record
once (its output records are at-least-once: a micro-batch that fails while
producing is produced again).
"""
import argparse

from pyspark.sql import functions as F

EVENT = "key string, ts long, amount double"


def aggregates(spark, endpoint, source, window, watermark, max_records_per_trigger=None):
    """The streaming DataFrame of output rows (key, value, timestamp)."""
    reader = (spark.readStream.format("gateway").option("endpoint", endpoint)
              .option("topics", source).option("startingOffsets", "earliest"))
    if max_records_per_trigger:
        reader = reader.option("maxRecordsPerTrigger", max_records_per_trigger)
    records = reader.load()
    event = F.from_json(F.col("value").cast("string"), EVENT)
    events = records.select(
        F.coalesce(event["key"], F.col("key").cast("string")).alias("key"),
        F.coalesce(F.timestamp_millis(event["ts"]), F.col("timestamp")).alias("event_time"),
        F.coalesce(event["amount"], F.lit(0.0)).alias("amount"),
    ).where(F.col("key").isNotNull())
    windows = (events.withWatermark("event_time", watermark)
               .groupBy(F.window("event_time", window).alias("window"), "key")
               .agg(F.count("*").alias("count"), F.sum("amount").alias("sum")))
    return windows.select(
        F.col("key"),
        F.to_json(F.struct(
            F.col("key"),
            F.unix_millis(F.col("window.start")).alias("window_start"),
            F.unix_millis(F.col("window.end")).alias("window_end"),
            F.col("count"), F.col("sum"))).alias("value"),
        F.col("window.end").alias("timestamp"))


def start(spark, endpoint, source, sink, checkpoint, window="10 seconds",
          watermark="10 seconds", once=False, max_records_per_trigger=None):
    """Start the query; returns the StreamingQuery. ``once``: process what
    the input holds now (and close the windows it can), then stop."""
    writer = (aggregates(spark, endpoint, source, window, watermark, max_records_per_trigger)
              .writeStream.format("gateway").option("endpoint", endpoint)
              .option("topic", sink).option("checkpointLocation", checkpoint)
              .outputMode("append").queryName(f"aggregate-{source}"))
    if once:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="2 seconds")
    return writer.start()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", default="127.0.0.1:9092",
                        help="the gateway's Kafka listener (default %(default)s)")
    parser.add_argument("--input", default="events", help="topic to read (default %(default)s)")
    parser.add_argument("--output", default="event-counts",
                        help="topic to write the aggregates to (default %(default)s)")
    parser.add_argument("--window", default="10 seconds", help="window length")
    parser.add_argument("--watermark", default="10 seconds",
                        help="how late an event may arrive and still count")
    parser.add_argument("--checkpoint", default="checkpoints/event-counts",
                        help="the query's checkpoint folder (default %(default)s)")
    parser.add_argument("--max-records-per-trigger", type=int, default=None)
    parser.add_argument("--once", action="store_true",
                        help="process the records there are now, then stop")
    args = parser.parse_args(argv)
    from examples.pipeline.local_spark import local_session
    spark = local_session("gateway-aggregate")
    query = start(spark, args.endpoint, args.input, args.output, args.checkpoint,
                  args.window, args.watermark, args.once, args.max_records_per_trigger)
    print(f"reading {args.input}, writing {args.output} (checkpoint {args.checkpoint}); "
          + ("stops once the records there are now are done" if args.once else "Ctrl-C stops"),
          flush=True)
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
