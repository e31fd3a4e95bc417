"""Protobuf messages as Arrow columns: the `doc` of a fixed-framed journal's segments.

One mapping from a message descriptor to an Arrow struct, used both for the segments
compaction writes and for the live tail `read_committed_arrow(parse=True)` parses, so the
two always agree. Values are kept exactly: integers at their width and signedness, `float`
as float32, enums as their numbers (an open enum may hold a number without a name), bytes
as binary, repeated fields as lists, maps as Arrow maps (entries by key), nested messages as
structs. A field with presence (a message field, `optional`, a oneof member, proto2) that is
not set is null; a proto3 scalar without presence is its value, the default included. A
message type that contains itself (directly or through others) has no struct: its journal's
segments keep the payloads only.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from oncelog._extras import needs_extra

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["doc_struct", "doc_array"]


def _scalar_types() -> dict[int, pa.DataType]:
    with needs_extra("arrow", "protobuf columns (oncelog.tables)"):
        import pyarrow as pa
    from google.protobuf.descriptor import FieldDescriptor as F

    return {
        F.TYPE_DOUBLE: pa.float64(), F.TYPE_FLOAT: pa.float32(),
        F.TYPE_INT64: pa.int64(), F.TYPE_SINT64: pa.int64(), F.TYPE_SFIXED64: pa.int64(),
        F.TYPE_UINT64: pa.uint64(), F.TYPE_FIXED64: pa.uint64(),
        F.TYPE_INT32: pa.int32(), F.TYPE_SINT32: pa.int32(), F.TYPE_SFIXED32: pa.int32(),
        F.TYPE_UINT32: pa.uint32(), F.TYPE_FIXED32: pa.uint32(),
        F.TYPE_BOOL: pa.bool_(), F.TYPE_STRING: pa.string(), F.TYPE_BYTES: pa.binary(),
        F.TYPE_ENUM: pa.int32(),
    }


def _is_map(field: Any) -> bool:
    entry = field.message_type
    return bool(
        entry is not None and entry.GetOptions().map_entry and _is_repeated(field)
    )


def _is_repeated(field: Any) -> bool:
    repeated = getattr(field, "is_repeated", None)
    if repeated is not None:
        return bool(repeated)
    return bool(field.label == field.LABEL_REPEATED)


def _value_type(field: Any, scalars: dict[int, pa.DataType], within: tuple[str, ...]
                ) -> pa.DataType | None:

    if field.message_type is not None:
        return _struct(field.message_type, (), scalars, within)
    return scalars.get(field.type)


def _field_type(field: Any, scalars: dict[int, pa.DataType], within: tuple[str, ...]
                ) -> pa.DataType | None:
    import pyarrow as pa

    if _is_map(field):
        entry = field.message_type
        key = scalars.get(entry.fields_by_name["key"].type)
        value = _value_type(entry.fields_by_name["value"], scalars, within)
        if key is None or value is None:
            return None
        return pa.map_(key, value)
    item = _value_type(field, scalars, within)
    if item is None:
        return None
    return pa.list_(item) if _is_repeated(field) else item


def _struct(descriptor: Any, exclude: Iterable[str], scalars: dict[int, pa.DataType],
            within: tuple[str, ...]) -> pa.StructType | None:
    import pyarrow as pa

    if descriptor.full_name in within:
        return None  # a recursive type has no finite struct
    inside = (*within, descriptor.full_name)
    left_out = set(exclude)
    fields = []
    for field in descriptor.fields:
        if field.name in left_out:
            continue
        kind = _field_type(field, scalars, inside)
        if kind is None:
            return None
        fields.append(pa.field(field.name, kind))
    if not fields:
        return None  # Parquet has no struct of no fields
    return pa.struct(fields)


def doc_struct(descriptor: Any, exclude: Iterable[str] = ()) -> pa.StructType | None:
    """The Arrow struct of messages of `descriptor` (fields named in `exclude` left out),
    or None if they cannot be columns (a recursive type, an unknown field type, a message
    of no fields)."""
    return _struct(descriptor, exclude, _scalar_types(), ())


def _has_presence(field: Any) -> bool:
    return bool(getattr(field, "has_presence", field.message_type is not None))


_SCALAR, _PRESENT, _MESSAGE, _LIST, _MESSAGES, _MAP, _MAP_MESSAGES = range(7)
"""How a field's value becomes a column value: as it is; None unless set (presence); a
nested message's row unless unset; a list; a list of rows; map entries by key (values as
they are, or rows)."""


@functools.lru_cache(maxsize=256)
def _plan(descriptor: Any, names: tuple[str, ...] | None) -> list[tuple[str, int]]:
    """(name, how) for fields `names` of `descriptor` (all if None), decided once per
    message type (cached: nested messages ask for it once per value) rather than once per
    field value. Callers must not change the list."""
    fields = descriptor.fields if names is None else [descriptor.fields_by_name[n] for n in names]
    plan = []
    for field in fields:
        if _is_map(field):
            value = field.message_type.fields_by_name["value"]
            how = _MAP_MESSAGES if value.message_type is not None else _MAP
        elif _is_repeated(field):
            how = _MESSAGES if field.message_type is not None else _LIST
        elif field.message_type is not None:
            how = _MESSAGE
        elif _has_presence(field):
            how = _PRESENT
        else:
            how = _SCALAR
        plan.append((field.name, how))
    return plan


def _values(messages: Sequence[Any], name: str, how: int) -> list[Any]:
    """Field `name` of every message, as `how` says it becomes a column value."""
    if how == _SCALAR:
        return [getattr(m, name) for m in messages]
    if how == _PRESENT:
        return [getattr(m, name) if m.HasField(name) else None for m in messages]
    if how == _MESSAGE:
        return [_row(getattr(m, name)) if m.HasField(name) else None for m in messages]
    if how == _LIST:
        return [list(getattr(m, name)) for m in messages]
    if how == _MESSAGES:
        return [[_row(v) for v in getattr(m, name)] for m in messages]
    if how == _MAP:
        return [sorted(getattr(m, name).items()) for m in messages]
    return [[(k, _row(v)) for k, v in sorted(getattr(m, name).items())] for m in messages]


def _row(message: Any) -> dict[str, Any]:
    """A nested message as a dict for `pa.array(..., type=struct)`."""
    return {
        name: _values([message], name, how)[0] for name, how in _plan(message.DESCRIPTOR, None)
    }


def doc_array(messages: Iterable[Any], struct: pa.StructType) -> pa.StructArray:
    """`messages` (parsed protobuf messages of one class) as an array of `struct`, made by
    `doc_struct` for their class: a column per field, built a field at a time."""
    with needs_extra("arrow", "protobuf columns (oncelog.tables)"):
        import pyarrow as pa

    rows = list(messages)
    fields = [struct.field(i) for i in range(struct.num_fields)]
    if not rows:
        return pa.array([], type=struct)
    plan = _plan(rows[0].DESCRIPTOR, tuple(f.name for f in fields))
    columns = [
        pa.array(_values(rows, name, how), type=field.type)
        for (name, how), field in zip(plan, fields, strict=True)
    ]
    return pa.StructArray.from_arrays(columns, fields=fields)


def payload_documents(payloads: pa.Array | pa.ChunkedArray, proto_class: Any,
                      struct: pa.StructType) -> pa.StructArray:
    """The protobuf payloads (binary) parsed with `proto_class` as an array of `struct`."""
    parse = proto_class.FromString
    return doc_array([parse(p) for p in payloads.to_pylist()], struct)


def with_fields(meta: pa.Table, doc: pa.ChunkedArray) -> pa.Table:
    """`meta` with the fields of `doc` (a struct column of its rows) appended as columns,
    every one even when there are no rows (the class gives their types)."""
    with needs_extra("arrow", "protobuf columns (oncelog.tables)"):
        import pyarrow as pa

    struct: pa.StructType = doc.type
    for i in range(struct.num_fields):
        field = struct.field(i)
        meta = meta.append_column(
            field.name, pa.chunked_array([c.field(i) for c in doc.chunks], field.type)
        )
    return meta
