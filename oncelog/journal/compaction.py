"""Compaction, retirement and trimming of oncelog journals.

A journal appended to in small batches for months is made of many small fragments, each
with its claim: every cold reader pays a claim GET and a fragment GET per fragment. Here
runs of small claimed fragments are copied, whole and SHA1-verified, into fragments of
about `FragmentSpec.length` bytes (never splitting a small fragment, so frames stay
whole), and a **compaction record** tells readers to use them:

```
<root>/.oncelog/compactions/<journal>/<through:016x>-<start:016x>.json
```

The record lists fragments (content names, with the CRC-32C block sums of raw ones) that
hold the journal's offsets [start, through) contiguously. It is created put-if-absent and
never changed. Readers use the record with the largest (through, start) and take as the
journal's first offset the largest `start` of any record (a trim raises `start`; a
compactor racing it may write a record with the older `start`, which must not bring the
trimmed offsets back). Claims from `through` on are read as before, so a cold index costs
one LIST of records, one GET of the newest, one LIST of the claims after `through` and
one GET of the last claim, whatever the journal's history.

Invariants (what makes it safe without locks):

- Compaction only reads claimed history below the head and writes new objects: appends
  are never blocked and never see a compaction object. Big fragments are valid Gazette
  fragments (content name = SHA1 of content, the journal's codec) in the journal's
  directory, so a Gazette reader (cover set: the longest covering fragment) reads the
  same bytes.
- The record is written last. A compactor killed at any point leaves unreferenced big
  fragments (removed by `gc` after its grace) and a journal read exactly as before; a
  rerun starts over from the newest record.
- Two compactors racing produce the same big fragments (same inputs, same greedy cut,
  same bytes, same names) and put-if-absent records; readers pick the max. A record never
  covers bytes its writer did not read from the store, verified.
- Retirement (`retire`, run by `gc` and by `compact`) deletes small fragments and claims
  below the `through` of a record older than the grace period, except the claim at the
  highest offset below that `through` (so a listing of the claims directory is never
  empty or short of the head). Fragments referenced by the newest record or by a record
  newer than the grace are never deleted.
- Claims below the newest record's `through` never count, whatever is stored there. A
  writer idle while its journal was compacted and retired may create a claim at an offset
  retirement freed: every reader, writer and compaction therefore takes a claim read at
  offset X only if a listing of the records made after reading it shows none ending past
  X (oncelog.journal.index), and a writer checks its own new claim the same way. A record
  made *after* a writer's claim (a compaction that read it) also ends past it: each
  compaction writes, before its record, a *claims object* beside it
  (`<through>-<start>.claims`: `<begin> <writer token>` per claim it consumed), so the
  writer can tell "consumed" (its append is in the record) from "stale" (append again at
  the true head) by its own token, not by bytes another writer may have repeated.
- Trimming writes a record whose `start` is the trim point (rounded down to a fragment
  boundary) before deleting anything, and never removes the last claim: the head and
  appends are untouched.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from oncelog.coordination import MetaStore, retry_storage
from oncelog.journal._blocks import BlockSums, block_sums
from oncelog.journal.errors import (
    CorruptRecord,
    FragmentChecksumError,
    JournalError,
    MissingFragment,
)
from oncelog.journal.extensions import notify_compaction, notify_trim
from oncelog.journal.fragment import (
    Codec,
    Fragment,
    content_sum,
    decode,
    encode,
    verify,
)

# The record format and its readers live in oncelog.journal.records; re-exported here.
from oncelog.journal.records import (
    RECORDS as RECORDS,
)
from oncelog.journal.records import (
    CompactionRecord as CompactionRecord,
)
from oncelog.journal.records import (
    RecordName as RecordName,
)
from oncelog.journal.records import (
    claims_path as claims_path,
)
from oncelog.journal.records import (
    consumed_claims as consumed_claims,
)
from oncelog.journal.records import (
    delete_records as delete_records,
)
from oncelog.journal.records import (
    effective as effective,
)
from oncelog.journal.records import (
    foreign_records as foreign_records,
)
from oncelog.journal.records import (
    list_records as list_records,
)
from oncelog.journal.records import (
    newest_record as newest_record,
)
from oncelog.journal.records import (
    read_record as read_record,
)
from oncelog.journal.records import (
    record_path as record_path,
)
from oncelog.journal.records import (
    records_beyond as records_beyond,
)
from oncelog.journal.records import (
    records_dir as records_dir,
)
from oncelog.journal.store import Claim

if TYPE_CHECKING:
    from oncelog.journal.client import JournalClient
    from oncelog.journal.spec import FragmentSpec

__all__ = [
    "CompactionRecord",
    "CompactionResult",
    "CorruptRecord",
    "RecordName",
    "RetireResult",
    "TrimResult",
    "compact",
    "list_records",
    "newest_record",
    "retire",
    "trim",
]

log = logging.getLogger(__name__)

_WINDOW = 256  # objects read together (concurrent GETs on S3)

DEFAULT_GC_GRACE = timedelta(hours=1)
"""How long `gc` leaves unclaimed fragments, and retirement the history a record made
redundant: longer than a writer takes between storing a fragment and claiming it (and
checking its claim), and than a reader holds a claim before reading its fragment."""

AUTO_POLL = 1.0
"""Seconds between the auto-compaction thread's looks at the journals it watches."""
AUTO_MIN_INTERVAL = 5.0
"""At least this many seconds between two automatic compactions of one journal."""


def _meta(client: JournalClient) -> MetaStore:
    """Where records are created: put-if-absent with a token of their own (their bytes
    carry one), in oncelog's own directory."""
    return MetaStore.of(client, internal=True)


def _meta_path(journal: str, name: str) -> str:
    """A record's (or claims object's) path under `<root>/.oncelog/`."""
    return f"{RECORDS}/{journal}/{name}"


# -- results ----------------------------------------------------------------------------------


@dataclass(slots=True)
class RetireResult:
    """What `retire` deleted (or would delete, `dry_run`)."""

    journal: str
    through: int = 0
    claims: list[int] = field(default_factory=list)
    fragments: list[Fragment] = field(default_factory=list)
    records: list[str] = field(default_factory=list)
    dry_run: bool = False


@dataclass(slots=True)
class CompactionResult:
    """What `compact` did (or would do, `dry_run`): the small fragments it read, the big
    ones it wrote (fragments referenced as they are are not counted), and the record."""

    journal: str
    start: int
    through: int
    fragments_read: int = 0
    bytes_compacted: int = 0
    fragments_written: list[Fragment] = field(default_factory=list)
    chunks: list[tuple[int, int]] = field(default_factory=list)
    """Offsets of the big fragments written (or to be written, `dry_run`)."""
    record: str | None = None
    record_won: bool = False
    dry_run: bool = False
    retired: RetireResult | None = None

    @property
    def changed(self) -> bool:
        return self.record is not None


@dataclass(slots=True)
class TrimResult:
    """What `trim` did (or would do): `first` is the journal's first offset afterwards."""

    journal: str
    first: int
    fragments: list[Fragment] = field(default_factory=list)
    claims: list[int] = field(default_factory=list)
    record: str | None = None
    dry_run: bool = False

    @property
    def bytes_deleted(self) -> int:
        return sum(f.content_length for f in self.fragments)


# -- compaction -------------------------------------------------------------------------------


@dataclass(slots=True)
class _Piece:
    """A fragment to be compacted: offsets [begin, end), its newest stored time."""

    begin: int
    end: int
    time: float | None
    fragment: Fragment | None = None
    blocks: BlockSums | None = None
    claimed: bool = True
    writer: str = ""  # the writer token of its claim (claimed pieces, once read)

    @property
    def length(self) -> int:
        return self.end - self.begin


def _plan(pieces: Sequence[_Piece], target: int) -> list[list[_Piece]]:
    """Cut pieces into chunks greedily: a chunk closes once it holds `target` bytes or
    more; no piece is split. Deterministic, so racing compactors make the same chunks."""
    chunks: list[list[_Piece]] = []
    current: list[_Piece] = []
    size = 0
    for piece in pieces:
        current.append(piece)
        size += piece.length
        if size >= target:
            chunks.append(current)
            current, size = [], 0
    if current:
        chunks.append(current)
    return chunks


_REPLANS = 3
"""A compaction whose small fragments vanish under it (another compactor retired them)
plans again from the newest record, at most this many times."""


def compact(
    client: JournalClient,
    name: str,
    *,
    target_length: int | None = None,
    min_age: float = 0.0,
    dry_run: bool = False,
    progress: Callable[[int, int], None] | None = None,
    retire_grace: float | None = None,
) -> CompactionResult:
    """Compact journal `name`; see JournalClient.compact. A racing compactor that retired
    the fragments this one planned to read makes it plan again (bounded); a fragment still
    missing after that is reported (MissingFragment), never skipped."""
    for attempt in range(_REPLANS + 1):
        try:
            return _compact_once(
                client, name, target_length=target_length, min_age=min_age,
                dry_run=dry_run, progress=progress, retire_grace=retire_grace,
            )
        except MissingFragment:
            if attempt == _REPLANS:
                raise
            _reload_index(client, name)
    raise AssertionError("unreachable")


def _compact_once(
    client: JournalClient,
    name: str,
    *,
    target_length: int | None,
    min_age: float,
    dry_run: bool,
    progress: Callable[[int, int], None] | None,
    retire_grace: float | None,
) -> CompactionResult:
    spec = client.get(name)
    store = client.store
    if not dry_run:
        store.backend.require_create()
    target = target_length or spec.fragment.length
    if target <= 0:
        raise ValueError(f"target_length must be > 0, not {target_length!r}")
    codec = spec.fragment.codec
    incarnation = spec.incarnation or ""
    # Reads below are retried by the store (RetryingReads); writes retry here.
    record, first, names = newest_record(store, name, incarnation)
    through0 = record.through if record is not None else 0
    foreign = foreign_records(record, names)
    begins = store.list_claim_begins(name, after=through0 - 1 if through0 else None)
    if record is None and begins:
        first = begins[0]
    result = CompactionResult(name, first, through0, dry_run=dry_run)
    if not begins:
        return _finish(client, name, result, retire_grace, DEFAULT_GC_GRACE.total_seconds())
    if record is not None and begins[0] != through0:
        raise MissingFragment(
            f"journal {name!r}: its compaction record {record.name} ends at offset {through0} "
            f"but its next claim begins at {begins[0]}: claims were removed by hand"
        )
    last = store.read_claim(name, begins[-1])
    if last is None:
        raise MissingFragment(f"the last claim of journal {name!r} ({begins[-1]}) vanished")
    head = last.parse_fragment(name).end
    # Times of the small fragments, from one listing of the journal (by begin offset: an
    # unclaimed copy at the same offset only makes the piece look younger).
    times: dict[int, float] = {}
    for f in store.list_fragments(name):
        if f.mod_time is not None:
            times[f.begin] = max(times.get(f.begin, 0.0), f.mod_time)
    cutoff = time.time() - min_age
    pieces: list[_Piece] = []
    base: list[tuple[Fragment, BlockSums | None]] = []
    base_times: list[float | None] = []
    if record is not None:
        base = effective(record, first)
        base_times = list(record.times[len(record.fragments) - len(base) :])
    if base and base[-1][0].content_length < target:
        # The record's last (undersized) fragment is merged with what follows it.
        frag, sums = base.pop()
        pieces.append(_Piece(frag.begin, frag.end, base_times.pop(), frag, sums, claimed=False))
    ends = [*begins[1:], head]
    for b, e in zip(begins, ends):
        when = times.get(b)
        if min_age > 0 and (when is None or when > cutoff):
            break
        if e <= first:
            continue
        pieces.append(_Piece(b, e, when))
    claimed = [p for p in pieces if p.claimed]
    if not claimed:
        return _finish(client, name, result, retire_grace, DEFAULT_GC_GRACE.total_seconds())
    chunks = _plan(pieces, target)
    result.through = claimed[-1].end
    to_copy = [c for c in chunks if len(c) > 1]
    total = sum(p.length for c in to_copy for p in c)
    result.fragments_read = sum(len(c) for c in to_copy)
    result.bytes_compacted = total
    result.record = f"{result.through:016x}-{first:016x}.json"
    result.chunks = [(c[0].begin, c[-1].end) for c in to_copy]
    if dry_run:
        return result
    _read_claims(client, name, claimed)
    if records_beyond(store, name, through0, foreign):
        # A newer record appeared since planning: a claim read may be stale (made at an
        # offset that record's retirement freed). Plan again from the newest record.
        raise MissingFragment(
            f"journal {name!r}: a compaction record newer than {through0} appeared while "
            "this compaction read its claims"
        )
    done = 0
    if progress is not None:
        progress(0, total)
    out_frags: list[Fragment] = [f for f, _ in base]
    out_blocks: list[BlockSums | None] = [b for _, b in base]
    out_times: list[float | None] = base_times
    for chunk in chunks:
        when = max((p.time for p in chunk if p.time is not None), default=None)
        if len(chunk) == 1:  # referenced as it is: nothing to copy
            piece = chunk[0]
            assert piece.fragment is not None
            out_frags.append(piece.fragment)
            out_blocks.append(piece.blocks)
            out_times.append(when)
            continue
        content = _read_chunk(client, name, chunk)
        fragment, stored, sums = _build(name, chunk[0].begin, content, codec)
        retry_storage(
            lambda f=fragment, b=stored: store.write_fragment(f, b),  # type: ignore[misc]
            f"write {fragment}",
            timeout=client.retry_timeout,
            where=repr(client),
            ambiguous=True,
        )
        result.fragments_written.append(fragment)
        out_frags.append(fragment)
        out_blocks.append(sums)
        out_times.append(when)
        done += len(content)
        if progress is not None:
            progress(done, total)
    new = CompactionRecord(
        name,
        first,
        result.through,
        tuple(out_frags),
        tuple(out_blocks),
        tuple(out_times),
        incarnation,
    )
    new.check()
    # The claims it consumed, for writers that check their new claims (see
    # `consumed_claims`): written before the record, with the same bytes by a racing
    # compactor of the same range (same claims read).
    sidecar = "".join(f"{p.begin:016x} {p.writer}\n" for p in claimed).encode()
    meta = _meta(client)
    meta.write(_meta_path(name, new.name[: -len(".json")] + ".claims"), sidecar)
    result.record_won = meta.put_if_absent(_meta_path(name, new.name), new.to_bytes())
    _reload_index(client, name)
    return _finish(client, name, result, retire_grace, DEFAULT_GC_GRACE.total_seconds())


def _finish(
    client: JournalClient,
    name: str,
    result: CompactionResult,
    retire_grace: float | None,
    default: float,
) -> CompactionResult:
    if not result.dry_run:
        if result.through > result.start:
            # Layers deriving data from sealed history (columnar segments) catch up to it;
            # a rerun after a kill between the record and this finishes their work too.
            notify_compaction(client, name, result.through)
        grace = default if retire_grace is None else retire_grace
        result.retired = retire(client, name, grace)
    return result


def _read_claims(client: JournalClient, name: str, pieces: list[_Piece]) -> None:
    """Fill in each piece's fragment and block sums from its claim (windows of concurrent
    GETs); the claim must name a fragment holding exactly the piece's offsets."""
    store = client.store
    for i in range(0, len(pieces), 4 * _WINDOW):
        window = pieces[i : i + 4 * _WINDOW]
        claims = store.read_claims(name, [p.begin for p in window])
        for piece, claim in zip(window, claims):
            fragment = _claimed(name, piece, claim)
            piece.fragment, piece.blocks = fragment, claim.blocks if claim else None
            piece.writer = claim.writer if claim else ""


def _claimed(name: str, piece: _Piece, claim: Claim | None) -> Fragment:
    if claim is None:
        raise MissingFragment(
            f"the claim at offset {piece.begin} of journal {name!r} vanished during "
            "compaction (a concurrent retirement or trim?); run compact again"
        )
    fragment = claim.parse_fragment(name)
    if fragment.end != piece.end:
        raise MissingFragment(
            f"the claim at offset {piece.begin} of journal {name!r} names fragment "
            f"{fragment.content_name}, which ends at {fragment.end}, not at the next claim "
            f"({piece.end}): claims were changed by hand"
        )
    return fragment


def _read_chunk(client: JournalClient, name: str, chunk: list[_Piece]) -> bytes:
    """The verified content of the chunk's pieces, concatenated. A fragment whose bytes do
    not match its SHA1 (or cannot be decompressed) stops the compaction: its bytes are
    never copied; FragmentChecksumError names the journal, the fragment and its offsets."""
    store = client.store
    parts: list[bytes] = []
    for i in range(0, len(chunk), _WINDOW):
        window = chunk[i : i + _WINDOW]
        frags = [p.fragment for p in window]
        paths = [store.fragment_path(f) for f in frags if f is not None]
        results = store.backend.read_many(paths)
        for fragment, data in zip(frags, results):
            assert fragment is not None
            if isinstance(data, FileNotFoundError):
                raise MissingFragment(
                    f"fragment {fragment.content_name} of journal {name!r} (offsets "
                    f"{fragment.begin}-{fragment.end}) is missing: compaction stopped"
                )
            if isinstance(data, BaseException):
                raise data
            try:
                content = decode(fragment, data)
                verify(fragment, content)
            except FragmentChecksumError as exc:
                raise FragmentChecksumError(
                    f"compaction of journal {name!r} refused: {exc}; nothing of it was "
                    "copied and no record was written (restore or remove that fragment)"
                ) from exc
            parts.append(content)
    return b"".join(parts)


def _build(
    name: str, begin: int, content: bytes, codec: Codec
) -> tuple[Fragment, bytes | bytearray | memoryview, BlockSums | None]:
    fragment = Fragment(name, begin, begin + len(content), content_sum(content), codec)
    if codec is Codec.NONE:
        return fragment, content, block_sums(content)
    return fragment, encode(codec, content), None


def _reload_index(client: JournalClient, name: str) -> None:
    """Let this client's index of the journal (shared with its appender) use the newest
    record, so its count of uncompacted claims drops."""
    index = client.loaded_index(name)
    reload = getattr(index, "reload_records", None)
    if reload is not None:
        try:
            reload()
        except JournalError as exc:  # the index recovers when next used
            log.debug("journal %r: reloading records failed: %s", name, exc)


# -- retirement ---------------------------------------------------------------------------------


def retire(
    client: JournalClient, name: str, grace: float, *, dry_run: bool = False
) -> RetireResult:
    """Delete what records older than `grace` seconds made redundant: claims (but the one at
    the highest offset below the record's `through`) and fragments under its `through`
    that no record newer than `grace` (nor the newest) references, then those records but
    the newest. Claims go first, so an index still listing them finds them gone and reads
    the records again; fragments then, so a reader that read a claim before has `grace`
    to read its fragment."""
    store = client.store
    result = RetireResult(name, dry_run=dry_run)
    names = list_records(store, name)
    if not names:
        return result
    cutoff = time.time() - grace
    old = [n for n in names if n.mtime <= cutoff]
    if not old:
        return result
    spec = client.get(name)
    incarnation = spec.incarnation or ""
    newest, first, names = newest_record(store, name, incarnation)
    if newest is None:
        return result
    if newest.start < first and not dry_run:
        # A trim raised `start` in a record that is not the newest: carry it over before
        # older records go (the newest alone must then say where the journal begins).
        kept = effective(newest, first)
        fixed = CompactionRecord(
            name,
            first,
            newest.through,
            tuple(f for f, _ in kept),
            tuple(b for _, b in kept),
            tuple(newest.times[len(newest.fragments) - len(kept) :]),
            incarnation,
            "trim",
        )
        _meta(client).put_if_absent(_meta_path(name, fixed.name), fixed.to_bytes())
        newest = fixed
    through = max(n.through for n in old)
    through = min(through, newest.through)
    result.through = through
    protected = {f.content_name for f in newest.fragments}
    for n in names:
        if n.mtime > cutoff and n.key != newest.key:
            rec = read_record(store, name, n.name)
            if rec is not None:
                protected.update(f.content_name for f in rec.fragments)
    begins = store.list_claim_begins(name)
    below = [b for b in begins if b < through]
    keep_claim = below[-1] if below else None
    kept_fragment = None
    if keep_claim is not None:
        claim = store.read_claim(name, keep_claim)
        kept_fragment = claim.fragment if claim is not None else None
    result.claims = [b for b in below if b != keep_claim]
    result.fragments = [
        f
        for f in store.list_fragments(name)
        if f.end <= through
        and f.content_name not in protected
        and f.content_name != kept_fragment
        and f.mod_time is not None
        and f.mod_time <= cutoff
    ]
    result.records = [n.name for n in names if n.mtime <= cutoff and n.key != newest.key]
    if dry_run:
        return result
    store.delete_claims(name, result.claims)
    store.delete_fragments(result.fragments)
    store.backend.delete(
        [record_path(store, name, r) for r in result.records]
        + [claims_path(store, name, r) for r in result.records]
    )
    return result


def gc_skips(client: JournalClient, name: str) -> int:
    """The offset below which unclaimed fragments are left to `retire` by `gc` (they may
    be small fragments a record covers but that are still within the grace period)."""
    names = list_records(client.store, name)
    return max((n.through for n in names), default=0)


# -- trimming ------------------------------------------------------------------------------------


def trim(
    client: JournalClient,
    name: str,
    before: int | datetime | None = None,
    *,
    dry_run: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> TrimResult:
    """Trim journal `name`; see JournalClient.trim."""
    spec = client.get(name)
    store = client.store
    incarnation = spec.incarnation or ""
    if before is None:
        if not spec.fragment.retention:
            raise ValueError(
                f"journal {name!r} has no retention (FragmentSpec.retention is 0): pass "
                "before= an offset or a datetime"
            )
        before = datetime.fromtimestamp(time.time() - spec.fragment.retention, UTC)
    if isinstance(before, bool) or not isinstance(before, (int, datetime)):
        raise TypeError(f"trim before= takes an offset or a datetime, not {before!r}")
    if isinstance(before, int) and before < 0:
        raise ValueError(f"trim point of journal {name!r} must be >= 0, not {before}")
    record, first, _ = newest_record(store, name, incarnation)
    through0 = record.through if record is not None else 0
    begins = store.list_claim_begins(name, after=through0 - 1 if through0 else None)
    pieces: list[_Piece] = []
    if record is not None:
        kept = effective(record, first)
        times = record.times[len(record.fragments) - len(kept) :]
        for (f, b), when in zip(kept, times):
            pieces.append(_Piece(f.begin, f.end, when, f, b, claimed=False))
    elif begins:
        first = begins[0]
    if begins:
        last = store.read_claim(name, begins[-1])
        if last is None:
            raise MissingFragment(f"the last claim of journal {name!r} ({begins[-1]}) vanished")
        head = last.parse_fragment(name).end
        listed: dict[int, float] = {}
        for f in store.list_fragments(name):
            if f.mod_time is not None:
                listed[f.begin] = max(listed.get(f.begin, 0.0), f.mod_time)
        for begin, end in zip(begins, [*begins[1:], head]):
            pieces.append(_Piece(begin, end, listed.get(begin)))
    # Whole fragments ending at or before the point, oldest first.
    doomed: list[_Piece] = []
    for piece in pieces:
        if isinstance(before, int):
            if piece.end > before:
                break
        else:
            stamp = before.timestamp()
            if piece.time is None or piece.time > stamp:
                break
        doomed.append(piece)
    result = TrimResult(name, first, dry_run=dry_run)
    if not doomed:
        return result
    point = doomed[-1].end
    result.first = point
    new_through = max(through0, point)
    kept_pieces = [p for p in pieces if not p.claimed and p.begin >= point]
    new = CompactionRecord(
        name,
        point,
        new_through,
        tuple(p.fragment for p in kept_pieces if p.fragment is not None),
        tuple(p.blocks for p in kept_pieces),
        tuple(p.time for p in kept_pieces),
        incarnation,
        "trim",
    )
    new.check()
    result.record = new.name
    # Claims below the point go (but the one at the highest offset below the record's
    # `through`, so the claims directory never looks shorter than the head).
    all_begins = store.list_claim_begins(name, after=None)
    below = [b for b in all_begins if b < new_through]
    keep_claim = below[-1] if below else None
    result.claims = [b for b in all_begins if b < point and b != keep_claim]
    referenced = {f.content_name for f in new.fragments}
    result.fragments = [
        f
        for f in store.list_fragments(name)
        if f.end <= point and f.content_name not in referenced
    ]
    if dry_run:
        return result
    _meta(client).put_if_absent(_meta_path(name, new.name), new.to_bytes())
    _reload_index(client, name)
    total = len(result.claims) + len(result.fragments)
    if progress is not None:
        progress(0, total)
    store.delete_claims(name, result.claims)
    if progress is not None:
        progress(len(result.claims), total)
    store.delete_fragments(result.fragments)
    if progress is not None:
        progress(total, total)
    notify_trim(client, name, point)
    return result


# -- automatic compaction -------------------------------------------------------------------------


class AutoCompactor:
    """The thread of one client that compacts, behind their heads, the journals it appends
    to whose spec sets `compact_after`: once the client's index of a journal holds that
    many claims past the newest record, at most every AUTO_MIN_INTERVAL seconds, it runs
    `compact` (retiring with the default gc grace) and, if the spec sets a retention,
    `trim`. It holds no lock an append takes: the appender shares only the index, whose
    lock is held for microseconds. Errors are logged, never raised. The thread exits when
    the client is closed or collected, or has nothing to watch.

    `_lock` guards `_watched` and `_thread`."""

    def __init__(self, client: JournalClient) -> None:
        self._client = weakref.ref(client)
        self._lock = threading.Lock()
        self._watched: dict[str, FragmentSpec] = {}
        self._last: dict[str, float] = {}
        self._thread: threading.Thread | None = None
        self.runs = 0
        self.errors: list[BaseException] = []

    def watch(self, name: str, fragment: FragmentSpec) -> None:
        with self._lock:
            self._watched[name] = fragment
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="oncelog-compact", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(AUTO_POLL)
            client = self._client()
            if client is None or client.closed:
                return
            with self._lock:
                watched = dict(self._watched)
            for name, fragment in watched.items():
                index = client.loaded_index(name)
                count = getattr(index, "uncompacted", None)
                if count is None or count() < fragment.compact_after:
                    continue
                if time.monotonic() - self._last.get(name, -1e9) < AUTO_MIN_INTERVAL:
                    continue
                self._last[name] = time.monotonic()
                try:
                    compact(client, name)
                    if fragment.retention:
                        trim(client, name)
                    self.runs += 1
                except Exception as exc:  # noqa: BLE001 - a background job: log and go on
                    self.errors.append(exc)
                    log.warning("automatic compaction of journal %r failed: %s", name, exc)
            del client
