"""`oncelog status`: one screen that says how a store is doing, once or refreshed live.

A frame shows, for the journals a selector picks (all by default):

- each journal's write head, first available offset, write rate (bytes per second between
  two frames; `-` on the first), compaction debt (claims past its newest compaction record,
  which readers open one by one until a compaction folds them into big fragments), and
  its retention and compact-after settings;
- each consumer group's checkpoint offset and lag in bytes per journal (of those shown);
- pending transaction records (commits across journals whose ACKs may be incomplete);
- streaming nodes with their newest heartbeat, and channel owners, when the store has any.

Without `--watch` one frame is printed and the command exits 0; with it, a frame is drawn
every `--interval` until Ctrl-C, which exits 0. On a terminal frames are drawn with rich
(one live screen under `--watch`); elsewhere each frame is plain aligned text without
colours, starting with a `oncelog status: STORE at TIME` line, flushed whole.

Work per frame is bounded and never reads journal data: one listing of the journal specs;
per journal, its compaction records listed and the newest read (a trim raises the first
offset) and the claims past the previous frame's head read (a few GETs, or one listing of
claims when many were added; the first frame lists each journal's claims once); per consumer
group, its descriptor, one listing and one read of each shard's checkpoints and a head
refresh per journal; one listing of the pending transaction records (each read); one
listing of the streaming metadata, then one heartbeat per node and one term per channel.
Every store call is bounded by the client's retry timeout, as everywhere else.
"""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import click

from oncelog.cli.app import State, cli, describe_error, pass_state, store_options
from oncelog.cli.output import Column, iso_time, rich_table
from oncelog.cli.params import DURATION, format_duration, format_size, selector_option

if TYPE_CHECKING:
    from oncelog.journal import JournalClient, JournalSpec

__all__ = ["status", "Frame", "collect_frame", "render_frame"]

_STAT_THREADS = 8
"""Journals looked at concurrently in one frame (as `journals list` does)."""


@dataclass(frozen=True, slots=True)
class JournalRow:
    """One journal in a frame. `rate` is None on the first frame (no earlier head to
    compare with); `debt` is None for a journal whose index keeps no claims (Gazette)."""

    name: str
    head: int
    first: int
    rate: float | None
    debt: int | None
    retention: float
    compact_after: int


@dataclass(frozen=True, slots=True)
class GroupRow:
    """A consumer group's position in one journal: `lag = head - offset` bytes (None if
    the journal no longer exists)."""

    group: str
    shard: int | None
    journal: str
    offset: int
    lag: int | None


@dataclass(frozen=True, slots=True)
class PendingRow:
    """A pending transaction record: `record` is its path under the store root."""

    record: str
    producer: str
    journals: tuple[str, ...]
    created: str


@dataclass(frozen=True, slots=True)
class NodeRow:
    """A streaming node's newest heartbeat: `age` is seconds since the beat's own clock
    said it was written (a hint: clocks of hosts differ), None if unreadable."""

    node_id: str
    address: str
    seq: int
    age: float | None
    channels: int


@dataclass(frozen=True, slots=True)
class ChannelRow:
    """A streaming channel's newest term and the node that took it."""

    channel: str
    term: int
    node_id: str
    address: str


@dataclass(frozen=True, slots=True)
class Frame:
    """Everything one refresh saw. `taken` is the wall-clock time of the refresh and
    `monotonic` its monotonic time (rates are computed from the latter)."""

    store: str
    selector: str
    taken: float
    monotonic: float
    journals: list[JournalRow] = field(default_factory=list)
    groups: list[GroupRow] = field(default_factory=list)
    pending: list[PendingRow] = field(default_factory=list)
    nodes: list[NodeRow] = field(default_factory=list)
    channels: list[ChannelRow] = field(default_factory=list)

    def heads(self) -> dict[str, int]:
        """Each journal's head, for the next frame's write rates."""
        return {j.name: j.head for j in self.journals}


def collect_frame(
    client: JournalClient, selector: str = "", previous: Frame | None = None
) -> Frame:
    """Look at the store once (see the module docstring for what that costs). Write rates
    compare heads with `previous`, which must be a frame of the same store and selector;
    a journal new since `previous` has no rate yet."""
    from oncelog.journal import JournalNotFound

    sel = selector_option(selector)
    taken, mono = time.time(), time.monotonic()
    specs = client.list(sel)
    before = previous.heads() if previous is not None else {}
    elapsed = mono - previous.monotonic if previous is not None else 0.0

    def look(spec: JournalSpec) -> JournalRow | None:
        try:
            first = client.first_offset(spec.name)  # reads the records: sees trims
            head = client.head(spec.name)
        except JournalNotFound:
            return None  # deleted since the listing
        index = client.loaded_index(spec.name)
        uncompacted = getattr(index, "uncompacted", None)
        rate = None
        if spec.name in before and elapsed > 0:
            rate = max(head - before[spec.name], 0) / elapsed
        return JournalRow(
            spec.name,
            head,
            first,
            rate,
            uncompacted() if uncompacted is not None else None,
            spec.fragment.retention,
            spec.fragment.compact_after,
        )

    rows: list[JournalRow | None] = []
    if specs:
        with ThreadPoolExecutor(max_workers=min(_STAT_THREADS, len(specs))) as pool:
            rows = list(pool.map(look, specs))
    journals = [r for r in rows if r is not None]
    shown = {j.name for j in journals}
    nodes, channels = _streaming(client, shown if selector else None)
    return Frame(
        store=client.location,
        selector=selector,
        taken=taken,
        monotonic=mono,
        journals=journals,
        groups=_groups(client, shown if selector else None),
        pending=_pending(client, shown if selector else None),
        nodes=nodes,
        channels=channels,
    )


def _groups(client: JournalClient, shown: set[str] | None) -> list[GroupRow]:
    """Every group's position per journal (only the journals in `shown`, if given), from
    its latest checkpoints; a group deleted meanwhile is left out."""
    from oncelog.consumer import GroupNotFound, group_status, list_groups

    out = []
    for name in list_groups(client):
        try:
            status = group_status(client, name, count=False)
        except GroupNotFound:
            continue
        for member in status.members:
            for j in member.journals:
                if shown is None or j.journal in shown:
                    out.append(GroupRow(name, member.shard, j.journal, j.offset, j.lag))
    return out


def _pending(client: JournalClient, shown: set[str] | None) -> list[PendingRow]:
    """The pending transaction records (those touching a journal in `shown`, if given)."""
    from oncelog.transactions import pending_records

    out = []
    for record in pending_records(client):
        journals = tuple(record.intent_journals)
        if shown is not None and not shown.intersection(journals):
            continue
        out.append(
            PendingRow(
                f".oncelog/{record.path}",
                record.producer.hex(),
                journals,
                iso_time(record.created.timestamp()) or "-",
            )
        )
    return out


def _streaming(
    client: JournalClient, shown: set[str] | None
) -> tuple[list[NodeRow], list[ChannelRow]]:
    """Streaming nodes and channel owners (the channels in `shown`, if given: a channel is
    a journal): none if the store has no streaming metadata or the streaming package cannot
    be imported. Nodes are all shown: one serves channels of any selection."""
    try:
        from oncelog.streaming.meta import StoreView, read_beat, read_term
    except ImportError:
        return [], []
    view = StoreView.read(client)
    now = time.time()
    nodes = []
    for node_id in sorted(view.beats):
        beat = read_beat(client, node_id) or {}
        when = beat.get("time")
        nodes.append(
            NodeRow(
                node_id,
                str(beat.get("address") or "-"),
                int(beat.get("seq") or view.beats[node_id]),
                max(now - when, 0.0) if isinstance(when, (int, float)) else None,
                len(beat.get("channels") or {}),
            )
        )
    channels = []
    for channel, term in sorted(view.terms.items()):
        if shown is not None and channel not in shown:
            continue
        record = read_term(client, channel, term)
        channels.append(
            ChannelRow(
                channel,
                term,
                record.node_id if record is not None else "-",
                record.address if record is not None else "-",
            )
        )
    return nodes, channels


# -- rendering ---------------------------------------------------------------------------------


def _rate(rate: float | None) -> str:
    return "-" if rate is None else format_size(round(rate)).replace(" ", "") + "/s"


def _age(age: float | None) -> str:
    return "-" if age is None else f"{age:.1f}s"


def render_frame(frame: Frame, *, tty: bool) -> Any:
    """The frame as one rich renderable: a title line and a table per section that has
    rows. On a terminal (`tty`) tables are boxed with bold headers; otherwise plain."""
    from rich.console import Group
    from rich.text import Text

    def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[Any]:
        columns = [Column(h, numeric=h in _NUMERIC) for h in headers]
        t = rich_table(columns, rows, tty=tty)
        return [Text(""), Text(title, style="bold cyan" if tty else ""), t]

    where = f"{frame.store}" + (f" (selector {frame.selector!r})" if frame.selector else "")
    parts: list[Any] = [
        Text(f"oncelog status: {where} at {iso_time(frame.taken)}", style="bold" if tty else "")
    ]
    among = " in the journals shown" if frame.selector else ""
    if not frame.journals:
        empty = (
            f"no journals match selector {frame.selector!r}"
            if frame.selector
            else "the store has no journals"
        )
        parts += [Text(""), Text(empty)]
    else:
        parts += table(
            f"JOURNALS ({len(frame.journals)})",
            ["JOURNAL", "HEAD", "FIRST", "WRITE RATE", "COMPACTION DEBT", "RETENTION",
             "COMPACT AFTER"],
            [
                (
                    j.name,
                    j.head,
                    j.first,
                    _rate(j.rate),
                    j.debt,
                    format_duration(j.retention) if j.retention else "-",
                    j.compact_after or "-",
                )
                for j in frame.journals
            ],
        )
    if frame.groups:
        parts += table(
            f"CONSUMER GROUPS ({len({g.group for g in frame.groups})})",
            ["GROUP", "SHARD", "JOURNAL", "OFFSET", "LAG"],
            [(g.group, g.shard, g.journal, g.offset, g.lag) for g in frame.groups],
        )
    else:
        parts += [Text(""), Text(f"no consumer groups{among}")]
    if frame.pending:
        parts += table(
            f"PENDING TRANSACTIONS ({len(frame.pending)})",
            ["RECORD", "PRODUCER", "JOURNALS", "CREATED"],
            [(p.record, p.producer, ",".join(p.journals), p.created) for p in frame.pending],
        )
    else:
        parts += [Text(""), Text(f"no pending transactions{among}")]
    if frame.nodes:
        parts += table(
            f"STREAMING NODES ({len(frame.nodes)})",
            ["NODE", "ADDRESS", "BEAT", "BEAT AGE", "CHANNELS"],
            [(n.node_id, n.address, n.seq, _age(n.age), n.channels) for n in frame.nodes],
        )
    if frame.channels:
        parts += table(
            f"CHANNEL OWNERS ({len(frame.channels)})",
            ["CHANNEL", "TERM", "NODE", "ADDRESS"],
            [(c.channel, c.term, c.node_id, c.address) for c in frame.channels],
        )
    return Group(*parts)


_NUMERIC = frozenset(
    {"HEAD", "FIRST", "WRITE RATE", "COMPACTION DEBT", "COMPACT AFTER", "SHARD", "OFFSET",
     "LAG", "BEAT", "BEAT AGE", "CHANNELS", "TERM"}
)


def _plain_text(renderable: Any) -> str:
    """`renderable` as plain text: no colours, no wrapping, no trailing blanks."""
    from rich.console import Console

    buffer = io.StringIO()
    Console(file=buffer, width=100_000, color_system=None, highlight=False).print(renderable)
    return "".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines())


def _error_frame(store: str, exc: BaseException) -> Any:
    """What `--watch` shows for a refresh that failed: the time and the error, in place of
    a frame (the next refresh tries again; nothing seen before is shown as current)."""
    from rich.text import Text

    return Text(
        f"oncelog status: {store} at {iso_time(time.time())}\n\n"
        f"could not refresh: {describe_error(exc)}"
    )


def _isatty() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


@cli.command("status")
@click.option(
    "--selector",
    "-l",
    default="",
    help="Show only the journals matching this label selector (and the groups' positions, "
    "pending transactions and channels in them).",
)
@click.option(
    "--watch", "-w", is_flag=True, help="Refresh every --interval until Ctrl-C."
)
@click.option(
    "--interval",
    type=DURATION,
    default=None,
    help="Time between refreshes with --watch, e.g. 500ms or 5s [default: 2s].",
)
@click.option(
    "--once", is_flag=True, help="Print one frame and exit (the default without --watch)."
)
@store_options
@pass_state
def status(
    state: State, selector: str, watch: bool, interval: timedelta | None, once: bool
) -> None:
    """Show the store at a glance: journals (head, first offset, write rate, compaction
    debt), consumer groups' lag, pending transactions and streaming nodes.

    Reads no journal data: each refresh costs a few listings and small reads per journal
    and group. Plain text when stdout is not a terminal.
    """
    if watch and once:
        raise click.UsageError("--watch and --once exclude each other")
    if interval is not None and not watch:
        raise click.UsageError("--interval sets the refresh of --watch: give both, or neither")
    period = (interval if interval is not None else timedelta(seconds=2)).total_seconds()
    if watch and period <= 0:
        raise click.BadParameter("must be more than 0s", param_hint="--interval")
    selector_option(selector)  # a bad selector is a usage error before the store is opened
    client = state.client()
    tty = _isatty()
    if not watch:
        _show(render_frame(collect_frame(client, selector), tty=tty), tty)
        return
    try:
        _watch(client, selector, period, tty)
    except KeyboardInterrupt:
        return  # Ctrl-C is how a watch ends: exit 0


def _show(renderable: Any, tty: bool) -> None:
    """Print one frame: with rich on a terminal, else as plain text written at once."""
    if tty:
        from rich.console import Console

        Console(highlight=False).print(renderable)
        return
    sys.stdout.write(_plain_text(renderable))
    sys.stdout.flush()


def _watch(client: JournalClient, selector: str, period: float, tty: bool) -> None:
    """Refresh every `period` seconds (measured from the start of each refresh; a slow one
    is followed at once by the next) until interrupted. A refresh that fails shows the
    error and the next one tries again: rates are then computed from the last good frame."""
    live: Any = None
    if tty:
        from rich.live import Live

        live = Live(auto_refresh=False, redirect_stderr=False)
        live.start()
    previous: Frame | None = None
    try:
        while True:
            started = time.monotonic()
            try:
                frame = collect_frame(client, selector, previous)
            except click.ClickException:
                raise
            except Exception as exc:  # noqa: BLE001 - shown, then retried next refresh
                shown = _error_frame(client.location, exc)
            else:
                previous = frame
                shown = render_frame(frame, tty=tty)
            if live is not None:
                live.update(shown, refresh=True)
            else:
                sys.stdout.write(_plain_text(shown) + "\n")
                sys.stdout.flush()
            time.sleep(max(period - (time.monotonic() - started), 0.0))
    finally:
        if live is not None:
            live.stop()
