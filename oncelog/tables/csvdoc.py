"""CSV records as named string columns: the one mapping every columnar reader of a CSV
journal uses (`read_committed_arrow(parse=True)`, segments' `doc` columns, merge-on-read),
so a row reads the same whichever path produced it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["csv_fields"]


def csv_fields(table: "pa.Table", journal: str, names: list[str]) -> "pa.Table":
    """`table` (CSV records as text in `message`) with `message` replaced by a string column
    per CSV column, named by `names`, the journal's recorded header (see
    `read_committed_arrow`). Every field is kept: a record longer than the header adds
    `_<n>` columns, a shorter one has nulls."""
    import csv

    import pyarrow as pa

    from oncelog.errors import BadMessage

    meta = table.drop_columns(["message"])
    texts = table.column("message").to_pylist()
    try:
        rows = list(csv.reader(texts, strict=True))
    except csv.Error:
        rows = []
    if len(rows) != len(texts):  # the framing read these records: only a corrupt segment
        begins, ends = table.column("begin").to_pylist(), table.column("end").to_pylist()
        for text, begin, stop in zip(texts, begins, ends, strict=True):
            try:
                parsed = list(csv.reader([text], strict=True))
            except csv.Error as exc:
                parsed, reason = [], str(exc)
            else:
                reason = f"{len(parsed)} records in one message"
            if len(parsed) != 1:
                raise BadMessage(f"malformed CSV record ({reason}): {text[:60]!r}",
                                 journal=journal, begin=begin, end=stop)
        raise BadMessage(f"journal {journal}: committed CSV records do not parse one by one")
    width = max([len(names), *map(len, rows)])
    for position in range(width):
        name = names[position] if position < len(names) else f"_{position}"
        if name in meta.column_names:  # the UUID column `uuid`: already the `uuid` column
            continue
        values = [row[position] if position < len(row) else None for row in rows]
        meta = meta.append_column(name, pa.array(values, pa.string()))
    return meta
