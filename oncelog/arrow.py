"""Read-committed journals as Apache Arrow, from Python, without Spark.

`read_committed_arrow(client, journal)` returns a `pyarrow.Table` with the columns the Spark
data source produces (`journal`, `begin`, `end`, `commit_offset`, `uuid`, `producer`, `clock`,
`time`, `flags`, `uuid_key`, `message`), each committed message once, in commit order; with
`parse=True` a JSON-lines journal's documents become columns of their own. With pandas
installed, `.to_pandas()` turns either into a DataFrame. It uses the Spark source's decoder
and commit planner, so both give the same rows. Needs the `spark` extra (pyarrow; pyspark
only for its type names, no JVM is started).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from oncelog.framing import CONTENT_TYPE_JSON_LINES

if TYPE_CHECKING:
    import pyarrow as pa

    from oncelog.journal import JournalClient

__all__ = ["read_committed_arrow", "committed_record_batches"]


def committed_record_batches(
    client: "JournalClient",
    journal: str,
    *,
    end: int | None = None,
    batch_rows: int = 65_536,
    proto_class: str | None = None,
) -> Iterator["pa.RecordBatch"]:
    """The committed messages of `journal` (from its start to `end`, default the head as
    of the call) as Arrow record batches of at most `batch_rows` rows. `message` is the
    frame's text (JSON lines, CSV) or its protobuf payload (binary; `proto_class`,
    `module:Class`, parses UUIDs)."""
    from pyspark.sql.types import BinaryType, StringType

    from oncelog.spark.batch import decoder_for
    from oncelog.spark.options import ReadOptions
    from oncelog.spark.read import journal_batches
    from oncelog.spark.schema import arrow_schema, message_kind, source_struct

    spec = client.get(journal)
    kind = message_kind(spec.content_type, None)
    message_type = StringType() if kind.spark_type == "string" else BinaryType()
    schema = arrow_schema(source_struct(message_type))
    raw_options = {"store": "-", "journals": journal, "batch_rows": str(batch_rows)}
    if proto_class is not None:
        raw_options["proto_class"] = proto_class
    options = ReadOptions.parse(raw_options)
    decoder = decoder_for(
        client, options, journal, spec.content_type, schema.field("message").type
    )
    stop = client.head(journal) if end is None else end
    yield from journal_batches(decoder, 0, stop, schema, batch_rows)


def read_committed_arrow(
    client: "JournalClient",
    journal: str,
    *,
    end: int | None = None,
    parse: bool = False,
    proto_class: str | None = None,
) -> "pa.Table":
    """The committed messages of `journal` as one `pyarrow.Table` (see the module). With
    `parse=True`, a JSON-lines journal's `message` column is replaced by the documents'
    fields (types inferred by `pyarrow.json`; the UUID field stays in `uuid`)."""
    import pyarrow as pa
    import pyarrow.json as pajson

    batches = list(
        committed_record_batches(client, journal, end=end, proto_class=proto_class)
    )
    if batches:
        table = pa.Table.from_batches(batches)
    else:
        from pyspark.sql.types import StringType

        from oncelog.spark.schema import arrow_schema, source_struct

        table = arrow_schema(source_struct(StringType())).empty_table()
    if not parse:
        return table
    if client.get(journal).content_type.split(";")[0].strip() != CONTENT_TYPE_JSON_LINES:
        raise ValueError(
            f"parse=True reads JSON documents; journal {journal!r} holds "
            f"{client.get(journal).content_type}"
        )
    meta = table.drop_columns(["message"])
    if table.num_rows == 0:
        return meta
    # The documents' text joined by Arrow, without a Python string per message.
    import pyarrow.compute as pc

    messages = table.column("message").combine_chunks().cast(pa.large_string())
    lines = pa.LargeListArray.from_arrays(pa.array([0, len(messages)], pa.int64()), messages)
    text = pc.binary_join(lines, pa.scalar("\n", pa.large_string()))[0].as_buffer()
    docs: Any = pajson.read_json(pa.BufferReader(text))
    for name in docs.column_names:
        if name in meta.column_names:  # the UUID field, or a document field named like one
            docs = docs.drop_columns([name])
    for name in docs.column_names:
        meta = meta.append_column(name, docs.column(name))
    return meta
