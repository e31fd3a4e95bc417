"""PolledList: a journal listing kept fresh, for mappings' `partitions()`.

A mapping (oncelog.mapping) draws from a callable returning the current journal specs;
`PolledList(client, selector)` is that callable over a store: it lists once when made, then
re-lists every `interval` seconds on a daemon thread (or on call, without the thread),
keeping the last good list when a refresh fails.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from oncelog.labels import LabelSelector

if TYPE_CHECKING:
    from oncelog.mapping import PartitionSpec

__all__ = ["PolledList"]

_log = logging.getLogger(__name__)

class _Lister(Protocol):
    def list(self, selector: str) -> Sequence[PartitionSpec]: ...


class PolledList:
    """Keeps ``client.list(selector)`` fresh; calling it returns the journals, sorted by name.

    The first listing happens in the constructor (its errors propagate). Then a
    daemon thread re-lists every `interval` seconds (``background=False``: the call
    re-lists, when the list is older than `interval` by `clock`). A failed refresh
    keeps the last good list, is logged and is kept in `last_error`. In a forked
    child, which has no thread, calls re-list as with ``background=False``.
    The result is a tuple, replaced as a whole on each refresh.
    """

    def __init__(
        self,
        client: _Lister,
        selector: LabelSelector | str | None = "",
        interval: float = 30.0,
        *,
        background: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be a positive number of seconds, not {interval!r}")
        self.client = client
        self.selector = LabelSelector.from_value(selector)
        self.interval = float(interval)
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._background = background
        self._current: tuple[PartitionSpec, ...] = ()
        self._last_error: Exception | None = None
        self._refreshed_at = self._due_at = clock()
        self._thread: threading.Thread | None = None
        self.refresh()
        if background:
            self._thread = threading.Thread(
                target=self._run, name=f"oncelog-polled-list[{self.selector}]", daemon=True
            )
            self._thread.start()
        _live_lists.add(self)

    # -- reading -----------------------------------------------------------------------

    def __call__(self) -> tuple[PartitionSpec, ...]:
        if self._clock() >= self._due_at and not self._stop.is_set():
            self._refresh_if_idle()
        return self._current

    @property
    def last_error(self) -> Exception | None:
        """The error of the last refresh if it failed, else None."""
        return self._last_error

    @property
    def refreshed_at(self) -> float:
        """When (by `clock`) the current list was fetched."""
        return self._refreshed_at

    @property
    def closed(self) -> bool:
        """Whether `close` was called: the list is no longer refreshed."""
        return self._stop.is_set()

    # -- refreshing --------------------------------------------------------------------

    def refresh(self) -> tuple[PartitionSpec, ...]:
        """List the journals now and return them; on failure keep the old list and raise."""
        with self._lock:
            return self._refresh_locked()

    def _refresh_locked(self) -> tuple[PartitionSpec, ...]:
        attempted_at = self._clock()
        # Without the thread, calls refresh after one interval; with it, they only step
        # in when it is a whole interval late.
        self._due_at = attempted_at + self.interval * (2 if self._background else 1)
        try:
            specs = self.client.list(str(self.selector))
            current = tuple(sorted(specs, key=lambda spec: spec.name))
        except Exception as err:
            self._last_error = err
            raise
        if current != self._current:  # keep the old tuple when equal: mappings cache on it
            self._current = current
        self._last_error = None
        self._refreshed_at = attempted_at
        return self._current

    def _refresh_if_idle(self) -> None:
        if not self._lock.acquire(blocking=False):
            return  # Another caller or the thread is refreshing: use the current list.
        try:
            self._refresh_locked()
        except Exception as err:
            self._log_failure(err)
        finally:
            self._lock.release()

    def _log_failure(self, err: Exception) -> None:
        _log.warning(
            "listing journals matching %r failed; keeping the last %d: %s",
            str(self.selector),
            len(self._current),
            err,
        )

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.refresh()
            except Exception as err:
                self._log_failure(err)

    # -- lifetime ----------------------------------------------------------------------

    def close(self, timeout: float | None = 5.0) -> None:
        """Stop refreshing; the last list stays readable."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def __enter__(self) -> PolledList:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PolledList({str(self.selector)!r}, {len(self._current)} journals)"

    def __reduce__(self) -> Any:
        raise TypeError("a PolledList cannot be pickled: create one in each process")

    def _after_fork_in_child(self) -> None:
        """The child has no refresh thread, and the lock may be held by a thread gone."""
        self._lock = threading.Lock()
        self._thread = None
        self._background = False
        self._due_at = min(self._due_at, self._refreshed_at + self.interval)


_live_lists: weakref.WeakSet[PolledList] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for polled in list(_live_lists):
        polled._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
