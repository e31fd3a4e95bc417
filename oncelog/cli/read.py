"""`oncelog read`: print one journal's messages, or those of every journal a selector picks.

Raw uncommitted reads copy journal bytes as stored; other reads decode frames (keeping
their bytes) and, with `--committed`, sequence them. Without `--follow` the journals of a
selector are read one after the other; with it, all are tailed at once (journals created
later that match are picked up) and whole frames are interleaved on stdout.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, BinaryIO

import click

from oncelog.cli.app import State, cli, pass_state, store_options
from oncelog.cli.frames import (
    FORMATTERS,
    committed_envelopes,
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
    committed: bool
    follow: bool
    from_head: bool
    offset: int | None
    content_type: str | None
    skip_errors: bool

    def copies_bytes(self, merged_follow: bool) -> bool:
        """Raw uncommitted output of one journal at a time is its bytes as stored."""
        return self.fmt == "raw" and not self.committed and not merged_follow


@cli.command("read")
@click.argument("name", required=False)
@click.option(
    "--selector", "-l", default=None, help="Read every journal matching this label selector."
)
@click.option(
    "--committed", "-c", is_flag=True, help="Only committed messages, each once (read-committed)."
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
@click.option("--follow", is_flag=True, help="Keep waiting for new messages (Ctrl-C to stop).")
@click.option(
    "--format",
    "-f",
    "fmt",
    type=click.Choice(sorted(FORMATTERS)),
    default="raw",
    show_default=True,
    help="raw: frames as stored; json: one JSON object per message; table: aligned text.",
)
@click.option(
    "--content-type",
    default=None,
    help="Framing of a journal with no oncelog spec (a Gazette fragment store).",
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
    offset: int | None,
    from_head: bool,
    follow: bool,
    fmt: str,
    content_type: str | None,
    skip_errors: bool,
    refresh: timedelta,
) -> None:
    """Print the messages of journal NAME (or of the journals matching --selector) to stdout."""
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
    plan = _Plan(fmt, committed, follow, from_head, offset, content_type, skip_errors)
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
    _begin_output(plan, out)
    if plan.follow:
        for data in _stream(client, name, plan, start, merged=False):
            out.write(data)
            out.flush()
        return
    with progress(f"read {name}", total=head - start, streams_stdout=True) as bar:
        for data in _stream(client, name, plan, start, merged=False, bar=bar):
            out.write(data)


def _read_each(client: JournalClient, selector: Any, plan: _Plan, out: BinaryIO) -> None:
    specs = client.list(selector)
    if not specs:
        warn(f"no journals match selector {str(selector)!r}")
        return
    starts = {s.name: _start(client, s.name, plan) for s in specs}
    _begin_output(plan, out)
    with progress("read", streams_stdout=True) as bar:
        for spec in specs:
            bar.describe(f"read {spec.name}")
            bar.add_total(max(client.head(spec.name) - starts[spec.name], 0))
            part = _Part(bar)
            for data in _stream(client, spec.name, plan, starts[spec.name], merged=False, bar=part):
                out.write(data)


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
    if plan.copies_bytes(merged):
        reader = client.read(name, start, block=plan.follow)
        try:
            while chunk := reader.read(COPY_CHUNK):
                if bar is not None:
                    bar.update(reader.offset - start)
                yield chunk
        finally:
            reader.close()
        return
    from oncelog.framing import for_content_type

    content_type = _content_type(client, name, plan.content_type)
    if plan.committed and content_type == "application/x-protobuf-fixed":
        raise click.ClickException(
            f"cannot read journal {name} committed: its protobuf messages' UUIDs need their "
            "schema, which the command line does not have (read it uncommitted, or use the library)"
        )
    framing = for_content_type(content_type)
    on_error = _warn_and_skip if plan.skip_errors else None
    read_envelopes = committed_envelopes if plan.committed else framed_envelopes
    envelopes = read_envelopes(
        client,
        name,
        framing,
        start,
        new_message=new_message_for(content_type),
        block=plan.follow,
        on_error=on_error,
        progress=bar,
    )
    try:
        yield from map(FORMATTERS[plan.fmt], envelopes)
    finally:
        envelopes.close()  # type: ignore[attr-defined]


def _warn_and_skip(exc: Exception) -> None:
    warn(f"skipped: {exc}")


def _content_type(client: JournalClient, name: str, override: str | None) -> str:
    from oncelog.journal import JournalNotFound

    try:
        spec = client.get(name)
    except JournalNotFound:
        client.head(name)  # no fragments either: let JournalNotFound say so
        if override:
            return override
        raise click.ClickException(
            f"journal {name} has fragments but no oncelog spec (a Gazette fragment store?): "
            "pass --content-type, or read it with --format raw"
        ) from None
    return override or spec.content_type


@dataclass(slots=True)
class _Failed:
    name: str
    error: BaseException


def _tail_all(
    client: JournalClient, selector: Any, plan: _Plan, out: BinaryIO, refresh: float
) -> None:
    """Tail every journal matching `selector` at once, one thread each, until interrupted."""
    pieces: queue.Queue[bytes | _Failed] = queue.Queue(maxsize=1024)
    tailed: set[str] = set()

    def pump(name: str, start: int) -> None:
        try:
            for data in _stream(client, name, plan, start, merged=True):
                pieces.put(data)
        except BaseException as exc:  # reported by the main thread
            pieces.put(_Failed(name, exc))

    def discover(first: bool) -> None:
        for spec in client.list(selector):
            if spec.name in tailed:
                continue
            tailed.add(spec.name)
            # A journal that appears later is new since we started: read all of it.
            start = _start(client, spec.name, plan) if first else 0
            threading.Thread(
                target=pump, args=(spec.name, start), daemon=True, name=f"tail {spec.name}"
            ).start()

    discover(True)
    _begin_output(plan, out)
    if not tailed:
        warn(f"no journals match selector {str(selector)!r} yet; waiting for some")
    next_refresh = time.monotonic() + refresh
    while True:
        try:
            item = pieces.get(timeout=max(next_refresh - time.monotonic(), 0.0))
        except queue.Empty:
            discover(False)
            next_refresh = time.monotonic() + refresh
            continue
        if isinstance(item, _Failed):
            raise item.error
        out.write(item)
        if pieces.empty():
            out.flush()
