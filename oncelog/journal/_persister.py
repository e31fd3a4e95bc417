"""Persisting a batch: seal it, store its bytes as a fragment, claim its offset if absent.

The loop driving the two halves of storing an appender's batch (Gazette keeps them apart
too: spool.go seals, persister.go stores and claims). The appender's writer thread hands
each batch's bytes to `Persister.persist`, which

1. seals them (`_seal.seal`, pure): the SHA1 that names the fragment, and per-block
   CRC-32Cs (raw fragments) or the CRC-32C of the compressed object, computed once per
   batch, in the hash threads for large batches;
2. stores them under the content name at the journal's known head (on local disk the bytes
   are written and fsync'd under a temporary name while they are sealed, then renamed);
3. claims that offset (`_claim.Claimer`: put-if-absent with a writer token of its own, so
   that a claim whose reply was lost is recognised as ours, then the check after that
   decides whether the claim counts against the compaction records);
4. unless the claim was WON, learns the new (or true) head and gives the stored object the
   name of the same bytes at the new offsets (`move_fragment`: a rename on local disk, a
   server-side copy and a delete on S3), so that a lost race or a stale claim costs a few
   requests and no bytes sent again, then claims again, until retry_timeout.

5. when the claim was WON long after the bytes were first stored (`recheck_after`, 1 s: the
   writer was paused, say a process stopped and resumed as a zombie, or its storage slow),
   checks that the fragment is still there and stores it again under the same name if not.
   `gc` deletes unclaimed fragments older than its grace; a writer stopped between storing
   and claiming for longer than that grace would otherwise win a claim naming a deleted
   object, and report durable bytes the journal no longer has.

Invariant: `persist` returns only after a WON claim (the bytes are durable and are the
journal's at the returned offset), and raises AppendFailed otherwise, saying whether the
append was not made or its outcome is unknown; a batch's bytes are sealed once whatever
the number of attempts.

Threads and locks: a Persister is used by one writer thread at a time (its appender's) and
takes no lock of the appender. Its counters `fragments_written`, `races_lost` and
`stale_claims` are written by that thread only; other threads read them as statistics. The
claims index it updates has its own locks, taken and released inside each index call (a
leaf in the lock order).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from oncelog.journal._claim import Claimer, Placement, retry_append
from oncelog.journal._seal import SealedFragment, seal
from oncelog.journal.backends import StagedFile
from oncelog.journal.errors import AppendFailed
from oncelog.journal.fragment import Codec, Fragment
from oncelog.journal.index import ClaimsIndex
from oncelog.journal.store import FragmentStore

__all__ = ["Persister"]

_OVERLAP_MIN = 1 << 20  # batches from this size are hashed in another thread while written
RECHECK_AFTER = 1.0
"""Seconds from first storing a batch's bytes to winning their claim after which the writer
checks that its fragment is still stored (see the module, step 5)."""

log = logging.getLogger(__name__)

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


class Persister:
    """Seals, stores and claims the fragments of one journal for its appender (see the
    module)."""

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
        self.fragments_restored = 0  # claimed fragments found deleted and stored again
        self.recheck_after = RECHECK_AFTER
        self._claimer = Claimer(store, index, retry_timeout)

    @property
    def stale_claims(self) -> int:
        """Claims made at offsets retirement had freed, deleted and made again at the true
        head (see oncelog.journal._claim)."""
        return self._claimer.stale_claims

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
        # Before the bytes are first stored: gc counts an object's age from then (a move
        # after a lost race keeps it), by the wall clock; a pause counts on the monotonic.
        first_stored = (time.monotonic(), time.time())
        staged: StagedFile | None = None
        # Sealed once per batch (raw fragments' block sums cost about 1/7 of the SHA1, and
        # let go of the GIL like it), not per claim attempt.
        sealed: SealedFragment
        if self.codec is Codec.NONE and self.store.can_stage:
            # Write and fsync the bytes under a temporary name while another thread seals
            # them (all let go of the GIL), so the writer's part is the write alone. Small
            # batches are sealed here: handing them to a thread costs more than it saves.
            sealing = (
                _hash_pool().submit(seal, self.journal, data, self.codec)
                if size >= _OVERLAP_MIN
                else None
            )
            try:
                staged = self._retry(
                    lambda: self.store.stage_fragment(self.journal, data),
                    f"write {size} bytes of journal {self.journal!r}",
                )
            finally:
                # Never leave the seal reading `data` behind.
                if sealing is not None:
                    sealed = sealing.result()
                else:
                    sealed = seal(self.journal, data, self.codec)
        else:
            # Big raw batches: the block sums in another thread while the SHA1 is computed here.
            pool = _hash_pool() if self.codec is Codec.NONE and size >= _OVERLAP_MIN else None
            sealed = seal(self.journal, data, self.codec, pool=pool)
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
                    self.store.write_fragment(fragment, sealed.stored)
            elif staged is not None:
                # The staged file is renamed, or removed if that fails: a retry writes afresh.
                pending, staged = staged, None
                try:
                    self.store.write_fragment(fragment, pending)
                except FileNotFoundError:
                    # A gc with a grace shorter than our stage-to-rename time removed the
                    # staged file (the maintenance tests run gc with grace 0): the bytes
                    # are still here, write them afresh under the same content name.
                    self.store.write_fragment(fragment, sealed.stored)
            else:
                self.store.write_fragment(fragment, sealed.stored)
            current = fragment

        deadline = time.monotonic() + self.retry_timeout
        while True:
            if time.monotonic() > deadline:
                if staged is not None:
                    self.store.discard_staged(staged)
                raise AppendFailed(
                    f"journal {self.journal!r}: could not claim an offset for {size} bytes "
                    f"within {self.retry_timeout} s ({self.races_lost} races lost so far, "
                    f"head now {self.index.head}); the append was not made",
                    made=False,
                )
            placed = sealed.at(self.index.head)
            fragment = placed.fragment
            self._retry(lambda: store_at(fragment), f"write {fragment}")
            placement = self._claimer.claim(placed)
            if placement is Placement.WON:
                self._ensure_stored(fragment, sealed, first_stored)
                self.fragments_written += 1
                return placed.begin
            if placement is Placement.LOST:
                self.races_lost += 1
            # Another writer claimed the offset first, or ours was stale (and is deleted):
            # learn the new head and try again there.
            self._retry(self.index.refresh, "refresh the index")
            winner = self.index.claim(placed.begin)
            if winner is not None and winner.fragment == placed.name:
                # The winner appended the very same bytes at the same offsets: its claim
                # names our object, which is now its fragment. Leave it; write ours afresh.
                current = None

    def _ensure_stored(
        self, fragment: Fragment, sealed: SealedFragment, first_stored: tuple[float, float]
    ) -> None:
        """After a WON claim that came `recheck_after` seconds or more after the bytes were
        first stored: make sure the claimed fragment exists, storing it again (same content
        name, same bytes) if a gc deleted it meanwhile (see the module, step 5)."""
        elapsed = max(time.monotonic() - first_stored[0], time.time() - first_stored[1])
        if elapsed < self.recheck_after:
            return
        path = self.store.fragment_path(fragment)
        where = f"fragment {fragment.stored_name} of journal {self.journal!r}"
        try:
            # The store's backend retries its reads itself (RetryingReads): not again here.
            if self.store.backend.exists(path):
                return
            log.warning(
                "%s (offsets %d-%d) was deleted between being stored and claimed %.1f s "
                "later (a gc with a shorter grace): storing it again",
                where, fragment.begin, fragment.end, elapsed,
            )
            self._retry(
                lambda: self.store.write_fragment(fragment, sealed.stored), f"store {where}"
            )
        except Exception as exc:  # noqa: BLE001 - any failure here: the claim stands
            raise AppendFailed(
                f"journal {self.journal!r}: offsets {fragment.begin}-{fragment.end} are "
                f"claimed for {where}, claimed {elapsed:.1f} s after it was first stored, "
                f"but it could not be checked or stored again ({exc}); the append's outcome "
                "is unknown: `oncelog journals verify` reports the fragment if it is missing",
                made=None,
            ) from exc
        self.fragments_restored += 1

    def _retry(self, op: Callable[[], Any], what: str) -> Any:
        """Run a storage call, retrying transient failures with backoff until retry_timeout
        (then AppendFailed saying the append was not made)."""
        return retry_append(self.journal, self.retry_timeout, op, what)
