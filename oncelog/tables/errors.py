"""Errors of oncelog.tables (under the one root, oncelog.OncelogError)."""

from __future__ import annotations

from oncelog.errors import OncelogError

__all__ = ["ExportError", "SegmentError", "SegmentWarning", "TablesError"]


class TablesError(OncelogError):
    """Base of the errors of oncelog.tables."""


class SegmentError(TablesError):
    """A segment or its record is unusable (missing, corrupt, foreign): readers fall back
    to the journal's fragments; the message names the journal, the segment and offsets."""


class SegmentWarning(OncelogError, UserWarning):
    """A segment could not be used (missing, damaged): its range was read from fragments."""


class ExportError(TablesError):
    """An export step failed with its outcome known: nothing of it is in the table."""
