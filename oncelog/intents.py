"""ACK intents: framed acknowledgements waiting to be appended, and how they are started.

A transaction's commit is the appending of one ACK_TXN acknowledgement per journal it wrote
(Gazette's "ACK intents"). The Publisher builds them; checkpoints (consumers), transaction
records (multi-journal commits) and Spark's driver store them and append them again on
recovery, which is harmless where they already are.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oncelog.journal import AsyncAppend, JournalClient

__all__ = ["AckIntent", "start_intents"]

log = logging.getLogger("oncelog.publisher")


@dataclass(frozen=True, slots=True)
class AckIntent:
    """A framed ACK_TXN acknowledgement and the journal it must be appended to."""

    journal: str
    intent: bytes


def start_intents(
    client: "JournalClient", intents: Iterable[AckIntent], *, skip_deleted: bool = False
) -> list["AsyncAppend | None"]:
    """Start one append per ACK intent, in order, without waiting (journals are written
    concurrently; `.result()` of each waits for it). An intent whose bytes cannot be written
    is aborted, not half-appended. With `skip_deleted`, an intent for a journal deleted since
    is logged and left out (None in its place); otherwise JournalNotFound is raised."""
    from oncelog.journal.errors import JournalNotFound

    started: list[AsyncAppend | None] = []
    for intent in intents:
        try:
            append = client.start_append(intent.journal)
        except JournalNotFound:
            if not skip_deleted:
                raise
            log.warning("ACK intent for journal %r skipped: the journal was deleted",
                        intent.journal)
            started.append(None)
            continue
        try:
            append.write(intent.intent)
        except BaseException:
            append.abort()
            raise
        append.release()
        started.append(append)
    return started
