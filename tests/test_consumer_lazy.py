"""Consumers reading lazily (`Consumer(lazy=True)`): inputs arrive as JSONLines, parsed only
when used, with exactly-once outputs, also across SIGKILLs."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest
from consumer_support import (
    INPUTS,
    SELECTOR,
    committed_echo,
    create_journals,
    echo,
    echo_consumer,
    expected_echo,
    kill_children,
    write_upstream,
)

from oncelog.consumer import Consumer, Transaction
from oncelog.journal import open_journals
from oncelog.message import Envelope, JSONLine
from oncelog.reading import read_committed
from oncelog.testing.faults import kill_after_writes

HERE = Path(__file__).resolve()


def test_a_lazy_consumer_produces_what_an_eager_one_does(local_store: Any) -> None:
    client = local_store.open()
    create_journals(client)
    write_upstream(client, seed=41)
    kinds: set[type] = set()

    def handler(env: Envelope, txn: Transaction) -> None:
        kinds.add(type(env.message))
        echo(env, txn)

    Consumer(client, "lazy", SELECTOR, handler, lazy=True, max_messages=5,
             initial_state={}).run(until_idle=True)
    assert kinds == {JSONLine}
    assert committed_echo(client) == expected_echo(client)


def test_a_forwarding_batch_consumer_never_parses(local_store: Any) -> None:
    """A batch handler that only forwards each line's bytes: no document is parsed."""
    client = local_store.open()
    create_journals(client)
    write_upstream(client, seed=42)
    parsed: list[bool] = []
    forwarded: list[bytes] = []

    def forward(envs: list[Envelope], txn: Transaction) -> None:
        for env in envs:
            forwarded.append(env.message.line)
            parsed.append(env.message.parsed)

    Consumer(client, "fwd", SELECTOR, batch_handler=forward, lazy=True).run(until_idle=True)
    assert forwarded and not any(parsed)
    # Exactly the committed messages' frames, byte for byte.
    expected = []
    for journal in INPUTS:
        for env in read_committed(client, journal):
            with client.read(journal, env.begin) as reader:
                expected.append(reader.read(env.end - env.begin))
    assert sorted(forwarded) == sorted(expected)


def test_lazy_and_new_message_are_exclusive(local_store: Any) -> None:
    client = local_store.open()
    with pytest.raises(ValueError, match="new_message"):
        Consumer(client, "x", SELECTOR, echo, lazy=True, new_message=dict)


def child(url: str, options: str, kill_at: int) -> int:
    client = open_journals(url, **json.loads(options))
    kill_after_writes(client, kill_at)
    echo_consumer(client, lazy=True).run(until_idle=True)
    client.close()
    return 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2))
def test_sigkill_at_random_storage_writes_with_lazy_inputs(local_store: Any, seed: int) -> None:
    """SIGKILLed after random storage writes, a lazy echo consumer's outputs are exactly
    those of a crash-free run."""
    rng = random.Random(seed)
    client = local_store.open()
    create_journals(client)
    write_upstream(client, seed=60 + seed)
    options = json.dumps(local_store.storage_options)
    kills = kill_children(
        HERE, rng, attempts=5, kills=3, high=15,
        argv=lambda kill_at: ["child", local_store.url, options, str(kill_at)],
    )
    assert kills == 3
    assert committed_echo(client) == expected_echo(client)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "child":
        sys.exit(child(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    sys.exit(f"usage: {sys.argv[0]} child URL OPTIONS KILL_AT")
