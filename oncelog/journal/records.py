"""Compaction records: what readers, writers and compactions learn of a journal's history.

```
<root>/.oncelog/compactions/<journal>/<through:016x>-<start:016x>.json     a record
<root>/.oncelog/compactions/<journal>/<through:016x>-<start:016x>.claims   its claims object
```

A record lists fragments (content names, with the CRC-32C block sums of raw ones) that hold
the journal's offsets [start, through) contiguously. It is created put-if-absent and never
changed. Readers use the record with the largest (through, start) and take as the
journal's first offset the largest `start` of any record. Claims below the newest record's
`through` never count (oncelog.journal.index says why and how that is checked); a
compaction's claims object names the claims it consumed, by writer token, so that a writer
can tell "my claim was compacted" from "my claim was stale" (oncelog.journal._claim).

This module holds the record format and how records are listed and read; making them
(compaction, retirement, trims) is oncelog.journal.compaction.
"""

from __future__ import annotations

import itertools
import re
import time
import uuid
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import orjson

from oncelog.journal._blocks import BlockSums
from oncelog.journal.errors import (
    CorruptRecord,
    InvalidFragmentName,
    MissingFragment,
    UnknownCodec,
)
from oncelog.journal.fragment import Fragment, parse_content_name
from oncelog.journal.names import validate_journal_name
from oncelog.journal.store import META_DIR, FragmentStore

__all__ = [
    "CompactionRecord",
    "RecordName",
    "RECORDS",
    "claims_path",
    "consumed_claims",
    "delete_records",
    "effective",
    "foreign_records",
    "list_records",
    "newest_record",
    "read_record",
    "record_path",
    "records_beyond",
    "records_dir",
]

RECORDS = "compactions"
"""Directory of compaction records under `<root>/.oncelog/`."""

_NAME_RE = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})\.json$")


@dataclass(frozen=True, slots=True)
class RecordName:
    """A listed compaction record: its range from its name, its stored time."""

    through: int
    start: int
    name: str
    mtime: float

    @property
    def key(self) -> tuple[int, int]:
        return (self.through, self.start)


@dataclass(frozen=True, slots=True)
class CompactionRecord:
    """Fragments holding a journal's offsets [start, through): `fragments` are contiguous,
    the first begins at or before `start` (after `start` only if there is none, then
    start == through), the last ends at `through`. `blocks[i]`: block sums of fragment i
    (raw fragments) or None; `times[i]`: the newest stored time of the data in fragment i
    (Unix seconds, for retention by age) or None. `token` makes every attempt's bytes
    unique (put-if-absent recognises its own retried write)."""

    journal: str
    start: int
    through: int
    fragments: tuple[Fragment, ...]
    blocks: tuple[BlockSums | None, ...]
    times: tuple[float | None, ...]
    incarnation: str = ""
    kind: str = "compact"
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: float = field(default_factory=time.time)

    @property
    def name(self) -> str:
        return f"{self.through:016x}-{self.start:016x}.json"

    @property
    def key(self) -> tuple[int, int]:
        return (self.through, self.start)

    def to_bytes(self) -> bytes:
        frags = []
        for fragment, blocks, when in zip(self.fragments, self.blocks, self.times):
            doc: dict[str, Any] = {"name": fragment.content_name}
            if blocks is not None:
                doc["block_size"] = blocks.size
                doc["block_crc32c"] = blocks.to_hex()
            if when is not None:
                doc["time"] = when
            frags.append(doc)
        return orjson.dumps(
            {
                "journal": self.journal,
                "start": self.start,
                "through": self.through,
                "kind": self.kind,
                "incarnation": self.incarnation,
                "token": self.token,
                "created": self.created,
                "fragments": frags,
            }
        )

    @classmethod
    def from_bytes(cls, journal: str, name: str, data: bytes) -> CompactionRecord:
        where = f"compaction record {name} of journal {journal!r}"
        try:
            doc = orjson.loads(data)
            start, through = int(doc["start"]), int(doc["through"])
            frags: list[Fragment] = []
            blocks: list[BlockSums | None] = []
            times: list[float | None] = []
            for item in doc["fragments"]:
                fragment = parse_content_name(journal, str(item["name"]))
                frags.append(fragment)
                if "block_size" in item:
                    blocks.append(
                        BlockSums.from_hex(
                            item["block_size"], item["block_crc32c"], fragment.content_length
                        )
                    )
                else:
                    blocks.append(None)
                when = item.get("time")
                times.append(None if when is None else float(when))
            record = cls(
                journal,
                start,
                through,
                tuple(frags),
                tuple(blocks),
                tuple(times),
                str(doc.get("incarnation") or ""),
                str(doc.get("kind") or "compact"),
                str(doc.get("token") or ""),
                float(doc.get("created") or 0.0),
            )
        except (
            orjson.JSONDecodeError,
            KeyError,
            TypeError,
            ValueError,
            AttributeError,
            InvalidFragmentName,
            UnknownCodec,
        ) as exc:
            raise CorruptRecord(f"{where} cannot be parsed: {exc}") from exc
        if record.name != name:
            raise CorruptRecord(f"{where} holds offsets {start}-{through}, not its name's")
        record.check()
        return record

    def check(self) -> None:
        """Raise CorruptRecord unless the fragments hold [start, through) contiguously."""
        where = f"compaction record {self.name} of journal {self.journal!r}"
        frags = self.fragments
        if not frags:
            if self.start != self.through:
                raise CorruptRecord(f"{where} lists no fragment for {self.start}-{self.through}")
            return
        if not frags[0].begin <= self.start < frags[0].end or frags[-1].end != self.through:
            raise CorruptRecord(
                f"{where}: fragments {frags[0].begin}-{frags[-1].end} do not hold offsets "
                f"{self.start}-{self.through}"
            )
        for a, b in itertools.pairwise(frags):
            if a.end != b.begin:
                raise CorruptRecord(f"{where}: a gap or overlap at offsets {a.end}-{b.begin}")
        for f in frags:
            if f.path_postfix or f.end <= f.begin:
                raise CorruptRecord(f"{where}: bad fragment {f.stored_name}")


def records_dir(store: FragmentStore, journal: str) -> str:
    return store.backend.join(META_DIR, RECORDS, journal)


def record_path(store: FragmentStore, journal: str, name: str) -> str:
    return store.backend.join(META_DIR, RECORDS, journal, name)


def claims_path(store: FragmentStore, journal: str, record: str) -> str:
    """The record's *claims* object: `<through>-<start>.claims` beside it, one line
    `<begin:016x> <writer token>` per claim the compaction consumed."""
    return record_path(store, journal, record[: -len(".json")] + ".claims")


def consumed_claims(store: FragmentStore, journal: str, record: str) -> dict[int, str]:
    """{claim offset: writer token} of the claims the compaction that wrote `record`
    consumed ({} if it wrote none: a trim, an older oncelog, or retired since)."""
    try:
        data = store.backend.read(claims_path(store, journal, record))
    except FileNotFoundError:
        return {}
    out: dict[int, str] = {}
    for line in data.decode("ascii", "replace").splitlines():
        begin, _, writer = line.partition(" ")
        try:
            out[int(begin, 16)] = writer
        except ValueError:
            continue
    return out


def foreign_records(record: CompactionRecord | None, names: list[RecordName]) -> set[str]:
    """Records `newest_record` skipped above the one it returned: another incarnation's."""
    key = record.key if record is not None else (-1, -1)
    return {n.name for n in names if n.key > key}


def records_beyond(
    store: FragmentStore, journal: str, offset: int, foreign: AbstractSet[str]
) -> bool:
    """Whether a record (not in `foreign`) ends past `offset` (one LIST)."""
    return any(
        n.through > offset and n.name not in foreign for n in list_records(store, journal)
    )


def list_records(store: FragmentStore, journal: str) -> list[RecordName]:
    """The journal's compaction records, by (through, start) ascending (one LIST)."""
    out = []
    for info in store.backend.list_dir(records_dir(store, validate_journal_name(journal))):
        m = _NAME_RE.match(info.name)
        if m is not None:
            out.append(RecordName(int(m.group(1), 16), int(m.group(2), 16), info.name, info.mtime))
    out.sort(key=lambda r: r.key)
    return out


def read_record(store: FragmentStore, journal: str, name: str) -> CompactionRecord | None:
    """The record `name`, or None if it is gone (one GET)."""
    try:
        data = store.backend.read(record_path(store, journal, name))
    except FileNotFoundError:
        return None
    return CompactionRecord.from_bytes(journal, name, data)


def newest_record(
    store: FragmentStore, journal: str, incarnation: str = ""
) -> tuple[CompactionRecord | None, int, list[RecordName]]:
    """The record readers use (the largest (through, start) of this incarnation), the
    journal's first offset by the records (the largest `start` within it; 0 without a
    record) and the listing. One LIST and usually one GET; records of another incarnation
    of the journal (a compactor of a deleted journal of the same name) are skipped."""
    for _ in range(5):
        names = list_records(store, journal)
        vanished = False
        for rn in reversed(names):
            record = read_record(store, journal, rn.name)
            if record is None:
                vanished = True  # deleted by a gc since the listing: list again
                break
            if incarnation and record.incarnation and record.incarnation != incarnation:
                continue
            first = max([record.start, *(n.start for n in names if n.start <= record.through)])
            return record, first, names
        if not vanished:
            return None, 0, names
    raise MissingFragment(
        f"the compaction records of journal {journal!r} kept vanishing while being read"
    )


def effective(record: CompactionRecord, first: int) -> list[tuple[Fragment, BlockSums | None]]:
    """The record's fragments still holding offsets from `first` on, with their sums."""
    return [(f, b) for f, b in zip(record.fragments, record.blocks) if f.end > first]


def delete_records(store: FragmentStore, journal: str) -> None:
    """Remove every compaction record of the journal, and their claims objects (when it
    is deleted)."""
    directory = records_dir(store, journal)
    store.backend.delete([f"{directory}/{o.name}" for o in store.backend.list_dir(directory)])


