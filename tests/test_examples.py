"""The non-Spark examples, each run as a subprocess (`python examples/X.py`) on a local
store and on the S3 test server, as a user would run them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from oncelog.testing.fixtures import StoreTarget

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TIMEOUT = 120


def run_example(
    name: str, store: StoreTarget | None, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    argv = [sys.executable, str(EXAMPLES / f"{name}.py"), *args]
    if store is not None:
        argv += ["--store", store.url]
        for key, value in store.storage_options.items():
            argv += ["-o", f"{key}={json.dumps(value)}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT,
                          env=None if env is None else {**os.environ, **env})


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def example_store(request: pytest.FixtureRequest) -> StoreTarget:
    return request.getfixturevalue(f"{request.param}_store")


def assert_ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
    return proc.stdout


# -- publisher service ------------------------------------------------------------------------


@pytest.mark.parametrize("mapping", ["modulo", "rendezvous"])
def test_publisher_service(example_store: StoreTarget, mapping: str) -> None:
    out = assert_ok(run_example("publisher_service", example_store, "--events", "60",
                                "--mapping", mapping))
    assert "each user in one partition: True" in out
    counts = [int(line.split()[1]) for line in out.splitlines() if "/part-" in line]
    assert len(counts) == 4 and sum(counts) == 60  # the audit journal is not selected

    client = example_store.open()
    try:
        audit = client.read("examples/clicks/audit").read()
        assert audit == b""
    finally:
        client.close()


def test_publisher_service_picks_up_new_partitions(local_store: StoreTarget) -> None:
    assert_ok(run_example("publisher_service", local_store, "--events", "30"))
    out = assert_ok(run_example("publisher_service", local_store, "--events", "30",
                                "--partitions", "6"))
    counts = [int(line.split()[1]) for line in out.splitlines() if "/part-" in line]
    assert len(counts) == 6 and sum(counts) == 30  # this run's events only


@pytest.mark.parametrize("name", ["publisher_service", "partitioning", "read_gazette_store"])
def test_default_store_is_a_temporary_directory(name: str, tmp_path: Path) -> None:
    out = assert_ok(run_example(name, None, env={"TMPDIR": str(tmp_path)}))
    assert "True" in out or "passed" in out
    assert list(tmp_path.iterdir()) == []  # removed on exit


# -- partitioning -----------------------------------------------------------------------------


def test_partitioning(example_store: StoreTarget) -> None:
    out = assert_ok(run_example("partitioning", example_store, "--keys", "2000"))
    assert out.splitlines()[-1] == "checks passed"
    moved = {line.split(":")[0].strip(): int(line.split()[1])
             for line in out.splitlines() if "keys moved" in line}
    assert 0 < moved["rendezvous"] < moved["modulo"] <= 2000
    assert "'examples/orders/us/part-000'" in out.splitlines()[1]  # region!=eu
    assert "us/" not in out.splitlines()[0]


# -- Gazette fragment store -------------------------------------------------------------------


def test_read_gazette_store(example_store: StoreTarget) -> None:
    out = assert_ok(run_example("read_gazette_store", example_store))
    committed = out.split("read committed:\n")[1].splitlines()[:-1]
    assert [line.strip().split(":")[0] for line in committed] == ["a1", "b0", "a2", "a3"]
    uncommitted = out.split("read uncommitted:\n")[1].split("read committed:")[0]
    assert "b1: rolled back later" in uncommitted and "c1: never committed" in uncommitted
    assert uncommitted.count("a1: committed on its own") == 2  # the duplicate frame

    # The store really is spec-less Gazette fragments, one of them in a postfix directory.
    client = example_store.open()
    try:
        assert client.list() == []
        fragments = client.fragments("examples/gazette/events")
        assert [f.codec.name for f in fragments] == ["NONE", "GZIP", "NONE"]
        head = client.head("examples/gazette/events")
        assert fragments[0].begin == 0 and fragments[-1].end == head
    finally:
        client.close()


def test_examples_fail_on_bad_arguments() -> None:
    proc = run_example("partitioning", None, "--keys", "many")
    assert proc.returncode == 2 and "invalid int value" in proc.stderr
