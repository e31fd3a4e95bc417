"""Consumer-group commands: `groups list`, `groups show GROUP`, `groups reset GROUP`."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from oncelog.cli.app import State, cli, pass_state, store_options
from oncelog.cli.journals import require_confirmation
from oncelog.cli.output import Column, notice, print_fields, print_table, write_json

__all__ = ["groups"]

FORMAT = click.Choice(["table", "json"])


def _doc(value: Any) -> Any:
    """A JSON-able form of what the consumer module returns."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _doc(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _doc(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_doc(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


@cli.group()
def groups() -> None:
    """List consumer groups, show their positions, reset them."""


@groups.command("list")
@click.option("--format", "-f", "fmt", type=FORMAT, default="table", show_default=True)
@store_options
@pass_state
def list_groups(state: State, fmt: str) -> None:
    """List the consumer groups with checkpoints in the store."""
    from oncelog.consumer import list_groups as consumer_groups

    names = [_doc(g) for g in consumer_groups(state.client())]
    if fmt == "json":
        write_json(names)
        return
    print_table(["GROUP"], [(n if isinstance(n, str) else n.get("group", n),) for n in names])


@groups.command("show")
@click.argument("group")
@click.option("--format", "-f", "fmt", type=FORMAT, default="table", show_default=True)
@store_options
@pass_state
def show(state: State, group: str, fmt: str) -> None:
    """Show GROUP's checkpoint and, per journal, its position, the head and the lag."""
    from oncelog.consumer import group_status

    doc = _doc(group_status(state.client(), group))
    if fmt == "json":
        write_json(doc)
        return
    rows = doc.pop("journals", []) if isinstance(doc, dict) else []
    if isinstance(doc, dict):
        print_fields([(k, v) for k, v in doc.items() if not isinstance(v, (list, dict))])
    if rows:
        print_table(
            ["JOURNAL", Column("OFFSET", numeric=True), Column("HEAD", numeric=True), Column("LAG", numeric=True)],
            [(r.get("journal"), r.get("offset"), r.get("head"), r.get("lag")) for r in rows],
        )


@groups.command("reset")
@click.argument("group")
@click.option(
    "--to", "to", type=click.Choice(["beginning", "head"]), required=True,
    help="beginning: re-read every journal from offset 0; head: skip to the journals' heads.",
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@store_options
@pass_state
def reset(state: State, group: str, to: str, yes: bool) -> None:
    """Move GROUP's positions to the beginning or the head of its journals (stop its
    consumers first)."""
    from oncelog.consumer import group_status, reset_group

    client = state.client()
    group_status(client, group)  # an unknown group fails before any question
    require_confirmation(f"Reset consumer group {group} to the {to}?", yes, f"reset group {group}")
    reset_group(client, group, to=to)
    notice(f"reset consumer group {group} to the {to}")
