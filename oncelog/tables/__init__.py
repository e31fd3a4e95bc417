"""Journals read as tables: columnar segments of sealed history, merge-on-read, exports.

- `dataset(client, journals)`: the committed messages of journals as a
  `pyarrow.dataset.Dataset` (segments for compacted history plus the live tail), exactly
  `read_committed`'s rows, order and offsets.
- `export_delta(client, journals, table_uri)`: append them to a Delta Lake table, exactly
  once, progress kept as Delta application transactions (oncelog.tables.delta).
- Segments (oncelog.tables.segments) are written by compaction, retired by trims and `gc`,
  and checked by `journals verify`, through the journal layer's extension hooks, which this
  package registers on import (`import oncelog` imports it). Needs pyarrow (the `arrow`
  extra) to write or read segments; without it compaction writes none.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from oncelog.journal.extensions import register_extension
from oncelog.tables.delta import ExportResult, export_delta
from oncelog.tables.errors import ExportError, SegmentError, SegmentWarning, TablesError
from oncelog.tables.query import dataset
from oncelog.tables.segments import ARROW_SCHEMA_LABEL, SEGMENTS_LABEL

if TYPE_CHECKING:
    from oncelog.journal import JournalClient
    from oncelog.journal.verify import VerifyProblem

__all__ = [
    "ARROW_SCHEMA_LABEL",
    "SEGMENTS_LABEL",
    "ExportError",
    "ExportResult",
    "SegmentError",
    "SegmentWarning",
    "TablesError",
    "dataset",
    "export_delta",
]


class _Segments:
    """The journal extension keeping segments in step with compaction, trims and gc."""

    name = "segments"

    def after_compaction(self, client: JournalClient, journal: str, through: int) -> None:
        if importlib.util.find_spec("pyarrow") is None:
            return  # segments need pyarrow; readers read the fragments
        from oncelog.tables.segments import seal

        seal(client, journal, through)

    def after_trim(self, client: JournalClient, journal: str, first: int) -> None:
        from oncelog.tables.segments import retire_below

        retire_below(client, journal, first)

    def collect(
        self, client: JournalClient, journal: str, grace: float, dry_run: bool
    ) -> list[str]:
        from oncelog.tables.segments import collect

        return collect(client, journal, grace, dry_run)

    def verify(self, client: JournalClient, journal: str) -> list[VerifyProblem]:
        from oncelog.journal.errors import JournalError
        from oncelog.journal.verify import VerifyProblem
        from oncelog.tables.segments import iter_problems

        if importlib.util.find_spec("pyarrow") is None:
            return []
        try:
            return [
                VerifyProblem(journal, where, begin, end, what)
                for where, begin, end, what in iter_problems(client, journal)
            ]
        except JournalError:
            # The journal itself cannot be opened (a corrupt record, say): the fragments'
            # check reports that; segments are checked once it can.
            return []


register_extension(_Segments())

