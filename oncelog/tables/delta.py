"""Exactly-once export of journals' committed messages to a Delta Lake table.

Each journal's progress lives in the Delta table itself, as a Delta *application
transaction* (`txn` action): app id `<app_id>:<journal>:<incarnation>`, version the
journal offset through which its commits are exported. One export step of a journal reads
the version V, reads the rows `read_committed_arrow` gives up to the head H whose commit
offset is in [V, H) (segments wholly below V are not read), and appends them in one Delta
commit that also sets the version to H. So:

- a rerun, or a crash at any point, exports every row once: the rows and the version are
  one atomic commit, and a step starts from the version committed;
- two exporters racing on one journal: Delta refuses the second commit of the same app id
  (a concurrent transaction); the loser reads the version again and finds nothing left;
- an error whose outcome is unknown (a lost reply) is resolved by reading the version: if
  it reached H, the rows are in the table (once), and the step reports them as exported.

Needs `deltalake` (not a dependency of oncelog: `pip install deltalake`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from oncelog._extras import needs_extra
from oncelog.tables.errors import ExportError

if TYPE_CHECKING:
    import pyarrow as pa

    from oncelog.journal import JournalClient

__all__ = ["ExportResult", "export_delta"]

_ATTEMPTS = 5
"""A step whose commit lost a race is retried from the version read again, this many times."""



@dataclass(slots=True)
class ExportResult:
    """What `export_delta` appended: rows per journal and the offsets each moved between."""

    table_uri: str
    rows: dict[str, int] = field(default_factory=dict)
    offsets: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per journal: (offset exported through before, after)."""

    @property
    def total(self) -> int:
        return sum(self.rows.values())


def app_id_of(prefix: str, journal: str, incarnation: str) -> str:
    """The Delta application-transaction id recording `journal`'s export progress."""
    return f"{prefix}:{journal}:{incarnation}"


def _snapshot(table_uri: str, storage_options: Mapping[str, str] | None) -> Any:
    """The table's latest snapshot (a DeltaTable), or None if there is no table yet."""
    with needs_extra("delta", "export_delta"):
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(table_uri, storage_options=dict(storage_options or {}))
    except TableNotFoundError:
        return None


def _txn_version(snapshot: Any, app: str) -> int:
    """The offset through which `app` was exported as of `snapshot` (0: never, no table)."""
    if snapshot is None:
        return 0
    version = snapshot.transaction_version(app)
    return int(version) if version is not None else 0


def _version(table_uri: str, app: str, storage_options: Mapping[str, str] | None) -> int:
    """The offset through which `app` was exported, as of now."""
    return _txn_version(_snapshot(table_uri, storage_options), app)


def _ensure_table(
    table_uri: str, schema: pa.Schema, storage_options: Mapping[str, str] | None
) -> None:
    """Create the table, empty, if there is none: Delta checks a commit's application
    transactions against the commits since its snapshot, and a commit that creates the
    table has none, so data is only ever appended to an existing table."""
    with needs_extra("delta", "export_delta"):
        from deltalake import DeltaTable
        from deltalake.exceptions import CommitFailedError, TableNotFoundError

    options = dict(storage_options or {})
    try:
        DeltaTable(table_uri, storage_options=options)
    except TableNotFoundError:
        try:
            DeltaTable.create(table_uri, schema, mode="ignore", storage_options=options or None)
        except CommitFailedError:
            pass  # another exporter created it meanwhile: the caller reads it again


def rows_between(client: JournalClient, journal: str, since: int, stop: int,
                 parse: bool = True) -> pa.Table:
    """The committed rows of `journal` whose commit offset is in [since, stop), in
    `read_committed` order (the journal's columns and, `parse`, its documents' fields)."""
    with needs_extra("delta", "export_delta"):
        import pyarrow.compute as pc

    from oncelog.arrow import read_committed_arrow

    table = read_committed_arrow(client, journal, end=stop, parse=parse)
    if since <= 0:
        return table
    return table.filter(pc.greater_equal(table.column("commit_offset"), since))


def _export_journal(
    client: JournalClient,
    journal: str,
    table_uri: str,
    app: str,
    storage_options: Mapping[str, str] | None,
    parse: bool,
    result: ExportResult,
) -> None:
    with needs_extra("delta", "export_delta"):
        from deltalake import CommitProperties, Transaction, write_deltalake
        from deltalake.exceptions import CommitFailedError

    for attempt in range(_ATTEMPTS):
        # The snapshot the progress is read from is the one the commit is made against:
        # Delta then refuses it if another commit of this app id came after the snapshot.
        snapshot = _snapshot(table_uri, storage_options)
        since = _txn_version(snapshot, app)
        stop = client.head(journal)
        result.offsets[journal] = (since, max(since, stop))
        if stop <= since:
            result.rows.setdefault(journal, 0)
            return
        rows = rows_between(client, journal, since, stop, parse)
        if rows.num_rows == 0:
            # Nothing committed in [since, stop): record the progress alone only once rows
            # come (an empty commit would still need a schema); the next step re-reads it.
            result.rows.setdefault(journal, 0)
            return
        if snapshot is None:
            _ensure_table(table_uri, rows.schema, storage_options)
            continue  # read the progress from the new table's snapshot
        props = CommitProperties(app_transactions=[Transaction(app, stop)])
        try:
            write_deltalake(snapshot, rows, mode="append", schema_mode="merge",
                            commit_properties=props)
        except CommitFailedError:
            # Another exporter committed this app id meanwhile: read its progress again.
            if attempt + 1 == _ATTEMPTS:
                raise ExportError(
                    f"journal {journal!r}: export to {table_uri} lost {_ATTEMPTS} commit races"
                    " in a row (is another exporter running?); nothing of this step is in it"
                ) from None
            continue
        except Exception:
            # Unknown outcome: the version tells whether the commit landed.
            if _version(table_uri, app, storage_options) >= stop:
                result.rows[journal] = result.rows.get(journal, 0) + rows.num_rows
                return
            raise
        result.rows[journal] = result.rows.get(journal, 0) + rows.num_rows
        return
    raise ExportError(
        f"journal {journal!r}: export to {table_uri} could not settle in {_ATTEMPTS} attempts;"
        " nothing of this step is in it"
    )


def export_delta(
    client: JournalClient,
    journals: str | Sequence[str],
    table_uri: str,
    *,
    app_id: str = "oncelog",
    storage_options: Mapping[str, str] | None = None,
    parse: bool = True,
    follow: bool = False,
    poll: float = 1.0,
    stop_when: Callable[[ExportResult], bool] | None = None,
) -> ExportResult:
    """Append the committed messages of `journals` not yet exported to the Delta table at
    `table_uri`, exactly once (see the module). Columns: `read_committed_arrow`'s, with the
    documents' fields (`parse=True`) or their text (`parse=False`); a field new to the
    table is added (schema merge). `app_id` names this export (two exports of one journal
    to one table with different ids are independent). `follow`: keep exporting every
    `poll` seconds until `stop_when(result)` is true (or forever; Ctrl-C stops it between
    steps, everything exported so far staying exported)."""
    names = [journals] if isinstance(journals, str) else list(journals)
    if not names:
        raise ValueError("export_delta() needs at least one journal")
    result = ExportResult(table_uri)
    while True:
        for name in names:
            incarnation = client.get(name).incarnation or ""
            _export_journal(client, name, table_uri, app_id_of(app_id, name, incarnation),
                            storage_options, parse, result)
        if not follow or (stop_when is not None and stop_when(result)):
            return result
        time.sleep(poll)


def exported_through(
    table_uri: str, client: JournalClient, journal: str, *, app_id: str = "oncelog",
    storage_options: Mapping[str, str] | None = None,
) -> int:
    """The journal offset through which `journal` has been exported to `table_uri`."""
    incarnation = client.get(journal).incarnation or ""
    return _version(table_uri, app_id_of(app_id, journal, incarnation), storage_options)

