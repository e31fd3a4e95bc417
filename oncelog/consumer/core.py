"""The exactly-once consumer: read committed, handle, checkpoint, acknowledge.

Each consumer transaction reads committed messages from the group's journals
and hands them to the handler, which publishes outputs *uncommitted* and
updates a JSON state. Its commit waits for the outputs, writes checkpoint N+1
(read offsets, producer states, the outputs' ACK intents, the state) only if
absent, checks that no checkpoint above N+1 exists (else N+1 was free only because
pruning removed it: this instance is a zombie), and only then appends the ACK
intents. Gazette's consumer semantics; docs/consumers.md explains why this is
exactly-once across crashes, zombies and pruning.

A `Consumer` is a composition: it holds its options (`_options.ConsumerOptions`), one input
reader (`_input.InputReader`: journals, Sequencer, handler calls) and one commit pipeline
(`_commit.CommitPipeline`: checkpoints, state objects, ACK intents, on a commit thread),
and wires them; each part owns its fields and is used through its methods only. This
module holds the public names, recovery and the `run()` loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

import orjson

from oncelog.consumer._base import Stages, StopRequest, encode_state
from oncelog.consumer._commit import MAX_PENDING, CommitPipeline
from oncelog.consumer._input import InputReader, ReadProgress
from oncelog.consumer._options import consumer_options
from oncelog.consumer._trimmed import CheckpointTrimmed, find_trimmed, skip_trimmed
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
from oncelog.consumer.sink import SinkWriter, SQLiteSink, SQLiteSinkEngine
from oncelog.consumer.state import (
    KV,
    SQLiteState,
    SQLiteStateEngine,
    StateObjectMissing,
    is_sqlite_ref,
)
from oncelog.journal.errors import OffsetNotAvailable
from oncelog.labels import LabelSelector
from oncelog.message import Envelope, Message
from oncelog.publisher import AckIntent, Mapping, Publisher

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
    """One consumer transaction: its outputs, the group's state, and how far it has come.

    Made by its `Consumer` (this module) for each transaction. How far reading has come
    (closing, idle, the deadline) lives in a `ReadProgress` the transaction creates and
    the consumer hands to its input reader; `close()` sets it."""

    __slots__ = ("_consumer", "_progress", "state", "kv", "seq", "messages", "started")

    def __init__(self, consumer: Consumer, state: Any, seq: int, max_duration: float) -> None:
        self._consumer = consumer
        self.state = state
        """The group's JSON-serialisable state: mutate it, or assign a new one (None with
        `state=SQLiteState()`: use `kv`)."""
        self.kv: KV | None = consumer.kv
        """With `state=SQLiteState()`: the group's key-value state (writes commit with
        this transaction, or are undone if it aborts); None with JSON state."""
        self.seq = seq
        """The checkpoint number this transaction commits as."""
        self.messages = 0
        """Messages handed to the handler so far."""
        self.started = time.monotonic()
        self._progress = ReadProgress(self.started + max_duration)

    @property
    def deadline(self) -> float:
        """When (`time.monotonic()`) this transaction stops reading and commits."""
        return self._progress.deadline

    @deadline.setter
    def deadline(self, value: float) -> None:
        self._progress.deadline = value

    @property
    def group(self) -> str:
        """The consumer group this transaction commits for."""
        return self._consumer.group

    @property
    def sink(self) -> SinkWriter:
        """With `sink=SQLiteSink(...)`: record output statements, applied exactly once
        with this transaction's commit (oncelog.consumer.sink)."""
        return self._consumer._sink_writer()

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
        self._progress.closing = True

    def __repr__(self) -> str:
        return f"Transaction(group={self.group!r}, seq={self.seq}, messages={self.messages})"


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

    Structure: a consumer holds one `InputReader` (`_reader`: the journals read, where,
    the Sequencer) and one `CommitPipeline` (`_pipeline`: the checkpoint store, the
    publisher, the last checkpoint, the commits in flight, whether fenced out), and owns
    the rest: the options, the handlers, the state and sink engines (opened here, loaded
    by recovery, released by `close()`), the state between transactions (`_state`), the
    stage hook (`_stages`, shared with both parts) and the stop request (`_stop`, shared
    with the reader). Every field is used from the thread calling `run()`, except what
    the pipeline's commit thread uses (see `CommitPipeline`), and `_stop`, which `stop()`
    sets from any thread. Recovery (here) drives both parts: it claims the checkpoint
    through the pipeline's store, then `start`s the reader and the pipeline.
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
        self.shards = shards
        self.shard: int | None = options.shard
        store = CheckpointStore(client, group, self.shard, shards)
        self._engine: SQLiteStateEngine | None
        if state == "json":
            self._engine = None
        elif isinstance(state, SQLiteState):
            if initial_state is not None:
                raise ValueError("initial_state is for JSON state: SQLite state starts empty")
            self._engine = state.open(client, store.directory)
        else:
            raise ValueError(f"state must be 'json' or a SQLiteState, not {state!r}")
        if sink is not None and not isinstance(sink, SQLiteSink):
            raise TypeError(f"sink must be a SQLiteSink, not {sink!r}")
        self._sink: SQLiteSinkEngine | None = (
            None if sink is None else sink.open(client, store.directory, group, self.shard)
        )
        self._handler = handler
        self._batch_handler = batch_handler
        self._finalize = finalize
        self._initial_state = initial_state
        if lazy and new_message is not None:
            raise ValueError("lazy=True reads JSONLine messages: it cannot take new_message")
        self._stages = Stages(on_stage)
        self._stop = StopRequest()
        labels = ConsumerMetrics.labels(self.group, self.shard)
        self._metrics = metrics
        self._labels = labels
        self._state: Any = None
        """The state between transactions (set by recovery, and by each transaction)."""
        self._reader = InputReader(
            client, options, new_message=new_message, lazy=bool(lazy), stages=self._stages,
            stop=self._stop,
        )
        self._pipeline = CommitPipeline(
            client, store, options, owner=repr(self), engine=self._engine, sink=self._sink,
            stages=self._stages, metrics=metrics, labels=labels,
        )

    # ------------------------------------------------------- hooks (for tests only)

    @property
    def _on_stage(self) -> Callable[[str], None] | None:
        """The `on_stage` hook; tests replace it between runs (both parts see the change)."""
        return self._stages.hook

    @_on_stage.setter
    def _on_stage(self, hook: Callable[[str], None] | None) -> None:
        self._stages.hook = hook

    @property
    def _store(self) -> CheckpointStore:
        """The checkpoint store (the pipeline's); tests wrap it before recovering."""
        return self._pipeline.store

    @_store.setter
    def _store(self, store: CheckpointStore) -> None:
        self._pipeline.store = store

    @property
    def _checkpoint(self) -> Checkpoint | None:
        """The last checkpoint claimed or submitted (the pipeline's)."""
        return self._pipeline.checkpoint

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
        return self._pipeline.fenced is not None

    @property
    def checkpoint_seq(self) -> int:
        """The number of the last checkpoint this instance wrote (0 before recovery)."""
        checkpoint = self._pipeline.checkpoint
        return 0 if checkpoint is None else checkpoint.seq

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
        publisher = self._pipeline.publisher
        return None if publisher is None else publisher.producer_id

    @property
    def journals(self) -> list[str]:
        """The journals this consumer currently reads."""
        return self._reader.journals()

    @property
    def positions(self) -> dict[str, int]:
        """Per journal, the offset up to which messages have been read."""
        return self._reader.positions()

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
        reader, pipeline = self._reader, self._pipeline
        reader.close()
        ensure_group(self.client, self.group, self.shards)
        journals = reader.discover()
        refused: list[str] = []
        store = pipeline.store
        for _ in range(RECOVERY_ATTEMPTS):
            latest, floor = store.latest_and_floor()
            if latest is None:
                # Nothing yet, or a deleted group's tombstone: start from scratch above it.
                base = Checkpoint(self.group, floor, shard=self.shard, shards=self.shards)
                intents: list[AckIntent] = []
            else:
                base = latest
                intents = recoverable_intents(self.client, latest, store.path(latest.seq))
            sink_data = None
            if self._sink is not None:
                # The statements recovery re-applies, read (and checked) before the claim.
                sink_data = self._sink.load(base.sink, store.path(base.seq))
            if self._engine is not None:
                # Rebuild the local database before anything is written (a corrupt reference
                # raises with nothing written); an object pruned since `latest` was read
                # means a newer checkpoint exists: retry from it.
                ref = base.state if base.has_state else None
                try:
                    self._engine.load(ref, store.path(base.seq))
                except StateObjectMissing as exc:
                    above = store.superseded(base.seq)
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
                        self.group, self.shard, store.path(base.seq), trimmed
                    )
                offsets, producers, reason = skip_trimmed(self.group, base, trimmed)
            publisher = Publisher(self.client)
            for journal in journals:
                if journal not in offsets:
                    offsets[journal] = reader.start_offset(journal)
            if self._engine is not None:
                state = self._engine.ref if base.has_state else None
                has_state = state is not None
            else:
                if base.has_state and is_sqlite_ref(base.state):
                    raise ConsumerError(
                        f"{self!r}: checkpoint {store.path(base.seq)} holds SQLite state:"
                        " run this group with state=SQLiteState() (or reset it)"
                    )
                state = base.state if base.has_state else self._initial_state
                has_state = True
            state_json = encode_state(state, repr(self))
            cp = base.successor(
                offsets=offsets,
                producers=producers,
                ack_intents=intents,
                state=state,
                has_state=has_state,
                reason=reason,
                writer=publisher.producer_id,
            )
            why = store.claim(cp, cp.to_json(state_json))
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
        pipeline.append_intents(cp.ack_intents)
        if self._sink is not None:
            self._sink.rollback()
            if sink_data is not None:
                # The latest commit's statements, unless the database has them (fenced).
                self._sink.apply(sink_data, store.path(cp.seq - 1))
        # A fresh copy, typed as any later recovery would see it (tuples become lists...).
        self._state = None if self._engine is not None else orjson.loads(state_json)
        reader.start(cp.offsets, cp.producers, journals)
        pipeline.start(cp, publisher)
        if self._metrics is not None:
            self._metrics.recovered(self._labels, cp.seq)
        self._stages("recovered")
        return cp.seq

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
        reader, pipeline, stop = self._reader, self._pipeline, self._stop
        committed = 0
        trim_retried = False
        try:
            while not stop.requested:
                if not reader.started:
                    self.recover()
                txn = self._begin()
                try:
                    if self._batch_handler is not None:
                        idle = reader.fill_batches(txn, self._batch_handler)
                    else:
                        assert self._handler is not None
                        idle = reader.fill(txn, self._handler)
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
                publisher = pipeline.publisher
                assert publisher is not None
                if txn.messages or reader.dirty or publisher.pending_journals():
                    self._commit(txn)
                    committed += 1
                    trim_retried = False
                if max_transactions is not None and committed >= max_transactions:
                    break
                if idle:
                    self._await_commits()
                    if until_idle:
                        break
                    stop.wait(self.poll_interval)
            self._await_commits()
        finally:
            stop.clear()
        return committed

    def stop(self) -> None:
        """Ask `run()` (in another thread) to commit the open transaction and return."""
        self._stop.set()

    def _begin(self) -> Transaction:
        self._reader.refresh_if_due()  # (before the transaction's clock starts)
        txn = Transaction(self, self._state, self.checkpoint_seq + 1, self.max_duration)
        self._reader.begin(txn._progress)
        return txn

    def _publish(self, mapping: Mapping, msg: Message) -> AsyncAppend:
        """`Transaction.publish`: an output of the open transaction, through the pipeline."""
        return self._pipeline.publish(mapping, msg)

    def _sink_writer(self) -> SinkWriter:
        """`Transaction.sink`: the sink's writer; ConsumerError without a sink."""
        if self._sink is None:
            raise ConsumerError("this consumer has no sink: pass sink=SQLiteSink(path)")
        return self._sink.writer

    def _check_not_fenced(self) -> None:
        self._pipeline.check_not_fenced()

    def _commit(self, txn: Transaction) -> None:
        """Close `txn` (its finalizer, its state and sink objects) and submit its commit,
        which completes on the pipeline's commit thread while the next transactions read.
        Anything raised before the submission aborts the consumer."""
        pipeline = self._pipeline
        try:
            if self._finalize is not None:
                self._finalize(txn)
            self._state = txn.state
            self._stages("finalized")
            prepared = pipeline.prepare(self._state)
            self._await_commits(leave=MAX_PENDING - 1)
        except BaseException:
            self._abort(rollback=True)
            raise
        offsets, producers = self._reader.checkpoint(self._options.prune_horizon)
        pipeline.submit(prepared, offsets, producers, txn.messages)

    def _await_commits(self, leave: int = 0) -> None:
        """Wait until at most `leave` submitted commits are unfinished; raise the first
        error, aborting the consumer (recovery settles what was written)."""
        error = self._pipeline.await_commits(leave)
        if error is not None:
            self._abort(rollback=False)  # recovery re-appends what was checkpointed
            raise error

    def _abort(self, *, rollback: bool) -> None:
        """Drop the open transaction; `run()` recovers from the last checkpoint next time.

        Waits for every commit in flight first (never recover while this instance's
        commits may still write); with `rollback`, rolls back the open transaction's
        outputs (never when a commit may have claimed its checkpoint: `rollback=False`)."""
        publisher = self._pipeline.abort()
        self._reader.close()
        if self._engine is not None:
            self._engine.rollback()  # the open transaction's writes; recovery reloads
        if self._sink is not None:
            self._sink.rollback()
        if rollback:
            self._pipeline.roll_back(publisher)

    def close(self) -> None:
        """Wait for a commit in flight, then close the readers (an open, uncommitted
        transaction is abandoned: its outputs are never acknowledged)."""
        try:
            self._await_commits()
        finally:
            self._reader.close()
            self._pipeline.drop_publisher()
            if self._sink is not None:
                self._sink.close()  # (reopened by the next recovery if run() again)
            if self._engine is not None:
                self._engine.release()  # an on-disk working database (rebuilt likewise)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
