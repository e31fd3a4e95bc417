"""`committed_dataframe`: sealed history read by Spark's own Parquet reader, the tail by the
source, exactly the rows of `spark.read.format("oncelog")` and `read_committed`.

Journals: segments with a transaction open across the last segment's end and a document
field that only later segments hold; a trim at a segment's start (the JVM reads it, rows
below the first offset are filtered); a trim across a segment (read by the source); a
damaged segment (checked in the driver: the source reads from it on); a journal without
segments. A file damaged after the driver's checks fails the query by its page checksum.
"""

from __future__ import annotations

import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType
from spark_history import to, write_history

from oncelog.coordination import MetaStore
from oncelog.journal import FragmentSpec, JournalSpec
from oncelog.message import JSONMessage
from oncelog.publisher import Publisher
from oncelog.reading import read_committed
from oncelog.spark.committed import committed_dataframe, plan_segments
from oncelog.spark.options import ReadOptions
from oncelog.spark.schema import arrow_schema, source_struct
from oncelog.tables import SegmentWarning
from oncelog.tables.segments import file_path, segment_records

DDL = "n bigint, page string, extra string"
PARSED = source_struct(StructType([
    StructField("n", LongType()), StructField("page", StringType()),
    StructField("extra", StringType()),
]))
NAMES = ["t/main", "t/edge", "t/mid", "t/dmg", "t/plain"]


def publish(client, name: str, pub: Publisher, start: int, count: int, **extra: str) -> None:
    for i in range(start, start + count):
        pub.publish_committed(to(name), JSONMessage({"n": i, "page": f"p{i % 3}", **extra}))
    pub.flush()


def build(client) -> dict[str, object]:
    """The journals (see the module); returns what the assertions need."""
    facts: dict[str, object] = {}
    # t/main: two segments, a transaction open across the second's end, `extra` only in
    # the second segment and the tail.
    write_history(client, "t/main", seed=31, rounds=14, fragment=300)
    client.compact("t/main", target_length=600, retire_grace=0)
    pub = Publisher(client)
    publish(client, "t/main", pub, 500, 4, extra="x")
    with pub.transaction():
        pub.publish_uncommitted(to("t/main"), JSONMessage({"n": 600, "page": "txn"}))
        pub.flush()
        client.compact("t/main", target_length=600, retire_grace=0)
        pub.publish_uncommitted(to("t/main"), JSONMessage({"n": 601, "page": "txn"}))
    publish(client, "t/main", Publisher(client), 700, 3, extra="y")
    # t/edge: a producer's segment, then a new producer's; trimmed at the second's start.
    client.create(JournalSpec("t/edge", fragment=FragmentSpec(length=1 << 20)))
    publish(client, "t/edge", Publisher(client), 0, 5)
    client.compact("t/edge", target_length=100, retire_grace=0)
    second = Publisher(client)
    publish(client, "t/edge", second, 100, 5)
    client.compact("t/edge", target_length=100, retire_grace=0)
    publish(client, "t/edge", second, 200, 2)
    edge_first = segment_records(client, "t/edge")[0][1].begin
    client.trim("t/edge", edge_first)
    facts["edge_first"] = client.first_offset("t/edge")
    # t/mid: trimmed inside its first segment.
    write_history(client, "t/mid", seed=32, rounds=14, fragment=200)
    client.compact("t/mid", target_length=200, retire_grace=0)
    publish(client, "t/mid", Publisher(client), 300, 3)
    client.compact("t/mid", target_length=200, retire_grace=0)
    seg = segment_records(client, "t/mid")[0][0]
    inside = [f.end for f in client.fragments("t/mid") if seg.begin < f.end < seg.end]
    client.trim("t/mid", inside[len(inside) // 2])
    facts["mid_first"] = client.first_offset("t/mid")
    # t/dmg: two segments and a tail; the second segment's file damaged.
    write_history(client, "t/dmg", seed=33, rounds=10, fragment=300)
    client.compact("t/dmg", target_length=600, retire_grace=0)
    publish(client, "t/dmg", Publisher(client), 400, 4)
    client.compact("t/dmg", target_length=600, retire_grace=0)
    publish(client, "t/dmg", Publisher(client), 450, 2)
    bad = segment_records(client, "t/dmg")[0][1]
    meta = MetaStore.of(client, internal=True)
    data = bytearray(meta.read(file_path("t/dmg", bad.file)) or b"")
    data[len(data) // 2] ^= 0x10
    meta.write(file_path("t/dmg", bad.file), bytes(data))
    facts["dmg_bad"] = bad
    # t/plain: no segments at all.
    write_history(client, "t/plain", seed=34, rounds=6)
    return facts


def sorted_rows(df) -> list[tuple]:
    return sorted((tuple(r) for r in df.collect()), key=lambda r: (r[0], r[1]))


def test_plans_and_rows_equal_the_source(spark, local_store) -> None:
    client = local_store.open()
    facts = build(client)
    assert facts["mid_first"] > segment_records(client, "t/mid")[0][0].begin
    options = ReadOptions.parse({"store": local_store.url, "journals": ",".join(NAMES)})
    specs = options.list_journals(client)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plans = plan_segments(client, options, specs, arrow_schema(PARSED))
    bad = facts["dmg_bad"]
    assert any(w.category is SegmentWarning and bad.name in str(w.message)
               and "t/dmg" in str(w.message) for w in caught)
    assert sorted(plans) == ["t/dmg", "t/edge", "t/main"]
    main_segments = segment_records(client, "t/main")[0]
    assert len(plans["t/main"].paths) == len(main_segments) == 2
    assert plans["t/main"].tail_begin == main_segments[-1].end
    assert plans["t/main"].tail_states  # the open transaction's producer, among others
    assert plans["t/edge"].first == facts["edge_first"] > 0
    assert len(plans["t/dmg"].paths) == 1 and plans["t/dmg"].tail_begin == bad.begin
    # A document type the segments do not hold: the source reads everything.
    odd = source_struct(StructType([StructField("n", StringType())]))
    assert plan_segments(client, options, specs, arrow_schema(odd)) == {}

    store = local_store.url
    for schema in (None, DDL):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SegmentWarning)
            df = committed_dataframe(spark, store, NAMES, schema=schema)
        plain = spark.read.format("oncelog").option("store", store) \
            .option("journals", ",".join(NAMES))
        if schema is not None:
            plain = plain.option("schema", schema)
        plain_df = plain.load()
        assert df.schema == plain_df.schema
        assert "parquet" in df._jdf.queryExecution().optimizedPlan().toString().lower()
        got = sorted_rows(df)
        assert got == sorted_rows(plain_df)
        for name in NAMES:  # read_committed's messages, offsets, order
            mine = sorted((r[3], r[1]) for r in got if r[0] == name)
            assert [b for _, b in mine] == [e.begin for e in read_committed(client, name)], name
        if schema is not None:
            extras = {r[10]["extra"] for r in got if r[0] == "t/main"}
            assert extras == {None, "x", "y"}  # null where a segment has no such field
    client.close()


def silent_flip(data: bytes, column: str) -> int:
    """An offset in `column`'s data whose flipped bit a reader not verifying page
    checksums reads without an error, as other values."""
    good = pq.read_table(pa.BufferReader(data))
    group = pq.ParquetFile(pa.BufferReader(data)).metadata.row_group(0)
    chunk = next(group.column(i) for i in range(group.num_columns)
                 if group.column(i).path_in_schema == column)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    for offset in range(start + chunk.total_compressed_size - 1, start, -1):
        flipped = bytearray(data)
        flipped[offset] ^= 0x01
        try:
            table = pq.ParquetFile(pa.BufferReader(bytes(flipped)),
                                   page_checksum_verification=False).read()
        except (pa.ArrowException, OSError):
            continue
        if not table.equals(good):
            return offset
    raise AssertionError(f"no silent flip in column {column}")


def test_a_file_damaged_after_planning_fails_the_query(spark, local_store) -> None:
    client = local_store.open()
    client.create(JournalSpec("t/late", fragment=FragmentSpec(length=1 << 20)))
    publish(client, "t/late", Publisher(client), 0, 40)
    client.compact("t/late", retire_grace=0)
    publish(client, "t/late", Publisher(client), 100, 2)
    df = committed_dataframe(spark, local_store.url, "t/late")
    rec = segment_records(client, "t/late")[0][0]
    meta = MetaStore.of(client, internal=True)
    data = meta.read(file_path("t/late", rec.file)) or b""
    flipped = bytearray(data)
    flipped[silent_flip(data, "clock")] ^= 0x01
    meta.write(file_path("t/late", rec.file), bytes(flipped))
    with pytest.raises(Exception) as caught:
        df.collect()
    assert "checksum" in str(caught.value).lower()
    client.close()
