"""Atomic commits across journals: durable transaction records, rolled forward by anyone.

A commit over one journal is one ACK append: atomic by itself. A commit over several
journals first stores its ACK intents in a *transaction record*, created only if absent
under `<root>/.oncelog/txns/`, and only then appends the ACKs. A crash after the record
and before the last ACK leaves a record whose ACKs may be incomplete; whoever finds it
appends them all again (*rolls it forward*), which finishes the commit in every journal.
Before the record exists no ACK was appended, so a crash there commits nothing anywhere.

Three kinds of record share this module:

- pending records of publishers without an identity, `txns/pending/<producer>-<clock>.json`:
  written before the ACKs, retired after them. Retiring and rolling forward race through
  one put-if-absent *settle marker* (`<record>.settled`): the publisher creates it after
  its ACKs, a recoverer before re-appending them. A recoverer that wins rolls the commit
  forward; a publisher that loses knows a recoverer may re-append its ACKs later and
  continues under a new producer ID (an ACK re-appended after its producer published again
  would roll back that producer's newer messages, under Gazette's sequencing rules).
- records of a transactional id, `txns/ids/<id>/<seq:016x>.json`: a chain written by the
  instances of one `Publisher(client, transactional_id=...)`, see `TransactionalLog`.
- records of idempotent writes (Spark batch writes with a write id),
  `txns/writes/<write id>/<version:016x>.json`: kept for good, so that a rerun of a
  committed write is recognised (`commit_once`).
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import orjson

from oncelog.coordination import FencedChain, Placement
from oncelog.errors import InvalidTransactionalId, TransactionRecordError
from oncelog.intents import AckIntent, start_intents

if TYPE_CHECKING:
    from oncelog.journal import AppendResult, JournalClient

__all__ = [
    "RECORD_FORMAT",
    "TransactionRecord",
    "TransactionRecordError",
    "InvalidTransactionalId",
    "append_intents",
    "write_pending",
    "settle",
    "pending_records",
    "recover_pending",
    "commit_once",
    "read_record",
    "retire",
    "TransactionalLog",
    "transactional_ids",
    "write_record_path",
    "validate_transaction_id",
]

log = logging.getLogger(__name__)

RECORD_FORMAT = "oncelog-txn/1"
PENDING_DIR = "txns/pending"
IDS_DIR = "txns/ids"
WRITES_DIR = "txns/writes"
SETTLED = ".settled"

_ID = re.compile(r"^[A-Za-z0-9_+=%-][A-Za-z0-9._+=%-]{0,127}$")


def validate_transaction_id(value: object, what: str = "transactional id") -> str:
    """Return `value` if it is a valid transactional id or write id (one path component of
    letters, digits and `-_+.=%`, not starting with `.`, at most 128 characters), else
    raise InvalidTransactionalId (a ValueError) naming it and the rule."""
    if not isinstance(value, str) or not _ID.match(value):
        raise InvalidTransactionalId(
            f"invalid {what} {value!r}: use 1 to 128 letters, digits and -_+.=% "
            "(not starting with '.')"
        )
    return value


def _now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True, slots=True)
class TransactionRecord:
    """One durable record: the ACK intents of a commit (or none, for a fence), who wrote it
    and when. `token` is unique to the write, so a writer whose reply was lost recognises
    its own record. `acked` maps each journal the writer ever acknowledged to the clock it
    last acknowledged there (what a rollback of its leftovers re-asserts); `journals`
    lists every journal the writer may hold uncommitted messages in.

    In a transactional id's chain, `intents` then `rollbacks` are what the next instance
    appends when this record is the newest. A fence carries those of the record it took
    over (so a takeover killed at any point leaves them to the next one), and names that
    record by `previous_seq` and `previous_token`: the durable proof that the record was
    taken over, and so rolled forward (its writer reads it to learn its commit's fate)."""

    kind: str
    intents: list[AckIntent] = field(default_factory=list)
    producer: bytes = b""
    clock: int = 0
    acked: dict[str, int] = field(default_factory=dict)
    journals: list[str] = field(default_factory=list)
    rollbacks: list[AckIntent] = field(default_factory=list)
    created: datetime = field(default_factory=_now)
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    path: str = ""
    previous_seq: int = 0
    previous_token: str = ""

    @property
    def intent_journals(self) -> list[str]:
        return sorted({a.journal for a in self.intents})

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "format": RECORD_FORMAT,
                "kind": self.kind,
                "producer": self.producer.hex(),
                "clock": self.clock,
                "created": self.created.isoformat(),
                "token": self.token,
                "intents": _intents_doc(self.intents),
                "acked": self.acked,
                "journals": self.journals,
                "rollbacks": _intents_doc(self.rollbacks),
                "previous_seq": self.previous_seq,
                "previous_token": self.previous_token,
            }
        )

    @classmethod
    def from_json(cls, data: bytes, path: str) -> TransactionRecord:
        try:
            doc = orjson.loads(data)
            if not isinstance(doc, dict) or doc.get("format") != RECORD_FORMAT:
                raise ValueError(f"format is not {RECORD_FORMAT!r}")
            acked = doc.get("acked") or {}
            if not all(isinstance(k, str) and isinstance(v, int) for k, v in acked.items()):
                raise ValueError(f"bad acked clocks {acked!r}")
            journals = doc.get("journals") or []
            if not all(isinstance(j, str) for j in journals):
                raise ValueError(f"bad journals {journals!r}")
            return cls(
                kind=str(doc["kind"]),
                intents=_intents_from(doc["intents"]),
                producer=bytes.fromhex(doc["producer"]),
                clock=int(doc["clock"]),
                acked=dict(acked),
                journals=list(journals),
                rollbacks=_intents_from(doc.get("rollbacks") or []),
                created=datetime.fromisoformat(doc["created"]),
                token=str(doc["token"]),
                path=path,
                previous_seq=int(doc.get("previous_seq") or 0),
                previous_token=str(doc.get("previous_token") or ""),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise TransactionRecordError(
                f"transaction record .oncelog/{path} is corrupt: {type(exc).__name__}: {exc}"
            ) from None


def _intents_doc(intents: Sequence[AckIntent]) -> list[dict[str, str]]:
    return [
        {"journal": a.journal, "intent": base64.b64encode(a.intent).decode("ascii")}
        for a in intents
    ]


def _intents_from(doc: Any) -> list[AckIntent]:
    return [AckIntent(str(a["journal"]), base64.b64decode(a["intent"], validate=True)) for a in doc]


def read_record(client: "JournalClient", path: str) -> TransactionRecord | None:
    """The record at `.oncelog/<path>`, or None if absent."""
    data = client.meta.read(path)
    return None if data is None else TransactionRecord.from_json(data, path)


def append_intents(
    client: "JournalClient", intents: Sequence[AckIntent]
) -> list["AppendResult | None"]:
    """Append ACK intents (concurrently across journals) and wait until all are durable.
    An intent for a journal deleted since is logged and skipped (None in the result): its
    messages went with the journal, and a commit must not stay unfinishable because of it."""
    started = start_intents(client, intents, skip_deleted=True)
    return [None if a is None else a.result() for a in started]


# -- pending records of publishers without an identity -----------------------------------


def pending_path(producer: bytes, clock: int) -> str:
    return f"{PENDING_DIR}/{producer.hex()}-{clock:016x}.json"


def write_pending(client: "JournalClient", record: TransactionRecord) -> TransactionRecord:
    """Store the pending record of a commit (before its first ACK); returns it with its
    path. Raises if the path is taken (a producer ID and clock are never reused)."""
    path = pending_path(record.producer, record.clock)
    if not client.meta.put_if_absent(path, record.to_json()):
        raise TransactionRecordError(f"transaction record .oncelog/{path} exists already")
    return replace(record, path=path)


def settle(client: "JournalClient", record: TransactionRecord, who: str) -> bool:
    """Create the record's settle marker; True if this call did (then it alone finishes the
    record: a publisher retires it, a recoverer rolls it forward first), and the record and
    marker are removed once that is done by the caller through `retire`."""
    marker = orjson.dumps({"by": who, "token": uuid.uuid4().hex, "at": _now().isoformat()})
    return client.meta.put_if_absent(record.path + SETTLED, marker)


def retire(client: "JournalClient", record: TransactionRecord) -> None:
    """Remove a finished pending record, then its settle marker."""
    client.meta.delete(record.path)
    client.meta.delete(record.path + SETTLED)


def pending_records(client: "JournalClient") -> list[TransactionRecord]:
    """Pending records of publishers without an identity: commits whose ACKs may be
    incomplete (their publisher is still at work, or died mid-commit)."""
    out = []
    for name in client.meta.list(PENDING_DIR):
        if not name.endswith(".json"):
            continue
        record = read_record(client, f"{PENDING_DIR}/{name}")
        if record is not None:
            out.append(record)
    return out


def recover_pending(
    client: "JournalClient", records: Iterable[TransactionRecord] | None = None
) -> list[TransactionRecord]:
    """Roll forward pending records (all, by default): for each whose settle marker this
    call creates, append its ACK intents again and retire it; records already settled by
    their publisher are only cleaned up. Returns the records rolled forward."""
    done = []
    for record in pending_records(client) if records is None else records:
        if settle(client, record, "recover"):
            append_intents(client, record.intents)
            done.append(record)
        retire(client, record)
    # Markers whose record is gone: a retire cut short between its two deletes.
    for name in client.meta.list(PENDING_DIR):
        if name.endswith(".json" + SETTLED):
            record_name = name[: -len(SETTLED)]
            if client.meta.read(f"{PENDING_DIR}/{record_name}") is None:
                client.meta.delete(f"{PENDING_DIR}/{name}")
    return done


# -- idempotent writes ---------------------------------------------------------------------


def write_record_path(write_id: str, version: int) -> str:
    validate_transaction_id(write_id, "write id")
    if not isinstance(version, int) or version < 0:
        raise ValueError(f"write version must be an int >= 0, not {version!r}")
    return f"{WRITES_DIR}/{write_id}/{version:016x}.json"


def commit_once(
    client: "JournalClient",
    path: str,
    intents: Sequence[AckIntent],
    *,
    producer: bytes = b"",
    clock: int = 0,
) -> bool:
    """Commit `intents` at most once under the record `path`: create the record only if
    absent, then append the intents. If a record is there already (an earlier run of the
    same write), append ITS intents again instead (finishing a commit that may have been
    cut short; harmless if it was not) and return False. Records stay: they are what
    makes a rerun a no-op. The producers of `intents` must never publish again (Spark
    task attempts, one-shot writers), since their ACKs may be re-appended at any time."""
    record = TransactionRecord("commit", list(intents), producer, clock)
    if client.meta.put_if_absent(path, record.to_json()):
        append_intents(client, record.intents)
        return True
    stored = read_record(client, path)
    if stored is not None:
        append_intents(client, stored.intents)
    return False


# -- the record chain of a transactional id ------------------------------------------------

class TransactionalLog:
    """The records of one transactional id: `txns/ids/<id>/<seq:016x>.json`, each created
    only if absent at the seq after the latest.

    Fencing: an instance writes a record at latest+1 when it starts (a fence), before a
    transaction first writes to a journal not named in its records, and at each commit.
    Whoever writes seq S+1 first owns the id from then on; an older instance's next write
    finds the seq taken and is fenced out. Pruning keeps the newest records only, and a
    write into a seq freed by pruning is caught by `write`'s check that nothing newer
    exists (the newest record is never pruned, so a freed seq always has a newer one
    above it): the proof of ownership is monotonic, never an object that pruning removes.

    Roll-forward: the newest record's `intents` and `rollbacks` are what a new instance
    appends. A fence copies them from the record it takes over, and is written before it
    appends them: a takeover killed at any point leaves them in the newest record again,
    for the next takeover (re-appending them is harmless: their producer is fenced out).
    Only after they are durable does its instance write other records (and prune).
    """

    def __init__(self, client: "JournalClient", transactional_id: str, keep: int = 10) -> None:
        self.client = client
        self.id = validate_transaction_id(transactional_id)
        self.directory = f"{IDS_DIR}/{self.id}"
        self.chain = FencedChain(client.meta, self.directory)
        if not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be an int >= 1, not {keep!r}")
        self.keep = keep

    def path(self, seq: int) -> str:
        return self.chain.path(seq)

    def seqs(self, after: int | None = None) -> list[int]:
        return self.chain.numbers(after)

    def latest(self) -> tuple[int, TransactionRecord | None]:
        """The newest seq and its record ((0, None) for a new id)."""
        link = self.chain.latest()
        if link is None:
            return 0, None
        return link.number, TransactionRecord.from_json(link.data, self.path(link.number))

    def fence(
        self, seq: int, previous: TransactionRecord | None, producer: bytes, clock: int
    ) -> TransactionRecord:
        """The fence a new instance writes at `seq + 1` over `previous` (the record at
        `seq`, None for a new id): it carries `previous`'s intents and rollbacks (what the
        new instance is about to append) and names `previous` as the record it took over."""
        if previous is None:
            return TransactionRecord("fence", producer=producer, clock=clock)
        return TransactionRecord(
            "fence",
            list(previous.intents),
            producer,
            clock,
            rollbacks=list(previous.rollbacks),
            previous_seq=seq,
            previous_token=previous.token,
        )

    def put(self, seq: int, record: TransactionRecord) -> Placement:
        """Create `record` at `seq` only if that seq is free, then check that nothing newer
        exists (`FencedChain.claim`). SUPERSEDED: the record was taken over by the instance
        that wrote the next seq, or written into a seq freed by pruning (never rolled
        forward); `taken_over` tells which."""
        return self.chain.claim(seq, record.to_json())

    def write(self, seq: int, record: TransactionRecord) -> bool:
        """Store `record` at `seq` only if that seq is free and nothing newer exists; False
        if another instance took it (or took a later one): the caller is fenced out."""
        return self.put(seq, record) is Placement.WON

    def taken_over(self, seq: int, record: TransactionRecord) -> bool | None:
        """After `put(seq, record)` gave SUPERSEDED: True if the instance that wrote seq+1
        took `record` over (its fence names `record`'s token: it, or a takeover after it,
        rolls `record` forward), False if `record` landed in a seq freed by pruning (never
        the newest: nobody rolls it forward), None if that can no longer be told.

        Decided from durable state only. Whoever wrote seq+1 saw seq taken: a takeover that
        read `record` as the newest names it; anyone else wrote seq+1 before `record`
        existed, so `record` went into a seq freed by pruning. If seq+1 is gone (pruned),
        `record` still being there means it was never taken over (pruning deletes in seq
        order, and seq+1 was written after `record` if it took it over). If both are gone
        (seq may hold another zombie's record by then, landed there after pruning), the
        evidence was pruned while the writer was paused for more than `keep` records of its
        successors, and the answer is None."""
        successor = read_record(self.client, self.path(seq + 1))
        if successor is not None:
            return successor.previous_seq == seq and successor.previous_token == record.token
        mine = read_record(self.client, self.path(seq))
        if mine is not None and mine.token == record.token:
            return False
        return None

    def prune(self) -> None:
        """Delete all but the `keep` newest records (housekeeping; failures are logged)."""
        try:
            self.chain.prune(self.keep)
        except Exception as exc:  # noqa: BLE001 - the next prune catches up
            log.warning("pruning records of transactional id %r failed: %s", self.id, exc)


def transactional_ids(client: "JournalClient") -> list[str]:
    """The transactional ids with records in this store."""
    names = set()
    for info in client.store.backend.walk(client.store.meta_path(IDS_DIR)):
        head = info.name.replace("\\", "/").split("/", 1)[0]
        if _ID.match(head):
            names.add(head)
    return sorted(names)
