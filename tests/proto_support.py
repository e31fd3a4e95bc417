"""An importable protobuf class for journals that record theirs (label
`oncelog.dev/protobuf-class`): `proto_support.Event` is `framing_support.event_class()`,
and `proto_support.Wide` a message with a field of every kind a `doc` column maps."""

from __future__ import annotations

from typing import Any

from framing_support import event_class
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

Event: Any = event_class()
EVENT_CLASS = "proto_support.Event"

_F = descriptor_pb2.FieldDescriptorProto


def _wide_class() -> Any:
    file_proto = descriptor_pb2.FileDescriptorProto(
        name="oncelog_test_wide.proto", package="oncelog.test", syntax="proto3"
    )
    inner = file_proto.message_type.add(name="Inner")
    inner.field.add(name="a", number=1, type=_F.TYPE_INT32, label=_F.LABEL_OPTIONAL)
    inner.field.add(name="b", number=2, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    kind = file_proto.enum_type.add(name="Kind")
    kind.value.add(name="KIND_NONE", number=0)
    kind.value.add(name="KIND_ONE", number=1)
    wide = file_proto.message_type.add(name="Wide")
    entry = wide.nested_type.add(name="CountsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=_F.TYPE_INT64, label=_F.LABEL_OPTIONAL)
    fields = [
        ("uuid", _F.TYPE_STRING, _F.LABEL_OPTIONAL, None, False),
        ("u64", _F.TYPE_UINT64, _F.LABEL_OPTIONAL, None, False),
        ("f32", _F.TYPE_FLOAT, _F.LABEL_OPTIONAL, None, False),
        ("kind", _F.TYPE_ENUM, _F.LABEL_OPTIONAL, ".oncelog.test.Kind", False),
        ("inner", _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, ".oncelog.test.Inner", False),
        ("inners", _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".oncelog.test.Inner", False),
        ("counts", _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".oncelog.test.Wide.CountsEntry", False),
        ("maybe", _F.TYPE_INT64, _F.LABEL_OPTIONAL, None, True),
        ("begin", _F.TYPE_STRING, _F.LABEL_OPTIONAL, None, False),
    ]
    for number, (name, type_, label, type_name, optional) in enumerate(fields, start=1):
        field = wide.field.add(name=name, number=number, type=type_, label=label)
        if type_name:
            field.type_name = type_name
        if optional:
            field.proto3_optional = True
            field.oneof_index = len(wide.oneof_decl)
            wide.oneof_decl.add(name=f"_{name}")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("oncelog.test.Wide"))


Wide: Any = _wide_class()
WIDE_CLASS = "proto_support.Wide"


def _class(name: str, fields: list[tuple[str, int, int, str | None]]) -> Any:
    """`oncelog.test.<name>` of `fields` (name, type, label, type name), in its own pool."""
    file_proto = descriptor_pb2.FileDescriptorProto(
        name=f"oncelog_test_{name.lower()}.proto", package="oncelog.test", syntax="proto3"
    )
    message = file_proto.message_type.add(name=name)
    for number, (field_name, type_, label, type_name) in enumerate(fields, start=1):
        field = message.field.add(name=field_name, number=number, type=type_, label=label)
        if type_name:
            field.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"oncelog.test.{name}"))


EventV2: Any = _class("Event", [
    ("uuid", _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
    ("seq", _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
    ("user", _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
    ("ok", _F.TYPE_BOOL, _F.LABEL_OPTIONAL, None),
    ("tags", _F.TYPE_STRING, _F.LABEL_REPEATED, None),
    ("blob", _F.TYPE_BYTES, _F.LABEL_OPTIONAL, None),
    ("score", _F.TYPE_DOUBLE, _F.LABEL_OPTIONAL, None),
])
"""`Event` with a field added (7, `score`): a later version of the same message."""
EVENT_V2_CLASS = "proto_support.EventV2"

Node: Any = _class("Node", [
    ("uuid", _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
    ("name", _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
    ("child", _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, ".oncelog.test.Node"),
])
"""A recursive message: no struct holds it, so its segments keep payloads only."""
NODE_CLASS = "proto_support.Node"
