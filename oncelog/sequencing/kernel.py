"""The sequencing rules, stated once in Python: Gazette's read-committed Sequencer kernel.

`decide_outcome` is the decision (Gazette's QueueUncommitted, without side effects) that
every implementation makes: `SequencingKernel` here (the ring, the per-producer table,
the offsets, stepping and replays), the C kernel bound in `oncelog.sequencing.native`
(the same rules, outcome for outcome), and the split planner of `oncelog.sequencing.plan`.
`oncelog.sequencer.Sequencer` is the public class on top of either kernel.

The public names here (`QueueOutcome`, `ProducerState`, `SequencingKernel`,
`decide_outcome`) keep `oncelog.sequencer` as their home (`__module__`): that is where
users import them from, and where pickles and the API reference name them. The kernel
logs through the `oncelog.sequencer` logger for the same reason.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from oncelog.errors import ReplayError, ReplayRequired, SequencerError
from oncelog.identity import (
    ACK_TXN,
    CONTINUE_TXN,
    OUTSIDE_TXN,
    PRODUCER_ID_LEN,
    Envelope,
)

__all__ = [
    "DEFAULT_MAX_BYTES",
    "ProducerState",
    "QueueOutcome",
    "ReplayFunc",
    "SequencingKernel",
    "decide_outcome",
]

PUBLIC_HOME = "oncelog.sequencer"
"""The module users import this module's public names from (see the module docstring)."""

_log = logging.getLogger(PUBLIC_HOME)

ReplayFunc = Callable[[str, int, int], Iterable[Envelope]]
"""`replay(journal, begin, end)`: the read-uncommitted envelopes of `journal` in `[begin, end)`."""

DEFAULT_MAX_BYTES = 32 << 20
"""The default byte budget of a growing ring (32 MiB of journal bytes; see `Sequencer`)."""

_INITIAL_SLOTS = 1024
"""The slots a growing ring starts with (Gazette's default fixed ring size)."""


class QueueOutcome(enum.Enum):
    """What `Sequencer.queue_uncommitted` decided for an envelope (Gazette's QueueOutcome).

    After a *commit* outcome (OUTSIDE_COMMIT, ACK_EMPTY, ACK_COMMIT_RING,
    ACK_COMMIT_REPLAY) call `step()` until it returns None. A nil-UUID (or
    zero-clock) message is not sequenced: it is always OUTSIDE_COMMIT.
    """

    OUTSIDE_ALREADY_ACKED = "outsideAlreadyAcked"
    """An OUTSIDE_TXN duplicate of an acknowledged message: ignored."""
    OUTSIDE_COMMIT = "outsideCommit"
    """An OUTSIDE_TXN message committed on its own (a pending span is rolled back)."""
    CONTINUE_ALREADY_ACKED = "continueAlreadyAcked"
    """A CONTINUE_TXN duplicate of an acknowledged message: ignored."""
    CONTINUE_TXN_CLOCK_LARGER = "continueTxnClockLarger"
    """A CONTINUE_TXN ignored: the open transaction already holds an equal or larger clock."""
    CONTINUE_BEGIN_SPAN = "continueBeginSpan"
    """A CONTINUE_TXN that begins a new transaction of its producer."""
    CONTINUE_EXTEND_SPAN = "continueExtendSpan"
    """A CONTINUE_TXN that extends its producer's open transaction."""
    ACK_ROLLBACK = "ackRollback"
    """An ACK_TXN at or below the last ACK: the open transaction is discarded."""
    ACK_EMPTY = "ackEmpty"
    """An ACK_TXN with no preceding CONTINUE_TXN: only the ACK itself is committed."""
    ACK_COMMIT_RING = "ackCommitRing"
    """An ACK_TXN committing a transaction held entirely in the ring."""
    ACK_COMMIT_REPLAY = "ackCommitReplay"
    """An ACK_TXN committing a transaction that partly left the ring: replay first."""

    @property
    def commits(self) -> bool:
        """True if messages are now ready to `step()` through."""
        return self in _COMMIT_OUTCOMES


_COMMIT_OUTCOMES = frozenset(
    {
        QueueOutcome.OUTSIDE_COMMIT,
        QueueOutcome.ACK_EMPTY,
        QueueOutcome.ACK_COMMIT_RING,
        QueueOutcome.ACK_COMMIT_REPLAY,
    }
)


# Members as module globals: reading `QueueOutcome.X` costs far more on the hot path.
_OUTSIDE_ALREADY_ACKED = QueueOutcome.OUTSIDE_ALREADY_ACKED
_OUTSIDE_COMMIT = QueueOutcome.OUTSIDE_COMMIT
_CONTINUE_ALREADY_ACKED = QueueOutcome.CONTINUE_ALREADY_ACKED
_CONTINUE_TXN_CLOCK_LARGER = QueueOutcome.CONTINUE_TXN_CLOCK_LARGER
_CONTINUE_BEGIN_SPAN = QueueOutcome.CONTINUE_BEGIN_SPAN
_CONTINUE_EXTEND_SPAN = QueueOutcome.CONTINUE_EXTEND_SPAN
_ACK_ROLLBACK = QueueOutcome.ACK_ROLLBACK
_ACK_EMPTY = QueueOutcome.ACK_EMPTY
_ACK_COMMIT_RING = QueueOutcome.ACK_COMMIT_RING
_ACK_COMMIT_REPLAY = QueueOutcome.ACK_COMMIT_REPLAY


@dataclass(slots=True, frozen=True)
class ProducerState:
    """A producer's sequencing state in one journal, as kept in checkpoints.

    `last_ack` is the clock of its last acknowledged message; `begin` the offset
    where its pending (uncommitted) transaction starts, or -1 if none.
    """

    journal: str
    producer: bytes
    last_ack: int
    begin: int

    def __post_init__(self) -> None:
        if not isinstance(self.journal, str) or not self.journal:
            raise ValueError(f"ProducerState.journal must be a journal name, not {self.journal!r}")
        if not isinstance(self.producer, bytes) or len(self.producer) != PRODUCER_ID_LEN:
            raise ValueError(
                f"ProducerState of journal {self.journal!r}: producer must be"
                f" {PRODUCER_ID_LEN} bytes, not {self.producer!r}"
            )
        if not isinstance(self.last_ack, int) or not 0 <= self.last_ack < 1 << 64:
            raise ValueError(
                f"ProducerState of journal {self.journal!r} producer {self.producer.hex()}:"
                f" last_ack must be a 64-bit clock, not {self.last_ack!r}"
            )
        if not isinstance(self.begin, int) or self.begin < -1:
            raise ValueError(
                f"ProducerState of journal {self.journal!r} producer {self.producer.hex()}:"
                f" begin must be an offset or -1, not {self.begin!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (producer as hex), for checkpoints."""
        return {
            "journal": self.journal,
            "producer": self.producer.hex(),
            "last_ack": self.last_ack,
            "begin": self.begin,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProducerState:
        """Inverse of `to_dict`; raises ValueError naming what is wrong."""
        try:
            return cls(d["journal"], bytes.fromhex(d["producer"]), d["last_ack"], d["begin"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a ProducerState: {d!r} ({exc})") from None


def decide_outcome(
    min_clock: int, max_clock: int, span_open: bool, clock: int, flags: int
) -> QueueOutcome:
    """The sequencing rules, once: Gazette's QueueUncommitted decision, without side effects.

    For a message `(clock, flags)` (clock > 0) of a producer whose state is: last
    acknowledged clock `min_clock`, largest pending clock `max_clock` (>= min_clock), and
    whether a transaction is open (`span_open`). Unknown flags count as OUTSIDE_TXN. An
    ACK committing an open transaction is ACK_COMMIT_RING here: whoever holds the
    transaction's messages says whether they must be re-read (ACK_COMMIT_REPLAY).
    `SequencingKernel.decide` and the split planner's `SplitCommitter`
    (`oncelog.sequencing.plan`) both decide through this function.
    """
    if flags == CONTINUE_TXN:
        if clock <= max_clock:
            return _CONTINUE_ALREADY_ACKED if clock <= min_clock else _CONTINUE_TXN_CLOCK_LARGER
        return _CONTINUE_EXTEND_SPAN if span_open else _CONTINUE_BEGIN_SPAN
    if flags == ACK_TXN:
        if clock <= min_clock:
            return _ACK_ROLLBACK
        return _ACK_COMMIT_RING if span_open else _ACK_EMPTY
    if clock <= min_clock:
        return _OUTSIDE_ALREADY_ACKED
    return _OUTSIDE_COMMIT


class _Partial:
    """A producer's partial, unacknowledged sequence within one journal (a kernel record).

    Messages with clocks in (min_clock, max_clock] are pending; `begin` is the
    offset of the first (or -1: no transaction open); ring_start..ring_stop link
    those still in the ring (-1: none). `tracked` is False until the kernel files
    the record in its table (a record `decide` made up for a new producer).
    """

    __slots__ = (
        "begin",
        "journal",
        "max_clock",
        "min_clock",
        "producer",
        "ring_start",
        "ring_stop",
        "tracked",
    )

    def __init__(
        self, journal: str, producer: bytes, last_ack: int, begin: int, tracked: bool = True
    ) -> None:
        self.journal = journal
        self.producer = producer
        self.min_clock = last_ack
        self.max_clock = last_ack
        self.begin = begin
        self.ring_start = -1
        self.ring_stop = -1
        self.tracked = tracked

    def __repr__(self) -> str:
        return (
            f"_Partial({self.journal!r}, {self.producer.hex()}, min={self.min_clock},"
            f" max={self.max_clock}, begin={self.begin}, ring={self.ring_start}..{self.ring_stop})"
        )


def _horizon_ns(prune_horizon: timedelta | float | int) -> int:
    if isinstance(prune_horizon, timedelta):
        ns = (
            prune_horizon.days * 86_400 + prune_horizon.seconds
        ) * 1_000_000_000 + prune_horizon.microseconds * 1_000
    elif isinstance(prune_horizon, (int, float)) and not isinstance(prune_horizon, bool):
        if not math.isfinite(prune_horizon):
            raise ValueError(
                f"prune_horizon must be a finite number of seconds, not {prune_horizon}"
            )
        ns = round(prune_horizon * 1_000_000_000)
    else:
        raise TypeError(
            f"prune_horizon must be a timedelta or seconds, not {type(prune_horizon).__name__}"
        )
    if ns < 0:
        raise ValueError(f"prune_horizon must not be negative, got {prune_horizon!r}")
    return ns


def _validated(
    offsets: dict[str, int] | None,
    states: Iterable[ProducerState] | None,
    buffer: int | None,
    max_bytes: int | None,
) -> tuple[dict[str, int], list[ProducerState], int, int]:
    """A kernel's starting offsets, producer states, ring size and byte budget (0: a fixed
    ring), checked."""
    if buffer is None or max_bytes is not None:
        budget = DEFAULT_MAX_BYTES if max_bytes is None else max_bytes
        if not isinstance(budget, int) or isinstance(budget, bool):
            raise TypeError(f"max_bytes must be an int, not {type(budget).__name__}")
        if budget < 1:
            raise ValueError(f"max_bytes must be at least 1, not {budget}")
        if buffer is None:
            buffer = _INITIAL_SLOTS
    else:
        budget = 0
    if not isinstance(buffer, int) or isinstance(buffer, bool):
        raise TypeError(f"buffer must be an int, not {type(buffer).__name__}")
    checked: dict[str, int] = {}
    for journal, offset in (offsets or {}).items():
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset of journal {journal!r} must be >= 0, not {offset!r}")
        checked[journal] = offset
    state_list = list(states or ())
    for state in state_list:
        if not isinstance(state, ProducerState):
            raise TypeError(f"states must hold ProducerState, not {type(state).__name__}")
    return checked, state_list, max(buffer, 1), budget


def prune_below(prune_horizon: timedelta | float | int) -> int:
    """How far (in clock units) below its journal's newest ACK a producer is forgotten at a
    checkpoint; -1: never."""
    horizon = _horizon_ns(prune_horizon)
    if horizon <= 0:
        return -1
    # Clock units are 100 ns, above 4 bits of sequence counter.
    return min((horizon // 100) << 4, (1 << 63) - 1)


_WARNINGS = (
    ("unexpected UUID flags: handled as OUTSIDE_TXN", logging.WARNING),
    (
        "OUTSIDE_TXN after a pending CONTINUE_TXN (mixed committed and uncommitted"
        " publishing?): rolled back",
        logging.WARNING,
    ),
    ("ACK_TXN clock is less than the last ACK (loss of exactly-once semantics)", logging.ERROR),
)
"""What the kernel logs, by code (the C kernel reports the same codes, see `_warn`)."""
_W_UNEXPECTED_FLAGS, _W_OUTSIDE_AFTER_PENDING, _W_ACK_BELOW_LAST = range(len(_WARNINGS))


def _warn(
    env: Envelope, producer: bytes, last_ack: int, begin: int, clock: int, flags: int, code: int
) -> None:
    """Log warning `code` of `_WARNINGS` about `env` of `producer` (whose last ACK clock is
    `last_ack` and pending transaction starts at `begin`)."""
    what, level = _WARNINGS[code]
    _log.log(
        level,
        "%s: journal %r offsets [%d, %d) producer %s clock %d flags %#x"
        " (last ACK clock %d, pending from offset %d)",
        what, env.journal, env.begin, env.end, producer.hex(), clock, flags, last_ack, begin,
    )


class SequencingKernel:
    """The sequencing state and its one set of rules: decide, then apply (Gazette's shape).

    This is the pure-Python kernel; `oncelog._speedups.Kernel` is the same kernel in C
    (its own state, the same rules, outcome for outcome), which `Sequencer` delegates to
    where the extension is built. The kernel owns, and nothing else writes:

    - the ring: `_ring[i]` an envelope, `_next[i]` the ring index of the next envelope
      of the same partial sequence (-1: none), `_owner[i]` the `_Partial` it was queued
      under; `_head` the slot the next queued envelope takes, `_size` the ring's length.
      `_budget` is the byte budget of a growing ring (0: a fixed ring); `_may_grow` is
      False for a fixed ring, and for a growing one from a refused growth until the head
      next wraps round (so the bytes held are summed at most once per turn of the ring).
    - the per-producer table `_partials`: journal -> producer -> `_Partial`.
    - `_offsets`: journal -> read-through offset (where a restart resumes reading).
    - `_pending`: partials whose transaction began since the last checkpoint.
    - the committed sequence being stepped through: `_emit` (its partial, or None),
      `_dequeued` / `_dequeued_clock` (the envelope `step()` last returned) and
      `_replay_it` (a replay being read, or None).

    Invariants, between calls: a partial's `ring_start..ring_stop` chain links, through
    `_next`, ring slots `_owner`ed by it, in queue order; `ring_start == -1` iff
    `ring_stop == -1`. A slot no partial's chain starts at is never read again, so
    reusing it needs no unlinking (`_evict_start` unlinks the one that is). A slot keeps
    its envelope after `step()` hands it out, until the slot is reused (as Gazette's ring
    does). Emptying it at once frees a delivered message while it is still in the CPU's
    caches (about 5% of `read_committed`'s time on small transactions), but a reader of
    large transactions then lost 40%. CPython's collector counts allocations net of frees,
    and reusing a slot frees one old envelope per envelope queued: without that pacing it
    ran about ten times as often, over the open transaction's messages each time. The C
    kernel (`oncelog/_speedups.c`, "delivered envelopes") keeps the pacing and still frees
    small transactions early: a recently queued envelope moves to a queue when delivered,
    and each queueing that frees nothing of its own drops the oldest one there. Both
    deliver the same envelopes; only when each is freed differs.
    `min_clock <= max_clock`; `begin == -1` iff no transaction of the producer is open,
    and then nothing of it is in `_pending`.

    Per envelope, `queue_uncommitted(env)` frees the ring slot at the head (see
    `_grow`: a growing ring doubles instead of dropping the first message of a
    transaction still open, while within its budget), decides
    the outcome (`decide_outcome`, the rules; `decide(env)` alone changes nothing), then
    applies it; after a commit outcome `_emit` is set and
    `step()` hands out the committed envelopes until it returns None, which moves the
    offsets past the committing envelope and clears `_emit`.
    """

    __slots__ = (
        "_budget",
        "_dequeued",
        "_dequeued_clock",
        "_emit",
        "_head",
        "_may_grow",
        "_next",
        "_offsets",
        "_owner",
        "_partials",
        "_pending",
        "_replay_it",
        "_ring",
        "_size",
    )

    def __init__(
        self,
        offsets: dict[str, int] | None = None,
        states: Iterable[ProducerState] | None = None,
        buffer: int | None = None,
        *,
        max_bytes: int | None = None,
    ) -> None:
        self._offsets, state_list, size, self._budget = _validated(
            offsets, states, buffer, max_bytes
        )
        self._may_grow = self._budget > 0
        # journal -> producer -> partial sequence.
        self._partials: dict[str, dict[bytes, _Partial]] = {}
        for state in state_list:
            self._partials.setdefault(state.journal, {})[state.producer] = _Partial(
                state.journal, state.producer, state.last_ack, state.begin
            )
        # Partial sequences begun since the last checkpoint (see has_pending).
        self._pending: set[_Partial] = set()
        self._emit: _Partial | None = None  # the committed sequence being stepped through
        self._dequeued: Envelope | None = None
        self._dequeued_clock = 0
        self._replay_it: Iterator[Envelope] | None = None
        self._ring: list[Envelope | None] = [None] * size
        self._next: list[int] = [-1] * size
        self._owner: list[_Partial | None] = [None] * size
        self._head = 0
        self._size = size

    # ------------------------------------------------------------------ queries

    def replay_range(self) -> tuple[str, int, int]:
        """The journal and `[begin, end)` offsets to replay before stepping on."""
        emit = self._emit
        if emit is None:
            raise SequencerError("replay_range(): no committed messages to step through")
        if emit.ring_start == -1:
            raise SequencerError(
                f"replay_range(): the committed sequence of journal {emit.journal!r} has been"
                " stepped through the ring; nothing is left to replay"
            )
        end = self._ring[emit.ring_start].begin  # type: ignore[union-attr]
        return emit.journal, emit.begin, end

    # ------------------------------------------------------ decide, then apply

    def decide(self, env: Envelope) -> tuple[QueueOutcome, _Partial]:
        """What queueing `env` next would do, and the partial it applies to; changes nothing.

        The decision phase of `queue_uncommitted`, on its own. The partial of a producer
        new to its journal is a fresh, untracked record (queueing files it). A nil UUID
        (zero clock) is never tracked: always OUTSIDE_COMMIT, with a throwaway record. An
        ACK commit is ACK_COMMIT_REPLAY when the transaction's first message is no longer
        in the ring, or is in the slot at the head (which queueing `env` reuses, unless
        the ring grows instead).
        """
        producer, clock, flags = env._ids or env.ids  # .ids without a property call
        if not clock:
            return _OUTSIDE_COMMIT, _Partial(env.journal, producer, 0, -1, False)
        by_producer = self._partials.get(env.journal)
        p = by_producer.get(producer) if by_producer is not None else None
        if p is None:
            p = _Partial(env.journal, producer, clock - 1, -1, False)
        outcome = decide_outcome(p.min_clock, p.max_clock, p.begin != -1, clock, flags)
        if outcome is _ACK_COMMIT_RING:
            start = p.ring_start
            if (
                start == -1
                or (start == self._head and not self._grows_at(start))
                or self._ring[start].begin != p.begin  # type: ignore[union-attr]
            ):
                outcome = _ACK_COMMIT_REPLAY  # all or part left the ring
        return outcome, p

    def queue_uncommitted(self, env: Envelope) -> QueueOutcome:
        """Queue the next read-uncommitted envelope: evict the head, decide, then apply.

        The outcome is exactly `decide(env)`'s. Afterwards: non-commit outcomes moved
        the journal's offset past `env`; commit outcomes (`outcome.commits`) set `_emit`
        to the producer's partial, with `max_clock` the committing clock, and leave the
        offset for the final `step()` to move, so that a checkpoint taken meanwhile
        queues `env` again on restart. Raises SequencerError if committed messages
        remain to `step()` through.
        """
        if self._emit is not None:
            self._raise_busy("queue_uncommitted", env)
        ring, nxt, owner = self._ring, self._next, self._owner
        head = self._head
        o = owner[head]  # evict_head()
        if o is not None and o.ring_start == head:
            first = ring[head]
            if self._may_grow and first.begin == o.begin and self._grow():  # type: ignore[union-attr]
                ring, nxt, owner = self._ring, self._next, self._owner
                head = self._head
            else:
                self._evict_start(o, head)

        # Decide: decide(env), inlined (no mutation up to the outcome).
        producer, clock, flags = env._ids or env.ids
        journal = env.journal
        if clock:
            try:
                p = self._partials[journal][producer]
            except KeyError:
                p = _Partial(journal, producer, clock - 1, -1, False)
            outcome = decide_outcome(p.min_clock, p.max_clock, p.begin != -1, clock, flags)
            if outcome is _ACK_COMMIT_RING:
                start = p.ring_start
                first = ring[start] if start != -1 and start != head else None
                if first is None or first.begin != p.begin:
                    outcome = _ACK_COMMIT_REPLAY  # all or part left the ring
        else:
            outcome, p = _OUTSIDE_COMMIT, _Partial(journal, producer, 0, -1, False)

        # Apply.
        if not p.tracked and clock:
            self._partials.setdefault(journal, {})[producer] = p
            p.tracked = True
        commit = True
        if outcome is _CONTINUE_EXTEND_SPAN:
            commit = False
        elif outcome is _OUTSIDE_COMMIT:
            if clock:
                if flags != OUTSIDE_TXN:
                    _warn(env, producer, p.min_clock, p.begin, clock, flags, _W_UNEXPECTED_FLAGS)
                if p.begin != -1:
                    _warn(env, producer, p.min_clock, p.begin, clock, flags,
                          _W_OUTSIDE_AFTER_PENDING)
            # Any pending span is deliberately clobbered: an implicit rollback.
            p.begin = env.begin
            p.ring_stop = -1
        elif outcome is _CONTINUE_BEGIN_SPAN:
            commit = False
            p.begin = env.begin
            self._pending.add(p)
        elif outcome is _ACK_EMPTY:
            p.begin = env.begin
        elif outcome is not _ACK_COMMIT_RING and outcome is not _ACK_COMMIT_REPLAY:
            # Outcomes that leave the ring alone: *_ALREADY_ACKED, CONTINUE_TXN_CLOCK_LARGER,
            # ACK_ROLLBACK.
            if outcome is _ACK_ROLLBACK:
                if clock < p.min_clock:
                    # An upstream consumer recovered an older checkpoint and re-sent its
                    # ACKs: fall back to at-least-once for the interval, as Gazette does,
                    # rather than never deliver what follows.
                    _warn(env, producer, p.min_clock, p.begin, clock, flags, _W_ACK_BELOW_LAST)
                # Roll back to this ACK, discarding any pending span.
                p.min_clock = p.max_clock = clock
                p.begin = p.ring_start = p.ring_stop = -1
                self._pending.discard(p)
            self._offsets[journal] = env.end
            return outcome
        # Every other outcome puts `env` in the ring slot at the head, linked after the
        # last entry of p's chain (an OUTSIDE_COMMIT starts a chain of its own).
        ring[head] = env
        nxt[head] = -1
        owner[head] = p
        stop = p.ring_stop
        if stop == -1:
            p.ring_start = head
        else:
            nxt[stop] = head
        p.ring_stop = head
        head += 1
        if head == self._size:
            head = 0
            self._may_grow = self._budget > 0  # a new turn: growth may be tried again
        self._head = head
        p.max_clock = clock
        if not commit:
            self._offsets[journal] = env.end
            return outcome
        # A commit, through `clock`: pending messages with larger clocks are dropped.
        self._emit = p
        return outcome

    def _raise_busy(self, what: str, env: Envelope | None = None) -> None:
        emit = self._emit
        assert emit is not None
        at = f" (queuing journal {env.journal!r} offset {env.begin})" if env is not None else ""
        raise SequencerError(
            f"{what}(): committed messages of journal {emit.journal!r} producer"
            f" {emit.producer.hex()} remain: step() until it returns None first{at}"
        )

    def _held_bytes(self) -> int:
        """The journal bytes of the envelopes in the ring (their `end - begin`)."""
        return sum(e.end - e.begin for e in self._ring if e is not None)

    def _grows_at(self, head: int) -> bool:
        """Whether queueing next grows the ring rather than free slot `head` (which holds
        the first message of an open transaction); changes nothing."""
        o = self._owner[head]
        return (
            self._may_grow
            and o is not None
            and o.ring_start == head
            and self._ring[head].begin == o.begin  # type: ignore[union-attr]
            and 2 * self._held_bytes() <= self._budget
        )

    def _grow(self) -> bool:
        """Double the ring, laid out again from the oldest slot (the head), if twice the
        bytes it holds fit in the budget; otherwise leave it and stop trying until the
        head wraps round. Called when the head slot holds the first message of an open
        transaction and nothing is being stepped through. True if it grew.

        Afterwards the old slots are `0..size-1` in queue order, the head is the first
        new, empty slot, and every chain (`_next`, `ring_start`, `ring_stop`) names the
        same envelopes as before. A ring never shrinks.
        """
        if 2 * self._held_bytes() > self._budget:
            self._may_grow = False
            return False
        size, head = self._size, self._head
        order = list(range(head, size)) + list(range(head))
        owners = [self._owner[i] for i in order]
        # Remap each chain's ends once: the new index is encoded as -2 - index while the
        # old slots are scanned (so a remapped end never matches an old index again).
        for i, o in enumerate(self._owner):
            if o is not None:
                if o.ring_start == i:
                    o.ring_start = -2 - (i - head) % size
                if o.ring_stop == i:
                    o.ring_stop = -2 - (i - head) % size
        for o in owners:
            if o is not None:
                if o.ring_start <= -2:
                    o.ring_start = -2 - o.ring_start
                if o.ring_stop <= -2:
                    o.ring_stop = -2 - o.ring_stop
        old_next = self._next
        self._ring = [self._ring[i] for i in order] + [None] * size
        self._owner = owners + [None] * size
        self._next = [
            -1 if old_next[i] == -1 else (old_next[i] - head) % size for i in order
        ] + [-1] * size
        self._head = size
        self._size = 2 * size
        return True

    def _evict_start(self, p: _Partial, head: int) -> None:
        """The ring slot `head`, about to be reused, holds the start of `p`'s sequence."""
        nxt = self._next[head]
        if (p.ring_start == p.ring_stop) != (nxt == -1):
            raise SequencerError(
                f"ring invariant violated for journal {p.journal!r} producer {p.producer.hex()}"
            )
        if nxt == -1:
            p.ring_start = p.ring_stop = -1  # nothing of it is left in the ring
        else:
            p.ring_start = nxt

    # ----------------------------------------------------------------- stepping

    def start_replay(self, envelopes: Iterable[Envelope]) -> None:
        """Supply the read-uncommitted envelopes of `replay_range()`, then `step()` on."""
        if self._emit is None:
            raise SequencerError("start_replay(): no committed messages to step through")
        self._replay_it = iter(envelopes)

    def step(self) -> Envelope | None:
        """The next committed envelope, or None once the committed sequence is drained.

        Each call first counts the envelope it last returned as processed
        (`min_clock` moves to its clock). Reaching None moves the offsets past the
        committing message, sets `max_clock = min_clock`, closes the span (`begin`,
        `ring_start`, `ring_stop` -1) and clears `_emit`. After ACK_COMMIT_REPLAY,
        `start_replay()` must come first.
        """
        emit = self._emit
        if emit is None:
            return None
        ring = self._ring
        dequeued = self._dequeued
        replay_it = self._replay_it
        start = emit.ring_start
        if dequeued is None:
            if replay_it is None and emit.begin != ring[start].begin:  # type: ignore[union-attr]
                journal, begin, end = self.replay_range()
                raise SequencerError(
                    f"step(): a replay of journal {journal!r} offsets [{begin}, {end}) must be"
                    " started with start_replay() first (queue outcome was ACK_COMMIT_REPLAY)"
                )
        else:
            emit.min_clock = self._dequeued_clock  # the dequeued envelope was processed

        while start != -1:
            if replay_it is None:
                env = ring[start]
                start = emit.ring_start = self._next[start]
            else:
                try:
                    env = next(replay_it)
                except StopIteration:
                    replay_it = self._replay_it = None  # replay drained: carry on from the ring
                    continue
                self._check_replayed(env, emit)
                replayed_producer, replayed_clock, _ = env._ids or env.ids
                if replayed_producer != emit.producer:
                    continue  # another producer's message, interleaved in the journal
                if replayed_clock == 0:
                    continue  # a zero clock commits at once: delivered when first queued
            dequeued = self._dequeued = env
            clock = self._dequeued_clock = (env._ids or env.ids)[1]  # type: ignore[union-attr]
            if clock and clock <= emit.min_clock:
                continue  # a duplicate (from the ring, a replay, or across a checkpoint)
            if clock > emit.max_clock:
                continue  # larger than the committing ACK: not committed
            emit.begin = env.begin  # type: ignore[union-attr]
            return env

        # Drained. Offsets were held back when the commit was queued: move them now.
        self._offsets[emit.journal] = dequeued.end  # type: ignore[union-attr]
        emit.max_clock = emit.min_clock
        emit.begin = emit.ring_start = emit.ring_stop = -1
        self._pending.discard(emit)
        self._emit = self._dequeued = None
        self._dequeued_clock = 0
        return None

    def _check_replayed(self, env: Envelope, emit: _Partial) -> None:
        end = self._ring[emit.ring_start].begin  # type: ignore[union-attr]
        if env.journal != emit.journal:
            raise ReplayError(
                f"replay of wrong journal {env.journal!r} (expected {emit.journal!r},"
                f" offsets [{emit.begin}, {end}))"
            )
        if env.begin < emit.begin:
            raise ReplayError(
                f"replay of journal {emit.journal!r} has wrong begin offset {env.begin}"
                f" (expected >= {emit.begin})"
            )
        if env.end > end:
            raise ReplayError(
                f"replay of journal {emit.journal!r} has wrong end offset {env.end}"
                f" (expected <= {end})"
            )

    # -------------------------------------------------------------- checkpoints

    def checkpoint(
        self, prune_horizon: timedelta | float | int = 0, *, dequeued_processed: bool = False
    ) -> tuple[dict[str, int], list[ProducerState]]:
        """Read-through offsets and producer states, from which a new Sequencer resumes.

        Producers whose clocks are older than `prune_horizon` (a timedelta or
        seconds; 0: never) relative to the newest ACK in their journal are
        forgotten. States come sorted by journal and producer. `has_pending()` is
        False afterwards.

        Taken while an envelope is `dequeued`, the checkpoint (as Gazette's) has it
        delivered again on resuming; with `dequeued_processed=True` it counts as
        processed instead, and a sequencer resumed from it carries on after it.
        """
        below = prune_below(prune_horizon)
        states: list[ProducerState] = []
        for journal, by_producer in list(self._partials.items()):
            if below >= 0 and by_producer:
                newest = max(p.min_clock for p in by_producer.values())
                bound = newest - below
                for producer in [pr for pr, p in by_producer.items() if p.max_clock < bound]:
                    by_producer[producer].tracked = False
                    del by_producer[producer]
            for producer, p in by_producer.items():
                states.append(ProducerState(journal, producer, p.min_clock, p.begin))
        self._pending.clear()
        offsets = dict(self._offsets)
        dequeued, emit = self._dequeued, self._emit
        if dequeued_processed and dequeued is not None and emit is not None:
            last = emit.ring_start == -1 and self._replay_it is None
            if last:  # the committing envelope: its sequence is done with
                offsets[emit.journal] = dequeued.end
            clock = self._dequeued_clock
            if clock:
                done = ProducerState(emit.journal, emit.producer, clock, -1 if last else emit.begin)
                states = [
                    done if (s.journal, s.producer) == (emit.journal, emit.producer) else s
                    for s in states
                ]
        states.sort(key=lambda s: (s.journal, s.producer))
        return offsets, states

    # ------------------------------------------------------------------ batches

    def _sequence(
        self, envelopes: Iterable[Envelope], replay: ReplayFunc | None, acks: bool = True
    ) -> Iterator[Envelope]:
        """The batch path: evict, decide, apply and step per envelope, with the kernel in
        exactly the per-call state at every yield."""
        queue, step = self.queue_uncommitted, self.step
        for env in envelopes:
            outcome = queue(env)
            if self._emit is None:
                continue
            if outcome is _ACK_COMMIT_REPLAY:
                j, begin, end = self.replay_range()
                if replay is None:
                    raise ReplayRequired(j, begin, end)
                self._replay_it = iter(replay(j, begin, end))
            while (committed := step()) is not None:
                if not acks and (committed._ids or committed.ids)[2] == ACK_TXN:
                    continue
                yield committed
                if self._dequeued is not committed:
                    self._raise_interfered()

    def _raise_interfered(self) -> None:
        raise SequencerError(
            "sequence(): the sequencer was stepped while this iterator was suspended; it"
            " stops here (carry on with step())"
        )


for _public in (QueueOutcome, ProducerState, SequencingKernel, decide_outcome):
    _public.__module__ = PUBLIC_HOME
del _public
