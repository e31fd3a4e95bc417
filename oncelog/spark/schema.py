"""The columns of an oncelog DataFrame and how each journal's frames fill `message`.

Every row is one message with its place and identity:

| column | type | |
| --- | --- | --- |
| journal | string | journal name |
| begin, end | bigint | the message's byte range `[begin, end)` |
| commit_offset | bigint | where it was committed: its ACK's offset, or its own |
| uuid | string | the message UUID (canonical, lower case) |
| producer | string | producer ID, 12 hex digits |
| clock | bigint | the UUID's 64-bit clock |
| time | timestamp | the clock's time (null for the nil UUID) |
| flags | int | 0 outside a transaction, 1 continue, 2 acknowledge |
| uuid_key | string | a time-sortable key (version 6 UUID) |
| message | string, binary, struct | text, protobuf payload, or a struct (`schema`, CSV names) |

Sorting by `(journal, commit_offset, begin)` gives `read_committed`'s order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from oncelog.framing import CONTENT_TYPE_CSV, CONTENT_TYPE_JSON_LINES, CONTENT_TYPE_PROTOBUF_FIXED
from oncelog.spark.errors import SchemaError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

__all__ = [
    "METADATA_COLUMNS",
    "MessageKind",
    "SchemaError",
    "csv_struct_ddl",
    "message_kind",
    "source_ddl",
    "source_struct",
    "check_schema",
    "arrow_schema",
    "source_arrow_schema",
]

METADATA_COLUMNS: tuple[tuple[str, str], ...] = (
    ("journal", "string"),
    ("begin", "bigint"),
    ("end", "bigint"),
    ("commit_offset", "bigint"),
    ("uuid", "string"),
    ("producer", "string"),
    ("clock", "bigint"),
    ("time", "timestamp"),
    ("flags", "int"),
    ("uuid_key", "string"),
)
"""Name and Spark type of every column before `message`, in order."""

_TEXT_CONTENT = {CONTENT_TYPE_JSON_LINES: "\n", CONTENT_TYPE_CSV: "\r\n"}


@dataclass(frozen=True, slots=True)
class MessageKind:
    """How frames of one content type become the `message` column: text without its line
    end (`trim`), a protobuf payload (binary), a JSON document parsed by `schema`
    (`parsed`), or a CSV record keyed by its journal's recorded column names (`columns`,
    the UUID column first: the struct's fields are those names, or `schema`'s).

    Invariant: `parsed` and `columns` never both hold; `columns` only for `text/csv`."""

    content_type: str
    spark_type: str
    trim: str = ""
    parsed: bool = False
    columns: tuple[str, ...] | None = None


def _ddl_name(name: str) -> str:
    """`name` as a Spark DDL identifier: back-quoted, a back-quote in it doubled."""
    return "`" + name.replace("`", "``") + "`"


def csv_struct_ddl(columns: Sequence[str]) -> str:
    """The DDL of the `message` struct of a CSV journal recording `columns`: one string
    field per column, the UUID column included, in the header's order."""
    return "struct<" + ", ".join(f"{_ddl_name(name)}: string" for name in columns) + ">"


def message_kind(
    content_type: str,
    schema: str | None,
    csv_columns: Sequence[str] | None = None,
    *,
    journal: str = "?",
) -> MessageKind:
    """The message column kind of a journal's content type (SchemaError if unsupported).

    `csv_columns`: the column names a `text/csv` journal records (label
    `oncelog.dev/csv-columns`), which make its records a struct keyed by them (by
    `schema`'s fields, if given); ignored for other content types. `journal` names the
    journal in errors."""
    ct = content_type.split(";", 1)[0].strip().lower()
    columns = tuple(csv_columns) if csv_columns is not None and ct == CONTENT_TYPE_CSV else None
    if columns is not None:
        spark_type = f"struct<{schema}>" if schema is not None else csv_struct_ddl(columns)
        return MessageKind(ct, spark_type, _TEXT_CONTENT[ct], columns=columns)
    if schema is not None:
        if ct == CONTENT_TYPE_CSV:
            raise SchemaError(
                "option 'schema' parses JSON documents, or CSV records by the column names "
                f"their journal records, but CSV journal {journal} records none (label "
                "oncelog.dev/csv-columns): append its data with `oncelog append --header`"
            )
        if ct != CONTENT_TYPE_JSON_LINES:
            raise SchemaError(
                f"option 'schema' parses JSON documents, but journal {journal} has content "
                f"type {ct!r}"
            )
        return MessageKind(ct, f"struct<{schema}>", "\n", parsed=True)
    if ct in _TEXT_CONTENT:
        return MessageKind(ct, "string", _TEXT_CONTENT[ct])
    if ct == CONTENT_TYPE_PROTOBUF_FIXED:
        return MessageKind(ct, "binary")
    raise SchemaError(
        f"no message column for content type {ct!r}: oncelog reads "
        f"{CONTENT_TYPE_JSON_LINES}, {CONTENT_TYPE_CSV} and {CONTENT_TYPE_PROTOBUF_FIXED}"
    )


def source_ddl(message_type: str) -> str:
    """The DataFrame schema as Spark DDL, given the message column's type."""
    cols = [f"`{name}` {kind}" for name, kind in METADATA_COLUMNS]
    cols.append(f"`message` {message_type}")
    return ", ".join(cols)


def source_struct(message_type: object) -> StructType:
    """The DataFrame schema as a StructType, given the message column's Spark DataType
    (built without a JVM, unlike parsing `source_ddl`)."""
    from pyspark.sql.types import (
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    types = {"string": StringType(), "bigint": LongType(), "int": IntegerType(),
             "timestamp": TimestampType()}
    fields = [StructField(name, types[kind]) for name, kind in METADATA_COLUMNS]
    fields.append(StructField("message", message_type))  # type: ignore[arg-type]
    return StructType(fields)


def check_schema(schema: StructType) -> None:
    """Raise SchemaError unless `schema` has the source's columns (a user-given `.schema()`
    may only change the message column)."""
    names = [f.name for f in schema.fields]
    expected = [name for name, _ in METADATA_COLUMNS] + ["message"]
    if names != expected:
        raise SchemaError(
            f"the oncelog source has columns {expected}, not {names}: describe JSON documents "
            "with option 'schema' (a DDL string such as 'page string, n bigint') instead"
        )


def source_arrow_schema(message_type: pa.DataType) -> pa.Schema:
    """The Arrow schema of the source's rows, given the message column's Arrow type, built
    with pyarrow alone (what `arrow_schema(source_struct(...))` gives, without PySpark)."""
    import pyarrow as pa

    types = {"string": pa.string(), "bigint": pa.int64(), "int": pa.int32(),
             "timestamp": pa.timestamp("us", tz="UTC")}
    fields = [pa.field(name, types[kind]) for name, kind in METADATA_COLUMNS]
    fields.append(pa.field("message", message_type))
    return pa.schema(fields)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects of the batches `read()` yields for `schema`."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import MapType, StructType

    def has_map(dt: object) -> bool:
        if isinstance(dt, MapType):
            return True
        if isinstance(dt, StructType):
            return any(has_map(f.dataType) for f in dt.fields)
        inner = getattr(dt, "elementType", None)
        return inner is not None and has_map(inner)

    if has_map(schema["message"].dataType):
        raise SchemaError(
            "map types are not supported in option 'schema': describe JSON objects as structs"
        )
    return to_arrow_schema(schema, timezone="UTC")
