"""`oncelog read`: print one journal's messages, or those of every journal a selector picks.

What is printed (documented in docs/cli.md):

- a journal with a framing (an oncelog spec, or `--content-type`): its committed messages,
  each once, as `read_committed` delivers them (duplicates, rolled-back messages and ACKs
  left out); `--uncommitted` prints every message as stored instead, ACKs included;
- a journal without one (a Gazette fragment store read without `--content-type`), and
  `--raw`: the journal's bytes exactly as stored, copied, not decoded;
- protobuf journals are read committed when they record their message class (label
  `oncelog.dev/protobuf-class`, importable here), their messages printed as protobuf's JSON
  mapping; without one they are read uncommitted (`--committed` is an error), payloads in
  base64: the command line has no class to find their UUIDs in.

`--format raw` prints each selected message's frame as stored; `json` and `table` decode
it. Without `--follow` the journals of a selector are read one after the other; with it,
all are tailed at once (journals created later that match are picked up) and whole frames
are interleaved on stdout.
"""

from __future__ import annotations

import functools
import math
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, BinaryIO

import click

from oncelog.cli.app import State, cli, pass_state, store_options
from oncelog.cli.frames import (
    FORMATTERS,
    committed_envelopes,
    format_json,
    framed_envelopes,
    new_message_for,
    table_header,
)
from oncelog.cli.output import Progress, progress, warn
from oncelog.cli.params import DURATION, selector_option

if TYPE_CHECKING:
    from oncelog.journal import JournalClient

__all__ = ["read"]

COPY_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class _Plan:
    """How to read: what to print, from where, and whether to keep waiting for more."""

    fmt: str
    committed: bool | None
    """True: `--committed`; False: `--uncommitted` or `--raw`; None: per journal, committed
    if it has a framing the command line can sequence (see `_reads_committed`)."""
    follow: bool
    from_head: bool
    offset: int | None
    content_type: str | None
    skip_errors: bool
    max_messages: int | None = None
    timeout: float | None = None

    def copies_bytes(self, committed: bool, merged_follow: bool) -> bool:
        """Raw uncommitted output of one journal at a time is its bytes as stored (unless
        messages are counted, or whole frames interleaved with other journals')."""
        return (
            self.fmt == "raw"
            and not committed
            and not merged_follow
            and self.max_messages is None
        )


@cli.command("read")
@click.argument("name", required=False)
@click.option(
    "--selector", "-l", default=None, help="Read every journal matching this label selector."
)
@click.option(
    "--committed",
    "-c",
    is_flag=True,
    help="Only committed messages, each once, ACKs left out (read-committed): the default "
    "for journals with a framing; given, it is an error for journals the command line "
    "cannot sequence (protobuf, no framing).",
)
@click.option(
    "--uncommitted",
    "-u",
    is_flag=True,
    help="Every message as stored, in journal order: ACKs, duplicates, pending and "
    "rolled-back messages included (read-uncommitted).",
)
@click.option(
    "--raw",
    is_flag=True,
    help="The journal's bytes exactly as stored, undecoded: every message, ACKs included "
    "(--uncommitted --format raw). The default for journals without a framing.",
)
@click.option(
    "--offset",
    type=click.IntRange(min=0),
    default=None,
    help="Start at this byte offset [default: 0].",
)
@click.option(
    "--head", "from_head", is_flag=True, help="Start at the write head (new messages only)."
)
@click.option(
    "--follow",
    "-f",
    is_flag=True,
    help="Keep waiting for new messages (Ctrl-C or --timeout to stop).",
)
@click.option(
    "--max-messages",
    "-n",
    type=click.IntRange(min=1),
    default=None,
    help="Stop after printing this many messages.",
)
@click.option(
    "--timeout",
    type=DURATION,
    default=None,
    help="With --follow: stop after this long (e.g. 30s), with exit status 0.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(sorted(FORMATTERS)),
    default=None,
    help="raw: each message's frame as stored; json: one JSON object per message; table: "
    "aligned text [default: raw].",
)
@click.option(
    "--content-type",
    default=None,
    help="Framing of a journal with no oncelog spec (a Gazette fragment store); for a "
    "journal with a spec, it must match the spec's.",
)
@click.option("--skip-errors", is_flag=True, help="Warn about bad frames on stderr and go on.")
@click.option(
    "--refresh",
    type=DURATION,
    default="10s",
    show_default=True,
    help="With --selector --follow: how often to look for new matching journals.",
)
@store_options
@pass_state
def read(
    state: State,
    name: str | None,
    selector: str | None,
    committed: bool,
    uncommitted: bool,
    raw: bool,
    offset: int | None,
    from_head: bool,
    follow: bool,
    max_messages: int | None,
    timeout: timedelta | None,
    fmt: str | None,
    content_type: str | None,
    skip_errors: bool,
    refresh: timedelta,
) -> None:
    """Print the messages of journal NAME (or of the journals matching --selector) to stdout.

    Journals with a framing (an oncelog spec, or --content-type) print their committed
    messages, each once, as an exactly-once reader gets them; --uncommitted prints every
    message (ACKs too). Journals without one, and --raw, print the bytes as stored.
    """
    if name is None and selector is None:
        raise click.UsageError("give a journal NAME or --selector")
    if name is not None and selector is not None:
        raise click.UsageError("give a journal NAME or --selector, not both")
    if offset is not None and from_head:
        raise click.UsageError("--offset and --head exclude each other")
    if offset is not None and selector is not None:
        raise click.UsageError(
            "--offset applies to one journal: name it instead of using --selector"
        )
    if timeout is not None and not follow:
        raise click.UsageError("--timeout ends a --follow: give both, or neither")
    if committed and uncommitted:
        raise click.UsageError("--committed and --uncommitted exclude each other")
    if raw and (committed or fmt not in (None, "raw")):
        raise click.UsageError(
            "--raw prints the journal's bytes as stored, every message uncommitted: it "
            "excludes --committed and --format json|table"
        )
    plan = _Plan(
        fmt or "raw",
        True if committed else False if uncommitted or raw else None,
        follow,
        from_head,
        offset,
        content_type,
        skip_errors,
        max_messages,
        timeout.total_seconds() if timeout is not None else None,
    )
    client = state.client()
    out = sys.stdout.buffer
    if name is not None:
        _read_one(client, name, plan, out)
    else:
        sel = selector_option(selector or "")
        if follow:
            _tail_all(client, sel, plan, out, refresh.total_seconds())
        else:
            _read_each(client, sel, plan, out)
    out.flush()


def _start(client: JournalClient, name: str, plan: _Plan) -> int:
    if plan.from_head:
        return client.head(name)
    return plan.offset or 0


def _begin_output(plan: _Plan, out: BinaryIO) -> None:
    """Called once the journals to read are known to exist: the table header, if any."""
    if plan.fmt == "table":
        out.write(table_header())
        if plan.follow:
            out.flush()


def _read_one(client: JournalClient, name: str, plan: _Plan, out: BinaryIO) -> None:
    head = client.head(name)  # fails first for an unknown journal
    start = head if plan.from_head else plan.offset or 0
    if start > head and not plan.follow:
        raise click.ClickException(
            f"offset {start} is past the write head {head} of journal {name}"
        )
    if plan.offset:
        _check_available(client, name, plan.offset)
    if plan.content_type is not None or plan.offset:
        content_type = _content_type(client, name, plan.content_type, required=False)
        if plan.offset and content_type is not None:
            _check_frame_boundary(client, name, plan.offset, content_type)
    _begin_output(plan, out)
    if plan.follow:
        _follow(client, [(name, start)], plan, out)
        return
    counter = _Counter(plan.max_messages)
    with progress(f"read {name}", total=head - start, streams_stdout=True) as bar:
        pieces = _stream(client, name, plan, start, merged=False, bar=bar)
        try:
            for data in pieces:
                out.write(data)
                if counter.done():
                    break
        finally:
            pieces.close()  # type: ignore[attr-defined]


def _read_each(client: JournalClient, selector: Any, plan: _Plan, out: BinaryIO) -> None:
    specs = client.list(selector)
    if not specs:
        warn(f"no journals match selector {str(selector)!r}")
        return
    starts = {s.name: _start(client, s.name, plan) for s in specs}
    _begin_output(plan, out)
    counter = _Counter(plan.max_messages)
    with progress("read", streams_stdout=True) as bar:
        for spec in specs:
            bar.describe(f"read {spec.name}")
            bar.add_total(max(client.head(spec.name) - starts[spec.name], 0))
            part = _Part(bar)
            pieces = _stream(client, spec.name, plan, starts[spec.name], merged=False, bar=part)
            try:
                for data in pieces:
                    out.write(data)
                    if counter.done():
                        return
            finally:
                pieces.close()  # type: ignore[attr-defined]


class _Counter:
    """Counts printed messages up to `--max-messages` (if given)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.count = 0

    def done(self) -> bool:
        """Count one message; True once the limit is reached."""
        self.count += 1
        return self.limit is not None and self.count >= self.limit


def _check_available(client: JournalClient, name: str, offset: int) -> None:
    """Refuse a start offset below the journal's first available one (a trim or retention
    removed it), naming the offset asked for and the first available one. Checked before
    the frame-boundary check, which reads the byte before `offset`: its error would name
    that byte's offset instead."""
    from oncelog.journal import OffsetNotAvailable

    first = client.first_offset(name)
    if offset < first:
        raise OffsetNotAvailable(
            f"offset {offset} of journal {name!r} is before its first available offset "
            f"{first} (the data before was trimmed): start at {first} or later"
        )


def _check_frame_boundary(client: JournalClient, name: str, offset: int, content_type: str) -> None:
    """Refuse a start offset inside a frame: raw output from there would begin with the
    tail of a frame, and decoding would fail on it. The first available offset is a
    fragment's begin, which is always a frame boundary (appends hold whole frames)."""
    from oncelog.framing import CONTENT_TYPE_PROTOBUF_FIXED

    if offset <= 0 or offset == client.first_offset(name):
        return
    if content_type == CONTENT_TYPE_PROTOBUF_FIXED:
        from oncelog.framing.fixed import MAGIC_WORD

        reader = client.read(name, offset)
        try:
            at = reader.read(len(MAGIC_WORD))
        finally:
            reader.close()
        ok = not at or at == MAGIC_WORD
    else:
        reader = client.read(name, offset - 1)
        try:
            ok = reader.read(1) == b"\n"
        finally:
            reader.close()
    if not ok:
        raise click.ClickException(
            f"offset {offset} of journal {name} is inside a frame, not at its start: start at "
            "a frame boundary (a 'begin' printed by --format json, or the head)"
        )


class _Part(Progress):
    """One journal's progress on a bar shared by several journals."""

    def __init__(self, bar: Progress) -> None:
        self._bar = bar
        self._done = 0.0

    def update(self, completed: float) -> None:
        self._bar.advance(completed - self._done)
        self._done = completed


def _stream(
    client: JournalClient,
    name: str,
    plan: _Plan,
    start: int,
    *,
    merged: bool,
    bar: Progress | None = None,
) -> Iterator[bytes]:
    """The output bytes for journal `name`, in pieces that never split a frame when
    `merged` (other journals' pieces come in between)."""
    from oncelog.framing import for_content_type

    content_type = _content_type(client, name, plan.content_type, required=False)
    proto_class = _proto_class(client, name, content_type, plan)
    committed = _reads_committed(name, plan, content_type, proto_class is not None)
    if plan.copies_bytes(committed, merged):
        reader = client.read(name, start, block=plan.follow)
        try:
            while chunk := reader.read(COPY_CHUNK):
                if bar is not None:
                    bar.update(reader.offset - start)
                yield chunk
        finally:
            reader.close()
        return
    if content_type is None:
        raise _no_framing(name)
    if committed and content_type == "application/x-protobuf-fixed" and proto_class is None:
        raise click.ClickException(
            f"cannot read journal {name} committed: its protobuf messages' UUIDs need their "
            "class, and the journal records none (label oncelog.dev/protobuf-class): read "
            "it --uncommitted, or record the class"
        )
    framing = for_content_type(content_type)
    on_error = _warn_and_skip if plan.skip_errors else None
    read_envelopes = committed_envelopes if committed else framed_envelopes
    envelopes = read_envelopes(
        client,
        name,
        framing,
        start,
        new_message=new_message_for(content_type, plan.fmt, proto_class),
        block=plan.follow,
        on_error=on_error,
        progress=bar,
    )
    try:
        yield from map(_formatter(client, name, plan.fmt, content_type), envelopes)
    finally:
        envelopes.close()  # type: ignore[attr-defined]


def _proto_class(
    client: JournalClient, name: str, content_type: str | None, plan: _Plan
) -> type | None:
    """The protobuf class journal `name` records (label `oncelog.dev/protobuf-class`), if
    it is read as a protobuf journal, records one, and the class imports here (else a
    warning naming the import error: its messages are then printed as payloads)."""
    from oncelog.framing import CONTENT_TYPE_PROTOBUF_FIXED
    from oncelog.framing.errors import ProtoClassError
    from oncelog.framing.protoclass import import_recorded_class
    from oncelog.journal.errors import JournalNotFound

    if content_type != CONTENT_TYPE_PROTOBUF_FIXED or plan.committed is False:
        return None
    try:
        return import_recorded_class(client.get(name))
    except JournalNotFound:
        return None
    except ProtoClassError as exc:
        warn(str(exc))
        return None


def _reads_committed(
    name: str, plan: _Plan, content_type: str | None, has_class: bool = False
) -> bool:
    """Whether journal `name` is read committed: as asked (`--committed`, `--uncommitted`,
    `--raw`), else whenever its messages can be sequenced here, i.e. it has a framing whose
    UUIDs the command line can see. Protobuf journals are read committed when they record
    an importable class (`has_class`), else uncommitted with a warning; journals without a
    known framing print their bytes."""
    from oncelog.framing import CONTENT_TYPE_PROTOBUF_FIXED, UnknownContentType, for_content_type

    if plan.committed is not None:
        return plan.committed
    if content_type is None:
        return False
    if content_type == CONTENT_TYPE_PROTOBUF_FIXED and not has_class:
        warn(
            f"journal {name} holds protobuf messages, whose UUIDs the command line cannot "
            "see without their class (label oncelog.dev/protobuf-class): printing every "
            "message, uncommitted"
        )
        return False
    try:
        for_content_type(content_type)
    except UnknownContentType:
        return False
    return True


def _formatter(
    client: JournalClient, name: str, fmt: str, content_type: str
) -> Callable[[Any], bytes]:
    """How `fmt` prints journal `name`'s messages: JSON output keys a CSV journal's records
    by the column names its spec records (`oncelog append --header`), if it records any."""
    from oncelog.framing import CONTENT_TYPE_CSV
    from oncelog.framing.csvlines import csv_columns
    from oncelog.journal import JournalNotFound

    if fmt == "json" and content_type == CONTENT_TYPE_CSV:
        try:
            columns = csv_columns(client.get(name))
        except JournalNotFound:  # a Gazette fragment store: no spec, no names
            columns = None
        if columns is not None:
            return functools.partial(format_json, columns=columns)
    return FORMATTERS[fmt]


def _warn_and_skip(exc: Exception) -> None:
    warn(f"skipped: {exc}")


def _content_type(
    client: JournalClient, name: str, override: str | None, *, required: bool = True
) -> str | None:
    """The journal's framing: its spec's content type (a different --content-type is an
    error), or --content-type for a journal with no spec."""
    from oncelog.journal import JournalNotFound

    try:
        spec = client.get(name)
    except JournalNotFound:
        client.head(name)  # no fragments either: let JournalNotFound say so
        if override or not required:
            return override
        raise _no_framing(name) from None
    if override is not None and override != spec.content_type:
        raise click.UsageError(
            f"--content-type {override} contradicts journal {name}'s content type "
            f"{spec.content_type}: --content-type is for journals without an oncelog spec"
        )
    return spec.content_type


def _no_framing(name: str) -> click.ClickException:
    """The error for decoding a journal whose framing is unknown."""
    return click.ClickException(
        f"journal {name} has fragments but no oncelog spec (a Gazette fragment store?): "
        "pass --content-type, or read its bytes with --raw"
    )


@dataclass(slots=True)
class _Failed:
    name: str
    error: BaseException


def _tail_all(
    client: JournalClient, selector: Any, plan: _Plan, out: BinaryIO, refresh: float
) -> None:
    """Tail every journal matching `selector` at once, one thread each, until interrupted
    (or --timeout, --max-messages)."""
    tailed: set[str] = set()

    def discover(first: bool) -> list[tuple[str, int]]:
        found = []
        for spec in client.list(selector):
            if spec.name in tailed:
                continue
            tailed.add(spec.name)
            # A journal that appears later is new since we started: read all of it.
            found.append((spec.name, _start(client, spec.name, plan) if first else 0))
        return found

    initial = discover(True)
    _begin_output(plan, out)
    if not tailed:
        warn(f"no journals match selector {str(selector)!r} yet; waiting for some")
    _follow(client, initial, plan, out, lambda: discover(False), refresh, merged=True)


def _follow(
    client: JournalClient,
    journals: list[tuple[str, int]],
    plan: _Plan,
    out: BinaryIO,
    discover: Callable[[], list[tuple[str, int]]] | None = None,
    refresh: float = 0.0,
    *,
    merged: bool = False,
) -> None:
    """Tail `journals` (name, start offset), one thread each, writing what they read until
    interrupted, --timeout passes or --max-messages are printed; `discover()`, called every
    `refresh` seconds, names more journals to tail."""
    pieces: queue.Queue[bytes | _Failed] = queue.Queue(maxsize=1024)

    def pump(name: str, start: int) -> None:
        try:
            for data in _stream(client, name, plan, start, merged=merged):
                pieces.put(data)
        except BaseException as exc:  # reported by the main thread
            pieces.put(_Failed(name, exc))

    def tail(found: list[tuple[str, int]]) -> None:
        for name, start in found:
            threading.Thread(
                target=pump, args=(name, start), daemon=True, name=f"tail {name}"
            ).start()

    tail(journals)
    counter = _Counter(plan.max_messages)
    deadline = None if plan.timeout is None else time.monotonic() + plan.timeout
    next_refresh = time.monotonic() + refresh if discover is not None else math.inf
    while True:
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            break
        wait = min(next_refresh, deadline if deadline is not None else math.inf) - now
        try:
            item = pieces.get(timeout=None if wait == math.inf else max(wait, 0.0))
        except queue.Empty:
            if discover is not None and time.monotonic() >= next_refresh:
                tail(discover())
                next_refresh = time.monotonic() + refresh
            continue
        if isinstance(item, _Failed):
            raise item.error
        out.write(item)
        if counter.done():
            break
        if pieces.empty():
            out.flush()
    out.flush()
