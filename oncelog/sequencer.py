"""Read-committed sequencing: Gazette's Sequencer for Python.

A `Sequencer` is fed read-*uncommitted* envelopes in journal order and hands
back read-*committed* ones: a non-duplicate OUTSIDE_TXN message commits
itself; an ACK_TXN commits its producer's pending CONTINUE_TXN messages with
clocks up to its own; duplicates and rolled-back messages are never
delivered. The semantics are those of Gazette's `message.Sequencer`
(go.gazette.dev/core), outcome for outcome; docs/sequencing.md explains them.

Memory is bounded: a ring of the most recent envelopes plus one small record
per (journal, producer). By default the ring grows (up to a byte budget,
`max_bytes`) rather than drop the start of a transaction still open, so
transactions that fit in the budget are never re-read; `buffer=N` keeps a
fixed ring of N envelopes instead, as Gazette's. A committed sequence that has
left the ring is re-read through a replay of `replay_range()`.

This is the public home of the sequencing names. The rules themselves live in the
`oncelog.sequencing` package: `oncelog.sequencing.kernel` states them in Python
(`decide_outcome`, `SequencingKernel`, and the `QueueOutcome` and `ProducerState`
re-exported here), `oncelog.sequencing.native` binds the C kernel; `Sequencer` adds the
batch API and read-only views on top of either.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING

from oncelog.errors import ReplayError, ReplayRequired, SequencerError
from oncelog.identity import Envelope
from oncelog.sequencing import native
from oncelog.sequencing.kernel import (
    DEFAULT_MAX_BYTES,
    ProducerState,
    QueueOutcome,
    ReplayFunc,
    SequencingKernel,
    decide_outcome,
)

__all__ = [
    "DEFAULT_MAX_BYTES",
    "ProducerState",
    "QueueOutcome",
    "ReplayError",
    "ReplayFunc",
    "ReplayRequired",
    "Sequencer",
    "SequencerError",
    "SequencingKernel",
    "decide_outcome",
]

if TYPE_CHECKING:
    from oncelog._speedups import Kernel
    from oncelog.sequencing.kernel import _Partial

_native_outcomes = native.OUTCOMES
"""QueueOutcome by the C kernel's outcome numbers (a module global: the hot path reads it)."""


class Sequencer(SequencingKernel):
    """Turns read-uncommitted envelopes into read-committed ones (Gazette's semantics).

    Per message: `queue_uncommitted(env)`, then, if the outcome commits, `step()`
    until it returns None. Or hand a batch to `sequence()` / `committed()`. The state
    and the rules are those of `SequencingKernel`; a Sequencer adds the batch API and
    read-only views.

    The ring: by default (`buffer=None`) it starts at 1,024 envelopes (`buffer=N` with
    `max_bytes=M`: at N) and doubles whenever the next queued envelope would otherwise
    drop the first message of a transaction still open, as long as twice the journal
    bytes it holds stay within `max_bytes` (default `DEFAULT_MAX_BYTES`, 32 MiB; decoded
    messages take a few times their journal bytes in memory). A transaction that fits is
    committed from memory (ACK_COMMIT_RING); a larger one is re-read from the journal
    (ACK_COMMIT_REPLAY).
    The ring never shrinks. `buffer=N` alone keeps a fixed ring of N envelopes, Gazette's
    exact semantics, outcome for outcome. Delivered envelopes, offsets and checkpoints
    are the same whatever the ring: only the replays differ.

    Where the C extension is built (and `ONCELOG_PURE_PYTHON` is not set), `Sequencer(...)`
    makes a `_NativeSequencer`: a Sequencer whose state and rules are a C kernel's
    (`oncelog._speedups.Kernel`), with the same outcomes, envelopes and checkpoints.
    Otherwise, and for subclasses (which may override the kernel's methods), it is the
    pure-Python kernel it inherits.
    """

    __slots__ = ()

    def __new__(
        cls,
        offsets: dict[str, int] | None = None,
        states: Iterable[ProducerState] | None = None,
        buffer: int | None = None,
        *,
        max_bytes: int | None = None,
    ) -> Sequencer:
        if cls is Sequencer and native.kernel_type() is not None:
            return object.__new__(_NativeSequencer)
        return object.__new__(cls)

    @property
    def dequeued(self) -> Envelope | None:
        """The committed envelope `step()` last returned, until the sequence is drained."""
        return self._dequeued

    @property
    def offsets(self) -> dict[str, int]:
        """A copy of the read-through offsets: where to resume reading each journal."""
        return dict(self._offsets)

    @property
    def buffer(self) -> int:
        """The ring's size in envelopes now (a growing ring's grows; it never shrinks)."""
        return self._size

    def has_pending(self) -> bool:
        """True if a transaction begun since the last `checkpoint()` is still open.

        Assuming producers are alive, it hints that more messages are coming, so
        a consumer may wait for them before closing its own transaction.
        """
        return bool(self._pending)

    def sequence(
        self,
        envelopes: Iterable[Envelope],
        replay: ReplayFunc | None = None,
        *,
        acks: bool = True,
    ) -> Iterator[Envelope]:
        """Queue each envelope and yield the committed ones, in order.

        Equivalent to `queue_uncommitted` + `step` per envelope, with the
        sequencer in the same state at each yield (so `checkpoint()` may be taken
        there), but faster. `replay(journal, begin, end)` reads replays; without
        it a replay raises `ReplayRequired`. With `acks=False` the dequeued
        acknowledgements (flags `ACK_TXN`) are stepped past without being yielded.
        """
        if self._emit is not None:
            self._raise_busy("sequence")
        return self._sequence(envelopes, replay, acks)

    def committed(
        self,
        envelopes: Iterable[Envelope],
        replay: ReplayFunc | None = None,
        *,
        acks: bool = True,
    ) -> list[Envelope]:
        """Sequence a whole batch at once; returns the committed envelopes in order
        (without the acknowledgements if `acks=False`).

        The fastest path. Take a checkpoint only after the batch: should it
        raise (a failed replay), resume from an earlier checkpoint.
        """
        return list(self.sequence(envelopes, replay, acks=acks))

    def __repr__(self) -> str:
        n = sum(len(b) for b in self._partials.values())
        return (
            f"Sequencer(buffer={self._size}, producers={n}, pending={len(self._pending)},"
            f" stepping={self._emit is not None})"
        )


class _NativeSequencer(Sequencer):
    """A Sequencer delegating to a C kernel (`oncelog._speedups.Kernel`), which owns the
    ring, the producer table, the offsets and the committed sequence being stepped through.

    `_kernel` is set once, in `__init__`; the pure kernel's attributes, inherited, are
    never set nor read. Every method is the kernel's, outcome for outcome (tests run both
    kernels side by side).
    """

    __slots__ = ("_kernel",)

    def __init__(
        self,
        offsets: dict[str, int] | None = None,
        states: Iterable[ProducerState] | None = None,
        buffer: int | None = None,
        *,
        max_bytes: int | None = None,
    ) -> None:
        self._kernel: Kernel = native.new_kernel(offsets, states, buffer, max_bytes)

    def decide(self, env: Envelope) -> tuple[QueueOutcome, _Partial]:
        return native.decided(self._kernel, env)

    def queue_uncommitted(self, env: Envelope) -> QueueOutcome:
        return _native_outcomes[self._kernel.queue_uncommitted(env)]

    def step(self) -> Envelope | None:
        return self._kernel.step()

    def replay_range(self) -> tuple[str, int, int]:
        return self._kernel.replay_range()

    def start_replay(self, envelopes: Iterable[Envelope]) -> None:
        self._kernel.start_replay(envelopes)

    def checkpoint(
        self, prune_horizon: timedelta | float | int = 0, *, dequeued_processed: bool = False
    ) -> tuple[dict[str, int], list[ProducerState]]:
        return native.checkpoint(self._kernel, prune_horizon, dequeued_processed)

    decide.__doc__ = SequencingKernel.decide.__doc__
    queue_uncommitted.__doc__ = SequencingKernel.queue_uncommitted.__doc__
    step.__doc__ = SequencingKernel.step.__doc__
    replay_range.__doc__ = SequencingKernel.replay_range.__doc__
    start_replay.__doc__ = SequencingKernel.start_replay.__doc__
    checkpoint.__doc__ = SequencingKernel.checkpoint.__doc__

    @property
    def dequeued(self) -> Envelope | None:
        """The committed envelope `step()` last returned, until the sequence is drained."""
        return self._kernel.dequeued

    @property
    def offsets(self) -> dict[str, int]:
        """A copy of the read-through offsets: where to resume reading each journal."""
        return self._kernel.offsets()

    @property
    def buffer(self) -> int:
        """The ring's size in envelopes now (a growing ring's grows; it never shrinks)."""
        return self._kernel.buffer

    def has_pending(self) -> bool:
        return self._kernel.has_pending()

    has_pending.__doc__ = Sequencer.has_pending.__doc__

    def sequence(
        self,
        envelopes: Iterable[Envelope],
        replay: ReplayFunc | None = None,
        *,
        acks: bool = True,
    ) -> Iterator[Envelope]:
        emitting = self._kernel.emitting()
        if emitting is not None:
            journal, producer = emitting[:2]
            raise SequencerError(
                f"sequence(): committed messages of journal {journal!r} producer"
                f" {producer.hex()} remain: step() until it returns None first"
            )
        return self._kernel.sequence(envelopes, replay, acks)

    sequence.__doc__ = Sequencer.sequence.__doc__

    def __repr__(self) -> str:
        k = self._kernel
        return (
            f"Sequencer(buffer={k.buffer}, producers={k.producers()}, pending={k.pending()},"
            f" stepping={k.stepping})"
        )
