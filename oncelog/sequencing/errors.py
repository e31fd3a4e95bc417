"""Errors of the split planner (`oncelog.sequencing.plan`, `oncelog.sequencing.bulkcommit`).

Both derive from `oncelog.OncelogError`. The sequencer's own errors (`SequencerError`,
`ReplayError`, `ReplayRequired`) live in `oncelog.errors`; `Diverged` is re-exported by
`oncelog.spark.errors`, where the data source's readers catch it. Imports nothing but
`oncelog.errors`.
"""

from __future__ import annotations

from typing import Any

from oncelog.errors import OncelogError

__all__ = ["Diverged", "NotBulk"]


class Diverged(OncelogError):
    """A guarded SplitCommitter met what the Sequencer may decide differently (see
    `oncelog.sequencing.plan`), at journal offset `offset`; `committed` are the decisions
    made before it (`oncelog.sequencing.plan.Committed`: references and their commit
    offsets).

    Every message committed before `offset` was decided exactly as the Sequencer does:
    a reader may keep those and take the rest from a sequential read.
    """

    def __init__(self, offset: int, committed: tuple[list[Any], list[int]], reason: str) -> None:
        super().__init__(f"offset {offset}: {reason}")
        self.offset = offset
        self.committed = committed


class NotBulk(OncelogError):
    """The batch at journal offset `offset` needs the per-message rules (`reason` says why).

    Raised by `BulkCommitter.feed` with nothing of the batch decided; the reader hands over
    to a `SplitCommitter` (`BulkCommitter.handover`). A signal, not a failure.
    """

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"at offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason
