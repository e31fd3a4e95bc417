"""The Spark batch source through the segments of a fixed-framed (protobuf) journal that
records its message class (label `oncelog.dev/protobuf-class`): segment tasks take the
payloads from the segments (no frame decoding), with the class recorded or given as the
same option, with exactly the rows of the same read from frames. Driven in-process as
Spark drives it (no Spark action), as test_spark_segments.py does."""

from __future__ import annotations

import pytest
from proto_support import EVENT_CLASS, Event
from pyspark.sql.types import BinaryType
from test_spark_segments import frame_reads, read_all

from oncelog.framing import CONTENT_TYPE_PROTOBUF_FIXED
from oncelog.framing.protoclass import PROTOBUF_CLASS_LABEL
from oncelog.journal import JournalSpec
from oncelog.message import ProtoMessage
from oncelog.publisher import Publisher
from oncelog.spark.batch import OncelogBatchReader
from oncelog.spark.options import OptionError, ReadOptions
from oncelog.spark.schema import source_struct
from oncelog.spark.segmented import SegmentPartition
from oncelog.tables.segments import segment_records

PROTO = CONTENT_TYPE_PROTOBUF_FIXED
PAYLOADS = source_struct(BinaryType())


def write_events(client, name: str, proto_class: str | None) -> None:  # type: ignore[no-untyped-def]
    """Two compactions with a transaction open across each boundary, then a tail."""
    labels = {"content-type": PROTO}
    if proto_class is not None:
        labels[PROTOBUF_CLASS_LABEL] = proto_class
    client.create(JournalSpec(name, labels=labels))
    to = lambda _m: (name, PROTO)  # noqa: E731
    a, b = Publisher(client), Publisher(client)
    for r in range(3):
        b.publish_committed(to, ProtoMessage(Event(seq=r, user=f"b{r}")))
        a.publish_uncommitted(to, ProtoMessage(Event(seq=10 + r, user=f"a{r}")))
        a.flush()
        b.flush()
        if r < 2:
            client.compact(name, retire_grace=0)
        a.append_intents(a.build_ack_intents())


def test_protobuf_segment_tasks_read_payloads_and_equal_the_frames(
    local_store, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = local_store.open()
    name = "proto/seg"
    write_events(client, name, EVENT_CLASS)
    records, _ = segment_records(client, name)
    assert len(records) == 2 and all(r.parsed for r in records)
    from_frames = frame_reads(monkeypatch)
    base = {"store": local_store.url, "journals": name}
    tables = []
    for opts in (base, {**base, "proto_class": EVENT_CLASS}):
        from_frames.clear()
        table, partitions = read_all(OncelogBatchReader(ReadOptions.parse(opts), PAYLOADS))
        assert sum(isinstance(p, SegmentPartition) for p in partitions) == 2
        assert from_frames == [(records[1].end, client.head(name))]
        tables.append(table)
    assert tables[0].equals(tables[1])
    users = [Event.FromString(p).user for p in tables[0].column("message").to_pylist()]
    assert users == ["b0", "a0", "b1", "a1", "b2", "a2"]

    # The same read from frames (another class name for the same class: no segments).
    monkeypatch.undo()
    other = {**base, "proto_class": "proto_support:Event"}
    table, partitions = read_all(OncelogBatchReader(ReadOptions.parse(other), PAYLOADS))
    assert not any(isinstance(p, SegmentPartition) for p in partitions)
    assert table.equals(tables[0])
    client.close()


def test_a_protobuf_journal_without_a_class_names_the_option_and_the_label(local_store) -> None:  # type: ignore[no-untyped-def]
    client = local_store.open()
    write_events(client, "proto/bare", None)
    opts = {"store": local_store.url, "journals": "proto/bare"}
    with pytest.raises(OptionError, match=f"proto_class.*{PROTOBUF_CLASS_LABEL}"):
        read_all(OncelogBatchReader(ReadOptions.parse(opts), PAYLOADS))
    client.close()
