"""A full integrity check of one journal: `JournalClient.verify` and `oncelog journals verify`.

Readers check the cheapest sum a fragment allows (CRC-32C block sums, or the CRC-32C of a
compressed object), which proves the stored object is what its writer stored. A full check
also proves the writer stored what the fragment's name says: every fragment **readers
read** is read whole and checked against BOTH the SHA1 in its name (over the content) and
every CRC-32C recorded for it (block sums over the content; a claim's `stored_crc32c` over
the stored object).

What readers read (see oncelog.journal.index.ClaimsIndex) is the newest compaction record's
fragments holding offsets from the journal's first available offset on (checked against
the record's block sums), then the claims from the record's `through` on (checked against
the claims' CRCs). Claims below that `through` never count for readers, so they are not
checked: those left for retirement are only counted (`VerifyReport.retiring`). Reported,
each naming the journal, the fragment (or claim, or record) and the journal offsets:
missing fragments, checksum mismatches, compaction records and claims that cannot be read,
a gap between the record's `through` and the first claim after it, and gaps or overlaps
between claims. Costs one whole read of the journal (SHA1 at ~1-2 GB/s per core).

Maintenance may run meanwhile: a compaction, retirement or trim that supersedes the record
in use may delete a fragment or claim after it was listed. A "missing" fragment or a gap
that the newest record (read again) explains is therefore never reported: the check starts
over from the new record (at most `_ATTEMPTS` times, then StorageUnavailable: try again).
A problem the new record does not explain (it still names the fragment; it does not cover
the offsets) is reported.

Gazette stores (journals without an oncelog spec) have no claims: their fragments are
checked against their SHA1s, and holes between them are reported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import crc32c

from oncelog.journal._blocks import BlockSums, verify_content
from oncelog.journal.errors import (
    CorruptRecord,
    FragmentChecksumError,
    JournalError,
    MissingFragment,
    StorageUnavailable,
)
from oncelog.journal.fragment import Fragment, content_sum, cover_set, decode
from oncelog.journal.records import (
    CompactionRecord,
    RecordName,
    effective,
    list_records,
    newest_record,
    read_record,
)
from oncelog.journal.store import Claim, CorruptClaim, FragmentStore

__all__ = ["VerifyProblem", "VerifyReport", "verify_journal"]

_ATTEMPTS = 5
"""A check whose record was superseded under it (and that found a problem the new record
explains) starts over at most this many times in all."""

_WINDOW = 32  # claims read together (concurrent GETs on S3)


@dataclass(frozen=True, slots=True)
class VerifyProblem:
    """One integrity problem: the journal, the fragment content name (or `claim <offset as
    16 hex digits>` when the claim itself is unreadable, `compaction record <name>` when the
    record is), the journal offsets [begin, end) concerned, and what is wrong."""

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
    """Fragments read and checked (missing ones excluded): those readers read."""
    bytes: int = 0
    """Content bytes checked (whole fragments: the first may begin before `begin`)."""
    begin: int = 0
    """The journal's first available offset (reading offset 0 starts here)."""
    head: int = 0
    """Write head: end of the last claimed fragment (or of the compaction record)."""
    problems: list[VerifyProblem] = field(default_factory=list)
    retiring: int = 0
    """Claims below the compaction record's `through` awaiting retirement: readers never
    use them, so they are not checked (not a problem)."""

    @property
    def ok(self) -> bool:
        return not self.problems


_RECORD, _CLAIM, _GAZETTE = "record", "claim", "gazette"


@dataclass(frozen=True, slots=True)
class _Item:
    """A fragment readers read, with the sums recorded for it; `kind`: who names it
    (_RECORD: the compaction record `record`, _CLAIM: its claim, _GAZETTE: nobody)."""

    fragment: Fragment
    blocks: BlockSums | None
    stored_crc32c: int | None
    kind: str
    record: str = ""


@dataclass(frozen=True, slots=True)
class _Doubt:
    """A problem that maintenance racing the check could have caused: `name` missing (a
    fragment the record in use named), or offsets from `begin` on no longer claimed."""

    begin: int
    name: str | None = None


class _Restart(Exception):
    """The record in use was superseded and explains a problem found: check again."""


class _Progress:
    """`progress(done, total)` across attempts: never goes back, the total only grows."""

    def __init__(self, callback: Callable[[int, int], None] | None) -> None:
        self._callback = callback
        self._base = 0
        self._done = 0
        self._total = 0

    def start(self, total: int) -> None:
        self._base = self._done
        self._total = self._base + total
        self._emit()

    def step(self, done: int) -> None:
        self._done = self._base + done
        self._emit()

    def _emit(self) -> None:
        if self._callback is not None:
            self._callback(self._done, self._total)


def verify_journal(
    store: FragmentStore,
    journal: str,
    *,
    gazette: bool,
    incarnation: str = "",
    progress: Callable[[int, int], None] | None = None,
) -> VerifyReport:
    """Check journal `journal` in full (see the module docstring); `progress(done, total)`
    is called with content bytes checked so far and in all, before and after each fragment
    (a check that starts over goes on counting, its total grown). `incarnation`: the
    journal's (from its spec), whose compaction records count. Storage outages propagate
    (StorageUnavailable); integrity problems are collected."""
    tracker = _Progress(progress)
    if gazette:
        fragments = cover_set(store.list_fragments(journal, postfixes=True))
        report = VerifyReport(journal)
        if fragments:
            report.begin, report.head = fragments[0].begin, fragments[-1].end
        items = [_Item(f, None, None, _GAZETTE) for f in fragments]
        _check_items(store, journal, items, None, report, tracker, gap_word="fragment")
        return report
    for _ in range(_ATTEMPTS):
        try:
            return _verify_claimed(store, journal, incarnation, tracker)
        except _Restart:
            continue
    raise StorageUnavailable(
        f"journal {journal!r}: its compaction records kept changing while it was verified "
        f"({_ATTEMPTS} times); try again"
    )


def _verify_claimed(
    store: FragmentStore, journal: str, incarnation: str, tracker: _Progress
) -> VerifyReport:
    """One attempt at an oncelog journal; raises _Restart if the record in use was
    superseded meanwhile in a way that explains a problem found."""
    report = VerifyReport(journal)
    record, first, key = _record(store, journal, incarnation, report)
    through = record.through if record is not None else (key[0] if key else 0)
    items: list[_Item] = []
    if record is not None:
        items = [_Item(f, b, None, _RECORD, record.name) for f, b in effective(record, first)]
    begins = store.list_claim_begins(journal)
    report.retiring = sum(1 for b in begins if b < through)
    claimed = _claimed(store, journal, incarnation, [b for b in begins if b >= through], report)
    items += claimed
    if key is not None:
        report.begin = first
    elif items:
        report.begin = items[0].fragment.begin
    report.head = items[-1].fragment.end if items else through
    expect = (through, f"the compaction record ending at {through}") if key is not None else None
    doubts = _check_items(store, journal, items, expect, report, tracker, gap_word="claim")
    if doubts:
        _recheck(store, journal, incarnation, key, doubts)
    return report


def _record(
    store: FragmentStore, journal: str, incarnation: str, report: VerifyReport
) -> tuple[CompactionRecord | None, int, tuple[int, int] | None]:
    """The record readers use now, the first available offset and the record's key (also
    that of an unreadable record, which is then reported: readers fail on it, and only the
    claims from the `through` in its name on can be checked)."""
    try:
        record, first, _ = newest_record(store, journal, incarnation)
    except CorruptRecord as exc:
        bad = _corrupt_record(store, journal, incarnation)
        if bad is None:
            raise _Restart() from exc  # replaced or removed since: look again
        name, error = bad
        report.problems.append(
            VerifyProblem(
                journal,
                f"compaction record {name.name}",
                name.start,
                name.through,
                f"{error}; readers of the journal fail on it, and its fragments cannot be checked",
            )
        )
        return None, name.start, name.key
    return record, first, record.key if record is not None else None


def _corrupt_record(
    store: FragmentStore, journal: str, incarnation: str
) -> tuple[RecordName, CorruptRecord] | None:
    """The unreadable record that stops `newest_record` (the same walk, newest first), or
    None if a readable record of this incarnation comes first now."""
    for name in reversed(list_records(store, journal)):
        try:
            record = read_record(store, journal, name.name)
        except CorruptRecord as exc:
            return name, exc
        if record is None:
            continue
        if incarnation and record.incarnation and record.incarnation != incarnation:
            continue
        return None
    return None


def _recheck(
    store: FragmentStore,
    journal: str,
    incarnation: str,
    key: tuple[int, int] | None,
    doubts: list[_Doubt],
) -> None:
    """Raise _Restart if the newest record now differs from the one checked and explains a
    doubt: it no longer names a missing fragment, or it covers offsets found unclaimed."""
    try:
        record, first, _ = newest_record(store, journal, incarnation)
    except CorruptRecord as exc:
        bad = _corrupt_record(store, journal, incarnation)
        if bad is not None and bad[0].key == key:
            return  # the unreadable record checked (and reported) is still the newest
        raise _Restart() from exc  # a new record, unreadable: the next attempt reports it
    if record is None or record.key == key:
        return
    names = {f.content_name for f, _ in effective(record, first)}
    for doubt in doubts:
        if doubt.name is not None and doubt.name not in names:
            raise _Restart()
        if doubt.name is None and record.through > doubt.begin:
            raise _Restart()


def _claimed(
    store: FragmentStore,
    journal: str,
    incarnation: str,
    begins: list[int],
    report: VerifyReport,
) -> list[_Item]:
    """The claims at `begins` with their fragments; unreadable claims, and claims of another
    incarnation of the journal (readers refuse them), become problems. A claim deleted
    since the listing is left out (the gap it leaves is checked against the records)."""
    out: list[_Item] = []
    for i in range(0, len(begins), _WINDOW):
        window = begins[i : i + _WINDOW]
        try:
            claims = store.read_claims(journal, window)
        except CorruptClaim:
            claims = [_read_one(store, journal, b, report) for b in window]
        for begin, claim in zip(window, claims):
            if claim is None:
                continue
            try:
                fragment = claim.parse_fragment(journal)
            except CorruptClaim as exc:
                report.problems.append(_claim_problem(journal, begin, str(exc)))
                continue
            if incarnation and claim.incarnation and claim.incarnation != incarnation:
                report.problems.append(
                    _claim_problem(
                        journal,
                        begin,
                        f"the claim at offset {begin} belongs to another incarnation of the "
                        f"journal ({claim.incarnation}, not {incarnation}): readers refuse it",
                    )
                )
            out.append(_Item(fragment, claim.blocks, claim.stored_crc32c, _CLAIM))
    return out


def _claim_problem(journal: str, begin: int, what: str) -> VerifyProblem:
    return VerifyProblem(journal, f"claim {begin:016x}", begin, begin, what)


def _read_one(store: FragmentStore, journal: str, begin: int, report: VerifyReport) -> Claim | None:
    try:
        return store.read_claim(journal, begin)
    except CorruptClaim as exc:
        report.problems.append(_claim_problem(journal, begin, str(exc)))
        return None


def _check_items(
    store: FragmentStore,
    journal: str,
    items: list[_Item],
    expect: tuple[int, str] | None,
    report: VerifyReport,
    tracker: _Progress,
    *,
    gap_word: str,
) -> list[_Doubt]:
    """Check every item in order, and that each claimed fragment (or Gazette fragment)
    begins where the one before ends; `expect`: where the first claim must begin and what
    ends there (a compaction record's fragments are contiguous, checked when it is read).
    Returns the problems maintenance could have caused (missing fragments, gaps)."""
    doubts: list[_Doubt] = []
    total = sum(item.fragment.content_length for item in items)
    tracker.start(total)
    done = 0
    end, before = expect if expect is not None else (None, "")
    for item in items:
        fragment = item.fragment
        if item.kind != _RECORD:
            if end is not None and fragment.begin > end:
                report.problems.append(
                    VerifyProblem(
                        journal,
                        fragment.content_name,
                        end,
                        fragment.begin,
                        f"gap: no {gap_word} covers offsets {end}-{fragment.begin} (between "
                        f"{before} and {fragment.content_name})",
                    )
                )
                doubts.append(_Doubt(end))
            elif end is not None and fragment.begin < end and item.kind == _CLAIM:
                report.problems.append(
                    VerifyProblem(
                        journal,
                        fragment.content_name,
                        fragment.begin,
                        end,
                        f"overlap: {before} and {fragment.content_name} both hold offsets "
                        f"{fragment.begin}-{end}",
                    )
                )
            end, before = fragment.end, fragment.content_name
        what, missing = _check_fragment(store, item)
        if what is None:
            report.fragments += 1
            report.bytes += fragment.content_length
        else:
            report.problems.append(
                VerifyProblem(journal, fragment.content_name, fragment.begin, fragment.end, what)
            )
            if missing:
                name = fragment.content_name if item.kind == _RECORD else None
                doubts.append(_Doubt(fragment.begin, name))
        done += fragment.content_length
        tracker.step(done)
    return doubts


def _check_fragment(store: FragmentStore, item: _Item) -> tuple[str | None, bool]:
    """(None, False) if the fragment is present and matches its SHA1 and every CRC recorded
    for it; else (what is wrong: every mismatch found, not only the first; whether it is
    missing)."""
    fragment = item.fragment
    path = store.fragment_path(fragment)
    named = {_RECORD: f"compaction record {item.record}", _CLAIM: "the claim"}.get(item.kind)
    try:
        stored = store.backend.read(path, fragment.size or fragment.content_length)
    except FileNotFoundError:
        if named is None:
            return f"fragment missing: {path} was listed but is not in the store", True
        return f"fragment missing: {named} names {path}, which is not in the store", True
    except MissingFragment as exc:
        return str(exc), True
    found: list[str] = []
    if item.stored_crc32c is not None:
        actual = crc32c.crc32c(stored)
        if actual != item.stored_crc32c:
            found.append(
                f"the stored object ({len(stored)} bytes) has CRC-32C {actual:08x}, its claim "
                f"records {item.stored_crc32c:08x}"
            )
    try:
        content = decode(fragment, stored)
    except FragmentChecksumError as exc:
        found.append(str(exc))
        return "; ".join(found), False
    if len(content) != fragment.content_length:
        found.append(f"holds {len(content)} bytes, its name says {fragment.content_length}")
        return "; ".join(found), False
    actual_sum = content_sum(content)
    if actual_sum != fragment.sum:
        found.append(f"SHA1 of content is {actual_sum}, its name says {fragment.sum}")
    if item.blocks is not None:
        try:
            verify_content(fragment.journal, fragment, content, item.blocks)
        except FragmentChecksumError as exc:
            what = str(exc).split(": ", 1)[-1]
            if item.kind == _RECORD:
                what = what.replace("its claim records", f"{named} records")
            found.append(what)
        except JournalError as exc:  # pragma: no cover - defensive
            found.append(str(exc))
    return ("; ".join(found) or None), False
