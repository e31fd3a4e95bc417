"""What a streaming node records in the store: channel terms and node heartbeats.

Both are fenced chains (oncelog.coordination) under `<root>/.oncelog/streaming/`, each link
created only if absent, so two nodes never both win the same link:

- `streaming/channels/<channel>/terms/<term:016x>.json`: one object per term of a channel,
  naming the node that took it. A node takes a channel by creating the term after the newest;
  it owns the channel while no higher term exists. Check after write: having created term T,
  the node lists the terms after T, and any found means it already lost the channel.
- `streaming/nodes/<node_id>/beats/<seq:016x>.json`: a node's heartbeats. Other nodes never
  compare clocks: a node is presumed dead once its newest beat has not changed for a lease
  timeout *of the observer's own monotonic clock*.

Invariant: terms only grow, and at any term exactly one node incarnation (`token`) is named.
"""

from __future__ import annotations

import re
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from oncelog.coordination import FencedChain, Placement

if TYPE_CHECKING:
    from oncelog.journal import JournalClient

__all__ = [
    "CHANNEL_ROLE",
    "Anchor",
    "Heartbeat",
    "LeaseWatcher",
    "StoreView",
    "TermRecord",
    "delete_terms",
    "idle_tick",
    "latest_term",
    "newer_terms",
    "parse_anchor",
    "read_beat",
    "read_term",
    "take_term",
    "terms_dir",
]

CHANNEL_ROLE = "streaming-channel"
"""`JournalSpec.owner.role` of journals created as streaming channels."""

def _chain(client: JournalClient, directory: str) -> FencedChain:
    return FencedChain(client.meta, directory)


@dataclass(frozen=True, slots=True)
class TermRecord:
    """Term `term` of `channel`, taken by node `node_id` (process incarnation `token`),
    reachable at `address`."""

    channel: str
    term: int
    node_id: str
    address: str
    description: str = ""
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: float = field(default_factory=time.time)

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self), option=orjson.OPT_SORT_KEYS)

    @classmethod
    def from_json(cls, data: bytes) -> TermRecord:
        doc: dict[str, Any] = orjson.loads(data)
        return cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})


def terms_dir(channel: str) -> str:
    """The directory (under `.oncelog/`) of the channel's term records."""
    return f"streaming/channels/{channel}/terms"


def _terms(client: JournalClient, channel: str) -> FencedChain:
    """The channel's chain of terms (oncelog.coordination: the soundness argument)."""
    return _chain(client, terms_dir(channel))


def latest_term(client: JournalClient, channel: str) -> TermRecord | None:
    """The channel's newest term record, or None if no node ever took it."""
    link = _terms(client, channel).latest()
    return None if link is None else TermRecord.from_json(link.data)


def read_term(client: JournalClient, channel: str, term: int) -> TermRecord | None:
    """Term `term` of the channel (one GET), or None if absent."""
    data = _terms(client, channel).read(term)
    return None if data is None else TermRecord.from_json(data)


def newer_terms(client: JournalClient, channel: str, term: int) -> list[int]:
    """Terms of the channel above `term` (one LIST from `term` on)."""
    return _terms(client, channel).newer(term)


def take_term(client: JournalClient, record: TermRecord) -> bool:
    """Create `record`'s term only if absent, then check after write: True only if it was
    created and no higher term exists (else the caller does not own the channel)."""
    placement = _terms(client, record.channel).claim(record.term, record.to_json())
    return placement is Placement.WON


def delete_terms(client: JournalClient, channel: str) -> None:
    """Remove every term record of a destroyed channel."""
    _terms(client, channel).delete_all()


def default_node_id(port: int) -> str:
    """A node id stable across restarts of a node on this host and port (so a restarted node
    takes its channels back at once instead of waiting for its old lease to expire)."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname()) or "node"
    return f"{host}-{port}"


def _beats_dir(node_id: str) -> str:
    return f"streaming/nodes/{node_id}/beats"


class Heartbeat:
    """The beat chain of one node: `beat()` creates the next link and deletes old ones."""

    KEEP = 3

    def __init__(self, client: JournalClient, node_id: str, address: str, token: str) -> None:
        self.client = client
        self.node_id = node_id
        self.address = address
        self.token = token
        self.chain = _chain(client, _beats_dir(node_id))
        beats = self.chain.numbers()
        self.seq = beats[-1] if beats else 0

    def beat(self, channels: dict[str, dict[str, Any]] | None = None) -> bool:
        """Write the next beat; False if another process with our node id wrote it first.

        `channels`: per owned channel, its anchor and idle tick (see
        `oncelog.streaming.node` and `Anchor`): `{"term", "offset", "tick", "idle", "floor",
        "open", "states", "pruned"}`. Costs one
        PUT, and one DELETE of the beat KEEP links back, whatever the number of channels."""
        seq = self.seq + 1
        doc: dict[str, Any] = {"node_id": self.node_id, "address": self.address,
                               "token": self.token, "seq": seq, "time": time.time()}
        if channels is not None:
            doc["channels"] = channels
        won = self.chain.put(seq, orjson.dumps(doc))
        self.seq = seq if won else max(seq, _last_beat(self.client, self.node_id))
        if won and seq > self.KEEP:
            self.client.meta.delete(self.chain.path(seq - self.KEEP))
        return won


def read_beat(client: JournalClient, node_id: str) -> dict[str, Any] | None:
    """The newest beat of `node_id` (one LIST, one GET), or None if it never beat."""
    link = _chain(client, _beats_dir(node_id)).latest()
    if link is None:
        return None
    doc = orjson.loads(link.data)
    return doc if isinstance(doc, dict) else None


@dataclass(frozen=True, slots=True)
class Anchor:
    """A channel's anchor, as a beat carries it per owned channel (see
    `oncelog.streaming.node`): the channel's time `tick` at line boundary `offset`, the
    begins of the transactions open there that its node knows (`open`), and the read-
    committed producer `states` there, in the form of columnar segment records' `States`
    (`oncelog.tables.segments`): producer hex -> (last ACK clock, pending begin or -1), a
    `Sequencer.checkpoint()`'s producer states. `states` is None in an older node's anchor,
    which has none. Producers pruned from them had clocks below `pruned` (0: none pruned)."""

    offset: int
    tick: int
    open: tuple[int, ...] = ()
    states: dict[str, tuple[int, int]] | None = None
    pruned: int = 0


def parse_anchor(entry: Any) -> Anchor | None:
    """The anchor of a beat's channel entry `{"term", "offset", "tick", "open", "states",
    "pruned", ...}`, or None if it is no usable anchor: not one, or its node had to leave
    its producer states out (`"states": null`: unknown, or too many), so that sequencing
    from it could give a wrong answer. An entry without `states` (an older node's) is an
    anchor without states."""
    if not isinstance(entry, dict):
        return None
    try:
        offset, tick = int(entry["offset"]), int(entry["tick"])
        begins = tuple(int(b) for b in entry.get("open", ()))
        states: dict[str, tuple[int, int]] | None = None
        if "states" in entry:
            raw = entry["states"]
            if not isinstance(raw, dict):
                return None
            states = {}
            for producer, (last, begin) in raw.items():
                if len(bytes.fromhex(producer)) != 6:
                    return None
                states[producer] = (int(last), int(begin))
        return Anchor(offset, tick, begins, states, int(entry.get("pruned", 0)))
    except (KeyError, TypeError, ValueError):
        return None


def idle_tick(client: JournalClient, channel: str) -> tuple[int, int] | None:
    """(offset, tick) of the idle tick in the newest beat of the channel's owner: every line
    of the channel before `offset` ticks below `tick`, every line after it above. None
    unless that owner (node and incarnation) still holds the newest term AFTER the beat was
    read: a failover owner reads the old owner's beat after taking its term, and continues
    above it. For any reader of channels (a consumer, `read_time_ordered`): two LIST and
    GET pairs, and one LIST."""
    record = latest_term(client, channel)
    if record is None or not record.node_id:
        return None
    beat = read_beat(client, record.node_id)
    if beat is None or beat.get("token") != record.token:
        return None
    entry = (beat.get("channels") or {}).get(channel)
    if not isinstance(entry, dict) or entry.get("term") != record.term:
        return None
    idle = int(entry.get("idle", 0))
    if not idle or newer_terms(client, channel, record.term):
        return None
    return int(entry["offset"]), idle


def idle_ticks(client: JournalClient) -> Callable[[str], tuple[int, int] | None]:
    """The idle ticks of the store's channels as `read_time_ordered(..., idle=...)` takes
    them: `idle_ticks(client)(channel)` is `idle_tick(client, channel)`."""
    return lambda channel: idle_tick(client, channel)


@dataclass(frozen=True, slots=True)
class StoreView:
    """What one listing of `streaming/` shows: each channel's newest term number and each
    node's newest beat number."""

    terms: dict[str, int]
    beats: dict[str, int]

    @classmethod
    def read(cls, client: JournalClient) -> StoreView:
        """ONE recursive listing of `<root>/.oncelog/streaming/` (paginated by the store
        past 1000 objects): the cost of a failover scan, whatever the number of channels."""
        store = client.store
        names = [o.name for o in store.backend.walk(store.meta_path("streaming"))]
        terms: dict[str, int] = {}
        beats: dict[str, int] = {}
        for name in names:
            head, _, leaf = name.rpartition("/")
            m = _LINK.fullmatch(leaf)
            if m is None:
                continue
            n = int(m.group(1), 16)
            if head.startswith("channels/") and head.endswith("/terms"):
                channel = head[len("channels/"):-len("/terms")]
                terms[channel] = max(terms.get(channel, 0), n)
            elif head.startswith("nodes/") and head.endswith("/beats"):
                node = head[len("nodes/"):-len("/beats")]
                beats[node] = max(beats.get(node, 0), n)
        return cls(terms, beats)


_LINK = re.compile(r"([0-9a-f]{16})\.json")


def _last_beat(client: JournalClient, node_id: str) -> int:
    beats = _chain(client, _beats_dir(node_id)).numbers()
    return beats[-1] if beats else 0


class LeaseWatcher:
    """Decides, from the observer's clock only, whether another node's lease expired: its
    newest beat did not change for `lease_timeout` seconds since this watcher first saw it."""

    def __init__(self, client: JournalClient, lease_timeout: float) -> None:
        self.client = client
        self.lease_timeout = lease_timeout
        self._seen: dict[str, tuple[int, float]] = {}

    def expired(self, node_id: str, seq: int | None = None) -> bool:
        """Whether `node_id`'s lease expired; `seq`: its newest beat as listed already
        (StoreView), else one LIST here."""
        if seq is None:
            seq = _last_beat(self.client, node_id)
        now = time.monotonic()
        last = self._seen.get(node_id)
        if last is None or last[0] != seq:
            self._seen[node_id] = (seq, now)
            return False
        return now - last[1] >= self.lease_timeout
