"""Export commands: `export delta` appends journals' committed messages to a Delta table.

Exactly once across reruns, crashes and racing exporters: the progress of each journal is
kept in the Delta table as an application transaction (oncelog.tables.delta).
"""

from __future__ import annotations

import click

from oncelog._extras import needs_extra
from oncelog.cli.app import State, cli, pass_state, store_options
from oncelog.cli.output import notice, print_table, write_json
from oncelog.cli.params import format_option, selector_option

__all__ = ["export"]


@cli.group()
def export() -> None:
    """Export journals' committed messages to table formats, exactly once."""


@export.command("delta")
@click.argument("names", metavar="[NAME]...", nargs=-1)
@click.option("--table", "table_uri", required=True, metavar="URI",
              help="The Delta table (a local path, or s3://... with --table-option).")
@click.option("--selector", "-l", default=None,
              help="Also export the journals matching this selector.")
@click.option("--app-id", default="oncelog", show_default=True,
              help="Names this export in the table's application transactions.")
@click.option("--text", is_flag=True,
              help="Export documents as text in a `message` column instead of their fields.")
@click.option("--table-option", "table_options", multiple=True, metavar="KEY=VALUE",
              help="A storage option of the Delta table (repeatable), e.g. AWS_ENDPOINT_URL=...")
@click.option("--follow", is_flag=True,
              help="Keep exporting new commits until interrupted (Ctrl-C).")
@click.option("--poll", type=float, default=1.0, show_default=True,
              help="Seconds between looks at the journals with --follow.")
@format_option
@store_options
@pass_state
def delta(
    state: State,
    names: tuple[str, ...],
    table_uri: str,
    selector: str | None,
    app_id: str,
    text: bool,
    table_options: tuple[str, ...],
    follow: bool,
    poll: float,
    fmt: str,
) -> None:
    """Append the committed messages of journals not yet exported to a Delta table.

    Each journal's progress is an application transaction of the table: a rerun, a crash
    or a second exporter never duplicates or skips a row. Needs `pip install deltalake`.
    """
    try:  # before any work: a missing deltalake names the command that installs it
        with needs_extra("delta", "oncelog export delta"):
            import deltalake  # noqa: F401
    except ImportError as exc:
        raise click.ClickException(str(exc)) from None
    from oncelog.tables.delta import ExportResult, export_delta

    options: dict[str, str] = {}
    for item in table_options:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--table-option")
        options[key] = value
    client = state.client()
    targets = list(dict.fromkeys(names))
    if selector is not None:
        targets += [s.name for s in client.list(selector_option(selector)) if s.name not in targets]
    if not targets:
        raise click.UsageError("name a journal or give --selector")
    for name in targets:
        client.get(name)  # JournalNotFound names it before anything is written
    seen: dict[str, int] = {}

    def report(result: ExportResult) -> bool:
        for name, rows in result.rows.items():
            if follow and rows != seen.get(name, 0):
                new = rows - seen.get(name, 0)
                notice(f"{name}: {new:,} {'row' if new == 1 else 'rows'} exported (through offset"
                       f" {result.offsets[name][1]:,})")
            seen[name] = rows
        return False

    try:
        result = export_delta(
            client, targets, table_uri, app_id=app_id, storage_options=options or None,
            parse=not text, follow=follow, poll=poll, stop_when=report if follow else None,
        )
    except KeyboardInterrupt:
        notice("interrupted: every row reported above is in the table, exactly once; run "
               "again to go on")
        raise SystemExit(130) from None
    docs = [
        {"journal": name, "rows": result.rows.get(name, 0), "from": result.offsets[name][0],
         "through": result.offsets[name][1]}
        for name in targets
    ]
    if fmt == "json":
        write_json({"table": table_uri, "journals": docs})
        return
    print_table(["JOURNAL", "ROWS", "FROM", "THROUGH"],
                [(d["journal"], f"{d['rows']:,}", d["from"], d["through"]) for d in docs])
