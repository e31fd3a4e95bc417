"""The two-phase split plan: read one journal's splits in parallel, commit as the Sequencer does.

A read-committed reader decides each message's fate from its producer's history
(last ACK clock, open transaction), which may lie in earlier parts of the journal.
To read a large journal in parallel it is cut at fragment boundaries into splits:

1. *Facts* (`gather_facts`, one task per split): per producer, a compact summary of
   what the split does to its sequencing state - its CONTINUE and OUTSIDE clocks before
   the first ACK, that ACK, and the state left at the split's end.
2. *Resolution* (`resolve`, on the driver): the summaries, in offset order, give each
   split the producers' states at its start, and the fate (commit clock, or none) of
   every transaction still open at its end.
3. *Commit* (`SplitCommitter`, one task per split): each split replays the Sequencer's
   rules over its own messages from those states.

The result equals `read_committed` (the sequential Sequencer) message for message.
The Sequencer delivers a partially acknowledged transaction slightly differently
depending on whether it re-reads it (a replay) or holds it in its ring, when that
transaction's clocks also go backwards; `resolve` sends such journals, and journals
with odd UUIDs (a zero clock from a real producer or the reverse), to a sequential
read. Neither occurs in journals written by a Publisher.

This module is pure Python over `(producer, clock, flags, begin)` tuples: it imports
neither PySpark nor pyarrow (`oncelog.sequencing.bulkcommit` decides whole Arrow batches
the same way). The Spark data source (`oncelog.spark.batch`, `oncelog.spark.read`) runs
the phases as Spark tasks; `oncelog.spark.plan` re-exports this module's names.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from oncelog.identity import ACK_TXN, CONTINUE_TXN, OUTSIDE_TXN
from oncelog.sequencing.errors import Diverged
from oncelog.sequencing.kernel import QueueOutcome, decide_outcome

__all__ = [
    "NIL_PRODUCER",
    "Split",
    "plan_splits",
    "ProducerFacts",
    "SplitFacts",
    "gather_facts",
    "SplitPlan",
    "JournalPlan",
    "resolve",
    "SplitCommitter",
    "Diverged",
    "commit_split",
]

NIL_PRODUCER = "000000000000"
"""Producer (hex) of the nil UUID."""

# Flags (oncelog.identity): unknown flags count as OUTSIDE_TXN.
_CONTINUE = CONTINUE_TXN
_ACK = ACK_TXN
_OUTSIDE = OUTSIDE_TXN

# Outcomes of the Sequencer's rules (oncelog.sequencing.kernel.decide_outcome), by effect here.
_BEGIN_OR_EXTEND = QueueOutcome.CONTINUE_BEGIN_SPAN, QueueOutcome.CONTINUE_EXTEND_SPAN
_CLOCK_LARGER = QueueOutcome.CONTINUE_TXN_CLOCK_LARGER
_ACK_COMMITS = QueueOutcome.ACK_EMPTY, QueueOutcome.ACK_COMMIT_RING
_ROLLBACK = QueueOutcome.ACK_ROLLBACK
_OUTSIDE_COMMIT = QueueOutcome.OUTSIDE_COMMIT

Ids = tuple[str, int, int, int]
"""One message as the plan sees it: (producer hex, clock, flags, begin offset)."""


@dataclass(frozen=True, slots=True)
class Split:
    """Bytes `[begin, end)` of `journal`, the `index`-th split of its read."""

    journal: str
    index: int
    begin: int
    end: int


def plan_splits(
    journal: str,
    boundaries: Iterable[tuple[int, int]],
    split_bytes: int,
    begin: int = 0,
    end: int | None = None,
) -> list[Split]:
    """Cut `[begin, end)` of a journal into splits of at least `split_bytes` (bar the last).

    `boundaries` are the journal's fragments as `(begin, end)` in offset order: splits
    start only at fragment starts, so frames are never cut. `end=None`: the last
    fragment's end.
    """
    if split_bytes <= 0:
        raise ValueError(f"split_bytes must be positive, not {split_bytes!r}")
    cuts: list[int] = []
    last_end = begin
    for frag_begin, frag_end in boundaries:
        last_end = max(last_end, frag_end)
        if begin < frag_begin and (end is None or frag_begin < end):
            cuts.append(frag_begin)
    stop = last_end if end is None else end
    if stop <= begin:
        return []
    splits: list[Split] = []
    start = begin
    for cut in cuts:
        if cut - start >= split_bytes:
            splits.append(Split(journal, len(splits), start, cut))
            start = cut
    splits.append(Split(journal, len(splits), start, stop))
    return splits


# --- phase 1: facts ---------------------------------------------------------------------


@dataclass(slots=True)
class ProducerFacts:
    """What one split does to one producer's sequencing state (see the module docs).

    `ops` are the producer's messages before its first ACK in the split, as
    `(flags, largest clock)` with consecutive messages of one kind merged; `ack` is that
    ACK's clock (None: no ACK); `last_ack`, `max_clock`, `open` the state at the split's
    end when there was an ACK (it no longer depends on the state at the split's start).
    """

    first_clock: int
    ops: list[list[int]] = field(default_factory=list)
    cont_min: int | None = None
    """Smallest CONTINUE_TXN clock before the first ACK."""
    ack: int | None = None
    ack_offset: int = -1
    last_ack: int = 0
    max_clock: int = 0
    open: bool = False
    regressed: bool = False
    """A CONTINUE_TXN clock below an earlier one since the last ACK in the split."""
    partial: bool = False
    """After the first ACK, an ACK committed part of a transaction only."""
    _cont_max: int = 0


@dataclass(slots=True)
class SplitFacts:
    """Per-producer facts of one split, and why the journal needs a sequential read (if it does)."""

    producers: dict[str, ProducerFacts] = field(default_factory=dict)
    odd: str | None = None


def gather_facts(ids: Iterable[Ids], facts: SplitFacts | None = None) -> SplitFacts:
    """Phase 1: summarise a split's messages (in offset order); may be fed in several calls."""
    out = SplitFacts() if facts is None else facts
    producers = out.producers
    for producer, clock, flags, begin in ids:
        if not clock:
            if producer != NIL_PRODUCER and out.odd is None:
                out.odd = f"a UUID with a zero clock but producer {producer} at offset {begin}"
            continue
        if producer == NIL_PRODUCER and out.odd is None:
            out.odd = f"a UUID with clock {clock} but the nil producer at offset {begin}"
        f = producers.get(producer)
        if f is None:
            f = producers[producer] = ProducerFacts(clock)
        if flags == _CONTINUE:
            if clock < f._cont_max:
                f.regressed = True
            else:
                f._cont_max = clock
            if f.ack is None:
                ops = f.ops
                if ops and ops[-1][0] == _CONTINUE:
                    if clock > ops[-1][1]:
                        ops[-1][1] = clock
                else:
                    ops.append([_CONTINUE, clock])
                if f.cont_min is None or clock < f.cont_min:
                    f.cont_min = clock
            elif clock > f.max_clock:  # max_clock >= last_ack: a new or extended span
                f.max_clock = clock
                f.open = True
        elif flags == _ACK:
            f._cont_max = 0
            if f.ack is None:
                f.ack = clock
                f.ack_offset = begin
            elif f.open and f.last_ack < clock < f.max_clock:
                f.partial = True
            f.last_ack = f.max_clock = clock
            f.open = False
        else:
            if f.ack is None:
                ops = f.ops
                if ops and ops[-1][0] == _OUTSIDE:
                    if clock > ops[-1][1]:
                        ops[-1][1] = clock
                else:
                    ops.append([_OUTSIDE, clock])
            elif clock > f.last_ack:
                f.last_ack = f.max_clock = clock
                f.open = False
    return out


# --- phase 1.5: resolution on the driver ------------------------------------------------

State = tuple[int, int, bool]
"""A producer's sequencing state: (last ACK clock, largest pending clock, transaction open)."""


@dataclass(slots=True)
class SplitPlan:
    """What phase 2 of one split needs: producers' states at its start (those appearing in
    it), and `(ack clock, ack offset)` of each transaction open at its end that commits."""

    split: Split
    states: dict[str, State] = field(default_factory=dict)
    commits: dict[str, tuple[int, int]] = field(default_factory=dict)


@dataclass(slots=True)
class JournalPlan:
    """The splits of one journal with their plans; `sequential` says why the journal must be
    read in one sequential pass instead (then `splits` is empty)."""

    journal: str
    splits: list[SplitPlan]
    sequential: str | None = None


def resolve(
    journal: str,
    splits: Sequence[Split],
    facts: Sequence[SplitFacts],
    states: dict[str, State] | None = None,
) -> JournalPlan:
    """Combine the splits' facts in offset order into each split's plan (see module docs).

    `states` are producers' states at the first split's start (none when reading from
    a journal's beginning).
    """
    if len(splits) != len(facts):
        raise ValueError(f"journal {journal!r}: {len(splits)} splits but {len(facts)} facts")
    state: dict[str, list[Any]] = {p: list(s) for p, s in (states or {}).items()}
    plans = [SplitPlan(s) for s in splits]
    pending: dict[str, list[int]] = {}  # producer -> splits holding part of its open span
    partial: set[str] = set()
    regressed: set[str] = set()

    def settle(producer: str, commit: tuple[int, int] | None) -> None:
        for k in pending.pop(producer, ()):
            if commit is not None:
                plans[k].commits[producer] = commit

    for k, f in enumerate(facts):
        if f.odd is not None:
            return JournalPlan(journal, [], f"split {k} holds {f.odd}")
        plan_states = plans[k].states
        for producer, pf in f.producers.items():
            st = state.get(producer)
            if st is None:
                st = state[producer] = [pf.first_clock - 1, pf.first_clock - 1, False]
            last, high, is_open = st
            plan_states[producer] = (last, high, is_open)
            if pf.regressed or (is_open and pf.cont_min is not None and pf.cont_min < high):
                regressed.add(producer)
            for kind, clock in pf.ops:
                if kind == _CONTINUE:
                    if clock > high:
                        high = clock
                        is_open = True
                elif clock > last:  # an OUTSIDE_TXN commit clobbers an open span
                    if is_open:
                        settle(producer, None)
                    last = high = clock
                    is_open = False
            if pf.ack is not None:
                if is_open:
                    if pf.ack > last:
                        if pf.ack < high:
                            partial.add(producer)
                        settle(producer, (pf.ack, pf.ack_offset))
                    else:
                        settle(producer, None)  # rolled back
                if pf.partial:
                    partial.add(producer)
                last, high, is_open = pf.last_ack, pf.max_clock, pf.open
            st[0], st[1], st[2] = last, high, is_open
            if is_open:
                pending.setdefault(producer, []).append(k)
    risky = partial & regressed
    if risky:
        producer = min(risky)
        return JournalPlan(
            journal,
            [],
            f"producer {producer} acknowledged part of a transaction whose clocks go backwards",
        )
    return JournalPlan(journal, plans)


# --- phase 2: commit within a split -----------------------------------------------------

R = TypeVar("R")


class _Model:
    __slots__ = ("last", "high", "open", "pending", "regressed")

    def __init__(self, last: int, high: int, is_open: bool) -> None:
        self.last = last
        self.high = high
        self.open = is_open
        self.pending: list[tuple[int, Any]] = []
        self.regressed = False


Committed = tuple[list[R], list[int]]
"""References of committed messages, and the offset at which each was committed."""


class SplitCommitter(Generic[R]):
    """Phase 2: decides which messages of one split are committed, and where.

    `feed()` messages in offset order with an opaque reference each; it returns the
    references of the messages committed by what was fed and, beside them, their commit
    offsets (that of the committing ACK, or the message's own). `finish()` returns those
    committed by ACKs in later splits. ACKs themselves are never returned.

    With `guard=True` (for a whole journal read from its start, without a plan) it
    raises `Diverged` where the journal needs a sequential read instead: an odd UUID,
    or a partial commit of a transaction whose clocks went backwards.
    """

    def __init__(self, plan: SplitPlan | None = None, *, guard: bool = False) -> None:
        self._states = {} if plan is None else plan.states
        self._commits = {} if plan is None else plan.commits
        self._models: dict[str, _Model] = {}
        self._guard = guard

    def feed(
        self,
        producers: Sequence[str],
        clocks: Sequence[int],
        flags: Sequence[int],
        begins: Sequence[int],
        refs: Sequence[R],
    ) -> Committed[R]:
        out_refs: list[R] = []
        out_commits: list[int] = []
        out = (out_refs, out_commits)
        emit_ref, emit_commit = out_refs.append, out_commits.append
        models = self._models
        guard = self._guard
        begin_or_extend, ack_commits = _BEGIN_OR_EXTEND, _ACK_COMMITS
        for producer, clock, flag, begin, ref in zip(producers, clocks, flags, begins, refs):
            if not clock:
                if guard and producer != NIL_PRODUCER:
                    raise Diverged(begin, out, f"a zero clock from producer {producer}")
                emit_ref(ref)
                emit_commit(begin)
                continue
            m = models.get(producer)
            if m is None:
                if guard and producer == NIL_PRODUCER:
                    raise Diverged(begin, out, f"clock {clock} from the nil producer")
                st = self._states.get(producer)
                m = models[producer] = (
                    _Model(clock - 1, clock - 1, False) if st is None else _Model(*st)
                )
            # The Sequencer's rules decide; the effects are this split's (messages of an
            # open transaction are held in `pending`, never in a ring: none is replayed).
            outcome = decide_outcome(m.last, m.high, m.open, clock, flag)
            if outcome in begin_or_extend:
                m.high = clock
                m.open = True
                m.pending.append((clock, ref))
            elif outcome in ack_commits:
                if guard and m.regressed and m.open and clock < m.high:
                    raise Diverged(
                        begin, out, f"producer {producer} acknowledged part of a"
                        " transaction whose clocks go backwards",
                    )
                for c, r in m.pending:
                    if c <= clock:  # larger clocks are not committed by this ACK
                        emit_ref(r)
                        emit_commit(begin)
                if m.pending:
                    m.pending = []
                m.last = m.high = clock
                m.open = m.regressed = False
            elif outcome is _ROLLBACK:
                if m.pending:
                    m.pending = []
                m.last = m.high = clock
                m.open = m.regressed = False
            elif outcome is _OUTSIDE_COMMIT:
                if m.pending:
                    m.pending = []
                emit_ref(ref)
                emit_commit(begin)
                m.last = m.high = clock
                m.open = m.regressed = False
            elif guard and outcome is _CLOCK_LARGER and m.open and clock < m.high:
                m.regressed = True
            # else CONTINUE_ALREADY_ACKED, OUTSIDE_ALREADY_ACKED: nothing.
        return out

    def oldest_pending(self) -> R | None:
        """The first-fed reference that may still be returned (None: none may); for ordered refs."""
        firsts = [m.pending[0][1] for m in self._models.values() if m.pending]
        return min(firsts) if firsts else None

    def finish(self) -> Committed[R]:
        out_refs: list[R] = []
        out_commits: list[int] = []
        for producer, m in self._models.items():
            if m.open and m.pending:
                commit = self._commits.get(producer)
                if commit is not None:
                    clock, offset = commit
                    refs = [r for c, r in m.pending if c <= clock]
                    out_refs.extend(refs)
                    out_commits.extend([offset] * len(refs))
            m.pending = []
        return out_refs, out_commits


def commit_split(ids: Iterable[Ids], plan: SplitPlan | None = None) -> Iterator[tuple[int, int]]:
    """Phase 2 of a whole split at once: `(begin, commit offset)` of its committed messages."""
    committer: SplitCommitter[int] = SplitCommitter(plan)
    rows = list(ids)
    producers = [r[0] for r in rows]
    clocks = [r[1] for r in rows]
    flags = [r[2] for r in rows]
    begins = [r[3] for r in rows]
    yield from zip(*committer.feed(producers, clocks, flags, begins, begins))
    yield from zip(*committer.finish())
