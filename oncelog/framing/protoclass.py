"""The protobuf class a fixed-framed journal records for its messages.

A fixed-framed (`application/x-protobuf-fixed`) journal's frames are protobuf payloads whose
UUID sits in a field of the message, so nothing can sequence them without the message class.
A journal may record that class in its spec, label `oncelog.dev/protobuf-class`
(`PROTOBUF_CLASS_LABEL`), as `package.module.Class` (the generated class, importable where the
journal is compacted or read; its UUID field is `uuid`). With it, compaction writes the
journal's columnar segments (its messages' fields as columns, see oncelog.tables) and
`read_committed_arrow` / `oncelog.tables.dataset` read the journal without being given the
class. The frames never change.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from oncelog.framing.errors import ProtoClassError
from oncelog.labels import CONTENT_TYPE_PROTOBUF_FIXED

if TYPE_CHECKING:
    from oncelog.journal.spec import JournalSpec

__all__ = [
    "PROTOBUF_CLASS_LABEL",
    "ProtoClassError",
    "import_proto_class",
    "import_recorded_class",
    "recorded_proto_class",
]

PROTOBUF_CLASS_LABEL = "oncelog.dev/protobuf-class"
"""Spec label naming a fixed-framed journal's protobuf message class by its import path,
`package.module.Class` (a label value cannot hold `module:Class`'s colon)."""


def is_protobuf(content_type: str) -> bool:
    """Whether `content_type` is the fixed (protobuf) framing's."""
    return content_type.split(";", 1)[0].strip().lower() == CONTENT_TYPE_PROTOBUF_FIXED


def recorded_proto_class(spec: JournalSpec) -> str | None:
    """The class a fixed-framed journal's spec records (`PROTOBUF_CLASS_LABEL`), or None
    (another framing, or no label)."""
    if not is_protobuf(spec.content_type):
        return None
    return spec.labels.value(PROTOBUF_CLASS_LABEL) or None


def import_proto_class(path: str, *, uuid_field: str = "uuid", what: str = "") -> type:
    """The protobuf message class `path` (`module.Class`, or `module:Class`) names, checked
    to have `uuid_field`; ProtoClassError saying which of those failed (`what` says where
    the name came from, e.g. "journal 'x' label oncelog.dev/protobuf-class")."""
    where = f"{what}: " if what else ""
    if ":" in path:
        module_name, _, attr = path.partition(":")
        attrs = attr.split(".")
        candidates = [(module_name, attrs)]
    else:
        parts = path.split(".")
        candidates = [(".".join(parts[:i]), parts[i:]) for i in range(len(parts) - 1, 0, -1)]
    if not candidates or not all(all(c) for c in candidates[0][1]) or not candidates[0][0]:
        raise ProtoClassError(f"{where}protobuf class {path!r} is not `module.Class`")
    cls: Any = None
    failure: Exception | None = None
    for module_name, attrs in candidates:  # the longest module that imports first
        try:
            found: Any = importlib.import_module(module_name)
            for attr in attrs:
                found = getattr(found, attr)
        except (ImportError, AttributeError, ValueError) as exc:
            failure = failure or exc
            continue
        cls = found
        break
    if cls is None:
        raise ProtoClassError(
            f"{where}protobuf class {path!r} does not import: {failure}"
        ) from None
    descriptor: Any = getattr(cls, "DESCRIPTOR", None)
    fields = getattr(descriptor, "fields_by_name", None)
    if not isinstance(cls, type) or fields is None:
        raise ProtoClassError(f"{where}{path!r} is not a protobuf message class")
    if uuid_field not in fields:
        raise ProtoClassError(
            f"{where}protobuf message {descriptor.full_name} has no field {uuid_field!r} for"
            " the UUID"
        )
    return cls


def recorded_class_label(journal: str) -> str:
    """Where a recorded class comes from, as errors about it say (`what` of
    `import_proto_class`)."""
    return f"journal {journal!r} label {PROTOBUF_CLASS_LABEL}"


def import_recorded_class(spec: JournalSpec) -> type | None:
    """The class `spec` records (`recorded_proto_class`), imported and checked; None if it
    records none; ProtoClassError naming the journal and the label if it does not import."""
    path = recorded_proto_class(spec)
    if path is None:
        return None
    return import_proto_class(path, what=recorded_class_label(spec.name))
