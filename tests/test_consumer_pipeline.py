"""The commit pipeline's asynchrony: two commits in flight on the consumer's commit thread,
and SQLite state snapshots written in the background for the next checkpoint to reference.
Each is SIGKILLed at the points the asynchrony opens, restarted, and must leave exactly the
outputs and state of a crash-free run.

This file is also the child process: `python tests/test_consumer_pipeline.py child ...`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from consumer_support import (  # noqa: E402
    committed_echo,
    create_journals,
    echo_consumer,
    expected_echo,
    expected_words,
    write_upstream,
)
from test_consumer_state import STATE_DIR, check_exactly_once, kv_consumer  # noqa: E402

from oncelog.consumer import CheckpointStore, Consumer, SQLiteState  # noqa: E402
from oncelog.consumer.state import is_sqlite_ref  # noqa: E402
from oncelog.coordination import MetaStore
from oncelog.journal import open_journals  # noqa: E402
from oncelog.testing.processes import run_python  # noqa: E402

HERE = Path(__file__).resolve()
CHILD_TIMEOUT = 120
WAIT = 30.0  # seconds: a bound on the waits below, which never take that long


class Boom(Exception):
    pass


def hold_until_next_commit_submitted(consumer: Consumer, stage: str, nth: int, then: Any):
    """An `on_stage` hook: at the `nth` `stage` on the commit thread, wait until the
    consumer's thread has submitted the commit after the one being written (two commits in
    flight), then call `then()`. Returns the hook and an event set once `then` is called."""
    cond = threading.Condition()
    submitted = 0  # commits submitted
    current = 0  # the commit being written (its number in submission order)
    seen = 0
    reached = threading.Event()
    real_submit = consumer._pipeline.worker.submit

    def submit(job: Any) -> None:
        nonlocal submitted
        real_submit(job)
        with cond:
            submitted += 1
            cond.notify_all()

    def on_stage(name: str) -> None:
        nonlocal current, seen
        if threading.current_thread() is threading.main_thread():
            return  # recovery's ACKs, the handler...
        if name == "flushed":
            current += 1  # the first stage of each commit
        if name != stage:
            return
        seen += 1
        if seen == nth:
            with cond:
                assert cond.wait_for(lambda: submitted > current, WAIT), "no next commit"
            reached.set()
            then()

    consumer._pipeline.worker.submit = submit  # type: ignore[method-assign]
    return on_stage, reached


# -- the child process --------------------------------------------------------------------------


def child(url: str, options: str, mode: str, stage: str, nth: int) -> int:
    client = open_journals(url, **json.loads(options))

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no flush: a crash

    if mode == "inflight":
        consumer = echo_consumer(client, max_messages=3)
        hook, _ = hold_until_next_commit_submitted(consumer, stage, nth, die)
        consumer._on_stage = hook
    elif mode == "snapshot":
        seen = [0]

        def on_stage(name: str) -> None:
            if name == stage:
                seen[0] += 1
                if seen[0] == nth:
                    die()

        consumer = kv_consumer(client, state=SQLiteState(snapshot_every=2),
                               on_stage=on_stage if stage else None)
    else:
        consumer = echo_consumer(client, max_messages=3)
    consumer.run(until_idle=True)
    client.close()
    return 0


def run_child(target: Any, mode: str, stage: str = "", nth: int = 0) -> int:
    proc = run_python(
        [sys.executable, str(HERE), "child", target.url, json.dumps(target.storage_options),
         mode, stage, str(nth)],
        text=True, timeout=CHILD_TIMEOUT,
    )
    if proc.returncode not in (0, -signal.SIGKILL):
        pytest.fail(f"consumer child failed with {proc.returncode}:\n{proc.stderr}")
    return proc.returncode


# -- two commits in flight -------------------------------------------------------------------------


@pytest.mark.parametrize(("stage", "nth"), [("acked", 1), ("acked", 3), ("committed", 2)])
def test_sigkill_with_two_commits_in_flight(local_store, stage, nth) -> None:
    """Killed while commit N is past its claim (ACKs started) and commit N+1 is queued
    behind it: recovery re-appends N's ACKs, and N+1's outputs are never acknowledged."""
    client = local_store.open()
    create_journals(client)
    write_upstream(client, seed=800)
    assert run_child(local_store, "inflight", stage, nth) == -signal.SIGKILL
    assert run_child(local_store, "plain") == 0
    assert committed_echo(client) == expected_echo(client)
    cp = CheckpointStore(client, "echo").latest()
    assert cp is not None and cp.state["words"] == expected_words(client)


def test_a_failed_commit_stops_the_commit_queued_behind_it(local_store) -> None:
    """Commit N fails after its claim with commit N+1 queued: N+1 writes nothing (no
    checkpoint N+1), run() raises, and the next run() recovers exactly once."""
    client = local_store.open()
    create_journals(client)
    write_upstream(client, seed=801)
    consumer = echo_consumer(client, max_messages=3)
    store = CheckpointStore(client, "echo")
    claimed: list[int] = []

    def fail() -> None:
        claimed.append(store.seqs()[-1])
        raise Boom("after the claim")

    hook, reached = hold_until_next_commit_submitted(consumer, "acked", 2, fail)
    consumer._on_stage = hook
    with pytest.raises(Boom):
        consumer.run(until_idle=True)
    assert reached.is_set()
    # Nothing was claimed after the failed commit's checkpoint (its recovery comes next).
    assert store.seqs()[-1] == claimed[0]
    consumer._on_stage = None
    consumer.run(until_idle=True)
    consumer.close()
    assert committed_echo(client) == expected_echo(client)
    cp = store.latest()
    assert cp is not None and cp.state["words"] == expected_words(client)


# -- SQLite state snapshots in the background --------------------------------------------------


def test_snapshot_is_written_in_the_background_for_the_next_checkpoint(memory_store) -> None:
    """With snapshot_every=3: a commit whose reference reaches 2 deltas starts a snapshot;
    the next checkpoint references it, named by its own number, with its delta after it."""
    client = memory_store.open()
    create_journals(client)
    write_upstream(client, seed=803)
    stages: list[str] = []
    consumer = kv_consumer(client, keep_checkpoints=None, on_stage=stages.append, max_messages=2)
    assert consumer.run(until_idle=True) > 8
    consumer.close()
    store = CheckpointStore(client, "kv")
    refs = {s: store.load(s).state for s in store.seqs()}
    snapshots = [(s, r) for s, r in refs.items() if is_sqlite_ref(r) and r["snapshot"]]
    assert snapshots and "snapshot" in stages
    for seq, ref in snapshots:
        assert len(ref["deltas"]) < 3
        before = refs.get(seq - 1) or {}
        if ref["snapshot"] != before.get("snapshot"):  # this one first references it
            assert int(ref["snapshot"][:16], 16) == seq
            assert len(before["deltas"]) == 2  # the commit before wrote a delta
    assert all(len(r["deltas"]) < 3 for r in refs.values() if is_sqlite_ref(r))
    check_exactly_once(client)


def test_a_failed_background_snapshot_fails_the_commit_that_references_it(
    memory_store, monkeypatch
) -> None:
    """The snapshot's write fails: the checkpoint that would reference it is never
    claimed (run() raises the write's error), and the next run() recovers exactly once."""
    client = memory_store.open()
    create_journals(client)
    write_upstream(client, seed=805)
    real = MetaStore.put_if_absent
    failed: list[str] = []

    def put_if_absent(meta: MetaStore, path: str, data: bytes) -> bool:
        if path.endswith(".sqlite") and not failed:
            failed.append(path)
            raise Boom(path)
        return real(meta, path, data)

    monkeypatch.setattr(MetaStore, "put_if_absent", put_if_absent)
    consumer = kv_consumer(client, keep_checkpoints=None)
    with pytest.raises(Boom):
        consumer.run(until_idle=True)
    store = CheckpointStore(client, "kv")
    refs = [store.load(s).state for s in store.seqs()]
    assert failed and all(
        not is_sqlite_ref(r) or r["snapshot"] != failed[0].rsplit("/", 1)[1] for r in refs
    )
    consumer.run(until_idle=True)
    consumer.close()
    check_exactly_once(client)


@pytest.mark.parametrize(("stage", "nth"), [("snapshot", 1), ("snapshot", 2), ("checkpoint", 4)])
def test_sigkill_around_a_background_snapshot(local_store, stage, nth) -> None:
    """Killed once a background snapshot is durable but before the checkpoint referencing
    it is claimed (or right before that claim): the snapshot is unreferenced garbage, the
    recovered state is the previous checkpoint's, and the final state is exact."""
    client = local_store.open()
    create_journals(client)
    write_upstream(client, seed=804)
    assert run_child(local_store, "snapshot", stage, nth) == -signal.SIGKILL
    if stage == "snapshot":
        names = client.meta.list(STATE_DIR)
        latest = CheckpointStore(client, "kv").latest()
        assert latest is not None
        referenced = (latest.state or {}).get("snapshot")
        assert any(n.endswith(".sqlite") and n != referenced for n in names)
    assert run_child(local_store, "snapshot") == 0
    check_exactly_once(client, (stage, nth))


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "child":
        _, _, url, options, mode, stage, nth = sys.argv
        sys.exit(child(url, options, mode, stage, int(nth)))
    sys.exit(f"usage: {sys.argv[0]} child URL OPTIONS MODE STAGE NTH")
