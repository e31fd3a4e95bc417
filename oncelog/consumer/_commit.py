"""The commit pipeline of a consumer: outputs durable, state objects, checkpoint claim,
ACK intents, on one commit thread per consumer while the next transactions read.

Each closed transaction becomes a `_CommitJob`, run in submission order by the consumer's
`_CommitWorker` (Gazette's pipelined commits):

1. the state and sink objects of the commit are written, put-if-absent (`state`), while
   the appenders write the outputs; then the outputs are durable (`flushed`), and so is a
   background snapshot this checkpoint references;
3. checkpoint N+1 is claimed (`checkpoint`, `checkpointed`): written only if absent, and
   nothing above it;
4. the ACK intents are appended (`acked`) and durable, then the sink statements applied
   (`sink`), then `committed`.

Invariants:
- jobs run one at a time, in order, so checkpoint N+1 is claimed only after every step of
  N (its ACKs durable, its sink statements applied): a crash never leaves a claimed
  checkpoint whose predecessor's outputs are uncommitted;
- after a job fails, the later jobs of the queue write nothing (they fail with its error)
  until the consumer has aborted (`_abort` waits for every job, then re-arms the worker);
- a transaction's outputs are appended only once the previous commit's ACKs have started
  (`_publish` waits at the gate): an ACK rolls back the pending messages of its producer
  with larger clocks that precede it in the journal;
- at most `MAX_PENDING` jobs are submitted and not yet awaited: `_commit` waits for the
  older ones (raising their errors), which bounds the memory held by commits in flight.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from oncelog.consumer._base import ConsumerBase
from oncelog.consumer.checkpoint import Checkpoint, ConsumerError, FencedOut
from oncelog.consumer.state import BackgroundWrite
from oncelog.publisher import AckIntent, Mapping, Publisher, start_intents

if TYPE_CHECKING:
    from oncelog.consumer.core import Transaction
    from oncelog.journal import AsyncAppend
    from oncelog.message import Message

__all__ = ["MAX_PENDING", "CommitPipeline"]

log = logging.getLogger("oncelog.consumer.core")

MAX_PENDING = 2
"""Commits submitted and not yet awaited: one being written, one waiting for it. The
transaction after them waits at its close (or at its first publish) for the oldest."""

_IDLE_EXIT = 5.0
"""Seconds an idle commit thread lingers before exiting (a new one starts on demand)."""


class _CommitJob:
    """One commit: what its thread writes, and how far it got."""

    __slots__ = (
        "publisher", "checkpoint", "data", "intents", "objects", "waits", "messages", "closed",
        "sink_data", "acks_started", "done", "error",
    )

    def __init__(
        self,
        publisher: Publisher,
        checkpoint: Checkpoint,
        data: bytes,
        intents: list[AckIntent],
        objects: list[tuple[str, bytes]],
        waits: list[BackgroundWrite],
    ) -> None:
        self.publisher = publisher
        self.checkpoint = checkpoint
        self.data = data
        self.intents = intents
        self.objects = objects
        """State and sink objects, written put-if-absent before the claim."""
        self.waits = waits
        """Objects written in the background (a snapshot), durable before the claim."""
        self.messages = 0
        self.closed = time.monotonic()
        self.sink_data: bytes | None = None
        self.acks_started = threading.Event()
        self.done = threading.Event()
        self.error: BaseException | None = None

    def wait_acks_started(self) -> None:
        """Block until the ACKs are on their way; raise the commit's error if it failed."""
        self.acks_started.wait()
        if self.error is not None:
            raise self.error


class _CommitWorker:
    """The thread running one consumer's commit jobs in order (started on demand, exiting
    after `_IDLE_EXIT` idle seconds). `_cond` guards `_queue`, `_thread` and `_failed`."""

    def __init__(self, name: str, run: CommitPipeline) -> None:
        self._name = name
        self._run_job = run._finish_commit
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[_CommitJob] = deque()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()  # a forked child has no commit thread: it starts its own
        self._failed: BaseException | None = None

    def submit(self, job: _CommitJob) -> None:
        with self._cond:
            self._queue.append(job)
            if self._thread is None or self._pid != os.getpid():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def rearm(self) -> None:
        """Run jobs again after a failure (the consumer aborted: no job is queued)."""
        with self._cond:
            assert not self._queue
            self._failed = None

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._queue:
                    self._cond.wait_for(lambda: bool(self._queue), timeout=_IDLE_EXIT)
                    if not self._queue:
                        self._thread = None
                        return
                job = self._queue.popleft()
                failed = self._failed
            try:
                if failed is not None:
                    job.error = failed  # never claim past a failed commit
                else:
                    self._run_job(job)
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer's thread
                job.error = exc
                with self._cond:
                    self._failed = exc
            finally:
                job.acks_started.set()
                job.done.set()


class CommitPipeline(ConsumerBase):
    """The commit part of a `Consumer`: `_commit` (the consumer's thread) closes a
    transaction and submits its job; `_finish_commit` (the commit thread) writes it."""

    _jobs: deque[_CommitJob]
    """Submitted and not yet awaited, oldest first (the consumer's thread only)."""
    _gate: _CommitJob | None
    """The last submitted job, until the open transaction's first publish saw its ACKs
    started."""
    _worker: _CommitWorker

    def _init_pipeline(self) -> None:
        self._jobs = deque()
        self._gate = None
        self._worker = _CommitWorker(f"oncelog-commit:{self.group}", self)

    def _publish(self, mapping: Mapping, msg: Message) -> AsyncAppend:
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

    def _commit(self, txn: Transaction) -> None:
        """Close `txn` and submit its commit, which completes on the commit thread while
        the next transactions read."""
        publisher = self._publisher
        seq = self._seq
        assert publisher is not None and seq is not None and self._checkpoint is not None
        next_seq = self._checkpoint.seq + 1
        waits: list[BackgroundWrite] = []
        try:
            if self._finalize is not None:
                self._finalize(txn)
            self._state = txn.state
            self._stage("finalized")
            objects: list[tuple[str, bytes]] = []
            sink_ref, sink_data = None, None
            if self._sink is not None:
                sink_ref, sink_data, sink_rel = self._sink.prepare(next_seq)
                if sink_data is not None and sink_rel is not None:
                    objects.append((sink_rel, sink_data))
            if self._engine is not None:
                # Committed locally now; the objects are written before the claim.
                state, state_objects, waits = self._engine.prepare(
                    next_seq, None if self._on_stage is None else self._stage
                )
                objects.extend(state_objects)
            else:
                state = self._state
            state_json = self._encode_state(state)
            self._await_commits(leave=MAX_PENDING - 1)
        except BaseException:
            self._abort(rollback=True)
            raise
        intents = publisher.build_ack_intents()
        # Mid upstream transaction (split_upstream), the last message handled counts as
        # processed: a resumed Sequencer replays the rest of that transaction after it.
        offsets, states = seq.checkpoint(
            self._options.prune_horizon, dequeued_processed=self._carry is not None
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
        job = _CommitJob(publisher, cp, cp.to_json(state_json), intents, objects, waits)
        job.messages = txn.messages
        job.sink_data = sink_data
        self._jobs.append(job)
        self._gate = job
        self._worker.submit(job)

    def _finish_commit(self, job: _CommitJob) -> None:
        """The commit's I/O (on the commit thread): outputs durable, then claim checkpoint
        N+1 (written only if absent, and nothing above it), then ACKs.

        An unclaimed N+1 fences this instance out for good and its ACK intents are never
        appended, whether N+1 was taken or was written into a hole left by pruning (a
        zombie resuming after others committed past N+1). A storage error while claiming
        (StorageUnavailable after the retries: N+1 may or may not exist, may or may not be
        the newest) is raised as is: the consumer aborts without rollback and appends
        nothing, and the next recovery settles it (N+1 is then the latest, whose intents
        it re-appends, or it is not, and they never are)."""
        for rel, data in job.objects:
            # State objects (named by this seq and a fresh token) before the claim: only a
            # claimed checkpoint references them. Unreferenced, they are harmless garbage.
            # Written while the appenders make the outputs durable (they were released to
            # them when published), so the two overlap.
            if not self.client.put_if_absent(rel, data):
                raise ConsumerError(f"{self!r}: state object {rel} exists already")
            self._stage("state")
        job.publisher.flush()
        self._stage("flushed")
        for write in job.waits:
            write.result()  # a snapshot written in the background since the last commit
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
            written += sum(write.size for write in job.waits)
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
        keep = self._options.keep_checkpoints
        if keep is not None and job.checkpoint.seq % keep == 0:
            try:
                self._store.prune(keep)
            except Exception as exc:  # only housekeeping: the next prune catches up
                log.warning("%r: pruning old checkpoints failed: %s", self, exc)

    def _await_commits(self, leave: int = 0) -> None:
        """Wait until at most `leave` submitted commits are unfinished (oldest first); raise
        the first error (aborting the consumer: recovery settles what was written)."""
        jobs = self._jobs
        while len(jobs) > leave:
            job = jobs[0]
            job.done.wait()
            jobs.popleft()
            if job.error is not None:
                self._abort(rollback=False)  # recovery re-appends what was checkpointed
                raise job.error

    def _await_commit(self) -> None:
        """Wait for every commit in flight; raise the first error (aborting the consumer)."""
        self._await_commits(0)

    def _append_intents(self, intents: Sequence[AckIntent]) -> None:
        """Append ACK intents (concurrently across journals) and wait until all are durable."""
        for append in self._start_intents(intents):
            append.result()
            self._stage("acked")

    def _start_intents(self, intents: Sequence[AckIntent]) -> list[AsyncAppend]:
        return [a for a in start_intents(self.client, intents) if a is not None]

    def _abort(self, *, rollback: bool) -> None:
        """Drop the open transaction; `run()` recovers from the last checkpoint next time."""
        jobs, self._jobs, self._gate = list(self._jobs), deque(), None
        for job in jobs:
            job.done.wait()  # never recover while our own commits may still write
            if job.error is not None and not isinstance(job.error, FencedOut):
                log.warning("%r: commit of checkpoint %d failed: %s", self, job.checkpoint.seq,
                            job.error)
        self._worker.rearm()
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
