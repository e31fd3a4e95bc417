"""The fields every append touches and the per-append work: `oncelog._spool` (C) where built,
else the pure-Python twins below, which do the same step for step.

`oncelog.journal.appender`'s `_Batch`, `AsyncAppend` and `Appender` derive from
`BatchCore`, `AppendCore` and `AppenderCore` and keep everything else in Python: sealing,
the writer thread, failures. The cores call back into their subclass for the slow and error
paths: `Appender._next_batch(batch)` (the open batch is full, a seal is wanted, too many
bytes wait, or the appender is closed; entered and left holding the write lock, which it
lets go when it raises), `Appender._hand_over()` (seal for the writer, then let the lock go),
`Appender._wake()` (a batch's first append) and `AsyncAppend._misuse(what)` (raises the
error of a write or release after release).

Locks are the appender's (see its module): `_write_lock` is held from `start_append` to
`release`; `_room` and `_seal_requested` are written under `_state` and read here without
it (a stale value only sends an append down the slow path).

`cores()` picks the C types unless `ONCELOG_PURE_PYTHON=1`; the appender's test suites run
on both (the pure run in a child process, since the choice is made at import).
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable
from time import monotonic as _monotonic
from types import ModuleType
from typing import Any, NamedTuple, cast

__all__ = [
    "AppendCore", "AppenderCore", "BatchCore", "Cores", "Lane", "OPEN", "Outstanding", "cores",
    "native",
]

OPEN = -1
"""`AppendCore._end` until the append is released (other negative values are states too)."""


class BatchCore:
    """The bytes of the appends that will share one fragment: `buf`, `used` (an append was
    released into it: its flush_interval runs from `created`, time.monotonic())."""

    __slots__ = ("buf", "used", "created")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.used = False
        self.created = 0.0


class AppendCore:
    """One append in progress: `_begin`/`_end` are its bytes in `_batch` (`_end` is OPEN
    until `release`). `write` and `release` are the hot path."""

    __slots__ = ("_appender", "_batch", "_begin", "_end")

    def __init__(self, appender: AppenderCore, batch: BatchCore, begin: int) -> None:
        self._appender = appender
        self._batch = batch
        self._begin = begin
        self._end = OPEN

    def _misuse(self, what: str) -> None:  # pragma: no cover - the subclass raises
        raise NotImplementedError

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Add bytes to this append; returns `len(data)` (an item count for a memoryview)."""
        if self._end != OPEN:
            self._misuse("write")
        self._batch.buf += data
        return len(data)

    def release(self) -> None:
        """Finish writing: the append is queued for its fragment and the lock is let go."""
        batch = self._batch
        if self._end != OPEN:
            self._misuse("release")
        self._end = len(batch.buf)
        appender = self._appender
        if batch.used:
            if appender._seal_requested:
                appender._hand_over()
            else:
                appender._write_lock.release()
            return
        batch.used = True  # the batch's first append: its flush_interval starts now
        try:
            batch.created = _monotonic()
        except BaseException:
            appender._write_lock.release()  # never keep the lock
            raise
        if appender._seal_requested:
            appender._hand_over()
            return
        appender._write_lock.release()
        appender._wake()


class AppenderCore:
    """The state an append touches (`_write_lock`, `_open`, `_room`, `_seal_requested`,
    `_closed`, `_append_type`: the AppendCore subclass made; `index`, the journal's claims
    index) and `start_append` / `append_made`."""

    __slots__ = (
        "index", "_write_lock", "_open", "_room", "_seal_requested", "_closed", "_append_type"
    )

    index: Any  # the journal's claims index (`Lane` reads its `stale`)
    _write_lock: threading.Lock
    _open: BatchCore
    _room: int
    _seal_requested: bool
    _closed: bool
    _append_type: type[AppendCore]

    @property
    def reusable(self) -> bool:
        """Whether `JournalClient.start_append` would still hand out this appender: it is
        not closed (the client closes it when the journal is deleted or the client closed)
        and its journal's index is not stale (a deletion elsewhere). Read without the lock:
        a caller that keeps an appender between appends checks it before each, and one that
        closes just after still fails its append as `start_append`'s would."""
        return not self._closed and not self.index.stale

    def _next_batch(self, batch: BatchCore) -> BatchCore:  # pragma: no cover - subclass
        raise NotImplementedError

    def _hand_over(self) -> None:  # pragma: no cover - the subclass's
        raise NotImplementedError

    def _wake(self) -> None:  # pragma: no cover - the subclass's
        raise NotImplementedError

    def start_append(self) -> Any:
        """Take the write lock and begin an append (blocks while another is in progress or
        while too many bytes wait to be written)."""
        self._write_lock.acquire()
        batch = self._open
        size = len(batch.buf)
        if size >= self._room:
            batch = self._next_batch(batch)
            size = len(batch.buf)
        try:
            return self._append_type(self, batch, size)
        except BaseException:
            self._write_lock.release()
            raise

    def append_made(self, make: Callable[..., tuple[Any, Any]], *args: Any) -> tuple[Any, Any]:
        """`start_append`, write `make(*args)[0]`, `release`, in one call; returns (the
        append, `make(*args)[1]`). If `make` (or the copy) raises, the append is released
        empty and the error propagates."""
        append = self.start_append()
        try:
            made = make(*args)
            if type(made) is not tuple or len(made) != 2:
                raise TypeError("append_made: make must return (data, token)")
            append._batch.buf += made[0]
        finally:
            append.release()
        return append, made[1]


_BOUND = 1024


class Outstanding:
    """The appends a caller still has to wait for (a publisher's, until `flush` or a commit),
    in append order, keeping only the latest append of each batch: appends in one batch
    share one fragment and one outcome, so it stands for the ones before it. Each operation
    is atomic (here under a lock; the C twin's are single C calls under the GIL), so `add`
    needs no lock beside it; `take` and `restore` (pruning) must not interleave with another
    `take`, which their caller ensures."""

    __slots__ = ("_lock", "_items", "_bound")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[Any] = []
        self._bound = _BOUND

    def add(self, append: Any) -> bool:
        """Remember `append` (replacing the last one if both are AppendCores of the same
        batch; anything else with `done` and `result` is kept as it is); True when there are
        more than the bound: prune then (`take`, drop the durable ones from the front,
        `restore` the rest)."""
        with self._lock:
            items = self._items
            if (
                items
                and isinstance(append, AppendCore)
                and isinstance(last := items[-1], AppendCore)
                and last._batch is append._batch
            ):
                items[-1] = append
                return False
            items.append(append)
            return len(items) > self._bound

    def take(self) -> list[Any]:
        """Every append remembered, in order; none is left."""
        with self._lock:
            taken, self._items = self._items, []
            return taken

    def restore(self, front: list[Any]) -> None:
        """Put `front` (from `take`, less the durable ones) back before those added since;
        the bound becomes twice their number, at least 1024."""
        with self._lock:
            self._items = front + self._items
            self._bound = max(_BOUND, 2 * len(self._items))

    def __len__(self) -> int:
        return len(self._items)


class Lane:
    """Appends to one appender whose records one function makes from a few arguments of
    each append and the same trailing ones every time (a publisher's stamp: the document and
    its UUID key, then its producer, clock, flags and error hook), each remembered in an
    Outstanding: `append(*args)` is `appender.append_made(make, *args, *fixed)` then
    `outstanding.add(append)` (and `on_full()` when that says to prune), in one call. It
    returns None, appending nothing, when the appender is not `reusable`, so that the
    caller takes its general path."""

    __slots__ = ("appender", "_make", "_fixed", "_outstanding", "_on_full")

    def __init__(
        self,
        appender: AppenderCore,
        make: Callable[..., tuple[Any, Any]],
        fixed: tuple[Any, ...],
        outstanding: Outstanding,
        on_full: Callable[[], object],
    ) -> None:
        self.appender = appender
        self._make = make
        self._fixed = fixed
        self._outstanding = outstanding
        self._on_full = on_full

    def append(self, *args: Any) -> tuple[Any, Any] | None:
        """`append_made(make, *args, *fixed)`, the append remembered: (append, token); None
        if the appender is not reusable."""
        appender = self.appender
        if not appender.reusable:
            return None
        pair = appender.append_made(self._make, *args, *self._fixed)
        if self._outstanding.add(pair[0]):
            self._on_full()
        return pair


class Cores(NamedTuple):
    """The bases and the outstanding-appends list, all C or all pure."""

    batch: type[BatchCore]
    append: type[AppendCore]
    appender: type[AppenderCore]
    outstanding: type[Outstanding]
    lane: type[Lane]


def _load() -> ModuleType | None:
    if os.environ.get("ONCELOG_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        return importlib.import_module("oncelog._spool")
    except ImportError:
        return None


native: ModuleType | None = _load()
"""`oncelog._spool` when built and not disabled by ONCELOG_PURE_PYTHON=1, else None."""


def cores() -> Cores:
    """The C cores where `native`, else the pure ones."""
    if native is None:
        return Cores(BatchCore, AppendCore, AppenderCore, Outstanding, Lane)
    return Cores(
        cast("type[BatchCore]", native.BatchCore),
        cast("type[AppendCore]", native.AppendCore),
        cast("type[AppenderCore]", native.AppenderCore),
        cast("type[Outstanding]", native.Outstanding),
        cast("type[Lane]", native.Lane),
    )

