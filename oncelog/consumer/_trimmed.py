"""Checkpoints older than what a journal still holds: retention or `JournalClient.trim`
deleted the bytes a group was to read next (or the start of a transaction it holds
pending). A consumer's `on_trimmed` policy says what recovery does then:

- `"error"` (the default): `CheckpointTrimmed`, naming the group, the journal, the
  checkpoint's offset and the first available one, and the command that goes on;
- `"skip"`: carry on from the first available offset, logging (a warning) what was
  skipped, and recording it in the recovery checkpoint, so the skip happens once.

A producer's pending transaction whose first message was trimmed cannot be delivered
whole: with "skip" its remaining messages are delivered if it commits (its pending span
restarts at the first available offset), and the warning says so.

The first available offset is `JournalClient.first_offset`.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from oncelog.consumer.checkpoint import Checkpoint
from oncelog.consumer.errors import CheckpointTrimmed
from oncelog.journal.errors import JournalNotFound
from oncelog.sequencer import ProducerState

if TYPE_CHECKING:
    from oncelog.journal import JournalClient

__all__ = [
    "ON_TRIMMED",
    "OnTrimmed",
    "CheckpointTrimmed",
    "TrimmedJournal",
    "first_available_offset",
    "find_trimmed",
    "skip_trimmed",
]

log = logging.getLogger("oncelog.consumer.core")

OnTrimmed = Literal["error", "skip"]
ON_TRIMMED: tuple[OnTrimmed, ...] = ("error", "skip")


def first_available_offset(client: "JournalClient", journal: str) -> int:
    """The lowest offset of `journal` still available (`JournalClient.first_offset`: 0
    unless trimmed or retained away)."""
    return client.first_offset(journal)


@dataclass(frozen=True, slots=True)
class TrimmedJournal:
    """One journal of a checkpoint whose needed bytes are (partly) gone."""

    journal: str
    offset: int
    """The checkpoint's read offset in the journal."""
    first: int
    """The journal's first available offset."""
    pending: list[ProducerState] = field(default_factory=list)
    """Producer states whose pending transaction began before `first`."""

    @property
    def skipped(self) -> int:
        """Unread bytes that are gone (0 if only pending transactions lost their start)."""
        return max(self.first - self.offset, 0)


def find_trimmed(
    client: "JournalClient", cp: Checkpoint, journals: Collection[str] | None = None
) -> list[TrimmedJournal]:
    """The journals of `cp` (those in `journals`, if given: the ones being read) whose
    needed bytes are gone: its read offset, or the begin of a producer's pending
    transaction, is below the first available offset.

    Cost: one head lookup per journal; a listing of the fragments only for a journal the
    checkpoint has not read to its head or that has a pending transaction. A journal that
    no longer exists is left to the reader (it reports it)."""
    pending: dict[str, list[ProducerState]] = {}
    for p in cp.producers:
        if p.begin != -1:
            pending.setdefault(p.journal, []).append(p)
    out = []
    for journal in sorted(set(cp.offsets) | set(pending)):
        if journals is not None and journal not in journals:
            continue
        offset = cp.offsets.get(journal, 0)
        try:
            if offset >= client.head(journal) and journal not in pending:
                continue
            first = first_available_offset(client, journal)
        except JournalNotFound:
            continue
        lost = [p for p in pending.get(journal, []) if p.begin < first]
        if offset < first or lost:
            out.append(TrimmedJournal(journal, offset, first, lost))
    return out


def skip_trimmed(
    group: str, cp: Checkpoint, trimmed: list[TrimmedJournal]
) -> tuple[dict[str, int], list[ProducerState], str]:
    """`cp`'s offsets and producer states moved past what `trimmed` says is gone (each
    read offset to at least the first available offset; each pending span that began
    before it restarted there), a reason for the recovery checkpoint, and a warning
    logged per journal saying what was skipped."""
    offsets = dict(cp.offsets)
    firsts = {t.journal: t for t in trimmed}
    producers = []
    for p in cp.producers:
        t = firsts.get(p.journal)
        if t is not None and p.begin != -1 and p.begin < t.first:
            p = ProducerState(p.journal, p.producer, p.last_ack, t.first)
        producers.append(p)
    for t in trimmed:
        if t.journal in offsets:
            offsets[t.journal] = max(t.offset, t.first)
        lost = "".join(
            f"; producer {p.producer.hex()}'s pending transaction began at offset {p.begin},"
            f" before {t.first}: its messages before {t.first} are lost, and the rest is"
            " delivered if it commits (not exactly once: the transaction is incomplete)"
            for p in t.pending
        )
        log.warning(
            "consumer group %r: journal %r was trimmed below the checkpoint: skipping offsets"
            " [%d, %d) (%d bytes) and going on from the first available offset %d%s",
            group, t.journal, t.offset, max(t.offset, t.first), t.skipped, t.first, lost,
        )
    reason = "recover (skipped trimmed " + ",".join(
        f"{t.journal}={t.offset}..{t.first}" for t in trimmed
    ) + ")"
    return offsets, producers, reason
