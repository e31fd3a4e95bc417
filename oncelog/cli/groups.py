"""Consumer-group commands: `groups list`, `groups show GROUP` (alias `groups status`),
`groups lag GROUP`, `groups reset GROUP`.

`groups show` prints the lag in bytes and in messages (counted by reading the lag: pass
`--no-messages` to skip that on a group far behind). `groups lag` prints one line per
journal, counting messages only where that is cheap (`--count-up-to`). `groups reset`
moves a group to the beginning, the head, given offsets (`--to JOURNAL=OFFSET,...`) or a
time (`--at`).

They work on the groups' checkpoints (oncelog.consumer), so they run wherever the store is
reachable, whether the group's consumers run or not.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import click

from oncelog.cli.app import State, cli, pass_state, store_options
from oncelog.cli.journals import require_confirmation
from oncelog.cli.output import Column, iso_time, notice, print_fields, print_table, write_json
from oncelog.cli.params import format_option, parse_size, plural

if TYPE_CHECKING:
    from oncelog.consumer import GroupStatus

__all__ = ["groups", "status_doc", "parse_reset_target"]


def status_doc(status: GroupStatus) -> dict[str, Any]:
    """A group's status as a JSON document: per shard, its checkpoint and per-journal lag."""
    return {
        "group": status.group,
        "shards": status.shards,
        "lag": status.lag,
        "messages": status.messages,
        "members": [
            {
                "shard": m.shard,
                "checkpoint": m.checkpoint,
                "created": None if m.created is None else iso_time(m.created.timestamp()),
                "reason": m.reason,
                "lag": m.lag,
                "messages": m.messages,
                "journals": [
                    {
                        "journal": j.journal,
                        "offset": j.offset,
                        "head": j.head,
                        "lag": j.lag,
                        "messages": j.messages,
                    }
                    for j in m.journals
                ],
            }
            for m in status.members
        ],
    }


@cli.group()
def groups() -> None:
    """List consumer groups, show where they stand and how far behind, reset them."""


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
@click.option(
    "--messages/--no-messages",
    default=True,
    help="Count the messages behind (reads the lag's bytes; --no-messages skips it).",
)
@format_option
@store_options
@pass_state
def show(state: State, group: str, messages: bool, fmt: str) -> None:
    """Show GROUP's latest checkpoint and, per journal, its offset, the head and the lag
    in bytes and messages."""
    from oncelog.consumer import group_status

    doc = status_doc(group_status(state.client(), group, count=messages))
    if fmt == "json":
        write_json(doc)
        return
    lag = plural(doc["lag"], "byte")
    if doc["messages"] is not None:
        lag += f", {plural(doc['messages'], 'message')}"
    print_fields([("group", doc["group"]), ("shards", doc["shards"]), ("lag", lag)])
    print_table(
        [
            Column("SHARD", numeric=True),
            Column("CHECKPOINT", numeric=True),
            "CREATED",
            "JOURNAL",
            Column("OFFSET", numeric=True),
            Column("HEAD", numeric=True),
            Column("LAG", numeric=True),
            Column("MESSAGES", numeric=True),
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
                j["messages"],
            )
            for m in doc["members"]
            for j in m["journals"]
            or [{"journal": None, "offset": None, "head": None, "lag": None, "messages": None}]
        ],
    )


groups.add_command(
    click.Command(
        "status",
        callback=show.callback,
        params=show.params,
        help="Same as `groups show GROUP` (an alias): "
        + " ".join((show.help or "").split()),
        short_help="Same as `groups show`.",
    )
)


def _size_or_zero(ctx: click.Context, param: click.Parameter, value: str) -> int:
    """A size such as 64MiB, or 0."""
    if value.strip() == "0":
        return 0
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


@groups.command("lag")
@click.argument("group")
@click.option(
    "--count-up-to",
    callback=_size_or_zero,
    default="64MiB",
    show_default=True,
    help="Count the messages behind in journals at most this many bytes behind (reads "
    "those bytes); 0 counts none (bytes only).",
    metavar="SIZE",
)
@format_option
@store_options
@pass_state
def lag(state: State, group: str, count_up_to: int, fmt: str) -> None:
    """Show how far GROUP is behind, per journal: the offset of its latest checkpoint, the
    journal's write head, the lag in bytes and, where counting is cheap, in messages
    (ACKs excluded; '-' where not counted)."""
    from oncelog.consumer import group_status
    from oncelog.consumer.groups import count_messages

    client = state.client()
    status = group_status(client, group, count=False)
    rows: list[dict[str, Any]] = []
    for member in status.members:
        for j in member.journals:
            messages = None
            if j.lag is not None and j.lag <= count_up_to:
                assert j.head is not None
                messages = count_messages(client, j.journal, j.offset, j.head)
            rows.append(
                {
                    "journal": j.journal,
                    "shard": member.shard,
                    "offset": j.offset,
                    "head": j.head,
                    "lag": j.lag,
                    "messages": messages,
                }
            )
    if fmt == "json":
        write_json(rows)
        return
    sharded = any(r["shard"] is not None for r in rows)
    print_table(
        [
            "JOURNAL",
            *([Column("SHARD", numeric=True)] if sharded else []),
            Column("OFFSET", numeric=True),
            Column("HEAD", numeric=True),
            Column("LAG", numeric=True),
            Column("MESSAGES", numeric=True),
        ],
        [
            (
                r["journal"],
                *((r["shard"],) if sharded else ()),
                r["offset"],
                "-" if r["head"] is None else r["head"],
                "-" if r["lag"] is None else r["lag"],
                "-" if r["messages"] is None else r["messages"],
            )
            for r in rows
        ],
    )


def parse_reset_target(to: str | None, at: str | None) -> Any:
    """The `reset_group` target of `--to beginning|head|JOURNAL=OFFSET,...` or `--at TIME`."""
    if (to is None) == (at is None):
        raise click.UsageError("give exactly one of --to and --at")
    if at is not None:
        try:
            when = datetime.fromisoformat(at.replace("Z", "+00:00"))
        except ValueError:
            raise click.BadParameter(
                f"not an ISO 8601 date-time: {at!r}", param_hint="--at"
            ) from None
        if when.tzinfo is None:
            raise click.BadParameter(
                f"{at!r} has no time zone (add Z or +00:00)", param_hint="--at"
            )
        return when
    assert to is not None
    if to in ("beginning", "head"):
        return to
    offsets: dict[str, int] = {}
    for item in to.split(","):
        journal, sep, offset = item.strip().rpartition("=")
        if not sep or not journal or not offset.isdigit():
            raise click.BadParameter(
                f"expected beginning, head or JOURNAL=OFFSET,...: {to!r}", param_hint="--to"
            )
        offsets[journal] = int(offset)
    return offsets


def _reset(client: Any, group: str, target: Any, keep_state: bool, *, dry_run: bool) -> Any:
    """`reset_group`, with an offset inside a message (or trimmed) refused as a CLI error
    that says which `--to` values would do (the library checks it before writing)."""
    from oncelog.consumer import NotAMessageBoundary, reset_group

    try:
        return reset_group(client, group, to=target, keep_state=keep_state, dry_run=dry_run)
    except NotAMessageBoundary as exc:
        ok = [b for b in (exc.before, exc.after) if b is not None]
        hint = " or ".join(f"--to {exc.journal}={b}" for b in ok)
        raise click.ClickException(f"{exc} (use {hint})") from None


@groups.command("reset")
@click.argument("group")
@click.option(
    "--to",
    "to",
    metavar="beginning|head|JOURNAL=OFFSET,...",
    help="beginning: re-read the group's journals from their first available offset (0"
    " unless trimmed); head: skip what is in them now; JOURNAL=OFFSET,...: move those"
    " journals to those offsets, each a message boundary (the others stay).",
)
@click.option(
    "--at",
    metavar="ISO-DATETIME",
    help="Move each journal to its first message whose UUID time is at or after this time"
    " (e.g. 2024-05-01T12:00:00Z): skips fragments persisted a minute or more before it"
    " unread, then scans.",
)
@click.option(
    "--keep-state", is_flag=True, help="Keep the consumers' state instead of starting afresh."
)
@click.option("--dry-run", is_flag=True, help="Show the new offsets; write nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@store_options
@pass_state
def reset(
    state: State,
    group: str,
    to: str | None,
    at: str | None,
    keep_state: bool,
    dry_run: bool,
    yes: bool,
) -> None:
    """Move GROUP to new offsets with a new checkpoint per shard.

    Running consumers of the group are fenced out by it: restart them afterwards.
    """
    from oncelog.consumer import group_status

    target = parse_reset_target(to, at)
    label = to if to is not None else at
    client = state.client()
    status = group_status(client, group)  # an unknown group fails before any question
    before = {(m.shard, j.journal): j.offset for m in status.members for j in m.journals}
    if dry_run:
        planned = _reset(client, group, target, keep_state, dry_run=True)
        print_table(
            [Column("SHARD", numeric=True), "JOURNAL", Column("OFFSET", numeric=True),
             Column("NEW OFFSET", numeric=True)],
            [
                (cp.shard, journal, before.get((cp.shard, journal)), offset)
                for cp in planned
                for journal, offset in sorted(cp.offsets.items())
            ],
        )
        notice(f"dry run: consumer group {group} not reset")
        return
    require_confirmation(
        f"Reset consumer group {group} ({plural(status.lag, 'byte')} behind) to {label}?",
        yes,
        f"reset group {group}",
    )
    written = _reset(client, group, target, keep_state, dry_run=False)
    seqs = ", ".join(str(cp.seq) for cp in written)
    where = f"the {label}" if to in ("beginning", "head") else label
    notice(f"reset consumer group {group} to {where}: checkpoint {seqs}")
