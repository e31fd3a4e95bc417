"""The appender's cores (`oncelog.journal._spoolcore`): the C ones (`oncelog._spool`) and the
pure ones do the same, step for step, on the same scripted histories; `Outstanding` and
`Lane` keep their contracts under threads; and the appender's own suites also run on the
pure cores (in a child process: the cores are chosen at import)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from speedups_support import PURE_REQUESTED

from oncelog.journal import _spoolcore
from oncelog.journal._spoolcore import Cores
from oncelog.journal.appender import Appender, AsyncAppend

ROOT = Path(__file__).resolve().parent.parent
DEADLINE = 60.0


def _all_cores() -> list[Cores]:
    pure = Cores(
        _spoolcore.BatchCore,
        _spoolcore.AppendCore,
        _spoolcore.AppenderCore,
        _spoolcore.Outstanding,
        _spoolcore.Lane,
    )
    found = [pure]
    if _spoolcore.native is not None:
        found.append(_spoolcore.cores())
    return found


CORES = _all_cores()


def core_id(c: Cores) -> str:
    return "pure" if c.batch is _spoolcore.BatchCore else "c"


class Misuse(Exception):
    pass


def classes(c: Cores) -> tuple[type, type, type]:
    """Minimal subclasses, as `oncelog.journal.appender`'s, recording the slow-path calls."""

    class Batch(c.batch):  # type: ignore[name-defined, misc]
        __slots__ = ("ref", "__weakref__")

    class Append(c.append):  # type: ignore[name-defined, misc]
        __slots__ = ()

        def _misuse(self, what: str) -> None:
            raise Misuse(what)

    class App(c.appender):  # type: ignore[name-defined, misc]
        def __init__(self, room: int) -> None:
            self.index = SimpleNamespace(stale=False)
            self._write_lock = threading.Lock()
            self._append_type = Append
            self._open = Batch()
            self._room = room
            self._seal_requested = False
            self._closed = False
            self.calls: list[str] = []
            self.sealed: list[Any] = []

        def _next_batch(self, batch: Any) -> Any:
            self.calls.append("next")
            if self._closed:
                self._write_lock.release()
                raise Misuse("closed")
            if batch.used:
                self.sealed.append(batch)
                self._open = Batch()
            return self._open

        def _hand_over(self) -> None:
            self.calls.append("hand_over")
            self.sealed.append(self._open)
            self._open = Batch()
            self._seal_requested = False
            self._write_lock.release()

        def _wake(self) -> None:
            self.calls.append("wake")

    return Batch, Append, App


def script(c: Cores) -> list[Any]:
    """One history through every path of the cores; returns everything observable."""
    _, _, App = classes(c)
    app = App(room=10)
    seen: list[Any] = []

    def state(label: str) -> None:
        seen.append((label, list(app.calls), bytes(app._open.buf), app._open.used,
                     [bytes(b.buf) for b in app.sealed], app._write_lock.locked()))

    def attempt(label: str, fn: Callable[[], Any]) -> Any:
        try:
            out = fn()
        except Exception as exc:  # noqa: BLE001 - recorded and compared
            # Our own errors word for word; Python's (argument parsing) by type.
            said = str(exc) if isinstance(exc, Misuse) or "append_made:" in str(exc) else ""
            seen.append((label, "raised", type(exc).__name__, said))
            state(label + "/after")
            return None
        state(label)
        return out

    first = app.start_append()
    seen.append(("first", first._begin, first._end, first.write(b"abc"), first._end))
    first.release()
    state("first released")
    assert app._open.created > 0
    second = app.start_append()
    second.write(bytearray(b"de"))
    second.write(memoryview(b"f"))
    second.release()
    seen.append(("second", second._begin, second._end))
    state("second released")
    attempt("write after release", lambda: second.write(b"x"))
    attempt("release twice", second.release)
    # The room is used up: the next append takes the slow path, in a fresh batch.
    app._open.buf += b"0123"
    third = app.start_append()
    seen.append(("third", third._begin, third._batch is app._open))
    third.release()  # empty
    state("third released")
    # A seal requested: the release hands the batch over.
    app._seal_requested = True
    fourth = app.start_append()
    fourth.write(b"gh")
    fourth.release()
    state("handed over")
    # append_made, and its failures: nothing appended, the lock let go, the error raised.
    token = object()
    made, got = app.append_made(lambda d, t: (d, t), b"ijk", token)
    seen.append(("made result", made._begin, made._end, got is token))
    state("made")
    shared = (bytes(bytearray(b"lm")), "shared")  # made at run time: not a constant
    pair = app.append_made(lambda: shared)
    seen.append(("shared", pair[1], shared[0] == b"lm", pair[0]._end - pair[0]._begin))
    attempt("make raises", lambda: app.append_made(lambda: 1 / 0))
    attempt("not a pair", lambda: app.append_made(lambda: b"no"))
    attempt("not bytes", lambda: app.append_made(lambda: (5, None)))
    attempt("bytearray made", lambda: app.append_made(lambda: (bytearray(b"n"), 1))[1])
    attempt("no make", lambda: app.append_made())
    # Closed: the slow path raises and has let the lock go.
    app._closed = True
    app._room = 0
    attempt("closed start", app.start_append)
    attempt("closed made", lambda: app.append_made(lambda: (b"z", 0)))
    return seen


def test_the_cores_agree_on_one_history() -> None:
    traces = [script(c) for c in CORES]
    assert len(traces[0]) > 20
    assert all(t == traces[0] for t in traces)
    # ...and the history says what the appender relies on.
    trace = dict((entry[0], entry[1:]) for entry in traces[0])
    assert trace["first released"][0] == ["wake"] and not trace["first released"][4]
    assert trace["second released"][1] == b"abcdef"
    assert trace["write after release"][:3] == ("raised", "Misuse", "write")
    assert trace["release twice"][:3] == ("raised", "Misuse", "release")
    assert trace["third"] == (0, True)
    assert trace["handed over"][2] is False and trace["handed over"][3][-1] == b"gh"
    assert trace["made result"] == (0, 3, True)
    assert trace["shared"] == ("shared", True, 2)  # a tuple held elsewhere is not reused
    for failed in ("make raises", "not a pair", "not bytes", "no make", "closed made"):
        assert trace[failed][0] == "raised", failed
        assert trace[failed + "/after"][-1] is False, f"{failed}: the lock is let go"
    assert trace["bytearray made"][-1] is False
    assert trace["closed start"][:3] == ("raised", "Misuse", "closed")


@pytest.mark.parametrize("c", CORES, ids=core_id)
def test_a_failed_make_appends_nothing(c: Cores) -> None:
    _, _, App = classes(c)
    app = App(room=1 << 20)
    app.append_made(lambda: (b"kept", 0))
    for bad in (lambda: 1 / 0, lambda: (object(), 0), lambda: [b"x", 0]):
        with pytest.raises((ZeroDivisionError, TypeError)):
            app.append_made(bad)
        assert bytes(app._open.buf) == b"kept"
        assert app._write_lock.acquire(blocking=False)
        app._write_lock.release()


@pytest.mark.parametrize("c", CORES, ids=core_id)
def test_an_append_in_a_reference_cycle_is_collected(c: Cores) -> None:
    Batch, _, App = classes(c)
    app = App(room=1 << 20)
    append = app.start_append()
    append.release()
    batch = append._batch
    batch.ref = append  # append -> batch -> append
    gone = weakref.ref(batch)
    app._open = Batch()
    del append, batch
    gc.collect()
    assert gone() is None


@pytest.mark.parametrize("c", CORES, ids=core_id)
def test_outstanding_keeps_the_latest_append_of_each_batch(c: Cores) -> None:
    _, _, App = classes(c)
    app = App(room=1 << 20)
    out = c.outstanding()
    a1 = app.start_append()
    a1.release()
    a2 = app.start_append()
    a2.release()
    assert out.add(a1) is False and out.add(a2) is False
    assert len(out) == 1  # same batch: a2 stands for a1
    other = SimpleNamespace(done=lambda: True)  # not an append of ours: kept as it is
    out.add(other)
    out.add(other)
    app._open = type(app._open)()
    a3 = app.start_append()
    a3.release()
    out.add(a3)
    taken = out.take()
    assert taken[0] is a2 and taken[1] is other and taken[2] is other and taken[3] is a3
    assert len(out) == 0 and out.take() == []
    out.add(a1)
    out.restore([a3])
    assert out.take() == [a3, a1]  # restored ones go first
    with pytest.raises(TypeError):
        out.restore((a1,))  # type: ignore[arg-type]


@pytest.mark.parametrize("c", CORES, ids=core_id)
def test_outstanding_says_when_to_prune_and_the_bound_follows(c: Cores) -> None:
    out = c.outstanding()
    items = [SimpleNamespace(n=i) for i in range(2100)]
    says = [out.add(x) for x in items[:1025]]
    assert says[:1024] == [False] * 1024 and says[1024] is True
    kept = out.take()[1000:]
    out.restore(kept)  # 25 left: the bound goes back to 1024
    assert [out.add(x) for x in items[1025:2024]] == [False] * 999
    assert out.add(items[2024]) is True
    out.restore(out.take())  # 1025 pending: the bound doubles
    assert not any(out.add(x) for x in items[2025:2100])


@pytest.mark.parametrize("c", CORES, ids=core_id)
def test_outstanding_loses_nothing_to_concurrent_takes(c: Cores) -> None:
    out = c.outstanding()
    threads_n, each = 4, 3000
    taken: list[Any] = []
    done = threading.Event()
    barrier = threading.Barrier(threads_n + 1)

    def add(t: int) -> None:
        barrier.wait(DEADLINE)
        for i in range(each):
            out.add((t, i))

    def take() -> None:
        barrier.wait(DEADLINE)
        while not done.is_set():
            taken.extend(out.take())

    adders = [threading.Thread(target=add, args=(t,)) for t in range(threads_n)]
    taker = threading.Thread(target=take)
    for th in [*adders, taker]:
        th.start()
    for th in adders:
        th.join(DEADLINE)
        assert not th.is_alive()
    done.set()
    taker.join(DEADLINE)
    assert not taker.is_alive()
    taken.extend(out.take())
    assert sorted(taken) == sorted((t, i) for t in range(threads_n) for i in range(each))
    for t in range(threads_n):  # each thread's own order is kept
        mine = [i for tt, i in taken if tt == t]
        assert mine == sorted(mine)


@pytest.mark.parametrize("c", CORES, ids=core_id)
def test_a_lane_appends_tracks_and_steps_aside(c: Cores) -> None:
    _, _, App = classes(c)
    app = App(room=1 << 20)
    out = c.outstanding()
    fulls: list[int] = []

    def make(doc: bytes, suffix: bytes, tail: bytes) -> tuple[bytes, int]:
        return doc + suffix + tail, len(doc)

    lane = c.lane(app, make, (b"!",), out, lambda: fulls.append(len(out)))
    assert lane.appender is app
    append, token = lane.append(b"ab", b"-")
    assert token == 2 and bytes(app._open.buf) == b"ab-!" and append._end == 4
    assert out.take() == [append]
    with pytest.raises(ZeroDivisionError):
        c.lane(app, lambda: 1 / 0, (), out, lambda: None).append()
    assert app._write_lock.acquire(blocking=False)  # let go after the failure
    app._write_lock.release()
    # Not reusable: None, nothing appended, the lock untouched.
    assert app.reusable is True
    app.index.stale = True
    assert app.reusable is False and lane.append(b"cd", b"-") is None
    app.index.stale = False
    app._closed = True
    assert app.reusable is False and lane.append(b"cd", b"-") is None
    assert bytes(app._open.buf) == b"ab-!" and len(out) == 0
    app._closed = False
    assert app.reusable is True
    # Past the bound, the caller is told to prune (once per add over it).
    for _ in range(1030):
        app._open = type(app._open)()  # a batch per append: one entry each
        lane.append(b"e", b"")
    assert fulls == [1025, 1026, 1027, 1028, 1029, 1030]


def test_the_appender_stands_on_the_c_cores_where_built() -> None:
    if os.environ.get("ONCELOG_REQUIRE_SPEEDUPS", "") not in ("", "0"):
        assert _spoolcore.native is not None, "oncelog._spool is required but not built"
    cores = _spoolcore.cores()
    assert issubclass(Appender, cores.appender) and issubclass(AsyncAppend, cores.append)
    assert (cores.appender is _spoolcore.AppenderCore) == (_spoolcore.native is None)
    assert (_spoolcore.native is None) or not PURE_REQUESTED


@pytest.mark.skipif(PURE_REQUESTED, reason="this run is on the pure cores already")
def test_the_appender_suites_pass_on_the_pure_cores(tmp_path: Path) -> None:
    """The cores are chosen at import: the appender's and the fast publisher's suites run
    again in a child process with ONCELOG_PURE_PYTHON=1."""
    env = dict(os.environ, ONCELOG_PURE_PYTHON="1")
    env.pop("PYTEST_XDIST_WORKER", None)
    files = ["tests/test_journal_appender.py", "tests/test_publisher_fast.py"]
    # Not the S3 variants (a moto server of its own) nor the slow pruning test: the cores
    # are what differs, and the parity tests above cover Outstanding on both.
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-p", "no:randomly", "-k", "not s3 and not never_forgotten", *files],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout
