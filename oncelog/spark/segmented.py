"""Batch reads through a journal's columnar segments (see oncelog.tables).

For a committed batch read of a journal whose history starts with usable segments (the
reader's states agree with each, oncelog.tables.merge_on_read.usable_prefix), the driver
plans one task per segment and one task for the tail after them. A segment task reads the
Parquet file with pyarrow (checked against its CRC-32C) and hands its columns to Spark,
with no JSON parse: the documents come from the segment's `doc` struct when the schema's
`message` struct asks exactly for fields the segment holds with the same types. A segment
whose file is damaged, or whose columns do not fit the schema exactly, is read from the
journal's frames instead (sequenced from the states the driver planned it with), so the
rows are always those of a read without segments. The tail task reads frames sequentially
from the states after the last segment, as a streaming micro-batch does.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from oncelog.journal import JournalClient
from oncelog.sequencer import ProducerState, Sequencer
from oncelog.spark.batches import RangeDecoder
from oncelog.spark.options import ReadOptions
from oncelog.spark.read import sequential_batches
from oncelog.tables.errors import SegmentError, SegmentWarning
from oncelog.tables.segments import SegmentRecord, States, read_segment

__all__ = ["SegmentPartition", "TailPartition", "segment_partitions", "read_partition"]

log = logging.getLogger(__name__)

_FRAMED = ("application/x-ndjson", "text/csv")


@dataclass(frozen=True)
class SegmentPartition(InputPartition):
    """One segment of a journal, and the reader's states at its start (for the fallback)."""

    content_type: str
    record: SegmentRecord
    states: tuple[tuple[str, int, int], ...]


@dataclass(frozen=True)
class TailPartition(InputPartition):
    """Offsets `[begin, end)` of a journal after its segments, read from the frames with
    the reader's states at `begin`."""

    journal: str
    content_type: str
    begin: int
    end: int
    states: tuple[tuple[str, int, int], ...]


def _frozen(states: States) -> tuple[tuple[str, int, int], ...]:
    return tuple(sorted((p, a, b) for p, (a, b) in states.items()))


def usable_with(options: ReadOptions, content_type: str) -> bool:
    """Whether a read with these options may use segments (they hold the default reading
    of JSON lines or CSV: the `uuid` field, the fast path, no protobuf class)."""
    base = content_type.split(";", 1)[0].strip().lower()
    return (
        base in _FRAMED and options.uuid_field == "uuid" and options.fast_path
        and not options.proto_class
    )


def segment_partitions(
    client: JournalClient, options: ReadOptions, journal: str, content_type: str, stop: int
) -> list[InputPartition] | None:
    """The partitions of a committed read of `journal` up to `stop` through its segments,
    or None if it has none a reader would start with (then plan it as before)."""
    from oncelog.tables.merge_on_read import usable_prefix

    if not usable_with(options, content_type):
        return None
    prefix = usable_prefix(client, journal, stop)
    if prefix is None:
        return None
    taken, position, states = prefix
    out: list[InputPartition] = [
        SegmentPartition(content_type, rec, _frozen(at)) for rec, at in taken
    ]
    if position < stop:
        out.append(TailPartition(journal, content_type, position, stop, _frozen(states)))
    return out


def _sequencer(journal: str, begin: int, states: tuple[tuple[str, int, int], ...]) -> Sequencer:
    return Sequencer(
        {journal: begin},
        [ProducerState(journal, bytes.fromhex(p), a, b) for p, a, b in states],
    )


def _fitted(table: pa.Table, arrow: pa.Schema, uuid_field: str) -> pa.Table | None:
    """The segment's rows in the read's Arrow schema, or None if they cannot be given
    exactly without parsing (the schema asks for a field the segment does not hold as
    asked, or for document fields the segment has no columns for)."""
    message_type = arrow.field("message").type
    columns: list[pa.ChunkedArray | pa.Array] = []
    for field in arrow:
        if field.name != "message":
            column = table.column(field.name)
            columns.append(column if column.type == field.type else column.cast(field.type))
            continue
        if not pa.types.is_struct(message_type):
            column = table.column("message")
            columns.append(column if column.type == message_type else column.cast(message_type))
            continue
        if "doc" not in table.column_names:
            return None
        doc = table.column("doc").combine_chunks()
        if isinstance(doc, pa.ChunkedArray):  # pragma: no cover - combine_chunks gives an array
            return None
        doc_type: pa.StructType = doc.type
        children = []
        for i in range(message_type.num_fields):
            wanted = message_type.field(i)
            if wanted.name == uuid_field or wanted.name in arrow.names:
                return None  # a field the segment leaves out of `doc`
            index = doc_type.get_field_index(wanted.name)
            if index < 0:
                children.append(pa.nulls(len(doc), wanted.type))
            elif doc_type.field(index).type != wanted.type:
                return None
            else:
                children.append(doc.field(index))
        columns.append(pa.StructArray.from_arrays(children, fields=list(message_type)))
    return pa.Table.from_arrays(columns, schema=arrow)


def read_partition(
    client: JournalClient,
    partition: SegmentPartition | TailPartition,
    decoder: RangeDecoder,
    arrow: pa.Schema,
    batch_rows: int,
) -> Iterator[pa.RecordBatch]:
    """The record batches of a segment or tail partition (see the module)."""
    if isinstance(partition, TailPartition):
        seq = _sequencer(partition.journal, partition.begin, partition.states)
        yield from sequential_batches(
            decoder, partition.begin, partition.end, arrow, seq, batch_rows
        )
        return
    rec = partition.record
    fitted = None
    try:
        fitted = _fitted(read_segment(client, rec), arrow, decoder.uuid_field)
    except SegmentError as exc:
        warnings.warn(f"{exc}; its range is read from the journal", SegmentWarning,
                      stacklevel=2)
    if fitted is not None:
        yield from fitted.to_batches(max_chunksize=batch_rows)
        return
    seq = _sequencer(rec.journal, rec.begin, partition.states)
    yield from sequential_batches(decoder, rec.begin, rec.end, arrow, seq, batch_rows)
