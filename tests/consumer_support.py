"""Shared pieces of the consumer tests: an upstream with rollbacks and duplicates, an echo
pipeline whose outputs do not depend on transaction boundaries, and readers of both."""

from __future__ import annotations

import random
import signal
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

from oncelog.consumer import Consumer, Transaction
from oncelog.journal import JournalClient, JournalSpec
from oncelog.message import Envelope, Flags, JSONMessage
from oncelog.publisher import Publisher
from oncelog.reading import read_committed, read_uncommitted
from oncelog.testing.processes import run_python

NDJSON = "application/x-ndjson"
INPUTS = ("up/in-0", "up/in-1")
OUTPUTS = ("down/out-0", "down/out-1")
RARE = "down/rare"
"""Only some transactions write here: a recovered consumer must not commit what a crashed
one left pending in a journal its last checkpointed transaction did not touch."""
SELECTOR = "role=input"


class Rollback(Exception):
    """Raised inside an upstream transaction to roll it back."""


def create_journals(client: JournalClient, inputs=INPUTS, outputs=(*OUTPUTS, RARE)) -> None:
    for name in inputs:
        client.create(JournalSpec(name, {"content-type": NDJSON, "role": "input"}))
    for name in outputs:
        client.create(JournalSpec(name, {"content-type": NDJSON, "role": "output"}))


def to(journal: str):
    """A mapping to one journal."""
    return lambda _msg: (journal, NDJSON)


def write_upstream(
    client: JournalClient, seed: int, transactions: int = 12, inputs=INPUTS
) -> None:
    """Two producers write sentences to the inputs in transactions, some rolled back; then
    some frames are re-appended as duplicates, and a last transaction is left pending."""
    rng = random.Random(seed)
    producers = [Publisher(client), Publisher(client)]
    words = "alpha beta gamma delta epsilon zeta eta theta".split()
    for t in range(transactions):
        publisher = rng.choice(producers)
        try:
            with publisher.transaction():
                for _ in range(rng.randint(1, 6)):
                    text = " ".join(rng.choices(words, k=rng.randint(1, 5)))
                    publisher.publish_uncommitted(
                        to(rng.choice(inputs)), JSONMessage({"text": text, "t": t})
                    )
                if rng.random() < 0.25:
                    raise Rollback
        except Rollback:
            pass
        if rng.random() < 0.2:
            solo = JSONMessage({"text": "solo", "t": t})
            publisher.publish_committed(to(rng.choice(inputs)), solo)
    # Duplicates: message frames appended again, as a retried append would. (Not ACKs: an
    # old ACK appended again means an upstream consumer recovered an older checkpoint.)
    for journal in inputs:
        envs = [e for e in read_uncommitted(client, journal) if e.flags != Flags.ACK_TXN]
        for env in rng.sample(envs, k=min(4, len(envs))):
            with client.read(journal, env.begin) as reader:
                client.append(journal, reader.read(env.end - env.begin))
    # A transaction that never commits.
    producers[0].publish_uncommitted(to(inputs[0]), JSONMessage({"text": "never", "t": -1}))
    producers[0].flush()


def echo(env: Envelope, txn: Transaction) -> None:
    """One output per input: its journal, its index among that journal's committed
    messages, and its text. Independent of how input is cut into transactions."""
    seen = txn.state.setdefault("seen", {})
    index = seen.get(env.journal, 0)
    seen[env.journal] = index + 1
    words = txn.state.setdefault("words", {})
    for word in env.message.doc["text"].split():
        words[word] = words.get(word, 0) + 1
    out = OUTPUTS[INPUTS.index(env.journal) % len(OUTPUTS)] if env.journal in INPUTS else OUTPUTS[0]
    # Every transaction touches both outputs, so there are two ACK intents to append.
    text = env.message.doc["text"]
    txn.publish(to(out), JSONMessage({"src": env.journal, "i": index, "text": text}))
    if index % 2 == 0:
        other = OUTPUTS[(OUTPUTS.index(out) + 1) % len(OUTPUTS)]
        txn.publish(to(other), JSONMessage({"src": env.journal, "i": index, "mirror": True}))
    if _is_rare(env.message.doc["text"]):
        txn.publish(to(RARE), JSONMessage({"src": env.journal, "i": index, "rare": True}))


def _is_rare(text: str) -> bool:
    words = text.split()
    return len(words) >= 3 and words[0] == "zeta"


def echo_consumer(client: JournalClient, group: str = "echo", **kwargs: Any) -> Consumer:
    kwargs.setdefault("max_messages", 5)
    kwargs.setdefault("initial_state", {})
    return Consumer(client, group, SELECTOR, echo, **kwargs)


def expected_echo(client: JournalClient, inputs=INPUTS) -> Counter:
    """The outputs an exactly-once echo must produce, from the committed input."""
    out: Counter = Counter()
    for journal in inputs:
        for i, env in enumerate(read_committed(client, journal)):
            out[(journal, i, env.message.doc["text"])] += 1
            if i % 2 == 0:
                out[(journal, i, "<mirror>")] += 1
            if _is_rare(env.message.doc["text"]):
                out[(journal, i, "<rare>")] += 1
    return out


def committed_echo(client: JournalClient, outputs=(*OUTPUTS, RARE)) -> Counter:
    """The outputs as read-committed readers see them."""
    out: Counter = Counter()
    for journal in outputs:
        for env in read_committed(client, journal):
            doc = env.message.doc
            kind = "<mirror>" if doc.get("mirror") else "<rare>" if doc.get("rare") else doc["text"]
            out[(doc["src"], doc["i"], kind)] += 1
    return out


def expected_words(client: JournalClient, inputs=INPUTS) -> dict[str, int]:
    counts: Counter = Counter()
    for journal in inputs:
        for env in read_committed(client, journal):
            counts.update(env.message.doc["text"].split())
    return dict(counts)


def kill_children(
    script: Any,
    rng: random.Random,
    attempts: int,
    kills: int,
    high: int,
    argv: Callable[[int], list[str]],
) -> int:
    """Run `python script *argv(kill_at)` until a child completes, at most `attempts` times:
    the first `kills` children with `kill_at` drawn from 1..`high` (the child SIGKILLs
    itself after that many storage writes), the others with no kill point. A child that
    fails otherwise fails the test. Returns how many were killed."""
    killed = 0
    for _ in range(attempts):
        kill_at = rng.randint(1, high) if killed < kills else 10**9
        proc = run_python(
            [sys.executable, str(script), *argv(kill_at)],
            text=True, timeout=120,
        )
        assert proc.returncode in (0, -signal.SIGKILL), proc.stderr
        if proc.returncode == 0:
            break
        killed += 1
    return killed
