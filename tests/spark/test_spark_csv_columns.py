"""CSV journals that record their column names (label `oncelog.dev/csv-columns`) read
through the Spark source as a `message` struct keyed by those names, with exactly the
values `read_committed_arrow(parse=True)` gives; option `schema` picks, orders and types
fields by those names. A CSV journal without names reads as before (the record's text).

Three Spark actions in all (the suite's time budget); the rest drives the source's
reader in-process, as tests/spark/test_spark_source.py does.
"""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from oncelog.arrow import read_committed_arrow
from oncelog.errors import OncelogError
from oncelog.framing.csvlines import CSV_COLUMNS_LABEL, csv_column_labels
from oncelog.journal import JournalSpec
from oncelog.message import CSVRecord
from oncelog.publisher import Publisher
from oncelog.reading import read_committed
from oncelog.spark import OncelogDataSource
from oncelog.spark.batch import OncelogBatchReader
from oncelog.spark.batches import BadMessage
from oncelog.spark.options import ReadOptions
from oncelog.spark.schema import METADATA_COLUMNS, SchemaError, source_struct

COLUMNS = ["uuid", "page name", "m`s"]  # a space and a back-quote: DDL must quote them
META = [name for name, _ in METADATA_COLUMNS]


class _Abort(Exception):
    pass


def _record_columns(client, journal: str, names: list[str]) -> None:
    """Record `names` on `journal` as `oncelog append --header` does: a conditional update."""
    spec = client.get(journal)
    labels = spec.labels.set(CSV_COLUMNS_LABEL, csv_column_labels(names))
    client.update(replace(spec, labels=labels), expect=spec)


def _write(client, journal: str) -> None:
    """Committed records (one quoted), a rolled-back transaction, then nil-UUID records
    outside any transaction: one longer than the header, one shorter, one with an empty
    field."""
    client.create(JournalSpec(journal, {"content-type": "text/csv"}))
    pub = Publisher(client)
    route = lambda _msg: (journal, "text/csv")  # noqa: E731
    pub.publish_committed(route, CSVRecord(["", "/a", "3"]))
    pub.publish_committed(route, CSVRecord(["", "/b,x", "4"]))
    pub.flush()
    with pytest.raises(_Abort), pub.transaction():
        pub.publish_uncommitted(route, CSVRecord(["", "/rolled-back", "9"]))
        pub.flush()
        raise _Abort
    client.append(journal, b',/d,6,extra,more\n,/e\n,/f,\n')


@pytest.fixture
def store(local_store):
    client = local_store.open()
    _write(client, "csv/named")
    _record_columns(client, "csv/named", COLUMNS)
    _write(client, "csv/plain")
    yield local_store, client
    client.close()


def _load(spark, url: str, journal: str, schema: str | None = None) -> pa.Table:
    reader = spark.read.format("oncelog").option("store", url).option("journals", journal)
    if schema is not None:
        reader = reader.option("schema", schema)
    return reader.load().toArrow().sort_by("begin")


def test_named_csv_columns_read_as_a_struct_equal_to_arrow(spark, store) -> None:
    target, client = store
    arrow = read_committed_arrow(client, "csv/named", parse=True).sort_by("begin")
    raw_uuids = [e.message.fields[0] for e in read_committed(client, "csv/named")]
    assert arrow.column("page name").to_pylist() == ["/a", "/b,x", "/d", "/e", "/f"]

    got = _load(spark, target.url, "csv/named")
    message_type = got.schema.field("message").type
    assert [message_type.field(i).name for i in range(message_type.num_fields)] == COLUMNS
    assert got.select(META).to_pylist() == arrow.select(META).to_pylist()
    messages = got.column("message").to_pylist()
    assert [m["page name"] for m in messages] == arrow.column("page name").to_pylist()
    assert [m["m`s"] for m in messages] == arrow.column("m`s").to_pylist() == [
        "3", "4", "6", None, ""
    ]
    assert [m["uuid"] for m in messages] == raw_uuids  # the UUID column, as written

    # `schema` names fields of the header (any order), past it (`_4`), or none (null);
    # non-string types are cast from the text, an empty field being null.
    typed = _load(spark, target.url, "csv/named", "`m``s` bigint, `page name` string, "
                  "_4 string, absent string")
    assert typed.select(META).to_pylist() == arrow.select(META).to_pylist()
    assert typed.column("message").to_pylist() == [
        {"m`s": int(ms) if ms else None, "page name": page, "_4": extra, "absent": None}
        for ms, page, extra in zip(arrow.column("m`s").to_pylist(),
                                   arrow.column("page name").to_pylist(),
                                   arrow.column("_4").to_pylist())
    ]


def test_csv_without_names_reads_its_text_as_before(spark, store) -> None:
    target, client = store
    got = _load(spark, target.url, "csv/plain")
    text = read_committed_arrow(client, "csv/plain").sort_by("begin")
    assert got.schema.field("message").type == pa.string()
    assert got.select([*META, "message"]).to_pylist() == text.to_pylist()
    assert got.column("message").to_pylist()[2:] == [",/d,6,extra,more", ",/e", ",/f,"]
    # Named and unnamed CSV journals have different `message` types: read them apart.
    both = OncelogDataSource({"store": target.url, "journals": "csv/named,csv/plain"})
    with pytest.raises(SchemaError, match="different message column types"):
        both.schema()


def test_named_csv_errors_name_journal_and_offsets(store) -> None:
    target, client = store
    typed = source_struct(StructType([StructField("page name", LongType())]))
    options = ReadOptions.parse(
        {"store": target.url, "journals": "csv/named", "schema": "`page name` bigint"}
    )
    reader = OncelogBatchReader(options, typed)
    (partition,) = reader.partitions()
    first = next(iter(read_committed(client, "csv/named")))
    with pytest.raises(BadMessage, match=(
        rf"journal 'csv/named': CSV record at offsets \[{first.begin}, {first.end}\) does "
        r"not fit option 'schema': column 'page name' value '/a'"
    )) as caught:
        list(reader.read(partition))
    assert isinstance(caught.value, OncelogError)
    # A struct read of a CSV journal that records no names (planned as named) says so.
    named = source_struct(StructType([StructField(n, StringType()) for n in COLUMNS]))
    plain = ReadOptions.parse({"store": target.url, "journals": "csv/plain"})
    with pytest.raises(SchemaError, match="CSV journal csv/plain .* records none"):
        OncelogBatchReader(plain, named).partitions()
