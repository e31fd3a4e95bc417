"""The Spark batch source through columnar segments: a task per segment (pyarrow, no JSON
parse) and one for the tail, exactly the rows of a read without segments, whatever the
schema; damaged segments and schemas the segments cannot give are read from frames.
Driven in-process as Spark drives it (see test_spark_source.py); test_spark_integration.py
runs the source in a real Spark."""

from __future__ import annotations

import warnings

import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType
from spark_history import to, write_history

from oncelog.coordination import MetaStore
from oncelog.message import JSONMessage
from oncelog.publisher import Publisher
from oncelog.reading import read_committed
from oncelog.spark import segmented
from oncelog.spark.batch import OncelogBatchReader
from oncelog.spark.options import ReadOptions
from oncelog.spark.schema import source_struct
from oncelog.spark.segmented import SegmentPartition, TailPartition
from oncelog.tables import SEGMENTS_LABEL, SegmentWarning
from oncelog.tables.segments import file_path, segment_records

RAW = source_struct(StringType())
PARSED = source_struct(
    StructType([StructField("n", LongType()), StructField("page", StringType())])
)
ODD = source_struct(StructType([StructField("n", DoubleType())]))  # not the segments


def more_history(client, name: str, seed: int) -> None:
    """Committed and transactional messages after a compaction (the journal's tail)."""
    pubs = [Publisher(client), Publisher(client)]
    for i in range(seed):
        pub = pubs[i % 2]
        if i % 3:
            pub.publish_committed(to(name), JSONMessage({"n": 1000 + i, "page": "tail"}))
        else:
            with pub.transaction():
                pub.publish_uncommitted(to(name), JSONMessage({"n": 2000 + i, "page": "txn"}))
    for pub in pubs:
        pub.flush()


def frame_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The ranges segment and tail tasks read from a journal's frames from now on (a task
    that takes a segment's rows reads none)."""
    ranges: list[tuple[int, int]] = []
    original = segmented.sequential_batches

    def spy(decoder, begin: int, end: int, *args, **kwargs):  # type: ignore[no-untyped-def]
        ranges.append((begin, end))
        return original(decoder, begin, end, *args, **kwargs)

    monkeypatch.setattr(segmented, "sequential_batches", spy)
    return ranges


def read_all(reader: OncelogBatchReader) -> tuple[pa.Table, list[object]]:
    partitions = cloudpickle.loads(cloudpickle.dumps(reader.partitions()))
    batches = []
    for partition in partitions:
        batches.extend(cloudpickle.loads(cloudpickle.dumps(reader)).read(partition))
    table = pa.Table.from_batches(batches)
    order = [("commit_offset", "ascending"), ("begin", "ascending")]
    return table.sort_by(order), partitions


def without_segments(client, name: str) -> None:
    """Turn segments off and retire their records: reads go back to the frames."""
    from dataclasses import replace

    spec = client.get(name)
    client.update(replace(spec, labels=spec.labels.set(SEGMENTS_LABEL, "off")))
    meta = MetaStore.of(client, internal=True)
    for rec in segment_records(client, name)[0]:
        meta.delete(f"segments/{name}/{rec.name}")


def test_segments_read_by_tasks_equal_the_frames_for_every_schema(local_store) -> None:
    client = local_store.open()
    name = "site/seg"
    write_history(client, name, seed=11, rounds=12, fragment=300)
    client.compact(name, target_length=600, retire_grace=0)
    more_history(client, name, 12)  # after the compaction: the tail
    write_history(client, "site/other", seed=12, rounds=4)  # another journal, no segments
    options = {"store": local_store.url, "journals": f"{name},site/other"}
    results = {}
    for label, schema, opts in [
        ("raw", RAW, {}),
        ("parsed", PARSED, {"schema": "n bigint, page string"}),
        ("odd", ODD, {"schema": "n double"}),
    ]:
        reader = OncelogBatchReader(ReadOptions.parse({**options, **opts}), schema)
        table, partitions = read_all(reader)
        assert any(isinstance(p, SegmentPartition) for p in partitions), label
        results[label] = table
    envs = list(read_committed(client, name))
    seg_rows = results["raw"].filter(pa.compute.equal(results["raw"].column("journal"), name))
    assert seg_rows.column("begin").to_pylist() == [e.begin for e in envs]
    assert results["parsed"].filter(
        pa.compute.equal(results["parsed"].column("journal"), name)
    ).column("message").to_pylist() == [
        {"n": e.message.doc.get("n"), "page": e.message.doc.get("page")} for e in envs
    ]
    # The same reads with segments gone (frames only) give the same tables.
    without_segments(client, name)
    for label, schema, opts in [
        ("raw", RAW, {}),
        ("parsed", PARSED, {"schema": "n bigint, page string"}),
        ("odd", ODD, {"schema": "n double"}),
    ]:
        reader = OncelogBatchReader(ReadOptions.parse({**options, **opts}), schema)
        table, partitions = read_all(reader)
        assert not any(isinstance(p, (SegmentPartition, TailPartition)) for p in partitions)
        assert table.equals(results[label]), label
    client.close()


def test_a_damaged_segment_task_reads_its_range_from_frames(local_store) -> None:
    client = local_store.open()
    name = "site/dmg"
    write_history(client, name, seed=13, rounds=12, fragment=300)
    client.compact(name, target_length=600, retire_grace=0)
    more_history(client, name, 14)
    options = ReadOptions.parse({"store": local_store.url, "journals": name})
    before, _ = read_all(OncelogBatchReader(options, RAW))
    rec = segment_records(client, name)[0][0]
    meta = MetaStore.of(client, internal=True)
    data = bytearray(meta.read(file_path(name, rec.file)) or b"")
    data[-100] ^= 1
    meta.write(file_path(name, rec.file), bytes(data))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        after, partitions = read_all(OncelogBatchReader(options, RAW))
    assert any(isinstance(p, SegmentPartition) for p in partitions)
    assert after.equals(before)
    assert any(w.category is SegmentWarning and rec.name in str(w.message) for w in caught)
    client.close()
