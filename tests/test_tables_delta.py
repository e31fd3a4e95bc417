"""Exactly-once export to Delta Lake (oncelog.tables.export_delta, `oncelog export delta`):
reruns, racing exporters and exporters SIGKILLed at random points never duplicate or skip a
row; the table equals `read_committed`."""

from __future__ import annotations

import random
import re
import signal
import subprocess
import sys
import threading
import time

import deltalake  # noqa: E402  (a dev dependency)
import orjson
import pytest

from oncelog.journal import JournalClient, JournalSpec  # noqa: E402
from oncelog.message import JSONMessage  # noqa: E402
from oncelog.publisher import Publisher  # noqa: E402
from oncelog.reading import read_committed  # noqa: E402
from oncelog.tables import export_delta  # noqa: E402
from oncelog.tables.delta import exported_through  # noqa: E402
from oncelog.testing.fixtures import StoreTarget  # noqa: E402
from oncelog.testing.processes import start_function  # noqa: E402

NDJSON = "application/x-ndjson"


def new_journal(client: JournalClient, name: str = "ev") -> str:
    client.create(JournalSpec(name, labels={"content-type": NDJSON}))
    return name


def publish(client: JournalClient, name: str, rng: random.Random, n: int, first: int = 0) -> None:
    to = lambda _m: (name, NDJSON)  # noqa: E731
    pubs = [Publisher(client) for _ in range(2)]
    i = first
    while i < first + n:
        p = rng.choice(pubs)
        if rng.random() < 0.5:
            p.publish_committed(to, JSONMessage({"id": i, "kind": "single"}))
            i += 1
        else:
            with p.transaction():
                for _ in range(3):
                    p.publish_uncommitted(to, JSONMessage({"id": i, "kind": "txn"}))
                    i += 1
    with pytest.raises(RuntimeError), pubs[0].transaction():  # a rolled-back transaction
        pubs[0].publish_uncommitted(to, JSONMessage({"id": -1, "kind": "rolled back"}))
        pubs[0].flush()
        raise RuntimeError("roll back")
    for p in pubs:
        p.flush()


def assert_table_is_read_committed(client: JournalClient, name: str, table_uri: str) -> None:
    table = deltalake.DeltaTable(table_uri).to_pyarrow_table()
    table = table.sort_by([("commit_offset", "ascending"), ("begin", "ascending")])
    envs = list(read_committed(client, name))
    assert table.column("begin").to_pylist() == [e.begin for e in envs]  # no dupes, no holes
    assert table.column("id").to_pylist() == [e.message.doc["id"] for e in envs]
    assert table.column("uuid").to_pylist() == [str(e.message.get_uuid()) for e in envs]
    assert -1 not in table.column("id").to_pylist()


def test_export_reruns_and_appends_only_what_is_new(local_store: StoreTarget, tmp_path) -> None:
    uri = str(tmp_path / "delta")
    with local_store.open() as client:
        name = new_journal(client)
        rng = random.Random(1)
        publish(client, name, rng, 40)
        first = export_delta(client, name, uri)
        assert first.rows[name] == len(list(read_committed(client, name))) > 0
        assert export_delta(client, name, uri).rows[name] == 0  # a rerun adds nothing
        assert exported_through(uri, client, name) == client.head(name)
        client.compact(name, retire_grace=0)  # read through segments from now on
        publish(client, name, rng, 30, first=1000)
        again = export_delta(client, [name], uri)
        assert again.rows[name] > 0 and again.offsets[name][0] == first.offsets[name][1]
        assert_table_is_read_committed(client, name, uri)


def test_racing_exporters_write_each_row_once(local_store: StoreTarget, tmp_path) -> None:
    uri = str(tmp_path / "delta")
    with local_store.open() as client:
        name = new_journal(client)
        publish(client, name, random.Random(2), 60)
        barrier = threading.Barrier(3)
        errors: list[BaseException] = []

        def exporter() -> None:
            barrier.wait()
            try:
                export_delta(client, name, uri)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=exporter) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert_table_is_read_committed(client, name, uri)


def follow_export(url: str, options: dict, name: str, uri: str) -> None:
    """Child: export `name` to `uri` until killed."""
    from oncelog.journal import open_journals

    client = open_journals(url, **options)

    def step(result: object) -> bool:
        print("step", flush=True)  # the parent kills after the first one
        return False

    export_delta(client, name, uri, follow=True, poll=0.01, stop_when=step)


@pytest.mark.slow
@pytest.mark.fault
def test_exporters_sigkilled_at_random_points_never_duplicate_or_skip(
    local_store: StoreTarget, tmp_path
) -> None:
    uri = str(tmp_path / "delta")
    rng = random.Random(3)
    with local_store.open() as client:
        name = new_journal(client)
        publish(client, name, rng, 20)
        kills = 0
        for round_ in range(10):
            child = start_function(
                follow_export, (local_store.url, dict(local_store.storage_options), name, uri)
            )
            child.expect("step", timeout=60)  # it is exporting
            publish(client, name, rng, 10, first=100 * (round_ + 1))
            # Fault injection, not synchronisation: the kill lands wherever the child is.
            time.sleep(rng.uniform(0.0, 0.3))
            rc = child.kill(60)
            child.close()
            assert rc == -signal.SIGKILL
            kills += 1
        assert kills == 10
        export_delta(client, name, uri)  # a last run finishes
        # (Progress stops at the last commit: what follows it, a rollback, exports nothing.)
        assert exported_through(uri, client, name) <= client.head(name)
        assert_table_is_read_committed(client, name, uri)


def oncelog_cli(*args: str, rc: int = 0) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run([sys.executable, "-m", "oncelog.cli", *args], capture_output=True,
                          stdin=subprocess.DEVNULL, timeout=120)
    assert proc.returncode == rc, proc.stderr.decode()
    assert b"Traceback" not in proc.stderr, proc.stderr.decode()
    return proc


def test_cli_export_delta_once_then_nothing_then_follow(local_store: StoreTarget, tmp_path) -> None:
    uri = str(tmp_path / "delta")
    with local_store.open() as client:
        name = new_journal(client)
        publish(client, name, random.Random(4), 25)
        want = len(list(read_committed(client, name)))
    args = ["--store", local_store.url, "export", "delta", name, "--table", uri]
    doc = orjson.loads(oncelog_cli(*args, "--format", "json").stdout)
    assert doc["journals"][0]["rows"] == want
    assert orjson.loads(oncelog_cli(*args, "--format", "json").stdout)["journals"][0]["rows"] == 0
    missing = oncelog_cli("--store", local_store.url, "export", "delta", "nope", "--table", uri,
                          rc=1)
    assert b"journal 'nope' does not exist" in missing.stderr
    # --follow exports new commits as they come, and Ctrl-C says what is in the table.
    follower = subprocess.Popen([sys.executable, "-m", "oncelog.cli", *args, "--follow",
                                 "--poll", "0.05"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list[bytes] = []
    assert follower.stderr is not None
    stderr = follower.stderr
    drain = threading.Thread(target=lambda: lines.extend(stderr), daemon=True)
    drain.start()

    def reported_through(head: int) -> bool:
        """The follower printed the export that reached `head` (it reports after its Delta
        commit: a SIGINT between the two would leave the last export unreported)."""
        return any(b"exported (through offset" in line and f"{head:,})".encode() in line
                   for line in list(lines))

    try:
        with local_store.open() as client:
            publish(client, name, random.Random(5), 10, first=500)
            wanted = len(list(read_committed(client, name)))
            head = client.head(name)
            deadline = time.monotonic() + 60
            while exported_through(uri, client, name) < head or not reported_through(head):
                assert time.monotonic() < deadline, f"the follower exported nothing new: {lines}"
                assert follower.poll() is None, b"".join(lines).decode()
                time.sleep(0.05)  # polling the table and the follower's output (bounded)
        follower.send_signal(signal.SIGINT)
        follower.wait(timeout=60)
        drain.join(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
    err = b"".join(lines)
    assert follower.returncode == 130, err.decode()
    assert re.search(rb"\d+ rows? exported", err) and b"exactly once" in err, err.decode()
    with local_store.open() as client:
        assert len(list(read_committed(client, name))) == wanted
        assert_table_is_read_committed(client, name, uri)


@pytest.mark.s3
def test_export_from_and_to_the_s3_test_server(s3_store: StoreTarget, s3_server) -> None:
    """Journals on S3 and the Delta table on S3 (conditional puts): reruns and racing
    exporters write each row once."""
    options = {
        "AWS_ENDPOINT_URL": s3_server.endpoint, "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
    }
    uri = s3_store.url.rstrip("/") + "-delta"
    with s3_store.open() as client:
        name = new_journal(client)
        rng = random.Random(6)
        publish(client, name, rng, 20)
        client.compact(name, retire_grace=0)
        publish(client, name, rng, 10, first=100)
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def exporter() -> None:
            barrier.wait()
            try:
                export_delta(client, name, uri, storage_options=options)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=exporter) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert export_delta(client, name, uri, storage_options=options).rows[name] == 0
        table = deltalake.DeltaTable(uri, storage_options=options).to_pyarrow_table()
        table = table.sort_by([("commit_offset", "ascending"), ("begin", "ascending")])
        envs = list(read_committed(client, name))
        assert table.column("begin").to_pylist() == [e.begin for e in envs]
