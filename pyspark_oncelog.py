"""PySpark's automatic registration of the `oncelog` data source.

PySpark registers the `DefaultSource` of every top-level module named `pyspark_*` that
`pkgutil.iter_modules()` lists, so with oncelog installed `spark.read.format("oncelog")`
works without calling `oncelog.spark.register(spark)` first. That holds for an editable
install too: pyproject.toml makes it a static sys.path entry that the listing sees.
Without the `spark` extra's pyarrow, importing this module raises MissingExtra naming
`pip install 'oncelog[spark]'`.
"""

from oncelog._extras import needs_extra

with needs_extra("spark", "the Spark data source (pyspark_oncelog)"):
    from oncelog.spark.datasource import OncelogDataSource as DefaultSource

__all__ = ["DefaultSource"]
