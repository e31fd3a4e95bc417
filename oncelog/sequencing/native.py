"""The C sequencing kernel's binding: `oncelog._speedups.Kernel`, checked against the rules.

The extension itself is loaded by `oncelog._native` (below this package: the JSON-lines
decoder of `oncelog.framing` comes from the same module, and framing must not import
sequencing). This module owns what concerns the kernel: its queue outcomes and warning
codes, checked here at import against their one definition in
`oncelog.sequencing.kernel` (a mismatch is an ImportError, a build bug, never a silent
fallback), and the conversions between the C kernel's tuples and the Python kernel's
types (`new_kernel`, `decided`, `checkpoint`). `oncelog.sequencer.Sequencer` delegates
to a kernel made here where the extension is in use.

Whether it is in use is read from `oncelog._native.speedups` at each call of
`kernel_type()`, the one switch (the tests swap it to run both kernels).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from types import ModuleType
from typing import TYPE_CHECKING

from oncelog import _native
from oncelog.identity import Envelope
from oncelog.sequencing.kernel import (
    _WARNINGS,
    ProducerState,
    QueueOutcome,
    _Partial,
    _validated,
    _warn,
    prune_below,
)

if TYPE_CHECKING:
    from oncelog._speedups import Kernel

__all__ = ["OUTCOMES", "checkpoint", "decided", "kernel_type", "new_kernel", "outcomes_of"]


def outcomes_of(module: ModuleType) -> tuple[QueueOutcome, ...]:
    """QueueOutcome by the C kernel's outcome numbers (its names checked against ours), for
    the extension `module`; ImportError if its outcomes or warnings are not ours."""
    outcomes = tuple(QueueOutcome(v) for v in module.OUTCOMES)
    if len(outcomes) != len(QueueOutcome) or set(outcomes) != set(QueueOutcome):
        raise ImportError("oncelog._speedups has other queue outcomes: rebuild the extension")
    if len(module.WARNINGS) != len(_WARNINGS):
        raise ImportError("oncelog._speedups has other warnings: rebuild the extension")
    return outcomes


OUTCOMES: tuple[QueueOutcome, ...] = (
    () if _native.speedups is None else outcomes_of(_native.speedups.module)
)
"""QueueOutcome by the C kernel's outcome numbers (empty when the extension is not loaded)."""


def kernel_type() -> type[Kernel] | None:
    """The C kernel type when the C speed-ups are in use in this process, else None."""
    speedups = _native.speedups
    if speedups is None:
        return None
    kernel: type[Kernel] = speedups.module.Kernel
    return kernel


def new_kernel(
    offsets: dict[str, int] | None,
    states: Iterable[ProducerState] | None,
    buffer: int | None,
    max_bytes: int | None,
) -> Kernel:
    """A C kernel starting from `offsets` and `states`, its ring as `SequencingKernel`'s
    would be (the same arguments, checked the same way); it logs through the Python
    kernel's `_warn`. RuntimeError if the extension is not in use."""
    kernel = kernel_type()
    if kernel is None:
        raise RuntimeError("oncelog._speedups is not loaded")
    checked, state_list, size, budget = _validated(offsets, states, buffer, max_bytes)
    return kernel(
        checked, [(s.journal, s.producer, s.last_ack, s.begin) for s in state_list], size,
        _warn, budget,
    )


def decided(kernel: Kernel, env: Envelope) -> tuple[QueueOutcome, _Partial]:
    """`kernel.decide(env)` as `SequencingKernel.decide` returns it: the outcome, and the
    producer's record (a copy: changing it changes nothing in the kernel)."""
    outcome, state = kernel.decide(env)
    journal, producer, low, high, begin, start, stop, tracked = state
    p = _Partial(journal, producer, low, begin, tracked)
    p.max_clock, p.ring_start, p.ring_stop = high, start, stop
    return OUTCOMES[outcome], p


def checkpoint(
    kernel: Kernel, prune_horizon: timedelta | float | int, dequeued_processed: bool
) -> tuple[dict[str, int], list[ProducerState]]:
    """`SequencingKernel.checkpoint` of a C kernel: offsets, and states sorted by journal
    and producer."""
    offsets, rows = kernel.checkpoint(prune_below(prune_horizon), dequeued_processed)
    states = [ProducerState(*row) for row in rows]
    states.sort(key=lambda s: (s.journal, s.producer))
    return offsets, states
