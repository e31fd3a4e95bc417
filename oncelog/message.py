"""Ready message types: JSON documents, JSON lines read lazily, CSV records, protobuf.

Each carries its UUID in a field of its own and implements the `Message` protocol.
Message identity (the UUID layout, clocks, flags, producer IDs, `Envelope`) lives in
`oncelog.identity`; every public name there is re-exported here, so `oncelog.message`
remains the one import for both. This module imports nothing from `oncelog.framing`
(the framings import it): a JSONLine that turns out malformed is decoded again by the
JSON framing through `JSONLine._reparse`, which the framing installs when it is imported.
"""

from __future__ import annotations

import uuid
from binascii import unhexlify
from collections import deque
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Any, Callable, ClassVar, cast

from oncelog.errors import BadMessage
from oncelog.identity import (
    _NIL_FIELDS,
    ACK_TXN,
    CLOCK_SEQ_BYTE,
    CONTINUE_TXN,
    FLAGS_MASK,
    NIL_UUID,
    OUTSIDE_TXN,
    PRODUCER_BYTE,
    PRODUCER_ID_LEN,
    SEQ_COUNTER_MASK,
    SEQ_COUNTER_SHIFT,
    TIME_HI_MASK,
    UNIX_EPOCH_OFFSET,
    Clock,
    Envelope,
    Flags,
    Message,
    _bulk_fields,
    build_uuid,
    check_producer_id,
    clock_from_unix_ns,
    clock_to_unix_ns,
    get_clock,
    get_flags,
    get_producer_id,
    new_producer_id,
    parse_uuid_fields,
    time_sortable_key,
    uuid_fields,
    uuid_text,
)

__all__ = [
    "Flags",
    "OUTSIDE_TXN",
    "CONTINUE_TXN",
    "ACK_TXN",
    "FLAGS_MASK",
    "CLOCK_SEQ_BYTE",
    "SEQ_COUNTER_SHIFT",
    "SEQ_COUNTER_MASK",
    "TIME_HI_MASK",
    "PRODUCER_BYTE",
    "PRODUCER_ID_LEN",
    "UNIX_EPOCH_OFFSET",
    "NIL_UUID",
    "Clock",
    "new_producer_id",
    "check_producer_id",
    "build_uuid",
    "uuid_text",
    "get_clock",
    "get_flags",
    "get_producer_id",
    "uuid_fields",
    "parse_uuid_fields",
    "clock_from_unix_ns",
    "clock_to_unix_ns",
    "time_sortable_key",
    "prime_ids",
    "Message",
    "Envelope",
    "JSONMessage",
    "JSONLine",
    "CSVRecord",
    "ProtoMessage",
]

_message_doc = attrgetter("message.doc")


def prime_ids(envelopes: list["Envelope"]) -> None:
    """Parse the UUIDs of a batch of JSON-message envelopes in bulk, caching each `.ids`.

    The hot path of read-committed reading: the canonical UUID strings are joined,
    hex-decoded and taken apart at C speed (see `_bulk_fields`); the caller may
    pause the garbage collector around it, as decoding does. Anything else (other
    message types, nil or non-canonical UUIDs) is left to parse lazily, one envelope
    at a time.
    """
    if not envelopes or (envelopes[0]._ids is not None and envelopes[-1]._ids is not None):
        return  # empty, or parsed already (the C decoder parses UUIDs as it decodes)
    first = envelopes[0].message
    if type(first) is not JSONMessage:
        return
    field_name = first.uuid_field
    try:
        joined = "".join(map(itemgetter(field_name), map(_message_doc, envelopes)))
    except (KeyError, TypeError, AttributeError):
        return  # a message without a string UUID, or of another type: parse lazily
    n = len(envelopes)
    if (
        len(joined) != 36 * n
        or joined[8::36].count("-") != n
        or joined[13::36].count("-") != n
        or joined[18::36].count("-") != n
        or joined[23::36].count("-") != n
    ):
        return
    try:
        digits = joined.encode("ascii").translate(None, b"-")
        if len(digits) != 32 * n:  # a dash where a digit belongs
            return
        raw = unhexlify(digits)  # unlike bytes.fromhex, skips no whitespace
    except ValueError:  # not ASCII, or not hex digits
        return
    deque(map(setattr, envelopes, repeat("_ids"), _bulk_fields(raw, n)), maxlen=0)


def _uuid_from_field(value: Any, where: str) -> uuid.UUID:
    if value is None or value == "":
        return NIL_UUID
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, (bytes, bytearray)):
        if len(value) != 16:
            raise ValueError(f"{where}: a UUID in bytes must be 16 long, got {len(value)}")
        return uuid.UUID(bytes=bytes(value))
    try:
        return uuid.UUID(value)
    except (ValueError, TypeError, AttributeError):
        raise ValueError(f"{where}: not a UUID: {value!r}") from None


class JSONMessage:
    """A JSON document (a dict) carrying its UUID as a string at `uuid_field`."""

    __slots__ = ("doc", "uuid_field")

    def __init__(self, doc: dict[str, Any] | None = None, uuid_field: str = "uuid") -> None:
        self.doc = {} if doc is None else doc
        self.uuid_field = uuid_field

    def get_uuid(self) -> uuid.UUID:
        return _uuid_from_field(self.doc.get(self.uuid_field), f"JSON field {self.uuid_field!r}")

    def uuid_fields(self) -> tuple[bytes, int, Flags | int]:
        value = self.doc.get(self.uuid_field)
        if value is None or value == "":
            return _NIL_FIELDS
        if isinstance(value, str):
            try:
                return parse_uuid_fields(value)
            except ValueError:
                pass  # non-canonical but maybe valid: let uuid.UUID decide
        return uuid_fields(self.get_uuid())

    def set_uuid(self, u: uuid.UUID) -> None:
        self.doc[self.uuid_field] = str(u)

    def new_acknowledgement(self, journal: str) -> "JSONMessage":
        return JSONMessage({}, self.uuid_field)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, JSONMessage):
            return self.doc == other.doc and self.uuid_field == other.uuid_field
        return NotImplemented  # a JSONLine compares itself

    def __repr__(self) -> str:
        return f"JSONMessage({self.doc!r})"


def lazy_uuid_text(line: bytes, prefix: bytes, key: bytes) -> bytes | None:
    """The UUID text of a JSON line that can be taken without parsing it, or None.

    `key` is the UUID field's name in quotes, `prefix` is `{` + key + `:"`. Two shapes
    qualify: the field as the line's last member (`...,"uuid":"<36>"}` + newline: a parser
    keeps the last of repeated keys, and the closing brace right after the value makes it
    a member of the top-level object), or as its first member with no later occurrence of
    the key nor any `\\u` escape (either could spell a later, overriding key). The C
    decoder (`decode_json_lazy`) applies the same rules.
    """
    k = len(line) - 41 - len(key)
    if (
        k >= 1
        and line[:1] == b"{"
        and line[-3:] == b'"}\n'
        and line[-41:-39] == b':"'
        and line[k : k + len(key)] == key
        and line[k - 1 : k] in (b",", b"{")
    ):
        return line[-39:-3]
    n = len(prefix)
    if (
        line.startswith(prefix)
        and line[n + 36 : n + 37] == b'"'
        and line.count(key) == 1
        and b"\\u" not in line
    ):
        return line[n : n + 36]
    return None


class JSONLine:
    """A JSON-lines message read lazily: the line as stored, parsed on first use of `doc`.

    Readers make these with `lazy=True` (`read_committed(..., lazy=True)`, consumers,
    `oncelog read`): a line is looked at only as far as its UUID, when the line starts with
    it (`{"uuid":"<36 characters>"`, as oncelog writes it), so a message that is never
    used, or only forwarded as bytes, is never parsed. Any other line is parsed at once, as
    eager reading would. `line` holds the frame's bytes, newline included; `journal` and
    `begin` say where it was read, for errors. A line whose document turns out malformed
    raises MalformedFrame from `doc`, naming the journal and offsets.
    """

    __slots__ = ("line", "uuid_field", "journal", "begin", "_doc")
    _doc: dict[str, Any]
    _reparse: ClassVar[Callable[[JSONLine], dict[str, Any]]]
    """Decodes a line that is not a JSON object as eager reading does, raising what that
    raises (MalformedFrame, naming journal and offsets). `oncelog.framing.jsonlines` installs
    its JSON framing's here when imported, which `import oncelog` always does: the framing
    imports this module, so this module does not import the framing."""

    def __init__(
        self,
        line: bytes,
        uuid_field: str = "uuid",
        journal: str = "",
        begin: int = 0,
        doc: dict[str, Any] | None = None,
    ) -> None:
        self.line = line
        self.uuid_field = uuid_field
        self.journal = journal
        self.begin = begin
        if doc is not None:
            self._doc = doc  # unset until parsed (the C decoder leaves it unset too)

    @property
    def parsed(self) -> bool:
        """Whether `doc` has been parsed already."""
        return hasattr(self, "_doc")

    @property
    def doc(self) -> dict[str, Any]:
        """The document, parsed from `line` on first use and kept."""
        try:
            return self._doc
        except AttributeError:
            doc = self._doc = self._parse()
            return doc

    def _parse(self) -> dict[str, Any]:
        import orjson

        try:
            doc = orjson.loads(self.line)
        except orjson.JSONDecodeError:
            doc = None
        if isinstance(doc, dict):
            return doc
        # A bad line: the JSON framing decodes it again, raising what eager reading raises.
        return JSONLine._reparse(self)

    def uuid_text(self) -> str | None:
        """The UUID string read out of the line without parsing it, where the line's shape
        allows (see `lazy_uuid_text`); None otherwise."""
        field = self.uuid_field.encode()
        text = lazy_uuid_text(self.line, b'{"' + field + b'":"', b'"' + field + b'"')
        return None if text is None else text.decode("ascii", "replace")

    def get_uuid(self) -> uuid.UUID:
        if not self.parsed:
            text = self.uuid_text()
            if text is not None:
                return _uuid_from_field(text, f"JSON field {self.uuid_field!r}")
        return _uuid_from_field(self.doc.get(self.uuid_field), f"JSON field {self.uuid_field!r}")

    def set_uuid(self, u: uuid.UUID) -> None:
        """Set the document's UUID field; `line` then no longer matches the document and is
        rewritten from it (orjson)."""
        import orjson

        doc = self.doc
        doc[self.uuid_field] = str(u)
        self.line = orjson.dumps(doc) + b"\n"

    def new_acknowledgement(self, journal: str) -> "JSONMessage":
        return JSONMessage({}, self.uuid_field)

    def __eq__(self, other: object) -> bool:
        """Equal to a JSONLine or JSONMessage with an equal document."""
        if isinstance(other, (JSONLine, JSONMessage)):
            return self.doc == other.doc and self.uuid_field == other.uuid_field
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"JSONLine({self.line!r})"


def _reject_line(line: JSONLine) -> dict[str, Any]:
    """`JSONLine._reparse` until the JSON framing replaces it (it does when imported, and
    `import oncelog` imports it): a line that is not a JSON object is a BadMessage."""
    raise BadMessage(
        f"not a JSON object: {line.line[:80]!r}",
        journal=line.journal,
        begin=line.begin,
        end=line.begin + len(line.line),
    )


JSONLine._reparse = _reject_line


class CSVRecord:
    """A CSV record (a list of strings) whose first field is the message UUID."""

    __slots__ = ("fields",)

    def __init__(self, fields: list[str] | None = None) -> None:
        self.fields = [""] if not fields else list(fields)

    def get_uuid(self) -> uuid.UUID:
        return _uuid_from_field(self.fields[0] if self.fields else None, "CSV field 0")

    def uuid_fields(self) -> tuple[bytes, int, Flags | int]:
        value = self.fields[0] if self.fields else ""
        if not value:
            return _NIL_FIELDS
        try:
            return parse_uuid_fields(value)
        except ValueError:
            return uuid_fields(self.get_uuid())

    def set_uuid(self, u: uuid.UUID) -> None:
        if self.fields:
            self.fields[0] = str(u)
        else:
            self.fields = [str(u)]

    def new_acknowledgement(self, journal: str) -> "CSVRecord":
        return CSVRecord([""])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CSVRecord) and self.fields == other.fields

    def __repr__(self) -> str:
        return f"CSVRecord({self.fields!r})"


class ProtoMessage:
    """Adapts a protobuf message with a UUID field (string, or 16 bytes) to `Message`.

    `ProtoMessage.factory(MyProto)` gives the `new_message` callable that framings
    use to decode fixed-framed payloads into `MyProto` instances.
    """

    __slots__ = ("proto", "uuid_field")

    def __init__(self, proto: Any, uuid_field: str = "uuid") -> None:
        descriptor = proto.DESCRIPTOR
        fd = descriptor.fields_by_name.get(uuid_field)
        if fd is None:
            raise ValueError(
                f"protobuf message {descriptor.full_name} has no field {uuid_field!r} for the UUID"
            )
        self.proto = proto
        self.uuid_field = uuid_field

    @classmethod
    def factory(
        cls, proto_class: type, uuid_field: str = "uuid"
    ) -> Callable[[bytes], "ProtoMessage"]:
        """A callable that parses a payload into `proto_class` and wraps it."""

        cls(proto_class(), uuid_field)  # checks the UUID field once, not per payload
        parse = cast(Any, proto_class).FromString
        new = cls.__new__

        def new_message(payload: bytes) -> ProtoMessage:
            message = new(cls)
            message.proto = parse(payload)
            message.uuid_field = uuid_field
            return message

        return new_message

    def _is_bytes_field(self) -> bool:
        fd = self.proto.DESCRIPTOR.fields_by_name[self.uuid_field]
        is_bytes: bool = fd.type == fd.TYPE_BYTES
        return is_bytes

    def get_uuid(self) -> uuid.UUID:
        return _uuid_from_field(
            getattr(self.proto, self.uuid_field),
            f"protobuf field {self.proto.DESCRIPTOR.full_name}.{self.uuid_field}",
        )

    def set_uuid(self, u: uuid.UUID) -> None:
        setattr(self.proto, self.uuid_field, u.bytes if self._is_bytes_field() else str(u))

    def new_acknowledgement(self, journal: str) -> "ProtoMessage":
        return ProtoMessage(type(self.proto)(), self.uuid_field)

    def validate(self) -> None:
        """Protobuf messages validate by having all required fields set (proto2)."""
        if not self.proto.IsInitialized():
            missing = ", ".join(self.proto.FindInitializationErrors())
            raise ValueError(f"protobuf message is missing required fields: {missing}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProtoMessage) and self.proto == other.proto

    def __repr__(self) -> str:
        return f"ProtoMessage({type(self.proto).__name__})"
