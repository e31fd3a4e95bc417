"""A full integrity check of one journal: `JournalClient.verify` and `oncelog journals verify`.

Readers check the cheapest sum a fragment's claim allows (CRC-32C block sums, or the CRC-32C
of a compressed object), which proves the stored object is what its writer stored. A full
check also proves the writer stored what the fragment's name says: every claimed fragment is
read whole and checked against BOTH the SHA1 in its name (over the content) and every
CRC-32C its claim records (block sums over the content; `stored_crc32c` over the stored
object); claims naming a missing fragment, claims that cannot be parsed and gaps between
claims are reported too. Every problem names the journal, the fragment (or claim) and the
journal offsets. Costs one whole read of the journal (SHA1 at ~1-2 GB/s per core).

Gazette stores (journals without an oncelog spec) have no claims: their fragments are
checked against their SHA1s, and holes between them are reported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import crc32c

from oncelog.journal._blocks import verify_content
from oncelog.journal.errors import FragmentChecksumError, JournalError, MissingFragment
from oncelog.journal.fragment import Fragment, content_sum, cover_set, decode
from oncelog.journal.store import Claim, CorruptClaim, FragmentStore

__all__ = ["VerifyProblem", "VerifyReport", "verify_journal"]


@dataclass(frozen=True, slots=True)
class VerifyProblem:
    """One integrity problem: the journal, the fragment content name (or the claim offset
    as 16 hex digits when the claim itself is unreadable), the journal offsets [begin, end)
    concerned, and what is wrong."""

    journal: str
    fragment: str
    begin: int
    end: int
    what: str

    def __str__(self) -> str:
        return (
            f"journal {self.journal!r}, fragment {self.fragment}, offsets "
            f"{self.begin}-{self.end}: {self.what}"
        )


@dataclass(slots=True)
class VerifyReport:
    """What `JournalClient.verify` checked and found: `ok` when `problems` is empty."""

    journal: str
    fragments: int = 0
    """Fragments read and checked (missing ones excluded)."""
    bytes: int = 0
    """Content bytes checked."""
    begin: int = 0
    """First offset of the journal still stored (claims below were removed by retention)."""
    head: int = 0
    """Write head: end of the last claimed fragment."""
    problems: list[VerifyProblem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_journal(
    store: FragmentStore,
    journal: str,
    *,
    gazette: bool,
    progress: Callable[[int, int], None] | None = None,
) -> VerifyReport:
    """Check journal `journal` in full (see the module docstring); `progress(done, total)`
    is called with content bytes checked so far and in all, before and after each fragment.
    Storage outages propagate (StorageUnavailable); integrity problems are collected."""
    report = VerifyReport(journal)
    if gazette:
        fragments = cover_set(store.list_fragments(journal, postfixes=True))
        items: list[tuple[Fragment, Claim | None]] = [(f, None) for f in fragments]
    else:
        items = _claimed(store, journal, report)
    items.sort(key=lambda item: item[0].begin)
    if items:
        report.begin, report.head = items[0][0].begin, items[-1][0].end
    total = sum(f.content_length for f, _ in items)
    done = 0
    if progress is not None:
        progress(done, total)
    previous: Fragment | None = None
    for fragment, claim in items:
        if previous is not None and fragment.begin > previous.end:
            report.problems.append(
                VerifyProblem(
                    journal,
                    fragment.content_name,
                    previous.end,
                    fragment.begin,
                    f"gap: no {'fragment' if gazette else 'claim'} covers offsets "
                    f"{previous.end}-{fragment.begin} (between {previous.content_name} and "
                    f"{fragment.content_name})",
                ),
            )
        previous = fragment
        what = _check_fragment(store, fragment, claim)
        if what is None:
            report.fragments += 1
            report.bytes += fragment.content_length
        elif what:
            report.problems.append(
                VerifyProblem(journal, fragment.content_name, fragment.begin, fragment.end, what)
            )
        done += fragment.content_length
        if progress is not None:
            progress(done, total)
    return report


def _claimed(
    store: FragmentStore, journal: str, report: VerifyReport
) -> list[tuple[Fragment, Claim | None]]:
    """Every claim of the journal with its fragment; unreadable claims become problems."""
    begins = store.list_claim_begins(journal)
    out: list[tuple[Fragment, Claim | None]] = []
    for i in range(0, len(begins), 32):
        window = begins[i : i + 32]
        try:
            claims = store.read_claims(journal, window)
        except CorruptClaim:
            claims = [_read_one(store, journal, b, report) for b in window]
        for begin, claim in zip(window, claims):
            if claim is None:
                continue  # deleted since the listing (a trim), or reported by _read_one
            try:
                out.append((claim.parse_fragment(journal), claim))
            except CorruptClaim as exc:
                report.problems.append(
                    VerifyProblem(journal, f"claim {begin:016x}", begin, begin, str(exc))
                )
    return out


def _read_one(store: FragmentStore, journal: str, begin: int, report: VerifyReport) -> Claim | None:
    try:
        return store.read_claim(journal, begin)
    except CorruptClaim as exc:
        report.problems.append(
            VerifyProblem(journal, f"claim {begin:016x}", begin, begin, str(exc))
        )
        return None


def _check_fragment(store: FragmentStore, fragment: Fragment, claim: Claim | None) -> str | None:
    """None if the fragment is present and matches its SHA1 and every CRC its claim records;
    else what is wrong (every mismatch found, not only the first)."""
    path = store.fragment_path(fragment)
    try:
        stored = store.backend.read(path, fragment.size or fragment.content_length)
    except FileNotFoundError:
        return f"fragment missing: the claim names {path}, which is not in the store"
    except MissingFragment as exc:
        return str(exc)
    found: list[str] = []
    if claim is not None and claim.stored_crc32c is not None:
        actual = crc32c.crc32c(stored)
        if actual != claim.stored_crc32c:
            found.append(
                f"the stored object ({len(stored)} bytes) has CRC-32C {actual:08x}, its claim "
                f"records {claim.stored_crc32c:08x}"
            )
    try:
        content = decode(fragment, stored)
    except FragmentChecksumError as exc:
        found.append(str(exc))
        return "; ".join(found)
    if len(content) != fragment.content_length:
        found.append(f"holds {len(content)} bytes, its name says {fragment.content_length}")
        return "; ".join(found)
    actual_sum = content_sum(content)
    if actual_sum != fragment.sum:
        found.append(f"SHA1 of content is {actual_sum}, its name says {fragment.sum}")
    if claim is not None and claim.blocks is not None:
        try:
            verify_content(fragment.journal, fragment, content, claim.blocks)
        except FragmentChecksumError as exc:
            found.append(str(exc).split(": ", 1)[-1])
        except JournalError as exc:  # pragma: no cover - defensive
            found.append(str(exc))
    return "; ".join(found) or None
