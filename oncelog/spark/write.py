"""Transactional writes: `df.write.format("oncelog")` and `df.writeStream.format("oncelog")`.

Each task attempt publishes its rows *uncommitted* (CONTINUE_TXN) under a producer
ID of its own and returns, in its commit message, the ACK intents that would commit
them and the rollback intents that would discard them. Only the driver's job commit
appends ACKs, so a failed, retried or speculative attempt never becomes visible:
its messages stay unacknowledged. An aborted job appends the rollbacks of the
attempts that finished. Task producers never publish again, so an ACK of theirs may
be appended any number of times: that is what lets anyone finish a recorded commit.

A job commit over several journals is atomic through a durable transaction record
(`oncelog.transactions`), stored before the first ACK:

- with option `write_id` (and `write_version`), the record of that write,
  `.oncelog/txns/writes/<write id>/<version>.json`, created only if absent and kept
  (`commit_once`). A rerun of the same write finds it, appends ITS ACKs again (which
  finishes a commit a dead driver cut short) and rolls back its own rows: nothing is
  ever committed twice.
- without, a pending record (`.oncelog/txns/pending/`), retired once the ACKs are in;
  a driver that dies before that leaves it for `oncelog txns recover`
  (`recover_pending`) to roll forward.

A streaming write does the same per micro-batch with `commit_once` records under
`<store>/.oncelog/spark/writers/<writer_id>/batches/`: a batch id already recorded
(a micro-batch replayed after a driver failure) is not committed again: its recorded
intents are re-appended, and the replay's own messages are rolled back.

If a job commit fails after its record was stored, Spark calls `abort`: the commit is
decided by then, so abort rolls it forward instead of rolling anything back (a
rollback would discard the rows of the journals not yet acknowledged for good).

Rows become JSON documents (one key per column; `uuid_field` is set by the
publisher) for `application/x-ndjson` journals, or CSV records (the UUID, then the
columns) for `text/csv` journals. A target is one `journal`, or the journals of
`selector` with each row mapped by its `key_column` column (modulo or rendezvous, as
Gazette maps).
"""

from __future__ import annotations

import base64
import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from oncelog import transactions
from oncelog.framing import CONTENT_TYPE_CSV, CONTENT_TYPE_JSON_LINES, for_content_type
from oncelog.journal import JournalClient, JournalSpec
from oncelog.labels import CONTENT_TYPE
from oncelog.mapping import modulo, rendezvous
from oncelog.message import CSVRecord, Flags, JSONMessage, build_uuid, get_clock
from oncelog.publisher import AckIntent, Publisher
from oncelog.spark.options import OptionError, WriteOptions
from oncelog.transactions import TransactionRecord, TransactionRecordError

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = [
    "OncelogBatchWriter",
    "OncelogStreamWriter",
    "TaskCommit",
    "ack_intents",
    "batch_record_path",
    "write_targets",
]

log = logging.getLogger(__name__)

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
        if options.key_column is None:
            target = (targets[0].name, targets[0].content_type)
            self.mapping: Callable[[Any], tuple[str, str]] = lambda _msg: target
        else:
            # Journals without a content-type label are JSON lines: say so to the mapping.
            parts = tuple(
                JournalSpec(t.name, labels=t.labels.set(CONTENT_TYPE, t.content_type))
                for t in targets
            )
            pick = modulo if options.mapping == "modulo" else rendezvous
            self.mapping = pick(self._key_function(options.key_column), lambda: parts)

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


def ack_intents(intents: Iterable[Intent]) -> list[AckIntent]:
    """The intents merged into one per journal, sorted by journal: each journal's ACKs (or
    rollbacks) of a job then land in one append, atomically, and equal job outputs give
    equal lists (what tells a commit's own record from another's)."""
    by_journal: dict[str, list[bytes]] = {}
    for journal, intent in intents:
        by_journal.setdefault(journal, []).append(intent)
    return [AckIntent(j, b"".join(frames)) for j, frames in sorted(by_journal.items())]


def _auto_producer(acks: Sequence[AckIntent]) -> bytes:
    """The producer ID naming the pending record of a job commit without a write id:
    derived from the ACKs (unique, since each task attempt has a random producer ID), so
    that `abort` finds the record its failed `commit` may have stored."""
    digest = hashlib.sha256()
    for ack in acks:
        digest.update(ack.journal.encode() + b"\0" + len(ack.intent).to_bytes(8, "big"))
        digest.update(ack.intent)
    producer = bytearray(digest.digest()[:6])
    producer[0] |= 0x01  # the multicast bit, as every producer ID has
    return bytes(producer)


def _read_own_record(
    client: JournalClient, path: str, acks: Sequence[AckIntent]
) -> TransactionRecord | None:
    """The record at `path` if it holds exactly `acks` (this job's commit), else None."""
    try:
        record = transactions.read_record(client, path)
    except TransactionRecordError:
        return None  # a stream record of the earlier layout: never this job's
    if record is None or record.intents != list(acks):
        return None
    return record


def _messages(messages: Sequence[WriterCommitMessage | None]) -> list[TaskCommit]:
    return [m for m in messages if isinstance(m, TaskCommit)]


class _PublishingWriter:
    """What the batch and stream writers share: checked options, and tasks that publish
    their rows uncommitted."""

    def __init__(
        self, options: WriteOptions, schema: StructType, targets: list[JournalSpec]
    ) -> None:
        resolved = options.resolve(schema.names)
        if resolved.store != options.store:
            # `key` turned out to be the store's access key: list the targets with it.
            with resolved.store.open() as client:
                targets = write_targets(client, resolved)
        self.options = resolved
        self.schema = schema
        self.targets = targets

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskCommit:
        return _TaskPublisher(self.options, self.schema.names, self.targets).publish(iterator)


def _acks(tasks: Sequence[TaskCommit]) -> list[AckIntent]:
    return ack_intents(a for m in tasks for a in m.acks)


def _rollbacks(tasks: Sequence[TaskCommit]) -> list[AckIntent]:
    return ack_intents(r for m in tasks for r in m.rollbacks)


class OncelogBatchWriter(_PublishingWriter, DataSourceArrowWriter):
    """`df.write.format("oncelog")`: tasks publish uncommitted, the job commit acknowledges
    every journal after storing a transaction record (see the module docstring)."""

    @property
    def record_path(self) -> str | None:
        """Where the record of this write goes (under `.oncelog/`), with a write id."""
        if self.options.write_id is None:
            return None
        return transactions.write_record_path(self.options.write_id, self.options.write_version)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        tasks = _messages(messages)
        acks = _acks(tasks)
        with self.options.store.open() as client:
            path = self.record_path
            if path is not None:
                if not transactions.commit_once(client, path, acks):
                    # Committed before (fully, or cut short and finished just now by
                    # commit_once): this run's own rows must not be committed too.
                    log.warning(
                        "write id %r version %d was committed before (record .oncelog/%s): "
                        "its commit is finished and this run's rows are discarded",
                        self.options.write_id,
                        self.options.write_version,
                        path,
                    )
                    transactions.append_intents(client, _rollbacks(tasks))
            elif len(acks) <= 1:
                transactions.append_intents(client, acks)  # one journal: one atomic append
            else:
                _commit_pending(client, acks)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        tasks = _messages(messages)
        acks = _acks(tasks)
        with self.options.store.open() as client:
            path = self.record_path
            if path is not None:
                own = _read_own_record(client, path, acks)
                if own is not None:  # a failed commit stored its record: it is decided
                    transactions.append_intents(client, own.intents)
                    return
            elif len(acks) > 1:
                producer = _auto_producer(acks)
                pending = _read_own_record(client, transactions.pending_path(producer, 0), acks)
                if pending is not None:
                    transactions.recover_pending(client, [pending])
                    return
            transactions.append_intents(client, _rollbacks(tasks))


def _commit_pending(client: JournalClient, acks: list[AckIntent]) -> None:
    """Commit over several journals without a write id: a pending record, the ACKs, then
    the settle marker and retirement. A driver dying in between leaves the record for
    `oncelog txns recover` (which re-appends the ACKs: harmless, as task producers never
    publish again)."""
    record = TransactionRecord("spark-write", acks, _auto_producer(acks), 0)
    record = transactions.write_pending(client, record)
    transactions.append_intents(client, acks)
    try:
        # Losing the settle race means a recoverer is rolling the record forward (and
        # retires it): nothing is left to do here.
        if transactions.settle(client, record, "spark"):
            transactions.retire(client, record)
    except Exception as exc:  # noqa: BLE001 - committed; the record is only left over
        log.warning("retiring transaction record .oncelog/%s failed: %s", record.path, exc)


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
        if options.write_id is not None:
            raise OptionError(
                "option 'write_id' is for batch writes: a stream's micro-batches are recorded "
                "under its 'writer_id' and batch ids"
            )
        super().__init__(options, schema, targets)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        tasks = _messages(messages)
        path = batch_record_path(self.options.writer_id or "", batchId)
        with self.options.store.open() as client:
            try:
                fresh = transactions.commit_once(client, path, _acks(tasks))
            except TransactionRecordError:
                # A record of the earlier layout: finish that commit the same way.
                transactions.append_intents(client, _legacy_batch_record(client, path))
                fresh = False
            if not fresh:
                # A replay of a committed batch (now finished): discard this attempt.
                transactions.append_intents(client, _rollbacks(tasks))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        tasks = _messages(messages)
        acks = _acks(tasks)
        path = batch_record_path(self.options.writer_id or "", batchId)
        with self.options.store.open() as client:
            own = _read_own_record(client, path, acks)
            if own is not None:  # a failed commit stored its record: it is decided
                transactions.append_intents(client, own.intents)
                return
            transactions.append_intents(client, _rollbacks(tasks))


def _legacy_batch_record(client: JournalClient, path: str) -> list[AckIntent]:
    """The ACK intents of a micro-batch record in the layout of oncelog before transaction
    records (`{"batch": id, "acks": [[journal, base64], ...]}`)."""
    try:
        doc = orjson.loads(client.meta.read(path) or b"")
        return [AckIntent(str(j), base64.b64decode(i, validate=True)) for j, i in doc["acks"]]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise TransactionRecordError(
            f"micro-batch record .oncelog/{path} is corrupt: {type(exc).__name__}: {exc}"
        ) from None
