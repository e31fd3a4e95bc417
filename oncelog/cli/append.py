"""`oncelog append`: publish a file or stdin to a journal as committed messages.

The input is decoded with the journal's framing as it is read. Each JSON or CSV record
becomes one committed message: a record with a UUID (JSON field `uuid`, CSV first field)
keeps it, after checking it is a version-1 (Gazette) UUID; a record without one is given a
new UUID (a new producer id, a clock per record, flag OUTSIDE_TXN), so read-committed readers
deliver every record. With `--idempotency-key`, the producer id and clocks are those of the
first run with that key (kept in `.oncelog/append-keys/` of the store), so a retried append
of the same input writes the same UUIDs again and readers drop the copies as duplicates.

Checked records are appended in chunks of whole frames, each chunk one append (so frames
never straddle appends, and a concurrent writer's append can only land between whole
frames). An input that fits in one chunk is appended all or nothing; after a bad record
nothing more is appended, and the error names its input line and what was appended before.
`--raw` appends the input byte for byte, unchecked.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, BinaryIO

import click
import orjson

from oncelog.cli.app import State, cli, pass_state, store_options
from oncelog.cli.output import Progress, notice, progress
from oncelog.cli.params import SIZE, format_size, plural

if TYPE_CHECKING:
    from oncelog.framing import Framing
    from oncelog.journal import AppendResult, AsyncAppend, JournalClient, JournalSpec

__all__ = ["APPEND_KEYS", "DEFAULT_CHUNK", "append"]

DEFAULT_CHUNK = 8 << 20
"""Bytes of input per append, unless the journal's fragments are smaller."""
_READ_BLOCK = 1 << 20
APPEND_KEYS = "append-keys"
"""Directory under `.oncelog/` holding the producer id and clocks of each idempotency key."""


@cli.command("append")
@click.argument("name")
@click.argument("file", type=click.File("rb"), default="-")
@click.option(
    "--raw",
    is_flag=True,
    help="Append the input byte for byte, unchecked and without UUIDs added, as one append "
    "(held in memory until written).",
)
@click.option(
    "--idempotency-key",
    metavar="KEY",
    default=None,
    help="Make a retry of this append a no-op for committed readers: records given new UUIDs "
    "get the same ones on every run with KEY (use one key per input).",
)
@click.option(
    "--header/--no-header",
    default=None,
    help="CSV: the first record is a header, not appended; its column names (with 'uuid' "
    "first under --add-uuid-column) are recorded on the journal for readers (label "
    "oncelog.dev/csv-columns), and must match the ones recorded before [default: only if "
    "its first field is 'uuid'].",
)
@click.option(
    "--add-uuid-column",
    is_flag=True,
    help="CSV: the records have no UUID column: put a new UUID before each record's fields.",
)
@click.option(
    "--chunk-size",
    type=SIZE,
    default=None,
    help="Input bytes per append, cut at frame boundaries [default: 8MiB or the fragment length].",
)
@store_options
@pass_state
def append(
    state: State,
    name: str,
    file: BinaryIO,
    raw: bool,
    idempotency_key: str | None,
    header: bool | None,
    add_uuid_column: bool,
    chunk_size: int | None,
) -> None:
    """Append FILE (default: stdin) to journal NAME as committed messages.

    Records are checked against the journal's content type (JSON objects one per line, CSV
    records, or fixed protobuf frames). A JSON or CSV record without a UUID is given one
    (JSON field "uuid"; CSV first field); one with a UUID keeps it. Blank lines are skipped
    and a missing final newline is added. Prints where the data landed on stderr.
    """
    from oncelog.framing import CONTENT_TYPE_CSV

    if raw and (idempotency_key is not None or header is not None or add_uuid_column):
        raise click.UsageError(
            "--raw appends the input as it is: --idempotency-key, --header and "
            "--add-uuid-column do not apply"
        )
    client = state.client()
    spec = client.get(name)
    if (header is not None or add_uuid_column) and spec.content_type != CONTENT_TYPE_CSV:
        raise click.UsageError(
            f"--header and --add-uuid-column apply to CSV journals; journal {name} holds "
            f"{spec.content_type}"
        )
    source = "stdin" if file.name in ("-", "<stdin>") else str(file.name)
    if source == "stdin" and file.isatty():
        notice(f"appending what you type to {name}; end with Ctrl-D")
    with progress(f"append {name}", total=_input_size(file)) as bar:
        if raw:
            appended = _append_raw(client, name, file, bar)
        else:
            from oncelog.framing import UnknownContentType, for_content_type

            try:
                framing = for_content_type(spec.content_type)
            except UnknownContentType as exc:
                raise click.ClickException(f"journal {name}: {exc}; append with --raw") from None
            size = chunk_size or min(DEFAULT_CHUNK, spec.fragment.length)
            stamper = _Stamper(client, spec, idempotency_key)
            records = _Records(framing, source, stamper, header, add_uuid_column)
            records.journal = (client, spec)  # CSV: where a header's column names go
            appended = _append_records(client, name, records, file, size, bar)
            if records.header_skipped:
                notice(f"line 1 of {source} is a CSV header: not appended")
    notice(appended.summary(name))


def _input_size(file: BinaryIO) -> int | None:
    try:
        info = os.fstat(file.fileno())
    except (OSError, ValueError, AttributeError):
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


@dataclass(slots=True)
class _Appended:
    """What was appended: each append's result, the input bytes and frames they held."""

    results: list[AppendResult] = field(default_factory=list)
    size: int = 0
    frames: int | None = 0
    stamped: int = 0

    def where(self) -> str:
        if not self.results:
            return "nothing"
        first, last = self.results[0], self.results[-1]
        count = len(self.results)
        size = plural(self.size, "byte")
        if self.size >= 1024:
            size += f" ({format_size(self.size)})"
        appends = f"{count} append{'s' if count != 1 else ''}"
        return f"{size} in {appends} at offsets {first.begin}-{last.end}"

    def summary(self, name: str) -> str:
        if not self.results:
            return f"nothing to append to {name}: the input is empty"
        frames = (
            "" if self.frames is None else f"{self.frames} frame{'s' if self.frames != 1 else ''}, "
        )
        stamped = f" ({self.stamped} given new UUIDs)" if self.stamped else ""
        return f"appended {frames}{self.where()} of journal {name}{stamped}"


def _append_raw(client: JournalClient, name: str, file: BinaryIO, bar: Progress) -> _Appended:
    done = _Appended(frames=None)
    block = file.read(_READ_BLOCK)
    if not block:
        return done
    pending = client.start_append(name)
    try:
        while block:
            pending.write(block)
            done.size += len(block)
            bar.advance(len(block))
            block = file.read(_READ_BLOCK)
    except BaseException:
        pending.abort()
        raise
    pending.release()
    done.results.append(pending.result())
    return done


class _Stamper:
    """New UUIDs for records without one: a producer id and a clock ticking once per record.

    Without a key: a new random producer id and the current time. With an idempotency key:
    the producer id and first clock recorded by the first run with that key (put-if-absent
    under `.oncelog/append-keys/`), so every run gives the n-th stamped record the same
    UUID. A committed reader then drops a rerun's records as duplicates: each one's clock is
    at or below the last clock it committed for that producer."""

    def __init__(self, client: JournalClient, spec: JournalSpec, key: str | None) -> None:
        self._client = client
        self._spec = spec
        self._key = key
        self._producer: bytes | None = None
        self._clock = 0
        self.count = 0

    def next_uuid(self) -> uuid.UUID:
        from oncelog.message import OUTSIDE_TXN, build_uuid

        if self._producer is None:
            self._producer, self._clock = self._start()
        self._clock += 1
        self.count += 1
        return build_uuid(self._producer, self._clock, OUTSIDE_TXN)

    def _start(self) -> tuple[bytes, int]:
        from oncelog.message import clock_from_unix_ns, new_producer_id

        producer, clock = new_producer_id(), clock_from_unix_ns(time.time_ns())
        if self._key is None:
            return producer, clock
        spec = self._spec
        digest = hashlib.sha256(
            b"\0".join(s.encode() for s in (spec.name, spec.incarnation or "", self._key))
        ).hexdigest()
        path = f"{APPEND_KEYS}/{digest}"
        doc = {
            "journal": spec.name,
            "producer": producer.hex(),
            "clock": clock,
            "token": uuid.uuid4().hex,  # makes the object unique to this attempt
        }
        if not self._client.meta.put_if_absent(path, orjson.dumps(doc)):
            stored = self._client.meta.read(path)
            try:
                doc = orjson.loads(stored or b"")
                producer, clock = bytes.fromhex(doc["producer"]), int(doc["clock"])
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                raise click.ClickException(
                    f"the record of --idempotency-key {self._key!r} (.oncelog/{path}) is "
                    "corrupt: delete it to start over with this key"
                ) from None
        return producer, clock


@dataclass(slots=True)
class _Bad(Exception):
    """A record that cannot be appended: its input line and why."""

    line: int
    reason: str


class _Records:
    """Turns input bytes into the frames to append, record by record: JSON and CSV records
    are checked and given UUIDs, protobuf frames are checked and kept as they are."""

    def __init__(
        self,
        framing: Framing,
        source: str,
        stamper: _Stamper,
        header: bool | None,
        add_uuid_column: bool,
    ) -> None:
        from oncelog.framing import CONTENT_TYPE_CSV, CONTENT_TYPE_JSON_LINES

        self.framing = framing
        self.source = source
        self.stamper = stamper
        self.header = header
        self.add_uuid_column = add_uuid_column
        self.header_skipped = False
        self.first = True
        self.journal: tuple[JournalClient, JournalSpec] | None = None
        self.pending_columns: tuple[list[str], int] | None = None
        self.kind = {CONTENT_TYPE_JSON_LINES: "json", CONTENT_TYPE_CSV: "csv"}.get(
            framing.content_type, "frames"
        )
        self.uuid_field = str(getattr(framing, "uuid_field", "uuid"))

    @property
    def lines(self) -> bool:
        """Whether the input is text lines (a missing final newline is added)."""
        return self.kind != "frames"

    def decode(
        self, buf: bytearray, base: int, line: int, eof: bool
    ) -> tuple[int, list[tuple[int, bytes]]]:
        """The whole records at the start of `buf` (input offset `base`, line `line`): how
        many bytes they use, and each one's input line and frame to append."""
        if self.kind == "json":
            return self._json(buf, line)
        from oncelog.cli.frames import new_message_for
        from oncelog.framing import FrameDecodeError

        try:
            with memoryview(buf) as view:
                result = self.framing.decode(
                    view,
                    journal="input",
                    base=base,
                    final=eof,
                    new_message=new_message_for(self.framing.content_type),
                )
        except FrameDecodeError as exc:
            at = (exc.begin if exc.begin is not None else base) - base
            raise _Bad(line + buf.count(b"\n", 0, at), f"{exc.what}: {exc.reason}") from None
        out: list[tuple[int, bytes]] = []
        pos, counted = 0, line
        for env in result.envelopes:
            begin, end = env.begin - base, env.end - base
            counted += buf.count(b"\n", pos, begin)
            pos = begin
            frame = bytes(buf[begin:end])
            if self.kind == "csv":
                frame_or_none = self._csv(env.message.fields, frame, counted)
                if frame_or_none is None:
                    continue
                frame = frame_or_none
            out.append((counted, frame))
        return result.consumed, out

    def _json(self, buf: bytearray, line: int) -> tuple[int, list[tuple[int, bytes]]]:
        cut = buf.rfind(b"\n") + 1
        out: list[tuple[int, bytes]] = []
        field = self.uuid_field
        for n, text in enumerate(bytes(buf[:cut]).splitlines(keepends=True), start=line):
            if not text.strip():
                continue  # blank lines hold no record
            try:
                doc = orjson.loads(text)
            except orjson.JSONDecodeError:
                raise _Bad(n, f"malformed JSON: {_json_error(text)}") from None
            if not isinstance(doc, dict):
                raise _Bad(n, f"a JSON record must be an object, not {type(doc).__name__}")
            value = doc.get(field)
            if value is None or value == "":
                stamped = str(self.stamper.next_uuid())
                doc = {field: stamped, **doc} if field not in doc else {**doc, field: stamped}
                text = self.framing.marshal(doc)
            else:
                self._check_uuid(value, f"field {field!r}", n)
                if not text.endswith(b"\n"):
                    text += b"\n"
            out.append((n, text))
        return cut, out

    def _csv(self, fields: list[str], frame: bytes, line: int) -> bytes | None:
        first, self.first = self.first, False
        if (first and self.header is not False) and (
            self.header or (fields and fields[0].strip().lower() == "uuid")
        ):
            self.header_skipped = True
            self._header(fields, line)
            return None
        frame_or_none = self._csv_record(fields, frame, line, first)
        if self.pending_columns is not None:
            # Recorded once the first record after the header is known good, so a header
            # whose file lacks a UUID column (fixed by --add-uuid-column) records nothing.
            self._record_columns(*self.pending_columns)
            self.pending_columns = None
        return frame_or_none

    def _csv_record(self, fields: list[str], frame: bytes, line: int, first: bool) -> bytes:
        if self.add_uuid_column:
            return self.framing.marshal([str(self.stamper.next_uuid()), *fields])
        if not fields or fields[0] == "":
            return self.framing.marshal([str(self.stamper.next_uuid()), *fields[1:]])
        if not _is_uuid(fields[0]):
            if first and self.header is None:
                raise _Bad(
                    line,
                    f"the first field {fields[0][:40]!r} is not a UUID (a CSV record's first "
                    "field is its UUID): pass --header if this line is a header, "
                    "--add-uuid-column if the records have no UUID column",
                )
            if self.header_skipped:
                raise _Bad(
                    line,
                    f"the first field {fields[0][:40]!r} is not a UUID (a CSV record's first "
                    "field is its UUID): pass --add-uuid-column if the records have no UUID "
                    "column (leave the field empty to have one made)",
                )
        self._check_uuid(fields[0], "the first field", line)
        return frame

    def _header(self, fields: list[str], line: int) -> None:
        """Check a CSV header against the columns the journal records (a different one
        is an error naming both) and keep its names to record once a record is good."""
        from oncelog.framing.csvlines import CSVColumnsError, check_csv_columns, csv_columns

        if self.journal is None:
            return
        spec = self.journal[1]
        names = ["uuid", *fields] if self.add_uuid_column else list(fields)
        try:
            names = check_csv_columns(names, journal=spec.name)
            recorded = csv_columns(spec)
        except CSVColumnsError as exc:
            raise _Bad(line, str(exc)) from None
        self._same_columns(spec.name, recorded, names, line)
        if recorded is None:
            self.pending_columns = (names, line)

    def _same_columns(
        self, journal: str, recorded: list[str] | None, names: list[str], line: int
    ) -> None:
        from oncelog.framing.csvlines import CSV_COLUMNS_LABEL

        if recorded is not None and recorded != names:
            added = " (with the UUID column --add-uuid-column adds)" if self.add_uuid_column else ""
            fix = "give the input the journal's header, or append it to another journal"
            if not self.add_uuid_column and recorded[1:] == names:
                fix = "pass --add-uuid-column if the records have no UUID column"
            raise _Bad(
                line,
                f"the CSV header names the columns {names}{added}, but journal {journal} has "
                f"the columns {recorded} (label {CSV_COLUMNS_LABEL}): {fix}",
            )

    def _record_columns(self, names: list[str], line: int) -> None:
        """Record `names` as the journal's columns (label `oncelog.dev/csv-columns`), by a
        conditional spec update: of two appends racing to record different headers one
        wins, and the other then finds the winner's columns and fails naming both."""
        from oncelog.framing.csvlines import CSV_COLUMNS_LABEL, csv_column_labels, csv_columns
        from oncelog.journal import JournalError

        assert self.journal is not None
        client, spec = self.journal
        for _ in range(8):  # each retry follows another writer's change of the spec
            recorded = csv_columns(spec)
            self._same_columns(spec.name, recorded, names, line)
            if recorded is not None:
                return
            labels = spec.labels.set(CSV_COLUMNS_LABEL, csv_column_labels(names))
            try:
                client.update(replace(spec, labels=labels), expect=spec)
                return
            except JournalError:
                spec = client.get(spec.name)
        raise click.ClickException(
            f"could not record the CSV columns {names} of journal {spec.name}: its spec kept "
            "changing under concurrent updates; nothing was appended, try again"
        )

    def _check_uuid(self, value: Any, where: str, line: int) -> None:
        try:
            parsed = value if isinstance(value, uuid.UUID) else uuid.UUID(value)
        except (ValueError, TypeError, AttributeError):
            raise _Bad(
                line,
                f"{where} is not a UUID: {str(value)[:60]!r} (leave it out or empty to have "
                "one made)",
            ) from None
        if parsed.version != 1:
            raise _Bad(
                line,
                f"{where} {str(value)!r} is not a version-1 UUID of oncelog or Gazette "
                "(leave it out or empty to have one made)",
            )


def _json_error(line: bytes) -> str:
    """What is wrong with a JSON line, at which column of the line (1-based)."""
    try:
        orjson.loads(line.rstrip(b"\r\n"))
    except orjson.JSONDecodeError as exc:
        return f"{exc.msg} at column {exc.pos + 1}"
    return "not JSON"


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _append_records(
    client: JournalClient,
    name: str,
    records: _Records,
    file: BinaryIO,
    chunk_size: int,
    bar: Progress,
) -> _Appended:
    """Append the records of `file` in chunks, one append in flight at a time.

    If the run stops (Ctrl-C, or an error other than a bad record) the append in flight is
    waited for, then what is stored is reported on stderr with the command that appends
    the rest without duplicates (see `_report_stopped`); the exception then propagates."""
    done = _Appended()
    buf = bytearray()  # input from `buf_offset` on, not decoded yet
    buf_offset = 0
    line = 1  # input line of buf[0]
    out = bytearray()  # frames decoded, not appended yet
    out_frames = 0
    out_line = 1  # input line of the first record in `out`
    in_flight: AsyncAppend | None = None
    chunk = _Chunk()  # the input `in_flight` holds
    stored = _Chunk()  # the input appended for sure: from line 1 (byte 0) on

    def submit(next_line: int) -> None:
        nonlocal in_flight, out_frames, chunk
        settle()
        in_flight = client.start_append(name)
        try:
            in_flight.write(bytes(out))
        except BaseException:
            in_flight.abort()
            in_flight = None
            raise
        in_flight.release()
        chunk = _Chunk(out_frames, len(out), out_line, next_line)
        done.size += len(out)
        done.frames = (done.frames or 0) + out_frames
        del out[:]
        out_frames = 0

    def settle() -> None:
        nonlocal in_flight
        if in_flight is not None:
            result = in_flight.result()  # raises, leaving it in flight: outcome unknown
            in_flight = None
            done.results.append(result)
            stored.add(chunk)

    try:
        while True:
            block = file.read(_READ_BLOCK)
            eof = not block
            buf += block
            bar.advance(len(block))
            if eof and records.lines and buf and not buf.endswith(b"\n"):
                buf += b"\n"  # a last line without its newline
            try:
                consumed, frames = records.decode(buf, buf_offset, line, eof)
            except _Bad as bad:
                settle()
                raise click.ClickException(
                    _invalid(name, records, bad, done, out_line)
                ) from None
            for at, frame in frames:
                if out and len(out) + len(frame) > chunk_size:
                    submit(at)
                if not out:
                    out_line = at
                out += frame
                out_frames += 1
            line += buf.count(b"\n", 0, consumed)
            del buf[:consumed]
            buf_offset += consumed
            if eof:
                break
        if out:
            submit(line)
        settle()
    except click.ClickException:
        raise  # a bad record: its message says what was appended
    except BaseException as exc:
        unknown: _Chunk | None = None
        if in_flight is not None:
            try:
                settle()  # the append in flight lands or fails: wait to know which
            except BaseException:  # noqa: BLE001 - its outcome stays unknown; reported
                unknown = chunk
        _report_stopped(name, records, done, stored, unknown, exc)
        raise
    done.stamped = records.stamper.count
    return done


@dataclass(slots=True)
class _Chunk:
    """Input records appended together: how many, their frames' bytes, the input line of
    the first one and the line after the last one (where the next record starts)."""

    frames: int = 0
    size: int = 0
    first_line: int = 1
    next_line: int = 1

    def add(self, later: _Chunk) -> None:
        self.frames += later.frames
        self.size += later.size
        self.next_line = later.next_line


def _report_stopped(
    name: str,
    records: _Records,
    done: _Appended,
    stored: _Chunk,
    unknown: _Chunk | None,
    exc: BaseException,
) -> None:
    """Say on stderr what a stopped append stored and the command that appends the rest
    without duplicates: the input from the first record not stored on (a text input by
    line, fixed frames by byte), appended with the same options. With an idempotency key
    the rest gets a key of its own (the first run's key would give its records the UUIDs
    of the first records: readers would drop them as duplicates)."""
    why = "interrupted" if isinstance(exc, KeyboardInterrupt) else "stopped by an error"
    if not done.results and unknown is None:
        notice(f"{why}: nothing was appended to journal {name}")
        return
    source = records.source
    if done.results:
        if records.lines:
            part = f"the records of lines 1-{stored.next_line - 1} of {source}"
        else:
            part = f"the first {stored.size} bytes of {source}"
        notice(
            f"{why}: appended {stored.frames} records, {done.where()} of journal {name}: "
            f"{part}"
        )
    else:
        notice(f"{why}: nothing was appended to journal {name} for sure")
    key = records.stamper._key  # noqa: SLF001 - this module's own class
    if unknown is not None:
        resume = _resume_command(name, records, stored.next_line, stored.size, key)
        notice(
            f"the outcome of the last append ({unknown.frames} records from line "
            f"{unknown.first_line}) is unknown: if `oncelog read {name} --raw` shows them "
            f"stored, resume at line {unknown.next_line}, else run: {resume}"
        )
        if key is not None:
            notice(
                f"or append the whole input again with --idempotency-key {key}: committed "
                "readers drop the records stored twice"
            )
        return
    resume = _resume_command(name, records, stored.next_line, stored.size, key)
    notice(f"to append the rest without duplicates, run: {resume}")


def _resume_command(
    name: str, records: _Records, line: int, size: int, key: str | None
) -> str:
    """The shell command appending `records.source` from input line `line` (text) or byte
    `size` (fixed frames) on, to journal `name` of the same store with the same options."""
    import shlex

    from oncelog.cli.app import State

    argv = ["oncelog", "append", name, "-"]
    state = click.get_current_context(silent=True)
    obj = state.find_object(State) if state is not None else None
    hidden = False
    if obj is not None and obj.store:
        argv += ["--store", obj.store]
    for path, value in obj.storage_options if obj is not None else ():
        dotted = ".".join(path)
        if path and path[-1].lower() in _SECRET_OPTIONS:
            argv += ["-o", f"{dotted}=HIDDEN"]
            hidden = True
        elif isinstance(value, str):
            argv += ["-o", f"{dotted}={value}"]
        else:
            argv += ["-o", f"{dotted}:={orjson.dumps(value).decode()}"]
    if records.add_uuid_column:
        argv.append("--add-uuid-column")
    if records.header_skipped or records.header:
        argv.append("--no-header")  # the rest starts after the header
    if key is not None:
        where = f"line{line}" if records.lines else f"byte{size}"
        argv += ["--idempotency-key", f"{key}@{where}"]
    skip = f"tail -n +{line}" if records.lines else f"tail -c +{size + 1}"
    head = (
        f"{skip} {shlex.quote(records.source)}"
        if records.source != "stdin"
        else f"<the same input> | {skip}"
    )
    command = f"{head} | {shlex.join(argv)}"
    return command + (" (with the hidden values as before)" if hidden else "")


_SECRET_OPTIONS = frozenset({"key", "secret", "token", "session_token", "password"})


def _invalid(name: str, records: _Records, bad: _Bad, done: _Appended, out_line: int) -> str:
    head = (
        f"invalid {records.framing.content_type} input for journal {name}: line {bad.line} "
        f"of {records.source}: {bad.reason}"
    )
    if not done.results:
        return f"{head}; nothing was appended"
    return f"{head}; appended only the records before line {out_line}: {done.where()}"
