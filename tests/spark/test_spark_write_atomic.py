"""Spark batch writes are atomic across journals and idempotent by write id, and write
options never collide with storage options.

- Option parsing: `key_column`, the deprecated routing `key`, credentials given every
  documented way, `write_id` / `write_version` (no JVM).
- The writers' commit and abort driven in-process, as Spark drives them, with commits
  cut short by an exception (no JVM).
- A real driver killed mid-commit (a subprocess Spark driver whose commit kills its
  whole process tree after the first ACK append), then a rerun of the same write in the
  tests' session, or `recover_pending` for a write without a write id; and a keyed write
  to the S3 test server with `key_column` and `key`/`secret` credentials together.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql.types import LongType, StringType, StructField, StructType

from oncelog import transactions
from oncelog.coordination import MetaStore
from oncelog.journal import JournalSpec
from oncelog.reading import read_committed
from oncelog.spark import OncelogDataSource
from oncelog.spark.options import OptionError, ReadOptions, WriteOptions
from oncelog.spark.write import OncelogBatchWriter, TaskCommit

JSON = "application/x-ndjson"
SCHEMA = StructType([StructField("id", LongType()), StructField("user", StringType())])
COLUMNS = ["id", "user"]
ROWS = [{"id": i, "user": f"u{i % 10}"} for i in range(30)]
PARTS = [f"atomic/part-{i}" for i in range(3)]

# Keep the Spark tests on one test worker (`--dist loadgroup`): one SparkSession.
pytestmark = pytest.mark.xdist_group("spark")


def roundtrip(obj: Any) -> Any:
    """What Spark does to writers and commit messages: pickle them between processes."""
    return cloudpickle.loads(cloudpickle.dumps(obj))


# --- options -----------------------------------------------------------------------------


def test_key_column_routes_and_key_is_the_access_key() -> None:
    opts = WriteOptions.parse(
        {
            "store": "s3://b/p",
            "selector": "app=x",
            "key_column": "user",
            "key": "AKIA",
            "secret": "s3cr3t",
            "endpoint_url": "http://127.0.0.1:1",
        },
        COLUMNS,
    )
    assert opts.key_column == "user" and opts.legacy_key is None
    assert opts.store.storage_options == {
        "key": "AKIA",
        "secret": "s3cr3t",
        "endpoint_url": "http://127.0.0.1:1",
    }
    # key_column wins even when `key` happens to name a column: `key` is a credential.
    opts = WriteOptions.parse(
        {"store": "/x", "journal": "a", "key_column": "id", "key": "user"}, COLUMNS
    )
    assert opts.key_column == "id" and opts.store.storage_options == {"key": "user"}


def test_key_naming_a_column_without_secret_is_the_deprecated_routing_column() -> None:
    options = {"store": "s3://b/p", "selector": "app=x", "key": "user"}
    unresolved = WriteOptions.parse(options)
    assert unresolved.legacy_key == "user" and "key" not in unresolved.store.storage_options
    with pytest.warns(DeprecationWarning, match="key_column"):
        opts = WriteOptions.parse(options, COLUMNS)
    assert opts.key_column == "user" and opts.store.storage_options == {}


@pytest.mark.parametrize(
    ("options", "storage"),
    [
        # Not a column: the access key (a single target needs no routing column).
        ({"journal": "a", "key": "AKIA"}, {"key": "AKIA"}),
        # With a secret, `key` is a credential even if it names a column.
        ({"journal": "a", "key": "user", "secret": "s"}, {"key": "user", "secret": "s"}),
        (
            {"journal": "a", "key": "user", "storage_options": '{"secret": "s"}'},
            {"key": "user", "secret": "s"},
        ),
    ],
)
def test_key_is_a_credential_unless_unambiguous(options, storage) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        opts = WriteOptions.parse({"store": "/x", **options}, COLUMNS)
    assert opts.key_column is None and opts.store.storage_options == storage


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"selector": "app=x", "key": "AKIA"}, "'key_column' is required.*storage access key"),
        ({"selector": "app=x", "key": "user", "secret": "s"}, "'key_column' is required"),
        ({"journals": "a,b", "key_column": "zzz"}, "'key_column' 'zzz' is not a column"),
        ({"journal": "a", "write_id": "a/b"}, "option 'write_id': invalid write id"),
        ({"journal": "a", "write_id": ".hidden"}, "invalid write id"),
        ({"journal": "a", "write_id": "w", "write_version": "-1"}, "at least 0"),
        ({"journal": "a", "write_id": "w", "write_version": "x"}, "must be an integer"),
        ({"journal": "a", "write_version": "3"}, "'write_version' needs 'write_id'"),
    ],
)
def test_write_options_are_checked_against_the_columns(options, message) -> None:
    with pytest.raises(OptionError, match=message):
        WriteOptions.parse({"store": "/x", **options}, COLUMNS)


def test_write_ids_and_versions() -> None:
    opts = WriteOptions.parse(
        {"store": "/x", "journal": "a", "write_id": "nightly-2024.06+eu", "write_version": "7"}
    )
    assert (opts.write_id, opts.write_version) == ("nightly-2024.06+eu", 7)
    assert WriteOptions.parse({"store": "/x", "journal": "a"}).write_id is None
    assert WriteOptions.parse({"store": "/x", "journal": "a", "write_id": "w"}).write_version == 0


@pytest.mark.parametrize("parse", [ReadOptions.parse, WriteOptions.parse])
def test_credentials_every_documented_way(parse) -> None:
    """The same storage options for reads and (keyed) writes, however they are given."""
    target = {"journals": "a"} if parse == ReadOptions.parse else {"journal": "a"}
    base = {"store": "s3://b/p", **target}
    assert parse({**base, "storage_options": json.dumps({"key": "k", "secret": "s"})}).store == (
        parse({**base, "key": "k", "secret": "s"}).store
    )
    full = parse(
        {
            **base,
            "key": "k",
            "secret": "s",
            "token": "t",
            "endpoint_url": "http://127.0.0.1:1",
            "region": "eu-west-1",
            "storage_options": '{"use_ssl": false, "client_kwargs": {"verify": false}}',
        }
    )
    assert full.store.storage_options == {
        "use_ssl": False,
        "key": "k",
        "secret": "s",
        "token": "t",
        "endpoint_url": "http://127.0.0.1:1",
        "client_kwargs": {"verify": False, "region_name": "eu-west-1"},
    }
    assert parse({**base, "anon": "true"}).store.storage_options == {"anon": True}
    # A read's `key` is always the access key.
    assert ReadOptions.parse({**base, "journals": "a", "key": "user"}).store.storage_options == {
        "key": "user"
    }


def test_stream_writes_take_writer_id_not_write_id(local_store) -> None:
    with local_store.open() as client:
        client.create(JournalSpec("s/out"))
    options = {"store": local_store.url, "journal": "s/out", "writer_id": "q", "write_id": "w"}
    with pytest.raises(OptionError, match="'write_id' is for batch writes"):
        OncelogDataSource(options).streamWriter(SCHEMA, False)


# --- commit and abort, in-process --------------------------------------------------------


@pytest.fixture
def atomic_store(local_store):
    client = local_store.open()
    for name in PARTS:
        client.create(JournalSpec(name, labels={"app": "atomic", "content-type": JSON}))
    yield local_store, client
    client.close()


def _batch(rows: list[dict]) -> pa.RecordBatch:
    schema = pa.schema([("id", pa.int64()), ("user", pa.string())])
    return pa.RecordBatch.from_pylist(rows, schema=schema)


def _writer(target, **extra: str) -> OncelogBatchWriter:
    options = {"store": target.url, "selector": "app=atomic", "key_column": "user", **extra}
    return roundtrip(OncelogDataSource(options).writer(SCHEMA, False))


def _tasks(writer: OncelogBatchWriter, rows: list[dict] = ROWS) -> list[TaskCommit]:
    """Two task attempts, as two Spark partitions would run them."""
    half = len(rows) // 2
    return [
        roundtrip(roundtrip(writer).write(iter([_batch(part)])))
        for part in (rows[:half], rows[half:])
    ]


def _committed(client) -> dict[str, list[tuple[int, str]]]:
    return {
        name: sorted(
            (e.message.doc["id"], e.message.doc["user"]) for e in read_committed(client, name)
        )
        for name in PARTS
    }


def _assert_one_clean_write(client, rows: list[dict] = ROWS) -> None:
    """Every row committed exactly once, each user's rows in one journal."""
    got = _committed(client)
    everything = [row for part in got.values() for row in part]
    assert Counter(everything) == Counter((r["id"], r["user"]) for r in rows)
    homes = {user: name for name, part in got.items() for _, user in part}
    assert all(homes[user] == name for name, part in got.items() for _, user in part)
    assert sum(1 for part in got.values() if part) > 1  # the write spans journals


class _Died(BaseException):
    """Stands for the driver dying: nothing after it runs."""


def _die_after_first_append(monkeypatch) -> None:
    real = transactions.append_intents

    def append_then_die(client, intents):
        real(client, intents[:1])
        raise _Died

    monkeypatch.setattr(transactions, "append_intents", append_then_die)


def test_rerun_of_a_write_id_finishes_a_cut_short_commit(atomic_store, monkeypatch) -> None:
    target, client = atomic_store
    writer = _writer(target, write_id="job-1", write_version="2")
    with monkeypatch.context() as patch:
        _die_after_first_append(patch)
        with pytest.raises(_Died):
            writer.commit(_tasks(writer))
    record = transactions.read_record(client, transactions.write_record_path("job-1", 2))
    assert record is not None and record.intent_journals == PARTS
    assert [bool(rows) for rows in _committed(client).values()] == [True, False, False]

    rerun = _writer(target, write_id="job-1", write_version="2")
    rerun.commit(_tasks(rerun))
    _assert_one_clean_write(client)
    rerun.commit(_tasks(rerun))  # a finished write: rerunning it adds nothing
    _assert_one_clean_write(client)
    # Another version is another write.
    again = _writer(target, write_id="job-1", write_version="3")
    again.commit(_tasks(again))
    assert sum(map(len, _committed(client).values())) == 2 * len(ROWS)


def test_write_without_id_leaves_a_pending_record_that_recovery_finishes(
    atomic_store, monkeypatch
) -> None:
    target, client = atomic_store
    writer = _writer(target)
    with monkeypatch.context() as patch:
        _die_after_first_append(patch)
        with pytest.raises(_Died):
            writer.commit(_tasks(writer))
    [pending] = transactions.pending_records(client)
    assert pending.kind == "spark-write" and pending.intent_journals == PARTS
    assert [p for p in _committed(client).values() if p] != []
    assert [r.path for r in transactions.recover_pending(client)] == [pending.path]
    _assert_one_clean_write(client)
    assert transactions.pending_records(client) == []
    assert client.meta.list("txns/pending") == []

    # An uninterrupted commit retires its record.
    writer = _writer(target)
    writer.commit(_tasks(writer))
    assert client.meta.list("txns/pending") == []
    assert sum(map(len, _committed(client).values())) == 2 * len(ROWS)


@pytest.mark.parametrize("write_id", [None, "job-abort"])
def test_abort_after_a_recorded_commit_rolls_it_forward(
    atomic_store, monkeypatch, write_id
) -> None:
    """Spark aborts a job whose commit raised. Past the record the commit is decided:
    rolling back the journals not yet acknowledged would leave it half done for good."""
    target, client = atomic_store
    extra = {"write_id": write_id} if write_id else {}
    writer = _writer(target, **extra)
    tasks = _tasks(writer)

    def append_then_fail(client, intents):
        real(client, intents[:1])
        raise OSError("connection reset")

    real = transactions.append_intents
    with monkeypatch.context() as patch:
        patch.setattr(transactions, "append_intents", append_then_fail)
        with pytest.raises(OSError):
            roundtrip(writer).commit(tasks)
    roundtrip(writer).abort(tasks + [None])
    _assert_one_clean_write(client)
    assert transactions.pending_records(client) == []

    # A commit that failed before its record is rolled back by the abort, as before.
    writer = _writer(target, **({"write_id": "job-abort-2"} if write_id else {}))
    tasks = _tasks(writer, [{"id": 100 + i, "user": f"u{i}"} for i in range(6)])
    with monkeypatch.context() as patch:
        patch.setattr(MetaStore, "put_if_absent", _refuse)
        with pytest.raises(OSError):
            roundtrip(writer).commit(tasks)
    roundtrip(writer).abort(tasks)
    _assert_one_clean_write(client)  # nothing of the second job
    if write_id:
        rerun = _writer(target, write_id="job-abort-2")
        rerun.commit(_tasks(rerun, [{"id": 100 + i, "user": f"u{i}"} for i in range(6)]))
        assert sum(map(len, _committed(client).values())) == len(ROWS) + 6


def _refuse(*_args: Any, **_kwargs: Any) -> bool:
    raise OSError("store unreachable")


def test_deprecated_key_still_routes_a_write(atomic_store) -> None:
    target, client = atomic_store
    options = {"store": target.url, "selector": "app=atomic", "key": "user"}
    with pytest.warns(DeprecationWarning, match="key_column"):
        writer = roundtrip(OncelogDataSource(options).writer(SCHEMA, False))
    assert writer.options.key_column == "user"
    assert "key" not in writer.options.store.storage_options
    writer.commit(_tasks(writer))
    _assert_one_clean_write(client)


# --- a real driver, killed mid-commit ----------------------------------------------------

DRIVER = textwrap.dedent(
    '''
    """A Spark driver whose job commit dies after its first ACK append (argv: options JSON,
    a file to create just before dying)."""
    import json
    import os
    import signal
    import sys

    from oncelog.spark import OncelogDataSource, local_session
    from oncelog.spark.write import OncelogBatchWriter

    # Started with start_new_session=True: this process group is the driver's alone.
    DRIVER_GROUP = os.getpgrp()
    MARKER = sys.argv[2]
    assert DRIVER_GROUP == os.getpid(), "run me as a process group leader"


    class DyingWriter(OncelogBatchWriter):
        """Appends the first ACK intent, then kills the driver, Spark's JVM, the Python
        workers and itself at once (SIGKILL): nothing else gets to run."""

        def commit(self, messages):
            import oncelog.transactions as transactions

            real = transactions.append_intents

            def append_then_die(client, intents):
                real(client, intents[:1])
                with open(MARKER, "w") as marker:  # the worker's stdout is captured
                    marker.write(str(len(intents)))
                os.killpg(DRIVER_GROUP, signal.SIGKILL)
                os.killpg(os.getpgrp(), signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)

            transactions.append_intents = append_then_die
            super().commit(messages)


    class DyingSource(OncelogDataSource):
        @classmethod
        def name(cls):
            return "oncelog_dying"

        def writer(self, schema, overwrite):
            writer = super().writer(schema, overwrite)
            return DyingWriter(writer.options, schema, writer.targets)


    options = json.loads(sys.argv[1])
    spark, _ = local_session("oncelog-dying-driver")
    spark.dataSource.register(DyingSource)
    rows = [(i, f"u{i % 10}") for i in range(30)]
    df = spark.createDataFrame(rows, "id bigint, user string").repartition(2)
    df.write.format("oncelog_dying").options(**options).mode("append").save()
    print("NOT KILLED", flush=True)
    '''
)


def _kill_driver_mid_commit(tmp_path: Path, options: dict[str, str]) -> None:
    script = tmp_path / "dying_driver.py"
    script.write_text(DRIVER)
    marker = tmp_path / "died"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    done = subprocess.run(
        [sys.executable, str(script), json.dumps(options), str(marker)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )
    # Died by SIGKILL in the commit, with 3 ACK intents to append (one got appended).
    assert done.returncode == -9 and marker.exists() and marker.read_text() == "3", (
        done.returncode,
        done.stdout,
        done.stderr[-3000:],
    )


def _spark_write(spark, options: dict[str, str]) -> None:
    df = spark.createDataFrame([(r["id"], r["user"]) for r in ROWS], "id bigint, user string")
    df.repartition(2).write.format("oncelog").options(**options).mode("append").save()


@pytest.mark.slow
def test_rerun_finishes_the_commit_of_a_killed_driver(spark, atomic_store, tmp_path) -> None:
    target, client = atomic_store
    options = {
        "store": target.url,
        "selector": "app=atomic",
        "key_column": "user",
        "write_id": "nightly",
        "write_version": "5",
    }
    _kill_driver_mid_commit(tmp_path, options)
    record = transactions.read_record(client, transactions.write_record_path("nightly", 5))
    assert record is not None and record.intent_journals == PARTS
    assert [bool(p) for p in _committed(client).values()] == [True, False, False]

    _spark_write(spark, options)  # the rerun: finishes THAT commit, commits nothing twice
    _assert_one_clean_write(client)
    _spark_write(spark, options)  # a finished write again: a no-op
    _assert_one_clean_write(client)


@pytest.mark.slow
@pytest.mark.s3
def test_recovery_finishes_the_commit_of_a_killed_driver_without_write_id(
    spark, s3_server, s3_store, tmp_path
) -> None:
    client = s3_store.open()
    for name in PARTS:
        client.create(JournalSpec(name, labels={"app": "atomic", "content-type": JSON}))
    options = {
        "store": s3_store.url,
        "selector": "app=atomic",
        "key_column": "user",
        "key": "testing",
        "secret": "testing",
        "endpoint_url": s3_server.endpoint,
        "region": "us-east-1",
    }
    _kill_driver_mid_commit(tmp_path, options)
    [pending] = transactions.pending_records(client)
    assert pending.intent_journals == PARTS
    assert [bool(p) for p in _committed(client).values()] == [True, False, False]
    transactions.recover_pending(client)
    _assert_one_clean_write(client)
    assert transactions.pending_records(client) == []
    client.close()


@pytest.mark.s3
def test_keyed_write_and_read_on_s3_with_credentials(spark, s3_server, s3_store) -> None:
    """`key_column` routes rows while `key`/`secret` reach the store; reads take `key` as
    the access key, here given inside `storage_options`."""
    client = s3_store.open()
    for name in PARTS:
        client.create(JournalSpec(name, labels={"app": "atomic", "content-type": JSON}))
    credentials = {
        "key": "testing",
        "secret": "testing",
        "endpoint_url": s3_server.endpoint,
        "region": "us-east-1",
    }
    options = {"store": s3_store.url, "selector": "app=atomic", "key_column": "user", **credentials}
    _spark_write(spark, {**options, "write_id": "s3-keyed"})
    _assert_one_clean_write(client)
    read = (
        spark.read.format("oncelog")
        .option("store", s3_store.url)
        .option("journals", "app=atomic")
        .option("schema", "id bigint, user string")
        .option("key", "testing")
        .option(
            "storage_options", json.dumps({"secret": "testing", "endpoint_url": s3_server.endpoint})
        )
        .load()
        .select("journal", "message.id", "message.user")
        .collect()
    )
    got = _committed(client)
    assert sorted((r.journal, r.id, r.user) for r in read) == sorted(
        (name, i, u) for name, part in got.items() for i, u in part
    )
    client.close()
