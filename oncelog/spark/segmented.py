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
import pyarrow.compute as pc
from pyspark.sql.datasource import InputPartition

from oncelog.framing.protoclass import is_protobuf, recorded_proto_class
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


def usable_with(options: ReadOptions, content_type: str, recorded: str | None = None) -> bool:
    """Whether a read with these options may use segments (they hold the default reading
    of JSON lines or CSV: the `uuid` field, the fast path, no protobuf class; or of
    protobuf messages by the class `recorded` on the journal, which the options leave as
    it is)."""
    base = content_type.split(";", 1)[0].strip().lower()
    if not (options.uuid_field == "uuid" and options.fast_path):
        return False
    if is_protobuf(base):
        return recorded is not None and options.proto_class in (None, "", recorded)
    return base in _FRAMED and not options.proto_class


def segment_partitions(
    client: JournalClient, options: ReadOptions, journal: str, content_type: str, stop: int
) -> list[InputPartition] | None:
    """The partitions of a committed read of `journal` up to `stop` through its segments,
    or None if it has none a reader would start with (then plan it as before)."""
    from oncelog.tables.merge_on_read import usable_prefix

    recorded = recorded_proto_class(client.get(journal)) if is_protobuf(content_type) else None
    if not usable_with(options, content_type, recorded):
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


def _fitted(table: pa.Table, arrow: pa.Schema, uuid_field: str,
            decoder: RangeDecoder | None = None) -> pa.Table | None:
    """The segment's rows in the read's Arrow schema, or None if they cannot be given
    exactly without parsing (the schema asks for a field the segment does not hold as
    asked, or for document fields the segment has no columns for). `decoder`: the read's
    (a CSV journal read by its recorded column names takes its struct from `_csv_message`)."""
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
        if decoder is not None and decoder.kind.columns is not None:
            message = _csv_message(table, doc, decoder)
            if message is None:
                return None
            columns.append(message)
            continue
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


def _csv_message(table: pa.Table, doc: pa.StructArray, decoder: RangeDecoder
                 ) -> pa.StructArray | None:
    """The `message` struct of a CSV journal's segment rows read by its recorded column
    names (`decoder.kind.columns`), from the segment's `doc` columns, exactly as the
    decoder builds it from the records (`RangeDecoder._csv_struct`: a field by its column's
    position, null where a record or the header has none, other types cast from the string
    with an empty field null); None if the segment cannot give it so: its `doc` was written
    by other names, a field the `doc` leaves out (the UUID column named `uuid`) cannot be
    taken from the records' text, or a value does not cast (reading the frames reports it,
    naming the record's offsets)."""
    from oncelog.tables.segments import csv_doc_fits

    names = list(decoder.kind.columns or ())
    if not csv_doc_fits(doc.type, names):
        return None
    wanted_type: pa.StructType = decoder.message_type
    children: list[pa.Array] = []
    for wanted, position in zip(wanted_type, decoder._csv_positions(), strict=True):
        if position is None:
            children.append(pa.nulls(len(doc), wanted.type))
            continue
        name = names[position] if position < len(names) else f"_{position}"
        index = doc.type.get_field_index(name)
        if index >= 0:
            values: pa.Array | None = doc.field(index)
        elif position == 0:  # the UUID column, left out of `doc` as the `uuid` column's twin
            values = _first_fields(table.column("message"))
        elif position >= len(names):  # past every record of the segment
            values = pa.nulls(len(doc), pa.string())
        else:  # a column named like a metadata column
            values = None
        if values is None:
            return None
        if wanted.type != pa.string():
            values = pc.if_else(pc.equal(values, ""), pa.scalar(None, pa.string()), values)
            try:
                values = values.cast(wanted.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                return None
        children.append(values)
    return pa.StructArray.from_arrays(children, fields=list(wanted_type))


def _first_fields(messages: pa.ChunkedArray) -> pa.Array | None:
    """The first field of each CSV record text in `messages`, or None if one is not the
    plain text before the record's first comma (quoted, or holding a line end)."""
    text = messages.combine_chunks()
    first = pc.list_element(pc.split_pattern(text, ",", max_splits=1), 0)
    if len(first) and pc.any(pc.match_substring_regex(first, '["\r\n]')).as_py():
        return None
    return first


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
        fitted = _fitted(read_segment(client, rec), arrow, decoder.uuid_field, decoder)
    except SegmentError as exc:
        warnings.warn(f"{exc}; its range is read from the journal", SegmentWarning,
                      stacklevel=2)
    if fitted is not None:
        yield from fitted.to_batches(max_chunksize=batch_rows)
        return
    seq = _sequencer(rec.journal, rec.begin, partition.states)
    yield from sequential_batches(decoder, rec.begin, rec.end, arrow, seq, batch_rows)
