"""Consumer-group commands: `groups list`, `groups show GROUP`, `groups reset GROUP`.

They work on the groups' checkpoints (oncelog.consumer), so they run wherever the store is
reachable, whether the group's consumers run or not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from oncelog.cli.app import State, cli, pass_state, store_options
from oncelog.cli.journals import require_confirmation
from oncelog.cli.output import Column, iso_time, notice, print_fields, print_table, write_json
from oncelog.cli.params import format_option

if TYPE_CHECKING:
    from oncelog.consumer import GroupStatus

__all__ = ["groups", "status_doc"]



def status_doc(status: GroupStatus) -> dict[str, Any]:
    """A group's status as a JSON document: per shard, its checkpoint and per-journal lag."""
    return {
        "group": status.group,
        "shards": status.shards,
        "lag": status.lag,
        "members": [
            {
                "shard": m.shard,
                "checkpoint": m.checkpoint,
                "created": None if m.created is None else iso_time(m.created.timestamp()),
                "reason": m.reason,
                "lag": m.lag,
                "journals": [
                    {"journal": j.journal, "offset": j.offset, "head": j.head, "lag": j.lag}
                    for j in m.journals
                ],
            }
            for m in status.members
        ],
    }


@cli.group()
def groups() -> None:
    """List consumer groups, show where they stand, reset them."""


@groups.command("list")
@format_option
@store_options
@pass_state
def list_groups(state: State, fmt: str) -> None:
    """List the consumer groups of the store."""
    from oncelog.consumer import list_groups as group_names

    names = group_names(state.client())
    if fmt == "json":
        write_json(names)
    else:
        print_table(["GROUP"], [(name,) for name in names])


@groups.command("show")
@click.argument("group")
@format_option
@store_options
@pass_state
def show(state: State, group: str, fmt: str) -> None:
    """Show GROUP's latest checkpoint and, per journal, its offset, the head and the lag."""
    from oncelog.consumer import group_status

    doc = status_doc(group_status(state.client(), group))
    if fmt == "json":
        write_json(doc)
        return
    print_fields(
        [("group", doc["group"]), ("shards", doc["shards"]), ("lag", f"{doc['lag']} bytes")]
    )
    print_table(
        [
            Column("SHARD", numeric=True),
            Column("CHECKPOINT", numeric=True),
            "CREATED",
            "JOURNAL",
            Column("OFFSET", numeric=True),
            Column("HEAD", numeric=True),
            Column("LAG", numeric=True),
        ],
        [
            (
                m["shard"],
                m["checkpoint"],
                m["created"],
                j["journal"],
                j["offset"],
                j["head"],
                j["lag"],
            )
            for m in doc["members"]
            for j in m["journals"] or [{"journal": None, "offset": None, "head": None, "lag": None}]
        ],
    )


@groups.command("reset")
@click.argument("group")
@click.option(
    "--to",
    "to",
    type=click.Choice(["beginning", "head"]),
    required=True,
    help="beginning: re-read the group's journals from offset 0; head: skip what is in them now.",
)
@click.option(
    "--keep-state", is_flag=True, help="Keep the consumers' state instead of starting afresh."
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@store_options
@pass_state
def reset(state: State, group: str, to: str, keep_state: bool, yes: bool) -> None:
    """Move GROUP to the beginning or the head of its journals with a new checkpoint.

    Running consumers of the group are fenced out by it: restart them afterwards.
    """
    from oncelog.consumer import group_status, reset_group

    client = state.client()
    status = group_status(client, group)  # an unknown group fails before any question
    require_confirmation(
        f"Reset consumer group {group} ({status.lag} bytes behind) to the {to}?",
        yes,
        f"reset group {group}",
    )
    written = reset_group(client, group, to=to, keep_state=keep_state)  # type: ignore[arg-type]
    seqs = ", ".join(str(cp.seq) for cp in written)
    notice(f"reset consumer group {group} to the {to}: checkpoint {seqs}")
