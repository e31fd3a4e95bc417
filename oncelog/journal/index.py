"""The fragment index of one journal: which fragment holds each offset, and the write head.

Claims mode (journals with an oncelog spec): the journal is exactly the claimed fragments.
Claims are immutable and contiguous (each is created at the end of the one before), so the
index is loaded once with one LIST and a GET per claim, then kept fresh from the known head:
a GET of the claim at the head (a 404 means nothing new), and a LIST starting after the head
only when many new claims appeared.

Gazette mode (no spec: a Gazette broker's fragment store): fragment objects define the
journal. Every refresh lists them all and keeps Gazette's cover set (the longest covering
fragment at each offset).
"""

from __future__ import annotations

import bisect
import threading
from oncelog.journal.errors import MissingFragment, OffsetNotAvailable
from oncelog.journal.fragment import Fragment, cover_set
from oncelog.journal.store import Claim, FragmentStore

__all__ = ["JournalIndex"]

_PROBES_BEFORE_LIST = 3


class JournalIndex:
    """Known fragments of one journal and its write head, safe to share between threads."""

    def __init__(self, store: FragmentStore, journal: str, gazette: bool = False) -> None:
        self.store = store
        self.journal = journal
        self.gazette = gazette
        self._cond = threading.Condition(threading.Lock())
        self._refresh_lock = threading.Lock()
        self._fragments: list[Fragment] = []
        self._begins: list[int] = []
        self._claims: dict[int, Claim] = {}
        self._loaded = False
        self._version = 0

    # -- reading the index --------------------------------------------------------------------

    @property
    def head(self) -> int:
        """The write head as last seen (call `refresh` first for a fresh value)."""
        with self._cond:
            return self._fragments[-1].end if self._fragments else 0

    @property
    def loaded(self) -> bool:
        return self._loaded

    @property
    def version(self) -> int:
        """Bumped on every change; readers wait for it to move."""
        return self._version

    def fragments(self) -> list[Fragment]:
        with self._cond:
            return list(self._fragments)

    def claim(self, begin: int) -> Claim | None:
        with self._cond:
            return self._claims.get(begin)

    def first_offset(self) -> int:
        with self._cond:
            return self._fragments[0].begin if self._fragments else 0

    def locate(self, offset: int) -> Fragment | None:
        """The fragment to read `offset` from, or None at or past the head.

        Raises OffsetNotAvailable for an offset (other than 0) before the first fragment and
        MissingFragment for an offset inside the journal that no claim covers."""
        with self._cond:
            frags = self._fragments
            if not frags or offset >= frags[-1].end:
                return None
            i = bisect.bisect_right(self._begins, offset) - 1
            if i >= 0 and frags[i].end > offset:
                return frags[i]
            nxt = frags[i + 1]
            if i < 0:
                if offset == 0 or self.gazette:
                    return nxt  # the reader jumps to the first available offset
                raise OffsetNotAvailable(
                    f"offset {offset} of journal {self.journal!r} is before its first fragment, "
                    f"which begins at {nxt.begin}"
                )
            if self.gazette:
                return nxt  # Gazette skips holes in a fragment store
            raise MissingFragment(
                f"no claim covers offsets {frags[i].end}-{nxt.begin} of journal "
                f"{self.journal!r} (offset {offset} asked); its claims were removed"
            )

    def wait_for_change(self, version: int, timeout: float) -> bool:
        """Block until the index changes from `version` (e.g. a local append) or timeout."""
        with self._cond:
            if self._version != version:
                return True
            return self._cond.wait_for(lambda: self._version != version, timeout)

    def notify(self) -> None:
        """Wake waiting readers (used when the reader is closed)."""
        with self._cond:
            self._version += 1
            self._cond.notify_all()

    # -- updating the index -------------------------------------------------------------------

    def refresh(self) -> int:
        """Bring the index up to date with the store; returns the write head."""
        with self._refresh_lock:
            if self.gazette:
                self._replace(cover_set(self.store.list_fragments(self.journal, postfixes=True)))
            elif not self._loaded:
                self._load_all()
            else:
                self._advance()
            self._loaded = True
        return self.head

    def ensure_loaded(self) -> int:
        if not self._loaded:
            return self.refresh()
        return self.head

    def add(self, claim: Claim, fragment: Fragment) -> None:
        """Record a claim this process just won (or read)."""
        self._add_many([(claim, fragment)])

    def _replace(self, fragments: list[Fragment]) -> None:
        with self._cond:
            changed = fragments != self._fragments
            self._fragments = fragments
            self._begins = [f.begin for f in fragments]
            if changed:
                self._version += 1
                self._cond.notify_all()

    def _load_all(self) -> None:
        begins = self.store.list_claim_begins(self.journal)
        claims = self.store.read_claims(self.journal, begins)
        self._add_many(
            [(c, c.parse_fragment(self.journal)) for c in claims if c is not None], reset=True
        )

    def _advance(self) -> None:
        for _ in range(_PROBES_BEFORE_LIST):
            head = self.head
            claim = self.store.read_claim(self.journal, head)
            if claim is None:
                return
            self.add(claim, claim.parse_fragment(self.journal))
        # Many new claims: list those after the last known one, then fetch them together.
        with self._cond:
            last = self._fragments[-1].begin if self._fragments else None
        begins = self.store.list_claim_begins(self.journal, after=last)
        claims = self.store.read_claims(self.journal, begins)
        self._add_many([(c, c.parse_fragment(self.journal)) for c in claims if c is not None])

    def _add_many(self, items: list[tuple[Claim, Fragment]], reset: bool = False) -> None:
        with self._cond:
            if reset:
                self._claims, self._fragments, self._begins = {}, [], []
            fresh = [(c, f) for c, f in items if c.begin not in self._claims]
            if not fresh and not reset:
                return
            for claim, _ in fresh:
                self._claims[claim.begin] = claim
            new = sorted((f for _, f in fresh), key=lambda f: f.begin)
            if not self._fragments or (new and new[0].begin > self._fragments[-1].begin):
                self._fragments.extend(new)
                self._begins.extend(f.begin for f in new)
            else:
                self._fragments = sorted(self._fragments + new, key=lambda f: f.begin)
                self._begins = [f.begin for f in self._fragments]
            self._version += 1
            self._cond.notify_all()

    def forget(self) -> None:
        """Drop everything known (after the journal was deleted)."""
        with self._refresh_lock, self._cond:
            self._fragments, self._begins, self._claims = [], [], {}
            self._loaded = False
            self._version += 1
            self._cond.notify_all()

