"""The shared retry loop (`oncelog._retry.retry`) and the journal's storage retries built on
it (`oncelog.journal._retry.retry`): which failures are retried, the callback between
attempts, the pauses, and the deadline. A fake clock stands in for `time` (sleeping moves
it), so the tests are exact and take no wall time."""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

import pytest

from oncelog import _retry as shared
from oncelog.journal import _retry as journal_retry
from oncelog.journal.errors import JournalError


class FakeClock:
    """`time` for the loop under test: `sleep` advances `monotonic` and is recorded."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.pauses: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(shared, "time", fake)
    return fake


class GaveUp(Exception):
    def __init__(self, last: Exception) -> None:
        super().__init__(f"gave up after {last!r}")
        self.last = last


def give_up(exc: Exception) -> NoReturn:
    raise GaveUp(exc)


def failing(errors: list[Exception], result: str = "done") -> tuple[Callable[[], str], list[int]]:
    """An op raising `errors` in turn, then returning `result`; and its call count."""
    calls = [0]

    def op() -> str:
        calls[0] += 1
        if errors:
            raise errors.pop(0)
        return result

    return op, calls


class Retriable(Exception):
    pass


class Final(Exception):
    pass


def is_retriable(exc: Exception) -> bool:
    return isinstance(exc, Retriable)


# -- the shared loop -------------------------------------------------------------------------


def test_retries_only_what_the_callers_predicate_accepts(clock: FakeClock) -> None:
    op, calls = failing([Retriable("a"), Retriable("b")])
    assert shared.retry(op, 10, give_up, retriable=is_retriable) == "done"
    assert calls[0] == 3

    final = Final("refused")
    op, calls = failing([Retriable("a"), final])
    with pytest.raises(Final) as info:
        shared.retry(op, 10, give_up, retriable=is_retriable)
    assert info.value is final  # raised at once, unchanged
    assert calls[0] == 2


def test_on_retry_runs_between_attempts_and_not_before_giving_up(clock: FakeClock) -> None:
    seen: list[tuple[str, int]] = []
    errors: list[Exception] = [Retriable(str(i)) for i in range(100)]
    op, calls = failing(errors)

    def on_retry(exc: Exception) -> None:
        seen.append((str(exc), len(clock.pauses)))  # before this attempt's pause

    with pytest.raises(GaveUp) as info:
        shared.retry(op, 1.0, give_up, retriable=is_retriable, on_retry=on_retry,
                     first_delay=0.05, max_delay=0.5)
    # Once per retried failure, each before its pause; the last failure goes to give_up only.
    assert seen == [(str(i), i) for i in range(calls[0] - 1)]
    assert str(info.value.last) == str(calls[0] - 1)


def test_what_on_retry_raises_stops_the_retries(clock: FakeClock) -> None:
    op, calls = failing([Retriable("a"), Retriable("b")])

    def on_retry(exc: Exception) -> None:
        raise Final(f"checked after {exc}")

    with pytest.raises(Final, match="checked after a"):
        shared.retry(op, 10, give_up, retriable=is_retriable, on_retry=on_retry)
    assert calls[0] == 1


def test_pauses_double_from_first_to_max_delay_jittered_and_stop_at_the_deadline(
        clock: FakeClock) -> None:
    op, calls = failing([Retriable(str(i)) for i in range(1000)])
    start = clock.now
    with pytest.raises(GaveUp):
        shared.retry(op, 5.0, give_up, retriable=is_retriable, first_delay=0.02, max_delay=0.5)
    nominal = [min(0.02 * 2 ** i, 0.5) for i in range(len(clock.pauses))]
    for pause, delay in zip(clock.pauses, nominal):
        assert 0.5 * delay <= pause <= 1.5 * delay
    assert clock.pauses and max(nominal) == 0.5
    # Bounded: no pause is begun that would end past the deadline (nominally).
    assert clock.now - start <= 5.0 + 0.5 * 0.5
    assert calls[0] == len(clock.pauses) + 1


def test_a_zero_timeout_makes_one_attempt(clock: FakeClock) -> None:
    op, calls = failing([Retriable("once"), Retriable("twice")])
    with pytest.raises(GaveUp) as info:
        shared.retry(op, 0, give_up, retriable=is_retriable)
    assert str(info.value.last) == "once"
    assert calls[0] == 1 and clock.pauses == []


def test_base_exceptions_are_never_caught(clock: FakeClock) -> None:
    op, calls = failing([KeyboardInterrupt()])  # type: ignore[list-item]
    with pytest.raises(KeyboardInterrupt):
        shared.retry(op, 10, give_up, retriable=lambda exc: True)
    assert calls[0] == 1


# -- the journal's storage retries (unchanged behaviour) -------------------------------------


def test_journal_retry_retries_transient_storage_errors_with_its_own_pauses(
        clock: FakeClock) -> None:
    op, calls = failing([ConnectionResetError("reset"), TimeoutError("slow"), OSError("eio")])
    assert journal_retry.retry(op, 30, give_up) == "done"
    assert calls[0] == 4
    for pause, delay in zip(clock.pauses, (0.01, 0.02, 0.04)):
        assert 0.5 * delay <= pause <= 1.5 * delay

    op, calls = failing([OSError(str(i)) for i in range(1000)])
    start = clock.now
    with pytest.raises(GaveUp) as info:
        journal_retry.retry(op, 10, give_up)
    assert isinstance(info.value.last, OSError)
    assert clock.now - start <= 10 + 0.5 * 1.0
    assert max(clock.pauses) <= 1.5 * 1.0


@pytest.mark.parametrize("error", [
    JournalError("journal 'a': gone"), FileNotFoundError("x"), PermissionError("x"),
    ValueError("x"), KeyError("x"),
])
def test_journal_retry_raises_permanent_errors_at_once(clock: FakeClock,
                                                       error: Exception) -> None:
    op, calls = failing([error])
    with pytest.raises(type(error)) as info:
        journal_retry.retry(op, 30, give_up)
    assert info.value is error and calls[0] == 1 and clock.pauses == []


def test_journal_retry_raises_missing_credentials_at_once(clock: FakeClock) -> None:
    error = type("NoCredentialsError", (Exception,), {"__module__": "botocore.exceptions"})()
    op, calls = failing([error])
    with pytest.raises(Exception) as info:
        journal_retry.retry(op, 30, give_up)
    assert info.value is error and calls[0] == 1
