"""Errors of the PySpark data source; every one derives from `oncelog.OncelogError`.

Imports neither PySpark nor pyarrow, so a driver can catch these without loading the data
source. `BadMessage` (a message that cannot become a row) is shared with the CLI and Arrow
reads and lives in `oncelog.errors`; `Diverged` (the split plan's) lives in
`oncelog.sequencing.errors`; both are re-exported here.
"""

from __future__ import annotations

from oncelog.errors import BadMessage, OncelogError
from oncelog.sequencing.errors import Diverged

__all__ = ["OptionError", "SchemaError", "BadMessage", "Diverged"]


class OptionError(OncelogError, ValueError):
    """A data source option is missing or has a bad value (the message names it)."""


class SchemaError(OncelogError, ValueError):
    """The requested schema does not fit the journals or the source's columns."""

