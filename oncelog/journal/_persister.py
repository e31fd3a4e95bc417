"""Persisting a sealed batch: store its bytes as a fragment, then claim its offset if absent.

The storing half of appending (as Gazette's persister.go is to spool.go): the appender's
writer thread hands each sealed batch's bytes to `Persister.persist`, which

1. sums them: the SHA1 that names the fragment, and per-block CRC-32Cs recorded in the claim
   (raw fragments) or a CRC-32C of the stored object (compressed ones), computed once per
   batch, in the hash threads for large batches;
2. stores them under the content name at the journal's known head (on local disk the bytes
   are written and fsync'd under a temporary name while the sums are computed, then renamed);
3. creates the claim of that offset only if absent, with a writer token of its own, so that
   a claim whose reply was lost is recognised as ours when it is read back;
4. on a lost race (another writer claimed the offset first) learns the new head and gives
   the stored object the name of the same bytes at the new offsets (`move_fragment`: a
   rename on local disk, a server-side copy and a delete on S3), so that a lost race costs a
   few requests and no bytes sent again, then claims again;
5. after winning, checks that its claim counts: no compaction record may end past it (one
   LIST of the records). A writer idle while its journal was compacted and retired may
   claim an offset whose claim retirement deleted: the put-if-absent succeeds, yet readers
   take those offsets from the record. Such a *stale* claim is deleted and the batch goes
   to the true head, as after a lost race. A record made after the claim (a compaction
   that read it) also ends past it: then the compaction's claims object lists this
   claim's writer token, which tells the two apart (bytes would not: another writer may
   have appended the very same bytes at those offsets).

Threads and locks: a Persister is used by one writer thread at a time (its appender's) and
takes no lock of the appender. Its counters `fragments_written` and `races_lost` are written
by that thread only; other threads read them as statistics. The claims index it updates has
its own locks, taken and released inside each index call (a leaf in the lock order).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, NoReturn

import crc32c

from oncelog.journal._blocks import BlockSums, block_sums
from oncelog.journal._retry import retry
from oncelog.journal.backends import StagedFile
from oncelog.journal.errors import AppendFailed
from oncelog.journal.fragment import Codec, Fragment, content_sum, encode
from oncelog.journal.index import ClaimsIndex
from oncelog.journal.records import consumed_claims, list_records
from oncelog.journal.store import Claim, FragmentStore

__all__ = ["Persister"]

_OVERLAP_MIN = 1 << 20  # batches from this size are hashed in another thread while written

_HASH_POOL: ThreadPoolExecutor | None = None
_HASH_POOL_LOCK = threading.Lock()


def _hash_pool() -> ThreadPoolExecutor:
    """Threads computing fragment SHA1s while the writer threads store the bytes."""
    global _HASH_POOL
    with _HASH_POOL_LOCK:
        if _HASH_POOL is None:
            _HASH_POOL = ThreadPoolExecutor(2, thread_name_prefix="oncelog-sha1")
        return _HASH_POOL


def _forget_hash_pool() -> None:
    """A forked child has none of the parent's threads: it must start its own pool (an
    inherited one would accept work that no thread ever runs)."""
    global _HASH_POOL, _HASH_POOL_LOCK
    _HASH_POOL, _HASH_POOL_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_hash_pool)


def _name_and_sums(data: bytes | bytearray | memoryview) -> tuple[str, BlockSums]:
    """A raw fragment's content sum (its name) and block CRC-32Cs (its claim)."""
    return content_sum(data), block_sums(data)


class Persister:
    """Stores and claims the fragments of one journal for its appender (see the module)."""

    def __init__(
        self, store: FragmentStore, index: ClaimsIndex, codec: Codec, retry_timeout: float
    ) -> None:
        self.store = store
        self.index = index
        self.journal = index.journal
        self.codec = codec
        self.retry_timeout = retry_timeout
        self.fragments_written = 0
        self.races_lost = 0
        self.stale_claims = 0  # claims made at offsets retirement had freed (see the module)

    def persist(self, data: bytearray) -> int:
        """Make `data` a claimed fragment of the journal and return the offset it begins at;
        on return it is durable. An empty batch claims nothing and returns the head.

        Raises AppendFailed (nothing of `data` is claimed, or, when it says so, the outcome
        of a claim is unknown) after retry_timeout seconds of transient failures or lost races.
        """
        size = len(data)
        if size == 0:
            head: int = self._retry(self.index.ensure_loaded, "load the index")
            return head
        staged: StagedFile | None = None
        # Raw fragments get per-block CRC-32C sums in their claim, so that reads entering
        # them in the middle are verified; computed once per batch (about 1/7 of the SHA1's
        # cost, and letting go of the GIL like it), not per claim attempt.
        blocks: BlockSums | None = None
        stored_crc: int | None = None  # compressed fragments: CRC-32C of the stored object
        if self.codec is Codec.NONE and self.store.can_stage:
            # Write and fsync the bytes under a temporary name while another thread computes
            # the SHA1 that names them and the block sums (all let go of the GIL), so the
            # writer's part is the write alone. Small batches are hashed here: handing them
            # to a thread costs more than it saves.
            hashing = _hash_pool().submit(_name_and_sums, data) if size >= _OVERLAP_MIN else None
            try:
                staged = self._retry(
                    lambda: self.store.stage_fragment(self.journal, data),
                    f"write {size} bytes of journal {self.journal!r}",
                )
            finally:
                # Never leave the hash reading `data` behind.
                digest, blocks = hashing.result() if hashing is not None else _name_and_sums(data)
            stored: bytes | bytearray | memoryview = data
        elif self.codec is Codec.NONE:
            # Big batches: the block sums in another thread while the SHA1 is computed here.
            summing = _hash_pool().submit(block_sums, data) if size >= _OVERLAP_MIN else None
            try:
                digest = content_sum(data)
                if summing is None:
                    blocks = block_sums(data)
            finally:
                if summing is not None:  # never leave the thread reading `data` behind
                    blocks = summing.result()
            stored = data
        else:
            digest = content_sum(data)
            stored = encode(self.codec, data)
            # Readers check this before decompressing instead of the content's SHA1.
            stored_crc = crc32c.crc32c(stored)
        try:
            self._retry(self.index.ensure_loaded, "load the index")
        except BaseException:
            if staged is not None:
                self.store.discard_staged(staged)
            raise
        # The object we have stored (and may move after a lost race), if any.
        current: Fragment | None = None

        def store_at(fragment: Fragment) -> None:
            nonlocal staged, current
            if current is not None:
                try:
                    self.store.move_fragment(current, fragment)
                except FileNotFoundError:  # gone (collected?): write the bytes afresh
                    self.store.write_fragment(fragment, stored)
            elif staged is not None:
                # The staged file is renamed, or removed if that fails: a retry writes afresh.
                pending, staged = staged, None
                self.store.write_fragment(fragment, pending)
            else:
                self.store.write_fragment(fragment, stored)
            current = fragment

        deadline = time.monotonic() + self.retry_timeout
        while True:
            if time.monotonic() > deadline:
                if staged is not None:
                    self.store.discard_staged(staged)
                raise AppendFailed(
                    f"journal {self.journal!r}: could not claim an offset for {size} bytes "
                    f"within {self.retry_timeout} s ({self.races_lost} races lost so far, "
                    f"head now {self.index.head}); the append was not made"
                )
            begin = self.index.head
            fragment = Fragment(self.journal, begin, begin + size, digest, self.codec)
            self._retry(lambda: store_at(fragment), f"write {fragment}")
            claim = Claim(
                begin,
                fragment.content_name,
                uuid.uuid4().hex,
                self.index.incarnation,
                blocks,
                stored_crc,
            )
            if self._retry(lambda: self._try_claim(claim), f"claim offset {begin}", True):
                if self._counts(claim, fragment):
                    self.fragments_written += 1
                    return begin
                # A stale claim: nobody reads it. Remove it (retirement would, later) and
                # go to the true head, which the index now knows from the records.
                self.stale_claims += 1
                self._retry(
                    lambda: self.store.delete_claims(self.journal, [claim.begin]),
                    f"delete the stale claim at offset {begin}",
                )
            else:
                self.races_lost += 1
            # Another writer claimed `begin` first: learn the new head and try again there.
            self._retry(self.index.refresh, "refresh the index")
            winner = self.index.claim(begin)
            if winner is not None and winner.fragment == fragment.content_name:
                # The winner appended the very same bytes at the same offsets: its claim
                # names our object, which is now its fragment. Leave it; write ours afresh.
                current = None

    def _counts(self, claim: Claim, fragment: Fragment) -> bool:
        """After our claim was created: whether it is part of the journal (module, step 5).
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
            if n.through > begin and consumed_claims(self.store, self.journal, n.name).get(
                begin
            ) == claim.writer:
                return True
        return False

    def _try_claim(self, claim: Claim) -> bool:
        """Create the claim; after a 'lost' answer, check whether an earlier attempt of ours
        (whose reply was lost) made it: the claim then carries our writer token."""
        if self.store.create_claim(self.journal, claim):
            return True
        existing = self.store.read_claim(self.journal, claim.begin)
        # Someone else's claim is not added to the index here: it may be a stale one (see
        # the module); the index's refresh reads it and checks it against the records.
        return existing is not None and existing.writer == claim.writer

    def _retry(self, op: Callable[[], Any], what: str, ambiguous: bool = False) -> Any:
        """Run a storage call, retrying transient failures with backoff until retry_timeout.
        `ambiguous`: a failed attempt may have taken effect (a claim whose reply was lost)."""

        def give_up(exc: Exception) -> NoReturn:
            outcome = (
                "the append's outcome is unknown (the claim may exist)"
                if ambiguous
                else "the append was not made"
            )
            raise AppendFailed(
                f"journal {self.journal!r}: could not {what} within "
                f"{self.retry_timeout} s; {outcome}: {exc!r}"
            ) from exc

        return retry(op, self.retry_timeout, give_up)
