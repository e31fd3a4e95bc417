"""Consumer checkpoints: what a consumer group has read, acknowledged and computed.

A checkpoint is a JSON object stored once, never overwritten, at
`<root>/.oncelog/checkpoints/<group>/<seq:016x>.json` (a shard of a group:
`<group>/shard-<i:03d>-of-<n:03d>/<seq:016x>.json`). Checkpoint N+1 is written
create-only-if-absent, so of several instances of a group exactly one can
commit each transaction; a group's descriptor `<root>/.oncelog/groups/<group>.json`
records its shard count. See docs/consumers.md.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import orjson

from oncelog.publisher import AckIntent
from oncelog.sequencer import ProducerState

if TYPE_CHECKING:
    from oncelog.journal import JournalClient

__all__ = [
    "CHECKPOINT_FORMAT",
    "ConsumerError",
    "CheckpointError",
    "FencedOut",
    "Checkpoint",
    "CheckpointStore",
    "GroupInfo",
    "validate_group_name",
    "read_group_info",
    "ensure_group",
]

CHECKPOINT_FORMAT = "oncelog-checkpoint/1"
GROUP_FORMAT = "oncelog-group/1"
MAX_GROUP_NAME_LEN = 128

_CHECKPOINT_NAME = re.compile(r"^([0-9a-f]{16})\.json$")
_GROUP_NAME = re.compile(r"^[A-Za-z0-9_+=%-][A-Za-z0-9._+=%-]*$")


class ConsumerError(RuntimeError):
    """A consumer or consumer-group operation cannot go on (the message says why)."""


class CheckpointError(ConsumerError):
    """A checkpoint or group descriptor is unreadable or corrupt; the message names the file."""


class FencedOut(ConsumerError):
    """Another instance of the group committed first: this one must stop publishing."""


def validate_group_name(group: object) -> str:
    """Return `group` if it is a valid consumer-group name, else raise ValueError.

    One path component: letters, digits and `-_+.=%`, not starting with `.`.
    """
    if not isinstance(group, str):
        raise ValueError(f"consumer group name must be a str, not {type(group).__name__}")
    if not group or len(group) > MAX_GROUP_NAME_LEN or not _GROUP_NAME.match(group):
        raise ValueError(
            f"invalid consumer group name {group!r}: use 1 to {MAX_GROUP_NAME_LEN} letters,"
            " digits and -_+.=% (not starting with '.')"
        )
    return group


def _now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One committed consumer transaction of a group (or of one shard of it).

    `offsets` and `producers` resume read-committed reading exactly where the
    transaction ended; `ack_intents` commit its outputs (re-appended on
    recovery: appending an ACK twice is harmless); `state` is the handler's
    JSON state, or absent (`has_state` False) when the consumer should start
    from its initial state. `writer` is the producer ID of the instance that wrote it.
    """

    group: str
    seq: int
    offsets: dict[str, int] = field(default_factory=dict)
    producers: list[ProducerState] = field(default_factory=list)
    ack_intents: list[AckIntent] = field(default_factory=list)
    state: Any = None
    has_state: bool = False
    shard: int | None = None
    shards: int = 1
    created: datetime = field(default_factory=_now)
    reason: str = "commit"
    writer: bytes | None = None

    def successor(self, **changes: Any) -> Checkpoint:
        """Checkpoint seq+1 with the same contents except `changes` (created now)."""
        changes.setdefault("created", _now())
        return replace(self, seq=self.seq + 1, **changes)

    def to_json(self, state_json: bytes | None = None) -> bytes:
        """The stored form. `state_json` (already encoded state) avoids encoding it twice."""
        doc: dict[str, Any] = {
            "format": CHECKPOINT_FORMAT,
            "group": self.group,
            "shard": None if self.shard is None else {"index": self.shard, "count": self.shards},
            "seq": self.seq,
            "created": self.created.isoformat(),
            "reason": self.reason,
            "writer": None if self.writer is None else self.writer.hex(),
            "offsets": self.offsets,
            "producers": [p.to_dict() for p in self.producers],
            "ack_intents": [
                {"journal": a.journal, "intent": base64.b64encode(a.intent).decode("ascii")}
                for a in self.ack_intents
            ],
        }
        if self.has_state:
            doc["state"] = self.state if state_json is None else orjson.Fragment(state_json)
        return orjson.dumps(doc)

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Checkpoint:
        """Parse a stored checkpoint; CheckpointError naming `where` if anything is wrong."""

        def bad(reason: str) -> CheckpointError:
            return CheckpointError(f"corrupt consumer checkpoint {where}: {reason}")

        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise bad(f"not JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise bad(f"expected a JSON object, found {type(doc).__name__}")
        if doc.get("format") != CHECKPOINT_FORMAT:
            raise bad(f"format is {doc.get('format')!r}, expected {CHECKPOINT_FORMAT!r}")
        try:
            group = doc["group"]
            seq = doc["seq"]
            if not isinstance(group, str) or not isinstance(seq, int) or seq < 0:
                raise ValueError(f"bad group {group!r} or seq {seq!r}")
            shard_doc = doc.get("shard")
            shard, shards = None, 1
            if shard_doc is not None:
                shard, shards = shard_doc["index"], shard_doc["count"]
                if not (isinstance(shard, int) and isinstance(shards, int) and 0 <= shard < shards):
                    raise ValueError(f"bad shard {shard_doc!r}")
            offsets = doc["offsets"]
            if not isinstance(offsets, dict) or not all(
                isinstance(j, str) and isinstance(o, int) and o >= 0 for j, o in offsets.items()
            ):
                raise ValueError(f"bad offsets {offsets!r}")
            producers = [ProducerState.from_dict(p) for p in doc["producers"]]
            intents = [
                AckIntent(a["journal"], base64.b64decode(a["intent"], validate=True))
                for a in doc["ack_intents"]
            ]
            writer = doc.get("writer")
            created = datetime.fromisoformat(doc["created"])
            return cls(
                group=group,
                seq=seq,
                offsets=offsets,
                producers=producers,
                ack_intents=intents,
                state=doc.get("state"),
                has_state="state" in doc,
                shard=shard,
                shards=shards,
                created=created,
                reason=str(doc.get("reason", "commit")),
                writer=None if writer is None else bytes.fromhex(writer),
            )
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise bad(f"{type(exc).__name__}: {exc}") from None


def _display_path(client: "JournalClient", rel: str) -> str:
    return f"{client.root.rstrip('/')}/.oncelog/{rel}"


class CheckpointStore:
    """The checkpoints of one group, or of one shard of a group, in a journal store."""

    def __init__(
        self, client: "JournalClient", group: str, shard: int | None = None, shards: int = 1
    ) -> None:
        self.client = client
        self.group = validate_group_name(group)
        if shard is None:
            if shards != 1:
                raise ValueError(f"group {group!r}: a shard index is needed with {shards} shards")
            self.directory = f"checkpoints/{group}"
        else:
            if not (isinstance(shards, int) and isinstance(shard, int) and 0 <= shard < shards):
                raise ValueError(f"group {group!r}: shard {shard!r} is not in [0, {shards!r})")
            self.directory = f"checkpoints/{group}/shard-{shard:03d}-of-{shards:03d}"
        self.shard = shard
        self.shards = shards

    def __repr__(self) -> str:
        return f"CheckpointStore({self.client!r}, {self.directory!r})"

    def relative_path(self, seq: int) -> str:
        """The checkpoint's path under `<root>/.oncelog/`."""
        return f"{self.directory}/{seq:016x}.json"

    def path(self, seq: int) -> str:
        """The checkpoint's full path, as named in errors."""
        return _display_path(self.client, self.relative_path(seq))

    def seqs(self, after: int | None = None) -> list[int]:
        """Sequence numbers of the stored checkpoints, ascending (only those > `after`)."""
        start = None if after is None else f"{after:016x}.json"
        out = []
        for name in self.client.list_objects(self.directory, after=start):
            m = _CHECKPOINT_NAME.match(name)
            if m:
                out.append(int(m.group(1), 16))
        out.sort()
        return out

    def load(self, seq: int) -> Checkpoint:
        """Read checkpoint `seq`; CheckpointError naming the file if missing or corrupt."""
        rel = self.relative_path(seq)
        where = self.path(seq)
        try:
            data = self.client.read_object(rel)
        except Exception as exc:  # an unreadable object: never silently start over
            raise CheckpointError(
                f"cannot read consumer checkpoint {where}: {type(exc).__name__}: {exc}"
            ) from exc
        if data is None:
            raise CheckpointError(f"consumer checkpoint {where} is missing (listed, then gone)")
        cp = Checkpoint.from_json(data, where)
        if cp.group != self.group or cp.seq != seq or cp.shard != self.shard or (
            cp.shard is not None and cp.shards != self.shards
        ):
            raise CheckpointError(
                f"corrupt consumer checkpoint {where}: it names group {cp.group!r} shard"
                f" {cp.shard!r}/{cp.shards} seq {cp.seq}, not its own place"
            )
        return cp

    def latest(self, after: int | None = None) -> Checkpoint | None:
        """The checkpoint with the highest seq (> `after` if given), or None if there is none."""
        seqs = self.seqs(after)
        return self.load(seqs[-1]) if seqs else None

    def write(self, cp: Checkpoint, data: bytes | None = None) -> bool:
        """Store `cp` only if its seq is free; False if another instance took it first."""
        if cp.group != self.group or cp.shard != self.shard:
            raise ValueError(f"{cp!r} does not belong in {self!r}")
        return self.client.put_if_absent(self.relative_path(cp.seq), data or cp.to_json())

    def prune(self, keep: int) -> list[int]:
        """Delete all but the `keep` newest checkpoints; returns the deleted seqs."""
        if not isinstance(keep, int) or keep < 1:
            raise ValueError(
                f"keep must be an int >= 1 (the latest checkpoint stays), not {keep!r}"
            )
        doomed = self.seqs()[:-keep]
        for seq in doomed:
            self.client.delete_object(self.relative_path(seq))
        return doomed

    def delete_all(self) -> list[int]:
        """Delete every checkpoint here (stop the group's consumers first)."""
        doomed = self.seqs()
        for seq in doomed:
            self.client.delete_object(self.relative_path(seq))
        return doomed


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A consumer group's descriptor: its name and how many shards split its journals."""

    group: str
    shards: int = 1
    created: datetime = field(default_factory=_now)

    def stores(self, client: "JournalClient") -> list[CheckpointStore]:
        """The checkpoint stores of the group: one, or one per shard."""
        if self.shards == 1:
            return [CheckpointStore(client, self.group)]
        return [CheckpointStore(client, self.group, i, self.shards) for i in range(self.shards)]


def _group_path(group: str) -> str:
    return f"groups/{validate_group_name(group)}.json"


def read_group_info(client: "JournalClient", group: str) -> GroupInfo | None:
    """The descriptor of `group`, or None if no consumer of it ever started."""
    rel = _group_path(group)
    where = _display_path(client, rel)
    try:
        data = client.read_object(rel)
    except Exception as exc:
        raise CheckpointError(
            f"cannot read consumer group descriptor {where}: {type(exc).__name__}: {exc}"
        ) from exc
    if data is None:
        return None
    try:
        doc = orjson.loads(data)
        if doc.get("format") != GROUP_FORMAT or doc["group"] != group:
            raise ValueError(f"format {doc.get('format')!r} group {doc.get('group')!r}")
        shards = doc["shards"]
        if not isinstance(shards, int) or shards < 1:
            raise ValueError(f"bad shard count {shards!r}")
        return GroupInfo(group, shards, datetime.fromisoformat(doc["created"]))
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"corrupt consumer group descriptor {where}: {exc}") from None


def ensure_group(client: "JournalClient", group: str, shards: int) -> GroupInfo:
    """Create the descriptor of `group` if absent; ConsumerError if it has another shard count."""
    if not isinstance(shards, int) or shards < 1:
        raise ValueError(f"shards must be an int >= 1, not {shards!r}")
    info = GroupInfo(group, shards)
    doc = {
        "format": GROUP_FORMAT,
        "group": group,
        "shards": shards,
        "created": info.created.isoformat(),
    }
    for _ in range(3):
        if client.put_if_absent(_group_path(group), orjson.dumps(doc)):
            return info
        existing = read_group_info(client, group)
        if existing is None:
            continue  # deleted since: try to create it again
        if existing.shards != shards:
            raise ConsumerError(
                f"consumer group {group!r} is split into {existing.shards} shard(s), not"
                f" {shards}: use the same count, or another group name (or delete_group first)"
            )
        return existing
    raise ConsumerError(f"consumer group {group!r}: its descriptor keeps being deleted")


def list_group_names(client: "JournalClient") -> list[str]:
    """Names of the consumer groups with a descriptor in this store, sorted."""
    return sorted(n[: -len(".json")] for n in client.list_objects("groups") if n.endswith(".json"))


def delete_group_info(client: "JournalClient", group: str) -> None:
    """Remove the group's descriptor."""
    client.delete_object(_group_path(group))


def intents_journals(intents: Iterable[AckIntent]) -> list[str]:
    """The journals a list of ACK intents goes to (for messages and logs)."""
    return sorted({a.journal for a in intents})
