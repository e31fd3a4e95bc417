"""Errors of the framings; every one derives from `FramingError`, an `oncelog.OncelogError`.

A decoding error carries where the bad bytes are (`journal`, `[begin, end)`), the bytes
themselves and the messages decoded before them, and survives pickling (Spark executors
send it to the driver). `oncelog.framing` and `oncelog.framing.base` re-export them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from oncelog.errors import OncelogError

if TYPE_CHECKING:
    from oncelog.identity import Envelope

__all__ = [
    "FramingError",
    "UnknownContentType",
    "EncodeError",
    "FrameDecodeError",
    "MalformedFrame",
    "DesyncDetected",
    "TruncatedFrame",
    "CSVColumnsError",
    "ProtoClassError",
]


class FramingError(OncelogError):
    """Base of every error a framing raises about content types, messages or bytes."""


class CSVColumnsError(FramingError, ValueError):
    """A CSV journal's column names that cannot be recorded or read back: an empty or
    repeated name, a name too long for a label, a malformed `oncelog.dev/csv-columns`
    label, or a header that differs from the columns the journal has."""


class ProtoClassError(FramingError, ValueError):
    """A protobuf message class that cannot be used for a journal: a name that is not
    `module:Class`, a module or attribute that does not import, or a class that is not a
    protobuf message with the UUID field."""


class UnknownContentType(FramingError, LookupError):
    """No framing is registered for a journal's content type."""

    def __init__(self, content_type: str, known: Sequence[str]) -> None:
        self.content_type = content_type
        self.known = tuple(known)
        super().__init__(
            f"no framing for content type {content_type!r}; "
            f"known content types: {', '.join(self.known) or '(none)'}"
        )

    def __str__(self) -> str:  # LookupError would repr() the message otherwise
        return str(self.args[0])


class EncodeError(FramingError, ValueError):
    """A message cannot be written as one frame of this framing."""


class FrameDecodeError(FramingError):
    """Bad bytes at `[begin, end)` of a journal; decoding can resume at `end`.

    `envelopes` holds the messages decoded before the bad bytes (deliver them
    first), `data` the bad bytes themselves. A reader either raises this or skips
    the bad bytes and decodes again from `end`: skipping loses only `data`.
    """

    what = "bad frame"

    def __init__(
        self,
        reason: str,
        *,
        what: str | None = None,
        journal: str | None = None,
        begin: int | None = None,
        end: int | None = None,
        data: bytes | bytearray | memoryview = b"",
        envelopes: list[Envelope] | None = None,
    ) -> None:
        if what is not None:
            self.what = what
        self.reason = reason
        self.journal = journal
        self.begin = begin
        self.end = end
        self.data = bytes(data)
        self.envelopes: list[Envelope] = [] if envelopes is None else envelopes
        super().__init__(self._message())

    def _message(self) -> str:
        where = "" if self.journal is None else f"journal {self.journal}: "
        at = "" if self.begin is None else f" at offset {self.begin}-{self.end}"
        return f"{where}{self.what}{at}: {self.reason}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), dict(self.__dict__)))


def _rebuild(cls: type[FrameDecodeError], state: dict[str, Any]) -> FrameDecodeError:
    err = cls.__new__(cls)
    err.__dict__.update(state)
    err.args = (err._message(),)
    return err


class MalformedFrame(FrameDecodeError):
    """A whole frame whose content does not decode (bad JSON, bad CSV quoting, bad protobuf)."""

    what = "malformed frame"


class DesyncDetected(FrameDecodeError):
    """Bytes that are not a frame where a frame should start; `skipped` holds them."""

    what = "fixed-frame desync"

    @property
    def skipped(self) -> bytes:
        """The discarded bytes (from `begin` up to the next magic word or the end of data)."""
        return self.data


class TruncatedFrame(FrameDecodeError):
    """Data ends part way through a frame: never returned as a short message."""

    what = "truncated frame"
