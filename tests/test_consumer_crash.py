"""Crash injection and racing instances: consumers killed with SIGKILL at random points of
their transactions, restarted, must leave exactly the outputs of a crash-free run.

This file is also the child process: `python tests/test_consumer_crash.py child ...`.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from consumer_support import (  # noqa: E402
    INPUTS,
    RARE,
    committed_echo,
    create_journals,
    echo_consumer,
    expected_echo,
    expected_words,
    to,
    write_upstream,
)

from oncelog.consumer import STAGES, CheckpointStore, FencedOut  # noqa: E402
from oncelog.journal import open_journals  # noqa: E402
from oncelog.message import JSONMessage  # noqa: E402
from oncelog.publisher import Publisher  # noqa: E402
from oncelog.reading import read_committed, read_uncommitted  # noqa: E402

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve()
# The highest occurrence of each stage a crash is scheduled at (a run has ~8 transactions,
# ~30 handled messages, two ACK intents per commit).
LAST_OCCURRENCE = {stage: 6 for stage in STAGES} | {"recovered": 1, "handler": 25, "acked": 10}
FENCED_EXIT = 3
CHILD_TIMEOUT = 60


# -- the child process --------------------------------------------------------------------------


def child(
    url: str, options: str, group: str, stage: str, nth: int, mode: str, max_messages: int
) -> int:
    client = open_journals(url, **json.loads(options))
    seen = 0
    lock = threading.Lock()

    def on_stage(name: str) -> None:
        nonlocal seen
        if name != stage:
            return
        with lock:
            seen += 1
            if seen == nth:
                os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no flush: a crash

    if mode == "race":
        # Restart whenever fenced out by the other instance, until the input is drained.
        fenced = 0
        for _ in range(200):
            try:
                echo_consumer(client, group, keep_checkpoints=None).run(until_idle=True)
                break
            except FencedOut:
                fenced += 1
        print(json.dumps({"fenced": fenced}), flush=True)
        client.close()
        return 0
    consumer = echo_consumer(
        client, group, on_stage=on_stage if stage else None, max_messages=max_messages
    )
    if mode == "timer":  # die after `nth` milliseconds, wherever the consumer then is
        timer = threading.Timer(nth / 1000, os.kill, (os.getpid(), signal.SIGKILL))
        timer.daemon = True
        timer.start()
    try:
        consumer.run(until_idle=True)
    except FencedOut:
        return FENCED_EXIT
    client.close()
    return 0


# -- the tests -----------------------------------------------------------------------------------


def spawn(
    target, group: str, stage: str = "", nth: int = 0, mode: str = "crash", max_messages: int = 5
) -> subprocess.Popen:
    args = [sys.executable, str(HERE), "child", target.url, json.dumps(target.storage_options),
            group, stage, str(nth), mode, str(max_messages)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    out, err = proc.communicate(timeout=CHILD_TIMEOUT)
    if proc.returncode not in (0, -signal.SIGKILL, FENCED_EXIT):
        pytest.fail(f"consumer child failed with {proc.returncode}:\n{err}")
    return proc.returncode, out


def latest_state(client, group: str):
    cp = CheckpointStore(client, group).latest()
    assert cp is not None
    return cp.state


def crash_and_recover(target, seed: int, transactions: int = 12) -> list[str]:
    """Run the echo consumer, killing it at random stages, until one run completes;
    returns the crash points that were hit."""
    rng = random.Random(seed)
    client = target.open()
    create_journals(client)
    write_upstream(client, seed, transactions)
    hits = []
    for _ in range(12):
        if len(hits) < 3:
            stage = rng.choice(STAGES)
            nth = rng.randint(1, LAST_OCCURRENCE[stage])
        else:
            stage, nth = "", 0
        code, _ = finish(spawn(target, "echo", stage, nth))
        if code == 0:
            break
        assert code == -signal.SIGKILL, code
        hits.append(f"{stage}#{nth}")
    else:
        pytest.fail(f"the consumer never completed (crashes: {hits})")

    assert committed_echo(client) == expected_echo(client), hits
    assert latest_state(client, "echo")["words"] == expected_words(client), hits
    client.close()
    return hits


@pytest.mark.parametrize("seed", range(4))
def test_sigkill_at_random_times_keeps_outputs_exactly_once(local_store, seed):
    """Killed after a random delay: anywhere, including inside storage calls."""
    rng = random.Random(1000 + seed)
    client = local_store.open()
    create_journals(client)
    write_upstream(client, 1000 + seed)
    kills = 0
    for _ in range(10):
        delay_ms = rng.randint(1, 150) if kills < 3 else 60_000
        code, _ = finish(spawn(local_store, "echo", "", delay_ms, mode="timer"))
        if code == 0:
            break
        kills += 1
    else:
        pytest.fail("the consumer never completed")
    assert committed_echo(client) == expected_echo(client), kills
    assert latest_state(client, "echo")["words"] == expected_words(client), kills


def test_crash_free_child_run_matches_the_committed_input(local_store):
    client = local_store.open()
    create_journals(client)
    write_upstream(client, seed=100)
    code, _ = finish(spawn(local_store, "echo"))
    assert code == 0
    expected = expected_echo(client)
    assert sum(expected.values()) > 20
    assert committed_echo(client) == expected
    assert latest_state(client, "echo")["words"] == expected_words(client)


@pytest.mark.parametrize("seed", range(12))
def test_sigkill_at_random_points_keeps_outputs_exactly_once(local_store, seed):
    crash_and_recover(local_store, seed)


def test_sigkill_on_s3_keeps_outputs_exactly_once(s3_store):
    crash_and_recover(s3_store, seed=201, transactions=8)


@pytest.mark.parametrize(
    "stage", ["flushed", "checkpoint", "checkpointed", "acked", "committed", "handler"]
)
def test_sigkill_at_each_commit_stage(local_store, stage):
    """Each stage, deterministically: before, at and after the checkpoint write, between
    the checkpoint and the ACKs, between two ACKs, and inside the handler."""
    client = local_store.open()
    create_journals(client)
    write_upstream(client, seed=300)
    code, _ = finish(spawn(local_store, "echo", stage, 2))
    assert code == -signal.SIGKILL
    code, _ = finish(spawn(local_store, "echo"))
    assert code == 0
    assert committed_echo(client) == expected_echo(client)
    assert latest_state(client, "echo")["words"] == expected_words(client)


def test_recovery_never_commits_what_a_crash_left_pending(local_store):
    """Transaction 1 writes the two outputs; transaction 2 also writes RARE, then the
    process dies with those outputs durable but not checkpointed. Re-appending checkpoint
    1's ACKs does not touch RARE: the recovered instance must not acknowledge the dead
    one's pending message there (it publishes under a new producer ID)."""
    client = local_store.open()
    create_journals(client)
    publisher = Publisher(client)
    for text in ("alpha", "zeta beta gamma"):
        publisher.publish_committed(to(INPUTS[0]), JSONMessage({"text": text}))
    publisher.flush()
    code, _ = finish(spawn(local_store, "echo", "flushed", 2, max_messages=1))
    assert code == -signal.SIGKILL
    assert len(list(read_uncommitted(client, RARE))) == 1  # the dead instance's output
    code, _ = finish(spawn(local_store, "echo", max_messages=1))
    assert code == 0
    assert [e.message.doc["i"] for e in read_committed(client, RARE)] == [1]
    assert committed_echo(client) == expected_echo(client)


def test_two_racing_instances_commit_exactly_once(local_store):
    client = local_store.open()
    create_journals(client)
    write_upstream(client, seed=400, transactions=30)
    procs = [spawn(local_store, "echo", mode="race") for _ in range(2)]
    results = [finish(p) for p in procs]
    assert [code for code, _ in results] == [0, 0]
    assert committed_echo(client) == expected_echo(client)
    assert latest_state(client, "echo")["words"] == expected_words(client)
    # Checkpoints form one unbroken chain: each number was committed by exactly one writer.
    store = CheckpointStore(client, "echo")
    seqs = store.seqs()
    assert seqs == list(range(1, seqs[-1] + 1))
    assert all(store.load(s).writer is not None for s in seqs)


if __name__ == "__main__":
    if len(sys.argv) == 9 and sys.argv[1] == "child":
        _, _, url, options, group, stage, nth, mode, max_messages = sys.argv
        sys.exit(child(url, options, group, stage, int(nth), mode, int(max_messages)))
    sys.exit(f"usage: {sys.argv[0]} child URL OPTIONS GROUP STAGE NTH MODE MAX_MESSAGES")
