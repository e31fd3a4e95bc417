"""Where the command line writes: data on stdout, messages and progress on stderr.

Progress bars and spinners appear only when stderr is a terminal (and, for commands that
stream data to stdout, only when stdout is not that terminal too), so pipes and logs see
nothing but the data and one-line messages. rich is imported only when something is drawn.
"""

from __future__ import annotations

import io
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterator, Sequence

import orjson

__all__ = [
    "Progress",
    "progress",
    "progress_allowed",
    "notice",
    "warn",
    "write_json",
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
    """A transient progress bar on stderr for the duration of the block (`unit` is `bytes`
    or `items`; `total=None` draws a pulsing bar)."""
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

    if unit == "bytes":
        columns: Sequence[Any] = (DownloadColumn(binary_units=True), TransferSpeedColumn())
    else:
        columns = (MofNCompleteColumn(),)
    bar = RichProgress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        *columns,
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    with bar:
        yield _RichProgress(bar, bar.add_task(description, total=total))


def notice(text: str) -> None:
    """A one-line status message on stderr (`oncelog: ...`)."""
    print(f"oncelog: {text}", file=sys.stderr, flush=True)


def warn(text: str) -> None:
    """A one-line warning on stderr (`oncelog: warning: ...`)."""
    print(f"oncelog: warning: {text}", file=sys.stderr, flush=True)


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


def print_table(columns: Sequence[Column | str], rows: Sequence[Sequence[Any]]) -> None:
    """A table on stdout: boxed and coloured on a terminal, plain aligned columns otherwise
    (easy to cut and awk), with no trailing blanks."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    tty = _isatty(sys.stdout)
    table = Table(
        box=box.SIMPLE_HEAD if tty else None,
        show_edge=False,
        pad_edge=False,
        header_style="bold" if tty else "",
    )
    for col in columns:
        col = Column(col) if isinstance(col, str) else col
        table.add_column(col.header, justify="right" if col.numeric else "left", no_wrap=not tty)
    for row in rows:
        table.add_row(*(Text("-" if v is None else str(v)) for v in row))
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
    moment = datetime.fromtimestamp(unix_seconds, tz=timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
