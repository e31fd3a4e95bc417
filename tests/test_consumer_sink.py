"""The external transactional store (SQLiteSink): statements recorded by the handler are
applied once per claimed commit, fenced by the (group, shard) row's seq, across crashes at
every stage, SIGKILLs and zombies."""

from __future__ import annotations

import json
import random
import sqlite3
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from consumer_support import INPUTS, SELECTOR, create_journals, kill_children, write_upstream

from oncelog.consumer import (
    OPTIONAL_STAGES,
    STAGES,
    CheckpointStore,
    Consumer,
    ConsumerError,
    FencedOut,
    SQLiteSink,
    Transaction,
    prune_checkpoints,
)
from oncelog.journal import open_journals
from oncelog.message import Envelope
from oncelog.reading import read_committed
from oncelog.testing.faults import kill_after_writes

HERE = Path(__file__).resolve()
SETUP = ("CREATE TABLE IF NOT EXISTS words (word TEXT PRIMARY KEY, n INTEGER NOT NULL)",
         "CREATE TABLE IF NOT EXISTS lines (src TEXT, i INTEGER, text TEXT)")


def to_db(env: Envelope, txn: Transaction) -> None:
    seen = txn.state.setdefault("seen", {})
    i = seen.get(env.journal, 0)
    seen[env.journal] = i + 1
    text = env.message.doc["text"]
    txn.sink.execute("INSERT INTO lines VALUES (?, ?, ?)", (env.journal, i, text))
    txn.sink.executemany(
        "INSERT INTO words VALUES (?, 1) ON CONFLICT (word) DO UPDATE SET n = n + 1",
        [(w,) for w in env.message.doc["text"].split()],
    )


def sink_consumer(client: Any, path: str, **kw: Any) -> Consumer:
    kw.setdefault("max_messages", 5)
    kw.setdefault("keep_checkpoints", 3)
    return Consumer(client, "sink", SELECTOR, to_db, initial_state={},
                    sink=SQLiteSink(path, SETUP), **kw)


def expected(client: Any) -> tuple[Counter, dict[str, int]]:
    lines: Counter = Counter()
    words: Counter = Counter()
    for journal in INPUTS:
        for i, env in enumerate(read_committed(client, journal)):
            lines[(journal, i, env.message.doc["text"])] += 1
            words.update(env.message.doc["text"].split())
    return lines, dict(words)


def in_db(path: str) -> tuple[Counter, dict[str, int]]:
    db = sqlite3.connect(path)
    lines = Counter(tuple(r) for r in db.execute("SELECT src, i, text FROM lines"))
    words = dict(db.execute("SELECT word, n FROM words").fetchall())
    db.close()
    return lines, words


def test_sink_applies_each_commit_once(local_store, tmp_path) -> None:
    client = local_store.open()
    create_journals(client)
    write_upstream(client, seed=1)
    path = str(tmp_path / "out.db")
    consumer = sink_consumer(client, path)
    commits = consumer.run(until_idle=True)
    consumer.close()
    assert commits > 3
    assert in_db(path) == expected(client)
    latest = CheckpointStore(client, "sink").latest()
    assert latest is not None
    applied = SQLiteSink(path).applied("sink")
    assert applied is not None and applied[0] <= latest.seq
    # A restart re-applies nothing (the database has the latest commit already).
    sink_consumer(client, path).run(until_idle=True)
    assert in_db(path) == expected(client)
    prune_checkpoints(client, "sink", keep=1)
    assert len([n for n in client.meta.list("checkpoints/sink/state")
                if n.endswith(".ops")]) <= 1


def test_sink_is_fenced_and_idempotent(memory_store, tmp_path) -> None:
    client = memory_store.open()
    create_journals(client)
    write_upstream(client, seed=2)
    path = str(tmp_path / "out.db")
    sink = SQLiteSink(path, SETUP)
    engine = sink.open(client, "checkpoints/x", "x", None)
    engine.writer.execute("INSERT INTO lines VALUES (?, ?, ?)", ("a", 1, "one"))
    _ref, data1, _ = engine.prepare(1)
    engine.writer.execute("INSERT INTO lines VALUES (?, ?, ?)", ("a", 2, "two"))
    _ref, data2, _ = engine.prepare(2)
    assert data1 is not None and data2 is not None
    assert engine.apply(data1, "t") and engine.apply(data2, "t")
    assert not engine.apply(data2, "t")  # applied already
    assert not engine.apply(data1, "t")  # a zombie's older commit: fenced
    assert sum(in_db(path)[0].values()) == 2
    assert engine.prepare(3) == (None, None, None)  # nothing recorded: nothing written
    engine.writer.execute("INSERT INTO lines VALUES (?, ?, ?)", ("a", 3, object()))
    with pytest.raises(ConsumerError, match="JSON"):
        engine.prepare(3)
    engine.close()
    with pytest.raises(ConsumerError, match="no sink"):
        Consumer(client, "n", SELECTOR, lambda env, txn: txn.sink).run(until_idle=True)


class Crash(Exception):
    pass


@pytest.mark.parametrize("seed", range(12))
def test_crashes_at_every_stage(memory_store, tmp_path, seed) -> None:
    rng = random.Random(seed)
    client = memory_store.open()
    create_journals(client)
    write_upstream(client, seed=10 + seed, transactions=24)
    path = str(tmp_path / "out.db")
    # (no journal outputs: no ACK intents, so no "acked")
    stages = [s for s in (*STAGES, *OPTIONAL_STAGES) if s not in ("recovered", "acked")]
    crashes = 0
    for _ in range(30):
        stage, nth = rng.choice(stages), rng.randint(1, 3)
        seen = [0]

        def on_stage(name: str, stage: str = stage, nth: int = nth, seen: list = seen) -> None:
            if name == stage:
                seen[0] += 1
                if seen[0] == nth:
                    raise Crash(name)

        consumer = sink_consumer(client, path, on_stage=on_stage if crashes < 5 else None,
                                 split_upstream=seed % 2 == 0)
        try:
            consumer.run(until_idle=True)
        except Crash:
            crashes += 1
            continue
        break
    assert crashes >= 1
    assert in_db(path) == expected(client), (seed, crashes)


def test_a_zombie_never_applies(memory_store, tmp_path) -> None:
    client = memory_store.open()
    create_journals(client)
    write_upstream(client, seed=3)
    path = str(tmp_path / "out.db")
    zombie = sink_consumer(client, path)
    zombie.run(max_transactions=1)
    sink_consumer(client, path).run(until_idle=True)  # takes over, drains
    with pytest.raises(FencedOut):
        zombie.run(until_idle=True)
    assert in_db(path) == expected(client)


# -- SIGKILL after a random storage write ----------------------------------------------------


def child(url: str, options: str, path: str, kill_at: int) -> int:
    client = open_journals(url, **json.loads(options))
    kill_after_writes(client, kill_at)
    sink_consumer(client, path).run(until_idle=True)
    client.close()
    return 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_sigkill_at_random_storage_writes(local_store, tmp_path, seed) -> None:
    rng = random.Random(seed)
    client = local_store.open()
    create_journals(client)
    write_upstream(client, seed=20 + seed)
    path = str(tmp_path / "out.db")
    options = json.dumps(local_store.storage_options)
    kills = kill_children(
        HERE, rng, attempts=5, kills=4, high=45,
        argv=lambda kill_at: ["child", local_store.url, options, path, str(kill_at)],
    )
    assert in_db(path) == expected(client), kills


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "child":
        _, _, url, options, path, kill_at = sys.argv
        sys.exit(child(url, options, path, int(kill_at)))
    sys.exit(f"usage: {sys.argv[0]} child URL OPTIONS DB KILL_AT")
