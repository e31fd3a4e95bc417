"""CSV framing (`text/csv`): one RFC 4180 record per frame, quoted newlines allowed.

Records are written with `\\n` line ends, as Gazette's Go writer does; `\\r\\n`
line ends are read too. A record may span lines inside a quoted field, so
frames end at record boundaries, not at every newline. Blank lines hold no
record and are skipped, as Go's csv reader does.

A CSV journal may name its columns: `oncelog append --header` records the header's names
in the journal's `oncelog.dev/csv-columns` label (`CSV_COLUMNS_LABEL`), and readers that
show records as named fields (`oncelog read --format json`, `read_committed_arrow(...,
parse=True)`) take them from there with `csv_columns(spec)`. The frames themselves never
change: a record stays a UUID followed by its fields, with no header line in the journal.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

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
from oncelog.framing.errors import CSVColumnsError
from oncelog.identity import Envelope
from oncelog.labels import MAX_VALUE_LENGTH, LabelSet
from oncelog.message import CSVRecord

if TYPE_CHECKING:
    from oncelog.journal.spec import JournalSpec

__all__ = [
    "CSVFraming",
    "CSV_COLUMNS_LABEL",
    "CSVColumnsError",
    "check_csv_columns",
    "csv_column_labels",
    "csv_columns",
    "csv_record_doc",
]

CSV_COLUMNS_LABEL = "oncelog.dev/csv-columns"
"""The spec label naming a CSV journal's columns, the UUID column first: one value per
column, `<position>=<name>` (`0=uuid`, `1=page`, ...), the name percent-encoded (UTF-8)
where label values do not allow its characters. Positions, not the order of the values,
give the order: a label's values are kept sorted."""

# Characters a label value allows besides ASCII letters and digits (quote() keeps those,
# and "_.-~"; "~" is not allowed in a label value, so it is encoded too).
_LABEL_SAFE = "+/="


def check_csv_columns(columns: Sequence[str], *, journal: str) -> list[str]:
    """`columns` as a list, after checking they can name a journal's columns: at least one,
    none empty, none repeated (they key JSON objects and Arrow columns), each short enough
    for a label value. Raises CSVColumnsError naming `journal` and the column."""
    names = list(columns)
    if not names:
        raise CSVColumnsError(f"journal {journal}: a CSV header needs at least one column")
    seen: set[str] = set()
    for position, name in enumerate(names):
        if name == "":
            raise CSVColumnsError(
                f"journal {journal}: column {position} of the CSV header {names} has no name"
            )
        if name in seen:
            raise CSVColumnsError(
                f"journal {journal}: the CSV header {names} names column {name!r} twice"
            )
        seen.add(name)
        if len(_label_value(position, name).encode("utf-8")) > MAX_VALUE_LENGTH:
            raise CSVColumnsError(
                f"journal {journal}: CSV column name {name[:40]!r}... is too long to record "
                f"(at most {MAX_VALUE_LENGTH} bytes in label {CSV_COLUMNS_LABEL}, encoded)"
            )
    return names


def _label_value(position: int, name: str) -> str:
    return f"{position}={quote(name, safe=_LABEL_SAFE).replace('~', '%7E')}"


def csv_column_labels(columns: Sequence[str]) -> list[str]:
    """The values of label `oncelog.dev/csv-columns` recording `columns` (checked first with
    `check_csv_columns` by whoever records them)."""
    return [_label_value(position, name) for position, name in enumerate(columns)]


def csv_columns(spec: JournalSpec | LabelSet, journal: str | None = None) -> list[str] | None:
    """The column names a CSV journal's spec (or its labels) records, in order, or None if
    it records none. Raises CSVColumnsError, naming the journal, if the label is malformed
    (a value that is not `<position>=<name>`, or positions that are not 0, 1, 2, ...)."""
    labels = spec if isinstance(spec, LabelSet) else spec.labels
    name = journal if journal is not None else getattr(spec, "name", "?")
    values = labels.values(CSV_COLUMNS_LABEL)
    if not values:
        return None
    found: dict[int, str] = {}
    for value in values:
        position, sep, encoded = value.partition("=")
        if not sep or not position.isdigit() or int(position) in found:
            raise CSVColumnsError(
                f"journal {name}: label {CSV_COLUMNS_LABEL} value {value!r} is not "
                "'<position>=<name>' with a position of its own"
            )
        found[int(position)] = unquote(encoded, errors="strict")
    if sorted(found) != list(range(len(found))):
        raise CSVColumnsError(
            f"journal {name}: label {CSV_COLUMNS_LABEL} has positions {sorted(found)}, "
            f"expected 0 to {len(found) - 1}"
        )
    return [found[i] for i in range(len(found))]


def csv_record_doc(fields: Sequence[str], columns: Sequence[str]) -> dict[str, str]:
    """A record's fields keyed by the journal's column names, in column order (the UUID
    column included, under its name). A record shorter than the header has no key for
    the columns it lacks; fields past the header's columns are kept under their position,
    `_<n>` (n from 0, counting the UUID column), so no field is ever dropped."""
    doc = dict(zip(columns, fields, strict=False))
    for position in range(len(columns), len(fields)):
        doc.setdefault(f"_{position}", fields[position])
    return doc


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
