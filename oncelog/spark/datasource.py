"""The `oncelog` PySpark data source: batch and streaming reads, transactional writes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)

from oncelog.framing import CONTENT_TYPE_CSV
from oncelog.framing.csvlines import csv_columns
from oncelog.journal import JournalSpec
from oncelog.spark.batch import OncelogBatchReader
from oncelog.spark.options import ReadOptions, WriteOptions
from oncelog.spark.schema import SchemaError, message_kind, source_ddl
from oncelog.spark.stream import OncelogStreamReader
from oncelog.spark.write import OncelogBatchWriter, OncelogStreamWriter, write_targets

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = ["OncelogDataSource"]


def _recorded_columns(spec: JournalSpec) -> list[str] | None:
    """The column names a CSV journal records (label `oncelog.dev/csv-columns`): its
    `message` is then a struct keyed by them, as JSON documents are with `schema`."""
    if spec.content_type.split(";", 1)[0].strip().lower() != CONTENT_TYPE_CSV:
        return None
    return csv_columns(spec)


class OncelogDataSource(DataSource):
    """Journals of an fsspec store (local disk, S3, ...) as Spark DataFrames, format `oncelog`.

    Read options: `store`, `journals` (names or a label selector), storage options
    (`key`, `secret`, `endpoint_url`, `region`, or `storage_options` JSON), `committed`
    (default true), `schema` (DDL of JSON documents, or of the fields of CSV records by
    their journal's recorded column names), `tails` (set by
    `oncelog.spark.committed.committed_dataframe`: journals read only over a planned tail,
    with its producer states). Write options: `store`, `journal`
    or `selector` with `key_column` and `mapping`, `write_id`/`write_version` for batch
    writes, `writer_id` for streams. See docs/spark.md.
    """

    @classmethod
    def name(cls) -> str:
        return "oncelog"

    def schema(self) -> str:
        options = ReadOptions.parse(self.options)
        if options.schema is not None:
            return source_ddl(message_kind("application/x-ndjson", options.schema).spark_type)
        with options.store.open() as client:
            specs = options.list_journals(client)
        kinds = {
            spec.name: message_kind(
                spec.content_type, None, _recorded_columns(spec), journal=spec.name
            ).spark_type
            for spec in specs
        }
        types = sorted(set(kinds.values()))
        if len(types) > 1:
            example = {t: next(n for n, k in kinds.items() if k == t) for t in types}
            raise SchemaError(
                f"the journals need different message column types {example}: read each kind "
                "of journal separately"
            )
        return source_ddl(types[0] if types else "string")

    def reader(self, schema: StructType) -> DataSourceReader:
        options = ReadOptions.parse(self.options)
        tails = self.options.get("tails")
        if tails:
            # Journals read only after their sealed history (oncelog.spark.committed).
            from oncelog.spark.committed import TailsReader, parse_tails

            return TailsReader(options, schema, parse_tails(tails))
        return OncelogBatchReader(options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return OncelogStreamReader(ReadOptions.parse(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        options = self._write_options(overwrite)
        with options.store.open() as client:
            targets = write_targets(client, options)
        return OncelogBatchWriter(options, schema, targets)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = self._write_options(overwrite)
        with options.store.open() as client:
            targets = write_targets(client, options)
        return OncelogStreamWriter(options, schema, targets)

    def _write_options(self, overwrite: bool) -> WriteOptions:
        if overwrite:
            raise SchemaError("journals are append-only: write with mode 'append'")
        return WriteOptions.parse(self.options)
