"""Transactions that end inside large upstream transactions (`split_upstream=True`):
bounded transactions, exactly once across crashes at every stage, in both handler modes."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

sys.path.insert(0, str(Path(__file__).parent))

from consumer_support import (
    INPUTS,
    SELECTOR,
    committed_echo,
    create_journals,
    echo,
    expected_echo,
    expected_words,
    kill_children,
    to,
)
from test_consumer_machine import (
    count_words,
    last_totals,
    publish_totals,
    word_counts,
)

from oncelog.consumer import STAGES, CheckpointStore, Consumer, SQLiteState, Transaction
from oncelog.journal import open_journals
from oncelog.message import Envelope, JSONMessage
from oncelog.publisher import Publisher
from oncelog.testing import consumer_machine
from oncelog.testing.faults import kill_after_writes


def big_upstream(client: Any, seed: int, size: int = 60, transactions: int = 3) -> None:
    """Upstream transactions far larger than the consumers' max_messages, over both
    inputs, interleaved with committed messages of another producer and a rollback."""
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "epsilon"]
    other = Publisher(client)
    for t in range(transactions):
        pub = Publisher(client)
        for _ in range(size):
            text = " ".join(rng.choices(words, k=rng.randint(1, 3)))
            pub.publish_uncommitted(to(rng.choice(INPUTS)), JSONMessage({"text": text, "t": t}))
            if rng.random() < 0.1:
                other.publish_committed(to(rng.choice(INPUTS)), JSONMessage({"text": "solo"}))
        pub.flush()
        other.flush()
        if t == 1:
            pub.rollback()
        else:
            pub.append_intents(pub.build_ack_intents())


def batch_echo(envs: list[Envelope], txn: Transaction) -> None:
    for env in envs:
        echo(env, txn)


def split_consumer(client: Any, batch: bool = False, **kw: Any) -> Consumer:
    kw.setdefault("max_messages", 7)
    kw.setdefault("initial_state", {})
    if batch:
        return Consumer(client, "split", SELECTOR, batch_handler=batch_echo, split_upstream=True,
                        read_batch=5, **kw)
    return Consumer(client, "split", SELECTOR, echo, split_upstream=True, **kw)


def latest_words(client: Any) -> dict[str, int]:
    cp = CheckpointStore(client, "split").latest()
    assert cp is not None
    return cp.state["words"]


@pytest.mark.parametrize("batch", [False, True])
@pytest.mark.parametrize("buffer", [4, 1024])
def test_transactions_stay_bounded_inside_large_upstream_transactions(
    memory_store, batch, buffer
) -> None:
    client = memory_store.open()
    create_journals(client)
    big_upstream(client, seed=1)
    sizes: list[int] = []
    consumer = split_consumer(client, batch, buffer=buffer,
                              finalize=lambda txn: sizes.append(txn.messages))
    consumer.run(until_idle=True)
    consumer.close()
    assert max(sizes) <= 7 and sum(sizes) >= 120 and len(sizes) >= 120 // 7
    assert committed_echo(client) == expected_echo(client)
    assert latest_words(client) == expected_words(client)


def test_without_split_a_transaction_takes_the_whole_upstream_one(memory_store) -> None:
    client = memory_store.open()
    create_journals(client)
    big_upstream(client, seed=2, transactions=1)
    sizes: list[int] = []
    Consumer(client, "whole", SELECTOR, echo, initial_state={}, max_messages=7,
             finalize=lambda txn: sizes.append(txn.messages)).run(until_idle=True)
    assert max(sizes) > 3 * 7  # one per input journal: each has its own ACK


class Crash(Exception):
    pass


CRASH_STAGES = [s for s in STAGES if s != "recovered"]


@pytest.mark.parametrize("seed", range(16))
def test_crashes_at_random_stages_are_exactly_once(memory_store, seed) -> None:
    """Crash at random stages (mid upstream transaction), then recover in a new instance
    (which replays the upstream transaction from its start and skips what was handled)."""
    rng = random.Random(seed)
    client = memory_store.open()
    create_journals(client)
    big_upstream(client, seed=100 + seed, size=40)
    batch = seed % 2 == 1
    buffer = rng.choice([3, 1024])
    crashes = 0
    for _ in range(30):
        stage, nth = rng.choice(CRASH_STAGES), rng.randint(1, 3)
        seen = [0]

        def on_stage(name: str, stage: str = stage, nth: int = nth, seen: list = seen) -> None:
            if name == stage:
                seen[0] += 1
                if seen[0] == nth:
                    raise Crash(name)

        consumer = split_consumer(client, batch, buffer=buffer,
                                  on_stage=on_stage if crashes < 6 else None)
        try:
            consumer.run(until_idle=True)
        except Crash:
            crashes += 1
            continue
        consumer.close()
        break
    else:
        pytest.fail("never completed")
    assert crashes >= 2
    assert committed_echo(client) == expected_echo(client), (seed, crashes)
    assert latest_words(client) == expected_words(client), (seed, crashes)


def test_split_with_sqlite_state(local_store) -> None:
    client = local_store.open()
    create_journals(client)
    big_upstream(client, seed=5)

    def handler(env: Envelope, txn: Transaction) -> None:
        assert txn.kv is not None
        for word in env.message.doc["text"].split():
            txn.kv.put(word, txn.kv.get(word, 0) + 1)

    consumer = Consumer(client, "kv", SELECTOR, handler, split_upstream=True, max_messages=5,
                        state=SQLiteState(snapshot_every=4))
    consumer.run(until_idle=True)
    assert consumer.kv is not None and consumer.kv.to_dict() == expected_words(client)


RUN = settings(max_examples=30, stateful_step_count=30, deadline=None, database=None,
               suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("batch", [False, True])
def test_state_machine_with_split_upstream(batch) -> None:
    """The machine's upstream batches hold up to 6 messages; max_messages is 2."""
    handler = count_words
    if batch:
        def handler(envs: list[Envelope], txn: Transaction) -> None:  # type: ignore[misc]
            for env in envs:
                count_words(env, txn)

    machine = consumer_machine(
        handler, word_counts, view=last_totals, finalize=publish_totals, batch=batch,
        initial_state={"counts": {}, "published": {}}, max_messages=2,
        consumer_options={"split_upstream": True}, name="SplitMachine",
    )
    run_state_machine_as_test(machine, settings=RUN)


# -- SIGKILL after a random storage write, inside large upstream transactions ------------------

HERE = Path(__file__).resolve()


def child(url: str, options: str, kill_at: int, batch: bool) -> int:
    client = open_journals(url, **json.loads(options))
    kill_after_writes(client, kill_at)
    split_consumer(client, batch, buffer=8, keep_checkpoints=3).run(until_idle=True)
    client.close()
    return 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_sigkill_inside_large_upstream_transactions(local_store, seed) -> None:
    """Upstream transactions of 40 messages, consumer transactions of 7, a ring of 8
    (replays), SIGKILLed after random storage writes: outputs and state exactly once."""
    rng = random.Random(seed)
    client = local_store.open()
    create_journals(client)
    big_upstream(client, seed=300 + seed, size=40)
    options = json.dumps(local_store.storage_options)
    mode = "batch" if seed % 2 else "each"
    # Early in each child (a crash-free run makes 70-80 storage writes, a resumed one
    # fewer): every child but the last dies, with recovery, commits and splits reached.
    kills = kill_children(
        HERE, rng, attempts=6, kills=4, high=15,
        argv=lambda kill_at: ["child", local_store.url, options, str(kill_at), mode],
    )
    assert kills == 4
    assert committed_echo(client) == expected_echo(client), (seed, kills)
    assert latest_words(client) == expected_words(client), (seed, kills)


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "child":
        _, _, url, options, kill_at, mode = sys.argv
        sys.exit(child(url, options, int(kill_at), mode == "batch"))
    sys.exit(f"usage: {sys.argv[0]} child URL OPTIONS KILL_AT each|batch")
