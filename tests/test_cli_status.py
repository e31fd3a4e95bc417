"""`oncelog status`: one frame of a store (journals, consumer groups' lag, pending
transactions), on local disk and the S3 test server; `--selector`; an empty store; and
`--watch` run as the console script, stopped with Ctrl-C."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from oncelog.cli import cli
from oncelog.cli.app import State
from oncelog.consumer import Consumer, group_status
from oncelog.intents import AckIntent
from oncelog.journal import JournalClient, JournalSpec
from oncelog.message import new_producer_id
from oncelog.testing.fixtures import StoreTarget
from oncelog.transactions import TransactionRecord, write_pending

TIMEOUT = 60.0
JSONL = {"content-type": "application/x-ndjson"}
HEADER = "oncelog status: "
_FOUND = shutil.which("oncelog", path=os.path.dirname(sys.executable))
assert _FOUND, f"the oncelog console script is not installed next to {sys.executable}"
ONCELOG: str = _FOUND


def _status(target: StoreTarget, *args: str) -> str:
    """Run `oncelog status ARGS` in-process on `target`; its stdout (checked: exit 0, plain
    text without colours)."""
    state = State(
        store=target.url, storage_options=[([k], v) for k, v in target.storage_options.items()]
    )
    try:
        result = CliRunner().invoke(cli, ["status", *args], obj=state, catch_exceptions=False)
    finally:
        state.close()
    assert result.exit_code == 0, result.output
    assert "\x1b[" not in result.stdout  # not a terminal: no colours, no cursor moves
    return result.stdout


def _rows(out: str, section: str) -> dict[str, list[str]]:
    """The rows of one section of a plain frame, by their first column."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(section))
    rows: dict[str, list[str]] = {}
    for line in lines[start + 2 :]:  # the title, then the column headers
        if not line.strip():
            break
        cells = line.split()
        rows[cells[0]] = cells
    return rows


def _fill(client: JournalClient) -> tuple[int, str]:
    """Two journals, a group that consumed part of `st/a`, a pending transaction record
    over both: returns the group's checkpoint offset in `st/a` and the record's path."""
    client.create(JournalSpec("st/a", {**JSONL, "app": "a"}))
    client.create(JournalSpec("st/b", {**JSONL, "app": "b"}))
    client.append("st/a", b'{"n": 1}\n{"n": 2}\n')
    consumer = Consumer(client, "counter", ["st/a"], lambda env, txn: None)
    try:
        consumer.run(until_idle=True)
    finally:
        consumer.close()
    client.append("st/a", b'{"n": 3}\n')  # the group is now this far behind
    client.append("st/b", b'{"n": 4}\n{"n": 5}\n{"n": 6}\n')
    record = write_pending(
        client,
        TransactionRecord(
            "commit",
            [AckIntent("st/a", b"ack-a\n"), AckIntent("st/b", b"ack-b\n")],
            producer=new_producer_id(),
            clock=7,
        ),
    )
    (member,) = group_status(client, "counter").members
    (position,) = member.journals
    return position.offset, f".oncelog/{record.path}"


def _check_frame(client: JournalClient, out: str, checkpoint: str, record: str) -> None:
    head_a, head_b = client.head("st/a"), client.head("st/b")
    assert out.startswith(HEADER)
    journals = _rows(out, "JOURNALS (2)")
    # JOURNAL HEAD FIRST WRITE-RATE COMPACTION-DEBT ...: one frame has no rate yet.
    assert journals["st/a"][:5] == ["st/a", str(head_a), "0", "-", "2"]
    assert journals["st/b"][:5] == ["st/b", str(head_b), "0", "-", "1"]
    groups = _rows(out, "CONSUMER GROUPS (1)")
    assert groups["counter"] == [
        "counter", "-", "st/a", checkpoint, str(head_a - int(checkpoint))
    ]
    assert 0 < head_a - int(checkpoint) < head_a
    pending = _rows(out, "PENDING TRANSACTIONS (1)")
    assert pending[record][2] == "st/a,st/b"


def test_one_frame_on_local_disk(local_store: StoreTarget) -> None:
    client = local_store.open()
    try:
        offset, record = _fill(client)
        out = _status(local_store)
        _check_frame(client, out, str(offset), record)
        assert _status(local_store, "--once").splitlines()[1:] == out.splitlines()[1:]

        # --selector: only st/b, no group reads it, the pending record touches it.
        only_b = _status(local_store, "--selector", "app=b")
        assert "(selector 'app=b')" in only_b.splitlines()[0]
        assert list(_rows(only_b, "JOURNALS (1)")) == ["st/b"]
        assert "CONSUMER GROUPS" not in only_b
        assert "no consumer groups in the journals shown" in only_b
        assert record in _rows(only_b, "PENDING TRANSACTIONS (1)")
        only_a = _status(local_store, "-l", "app=a")
        assert list(_rows(only_a, "JOURNALS (1)")) == ["st/a"]
        assert list(_rows(only_a, "CONSUMER GROUPS (1)")) == ["counter"]
        none = _status(local_store, "-l", "app=zzz")
        assert "no journals match selector 'app=zzz'" in none
        assert "no pending transactions in the journals shown" in none
    finally:
        client.close()


def test_one_frame_on_s3(s3_store: StoreTarget) -> None:
    client = s3_store.open()
    try:
        offset, record = _fill(client)
        _check_frame(client, _status(s3_store), str(offset), record)
    finally:
        client.close()


def test_empty_store_says_so(local_store: StoreTarget) -> None:
    os.makedirs(local_store.url)
    out = _status(local_store)
    assert out.splitlines()[0].startswith(f"{HEADER}{local_store.url} at ")
    for line in ("the store has no journals", "no consumer groups", "no pending transactions"):
        assert line in out.splitlines()


def test_bad_options_are_usage_errors(local_store: StoreTarget) -> None:
    state = State(store=local_store.url)
    for args, text in (
        (["--interval", "1s"], "--interval sets the refresh of --watch"),
        (["--watch", "--once"], "--watch and --once exclude each other"),
        (["--selector", "a in ("], "--selector"),
    ):
        result = CliRunner().invoke(cli, ["status", *args], obj=state)
        assert result.exit_code == 2, (args, result.output)
        assert text in result.output, (args, result.output)
    assert not os.path.exists(local_store.url)  # refused before the store was touched
    # A zero interval would refresh in a busy loop: refused (a subprocess, in case it is not).
    zero = subprocess.run(
        [ONCELOG, "--store", local_store.url, "status", "--watch", "--interval", "0s"],
        stdin=subprocess.DEVNULL, capture_output=True, timeout=TIMEOUT,
    )
    assert zero.returncode == 2 and b"must be more than 0s" in zero.stderr, zero.stderr


# -- --watch, as the console script ------------------------------------------------------------



class _Lines:
    """A process's stdout lines, read by a thread, taken with a deadline."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._queue: queue.Queue[str | None] = queue.Queue()
        assert proc.stdout is not None
        stdout = proc.stdout

        def pump() -> None:
            for line in stdout:
                self._queue.put(line.decode())
            self._queue.put(None)

        threading.Thread(target=pump, daemon=True).start()
        self._current: list[str] | None = None  # the frame being read, once one started

    def frames(self, count: int, deadline: float) -> list[list[str]]:
        """The next `count` whole frames (a frame ends where the next one starts)."""
        frames: list[list[str]] = []
        while len(frames) < count:
            line = self._queue.get(timeout=max(deadline - time.monotonic(), 0.001))
            assert line is not None, f"stdout closed after {len(frames)} frames"
            if line.startswith(HEADER):
                if self._current is not None:
                    frames.append(self._current)
                self._current = []
            if self._current is not None:
                self._current.append(line.rstrip("\n"))
        return frames


@pytest.fixture
def watcher(local_store: StoreTarget) -> Iterator[tuple[JournalClient, subprocess.Popen[bytes]]]:
    client = local_store.open()
    client.create(JournalSpec("st/a", JSONL))
    client.append("st/a", b'{"n": 1}\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ONCELOG_", "AWS_"))}
    env["ONCELOG_STORE"] = local_store.url
    proc = subprocess.Popen(
        [ONCELOG, "status", "--watch", "--interval", "0.2s"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        yield client, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=TIMEOUT)
        client.close()


def _rate(frame: list[str]) -> str:
    return _rows("\n".join(frame), "JOURNALS (1)")["st/a"][3]


Watcher = tuple[JournalClient, subprocess.Popen[bytes]]


def test_watch_refreshes_until_ctrl_c(watcher: Watcher) -> None:
    client, proc = watcher
    lines = _Lines(proc)
    deadline = time.monotonic() + TIMEOUT
    (first,) = lines.frames(1, deadline)
    assert _rate(first) == "-"  # no earlier frame to compare with
    before = client.head("st/a")
    client.append("st/a", b'{"n": 2, "pad": "' + b"x" * 1000 + b'"}\n')
    after = client.head("st/a")
    # The first frame that sees the new head compares it with the old one: a rate above 0.
    seen: list[list[str]] = []
    while True:
        assert time.monotonic() < deadline, seen
        (frame,) = lines.frames(1, deadline)
        seen.append(frame)
        head = int(_rows("\n".join(frame), "JOURNALS (1)")["st/a"][1])
        assert head in (before, after)
        if head == after:
            break
        assert _rate(frame) == "0B/s"  # refreshed, nothing written meanwhile
    assert _rate(frame) not in ("-", "0B/s")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err.decode()
    assert b"Traceback" not in err and b"error" not in err, err.decode()
