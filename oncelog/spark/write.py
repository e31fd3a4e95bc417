"""Transactional writes: `df.write.format("oncelog")` and `df.writeStream.format("oncelog")`.

Each task attempt publishes its rows *uncommitted* (CONTINUE_TXN) under a producer
ID of its own and returns, in its commit message, the ACK intents that would commit
them and the rollback intents that would discard them. Only the driver's job commit
appends ACKs, so a failed, retried or speculative attempt never becomes visible:
its messages stay unacknowledged. An aborted job appends the rollbacks of the
attempts that finished.

A streaming write does the same per micro-batch, and first records the batch's ACK
intents under `<store>/.oncelog/spark/writers/<writer_id>/batches/` only if absent.
A batch id already recorded (a micro-batch replayed after a driver failure) is not
committed again: its recorded intents are re-appended (harmless if already there),
and the replay's own messages are rolled back.

Rows become JSON documents (one key per column; `uuid_field` is set by the
publisher) for `application/x-ndjson` journals, or CSV records (the UUID, then the
columns) for `text/csv` journals. A target is one `journal`, or the journals of
`selector` with each row mapped by its `key` column (modulo or rendezvous, as
Gazette maps).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from oncelog.framing import CONTENT_TYPE_CSV, CONTENT_TYPE_JSON_LINES, for_content_type
from oncelog.journal import JournalClient, JournalSpec
from oncelog.labels import CONTENT_TYPE
from oncelog.mapping import modulo, rendezvous
from oncelog.message import CSVRecord, Flags, JSONMessage, build_uuid, get_clock
from oncelog.publisher import Publisher
from oncelog.spark.options import OptionError, WriteOptions

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = [
    "TaskCommit",
    "OncelogBatchWriter",
    "OncelogStreamWriter",
    "write_targets",
    "batch_record_path",
]

Intent = tuple[str, bytes]
"""A framed ACK_TXN message and the journal it goes to."""


@dataclass
class TaskCommit(WriterCommitMessage):
    """What one task attempt published: its producer, ACK and rollback intents, row count."""

    producer: str
    acks: list[Intent] = field(default_factory=list)
    rollbacks: list[Intent] = field(default_factory=list)
    rows: int = 0


def write_targets(client: JournalClient, options: WriteOptions) -> list[JournalSpec]:
    """The target journals (by name), checked to share one writable content type."""
    if options.journals:
        specs = sorted((client.get(name) for name in set(options.journals)), key=lambda s: s.name)
    else:
        specs = sorted(client.list(options.selector), key=lambda s: s.name)
        if not specs:
            raise OptionError(f"no journal matches selector {options.selector!r} to write to")
    kinds = {_content_type(s) for s in specs}
    if len(kinds) != 1:
        raise OptionError(
            f"target journals have different content types {sorted(kinds)}: write to one kind"
        )
    kind = kinds.pop()
    if kind not in (CONTENT_TYPE_JSON_LINES, CONTENT_TYPE_CSV):
        raise OptionError(
            f"journal {specs[0].name!r} has content type {kind!r}: Spark writes "
            f"{CONTENT_TYPE_JSON_LINES} or {CONTENT_TYPE_CSV} journals"
        )
    return specs


def _content_type(spec: JournalSpec) -> str:
    return spec.content_type.split(";", 1)[0].strip().lower()


def batch_record_path(writer_id: str, batch_id: int) -> str:
    """Where a streaming writer records a committed micro-batch (under `.oncelog/`)."""
    return f"spark/writers/{writer_id}/batches/{batch_id:020d}.json"


def _json_ready(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Decimals as exact strings; binary columns are refused (JSON has no bytes)."""
    columns, changed = [], False
    for name, col in zip(batch.schema.names, batch.columns):
        if pa.types.is_decimal(col.type):
            col, changed = col.cast(pa.string()), True
        elif pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
            raise OptionError(
                f"column {name!r} is binary, which JSON cannot hold: cast it to a string first"
            )
        columns.append(col)
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names) if changed else batch


class _TaskPublisher:
    """Publishes one task attempt's rows uncommitted and builds its commit message."""

    def __init__(
        self, options: WriteOptions, columns: Sequence[str], targets: Sequence[JournalSpec]
    ) -> None:
        self.options = options
        self.columns = list(columns)
        self.client = options.store.open()
        self.publisher = Publisher(self.client)
        self.content_type = _content_type(targets[0])
        self.framing = for_content_type(self.content_type)
        self._first_clock: dict[str, int] = {}
        self._ack_template: dict[str, Any] = {}
        self.rows = 0
        if options.key is None:
            target = (targets[0].name, targets[0].content_type)
            self.mapping: Callable[[Any], tuple[str, str]] = lambda _msg: target
        else:
            # Journals without a content-type label are JSON lines: say so to the mapping.
            parts = tuple(
                JournalSpec(t.name, labels=t.labels.set(CONTENT_TYPE, t.content_type))
                for t in targets
            )
            pick = modulo if options.mapping == "modulo" else rendezvous
            self.mapping = pick(self._key_function(options.key), lambda: parts)

    def _key_function(self, column: str) -> Callable[[Any], str]:
        if self.content_type == CONTENT_TYPE_CSV:
            index = self.columns.index(column) + 1  # after the UUID
            return lambda msg: msg.fields[index]

        def json_key(msg: JSONMessage) -> str:
            value = msg.doc.get(column)
            return "" if value is None else str(value)

        return json_key

    def publish(self, batches: Iterator[pa.RecordBatch]) -> TaskCommit:
        csv = self.content_type == CONTENT_TYPE_CSV
        uuid_field = self.options.uuid_field
        try:
            for batch in batches:
                if csv:
                    rows = zip(*(col.to_pylist() for col in batch.columns))
                    messages: Iterator[Any] = (
                        CSVRecord([""] + ["" if v is None else str(v) for v in row]) for row in rows
                    )
                else:
                    docs = _json_ready(batch).to_pylist()
                    messages = (JSONMessage(doc, uuid_field) for doc in docs)
                for msg in messages:
                    self._publish(msg)
            self.publisher.flush()
            acks = [(i.journal, i.intent) for i in self.publisher.build_ack_intents()]
            return TaskCommit(self.publisher.producer_id.hex(), acks, self._rollbacks(), self.rows)
        finally:
            self.client.close()

    def _publish(self, msg: Any) -> None:
        journal, content_type = self.mapping(msg)
        self.publisher.publish_uncommitted(lambda _m: (journal, content_type), msg)
        self.rows += 1
        if journal not in self._first_clock:
            self._first_clock[journal] = get_clock(msg.get_uuid())
            self._ack_template[journal] = msg.new_acknowledgement(journal)

    def _rollbacks(self) -> list[Intent]:
        """ACKs at the clock before each journal's first message: they discard them all."""
        out = []
        for journal, first in self._first_clock.items():
            ack = self._ack_template[journal]
            ack.set_uuid(build_uuid(self.publisher.producer_id, first - 1, Flags.ACK_TXN))
            out.append((journal, self.framing.marshal(ack)))
        return out


def append_intents(client: JournalClient, intents: Sequence[Intent]) -> None:
    """Append intents, one append per journal (so each journal's are atomic), and wait."""
    by_journal: dict[str, list[bytes]] = {}
    for journal, intent in intents:
        by_journal.setdefault(journal, []).append(intent)
    pending = []
    for journal, frames in sorted(by_journal.items()):
        append = client.start_append(journal)
        try:
            append.write(b"".join(frames))
        finally:
            append.release()
        pending.append(append)
    for append in pending:
        append.result()


def _check_key(options: WriteOptions, schema: StructType) -> None:
    if options.key is not None and options.key not in schema.names:
        raise OptionError(f"key column {options.key!r} is not a column of {schema.names}")


def _messages(messages: Sequence[WriterCommitMessage | None]) -> list[TaskCommit]:
    return [m for m in messages if isinstance(m, TaskCommit)]


class _PublishingWriter:
    """What the batch and stream writers share: checked options, and tasks that publish
    their rows uncommitted."""

    def __init__(
        self, options: WriteOptions, schema: StructType, targets: list[JournalSpec]
    ) -> None:
        _check_key(options, schema)
        self.options = options
        self.schema = schema
        self.targets = targets

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskCommit:
        return _TaskPublisher(self.options, self.schema.names, self.targets).publish(iterator)


class OncelogBatchWriter(_PublishingWriter, DataSourceArrowWriter):
    """`df.write.format("oncelog")`: tasks publish uncommitted, the job commit acknowledges."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        with self.options.store.open() as client:
            append_intents(client, [a for m in _messages(messages) for a in m.acks])

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        with self.options.store.open() as client:
            append_intents(client, [r for m in _messages(messages) for r in m.rollbacks])


class OncelogStreamWriter(_PublishingWriter, DataSourceStreamArrowWriter):
    """`df.writeStream.format("oncelog")`: the batch writer's protocol per micro-batch, with
    each committed batch id recorded so a replayed micro-batch is not committed twice."""

    def __init__(
        self, options: WriteOptions, schema: StructType, targets: list[JournalSpec]
    ) -> None:
        if not options.writer_id:
            raise OptionError(
                "option 'writer_id' is required for streaming writes: a stable name of this "
                "query's output, under which committed micro-batches are recorded"
            )
        super().__init__(options, schema, targets)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        tasks = _messages(messages)
        acks = [a for m in tasks for a in m.acks]
        record = orjson.dumps(
            {
                "batch": batchId,
                "acks": [[j, base64.b64encode(i).decode("ascii")] for j, i in acks],
            }
        )
        path = batch_record_path(self.options.writer_id or "", batchId)
        with self.options.store.open() as client:
            if client.put_if_absent(path, record):
                append_intents(client, acks)
                return
            # A replay of a committed batch: finish that commit, discard this attempt.
            stored = orjson.loads(client.read_object(path) or b"{}")
            recorded = [(j, base64.b64decode(i)) for j, i in stored.get("acks", ())]
            append_intents(client, recorded + [r for m in tasks for r in m.rollbacks])

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        with self.options.store.open() as client:
            append_intents(client, [r for m in _messages(messages) for r in m.rollbacks])
