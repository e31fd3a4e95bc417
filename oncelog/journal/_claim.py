"""Claiming a stored fragment's offsets: put-if-absent, lost replies, and the check after.

The second half of persisting a batch (as Gazette's persister.go is to spool.go): once a
sealed fragment's bytes are stored under its content name at [begin, end), `Claimer.claim`
makes them part of the journal by creating `.oncelog/claims/<journal>/<begin>` only if
absent, and says where that left the batch (a `Placement`):

- WON: the claim is ours and counts. Afterwards the claim at `begin` exists, names the
  sealed fragment and carries our writer token; no compaction record ends past `begin`
  (the index then holds the claim, so its head is at least `end`), or the one that does
  consumed this very claim (its bytes are the record's at those offsets). Readers see the
  bytes at [begin, end) from now on, and no other writer can claim `begin`.
- LOST: another writer's claim holds `begin` (a lost race). Ours was not made; nothing was
  added to the index (that claim may itself be stale: the index's refresh reads it and
  checks it against the records).
- STALE: our claim was made but never counts, and has been deleted: the offset had been
  retired before we claimed it (see below). The index has read the records again, so its
  head is the true one.

After LOST and STALE the bytes are still stored under the old name: the caller moves them
to the new head and claims again (`oncelog.journal._persister`).

The lost-reply rule: each claim attempt carries a writer token of its own (a fresh UUID
per attempt, not per writer). A create whose reply was lost is retried with the same
token; an "already exists" answer is then resolved by reading the claim back: it is ours
exactly when it carries our token. Bytes could not tell (another writer may append the
very same bytes at the same offsets), nor could the fragment name.

Why a claim below the newest compaction record's `through` never counts: readers take
every offset below `through` from the record's fragments, not from claims, and retirement
deletes the claims the record replaced. A writer idle across a compaction and retirement
may then create a claim at a freed offset: the put-if-absent succeeds, yet that claim
would contradict the record, so it is not part of the journal. Hence the check after
winning (one LIST of the records): a record ending past our claim was made either before
it (the claim is stale) or after it, by a compaction that read it; that compaction's
claims object lists our writer token at our offset, which tells the two apart.
"""

from __future__ import annotations

import enum
import uuid
from typing import Any, Callable, NoReturn

from oncelog.journal._retry import retry
from oncelog.journal._seal import SealedFragment
from oncelog.journal.errors import AppendFailed
from oncelog.journal.fragment import Fragment
from oncelog.journal.index import ClaimsIndex
from oncelog.journal.records import consumed_claims, list_records
from oncelog.journal.store import Claim, FragmentStore

__all__ = ["Claimer", "Placement", "retry_append"]


class Placement(enum.Enum):
    """Where a claim left its sealed fragment (see the module for what holds after each)."""

    WON = "won"
    """Ours and counting: the bytes are the journal's at [begin, end)."""
    LOST = "lost"
    """Another writer's claim holds `begin`: try again at the new head."""
    STALE = "stale"
    """Ours at an offset retired before; deleted: try again at the true head."""


def retry_append(
    journal: str,
    timeout: float,
    op: Callable[[], Any],
    what: str,
    ambiguous: bool = False,
) -> Any:
    """Run a storage call of an append to `journal`, retrying transient failures with
    backoff for `timeout` seconds, then raising AppendFailed saying what could not be done.
    `ambiguous`: a failed attempt may have taken effect (a claim whose reply was lost), so
    the error says the append's outcome is unknown instead of that it was not made."""

    def give_up(exc: Exception) -> NoReturn:
        outcome = (
            "the append's outcome is unknown (the claim may exist)"
            if ambiguous
            else "the append was not made"
        )
        raise AppendFailed(
            f"journal {journal!r}: could not {what} within {timeout} s; {outcome}: {exc!r}",
            made=None if ambiguous else False,
        ) from exc

    return retry(op, timeout, give_up)


class Claimer:
    """Claims stored fragments of one journal (see the module).

    Used by one writer thread at a time (its persister's); takes no lock of its own. The
    claims index it reads and updates takes its own locks inside each call (leaves in the
    lock order). `stale_claims` counts the stale claims it deleted (written by that thread
    only; a statistic for others).
    """

    def __init__(self, store: FragmentStore, index: ClaimsIndex, retry_timeout: float) -> None:
        self.store = store
        self.index = index
        self.journal = index.journal
        self.retry_timeout = retry_timeout
        self.stale_claims = 0

    def claim(self, sealed: SealedFragment) -> Placement:
        """Claim `sealed.begin` for the sealed fragment, whose bytes the caller has stored
        under `sealed.fragment`, and return the placement (module docstring: what holds).

        Raises AppendFailed after retry_timeout seconds of transient failures; when the
        claim may have been created, the error says the append's outcome is unknown.
        """
        begin = sealed.begin
        claim = Claim(
            begin,
            sealed.name,
            uuid.uuid4().hex,  # this attempt's writer token (the lost-reply rule)
            self.index.incarnation,
            sealed.blocks,
            sealed.stored_crc32c,
        )
        if not self._retry(lambda: self._try_claim(claim), f"claim offset {begin}", True):
            return Placement.LOST
        if self._counts(claim, sealed.fragment):
            return Placement.WON
        # A stale claim: nobody reads it. Remove it (retirement would, later); the index
        # knows the true head from the records it read again.
        self.stale_claims += 1
        self._retry(
            lambda: self.store.delete_claims(self.journal, [begin]),
            f"delete the stale claim at offset {begin}",
        )
        return Placement.STALE

    def _try_claim(self, claim: Claim) -> bool:
        """Create the claim; after a 'lost' answer, check whether an earlier attempt of ours
        (whose reply was lost) made it: the claim then carries our writer token."""
        if self.store.create_claim(self.journal, claim):
            return True
        existing = self.store.read_claim(self.journal, claim.begin)
        # Someone else's claim is not added to the index here: it may be a stale one (see
        # the module); the index's refresh reads it and checks it against the records.
        return existing is not None and existing.writer == claim.writer

    def _counts(self, claim: Claim, fragment: Fragment) -> bool:
        """After our claim was created: whether it is part of the journal (see the module).
        True once the index holds it, or a compaction consumed it."""
        what = f"check the claim at offset {claim.begin}"
        # Raises AppendFailed saying the outcome is unknown if the store stays down: the
        # claim exists, and whether it counts could not be found out.
        if self._retry(lambda: self.index.check_own_claim(claim.begin), what, True):
            self.index.add(claim, fragment)
            return True
        # A record ends past our claim: made after it (a compaction that read our claim:
        # it counts), or before (the offset was retired, then claimed again by us).
        landed: bool = self._retry(lambda: self._consumed(claim), what, True)
        return landed

    def _consumed(self, claim: Claim) -> bool:
        """Whether a compaction consumed our claim (its record's claims object lists our
        writer token at our offset): the record then holds our bytes there. Otherwise the
        claim is stale: the offset had been retired before we claimed it. (If the record
        that consumed it was itself retired before this check, after a pause of this
        writer longer than the retirement grace, the batch is appended again: a duplicate,
        never a loss.)"""
        begin = claim.begin
        for n in reversed(list_records(self.store, self.journal)):
            if (
                n.through > begin
                and consumed_claims(self.store, self.journal, n.name).get(begin) == claim.writer
            ):
                return True
        return False

    def _retry(self, op: Callable[[], Any], what: str, ambiguous: bool = False) -> Any:
        return retry_append(self.journal, self.retry_timeout, op, what, ambiguous)
