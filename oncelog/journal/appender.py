"""Appending: spool appends in memory and group-commit them, one fragment per flush.

The batching half of appending (as Gazette's spool.go is to persister.go; the storing half,
write-then-claim-if-absent with its retries and lost races, is `_persister.Persister`).

One Appender serves every thread of a process appending to a journal. An AsyncAppend holds
the appender's write lock from `start_append` to `release`, so its bytes are contiguous and
land in one fragment. Released appends accumulate in the open batch while the previous batch
is being written (group commit); a batch is sealed when it reaches FragmentSpec.length, when
the writer is free (flush_interval 0), after flush_interval, or when someone waits for it.
`start_append_many` spools many records under one hold of the lock, a run of whole records
per batch with one copy, and gives each record the offsets single appends would have had.
One writer thread per appender takes sealed batches in order and persists them; a failed
batch fails every batch queued behind it (sealed, or open when the failure is recorded, with
an append in progress or not), unwritten, so an append started before a failure was recorded
is never durable after the failed one. (Appends started after it are independent: they go to
a fresh batch.) A caller that enqueues an append which must not outlive earlier ones (a
transaction's ACK behind its messages, `oncelog.publisher`) relies on this: once it holds the
write lock, either an earlier append's failure is already visible (`done()` and `result()`
raising) or its own batch is failed with it.

Holds: while a caller holds the appender (`hold`, a count: a publisher's open transaction
does, so that its messages and its ACK share one fragment, one fsync and one claim), an
idle writer does not seal the open batch by itself (as it does with flush_interval 0) for
up to `HOLD_LIMIT` seconds from the batch's first append (or flush_interval, if longer).
Anything else that makes a batch due still does: someone waiting for an append (`result`,
`flush`), the batch reaching FragmentSpec.length, closing. Holds change when a batch is
written, never what it holds or in which order.

Locks and what they guard (Appender):
- `_write_lock`: held by an AsyncAppend from start to release (and by start_append_many
  and flush); guards the open batch's bytes (`_open.buf`, `used`, `created`) and the
  reading of `_open` on the hot path.
- `_state` (a Condition): guards `_open` being replaced, `_sealed`, `_sealed_bytes`,
  `_inflight`, `_flush_requested`, `_seal_requested`, `_holds`, `_thread` and `_closed`;
  `_room` is
  written under it and read without it on the hot path (a stale value only sends an append
  down the slow path, which re-reads it under the lock).
- Lock order: `_write_lock`, then `_state`. Nothing takes `_write_lock` while holding
  `_state` (the writer thread only tries it without blocking, outside `_state`). The
  persister runs holding neither; the claims index's locks are leaves taken inside its calls.
- A batch's `base`, `error` and `event` are written by the writer thread before `event` is
  set, and read by waiters after it is set. A failure's errors and events are set inside the
  `_state` section that records it (`_fail`), so that whoever takes the write lock after it
  sees them.
"""

from __future__ import annotations

import collections
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import accumulate, repeat
from time import monotonic as _monotonic
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

from oncelog.journal import _spoolcore
from oncelog.journal._persister import Persister
from oncelog.journal._spoolcore import AppendCore, AppenderCore, BatchCore
from oncelog.journal.errors import AppendFailed, JournalError
from oncelog.journal.index import ClaimsIndex
from oncelog.journal.spec import FragmentSpec
from oncelog.journal.store import FragmentStore

__all__ = ["AppendResult", "AsyncAppend", "AsyncAppendMany", "Appender"]

_IDLE_EXIT = 5.0  # seconds an idle writer thread lingers before exiting
HOLD_LIMIT = 1.0
"""Seconds a held appender lets its open batch wait for more appends (see the module)."""
_MIN_PENDING_LIMIT = 16 << 20


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where an append landed: journal bytes [begin, end) (`journal` is informative and
    left out of comparisons, so `AppendResult(0, 5)` equals a result of any journal)."""

    begin: int
    end: int
    journal: str = field(default="", compare=False)


_cores = _spoolcore.cores()
if TYPE_CHECKING:  # the C cores have the pure cores' interface
    _BatchBase = BatchCore
    _AppendBase = AppendCore
    _AppenderBase = AppenderCore
    Outstanding = _spoolcore.Outstanding
    Lane = _spoolcore.Lane
else:
    _BatchBase, _AppendBase, _AppenderBase, Outstanding, Lane = _cores
# Outstanding: the appends still to wait for, the latest of each batch; Lane: appends made
# by one function, remembered in an Outstanding, one call each (see `_spoolcore`).


class _Batch(_BatchBase):
    """Bytes of the appends that will share one fragment (`buf`, `used`, `created`: the
    core's, see `_spoolcore`)."""

    __slots__ = ("event", "base", "error", "sealed", "doom")

    def __init__(self) -> None:
        super().__init__()
        self.event = threading.Event()
        self.base = 0
        self.error: BaseException | None = None
        self.sealed = False
        # Set (under `_state`) when an earlier batch failed while this one was open with an
        # append in progress: the writer fails it with this error instead of writing it.
        self.doom: AppendFailed | None = None


# AsyncAppend._end doubles as its state: these negative values until it is released.
_OPEN, _ABORTED = _spoolcore.OPEN, -2


class AsyncAppend(_AppendBase):
    """One append in progress: `write` bytes, then `release` (or `abort`), then wait on
    `result`. Between `start_append` and `release` it holds the journal's write lock, so keep
    that span short and release from the thread that started it.

    `write(data) -> int` adds bytes to the append and returns their count; `release()`
    finishes writing: the append is queued for its fragment and the lock is let go (both are
    the core's, in C where built: see `_spoolcore`)."""

    __slots__ = ()
    _appender: Appender  # the core's fields, with the types the subclasses give them
    _batch: _Batch

    @property
    def journal(self) -> str:
        return self._appender.journal

    @property
    def appender(self) -> Appender:
        """The appender this append was started on (for `Appender.hold`)."""
        return self._appender

    def _misuse(self, what: str) -> None:
        """Raise the error of a `write` or `release` ("write", "release") after release."""
        if what == "write":
            raise JournalError(f"write to an append of journal {self.journal!r} already released")
        raise JournalError(f"append to journal {self.journal!r} released twice")

    def abort(self) -> None:
        """Drop the bytes written so far and let the lock go; `result()` then raises."""
        if self._end != _OPEN:
            raise JournalError(f"append to journal {self.journal!r} already released")
        self._appender._abort(self)

    def done(self) -> bool:
        """Whether the append is durable (or failed)."""
        return self._end == _ABORTED or (self._end != _OPEN and self._batch.event.is_set())

    def result(self, timeout: float | None = None) -> AppendResult:
        """Wait until the append is durable and return where it landed.

        Raises TimeoutError after `timeout` seconds and AppendFailed if it could not be written.
        """
        if self._end == _OPEN:
            raise JournalError(
                f"result() of an append to journal {self.journal!r} before release()"
            )
        if self._end == _ABORTED:
            raise AppendFailed(f"the append to journal {self.journal!r} was aborted", made=False)
        batch = self._batch
        if not batch.event.is_set():
            self._appender._request_flush()
            if not batch.event.wait(timeout):
                raise TimeoutError(
                    f"append to journal {self.journal!r} not durable after {timeout} s"
                )
        if batch.error is not None:
            raise batch.error
        return AppendResult(batch.base + self._begin, batch.base + self._end, self.journal)

    def __enter__(self) -> AsyncAppend:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._end == _OPEN:
            if exc_type is None:
                self.release()
            else:
                self.abort()


class AsyncAppendMany:
    """Many appends made by one `start_append_many` call: one per record, in order. Each
    record is contiguous and in one fragment; `result` waits until all are durable."""

    __slots__ = ("_appender", "_offsets", "_runs", "_results")

    def __init__(
        self, appender: Appender, offsets: list[int], runs: list[tuple[_Batch, int, int]]
    ) -> None:
        self._appender = appender
        # Record k is bytes [offsets[k], offsets[k + 1]) of the call; a run (batch, first,
        # at) puts records first.. (up to the next run's first) at byte `at` of `batch`.
        self._offsets = offsets
        self._runs = runs
        self._results: list[AppendResult] | None = None

    @property
    def journal(self) -> str:
        return self._appender.journal

    def __len__(self) -> int:
        """The number of records (appends) of the call."""
        return len(self._offsets) - 1

    def _batches(self) -> list[_Batch]:
        """The batches holding the records, in write order, each once."""
        batches: list[_Batch] = []
        for batch, _, _ in self._runs:
            if not batches or batches[-1] is not batch:
                batches.append(batch)
        return batches

    def done(self) -> bool:
        """Whether every record is durable, or one of their fragments failed."""
        for batch in self._batches():
            if not batch.event.is_set():
                return False
            if batch.error is not None:
                return True
        return True

    def result(self, timeout: float | None = None) -> list[AppendResult]:
        """Wait until every record is durable and return where each landed, in order.

        Raises TimeoutError after `timeout` seconds and AppendFailed if a fragment holding
        any of the records could not be written.
        """
        if self._results is not None:
            return self._results
        deadline = None if timeout is None else _monotonic() + timeout
        asked = False
        for batch in self._batches():
            if not batch.event.is_set():
                if not asked:
                    self._appender._request_flush()
                    asked = True
                left = None if deadline is None else max(0.0, deadline - _monotonic())
                if not batch.event.wait(left):
                    raise TimeoutError(
                        f"{len(self)} appends to journal {self.journal!r} not durable "
                        f"after {timeout} s"
                    )
            if batch.error is not None:
                raise batch.error
        self._results = self._build_results()
        return self._results

    def _build_results(self) -> list[AppendResult]:
        # Per run: a record's journal offset is its offset in the call shifted by where the
        # run landed (the base of its fragment, which a lost race may have moved).
        offsets, runs, journal = self._offsets, self._runs, self.journal
        stops = [first for _, first, _ in runs[1:]]
        stops.append(len(offsets) - 1)
        results: list[AppendResult] = []
        for (batch, first, at), stop in zip(runs, stops):
            shift = (batch.base + at - offsets[first]).__add__
            results += map(
                AppendResult,
                map(shift, offsets[first:stop]),
                map(shift, offsets[first + 1 : stop + 1]),
                repeat(journal, stop - first),
            )
        return results


def _offsets(records: list[Any] | tuple[Any, ...], joined: bytes) -> list[int]:
    """Byte offsets of the records in their concatenation `joined` (len(records) + 1)."""
    try:
        offsets = list(accumulate(map(len, records), initial=0))
        if offsets[-1] == len(joined):
            return offsets
    except TypeError:  # a bytes-like object without len()
        pass
    # len() counts items, not bytes, for memoryviews and arrays of wider items.
    return list(accumulate((memoryview(r).nbytes for r in records), initial=0))


def _bad_record(journal: str, records: list[Any] | tuple[Any, ...]) -> TypeError:
    """The error for a call whose records are not all bytes-like, naming the first bad one."""
    for index, record in enumerate(records):
        try:
            memoryview(record)
        except TypeError:
            return TypeError(
                f"append_many to journal {journal!r}: record {index} is a "
                f"{type(record).__name__}, not a bytes-like object; nothing was appended"
            )
    return TypeError(f"append_many to journal {journal!r}: records must be bytes-like")


class Appender(_AppenderBase):
    """The appender of one journal in one process (shared by all its threads).

    `start_append() -> AsyncAppend` takes the write lock and begins an append (it blocks
    while another is in progress or while too many bytes wait to be written).
    `append_made(make, *args) -> (AsyncAppend, token)` is `start_append`, `write` and
    `release` in one call (one AsyncAppend, one pass over the lock), with the record made by
    `make(*args)`, which returns `(data, token)`, while the write lock is held: for a record
    stamped with something that must follow the journal's append order (a publisher's clock,
    `oncelog.publisher`), `make` runs in that order. If `make` (or copying its data) raises,
    the append is released empty, as `release()` after a failed `write` in a `finally`
    would (nothing is appended), and the error propagates. Both are the core's (in C where
    built: see `_spoolcore`), so an append costs one call.
    """

    index: ClaimsIndex
    _open: _Batch
    _append_type: type[AsyncAppend]

    def __init__(
        self,
        store: FragmentStore,
        index: ClaimsIndex,
        fragment_spec: FragmentSpec,
        retry_timeout: float = 30.0,
    ) -> None:
        self.store = store
        self.index = index
        self.journal = index.journal
        self._length = fragment_spec.length
        self._interval = fragment_spec.flush_interval
        self._limit = max(2 * self._length, _MIN_PENDING_LIMIT)

        self._write_lock = threading.Lock()  # held by an AsyncAppend from start to release
        self._state = threading.Condition(threading.Lock())  # guards everything below
        self._append_type = AsyncAppend
        self._open = _Batch()
        self._sealed: collections.deque[_Batch] = collections.deque()
        self._sealed_bytes = 0
        self._inflight: _Batch | None = None
        self._flush_requested = False
        self._seal_requested = False
        self._holds = 0
        self._room = min(self._length, self._limit)
        self._thread: threading.Thread | None = None
        self._closed = False
        self._persister = Persister(store, index, fragment_spec.codec, retry_timeout)
        try:
            store.prepare_journal(self.journal)
        except OSError:  # the writer makes them when it writes (and reports failures)
            pass

    @property
    def fragments_written(self) -> int:
        """Fragments this appender has written and claimed."""
        return self._persister.fragments_written

    @property
    def races_lost(self) -> int:
        """Claims this appender lost to another writer (each then retried at the new head)."""
        return self._persister.races_lost

    def hold(self) -> None:
        """Let the open batch wait for more appends while the writer is idle (see the
        module); every `hold` must be paired with one `unhold`."""
        with self._state:
            self._holds += 1

    def unhold(self) -> None:
        """Undo one `hold`; the last one lets an idle writer seal the open batch at once."""
        with self._state:
            if self._holds <= 0:
                raise JournalError(f"unhold of the appender of journal {self.journal!r} "
                                   "without a hold")
            self._holds -= 1
            self._state.notify_all()  # the writer re-evaluates whether the batch is due

    def _wait_interval_locked(self) -> float:
        """How long the open batch may wait for more appends (0: due when the writer is
        free): flush_interval, and at least HOLD_LIMIT while the appender is held."""
        return max(self._interval, HOLD_LIMIT) if self._holds else self._interval

    # -- the AsyncAppend side ----------------------------------------------------------------

    if TYPE_CHECKING:  # the core's, with the types this subclass gives them

        def start_append(self) -> AsyncAppend: ...

        def append_made(
            self, make: Callable[..., tuple[Any, Any]], *args: Any
        ) -> tuple[AsyncAppend, Any]: ...

    def _next_batch(self, batch: BatchCore) -> _Batch:
        """The batch to append to when the open one is full, a seal is wanted, too many bytes
        wait to be written, or the appender is closed. Entered and left holding the write
        lock, which is let go while waiting for the writer and when raising."""
        try:
            while True:
                if self._closed:
                    raise JournalError(f"the appender of journal {self.journal!r} is closed")
                with self._state:
                    if batch.used:
                        self._seal_locked()
                    elif cast(_Batch, batch).doom is not None:
                        self._open = _Batch()  # nothing released into it: drop it
                    self._seal_requested = False
                    self._update_room_locked()
                    if self._sealed_bytes < self._limit:
                        return self._open
                # Too many bytes wait to be written: let the writer catch up (without the lock).
                self._write_lock.release()
                try:
                    with self._state:
                        self._state.wait_for(
                            lambda: self._sealed_bytes < self._limit or self._closed
                        )
                finally:
                    self._write_lock.acquire()
                batch = self._open
                if len(batch.buf) < self._room:
                    return batch
        except BaseException:
            self._write_lock.release()
            raise

    def start_append_many(self, records: Iterable[Any]) -> AsyncAppendMany:
        """Append each record as one append, in order; see JournalClient.start_append_many.

        Records are spooled in runs: as many whole records as fit the open batch go in with
        one copy, then the batch is sealed and the next run starts a new one. The write lock
        is held throughout, except while waiting for the writer to catch up.
        """
        if isinstance(records, (bytes, bytearray, memoryview, str)):
            raise TypeError(
                f"append_many to journal {self.journal!r} takes an iterable of records, "
                f"not one {type(records).__name__}"
            )
        recs = records if isinstance(records, (list, tuple)) else list(records)
        if not recs:
            return AsyncAppendMany(self, [0], [])
        try:
            joined = b"".join(recs)  # also checks, in C, that every record is bytes-like
        except TypeError:
            raise _bad_record(self.journal, recs) from None
        offsets = _offsets(recs, joined)
        count = len(recs)
        view = memoryview(joined)
        runs: list[tuple[_Batch, int, int]] = []
        first = 0
        self._write_lock.acquire()
        while first < count:
            batch = self._open
            at = len(batch.buf)
            room = self._room  # the writer thread may lower it meanwhile: read it once
            if at >= room:
                try:
                    batch = self._next_batch(batch)
                except JournalError as exc:  # closed meanwhile
                    raise JournalError(
                        f"{exc}: of {count} records, the first {first} were appended, the "
                        "rest were not"
                    ) from exc
                left = runs[-1][0] if runs else None
                if left is not None and (left.doom is not None or left.error is not None):
                    # The run before failed: the records after it must not be durable
                    # either (appends of one call are in order, like appends in a row).
                    with self._state:
                        batch.doom = AppendFailed(
                            f"append_many to journal {self.journal!r}: records from "
                            f"{first} on were not made: an earlier run of the same call "
                            "failed",
                            made=False,
                        )
                        batch.doom.__cause__ = left.doom or left.error
                        self._seal_requested = True
                        self._update_room_locked()
                at = len(batch.buf)
                room = self._room
            # Records starting before the room runs out go in; the last may cross it, as a
            # single append would (one append is never split). At least one goes in.
            stop = bisect_left(offsets, offsets[first] + room - at, first + 1, count)
            try:
                batch.buf += view[offsets[first] : offsets[stop]]
            except BaseException:  # e.g. MemoryError: this run is not appended
                self._write_lock.release()
                raise
            if not batch.used:
                batch.used = True
                batch.created = _monotonic()
            runs.append((batch, first, at))
            first = stop
        if self._seal_requested:
            self._hand_over()
        else:
            self._write_lock.release()
            self._wake()
        return AsyncAppendMany(self, offsets, runs)

    def _update_room_locked(self) -> None:
        """Recompute how far the open batch may grow before start_append takes the slow path
        (0 forces it: a seal was requested or the appender is closed)."""
        if self._seal_requested or self._closed:
            self._room = 0
        else:
            self._room = min(self._length, self._limit - self._sealed_bytes)

    def _hand_over(self) -> None:
        """Seal the open batch for the waiting writer, then let the write lock go."""
        try:
            with self._state:
                self._seal_locked()
        finally:
            self._write_lock.release()

    def _wake(self) -> None:
        with self._state:
            self._wake_locked()

    def _abort(self, aa: AsyncAppend) -> None:
        batch = aa._batch
        del batch.buf[aa._begin :]
        aa._end = _ABORTED
        if self._seal_requested and batch.used:
            with self._state:
                self._seal_locked()
        self._write_lock.release()

    def _request_flush(self) -> None:
        with self._state:
            self._flush_requested = True
            self._wake_locked()

    def flush(self, timeout: float | None = None) -> None:
        """Write everything released so far and wait until it is durable; raises the error
        of the first batch that failed among those (the ones queued behind it fail with
        it, unwritten: the first one's error says what happened)."""
        with self._write_lock, self._state:
            if self._open.used:
                self._seal_locked()
            pending = list(self._sealed)
            if self._inflight is not None:
                pending.insert(0, self._inflight)
            self._wake_locked()
        if pending:
            if not pending[-1].event.wait(timeout):
                raise TimeoutError(f"flush of journal {self.journal!r} timed out")
            for batch in pending:
                if batch.error is not None:
                    raise batch.error

    def close(self) -> None:
        """Flush, then stop the writer thread."""
        try:
            self.flush()
        finally:
            with self._state:
                self._closed = True
                self._update_room_locked()
                self._state.notify_all()
                thread = self._thread
            if thread is not None and thread is not threading.current_thread():
                thread.join()

    # -- the writer side ------------------------------------------------------------------------

    def _seal_locked(self) -> None:
        """Move the open batch to the write queue (caller holds both locks)."""
        batch = self._open
        batch.sealed = True
        self._sealed.append(batch)
        self._sealed_bytes += len(batch.buf)
        self._open = _Batch()
        self._seal_requested = False
        self._flush_requested = False
        self._update_room_locked()
        self._wake_locked()

    def _wake_locked(self) -> None:
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(
                target=self._run, name=f"oncelog-append:{self.journal}", daemon=True
            )
            self._thread.start()
        self._state.notify_all()

    def _due_locked(self) -> bool:
        batch = self._open
        if not batch.used:
            return False
        interval = self._wait_interval_locked()
        return (
            interval <= 0
            or self._flush_requested
            or self._closed
            or len(batch.buf) >= self._length
            or time.monotonic() >= batch.created + interval
        )

    def _run(self) -> None:
        while True:
            with self._state:
                idle_since = time.monotonic()
                while not self._sealed and not self._due_locked():
                    if self._closed:
                        self._thread = None
                        return
                    if self._open.used:
                        timeout = max(
                            0.0,
                            self._open.created + self._wait_interval_locked() - time.monotonic(),
                        )
                    else:
                        timeout = _IDLE_EXIT - (time.monotonic() - idle_since)
                        if timeout <= 0:
                            self._thread = None
                            return
                    self._state.wait(timeout)
                if not self._sealed:
                    self._seal_requested = True  # the next release hands the batch over
                    self._room = 0
            if self._seal_requested:
                if self._write_lock.acquire(blocking=False):
                    try:
                        with self._state:
                            if self._open.used:
                                self._seal_locked()
                            elif self._open.doom is not None:
                                self._open = _Batch()  # nothing released into it: drop it
                            self._seal_requested = False
                            self._update_room_locked()
                    finally:
                        self._write_lock.release()
                else:
                    with self._state:
                        self._state.wait_for(
                            lambda: self._sealed or not self._seal_requested or self._closed,
                            timeout=0.05,
                        )
                with self._state:
                    if not self._sealed:
                        continue
            with self._state:
                batch = self._sealed.popleft()
                self._inflight = batch
            try:
                if batch.doom is not None:  # queued behind a failed batch: never written
                    batch.error = batch.doom
                    batch.event.set()
                else:
                    self._write(batch)
            except BaseException as exc:  # noqa: BLE001 - every failure must reach the callers
                self._fail(batch, exc)
            finally:
                with self._state:
                    self._sealed_bytes -= len(batch.buf)
                    self._inflight = None
                    self._update_room_locked()
                    self._state.notify_all()

    def _fail(self, batch: _Batch, exc: BaseException) -> None:
        """Fail `batch` with `exc` (as AppendFailed) and, unwritten, every batch queued behind
        it: the sealed ones, and the open one if anything was released or is being appended
        into it. Invariant: an append started before this failure is recorded is never made
        durable after it; one started after it goes to a fresh batch and is independent.

        The batches behind get an error of their own saying they were not made (they never
        reached the store), whatever the failed batch's outcome; its error is their cause
        (and is not quoted in their text, which states one outcome only). Errors and events are set
        inside the `_state` section recording the failure: a thread that takes the write lock
        afterwards sees the earlier appends failed (their `done()` and `result()`), and one
        that held it before has its batch failed here."""
        if isinstance(exc, AppendFailed):
            error = exc
        else:
            error = AppendFailed(
                f"append of {len(batch.buf)} bytes to journal {self.journal!r} failed: {exc!r}"
            )
            error.__cause__ = exc
        journal = self.journal

        def behind(b: _Batch) -> AppendFailed:
            cascaded = AppendFailed(
                f"append of {len(b.buf)} bytes to journal {journal!r} was not made: it was "
                f"queued behind a batch of {len(batch.buf)} bytes that failed (the cause)",
                made=False,
            )
            cascaded.__cause__ = error
            return cascaded

        # Without blocking (the lock order is _write_lock, then _state): taken, nobody is
        # appending and the open batch can be failed at once; held by an append in progress,
        # the open batch is doomed, and that append's release hands it over to be failed.
        writing = not self._write_lock.acquire(blocking=False)
        try:
            with self._state:
                failed = [(batch, error)]
                for b in self._sealed:
                    self._sealed_bytes -= len(b.buf)
                    failed.append((b, behind(b)))
                self._sealed.clear()
                open_batch = self._open
                if writing:
                    open_batch.doom = behind(open_batch)
                    self._seal_requested = True
                elif open_batch.used:
                    failed.append((open_batch, behind(open_batch)))
                    self._open = _Batch()
                    self._flush_requested = False
                self._update_room_locked()
                for b, e in failed:
                    b.sealed = True
                    b.error = e
                    b.event.set()
                self._state.notify_all()
        finally:
            if not writing:
                self._write_lock.release()

    def _write(self, batch: _Batch) -> None:
        """Persist a sealed batch (writer thread, holding no lock) and wake its waiters."""
        batch.base = self._persister.persist(batch.buf)
        batch.event.set()


def appender_of(append: AsyncAppend) -> Appender:
    """The appender an append was started on (for `Appender.hold`)."""
    return append.appender


def first_failure(appends: Iterable[AsyncAppend], wait: bool = True) -> AppendFailed | None:
    """The error of the first of `appends` (released or aborted, in order) that failed, or
    None; with `wait`, after waiting until each is durable or failed, else among those
    already known. Appends sharing a batch share its outcome, so each batch is looked at
    once: a transaction's thousands of appends cost a few checks, not a `result()` each.
    Errors other than AppendFailed (an interrupt while waiting) propagate."""
    last: _Batch | None = None
    for append in appends:
        if append._end >= 0:  # released: its batch's outcome is its own
            if append._batch is last:
                continue
            last = append._batch
        if not wait and not append.done():
            continue
        try:
            append.result()
        except AppendFailed as exc:
            return exc
    return None

