"""Sequencer properties: random histories against a reference model of read-committed delivery.

Histories hold several producers writing to one or two journals: committed
messages, nil-UUID messages, and transactions that commit, roll back, or are
acknowledged only in part; earlier frames are duplicated at random later points
(where a real retry could put them); the consumer crashes at random points and
restarts from its last checkpoint, re-reading from the checkpoint's offsets.
Whatever the ring size, the delivered output must hold every committed message
exactly once, each producer's in clock order, and nothing rolled back. The
per-call API and `sequence()` must also agree step for step.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from speedups_support import MODES, speedups_mode

from oncelog.message import NIL_UUID, Envelope, Flags, JSONMessage, build_uuid
from oncelog.sequencer import QueueOutcome, Sequencer

CONT, ACK, OUT = Flags.CONTINUE_TXN, Flags.ACK_TXN, Flags.OUTSIDE_TXN


@dataclass
class Frame:
    """One message a producer wrote: the reference model's view of it."""

    journal: str
    stream: int  # index of the (journal, producer) pair
    producer: bytes
    clock: int  # 0: a nil UUID
    flags: int
    delivered: bool  # does read-committed deliver it?
    ident: int
    dup_until: str = "end"  # where a duplicate may land: "end", "resolve" or "next"
    resolve: "Frame | None" = None  # the ACK that resolves a CONTINUE_TXN


@dataclass
class History:
    envelopes: list[Envelope]
    journals: dict[str, list[Envelope]]
    expected: set[tuple[str, int]]
    frames: list[Frame] = field(repr=False)


unit = st.one_of(
    st.just(("out",)),
    st.just(("nil",)),
    st.tuples(st.just("commit"), st.integers(0, 4)),
    st.tuples(st.just("rollback"), st.integers(1, 3)),
    st.tuples(st.just("partial"), st.integers(2, 4), st.integers(1, 3)),
)


@st.composite
def histories(draw) -> History:
    journals = [f"prop/journal-{i}" for i in range(draw(st.integers(1, 2)))]
    producers = [bytes([0x01, 0xAB, 0, 0, 0, i + 1]) for i in range(draw(st.integers(1, 3)))]
    streams: list[list[Frame]] = []
    ident = 0
    for journal in journals:
        for producer in producers:
            index = len(streams)
            frames: list[Frame] = []
            clock = draw(st.integers(8, 40))
            last_ack: int | None = None  # the clock a rollback re-asserts

            def frame(clock: int, flags: int, delivered: bool, dup_until: str = "end") -> Frame:
                nonlocal ident
                ident += 1
                f = Frame(journal, index, producer, clock, flags, delivered, ident, dup_until)
                frames.append(f)
                return f

            for u in draw(st.lists(unit, min_size=1, max_size=6)):
                if u[0] == "nil":
                    frame(0, OUT, True, dup_until="none")  # nil UUIDs opt out: never duplicated
                    continue
                if last_ack is None:
                    last_ack = clock + 1  # a fresh producer is tracked from its first clock - 1
                if u[0] == "out":
                    clock += 2
                    frame(clock, OUT, True)
                    last_ack = clock
                elif u[0] == "commit":
                    for _ in range(u[1]):
                        clock += 2
                        frame(clock, CONT, True)
                    clock += 2
                    frame(clock, ACK, True, dup_until="next")
                    last_ack = clock
                elif u[0] == "rollback":
                    conts = []
                    for _ in range(u[1]):
                        clock += 2
                        conts.append(frame(clock, CONT, False, dup_until="resolve"))
                    ack = frame(last_ack, ACK, False, dup_until="next")
                    for c in conts:
                        c.resolve = ack
                else:  # a partial ACK: commits the first k messages only
                    n, k = u[1], min(u[2], u[1] - 1)
                    conts = []
                    for i in range(n):
                        clock += 2
                        acked = i < k
                        conts.append(frame(clock, CONT, acked, "end" if acked else "resolve"))
                    ack_clock = conts[k - 1].clock + 1
                    ack = frame(ack_clock, ACK, True, dup_until="next")
                    for c in conts[k:]:
                        c.resolve = ack
                    last_ack = ack_clock
            streams.append(frames)

    # Interleave the producers' frames, each stream keeping its own order.
    tags = draw(st.permutations([s for s, frames in enumerate(streams) for _ in frames]))
    cursors = [0] * len(streams)
    order: list[Frame] = []
    for s in tags:
        order.append(streams[s][cursors[s]])
        cursors[s] += 1
    position = {id(f): i for i, f in enumerate(order)}

    # Duplicates, inserted before original position `at` (len(order): at the end).
    dups: dict[int, list[Frame]] = collections.defaultdict(list)
    for i, f in enumerate(order):
        if f.dup_until == "none" or not draw(st.integers(0, 3)) == 0:
            continue
        if f.dup_until == "end":
            limit = len(order)
        elif f.dup_until == "resolve":  # a rolled-back message re-sent before its rollback
            limit = position[id(f.resolve)]
        else:  # an ACK re-sent before its producer's next frame
            stream = streams[f.stream]
            nxt = stream.index(f) + 1
            limit = position[id(stream[nxt])] if nxt < len(stream) else len(order)
        dups[draw(st.integers(i + 1, limit))].append(f)

    sequence: list[Frame] = []
    for i in range(len(order) + 1):
        sequence.extend(dups.get(i, ()))
        if i < len(order):
            sequence.append(order[i])

    offsets = dict.fromkeys(journals, 0)
    by_journal: dict[str, list[Envelope]] = {j: [] for j in journals}
    envelopes = []
    for f in sequence:
        uuid = NIL_UUID if f.clock == 0 else build_uuid(f.producer, f.clock, f.flags)
        size = 10 + f.ident % 7
        begin = offsets[f.journal]
        msg = JSONMessage({"uuid": str(uuid), "f": f.ident})
        env = Envelope(f.journal, begin, begin + size, msg)
        offsets[f.journal] = begin + size + f.ident % 3  # some dead space between frames
        envelopes.append(env)
        by_journal[f.journal].append(env)
    expected = {(f.journal, f.ident) for f in order if f.delivered}
    return History(envelopes, by_journal, expected, order)


class Crash(Exception):
    """The consumer dies: all it keeps is its last checkpoint and the output it committed."""


def replayer(history: History):
    def replay(journal: str, begin: int, end: int) -> list[Envelope]:
        return [e for e in history.journals[journal] if e.begin >= begin and e.end <= end]

    return replay


def run(history: History, buffer: int, crash_at: frozenset[int], api: str, processed: bool = False):
    """Consume `history`, crashing at the numbered events; returns what was observed.

    Events are numbered across restarts: reading an envelope, and being handed a
    committed one. A crash checkpoints first. The envelope in hand at that moment
    was not processed (the checkpoint says it will be delivered again) unless
    `processed`: then it was, and the checkpoint counts it so.
    """
    replay = replayer(history)
    offsets: dict[str, int] = {}
    states: list = []
    output: list[Envelope] = []
    checkpoints = []
    pending: list[bool] = []  # has_pending() at each event
    done: list[Envelope] = []  # processed since the last restart
    event = 0

    def tick(env: Envelope | None = None) -> None:
        nonlocal event
        event += 1
        pending.append(seq.has_pending())
        if event in crash_at:
            if env is not None and processed:
                done.append(env)
            raise Crash

    while True:
        seq = Sequencer(offsets, states, buffer)
        feed = [e for e in history.envelopes if e.begin >= offsets.get(e.journal, 0)]
        done = []
        try:
            if api == "call":
                for env in feed:
                    tick()
                    if seq.queue_uncommitted(env) is QueueOutcome.ACK_COMMIT_REPLAY:
                        seq.start_replay(replay(*seq.replay_range()))
                    while (committed := seq.step()) is not None:
                        assert seq.dequeued is committed
                        tick(committed)
                        done.append(committed)
            else:

                def reading():
                    for env in feed:
                        tick()
                        yield env

                for committed in seq.sequence(reading(), replay):
                    assert seq.dequeued is committed
                    tick(committed)
                    done.append(committed)
            output += done
            return output, seq.checkpoint(), checkpoints, pending
        except Crash:
            output += done
            offsets, states = checkpoint = seq.checkpoint(dequeued_processed=processed)
            checkpoints.append(checkpoint)


def check_read_committed(history: History, output: list[Envelope]) -> None:
    got = collections.Counter((e.journal, e.message.doc["f"]) for e in output)
    duplicated = {k: n for k, n in got.items() if n > 1}
    assert not duplicated, f"delivered more than once: {duplicated}"
    missing, unexpected = history.expected - set(got), set(got) - history.expected
    assert not missing and not unexpected, f"missing {missing}, unexpected {unexpected}"
    last: dict[tuple[str, bytes], int] = {}
    for e in output:
        if e.clock:
            key = (e.journal, e.producer)
            assert e.clock > last.get(key, 0), f"out of clock order: {e}"
            last[key] = e.clock


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    history=histories(),
    buffer=st.one_of(st.integers(0, 6), st.just(64)),
    crash_at=st.frozensets(st.integers(1, 50), min_size=1, max_size=4),
    processed=st.booleans(),
)
def test_read_committed_matches_reference_model(history, buffer, crash_at, processed, mode):
    with speedups_mode("pure"):
        output, final, checkpoints, pending = run(history, buffer, crash_at, "call", processed)
    check_read_committed(history, output)

    # The per-call API and sequence() are the same machine, step for step, crash for crash,
    # on the C kernel and in Python.
    for api in ("call", "sequence"):
        with speedups_mode(mode):
            output2, final2, checkpoints2, pending2 = run(
                history, buffer, crash_at, api, processed
            )
        assert [id(e) for e in output2] == [id(e) for e in output], api
        assert checkpoints2 == checkpoints, api
        assert final2 == final, api
        assert pending2 == pending, api


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=100, deadline=None)
@given(history=histories(), buffer=st.one_of(st.integers(0, 6), st.just(64)))
def test_committed_batch_equals_per_call(history, buffer, mode):
    replay = replayer(history)
    with speedups_mode("pure"):
        one = Sequencer(buffer=buffer)
    expect = []
    for env in history.envelopes:
        if one.queue_uncommitted(env) is QueueOutcome.ACK_COMMIT_REPLAY:
            one.start_replay(replay(*one.replay_range()))
        while (e := one.step()) is not None:
            expect.append(e)
    # In two batches, to cross a batch boundary too.
    half = len(history.envelopes) // 2
    with speedups_mode(mode):
        batch = Sequencer(buffer=buffer)
        got = batch.committed(history.envelopes[:half], replay)
        got += batch.committed(history.envelopes[half:], replay)
    assert [id(e) for e in got] == [id(e) for e in expect]
    assert batch.checkpoint() == one.checkpoint()
    check_read_committed(history, got)
