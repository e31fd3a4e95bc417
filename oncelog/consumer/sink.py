"""External transactional stores ("sinks"): outputs written to a database, exactly once
with the consumer's checkpoints. `SQLiteSink` is the SQLite implementation.

`Consumer(..., sink=SQLiteSink("/path/out.db"))` gives handlers `txn.sink`, whose
`execute(sql, params)` / `executemany(sql, rows)` *record* statements. At commit:

1. the statements are written, put-if-absent, as an object
   `<checkpoint directory>/state/<seq:016x>-<token>.ops` (after the outputs are durable,
   before the claim), and checkpoint N+1 references it (`sink`: seq, token, name);
2. once checkpoint N+1 is claimed, the statements run in ONE database transaction
   (`BEGIN IMMEDIATE`) together with the upsert of the row
   `oncelog_sink(grp, shard) = (seq N+1, token)`, and only if that row's `seq` is below
   N+1; otherwise nothing runs (already applied, or a newer commit was applied: this
   writer is a zombie) — the *fence*;
3. recovery (and a later commit's failure path) re-applies the latest checkpoint's
   statements under the same guard: a crash between claim and apply loses nothing,
   and a statement list is never applied twice.

Invariants: the database's `oncelog_sink.seq` only grows; it names the last commit whose
statements are in the database, and their effect is there exactly once. Only claimed
checkpoints' statements are ever applied. Commits are sequential per group (or shard), and
a commit is claimed only after its predecessor's statements are applied, so the database
is never more than one commit behind the checkpoints. Handlers cannot read their own
uncommitted writes (they are applied at commit): use the sink for outputs, `txn.state` /
`txn.kv` for what the handler needs to read back.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from oncelog.consumer.errors import CheckpointError, ConsumerError
from oncelog.consumer.state import object_seq, state_directory
from oncelog.coordination import new_token

if TYPE_CHECKING:
    from oncelog.journal import JournalClient

__all__ = ["OPS_FORMAT", "SINK_REF_FORMAT", "SQLiteSink", "SQLiteSinkEngine", "SinkWriter"]

SINK_REF_FORMAT = "oncelog-sink/1"
OPS_FORMAT = "oncelog-sink-ops/1"
_FENCE_TABLE = """CREATE TABLE IF NOT EXISTS oncelog_sink (
    grp TEXT NOT NULL, shard TEXT NOT NULL, seq INTEGER NOT NULL, token TEXT NOT NULL,
    PRIMARY KEY (grp, shard))"""


@dataclass(frozen=True, slots=True)
class SQLiteSink:
    """A SQLite database file as the consumer's transactional output store.

    `setup`: statements run once per connection before anything else (e.g.
    `CREATE TABLE IF NOT EXISTS ...`), outside the fenced transactions. `timeout`: seconds
    to wait for the database lock."""

    path: str
    setup: tuple[str, ...] = ()
    timeout: float = 30.0

    def open(
        self, client: JournalClient, checkpoint_directory: str, group: str, shard: int | None
    ) -> SQLiteSinkEngine:
        """The engine of one consumer instance."""
        return SQLiteSinkEngine(
            self, client, state_directory(checkpoint_directory), group, shard
        )

    def connect(self) -> sqlite3.Connection:
        """A connection to the database, with the fence table and `setup` applied."""
        db = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=self.timeout
        )
        db.execute(_FENCE_TABLE)
        for sql in self.setup:
            db.execute(sql)
        return db

    def applied(self, group: str, shard: int | None = None) -> tuple[int, str] | None:
        """The (seq, token) of the last commit applied for the group (or shard), or None."""
        db = self.connect()
        try:
            row = db.execute(
                "SELECT seq, token FROM oncelog_sink WHERE grp = ? AND shard = ?",
                (group, "" if shard is None else str(shard)),
            ).fetchone()
        finally:
            db.close()
        return None if row is None else (int(row[0]), str(row[1]))


class SinkWriter:
    """The handler's side of the sink: statements recorded for this transaction."""

    __slots__ = ("_ops",)

    def __init__(self) -> None:
        self._ops: list[tuple[str, list[Any] | dict[str, Any]]] = []

    def execute(self, sql: str, params: Any = ()) -> None:
        """Record one statement (params: a sequence or a mapping of JSON values)."""
        if not isinstance(sql, str):
            raise TypeError(f"sql must be a str, not {type(sql).__name__}")
        self._ops.append((sql, params if isinstance(params, dict) else list(params)))

    def executemany(self, sql: str, rows: Any) -> None:
        """Record one statement per row of parameters."""
        for row in rows:
            self.execute(sql, row)

    def __len__(self) -> int:
        return len(self._ops)


class SQLiteSinkEngine:
    """One consumer instance's sink: the open transaction's statements; writing them
    before the claim, applying them after it (fenced), re-applying on recovery."""

    def __init__(
        self,
        options: SQLiteSink,
        client: JournalClient,
        directory: str,
        group: str,
        shard: int | None,
    ) -> None:
        self.options = options
        self.client = client
        self.directory = directory
        self.group = group
        self.shard = "" if shard is None else str(shard)
        self.writer = SinkWriter()
        self._db: sqlite3.Connection | None = None

    def rollback(self) -> None:
        """Forget the open transaction's statements."""
        self.writer = SinkWriter()

    def prepare(self, seq: int) -> tuple[dict[str, Any] | None, bytes | None, str | None]:
        """Checkpoint `seq`'s sink reference, the ops object's bytes and its path under
        `.oncelog/` (all None if the transaction recorded nothing)."""
        writer, self.writer = self.writer, SinkWriter()
        if not writer._ops:
            return None, None, None
        token = new_token()
        name = f"{seq:016x}-{token}.ops"
        doc = {"format": OPS_FORMAT, "seq": seq, "token": token, "ops": writer._ops}
        try:
            data = orjson.dumps(doc)
        except TypeError as exc:
            raise ConsumerError(f"sink statement parameters are not JSON values: {exc}") from exc
        ref = {"format": SINK_REF_FORMAT, "seq": seq, "token": token, "name": name}
        return ref, data, f"{self.directory}/{name}"

    def load(self, ref: Any, where: str) -> bytes | None:
        """The ops object a checkpoint's sink reference names (None for no reference);
        CheckpointError naming `where` if the reference is bad or the object missing."""
        if ref is None:
            return None
        if not (
            isinstance(ref, dict)
            and ref.get("format") == SINK_REF_FORMAT
            and isinstance(ref.get("seq"), int)
            and isinstance(ref.get("name"), str)
            and object_seq(ref["name"]) == ref["seq"]
        ):
            raise CheckpointError(f"corrupt consumer checkpoint {where}: bad sink {ref!r}")
        data = self.client.meta.read(f"{self.directory}/{ref['name']}")
        if data is None:
            raise CheckpointError(
                f"consumer checkpoint {where} references sink statements"
                f" {self.directory}/{ref['name']}, which do not exist"
            )
        return data

    def apply(self, data: bytes, where: str) -> bool:
        """Run the statements of an ops object in one database transaction with the fence
        row, unless a commit at or above its seq was applied already; True if applied."""
        try:
            doc = orjson.loads(data)
            if doc.get("format") != OPS_FORMAT:
                raise ValueError(f"format {doc.get('format')!r}")
            seq, token, ops = int(doc["seq"]), str(doc["token"]), doc["ops"]
        except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{where}: corrupt sink statements: {exc}") from None
        if self._db is None:
            self._db = self.options.connect()
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute(
                "SELECT seq FROM oncelog_sink WHERE grp = ? AND shard = ?",
                (self.group, self.shard),
            ).fetchone()
            if row is not None and int(row[0]) >= seq:
                db.execute("ROLLBACK")
                return False
            for sql, params in ops:
                db.execute(sql, params)
            db.execute(
                "INSERT INTO oncelog_sink (grp, shard, seq, token) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (grp, shard) DO UPDATE SET seq = excluded.seq,"
                " token = excluded.token",
                (self.group, self.shard, seq, token),
            )
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        return True

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


def sink_object_names(ref: Any) -> set[str]:
    """The ops object a checkpoint's sink reference names (for pruning)."""
    if isinstance(ref, dict) and ref.get("format") == SINK_REF_FORMAT:
        name = ref.get("name")
        if isinstance(name, str):
            return {name}
    return set()
