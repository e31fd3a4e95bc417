"""The streaming node: a gRPC server producing to and consuming from channels (journals).

A node owns channels under terms recorded in the store (`oncelog.streaming.meta`). For each
Produce stream it appends every request's messages as ONE journal append (so a request is
atomic: all its messages land in one fragment, or none; a batch of requests is one append
too, each request keeping its own validation and answer) through the node's single
`JournalClient`, whose appender group-commits the appends of every stream of a channel into
one fragment per flush. A request is answered only once its append is durable AND the node
has checked, after that, that no higher term of the channel exists (one LIST, shared by
every request that became durable before it started). A node that finds a higher term is
fenced for that channel for good: it answers CHANNEL_FENCED and appends nothing more there.

Messages are ordinary JSON lines of the journal (`{"uuid", "vchannel", "payload",
"properties"}`), so `read_committed`, consumers and Spark read channels straight from the
store. Time ticks of idle channels are not in the journal: they travel in the node's
heartbeat with each owned channel's anchor (its tick at an offset, and the transactions open
there), and the node's next append to the channel begins with a floor line (an ACK of the
node's tick producer) so that later lines tick above them. An idle node costs a bounded
number of store requests per heartbeat, whatever its channels.
"""

from __future__ import annotations

import base64
import hmac
import logging
import queue
import random
import threading
import time
import uuid
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import grpc
import orjson

from oncelog._extras import needs_extra
from oncelog.message import (
    ACK_TXN,
    CONTINUE_TXN,
    OUTSIDE_TXN,
    Clock,
    build_uuid,
    new_producer_id,
    parse_uuid_fields,
)
from oncelog.producer_transaction import Keepalive, ProducerTransaction, TxnState
from oncelog.sequencing.kernel import QueueOutcome, decide_outcome, prune_below
from oncelog.streaming import meta
from oncelog.streaming import streaming_pb2 as pb
from oncelog.streaming import streaming_pb2_grpc as pb_grpc
from oncelog.streaming.errors import Code, StreamingError

if TYPE_CHECKING:
    from oncelog.journal import AsyncAppend, JournalClient

__all__ = [
    "NodeConfig",
    "NodeMetrics",
    "StreamingNode",
    "decode_message",
    "encode_message",
    "serve",
]

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/x-ndjson"
_KNOWN_TXNS = 1 << 16
"""Client-stamped transactions a node remembers (for orphan commits and rollbacks)."""
_NIL_PRODUCER = bytes(6)
CHANNEL_COMPACT_AFTER = 64
"""Small fragments after which a channel's owner compacts it (FragmentSpec.compact_after)."""
INHERIT_SECONDS = 120.0
"""How long a new owner keeps the previous owner's open-transaction begins in its anchors
(the client finishes such a transaction on it within its retry_timeout, 30 s)."""
ANCHOR_MAX_PRODUCERS = 1024
"""The most producer states an anchor carries (about 39 bytes each in the beat). Producers
without an open transaction beyond it are pruned, least recently active first; an anchor
whose open transactions alone exceed it carries none (`"states": null`): consumers then
sequence from offset 0."""
ANCHOR_PRUNE_SECONDS = 600.0
"""Producers with no line for this long (by clock, below the channel's newest ACK) are
pruned from anchors' states, as `Sequencer.checkpoint(prune_horizon)` prunes them."""


@dataclass
class NodeConfig:
    """Settings of one node. Durations in seconds, sizes in bytes."""

    node_id: str = ""
    address: str = ""  # advertised to clients (DescribeChannel); default: the listen address
    description: str = ""
    token: str | None = None
    max_message_bytes: int = 1 << 20
    max_request_bytes: int = 4 << 20
    max_messages_per_request: int = 10_000
    heartbeat_interval: float = 1.0
    lease_timeout: float = 5.0
    failover: bool = True
    tick_interval: float = 1.0  # a channel idle this long gets a time tick
    txn_keepalive: float = 30.0  # default keepalive of transactions
    max_workers: int = 256
    take: list[str] = field(default_factory=list)  # channels to take at start


# -- messages on the journal ---------------------------------------------------------------


def encode_message(msg: pb.Message, uuid_text: str) -> bytes:
    """The JSON line stored for `msg`: the payload as text when it is UTF-8, else base64
    under `payload_b64` (so every message is valid JSON and decodes back to its bytes)."""
    doc: dict[str, Any] = {"uuid": uuid_text, "vchannel": msg.vchannel}
    try:
        doc["payload"] = msg.payload.decode("utf-8")
    except UnicodeDecodeError:
        doc["payload_b64"] = base64.b64encode(msg.payload).decode("ascii")
    if msg.properties:
        doc["properties"] = dict(msg.properties)
    return orjson.dumps(doc) + b"\n"


def decode_message(doc: dict[str, Any]) -> pb.Message:
    """The Message of a stored JSON document (any JSON object: foreign fields are ignored,
    a non-string payload is given as its JSON text)."""
    payload = doc.get("payload")
    if isinstance(payload, str):
        body = payload.encode("utf-8")
    elif "payload_b64" in doc:
        body = base64.b64decode(doc["payload_b64"])
    elif payload is None:
        body = b""
    else:
        body = orjson.dumps(payload)
    props = doc.get("properties")
    return pb.Message(
        payload=body,
        vchannel=str(doc.get("vchannel") or ""),
        uuid=str(doc.get("uuid") or ""),
        properties={str(k): str(v) for k, v in props.items()} if isinstance(props, dict) else {},
    )


def message_size(msg: pb.Message) -> int:
    """The size `--max-message-bytes` bounds: the payload's bytes plus the UTF-8 bytes of
    every property's key and value. Produce and Broadcast both count with this, so one
    message passes or fails the limit whichever way it is sent."""
    return len(msg.payload) + sum(
        len(k.encode("utf-8")) + len(v.encode("utf-8")) for k, v in msg.properties.items()
    )


def check_message_size(msg: pb.Message, limit: int, what: str, effect: str) -> None:
    """Raise INVALID_ARGUMENT naming `what` (e.g. "message 3"), its size, the node's `limit`
    and `effect` (what was not done) if `msg` is larger than `limit` bytes."""
    size = message_size(msg)
    if size > limit:
        raise StreamingError(
            Code.INVALID_ARGUMENT,
            f"{what} is {size} bytes (payload and properties); the node's limit is {limit} "
            f"bytes: {effect}",
        )


def _to(journal: str) -> Callable[[Any], tuple[str, str]]:
    """A mapping of every message to `journal`."""
    return lambda _msg: (journal, CONTENT_TYPE)


def _err(code: Code, cause: str) -> pb.StreamingError:
    return pb.StreamingError(code=cast(Any, int(code)), cause=cause)


# -- channel time ticks ---------------------------------------------------------------------


def next_tick(prev: int, clock: int) -> int:
    """The channel time-tick rule: the line after one of tick `prev` whose UUID clock is
    `clock` gets tick max(prev + 1, clock).

    Applied to every line of a channel in journal order from its first offset (tick 0
    before it), duplicates, uncommitted lines and ACKs included, it is a function of the
    journal's bytes alone: the owner, any other node, a failover owner and a store reader
    compute the same ticks, strictly increasing in journal order, whatever the producers'
    clocks (a lagging producer's line gets its predecessor's tick + 1)."""
    return prev + 1 if clock <= prev else clock


_BEGIN = QueueOutcome.CONTINUE_BEGIN_SPAN
_EXTEND = QueueOutcome.CONTINUE_EXTEND_SPAN
_SETTLES = frozenset({QueueOutcome.OUTSIDE_COMMIT, QueueOutcome.ACK_EMPTY,
                      QueueOutcome.ACK_COMMIT_RING, QueueOutcome.ACK_ROLLBACK})
"""Outcomes after which (once stepped through) a producer's state is [clock, clock, -1]."""


class _ProducerStates:
    """A channel's read-committed producer states at a line boundary, kept without a ring:
    what `Sequencer.checkpoint()` would report there (the anchors' `states`).

    `apply(producer, clock, flags, begin)`, per line in journal order, decides by the
    Sequencer's rules (`decide_outcome`) and makes the change `SequencingKernel` makes once
    the line is queued and what it commits stepped through: a record
    [last ACK clock, largest pending clock, pending begin or -1] per producer, a new
    producer starting at clock - 1, zero clocks untracked. `states()` is therefore, line
    for line, the checkpoint of a Sequencer fed the same lines (tests compare them), in the
    form of columnar segment records' `States`: producer hex -> (last ACK clock, begin).

    Bounded: `anchor()` (once per beat) prunes producers with no open transaction whose
    clocks are ANCHOR_PRUNE_SECONDS below the newest ACK (the Sequencer's `prune_horizon`
    rule), then the least recently active down to ANCHOR_MAX_PRODUCERS, and `apply` does so
    too past four times that. So memory is ANCHOR_MAX_PRODUCERS records plus the producers
    first seen since the last prune plus the transactions open in the channel (never
    pruned: their begins are what a late starter replays). `pruned` is above every pruned
    producer's clocks: a line of a producer not in the table whose clock is below it may be
    a copy of a pruned producer's message, which the table cannot decide; the tracker then
    gives up (`table` None: anchors carry no states and late starters read from offset 0;
    the next owner counts from offset 0 again) rather than report a wrong state.
    """

    __slots__ = ("table", "pruned")

    def __init__(self, states: dict[str, tuple[int, int]] | None = None,
                 pruned: int = 0) -> None:
        self.table: dict[bytes, list[int]] | None = {
            bytes.fromhex(p): [last, last, begin] for p, (last, begin) in (states or {}).items()
        }
        self.pruned = pruned

    def copy(self) -> _ProducerStates:
        out = _ProducerStates(pruned=self.pruned)
        out.table = None if self.table is None else {p: list(r) for p, r in self.table.items()}
        return out

    def apply(self, producer: bytes, clock: int, flags: int, begin: int) -> None:
        """The line at `begin` of `producer` with `clock` and `flags` was read next."""
        table = self.table
        if table is None or not clock:
            return
        rec = table.get(producer)
        if rec is None:
            if clock < self.pruned:
                log.warning("producer %s: clock %d below the pruned states' %d at offset %d: "
                            "anchors carry no producer states from here", producer.hex(),
                            clock, self.pruned, begin)
                self.table = None
                return
            rec = table[producer] = [clock - 1, clock - 1, -1]
            if len(table) > 4 * ANCHOR_MAX_PRODUCERS:
                self.prune()
        outcome = decide_outcome(rec[0], rec[1], rec[2] != -1, clock, flags)
        if outcome is _BEGIN:
            rec[1], rec[2] = clock, begin
        elif outcome is _EXTEND:
            rec[1] = clock
        elif outcome in _SETTLES:
            rec[0] = rec[1] = clock
            rec[2] = -1

    def states(self) -> dict[str, tuple[int, int]] | None:
        """Producer hex -> (last ACK clock, pending begin or -1); None if given up."""
        if self.table is None:
            return None
        return {p.hex(): (r[0], r[2]) for p, r in sorted(self.table.items())}

    def prune(self) -> None:
        """Forget producers with no open transaction: those ANCHOR_PRUNE_SECONDS of clock
        below the newest ACK, then the least recently active beyond ANCHOR_MAX_PRODUCERS;
        `pruned` rises above their clocks."""
        table = self.table
        if not table:
            return
        below = prune_below(ANCHOR_PRUNE_SECONDS)
        bound = max(r[0] for r in table.values()) - below
        idle = sorted((r[1], p) for p, r in table.items() if r[2] == -1)
        excess = len(table) - ANCHOR_MAX_PRODUCERS
        for k, (high, p) in enumerate(idle):
            if high >= bound and k >= excess:
                break
            del table[p]
            self.pruned = max(self.pruned, high + 1)

    def anchor(self) -> tuple[dict[str, tuple[int, int]], int] | None:
        """(states, pruned) to carry in an anchor, pruned first; None if they are unknown
        or too many (more open transactions than ANCHOR_MAX_PRODUCERS)."""
        self.prune()
        states = self.states()
        if states is None or len(states) > ANCHOR_MAX_PRODUCERS:
            return None
        return states, self.pruned


def _line_ids(line: bytes) -> tuple[bytes, int, int] | None:
    """(producer, clock, flags) of a JSON line the node wrote (its `uuid` first), or None
    if it has none (the reader gives such a line a nil UUID: not sequenced)."""
    try:
        if line.startswith(b'{"uuid":"') and line[45:46] == b'"':
            text = line[9:45].decode("ascii")
        else:
            doc = orjson.loads(line)
            value = doc.get("uuid") if isinstance(doc, dict) else None
            if not isinstance(value, str):
                return None
            text = value
        producer, clock, flags = parse_uuid_fields(text)
    except ValueError:  # orjson.JSONDecodeError and bad UUIDs alike
        return None
    return producer, clock, int(flags)


class _Unanchored(Exception):
    """A consumer from an anchor met a line it cannot sequence from the anchor's states:
    one of a producer pruned from them (see `_ProducerStates`), at `offset`."""

    def __init__(self, offset: int) -> None:
        super().__init__(offset)
        self.offset = offset


class _TickedLines:
    """Raw envelopes of a channel (from its first offset, in journal order) passed through
    while counting their ticks: `tick` and `begin` are those of the last line pulled.

    A Sequencer pulls lines one at a time and yields what a line commits before pulling
    the next, so when it yields, the last line pulled is the one that committed it: an
    OUTSIDE_TXN message itself, or the ACK of a transaction (its messages share the ACK's
    tick)."""

    __slots__ = ("tick", "begin", "end", "_anchor", "_on_position", "_known", "_pruned")

    def __init__(self, anchor: int = 0, tick: int = 0,
                 on_position: Callable[[int], None] | None = None,
                 known: set[bytes] | None = None, pruned: int = 0) -> None:
        # Lines before `anchor` (read only for the transactions open there) do not count:
        # `tick` is the channel's tick at `anchor` (an anchor, see StreamingNode).
        self.tick = tick
        self.begin = -1
        self.end = anchor
        self._anchor = anchor
        self._on_position = on_position
        # Sequencing from an anchor's producer states pruned below clock `pruned`: the
        # producers known so far (`_Unanchored` for an unknown one's line below it).
        self._known = known
        self._pruned = pruned

    def over(self, batches: Iterator[list[Any]]) -> Iterator[Any]:
        """The envelopes of `batches`, counting ticks; after each batch (once the sequencer
        yielded everything its lines committed), `on_position(end of its last line)`.
        Raises `_Unanchored` before passing on a line the anchor's states cannot decide."""
        known, pruned = self._known, self._pruned
        for batch in batches:
            for env in batch:
                if env.begin >= self._anchor:
                    producer, clock, _ = env.ids
                    if known is not None and producer not in known:
                        if 0 < clock < pruned:
                            raise _Unanchored(env.begin)
                        known.add(producer)
                    prev = self.tick
                    self.tick = prev + 1 if clock <= prev else clock
                self.begin = env.begin
                self.end = env.end
                yield env
            if self._on_position is not None and batch:
                self._on_position(self.end)


class _ChannelTicks:
    """The owner's ticks of its own appends (for append results), by `next_tick`.

    Appends are registered with their lines' UUID clocks by `wrote`, while the writer
    holds the journal's write lock, so the queue is in journal order. `of(aa)` takes the
    queue's appends in order once durable, reading from the store any lines between them
    that other writers put there (a rollback ACK, a broadcast, a fenced zombie, or the
    channel's whole history the first time), so its ticks are those every reader computes.
    The same lines, in the same order, advance `states`, the Sequencer's producer states.
    Invariant: `tick` is the tick of the last line ending at `offset`, and `states` are the
    producer states there (see `_ProducerStates`)."""

    def __init__(self, client: JournalClient, name: str) -> None:
        self.client = client
        self.name = name
        self.offset = 0
        self.tick = 0
        self.states = _ProducerStates()
        self._queue: deque[tuple[Any, list[int], bytes]] = deque()
        self._queue_lock = threading.Lock()  # never held while waiting
        self._lock = threading.Lock()  # held while advancing
        self._done: dict[Any, list[int]] = {}

    def wrote(self, aa: Any, clocks: list[int], data: bytes) -> None:
        """Register append `aa` (its lines' clocks in order, and its bytes, whose lines'
        UUIDs advance `states` once it is counted). Caller holds the write lock."""
        with self._queue_lock:
            self._queue.append((aa, clocks, data))

    def of(self, aa: Any) -> list[int]:
        """The ticks of `aa`'s lines (registered, durable): [] if they cannot be known (the
        store failed while reading lines of other writers)."""
        with self._lock:
            try:
                while aa not in self._done:
                    with self._queue_lock:
                        if not self._queue:
                            return []
                        front, clocks, data = self._queue[0]
                    try:
                        res = front.result()
                    except Exception:  # noqa: BLE001 - not in the journal as ours: skip it
                        res = None
                    if res is not None and res.begin > self.offset:
                        self._read_gap(res.begin)
                    with self._queue_lock:
                        self._queue.popleft()
                    if res is None:
                        continue
                    ticks = []
                    tick = self.tick
                    for clock in clocks:
                        tick = tick + 1 if clock <= tick else clock
                        ticks.append(tick)
                    if res.begin == self.offset:
                        self._apply(res.begin, data)
                        self.tick, self.offset = tick, res.end
                    self._done[front] = ticks
            except Exception as exc:  # noqa: BLE001 - the gap read failed: ticks unknown
                log.warning("time ticks of %r after offset %d: %s", self.name, self.offset, exc)
                return []
            return self._done.pop(aa)

    def seed(self, offset: int, tick: int, states: _ProducerStates) -> None:
        """Start from an anchor (the channel's tick `tick` and producer `states` at line
        boundary `offset`, from the previous owner's beat) instead of offset 0. Before any
        append is registered."""
        with self._lock:
            self.offset, self.tick, self.states = offset, tick, states

    def catch_up(self, end: int) -> bool:
        """Count the lines up to `end` (the head) if no append of ours is pending; True if
        `offset` is then `end`."""
        with self._lock:
            with self._queue_lock:
                if self._queue:
                    return False
            if end > self.offset:
                self._read_gap(end)
            return self.offset >= end

    def settled(self) -> tuple[int, int] | None:
        """(offset, tick) if no registered append of ours is waiting to be counted (so every
        append of ours registered so far ends at or before `offset`), else None. Caller
        holds the journal's write lock, so none can be registered meanwhile."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            with self._queue_lock:
                if self._queue:
                    return None
            return self.offset, self.tick
        finally:
            self._lock.release()

    def anchor(self) -> tuple[int, int]:
        """A consistent (offset, tick at offset)."""
        with self._lock:
            return self.offset, self.tick

    def anchor_with_states(
        self,
    ) -> tuple[int, int, tuple[dict[str, tuple[int, int]], int] | None]:
        """A consistent (offset, tick at offset, (producer states, pruned) at offset or None
        if they are unknown or too many: see `_ProducerStates.anchor`)."""
        with self._lock:
            return self.offset, self.tick, self.states.anchor()

    def _apply(self, begin: int, data: bytes) -> None:
        """Advance `states` over the lines of `data`, appended at `begin`."""
        states = self.states
        if states.table is None:
            return
        pos, size = 0, len(data)
        while pos < size:
            nl = data.find(b"\n", pos)
            end = size if nl < 0 else nl + 1
            ids = _line_ids(data[pos:end])
            if ids is not None:
                states.apply(ids[0], ids[1], ids[2], begin + pos)
            pos = end

    def _read_gap(self, end: int) -> None:
        from oncelog.reading import read_uncommitted

        tick = self.tick
        states = self.states.copy()  # kept only if the whole gap was read
        for env in read_uncommitted(self.client, self.name, self.offset, end=end,
                                    on_error="skip"):
            producer, clock, flags = env.ids
            tick = next_tick(tick, clock)
            states.apply(producer, clock, int(flags), env.begin)
        self.tick, self.offset, self.states = tick, end, states


def read_ticked(
    client: JournalClient, name: str, start: int, on_open: Callable[[Any], None] | None = None,
    *, origin: tuple[int, int, int] = (0, 0, 0),
    states: dict[str, tuple[int, int]] | None = None, pruned: int = 0,
    on_position: Callable[[int], None] | None = None,
) -> Generator[tuple[Any, int], None, None]:
    """Read-committed envelopes of channel `name` (ACKs included) that are committed at or
    after offset `start`, each with its time tick, tailing the channel.

    The channel is sequenced from its first offset, whatever `start`: the ticks (by
    `next_tick`) and the sequencing state at `start` are then exactly those of a reader
    that began at offset 0. So a consumer started mid-channel delivers the messages of
    transactions that were open at `start` and commit after it, drops resent copies of
    messages from before it, and its ticks equal every other reader's. An envelope is
    committed at the line that made the sequencer yield it (`_TickedLines`): its own for a
    committed message, the ACK for a transaction's messages, which carry the ACK's tick.
    The price: a consumer starting mid-channel reads the channel's history first.

    `origin` = (lo, anchor, tick) starts from an anchor instead (see StreamingNode): the
    channel's tick at line boundary `anchor` <= `start` is `tick`.

    - With the anchor's producer `states` (a Sequencer checkpoint's, by producer hex:
      (last ACK clock, pending begin); `lo` must be `anchor`), the Sequencer is restored
      from them at `anchor`: copies of messages acknowledged before it are dropped as from
      offset 0, and a transaction open there is replayed from its begin when it commits.
      States `pruned` below a clock (see `_ProducerStates`) cannot decide a line of an
      unknown producer below that clock: from that line on, the channel is sequenced from
      offset 0 again, delivering only what lines at or after it commit (everything before
      was decided alike by both).
    - Without (an older node's anchor), every transaction open at `anchor` began at or
      after `lo` <= `anchor`: sequencing starts at `lo` with no producer state, so those
      transactions are delivered when they commit after `start`; copies of messages from
      before `lo` are not recognised.

    `on_position(end)`: every line before `end` was pulled and everything it committed
    yielded (called from the generator, in order)."""
    from oncelog.sequencer import ProducerState, Sequencer

    lo, anchor, tick = origin
    if states is None:
        yield from _sequenced(client, name, start, on_open, Sequencer(offsets={name: lo}),
                              _TickedLines(anchor, tick, on_position))
        return
    seq = Sequencer(offsets={name: anchor}, states=[
        ProducerState(name, bytes.fromhex(p), last, begin) for p, (last, begin) in states.items()
    ])
    known = {bytes.fromhex(p) for p in states} if pruned else None
    try:
        yield from _sequenced(client, name, start, on_open, seq,
                              _TickedLines(anchor, tick, on_position, known, pruned))
        return
    except _Unanchored as exc:
        log.info("channel %r: a line at offset %d may copy a producer pruned from the "
                 "anchor's states (clocks below %d): sequencing from offset 0",
                 name, exc.offset, pruned)
        resume = exc.offset
    yield from _sequenced(client, name, max(start, resume), on_open,
                          Sequencer(offsets={name: 0}), _TickedLines(0, 0, on_position))


def _sequenced(
    client: JournalClient, name: str, start: int, on_open: Callable[[Any], None] | None,
    seq: Any, lines: _TickedLines,
) -> Generator[tuple[Any, int], None, None]:
    """`read_ticked` from `seq`'s offset of `name`, counting ticks with `lines`."""
    from oncelog.reading import read_uncommitted, read_uncommitted_batches

    def replay(journal: str, begin: int, end: int) -> Iterator[Any]:
        return read_uncommitted(client, journal, begin, end=end, on_error="skip", exact=True)

    batches = read_uncommitted_batches(client, name, seq.offsets[name], block=True,
                                       on_error="skip", on_open=on_open)
    try:
        for env in seq.sequence(lines.over(batches), replay, acks=True):
            if lines.begin >= start:
                yield env, lines.tick
    finally:
        batches.close()


HEALTH_SERVICE = "oncelog.streaming.v1.StreamingNodeService"
"""The service name the node reports in `grpc.health.v1` (besides "", the whole server)."""

_HEALTH_PREFIX = "/grpc.health.v1.Health/"


# -- metrics ----------------------------------------------------------------------------------


class NodeMetrics:
    """Prometheus metrics of one node (`oncelog serve --metrics-listen`, the `metrics` extra).

    - `<ns>_streaming_appends_total{channel}`: produce requests acknowledged (durable, owner
      confirmed); `<ns>_streaming_messages_total{channel}` and
      `<ns>_streaming_bytes_total{channel}`: their messages and stored bytes;
    - `<ns>_streaming_produce_seconds`: from a request taken off its stream to its answer;
    - `<ns>_streaming_fenced_total{channel}`: answers CHANNEL_FENCED (requests and streams);
    - `<ns>_streaming_store_errors_total{operation}`: store requests that failed (appends,
      the keeper's heartbeats, ticks and scans, broadcasts, rollbacks);
    - `<ns>_streaming_open_transactions`, `<ns>_streaming_owned_channels`: gauges read from
      the node when scraped.

    Only acknowledged requests are counted as appends, so the counters never include work
    whose outcome was unknown or refused."""

    def __init__(self, registry: Any = None, namespace: str = "oncelog") -> None:
        with needs_extra("metrics", "NodeMetrics"):
            import prometheus_client as prom
        kw: dict[str, Any] = {"namespace": namespace}
        if registry is not None:
            kw["registry"] = registry
        self.appends = prom.Counter("streaming_appends", "Produce requests acknowledged",
                                    ["channel"], **kw)
        self.messages = prom.Counter("streaming_messages", "Messages acknowledged",
                                     ["channel"], **kw)
        self.bytes = prom.Counter("streaming_bytes", "Stored bytes of messages acknowledged",
                                  ["channel"], **kw)
        self.produce_seconds = prom.Histogram(
            "streaming_produce_seconds", "From a produce request taken to its answer", **kw)
        self.fenced = prom.Counter("streaming_fenced", "Answers CHANNEL_FENCED", ["channel"],
                                   **kw)
        self.store_errors = prom.Counter("streaming_store_errors",
                                         "Store requests of the node that failed",
                                         ["operation"], **kw)
        self.open_transactions = prom.Gauge("streaming_open_transactions",
                                            "Transactions open on the node", **kw)
        self.owned_channels = prom.Gauge("streaming_owned_channels",
                                         "Channels the node owns (not fenced)", **kw)

    def bind(self, node: StreamingNode) -> None:
        """Read the gauges from `node` at each scrape."""
        self.open_transactions.set_function(node.open_transactions)
        self.owned_channels.set_function(node.owned_count)

    def answered(self, channel: str, answers: Any, started: float) -> None:
        """Count the ProduceMessageResponses `answers` of `channel` (one request each)."""
        seconds = time.monotonic() - started
        for answer in answers:
            self.produce_seconds.observe(seconds)
            if answer.WhichOneof("response") == "error":
                code = answer.error.code
                if code == Code.CHANNEL_FENCED:
                    self.fenced.labels(channel).inc()
                elif code == Code.INNER:
                    self.store_errors.labels("append").inc()
                continue
            ids = answer.result.ids
            if ids:
                self.appends.labels(channel).inc()
                self.messages.labels(channel).inc(len(ids))
                self.bytes.labels(channel).inc(sum(i.end - i.begin for i in ids))


# -- channel ownership ----------------------------------------------------------------------


class _Channel:
    """A channel this node owns at `term`. `confirm()` is the fencing check: it returns only
    after a term LIST that *started after the call*, so whatever the caller made durable
    before calling is covered; concurrent callers share one LIST."""

    def __init__(self, client: JournalClient, record: meta.TermRecord) -> None:
        self.client = client
        self.name = record.channel
        self.term = record.term
        self.record = record
        self.fenced: str | None = None
        self.draining: str | None = None  # set: requests are refused (see StreamingNode.drain)
        self.last_append = time.monotonic()
        self.ticks = _ChannelTicks(client, record.channel)  # of the lines, for answers
        # Idle ticks (see StreamingNode._ticks): `idle` is the newest, valid at line boundary
        # `idle_offset`; `floor` is an idle tick no line in the journal carries yet: the next
        # append of this node begins with a floor line (an ACK of the node's tick producer
        # whose clock is `floor`), so every later line's tick is above it.
        self.idle = 0
        self.idle_offset = -1
        self.floor = 0
        self.last_idle = 0.0
        self.synced = False  # `ticks` counted up to the head once since the take
        # Transactions open here (their first append), and begins inherited from the
        # previous owner's anchor (kept until `inherited_until`, monotonic).
        self.txns: weakref.WeakSet[_Txn] = weakref.WeakSet()
        self.inherited: list[int] = []
        self.inherited_until = 0.0
        self.broadcasts: dict[int, int] = {}  # in progress: id -> ticks offset at its start
        self._cv = threading.Condition()
        self._started = 0  # checks started
        self._done = 0  # the newest check finished (its start number)
        self._running = False
        self._busy = 0  # requests taken off a stream and not answered yet

    def lead(self, producer: bytes) -> tuple[bytes, list[int]]:
        """The floor line to write first in an append (and its clock), or nothing. Caller
        holds the journal's write lock (so the floor is written exactly once, before any
        other line of this node after the idle tick)."""
        floor = self.floor
        if not floor:
            return b"", []
        self.floor = 0
        text = str(build_uuid(producer, floor, ACK_TXN))
        return orjson.dumps({"uuid": text}) + b"\n", [floor]

    def open_begins(self, offset: int) -> list[int]:
        """Begins (below `offset`) of the transactions open at `offset` that this node knows:
        its own (first append durable below `offset`), broadcasts in progress, and those
        inherited from the previous owner's anchor."""
        begins = [b for b in self.broadcasts.values() if b < offset]
        for txn in list(self.txns):
            aa = txn.first_append
            if txn.state is not TxnState.OPEN or aa is None or not aa.done():
                continue
            try:
                begin = aa.result().begin
            except Exception:  # noqa: BLE001 - not in the journal
                continue
            if begin < offset:
                begins.append(begin)
        if time.monotonic() < self.inherited_until:
            begins.extend(b for b in self.inherited if b < offset)
        return sorted(set(begins))

    def enter(self) -> None:
        """A stream took a request of this channel (answered later: `leave`)."""
        with self._cv:
            self._busy += 1

    def leave(self, n: int) -> None:
        """`n` requests were answered."""
        with self._cv:
            self._busy -= n
            if self._busy <= 0:
                self._cv.notify_all()

    def quiesce(self, why: str, timeout: float) -> bool:
        """Refuse every request taken from now on (`draining`), then wait, at most `timeout`
        seconds, until every request taken before is answered. True if none is left.
        Invariant: a request is refused if its check ran after this call set `draining`;
        one whose check ran before counted itself busy first (`enter`), so it is waited for."""
        deadline = time.monotonic() + timeout
        with self._cv:
            self.draining = why
            while self._busy > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def fence(self, why: str) -> None:
        if self.fenced is None:
            self.fenced = why
            log.warning("channel %r fenced at term %d: %s", self.name, self.term, why)

    def confirm(self) -> bool:
        """True if no higher term existed at some point after this call began."""
        with self._cv:
            need = self._started + 1
            while True:
                if self.fenced is not None:
                    return False
                if self._done >= need:
                    return True
                if not self._running:
                    self._running = True
                    self._started += 1
                    mine = self._started
                    break
                self._cv.wait()
        try:
            newer = meta.newer_terms(self.client, self.name, self.term)
            if newer:
                self.fence(f"term {newer[-1]} was taken by another node")
        finally:
            with self._cv:
                self._running = False
                self._done = mine
                self._cv.notify_all()
        return self.fenced is None


# -- produce streams ------------------------------------------------------------------------


@dataclass(eq=False)
class _Txn:
    """A transaction of a Produce stream. Its producer, clocks, state and keepalive are the
    rules of `pt` (its producer is the client's, from its UUIDs, or a new one of ours);
    `lock` guards `pt` and `stamped_by_client`."""

    txn_id: int
    vchannel: str
    keepalive: float  # seconds
    pt: ProducerTransaction = field(default_factory=ProducerTransaction)
    stamped_by_client: bool | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    first_append: Any = None  # AsyncAppend of its first messages (for anchors' open begins)

    @property
    def state(self) -> TxnState:
        return self.pt.state


@dataclass
class _Pending:
    """A request waiting for durability (appends) and the fencing check, or an answer ready."""

    request_id: int
    appends: list[Any] = field(default_factory=list)  # AsyncAppend
    sizes: list[list[int]] = field(default_factory=list)  # per append, each message's length
    answer: pb.ProduceResponse | None = None
    txn_id: int = 0
    time_tick: int = 0
    on_durable: Callable[[], None] | None = None
    lead: int = 0  # bytes of a floor line written before the request's lines (not a message)
    # A ProduceBatchRequest: per request (id, error answer or None, message sizes, tick);
    # the valid ones' bytes are `appends[0]`, in this order.
    batch: list[_BatchItem] | None = None
    started: float = field(default_factory=time.monotonic)  # for the latency metric


@dataclass(slots=True)
class _BatchItem:
    """One request of a batch: its error answer, or the sizes of its messages (appended)."""

    request_id: int
    error: pb.StreamingError | None = None
    sizes: list[int] = field(default_factory=list)
    time_tick: int = 0
    clocks: list[int] = field(default_factory=list)  # its lines' UUID clocks


class _ProducerStream:
    """One Produce stream: requests are validated and appended in arrival order by `pump`
    (so a producer's messages land in the journal in its order), answered in the same order
    by `complete` once durable and confirmed."""

    _ids = iter(range(1, 1 << 62))
    _ids_lock = threading.Lock()

    def __init__(self, node: StreamingNode, channel: _Channel) -> None:
        self.node = node
        self.channel = channel
        with self._ids_lock:
            self.producer_id = next(self._ids)
        self.own_producer = new_producer_id()  # stamps messages sent without a UUID
        self.clock = Clock()
        self.last_request = 0
        self.client_producer: bytes | None = None
        self.client_clock = 0
        self.txns: dict[int, _Txn] = {}
        self.next_txn = 1
        self.pending: queue.Queue[_Pending | None] = queue.Queue()
        self.out: queue.Queue[pb.ProduceResponse | None] = queue.Queue()

    # The pump: reads requests in order -------------------------------------------------

    def pump(self, requests: Iterator[pb.ProduceRequest]) -> None:
        """Handle the stream's requests in order. When it ends, open transactions are rolled
        back, except, if it broke (no `close`), those whose UUIDs the client stamps: the
        client finishes them itself through a new stream (an orphan commit or rollback, see
        `_orphan_ack`), and their keepalive rolls back those it abandons. Rolling one back
        here would race that commit's ACK, and the lower rollback ACK landing first would
        discard messages whose commit was then acknowledged."""
        closed = False
        try:
            for req in requests:
                kind = req.WhichOneof("request")
                if kind == "close":
                    closed = True
                    break
                self.channel.enter()  # answered in `complete`; a drain waits for it
                try:
                    item = self._handle(kind, req)
                except BaseException:
                    self.channel.leave(1)  # nothing to answer: not busy any more
                    raise
                self.pending.put(item)
        except grpc.RpcError:
            pass  # the client went away
        except Exception:
            log.exception("produce stream of %r failed", self.channel.name)
        finally:
            for txn in list(self.txns.values()):
                if closed or not txn.stamped_by_client:
                    self._rollback(txn, TxnState.ROLLED_BACK)
            self.pending.put(None)

    def _handle(self, kind: str | None, req: pb.ProduceRequest) -> _Pending:
        if kind == "batch":
            return self._batch(req.batch)
        body: Any = getattr(req, kind) if kind else None
        request_id = int(getattr(body, "request_id", 0))
        if kind not in ("produce", "begin_txn", "commit_txn", "rollback_txn"):
            return self._answer(request_id, Code.INVALID_ARGUMENT, f"unexpected {kind} request")
        if request_id <= self.last_request:
            return self._answer(
                request_id,
                Code.INVALID_REQUEST_SEQ,
                f"request id {request_id} is not above the previous one ({self.last_request})",
            )
        self.last_request = request_id
        if self.channel.fenced is not None:
            return self._answer(request_id, Code.CHANNEL_FENCED, self.channel.fenced)
        if self.channel.draining is not None:
            return self._answer(request_id, Code.CHANNEL_FENCED, self.channel.draining)
        if self.node.closing:
            return self._answer(request_id, Code.ON_SHUTDOWN, "the node is shutting down")
        try:
            if kind in ("commit_txn", "rollback_txn") and body.orphan:
                return self._orphan_ack(request_id, body, commit=kind == "commit_txn")
            if kind == "produce":
                return self._produce(request_id, body)
            if kind == "begin_txn":
                return self._begin(request_id, body)
            if kind == "commit_txn":
                return self._commit(request_id, body)
            return self._rollback_request(request_id, body)
        except StreamingError as exc:
            return self._answer(request_id, exc.code, exc.cause)
        except Exception as exc:  # noqa: BLE001 - the store failed: answer, keep serving
            log.warning("produce to %r failed: %s", self.channel.name, exc)
            return self._answer(request_id, Code.INNER, f"{type(exc).__name__}: {exc}")

    def _batch(self, body: pb.ProduceBatchRequest) -> _Pending:
        """Validate each request of a batch on its own (request ids, messages, UUIDs), then
        append every valid one in ONE journal append: each stays contiguous and atomic, and
        the batch costs one appender round, one write and one fencing check."""
        items: list[_BatchItem] = []
        parts: list[tuple[_BatchItem, list[bytes] | None, Any]] = []
        for sub in body.requests:
            item = _BatchItem(int(sub.request_id))
            items.append(item)
            try:
                if item.request_id <= self.last_request:
                    raise StreamingError(
                        Code.INVALID_REQUEST_SEQ,
                        f"request id {item.request_id} is not above the previous one "
                        f"({self.last_request})",
                    )
                self.last_request = item.request_id
                if self.channel.fenced is not None:
                    raise StreamingError(Code.CHANNEL_FENCED, self.channel.fenced)
                if self.channel.draining is not None:
                    raise StreamingError(Code.CHANNEL_FENCED, self.channel.draining)
                if self.node.closing:
                    raise StreamingError(Code.ON_SHUTDOWN, "the node is shutting down")
                if sub.txn_id:
                    raise StreamingError(Code.INVALID_ARGUMENT,
                                         "transactional requests cannot be batched")
                lines, clocks = self._committed_lines(sub)
            except StreamingError as exc:
                item.error = _err(exc.code, exc.cause)
                continue
            except Exception as exc:  # noqa: BLE001 - answered; the others go on
                item.error = _err(Code.INNER, f"{type(exc).__name__}: {exc}")
                continue
            if lines is None:
                parts.append((item, None, sub.messages))  # stamped below, in append order
            else:
                item.sizes = [len(line) for line in lines]
                item.clocks = clocks
                parts.append((item, lines, None))
        pending = _Pending(items[-1].request_id if items else 0, batch=items)
        if not parts:
            return pending
        try:
            aa: AsyncAppend = self.node.client.start_append(self.channel.name)
        except Exception as exc:  # noqa: BLE001 - the store failed: answer, keep serving
            log.warning("produce to %r failed: %s", self.channel.name, exc)
            for item, _, _ in parts:
                item.error = _err(Code.INNER, f"{type(exc).__name__}: {exc}")
            return pending
        try:
            lead, lead_clocks = self.channel.lead(self.node.tick_producer)
            chunks: list[bytes] = [lead] if lead else []
            pending.lead = len(lead)
            for item, lines, messages in parts:
                if lines is None:
                    self.clock.update()
                    lines = []
                    for msg in messages:
                        clock = self.clock.tick()
                        item.clocks.append(clock)
                        lines.append(encode_message(
                            msg, str(build_uuid(self.own_producer, clock, OUTSIDE_TXN))))
                    item.sizes = [len(line) for line in lines]
                chunks.extend(lines)
            data = b"".join(chunks)
            aa.write(data)
            self.channel.ticks.wrote(
                aa, lead_clocks + [c for item, _, _ in parts for c in item.clocks], data)
        except BaseException:
            self.channel.floor = self.channel.floor or (lead_clocks[0] if lead_clocks else 0)
            aa.abort()
            raise
        aa.release()
        self.channel.last_append = time.monotonic()
        pending.appends = [aa]
        return pending

    def _committed_lines(
        self, body: pb.ProduceMessageRequest
    ) -> tuple[list[bytes] | None, list[int]]:
        """The stored lines of a committed request whose messages carry UUIDs (checked, and
        the stream's producer clock advanced) and their clocks, or None if the node is to
        stamp them."""
        self._check_messages(body.messages)
        stamped = [bool(m.uuid) for m in body.messages]
        if not any(stamped):
            return None, []
        if not all(stamped):
            raise StreamingError(
                Code.INVALID_ARGUMENT, "either every message of a request has a UUID or none"
            )
        lines: list[bytes] = []
        clocks: list[int] = []
        producer, last = self.client_producer, self.client_clock
        for msg in body.messages:
            producer, last = self._client_uuid(msg.uuid, OUTSIDE_TXN, producer, last)
            lines.append(encode_message(msg, msg.uuid))
            clocks.append(last)
        self.client_producer, self.client_clock = producer, last
        return lines, clocks

    @staticmethod
    def _answer(request_id: int, code: Code, cause: str) -> _Pending:
        answer = pb.ProduceResponse(
            produce=pb.ProduceMessageResponse(request_id=request_id, error=_err(code, cause))
        )
        return _Pending(request_id, answer=answer)

    def _check_messages(self, messages: Any) -> None:
        cfg = self.node.config
        if not messages:
            raise StreamingError(Code.INVALID_ARGUMENT, "a produce request needs messages")
        if len(messages) > cfg.max_messages_per_request:
            raise StreamingError(
                Code.INVALID_ARGUMENT,
                f"{len(messages)} messages in one request; the node's limit is "
                f"{cfg.max_messages_per_request}",
            )
        for i, msg in enumerate(messages):
            check_message_size(msg, cfg.max_message_bytes, f"message {i}",
                               "nothing of this request was appended")

    def _client_uuid(self, text: str, flags: int, producer: bytes | None, last: int) -> tuple[
        bytes, int
    ]:
        """Parse a producer-stamped UUID: its flags must be `flags`, its producer `producer`
        (when known) and its clock above `last` (a producer's clocks only grow)."""
        try:
            got_producer, clock, got_flags = parse_uuid_fields(text)
            uuid.UUID(text)
        except ValueError:
            raise StreamingError(Code.INVALID_ARGUMENT, f"not a message UUID: {text!r}") from None
        if got_producer == _NIL_PRODUCER or clock == 0:
            raise StreamingError(Code.INVALID_ARGUMENT, f"UUID {text} has no producer or clock")
        if int(got_flags) != flags:
            raise StreamingError(
                Code.INVALID_ARGUMENT, f"UUID {text} has flags {int(got_flags)}, expected {flags}"
            )
        if producer is not None and got_producer != producer:
            raise StreamingError(
                Code.INVALID_ARGUMENT, f"UUID {text} is of another producer than this stream's"
            )
        if clock <= last:
            raise StreamingError(
                Code.INVALID_ARGUMENT,
                f"UUID {text}: its clock does not grow past the producer's previous one",
            )
        return got_producer, clock

    def _produce(self, request_id: int, body: pb.ProduceMessageRequest) -> _Pending:
        if body.txn_id:
            self._check_messages(body.messages)
            return self._produce_txn(request_id, body)
        lines, clocks = self._committed_lines(body)
        if lines is not None:
            return self._append(request_id, lines, clocks)
        return self._append(request_id, body.messages, [], stamp=OUTSIDE_TXN)

    def _append(
        self,
        request_id: int,
        lines: Any,
        clocks: list[int],
        *,
        stamp: int | None = None,
        txn_id: int = 0,
    ) -> _Pending:
        """Append `lines` whose UUID clocks are `clocks` (or, with `stamp`, messages stamped
        with the stream's own producer under the journal's append order) as one append; the
        pending answer waits for it. The lines are registered for their time ticks under the
        journal's write lock (see _ChannelTicks)."""
        aa: AsyncAppend = self.node.client.start_append(self.channel.name)
        sizes = []
        try:
            lead, lead_clocks = self.channel.lead(self.node.tick_producer)
            if stamp is None:
                data = b"".join(lines)
                sizes = [len(line) for line in lines]
            else:
                clock = self.clock
                clock.update()
                parts = []
                clocks = []
                for msg in lines:
                    clocks.append(clock.tick())
                    text = str(build_uuid(self.own_producer, clocks[-1], stamp))
                    parts.append(encode_message(msg, text))
                data = b"".join(parts)
                sizes = [len(p) for p in parts]
            data = lead + data
            aa.write(data)
            self.channel.ticks.wrote(aa, lead_clocks + clocks, data)
        except BaseException:
            self.channel.floor = self.channel.floor or (lead_clocks[0] if lead_clocks else 0)
            aa.abort()
            raise
        aa.release()
        self.channel.last_append = time.monotonic()
        return _Pending(request_id, [aa], [sizes], txn_id=txn_id, lead=len(lead))

    # Transactions --------------------------------------------------------------------------

    def _begin(self, request_id: int, body: pb.BeginTxnRequest) -> _Pending:
        default_keepalive = self.node.config.txn_keepalive
        keepalive = body.keepalive_ms / 1000 if body.keepalive_ms else default_keepalive
        label = f"transaction {self.next_txn} on {self.channel.name!r}"
        txn = _Txn(self.next_txn, body.vchannel, keepalive, ProducerTransaction(label=label))
        self.next_txn += 1
        self.txns[txn.txn_id] = txn
        # Its timer rolls it back once it sends nothing for `keepalive` (see _expire).
        txn.pt.keepalive = Keepalive(keepalive, lambda: self._expire(txn))
        answer = pb.ProduceResponse(
            produce=pb.ProduceMessageResponse(
                request_id=request_id, result=pb.ProduceMessageResult(txn_id=txn.txn_id)
            )
        )
        return _Pending(request_id, answer=answer)

    def _expire(self, txn: _Txn) -> None:
        """The keepalive ran out (its timer thread): roll back, unless finished meanwhile."""
        self._rollback(txn, TxnState.EXPIRED)

    def _open_txn(self, txn_id: int) -> _Txn:
        txn = self.txns.get(txn_id)
        if txn is None:
            raise StreamingError(Code.INVALID_ARGUMENT, f"no transaction {txn_id} on this stream")
        if txn.state is TxnState.EXPIRED:
            raise StreamingError(
                Code.TRANSACTION_EXPIRED,
                f"transaction {txn_id} sent nothing for its keepalive of {txn.keepalive:g} s "
                "and was rolled back",
            )
        if txn.state is not TxnState.OPEN:
            raise StreamingError(Code.IGNORED_OPERATION, f"transaction {txn_id} is {txn.state}")
        return txn

    def _produce_txn(self, request_id: int, body: pb.ProduceMessageRequest) -> _Pending:
        txn = self._open_txn(body.txn_id)
        with txn.lock:
            txn = self._open_txn(body.txn_id)  # not expired meanwhile
            for msg in body.messages:
                if msg.vchannel and msg.vchannel != txn.vchannel:
                    raise StreamingError(
                        Code.INVALID_ARGUMENT,
                        f"transaction {txn.txn_id} writes vchannel {txn.vchannel!r}, "
                        f"not {msg.vchannel!r}",
                    )
            by_client = bool(body.messages[0].uuid)
            if any(bool(m.uuid) != by_client for m in body.messages) or (
                txn.stamped_by_client is not None and txn.stamped_by_client != by_client
            ):
                raise StreamingError(
                    Code.INVALID_ARGUMENT,
                    "either every message of a transaction has a UUID or none",
                )
            txn.stamped_by_client = by_client
            pt = txn.pt
            msgs = [pb.Message(payload=m.payload, properties=m.properties,
                               vchannel=txn.vchannel, uuid=m.uuid) for m in body.messages]
            if by_client:
                # Every UUID is checked before any is noted: a refused request leaves the
                # transaction's producer and clocks as they were.
                new_producer = pt.producer is None
                lines, producer, first, last = [], pt.producer, 0, pt.last_clock
                clocks = []
                for msg in msgs:
                    producer, last = self._client_uuid(msg.uuid, CONTINUE_TXN, producer, last)
                    first = first or last
                    lines.append(encode_message(msg, msg.uuid))
                    clocks.append(last)
                pt.note(first, last, producer)
                if new_producer and producer is not None:
                    self.node.remember_txn(self.channel.name, producer, txn)
            else:
                uuids = pt.continue_uuids(len(msgs))
                lines = [encode_message(m, str(u)) for m, u in zip(msgs, uuids)]
                clocks = [parse_uuid_fields(str(u))[1] for u in uuids]
            pending = self._append(request_id, lines, clocks, txn_id=txn.txn_id)
            if txn.first_append is None:
                txn.first_append = pending.appends[0]
                self.channel.txns.add(txn)
            pt.touch()
            return pending

    def _commit(self, request_id: int, body: pb.CommitTxnRequest) -> _Pending:
        txn = self._open_txn(body.txn_id)
        with txn.lock:
            txn = self._open_txn(body.txn_id)
            pt = txn.pt
            pt.stop_keepalive()
            if not pt.written:  # nothing written: nothing to commit
                pt.finish(TxnState.COMMITTED)
                return self._result(request_id, txn.txn_id)
            if body.ack_uuid:
                # The client's ACK: its clock must not be below the last message's.
                _, ack_clock = self._client_uuid(body.ack_uuid, ACK_TXN, pt.producer,
                                                 pt.last_clock - 1)
                ack_text = body.ack_uuid
            else:
                ack_text = str(pt.commit_uuid())
                ack_clock = pt.ack_clock
            # Fencing: the ACK commits the transaction, so it is appended only by the owner.
            if not self.channel.confirm():
                self._rollback_locked(txn, TxnState.ROLLED_BACK)
                raise StreamingError(Code.CHANNEL_FENCED, self.channel.fenced or "fenced")
            pending = self._append(request_id, [orjson.dumps({"uuid": ack_text}) + b"\n"],
                                   [ack_clock], txn_id=txn.txn_id)
            pending.sizes = [[]]  # the ACK is not a message of the answer
            pt.finish(TxnState.COMMITTED)
            return pending

    def _orphan_ack(self, request_id: int, body: Any, *, commit: bool) -> _Pending:
        """Commit or roll back a transaction whose stream broke, opened on a node that died
        or on this one: append the client's ACK as it is (after the fencing check, like a
        commit). Its messages are durable (the client commits an orphan only once every
        append was acknowledged), so the ACK alone commits them, or, re-asserting the clock
        before them, rolls them back. A copy of an ACK the dead node appended already
        changes nothing.

        A transaction this node still knows (its producer's, see `remember_txn`) is settled
        under its lock first: an open one is marked finished (its keepalive can no longer
        roll it back behind the commit's ACK), and a commit of one this node already rolled
        back (its keepalive ran out) is refused with TRANSACTION_EXPIRED, nothing appended:
        the rollback ACK is in the journal before it, so the ACK would commit nothing."""
        if not body.ack_uuid:
            raise StreamingError(Code.INVALID_ARGUMENT, "an orphan commit or rollback needs "
                                 "its ack_uuid")
        try:
            producer, clock, flags = parse_uuid_fields(body.ack_uuid)
        except ValueError:
            raise StreamingError(Code.INVALID_ARGUMENT,
                                 f"not a message UUID: {body.ack_uuid!r}") from None
        if int(flags) != ACK_TXN or clock == 0:
            raise StreamingError(Code.INVALID_ARGUMENT,
                                 f"UUID {body.ack_uuid} is not an acknowledgement")
        if not self.channel.confirm():
            raise StreamingError(Code.CHANNEL_FENCED, self.channel.fenced or "fenced")
        line = orjson.dumps({"uuid": body.ack_uuid}) + b"\n"
        txn = self.node.known_txn(self.channel.name, producer)
        if txn is None:
            pending = self._append(request_id, [line], [clock])
            pending.sizes = [[]]
            return pending
        with txn.lock:
            if txn.state is TxnState.OPEN:
                txn.pt.finish(TxnState.COMMITTED if commit else TxnState.ROLLED_BACK)
            elif commit and txn.state in (TxnState.ROLLED_BACK, TxnState.EXPIRED):
                raise StreamingError(
                    Code.TRANSACTION_EXPIRED,
                    f"transaction {txn.txn_id} on {self.channel.name!r} was {txn.state} on "
                    f"this node before its commit arrived (keepalive {txn.keepalive:g} s): "
                    "nothing was committed",
                )
            pending = self._append(request_id, [line], [clock])  # in order, under the lock
        pending.sizes = [[]]
        return pending

    def _result(self, request_id: int, txn_id: int) -> _Pending:
        answer = pb.ProduceResponse(
            produce=pb.ProduceMessageResponse(
                request_id=request_id, result=pb.ProduceMessageResult(txn_id=txn_id)
            )
        )
        return _Pending(request_id, answer=answer)

    def _rollback_request(self, request_id: int, body: pb.RollbackTxnRequest) -> _Pending:
        txn = self._open_txn(body.txn_id)
        self._rollback(txn, TxnState.ROLLED_BACK)
        return self._result(request_id, txn.txn_id)

    def _rollback(self, txn: _Txn, state: TxnState) -> None:
        with txn.lock:
            if txn.state is TxnState.OPEN:
                self._rollback_locked(txn, state)

    def _rollback_locked(self, txn: _Txn, state: TxnState) -> None:
        """Finish the transaction as `state` (rolled back or expired) and append its
        rollback ACK (`ProducerTransaction.rollback_uuid`: the clock just below its first
        message): readers discard its messages (Gazette's rollback). Caller holds the lock."""
        txn.pt.finish(state)
        rollback = txn.pt.rollback_uuid()
        if rollback is None or self.channel.fenced is not None:
            return
        ack = str(rollback)
        try:
            # The client may finish a transaction it stamps on the channel's next owner
            # (an orphan commit): a node that lost the channel must not roll it back.
            if txn.stamped_by_client and not self.channel.confirm():
                return
            self.node.append_plain(self.channel, orjson.dumps({"uuid": ack}) + b"\n")
        except Exception as exc:  # noqa: BLE001 - never acknowledged: readers drop it anyway
            log.warning("rollback of a transaction on %r failed: %s", self.channel.name, exc)

    # Completion: answers in order ------------------------------------------------------

    def complete(self) -> None:
        try:
            while True:
                item = self.pending.get()
                if item is None:
                    break
                batch = [item]
                while True:  # more requests already durable share the fencing check
                    try:
                        nxt = self.pending.get_nowait()
                    except queue.Empty:
                        break
                    batch.append(cast(_Pending, nxt))
                    if nxt is None or not all(a.done() for a in nxt.appends):
                        break
                end = batch[-1] is None
                if end:
                    batch.pop()
                try:
                    self._answer_batch(batch)
                finally:
                    self.channel.leave(len(batch))
                if end:
                    break
        finally:
            self.out.put(None)

    def _stamp_ticks(self, item: _Pending) -> None:
        """Set the time ticks of a durable request's answer: those of its last line (of
        each request of a batch). 0 if the store failed while they were counted."""
        if not item.appends:
            return
        ticks = self.channel.ticks.of(item.appends[0])
        if item.batch is None:
            item.time_tick = ticks[-1] if ticks else 0
            return
        at = 1 if item.lead else 0  # the floor line's tick comes first
        for sub in item.batch:
            if sub.error is None and sub.clocks:
                at += len(sub.clocks)
                sub.time_tick = ticks[at - 1] if len(ticks) >= at else 0

    def _answer_batch(self, batch: list[_Pending]) -> None:
        results: list[tuple[_Pending, list[Any] | Exception]] = []
        for item in batch:
            if item.answer is not None:
                results.append((item, []))
                continue
            try:
                results.append((item, [a.result() for a in item.appends]))
            except Exception as exc:  # noqa: BLE001 - answered as INNER
                results.append((item, exc))
                continue
            self._stamp_ticks(item)
        needs_check = any(item.answer is None and item.appends for item in batch)
        owner = self.channel.confirm() if needs_check else True
        for item, got in results:
            if item.answer is not None:
                self._put(item.answer, item.started)
                continue
            if item.batch is not None:
                self._put(self._batch_answer(item, got, owner), item.started)
                continue
            if isinstance(got, Exception):
                error = _err(Code.INNER, f"the append failed, its outcome unknown: {got}")
            elif not owner:
                error = _err(
                    Code.CHANNEL_FENCED,
                    f"{self.channel.fenced}; this request is not acknowledged (it may be in "
                    "the journal: resend it with the same UUIDs to the new owner)",
                )
            else:
                error = None
            if error is not None:
                resp = pb.ProduceMessageResponse(request_id=item.request_id, error=error)
            else:
                ids = []
                for res, sizes in zip(got, item.sizes):  # type: ignore[arg-type]
                    begin = res.begin + item.lead
                    for size in sizes:
                        ids.append(pb.MessageID(channel=self.channel.name, begin=begin,
                                                end=begin + size))
                        begin += size
                resp = pb.ProduceMessageResponse(
                    request_id=item.request_id,
                    result=pb.ProduceMessageResult(ids=ids, txn_id=item.txn_id,
                                                   time_tick=item.time_tick),
                )
            self._put(pb.ProduceResponse(produce=resp), item.started)

    def _put(self, resp: pb.ProduceResponse, started: float) -> None:
        """Send `resp` (counted in the node's metrics, if any)."""
        metrics = self.node.metrics
        if metrics is not None:
            answers = resp.batch.responses if resp.WhichOneof("response") == "batch" \
                else (resp.produce,)
            metrics.answered(self.channel.name, answers, started)
        self.out.put(resp)

    def _batch_answer(self, item: _Pending, got: list[Any] | Exception,
                      owner: bool) -> pb.ProduceResponse:
        """The answers of a batch: its invalid requests' errors; the appended ones' ids (or
        the append's failure, or CHANNEL_FENCED: not acknowledged)."""
        assert item.batch is not None
        error: pb.StreamingError | None = None
        if isinstance(got, Exception):
            error = _err(Code.INNER, f"the append failed, its outcome unknown: {got}")
        elif not owner and item.appends:
            error = _err(
                Code.CHANNEL_FENCED,
                f"{self.channel.fenced}; this request is not acknowledged (it may be in "
                "the journal: resend it with the same UUIDs to the new owner)",
            )
        begin = got[0].begin + item.lead if got and not isinstance(got, Exception) else 0
        name = self.channel.name
        answers = []
        for sub in item.batch:
            if sub.error is not None:
                answers.append(pb.ProduceMessageResponse(request_id=sub.request_id,
                                                         error=sub.error))
                continue
            if error is not None:
                answers.append(pb.ProduceMessageResponse(request_id=sub.request_id,
                                                         error=error))
                continue
            ids = []
            for size in sub.sizes:
                ids.append(pb.MessageID(channel=name, begin=begin, end=begin + size))
                begin += size
            answers.append(pb.ProduceMessageResponse(
                request_id=sub.request_id,
                result=pb.ProduceMessageResult(ids=ids, time_tick=sub.time_tick),
            ))
        return pb.ProduceResponse(batch=pb.ProduceBatchResponse(responses=answers))


# -- the service ------------------------------------------------------------------------------


class StreamingNode(pb_grpc.StreamingNodeServiceServicer):
    """The servicer, plus the node's background keeper (heartbeats, time ticks, failover)."""

    def __init__(self, client: JournalClient, config: NodeConfig) -> None:
        self.client = client
        self.config = config
        self.token = uuid.uuid4().hex  # this process's incarnation
        self.closing = False
        self._lock = threading.Lock()
        # Serializes this node's takes of channels (its scan, AssignChannel, CreateChannel), so
        # that two of them never take one channel twice: the second finds it taken.
        self._take_lock = threading.Lock()
        self._owned: dict[str, _Channel] = {}
        # Client-stamped transactions by (channel, producer), newest last (at most
        # _KNOWN_TXNS): orphan commits and rollbacks settle them (see _orphan_ack).
        self._txns: OrderedDict[tuple[str, bytes], _Txn] = OrderedDict()
        self.tick_producer = new_producer_id()  # its ACKs are floor lines (idle ticks)
        self._tick_clock = Clock()
        self._records: dict[str, meta.TermRecord] = {}  # newest term records seen by scans
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None
        self._heartbeat: meta.Heartbeat | None = None
        self._leases = meta.LeaseWatcher(client, config.lease_timeout)
        self.metrics: NodeMetrics | None = None
        self.health: Any = None  # grpc_health's HealthServicer, set by `serve`
        self._streams: weakref.WeakSet[_ProducerStream] = weakref.WeakSet()
        # Notified whenever this node takes or releases a channel (WatchChannels wakes up).
        self._changed = threading.Condition()
        # Channels this node released (UnassignChannel): name -> the released term. Its
        # failover scan leaves them to the other nodes.
        self._released: dict[str, int] = {}

    def open_transactions(self) -> int:
        """Transactions open on this node's Produce streams (a gauge of NodeMetrics)."""
        return sum(1 for stream in list(self._streams) for txn in list(stream.txns.values())
                   if txn.state is TxnState.OPEN)

    def owned_count(self) -> int:
        """Channels this node owns and is not fenced on (a gauge of NodeMetrics)."""
        with self._lock:
            return sum(1 for c in self._owned.values() if c.fenced is None)

    def _store_error(self, operation: str) -> None:
        if self.metrics is not None:
            self.metrics.store_errors.labels(operation).inc()

    def _notify_change(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def remember_txn(self, channel: str, producer: bytes, txn: _Txn) -> None:
        """Know `txn` (client-stamped, of `producer`) for orphan commits and rollbacks sent
        on another stream of this node; the oldest are forgotten past _KNOWN_TXNS."""
        with self._lock:
            self._txns[(channel, producer)] = txn
            while len(self._txns) > _KNOWN_TXNS:
                self._txns.popitem(last=False)

    def known_txn(self, channel: str, producer: bytes) -> _Txn | None:
        with self._lock:
            return self._txns.get((channel, producer))

    # Ownership --------------------------------------------------------------------------

    def start(self) -> None:
        """Begin heartbeating, take the configured channels, start the keeper thread."""
        self._heartbeat = meta.Heartbeat(self.client, self.config.node_id, self.config.address,
                                         self.token)
        self._heartbeat.beat()
        for name in self.config.take:
            self.take(name)
        self._keeper = threading.Thread(target=self._keep, name="oncelog-streaming-keeper",
                                        daemon=True)
        self._keeper.start()

    def take(self, name: str) -> _Channel:
        """Take `name` at the term after the newest (fencing its previous owner)."""
        if not self.client.exists(name):
            raise StreamingError(Code.CHANNEL_NOT_EXIST, f"channel {name!r} does not exist")
        with self._take_lock:
            return self._take(name)

    def _take(self, name: str) -> _Channel:
        """`take`, under `_take_lock`."""
        for _ in range(5):
            latest = meta.latest_term(self.client, name)
            if latest is not None and latest.node_id == self.config.node_id \
                    and latest.token == self.token:
                with self._lock:
                    mine = self._owned.get(name)
                if mine is not None and mine.term == latest.term and mine.fenced is None:
                    return mine  # this node took it meanwhile (its scan): nothing to redo
            record = meta.TermRecord(
                name, (latest.term if latest else 0) + 1, self.config.node_id,
                self.config.address, self.config.description, self.token,
            )
            if meta.take_term(self.client, record):
                channel = _Channel(self.client, record)
                self._continue_from(channel, latest)
                self._compact(name)
                with self._lock:
                    old = self._owned.get(name)
                    if old is not None:
                        old.fence(f"re-taken at term {record.term}")
                    self._owned[name] = channel
                    self._released.pop(name, None)
                log.info("took channel %r at term %d", name, record.term)
                self._notify_change()
                return channel
        raise StreamingError(Code.CHANNEL_FENCED, f"could not take channel {name!r}: other "
                             "nodes kept taking it")

    def _continue_from(self, channel: _Channel, previous: meta.TermRecord | None) -> None:
        """Continue the channel's ticks from its previous owner's newest beat (taken after
        our term, so that owner publishes no later idle tick a consumer would accept, see
        Consume): its anchor seeds our counting of ticks and producer states (we read only
        the lines after it, not the channel from offset 0), its idle tick becomes our
        floor, its open transactions' begins our anchors' for INHERIT_SECONDS. Without a
        beat, or with an anchor without producer states (an older node's, or one that had
        to leave them out), we count from offset 0, once: our anchors then carry states."""
        if previous is None:
            return
        try:
            if not previous.node_id and previous.term > 1:  # released: its releaser's
                previous = meta.read_term(self.client, channel.name, previous.term - 1)
                if previous is None or not previous.node_id:
                    return
            beat = meta.read_beat(self.client, previous.node_id)
            entry = ((beat or {}).get("channels") or {}).get(channel.name)
            if not isinstance(entry, dict) or int(entry.get("term", 0)) >= channel.term:
                return
            anchor = meta.parse_anchor(entry)
            if anchor is not None and anchor.states is not None:
                channel.ticks.seed(anchor.offset, anchor.tick,
                                   _ProducerStates(anchor.states, anchor.pruned))
            else:
                log.info("channel %r: the previous owner's anchor has no producer states: "
                         "counting from offset 0", channel.name)
            channel.floor = max(int(entry.get("idle", 0)), int(entry.get("floor", 0)))
            channel.idle = channel.floor
            channel.inherited = [int(b) for b in entry.get("open", ())]
            channel.inherited_until = time.monotonic() + max(
                INHERIT_SECONDS, 2 * self.config.txn_keepalive)
        except Exception as exc:  # noqa: BLE001 - counted from offset 0 instead
            log.warning("channel %r: no anchor from its previous owner: %s", channel.name, exc)

    def _compact(self, name: str) -> None:
        """Have the client's auto-compactor compact this channel behind its head (channels
        created before carry no compact_after in their spec: CHANNEL_COMPACT_AFTER)."""
        try:
            spec = self.client.get(name)
            self.client.compact_automatically(
                name, None if spec.fragment.compact_after else CHANNEL_COMPACT_AFTER
            )
        except Exception as exc:  # noqa: BLE001 - compaction is an optimisation
            log.warning("channel %r: no auto-compaction: %s", name, exc)

    def append_plain(self, channel: _Channel, line: bytes) -> None:
        """Append `line` (not counted for answers' ticks), after the channel's floor line
        if one is due; wait until durable."""
        aa = self.client.start_append(channel.name)
        try:
            lead, _ = channel.lead(self.tick_producer)
            aa.write(lead + line)
        except BaseException:
            aa.abort()
            raise
        aa.release()
        aa.result()

    def _owned_channel(self, name: str, term: int) -> _Channel:
        with self._lock:
            channel = self._owned.get(name)
        if channel is None:
            latest = meta.latest_term(self.client, name) if self.client.exists(name) else None
            if latest is None and not self.client.exists(name):
                raise StreamingError(Code.CHANNEL_NOT_EXIST, f"channel {name!r} does not exist")
            owner = f"; its owner is {latest.node_id} at {latest.address} (term {latest.term})" \
                if latest else ""
            raise StreamingError(
                Code.CHANNEL_NOT_EXIST, f"channel {name!r} is not assigned to this node{owner}"
            )
        if channel.fenced is not None:
            raise StreamingError(Code.CHANNEL_FENCED, channel.fenced)
        if channel.draining is not None:
            raise StreamingError(Code.CHANNEL_FENCED, channel.draining)
        if term and term != channel.term:
            raise StreamingError(
                Code.UNMATCHED_CHANNEL_TERM,
                f"channel {name!r} is at term {channel.term} on this node, not {term}",
            )
        return channel

    def describe(self, name: str) -> pb.ChannelDescription:
        try:
            spec = self.client.get(name)
        except Exception:  # noqa: BLE001 - no such journal, or a name that cannot be one
            raise StreamingError(Code.CHANNEL_NOT_EXIST, f"channel {name!r} does not exist") \
                from None
        latest = meta.latest_term(self.client, name)
        desc = pb.ChannelDescription(
            channel=pb.ChannelInfo(name=name, term=latest.term if latest else 0),
            description=spec.owner.description if spec.owner else "",
            head=self.client.head(name),
            labels={k: v for k, v in spec.labels.to_dict().items()
                    if isinstance(v, str)} if hasattr(spec.labels, "to_dict") else {},
        )
        if latest is not None:
            desc.owner.CopyFrom(pb.ChannelOwner(node_id=latest.node_id, address=latest.address,
                                                description=latest.description))
        return desc

    # The keeper: heartbeats, time ticks, failover -----------------------------------------

    def _keep(self) -> None:
        """Every `heartbeat_interval`: idle ticks, then one beat carrying them and every
        owned channel's anchor, then one scan. The store requests per round are bounded
        whatever the number of channels: one PUT and one DELETE (the beat), one recursive
        LIST (the scan), plus one GET per term that changed since the last scan."""
        cfg = self.config
        next_scan = time.monotonic() + cfg.heartbeat_interval * random.uniform(0.5, 1.0)
        while not self._stop.wait(min(cfg.heartbeat_interval, cfg.tick_interval) / 2):
            now = time.monotonic()
            try:
                self._ticks()
                if now >= next_scan:
                    next_scan = now + cfg.heartbeat_interval
                    assert self._heartbeat is not None
                    if not self._heartbeat.beat(self._anchors()):
                        log.warning("another process beats as node %r", cfg.node_id)
                    self._scan()
            except Exception as exc:  # noqa: BLE001 - the store may be down: try again later
                log.warning("streaming keeper: %s", exc)
                self._store_error("keeper")

    def _ticks(self) -> None:
        """Give each owned channel idle for tick_interval an idle tick, written to NO
        journal: it goes out in the next beat (and to this node's consumers at once).

        Under the journal's write lock, with every append of ours counted (else the
        channel is not idle), the tick is T = max(tick at the head + 1, our clock, the
        previous idle tick + 1), valid at the head (`idle_offset`): every line before has
        a lower tick, and our next append begins with a floor line of clock T (see
        `_Channel.lead`), so every later line has a higher one."""
        now = time.monotonic()
        with self._lock:
            idle = [c for c in self._owned.values()
                    if c.fenced is None and c.draining is None
                    and now - max(c.last_append, c.last_idle) >= self.config.tick_interval]
        for channel in idle:
            if not channel.synced:
                # Once after the take: count the lines the previous owner (or anyone)
                # wrote after the anchor we continue from.
                if not channel.ticks.catch_up(self.client.head(channel.name)):
                    continue
                channel.synced = True
            aa = self.client.start_append(channel.name)  # the write lock; nothing written
            try:
                settled = channel.ticks.settled()
                if settled is None:
                    continue
                offset, tick = settled
                self._tick_clock.update()
                idle_tick = max(tick + 1, self._tick_clock.tick(), channel.idle + 1)
                channel.idle, channel.idle_offset = idle_tick, offset
                channel.floor = idle_tick
                channel.last_idle = now
            finally:
                aa.abort()

    def idle_tick(self, name: str) -> tuple[int, int] | None:
        """(offset, tick) of this node's newest idle tick of `name`, if it owns it."""
        with self._lock:
            channel = self._owned.get(name)
        if channel is None or channel.fenced is not None or not channel.idle:
            return None
        return channel.idle_offset, channel.idle

    def _anchors(self) -> dict[str, dict[str, Any]]:
        """What the beat carries per owned channel: the anchor {term, offset, tick, open,
        states, pruned} (the channel's tick at line boundary `offset`, the begins of the
        transactions open there, and the producer states there, see `meta.Anchor`) and
        `idle`, the idle tick valid at `offset` (0: none), and `floor`, an idle tick no line
        carries yet (the next owner starts above it).

        A beat's size is bounded: per channel, at most ANCHOR_MAX_PRODUCERS states (about
        39 bytes each) or `"states": null` (consumers then read from offset 0)."""
        with self._lock:
            owned = [c for c in self._owned.values() if c.fenced is None]
        out: dict[str, dict[str, Any]] = {}
        for c in owned:
            offset, tick, snap = c.ticks.anchor_with_states()
            states, pruned = snap if snap is not None else (None, 0)
            out[c.name] = {
                "term": c.term, "offset": offset, "tick": tick,
                "idle": c.idle if c.idle_offset == offset else 0,
                "floor": c.floor, "open": c.open_begins(offset),
                "states": None if states is None else {p: list(v) for p, v in states.items()},
                "pruned": pruned,
            }
        return out

    def channel_anchor(self, name: str) -> meta.Anchor | None:
        """The newest anchor of `name`: this node's own if it owns the channel, else its
        owner's newest beat's (one LIST and GET for the term, one LIST and GET for the
        beat); None if there is none, or if it has no producer states where it should
        (`meta.parse_anchor`)."""
        with self._lock:
            channel = self._owned.get(name)
        if channel is not None and channel.fenced is None:
            offset, tick, snap = channel.ticks.anchor_with_states()
            if snap is None:
                return None
            return meta.Anchor(offset, tick, tuple(channel.open_begins(offset)), *snap)
        record = meta.latest_term(self.client, name)
        if record is None:
            return None
        if not record.node_id and record.term > 1:
            record = meta.read_term(self.client, name, record.term - 1)
            if record is None:
                return None
        beat = meta.read_beat(self.client, record.node_id)
        return meta.parse_anchor(((beat or {}).get("channels") or {}).get(name))

    def _scan(self) -> None:
        """One listing of every term record and beat (meta.StoreView). Fence owned channels
        that have a higher term (even when nobody produces). With `--failover`, take the
        channels whose owner's lease expired (or that a previous incarnation of this node
        id owned, or that were released). Every live node races; the term's put-if-absent
        picks one."""
        view = meta.StoreView.read(self.client)
        now = time.monotonic()
        with self._lock:
            owned = dict(self._owned)
        for name, term in view.terms.items():
            mine = owned.get(name)
            if mine is not None and mine.fenced is None:
                # As an idle channel's tick did before: a channel idle for tick_interval
                # notices its higher term (one with appends notices it at its next check).
                if term > mine.term and now - mine.last_append >= self.config.tick_interval:
                    mine.fence(f"term {term} was taken by another node")
                    self._notify_change()
                continue
            if not self.config.failover:
                continue
            latest = self._records.get(name)
            if latest is None or latest.term != term:
                latest = meta.read_term(self.client, name, term)
                if latest is None:
                    continue
                self._records[name] = latest
            if not latest.node_id:
                # Released by its owner (UnassignChannel): taken at once, by any node but
                # the one that released it.
                with self._lock:
                    if self._released.get(name) == latest.term:
                        continue
            elif latest.node_id == self.config.node_id:
                if latest.token == self.token:
                    continue
            elif not self._leases.expired(latest.node_id, view.beats.get(latest.node_id, 0)):
                continue
            try:
                self.take(name)
            except StreamingError as exc:
                log.info("failover of %r: %s", name, exc)
        for gone in set(self._records) - set(view.terms):
            del self._records[gone]

    def close(self) -> None:
        """Stop: health turns NOT_SERVING at once (load balancers and clients move away
        while in-flight calls finish), new requests are refused, the keeper stops."""
        if self.health is not None:
            self.health.enter_graceful_shutdown()
        self.closing = True
        self._notify_change()
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join(timeout=5)

    # RPCs ------------------------------------------------------------------------------

    def CreateChannel(self, request: pb.CreateChannelRequest, context: Any) -> Any:
        from oncelog.journal import FragmentSpec, JournalExists, JournalOwner, JournalSpec
        from oncelog.tables import SEGMENTS_LABEL

        try:
            spec = JournalSpec(
                request.name,
                # No columnar segments unless asked: sealing them is CPU work in the
                # node's process, which stalled its appends (p99 10 -> 40 ms) each time a
                # channel was compacted. `oncelog journals compact` elsewhere can write them.
                labels={SEGMENTS_LABEL: "off", **dict(request.labels)},
                fragment=FragmentSpec(compact_after=CHANNEL_COMPACT_AFTER),
                owner=JournalOwner(meta.CHANNEL_ROLE, self.config.address, request.description),
            )
        except Exception as exc:  # noqa: BLE001 - a bad name or label
            return pb.CreateChannelResponse(error=_err(Code.INVALID_ARGUMENT, str(exc)))
        try:
            self.client.create(spec)
        except JournalExists:
            return pb.CreateChannelResponse(
                error=_err(Code.CHANNEL_EXIST, f"channel {request.name!r} already exists")
            )
        return self._assigned(request.name, pb.CreateChannelResponse)

    def _assigned(self, name: str, response: Any) -> Any:
        try:
            self.take(name)
            return response(channel=self.describe(name))
        except StreamingError as exc:
            return response(error=_err(exc.code, exc.cause))
        except Exception as exc:  # noqa: BLE001 - the store failed
            return response(error=_err(Code.INNER, str(exc)))

    def DescribeChannel(self, request: pb.DescribeChannelRequest, context: Any) -> Any:
        try:
            return pb.DescribeChannelResponse(channel=self.describe(request.name))
        except StreamingError as exc:
            return pb.DescribeChannelResponse(error=_err(exc.code, exc.cause))
        except Exception as exc:  # noqa: BLE001 - bad name or store failure
            return pb.DescribeChannelResponse(error=_err(Code.INVALID_ARGUMENT, str(exc)))

    def DestroyChannel(self, request: pb.DestroyChannelRequest, context: Any) -> Any:
        from oncelog.journal import JournalNotFound

        name = request.name
        try:
            with self._lock:
                channel = self._owned.pop(name, None)
            if channel is not None:
                channel.fence("the channel was destroyed")
            self.client.delete(name)
            meta.delete_terms(self.client, name)
        except JournalNotFound:
            return pb.DestroyChannelResponse(
                error=_err(Code.CHANNEL_NOT_EXIST, f"channel {name!r} does not exist")
            )
        except Exception as exc:  # noqa: BLE001
            return pb.DestroyChannelResponse(error=_err(Code.INNER, str(exc)))
        return pb.DestroyChannelResponse()

    def AssignChannel(self, request: pb.AssignChannelRequest, context: Any) -> Any:
        """Take the channel at term + 1, unless this node owns it already: then nothing is
        done (the term stays, its streams go on) and the answer is CHANNEL_EXIST with the
        channel's description."""
        name = request.name
        with self._lock:
            channel = self._owned.get(name)
        try:
            if (channel is not None and channel.fenced is None and channel.draining is None
                    and channel.confirm()):
                return pb.AssignChannelResponse(
                    error=_err(Code.CHANNEL_EXIST, f"channel {name!r} is already assigned to "
                               f"node {self.config.node_id} at term {channel.term}"),
                    channel=self.describe(name))
        except Exception as exc:  # noqa: BLE001 - the store failed
            self._store_error("assign")
            return pb.AssignChannelResponse(error=_err(Code.INNER, str(exc)))
        return self._assigned(name, pb.AssignChannelResponse)

    def UnassignChannel(self, request: pb.UnassignChannelRequest, context: Any) -> Any:
        try:
            return pb.UnassignChannelResponse(channel=self.drain(request.name))
        except StreamingError as exc:
            return pb.UnassignChannelResponse(error=_err(exc.code, exc.cause))
        except Exception as exc:  # noqa: BLE001 - the store failed
            self._store_error("unassign")
            return pb.UnassignChannelResponse(error=_err(Code.INNER, f"{type(exc).__name__}: "
                                                         f"{exc}"))

    def drain(self, name: str, timeout: float = 30.0) -> pb.ChannelDescription:
        """Hand channel `name` over gracefully: refuse new requests on it (CHANNEL_FENCED,
        so clients look the owner up again and resend there), wait until every request
        already taken is answered (durable and confirmed: nothing taken is left unanswered
        or answered fenced), flush, then record the next term as released (no owner). The
        channel is then fenced here; any other node takes it at the following term at once.
        If the wait times out or the release loses to another node's term, the requests not
        yet answered get CHANNEL_FENCED (not acknowledged: resent to the new owner)."""
        channel = self._owned_channel(name, 0)
        term = channel.term
        why = (f"channel {name!r} is being handed over by node {self.config.node_id} "
               f"(term {term}): send to its next owner")
        if not channel.quiesce(why, timeout):
            log.warning("drain of %r: requests still unanswered after %g s", name, timeout)
        self.client.flush()
        record = meta.TermRecord(name, term + 1, "", "",
                                 f"released by node {self.config.node_id}", "")
        released = meta.take_term(self.client, record)
        with self._lock:
            if released:
                self._released[name] = record.term
            channel.fence(f"unassigned: released at term {record.term}" if released
                          else f"term {record.term} was taken by another node while draining")
        self._notify_change()
        log.info("released channel %r at term %d", name, record.term)
        return self.describe(name)

    def WatchChannels(self, request: pb.WatchChannelsRequest,
                      context: Any) -> Iterator[pb.WatchChannelsResponse]:
        """The description of each channel named, then one each time its term changes.
        Changes made by this node are sent at once; those of other nodes are found by
        reading the channels' newest terms every heartbeat interval (one LIST per channel
        watched), so clients follow owners without polling DescribeChannel."""
        names = list(dict.fromkeys(request.names))
        if not names:
            yield pb.WatchChannelsResponse(error=_err(Code.INVALID_ARGUMENT,
                                                      "WatchChannels needs channel names"))
            return
        stopped = threading.Event()

        def stop() -> None:
            stopped.set()
            self._notify_change()

        context.add_callback(stop)
        sent: dict[str, int] = {}
        while not stopped.is_set() and not self.closing:
            for name in names:
                try:
                    latest = meta.latest_term(self.client, name) if name in sent else None
                    if latest is not None and latest.term == sent[name]:
                        continue
                    desc = self.describe(name)
                except StreamingError as exc:
                    yield pb.WatchChannelsResponse(error=_err(exc.code, exc.cause))
                    return
                except Exception as exc:  # noqa: BLE001 - the store failed: try again
                    self._store_error("watch")
                    log.warning("watch of %r: %s", name, exc)
                    continue
                if sent.get(name) != desc.channel.term:
                    sent[name] = desc.channel.term
                    yield pb.WatchChannelsResponse(channel=desc)
            with self._changed:
                if not stopped.is_set():
                    self._changed.wait(self.config.heartbeat_interval)

    def ListChannels(self, request: pb.ListChannelsRequest, context: Any) -> Any:
        with self._lock:
            owned = [c for c in self._owned.values() if c.fenced is None]
        return pb.ListChannelsResponse(
            channels=[
                pb.ChannelDescription(
                    channel=pb.ChannelInfo(name=c.name, term=c.term),
                    owner=pb.ChannelOwner(node_id=self.config.node_id,
                                          address=self.config.address,
                                          description=self.config.description),
                )
                for c in owned
            ]
        )

    def Produce(self, request_iterator: Any, context: Any) -> Iterator[pb.ProduceResponse]:
        first = next(request_iterator, None)
        if first is None:
            return
        if first.WhichOneof("request") != "create":
            yield pb.ProduceResponse(create=pb.CreateProducerResponse(
                error=_err(Code.INVALID_ARGUMENT, "a Produce stream begins with a create request")
            ))
            return
        info = first.create.channel
        try:
            if self.closing:
                raise StreamingError(Code.ON_SHUTDOWN, "the node is shutting down")
            channel = self._owned_channel(info.name, info.term)
            if not channel.confirm():  # one LIST per stream: a fenced node appends nothing
                raise StreamingError(Code.CHANNEL_FENCED, channel.fenced or "fenced")
        except StreamingError as exc:
            if exc.code == Code.CHANNEL_FENCED and self.metrics is not None:
                self.metrics.fenced.labels(info.name).inc()
            yield pb.ProduceResponse(create=pb.CreateProducerResponse(
                error=_err(exc.code, exc.cause)))
            return
        except Exception as exc:  # noqa: BLE001 - bad name, store failure
            yield pb.ProduceResponse(create=pb.CreateProducerResponse(
                error=_err(Code.INVALID_ARGUMENT, str(exc))))
            return
        stream = _ProducerStream(self, channel)
        self._streams.add(stream)
        yield pb.ProduceResponse(create=pb.CreateProducerResponse(
            producer_id=stream.producer_id,
            channel=pb.ChannelInfo(name=channel.name, term=channel.term),
            max_request_bytes=self.config.max_request_bytes,
        ))
        pump = threading.Thread(target=stream.pump, args=(request_iterator,), daemon=True,
                                name="oncelog-produce-pump")
        done = threading.Thread(target=stream.complete, daemon=True,
                                name="oncelog-produce-complete")
        pump.start()
        done.start()
        while True:
            item = stream.out.get()
            if item is None:
                break
            yield item
        yield pb.ProduceResponse(close=pb.CloseProducerResponse())

    def Consume(self, request: pb.ConsumeRequest, context: Any) -> Iterator[pb.ConsumeResponse]:
        from oncelog.message import Flags

        name = request.channel.name
        try:
            start, keep, origin, anchor = self._consume_plan(request)
        except StreamingError as exc:
            yield pb.ConsumeResponse(error=_err(exc.code, exc.cause))
            return
        yield pb.ConsumeResponse(create=pb.CreateConsumerResponse(start_offset=start))
        readers: list[Any] = []
        stopped = threading.Event()

        def stop() -> None:
            stopped.set()
            for r in readers:
                r.close()

        def opened(reader: Any) -> None:
            readers.append(reader)
            if stopped.is_set():
                reader.close()

        context.add_callback(stop)
        ticks = request.time_ticks
        last_tick = 0
        skip = request.skip  # a resumed consumer: these were delivered before
        resume_after = request.resume_after if request.HasField("resume_after") else None
        items: queue.Queue[tuple[str, Any, int]] = queue.Queue(maxsize=4096)

        def put(item: tuple[str, Any, int]) -> None:
            while not stopped.is_set():
                try:
                    items.put(item, timeout=0.2)
                    return
                except queue.Full:
                    continue

        def read() -> None:
            it = read_ticked(self.client, name, start, opened, origin=origin,
                             states=None if anchor is None else anchor.states,
                             pruned=0 if anchor is None else anchor.pruned,
                             on_position=lambda end: put(("pos", None, end)))
            try:
                for env, clock in it:
                    put(("env", env, clock))
                put(("end", None, 0))
            except Exception as exc:  # noqa: BLE001 - e.g. the journal was deleted
                put(("err", exc, 0))
            finally:
                it.close()

        reader = threading.Thread(target=read, name="oncelog-consume", daemon=True)
        reader.start()
        position = origin[0]  # every line before it was read and what it committed sent
        poll = min(self.config.heartbeat_interval, self.config.tick_interval)
        next_poll = time.monotonic()
        try:
            while not stopped.is_set():
                try:
                    kind, env, clock = items.get(timeout=poll / 2)
                except queue.Empty:
                    kind, env, clock = "idle", None, 0
                if kind == "err":
                    if not stopped.is_set():
                        yield pb.ConsumeResponse(error=_err(
                            Code.INNER, f"{type(env).__name__}: {env}"))
                    return
                if kind == "end":
                    return
                if kind == "pos":
                    position = max(position, clock)
                if kind in ("pos", "idle") and ticks and not skip \
                        and time.monotonic() >= next_poll:
                    # Idle ticks travel in beats, not in the journal: sent once every line
                    # before the tick's offset was read (all lines after it tick higher).
                    next_poll = time.monotonic() + poll
                    idle = self.idle_tick(name)
                    if idle is None:
                        try:
                            idle = meta.idle_tick(self.client, name)
                        except Exception as exc:  # noqa: BLE001 - the store: later
                            log.debug("idle tick of %r: %s", name, exc)
                    if idle is not None and position >= idle[0] and idle[1] > last_tick:
                        last_tick = idle[1]
                        yield pb.ConsumeResponse(time_tick=pb.TimeTickResponse(
                            time_tick=idle[1], offset=idle[0]))
                if kind != "env":
                    continue
                flags = env.ids[2]
                if flags == Flags.ACK_TXN:
                    if ticks and clock > last_tick and not skip:
                        last_tick = clock
                        yield pb.ConsumeResponse(time_tick=pb.TimeTickResponse(
                            time_tick=clock, offset=env.end))
                    continue
                doc = getattr(env.message, "doc", None)
                if not isinstance(doc, dict) or not keep(clock, doc):
                    continue
                if skip:
                    skip -= 1
                    if not skip and resume_after is not None and (
                            env.begin, env.end) != (resume_after.begin, resume_after.end):
                        yield pb.ConsumeResponse(error=_err(
                            Code.INVALID_ARGUMENT,
                            f"cannot resume channel {name!r}: the last message delivered "
                            f"before was [{resume_after.begin}, {resume_after.end}), now it "
                            f"is [{env.begin}, {env.end})"))
                        return
                    continue
                yield pb.ConsumeResponse(consume=pb.ConsumeMessageResponse(
                    id=pb.MessageID(channel=name, begin=env.begin, end=env.end),
                    message=decode_message(doc),
                    time_tick=clock,
                ))
        finally:
            stop()

    def _consume_plan(
        self, request: pb.ConsumeRequest
    ) -> tuple[int, Callable[[int, dict[str, Any]], bool], tuple[int, int, int],
               meta.Anchor | None]:
        """Where the consumer starts, its filter, and where it sequences from (`read_ticked`'s
        origin, and the anchor whose producer states it restores, if any): the newest anchor
        at or before its start (a fresh consumer of `latest`, `start_from`, `start_after`),
        else offset 0 (`all`, a resumed consumer, no anchor). From an anchor with producer
        states it sequences from the anchor's offset; from an older node's (none), from the
        earliest begin of the transactions open there."""
        name = request.channel.name
        try:
            exists = self.client.exists(name)
        except Exception as exc:  # noqa: BLE001 - a bad name
            raise StreamingError(Code.INVALID_ARGUMENT, str(exc)) from None
        if not exists:
            raise StreamingError(Code.CHANNEL_NOT_EXIST, f"channel {name!r} does not exist")
        policy = request.deliver_policy
        kind = policy.WhichOneof("policy") or "all"
        anchor: meta.Anchor | None = None
        if kind != "all" and not request.skip:
            try:
                anchor = self.channel_anchor(name)  # before the head: at or before it
            except Exception as exc:  # noqa: BLE001 - read from offset 0 instead
                log.info("no anchor of %r: %s", name, exc)
        if kind == "all":
            start = 0
        elif kind == "latest":
            start = self.client.head(name)
        else:
            mid = getattr(policy, kind)
            if mid.channel and mid.channel != name:
                raise StreamingError(Code.INVALID_ARGUMENT,
                                     f"message id of channel {mid.channel!r}, not {name!r}")
            start = mid.begin if kind == "start_from" else mid.end
            if start < 0 or mid.end < mid.begin:
                raise StreamingError(Code.INVALID_ARGUMENT, f"bad message id {mid}")
        low_gt: int | None = None
        low_gte: int | None = None
        vchannels: set[str] = set()
        for f in request.deliver_filters:
            which = f.WhichOneof("filter")
            if which == "time_tick_gt":
                low_gt = max(low_gt or 0, f.time_tick_gt.time_tick)
            elif which == "time_tick_gte":
                low_gte = max(low_gte or 0, f.time_tick_gte.time_tick)
            elif which == "vchannel":
                vchannels.add(f.vchannel.vchannel)
            else:
                raise StreamingError(Code.INVALID_ARGUMENT, "an empty deliver filter")

        def keep(clock: int, doc: dict[str, Any]) -> bool:
            if low_gt is not None and not clock > low_gt:
                return False
            if low_gte is not None and not clock >= low_gte:
                return False
            return not vchannels or doc.get("vchannel") in vchannels

        if anchor is None or not 0 < anchor.offset <= start:
            return start, keep, (0, 0, 0), None
        if anchor.states is not None:
            return start, keep, (anchor.offset, anchor.offset, anchor.tick), anchor
        begins = [anchor.offset, *anchor.open]
        return start, keep, (min(begins), anchor.offset, anchor.tick), None

    def Broadcast(self, request: pb.BroadcastRequest, context: Any) -> Any:
        from oncelog.message import JSONMessage
        from oncelog.publisher import Publisher

        try:
            names = list(dict.fromkeys(request.channels))
            if not names:
                raise StreamingError(Code.INVALID_ARGUMENT, "a broadcast needs channels")
            check_message_size(request.message, self.config.max_message_bytes,
                               "the broadcast message",
                               f"nothing was appended to channels {names}")
            channels = self._broadcast_channels(names)
            if not all(c.confirm() for c in channels):
                raise StreamingError(Code.CHANNEL_FENCED, "a channel was taken by another node")
            if request.message.uuid:
                # The client's producer and clocks: a resent broadcast repeats every UUID.
                try:
                    producer, clock, flags = parse_uuid_fields(request.message.uuid)
                except ValueError as exc:
                    raise StreamingError(Code.INVALID_ARGUMENT, str(exc)) from None
                if int(flags) != OUTSIDE_TXN or producer == _NIL_PRODUCER or clock == 0:
                    raise StreamingError(Code.INVALID_ARGUMENT, "a broadcast's UUID needs a "
                                         f"producer, a clock and flags 0: {request.message.uuid}")
                pub = Publisher(self.client, clock=Clock(clock - 1))
                pub.producer_id = producer
            else:
                pub = Publisher(self.client)
            appends: list[Any] = []
            key = id(appends)
            try:
                for c in channels:
                    # Open at the anchors taken meanwhile; after the idle tick's floor.
                    c.broadcasts[key] = c.ticks.anchor()[0]
                    if c.floor:
                        self.append_plain(c, b"")
                with pub.transaction():
                    for c in channels:
                        doc = orjson.loads(encode_message(request.message, ""))
                        appends.append(pub.publish_uncommitted(_to(c.name), JSONMessage(doc)))
                results = [a.result() for a in appends]
            finally:
                for c in channels:
                    c.broadcasts.pop(key, None)
            for c in channels:
                c.last_append = time.monotonic()
            return pb.BroadcastResponse(ids=[
                pb.MessageID(channel=c.name, begin=r.begin, end=r.end)
                for c, r in zip(channels, results)
            ])
        except StreamingError as exc:
            return pb.BroadcastResponse(error=_err(exc.code, exc.cause))
        except Exception as exc:  # noqa: BLE001
            self._store_error("broadcast")
            return pb.BroadcastResponse(error=_err(Code.INNER, f"{type(exc).__name__}: {exc}"))

    def _broadcast_channels(self, names: list[str]) -> list[_Channel]:
        """The channels of a broadcast, all owned by this node; else why not.

        A broadcast is one transaction of this node's (atomic through its ACKs), so it needs
        every channel here. Channels owned by *different* nodes are refused at once with
        INVALID_ARGUMENT naming each channel's owner, nothing appended (the caller splits
        the broadcast or moves the channels together: AssignChannel). Every other miss is
        transient or a wrong address and stays retriable: CHANNEL_NOT_EXIST naming the
        owner when one other node owns them all (the client goes there), or when an owner
        is being replaced (a released term, this node's previous incarnation)."""
        with self._lock:
            mine = {n: self._owned.get(n) for n in names}
        if all(c is not None and c.fenced is None for c in mine.values()):
            return [self._owned_channel(n, 0) for n in names]
        owners: dict[str, meta.TermRecord | None] = {}
        for n in names:
            c = mine[n]
            if c is not None and c.fenced is None:
                owners[n] = c.record
                continue
            if not self.client.exists(n):
                raise StreamingError(Code.CHANNEL_NOT_EXIST, f"channel {n!r} does not exist")
            owners[n] = meta.latest_term(self.client, n)
        nodes = {r.node_id for r in owners.values() if r is not None and r.node_id}
        settled = all(r is not None and r.node_id for r in owners.values())
        if len(nodes) > 1 and settled:
            listing = ", ".join(
                f"{n!r}: node {r.node_id} at {r.address} (term {r.term})"
                for n, r in owners.items() if r is not None)
            raise StreamingError(
                Code.INVALID_ARGUMENT,
                f"broadcast to channels {names} spans {len(nodes)} nodes ({listing}); a "
                "broadcast is atomic only across channels of one node: nothing was appended "
                "(assign the channels to one node, or broadcast to each node's channels)")
        return [self._owned_channel(n, 0) for n in names]  # raises CHANNEL_NOT_EXIST


# -- authentication and the server ----------------------------------------------------------


class _TokenCheck(grpc.ServerInterceptor):
    """Rejects every call without `authorization: Bearer <token>` with UNAUTHENTICATED,
    before any handler runs (so no data is read or written). `grpc.health.v1` is exempt:
    probes carry no token, and it tells nothing but whether the node serves."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        if str(details.method).startswith(_HEALTH_PREFIX):
            return continuation(details)
        got = ""
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                got = value if isinstance(value, str) else value.decode()
        if hmac.compare_digest(got.encode(), self._expected):
            return continuation(details)
        handler = continuation(details)
        if handler is None:
            return None

        def deny(request: Any, context: Any) -> Any:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(deny)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(deny)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(deny)
        return grpc.unary_unary_rpc_method_handler(deny)


def serve(
    client: JournalClient,
    listen: str,
    config: NodeConfig,
    *,
    tls_cert: bytes | None = None,
    tls_key: bytes | None = None,
    metrics: NodeMetrics | None = None,
) -> tuple[grpc.Server, StreamingNode, str]:
    """Start a node serving `client`'s store on `listen` (`host:port`, port 0: any free one).
    Returns the server, the node and the address actually bound.

    The server also serves `grpc.health.v1` (grpcio-health-checking): SERVING for "" and
    HEALTH_SERVICE once the node serves, NOT_SERVING from `StreamingNode.close()` on.
    `metrics`: count into these Prometheus metrics (see NodeMetrics)."""
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    interceptors = [_TokenCheck(config.token)] if config.token else []
    server = grpc.server(
        ThreadPoolExecutor(config.max_workers, thread_name_prefix="oncelog-grpc"),
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", config.max_request_bytes),
            ("grpc.max_send_message_length", max(config.max_request_bytes, 64 << 20)),
            ("grpc.so_reuseport", 0),
        ],
        maximum_concurrent_rpcs=config.max_workers,
    )
    if tls_cert is not None and tls_key is not None:
        creds = grpc.ssl_server_credentials([(tls_key, tls_cert)])
        port = server.add_secure_port(listen, creds)
    else:
        port = server.add_insecure_port(listen)
    if port == 0:
        raise OSError(f"could not bind {listen}")
    host = listen.rsplit(":", 1)[0]
    bound = f"{host}:{port}"
    if not config.address:
        config.address = bound
    if not config.node_id:
        config.node_id = meta.default_node_id(port)
    node = StreamingNode(client, config)
    node.metrics = metrics
    if metrics is not None:
        metrics.bind(node)
    node.health = health.HealthServicer()
    pb_grpc.add_StreamingNodeServiceServicer_to_server(node, server)
    health_pb2_grpc.add_HealthServicer_to_server(node.health, server)
    node.start()
    server.start()
    for service in ("", HEALTH_SERVICE):
        node.health.set(service, health_pb2.HealthCheckResponse.SERVING)
    return server, node, bound
