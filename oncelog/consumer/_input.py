"""Input reading of a consumer: the group's journals read uncommitted, round robin,
sequenced (read committed) and handed to the handler, within one transaction's limits.

Invariant: a transaction ends with the Sequencer between committed sequences (a checkpoint
may be taken), except with `split_upstream`, where it may end inside one: the suspended
sequencing iterator is then kept in `_carry` and resumed by the next transaction.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import TYPE_CHECKING

from oncelog.consumer._base import ConsumerBase
from oncelog.message import ACK_TXN as _ACK_TXN
from oncelog.message import Envelope
from oncelog.reading import read_uncommitted, read_uncommitted_batches

if TYPE_CHECKING:
    from oncelog.consumer.core import Transaction

__all__ = ["InputReading"]


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


class InputReading(ConsumerBase):
    """The reading part of a `Consumer` (from the thread calling `run()` only)."""

    def _fill(self, txn: Transaction) -> None:
        """Read and handle committed messages until the transaction is full or input is idle."""
        handler = self._handler
        assert handler is not None
        if self._on_stage is not None:
            user_handler, stage = handler, self._on_stage

            def handler(env: Envelope, txn: Transaction) -> None:
                stage("handler")
                user_handler(env, txn)

        max_messages = self._options.max_messages
        deadline = txn.deadline
        clock = time.monotonic
        seq = self._seq
        assert seq is not None
        split = self._options.split_upstream
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
        limit = self._options.read_batch
        max_messages = self._options.max_messages
        clock = time.monotonic
        replay = self._replay
        split = self._options.split_upstream

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
                            lazy=self._lazy,
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
        limit = self._options.read_batch
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
        # Exactly from `begin`: a transaction whose start was trimmed is never delivered
        # in part (OffsetNotAvailable; recovery then applies `on_trimmed`).
        return read_uncommitted(
            self.client, journal, begin, end=end, new_message=self._new_message,
            lazy=self._lazy, exact=True,
        )
