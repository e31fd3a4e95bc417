"""Input reading of a consumer: the group's journals read uncommitted, round robin,
sequenced (read committed) and handed to the handler, within one transaction's limits.

`InputReader` is one of the two parts a `Consumer` is composed of (the other is the commit
pipeline, `_commit.CommitPipeline`). Its inputs are its constructor arguments (the
client, the options, how to decode messages, the stage hook and the stop request) and
the arguments of its calls (the offsets and producer states recovery loaded, the open
transaction and its handler); its outputs are return values (whether the input went idle,
the offsets and producer states a checkpoint records). It owns the fields below and no
other object reads or writes them.

Invariant: a transaction ends with the Sequencer between committed sequences (a checkpoint
may be taken), except with `split_upstream`, where it may end inside one: the suspended
sequencing iterator is then kept in `_carry` and resumed by the next transaction.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import timedelta
from itertools import islice
from typing import TYPE_CHECKING, Any

from oncelog.consumer._base import Stages, StopRequest
from oncelog.consumer._options import ConsumerOptions
from oncelog.consumer._trimmed import first_available_offset
from oncelog.consumer.shards import shard_journals
from oncelog.message import ACK_TXN as _ACK_TXN
from oncelog.message import Envelope
from oncelog.reading import read_uncommitted, read_uncommitted_batches
from oncelog.sequencer import ProducerState, Sequencer

if TYPE_CHECKING:
    from oncelog.consumer.core import Transaction
    from oncelog.journal import JournalClient

__all__ = ["InputReader", "ReadProgress"]


class ReadProgress:
    """How far the open transaction's reading has come: shared by the `Transaction` (whose
    `close()`, from the handler, sets `closing`) and the `InputReader` (which sets `closing`
    at the transaction's limits and `idle` when every journal is drained).

    One per transaction, used from the thread calling `run()` only (no lock).
    """

    __slots__ = ("deadline", "closing", "idle")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        """The consumer's clock (`time.monotonic`) at which the transaction closes."""
        self.closing = False
        """True once the transaction must commit when its committed sequence is consumed."""
        self.idle = False
        """True if reading stopped because no journal had anything more."""


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


class InputReader:
    """The reading part of a `Consumer`: which journals it reads, where, and the Sequencer.

    Every method is called from the thread calling `run()` (or `recover()`) only, so no
    field has a lock. The reader owns:

    - `_seq`: the Sequencer, None until `start()` and after `close()` (the consumer must
      then recover before reading);
    - `_inputs`: per journal read, its reader and position (`_Input`);
    - `_positions`: per journal, the offset recorded by the last checkpoint (plus the
      start offsets of journals picked up since), completed by the Sequencer's offsets;
    - `_dirty`: True when `_positions` gained a journal the last checkpoint lacks;
    - `_carry`: with split_upstream, the sequencing iterator suspended mid upstream
      transaction, resumed by the next transaction (None between sequences);
    - `_txn_progress`: the open transaction's `ReadProgress` (a carried iterator reads it to
      follow the transaction it was resumed in);
    - `_last_refresh`: when journals matching the selector were last listed.
    """

    def __init__(
        self,
        client: JournalClient,
        options: ConsumerOptions,
        *,
        new_message: Callable[[Any], Any] | None,
        lazy: bool,
        stages: Stages,
        stop: StopRequest,
    ) -> None:
        self._client = client
        self._options = options
        self._new_message = new_message
        self._lazy = lazy
        self._stages = stages
        self._stop = stop
        self._seq: Sequencer | None = None
        self._inputs: dict[str, _Input] = {}
        self._positions: dict[str, int] = {}
        self._dirty = False
        self._carry: Iterator[Envelope] | None = None
        self._txn_progress: ReadProgress | None = None
        self._last_refresh = 0.0

    # ------------------------------------------------------------------ lifecycle

    @property
    def started(self) -> bool:
        """True between `start()` and `close()`: reading may go on without a recovery."""
        return self._seq is not None

    def start(
        self,
        offsets: dict[str, int],
        producers: Sequence[ProducerState],
        journals: Iterable[str],
    ) -> None:
        """Read `journals` from a recovered checkpoint's `offsets` (which hold every one of
        them) and producer states, with a fresh Sequencer."""
        self._seq = Sequencer(offsets, producers, self._options.buffer)
        self._positions = dict(offsets)
        self._inputs = {j: _Input(j, offsets[j]) for j in journals}
        self._dirty = False
        self._last_refresh = time.monotonic()

    def close(self) -> None:
        """Close every reader and drop the Sequencer (an aborted or closed consumer)."""
        carry, self._carry = self._carry, None
        if carry is not None and hasattr(carry, "close"):
            carry.close()
        for inp in self._inputs.values():
            inp.close()
        self._seq = None

    # ------------------------------------------------------------------ queries

    def journals(self) -> list[str]:
        """The journals read now."""
        return list(self._inputs)

    def positions(self) -> dict[str, int]:
        """Per journal, the offset up to which messages have been read."""
        out = dict(self._positions)
        if self._seq is not None:
            out.update(self._seq.offsets)
        return out

    @property
    def dirty(self) -> bool:
        """True when a journal was picked up since the last checkpoint: its start offset
        needs a commit even if no message was read."""
        return self._dirty

    def discover(self) -> list[str]:
        """The group's journals now (a selector is listed again), this shard's only."""
        options = self._options
        if options.selector is None:
            names = list(options.names)
        else:
            names = [spec.name for spec in self._client.list(options.selector)]
        if options.shard is not None:
            names = shard_journals(names, options.shard, options.shards)
        return names

    def start_offset(self, journal: str) -> int:
        """Where a journal new to the group is read from: its first available offset
        (0 unless trimmed: a checkpoint never records an offset below what the journal
        held when it was written) or its head."""
        if self._options.start == "beginning":
            return first_available_offset(self._client, journal)
        return self._client.head(journal)

    # ------------------------------------------------------------- transactions

    def refresh_if_due(self) -> None:
        """Before a transaction: pick up journals newly matching the selector (and drop
        those that stopped matching) every `refresh_interval`, but not while a carried
        iterator holds the inputs."""
        if self._options.selector is not None and self._carry is None and (
            time.monotonic() - self._last_refresh >= self._options.refresh_interval
        ):
            self._refresh_journals()

    def begin(self, progress: ReadProgress) -> None:
        """Start reading for a new transaction, whose progress is `progress`: look for
        new data at every head again."""
        for inp in self._inputs.values():
            inp.exhausted = False
        self._txn_progress = progress

    def checkpoint(
        self, prune_horizon: timedelta | float
    ) -> tuple[dict[str, int], list[ProducerState]]:
        """The offsets and producer states the open transaction's checkpoint records;
        they become the reader's recorded positions (and `dirty` is cleared).

        Mid upstream transaction (split_upstream), the last message handled counts as
        processed: a resumed Sequencer replays the rest of that transaction after it."""
        seq = self._seq
        assert seq is not None
        offsets, states = seq.checkpoint(prune_horizon, dequeued_processed=self._carry is not None)
        positions = {**self._positions, **offsets}
        self._positions = dict(positions)
        self._dirty = False
        return positions, states

    def _refresh_journals(self) -> None:
        """Pick up journals newly matching the selector (and drop ones that stopped matching)."""
        self._last_refresh = time.monotonic()
        journals = self.discover()
        wanted = set(journals)
        for journal in [j for j in self._inputs if j not in wanted]:
            self._inputs.pop(journal).close()
        for journal in journals:
            if journal not in self._inputs:
                offset = self.positions().get(journal)
                if offset is None:
                    offset = self._positions[journal] = self.start_offset(journal)
                    self._dirty = True
                self._inputs[journal] = _Input(journal, offset)

    def fill(self, txn: Transaction, handler: Callable[[Envelope, Transaction], None]) -> bool:
        """Read and hand committed messages to `handler` until the transaction (begun with
        `begin`) is full or the input is idle; returns True if idle."""
        progress = self._txn_progress
        assert progress is not None
        stage = self._stages.hook
        if stage is not None:
            user_handler = handler

            def handler(env: Envelope, txn: Transaction) -> None:
                stage("handler")
                user_handler(env, txn)

        max_messages = self._options.max_messages
        deadline = progress.deadline
        clock = time.monotonic
        seq = self._seq
        assert seq is not None
        split = self._options.split_upstream
        it, self._carry = self._carry, None
        if it is None:
            it = seq.sequence(self._feed(progress), self._replay)
        for env in it:
            if (env._ids or env.ids)[2] == _ACK_TXN:  # parsed already by the Sequencer
                continue  # acknowledgements commit others; they are not delivered
            handler(env, txn)
            txn.messages += 1
            if txn.messages >= max_messages or clock() >= deadline:
                progress.closing = True
                if split:
                    # End here, even mid upstream transaction: `env` is dequeued, and the
                    # checkpoint counts it as processed; the next transaction resumes `it`.
                    self._carry = it
                    return progress.idle
        return progress.idle

    def fill_batches(
        self, txn: Transaction, handler: Callable[[list[Envelope], Transaction], None]
    ) -> bool:
        """`fill` for a batch handler: round robin over the inputs, each time sequencing up
        to `read_batch` read-uncommitted envelopes of one input at once (`Sequencer.committed`,
        the reader's fast path) and handing the committed ones, if any, to the handler.
        Returns True if the input went idle.

        Invariant: after each `committed()` call every envelope of the slice has been
        queued and every sequence it committed fully stepped, so the Sequencer is between
        sequences and a checkpoint may be taken; a batch is therefore never split across
        two transactions. A slice holds at most `max_messages - txn.messages` envelopes
        (committed outputs can still exceed it when an ACK commits messages read earlier:
        `max_messages` is a bound on reading, as in the per-message mode).
        """
        progress = self._txn_progress
        assert progress is not None
        stage = self._stages.hook
        seq = self._seq
        assert seq is not None
        inputs = list(self._inputs.values())
        limit = self._options.read_batch
        max_messages = self._options.max_messages
        clock = time.monotonic
        replay = self._replay
        split = self._options.split_upstream
        stop = self._stop

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
                    progress.closing = True
            return progress.closing

        carry, self._carry = self._carry, None
        if carry is not None and handle(carry):
            return progress.idle
        while True:
            progressed = False
            for inp in inputs:
                if progress.closing or stop.requested or (
                    progressed and clock() >= progress.deadline
                ):
                    progress.closing = True
                    return progress.idle
                if inp.exhausted:
                    continue
                batch, pos = inp.batch, inp.pos
                if pos == len(batch):
                    if inp.batches is None:
                        inp.batches = read_uncommitted_batches(
                            self._client, inp.journal, inp.offset,
                            new_message=self._new_message, lazy=self._lazy,
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
                    return progress.idle
            if not progressed:
                progress.idle = True
                return True

    def _feed(self, progress: ReadProgress) -> Iterator[Envelope]:
        """Read-uncommitted envelopes, round robin over the inputs, `read_batch` at a time.

        It stops, without reading ahead, as soon as the transaction is closing: the
        Sequencer asks for an envelope only once its committed sequence is consumed,
        so the transaction then ends with the Sequencer between sequences. Carried into a
        later transaction (split_upstream), it follows that transaction's `ReadProgress`.
        """
        inputs = list(self._inputs.values())
        limit = self._options.read_batch
        deadline = progress.deadline
        clock = time.monotonic
        stop = self._stop
        while True:
            progressed = False
            for inp in inputs:
                if inp.exhausted:
                    continue
                if self._txn_progress is not progress:  # carried over into a new transaction
                    progress = self._txn_progress  # type: ignore[assignment]
                    deadline = progress.deadline
                n = 0
                batch, pos = inp.batch, inp.pos
                try:
                    while n < limit:
                        # The deadline is checked every 64 envelopes read (and after each
                        # message handled): a transaction always makes some progress.
                        if progress.closing or stop.requested or (
                            n and not n & 63 and clock() >= deadline
                        ):
                            progress.closing = True
                            return
                        if pos == len(batch):
                            if inp.batches is None:
                                inp.batches = read_uncommitted_batches(
                                    self._client, inp.journal, inp.offset,
                                    new_message=self._new_message, lazy=self._lazy,
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
                        if self._txn_progress is not progress:  # resumed by the next transaction
                            progress = self._txn_progress  # type: ignore[assignment]
                            deadline = progress.deadline
                finally:
                    inp.batch, inp.pos = batch, pos
                if n:
                    progressed = True
            if not progressed:
                progress.idle = True
                return

    def _replay(self, journal: str, begin: int, end: int) -> Iterable[Envelope]:
        # Exactly from `begin`: a transaction whose start was trimmed is never delivered
        # in part (OffsetNotAvailable; recovery then applies `on_trimmed`).
        return read_uncommitted(
            self._client, journal, begin, end=end, new_message=self._new_message,
            lazy=self._lazy, exact=True,
        )
