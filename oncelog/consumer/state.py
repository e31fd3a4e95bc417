"""Pluggable consumer state: JSON inside the checkpoint (the default), or an embedded SQLite
key-value store whose commit cost is O(keys changed).

`Consumer(..., state="json")` keeps today's behaviour: `txn.state` is any JSON value,
written whole into every checkpoint (commit cost O(state size)).

`Consumer(..., state=SQLiteState(snapshot_every=K))` keeps the state in an in-memory SQLite
database that handlers use through `txn.kv` (`get`, `put`, `delete`, ...). Each commit
writes the keys its transaction changed as a *delta* object; the checkpoint references the
latest *snapshot* (the whole database file) and the deltas after it, so recovery is "load
the snapshot, apply the deltas" (at most K-1). Snapshots are written off the commit's
critical path: the commit whose reference reaches K-1 deltas serializes the database and
writes it on a thread of its own, and the next commit's checkpoint references it (with
only its own delta after it) once it is durable (`BackgroundWrite`). With K=1 every commit
writes a snapshot instead of a delta, in line.

Exactly once with the checkpoint, on any store:

- the objects live in `<root>/.oncelog/<checkpoint directory>/state/`, named
  `<seq:016x>-<token>.delta` / `.sqlite` by the number of the checkpoint that first
  references them and a random token (so a zombie's or a failed attempt's objects never
  collide with anyone's); they are written with `put_if_absent` and durable *before* the
  checkpoint is claimed (a background snapshot too: the commit waits for it), and only a
  claimed checkpoint makes them part of the group's state;
- a checkpoint's reference names the snapshot and every delta after it, in order;
  checkpoint N+1's reference is N's plus its own delta (or just a new snapshot);
- pruning deletes a state object only if no kept checkpoint references it and its number
  is below the oldest kept checkpoint's: anything a later checkpoint may reference is
  either referenced by the newest checkpoint (which is kept) or numbered above it.

Integrity: every state object is checked when recovery reads it, and anything wrong is a
CheckpointError naming the object's storage path, never a different state. A snapshot's
CRC-32C is recorded in the reference that names it (`snapshot_crc32c`, inside the
checkpoint, whose state has a checksum of its own); a delta ends with its own CRC-32C (a
last member `"crc32c"`, over the object's bytes before it). Objects written before these
checksums existed (no `snapshot_crc32c` in the reference, no `crc32c` in the delta) are
still read: such a snapshot gets SQLite's `PRAGMA integrity_check` instead.

Invariant of the local database: `SQLiteStateEngine.local_ref` names (by the token of its
last object) the state the database holds outside the open transaction; recovery
rebuilds the database from the store unless the recovered checkpoint references exactly
that state. A transaction's writes go into one SQLite transaction, rolled back when the
consumer transaction aborts, and committed (locally) when its checkpoint is prepared.
"""

from __future__ import annotations

import os
import re
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import crc32c
import orjson

from oncelog.consumer._paths import display_path
from oncelog.consumer.errors import CheckpointError, ConsumerError, StateObjectMissing
from oncelog.coordination import new_token

if TYPE_CHECKING:
    from oncelog.journal import JournalClient

__all__ = [
    "BackgroundWrite",
    "DELTA_FORMAT",
    "KV",
    "STATE_REF_FORMAT",
    "SQLiteState",
    "SQLiteStateEngine",
    "StateObjectMissing",
    "is_sqlite_ref",
    "state_directory",
    "state_object_names",
]

STATE_REF_FORMAT = "oncelog-sqlite-state/1"
DELTA_FORMAT = "oncelog-sqlite-delta/1"
_OBJECT_NAME = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{32})\.(delta|sqlite|ops)$")
_MISSING = object()
_SEAL = re.compile(rb',"crc32c":"([0-9a-f]{8})"\}\Z')


def checksum(data: bytes) -> str:
    """The CRC-32C of `data`, as the 8 hex digits stored with state objects."""
    return f"{crc32c.crc32c(data):08x}"


def seal(doc: bytes) -> bytes:
    """A JSON object's bytes with its CRC-32C appended as a last member `"crc32c"` (over
    the bytes of the object without it), so a reader can check the exact bytes written."""
    if not (doc.startswith(b"{") and doc.endswith(b"}")) or doc == b"{}":
        raise ValueError("seal() takes the bytes of a non-empty JSON object")
    return doc[:-1] + b',"crc32c":"' + checksum(doc).encode() + b'"}'


def unseal(data: bytes) -> tuple[bytes, bool]:
    """The bytes `seal` was given, and whether a checksum was there (False: an object
    written before checksums, returned as is); ValueError if the checksum does not match."""
    m = _SEAL.search(data)
    if m is None:
        return data, False
    body = data[: m.start()] + b"}"
    actual = checksum(body)
    if m.group(1).decode() != actual:
        raise ValueError(
            f"its bytes do not match its checksum (crc32c {m.group(1).decode()!r}, computed"
            f" {actual!r}): the object was damaged or edited"
        )
    return body, True


def state_directory(checkpoint_directory: str) -> str:
    """Where the state objects of a checkpoint directory live (under `.oncelog/`)."""
    return f"{checkpoint_directory}/state"


def is_sqlite_ref(state: Any) -> bool:
    """True if a checkpoint's state is a reference to SQLite state objects."""
    return isinstance(state, dict) and state.get("format") == STATE_REF_FORMAT


def _ref(snapshot: str | None, crc: str | None, deltas: list[str]) -> dict[str, Any]:
    """A checkpoint's reference to SQLite state: its snapshot (with the snapshot's
    CRC-32C, when known) and the deltas after it, in order."""
    ref: dict[str, Any] = {"format": STATE_REF_FORMAT, "snapshot": snapshot, "deltas": deltas}
    if crc is not None:
        ref["snapshot_crc32c"] = crc
    return ref


def state_object_names(state: Any) -> set[str]:
    """The state objects a checkpoint's state references (none for JSON state)."""
    if not is_sqlite_ref(state):
        return set()
    names = set(state.get("deltas") or ())
    if state.get("snapshot"):
        names.add(state["snapshot"])
    return names


def object_seq(name: str) -> int | None:
    """The checkpoint number a state object is named by, or None if it is not one."""
    m = _OBJECT_NAME.match(name)
    return int(m.group(1), 16) if m else None


@dataclass(frozen=True, slots=True)
class SQLiteState:
    """Options of the SQLite consumer state: `Consumer(..., state=SQLiteState())`.

    `snapshot_every`: a checkpoint references at most `snapshot_every - 1` deltas after
    its snapshot (what recovery applies): once a commit's reference reaches that many, a
    snapshot (O(state size)) is written in the background, and the next checkpoint
    references it. Commits cost O(keys changed); the snapshot is serialized in memory on
    the consumer's thread (a copy of the database) and waited for by the next commit.
    """

    snapshot_every: int = 100
    directory: str | None = None
    """None: the working database is in memory. A local directory: it is a file there
    (one per consumer instance, removed by `Consumer.close()`; a crashed process leaves
    it behind, so use a temporary directory), for states larger than memory. Either way
    the store holds the state; the working database is rebuilt from it on recovery."""

    def __post_init__(self) -> None:
        if not isinstance(self.snapshot_every, int) or self.snapshot_every < 1:
            raise ValueError(f"snapshot_every must be an int >= 1, not {self.snapshot_every!r}")
        if self.directory is not None and not os.path.isdir(self.directory):
            raise ValueError(f"directory must be an existing directory, not {self.directory!r}")

    def open(self, client: JournalClient, checkpoint_directory: str) -> SQLiteStateEngine:
        """The engine of one consumer instance."""
        return SQLiteStateEngine(self, client, state_directory(checkpoint_directory))


class KV:
    """The handler's view of the SQLite state: a mapping of str keys to JSON values.

    Every write joins the open consumer transaction: committed with its checkpoint, or
    undone if it aborts. Values are stored JSON-encoded (tuples come back as lists)."""

    __slots__ = ("_engine",)

    def __init__(self, engine: SQLiteStateEngine) -> None:
        self._engine = engine

    def get(self, key: str, default: Any = None) -> Any:
        """The value of `key`, or `default`."""
        row = self._engine._db.execute("SELECT v FROM kv WHERE k = ?", (key,)).fetchone()
        return default if row is None else orjson.loads(row[0])

    def __getitem__(self, key: str) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        return (
            self._engine._db.execute("SELECT 1 FROM kv WHERE k = ?", (key,)).fetchone()
            is not None
        )

    def __len__(self) -> int:
        return int(self._engine._db.execute("SELECT count(*) FROM kv").fetchone()[0])

    def put(self, key: str, value: Any) -> None:
        """Set `key` to the JSON-serialisable `value`."""
        self.put_many(((key, value),))

    __setitem__ = put

    def put_many(self, items: Iterable[tuple[str, Any]]) -> None:
        """Set many keys at once (one SQL statement)."""
        engine = self._engine
        engine._begin()
        rows = []
        for key, value in items:
            if not isinstance(key, str):
                raise TypeError(f"SQLite state keys must be str, not {type(key).__name__}")
            try:
                data = orjson.dumps(value)
            except TypeError as exc:
                raise ConsumerError(
                    f"state value of {key!r} is not JSON-serialisable: {exc}"
                ) from exc
            rows.append((key, data))
            engine._changes[key] = data
        engine._db.executemany("INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)", rows)

    def update(self, mapping: dict[str, Any]) -> None:
        """Set every key of `mapping`."""
        self.put_many(mapping.items())

    def delete(self, key: str) -> None:
        """Remove `key` (no error if absent)."""
        engine = self._engine
        engine._begin()
        engine._db.execute("DELETE FROM kv WHERE k = ?", (key,))
        engine._changes[key] = None

    __delitem__ = delete

    def get_many(self, keys: Iterable[str]) -> dict[str, Any]:
        """The values of those of `keys` that exist."""
        out: dict[str, Any] = {}
        keys = list(keys)
        db = self._engine._db
        for i in range(0, len(keys), 500):
            part = keys[i : i + 500]
            marks = ",".join("?" * len(part))
            for k, v in db.execute(f"SELECT k, v FROM kv WHERE k IN ({marks})", part):
                out[k] = orjson.loads(v)
        return out

    def items(self) -> Iterator[tuple[str, Any]]:
        """All keys and values, by key."""
        for k, v in self._engine._db.execute("SELECT k, v FROM kv ORDER BY k"):
            yield k, orjson.loads(v)

    def keys(self) -> Iterator[str]:
        for (k,) in self._engine._db.execute("SELECT k FROM kv ORDER BY k"):
            yield k

    def to_dict(self) -> dict[str, Any]:
        """The whole state as a dict (for tests and small states)."""
        return dict(self.items())

    def __repr__(self) -> str:
        return f"KV({len(self)} keys)"


class BackgroundWrite:
    """An object written put-if-absent on a thread of its own (a state snapshot), started
    when made. `result()` waits for the write and raises its error; the bytes are dropped
    once written. The write is bounded by the client's retry timeout."""

    __slots__ = ("name", "path", "size", "crc32c", "_done", "_error", "_thread")

    def __init__(
        self,
        client: JournalClient,
        directory: str,
        name: str,
        data: bytes,
        stage: Callable[[str], None] | None = None,
    ) -> None:
        self.name = name
        self.path = f"{directory}/{name}"
        self.size = len(data)
        self.crc32c = checksum(data)
        """The CRC-32C of the bytes, recorded in the reference naming the object."""
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(client, data, stage), name=f"oncelog-snapshot:{name}",
            daemon=True,
        )
        self._thread.start()

    def _run(
        self, client: JournalClient, data: bytes, stage: Callable[[str], None] | None
    ) -> None:
        try:
            if not client.meta.put_if_absent(self.path, data):
                raise ConsumerError(f"state snapshot {self.path} exists already")
            if stage is not None:
                stage("snapshot")
        except BaseException as exc:  # noqa: BLE001 - raised by result() in the committer
            self._error = exc
        finally:
            self._done.set()

    def wait(self) -> None:
        """Wait for the write to end, whatever its outcome."""
        self._done.wait()

    def result(self) -> None:
        """Wait for the write; raise its error if it failed."""
        self._done.wait()
        if self._error is not None:
            raise self._error


def _open_db(directory: str | None, image: bytes | None = None) -> tuple[sqlite3.Connection, str]:
    """A working database, empty or holding `image` (a serialized one), in memory or in a
    new file of `directory`; with its file's path ("" in memory). The file needs no
    durability (the store holds the state): no fsyncs, the rollback journal in memory."""
    path = ""
    if directory is None:
        db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        if image is not None:
            db.deserialize(image)
    else:
        fd, path = tempfile.mkstemp(prefix="oncelog-state-", suffix=".sqlite", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                if image is not None:
                    f.write(image)
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=MEMORY")
            db.execute("PRAGMA synchronous=OFF")
        except BaseException:
            _remove(path)
            raise
    if image is None:
        db.execute("CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v BLOB NOT NULL)")
    return db, path


def _close_db(db: sqlite3.Connection, path: str) -> None:
    db.close()
    if path:
        _remove(path)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class SQLiteStateEngine:
    """One consumer instance's SQLite state: the local database, the open transaction's
    changes, and the reference of the last prepared commit. Used from the consumer's
    thread only (the commit thread only writes the bytes `prepare` returned)."""

    def __init__(self, options: SQLiteState, client: JournalClient, directory: str) -> None:
        self.options = options
        self.client = client
        self.directory = directory
        self._db, self._db_path = _open_db(options.directory)
        self._in_txn = False
        self._changes: dict[str, bytes | None] = {}
        self.ref: dict[str, Any] | None = None
        """The reference of the state the local database holds (outside the open txn)."""
        self._pending: BackgroundWrite | None = None
        """A snapshot being written in the background for the next commit to reference."""
        self.kv = KV(self)

    # ---------------------------------------------------------------- transactions

    def _begin(self) -> None:
        if not self._in_txn:
            self._db.execute("BEGIN")
            self._in_txn = True

    def rollback(self) -> None:
        """Undo the open transaction's writes (and drop a pending background snapshot: the
        commit that would reference it will not happen)."""
        self.discard_pending()
        if self._in_txn:
            self._db.execute("ROLLBACK")
            self._in_txn = False
        self._changes = {}

    def prepare(
        self, seq: int, stage: Callable[[str], None] | None = None
    ) -> tuple[dict[str, Any], list[tuple[str, bytes]], list[BackgroundWrite]]:
        """Commit the open transaction locally and return checkpoint `seq`'s state
        reference, the objects to write (path under `.oncelog/`, bytes) before claiming it,
        and the background writes that must be durable before the claim.

        O(keys changed). When the reference would reach `snapshot_every` deltas at the
        next commit, the database is also serialized (a copy in memory) and written in the
        background as a snapshot named by `seq + 1`: checkpoint `seq + 1` references it
        (with only its own delta after it) and its commit waits for that write. Without
        changes (and no snapshot pending) the reference is the previous one and nothing
        is written. `stage("snapshot")` is called (on the writing thread) once a
        background snapshot is durable."""
        if self._in_txn:
            self._db.execute("COMMIT")
            self._in_txn = False
        changes, self._changes = self._changes, {}
        base = self.ref or _empty_ref()
        objects: list[tuple[str, bytes]] = []
        waits: list[BackgroundWrite] = []
        pending, self._pending = self._pending, None
        if pending is not None:
            waits.append(pending)
            base = _ref(pending.name, pending.crc32c, [])
        if not changes:
            self.ref = base if pending is not None else self.ref
            return base, objects, waits
        token = new_token()
        every = self.options.snapshot_every
        if every == 1:
            name = f"{seq:016x}-{token}.sqlite"
            image = self._db.serialize()
            objects.append((f"{self.directory}/{name}", image))
            ref = _ref(name, checksum(image), [])
        else:
            name = f"{seq:016x}-{token}.delta"
            put = {k: orjson.Fragment(v) for k, v in changes.items() if v is not None}
            doc = {
                "format": DELTA_FORMAT,
                "seq": seq,
                "token": token,
                "put": put,
                "delete": [k for k, v in changes.items() if v is None],
            }
            objects.append((f"{self.directory}/{name}", seal(orjson.dumps(doc))))
            ref = _ref(base["snapshot"], base.get("snapshot_crc32c"), [*base["deltas"], name])
            if len(ref["deltas"]) + 1 >= every:
                # Off the critical path: this commit writes its delta, and the next
                # commit's checkpoint references the snapshot once it is durable.
                snapshot = f"{seq + 1:016x}-{new_token()}.sqlite"
                self._pending = BackgroundWrite(
                    self.client, self.directory, snapshot, self._db.serialize(), stage
                )
        self.ref = ref
        return ref, objects, waits

    def discard_pending(self) -> None:
        """Forget a background snapshot no checkpoint will reference (after an abort), once
        its write has ended (whatever its outcome: unreferenced, it is harmless)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.wait()

    # --------------------------------------------------------------------- recovery

    def load(self, ref: Any, where: str) -> None:
        """Make the local database hold the state `ref` (a checkpoint's state, None for a
        fresh group) references; CheckpointError naming `where` if it is not SQLite state,
        StateObjectMissing if an object is gone, CheckpointError naming the object's path
        and what is wrong if one is damaged (checksum mismatch, empty, not a database, not
        a delta). Nothing is written, and the local database is unchanged on error."""
        self.rollback()
        if ref is None:
            released = self.options.directory is not None and not self._db_path
            if released or self.ref is not None or self._db.execute("SELECT 1 FROM kv").fetchone():
                _close_db(self._db, self._db_path)
                self._db, self._db_path = _open_db(self.options.directory)
            self.ref = None
            return
        if not is_sqlite_ref(ref):
            raise ConsumerError(
                f"consumer checkpoint {where} holds JSON state, not SQLite state: this group was"
                " run with state='json' (reset it, or use another group)"
            )
        snapshot, deltas = ref.get("snapshot"), ref.get("deltas")
        crc = ref.get("snapshot_crc32c")
        if not (snapshot is None or isinstance(snapshot, str)) or not (
            isinstance(deltas, list) and all(isinstance(d, str) for d in deltas)
        ) or not (crc is None or (isinstance(crc, str) and snapshot is not None)):
            raise CheckpointError(f"corrupt consumer checkpoint {where}: bad state {ref!r}")
        if self.ref is not None and _ref_id(self.ref) == _ref_id(ref):
            return  # the local database is exactly that state already
        image = None if snapshot is None else self._read(snapshot, where)
        db, path = self._open_snapshot(snapshot, image, crc, where)
        try:
            del image
            for name in deltas:
                self._apply(db, name, self._read(name, where), where)
        except BaseException:
            _close_db(db, path)
            raise
        _close_db(self._db, self._db_path)
        self._db, self._db_path = db, path
        self.ref = _ref(snapshot, crc, list(deltas))

    def _open_snapshot(
        self, name: str | None, image: bytes | None, crc: str | None, where: str
    ) -> tuple[sqlite3.Connection, str]:
        """A working database holding snapshot `name`'s bytes `image` (empty if None),
        checked: against `crc` (from the reference), else (a snapshot written before
        checksums) by SQLite's integrity check. CheckpointError naming the object."""
        if image is None or name is None:
            return _open_db(self.options.directory)
        what = f"state snapshot {self.object_path(name)} (referenced by {where})"
        if crc is not None and checksum(image) != crc:
            raise CheckpointError(
                f"{what} is damaged: its {len(image)} bytes do not match the checksum its"
                f" reference records (crc32c {crc!r}, computed {checksum(image)!r})"
            )
        if not image:
            raise CheckpointError(f"{what} is damaged: it is empty, not a SQLite database")
        try:
            db, path = _open_db(self.options.directory, image)
        except (sqlite3.Error, MemoryError, OverflowError, ValueError) as exc:
            raise CheckpointError(
                f"{what} is not a SQLite state database: {type(exc).__name__}: {exc}"
            ) from None
        try:
            if crc is None:
                problems = [row[0] for row in db.execute("PRAGMA integrity_check")]
                if problems != ["ok"]:
                    raise CheckpointError(
                        f"{what} is damaged: SQLite's integrity check says: "
                        + "; ".join(str(p) for p in problems[:5])
                    )
            db.execute("SELECT count(*) FROM kv").fetchone()
        except (sqlite3.Error, MemoryError, OverflowError) as exc:
            _close_db(db, path)
            raise CheckpointError(
                f"{what} is not a SQLite state database: {type(exc).__name__}: {exc}"
            ) from None
        except BaseException:
            _close_db(db, path)
            raise
        return db, path

    def object_path(self, name: str) -> str:
        """The full storage path of state object `name`, as named in errors."""
        return display_path(self.client, f"{self.directory}/{name}")

    def _read(self, name: str, where: str) -> bytes:
        if object_seq(name) is None:
            raise CheckpointError(
                f"corrupt consumer checkpoint {where}: bad state object name {name!r}"
            )
        try:
            data = self.client.meta.read(f"{self.directory}/{name}")
        except Exception as exc:  # an unreadable object: named, never a different state
            raise CheckpointError(
                f"cannot read state object {self.object_path(name)} (referenced by {where}):"
                f" {type(exc).__name__}: {exc}"
            ) from exc
        if data is None:
            raise StateObjectMissing(
                f"consumer checkpoint {where} references state object {self.object_path(name)},"
                " which does not exist"
            )
        return data

    def _apply(self, db: sqlite3.Connection, name: str, data: bytes, where: str) -> None:
        """Apply delta `name` (its bytes `data`) to `db`, after checking its checksum (if
        it has one: older deltas have none) and its form: CheckpointError naming it."""
        try:
            body, _sealed = unseal(data)
            doc = orjson.loads(body)
            if not isinstance(doc, dict) or doc.get("format") != DELTA_FORMAT:
                raise ValueError(
                    f"format {doc.get('format') if isinstance(doc, dict) else doc!r}, expected"
                    f" {DELTA_FORMAT!r}"
                )
            if "crc32c" in doc:
                raise ValueError("its checksum member is damaged")
            if object_seq(name) != doc.get("seq"):
                raise ValueError(f"it names checkpoint {doc.get('seq')!r}, not its own")
            put = [(k, orjson.dumps(v)) for k, v in doc["put"].items()]
            delete = [(k,) for k in doc["delete"]]
            if not all(isinstance(k, str) for k, _v in put) or not all(
                isinstance(k, str) for (k,) in delete
            ):
                raise ValueError("a key is not a string")
        except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(
                f"state delta {self.object_path(name)} (referenced by {where}) is corrupt:"
                f" {exc}"
            ) from None
        db.execute("BEGIN")
        db.executemany("INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)", put)
        db.executemany("DELETE FROM kv WHERE k = ?", delete)
        db.execute("COMMIT")

    def release(self) -> None:
        """With an on-disk working database: close it and remove its file (the next `load`,
        i.e. the next recovery, rebuilds it from the store). In memory: nothing (the state
        stays readable through `kv` after `Consumer.close()`)."""
        if not self._db_path:
            return
        self.rollback()
        _close_db(self._db, self._db_path)
        self._db, self._db_path = _open_db(None)  # empty until the next load
        self.ref = None

    def close(self) -> None:
        """Close the working database (and remove its file): the engine is unusable."""
        self.rollback()
        _close_db(self._db, self._db_path)


def _empty_ref() -> dict[str, Any]:
    return {"format": STATE_REF_FORMAT, "snapshot": None, "deltas": []}


def _ref_id(ref: dict[str, Any]) -> Any:
    deltas = ref.get("deltas") or []
    return deltas[-1] if deltas else ref.get("snapshot")


def prune_state_objects(
    client: JournalClient, directory: str, referenced: set[str], below: int
) -> list[str]:
    """Delete the state (and sink) objects in `directory` that none of the kept
    checkpoints references (`referenced`) and that are numbered below `below` (the oldest
    kept checkpoint's number); returns their names. See the module docstring for why this
    is safe."""
    names = client.meta.list(directory)
    if not names:
        return []
    doomed = []
    for name in names:
        seq = object_seq(name)
        if seq is not None and seq < below and name not in referenced:
            client.meta.delete(f"{directory}/{name}")
            doomed.append(name)
    return doomed
