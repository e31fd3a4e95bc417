"""The commit pipeline of a consumer: outputs durable, state objects, checkpoint claim,
ACK intents, on one commit thread per consumer while the next transactions read.

`CommitPipeline` is one of the two parts a `Consumer` is composed of (the other is the
input reader, `_input.InputReader`). Its inputs are its constructor arguments (the client,
the checkpoint store, the options, the state and sink engines, the stage hook, the
metrics) and the arguments of its calls (the recovered checkpoint and publisher, the
state and the offsets a commit records); its outputs are return values (a prepared
commit, a failed commit's error, the publisher an abort dropped). The fields it owns are
listed on the class; no other object reads or writes them.

Each closed transaction becomes a `_CommitJob`, run in submission order by the pipeline's
`_CommitWorker` (Gazette's pipelined commits):

1. the state and sink objects of the commit are written, put-if-absent (`state`), while
   the appenders write the outputs; then the outputs are durable (`flushed`), and so is a
   background snapshot this checkpoint references;
2. checkpoint N+1 is claimed (`checkpoint`, `checkpointed`): written only if absent, and
   nothing above it;
3. the ACK intents are appended (`acked`) and durable, then the sink statements applied
   (`sink`), then `committed`.

Invariants:
- jobs run one at a time, in order, so checkpoint N+1 is claimed only after every step of
  N (its ACKs durable, its sink statements applied): a crash never leaves a claimed
  checkpoint whose predecessor's outputs are uncommitted;
- after a job fails, the later jobs of the queue write nothing (they fail with its error)
  until the consumer has aborted (`CommitPipeline.abort` waits for every job, then
  re-arms the worker);
- a transaction's outputs are appended only once the previous commit's ACKs have started
  (`CommitPipeline.publish` waits at the gate): an ACK rolls back the pending messages of
  its producer with larger clocks that precede it in the journal;
- at most `MAX_PENDING` jobs are submitted and not yet awaited: the consumer waits for the
  older ones (`await_commits`, raising their errors) before submitting, which bounds the
  memory held by commits in flight.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from oncelog.consumer._base import Stages, encode_state
from oncelog.consumer._options import ConsumerOptions
from oncelog.consumer.checkpoint import Checkpoint, CheckpointStore, ConsumerError, FencedOut
from oncelog.consumer.metrics import ConsumerMetrics
from oncelog.consumer.sink import SQLiteSinkEngine
from oncelog.consumer.state import BackgroundWrite, SQLiteStateEngine
from oncelog.publisher import AckIntent, Mapping, Publisher, start_intents
from oncelog.sequencer import ProducerState

if TYPE_CHECKING:
    from oncelog.journal import AsyncAppend, JournalClient
    from oncelog.message import Message

__all__ = ["MAX_PENDING", "CommitPipeline", "PreparedCommit"]

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

    def __init__(self, name: str, run_job: Callable[[_CommitJob], None]) -> None:
        self._name = name
        self._run_job = run_job
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


@dataclass(frozen=True, slots=True)
class PreparedCommit:
    """A closed transaction's commit, prepared on the consumer's thread before it is
    submitted (`CommitPipeline.prepare`): what the checkpoint records besides offsets."""

    state: Any
    """The state the checkpoint holds (JSON state, or the SQLite state's reference)."""
    state_json: bytes
    objects: list[tuple[str, bytes]]
    """State and sink objects, written put-if-absent before the claim."""
    waits: list[BackgroundWrite]
    """Objects written in the background (a snapshot), durable before the claim."""
    sink_ref: Any
    sink_data: bytes | None


class CommitPipeline:
    """The commit part of a `Consumer`: `prepare` and `submit` (the consumer's thread) turn a
    closed transaction into a job; `_finish_commit` (the commit thread) writes it.

    Fields, and who may touch them:

    - `store`: the group's (shard's) checkpoint store, set at construction; recovery
      (the consumer's thread) and the commit thread both use it (`CheckpointStore` calls
      are independent). Replaceable while nothing runs (tests wrap it).
    - `_publisher`, `_checkpoint`: the outputs' publisher and the last checkpoint claimed
      or submitted; set by `start()` (after a recovery's claim), `submit()` and `abort()`,
      on the consumer's thread only. A job carries its own copies to the commit thread.
    - `_jobs`, `_gate`: the consumer's thread only.
    - `_fenced`: written once, by the commit thread, before the job it fails is marked
      done; read by the consumer's thread (a single reference store: no lock needed, and
      it is read for decisions only after `job.done`, or as a hint in `publish`).
    - `worker`: its own `_cond` guards its queue, thread and failure.

    The state and sink engines are the consumer's (it opens, loads and closes them); the
    pipeline prepares and applies their commits: `prepare` on the consumer's thread,
    `apply` on the commit thread, never at once for one commit (a commit's sink apply
    comes after its claim, the next prepare's writes go to a new object).
    """

    def __init__(
        self,
        client: JournalClient,
        store: CheckpointStore,
        options: ConsumerOptions,
        *,
        owner: str,
        engine: SQLiteStateEngine | None,
        sink: SQLiteSinkEngine | None,
        stages: Stages,
        metrics: ConsumerMetrics | None,
        labels: tuple[str, str],
    ) -> None:
        self._client = client
        self.store = store
        self._options = options
        self._owner = owner
        """The consumer's repr, which names it in errors and logs."""
        self._engine = engine
        self._sink = sink
        self._stages = stages
        self._metrics = metrics
        self._labels = labels
        self._publisher: Publisher | None = None
        self._checkpoint: Checkpoint | None = None
        self._fenced: str | None = None
        self._jobs: deque[_CommitJob] = deque()
        """Submitted and not yet awaited, oldest first."""
        self._gate: _CommitJob | None = None
        """The last submitted job, until the open transaction's first publish saw its ACKs
        started."""
        self.worker = _CommitWorker(f"oncelog-commit:{store.group}", self._finish_commit)

    def __repr__(self) -> str:
        return self._owner

    # ------------------------------------------------------------------ queries

    @property
    def publisher(self) -> Publisher | None:
        """The publisher of the open transaction's outputs (None until recovered, and
        after an abort)."""
        return self._publisher

    @property
    def checkpoint(self) -> Checkpoint | None:
        """The last checkpoint claimed by recovery or submitted by a commit."""
        return self._checkpoint

    @property
    def fenced(self) -> str | None:
        """Why this instance is fenced out (for good), or None."""
        return self._fenced

    def check_not_fenced(self) -> None:
        """FencedOut if another instance of the group has committed over this one."""
        if self._fenced is not None:
            raise FencedOut(self._fenced)

    # ------------------------------------------------------------------ consumer's thread

    def start(self, checkpoint: Checkpoint, publisher: Publisher) -> None:
        """Commit after `checkpoint` (a recovery's, claimed), publishing with `publisher`."""
        self._checkpoint = checkpoint
        self._publisher = publisher

    def publish(self, mapping: Mapping, msg: Message) -> AsyncAppend:
        """Publish an output of the open transaction, uncommitted."""
        if self._gate is not None:
            # The previous commit's ACKs must reach each journal before this transaction's
            # outputs: an ACK drops the pending messages with larger clocks before it.
            self._gate.wait_acks_started()
            self._gate = None
        publisher = self._publisher
        if publisher is None:
            self.check_not_fenced()
            raise ConsumerError(f"{self!r}: the transaction was aborted; run() again to recover")
        return publisher.publish_uncommitted(mapping, msg)

    def prepare(self, state: Any) -> PreparedCommit:
        """The next commit's state and sink objects (the SQLite state commits locally
        now), and the state's JSON; ConsumerError if it is not JSON-serialisable."""
        assert self._checkpoint is not None
        next_seq = self._checkpoint.seq + 1
        objects: list[tuple[str, bytes]] = []
        waits: list[BackgroundWrite] = []
        sink_ref, sink_data = None, None
        if self._sink is not None:
            sink_ref, sink_data, sink_rel = self._sink.prepare(next_seq)
            if sink_data is not None and sink_rel is not None:
                objects.append((sink_rel, sink_data))
        if self._engine is not None:
            # Committed locally now; the objects are written before the claim.
            state, state_objects, waits = self._engine.prepare(
                next_seq, None if self._stages.hook is None else self._stages
            )
            objects.extend(state_objects)
        return PreparedCommit(
            state, encode_state(state, self._owner), objects, waits, sink_ref, sink_data
        )

    def submit(
        self,
        prepared: PreparedCommit,
        offsets: dict[str, int],
        producers: list[ProducerState],
        messages: int,
    ) -> None:
        """Submit the commit of checkpoint N+1 (`prepared`, recording `offsets` and
        `producers`, after `messages` messages), which completes on the commit thread
        while the next transactions read. The caller has awaited all but
        `MAX_PENDING - 1` older commits."""
        publisher = self._publisher
        assert publisher is not None and self._checkpoint is not None
        intents = publisher.build_ack_intents()
        cp = self._checkpoint.successor(
            offsets=offsets,
            producers=producers,
            ack_intents=intents,
            state=prepared.state,
            has_state=True,
            reason="commit",
            writer=publisher.producer_id,
            ack_producer=publisher.producer_id,
            sink=prepared.sink_ref,
        )
        self._checkpoint = cp
        job = _CommitJob(
            publisher, cp, cp.to_json(prepared.state_json), intents, prepared.objects,
            prepared.waits,
        )
        job.messages = messages
        job.sink_data = prepared.sink_data
        self._jobs.append(job)
        self._gate = job
        self.worker.submit(job)

    def await_commits(self, leave: int = 0) -> BaseException | None:
        """Wait until at most `leave` submitted commits are unfinished (oldest first).
        Returns the first failed commit's error (the later jobs stay queued: the caller
        must `abort`), or None."""
        jobs = self._jobs
        while len(jobs) > leave:
            job = jobs[0]
            job.done.wait()
            jobs.popleft()
            if job.error is not None:
                return job.error
        return None

    def abort(self) -> Publisher | None:
        """Drop every commit in flight (waiting until each has finished: a recovery never
        runs while this instance's commits may still write) and the publisher, which is
        returned (its pending outputs are the open transaction's)."""
        jobs, self._jobs, self._gate = list(self._jobs), deque(), None
        for job in jobs:
            job.done.wait()
            if job.error is not None and not isinstance(job.error, FencedOut):
                log.warning("%r: commit of checkpoint %d failed: %s", self, job.checkpoint.seq,
                            job.error)
        self.worker.rearm()
        publisher, self._publisher = self._publisher, None
        return publisher

    def drop_publisher(self) -> None:
        """Forget the publisher (the consumer closed; the next recovery makes another).
        Its uncommitted outputs, if any, are never acknowledged."""
        self._publisher = None

    def roll_back(self, publisher: Publisher | None) -> None:
        """Roll back an aborted transaction's outputs, if any (never once fenced out).

        Not needed for correctness (the next recovery uses a new producer ID, so these
        outputs are never acknowledged), but it lets readers drop them now. Only the
        aborted transaction's outputs are pending: the last commit's were taken by
        `build_ack_intents`, and these exist only if that commit's ACKs went out."""
        if self._fenced is None and publisher is not None and publisher.pending_journals():
            try:
                publisher.rollback()
            except Exception as exc:
                log.warning("%r: rolling back aborted outputs failed: %s", self, exc)

    def append_intents(self, intents: Sequence[AckIntent]) -> None:
        """Append ACK intents (concurrently across journals) and wait until all are durable."""
        for append in self._start_intents(intents):
            append.result()
            self._stages("acked")

    def _start_intents(self, intents: Sequence[AckIntent]) -> list[AsyncAppend]:
        return [a for a in start_intents(self._client, intents) if a is not None]

    # ------------------------------------------------------------------ commit thread

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
        stage = self._stages
        for rel, data in job.objects:
            # State objects (named by this seq and a fresh token) before the claim: only a
            # claimed checkpoint references them. Unreferenced, they are harmless garbage.
            # Written while the appenders make the outputs durable (they were released to
            # them when published), so the two overlap.
            if not self._client.meta.put_if_absent(rel, data):
                raise ConsumerError(f"{self!r}: state object {rel} exists already")
            stage("state")
        job.publisher.flush()
        stage("flushed")
        for write in job.waits:
            write.result()  # a snapshot written in the background since the last commit
        stage("checkpoint")
        # From here on nothing may be rolled back: checkpoint N+1 may exist even if writing
        # it raised, and a rollback ACK would then discard outputs it commits.
        store = self.store
        path = store.path(job.checkpoint.seq)
        try:
            why = store.claim(job.checkpoint, job.data)
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
        stage("checkpointed")
        # Started before the next transaction publishes anything (appends to a journal keep
        # their start order), so each ACK lands ahead of that transaction's outputs.
        appends = self._start_intents(job.intents)
        job.acks_started.set()
        for append in appends:
            append.result()
            stage("acked")
        if job.sink_data is not None and self._sink is not None:
            self._sink.apply(job.sink_data, store.path(job.checkpoint.seq))
            stage("sink")
        if self._metrics is not None:
            self._metrics.acked(self._labels, time.monotonic() - job.closed)
        stage("committed")
        keep = self._options.keep_checkpoints
        if keep is not None and job.checkpoint.seq % keep == 0:
            try:
                store.prune(keep)
            except Exception as exc:  # only housekeeping: the next prune catches up
                log.warning("%r: pruning old checkpoints failed: %s", self, exc)
