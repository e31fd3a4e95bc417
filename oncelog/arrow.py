"""Read-committed journals as Apache Arrow, from Python, without Spark.

`read_committed_arrow(client, journal)` returns a `pyarrow.Table` with the columns the Spark
data source produces (`journal`, `begin`, `end`, `commit_offset`, `uuid`, `producer`, `clock`,
`time`, `flags`, `uuid_key`, `message`), each committed message once, in commit order
(`read_committed`'s: by `commit_offset`, then `begin`); with
`parse=True` a JSON-lines journal's documents become columns of their own, and so do the
fields of a CSV journal that records its column names (`oncelog append --header`). With pandas
installed, `.to_pandas()` turns either into a DataFrame. It uses the Spark source's decoder
and commit planner, so both give the same rows; JSON lines are read in bulk (UUIDs and, with
`parse=True`, documents by Arrow's JSON reader in one pass, commits decided a batch at a
time). Needs pyarrow only (the `arrow` extra, or `spark`): PySpark is never imported.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from oncelog._extras import needs_extra
from oncelog.framing import CONTENT_TYPE_JSON_LINES
from oncelog.framing.protoclass import is_protobuf, recorded_proto_class

if TYPE_CHECKING:
    import pyarrow as pa

    from oncelog.journal import JournalClient

__all__ = ["read_committed_arrow", "committed_record_batches"]

_BATCH_ROWS = 65_536
"""The most rows a record batch holds (a table is made of such batches)."""


def committed_record_batches(
    client: "JournalClient",
    journal: str,
    *,
    end: int | None = None,
    batch_rows: int = _BATCH_ROWS,
    proto_class: str | None = None,
    chunk_bytes: int = 8 << 20,
) -> Iterator["pa.RecordBatch"]:
    """The committed messages of `journal` (from its start to `end`, default the head as
    of the call) as Arrow record batches of at most `batch_rows` rows. `message` is the
    frame's text (JSON lines, CSV) or its protobuf payload (binary; `proto_class`,
    `module:Class`, parses UUIDs). The journal is read `chunk_bytes` at a time (at most
    about that much frame data is decoded at once, more while a transaction is open).

    Batches come as commits are decided; rows decided together are in offset order, so
    transactions committed close together may interleave: sort by `(commit_offset, begin)`
    for read_committed's order (`read_committed_arrow` does)."""
    content_type = client.get(journal).content_type
    return _batches(client, journal, content_type, end, batch_rows, proto_class, chunk_bytes, None)


def _batches(
    client: "JournalClient",
    journal: str,
    content_type: str,
    end: int | None,
    batch_rows: int,
    proto_class: str | None,
    chunk_bytes: int,
    struct: "pa.StructType | None",
) -> Iterator["pa.RecordBatch"]:
    """committed_record_batches; with a `struct`, JSON documents are parsed into it in the
    same pass as their UUIDs (a document that does not fit it exactly is a BadMessage)."""
    with needs_extra("arrow", "committed_record_batches"):
        import pyarrow as pa

    from oncelog.spark.batches import RangeDecoder, decoder_for
    from oncelog.spark.options import ReadOptions
    from oncelog.spark.read import journal_batches
    from oncelog.spark.schema import MessageKind, message_kind, source_arrow_schema

    kind = message_kind(content_type, None)
    message_type = pa.string() if kind.spark_type == "string" else pa.binary()
    raw_options = {
        "store": "-",
        "journals": journal,
        "batch_rows": str(batch_rows),
        "chunk_bytes": str(chunk_bytes),
    }
    if proto_class is not None:
        raw_options["proto_class"] = proto_class
    options = ReadOptions.parse(raw_options)
    if struct is None:
        decoder = decoder_for(client, options, journal, content_type, message_type, threads=True)
    else:
        message_type = struct
        parsed = MessageKind(kind.content_type, "struct", kind.trim, parsed=True)
        decoder = RangeDecoder(client, journal, parsed, struct, chunk_bytes=chunk_bytes,
                               threads=True, strict_fields=True)
    schema = source_arrow_schema(message_type)
    stop = client.head(journal) if end is None else end
    yield from journal_batches(decoder, client.first_offset(journal), stop, schema, batch_rows)


_INFER_BYTES = 1 << 20
"""How much of a journal's start `read_committed_arrow(parse=True)` infers types from."""


def _inferred_struct(client: "JournalClient", journal: str) -> "pa.StructType | None":
    """The documents' fields as Arrow infers them from the first lines of `journal` (the
    UUID field left out), or None if they cannot be read that way."""
    import io

    with needs_extra("arrow", "read_committed_arrow"):
        import pyarrow as pa
        import pyarrow.json as pajson

    with client.read(journal, 0) as reader:
        data = reader.read(_INFER_BYTES)
    data = data[: data.rfind(b"\n") + 1]
    if not data:
        return None
    try:
        table = pajson.read_json(io.BytesIO(data))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    fields = [f for f in table.schema if f.name != "uuid"]
    if not fields:
        return None  # only UUIDs so far (ACKs, say): a struct of no fields has no rows
    if any(pa.types.is_null(f.type) for f in fields):
        return None  # a field seen only as null: its type is not known yet
    return pa.struct(fields)


def _flattened(table: "pa.Table") -> "pa.Table":
    """A table whose `message` is a struct, with the struct's fields as columns instead
    (those named like a source column left out; no document columns if it is empty)."""
    with needs_extra("arrow", "read_committed_arrow"):
        import pyarrow as pa

    meta = table.drop_columns(["message"])
    if table.num_rows == 0:
        return meta
    message = table.column("message")
    struct: pa.StructType = message.type
    for i in range(struct.num_fields):
        field = struct.field(i)
        if field.name not in meta.column_names:
            column = pa.chunked_array([c.field(i) for c in message.chunks], field.type)
            meta = meta.append_column(field.name, column)
    return meta


def read_committed_arrow(
    client: "JournalClient",
    journal: str,
    *,
    end: int | None = None,
    parse: bool = False,
    proto_class: str | None = None,
    chunk_bytes: int = 8 << 20,
    columns: "Sequence[str] | None" = None,
) -> "pa.Table":
    """The committed messages of `journal` as one `pyarrow.Table` (see the module). With
    `parse=True`, a JSON-lines journal's `message` column is replaced by the documents'
    fields (the UUID field stays in `uuid`; a document field named like one of the other
    columns is left out). Their types are those Arrow's JSON reader infers from the
    journal's first MiB, and the documents are parsed in the same pass as their UUIDs; if
    any committed document does not fit those types exactly (another type, a new field),
    the committed documents' text is parsed as a whole instead, its types inferred from
    all of it. Fields the journal's `oncelog.dev/arrow-schema` label declares have the
    types it gives. `columns`: only these columns, in this order (ValueError naming any the
    table does not have).

    A CSV journal whose spec records its column names (label `oncelog.dev/csv-columns`,
    set by `oncelog append --header`) reads with `parse=True` too: its `message` column
    is replaced by one string column per CSV column, named by the header, the UUID column
    included unless it is named like one of the other columns (`uuid`); a field a record
    lacks is null, and fields past the header's columns are `_<n>` (n counting from 0).
    Without recorded names, `parse=True` on a CSV journal is a ValueError saying so.

    A fixed-framed (protobuf) journal is read with `proto_class` (`module:Class`), or else
    the class its spec records (label `oncelog.dev/protobuf-class`); `parse=True` replaces
    its `message` column (the payloads) by the messages' fields, one column each
    (`oncelog.tables.protodoc`: exact types, null for an unset field with presence; the
    UUID field and fields named like the other columns left out).

    History sealed by compaction is read from the journal's columnar segments (see
    oncelog.tables): the same rows, order and offsets, without decoding or parsing (a
    named CSV journal's fields from the segments' `doc` columns, when they were written by
    the names it records now), and with `columns`, decoding only those."""
    from oncelog.tables.merge_on_read import select_columns

    table = _read(client, journal, end, parse, proto_class, chunk_bytes, columns)
    return select_columns(table, columns)


def _read(
    client: "JournalClient",
    journal: str,
    end: int | None,
    parse: bool,
    proto_class: str | None,
    chunk_bytes: int,
    columns: "Sequence[str] | None",
    *,
    segments: bool = True,
) -> "pa.Table":
    """read_committed_arrow, before `columns` are selected (segments select them already).
    `segments=False`: from the frames only (the caller found no segment to use)."""
    with needs_extra("arrow", "read_committed_arrow"):
        import pyarrow as pa
        import pyarrow.json as pajson

    from oncelog.spark.batches import BadMessage
    from oncelog.spark.schema import message_kind, source_arrow_schema
    from oncelog.tables.segments import in_commit_order

    spec = client.get(journal)
    content_type = spec.content_type
    if parse and _is_csv(content_type):
        from oncelog.framing.csvlines import CSVColumnsError, csv_columns

        names = csv_columns(spec)
        if names is None:
            raise CSVColumnsError(
                "parse=True reads JSON documents, or CSV records by the column names their "
                f"journal records, and CSV journal {journal} records none (label "
                "oncelog.dev/csv-columns): append its data with `oncelog append --header`, "
                "or read the records' text with parse=False"
            )
        if proto_class is None:
            # Sealed history from the `doc` columns of segments written by these names,
            # the rest parsed from the records' text (oncelog.tables.merge_on_read).
            from oncelog.tables.merge_on_read import committed_table

            merged = committed_table(
                client, journal, end=end, parse=True, columns=columns, csv_names=names
            )
            if merged is not None:
                return merged
        text = _read(client, journal, end, False, proto_class, chunk_bytes, None,
                     segments=False)
        from oncelog.tables.csvdoc import csv_fields

        return csv_fields(text, journal, names)
    recorded = recorded_proto_class(spec)
    if proto_class is None:
        proto_class = recorded
    if parse and is_protobuf(content_type) and proto_class is not None:
        return _protobuf_fields(
            client, journal, end, proto_class, chunk_bytes, columns,
            segments=segments and proto_class == recorded,
        )
    if parse and content_type.split(";")[0].strip() != CONTENT_TYPE_JSON_LINES:
        raise ValueError(
            f"parse=True reads JSON documents, CSV records by their recorded column names, or"
            f" protobuf messages by their class; journal {journal!r} holds {content_type}"
            + (" and records no class (label oncelog.dev/protobuf-class): give proto_class"
               if is_protobuf(content_type) else "")
        )
    if proto_class == recorded and segments:
        # Sealed history from the journal's columnar segments, the rest from its frames.
        from oncelog.tables.merge_on_read import committed_table

        merged = committed_table(client, journal, end=end, parse=parse, columns=columns)
        if merged is not None:
            return merged
    declared = None
    if parse:
        from oncelog.tables.segments import declared_schema

        declared = declared_schema(client.get(journal))
    if parse and proto_class is None and declared is None:
        # One pass: the documents parsed with their UUIDs, into the types their first lines
        # have; should any later one not fit them exactly, read the text and parse that.
        struct = _inferred_struct(client, journal)
        if struct is not None:
            try:
                batches = list(_batches(
                    client, journal, content_type, end, _BATCH_ROWS, None, chunk_bytes, struct
                ))
            except BadMessage:
                pass
            else:
                return _flattened(in_commit_order(batches, source_arrow_schema(struct)))
    kind = message_kind(content_type, None)
    text_schema = source_arrow_schema(pa.string() if kind.spark_type == "string" else pa.binary())
    batches = list(_batches(
        client, journal, content_type, end, _BATCH_ROWS, proto_class, chunk_bytes, None
    ))
    table = in_commit_order(batches, text_schema)
    if not parse:
        return table
    meta = table.drop_columns(["message"])
    if table.num_rows == 0:
        return meta
    # The documents' text joined by Arrow, without a Python string per message.
    with needs_extra("arrow", "read_committed_arrow"):
        import pyarrow.compute as pc

    messages = table.column("message").combine_chunks().cast(pa.large_string())
    lines = pa.LargeListArray.from_arrays(pa.array([0, len(messages)], pa.int64()), messages)
    text = pc.binary_join(lines, pa.scalar("\n", pa.large_string()))[0].as_buffer()
    options = None
    if declared is not None:  # the types the journal's label declares (segments use them too)
        options = pajson.ParseOptions(explicit_schema=declared, unexpected_field_behavior="infer")
    docs: Any = pajson.read_json(pa.BufferReader(text), parse_options=options)
    for name in docs.column_names:
        if name in meta.column_names:  # the UUID field, or a document field named like one
            docs = docs.drop_columns([name])
    for name in docs.column_names:
        meta = meta.append_column(name, docs.column(name))
    return meta


def _protobuf_fields(
    client: "JournalClient",
    journal: str,
    end: int | None,
    proto_class: str,
    chunk_bytes: int,
    columns: "Sequence[str] | None",
    *,
    segments: bool,
) -> "pa.Table":
    """`read_committed_arrow(parse=True)` of a fixed-framed journal: its messages' fields
    as columns (`oncelog.tables.protodoc`), from its segments' `doc` columns where they
    hold them (`segments`: the class is the one the journal records) and its payloads
    parsed with `proto_class` elsewhere."""
    from oncelog.framing.protoclass import import_proto_class, recorded_class_label
    from oncelog.tables.protodoc import payload_documents, with_fields
    from oncelog.tables.segments import proto_struct

    with needs_extra("arrow", "read_committed_arrow"):
        import pyarrow as pa

    cls = import_proto_class(
        proto_class, what=recorded_class_label(journal) if segments else "proto_class"
    )
    struct = proto_struct(cls)
    if struct is None:
        raise ValueError(
            f"parse=True: journal {journal!r}'s protobuf messages ({proto_class}) cannot be"
            " columns (a recursive message type, or no fields but the UUID): read their"
            " payloads with parse=False"
        )
    if segments:
        from oncelog.tables.merge_on_read import committed_table

        merged = committed_table(
            client, journal, end=end, parse=True, columns=columns, proto=(cls, struct)
        )
        if merged is not None:
            return merged
    table = _read(client, journal, end, False, proto_class, chunk_bytes, None, segments=False)
    docs = payload_documents(table.column("message"), cls, struct)
    return with_fields(table.drop_columns(["message"]), pa.chunked_array([docs], struct))


def _is_csv(content_type: str) -> bool:
    from oncelog.framing import CONTENT_TYPE_CSV

    return content_type.split(";")[0].strip().lower() == CONTENT_TYPE_CSV
