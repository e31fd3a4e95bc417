"""Merge-on-read: a journal's committed messages from its segments plus its live tail.

A reader starts at the journal's first available offset with no producer states (as
`read_committed` does) and walks forward: where a segment begins at its position and agrees
with its states (`SegmentRecord.matches`), it takes the segment's rows; elsewhere (the
tail after the last segment, a range before the first, a segment that disagrees, or one
whose file is missing or damaged, with a warning naming it) it reads the journal's frames
as `read_committed_arrow` always has. Rows, order and offsets are exactly
`read_committed`'s either way.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from oncelog._extras import needs_extra
from oncelog.tables.errors import SegmentError, SegmentWarning
from oncelog.tables.segments import (
    SegmentRecord,
    States,
    chain,
    csv_doc_fits,
    csv_documents,
    declared_schema,
    in_commit_order,
    parse_documents,
    read_range,
    read_segment,
    segment_records,
    text_decoder,
    text_schema,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from oncelog.journal import JournalClient

__all__ = ["committed_table", "select_columns", "usable_prefix"]

log = logging.getLogger(__name__)



def _parts(
    client: JournalClient, journal: str, end: int | None, skip_text: bool = False,
    skip: frozenset[str] = frozenset(),
) -> tuple[list[pa.Table], int, pa.Schema] | None:
    """The journal's committed rows as tables in commit order (segments' rows, and rows read
    from fragments), how many came from segments, and the text schema; None when the
    journal has no segment a reader could use (then read it as before). `skip_text`:
    segments holding documents as columns are read without their `message` text; `skip`:
    nor these columns."""
    spec = client.get(journal)
    records, bad = segment_records(client, journal, spec.incarnation or "")
    for what in bad:
        warnings.warn(f"{what}; its range is read from the journal", SegmentWarning,
                      stacklevel=3)
    if not records:
        return None
    stop = client.head(journal) if end is None else end
    first = client.first_offset(journal)
    by_begin = chain([r for r in records if first <= r.begin and r.end <= stop])
    if not by_begin:
        return None
    decoder = text_decoder(client, journal, spec.content_type)
    schema = text_schema(decoder)
    parts: list[pa.Table] = []
    used = 0
    position, states = first, States()
    while position < stop:
        rec = by_begin.get(position)
        if rec is not None and rec.matches(states):
            try:
                table = read_segment(
                    client, rec, skip_text=skip_text and rec.parsed, skip=skip
                )
            except SegmentError as exc:
                warnings.warn(f"{exc}; its range is read from the journal", SegmentWarning,
                              stacklevel=3)
            else:
                parts.append(table)
                states = rec.advance(states)
                position = rec.end
                used += 1
                continue
        after = [b for b in by_begin if b > position]
        upto = min(min(after, default=stop), stop)
        batches, states = read_range(decoder, position, upto, states)
        parts.append(in_commit_order(batches, schema))
        position = upto
    if not used:
        return None
    return parts, used, schema


def usable_prefix(
    client: JournalClient, journal: str, stop: int
) -> tuple[list[tuple[SegmentRecord, States]], int, States] | None:
    """The segments a reader starting at the journal's first offset takes one after another
    before it would first read frames, each with the reader's states at its start; the
    offset after them and the states there. None if it would read frames first (then a
    reader reads the journal as before). Checks records, not files: a task reading a
    segment whose file turns out damaged reads its range from frames instead."""
    spec = client.get(journal)
    records, _ = segment_records(client, journal, spec.incarnation or "")
    if not records:
        return None
    first = client.first_offset(journal)
    by_begin = chain([r for r in records if first <= r.begin and r.end <= stop])
    taken: list[tuple[SegmentRecord, States]] = []
    position, states = first, States()
    while position < stop:
        rec = by_begin.get(position)
        if rec is None or not rec.matches(states):
            break
        taken.append((rec, states))
        states = rec.advance(states)
        position = rec.end
    if not taken:
        return None
    return taken, position, states


def _documents(parts: Sequence[pa.Table], journal: str, meta_names: list[str],
               uuid_field: str, declared: pa.Schema | None,
               csv_names: Sequence[str] | None = None) -> pa.Table | None:
    """The documents of every part as one table of columns (types unified across parts: a
    field new in a later part is null before it), or None if some part's documents cannot
    be read as columns exactly. `csv_names`: the parts are a CSV journal's records, by
    these column names (a segment's `doc` is used only if it holds them by these names)."""
    with needs_extra("arrow", "read_committed_arrow"):
        import pyarrow as pa

    tables: list[pa.Table] = []
    for part in parts:
        if part.num_rows == 0:
            continue
        if "doc" in part.column_names:
            doc = part.column("doc")
            struct: pa.StructType = doc.type
            if csv_names is not None and not csv_doc_fits(struct, csv_names):
                return None  # written while the journal recorded other names
            tables.append(pa.table({
                struct.field(i).name: pa.chunked_array(
                    [c.field(i) for c in doc.chunks], struct.field(i).type
                )
                for i in range(struct.num_fields)
            }))
        else:
            if csv_names is not None:
                docs = csv_documents(part, journal, csv_names)
            else:
                docs = parse_documents(
                    part.column("message"), declared, [uuid_field, *meta_names]
                )
            if docs is None:
                return None
            tables.append(docs)
    if not tables:
        return None
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None


def _protobuf_table(
    client: JournalClient, journal: str, end: int | None, columns: Sequence[str] | None,
    proto_class: Any, struct: pa.StructType,
) -> pa.Table | None:
    """`committed_table(..., parse=True)` of a fixed-framed journal whose messages are of
    `proto_class` (`struct`: their `doc` struct): a segment's `doc` where it is `struct`
    (written by the same class), its payloads parsed with the class elsewhere (the tail,
    a segment written by an older version of the class), so every row's fields are what
    the class reads from its payload."""
    with needs_extra("arrow", "read_committed_arrow"):
        import pyarrow as pa

    from oncelog.tables.protodoc import payload_documents, with_fields

    found = _parts(client, journal, end)
    if found is None:
        return None
    parts, _, schema = found
    meta_schema = pa.schema([f for f in schema if f.name != "message"])
    meta = pa.concat_tables([p.select(meta_schema.names).cast(meta_schema) for p in parts])
    chunks: list[pa.Array] = []
    for part in parts:
        if part.num_rows == 0:
            continue
        if "doc" in part.column_names and part.column("doc").type == struct:
            chunks.extend(part.column("doc").chunks)
        else:
            chunks.append(payload_documents(part.column("message"), proto_class, struct))
    return select_columns(with_fields(meta, pa.chunked_array(chunks, struct)), columns)


def committed_table(
    client: JournalClient,
    journal: str,
    *,
    end: int | None = None,
    parse: bool = False,
    columns: Sequence[str] | None = None,
    csv_names: Sequence[str] | None = None,
    proto: tuple[Any, pa.StructType] | None = None,
) -> pa.Table | None:
    """`read_committed_arrow(client, journal, end=end, parse=parse, columns=columns)` read
    through the journal's segments, or None if it has none a reader could use. With
    `columns` and `parse`, segments decode only the columns asked for.

    `csv_names`, with `parse`: the journal is CSV and records these column names; its
    records become string columns as `read_committed_arrow` makes them
    (`oncelog.tables.csvdoc.csv_fields`), taken from the `doc` columns of segments written by the
    same names and parsed from the text elsewhere (the tail, segments written before the
    names were recorded).

    `proto`, with `parse`: the journal is fixed-framed, its messages of this class with
    this `doc` struct (`oncelog.tables.segments.proto_struct`); its rows hold the
    messages' fields as columns after the metadata columns."""
    with needs_extra("arrow", "read_committed_arrow"):
        import pyarrow as pa

    if parse and proto is not None:
        return _protobuf_table(client, journal, end, columns, *proto)

    spec = client.get(journal)
    declared = declared_schema(spec) if parse and csv_names is None else None
    skip: frozenset[str] = frozenset()
    if columns is not None and parse and csv_names is None:
        # (Not for CSV: a record's text is parsed with every metadata column at hand.)
        from oncelog.spark.schema import METADATA_COLUMNS

        skip = frozenset(n for n, _ in METADATA_COLUMNS if n not in columns)
    found = _parts(client, journal, end, skip_text=parse, skip=skip)
    if found is None:
        return None
    parts, _, schema = found
    if parse:
        meta_schema = pa.schema([f for f in schema if f.name not in ("message", *skip)])
        metas = [p.select(meta_schema.names) for p in parts]
        meta = pa.concat_tables([m.cast(meta_schema) for m in metas])
        if sum(p.num_rows for p in parts) == 0 and csv_names is None:
            return select_columns(meta, columns)  # (a table of no columns has no rows)
        all_meta = [f.name for f in schema if f.name != "message"]
        docs = _documents(parts, journal, all_meta, "uuid", declared, csv_names)
        if docs is not None:
            # The documents' columns after the metadata's (of which `columns` may keep none).
            for i, name in enumerate(meta.column_names):
                docs = docs.add_column(i, name, meta.column(name))
            return select_columns(docs, columns)
        # The documents' text (every column), to parse as a whole below.
        found = _parts(client, journal, end)
        assert found is not None
        parts = found[0]
    texts = [p.drop_columns(["doc"]) if "doc" in p.column_names else p for p in parts]
    table = pa.concat_tables([t.cast(schema) for t in texts]) if texts else schema.empty_table()
    if not parse:
        return select_columns(table, columns)
    if csv_names is not None:  # as read_committed_arrow parses a CSV journal's records
        from oncelog.tables.csvdoc import csv_fields

        return select_columns(csv_fields(table, journal, list(csv_names)), columns)
    meta = table.drop_columns(["message"])
    # As read_committed_arrow does when one pass cannot type every document: parse the
    # committed documents' text as a whole.
    docs = parse_documents(
        table.column("message"), declared, ["uuid", *meta.column_names], strict=True
    )
    assert docs is not None  # strict: Arrow's error instead of None
    for name in docs.column_names:
        meta = meta.append_column(name, docs.column(name))
    return select_columns(meta, columns)


def select_columns(table: pa.Table, columns: Sequence[str] | None) -> pa.Table:
    """`table` with only `columns`, in that order (all without); ValueError naming any
    column the table does not have."""
    if columns is None:
        return table
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ValueError(
            f"no column {', '.join(map(repr, missing))} among {', '.join(table.column_names)}"
        )
    return table.select(list(columns))
