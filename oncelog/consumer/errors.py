"""Errors of consumers, checkpoints and consumer groups; every one derives from
`ConsumerError`, an `oncelog.OncelogError`.

The modules of `oncelog.consumer` re-export the ones they raise (`oncelog.consumer` exports
them all). This module imports nothing else of the consumer package, so importing it
never starts an import cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oncelog import errors
from oncelog.errors import OncelogError

if TYPE_CHECKING:
    from oncelog.consumer._trimmed import TrimmedJournal

__all__ = [
    "ConsumerError",
    "CheckpointError",
    "FencedOut",
    "InvalidGroupName",
    "GroupNotFound",
    "NotAMessageBoundary",
    "CheckpointTrimmed",
    "StateObjectMissing",
]


class ConsumerError(OncelogError, RuntimeError):
    """A consumer or consumer-group operation cannot go on (the message says why)."""


class CheckpointError(ConsumerError):
    """A checkpoint, group descriptor or state object is unreadable or corrupt; the message
    names the object (its storage path) and what is wrong."""


class FencedOut(ConsumerError, errors.FencedOut):
    """Another instance of the group committed first: this one must stop publishing.

    Also an `oncelog.errors.FencedOut`, the error of every fenced-out writer."""


class InvalidGroupName(ConsumerError, ValueError):
    """A consumer group name is not one path component of 1 to 128 letters, digits and
    `-_+.=%` not starting with `.`; checked before any storage call. The message names the
    value and the rule."""


class GroupNotFound(ConsumerError, LookupError):
    """No consumer of the group ever started in this store."""


class NotAMessageBoundary(ConsumerError, ValueError):
    """`reset_group` was given an offset inside a message (a consumer started there would
    fail on the tail of a frame at every start), or below the journal's first available
    offset. Nothing was written. `before` and `after` are the nearest message boundaries
    around `offset` (the begin and end of the message holding it; for a trimmed offset,
    None and the first available offset)."""

    def __init__(
        self, group: str, journal: str, offset: int, before: int | None, after: int,
        *, trimmed: bool = False,
    ) -> None:
        self.group = group
        self.journal = journal
        self.offset = offset
        self.before = before
        self.after = after
        if trimmed:
            why = (
                f"is before its first available offset {after} (the data before was"
                f" trimmed): the nearest message boundary is {after}"
            )
        else:
            why = (
                f"is inside a message, not at its start: the nearest message boundaries are"
                f" {before} (before) and {after} (after)"
            )
        super().__init__(
            f"cannot reset consumer group {group!r}: offset {offset} of journal {journal!r}"
            f" {why}; nothing was written"
        )


class CheckpointTrimmed(ConsumerError):
    """A consumer group's checkpoint needs bytes a journal no longer holds (retention or a
    trim deleted them): with `on_trimmed="error"`, recovery stops here, writing nothing.
    `journals` says, per journal, the checkpoint's offset and the first available one."""

    def __init__(
        self, group: str, shard: int | None, checkpoint: str, journals: list[TrimmedJournal]
    ) -> None:
        self.group = group
        self.shard = shard
        self.checkpoint = checkpoint
        self.journals = journals
        parts = []
        for t in journals:
            what = (
                f"journal {t.journal!r}: checkpoint offset {t.offset}, first available"
                f" offset {t.first}"
            )
            if t.skipped:
                what += f" ({t.skipped} unread bytes were trimmed)"
            if t.pending:
                what += (
                    "; pending transaction(s) of producer(s) "
                    + ", ".join(f"{p.producer.hex()} (since offset {p.begin})" for p in t.pending)
                    + " began before it"
                )
            parts.append(what)
        target = ",".join(f"{t.journal}={max(t.offset, t.first)}" for t in journals)
        super().__init__(
            f"consumer group {group!r}"
            + ("" if shard is None else f" shard {shard}")
            + f": checkpoint {checkpoint} needs data that was trimmed from its journals: "
            + "; ".join(parts)
            + f". To go on from the first available offsets, run `oncelog groups reset {group}"
            f" --to {target}` (the producer states of those journals are dropped), or start"
            " the consumer with on_trimmed='skip' (keeps them, logs what is skipped)"
        )


class StateObjectMissing(CheckpointError):
    """A state object a checkpoint references is gone (pruned after the checkpoint was read,
    if a newer checkpoint exists; else the group's state is damaged)."""
