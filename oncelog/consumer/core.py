"""The exactly-once consumer: read committed, handle, checkpoint, acknowledge.

Each consumer transaction reads committed messages from the group's journals
and hands them to the handler, which publishes outputs *uncommitted* and
updates a JSON state. Its commit waits for the outputs, writes checkpoint N+1
(read offsets, producer states, the outputs' ACK intents, the state) only if
absent, checks that no checkpoint above N+1 exists (else N+1 was free only because
pruning removed it: this instance is a zombie), and only then appends the ACK
intents. Gazette's consumer semantics; docs/consumers.md explains why this is
exactly-once across crashes, zombies and pruning.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import timedelta
from itertools import islice
from typing import TYPE_CHECKING, Any, Literal

import orjson

from oncelog.consumer.checkpoint import (
    Checkpoint,
    CheckpointStore,
    ConsumerError,
    FencedOut,
    ensure_group,
    intents_journals,
    recoverable_intents,
    validate_group_name,
)
from oncelog.consumer.metrics import ConsumerMetrics
from oncelog.consumer.shards import shard_journals
from oncelog.consumer.sink import SinkWriter, SQLiteSink, SQLiteSinkEngine
from oncelog.consumer.state import (
    KV,
    SQLiteState,
    SQLiteStateEngine,
    StateObjectMissing,
    is_sqlite_ref,
)
from oncelog.labels import LabelSelector
from oncelog.message import ACK_TXN as _ACK_TXN
from oncelog.message import Envelope, Message
from oncelog.publisher import AckIntent, Mapping, Publisher, start_intents
from oncelog.reading import read_uncommitted, read_uncommitted_batches
from oncelog.sequencer import Sequencer

if TYPE_CHECKING:
    from oncelog.journal import AsyncAppend, JournalClient

__all__ = [
    "OPTIONAL_STAGES",
    "Consumer",
    "Transaction",
    "Handler",
    "BatchHandler",
    "Finalizer",
    "STAGES",
    "RECOVERY_ATTEMPTS",
]

log = logging.getLogger(__name__)

Handler = Callable[[Envelope, "Transaction"], None]
"""`handler(envelope, txn)`: consume one committed message; publish outputs with `txn.publish`."""
BatchHandler = Callable[[list[Envelope], "Transaction"], None]
"""`batch_handler(envelopes, txn)`: consume committed messages in bulk (all of one
transaction: a batch never straddles a commit); publish with `txn.publish` / `publish_many`."""
Finalizer = Callable[["Transaction"], None]
"""`finalize(txn)`: called once before each commit, e.g. to publish aggregates of `txn.state`."""

STAGES = (
    "recovered",  # recovery checkpoint claimed and its ACK intents re-appended
    "handler",  # about to call the handler (only when a stage hook is set)
    "finalized",  # the finalizer ran
    "flushed",  # the transaction's outputs are durable (still uncommitted)
    "checkpoint",  # about to write checkpoint N+1
    "checkpointed",  # checkpoint N+1 is claimed: the transaction is committed
    "acked",  # one ACK intent appended (once per intent)
    "committed",  # every ACK intent appended: the outputs are visible
)
"""The points at which a consumer calls its `on_stage` hook, in order (for tests and tracing)."""

OPTIONAL_STAGES = (
    "state",  # after "flushed": one state or sink object written (once per object)
    "sink",  # after the last "acked": the sink statements applied to the external store
)
"""Stages reached only with `state=SQLiteState()` or a `sink` (also passed to `on_stage`)."""

RECOVERY_ATTEMPTS = 8
"""How often recovery retries when other instances of the group keep committing meanwhile
(or when its checkpoint landed in a pruned hole because it was paused)."""


class Transaction:
    """One consumer transaction: its outputs, the group's state, and how far it has come."""

    __slots__ = (
        "_consumer", "state", "kv", "seq", "messages", "started", "deadline", "_closing",
        "_idle",
    )

    def __init__(self, consumer: Consumer, state: Any, seq: int, max_duration: float) -> None:
        self._consumer = consumer
        self.state = state
        """The group's JSON-serialisable state: mutate it, or assign a new one (None with
        `state=SQLiteState()`: use `kv`)."""
        engine = consumer._engine
        self.kv: KV | None = None if engine is None else engine.kv
        """With `state=SQLiteState()`: the group's key-value state (writes commit with
        this transaction, or are undone if it aborts); None with JSON state."""
        self.seq = seq
        """The checkpoint number this transaction commits as."""
        self.messages = 0
        """Messages handed to the handler so far."""
        self.started = time.monotonic()
        self.deadline = self.started + max_duration
        self._closing = False
        self._idle = False

    @property
    def group(self) -> str:
        """The consumer group this transaction commits for."""
        return self._consumer.group

    @property
    def sink(self) -> SinkWriter:
        """With `sink=SQLiteSink(...)`: record output statements, applied exactly once
        with this transaction's commit (oncelog.consumer.sink)."""
        engine = self._consumer._sink
        if engine is None:
            raise ConsumerError("this consumer has no sink: pass sink=SQLiteSink(path)")
        return engine.writer

    @property
    def shard(self) -> int | None:
        """This consumer's shard index, or None if the group is not sharded."""
        return self._consumer.shard

    def publish(self, mapping: Mapping, msg: Message) -> "AsyncAppend":
        """Publish an output, uncommitted: readers see it once this transaction commits."""
        return self._consumer._publish(mapping, msg)

    def publish_many(self, mapping: Mapping, msgs: Iterable[Message]) -> list["AsyncAppend"]:
        """Publish outputs in bulk, uncommitted (as `publish` for each, in order)."""
        return [self._consumer._publish(mapping, msg) for msg in msgs]

    def close(self) -> None:
        """Commit once the current committed input sequence is consumed (don't read more)."""
        self._closing = True

    def __repr__(self) -> str:
        return f"Transaction(group={self.group!r}, seq={self.seq}, messages={self.messages})"


class _Input:
    """One journal being read: where the next read starts, its open reader, and the
    decoded batch being fed to the Sequencer (`batch[pos:]` not yet fed)."""

    __slots__ = ("journal", "offset", "batches", "batch", "pos", "exhausted")

    def __init__(self, journal: str, offset: int) -> None:
        self.journal = journal
        self.offset = offset
        self.batches: Iterator[list[Envelope]] | None = None
        self.batch: list[Envelope] = []
        self.pos = 0
        self.exhausted = False

    def close(self) -> None:
        if self.batches is not None:
            self.batches.close()  # type: ignore[attr-defined]
            self.batches = None
        self.batch, self.pos = [], 0


def _seconds(value: float | timedelta, what: str) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not seconds > 0:
        raise ValueError(f"{what} must be positive, not {value!r}")
    return seconds


class Consumer:
    """An exactly-once consumer of a group's journals (a label selector or a list of names).

    `run()` consumes in transactions of at most `max_messages` messages and
    `max_duration` seconds, each committed by a checkpoint; several instances
    of one group may run, but only the latest to recover can commit (the others
    are `FencedOut`). With `shards=N`, `shard=i` consumes the journals that
    rendezvous hashing gives shard `i`, with its own checkpoints.

    Give `handler(envelope, txn)` or `batch_handler(envelopes, txn)` (lists of
    committed messages, never straddling a transaction). `state="json"` keeps
    `txn.state` in each checkpoint; `state=SQLiteState()` gives `txn.kv`, committed as
    deltas and snapshots written before the checkpoint that references them. With
    `split_upstream=True` a transaction may end inside a large upstream transaction.
    """

    def __init__(
        self,
        client: "JournalClient",
        group: str,
        journals: LabelSelector | str | Sequence[str],
        handler: Handler | None = None,
        *,
        batch_handler: BatchHandler | None = None,
        finalize: Finalizer | None = None,
        initial_state: Any = None,
        shards: int = 1,
        shard: int = 0,
        max_messages: int = 10_000,
        max_duration: float | timedelta = 1.0,
        start: Literal["beginning", "head"] = "beginning",
        new_message: Callable[[Any], Any] | None = None,
        poll_interval: float | timedelta = 0.2,
        refresh_interval: float | timedelta = 10.0,
        prune_horizon: timedelta | float = 0,
        keep_checkpoints: int | None = 10,
        buffer: int = 1024,
        read_batch: int = 1000,
        on_stage: Callable[[str], None] | None = None,
        state: Literal["json"] | SQLiteState = "json",
        split_upstream: bool = False,
        metrics: ConsumerMetrics | None = None,
        sink: SQLiteSink | None = None,
    ) -> None:
        self.client = client
        self.group = validate_group_name(group)
        if isinstance(journals, (str, LabelSelector)):
            self._selector: LabelSelector | None = LabelSelector.from_value(journals)
            self._names: list[str] = []
        else:
            self._selector = None
            self._names = list(dict.fromkeys(journals))
            if not all(isinstance(j, str) for j in self._names):
                raise TypeError(
                    f"journals must be a label selector or a list of names: {journals!r}"
                )
        if (handler is None) == (batch_handler is None):
            raise TypeError("give exactly one of handler= and batch_handler=")
        if not callable(handler if batch_handler is None else batch_handler):
            raise TypeError(f"handler must be callable, not {handler or batch_handler!r}")
        if start not in ("beginning", "head"):
            raise ValueError(f"start must be 'beginning' or 'head', not {start!r}")
        if not isinstance(max_messages, int) or max_messages < 1:
            raise ValueError(f"max_messages must be an int >= 1, not {max_messages!r}")
        if keep_checkpoints is not None and (
            not isinstance(keep_checkpoints, int) or keep_checkpoints < 1
        ):
            raise ValueError(
                f"keep_checkpoints must be None or an int >= 1, not {keep_checkpoints!r}"
            )
        if not isinstance(read_batch, int) or read_batch < 1:
            raise ValueError(f"read_batch must be an int >= 1, not {read_batch!r}")
        if not isinstance(shards, int) or shards < 1:
            raise ValueError(f"shards must be an int >= 1, not {shards!r}")
        if not isinstance(shard, int) or not 0 <= shard < shards:
            raise ValueError(f"shard must be an int in [0, {shards}), not {shard!r}")
        horizon = (
            prune_horizon.total_seconds() if isinstance(prune_horizon, timedelta) else prune_horizon
        )
        if isinstance(horizon, bool) or not isinstance(horizon, (int, float)) or not horizon >= 0:
            raise ValueError(
                f"prune_horizon must be a timedelta or seconds >= 0, not {prune_horizon!r}"
            )
        self.shards = shards
        self.shard: int | None = None if shards == 1 else shard
        self._store = CheckpointStore(client, group, self.shard, shards)
        if state == "json":
            self._engine: SQLiteStateEngine | None = None
        elif isinstance(state, SQLiteState):
            if initial_state is not None:
                raise ValueError("initial_state is for JSON state: SQLite state starts empty")
            self._engine = state.open(client, self._store.directory)
        else:
            raise ValueError(f"state must be 'json' or a SQLiteState, not {state!r}")
        if sink is not None and not isinstance(sink, SQLiteSink):
            raise TypeError(f"sink must be a SQLiteSink, not {sink!r}")
        self._sink: SQLiteSinkEngine | None = (
            None if sink is None else sink.open(client, self._store.directory, group, self.shard)
        )
        self._handler = handler
        self._batch_handler = batch_handler
        self.split_upstream = bool(split_upstream)
        """If True, a transaction ends at `max_messages` (or `max_duration`) even inside a
        large upstream transaction: its checkpoint counts the last message handled as
        processed (`Sequencer.checkpoint(dequeued_processed=True)`), and the next
        transaction (or a recovery, by replaying the upstream transaction from its start)
        carries on after it."""
        self._finalize = finalize
        self._initial_state = initial_state
        self.max_messages = max_messages
        self.max_duration = _seconds(max_duration, "max_duration")
        self.start = start
        self._new_message = new_message
        self.poll_interval = _seconds(poll_interval, "poll_interval")
        self.refresh_interval = _seconds(refresh_interval, "refresh_interval")
        self.prune_horizon = prune_horizon
        self.keep_checkpoints = keep_checkpoints
        self._buffer = buffer
        self._read_batch = read_batch
        self._on_stage = on_stage
        self._metrics = metrics
        self._labels = ConsumerMetrics.labels(self.group, self.shard)

        # Set by recover(); _seq is None whenever the consumer must recover before reading.
        self._seq: Sequencer | None = None
        self._publisher: Publisher | None = None
        self._checkpoint: Checkpoint | None = None
        self._state: Any = None
        self._positions: dict[str, int] = {}
        self._inputs: dict[str, _Input] = {}
        self._dirty = False
        self._job: _CommitJob | None = None  # the commit in flight
        self._txn: Transaction | None = None  # the open transaction (read by _feed)
        # With split_upstream: the sequencing iterator suspended mid upstream transaction,
        # resumed by the next transaction (None when the Sequencer is between sequences).
        self._carry: Iterator[Envelope] | None = None
        self._gate: _CommitJob | None = None  # ... until its ACKs are started
        self._last_refresh = 0.0
        self._fenced: str | None = None
        self._stopping = False
        self._stop_event = threading.Event()

    # ------------------------------------------------------------------ queries

    def __repr__(self) -> str:
        where = "" if self.shard is None else f", shard={self.shard}/{self.shards}"
        return f"Consumer({self.client!r}, group={self.group!r}{where})"

    @property
    def fenced(self) -> bool:
        """True once another instance of the group has committed over this one."""
        return self._fenced is not None

    @property
    def checkpoint_seq(self) -> int:
        """The number of the last checkpoint this instance wrote (0 before recovery)."""
        return 0 if self._checkpoint is None else self._checkpoint.seq

    @property
    def state(self) -> Any:
        """The group's state as the handler left it (committed at the next checkpoint)."""
        return self._state

    @property
    def kv(self) -> KV | None:
        """With `state=SQLiteState()`, the group's key-value state; else None."""
        return None if self._engine is None else self._engine.kv

    @property
    def producer_id(self) -> bytes | None:
        """The producer ID of this instance's outputs (a new one at each recovery)."""
        return None if self._publisher is None else self._publisher.producer_id

    @property
    def journals(self) -> list[str]:
        """The journals this consumer currently reads."""
        return list(self._inputs)

    @property
    def positions(self) -> dict[str, int]:
        """Per journal, the offset up to which messages have been read."""
        out = dict(self._positions)
        if self._seq is not None:
            out.update(self._seq.offsets)
        return out

    # ----------------------------------------------------------------- recovery

    def recover(self) -> int:
        """Take over the group: write a recovery checkpoint over the latest one (fencing
        out older instances), re-append its ACK intents, and load its offsets, producer
        states and state. Returns the new checkpoint's number. `run()` calls it as needed.

        Order, per attempt: read the latest checkpoint N (one LIST, one GET); check all
        of it (`recoverable_intents`: a corrupt N raises CheckpointError with nothing
        written or appended); claim N+1 (`CheckpointStore.claim`). If N+1 was taken, or
        was written but something is above it (this instance paused after reading N
        while others committed and pruned N+1), N+1 is not acted on and the attempt is
        repeated from the real latest, up to RECOVERY_ATTEMPTS times (then FencedOut).
        Only a claimed N+1's ACK intents (N's, carried over) are re-appended. A storage
        error (StorageUnavailable: the write's outcome unknown) propagates with nothing
        appended; the next recovery settles it either way.
        """
        self._check_not_fenced()
        self._close_inputs()
        self._seq = None
        ensure_group(self.client, self.group, self.shards)
        journals = self._discover()
        refused: list[str] = []
        for _ in range(RECOVERY_ATTEMPTS):
            latest, floor = self._store.latest_and_floor()
            if latest is None:
                # Nothing yet, or a deleted group's tombstone: start from scratch above it.
                base = Checkpoint(self.group, floor, shard=self.shard, shards=self.shards)
                intents: list[AckIntent] = []
            else:
                base = latest
                intents = recoverable_intents(self.client, latest, self._store.path(latest.seq))
            sink_data = None
            if self._sink is not None:
                # The statements recovery re-applies, read (and checked) before the claim.
                sink_data = self._sink.load(base.sink, self._store.path(base.seq))
            if self._engine is not None:
                # Rebuild the local database before anything is written (a corrupt reference
                # raises with nothing written); an object pruned since `latest` was read
                # means a newer checkpoint exists: retry from it.
                ref = base.state if base.has_state else None
                try:
                    self._engine.load(ref, self._store.path(base.seq))
                except StateObjectMissing as exc:
                    above = self._store.superseded(base.seq)
                    if above is None:
                        raise
                    refused.append(f"{exc}; {above}")
                    continue
            publisher = Publisher(self.client)
            offsets = dict(base.offsets)
            for journal in journals:
                if journal not in offsets:
                    offsets[journal] = self._start_offset(journal)
            if self._engine is not None:
                state = self._engine.ref if base.has_state else None
                has_state = state is not None
            else:
                if base.has_state and is_sqlite_ref(base.state):
                    raise ConsumerError(
                        f"{self!r}: checkpoint {self._store.path(base.seq)} holds SQLite state:"
                        " run this group with state=SQLiteState() (or reset it)"
                    )
                state = base.state if base.has_state else self._initial_state
                has_state = True
            state_json = self._encode_state(state)
            cp = base.successor(
                offsets=offsets,
                ack_intents=intents,
                state=state,
                has_state=has_state,
                reason="recover",
                writer=publisher.producer_id,
            )
            why = self._store.claim(cp, cp.to_json(state_json))
            if why is None:
                break
            refused.append(why)
            log.info("%r: recovery not claimed: %s; retrying from the latest", self, why)
        else:
            raise FencedOut(
                f"{self!r} could not take over: other instances of the group committed"
                f" {RECOVERY_ATTEMPTS} times while it recovered (last: {refused[-1]})"
            )
        if cp.ack_intents:
            log.info(
                "%r: re-appending the ACK intents of checkpoint %d to %s",
                self, cp.seq - 1, intents_journals(cp.ack_intents),
            )
        self._append_intents(cp.ack_intents)
        if self._sink is not None:
            self._sink.rollback()
            if sink_data is not None:
                # The latest commit's statements, unless the database has them (fenced).
                self._sink.apply(sink_data, self._store.path(cp.seq - 1))
        # A fresh copy, typed as any later recovery would see it (tuples become lists...).
        self._state = None if self._engine is not None else orjson.loads(state_json)
        self._seq = Sequencer(cp.offsets, cp.producers, self._buffer)
        self._positions = dict(cp.offsets)
        self._inputs = {j: _Input(j, offsets[j]) for j in journals}
        self._publisher = publisher
        self._checkpoint = cp
        self._dirty = False
        self._last_refresh = time.monotonic()
        if self._metrics is not None:
            self._metrics.recovered(self._labels, cp.seq)
        self._stage("recovered")
        return cp.seq

    def _discover(self) -> list[str]:
        if self._selector is None:
            names = list(self._names)
        else:
            names = [spec.name for spec in self.client.list(self._selector)]
        if self.shard is not None:
            names = shard_journals(names, self.shard, self.shards)
        return names

    def _start_offset(self, journal: str) -> int:
        return 0 if self.start == "beginning" else self.client.head(journal)

    def _encode_state(self, state: Any) -> bytes:
        try:
            return orjson.dumps(state)
        except TypeError as exc:
            raise ConsumerError(
                f"{self!r}: the state is not JSON-serialisable ({exc}): {_preview(state)}"
            ) from exc

    def _refresh_journals(self) -> None:
        """Pick up journals newly matching the selector (and drop ones that stopped matching)."""
        self._last_refresh = time.monotonic()
        journals = self._discover()
        wanted = set(journals)
        for journal in [j for j in self._inputs if j not in wanted]:
            self._inputs.pop(journal).close()
        for journal in journals:
            if journal not in self._inputs:
                offset = self.positions.get(journal)
                if offset is None:
                    offset = self._positions[journal] = self._start_offset(journal)
                    self._dirty = True
                self._inputs[journal] = _Input(journal, offset)

    # ------------------------------------------------------------------ running

    def run(self, *, until_idle: bool = False, max_transactions: int | None = None) -> int:
        """Consume in transactions until `stop()` (or, with `until_idle`, until the journals
        are drained, or after `max_transactions` commits); returns the commits made.

        On return every commit is complete (outputs visible). A handler or storage error
        aborts the open transaction (its outputs are never committed) and is raised;
        calling `run()` again recovers from the last checkpoint. Losing a checkpoint race
        raises FencedOut, for good.
        """
        self._check_not_fenced()
        committed = 0
        try:
            while not self._stopping:
                if self._seq is None:
                    self.recover()
                txn = self._begin()
                try:
                    if self._batch_handler is not None:
                        self._fill_batches(txn)
                    else:
                        self._fill(txn)
                except BaseException:
                    self._state = txn.state
                    self._abort(rollback=True)
                    raise
                self._state = txn.state
                publisher = self._publisher
                assert publisher is not None
                if txn.messages or self._dirty or publisher.pending_journals():
                    self._commit(txn)
                    committed += 1
                if max_transactions is not None and committed >= max_transactions:
                    break
                if txn._idle:
                    self._await_commit()
                    if until_idle:
                        break
                    self._stop_event.wait(self.poll_interval)
            self._await_commit()
        finally:
            self._stopping = False
            self._stop_event.clear()
        return committed

    def stop(self) -> None:
        """Ask `run()` (in another thread) to commit the open transaction and return."""
        self._stopping = True
        self._stop_event.set()

    def _begin(self) -> Transaction:
        if self._selector is not None and self._carry is None and (
            time.monotonic() - self._last_refresh >= self.refresh_interval
        ):
            self._refresh_journals()  # (not while a carried iterator holds the inputs)
        for inp in self._inputs.values():
            inp.exhausted = False  # look for new data at the head again
        txn = Transaction(self, self._state, self.checkpoint_seq + 1, self.max_duration)
        self._txn = txn
        return txn

    def _fill(self, txn: Transaction) -> None:
        """Read and handle committed messages until the transaction is full or input is idle."""
        handler = self._handler
        assert handler is not None
        if self._on_stage is not None:
            user_handler, stage = handler, self._on_stage

            def handler(env: Envelope, txn: Transaction) -> None:
                stage("handler")
                user_handler(env, txn)

        max_messages = self.max_messages
        deadline = txn.deadline
        clock = time.monotonic
        seq = self._seq
        assert seq is not None
        split = self.split_upstream
        it, self._carry = self._carry, None
        if it is None:
            it = seq.sequence(self._feed(txn), self._replay)
        for env in it:
            if (env._ids or env.ids)[2] == _ACK_TXN:  # parsed already by the Sequencer
                continue  # acknowledgements commit others; they are not delivered
            handler(env, txn)
            txn.messages += 1
            if txn.messages >= max_messages or clock() >= deadline:
                txn._closing = True
                if split:
                    # End here, even mid upstream transaction: `env` is dequeued, and the
                    # checkpoint counts it as processed; the next transaction resumes `it`.
                    self._carry = it
                    return

    def _fill_batches(self, txn: Transaction) -> None:
        """`_fill` for a batch handler: round robin over the inputs, each time sequencing up
        to `read_batch` read-uncommitted envelopes of one input at once (`Sequencer.committed`,
        the reader's fast path) and handing the committed ones, if any, to the handler.

        Invariant: after each `committed()` call every envelope of the slice has been
        queued and every sequence it committed fully stepped, so the Sequencer is between
        sequences and a checkpoint may be taken; a batch is therefore never split across
        two transactions. A slice holds at most `max_messages - txn.messages` envelopes
        (committed outputs can still exceed it when an ACK commits messages read earlier:
        `max_messages` is a bound on reading, as in the per-message mode).
        """
        handler = self._batch_handler
        assert handler is not None
        stage = self._on_stage
        seq = self._seq
        assert seq is not None
        inputs = list(self._inputs.values())
        limit = self._read_batch
        max_messages = self.max_messages
        clock = time.monotonic
        replay = self._replay
        split = self.split_upstream

        def handle(it: Iterator[Envelope]) -> bool:
            """Hand `it`'s committed envelopes over; with split_upstream, at most what
            fills the transaction, keeping `it` (suspended) for the next. True if full."""
            if split:
                room = max(max_messages - txn.messages, 1)
                envelopes = list(islice(it, room))
                if len(envelopes) == room:
                    self._carry = it  # maybe more: the Sequencer may be mid-sequence
            else:
                envelopes = list(it)
            if envelopes:
                if stage is not None:
                    stage("handler")
                handler(envelopes, txn)
                txn.messages += len(envelopes)
                if txn.messages >= max_messages:
                    txn._closing = True
            return txn._closing

        carry, self._carry = self._carry, None
        if carry is not None and handle(carry):
            return
        while True:
            progressed = False
            for inp in inputs:
                if txn._closing or self._stopping or (progressed and clock() >= txn.deadline):
                    txn._closing = True
                    return
                if inp.exhausted:
                    continue
                batch, pos = inp.batch, inp.pos
                if pos == len(batch):
                    if inp.batches is None:
                        inp.batches = read_uncommitted_batches(
                            self.client, inp.journal, inp.offset, new_message=self._new_message,
                        )
                    batch, pos = next(inp.batches, None), 0  # type: ignore[arg-type]
                    if batch is None:
                        inp.batches, inp.batch, inp.pos = None, [], 0
                        inp.exhausted = True
                        continue
                n = min(limit, len(batch) - pos, max(max_messages - txn.messages, 1))
                part = batch if pos == 0 and n == len(batch) else batch[pos : pos + n]
                inp.batch, inp.pos = batch, pos + n
                inp.offset = part[-1].end
                progressed = True
                if handle(seq.sequence(part, replay, acks=False)) and self._carry is not None:
                    return
            if not progressed:
                txn._idle = True
                return

    def _feed(self, txn: Transaction) -> Iterator[Envelope]:
        """Read-uncommitted envelopes, round robin over the inputs, `read_batch` at a time.

        It stops, without reading ahead, as soon as the transaction is closing: the
        Sequencer asks for an envelope only once its committed sequence is consumed,
        so the transaction then ends with the Sequencer between sequences.
        """
        inputs = list(self._inputs.values())
        limit = self._read_batch
        deadline = txn.deadline
        clock = time.monotonic
        while True:
            progressed = False
            for inp in inputs:
                if inp.exhausted:
                    continue
                if self._txn is not txn:  # carried over into a new transaction
                    txn = self._txn  # type: ignore[assignment]
                    deadline = txn.deadline
                n = 0
                batch, pos = inp.batch, inp.pos
                try:
                    while n < limit:
                        # The deadline is checked every 64 envelopes read (and after each
                        # message handled): a transaction always makes some progress.
                        if txn._closing or self._stopping or (
                            n and not n & 63 and clock() >= deadline
                        ):
                            txn._closing = True
                            return
                        if pos == len(batch):
                            if inp.batches is None:
                                inp.batches = read_uncommitted_batches(
                                    self.client, inp.journal, inp.offset,
                                    new_message=self._new_message,
                                )
                            batch, pos = next(inp.batches, None), 0  # type: ignore[arg-type]
                            if batch is None:
                                inp.batches, batch = None, []
                                inp.exhausted = True
                                break
                        env = batch[pos]
                        pos += 1
                        inp.offset = env.end
                        n += 1
                        yield env
                        if self._txn is not txn:  # resumed by the next transaction
                            txn = self._txn  # type: ignore[assignment]
                            deadline = txn.deadline
                finally:
                    inp.batch, inp.pos = batch, pos
                if n:
                    progressed = True
            if not progressed:
                txn._idle = True
                return

    def _replay(self, journal: str, begin: int, end: int) -> Iterable[Envelope]:
        return read_uncommitted(self.client, journal, begin, end=end, new_message=self._new_message)

    def _publish(self, mapping: Mapping, msg: Message) -> "AsyncAppend":
        if self._gate is not None:
            # The previous commit's ACKs must reach each journal before this transaction's
            # outputs: an ACK drops the pending messages with larger clocks before it.
            self._gate.wait_acks_started()
            self._gate = None
        publisher = self._publisher
        if publisher is None:
            self._check_not_fenced()
            raise ConsumerError(f"{self!r}: the transaction was aborted; run() again to recover")
        return publisher.publish_uncommitted(mapping, msg)

    # ------------------------------------------------------------------ commits

    def _commit(self, txn: Transaction) -> None:
        """Close `txn` and start its commit, which completes in the background while the
        next transaction reads (Gazette's pipelined commits)."""
        publisher = self._publisher
        seq = self._seq
        assert publisher is not None and seq is not None and self._checkpoint is not None
        try:
            if self._finalize is not None:
                self._finalize(txn)
            self._state = txn.state
            self._stage("finalized")
            objects: list[tuple[str, bytes]] = []
            sink_ref, sink_data = None, None
            if self._sink is not None:
                sink_ref, sink_data, sink_rel = self._sink.prepare(self._checkpoint.seq + 1)
                if sink_data is not None and sink_rel is not None:
                    objects.append((sink_rel, sink_data))
            if self._engine is not None:
                # Committed locally now; the objects are written before the claim.
                state, state_objects = self._engine.prepare(self._checkpoint.seq + 1)
                objects.extend(state_objects)
                state_json = self._encode_state(state)
            else:
                state = self._state
                state_json = self._encode_state(state)
            self._await_commit()  # the previous one: its seq must be taken first
        except BaseException:
            self._abort(rollback=True)
            raise
        intents = publisher.build_ack_intents()
        # Mid upstream transaction (split_upstream), the last message handled counts as
        # processed: a resumed Sequencer replays the rest of that transaction after it.
        offsets, states = seq.checkpoint(
            self.prune_horizon, dequeued_processed=self._carry is not None
        )
        positions = {**self._positions, **offsets}
        cp = self._checkpoint.successor(
            offsets=positions,
            producers=states,
            ack_intents=intents,
            state=state,
            has_state=True,
            reason="commit",
            writer=publisher.producer_id,
            ack_producer=publisher.producer_id,
            sink=sink_ref,
        )
        self._checkpoint = cp
        self._positions = positions
        self._dirty = False
        job = _CommitJob(self, publisher, cp, cp.to_json(state_json), intents, objects)
        job.messages = txn.messages
        job.sink_data = sink_data
        self._job = self._gate = job
        job.start()

    def _finish_commit(self, job: _CommitJob) -> None:
        """The commit's I/O: outputs durable, then claim checkpoint N+1 (written only if
        absent, and nothing above it), then ACKs.

        An unclaimed N+1 fences this instance out for good and its ACK intents are never
        appended, whether N+1 was taken or was written into a hole left by pruning (a
        zombie resuming after others committed past N+1). A storage error while claiming
        (StorageUnavailable after the retries: N+1 may or may not exist, may or may not be
        the newest) is raised as is: the consumer aborts without rollback and appends
        nothing, and the next recovery settles it (N+1 is then the latest, whose intents
        it re-appends, or it is not, and they never are)."""
        job.publisher.flush()
        self._stage("flushed")
        for rel, data in job.objects:
            # State objects (named by this seq and a fresh token) before the claim: only a
            # claimed checkpoint references them. Unreferenced, they are harmless garbage.
            if not self.client.put_if_absent(rel, data):
                raise ConsumerError(f"{self!r}: state object {rel} exists already")
            self._stage("state")
        self._stage("checkpoint")
        # From here on nothing may be rolled back: checkpoint N+1 may exist even if writing
        # it raised, and a rollback ACK would then discard outputs it commits.
        path = self._store.path(job.checkpoint.seq)
        try:
            why = self._store.claim(job.checkpoint, job.data)
        except Exception as exc:
            log.warning(
                "%r: claiming checkpoint %s failed (%s: %s); its outcome is unknown: nothing"
                " is acknowledged, and the next recovery settles it",
                self, path, type(exc).__name__, exc,
            )
            raise
        if why is not None:
            self._fenced = (
                f"{self!r} is fenced out: {why}; this instance publishes nothing more (its"
                " uncommitted outputs are never acknowledged)"
            )
            log.info("%s", self._fenced)
            if self._metrics is not None:
                self._metrics.fenced_out(self._labels)
            raise FencedOut(self._fenced)
        if self._metrics is not None:
            written = len(job.data) + sum(len(data) for _, data in job.objects)
            self._metrics.committed(self._labels, job.checkpoint.seq, job.messages, written)
        self._stage("checkpointed")
        # Started before the next transaction publishes anything (appends to a journal keep
        # their start order), so each ACK lands ahead of that transaction's outputs.
        appends = self._start_intents(job.intents)
        job.acks_started.set()
        for append in appends:
            append.result()
            self._stage("acked")
        if job.sink_data is not None and self._sink is not None:
            self._sink.apply(job.sink_data, self._store.path(job.checkpoint.seq))
            self._stage("sink")
        if self._metrics is not None:
            self._metrics.acked(self._labels, time.monotonic() - job.closed)
        self._stage("committed")
        keep = self.keep_checkpoints
        if keep is not None and job.checkpoint.seq % keep == 0:
            try:
                self._store.prune(keep)
            except Exception as exc:  # only housekeeping: the next prune catches up
                log.warning("%r: pruning old checkpoints failed: %s", self, exc)

    def _await_commit(self) -> None:
        """Wait for the commit in flight, if any; raise its error (aborting the consumer)."""
        job = self._job
        if job is None:
            return
        job.thread.join()
        self._job = None
        if job.error is not None:
            self._abort(rollback=False)  # recovery re-appends what was checkpointed
            raise job.error

    def _append_intents(self, intents: Sequence[AckIntent]) -> None:
        """Append ACK intents (concurrently across journals) and wait until all are durable."""
        for append in self._start_intents(intents):
            append.result()
            self._stage("acked")

    def _start_intents(self, intents: Sequence[AckIntent]) -> list["AsyncAppend"]:
        return [a for a in start_intents(self.client, intents) if a is not None]

    def _abort(self, *, rollback: bool) -> None:
        """Drop the open transaction; `run()` recovers from the last checkpoint next time."""
        job, self._job, self._gate = self._job, None, None
        if job is not None:
            job.thread.join()  # never recover while our own commit may still write
            if job.error is not None and not isinstance(job.error, FencedOut):
                log.warning("%r: commit of checkpoint %d failed: %s", self, job.checkpoint.seq,
                            job.error)
        publisher = self._publisher
        self._close_inputs()
        self._seq = None
        self._publisher = None
        if self._engine is not None:
            self._engine.rollback()  # the open transaction's writes; recovery reloads
        if self._sink is not None:
            self._sink.rollback()
        if (
            rollback
            and self._fenced is None
            and publisher is not None
            and publisher.pending_journals()
        ):
            # Not needed for correctness (the next recovery uses a new producer ID, so
            # these outputs are never acknowledged), but it lets readers drop them now.
            # Only this transaction's outputs are pending: the last commit's were taken
            # by build_ack_intents, and these exist only if that commit's ACKs went out.
            try:
                publisher.rollback()
            except Exception as exc:
                log.warning("%r: rolling back aborted outputs failed: %s", self, exc)

    def _close_inputs(self) -> None:
        carry, self._carry = self._carry, None
        if carry is not None and hasattr(carry, "close"):
            carry.close()  # type: ignore[attr-defined]
        for inp in self._inputs.values():
            inp.close()

    def _check_not_fenced(self) -> None:
        if self._fenced is not None:
            raise FencedOut(self._fenced)

    def _stage(self, name: str) -> None:
        if self._on_stage is not None:
            self._on_stage(name)

    def close(self) -> None:
        """Wait for a commit in flight, then close the readers (an open, uncommitted
        transaction is abandoned: its outputs are never acknowledged)."""
        try:
            self._await_commit()
        finally:
            self._close_inputs()
            self._seq = None
            self._publisher = None
            if self._sink is not None:
                self._sink.close()  # (reopened by the next recovery if run() again)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _CommitJob:
    """A commit completing on its own thread: outputs durable → checkpoint → ACK intents."""

    __slots__ = (
        "publisher", "checkpoint", "data", "intents", "objects", "messages", "closed", "sink_data",
        "acks_started", "error",
        "thread",
    )

    def __init__(
        self,
        consumer: Consumer,
        publisher: Publisher,
        checkpoint: Checkpoint,
        data: bytes,
        intents: list[AckIntent],
        objects: list[tuple[str, bytes]],
    ) -> None:
        self.publisher = publisher
        self.objects = objects
        self.messages = 0
        self.closed = time.monotonic()
        self.sink_data: bytes | None = None
        self.checkpoint = checkpoint
        self.data = data
        self.intents = intents
        self.acks_started = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(
            target=self._run, args=(consumer,), name=f"oncelog-commit:{checkpoint.group}",
            daemon=True,
        )

    def start(self) -> None:
        self.thread.start()

    def _run(self, consumer: Consumer) -> None:
        try:
            consumer._finish_commit(self)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer's thread
            self.error = exc
        finally:
            self.acks_started.set()

    def wait_acks_started(self) -> None:
        """Block until the ACKs are on their way; raise the commit's error if it failed."""
        self.acks_started.wait()
        if self.error is not None:
            raise self.error


def _preview(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
