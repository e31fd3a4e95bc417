"""Consumer-group operations: list groups, show position and lag, reset, prune, delete.

They work on the checkpoints alone, so they run anywhere the store is
reachable. A reset claims a new checkpoint above the latest, which fences out running
instances (restart them afterwards); pruning keeps the newest checkpoints, which is all
fencing needs; deleting a group leaves a tombstone that fences out its zombies, but
needs its consumers stopped (see `delete_group`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

from oncelog.consumer._trimmed import first_available_offset
from oncelog.consumer.checkpoint import (
    Checkpoint,
    GroupInfo,
    delete_group_info,
    list_group_names,
    read_group_info,
)
from oncelog.consumer.errors import ConsumerError, GroupNotFound, NotAMessageBoundary
from oncelog.consumer.shards import shard_of
from oncelog.journal.errors import JournalNotFound
from oncelog.labels import LabelSelector
from oncelog.message import Flags

if TYPE_CHECKING:
    from oncelog.journal import JournalClient

__all__ = [
    "JournalLag",
    "ShardStatus",
    "GroupStatus",
    "GroupNotFound",
    "NotAMessageBoundary",
    "ResetTarget",
    "message_at",
    "offset_at_time",
    "count_messages",
    "list_groups",
    "group_status",
    "reset_group",
    "prune_checkpoints",
    "delete_group",
]


ResetTarget = Literal["beginning", "head"] | Mapping[str, int] | datetime
"""Where `reset_group` moves a group: "beginning", "head", `{journal: offset}`, or a time."""


@dataclass(frozen=True, slots=True)
class JournalLag:
    """How far a group has read one journal: `lag = head - offset` bytes (None if the
    journal no longer exists), and `messages` behind (None unless counted: see
    `group_status(count=True)`)."""

    journal: str
    offset: int
    head: int | None
    lag: int | None
    messages: int | None = None


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

    @property
    def messages(self) -> int | None:
        """Total messages behind (None if not counted)."""
        total = 0
        for j in self.journals:
            if j.lag is not None:
                if j.messages is None:
                    return None
                total += j.messages
        return total


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

    @property
    def messages(self) -> int | None:
        """Total messages behind, over all shards (None if not counted)."""
        total = 0
        for m in self.members:
            n = m.messages
            if n is None:
                return None
            total += n
        return total


def _info(client: "JournalClient", group: str) -> GroupInfo:
    info = read_group_info(client, group)
    if info is None:
        raise GroupNotFound(f"consumer group {group!r} does not exist in store {client.location}")
    return info


def list_groups(client: "JournalClient") -> list[str]:
    """Names of the consumer groups in the store, sorted."""
    return list_group_names(client)


def count_messages(client: "JournalClient", journal: str, begin: int, end: int) -> int:
    """The messages (acknowledgements excluded) in `journal`'s bytes [begin, end), counted
    by reading them: O(end - begin) bytes read. Uncommitted, rolled-back and duplicate
    messages count too: it is what a consumer at `begin` has still to read."""
    from oncelog.reading import read_uncommitted

    if end <= begin:
        return 0
    ack = Flags.ACK_TXN
    return sum(1 for env in read_uncommitted(client, journal, begin, end=end) if env.flags != ack)


def group_status(client: "JournalClient", group: str, *, count: bool = False) -> GroupStatus:
    """Each journal's committed read offset, write head and lag, from the latest checkpoints.

    With `count=True` the messages behind are counted too (`count_messages`: reads every
    byte of the lag, so it costs as much as consuming it without handling)."""
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
            messages = None
            if count and head is not None:
                messages = count_messages(client, journal, offset, head)
            lags.append(JournalLag(
                journal, offset, head, None if head is None else head - offset, messages
            ))
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


def offset_at_time(
    client: "JournalClient",
    journal: str,
    when: datetime,
    *,
    skew: timedelta = timedelta(minutes=1),
) -> int:
    """The offset of the first message of `journal` whose UUID time is >= `when` (an aware
    datetime); the head if there is none.

    Cost: one listing of the journal's fragments, then a scan from the first fragment
    that may hold such a message: fragments persisted (mod time) before `when - skew` are
    skipped unread, assuming producers' clocks run at most `skew` ahead of the store's.
    A fragment without a mod time, and every one after the first candidate, is read, so
    the scan reads the bytes written since about `when - skew`, up to the first match.
    Messages without a time (nil UUIDs) and acknowledgements are stepped over.
    """
    from oncelog.reading import clock_of_bound, read_uncommitted

    if not isinstance(when, datetime) or when.tzinfo is None:
        raise ValueError(f"when must be a timezone-aware datetime, not {when!r}")
    low = clock_of_bound(when)
    threshold = when.timestamp() - skew.total_seconds()
    head = client.head(journal)
    start = head
    for frag in client.fragments(journal):
        if frag.mod_time is None or frag.mod_time >= threshold:
            # A compacted fragment may begin before the first available offset (a trim).
            start = max(frag.begin, client.first_offset(journal))
            break
    ack = Flags.ACK_TXN
    for env in read_uncommitted(client, journal, start, end=head):
        _producer, clock, flags = env.ids
        if clock and flags != ack and clock >= low:
            return env.begin
    return head


def message_at(client: "JournalClient", journal: str, offset: int) -> tuple[int, int] | None:
    """The `[begin, end)` of the message of `journal` holding `offset` strictly inside it,
    or None if `offset` is a message boundary (a message's begin or end, the head, the
    first available offset, or bytes between messages that decoding steps over).

    Exact for every framing: the fragment holding `offset` is decoded from its begin
    (appends, and so fragments, hold whole frames), up to `offset`. Cost: a listing of the
    journal's fragments, then at most that fragment's bytes read. An offset below the
    first available offset (trimmed) gives `(-1, first)`."""
    from oncelog.reading import read_uncommitted

    head = client.head(journal)
    if offset >= head:
        return None
    first = first_available_offset(client, journal)
    if offset < first:
        return (-1, first)
    frag = None
    for f in client.fragments(journal):
        if f.begin <= offset < f.end:
            frag = f
            break
    # A compacted fragment may begin before a trim point, which is a message boundary.
    start = max(frag.begin, first) if frag is not None else offset
    if start == offset:
        return None
    envelopes = read_uncommitted(client, journal, start, end=frag.end if frag else head, lazy=True)
    try:
        for env in envelopes:
            if env.end <= offset:
                continue
            if env.begin < offset:
                return (env.begin, env.end)
            return None
    finally:
        envelopes.close()
    return None


def _check_boundary(client: "JournalClient", group: str, journal: str, offset: int) -> None:
    """NotAMessageBoundary unless `offset` is a message boundary of `journal` at or above
    its first available offset (see `message_at`)."""
    inside = message_at(client, journal, offset)
    if inside is None:
        return
    begin, end = inside
    if begin < 0:
        raise NotAMessageBoundary(group, journal, offset, None, end, trimmed=True)
    raise NotAMessageBoundary(group, journal, offset, begin, end)


def _target_offsets(
    client: "JournalClient",
    group: str,
    names: Sequence[str],
    to: ResetTarget,
    current: Mapping[str, int],
) -> dict[str, int]:
    if isinstance(to, datetime):
        return {j: offset_at_time(client, j, to) for j in names}
    if isinstance(to, Mapping):
        out = {}
        for j in names:
            if j not in to:
                out[j] = current[j]
                continue
            offset, head = to[j], client.head(j)
            if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= head:
                raise ValueError(
                    f"reset_group: offset of journal {j!r} must be an int in [0, {head}] (its"
                    f" head), not {offset!r}"
                )
            if offset == 0:  # the first available offset, recorded as it is
                offset = first_available_offset(client, j)
            else:
                _check_boundary(client, group, j, offset)
            out[j] = offset
        return out
    if to == "beginning":
        return {j: first_available_offset(client, j) for j in names}
    return {j: client.head(j) for j in names}


def _describe(to: ResetTarget) -> str:
    if isinstance(to, datetime):
        return f"reset to {to.isoformat()}"
    if isinstance(to, Mapping):
        return "reset to " + ",".join(f"{j}={o}" for j, o in sorted(to.items()))
    return f"reset to {to}"


def reset_group(
    client: "JournalClient",
    group: str,
    to: ResetTarget = "beginning",
    *,
    keep_state: bool = False,
    journals: LabelSelector | str | Sequence[str] | None = None,
    dry_run: bool = False,
) -> list[Checkpoint]:
    """Move the group with a new checkpoint per shard; returns them. Running instances
    are fenced out by it.

    `to`: "beginning" (each journal's first available offset: 0 unless trimmed), "head"
    (skip what is in the journals now), a mapping
    `{journal: offset}` (those journals only; the others keep their offsets and producer
    states; each offset must be a message boundary at or above the journal's first
    available offset, e.g. one `group_status` showed, or 0 for the first available: else
    NotAMessageBoundary naming the nearest boundaries, before anything is written), or an
    aware datetime (per journal, the first message whose UUID time is >= it:
    `offset_at_time`, which documents the cost). Producer states of moved journals are
    dropped, so a transaction that began before the new offset is not delivered.

    The journals are those of the latest checkpoint, plus `journals` (a selector or
    names), plus a mapping's keys. The state restarts from the consumers' initial state
    unless `keep_state`. The latest checkpoint's ACK intents are carried over, so its
    outputs still commit. Each new checkpoint is numbered latest + 1 and claimed
    (`CheckpointStore.claim`): if another instance committed meanwhile (taking that
    number, or going past it and pruning it) the reset raises ConsumerError rather than
    silently not taking effect. With `dry_run`, nothing is written: the checkpoints that
    would be claimed are returned.
    """
    if isinstance(to, str):
        if to not in ("beginning", "head"):
            raise ValueError(
                f"reset_group: to must be 'beginning', 'head', a {{journal: offset}} mapping"
                f" or a datetime, not {to!r}"
            )
    elif isinstance(to, datetime):
        if to.tzinfo is None:
            raise ValueError(f"reset_group: the datetime must be timezone-aware: {to!r}")
    elif not isinstance(to, Mapping):
        raise ValueError(f"reset_group: cannot reset to {to!r}")
    info = _info(client, group)
    extra: list[str] = []
    if isinstance(journals, (str, LabelSelector)):
        extra = [spec.name for spec in client.list(journals)]
    elif journals is not None:
        extra = list(journals)
    if isinstance(to, Mapping):
        extra.extend(to)
    written = []
    for store in info.stores(client):
        latest, floor = store.latest_and_floor()
        base = latest or Checkpoint(group, floor, shard=store.shard, shards=store.shards)
        names = set(base.offsets)
        names.update(
            j for j in extra if store.shard is None or shard_of(j, info.shards) == store.shard
        )
        current = {j: base.offsets.get(j, 0) for j in names}
        offsets = _target_offsets(client, group, sorted(names), to, current)
        moved = {j for j in names if j not in base.offsets or offsets[j] != base.offsets[j]}
        if isinstance(to, Mapping):
            producers = [p for p in base.producers if p.journal not in moved]
        else:
            producers = []
        cp = base.successor(
            offsets=offsets,
            producers=producers,
            state=base.state if keep_state else None,
            has_state=keep_state and base.has_state,
            reason=_describe(to),
            writer=None,
        )
        if not dry_run:
            why = store.claim(cp)
            if why is not None:
                raise ConsumerError(
                    f"reset of consumer group {group!r} raced with a commit: {why}; stop its"
                    " consumers and retry"
                )
        written.append(cp)
    return written


def prune_checkpoints(client: "JournalClient", group: str, keep: int = 10) -> int:
    """Delete all but the `keep` newest checkpoints of each shard; returns how many went.

    Safe while consumers run, and with any number of paused (zombie) instances: commits
    and recoveries are claimed against the newest checkpoint, which is never pruned."""
    info = _info(client, group)
    return sum(len(store.prune(keep)) for store in info.stores(client))


def delete_group(client: "JournalClient", group: str) -> int:
    """Delete the group's checkpoints and descriptor; returns the checkpoints deleted.

    Stop the group's consumers first. Each checkpoint directory keeps a tombstone
    (`CheckpointStore.delete_all`): an instance that was paused (a zombie) and writes its
    next checkpoint after the deletion is fenced out by it, and a consumer started later
    begins the group afresh above it. An instance that is running and commits during the
    deletion makes it fail (ConsumerError, nothing deleted) when caught in the act; one
    that recovers from the deletion's own fence checkpoint just starts afresh, but it
    may leave checkpoints without a descriptor until its next start.
    """
    info = _info(client, group)
    count = sum(len(store.delete_all()) for store in info.stores(client))
    delete_group_info(client, group)
    return count
