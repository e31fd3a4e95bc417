"""PySpark's automatic registration of the `oncelog` data source.

PySpark registers the `DefaultSource` of every installed top-level module named
`pyspark_*`, so with oncelog installed `spark.read.format("oncelog")` works without
calling `oncelog.spark.register(spark)` first.
"""

from oncelog.spark.datasource import OncelogDataSource as DefaultSource

__all__ = ["DefaultSource"]
