"""Sequencer: every scenario of Gazette's message/sequencer_test.go, plus bad input.

The ring-mechanics test reads the Sequencer's internals (as Gazette's does):
they are the invariants that make eviction and replay outcomes exact. Every test
runs on the C kernel (`oncelog._speedups.Kernel`, where built) and in pure Python:
the internals are read through the C kernel's introspection methods there.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from speedups_support import MODES, speedups_mode

from oncelog.message import NIL_UUID, Envelope, Flags, JSONMessage, build_uuid, new_producer_id
from oncelog.sequencer import (
    ProducerState,
    QueueOutcome,
    ReplayError,
    ReplayRequired,
    Sequencer,
    SequencerError,
)

J = "test/journal"
CONT, ACK, OUT = Flags.CONTINUE_TXN, Flags.ACK_TXN, Flags.OUTSIDE_TXN
Q = QueueOutcome


@pytest.fixture(autouse=True, params=MODES)
def mode(request):
    """Sequencers made in the test are C kernels ("c") or pure Python ("pure")."""
    with speedups_mode(request.param):
        yield request.param


class Generator:
    """Envelopes of one journal, 100 bytes each with 2 bytes of dead space between."""

    def __init__(self, journal: str = J) -> None:
        self.journal = journal
        self.offset = 0

    def __call__(self, producer: bytes, clock: int, flags: int) -> Envelope:
        msg = JSONMessage({"uuid": str(build_uuid(producer, clock, flags)), "str": str(clock)})
        env = Envelope(self.journal, self.offset, self.offset + 100, msg)
        self.offset += 102
        return env

    def nil(self) -> Envelope:
        msg = JSONMessage({"uuid": str(NIL_UUID)})
        env = Envelope(self.journal, self.offset, self.offset + 100, msg)
        self.offset += 102
        return env


def queue(seq: Sequencer, *envs: Envelope) -> list[QueueOutcome]:
    return [seq.queue_uncommitted(e) for e in envs]


def partial_state(seq: Sequencer, env_or_producer, journal: str = J) -> tuple[int, ...]:
    producer = env_or_producer if isinstance(env_or_producer, bytes) else env_or_producer.producer
    return partials(seq, journal)[producer]


def partials(seq: Sequencer, journal: str = J) -> dict[bytes, tuple[int, int, int, int, int]]:
    """producer -> (min_clock, max_clock, begin, ring_start, ring_stop) of `journal`."""
    if getattr(seq, "_kernel", None) is not None:
        return {pr: state[2:7] for pr, state in seq._kernel.partials(journal).items()}
    return {
        pr: (p.min_clock, p.max_clock, p.begin, p.ring_start, p.ring_stop)
        for pr, p in seq._partials.get(journal, {}).items()
    }


def emitting(seq: Sequencer) -> tuple[int, int] | None:
    """(begin, min_clock) of the committed sequence being stepped through, or None."""
    if getattr(seq, "_kernel", None) is not None:
        state = seq._kernel.emitting()
        return None if state is None else (state[4], state[2])
    return None if seq._emit is None else (seq._emit.begin, seq._emit.min_clock)


def ring(seq: Sequencer) -> tuple[list[Envelope | None], list[int], int]:
    if getattr(seq, "_kernel", None) is not None:
        return seq._kernel.ring()
    return seq._ring, seq._next, seq._head


def pending(seq: Sequencer) -> int:
    kernel = getattr(seq, "_kernel", None)
    return kernel.pending() if kernel is not None else len(seq._pending)


def expect_deque(seq: Sequencer, *expect: Envelope) -> None:
    """Step through exactly `expect`, then drain; check the tightened bounds on the way."""
    for i, env in enumerate(expect):
        got = seq.step()
        assert got is env, (i, got, env)
        assert seq.dequeued is env
        assert emitting(seq)[0] == env.begin
        if i > 0:
            assert emitting(seq)[1] == expect[i - 1].clock
    assert seq.step() is None
    assert seq.dequeued is None

    last = expect[-1]
    if last.clock != 0:
        # The producer's partial sequence is cleared, ready for its next sequence.
        assert partial_state(seq, last, last.journal) == (last.clock, last.clock, -1, -1, -1)
    # Read-through of the committing message is tracked in offsets.
    assert seq.offsets[last.journal] == last.end


def expect_replay(seq: Sequencer, begin: int, end: int, *envs: Envelope) -> None:
    assert seq.replay_range() == (envs[0].journal, begin, end)
    seq.start_replay(list(envs))


def by_producer(states: list[ProducerState]) -> list[ProducerState]:
    return sorted(states, key=lambda s: s.producer)


def test_ring_add_and_evict():
    seq = Sequencer(buffer=5)
    gen = Generator()
    A, B = new_producer_id(), new_producer_id()
    e1, e2, e3, e4 = gen(A, 100, CONT), gen(B, 200, CONT), gen(A, 300, CONT), gen(A, 400, CONT)
    e5, e6, e7, e8 = gen(B, 500, CONT), gen(B, 600, CONT), gen(B, 700, CONT), gen(B, 800, CONT)
    e9, e10, e11 = gen(B, 900, CONT), gen(B, 1000, CONT), gen(B, 1100, CONT)

    def ring_now():
        return ring(seq)

    assert ring_now() == ([None] * 5, [-1] * 5, 0)
    assert partials(seq) == {}
    assert not seq.has_pending()

    assert seq.queue_uncommitted(e1) is Q.CONTINUE_BEGIN_SPAN
    assert ring_now() == ([e1, None, None, None, None], [-1] * 5, 1)
    assert partials(seq) == {A: (99, 100, e1.begin, 0, 0)}
    assert seq.has_pending()
    assert seq.offsets == {J: e1.end}  # continuations always update read-through offsets

    assert seq.queue_uncommitted(e2) is Q.CONTINUE_BEGIN_SPAN
    assert ring_now() == ([e1, e2, None, None, None], [-1] * 5, 2)
    assert partials(seq) == {A: (99, 100, e1.begin, 0, 0), B: (199, 200, e2.begin, 1, 1)}
    assert pending(seq) == 2  # two pending sequences

    assert seq.queue_uncommitted(e3) is Q.CONTINUE_EXTEND_SPAN
    assert ring_now() == ([e1, e2, e3, None, None], [2, -1, -1, -1, -1], 3)  # e1 => e3
    assert partials(seq)[A] == (99, 300, e1.begin, 0, 2)

    assert seq.queue_uncommitted(e4) is Q.CONTINUE_EXTEND_SPAN
    assert ring_now() == ([e1, e2, e3, e4, None], [2, -1, 3, -1, -1], 4)  # e3 => e4
    assert partials(seq)[A] == (99, 400, e1.begin, 0, 3)

    assert seq.queue_uncommitted(e5) is Q.CONTINUE_EXTEND_SPAN
    assert ring_now() == ([e1, e2, e3, e4, e5], [2, 4, 3, -1, -1], 0)  # e2 => e5
    assert partials(seq) == {A: (99, 400, e1.begin, 0, 3), B: (199, 500, e2.begin, 1, 4)}

    assert seq.queue_uncommitted(e6) is Q.CONTINUE_EXTEND_SPAN  # evicts e1
    assert ring_now() == ([e6, e2, e3, e4, e5], [-1, 4, 3, -1, 0], 1)  # e5 => e6
    assert partials(seq) == {A: (99, 400, e1.begin, 2, 3), B: (199, 600, e2.begin, 1, 0)}

    assert queue(seq, e7, e8) == [Q.CONTINUE_EXTEND_SPAN] * 2
    assert ring_now() == ([e6, e7, e8, e4, e5], [1, 2, -1, -1, 0], 3)
    assert partials(seq) == {A: (99, 400, e1.begin, 3, 3), B: (199, 800, e2.begin, 4, 2)}

    assert seq.queue_uncommitted(e9) is Q.CONTINUE_EXTEND_SPAN  # evicts A's final entry
    assert ring_now() == ([e6, e7, e8, e9, e5], [1, 2, 3, -1, 0], 4)
    # A's begin is still tracked, but none of it is in the ring.
    assert partials(seq) == {A: (99, 400, e1.begin, -1, -1), B: (199, 900, e2.begin, 4, 3)}

    assert seq.queue_uncommitted(e10) is Q.CONTINUE_EXTEND_SPAN
    assert ring_now() == ([e6, e7, e8, e9, e10], [1, 2, 3, 4, -1], 0)
    assert partials(seq) == {A: (99, 400, e1.begin, -1, -1), B: (199, 1000, e2.begin, 0, 4)}

    assert seq.queue_uncommitted(e11) is Q.CONTINUE_EXTEND_SPAN
    assert ring_now() == ([e11, e7, e8, e9, e10], [-1, 2, 3, 4, 0], 1)
    assert partials(seq) == {A: (99, 400, e1.begin, -1, -1), B: (199, 1100, e2.begin, 1, 0)}

    assert seq.offsets == {J: e11.end}


def test_txn_sequence_cases(caplog):
    gen = Generator()
    seq = Sequencer(buffer=3)
    A, B = new_producer_id(), new_producer_id()

    # Sequence with internal duplicates, served from the ring.
    a1, a2, a1_dup, a2_dup = gen(A, 1, CONT), gen(A, 2, CONT), gen(A, 1, CONT), gen(A, 2, CONT)
    a3_ack = gen(A, 3, ACK)
    assert queue(seq, a1, a2, a1_dup, a2_dup, a3_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.ACK_COMMIT_RING,
    ]
    expect_deque(seq, a1, a2, a3_ack)
    assert not seq.has_pending()

    # ACK without a preceding CONTINUE: unusual but allowed.
    a4_ack = gen(A, 4, ACK)
    assert queue(seq, a4_ack) == [Q.ACK_EMPTY]
    expect_deque(seq, a4_ack)

    # Partial ACK of preceding messages.
    a5, a7_no_ack, a6_ack = gen(A, 5, CONT), gen(A, 7, CONT), gen(A, 6, ACK)
    assert queue(seq, a5, a7_no_ack, a6_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_RING,
    ]
    expect_deque(seq, a5, a6_ack)  # a7 is not committed
    assert not seq.has_pending()

    # Rollback with interleaved producer B.
    b1 = gen(B, 1, CONT)  # evicted
    a7_rollback = gen(A, 7, CONT)  # evicted
    a8_rollback = gen(A, 8, CONT)
    b2 = gen(B, 2, CONT)
    a6_abort = gen(A, 6, ACK)  # aborts back to clock 6
    assert queue(seq, a7_rollback, b1, a7_rollback, a8_rollback, b2, a6_abort) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_ROLLBACK,
    ]
    assert emitting(seq) is None and seq.step() is None  # nothing to step through
    assert seq.has_pending()  # B is still pending
    assert partials(seq) == {A: (6, 6, -1, -1, -1), B: (0, 2, b1.begin, 1, 1)}

    # Interleaved producer ACKs: a replay is required due to eviction.
    b3_ack = gen(B, 3, ACK)
    assert queue(seq, b3_ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq, b1.begin, b2.begin, b1, a7_rollback, a8_rollback)
    expect_deque(seq, b1, b2, b3_ack)
    assert not seq.has_pending()

    # A sequence that needs a replay, with duplicates inside it and from before
    # it, met both in the ring and during the replay.
    b4 = gen(B, 4, CONT)  # evicted
    b1_dup = gen(B, 1, CONT)
    b4_dup = gen(B, 4, CONT)
    b5 = gen(B, 5, CONT)  # evicted
    b6 = gen(B, 6, CONT)
    b2_dup = gen(B, 2, CONT)
    b7 = gen(B, 7, CONT)
    b8_ack = gen(B, 8, ACK)
    assert queue(seq, b4, b1_dup, b4_dup, b5, b6, b2_dup, b7, b8_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_ALREADY_ACKED,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_ALREADY_ACKED,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, b4.begin, b6.begin, b4, b1_dup, b4_dup, b5)
    expect_deque(seq, b4, b5, b6, b7, b8_ack)
    assert not seq.has_pending()

    # Partial rollback where every ring entry is skipped.
    b9 = gen(B, 9, CONT)  # evicted
    b11_no_ack = gen(B, 11, CONT)  # evicted
    b12_no_ack = gen(B, 12, CONT)
    b13_no_ack = gen(B, 13, CONT)
    b10_ack = gen(B, 10, ACK)
    assert queue(seq, b9, b11_no_ack, b12_no_ack, b13_no_ack, b10_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, b9.begin, b12_no_ack.begin, b9, b11_no_ack)
    expect_deque(seq, b9, b10_ack)
    assert not seq.has_pending()

    # Interleaved ACK'd sequences requiring two replays.
    b11 = gen(B, 11, CONT)  # evicted
    a7 = gen(A, 7, CONT)  # evicted
    a8 = gen(A, 8, CONT)
    b12 = gen(B, 12, CONT)
    a9_ack = gen(A, 9, ACK)
    b13_ack = gen(B, 13, ACK)
    assert queue(seq, b11, a7, a8, b12, a9_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, a7.begin, a8.begin, a7)
    expect_deque(seq, a7, a8, a9_ack)
    assert seq.has_pending()

    assert queue(seq, b13_ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq, b11.begin, b12.begin, b11, a7, a8)
    expect_deque(seq, b11, b12, b13_ack)
    assert not seq.has_pending()

    # Reset to an earlier ACK, then re-use of clocks (logged: exactly-once is lost).
    b8_ack_reset, b9_reuse, b10_ack_reuse = gen(B, 8, ACK), gen(B, 9, CONT), gen(B, 10, ACK)
    with caplog.at_level(logging.ERROR, logger="oncelog.sequencer"):
        assert queue(seq, b8_ack_reset, b9_reuse, b10_ack_reuse) == [
            Q.ACK_ROLLBACK,
            Q.CONTINUE_BEGIN_SPAN,
            Q.ACK_COMMIT_RING,
        ]
    assert "less than the last ACK" in caplog.text
    assert f"offsets [{b8_ack_reset.begin}, {b8_ack_reset.end})" in caplog.text
    expect_deque(seq, b9_reuse, b10_ack_reuse)
    assert not seq.has_pending()


@pytest.mark.parametrize("buffer", [0, -3, 1])
def test_txn_without_buffer(buffer):
    gen = Generator()
    seq = Sequencer(buffer=buffer)  # <= 0 behaves as a ring of 1
    assert seq.buffer == 1
    A, B = new_producer_id(), new_producer_id()
    a1, a2, b1 = gen(A, 1, CONT), gen(A, 2, CONT), gen(B, 1, CONT)
    a1_dup, a2_dup, a3_ack = gen(A, 1, CONT), gen(A, 2, CONT), gen(A, 3, ACK)
    b2, b3_ack = gen(B, 2, CONT), gen(B, 3, ACK)

    assert queue(seq, a1, a2, b1, a1_dup, a2_dup, a3_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, a1.begin, a3_ack.begin, a1, a2, b1, a1_dup, a2_dup)
    expect_deque(seq, a1, a2, a3_ack)
    assert seq.has_pending()  # B is still pending

    assert queue(seq, b2, b3_ack) == [Q.CONTINUE_EXTEND_SPAN, Q.ACK_COMMIT_REPLAY]
    expect_replay(seq, b1.begin, b3_ack.begin, b1, a1_dup, a2_dup, a3_ack, b2)
    expect_deque(seq, b1, b2, b3_ack)
    assert not seq.has_pending()


def test_outside_txn_cases(caplog):
    gen = Generator()
    seq = Sequencer(buffer=0)
    A = new_producer_id()

    # OUTSIDE_TXN messages are committed at once.
    a1, a2 = gen(A, 1, OUT), gen(A, 2, OUT)
    assert queue(seq, a1) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq, a1)
    assert queue(seq, a2) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq, a2)
    assert not seq.has_pending()
    assert seq.offsets == {J: a2.end}

    # Duplicates are ignored.
    a1_dup, a2_dup = gen(A, 1, OUT), gen(A, 2, OUT)
    assert queue(seq, a1_dup, a2_dup) == [Q.OUTSIDE_ALREADY_ACKED] * 2
    assert seq.step() is None  # nothing to step through
    assert seq.offsets == {J: a2_dup.end}

    # Preceding CONTINUE_TXN messages are aborted (and the mixed use is logged).
    a3_discard, a4_discard, a5 = gen(A, 3, CONT), gen(A, 4, CONT), gen(A, 5, OUT)
    with caplog.at_level(logging.WARNING, logger="oncelog.sequencer"):
        assert queue(seq, a3_discard, a4_discard, a5) == [
            Q.CONTINUE_BEGIN_SPAN,
            Q.CONTINUE_EXTEND_SPAN,
            Q.OUTSIDE_COMMIT,
        ]
    assert "OUTSIDE_TXN after a pending CONTINUE_TXN" in caplog.text
    expect_deque(seq, a5)
    assert not seq.has_pending()
    assert seq.offsets == {J: a5.end}

    # Messages with unknown flags are handled as OUTSIDE_TXN.
    a6_discard, a7_bad_bits, a7_bad_bits_dup = gen(A, 6, CONT), gen(A, 7, 0x100), gen(A, 7, 0x100)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="oncelog.sequencer"):
        assert queue(seq, a6_discard, a7_bad_bits) == [Q.CONTINUE_BEGIN_SPAN, Q.OUTSIDE_COMMIT]
    assert "unexpected UUID flags" in caplog.text and "flags 0x100" in caplog.text
    expect_deque(seq, a7_bad_bits)
    assert queue(seq, a7_bad_bits_dup) == [Q.OUTSIDE_ALREADY_ACKED]
    assert seq.step() is None

    # Messages with a nil UUID are always delivered at once.
    z1, z2 = gen.nil(), gen.nil()
    assert queue(seq, z1) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq, z1)
    assert queue(seq, z2) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq, z2)
    assert queue(seq, z1) == [Q.OUTSIDE_COMMIT]  # even again: nil UUIDs opt out
    expect_deque(seq, z1)
    assert not seq.has_pending()

    # The nil UUID's producer is not tracked, but offsets still move.
    assert partials(seq) == {A: (7, 7, -1, -1, -1)}
    assert seq.offsets == {J: z1.end}


def test_zero_clock_with_producer_is_not_sequenced():
    """Any zero-clock UUID (not just the nil one) is committed at once, whatever its flags."""
    gen = Generator()
    seq = Sequencer(buffer=4)
    A = new_producer_id()
    a0 = gen(A, 0, CONT)
    assert queue(seq, a0) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq, a0)
    assert queue(seq, a0) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq, a0)
    assert partials(seq) == {}


@pytest.mark.parametrize("api", ["call", "sequence"])
def test_ack_with_the_clock_of_a_pending_message(api):
    """Gazette: the ACK is then a duplicate of the message it commits, and is not delivered."""
    gen = Generator()
    A = new_producer_id()
    a5, a5_ack, a6 = gen(A, 5, CONT), gen(A, 5, ACK), gen(A, 6, OUT)
    seq = Sequencer(buffer=4)
    if api == "call":
        assert queue(seq, a5, a5_ack) == [Q.CONTINUE_BEGIN_SPAN, Q.ACK_COMMIT_RING]
        assert seq.step() is a5
        assert seq.step() is None
    else:
        assert seq.committed([a5, a5_ack]) == [a5]
    assert seq.offsets == {J: a5_ack.end}  # read through the ACK all the same
    assert partial_state(seq, A) == (5, 5, -1, -1, -1)
    assert seq.committed([a5_ack, a6]) == [a6]  # and a re-read ACK rolls back to itself


def test_producer_states_round_trip():
    gen = Generator()
    seq1 = Sequencer(buffer=12)
    A, B, C = new_producer_id(), new_producer_id(), new_producer_id()
    a1, a2, b1, b2 = gen(A, 1, CONT), gen(A, 2, CONT), gen(B, 1, CONT), gen(B, 2, CONT)
    c1_ack, b3_ack, c2 = gen(C, 1, ACK), gen(B, 3, ACK), gen(C, 2, CONT)
    c1_rollback, a3_ack, z1 = gen(C, 1, ACK), gen(A, 3, ACK), gen.nil()

    assert queue(seq1, a1, a2, b1, b2, c1_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_EMPTY,
    ]
    expect_deque(seq1, c1_ack)
    assert seq1.has_pending()
    assert queue(seq1, z1) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq1, z1)

    # Taking a checkpoint ends "pending": to be pending, a sequence must have
    # been begun since the last checkpoint.
    assert seq1.has_pending()
    offsets, states = seq1.checkpoint(0)
    assert not seq1.has_pending()

    # Recover a new Sequencer from the checkpoint.
    seq2 = Sequencer(offsets, states, 12)
    offsets2, states2 = seq2.checkpoint(0)
    assert not seq2.has_pending()

    expect = by_producer(
        [
            ProducerState(J, A, 0, a1.begin),
            ProducerState(J, B, 0, b1.begin),
            ProducerState(J, C, 1, -1),
        ]
    )
    assert by_producer(states) == expect
    assert by_producer(states2) == expect
    assert offsets == offsets2 == {J: z1.end}

    # Both produce the same output from here, though seq2 needs replays.
    assert queue(seq1, b3_ack) == [Q.ACK_COMMIT_RING]
    assert queue(seq2, b3_ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq2, b1.begin, b3_ack.begin, b1, b2, c1_ack)
    expect_deque(seq1, b1, b2, b3_ack)
    expect_deque(seq2, b1, b2, b3_ack)

    assert queue(seq1, c2, c1_rollback) == [Q.CONTINUE_BEGIN_SPAN, Q.ACK_ROLLBACK]
    assert queue(seq2, c2, c1_rollback) == [Q.CONTINUE_BEGIN_SPAN, Q.ACK_ROLLBACK]
    assert seq1.step() is None and seq2.step() is None  # nothing to step through

    assert queue(seq1, a3_ack) == [Q.ACK_COMMIT_RING]
    assert queue(seq2, a3_ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq2, a1.begin, a3_ack.begin, a1, a2, b1, b2, c1_ack)
    expect_deque(seq1, a1, a2, a3_ack)
    expect_deque(seq2, a1, a2, a3_ack)


def test_producer_states_round_trip_during_dequeue():
    gen = Generator()
    seq1 = Sequencer(buffer=12)
    A = new_producer_id()
    a1, a2, a3_ack = gen(A, 1, CONT), gen(A, 2, CONT), gen(A, 3, ACK)
    a4, a5, a6_ack = gen(A, 4, CONT), gen(A, 5, CONT), gen(A, 6, ACK)

    assert queue(seq1, a1, a2, a3_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_RING,
    ]
    assert seq1.step() is a1

    # Suppose the program crashes here, before a1 is processed.
    offsets, states = seq1.checkpoint(0)
    # Round-trip twice: unchanged states survive restoring.
    seq2 = Sequencer(offsets, states, 12)
    seq2 = Sequencer(*seq2.checkpoint(0), 12)

    # Both are immediately before a3_ack, as it were.
    for seq in (seq1, seq2):
        assert seq.checkpoint(0) == ({J: a2.end}, [ProducerState(J, A, 0, a1.begin)])

    # seq2 begins by reading a3_ack again.
    assert queue(seq2, a3_ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq2, a1.begin, a3_ack.begin, a1, a2)

    assert seq1.step() is a2
    assert seq1.step() is a3_ack
    assert seq1.step() is None
    expect_deque(seq2, a1, a2, a3_ack)

    # seq1 checkpoints part-way through stepping its next sequence.
    assert queue(seq1, a4, a5, a6_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_RING,
    ]
    assert seq1.step() is a4
    assert seq1.step() is a5  # crash

    seq2 = Sequencer(*seq1.checkpoint(0), 12)
    seq2 = Sequencer(*seq2.checkpoint(0), 12)
    # Both are immediately before a6_ack, tightened to reflect a4's processing.
    for seq in (seq1, seq2):
        assert seq.checkpoint(0) == ({J: a5.end}, [ProducerState(J, A, 4, a5.begin)])

    # seq2 reads a6_ack again and steps from a5 (not a4).
    assert queue(seq2, a6_ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq2, a5.begin, a6_ack.begin, a5)
    expect_deque(seq2, a5, a6_ack)


def test_checkpoint_counting_the_dequeued_envelope_as_processed():
    gen = Generator()
    A = new_producer_id()
    a1, a2, a3_ack = gen(A, 1, CONT), gen(A, 2, CONT), gen(A, 3, ACK)
    a4, z = gen(A, 4, OUT), gen.nil()
    seq = Sequencer(buffer=12)
    assert queue(seq, a1, a2, a3_ack)[-1] is Q.ACK_COMMIT_RING
    assert seq.step() is a1

    # Mid-sequence: a1 is done with, the rest is replayed from a1 on resuming.
    offsets, states = seq.checkpoint(dequeued_processed=True)
    assert (offsets, states) == ({J: a2.end}, [ProducerState(J, A, 1, a1.begin)])
    resumed = Sequencer(offsets, states)
    assert resumed.queue_uncommitted(a3_ack) is Q.ACK_COMMIT_REPLAY
    expect_replay(resumed, a1.begin, a3_ack.begin, a1, a2)
    expect_deque(resumed, a2, a3_ack)
    # Without the option, Gazette's checkpoint: a1 is delivered again.
    assert seq.checkpoint() == ({J: a2.end}, [ProducerState(J, A, 0, a1.begin)])

    # At the committing envelope: the same as the checkpoint once drained.
    assert seq.step() is a2
    assert seq.step() is a3_ack
    processed = seq.checkpoint(dequeued_processed=True)
    assert processed == ({J: a3_ack.end}, [ProducerState(J, A, 3, -1)])
    assert seq.step() is None
    assert seq.checkpoint() == processed

    # A lone OUTSIDE_TXN message, and a nil UUID (whose producer is not tracked).
    for env, state in [(a4, [ProducerState(J, A, 4, -1)]), (z, [ProducerState(J, A, 4, -1)])]:
        assert seq.queue_uncommitted(env) is Q.OUTSIDE_COMMIT
        assert seq.step() is env
        assert seq.checkpoint(dequeued_processed=True) == ({J: env.end}, state)
        assert seq.step() is None
        assert seq.checkpoint() == ({J: env.end}, state)


def test_producer_states_straddle_duplicate():
    gen = Generator()
    seq1 = Sequencer(buffer=12)
    A = new_producer_id()
    a1, a2, a3 = gen(A, 1, CONT), gen(A, 2, CONT), gen(A, 3, CONT)
    a1_dup, a2_dup, a3_dup = gen(A, 1, CONT), gen(A, 2, CONT), gen(A, 3, CONT)
    a4_ack = gen(A, 4, ACK)

    assert queue(seq1, a1, a2, a3) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
    ]
    assert seq1.step() is None

    # Checkpoint, and restore.
    seq2 = Sequencer(*seq1.checkpoint(0), 12)

    assert queue(seq1, a1_dup, a2_dup, a3_dup, a4_ack) == [
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.ACK_COMMIT_RING,
    ]
    # seq2 knows only the last ACK, so the duplicates extend its span ...
    assert queue(seq2, a1_dup, a2_dup, a3_dup, a4_ack) == [
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    # ... but stepping delivers each message once.
    expect_replay(seq2, a1.begin, a1_dup.begin, a1, a2, a3)
    expect_deque(seq1, a1, a2, a3, a4_ack)
    expect_deque(seq2, a1, a2, a3, a4_ack)


@pytest.mark.parametrize("as_timedelta", [False, True])
def test_producer_pruning(as_timedelta):
    # Clock units are 100s of nanoseconds, above 4 bits of sequence counter. A
    # timedelta has microseconds, so its variant scales every clock by 10.
    scale = 10 if as_timedelta else 1

    def horizon(ns: int):
        return timedelta(microseconds=ns * scale // 1000) if as_timedelta else ns / 1e9

    def clock(ticks: int) -> int:
        return (ticks * scale) << 4

    gen = Generator()
    seq1 = Sequencer(buffer=12)
    A, B, C = new_producer_id(), new_producer_id(), new_producer_id()
    a_cont, b_cont = gen(A, clock(10), CONT), gen(B, clock(19), CONT)
    b_ack, c_cont = gen(B, clock(20), ACK), gen(C, clock(30), CONT)
    assert queue(seq1, a_cont, b_cont, b_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.ACK_COMMIT_RING,
    ]
    expect_deque(seq1, b_cont, b_ack)
    assert queue(seq1, c_cont) == [Q.CONTINUE_BEGIN_SPAN]

    # This horizon prunes no producer.
    _, states = seq1.checkpoint(horizon(20 * 100))
    assert by_producer(states) == by_producer(
        [
            ProducerState(J, A, clock(10) - 1, a_cont.begin),
            ProducerState(J, B, clock(20), -1),
            ProducerState(J, C, clock(30) - 1, c_cont.begin),
        ]
    )
    assert len(partials(seq1)) == 3

    # A is pruned.
    _, states = seq1.checkpoint(horizon(19 * 100))
    assert by_producer(states) == by_producer(
        [ProducerState(J, B, clock(20), -1), ProducerState(J, C, clock(30) - 1, c_cont.begin)]
    )
    assert len(partials(seq1)) == 2

    # B is pruned.
    _, states = seq1.checkpoint(timedelta(microseconds=1) if as_timedelta else 1e-9)
    assert states == [ProducerState(J, C, clock(30) - 1, c_cont.begin)]
    assert len(partials(seq1)) == 1

    # Zero means no pruning at all.
    assert seq1.checkpoint(0)[1] == states
    assert seq1.checkpoint(timedelta(0))[1] == states


def test_pruning_is_per_journal():
    """A producer is compared with the newest ACK of its own journal only."""
    ga, gb = Generator("a/journal"), Generator("b/journal")
    seq = Sequencer(buffer=4)
    P = new_producer_id()
    old_a, new_a = ga(P, 10 << 4, OUT), ga(new_producer_id(), 1000 << 4, OUT)
    only_b = gb(P, 10 << 4, OUT)
    for env in (old_a, new_a, only_b):
        assert seq.queue_uncommitted(env) is Q.OUTSIDE_COMMIT
        expect_deque(seq, env)
    _, states = seq.checkpoint(horizon := 1e-6)  # 1 us = 10 clock ticks
    assert horizon and sorted((s.journal, s.producer) for s in states) == sorted(
        [("a/journal", new_a.producer), ("b/journal", P)]
    )


def _replay_error_setup():
    gen = Generator()
    seq = Sequencer(buffer=0)
    A, B = new_producer_id(), new_producer_id()
    b1, a2, a3_ack = gen(B, 1, CONT), gen(A, 2, CONT), gen(A, 3, ACK)
    assert queue(seq, b1, a2, a3_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    assert seq.replay_range() == (J, a2.begin, a3_ack.begin) == (J, 102, 204)
    return seq, a2, a3_ack


def test_replay_reader_no_error():
    seq, a2, a3_ack = _replay_error_setup()
    seq.start_replay([a2])
    expect_deque(seq, a2, a3_ack)


def test_replay_reader_errors_pass_through():
    seq, _, _ = _replay_error_setup()

    def failing():
        raise OSError("unexpected EOF")
        yield  # pragma: no cover

    seq.start_replay(failing())
    with pytest.raises(OSError, match="unexpected EOF"):
        seq.step()


@pytest.mark.parametrize(
    "mangle, message",
    [
        (
            lambda e: Envelope("wrong/journal", e.begin, e.end, e.message),
            r"replay of wrong journal 'wrong/journal'"
            r" \(expected 'test/journal', offsets \[102, 204\)\)",
        ),
        (
            lambda e: Envelope(e.journal, e.begin - 1, e.end, e.message),
            r"replay of journal 'test/journal' has wrong begin offset 101 \(expected >= 102\)",
        ),
        (
            lambda e: Envelope(e.journal, e.begin, e.end + 100, e.message),
            r"replay of journal 'test/journal' has wrong end offset 302 \(expected <= 204\)",
        ),
    ],
    ids=["journal", "begin", "end"],
)
def test_replay_of_wrong_journal_or_range(mangle, message):
    seq, a2, _ = _replay_error_setup()
    seq.start_replay([mangle(a2)])
    with pytest.raises(ReplayError, match=message) as info:
        seq.step()
    assert isinstance(info.value, ValueError) and isinstance(info.value, SequencerError)


def test_queue_while_committed_messages_remain():
    gen = Generator()
    seq = Sequencer(buffer=4)
    A = new_producer_id()
    a1, a2_ack, a3 = gen(A, 1, CONT), gen(A, 2, ACK), gen(A, 3, OUT)
    assert queue(seq, a1, a2_ack) == [Q.CONTINUE_BEGIN_SPAN, Q.ACK_COMMIT_RING]
    with pytest.raises(SequencerError, match=r"remain: step\(\) until it returns None.*offset 204"):
        seq.queue_uncommitted(a3)
    assert seq.step() is a1
    with pytest.raises(SequencerError, match="remain"):
        seq.queue_uncommitted(a3)  # still: a2_ack and the drain remain
    with pytest.raises(SequencerError, match="remain"):
        list(seq.sequence([a3]))
    assert seq.step() is a2_ack
    assert seq.step() is None
    assert seq.step() is None  # stays drained
    assert queue(seq, a3) == [Q.OUTSIDE_COMMIT]  # and now it is fine
    expect_deque(seq, a3)


def test_step_without_the_required_replay():
    seq, a2, a3_ack = _replay_error_setup()
    needed = r"replay of journal 'test/journal' offsets \[102, 204\) must be started"
    with pytest.raises(SequencerError, match=needed):
        seq.step()
    # Nothing was lost: the replay can still be started.
    seq.start_replay([a2])
    expect_deque(seq, a2, a3_ack)


def test_replay_calls_with_nothing_to_step():
    seq = Sequencer()
    with pytest.raises(SequencerError, match="no committed messages"):
        seq.replay_range()
    with pytest.raises(SequencerError, match="no committed messages"):
        seq.start_replay([])
    gen = Generator()
    a = gen(new_producer_id(), 5, OUT)
    seq.queue_uncommitted(a)
    assert seq.step() is a
    with pytest.raises(SequencerError, match="nothing is left to replay"):
        seq.replay_range()


def test_outcome_commits_flag():
    assert {o for o in QueueOutcome if o.commits} == {
        Q.OUTSIDE_COMMIT,
        Q.ACK_EMPTY,
        Q.ACK_COMMIT_RING,
        Q.ACK_COMMIT_REPLAY,
    }


def test_bad_constructor_input():
    P = new_producer_id()
    with pytest.raises(ValueError, match="producer must be 6 bytes"):
        ProducerState(J, b"abc", 1, -1)
    with pytest.raises(ValueError, match="last_ack must be a 64-bit clock"):
        ProducerState(J, P, -1, -1)
    with pytest.raises(ValueError, match="begin must be an offset or -1"):
        ProducerState(J, P, 1, -2)
    with pytest.raises(ValueError, match="journal name"):
        ProducerState("", P, 1, -1)
    with pytest.raises(ValueError, match="offset of journal 'x' must be >= 0"):
        Sequencer({"x": -5})
    with pytest.raises(TypeError, match="ProducerState"):
        Sequencer(states=[("x", P, 1, -1)])
    with pytest.raises(TypeError, match="buffer must be an int"):
        Sequencer(buffer="8")
    seq = Sequencer()
    with pytest.raises(ValueError, match="must not be negative"):
        seq.checkpoint(-1)
    with pytest.raises(ValueError, match="must not be negative"):
        seq.checkpoint(timedelta(seconds=-1))
    with pytest.raises(TypeError, match="timedelta or seconds"):
        seq.checkpoint("1h")
    with pytest.raises(ValueError, match="finite number of seconds"):
        seq.checkpoint(float("nan"))


def test_producer_state_dict_round_trip():
    state = ProducerState(J, new_producer_id(), 12345, 678)
    assert ProducerState.from_dict(state.to_dict()) == state
    with pytest.raises(ValueError, match="not a ProducerState"):
        ProducerState.from_dict({"journal": J, "producer": "zz", "last_ack": 1, "begin": -1})
    with pytest.raises(ValueError, match="not a ProducerState"):
        ProducerState.from_dict({"journal": J})


def test_constructor_copies_offsets():
    offsets = {J: 10}
    seq = Sequencer(offsets)
    gen = Generator()
    gen.offset = 10
    seq.queue_uncommitted(gen(new_producer_id(), 3, CONT))
    assert offsets == {J: 10}
    assert seq.offsets == {J: 110}


# --------------------------------------------------------------- batch APIs


def test_sequence_matches_queue_and_step():
    gen = Generator()
    A, B = new_producer_id(), new_producer_id()
    envs = [
        gen(A, 1, OUT), gen(A, 1, OUT), gen(B, 1, CONT), gen(A, 2, OUT), gen.nil(),
        gen(B, 2, CONT), gen(A, 3, CONT), gen(A, 4, OUT), gen(B, 3, ACK), gen(A, 5, 0x100),
        gen(B, 4, CONT), gen(B, 3, ACK), gen(A, 6, ACK),
    ]
    journal = list(envs)

    def replay(j, b, e):
        assert j == J
        return [x for x in journal if x.begin >= b and x.end <= e]

    for buffer in (1, 2, 3, 16):
        one, batch = Sequencer(buffer=buffer), Sequencer(buffer=buffer)
        expect = []
        for env in envs:
            if one.queue_uncommitted(env) is Q.ACK_COMMIT_REPLAY:
                one.start_replay(replay(*one.replay_range()))
            while (e := one.step()) is not None:
                expect.append(e)
        got = batch.committed(envs, replay)
        assert [id(e) for e in got] == [id(e) for e in expect]
        assert batch.checkpoint() == one.checkpoint()
    assert [e.clock for e in expect] == [1, 2, 0, 4, 1, 2, 3, 5, 6]


def test_sequence_state_at_each_yield_is_that_of_step():
    """Checkpoints taken while sequence() is suspended equal those of queue + step."""
    gen = Generator()
    A, B = new_producer_id(), new_producer_id()
    envs = [gen(A, 1, OUT), gen(B, 1, CONT), gen(A, 2, OUT), gen(B, 2, CONT)]
    envs += [gen(B, 3, ACK), gen(A, 3, OUT)]
    one, batch = Sequencer(buffer=8), Sequencer(buffer=8)
    it = iter(envs)
    stepped = []
    for env in it:
        if one.queue_uncommitted(env).commits:
            while (e := one.step()) is not None:
                stepped.append((e, one.checkpoint(), one.has_pending()))
    got = []
    for e in batch.sequence(envs):
        assert batch.dequeued is e
        got.append((e, batch.checkpoint(), batch.has_pending()))
    assert got == stepped
    assert batch.checkpoint() == one.checkpoint()


def test_sequence_resumes_with_step_after_close():
    gen = Generator()
    A = new_producer_id()
    a1, a2, a3 = gen(A, 1, OUT), gen(A, 2, OUT), gen(A, 3, OUT)
    seq = Sequencer(buffer=4)
    it = seq.sequence([a1, a2, a3])
    assert next(it) is a1
    with pytest.raises(SequencerError, match="remain"):
        seq.queue_uncommitted(a2)
    with pytest.raises(SequencerError, match="remain"):
        seq.sequence([a2])
    it.close()
    # Left exactly as after step() returned a1: finish with step().
    assert seq.dequeued is a1
    assert seq.checkpoint()[1] == [ProducerState(J, A, 0, a1.begin)]
    assert seq.step() is None
    assert seq.offsets == {J: a1.end}
    assert seq.committed([a2, a1, a3]) == [a2, a3]


def test_abandoned_sequence_leaves_the_ring_alone():
    """Closing a suspended sequence() after per-call use must not disturb the ring."""
    gen = Generator()
    A, B = new_producer_id(), new_producer_id()
    a1, b1, b2 = gen(A, 1, OUT), gen(B, 1, CONT), gen(B, 2, CONT)
    a2, b3_ack = gen(A, 2, OUT), gen(B, 3, ACK)
    seq = Sequencer(buffer=3)
    it = seq.sequence([a1])
    assert next(it) is a1
    assert seq.step() is None
    assert queue(seq, b1, b2) == [Q.CONTINUE_BEGIN_SPAN, Q.CONTINUE_EXTEND_SPAN]
    it.close()
    assert ring(seq)[2] == 0  # three envelopes in a ring of three
    assert seq.committed([a2, b3_ack], lambda j, b, e: [b1]) == [a2, b1, b2, b3_ack]


@pytest.mark.parametrize("buffer", [8, 1], ids=["ring", "replay"])
def test_sequence_stops_if_stepped_meanwhile(buffer):
    gen = Generator()
    A = new_producer_id()
    a1, a2, a3, a4_ack = gen(A, 1, OUT), gen(A, 2, CONT), gen(A, 3, CONT), gen(A, 4, ACK)
    journal = [a1, a2, a3, a4_ack]
    seq = Sequencer(buffer=buffer)
    it = seq.sequence(journal, lambda j, b, e: [x for x in journal if b <= x.begin < e])
    assert next(it) is a1
    assert next(it) is a2
    assert seq.step() is a3  # behind the iterator's back
    with pytest.raises(SequencerError, match="stepped while this iterator was suspended"):
        next(it)
    assert seq.step() is a4_ack  # the sequencer itself is consistent
    assert seq.step() is None
    assert seq.offsets == {J: a4_ack.end}


def test_sequence_without_replay_raises_replay_required():
    gen = Generator()
    A, B = new_producer_id(), new_producer_id()
    a1, b1, a2_ack, b2 = gen(A, 1, CONT), gen(B, 1, CONT), gen(A, 2, ACK), gen(B, 2, OUT)
    seq = Sequencer(buffer=1)
    rest = iter([a1, b1, a2_ack, b2])
    with pytest.raises(ReplayRequired) as info:
        list(seq.sequence(rest))
    assert (info.value.journal, info.value.begin, info.value.end) == (J, a1.begin, a2_ack.begin)
    assert "[0, 204)" in str(info.value)
    # The sequencer is as after ACK_COMMIT_REPLAY: replay by hand, then carry on.
    seq.start_replay([a1, b1])
    expect_deque(seq, a1, a2_ack)
    assert seq.committed(rest) == [b2]


def test_replay_does_not_redeliver_a_zero_clock_message_of_the_producer() -> None:
    # CONTINUE at clock 10, then a clock-0 message of the same producer (delivered at once),
    # then the ACK at 11 with a ring of 1: the replay must not deliver the clock-0 one again.
    from oncelog.message import Envelope, Flags, JSONMessage, build_uuid

    producer = b"\x01\x02\x03\x04\x05\x06"
    frames = [(10, Flags.CONTINUE_TXN), (0, Flags.OUTSIDE_TXN), (11, Flags.ACK_TXN)]
    envs = [
        Envelope(
            "j", i * 10, i * 10 + 10, JSONMessage({"uuid": str(build_uuid(producer, c, f)), "i": i})
        )
        for i, (c, f) in enumerate(frames)
    ]
    seq = Sequencer(buffer=1)

    def replay(j: str, b: int, e: int) -> list[Envelope]:
        return [x for x in envs if b <= x.begin and x.end <= e]

    delivered = [e.message.doc["i"] for e in seq.sequence(envs, replay)]
    assert delivered == [1, 0, 2]
