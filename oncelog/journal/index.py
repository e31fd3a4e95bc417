"""The fragment index of one journal: which fragment holds each offset, and the write head.

Claims mode (`ClaimsIndex`, journals with an oncelog spec): the journal is exactly the
claimed fragments. Claims are immutable and contiguous (each is created at the end of the
one before), so a cold index lists the claim offsets once (one LIST per 1000 claims) and
reads only the last claim to learn the head; other claims are read when a reader gets near
them, a window at a time. It is then kept fresh from the known head: a GET of the claim at
the head (a 404 means nothing new), and a LIST starting after the head only when many new
claims appeared.

Gazette mode (`GazetteIndex`, no spec: a Gazette broker's fragment store): fragment objects
define the journal. Every refresh lists them all and keeps Gazette's cover set (the longest
covering fragment at each offset).
"""

from __future__ import annotations

import bisect
import threading
from typing import Sequence

from oncelog.journal.errors import MissingFragment, OffsetNotAvailable
from oncelog.journal.fragment import Fragment, cover_set
from oncelog.journal.store import Claim, FragmentStore

__all__ = ["JournalIndex", "ClaimsIndex", "GazetteIndex"]

_PROBES_BEFORE_LIST = 3
_CLAIM_WINDOW = 32  # claims read together (concurrently) when a reader reaches unread ones


class JournalIndex:
    """Known fragments of one journal and its write head, safe to share between threads."""

    gazette = False

    def __init__(self, store: FragmentStore, journal: str) -> None:
        self.store = store
        self.journal = journal
        self._cond = threading.Condition(threading.Lock())
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


class ClaimsIndex(JournalIndex):
    """Index of an oncelog journal: its claims, read lazily."""

    def __init__(self, store: FragmentStore, journal: str) -> None:
        super().__init__(store, journal)
        self._begins: list[int] = []  # every known claim offset, ascending
        self._claims: dict[int, tuple[Claim, Fragment]] = {}  # the claims read so far

    @property
    def head(self) -> int:
        with self._cond:
            if not self._begins:
                return 0
            return self._claims[self._begins[-1]][1].end

    def claim(self, begin: int) -> Claim | None:
        """The claim at `begin`, if this index has read it."""
        with self._cond:
            entry = self._claims.get(begin)
            return entry[0] if entry else None

    def add(self, claim: Claim, fragment: Fragment) -> None:
        """Record a claim this process just won (or read)."""
        self._insert([(claim, fragment)])

    def locate(self, offset: int) -> Fragment | None:
        with self._cond:
            begins = self._begins
            if not begins or offset >= self._claims[begins[-1]][1].end:
                return None
            i = bisect.bisect_right(begins, offset) - 1
            first = begins[0]
        if i < 0:
            if offset != 0:
                raise OffsetNotAvailable(
                    f"offset {offset} of journal {self.journal!r} is before its first "
                    f"fragment, which begins at {first}"
                )
            i = 0  # offset 0 jumps to the first offset still stored (retention)
        fragment = self._fragment_at(i)
        if fragment.end > offset or fragment.begin > offset:
            return fragment
        with self._cond:
            nxt = self._begins[i + 1]
        raise MissingFragment(
            f"no claim covers offsets {fragment.end}-{nxt} of journal {self.journal!r} "
            f"(offset {offset} asked); its claims were removed"
        )

    def fragments(self) -> list[Fragment]:
        with self._cond:
            missing = [b for b in self._begins if b not in self._claims]
        self._read_claims(missing)
        with self._cond:
            return [self._claims[b][1] for b in self._begins]

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
            self._loaded = False
            self._changed_locked()

    # -- internals ----------------------------------------------------------------------------

    def _fragment_at(self, i: int) -> Fragment:
        with self._cond:
            begin = self._begins[i]
            entry = self._claims.get(begin)
            if entry is not None:
                return entry[1]
            window = [b for b in self._begins[i : i + _CLAIM_WINDOW] if b not in self._claims]
        self._read_claims(window)
        with self._cond:
            return self._claims[begin][1]

    def _read_claims(self, begins: Sequence[int]) -> None:
        self._insert(self._fetch(begins))

    def _fetch(self, begins: Sequence[int]) -> list[tuple[Claim, Fragment]]:
        if not begins:
            return []
        claims = self.store.read_claims(self.journal, begins)
        found = []
        for begin, claim in zip(begins, claims):
            if claim is None:
                raise MissingFragment(
                    f"the claim at offset {begin} of journal {self.journal!r} was listed but "
                    "is gone: the journal is being deleted or its claims were removed"
                )
            found.append((claim, claim.parse_fragment(self.journal)))
        return found

    def _load(self) -> None:
        begins = self.store.list_claim_begins(self.journal)
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
        claims not read yet. The latter must not extend past the last claim in `items`."""
        with self._cond:
            begins = self._begins
            changed = False
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
