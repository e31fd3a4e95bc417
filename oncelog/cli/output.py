"""Where the command line writes: data on stdout, messages and progress on stderr.

Progress bars and spinners appear only when stderr is a terminal (and, for commands that
stream data to stdout, only when stdout is not that terminal too), so pipes and logs see
nothing but the data and one-line messages. rich is imported only when something is drawn.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

__all__ = [
    "Progress",
    "progress",
    "progress_allowed",
    "notice",
    "warn",
    "write_json",
    "Column",
    "print_table",
    "print_fields",
    "iso_time",
]


def progress_allowed(*, streams_stdout: bool = False) -> bool:
    """Whether to draw progress: stderr is a terminal, `ONCELOG_NO_PROGRESS` is unset and,
    for commands writing data to stdout, stdout is not a terminal."""
    if os.environ.get("ONCELOG_NO_PROGRESS"):
        return False
    if not _isatty(sys.stderr):
        return False
    return not (streams_stdout and _isatty(sys.stdout))


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Progress:
    """A progress handle: `advance(n)`, `update(completed)`, `add_total(n)`; a no-op when
    progress is not drawn."""

    def advance(self, amount: float) -> None:
        pass

    def update(self, completed: float) -> None:
        pass

    def add_total(self, amount: float) -> None:
        pass

    def describe(self, description: str) -> None:
        pass


class _RichProgress(Progress):
    def __init__(self, bar: Any, task: Any) -> None:
        self._bar = bar
        self._task = task

    def advance(self, amount: float) -> None:
        self._bar.advance(self._task, amount)

    def update(self, completed: float) -> None:
        self._bar.update(self._task, completed=completed)

    def add_total(self, amount: float) -> None:
        task = next(t for t in self._bar.tasks if t.id == self._task)
        self._bar.update(self._task, total=(task.total or 0) + amount)

    def describe(self, description: str) -> None:
        self._bar.update(self._task, description=description)


@contextmanager
def progress(
    description: str,
    total: float | None = None,
    *,
    unit: str = "bytes",
    streams_stdout: bool = False,
) -> Iterator[Progress]:
    """A transient progress bar on stderr for the duration of the block (`unit` is `bytes`,
    `items` or `none`; `total=None` draws a pulsing bar)."""
    if not progress_allowed(streams_stdout=streams_stdout):
        yield Progress()
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TransferSpeedColumn,
    )
    from rich.progress import Progress as RichProgress

    columns: Sequence[Any] = ()
    if unit == "bytes":
        columns = (DownloadColumn(binary_units=True), TransferSpeedColumn())
    elif unit == "items":
        columns = (MofNCompleteColumn(),)
    console = Console(stderr=True)
    bar = RichProgress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        *columns,
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    with bar:
        _live.append(console)
        try:
            yield _RichProgress(bar, bar.add_task(description, total=total))
        finally:
            _live.remove(console)


_live: list[Any] = []
"""The rich console drawing a progress bar right now, if any: messages go through it so they
print above the bar instead of through it."""


def _message(line: str) -> None:
    if _live:
        _live[-1].print(line, markup=False, highlight=False, soft_wrap=True)
    else:
        print(line, file=sys.stderr, flush=True)


def notice(text: str) -> None:
    """A one-line status message on stderr (`oncelog: ...`)."""
    _message(f"oncelog: {text}")


def warn(text: str) -> None:
    """A one-line warning on stderr (`oncelog: warning: ...`)."""
    _message(f"oncelog: warning: {text}")


def write_json(doc: Any) -> None:
    """`doc` as indented JSON on stdout."""
    out = sys.stdout.buffer
    out.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    out.write(b"\n")
    out.flush()


@dataclass(frozen=True, slots=True)
class Column:
    """A table column: its header and whether it holds numbers (right-aligned)."""

    header: str
    numeric: bool = False


def rich_table(columns: Sequence[Column | str], rows: Sequence[Sequence[Any]], *,
               tty: bool) -> Any:
    """The rich Table every command prints: on a terminal (`tty`) boxed with bold headers,
    otherwise plain aligned columns; numeric columns right-aligned; None shown as `-`."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(
        box=box.SIMPLE_HEAD if tty else None,
        show_edge=False,
        pad_edge=False,
        header_style="bold" if tty else "",
    )
    for spec in columns:
        col = Column(spec) if isinstance(spec, str) else spec
        table.add_column(col.header, justify="right" if col.numeric else "left", no_wrap=not tty)
    for row in rows:
        table.add_row(*(Text("-" if v is None else str(v)) for v in row))
    return table


def print_table(columns: Sequence[Column | str], rows: Sequence[Sequence[Any]]) -> None:
    """A table on stdout: boxed and coloured on a terminal, plain aligned columns otherwise
    (easy to cut and awk), with no trailing blanks."""
    from rich.console import Console

    tty = _isatty(sys.stdout)
    table = rich_table(columns, rows, tty=tty)
    if tty:
        Console(highlight=False).print(table)
        return
    buffer = io.StringIO()
    Console(file=buffer, width=100_000, color_system=None, highlight=False).print(table)
    lines = [line.rstrip() for line in buffer.getvalue().splitlines()]
    sys.stdout.write("".join(line + "\n" for line in lines))
    sys.stdout.flush()


def print_fields(fields: Sequence[tuple[str, Any]]) -> None:
    """`key: value` lines on stdout, values aligned."""
    width = max((len(key) for key, _ in fields), default=0) + 1
    sys.stdout.write("".join(f"{key + ':':<{width}} {value}\n" for key, value in fields))
    sys.stdout.flush()


def iso_time(unix_seconds: float | None) -> str | None:
    """An ISO 8601 UTC time with millisecond precision, or None."""
    if unix_seconds is None:
        return None
    moment = datetime.fromtimestamp(unix_seconds, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
