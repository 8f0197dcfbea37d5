"""The SparkSession the example jobs run in.

``local[2]`` on this machine unless ``SPARK_MASTER`` names a cluster (its
executors need this project installed and a route to the gateway's Kafka
listener). Python workers run this interpreter, so they import the
``pipeline`` package from the same virtualenv; the UI is off and shuffles
use two partitions, which is what a small stream aggregation wants (the
default 200 would make every micro-batch run 200 tiny state-store tasks).
"""
import os
import sys

from pyspark.sql import SparkSession

import pipeline


def local_session(app_name):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.appName(app_name)
             .master(os.environ.get("SPARK_MASTER", "local[2]"))
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    pipeline.register(spark)
    return spark
