"""The README demo and the examples, run as users run them: on local disk and on S3."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import oncelog.demo as demo
from oncelog.journal import open_journals

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def s3_args(target) -> list[str]:
    return ["--store", target.url] + [
        arg for key, value in target.storage_options.items()
        for arg in ("-o", f"{key}={json.dumps(value) if not isinstance(value, str) else value}")
    ]


def check_demo_output(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1].startswith("all 12 totals match")
    assert "instance A was fenced out" in proc.stdout
    assert len(lines) < 30  # short enough to read at a glance
    rows = [line.split() for line in lines if len(line.split()) == 3 and line.split()[1].isdigit()]
    assert len(rows) == 12 and all(r[1] == r[2] for r in rows)


def test_demo_on_a_temporary_local_store():
    proc = run("-m", "oncelog.demo")
    check_demo_output(proc)
    store = proc.stdout.splitlines()[0].split(" on ", 1)[1].removesuffix(" (temporary)")
    assert not os.path.exists(store)  # cleaned up


def test_demo_on_s3(s3_store):
    proc = run("-m", "oncelog.demo", *s3_args(s3_store))
    check_demo_output(proc)
    client = s3_store.open()
    assert len(client.list("role=totals")) == 1


def test_demo_exits_non_zero_when_the_totals_differ(tmp_path, monkeypatch, capsys):
    counted = demo._count_words

    calls = []

    def double_counting(env, txn):  # counts the first sentence it sees twice
        counted(env, txn)
        if not calls:
            calls.append(env)
            counted(env, txn)

    monkeypatch.setattr(demo, "_count_words", double_counting)
    assert demo.main(["--store", str(tmp_path / "store")]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH" in out and "DIFFER" in out


def test_run_demo_on_memory():
    out = io.StringIO()
    client = open_journals(f"memory://oncelog-demo-{os.getpid()}")
    result = demo.run_demo(client, seed=5, out=out)
    assert result.ok and sum(result.direct_totals.values()) > 50
    assert result.consumer_totals == result.direct_totals


@pytest.mark.parametrize("where", ["local", "s3"])
def test_wordcount_example(where, tmp_path, request):
    args = ["--store", str(tmp_path / "store")] if where == "local" else s3_args(
        request.getfixturevalue("s3_store")
    )
    first = run(str(EXAMPLES / "wordcount.py"), *args, "the cat sat", "the cat sat on the mat")
    assert first.returncode == 0, first.stderr
    assert "  the          3" in first.stdout
    second = run(str(EXAMPLES / "wordcount.py"), *args, "a cat")
    assert second.returncode == 0, second.stderr
    totals = dict(line.split() for line in second.stdout.splitlines()[1:])
    assert totals == {"the": "3", "cat": "3", "sat": "2", "on": "1", "mat": "1", "a": "1"}


@pytest.mark.parametrize("where", ["local", "s3"])
def test_sharded_wordcount_example(where, tmp_path, request):
    args = ["--store", str(tmp_path / "store")] if where == "local" else s3_args(
        request.getfixturevalue("s3_store")
    )
    proc = run(str(EXAMPLES / "sharded_wordcount.py"), *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1].endswith(": exactly once")
    consumed = [line for line in proc.stdout.splitlines() if line.startswith("shard ")]
    parts = sorted(
        p.strip() for line in consumed for p in line.split("consumed", 1)[1].split(",") if p.strip()
    )
    assert parts == [f"part-{i:03d}" for i in range(6)]
    assert "lag 0 bytes" in proc.stdout
