"""The growing ring: a Sequencer keeps open transactions in memory up to a byte budget
instead of re-reading them from the journal, and delivers exactly what a fixed ring does.

(The five-way kernel equivalence over random histories, with fixed, tightly budgeted and
unbounded rings, is in test_sequencing_kernel.py.)
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from speedups_support import MODES, speedups_mode

import oncelog.reading
from oncelog.framing import CONTENT_TYPE_JSON_LINES
from oncelog.journal import JournalSpec
from oncelog.message import Envelope, Flags, build_uuid
from oncelog.reading import checkpoint_after_dequeued, read_committed, read_uncommitted
from oncelog.sequencer import DEFAULT_MAX_BYTES, QueueOutcome, Sequencer

JSON = {"content-type": CONTENT_TYPE_JSON_LINES}
BASE = 1 << 60
PRODUCERS = [bytes([1, 2, 3, 4, 5, i]) for i in range(1, 5)]


def line(producer: bytes, clock: int, flags: int, n: int) -> bytes:
    return b'{"uuid":"%s","n":%d}\n' % (str(build_uuid(producer, BASE + clock, flags)).encode(), n)


def transaction(producer: bytes, first_clock: int, size: int, start: int = 0) -> list[bytes]:
    """`size` CONTINUE_TXN lines of `producer` and their ACK (clocks from `first_clock`)."""
    out = [line(producer, first_clock + i, Flags.CONTINUE_TXN, start + i) for i in range(size)]
    out.append(line(producer, first_clock + size, Flags.ACK_TXN, -1))
    return out


def counting_replays(monkeypatch: Any) -> list[tuple[str, int, int]]:
    """Record every replay read_committed asks for."""
    calls: list[tuple[str, int, int]] = []
    make = oncelog.reading._replayer

    def replayer(*args: Any, **kwargs: Any) -> Callable[[str, int, int], Iterable[Envelope]]:
        replay = make(*args, **kwargs)

        def counted(journal: str, begin: int, end: int) -> Iterable[Envelope]:
            calls.append((journal, begin, end))
            return replay(journal, begin, end)

        return counted

    monkeypatch.setattr(oncelog.reading, "_replayer", replayer)
    return calls


def summary(envs: Iterable[Envelope]) -> list[tuple[str, int, int]]:
    return [(e.journal, e.begin, e.end) for e in envs]


@pytest.mark.parametrize("mode", MODES)
def test_a_large_transaction_is_delivered_without_a_replay(
    journals: Any, monkeypatch: Any, mode: str
) -> None:
    journals.create(JournalSpec("budget/big", labels=JSON))
    lines = [line(PRODUCERS[1], 1, Flags.OUTSIDE_TXN, -2)]
    lines += transaction(PRODUCERS[0], 1, 50_000)
    lines.append(line(PRODUCERS[1], 2, Flags.OUTSIDE_TXN, -3))
    journals.append("budget/big", b"".join(lines))
    replays = counting_replays(monkeypatch)
    with speedups_mode(mode):
        seq = Sequencer({"budget/big": 0})
        docs = [e.message.doc["n"] for e in read_committed(journals, "budget/big", sequencer=seq)]
        assert replays == []
        assert seq.buffer == 65_536  # 1,024 doubled six times, and no further
        assert docs == [-2, *range(50_000), -3]
        # Gazette's fixed ring of 1,024 replays the transaction, to the same result.
        fixed = Sequencer({"budget/big": 0}, buffer=1024)
        again = [
            e.message.doc["n"] for e in read_committed(journals, "budget/big", sequencer=fixed)
        ]
        assert again == docs
        assert len(replays) == 1 and fixed.buffer == 1024


@pytest.mark.parametrize("mode", MODES)
def test_beyond_the_budget_transactions_are_replayed(
    journals: Any, monkeypatch: Any, mode: str
) -> None:
    journals.create(JournalSpec("budget/small", labels=JSON))
    lines = transaction(PRODUCERS[0], 1, 3_000) + transaction(PRODUCERS[1], 1, 200)
    journals.append("budget/small", b"".join(lines))
    replays = counting_replays(monkeypatch)
    with speedups_mode(mode):
        # 4 KiB: the ring grows from 8 slots while twice the bytes it holds fit.
        seq = Sequencer({"budget/small": 0}, buffer=8, max_bytes=4096)
        got = summary(read_committed(journals, "budget/small", sequencer=seq))
        assert 8 < seq.buffer and seq.buffer * min(map(len, lines)) <= 4096
        second = sum(map(len, lines[:3001]))
        assert [(j, b) for j, b, _ in replays] == [("budget/small", 0), ("budget/small", second)]
        fixed = Sequencer({"budget/small": 0}, buffer=1 << 20)
        assert got == summary(read_committed(journals, "budget/small", sequencer=fixed))
        assert len(got) == 3_200


def test_sizes_and_arguments() -> None:
    assert Sequencer().buffer == 1024
    assert Sequencer(buffer=7).buffer == 7
    assert Sequencer(buffer=7, max_bytes=100).buffer == 7
    assert DEFAULT_MAX_BYTES == 32 << 20
    with pytest.raises(ValueError, match="max_bytes must be at least 1"):
        Sequencer(max_bytes=0)
    with pytest.raises(TypeError, match="max_bytes must be an int"):
        Sequencer(max_bytes=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="buffer must be an int"):
        Sequencer(buffer="8")  # type: ignore[arg-type]


def fed(seq: Sequencer, envs: list[Envelope]) -> tuple[list[QueueOutcome], list[Envelope]]:
    outcomes, out = [], []
    for env in envs:
        predicted, _ = seq.decide(env)
        outcome = seq.queue_uncommitted(env)
        assert outcome is predicted
        outcomes.append(outcome)
        assert outcome is not QueueOutcome.ACK_COMMIT_REPLAY
        while (committed := seq.step()) is not None:
            out.append(committed)
    return outcomes, out


@pytest.mark.parametrize("mode", MODES)
def test_growth_keeps_every_chain_of_interleaved_producers(journals: Any, mode: str) -> None:
    """Four producers' transactions interleaved, so that chains cross the ring's wrap
    point when it grows (from 2 slots, many times): all commit from the ring, as a ring
    that never wraps would have them."""
    journals.create(JournalSpec("budget/mix", labels=JSON))
    clocks = dict.fromkeys(PRODUCERS, 1)
    lines = []
    for step in range(400):
        p = PRODUCERS[(step * 7 + step // 5) % 4]
        flags = Flags.ACK_TXN if step % 13 == 0 else Flags.CONTINUE_TXN
        lines.append(line(p, clocks[p], flags, step))
        clocks[p] += 1
    for p in PRODUCERS:
        lines.append(line(p, clocks[p], Flags.ACK_TXN, -1))
    journals.append("budget/mix", b"".join(lines))
    envs = list(read_uncommitted(journals, "budget/mix"))
    with speedups_mode(mode):
        seq = Sequencer({"budget/mix": 0}, buffer=2, max_bytes=1 << 30)
        outcomes, out = fed(seq, envs)
        assert seq.buffer > 2 and QueueOutcome.ACK_COMMIT_RING in outcomes
        big = Sequencer({"budget/mix": 0}, buffer=1 << 12)
        assert summary(out) == summary(fed(big, envs)[1])
        assert seq.checkpoint() == big.checkpoint()


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(st.integers(1, 300), min_size=1, max_size=6),
    producers=st.lists(st.integers(0, 3), min_size=6, max_size=6),
    budget=st.sampled_from([200, 3_000, 30_000, DEFAULT_MAX_BYTES]),
    restarts=st.lists(st.integers(0, 2_000), max_size=3),
)
def test_restarts_from_checkpoints_deliver_what_a_large_ring_does(
    memory_store: Any, mode: str, sizes: list[int], producers: list[int], budget: int,
    restarts: list[int],
) -> None:
    """Transactions of several producers, some rolled back, read with a budgeted ring and
    restarted from checkpoints taken at random committed messages: the same messages,
    each once, as one read with a ring of a million."""
    client = memory_store.open()
    name = f"budget/{uuid.uuid4().hex}"
    client.create(JournalSpec(name, labels=JSON))
    clocks = dict.fromkeys(PRODUCERS, 1)
    lines: list[bytes] = []
    for i, size in enumerate(sizes):
        p = PRODUCERS[producers[i]]
        lines += transaction(p, clocks[p], size, start=len(lines))
        if i % 3 == 2:  # roll it back: an ACK at the last acknowledged clock
            lines[-1] = line(p, clocks[p] - 1, Flags.ACK_TXN, -1)
        clocks[p] += size + 1
    client.append(name, b"".join(lines))
    with speedups_mode(mode):
        reference = summary(read_committed(client, name, sequencer=Sequencer({name: 0},
                                                                            buffer=1 << 20)))
        got: list[tuple[str, int, int]] = []
        offsets: dict[str, int] = {name: 0}
        states: list[Any] = []
        cuts = sorted(set(restarts))
        while True:
            seq = Sequencer(offsets, states, buffer=4, max_bytes=budget)
            for env in read_committed(client, name, offsets[name], sequencer=seq):
                got.append((env.journal, env.begin, env.end))
                if cuts and len(got) >= cuts[0]:
                    cuts.pop(0)
                    offsets, states = checkpoint_after_dequeued(seq)
                    break
            else:
                break
        assert got == reference
    client.close()
