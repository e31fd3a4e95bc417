"""PySpark data source for oncelog journals (format `"oncelog"`), on PySpark >= 4.3.

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

PySpark is imported only by the data source itself: the split plan it runs
(`oncelog.sequencing.plan`, re-exported as `oncelog.spark.plan`) works without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from oncelog._extras import needs_extra

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from oncelog.spark.committed import committed_dataframe
    from oncelog.spark.datasource import OncelogDataSource

__all__ = ["register", "local_session", "OncelogDataSource", "committed_dataframe"]


def register(spark: SparkSession) -> None:
    """Register the `oncelog` format with a SparkSession.

    Needed only where PySpark's own discovery of `pyspark_oncelog` does not run (a session
    started before oncelog was installed, say); calling it again is harmless."""
    with needs_extra("spark", "the Spark data source (oncelog.spark)"):
        from oncelog.spark.datasource import OncelogDataSource

    spark.dataSource.register(OncelogDataSource)


def local_session(
    app_name: str = "oncelog", master: str = "local[2]", **conf: str
) -> tuple[SparkSession, bool]:
    """The active SparkSession, or a new local one on the loopback interface whose
    workers run this interpreter, with the `oncelog` format registered.

    Returns the session and whether it was started here (then the caller stops it).
    `conf` adds Spark settings (dots spelled as underscores are not translated: pass
    `**{"spark.sql.session.timeZone": "UTC"}`).
    """
    import os
    import sys

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with needs_extra("spark", "oncelog.spark.local_session"):
        from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        register(active)
        return active, False
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark, True


def __getattr__(name: str) -> Any:
    if name == "OncelogDataSource":
        with needs_extra("spark", "oncelog.spark.OncelogDataSource"):
            from oncelog.spark.datasource import OncelogDataSource

        return OncelogDataSource
    if name == "committed_dataframe":
        with needs_extra("spark", "oncelog.spark.committed_dataframe"):
            from oncelog.spark.committed import committed_dataframe

        return committed_dataframe
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
