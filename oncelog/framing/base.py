"""The Framing protocol, the content-type registry and stream decoding (the framing
errors live in `oncelog.framing.errors` and are re-exported here).

A framing turns messages into the bytes of a journal and back. Decoding works
on whole buffers: one call decodes every complete frame of a buffer into
Envelopes, which is what keeps readers fast in Python.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import accumulate, islice, repeat
from types import MappingProxyType
from typing import Any, Protocol, TypeVar, runtime_checkable

from oncelog.framing.errors import (
    DesyncDetected,
    EncodeError,
    FrameDecodeError,
    FramingError,
    MalformedFrame,
    TruncatedFrame,
    UnknownContentType,
)
from oncelog.identity import Envelope

__all__ = [
    "CONTENT_TYPE_JSON_LINES",
    "CONTENT_TYPE_CSV",
    "CONTENT_TYPE_PROTOBUF_FIXED",
    "Buffer",
    "FramingError",
    "UnknownContentType",
    "EncodeError",
    "FrameDecodeError",
    "MalformedFrame",
    "DesyncDetected",
    "TruncatedFrame",
    "DecodeResult",
    "Framing",
    "register",
    "for_content_type",
    "content_types",
    "decode_stream",
    "decode_batches",
    "set_gc_pausing",
]

CONTENT_TYPE_JSON_LINES = "application/x-ndjson"
"""Newline-delimited JSON documents (Gazette's `labels.ContentType_JSONLines`)."""
CONTENT_TYPE_CSV = "text/csv"
"""RFC 4180 CSV records (Gazette's `labels.ContentType_CSV`)."""
CONTENT_TYPE_PROTOBUF_FIXED = "application/x-protobuf-fixed"
"""Protobuf payloads behind a magic word and length (Gazette's `ContentType_ProtoFixed`)."""

Buffer = bytes | bytearray | memoryview
"""What a framing decodes from."""

_SNIPPET = 64


def snippet(data: bytes | bytearray | memoryview) -> str:
    """A short printable form of some bad bytes, for error messages."""
    data = bytes(data[: _SNIPPET + 1])
    if len(data) > _SNIPPET:
        return f"{data[:_SNIPPET]!r}..."
    return repr(data)


@dataclass(slots=True)
class DecodeResult:
    """The envelopes decoded from a buffer and how many of its bytes they used.

    Only whole frames are consumed: a trailing partial frame stays in the buffer
    (`buffer[consumed:]`) to be decoded again once more data follows it.
    """

    envelopes: list[Envelope]
    consumed: int
    next_offset: int
    """Journal offset of `buffer[consumed]`: where the next decode starts."""


@runtime_checkable
class Framing(Protocol):
    """Marshals messages into frames of one content type and decodes buffers of them."""

    content_type: str

    def marshal(self, msg: Any) -> bytes:
        """One whole frame holding `msg`."""
        ...

    def decode(
        self,
        buf: Buffer,
        *,
        journal: str,
        base: int = 0,
        final: bool = False,
        new_message: Callable[[Any], Any] | None = None,
    ) -> DecodeResult:
        """Decode every whole frame of `buf`, whose first byte is at journal offset `base`.

        With `final=True` the buffer is the end of the data, so a trailing
        partial frame raises TruncatedFrame. Bad bytes raise a FrameDecodeError
        carrying the envelopes decoded before them.
        """
        ...


_registry: dict[str, Framing] = {}
_registry_lock = threading.Lock()

registered: Mapping[str, Framing] = MappingProxyType(_registry)
"""A read-only, live view of the registry by normalised content type (lower case, no
parameters): a dict lookup for hot paths that already hold a normalised type."""

registered_get: Callable[[str], Framing | None] = _registry.get
"""`registered.get` without the view's indirection (one C call, for per-message paths): the
framing registered for a normalised content type, or None."""


def _normalize(content_type: str) -> str:
    # Media types are case-insensitive and may carry parameters ("text/csv; charset=utf-8").
    return content_type.split(";", 1)[0].strip().lower()


def register(framing: Framing) -> Framing | None:
    """Register `framing` for its content type; returns the framing it replaces, if any."""
    content_type = getattr(framing, "content_type", None)
    if not isinstance(content_type, str) or not _normalize(content_type):
        raise TypeError(f"{framing!r} has no content_type string to register it under")
    key = _normalize(content_type)
    with _registry_lock:
        previous = _registry.get(key)
        _registry[key] = framing
    return previous


def for_content_type(content_type: str) -> Framing:
    """The framing registered for a journal's `content-type` label value."""
    framing = _registry.get(_normalize(content_type)) if isinstance(content_type, str) else None
    if framing is None:
        raise UnknownContentType(content_type, content_types())
    return framing


def content_types() -> list[str]:
    """The content types that have a registered framing, sorted."""
    return sorted(_registry)


# --- decoding support shared by the framings ---------------------------------------------

_gc_lock = threading.Lock()
_gc_depth = 0
_gc_resume = False
_gc_promote = False

PROMOTE_BATCH = 50_000
"""Frames in one batch from which the end of a pause promotes the batch to the oldest
generation instead of leaving it to young-generation collections."""

GC_PAUSE_ENV = "ONCELOG_GC_PAUSE"
"""Set to 1 to opt a process in to pausing the collector while decoding, without code."""

_gc_pausing = os.environ.get(GC_PAUSE_ENV, "") not in ("", "0")


def set_gc_pausing(enabled: bool) -> bool:
    """Opt in (or out) of pausing the process's garbage collector while decoding; returns
    the previous setting. Off by default: a library must not change its host process's
    collector behind its back.

    When on, decoding a large batch disables the cyclic collector process-wide for the
    batch (see `gc_paused`) and may `gc.freeze()`/`gc.unfreeze()` to promote it; this
    makes bulk decoding faster (benchmarks/framing.py) in processes that own their
    collector, e.g. a batch job.
    """
    global _gc_pausing
    with _gc_lock:
        previous, _gc_pausing = _gc_pausing, bool(enabled)
    return previous


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a batch of envelopes is built, if the
    process opted in with `set_gc_pausing(True)`; otherwise do nothing.

    Building many objects that all stay referenced makes CPython run collections
    that free nothing and cost more than the decoding itself. Nested and
    concurrent pauses are counted; the collector is re-enabled only if it was
    enabled when the first pause began. After a batch of PROMOTE_BATCH frames or
    more (see `batch_built`), the young objects are moved to the oldest generation
    in O(1) (`gc.freeze()` then `gc.unfreeze()`) rather than traversed by a
    young-generation collection; this is skipped when the process keeps frozen
    objects of its own.
    """
    global _gc_depth, _gc_resume, _gc_promote
    if not _gc_pausing:
        yield
        return
    with _gc_lock:
        if _gc_depth == 0:
            _gc_resume = gc.isenabled()
            gc.disable()
        _gc_depth += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_depth -= 1
            if _gc_depth == 0:
                if _gc_resume:
                    if _gc_promote and gc.get_freeze_count() == 0:
                        gc.freeze()
                        gc.unfreeze()
                    gc.enable()
                _gc_promote = False


def batch_built(frames: int) -> None:
    """Inside `gc_paused`: a batch of `frames` envelopes was built."""
    global _gc_promote
    if frames >= PROMOTE_BATCH:
        _gc_promote = True


T = TypeVar("T")
R = TypeVar("R")


def map_until_error(
    func: Callable[[T], R], items: Sequence[T]
) -> tuple[list[R], int | None, Exception | None]:
    """`[func(x) for x in items]` at C speed; on an exception, the results before it,
    the index of the failing item and the exception."""
    try:
        return list(map(func, items)), None, None
    except Exception:
        pass
    out: list[R] = []
    append = out.append
    for i, item in enumerate(items):
        try:
            append(func(item))
        except Exception as exc:
            return out, i, exc
    return out, None, None  # func failed only the first time; its results now stand


def frame_offsets(lengths: Iterable[int], base: int) -> list[int]:
    """Offsets of consecutive frames of the given lengths from `base` (one more than lengths)."""
    return list(accumulate(lengths, initial=base))


def build_envelopes(journal: str, offsets: list[int], messages: Iterable[Any]) -> list[Envelope]:
    """Envelopes of messages whose frames start at offsets[i] and end at offsets[i + 1]."""
    return list(map(Envelope, repeat(journal), offsets, islice(offsets, 1, None), messages))


# --- stream decoding ---------------------------------------------------------------------

ErrorHandler = Callable[[FrameDecodeError], None]


def decode_batches(
    framing: Framing,
    chunks: Iterable[Buffer],
    *,
    journal: str,
    offset: int = 0,
    new_message: Callable[[Any], Any] | None = None,
    on_error: ErrorHandler | None = None,
) -> Iterator[list[Envelope]]:
    """Lists of envelopes, one or more per chunk, of the frames in consecutive chunks of a
    journal starting at `offset`: `decode_stream` a batch at a time, for hot paths.

    Partial frames are carried over to the next chunk; the end of `chunks` is the
    end of the data (a partial frame left then raises TruncatedFrame). On bad bytes,
    the envelopes before them are yielded (and cleared from the error), then the
    error is raised, or, when `on_error` is given, passed to it and decoding
    resumes after the bad bytes (`on_error` may raise to stop instead).
    """
    pending = bytearray()
    base = offset
    # While a frame longer than the chunks is incomplete, decoding waits until the pending
    # bytes have doubled, so a long frame costs O(its length) to find, not O(length^2/chunk).
    wait_for = 0

    def drain(final: bool) -> Iterator[list[Envelope]]:
        nonlocal base, wait_for
        while True:
            try:
                result = framing.decode(
                    pending, journal=journal, base=base, final=final, new_message=new_message
                )
            except FrameDecodeError as exc:
                if exc.envelopes:
                    yield exc.envelopes
                exc.envelopes = []  # delivered: don't keep them alive with the error
                if on_error is None or exc.end is None:
                    raise
                on_error(exc)
                del pending[: exc.end - base]
                base = exc.end
                continue
            del pending[: result.consumed]
            base = result.next_offset
            wait_for = 2 * len(pending) if result.consumed == 0 else 0
            if result.envelopes:
                yield result.envelopes
            return

    for chunk in chunks:
        if chunk:
            pending += chunk
            if len(pending) >= wait_for:
                yield from drain(False)
    yield from drain(True)


def decode_stream(
    framing: Framing,
    chunks: Iterable[Buffer],
    *,
    journal: str,
    offset: int = 0,
    new_message: Callable[[Any], Any] | None = None,
    on_error: ErrorHandler | None = None,
) -> Iterator[Envelope]:
    """Envelopes of the frames in consecutive chunks of a journal starting at `offset`
    (see `decode_batches` for partial frames and bad bytes)."""
    for batch in decode_batches(
        framing, chunks, journal=journal, offset=offset, new_message=new_message,
        on_error=on_error,
    ):
        yield from batch
