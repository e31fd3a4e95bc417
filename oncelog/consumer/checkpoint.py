"""Consumer checkpoints: what a consumer group has read, acknowledged and computed.

A checkpoint is a JSON object stored once, never overwritten, at
`<root>/.oncelog/checkpoints/<group>/<seq:016x>.json` (a shard of a group:
`<group>/shard-<i:03d>-of-<n:03d>/<seq:016x>.json`). Checkpoint N+1 is written
create-only-if-absent and then *claimed* (`CheckpointStore.claim`): it counts only if no
checkpoint above N+1 (and no tombstone of a deletion at or above N+1) is listed right
after the write, so pruning old checkpoints never reopens a number to a zombie instance.
A group's descriptor `<root>/.oncelog/groups/<group>.json` records its shard count; a
deleted group leaves `tombstone-<floor:016x>.json` in each of its checkpoint directories.
See docs/consumers.md ("Fencing, pruning and deletion").

Every object written here with `put_if_absent` holds a fresh random `token`, so its bytes
are unique to the write attempt: `JournalClient.put_if_absent` relies on that to recognise
its own object after a lost reply (an "already exists" answer to a retried PUT).
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, NamedTuple

import crc32c
import orjson

from oncelog.consumer._paths import display_path
from oncelog.consumer.errors import (
    CheckpointError,
    ConsumerError,
    FencedOut,
    InvalidGroupName,
)
from oncelog.coordination import FencedChain
from oncelog.coordination import new_token as new_token  # unique bytes per write attempt
from oncelog.framing import FramingError, for_content_type
from oncelog.journal.errors import InvalidJournalName, JournalNotFound
from oncelog.journal.names import validate_journal_name
from oncelog.message import Flags
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
    "recoverable_intents",
]

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "oncelog-checkpoint/1"
GROUP_FORMAT = "oncelog-group/1"
TOMBSTONE_FORMAT = "oncelog-tombstone/1"
MAX_GROUP_NAME_LEN = 128

_LATEST_ATTEMPTS = 5  # newest checkpoints pruned between a LIST and a GET, in a row


class CheckpointMissing(CheckpointError):
    """A listed checkpoint was gone when read (pruned since the LIST, or deleted by hand)."""


# "t" sorts after every hex digit, so a LIST that starts after any checkpoint's name
# (S3 StartAfter) always returns the tombstones too.
_TOMBSTONE_NAME = re.compile(r"^tombstone-([0-9a-f]{16})\.json$")
_GROUP_NAME = re.compile(r"^[A-Za-z0-9_+=%-][A-Za-z0-9._+=%-]*$")


def state_checksum(state_json: bytes) -> str:
    """The CRC-32C (8 hex digits) of a checkpoint's encoded state, stored with it as
    `state_crc32c` and checked when it is read back: a damaged state (one changed digit)
    is an error, never a silently different state."""
    return f"{crc32c.crc32c(state_json):08x}"


def validate_group_name(group: object) -> str:
    """Return `group` if it is a valid consumer-group name, else raise InvalidGroupName (a
    ValueError) naming it and the rule.

    One path component: letters, digits and `-_+.=%`, not starting with `.`.
    """
    if not isinstance(group, str):
        raise InvalidGroupName(
            f"invalid consumer group name {group!r}: must be a str, not {type(group).__name__}"
        )
    if not group or len(group) > MAX_GROUP_NAME_LEN or not _GROUP_NAME.match(group):
        raise InvalidGroupName(
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
    `ack_producer` is the producer ID the ACK intents acknowledge: the `writer` of the
    commit checkpoint that built them, carried unchanged by the recovery and reset
    checkpoints that copy them (recovery checks every intent against it).

    Invariants: `seq` is the predecessor's plus one; a checkpoint is written once
    (put-if-absent) and only counts once claimed (see `CheckpointStore.claim`).
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
    ack_producer: bytes | None = None
    sink: Any = None
    """The reference of the statements of the last commit for an external sink
    (oncelog.consumer.sink), carried by recovery and reset checkpoints like ACK intents."""

    def successor(self, **changes: Any) -> Checkpoint:
        """Checkpoint seq+1 with the same contents except `changes` (created now)."""
        changes.setdefault("created", _now())
        return replace(self, seq=self.seq + 1, **changes)

    def to_json(self, state_json: bytes | None = None) -> bytes:
        """The stored form. `state_json` (already encoded state) avoids encoding it twice.

        Each call stamps a fresh random `token`: the bytes of every write attempt are
        unique (even a retried recovery, or two resets of the same checkpoint), which
        `JournalClient.put_if_absent` relies on when it reads back an "already exists".
        """
        doc: dict[str, Any] = {
            "format": CHECKPOINT_FORMAT,
            "group": self.group,
            "shard": None if self.shard is None else {"index": self.shard, "count": self.shards},
            "seq": self.seq,
            "created": self.created.isoformat(),
            "reason": self.reason,
            "writer": None if self.writer is None else self.writer.hex(),
            "token": new_token(),
            "ack_producer": None if self.ack_producer is None else self.ack_producer.hex(),
            "offsets": self.offsets,
            "producers": [p.to_dict() for p in self.producers],
            "ack_intents": [
                {"journal": a.journal, "intent": base64.b64encode(a.intent).decode("ascii")}
                for a in self.ack_intents
            ],
        }
        if self.sink is not None:
            doc["sink"] = self.sink
        if self.has_state:
            if state_json is None:
                state_json = orjson.dumps(self.state)
            doc["state"] = orjson.Fragment(state_json)
            doc["state_crc32c"] = state_checksum(state_json)
        return orjson.dumps(doc)

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Checkpoint:
        """Parse a stored checkpoint; CheckpointError naming `where` if anything is wrong.

        The state is checked against its `state_crc32c` (re-encoding a parsed JSON value
        gives back the bytes orjson wrote). Checkpoints written before that field existed
        are read unchecked."""

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
            if "state" in doc and "state_crc32c" in doc:
                stored = doc["state_crc32c"]
                actual = state_checksum(orjson.dumps(doc["state"]))
                if stored != actual:
                    raise bad(
                        f"its state does not match its checksum (state_crc32c {stored!r},"
                        f" computed {actual!r}): the state was damaged or edited"
                    )
            elif "state_crc32c" in doc:
                raise bad("it has a state checksum (state_crc32c) but no state")
            writer = doc.get("writer")
            ack_producer = doc.get("ack_producer")
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
                ack_producer=None if ack_producer is None else bytes.fromhex(ack_producer),
                sink=doc.get("sink"),
            )
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise bad(f"{type(exc).__name__}: {exc}") from None


class _Listing(NamedTuple):
    """One LIST of a checkpoint directory."""

    seqs: list[int]
    """Checkpoint numbers, ascending."""
    floors: list[int]
    """Floors of the tombstones, ascending (always all of them, whatever the LIST's start)."""

    @property
    def floor(self) -> int:
        """The highest tombstone floor: checkpoints up to it belong to a deleted group."""
        return self.floors[-1] if self.floors else 0


class CheckpointStore:
    """The checkpoints of one group, or of one shard of a group, in a journal store.

    Fencing rests on two invariants that every operation here keeps:

    - I1 (the top survives): `prune` deletes a checkpoint only if a higher one was listed
      by the same LIST; `delete_all` deletes checkpoints only after writing a tombstone
      whose floor is at least each of them, and a tombstone goes only once a higher one
      exists. So once "a checkpoint above S, or a tombstone with floor >= S" is true it
      stays true forever (a chain of deletions, each needing a higher survivor, ends at
      one that is never deleted).
    - I2 (no skipping): every writer's next number is the number of a checkpoint it saw
      (or wrote, or a floor) plus one.

    Hence `claim`: write S only if absent, then LIST after S. A number that is free only
    because it was pruned (or deleted with the group) always has a higher checkpoint or a
    covering tombstone (I1), and the LIST sees it; see `claim` for the argument.
    """

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
        # The checkpoints are a fenced chain (oncelog.coordination); tombstones beside its
        # links fence a deleted group.
        self.chain = FencedChain(client.meta, self.directory)

    def __repr__(self) -> str:
        return f"CheckpointStore({self.client!r}, {self.directory!r})"

    def relative_path(self, seq: int) -> str:
        """The checkpoint's path under `<root>/.oncelog/`."""
        return self.chain.path(seq)

    def path(self, seq: int) -> str:
        """The checkpoint's full path, as named in errors."""
        return display_path(self.client, self.relative_path(seq))

    def tombstone_relative_path(self, floor: int) -> str:
        """The path under `<root>/.oncelog/` of the tombstone fencing checkpoints <= `floor`."""
        return f"{self.directory}/tombstone-{floor:016x}.json"

    def tombstone_path(self, floor: int) -> str:
        """The tombstone's full path, as named in errors."""
        return display_path(self.client, self.tombstone_relative_path(floor))

    def _list(self, after: int | None = None) -> _Listing:
        """One LIST: the checkpoints numbered above `after` (all if None), and the tombstones."""
        names = self.chain.listing(after)
        seqs = self.chain.numbers_in(names)
        floors = []
        for name in names:
            m = _TOMBSTONE_NAME.match(name)
            if m:
                floors.append(int(m.group(1), 16))
        floors.sort()
        return _Listing(seqs, floors)

    def seqs(self, after: int | None = None) -> list[int]:
        """Sequence numbers of the stored checkpoints, ascending (only those > `after`).

        These include a deleted group's leftovers (numbers up to `floor()`), which
        `latest` ignores."""
        return self._list(after).seqs

    def floor(self) -> int:
        """The highest number fenced by a tombstone (the group was deleted there), or 0."""
        return self._list().floor

    def load(self, seq: int) -> Checkpoint:
        """Read checkpoint `seq`; CheckpointError naming the file if missing or corrupt."""
        rel = self.relative_path(seq)
        where = self.path(seq)
        try:
            data = self.client.meta.read(rel)
        except Exception as exc:  # an unreadable object: never silently start over
            raise CheckpointError(
                f"cannot read consumer checkpoint {where}: {type(exc).__name__}: {exc}"
            ) from exc
        if data is None:
            raise CheckpointMissing(f"consumer checkpoint {where} is missing (listed, then gone)")
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
        """The checkpoint with the highest seq (> `after` if given), or None if there is none.

        Checkpoints at or below the tombstone floor (a deleted group's, or a zombie's
        written after the deletion) are not the group's: they are ignored."""
        return self.latest_and_floor(after)[0]

    def latest_and_floor(self, after: int | None = None) -> tuple[Checkpoint | None, int]:
        """`latest(after)` and `floor()` from one LIST. With no checkpoint, the next
        writer numbers its checkpoint floor + 1."""
        for _ in range(_LATEST_ATTEMPTS):
            listing = self._list(after)
            live = [s for s in listing.seqs if s > listing.floor]
            if not live:
                return None, listing.floor
            try:
                return self.load(live[-1]), listing.floor
            except CheckpointMissing:
                # Pruned between the LIST and the GET (a paused instance's listing went stale
                # while others committed on): by I1 something above it exists, so list again.
                # Missing with nothing above it is damage: say so.
                if self.superseded(live[-1]) is None:
                    raise
        raise CheckpointError(
            f"consumer group {self.group!r}: its newest checkpoint (in"
            f" {self.path(0).rsplit('/', 1)[0]}) vanished between listing and reading"
            f" {_LATEST_ATTEMPTS} times in a row"
            " (checkpoints are being pruned faster than they can be read)"
        )

    def write(self, cp: Checkpoint, data: bytes | None = None) -> bool:
        """Store `cp` only if its seq is free; False if another instance took it first.

        Success alone does not make `cp` the group's: the number may have been free
        because it was pruned. Use `claim`, which also checks that."""
        if cp.group != self.group or cp.shard != self.shard:
            raise ValueError(f"{cp!r} does not belong in {self!r}")
        return self.chain.put(cp.seq, data or cp.to_json())

    def superseded(self, seq: int) -> str | None:
        """Why a checkpoint numbered `seq` is not (or no longer) the group's newest: a
        higher checkpoint, or a tombstone fencing it; None if neither. One LIST."""
        listing = self._list(seq)
        if listing.seqs:
            return f"checkpoint {self.path(listing.seqs[-1])} exists"
        if listing.floor >= seq:
            return (
                f"the group was deleted: tombstone {self.tombstone_path(listing.floor)} fences"
                f" out checkpoints up to {listing.floor}"
            )
        return None

    def claim(self, cp: Checkpoint, data: bytes | None = None) -> str | None:
        """Write `cp` only if its number is free, then check that nothing is above it
        (one LIST starting after it: normally empty); None if `cp` is now the group's
        newest checkpoint, else why it is not (the message names the paths).

        Only a claimed checkpoint may be acted on (its ACK intents appended, its
        recovery used). A write that succeeded but is not claimed landed in a hole left
        by pruning, or in a deleted group: the writer is a zombie; its object is left
        in place (it may instead be a checkpoint another instance has already recovered
        from, so deleting it could lose a commit), is never `latest`, and goes with the
        next prune or deletion.

        This is `FencedChain.claim` (oncelog.coordination, where the argument that it is
        sound is written; `write` is its put, `superseded` its check after), with a
        tombstone's floor counting as a link above every number it covers: I1 holds for
        tombstones too (`delete_all` deletes checkpoints only after writing a tombstone
        covering them, and a tombstone only once a higher one exists).
        """
        if not self.write(cp, data):
            return (
                f"checkpoint {self.path(cp.seq)} was written by another instance of the group"
                " first"
            )
        above = self.superseded(cp.seq)
        if above is None:
            return None
        return (
            f"checkpoint {self.path(cp.seq)} was written, but {above}: another instance took"
            f" the group over (and checkpoint {cp.seq} had been pruned, or the group deleted,"
            " before this write)"
        )

    def prune(self, keep: int) -> list[int]:
        """Delete all but the `keep` newest checkpoints; returns the deleted seqs.

        Keeps I1 with any number of concurrent prunes and zombies: it deletes only
        numbers below the highest one its own LIST saw (`keep` >= 1), never tombstones.
        Fencing does not depend on the deleted checkpoints (see `claim`).

        Then the SQLite state objects (oncelog.consumer.state) that no kept checkpoint
        references and that are numbered below the oldest kept one go too (one more LIST;
        if there are any, one GET per kept checkpoint)."""
        if not isinstance(keep, int) or keep < 1:
            raise ValueError(
                f"keep must be an int >= 1 (the latest checkpoint stays), not {keep!r}"
            )
        seqs = self.seqs()
        doomed = seqs[:-keep]
        for seq in doomed:
            self.client.meta.delete(self.relative_path(seq))
        if seqs:
            self.prune_state(seqs[-keep:])
        return doomed

    def prune_state(self, kept: list[int]) -> list[str]:
        """Delete the state objects unreferenced by checkpoints `kept` and numbered below
        the lowest of them; returns their names. If a kept checkpoint is gone or
        unreadable (a concurrent prune), nothing is deleted this time."""
        from oncelog.consumer.sink import sink_object_names
        from oncelog.consumer.state import (
            prune_state_objects,
            state_directory,
            state_object_names,
        )

        directory = state_directory(self.directory)
        if not kept or not self.client.meta.list(directory):
            return []
        referenced: set[str] = set()
        for seq in kept:
            try:
                cp = self.load(seq)
            except CheckpointError:
                return []
            if cp.has_state:
                referenced |= state_object_names(cp.state)
            referenced |= sink_object_names(cp.sink)
        return prune_state_objects(self.client, directory, referenced, min(kept))

    def delete_all(self) -> list[int]:
        """Delete every checkpoint here, leaving a tombstone that fences out zombies;
        returns the numbers of the checkpoints deleted (stop the group's consumers first).

        With D the highest number listed (or the old floor): claim a "deleted"
        checkpoint D+1, so a live instance's commit or recovery racing with this makes it
        fail (ConsumerError; nothing is deleted); write `tombstone-<D+1>.json`; then delete
        the checkpoints listed, D+1 and older tombstones. A zombie's later write numbered
        <= D+1 (all it can write, by I2) lands in the empty directory but is not claimed
        (the tombstone covers it) and is ignored by `latest`. A new consumer of the group
        starts from nothing at D+2.
        """
        listing = self._list()
        top = max(listing.seqs[-1] if listing.seqs else 0, listing.floor) + 1
        fence = Checkpoint(
            self.group, top, shard=self.shard, shards=self.shards, reason="deleted"
        )
        why = self.claim(fence)
        if why is not None:
            raise ConsumerError(
                f"deleting consumer group {self.group!r} raced with a commit: {why}; stop its"
                " consumers and retry"
            )
        doc = {
            "format": TOMBSTONE_FORMAT,
            "group": self.group,
            "shard": None if self.shard is None else {"index": self.shard, "count": self.shards},
            "floor": top,
            "created": _now().isoformat(),
            "token": new_token(),
        }
        self.client.meta.put_if_absent(self.tombstone_relative_path(top), orjson.dumps(doc))
        for seq in [*listing.seqs, top]:
            self.client.meta.delete(self.relative_path(seq))
        from oncelog.consumer.state import state_directory

        state_dir = state_directory(self.directory)
        for name in self.client.meta.list(state_dir):
            self.client.meta.delete(f"{state_dir}/{name}")
        for floor in listing.floors:
            if floor < top:
                self.client.meta.delete(self.tombstone_relative_path(floor))
        return listing.seqs


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
    where = display_path(client, rel)
    try:
        data = client.meta.read(rel)
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
    """Create the descriptor of `group` if absent; ConsumerError if it has another shard count.

    Each attempt's descriptor holds a fresh `token` (put_if_absent callers' contract)."""
    if not isinstance(shards, int) or shards < 1:
        raise ValueError(f"shards must be an int >= 1, not {shards!r}")
    info = GroupInfo(group, shards)
    for _ in range(3):
        doc = {
            "format": GROUP_FORMAT,
            "group": group,
            "shards": shards,
            "created": info.created.isoformat(),
            "token": new_token(),  # unique bytes per attempt: see put_if_absent
        }
        if client.meta.put_if_absent(_group_path(group), orjson.dumps(doc)):
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
    return sorted(n[: -len(".json")] for n in client.meta.list("groups") if n.endswith(".json"))


def delete_group_info(client: "JournalClient", group: str) -> None:
    """Remove the group's descriptor."""
    client.meta.delete(_group_path(group))


def intents_journals(intents: Iterable[AckIntent]) -> list[str]:
    """The journals a list of ACK intents goes to (for messages and logs)."""
    return sorted({a.journal for a in intents})


def recoverable_intents(client: "JournalClient", cp: Checkpoint, where: str) -> list[AckIntent]:
    """Check everything recovery will act on in checkpoint `cp` (stored at `where`),
    before anything is written; returns the ACK intents to re-append.

    The journal names of the offsets, producer states and intents must be valid, and
    each intent must decode, with the framing of its journal's content type, to exactly
    one message whose UUID is an ACK_TXN of `cp.ack_producer` (for checkpoints written
    before that field: of `cp.writer` for a commit, else of one producer for all
    intents). Otherwise CheckpointError naming `where`, the intent's index and journal:
    appending anything else would make the journal unreadable, or acknowledge another
    producer's outputs. An intent for a journal that no longer exists (JournalNotFound)
    is logged and skipped, as Gazette's consumer does; storage errors propagate.
    """

    def bad(reason: str) -> CheckpointError:
        return CheckpointError(f"corrupt consumer checkpoint {where}: {reason}")

    for journal in [*cp.offsets, *(p.journal for p in cp.producers)]:
        try:
            validate_journal_name(journal)
        except InvalidJournalName as exc:
            raise bad(f"offsets or producer states name an invalid journal: {exc}") from None
    expected = cp.ack_producer
    if expected is None and cp.reason == "commit":
        expected = cp.writer
    out: list[AckIntent] = []
    for i, intent in enumerate(cp.ack_intents):
        what = f"ACK intent #{i} (journal {intent.journal!r})"
        try:
            journal = validate_journal_name(intent.journal)
        except InvalidJournalName as exc:
            raise bad(f"{what}: {exc}") from None
        try:
            spec = client.get(journal)
        except JournalNotFound:
            log.warning(
                "consumer checkpoint %s: %s: the journal no longer exists; not re-appending"
                " its ACK", where, what,
            )
            continue
        try:
            framing = for_content_type(spec.content_type)
            result = framing.decode(intent.intent, journal=journal, base=0, final=True)
        except FramingError as exc:
            raise bad(f"{what} is not a frame of the journal's framing: {exc}") from None
        if len(result.envelopes) != 1 or result.consumed != len(intent.intent):
            raise bad(
                f"{what} holds {len(result.envelopes)} message(s) in {result.consumed} of its"
                f" {len(intent.intent)} bytes, not exactly one ACK"
            )
        try:
            producer, _clock, flags = result.envelopes[0].ids
        except (ValueError, TypeError, AttributeError) as exc:
            raise bad(f"{what}: its message has no valid UUID: {exc}") from None
        if flags != Flags.ACK_TXN:
            raise bad(f"{what} is not an ACK_TXN acknowledgement (UUID flags {flags!r})")
        if expected is None:
            expected = producer  # an older recovery or reset checkpoint: one producer
        if producer != expected:
            raise bad(
                f"{what} acknowledges producer {producer.hex()}, not {expected.hex()} whose"
                " transaction the checkpoint commits"
            )
        out.append(intent)
    return out
