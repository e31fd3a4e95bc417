"""Errors of the PySpark data source; every one derives from `oncelog.OncelogError`.

Imports neither PySpark nor pyarrow, so a driver can catch these without loading the data
source. `BadMessage` (a message that cannot become a row) is shared with the CLI and Arrow
reads and lives in `oncelog.errors`; it is re-exported here.
"""

from __future__ import annotations

from typing import Any

from oncelog.errors import BadMessage, OncelogError

__all__ = ["OptionError", "SchemaError", "BadMessage", "Diverged"]


class OptionError(OncelogError, ValueError):
    """A data source option is missing or has a bad value (the message names it)."""


class SchemaError(OncelogError, ValueError):
    """The requested schema does not fit the journals or the source's columns."""


class Diverged(OncelogError):
    """A guarded SplitCommitter met what the Sequencer may decide differently (see
    `oncelog.spark.plan`), at journal offset `offset`; `committed` are the decisions made
    before it (`oncelog.spark.plan.Committed`: references and their commit offsets).

    Every message committed before `offset` was decided exactly as the Sequencer does:
    a reader may keep those and take the rest from a sequential read.
    """

    def __init__(self, offset: int, committed: tuple[list[Any], list[int]], reason: str) -> None:
        super().__init__(f"offset {offset}: {reason}")
        self.offset = offset
        self.committed = committed
