"""Gateway topics as Spark DataFrames: the ``gateway`` data source.

::

    from pipeline import register
    register(spark)
    df = (spark.read.format("gateway").option("endpoint", "127.0.0.1:9092")
          .option("topics", "events").load())

Needs PySpark 4.2 or later (Python data sources with admission control and
Arrow writers) and pyarrow. The core gateway does not depend on this
package; this package depends on the Kafka dialect's blocking client.
"""
from pipeline.source import SCHEMA, GatewayDataSource, register

__all__ = ["SCHEMA", "GatewayDataSource", "register"]
