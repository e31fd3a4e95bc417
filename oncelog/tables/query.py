"""Journals as one Arrow dataset, for DuckDB, Polars, pandas and pyarrow users."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from oncelog._extras import needs_extra

if TYPE_CHECKING:
    import pyarrow.dataset as pads

    from oncelog.journal import JournalClient

__all__ = ["dataset"]


def dataset(
    client: JournalClient,
    journals: str | Sequence[str],
    *,
    parse: bool = True,
    columns: Sequence[str] | None = None,
) -> pads.Dataset:
    """The committed messages of `journals` as one `pyarrow.dataset.Dataset` (DuckDB,
    Polars and pandas read it directly): per journal, exactly `read_committed_arrow`'s rows
    and order, read from its segments for sealed history and its frames for the rest.
    Journals follow one another in the order given; document columns are unified across
    them (a field one journal lacks is null there). `parse=False`: the documents' text in a
    `message` column instead. `columns`: only these (sealed history decodes only them)."""
    with needs_extra("arrow", "oncelog.tables.dataset"):
        import pyarrow as pa
        import pyarrow.dataset as pads

    from oncelog.arrow import read_committed_arrow

    names = [journals] if isinstance(journals, str) else list(journals)
    tables = [read_committed_arrow(client, name, parse=parse, columns=columns) for name in names]
    if not tables:
        raise ValueError("dataset() needs at least one journal")
    table = pa.concat_tables(tables, promote_options="permissive")
    return pads.dataset(table)
