"""One kernel, five drivers: every implementation of the sequencing rules agrees.

On the same random histories (real Publishers via `oncelog.testing`, and the
adversarial histories of test_sequencer_props: duplicates, partial ACKs,
rollbacks, nil UUIDs, two journals), with random ring sizes and crashes that
restart from the last checkpoint:

- the kernel itself (`SequencingKernel`: `decide` predicts, `queue_uncommitted` applies);
- the public `Sequencer`, one call at a time, in pure Python and on the C kernel
  (`oncelog._speedups.Kernel`, where built);
- the batch path (`Sequencer.sequence`), in pure Python and on the C kernel;

all deliver the same envelopes (by identity) and take the same checkpoints, with a
fixed ring (Gazette's), a ring growing within a budget so small that it is soon
refused (both growth and replays past the budget are met), and one growing without
bound, which never replays more than the fixed ring. The
split planner (`oncelog.sequencing.plan`: facts, resolution, `SplitCommitter`) decides
through the same rules: over random splits its commits equal the kernel's, and the
producer states it resolves at each split boundary equal the kernel's checkpoint
there.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from speedups_support import BUILT, PURE_REQUESTED, speedups_mode
from test_sequencer_props import histories as adversarial_histories

from oncelog.journal import JournalSpec, open_journals
from oncelog.message import Envelope, Flags
from oncelog.reading import read_uncommitted
from oncelog.sequencer import ProducerState, QueueOutcome, Sequencer, SequencingKernel
from oncelog.sequencing.plan import (
    Diverged,
    SplitCommitter,
    commit_split,
    gather_facts,
    plan_splits,
    resolve,
)
from oncelog.testing import histories as publisher_histories
from oncelog.testing import run_history

DRIVERS = ["kernel", "call-pure", "batch-pure"]
if not PURE_REQUESTED and BUILT is not None:
    DRIVERS += ["call-c", "batch-c"]

Checkpoint = tuple[dict[str, int], list[ProducerState]]


class Crash(Exception):
    pass


RINGS: list[int | None] = [None, 300, 1 << 40]
"""Ring budgets compared: a fixed ring (None), a growing one within 300 bytes (a few
small frames: growth is soon refused), and one without a useful bound."""


def drive(
    driver: str,
    envelopes: Sequence[Envelope],
    replay: Callable[[str, int, int], list[Envelope]],
    buffer: int,
    crash_at: frozenset[int],
    prune: float = 0,
    max_bytes: int | None = None,
) -> tuple[list[Envelope], list[Checkpoint], Checkpoint]:
    """Sequence `envelopes` with `driver`, crashing at the numbered events (each envelope
    read, each committed one handed out) and restarting from the checkpoint then taken
    (with a `prune` horizon in seconds: 0, none). The ring starts at `buffer` slots and
    grows within `max_bytes` (None: a fixed ring)."""
    offsets: dict[str, int] = {}
    states: list[ProducerState] = []
    output: list[Envelope] = []
    checkpoints: list[Checkpoint] = []
    event = 0

    def tick() -> None:
        nonlocal event
        event += 1
        if event in crash_at:
            raise Crash

    native = driver.endswith("-c")
    while True:
        cls = SequencingKernel if driver == "kernel" else Sequencer
        with speedups_mode("c" if native else "pure"):
            seq = cls(offsets, states, buffer, max_bytes=max_bytes)
        assert (getattr(seq, "_kernel", None) is not None) == native, driver
        feed = [e for e in envelopes if e.begin >= offsets.get(e.journal, 0)]
        try:
            if driver in ("kernel", "call-pure", "call-c"):
                for env in feed:
                    tick()
                    predicted, _ = seq.decide(env)
                    outcome = seq.queue_uncommitted(env)
                    assert outcome is predicted, (outcome, predicted)
                    if outcome is QueueOutcome.ACK_COMMIT_REPLAY:
                        seq.start_replay(replay(*seq.replay_range()))
                    while (committed := seq.step()) is not None:
                        output.append(committed)
                        tick()
            else:

                def reading(feed: list[Envelope] = feed) -> Iterator[Envelope]:
                    for env in feed:
                        tick()
                        yield env

                for committed in seq.sequence(reading(), replay):  # type: ignore[attr-defined]
                    output.append(committed)
                    tick()
            return output, checkpoints, seq.checkpoint(prune)
        except Crash:
            offsets, states = checkpoint = seq.checkpoint(prune)
            checkpoints.append(checkpoint)


def replayer(envelopes: Sequence[Envelope]) -> Callable[[str, int, int], list[Envelope]]:
    def replay(journal: str, begin: int, end: int) -> list[Envelope]:
        return [e for e in envelopes if e.journal == journal and begin <= e.begin and e.end <= end]

    return replay


def check_drivers_agree(
    envelopes: Sequence[Envelope], buffer: int, crash_at: frozenset[int], prune: float = 0
) -> list[Envelope]:
    base = replayer(envelopes)
    replays: dict[tuple[str, int | None], int] = {}
    runs = {}
    for ring in RINGS:
        for d in DRIVERS:

            def replay(j: str, b: int, e: int, key: tuple[str, int | None] = (d, ring)) -> Any:
                replays[key] = replays.get(key, 0) + 1
                return base(j, b, e)

            runs[d, ring] = drive(d, envelopes, replay, buffer, crash_at, prune, ring)
    out, checkpoints, final = runs["kernel", None]
    for key, (out2, checkpoints2, final2) in runs.items():
        assert [id(e) for e in out2] == [id(e) for e in out], key
        assert checkpoints2 == checkpoints, key
        assert final2 == final, key
    for d in DRIVERS:  # the paths of one ring replay alike; a larger budget, never more
        counts = [replays.get((d, ring), 0) for ring in RINGS]
        assert counts == [replays.get(("kernel", ring), 0) for ring in RINGS], d
        assert counts[2] <= counts[0], (d, counts)
    return out


def check_planner_agrees(envelopes: Sequence[Envelope], cuts: list[int], buffer: int) -> None:
    """The Spark planner over each journal, split at `cuts` (indices of frames), against
    the kernel without crashes: same commits, same states at every split boundary."""
    for journal in sorted({e.journal for e in envelopes}):
        envs = [e for e in envelopes if e.journal == journal]
        if not envs:
            continue
        # The kernel's committed (commit offset, begin) pairs, and its checkpoints.
        kernel = SequencingKernel(buffer=buffer)
        replay = replayer(envs)
        expected: list[tuple[int, int]] = []
        at: dict[int, list[ProducerState]] = {}
        boundaries = sorted({envs[k % len(envs)].begin for k in cuts} | {envs[0].begin})
        for env in envs:
            if env.begin in boundaries:
                at[env.begin] = kernel.checkpoint()[1]
            if kernel.queue_uncommitted(env) is QueueOutcome.ACK_COMMIT_REPLAY:
                kernel.start_replay(replay(*kernel.replay_range()))
            while (committed := kernel.step()) is not None:
                if (committed._ids or committed.ids)[2] != 2:  # ACKs are not rows
                    expected.append((env.begin, committed.begin))

        ids = [(e.producer.hex(), e.clock, int(e.flags), e.begin) for e in envs]
        frags = [(b, e) for b, e in zip(boundaries, [*boundaries[1:], envs[-1].end])]
        splits = plan_splits(journal, frags, 1, begin=envs[0].begin, end=envs[-1].end)
        assert [s.begin for s in splits] == boundaries
        rows = [[r for r in ids if s.begin <= r[3] < s.end] for s in splits]
        plan = resolve(journal, splits, [gather_facts(r) for r in rows])
        if plan.sequential is not None:  # a case the plan hands to a sequential read
            continue
        got = sorted(
            (commit, begin)
            for sp, r in zip(plan.splits, rows)
            for begin, commit in commit_split(r, sp)
        )
        assert got == sorted(expected)
        # The resolved states at each split's start are the kernel's checkpoint there.
        for sp in plan.splits:
            checkpoint = {s.producer.hex(): s for s in at[sp.split.begin]}
            for producer, (last, _high, is_open) in sp.states.items():
                state = checkpoint.get(producer)
                if state is None:  # new to the kernel: tracked from its first clock - 1
                    assert not is_open
                    continue
                assert (last, is_open) == (state.last_ack, state.begin != -1), producer

        # One guarded committer over the whole journal: equal up to where it diverges.
        cols = list(zip(*ids))
        committer: SplitCommitter[int] = SplitCommitter(guard=True)
        try:
            refs, commits = committer.feed(cols[0], cols[1], cols[2], cols[3], cols[3])
            limit = None
        except Diverged as exc:
            refs, commits = exc.committed
            limit = exc.offset
        whole = sorted(zip(commits, refs))
        assert whole == [x for x in sorted(expected) if limit is None or x[0] < limit]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    history=adversarial_histories(),
    buffer=st.one_of(st.integers(0, 6), st.just(64)),
    crash_at=st.frozensets(st.integers(1, 60), max_size=4),
    cuts=st.lists(st.integers(0, 1000), max_size=4),
    # Checkpoints that forget producers more than 0, 16 or 48 clock units (1 unit: 100 ns
    # >> 4) behind their journal's newest ACK: the kernels must forget the same ones.
    prune=st.sampled_from([0, 1e-7, 3e-7]),
)
def test_drivers_agree_on_adversarial_histories(
    history: Any, buffer, crash_at, cuts, prune
) -> None:
    check_drivers_agree(history.envelopes, buffer, crash_at, prune)
    check_planner_agrees(history.envelopes, cuts, buffer)


@pytest.fixture
def client() -> Iterator[Any]:
    c = open_journals(f"memory://oncelog-kernel-{uuidlib.uuid4().hex}")
    yield c
    c.close()
    c.fs.rm(c.root, recursive=True)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    history=publisher_histories(producers=3, journals=2, max_steps=30),
    buffer=st.sampled_from([1, 3, 1024]),
    crash_at=st.frozensets(st.integers(1, 60), max_size=3),
    cuts=st.lists(st.integers(0, 1000), max_size=3),
)
def test_drivers_agree_on_published_histories(client, history, buffer, crash_at, cuts) -> None:
    tag = uuidlib.uuid4().hex[:8]
    journals = [f"kernel/{tag}/part-{i}" for i in range(2)]
    for j in journals:
        client.create(JournalSpec(j))
    run = run_history(client, journals, history)
    envelopes = [e for j in journals for e in read_uncommitted(client, j)]
    # Interleave the journals by offset, as a reader of both would.
    envelopes.sort(key=lambda e: (e.begin, e.journal))
    out = check_drivers_agree(envelopes, buffer, crash_at)
    if not crash_at:
        for j in journals:
            delivered = [
                e.message.doc["id"] for e in out if e.journal == j and e.flags != Flags.ACK_TXN
            ]
            assert delivered == run.model.committed_in(j)
    check_planner_agrees(envelopes, cuts, buffer)
