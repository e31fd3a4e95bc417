"""CSV framing (`text/csv`): one RFC 4180 record per frame, quoted newlines allowed.

Records are written with `\\n` line ends, as Gazette's Go writer does; `\\r\\n`
line ends are read too. A record may span lines inside a quoted field, so
frames end at record boundaries, not at every newline. Blank lines hold no
record and are skipped, as Go's csv reader does.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any

from oncelog.framing.base import (
    CONTENT_TYPE_CSV,
    Buffer,
    DecodeResult,
    EncodeError,
    MalformedFrame,
    TruncatedFrame,
    batch_built,
    build_envelopes,
    frame_offsets,
    gc_paused,
    map_until_error,
    snippet,
)
from oncelog.identity import Envelope
from oncelog.message import CSVRecord

__all__ = ["CSVFraming"]


class _Echo:
    """A csv writer target whose `write` returns the line it is given."""

    write = staticmethod(str)


_ECHO = _Echo()


class CSVFraming:
    """CSV records, one message per record, via the stdlib csv module.

    Decoding yields `CSVRecord(fields)` unless a `new_message(fields)` factory
    is given (to the framing or to one `decode` call). Records without any quote
    character take a fast path that splits on commas; quoted records go through
    `csv.reader` in strict mode.
    """

    content_type = CONTENT_TYPE_CSV

    def __init__(self, new_message: Callable[[list[str]], Any] | None = None) -> None:
        self.new_message = new_message

    def __repr__(self) -> str:
        return "CSVFraming()"

    def marshal(self, msg: CSVRecord | Sequence[Any]) -> bytes:
        """One record line of a CSVRecord (or a list/tuple of fields), quoted as RFC 4180 asks.

        Fields that are not strings are written as `str()` of them (None as empty).
        """
        if isinstance(msg, CSVRecord):
            fields: Sequence[Any] = msg.fields
        elif isinstance(msg, (list, tuple)):
            fields = msg
        else:
            raise TypeError(
                f"CSV framing marshals a CSVRecord or a list of fields, not {type(msg).__name__}"
            )
        if not fields:
            raise EncodeError("a CSV record needs at least one field (an empty line is no record)")
        try:
            # A "\r\n" terminator makes the writer quote fields holding either character.
            line: str = csv.writer(_ECHO, lineterminator="\r\n").writerow(fields)
            return (line[:-2] + "\n").encode("utf-8")
        except (csv.Error, UnicodeEncodeError) as exc:
            raise EncodeError(f"cannot encode record as CSV: {exc}") from exc

    def decode(
        self,
        buf: Buffer,
        *,
        journal: str,
        base: int = 0,
        final: bool = False,
        new_message: Callable[[list[str]], Any] | None = None,
    ) -> DecodeResult:
        """Decode every complete record of `buf` (see `Framing.decode`)."""
        data = bytes(buf) if isinstance(buf, memoryview) else buf
        cut = data.rfind(b"\n") + 1
        factory = new_message or self.new_message or CSVRecord
        envelopes: list[Envelope] = []
        consumed = 0
        if cut:
            complete = data[:cut]
            try:
                text = str(complete, "utf-8")
                bad_utf8 = False
            except UnicodeDecodeError:
                text = str(complete, "utf-8", "surrogateescape")
                bad_utf8 = True
            lines = text.split("\n")
            lines.pop()
            if text.isascii():
                lengths: Any = map(len, lines)
            else:
                byte_lines = complete.split(b"\n")
                byte_lines.pop()
                lengths = map(len, byte_lines)
            offsets = frame_offsets(map((1).__add__, lengths), base)
            with gc_paused():
                if not bad_utf8 and '"' not in text and "\r" not in text and "" not in lines:
                    records = list(map(str.split, lines, repeat(",")))
                    messages, limit, cause = map_until_error(factory, records)
                    envelopes = build_envelopes(journal, offsets, messages)
                    if limit is not None:
                        raise _rejected(journal, data, base, offsets, limit, limit + 1, cause,
                                        envelopes)
                    used = len(lines)
                else:
                    envelopes, used = _decode_records(
                        journal, data, base, lines, offsets, factory, bad_utf8
                    )
                batch_built(len(envelopes))
            consumed = offsets[used] - base

        rest = len(data) - consumed
        if final and rest:
            if consumed < cut:
                reason = f"data ends inside a quoted CSV field ({rest} bytes)"
            else:
                reason = f"data ends inside a CSV line of {rest} bytes with no newline"
            raise TruncatedFrame(
                f"{reason}: {snippet(data[consumed:])}",
                what="truncated CSV frame",
                journal=journal,
                begin=base + consumed,
                end=base + len(data),
                data=data[consumed:],
                envelopes=envelopes,
            )
        return DecodeResult(envelopes, consumed, base + consumed)


def _decode_records(
    journal: str,
    data: bytes | bytearray,
    base: int,
    lines: list[str],
    offsets: list[int],
    factory: Callable[[list[str]], Any],
    check_utf8: bool,
) -> tuple[list[Envelope], int]:
    """Records of `lines` through csv.reader; returns envelopes and the lines they used."""
    reader = csv.reader(map(str.__add__, lines, repeat("\n")), strict=True)
    envelopes: list[Envelope] = []
    append = envelopes.append
    total = len(lines)
    prev = 0
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            n = reader.line_num
            if n >= total and "unexpected end of data" in str(exc):
                break  # a quoted field runs past the last complete line: wait for more
            raise _malformed(journal, data, base, offsets, prev, n, f"bad CSV quoting: {exc}",
                             envelopes) from exc
        n = reader.line_num
        if not fields:  # a blank line
            prev = n
            continue
        if check_utf8:
            try:
                "".join(fields).encode("utf-8")
            except UnicodeEncodeError:
                raise _malformed(journal, data, base, offsets, prev, n, "invalid UTF-8",
                                 envelopes) from None
        try:
            message = factory(fields)
        except Exception as exc:
            raise _rejected(journal, data, base, offsets, prev, n, exc, envelopes) from exc
        append(Envelope(journal, offsets[prev], offsets[n], message))
        prev = n
    return envelopes, prev


def _malformed(journal: str, data: bytes | bytearray, base: int, offsets: list[int], first: int,
               last: int, reason: str, envelopes: list[Envelope],
               what: str = "malformed CSV frame") -> MalformedFrame:
    begin, end = offsets[first], offsets[last]
    frame = data[begin - base : end - base]
    return MalformedFrame(f"{reason}: {snippet(frame)}", what=what, journal=journal,
                          begin=begin, end=end, data=frame, envelopes=envelopes)


def _rejected(journal: str, data: bytes | bytearray, base: int, offsets: list[int], first: int,
              last: int, exc: Exception | None, envelopes: list[Envelope]) -> MalformedFrame:
    return _malformed(journal, data, base, offsets, first, last,
                      f"{type(exc).__name__}: {exc}", envelopes,
                      what="CSV frame rejected by new_message")
