"""The fragment index of one journal: which fragment holds each offset, and the write head.

Claims mode (`ClaimsIndex`, journals with an oncelog spec): the journal is exactly the
claimed fragments. Claims are immutable and contiguous (each is created at the end of the
one before), so a cold index lists the claim offsets once (one LIST per 1000 claims) and
reads only the last claim to learn the head; other claims are read when a reader gets near
them, a window at a time. It is then kept fresh from the known head: a GET of the claim at
the head (a 404 means nothing new), and a LIST starting after the head only when many new
claims appeared.

Compaction records (oncelog.journal.compaction): a cold claims index first lists the
journal's compaction records and reads the newest, whose fragments hold the offsets
[first, through); it then lists only the claims from `through` on. Opening a journal of N
small appends compacted into M fragments thus costs O(M) requests, not O(N). Refreshes at
the head are unchanged. When a claim the index listed is gone (retired after compaction),
the index reads the records again and goes on (once per missing claim); readers call
`recover` for a missing fragment likewise.

Claims below the newest record's `through` never count, whatever is stored there: once a
record ends past an offset, retirement and trims may delete the claim at it, and a writer
that remembered that offset as the head (idle while the journal was compacted) can then
create a claim there again. So a claim read at offset X counts only if a listing of the
records made *after* reading it shows none ending past X; otherwise the index reads the
records again and goes on from their `through`. A refresh therefore costs one LIST of the
journal's records beside its claim probes, and an index never takes a stale claim (or a
claim that follows one) for the head, nor a missing claim at a retired offset for "nothing
new" (see `ClaimsIndex.refresh`, and `oncelog.journal._claim.Claimer`, which checks a
writer's own new claims the same way).

Gazette mode (`GazetteIndex`, no spec: a Gazette broker's fragment store): fragment objects
define the journal. Every refresh lists them all and keeps Gazette's cover set (the longest
covering fragment at each offset).
"""

from __future__ import annotations

import bisect
import threading
import time
from typing import NoReturn, Sequence

from oncelog.journal._blocks import BlockSums
from oncelog.journal.errors import (
    JournalRecreated,
    MissingFragment,
    OffsetNotAvailable,
    StorageUnavailable,
)
from oncelog.journal.fragment import Fragment, cover_set
from oncelog.journal.records import (
    CompactionRecord,
    effective,
    foreign_records,
    newest_record,
    records_beyond,
)
from oncelog.journal.store import Claim, FragmentStore

__all__ = ["JournalIndex", "ClaimsIndex", "GazetteIndex"]

_PROBES_BEFORE_LIST = 3
_CLAIM_WINDOW = 32  # claims read together (concurrently) when a reader reaches unread ones
_RECHECK = 5.0
"""Seconds: a tailing reader that keeps finding nothing new at the head lists the records
at most this often (a GET per poll as before); anything found is checked at once."""
_RELOADS = 16
"""A refresh that keeps finding newer records (compactions every few milliseconds) starts
over at most this many times before giving up with a retryable error."""


class JournalIndex:
    """Known fragments of one journal and its write head, safe to share between threads."""

    gazette = False

    def __init__(self, store: FragmentStore, journal: str, incarnation: str = "") -> None:
        self.store = store
        self.journal = journal
        # The journal's incarnation (from its spec; "" if unknown): claims of another one
        # belong to a deleted journal of the same name and are never part of this one.
        self.incarnation = incarnation
        # Set once a claim of another incarnation was met: the client then drops this index
        # (and an appender using it) and opens the journal again.
        self.stale = False
        # Guards the known fragments and `_version`. Reentrant: the cyclic collector may
        # finalize an abandoned reader's generator at any allocation, including one made
        # while this thread holds the lock, and the reader's close() notifies waiters here.
        self._cond = threading.Condition(threading.RLock())
        self._refresh_lock = threading.Lock()
        self._loaded = False
        self._version = 0

    @property
    def head(self) -> int:
        """The write head as last seen (call `refresh` first for a fresh value)."""
        raise NotImplementedError

    @property
    def version(self) -> int:
        """Bumped on every change; readers wait for it to move."""
        return self._version

    @property
    def first(self) -> int:
        """The journal's first available offset as last seen: reading offset 0 starts here
        (call `refresh` first for a fresh value)."""
        raise NotImplementedError

    def locate(self, offset: int) -> Fragment | None:
        """The fragment to read `offset` from (possibly one beginning later, when the reader
        should jump), or None at or past the known head."""
        raise NotImplementedError

    def fragments(self) -> list[Fragment]:
        """Every fragment of the journal as last seen, in offset order."""
        raise NotImplementedError

    def refresh(self) -> int:
        """Bring the index up to date with the store; returns the write head."""
        raise NotImplementedError

    def poll(self) -> int:
        """`refresh` for a tailing reader's repeated looks at the head: it may spare
        requests when nothing new was found (see ClaimsIndex.poll)."""
        return self.refresh()

    def forget(self) -> None:
        """Drop everything known (after the journal was deleted)."""

    def ensure_loaded(self) -> int:
        if not self._loaded:
            return self.refresh()
        return self.head

    def fresh_first(self) -> int:
        """The first available offset as the store says now (a trim may have raised it
        since this index was loaded)."""
        self.refresh()
        return self.first

    def wait_for_change(self, version: int, timeout: float) -> bool:
        """Block until the index changes from `version` (e.g. a local append) or timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._version != version, timeout)

    def notify(self) -> None:
        """Wake waiting readers (used when a reader is closed)."""
        with self._cond:
            self._changed_locked()

    def _changed_locked(self) -> None:
        self._version += 1
        self._cond.notify_all()


class _ClaimGone(MissingFragment):
    """A claim the index listed is gone: retired under a compaction record, or trimmed."""


class ClaimsIndex(JournalIndex):
    """Index of an oncelog journal: the newest compaction record's fragments, then its
    claims from the record's `through` on, read lazily.

    `_cond` guards the claims (`_begins`, `_claims`) and the record state (`_record`,
    `_first`, `_through`, `_rec_begins`, `_rec`); `_refresh_lock` serialises loads,
    refreshes and record reloads (I/O happens outside `_cond`). Invariant: every claim
    offset known is >= `_through`, and claims are contiguous from `_through` on."""

    def __init__(self, store: FragmentStore, journal: str, incarnation: str = "") -> None:
        super().__init__(store, journal, incarnation)
        self._begins: list[int] = []  # every known claim offset, ascending
        self._claims: dict[int, tuple[Claim, Fragment]] = {}  # the claims read so far
        self._record: CompactionRecord | None = None
        self._first = 0  # the first offset still stored, by the records (0: none)
        self._through = 0  # claims hold the offsets from here on
        self._rec_begins: list[int] = []  # begins of the record's fragments (from _first)
        self._rec: dict[int, tuple[Fragment, BlockSums | None]] = {}
        # Records listed that are not this journal's (another incarnation's): they never
        # make a claim stale. Guarded by `_cond`.
        self._foreign: frozenset[str] = frozenset()
        self._checked_at = -1e18  # time.monotonic() of the last records listing

    @property
    def head(self) -> int:
        with self._cond:
            return self._head_locked()

    @property
    def first(self) -> int:
        with self._cond:
            if self._record is not None:
                return self._first
            return self._begins[0] if self._begins else self._through

    def _head_locked(self) -> int:
        if not self._begins:
            return self._through
        return self._claims[self._begins[-1]][1].end

    @property
    def compacted_through(self) -> int:
        """The `through` of the compaction record in use (0: none)."""
        with self._cond:
            return self._through

    def uncompacted(self) -> int:
        """How many claims this index knows past its compaction record."""
        with self._cond:
            return len(self._begins)

    def claim(self, begin: int) -> Claim | None:
        """The claim at `begin`, if this index has read it; for a fragment of the compaction
        record, a claim-like view of it (writer "") carrying the record's block sums."""
        with self._cond:
            entry = self._claims.get(begin)
            if entry is not None:
                return entry[0]
            rec = self._rec.get(begin)
            if rec is None:
                return None
            return Claim(begin, rec[0].content_name, "", self.incarnation, rec[1])

    def reload_records(self) -> bool:
        """Read the compaction records again (one LIST, one GET) and use the newest; True
        if the index changed. Claims below its `through` are dropped (their fragments are
        in the record)."""
        with self._refresh_lock:
            return self._reload_records()

    def _reload_records(self) -> bool:
        """`reload_records` with `_refresh_lock` held."""
        record, first, names = newest_record(self.store, self.journal, self.incarnation)
        # Records listed above the one used are another incarnation's (newest_record skips
        # them): remember them, so they never make this journal's claims look stale.
        with self._cond:
            self._foreign = frozenset(foreign_records(record, names))
        return self._set_record(record, first)

    def fresh_first(self) -> int:
        # A trim's record may end below the head, so a refresh need not read it: read the
        # records (a cold index just did, loading).
        if self._loaded:
            self.reload_records()
        else:
            self.refresh()
        return self.first

    def records_beyond(self, offset: int) -> bool:
        """Whether a record of this journal ends past `offset` (one LIST of the records). A
        claim read at `offset` before this call counts only if it returns False: otherwise
        the claim may be a stale one, made at an offset retirement had freed."""
        with self._cond:
            foreign = self._foreign
        beyond = records_beyond(self.store, self.journal, offset, foreign)
        with self._cond:
            self._checked_at = time.monotonic()
        return beyond

    def check_own_claim(self, begin: int) -> bool:
        """After this process created the claim at `begin`: True if it counts (no record
        ends past `begin`); otherwise read the records again and return False. The caller
        then finds out whether a compaction covered its claim after it was made or the
        offset had been retired before (see oncelog.journal._claim.Claimer)."""
        if not self.records_beyond(begin):
            return True
        with self._refresh_lock:
            self._reload_records()
        return self.compacted_through <= begin

    def recover(self, fragment: Fragment) -> bool:
        """Called by a reader that found `fragment`, which this index named, missing from the
        store: read the records again; True if the index no longer names that fragment
        (locate again), False if it still does (the fragment really is missing)."""
        self.reload_records()
        with self._cond:
            entry = self._claims.get(fragment.begin)
            rec = self._rec.get(fragment.begin)
        names = {entry[1].content_name} if entry is not None else set()
        if rec is not None:
            names.add(rec[0].content_name)
        return fragment.content_name not in names

    def _set_record(self, record: CompactionRecord | None, first: int) -> bool:
        if record is None:
            return False
        kept = effective(record, first)
        with self._cond:
            key = (record.through, first)
            if self._record is not None and (self._record.through, self._first) >= key:
                return False
            self._record, self._first, self._through = record, first, record.through
            self._rec_begins = [f.begin for f, _ in kept]
            self._rec = {f.begin: (f, b) for f, b in kept}
            cut = bisect.bisect_left(self._begins, record.through)
            for b in self._begins[:cut]:
                self._claims.pop(b, None)
            del self._begins[:cut]
            self._changed_locked()
            return True

    def add(self, claim: Claim, fragment: Fragment) -> None:
        """Record a claim this process just won (or read)."""
        self._insert([(claim, fragment)])

    def locate(self, offset: int) -> Fragment | None:
        try:
            return self._locate(offset)
        except _ClaimGone:
            # Retired or trimmed since listed: the records say where its bytes went (once;
            # a claim still missing after that is reported).
            self.reload_records()
            return self._locate(offset)

    def _locate(self, offset: int) -> Fragment | None:
        with self._cond:
            begins = self._begins
            if offset >= self._head_locked():
                return None
            if self._record is not None:
                first = self._first
                if offset < first:
                    # Never a silent jump: a reader reports the offsets of what it returns,
                    # and resolves offset 0 to the first available one when it opens.
                    raise OffsetNotAvailable(
                        f"offset {offset} of journal {self.journal!r} is before its first "
                        f"available offset {first} (the data before was trimmed)"
                    )
                if offset < self._through:
                    j = max(bisect.bisect_right(self._rec_begins, offset) - 1, 0)
                    return self._rec[self._rec_begins[j]][0]
            i = bisect.bisect_right(begins, offset) - 1
            first = begins[0]
            if i < 0:
                raise OffsetNotAvailable(
                    f"offset {offset} of journal {self.journal!r} is before its first "
                    f"available offset {first} (the data before was trimmed)"
                )
            # By offset, not position: a record reload may drop claims before it meanwhile.
            begin = begins[i]
            window = [b for b in begins[i : i + _CLAIM_WINDOW] if b not in self._claims]
        fragment = self._fragment_at(begin, window)
        if fragment.end > offset or fragment.begin > offset:
            return fragment
        with self._cond:
            j = bisect.bisect_right(self._begins, begin)
            nxt = self._begins[j] if j < len(self._begins) else self._head_locked()
        raise MissingFragment(
            f"no claim covers offsets {fragment.end}-{nxt} of journal {self.journal!r} "
            f"(offset {offset} asked); its claims were removed"
        )

    def fragments(self) -> list[Fragment]:
        for attempt in range(2):
            with self._cond:
                missing = [b for b in self._begins if b not in self._claims]
            try:
                self._read_claims(missing)
                break
            except _ClaimGone:
                if attempt:
                    raise
                self.reload_records()
        with self._cond:
            rec = [self._rec[b][0] for b in self._rec_begins]
            return rec + [self._claims[b][1] for b in self._begins]

    def refresh(self) -> int:
        with self._refresh_lock:
            if not self._loaded:
                self._load()
                self._loaded = True
            else:
                self._advance()
        return self.head

    def poll(self) -> int:
        """`refresh`, but when the probe at the head finds nothing and the records were
        listed less than `_RECHECK` seconds ago, without listing them again: an idle
        tailing reader costs a GET per poll, and one whose head was retired (the claim
        there deleted, the data gone on past it) sees the new data within `_RECHECK`."""
        with self._refresh_lock:
            if not self._loaded:
                self._load()
                self._loaded = True
            else:
                self._advance(light=time.monotonic() - self._checked_at < _RECHECK)
        return self.head

    def forget(self) -> None:
        """Drop everything known (after the journal was deleted)."""
        with self._refresh_lock, self._cond:
            self._begins, self._claims = [], {}
            self._record, self._first, self._through = None, 0, 0
            self._rec_begins, self._rec = [], {}
            self._loaded = False
            self._changed_locked()

    # -- internals ----------------------------------------------------------------------------

    def _check_incarnation(self, claim: Claim) -> None:
        if self.incarnation and claim.incarnation and claim.incarnation != self.incarnation:
            self.stale = True
            raise JournalRecreated(
                f"the claim at offset {claim.begin} of journal {self.journal!r} belongs to "
                f"another incarnation of it ({claim.incarnation}, not {self.incarnation}): the "
                "journal was deleted and created again under the same name (or a writer of "
                "the deleted journal was still appending); offsets read before mean nothing "
                "in it. Open the journal again (a new client, or after client.create)"
            )

    def _fragment_at(self, begin: int, window: list[int]) -> Fragment:
        """The fragment of the claim at `begin`, reading `window` (unread claims from it on)
        if it is not read yet."""
        if window:
            self._read_claims(window)
        with self._cond:
            entry = self._claims.get(begin)
        if entry is None:
            raise _ClaimGone(
                f"the claim at offset {begin} of journal {self.journal!r} was dropped: a "
                "compaction record covers it"
            )
        return entry[1]

    def _read_claims(self, begins: Sequence[int]) -> None:
        self._insert(self._fetch(begins))

    def _fetch(self, begins: Sequence[int]) -> list[tuple[Claim, Fragment]]:
        if not begins:
            return []
        claims = self.store.read_claims(self.journal, begins)
        found = []
        for begin, claim in zip(begins, claims):
            if claim is None:
                raise _ClaimGone(
                    f"the claim at offset {begin} of journal {self.journal!r} was listed but "
                    "is gone: the journal is being deleted or its claims were removed"
                )
            found.append((claim, claim.parse_fragment(self.journal)))
        return found

    def _load(self) -> None:
        """Read the newest record, list the claims after it, read the last one and probe
        past it; all count only if no newer record appeared meanwhile (a claim listed may
        then be stale): else start over."""
        for _ in range(_RELOADS):
            self._reload_records()
            through = self.compacted_through
            begins = self.store.list_claim_begins(
                self.journal, after=through - 1 if through else None
            )
            # Read the last claim (the head) before publishing the offsets, so `head` always
            # finds the claim of the last known offset.
            last = self._fetch(begins[-1:])
            found, more = self._probe(last[-1][1].end if last else through)
            if self.records_beyond(through):
                continue
            self._insert(last + found, more_begins=[*begins, *more])
            return
        self._unsettled()

    def _advance(self, light: bool = False) -> None:
        """Read the claims past the known head; they count only if no record ends past the
        head after they were read (else: read the records, and go on from their end).
        `light`: finding none, trust the last listing of the records (see `poll`)."""
        for _ in range(_RELOADS):
            head = self.head
            found, more = self._probe(head)
            if light and not found:
                return
            if not self.records_beyond(head):
                self._insert(found, more_begins=more)
                return
            self._reload_records()
        self._unsettled()

    def _probe(self, head: int) -> tuple[list[tuple[Claim, Fragment]], list[int]]:
        """The claims from `head` on (read, not yet counted): a few GETs along the chain, a
        LIST when there are many. Returns (claims read, offsets listed but not read)."""
        found: list[tuple[Claim, Fragment]] = []
        pos = head
        for _ in range(_PROBES_BEFORE_LIST):
            claim = self.store.read_claim(self.journal, pos)
            if claim is None:
                return found, []
            self._check_incarnation(claim)
            fragment = claim.parse_fragment(self.journal)
            found.append((claim, fragment))
            pos = fragment.end
        # Many new claims: list those after the last one read, then read the last of them
        # and the claim at its end.
        begins = self.store.list_claim_begins(self.journal, after=found[-1][0].begin)
        found += self._fetch(begins[-1:])
        claim = self.store.read_claim(self.journal, found[-1][1].end)
        if claim is not None:
            self._check_incarnation(claim)
            found.append((claim, claim.parse_fragment(self.journal)))
        return found, begins

    def _unsettled(self) -> NoReturn:
        raise StorageUnavailable(
            f"journal {self.journal!r}: its compaction records kept changing while its "
            f"claims were read ({_RELOADS} times); try again"
        )

    def _insert(
        self, items: list[tuple[Claim, Fragment]], more_begins: Sequence[int] = ()
    ) -> None:
        """Record claims read from the store, plus offsets known (from a listing) to hold
        claims not read yet. The latter must not extend past the last claim in `items`.
        Raises JournalRecreated for a claim of another incarnation of the journal."""
        for claim, _ in items:
            self._check_incarnation(claim)
        with self._cond:
            begins = self._begins
            changed = False
            through = self._through  # claims below it are in the compaction record
            items = [item for item in items if item[0].begin >= through]
            more_begins = [b for b in more_begins if b >= through]
            for claim, fragment in items:
                if claim.begin not in self._claims:
                    self._claims[claim.begin] = (claim, fragment)
                    changed = True
            for begin in [*more_begins, *(c.begin for c, _ in items)]:
                if not begins or begin > begins[-1]:
                    begins.append(begin)
                    changed = True
                else:
                    i = bisect.bisect_left(begins, begin)
                    if begins[i] != begin:
                        begins.insert(i, begin)
                        changed = True
            if changed:
                self._changed_locked()


class GazetteIndex(JournalIndex):
    """Index of a Gazette fragment store: the cover set of the listed fragment files."""

    gazette = True

    def __init__(self, store: FragmentStore, journal: str) -> None:
        super().__init__(store, journal)
        self._fragments: list[Fragment] = []
        self._begins: list[int] = []

    @property
    def head(self) -> int:
        with self._cond:
            return self._fragments[-1].end if self._fragments else 0

    @property
    def first(self) -> int:
        with self._cond:
            return self._fragments[0].begin if self._fragments else 0

    def locate(self, offset: int) -> Fragment | None:
        with self._cond:
            frags = self._fragments
            if not frags or offset >= frags[-1].end:
                return None
            i = bisect.bisect_right(self._begins, offset) - 1
            if i >= 0 and frags[i].end > offset:
                return frags[i]
            return frags[i + 1]  # Gazette skips holes in a fragment store

    def fragments(self) -> list[Fragment]:
        with self._cond:
            return list(self._fragments)

    def refresh(self) -> int:
        with self._refresh_lock:
            fragments = cover_set(self.store.list_fragments(self.journal, postfixes=True))
            with self._cond:
                if fragments != self._fragments:
                    self._fragments = fragments
                    self._begins = [f.begin for f in fragments]
                    self._changed_locked()
            self._loaded = True
        return self.head
