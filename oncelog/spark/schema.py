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
| message | string, binary, struct | document text, protobuf payload, or parsed (`schema`) |

Sorting by `(journal, commit_offset, begin)` gives `read_committed`'s order.
"""

from __future__ import annotations

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
    end (`trim`), a protobuf payload (binary), or a JSON document parsed by `schema`."""

    content_type: str
    spark_type: str
    trim: str = ""
    parsed: bool = False


def message_kind(content_type: str, schema: str | None) -> MessageKind:
    """The message column kind of a journal's content type (SchemaError if unsupported)."""
    ct = content_type.split(";", 1)[0].strip().lower()
    if schema is not None:
        if ct != CONTENT_TYPE_JSON_LINES:
            raise SchemaError(
                f"option 'schema' parses JSON documents, but a journal has content type {ct!r}"
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
