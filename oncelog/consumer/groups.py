"""Consumer-group operations: list groups, show position and lag, reset, prune, delete.

They work on the checkpoints alone, so they run anywhere the store is
reachable, while the group's consumers run or not. A reset writes a new
checkpoint, which fences out running instances (restart them afterwards).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from oncelog.consumer.checkpoint import (
    Checkpoint,
    ConsumerError,
    GroupInfo,
    delete_group_info,
    list_group_names,
    read_group_info,
)
from oncelog.consumer.shards import shard_of
from oncelog.journal.errors import JournalNotFound
from oncelog.labels import LabelSelector

if TYPE_CHECKING:
    from oncelog.journal import JournalClient

__all__ = [
    "JournalLag",
    "ShardStatus",
    "GroupStatus",
    "GroupNotFound",
    "list_groups",
    "group_status",
    "reset_group",
    "prune_checkpoints",
    "delete_group",
]


class GroupNotFound(ConsumerError, LookupError):
    """No consumer of the group ever started in this store."""


@dataclass(frozen=True, slots=True)
class JournalLag:
    """How far a group has read one journal: `lag = head - offset` bytes (None if the
    journal no longer exists)."""

    journal: str
    offset: int
    head: int | None
    lag: int | None


@dataclass(frozen=True, slots=True)
class ShardStatus:
    """The latest checkpoint of a group (or of one of its shards) and its lag per journal."""

    shard: int | None
    checkpoint: int
    created: datetime | None
    reason: str | None
    journals: list[JournalLag]

    @property
    def lag(self) -> int:
        """Total bytes behind, over the journals that exist."""
        return sum(j.lag for j in self.journals if j.lag is not None)


@dataclass(frozen=True, slots=True)
class GroupStatus:
    """Where a consumer group stands: one ShardStatus per shard (one if unsharded)."""

    group: str
    shards: int
    members: list[ShardStatus]

    @property
    def lag(self) -> int:
        """Total bytes behind, over all shards."""
        return sum(m.lag for m in self.members)


def _info(client: "JournalClient", group: str) -> GroupInfo:
    info = read_group_info(client, group)
    if info is None:
        raise GroupNotFound(f"consumer group {group!r} does not exist in {client!r}")
    return info


def list_groups(client: "JournalClient") -> list[str]:
    """Names of the consumer groups in the store, sorted."""
    return list_group_names(client)


def group_status(client: "JournalClient", group: str) -> GroupStatus:
    """Each journal's committed read offset, write head and lag, from the latest checkpoints."""
    info = _info(client, group)
    members = []
    for store in info.stores(client):
        cp = store.latest()
        lags = []
        for journal, offset in sorted((cp.offsets if cp else {}).items()):
            try:
                head: int | None = client.head(journal)
            except JournalNotFound:
                head = None
            lags.append(JournalLag(journal, offset, head, None if head is None else head - offset))
        members.append(
            ShardStatus(
                store.shard,
                cp.seq if cp else 0,
                cp.created if cp else None,
                cp.reason if cp else None,
                lags,
            )
        )
    return GroupStatus(group, info.shards, members)


def reset_group(
    client: "JournalClient",
    group: str,
    to: Literal["beginning", "head"] = "beginning",
    *,
    keep_state: bool = False,
    journals: LabelSelector | str | Sequence[str] | None = None,
) -> list[Checkpoint]:
    """Move the group to the beginning or the head of its journals with a new checkpoint
    per shard; returns them. Running instances are fenced out by it.

    The journals are those of the latest checkpoint, plus `journals` (a selector or
    names). The state restarts from the consumers' initial state unless `keep_state`.
    The latest checkpoint's ACK intents are carried over, so its outputs still commit.
    """
    if to not in ("beginning", "head"):
        raise ValueError(f"reset_group: to must be 'beginning' or 'head', not {to!r}")
    info = _info(client, group)
    extra: list[str] = []
    if isinstance(journals, (str, LabelSelector)):
        extra = [spec.name for spec in client.list(journals)]
    elif journals is not None:
        extra = list(journals)
    written = []
    for store in info.stores(client):
        latest = store.latest()
        base = latest or Checkpoint(group, 0, shard=store.shard, shards=store.shards)
        names = set(base.offsets)
        names.update(
            j for j in extra if store.shard is None or shard_of(j, info.shards) == store.shard
        )
        offsets = {j: 0 if to == "beginning" else client.head(j) for j in sorted(names)}
        cp = base.successor(
            offsets=offsets,
            producers=[],
            state=base.state if keep_state else None,
            has_state=keep_state and base.has_state,
            reason=f"reset to {to}",
            writer=None,
        )
        if not store.write(cp):
            raise ConsumerError(
                f"reset of consumer group {group!r} raced with a commit at {store.path(cp.seq)}:"
                " stop its consumers and retry"
            )
        written.append(cp)
    return written


def prune_checkpoints(client: "JournalClient", group: str, keep: int = 10) -> int:
    """Delete all but the `keep` newest checkpoints of each shard; returns how many went."""
    info = _info(client, group)
    return sum(len(store.prune(keep)) for store in info.stores(client))


def delete_group(client: "JournalClient", group: str) -> int:
    """Delete the group's checkpoints and descriptor (stop its consumers first: a running
    instance would not be fenced); returns the checkpoints deleted."""
    info = _info(client, group)
    count = sum(len(store.delete_all()) for store in info.stores(client))
    delete_group_info(client, group)
    return count
