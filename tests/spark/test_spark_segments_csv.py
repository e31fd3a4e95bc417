"""The Spark batch source through the segments of a CSV journal that records its column
names: segment tasks take the `message` struct from the segments' `doc` columns (no CSV
parse), for the default struct (the UUID column from the records' text) and for a
`schema` of other types, with exactly the rows of the same read from frames. Driven
in-process as Spark drives it (no Spark action), as test_spark_segments.py does."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType
from test_spark_segments import frame_reads, read_all

from oncelog.coordination import MetaStore
from oncelog.framing.csvlines import CSV_COLUMNS_LABEL, csv_column_labels
from oncelog.journal import JournalSpec
from oncelog.message import CSVRecord
from oncelog.publisher import Publisher
from oncelog.spark.batch import OncelogBatchReader
from oncelog.spark.options import ReadOptions
from oncelog.spark.schema import source_struct
from oncelog.spark.segmented import SegmentPartition, TailPartition
from oncelog.tables import SEGMENTS_LABEL
from oncelog.tables.segments import segment_records

CSV = "text/csv"
COLUMNS = ["uuid", "page", "ms"]
NAMED = source_struct(StructType([StructField(n, StringType()) for n in COLUMNS]))
TYPED_DDL = "page string, ms bigint, _3 string, _9 string"
TYPED = source_struct(StructType([
    StructField("page", StringType()), StructField("ms", LongType()),
    StructField("_3", StringType()), StructField("_9", StringType()),
]))


def write_csv(client, name: str) -> None:
    """Two compactions with a transaction open across each boundary, then a tail."""
    client.create(JournalSpec(name, labels={
        "content-type": CSV, CSV_COLUMNS_LABEL: csv_column_labels(COLUMNS),
    }))
    to = lambda _m: (name, CSV)  # noqa: E731
    a, b = Publisher(client), Publisher(client)
    for r in range(3):
        b.publish_committed(to, CSVRecord(["", f"/b{r}", str(r)]))
        a.publish_uncommitted(to, CSVRecord(["", f"/a{r}", str(10 + r)]))
        a.flush()
        b.flush()
        client.append(name, b',/long,1,x,y\n,/short\n,"/q,""uote""",\n')
        if r < 2:
            client.compact(name, retire_grace=0)
        a.append_intents(a.build_ack_intents())


def test_csv_segment_tasks_read_doc_columns_and_equal_the_frames(
    local_store, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = local_store.open()
    name = "csv/seg"
    write_csv(client, name)
    records, _ = segment_records(client, name)
    assert len(records) == 2 and all(r.parsed for r in records)
    from_frames = frame_reads(monkeypatch)  # ranges a task read from the journal's frames
    base = {"store": local_store.url, "journals": name}
    reads = [("named", NAMED, base), ("typed", TYPED, {**base, "schema": TYPED_DDL})]
    results = {}
    for label, schema, opts in reads:
        from_frames.clear()
        table, partitions = read_all(OncelogBatchReader(ReadOptions.parse(opts), schema))
        assert sum(isinstance(p, SegmentPartition) for p in partitions) == 2, label
        # Only the tail is read from frames: the segments' rows came from their columns.
        assert from_frames == [(records[1].end, client.head(name))], label
        results[label] = table
    message = results["typed"].column("message").to_pylist()
    assert message[1] == {"page": "/long", "ms": 1, "_3": "x", "_9": None}
    assert message[2]["ms"] is None and message[3]["ms"] is None  # short, and empty
    assert results["named"].column("message").to_pylist()[0]["uuid"] != ""
    # The same reads from frames only (segments off and retired) give the same tables.
    spec = client.get(name)
    client.update(replace(spec, labels=spec.labels.set(SEGMENTS_LABEL, "off")))
    meta = MetaStore.of(client, internal=True)
    for rec in records:
        meta.delete(f"segments/{name}/{rec.name}")
    for label, schema, opts in reads:
        table, partitions = read_all(OncelogBatchReader(ReadOptions.parse(opts), schema))
        assert not any(isinstance(p, (SegmentPartition, TailPartition)) for p in partitions)
        assert table.equals(results[label]), label
    client.close()
