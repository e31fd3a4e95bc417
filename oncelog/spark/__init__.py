"""PySpark data source for oncelog journals (format `"oncelog"`), on PySpark >= 4.2.

`register(spark)` makes `spark.read.format("oncelog")`, `spark.readStream`,
`df.write` and `df.writeStream` speak journals on any fsspec store:

    from oncelog.spark import register
    register(spark)
    df = (spark.read.format("oncelog")
          .option("store", "s3://bucket/journals").option("journals", "app=web")
          .option("schema", "page string, ms bigint").load())

Batch reads are read-committed (exactly `read_committed`'s messages) and parallel
within large journals; streams resume exactly once from their checkpoints; writes
become visible only when Spark commits the job or micro-batch. See docs/spark.md.

PySpark is imported only by the data source itself: `oncelog.spark.plan` (the split
plan) works without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from oncelog.spark.datasource import OncelogDataSource

__all__ = ["register", "OncelogDataSource"]


def register(spark: SparkSession) -> None:
    """Register the `oncelog` format with a SparkSession."""
    from oncelog.spark.datasource import OncelogDataSource

    spark.dataSource.register(OncelogDataSource)


def __getattr__(name: str) -> Any:
    if name == "OncelogDataSource":
        from oncelog.spark.datasource import OncelogDataSource

        return OncelogDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
