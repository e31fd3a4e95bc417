"""The exactly-once consumer: read committed, handle, checkpoint, acknowledge.

Each consumer transaction reads committed messages from the group's journals
and hands them to the handler, which publishes outputs *uncommitted* and
updates a JSON state. Its commit waits for the outputs, writes checkpoint N+1
(read offsets, producer states, the outputs' ACK intents, the state) only if
absent, checks that no checkpoint above N+1 exists (else N+1 was free only because
pruning removed it: this instance is a zombie), and only then appends the ACK
intents. Gazette's consumer semantics; docs/consumers.md explains why this is
exactly-once across crashes, zombies and pruning.

A `Consumer` is three parts, one module each: its options (`_options`), input reading
(`_input`) and the commit pipeline (`_commit`); this module holds the public names,
recovery and the `run()` loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

import orjson

from oncelog.consumer._commit import CommitPipeline
from oncelog.consumer._input import InputReading, _Input
from oncelog.consumer._options import consumer_options
from oncelog.consumer._trimmed import (
    CheckpointTrimmed,
    find_trimmed,
    first_available_offset,
    skip_trimmed,
)
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
from oncelog.consumer.sink import SinkWriter, SQLiteSink
from oncelog.consumer.state import (
    KV,
    SQLiteState,
    StateObjectMissing,
    is_sqlite_ref,
)
from oncelog.journal.errors import OffsetNotAvailable
from oncelog.labels import LabelSelector
from oncelog.message import Envelope, Message
from oncelog.publisher import AckIntent, Mapping, Publisher
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
    "state",  # before "flushed": one state or sink object written (once per object)
    "sink",  # after the last "acked": the sink statements applied to the external store
    "snapshot",  # a SQLite state snapshot written in the background is durable
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


class Consumer(InputReading, CommitPipeline):
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
    With `lazy=True` JSON-lines inputs arrive as `JSONLine`s, parsed only when a handler
    uses `env.message.doc` (handlers reading `.doc` work unchanged; forwarding `.line`
    costs no parse).

    `on_trimmed`: what recovery does when the checkpoint needs bytes that retention or
    `JournalClient.trim` deleted (its read offset, or the start of a producer's pending
    transaction, is below a journal's first available offset). "error" (the default)
    raises `CheckpointTrimmed` naming the group, journal and offsets, writing nothing;
    "skip" goes on from the first available offset and logs a warning saying what was
    skipped (journal, offsets, bytes, transactions left incomplete). A trim while `run()`
    reads makes it recover once, which applies the same policy.
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
        buffer: int | None = None,
        read_batch: int = 1000,
        on_stage: Callable[[str], None] | None = None,
        state: Literal["json"] | SQLiteState = "json",
        split_upstream: bool = False,
        metrics: ConsumerMetrics | None = None,
        sink: SQLiteSink | None = None,
        lazy: bool = False,
        on_trimmed: Literal["error", "skip"] = "error",
    ) -> None:
        self.client = client
        self.group = validate_group_name(group)
        self._options = options = consumer_options(
            journals, handler, batch_handler, shards=shards, shard=shard,
            max_messages=max_messages, max_duration=max_duration, start=start,
            poll_interval=poll_interval, refresh_interval=refresh_interval,
            prune_horizon=prune_horizon, keep_checkpoints=keep_checkpoints, buffer=buffer,
            read_batch=read_batch, split_upstream=split_upstream, on_trimmed=on_trimmed,
        )
        self._selector: LabelSelector | None = options.selector
        self._names = options.names
        self.shards = shards
        self.shard: int | None = options.shard
        self._store = CheckpointStore(client, group, self.shard, shards)
        if state == "json":
            self._engine = None
        elif isinstance(state, SQLiteState):
            if initial_state is not None:
                raise ValueError("initial_state is for JSON state: SQLite state starts empty")
            self._engine = state.open(client, self._store.directory)
        else:
            raise ValueError(f"state must be 'json' or a SQLiteState, not {state!r}")
        if sink is not None and not isinstance(sink, SQLiteSink):
            raise TypeError(f"sink must be a SQLiteSink, not {sink!r}")
        self._sink = (
            None if sink is None else sink.open(client, self._store.directory, group, self.shard)
        )
        self._handler = handler
        self._batch_handler = batch_handler
        self._finalize = finalize
        self._initial_state = initial_state
        if lazy and new_message is not None:
            raise ValueError("lazy=True reads JSONLine messages: it cannot take new_message")
        self._new_message = new_message
        self._lazy = bool(lazy)
        self._on_stage = on_stage
        self._metrics = metrics
        self._labels = ConsumerMetrics.labels(self.group, self.shard)

        # Set by recover(); _seq is None whenever the consumer must recover before reading.
        self._seq = None
        self._publisher = None
        self._checkpoint = None
        self._state = None
        self._positions = {}
        self._inputs = {}
        self._dirty = False
        self._txn = None  # the open transaction (read by _feed)
        self._carry = None
        self._init_pipeline()
        self._last_refresh = 0.0
        self._fenced = None
        self._stopping = False
        self._stop_event = threading.Event()

    # ------------------------------------------------------------------ options

    @property
    def max_messages(self) -> int:
        """At most this many messages are read per transaction."""
        return self._options.max_messages

    @property
    def max_duration(self) -> float:
        """A transaction closes after this many seconds (of the consumer's clock)."""
        return self._options.max_duration

    @property
    def start(self) -> Literal["beginning", "head"]:
        """Where a journal new to the group is read from."""
        return self._options.start

    @property
    def poll_interval(self) -> float:
        """Seconds between looks for new messages once the journals are drained."""
        return self._options.poll_interval

    @property
    def refresh_interval(self) -> float:
        """Seconds between looks for journals newly matching the selector."""
        return self._options.refresh_interval

    @property
    def prune_horizon(self) -> timedelta | float:
        """How long the Sequencer keeps an idle producer's state."""
        return self._options.prune_horizon

    @property
    def keep_checkpoints(self) -> int | None:
        """How many checkpoints pruning keeps (None: all)."""
        return self._options.keep_checkpoints

    @property
    def on_trimmed(self) -> Literal["error", "skip"]:
        """What recovery does with a checkpoint older than a journal's first available
        offset: "error" (CheckpointTrimmed) or "skip" (go on from it, logging a warning)."""
        return self._options.on_trimmed

    @property
    def split_upstream(self) -> bool:
        """If True, a transaction ends at `max_messages` (or `max_duration`) even inside a
        large upstream transaction: its checkpoint counts the last message handled as
        processed (`Sequencer.checkpoint(dequeued_processed=True)`), and the next
        transaction (or a recovery, by replaying the upstream transaction from its start)
        carries on after it."""
        return self._options.split_upstream

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
            # Bytes the checkpoint still needs that a trim (or retention) deleted: refuse
            # (nothing written), or skip them in the recovery checkpoint, per `on_trimmed`.
            producers, reason = base.producers, "recover"
            offsets = dict(base.offsets)
            trimmed = find_trimmed(self.client, base, set(journals)) if latest else []
            if trimmed:
                if self._options.on_trimmed == "error":
                    raise CheckpointTrimmed(
                        self.group, self.shard, self._store.path(base.seq), trimmed
                    )
                offsets, producers, reason = skip_trimmed(self.group, base, trimmed)
            publisher = Publisher(self.client)
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
                producers=producers,
                ack_intents=intents,
                state=state,
                has_state=has_state,
                reason=reason,
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
        self._seq = Sequencer(cp.offsets, cp.producers, self._options.buffer)
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
        """Where a journal new to the group is read from: its first available offset
        (0 unless trimmed: a checkpoint never records an offset below what the journal
        held when it was written) or its head."""
        if self.start == "beginning":
            return first_available_offset(self.client, journal)
        return self.client.head(journal)

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
        trim_retried = False
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
                except OffsetNotAvailable:
                    # Trimmed while reading: recover once, applying `on_trimmed`.
                    self._state = txn.state
                    self._abort(rollback=True)
                    if trim_retried:
                        raise
                    trim_retried = True
                    continue
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
                    trim_retried = False
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
            if self._engine is not None:
                self._engine.release()  # an on-disk working database (rebuilt likewise)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
