"""Bulk stamping and framing of JSON documents (`Publisher.publish_many`'s hot path).

`frame_json(docs, uuid_field, producer, first_clock, flags)` returns the JSON-lines frames
of `docs`, document i stamped with the UUID of (producer, first_clock + i, flags): exactly
the bytes `JSONMessage.set_uuid` + `JSONFraming.marshal` give one message at a time (a
document without the UUID field gets it last; one that has it keeps its position), but
without a `uuid.UUID` or a bytes object per message. The documents are not modified.

Two implementations give the same bytes (the tests run both on the same inputs):
`oncelog._bulk.frame_json` (C: one `orjson.dumps` of the whole list, cut into its
objects, the UUID text formatted into the output) and `frame_json_pure`. The C path is
used when built, unless `ONCELOG_PURE_PYTHON=1`.

`stamper(clock)` gives the one-message path of `Publisher.publish_uncommitted` /
`publish_committed`: `stamp(doc, key, producer, clock, flags, fail)` advances `clock`, sets
`doc[key]` to the UUID text, and returns `(line, clock value)`, the line exactly what
`JSONFraming.marshal` gives the stamped document, with its errors (`stamp_json_pure` is
the reference; the C `oncelog._bulk.stamp_json` does it in one call on a C-backed `Clock`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any, NoReturn

import orjson

from oncelog.framing.base import EncodeError, snippet
from oncelog.message import (
    FLAGS_MASK,
    PRODUCER_ID_LEN,
    SEQ_COUNTER_MASK,
    SEQ_COUNTER_SHIFT,
    TIME_HI_MASK,
    Clock,
    build_uuid,
    uuid_text,
)

__all__ = [
    "frame_json",
    "frame_json_pure",
    "format_uuid",
    "native",
    "PURE_ENV",
    "stamper",
    "Stamp",
    "stamp_json_pure",
    "stamp_failed",
]

PURE_ENV = "ONCELOG_PURE_PYTHON"
"""Set to 1 to run without the C path even where it is built (as for `oncelog._speedups`)."""

_MASK64 = (1 << 64) - 1
_dumps = orjson.dumps
_APPEND_NEWLINE = orjson.OPT_APPEND_NEWLINE


def _load() -> ModuleType | None:
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return None
    try:
        from oncelog import _bulk
    except ImportError:
        return None
    _check(_bulk)
    return _bulk


def _check(module: ModuleType) -> None:
    """The C formatter hard-codes the UUID layout of oncelog.message: check that they agree
    with every field at its extremes (a mismatch is a build bug, not a fallback)."""
    producer = bytes([0x81, 0x02, 0x40, 0x08, 0x10, 0xFF])
    for clock in (0, 1, SEQ_COUNTER_MASK, (1 << 64) - 1, 0x0123456789ABCDEF):
        for flags in (0, 1, 2, FLAGS_MASK):
            want = str(build_uuid(producer, clock, flags))
            if module.format_uuid(producer, clock, flags) != want:
                raise ImportError(
                    f"oncelog._bulk formats {module.format_uuid(producer, clock, flags)}, "
                    f"oncelog.message {want}: rebuild the extension"
                )


native: ModuleType | None = _load()
"""`oncelog._bulk` when built and not disabled, else None (tests swap it to run both)."""


def format_uuid(producer: bytes, clock: int, flags: int) -> str:
    """The canonical text of the message UUID of (producer, clock, flags)."""
    if native is not None:
        return str(native.format_uuid(producer, clock, flags))
    return uuid_text(producer, clock, flags)


def stamp_failed(what: BaseException | bytes) -> NoReturn:
    """Raise the EncodeError `JSONFraming.marshal` raises for a document whose encoding
    failed (`what` the orjson error) or holds a raw newline (`what` the line)."""
    if isinstance(what, BaseException):
        raise EncodeError(f"cannot encode document as JSON: {what}") from what
    raise EncodeError(f"JSON encoding contains a raw newline: {snippet(what)}")


def stamp_json_pure(
    doc: dict[str, Any],
    key: str,
    producer: bytes,
    clock: Clock,
    flags: int,
    fail: Callable[[BaseException | bytes], NoReturn] = stamp_failed,
) -> tuple[bytes, int]:
    """Stamp `doc` at `clock.advance()` and frame it: `doc[key]` is set to the UUID text of
    (producer, that clock, flags) and the JSON line of `doc` returned with the clock, as
    `JSONMessage.set_uuid` + `JSONFraming.marshal` give it. The clock moves and the
    document is stamped even when the encoding then fails (EncodeError), as on the slow
    path. Any `Clock` (the C `stamp_json` needs a C-backed one). `fail` raises the error
    (the C function's signature: the two are interchangeable)."""
    value = clock.advance()
    doc[key] = uuid_text(producer, value, flags)
    try:
        line = _dumps(doc, option=_APPEND_NEWLINE)
    except orjson.JSONEncodeError as exc:
        fail(exc)
    if line.find(b"\n") != len(line) - 1:
        fail(line)
    return line, value


Stamp = Callable[..., "tuple[bytes, int]"]
"""`stamp(doc, key, producer, clock, flags, fail) -> (line, clock value)`."""


def stamper(clock: Clock) -> Stamp:
    """The stamp function for `clock`: the C `stamp_json` where `oncelog._bulk` is loaded and
    `clock` is C-backed (a `Clock` made while it was loaded), else `stamp_json_pure`."""
    if native is not None and isinstance(clock, native.ClockCore):
        return native.stamp_json  # type: ignore[no-any-return]
    return stamp_json_pure


def _check_ids(producer: bytes, first_clock: int, flags: int) -> None:
    if len(producer) != PRODUCER_ID_LEN or not 0 <= flags <= FLAGS_MASK:
        build_uuid(producer, first_clock, flags)  # raises, naming what is wrong
    if not 0 <= first_clock <= _MASK64:
        raise ValueError(f"clock {first_clock} is outside the unsigned 64-bit range")


def frame_json(
    docs: list[dict[str, Any]], uuid_field: str, producer: bytes, first_clock: int, flags: int
) -> bytes:
    """JSON-lines frames of `docs`, document i stamped with (producer, first_clock + i,
    flags). EncodeError (nothing framed) if a document is not a dict or cannot be encoded."""
    _check_ids(producer, first_clock, flags)
    key_json = _dumps(uuid_field)
    if native is not None:
        try:
            data: bytes | None = native.frame_json(
                docs, uuid_field, key_json, producer, first_clock, flags, _dumps
            )
        except orjson.JSONEncodeError as exc:
            raise EncodeError(f"cannot encode document as JSON: {exc}") from exc
        except TypeError as exc:
            raise EncodeError(str(exc)) from exc
        if data is not None:
            return data
    return _frame_pure(docs, uuid_field, key_json, producer, first_clock, flags)


def frame_json_pure(
    docs: list[dict[str, Any]], uuid_field: str, producer: bytes, first_clock: int, flags: int
) -> bytes:
    """`frame_json` in pure Python (the fallback, and the reference the C path is tested
    against)."""
    _check_ids(producer, first_clock, flags)
    return _frame_pure(docs, uuid_field, _dumps(uuid_field), producer, first_clock, flags)


def _frame_pure(
    docs: list[dict[str, Any]],
    key: str,
    key_json: bytes,
    producer: bytes,
    first_clock: int,
    flags: int,
) -> bytes:
    node = producer.hex()
    insert = b"," + key_json + b':"'
    alone = b"{" + key_json + b':"'
    out: list[bytes] = []
    append = out.append
    clock = first_clock
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise EncodeError(
                f"document {i} of the batch is a {type(doc).__name__}, not a dict: a JSON "
                "frame must be an object"
            )
        ts = clock >> 4
        text = "%08x-%04x-%04x-%04x-%s" % (
            ts & 0xFFFFFFFF,
            (ts >> 32) & 0xFFFF,
            ((ts >> 48) & TIME_HI_MASK) | 0x1000,
            ((clock & SEQ_COUNTER_MASK) << SEQ_COUNTER_SHIFT) | flags | 0x8000,
            node,
        )
        clock = (clock + 1) & _MASK64
        try:
            if key in doc:
                stamped = dict(doc)
                stamped[key] = text
                append(_dumps(stamped))
                append(b"\n")
                continue
            line = _dumps(doc)
        except orjson.JSONEncodeError as exc:
            raise EncodeError(f"cannot encode document as JSON: {exc}") from exc
        if len(line) == 2:  # {}
            append(alone)
        else:
            append(line[:-1])
            append(insert)
        append(text.encode())
        append(b'"}\n')
    data = b"".join(out)
    if data.count(b"\n") != len(docs):  # only an orjson.Fragment can smuggle one in
        raise EncodeError(
            f"JSON encoding contains a raw newline (an orjson.Fragment?): {snippet(data)}"
        )
    return data
