"""The consumer state machine is deterministic under load: neither a CPU hog nor a clock
that jumps at random changes what hypothesis generates (no FlakyStrategyDefinition)."""

from __future__ import annotations

import math
import random
import subprocess
import sys
import time
import types
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test
from test_consumer_machine import WordCountMachine

from oncelog.consumer import _input, core
from oncelog.testing import ConsumerMachine

RUN = settings(
    max_examples=25,
    stateful_step_count=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.fixture
def cpu_hog() -> Iterator[None]:
    """Busy subprocesses spinning on every core (and one more), for the test's duration."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)
    ]
    try:
        time.sleep(0.2)
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


def test_machine_transactions_have_no_deadline() -> None:
    assert ConsumerMachine.max_duration == math.inf
    machine = WordCountMachine()
    try:
        assert machine._new_consumer().max_duration == math.inf
    finally:
        machine.client.close()


def test_word_count_is_exactly_once_under_cpu_hog(cpu_hog: None) -> None:
    run_state_machine_as_test(WordCountMachine, settings=RUN)


def test_word_count_with_an_erratic_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The consumer's clock jumps ahead by seconds at random (not drawn by hypothesis),
    as if the process were descheduled: with a wall-clock deadline this made transaction
    boundaries, hence crash points and preconditions, differ between runs of an example."""
    rng = random.SystemRandom()
    skew = [0.0]

    def erratic() -> float:
        if rng.random() < 0.3:
            skew[0] += rng.choice([0.5, 2.0, 30.0])
        return time.monotonic() + skew[0]

    clock = types.SimpleNamespace(monotonic=erratic)
    monkeypatch.setattr(core, "time", clock)  # transactions' deadlines
    monkeypatch.setattr(_input, "time", clock)  # and the reading loop's checks of them
    run_state_machine_as_test(WordCountMachine, settings=settings(RUN, max_examples=60))
