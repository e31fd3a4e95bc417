"""Streaming reads: `spark.readStream.format("oncelog")`, exactly once across restarts.

An offset records, per journal, the byte offset read through and the producer
states a Sequencer needs to carry on from there (a transaction open at the offset,
the last ACK of each producer for de-duplication). `latestOffset` sequences the new
bytes on the driver to find the next offset and its states; each micro-batch task
then re-reads its journal's range with a Sequencer restored from the start offset's
states, so a batch replayed after a failure yields exactly the same rows. A
transaction that an ACK in a later batch commits is delivered in that batch, its
messages replayed from the journal. Journals matching the selector are picked up
as they appear, from their beginning.

Offsets are canonical JSON (sorted keys, states sorted by producer): Spark compares
them as strings.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from oncelog.framing import set_gc_pausing
from oncelog.journal import JournalClient
from oncelog.message import Envelope
from oncelog.reading import read_uncommitted
from oncelog.sequencer import ProducerState, Sequencer
from oncelog.spark.batches import decoder_for, new_message_factory
from oncelog.spark.options import ReadOptions
from oncelog.spark.read import sequential_batches, uncommitted_batches
from oncelog.spark.schema import arrow_schema, check_schema

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

__all__ = [
    "OncelogStreamReader",
    "StreamPartition",
    "JournalOffset",
    "encode_offset",
    "decode_offset",
]


@dataclass(frozen=True, slots=True)
class JournalOffset:
    """Where a stream has read one journal through, and its producers' states there."""

    offset: int
    states: tuple[tuple[str, int, int], ...] = ()
    """(producer hex, last ACK clock, begin of its open transaction or -1), by producer."""

    def sequencer_states(self, journal: str) -> list[ProducerState]:
        return [
            ProducerState(journal, bytes.fromhex(p), last, begin)
            for p, last, begin in self.states
        ]


def encode_offset(journals: dict[str, JournalOffset]) -> dict[str, Any]:
    """The canonical JSON-ready form of a stream offset."""
    return {
        "journals": {
            name: {"offset": jo.offset, "states": [list(s) for s in sorted(jo.states)]}
            for name, jo in sorted(journals.items())
        }
    }


def decode_offset(offset: dict[str, Any] | None) -> dict[str, JournalOffset]:
    """Inverse of `encode_offset`; ValueError naming what is wrong."""
    if not offset:
        return {}
    try:
        return {
            name: JournalOffset(
                int(jo["offset"]),
                tuple((str(p), int(last), int(begin)) for p, last, begin in jo.get("states", ())),
            )
            for name, jo in offset["journals"].items()
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not an oncelog stream offset: {offset!r} ({exc})") from None


@dataclass(frozen=True)
class StreamPartition(InputPartition):
    """One journal's part of a micro-batch: `[begin, end)` and the states at `begin`."""

    journal: str
    content_type: str
    begin: int
    end: int
    states: tuple[tuple[str, int, int], ...]


class OncelogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of journals' committed (or all) messages; see the module docs."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        check_schema(schema)
        self.options = options
        self.schema = schema
        self._target: dict[str, int] | None = None

    # -- offsets (driver) --------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        return encode_offset({})

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_messages_per_trigger:
            return ReadMaxRows(self.options.max_messages_per_trigger)
        if self.options.max_bytes_per_trigger:
            return ReadMaxBytes(self.options.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        client = self.options.store.open()
        try:
            specs = self.options.list_journals(client)
            self._target = {s.name: client.head(s.name) for s in specs}
        finally:
            client.close()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        options = self.options
        previous = decode_offset(start)
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        size = limit.max_bytes if isinstance(limit, ReadMaxBytes) else None
        out: dict[str, JournalOffset] = {}
        client = options.store.open()
        try:
            ready: list[tuple[str, str, JournalOffset, int]] = []
            for spec in options.list_journals(client):
                name = spec.name
                if self._target is not None and name not in self._target:
                    continue  # created after Trigger.AvailableNow fixed its target
                prev = out[name] = previous.get(name, JournalOffset(0))
                head = client.head(name)
                if self._target is not None:
                    head = min(head, self._target[name])
                if head > prev.offset:
                    ready.append((name, spec.content_type, prev, head))
            # A limit is shared out evenly among the journals with new data (rotating, so
            # that none waits forever when there are more journals than the limit).
            turn = sum(jo.offset for jo in previous.values()) % len(ready) if ready else 0
            ready = ready[turn:] + ready[:turn]
            for i, (name, content_type, prev, head) in enumerate(ready):
                row_share = None if rows is None else _share(rows, len(ready), i)
                byte_share = None if size is None else _share(size, len(ready), i)
                if row_share == 0 or byte_share == 0:
                    continue
                out[name] = self._advance(
                    client, name, content_type, prev, head, row_share, byte_share
                )
        finally:
            client.close()
        return encode_offset(out)

    def _advance(
        self,
        client: JournalClient,
        journal: str,
        content_type: str,
        prev: JournalOffset,
        head: int,
        rows: int | None,
        size: int | None,
    ) -> JournalOffset:
        """The offset after reading `journal` from `prev` up to `head` within the limits."""
        options = self.options
        if rows is None and size is None and not options.committed:
            return JournalOffset(head)
        new_message = new_message_factory(options, content_type, journal)
        envelopes = read_uncommitted(
            client, journal, prev.offset, end=head, new_message=new_message
        )
        counted = _Counted(envelopes, prev.offset, size)
        limited: Iterable[Envelope] = counted if rows is None else islice(counted, rows)
        try:
            if not options.committed:
                for _ in limited:
                    pass
                return JournalOffset(counted.end)
            seq = Sequencer({journal: prev.offset}, prev.sequencer_states(journal))

            def replay(j: str, begin: int, end: int) -> Iterable[Envelope]:
                return read_uncommitted(
                    client, j, begin, end=end, new_message=new_message, exact=True
                )

            for _ in seq.sequence(limited, replay):
                pass
        finally:
            envelopes.close()
        offsets, states = seq.checkpoint(options.prune_horizon)
        end = offsets.get(journal, prev.offset)
        kept = tuple(
            sorted((s.producer.hex(), s.last_ack, s.begin) for s in states if s.journal == journal)
        )
        return JournalOffset(end, kept)

    # -- micro-batches (driver plans, executors read) ------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        first, last = decode_offset(start), decode_offset(end)
        moved = {
            n: jo for n, jo in last.items() if jo.offset > first.get(n, JournalOffset(0)).offset
        }
        if not moved:
            return []
        client = self.options.store.open()
        try:
            content_types = {n: client.get(n).content_type for n in moved}
        finally:
            client.close()
        return [
            StreamPartition(
                name, content_types[name], first.get(name, JournalOffset(0)).offset, jo.offset,
                first.get(name, JournalOffset(0)).states,
            )
            for name, jo in sorted(moved.items())
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, StreamPartition):
            return  # Spark's stand-in partition when there is nothing to read
        # Spark's Python worker is a process this data source owns: bulk decoding may pause
        # its collector (see oncelog.framing.set_gc_pausing).
        set_gc_pausing(True)
        options = self.options
        arrow = arrow_schema(self.schema)
        client = options.store.open()
        try:
            decoder = decoder_for(
                client, options, partition.journal, partition.content_type,
                arrow.field("message").type,
            )
            if not options.committed:
                yield from uncommitted_batches(
                    decoder, partition.begin, partition.end, arrow, options.batch_rows
                )
                return
            start = JournalOffset(partition.begin, partition.states)
            seq = Sequencer(
                {partition.journal: partition.begin}, start.sequencer_states(partition.journal)
            )
            yield from sequential_batches(
                decoder, partition.begin, partition.end, arrow, seq, options.batch_rows
            )
        finally:
            client.close()

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: every offset holds all that is needed to resume from it."""


def _share(total: int, parts: int, index: int) -> int:
    """The `index`-th of `parts` near-equal shares of `total`."""
    return total // parts + (1 if index < total % parts else 0)


class _Counted:
    """Envelopes until `max_bytes` past `begin` (at least one), counting rows and the end."""

    def __init__(self, envelopes: Iterable[Envelope], begin: int, max_bytes: int | None) -> None:
        self._it = iter(envelopes)
        self._limit = None if max_bytes is None else begin + max_bytes
        self.end = begin
        self.rows = 0

    def __iter__(self) -> Iterator[Envelope]:
        for env in self._it:
            if self._limit is not None and self.rows and env.end > self._limit:
                return
            self.rows += 1
            self.end = env.end
            yield env
