"""The split plan's commit rules decided a whole batch at a time, with Arrow kernels.

`SplitCommitter` (oncelog.sequencing.plan) applies the Sequencer's rules message by
message in Python. In journals written by a Publisher every producer's clocks only
grow, and then the rules reduce to this, per producer, in offset order:

- a CONTINUE message waits for the producer's next message that is not a CONTINUE;
- an ACK commits every message waiting (at the ACK's offset); the ACK itself is no row;
- any other flags (OUTSIDE_TXN, unknown) discard what waits and commit the message
  itself (at its own offset);
- the nil UUID (clock 0, nil producer) commits at its own offset.

`BulkCommitter.feed` decides a batch that way with a handful of vectorised passes
(sort by producer, a reversed running minimum for "the next terminator", a gather),
keeping per producer only its clocks and the messages still waiting. A batch where a
producer's clock does not grow (a rollback, a duplicate, a re-ordered write), or with an
odd UUID, raises `NotBulk` before deciding anything of it; `handover()` then gives a
`SplitCommitter` in exactly the state the per-message rules would have reached (the
producers' states after their last decided message, the waiting messages fed to it
again), which takes over from that batch on.

Needs pyarrow (not PySpark): the Spark reader (`oncelog.spark.read`) feeds it the UUID
columns of `oncelog.spark.uuids`, or anything with the same three columns (`UUIDBatch`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from oncelog.identity import ACK_TXN, CONTINUE_TXN
from oncelog.sequencing.errors import NotBulk
from oncelog.sequencing.plan import (
    NIL_PRODUCER,
    ProducerFacts,
    Split,
    SplitCommitter,
    SplitFacts,
    SplitPlan,
    State,
)

__all__ = ["BulkCommitter", "BulkDecision", "NotBulk", "UUIDBatch", "bulk_facts"]

_I64 = pa.int64()


class UUIDBatch(Protocol):
    """The UUID columns of a batch that `BulkCommitter.feed` reads, one row per message:
    producer IDs as hex strings, clocks and flags (e.g. `oncelog.spark.uuids.UUIDColumns`)."""

    @property
    def producer(self) -> pa.Array: ...

    @property
    def clock(self) -> pa.Array: ...

    @property
    def flags(self) -> pa.Array: ...


@dataclass(slots=True)
class _Producer:
    """A producer's sequencing state: last acknowledged clock, largest clock seen, whether a
    transaction is open; the waiting messages (clocks, row references, offsets), and
    `base`, the state before the first of them (after the last decided message)."""

    last: int
    high: int
    open: bool
    base: State
    clocks: list[int] = field(default_factory=list)
    refs: list[int] = field(default_factory=list)
    begins: list[int] = field(default_factory=list)

    def clear(self) -> None:
        self.clocks, self.refs, self.begins = [], [], []


@dataclass(slots=True)
class BulkDecision:
    """What one batch commits: `mask` and `commits` (the commit offset where `mask` is
    true), row for row; `carried`, references of earlier rows it commits, and their offsets."""

    mask: pa.Array
    commits: pa.Array
    carried: tuple[list[int], list[int]]


def _positions(n: int) -> pa.Array:
    """0, 1, ..., n - 1 as int64."""
    if not n:
        return pa.array([], _I64)
    return pc.subtract(pc.cumulative_sum(pa.repeat(pa.scalar(1, _I64), n)), pa.scalar(1, _I64))


class BulkCommitter:
    """Phase 2 of the split plan (or a whole journal read from its start) for batches of
    growing clocks; see the module. `states` and `commits` are a `SplitPlan`'s (producers'
    states at the split's start, and the commits of transactions open at its end).

    Row references are global row numbers: `feed(..., row)` numbers the batch's rows
    from `row`. Not thread-safe: one task feeds it.
    """

    def __init__(
        self,
        states: Mapping[str, State] | None = None,
        commits: Mapping[str, tuple[int, int]] | None = None,
    ) -> None:
        self._states = dict(states or {})
        self._commits = dict(commits or {})
        self._producers: dict[str, _Producer] = {}

    def feed(self, uuids: UUIDBatch, begins: pa.Array, row: int, offset: int) -> BulkDecision:
        """Decide the batch of `uuids` (rows starting at journal offsets `begins`, the
        first at `offset`); NotBulk, with nothing decided, if it needs the per-message rules."""
        n = len(begins)
        clock, flags = uuids.clock, uuids.flags
        zero = pc.equal(clock, 0)
        nil = pc.equal(uuids.producer, NIL_PRODUCER)
        if pc.any(pc.not_equal(zero, nil)).as_py():
            raise NotBulk(offset, "a zero clock from a producer, or a clock of the nil producer")
        if not n:
            return BulkDecision(pa.array([], pa.bool_()), pa.array([], _I64), ([], []))
        flags = pc.if_else(zero, pa.scalar(0, flags.type), flags)  # the nil UUID commits alone
        encoded = uuids.producer.dictionary_encode()
        codes = encoded.indices
        order = pc.sort_indices(codes)  # stable: offset order within each producer
        codes_s = codes.take(order)
        clock_s = clock.take(order)
        flags_s = flags.take(order)
        begins_s = begins.take(order)
        if n > 1:
            same = pc.equal(codes_s.slice(1), codes_s.slice(0, n - 1))
            stays = pc.less_equal(clock_s.slice(1), clock_s.slice(0, n - 1))
            real = pc.invert(zero.take(order).slice(1))
            if pc.any(pc.and_(pc.and_(same, stays), real)).as_py():
                raise NotBulk(offset, "a producer's clock does not grow")
        pos = _positions(n)
        is_term = pc.not_equal(flags_s, CONTINUE_TXN)
        # For each row, the position of its producer's next message that is not a CONTINUE.
        reverse = pc.subtract(pa.scalar(n - 1, _I64), pos)
        candidates = pc.if_else(is_term, pos, pa.scalar(n, _I64))
        next_term = pc.cumulative_min(candidates.take(reverse)).take(reverse)
        clipped = pc.min_element_wise(next_term, pa.scalar(n - 1, _I64))
        has_term = pc.and_(
            pc.less(next_term, pa.scalar(n, _I64)), pc.equal(codes_s.take(clipped), codes_s)
        )
        term_flags = flags_s.take(clipped)
        is_continue = pc.invert(is_term)
        by_ack = pc.and_(is_continue, pc.equal(term_flags, ACK_TXN))
        outside = pc.and_(is_term, pc.not_equal(flags_s, ACK_TXN))
        committed_s = pc.and_(has_term, pc.or_(by_ack, outside))
        commit_s = begins_s.take(clipped)
        inverse = pc.sort_indices(order)
        mask = committed_s.take(inverse)
        commits = commit_s.take(inverse)
        carried = self._advance(
            encoded.dictionary, codes_s, clock_s, flags_s, begins_s, order, pos, is_term,
            next_term, row, offset,
        )
        return BulkDecision(mask, commits, carried)

    def _advance(
        self,
        dictionary: pa.Array,
        codes_s: pa.Array,
        clock_s: pa.Array,
        flags_s: pa.Array,
        begins_s: pa.Array,
        order: pa.Array,
        pos: pa.Array,
        is_term: pa.Array,
        next_term: pa.Array,
        row: int,
        offset: int,
    ) -> tuple[list[int], list[int]]:
        """Producers' states after the batch (sorted by producer): what earlier waiting
        messages its terminators commit, and which of its messages wait now."""
        n = len(codes_s)
        runs = pc.run_end_encode(codes_s)
        ends = runs.run_ends.cast(_I64)
        ends_l = ends.to_pylist()
        starts_l = [0, *ends_l[:-1]]
        starts = pa.array(starts_l, _I64)
        lasts = pc.subtract(ends, pa.scalar(1, _I64))
        prev_term = pc.cumulative_max(pc.if_else(is_term, pos, pa.scalar(-1, _I64)))
        names = dictionary.take(runs.values).to_pylist()
        first_clock = clock_s.take(starts).to_pylist()
        last_clock = clock_s.take(lasts).to_pylist()
        first_term = next_term.take(starts).to_pylist()
        last_term = prev_term.take(lasts).to_pylist()
        first_term_c = pc.min_element_wise(next_term.take(starts), pa.scalar(n - 1, _I64))
        first_term_flags = flags_s.take(first_term_c).to_pylist()
        first_term_begin = begins_s.take(first_term_c).to_pylist()
        last_term_c = pc.max_element_wise(prev_term.take(lasts), pa.scalar(0, _I64))
        last_term_clock = clock_s.take(last_term_c).to_pylist()
        producers = self._producers
        # Check every producer before changing any state: NotBulk leaves the state as it was.
        for g, name in enumerate(names):
            if name == NIL_PRODUCER:
                continue
            p = producers.get(name)
            high = p.high if p is not None else self._states.get(name, (0, 0, False))[1]
            if (p is not None or name in self._states) and first_clock[g] <= high:
                raise NotBulk(offset, f"producer {name}'s clock {first_clock[g]} does not grow")
        out_refs: list[int] = []
        out_commits: list[int] = []
        for g, name in enumerate(names):
            if name == NIL_PRODUCER:
                continue
            p = producers.get(name)
            if p is None:
                st = self._states.get(name)
                if st is None:
                    st = (first_clock[g] - 1, first_clock[g] - 1, False)
                p = producers[name] = _Producer(*st, base=st)
            start, end = starts_l[g], ends_l[g]
            if first_term[g] < end:  # a terminator: earlier waiting messages are decided
                if p.refs and first_term_flags[g] == ACK_TXN:
                    out_refs.extend(p.refs)
                    out_commits.extend([first_term_begin[g]] * len(p.refs))
                p.clear()
            if last_term[g] >= start:
                p.last = last_term_clock[g]
                p.base = (p.last, p.last, False)
                p.open = last_term[g] < end - 1
                wait_from = last_term[g] + 1
            else:
                p.open = True
                wait_from = start
            p.high = last_clock[g]
            if wait_from < end:
                p.refs.extend(
                    pc.add(order.slice(wait_from, end - wait_from), pa.scalar(row, _I64))
                    .to_pylist()
                )
                p.clocks.extend(clock_s.slice(wait_from, end - wait_from).to_pylist())
                p.begins.extend(begins_s.slice(wait_from, end - wait_from).to_pylist())
        return out_refs, out_commits

    def handover(self, plan: SplitPlan | None, guard: bool) -> SplitCommitter[int]:
        """A SplitCommitter (of `plan`, or of a journal read from its start, `guard`ed as
        asked) in the state the per-message rules reach over what was fed here: it takes
        over from the batch that raised NotBulk."""
        states = dict(self._states)
        waiting: list[tuple[int, str, int, int]] = []
        for name, p in self._producers.items():
            if p.refs:
                states[name] = p.base
                waiting.extend(zip(p.refs, repeat(name), p.clocks, p.begins))
            else:
                states[name] = (p.last, p.high, p.open)
        split = plan.split if plan is not None else Split("", 0, 0, 0)
        commits = dict(self._commits)
        committer: SplitCommitter[int] = SplitCommitter(
            SplitPlan(split, states, commits), guard=guard
        )
        if waiting:
            waiting.sort()
            refs, names, clocks, begins = map(list, zip(*waiting))
            done = committer.feed(names, clocks, [CONTINUE_TXN] * len(refs), begins, refs)
            assert not done[0], "waiting CONTINUE messages commit nothing when fed again"
        return committer

    def oldest_pending(self) -> int | None:
        """The smallest row reference still waiting (None: none waits)."""
        firsts = [p.refs[0] for p in self._producers.values() if p.refs]
        return min(firsts) if firsts else None

    def finish(self) -> tuple[list[int], list[int]]:
        """Waiting messages the plan's `commits` (ACKs in later splits) commit."""
        out_refs: list[int] = []
        out_commits: list[int] = []
        for name, p in self._producers.items():
            if p.open and p.refs:
                commit = self._commits.get(name)
                if commit is not None:
                    clock, at = commit
                    refs = [r for c, r in zip(p.clocks, p.refs) if c <= clock]
                    out_refs.extend(refs)
                    out_commits.extend([at] * len(refs))
            p.clear()
        return out_refs, out_commits


def bulk_facts(
    producers: Sequence[str], clocks: Sequence[int], flags: Sequence[int], begins: Sequence[int]
) -> SplitFacts | None:
    """Phase 1 of the split plan (`gather_facts`) for a whole split's ids at once, when every
    producer's clocks grow in it; None otherwise (then `gather_facts` must summarise it).

    With growing clocks no CONTINUE regresses and no ACK commits part of a transaction, so
    each producer's facts follow from a few positions: its first message, its first ACK,
    its last ACK or OUTSIDE message and its last message.
    """
    n = len(clocks)
    facts = SplitFacts()
    if not n:
        return facts
    producer = pa.array(producers, pa.string())
    clock = pa.array(clocks, _I64)
    zero = pc.equal(clock, 0)
    if pc.any(pc.not_equal(zero, pc.equal(producer, NIL_PRODUCER))).as_py():
        return None  # odd UUIDs: gather_facts names the first
    real = pc.invert(zero)
    producer = producer.filter(real)
    clock = clock.filter(real)
    flag = pa.array(flags, pa.int32()).filter(real)
    begin = pa.array(begins, _I64).filter(real)
    n = len(clock)
    if not n:
        return facts
    encoded = producer.dictionary_encode()
    order = pc.sort_indices(encoded.indices)
    codes_s = encoded.indices.take(order)
    clock_a = clock.take(order)
    if n > 1:
        same = pc.equal(codes_s.slice(1), codes_s.slice(0, n - 1))
        stays = pc.less_equal(clock_a.slice(1), clock_a.slice(0, n - 1))
        if pc.any(pc.and_(same, stays)).as_py():
            return None
    clock_s = clock_a.to_pylist()
    kind_s = pc.if_else(
        pc.equal(flag, CONTINUE_TXN), CONTINUE_TXN, pc.if_else(pc.equal(flag, ACK_TXN), ACK_TXN, 0)
    ).take(order).to_pylist()
    begin_s = begin.take(order).to_pylist()
    runs = pc.run_end_encode(codes_s)
    ends = runs.run_ends.to_pylist()
    names = encoded.dictionary.take(runs.values).to_pylist()
    start = 0
    for name, end in zip(names, ends):
        facts.producers[name] = _producer_facts(
            clock_s[start:end], kind_s[start:end], begin_s[start:end]
        )
        start = end
    return facts


def _producer_facts(clocks: list[int], kinds: list[int], begins: list[int]) -> ProducerFacts:
    """`gather_facts`'s summary of one producer's messages (growing clocks)."""
    f = ProducerFacts(clocks[0])
    try:
        first_ack = kinds.index(ACK_TXN)
    except ValueError:
        first_ack = len(kinds)
    ops: list[list[int]] = []
    for kind, clock in zip(kinds[:first_ack], clocks[:first_ack]):
        if ops and ops[-1][0] == kind:
            ops[-1][1] = clock
        else:
            ops.append([kind, clock])
        if kind == CONTINUE_TXN and f.cont_min is None:
            f.cont_min = clock
    f.ops = ops
    last = len(kinds) - 1

    def last_of(wanted: int, stop: int) -> int:
        """Position of the last message of `wanted` kind at or after `stop` (-1: none);
        searched from the end, where it usually is."""
        for i in range(last, stop - 1, -1):
            if kinds[i] == wanted:
                return i
        return -1

    if first_ack > last:
        # No ACK: the last (largest) CONTINUE clock is the regression watermark.
        cont = last_of(CONTINUE_TXN, 0)
        f._cont_max = clocks[cont] if cont >= 0 else 0
        return f
    f.ack = clocks[first_ack]
    f.ack_offset = begins[first_ack]
    last_ack = last_of(ACK_TXN, first_ack)
    last_term = last
    while kinds[last_term] == CONTINUE_TXN:
        last_term -= 1  # stops at last_ack at the latest
    f.last_ack = clocks[last_term]
    f.max_clock = clocks[last]
    f.open = kinds[last] == CONTINUE_TXN
    cont = last_of(CONTINUE_TXN, last_ack + 1)
    f._cont_max = clocks[cont] if cont >= 0 else 0
    return f
