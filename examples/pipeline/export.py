"""Batch job: export a range of a topic to Parquet.

::

    .venv/bin/python examples/pipeline/export.py events exports/events
    .venv/bin/python examples/pipeline/export.py events exports/next \\
        --from '{"events": {"0": 1200}}'

Writes every record of the range — topic, partition, offset, timestamp, key,
value — to a Parquet dataset partitioned by topic and partition, and
prints the offsets the range ended at as JSON: pass it as ``--from`` to the
next export to continue exactly where this one stopped (no record twice,
none missed). The range is fixed when the job starts; records that arrive
while it runs belong to the next export.
"""
import argparse
import json

from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

from pipeline import SCHEMA


def export(spark, endpoint, topics, output, starting="earliest", ending="latest",
           max_records_per_split=None):
    """Write the range to ``output``; returns ``(records, ending offsets)``
    with the offsets as the JSON ``--from`` takes. A partition that had
    nothing in the range keeps its starting offset."""
    reader = (spark.read.format("gateway").option("endpoint", endpoint)
              .option("topics", topics).option("startingOffsets", starting)
              .option("endingOffsets", ending))
    if max_records_per_split:
        reader = reader.option("maxRecordsPerSplit", max_records_per_split)
    reader.load().write.partitionBy("topic", "partition").mode("errorifexists") \
        .parquet(output)
    # What was written, from the Parquet files' offset column alone. The
    # schema is given: an empty range leaves no file to infer it from, and
    # partition discovery would read a numeric topic name as a number.
    written = spark.read.schema(SCHEMA).parquet(output).groupBy("topic", "partition").agg(
        F.count("*").alias("records"), F.max("offset").alias("last")).collect()
    count = sum(row["records"] for row in written)
    following = {}
    for row in written:
        following.setdefault(row["topic"], {})[str(row["partition"])] = row["last"] + 1
    if starting not in ("earliest", "latest"):
        for topic, parts in json.loads(starting).items():
            for partition, offset in parts.items():
                following.setdefault(topic, {}).setdefault(partition, offset)
    return count, following


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("topics", help="topic names or glob patterns, comma-separated")
    parser.add_argument("output", help="Parquet folder to create")
    parser.add_argument("--endpoint", default="127.0.0.1:9092",
                        help="the gateway's Kafka listener (default %(default)s)")
    parser.add_argument("--from", dest="starting", default="earliest",
                        help="earliest, latest or JSON offsets (default %(default)s)")
    parser.add_argument("--to", dest="ending", default="latest",
                        help="latest or JSON offsets (default %(default)s)")
    parser.add_argument("--max-records-per-split", type=int, default=None)
    args = parser.parse_args(argv)
    from examples.pipeline.local_spark import local_session
    spark = local_session("gateway-export")
    try:
        count, following = export(spark, args.endpoint, args.topics, args.output,
                                  args.starting, args.ending, args.max_records_per_split)
    except AnalysisException as e:
        # An output folder that exists already, most often: one line will do.
        raise SystemExit(f"export: {e.getMessage()}") from None
    finally:
        spark.stop()
    print(f"exported {count} records to {args.output}")
    print(f"next --from: {json.dumps(following)}")


if __name__ == "__main__":
    main()
