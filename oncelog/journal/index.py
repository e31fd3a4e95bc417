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

Gazette mode (`GazetteIndex`, no spec: a Gazette broker's fragment store): fragment objects
define the journal. Every refresh lists them all and keeps Gazette's cover set (the longest
covering fragment at each offset).
"""

from __future__ import annotations

import bisect
import threading
from typing import Sequence

from oncelog.journal._blocks import BlockSums
from oncelog.journal.compaction import CompactionRecord, effective, newest_record
from oncelog.journal.errors import JournalRecreated, MissingFragment, OffsetNotAvailable
from oncelog.journal.fragment import Fragment, cover_set
from oncelog.journal.store import Claim, FragmentStore

__all__ = ["JournalIndex", "ClaimsIndex", "GazetteIndex"]

_PROBES_BEFORE_LIST = 3
_CLAIM_WINDOW = 32  # claims read together (concurrently) when a reader reaches unread ones


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

    def forget(self) -> None:
        """Drop everything known (after the journal was deleted)."""

    def ensure_loaded(self) -> int:
        if not self._loaded:
            return self.refresh()
        return self.head

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

    @property
    def head(self) -> int:
        with self._cond:
            return self._head_locked()

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
            record, first, _ = newest_record(self.store, self.journal, self.incarnation)
            return self._set_record(record, first)

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
                    if offset != 0:
                        raise OffsetNotAvailable(
                            f"offset {offset} of journal {self.journal!r} is before its first "
                            f"available offset {first} (the data before was trimmed)"
                        )
                    offset = first  # offset 0 jumps to the first offset still stored
                    if offset >= self._head_locked():
                        return None
                if offset < self._through:
                    j = max(bisect.bisect_right(self._rec_begins, offset) - 1, 0)
                    return self._rec[self._rec_begins[j]][0]
            i = bisect.bisect_right(begins, offset) - 1
            first = begins[0]
            if i < 0:
                if offset != 0:
                    raise OffsetNotAvailable(
                        f"offset {offset} of journal {self.journal!r} is before its first "
                        f"fragment, which begins at {first}"
                    )
                i = 0  # offset 0 jumps to the first offset still stored (retention)
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
        record, first, _ = newest_record(self.store, self.journal, self.incarnation)
        self._set_record(record, first)
        through = self.compacted_through
        begins = self.store.list_claim_begins(self.journal, after=through - 1 if through else None)
        # Read the last claim (the head) before publishing the offsets, so `head` always
        # finds the claim of the last known offset.
        self._insert(self._fetch(begins[-1:]), more_begins=begins)
        self._advance()

    def _advance(self) -> None:
        for _ in range(_PROBES_BEFORE_LIST):
            claim = self.store.read_claim(self.journal, self.head)
            if claim is None:
                return
            self.add(claim, claim.parse_fragment(self.journal))
        # Many new claims: list those after the last known one, then read the last of them.
        with self._cond:
            last = self._begins[-1] if self._begins else None
        begins = self.store.list_claim_begins(self.journal, after=last)
        self._insert(self._fetch(begins[-1:]), more_begins=begins)
        claim = self.store.read_claim(self.journal, self.head)
        if claim is not None:
            self.add(claim, claim.parse_fragment(self.journal))

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
