"""The oncelog demo: an exactly-once word count, checked against the committed input.

A producer publishes sentences in transactions (some rolled back, some messages re-sent
as duplicates, one left open); a consumer group counts words and publishes running
totals, with one instance taking over from another midway. The totals read committed
are printed beside the totals counted directly from the committed input.

    python -m oncelog.demo [--store URL] [-o KEY=VALUE ...]

A temporary local directory by default; any fsspec URL (`s3://bucket/prefix`, with
s3fs options from the environment or `-o`) works too. Exits 1 if the totals differ.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TextIO

from oncelog.consumer import Consumer, FencedOut, Transaction
from oncelog.journal import JournalClient, JournalSpec, open_journals
from oncelog.message import Envelope, Flags, JSONMessage
from oncelog.options import storage_option_arg
from oncelog.publisher import Publisher
from oncelog.reading import read_committed, read_uncommitted

__all__ = ["main", "run_demo", "DemoResult"]

NDJSON = "application/x-ndjson"
WORDS = "apple banana cherry date elder fig grape honeydew kiwi lemon mango nectarine".split()


class _Rollback(Exception):
    """Raised inside a producer transaction to roll it back."""


class DemoResult:
    """What the demo found: the two sets of totals and whether they match."""

    def __init__(self, consumer_totals: dict[str, int], direct_totals: dict[str, int]) -> None:
        self.consumer_totals = consumer_totals
        self.direct_totals = direct_totals

    @property
    def ok(self) -> bool:
        return self.consumer_totals == self.direct_totals


def _mapping(journal: str) -> Callable[[object], tuple[str, str]]:
    return lambda _msg: (journal, NDJSON)


def _produce(client: JournalClient, inputs: list[str], rng: random.Random) -> dict[str, int]:
    """Sentences in transactions: some rolled back, some re-sent, one left open."""
    publisher = Publisher(client)
    tally: Counter[str] = Counter()
    for _ in range(24):
        try:
            with publisher.transaction():
                for _ in range(rng.randint(2, 5)):
                    sentence = " ".join(rng.choices(WORDS, k=rng.randint(3, 7)))
                    publisher.publish_uncommitted(
                        _mapping(rng.choice(inputs)), JSONMessage({"sentence": sentence})
                    )
                if rng.random() < 0.25:
                    raise _Rollback
            tally["committed"] += 1
        except _Rollback:
            tally["rolled back"] += 1
    # Retried appends: the same frames (same UUIDs) appended again.
    for journal in inputs:
        frames = [e for e in read_uncommitted(client, journal) if e.flags != Flags.ACK_TXN]
        for env in rng.sample(frames, k=min(3, len(frames))):
            with client.read(journal, env.begin) as reader:
                client.append(journal, reader.read(env.end - env.begin))
            tally["duplicates"] += 1
    # A transaction whose producer "died" before committing it.
    publisher.publish_uncommitted(_mapping(inputs[0]), JSONMessage({"sentence": "never committed"}))
    publisher.flush()
    return dict(tally)


def _count_words(env: Envelope, txn: Transaction) -> None:
    counts = txn.state["counts"]
    for word in env.message.doc["sentence"].split():
        counts[word] = counts.get(word, 0) + 1


def _totals_publisher(output: str) -> Callable[[Transaction], None]:
    def publish_totals(txn: Transaction) -> None:
        """Before each commit: publish the running total of each word that changed."""
        counts, published = txn.state["counts"], txn.state["published"]
        for word in sorted(counts):
            if published.get(word) != counts[word]:
                txn.publish(_mapping(output), JSONMessage({"word": word, "total": counts[word]}))
                published[word] = counts[word]

    return publish_totals


def _consume(
    client: JournalClient, group: str, selector: str, output: str, say: Callable[[str], None]
) -> None:
    """Instance A commits two transactions; B takes over; A is fenced out; B finishes."""

    def instance() -> Consumer:
        return Consumer(
            client,
            group,
            selector,
            _count_words,
            finalize=_totals_publisher(output),
            initial_state={"counts": {}, "published": {}},
            max_messages=10,
        )

    a = instance()
    a.run(max_transactions=2)
    say(
        f"   instance A committed {a.checkpoint_seq - 1} transactions"
        f" (checkpoints 2-{a.checkpoint_seq})"
    )
    b = instance()
    taken = b.recover()
    say(f"   instance B took the group over: recovery checkpoint {taken}")
    try:
        a.run(until_idle=True)
        say("   instance A was NOT fenced out (unexpected)")
    except FencedOut:
        say(
            "   instance A was fenced out at its next commit:"
            " its new outputs are never acknowledged"
        )
    commits = b.run(until_idle=True)
    say(
        f"   instance B committed {commits} more transactions"
        f" (up to checkpoint {b.checkpoint_seq})"
    )
    b.close()


def run_demo(client: JournalClient, *, seed: int = 2024, out: TextIO | None = None) -> DemoResult:
    """Run the pipeline in `client`'s store (under a fresh prefix) and compare the totals;
    the story goes to `out` (default: standard output)."""

    def say(line: str = "") -> None:
        print(line, file=out or sys.stdout)

    rng = random.Random(seed)
    run = uuid.uuid4().hex[:8]
    inputs = [f"demo-{run}/sentences/part-{i:03d}" for i in range(2)]
    output = f"demo-{run}/totals"
    labels = {"content-type": NDJSON, "app": f"wordcount-{run}"}
    for name in inputs:
        client.create(JournalSpec(name, {**labels, "role": "sentences"}))
    client.create(JournalSpec(output, {**labels, "role": "totals"}))

    say(f"1. producer: transactions of sentences into {len(inputs)} journals")
    tally = _produce(client, inputs, rng)
    say(
        f"   {tally.get('committed', 0)} committed, {tally.get('rolled back', 0)} rolled back,"
        f" {tally.get('duplicates', 0)} messages re-sent as duplicates, 1 left uncommitted"
    )
    say(f"2. consumer group wordcount-{run}: counts words, publishes running totals")
    _consume(client, f"wordcount-{run}", f"app=wordcount-{run}, role=sentences", output, say)

    consumer_totals: dict[str, int] = {}
    for env in read_committed(client, output):
        consumer_totals[env.message.doc["word"]] = env.message.doc["total"]
    direct: Counter[str] = Counter()
    for journal in inputs:
        for env in read_committed(client, journal):
            direct.update(env.message.doc["sentence"].split())
    result = DemoResult(consumer_totals, dict(direct))

    say("3. totals: published by the consumer (read committed) vs counted from the committed input")
    say(f"   {'word':<10} {'consumer':>8} {'direct':>7}")
    for word in sorted(set(consumer_totals) | set(direct), key=lambda w: (-direct.get(w, 0), w)):
        mine, theirs = consumer_totals.get(word), direct.get(word)
        flag = "" if mine == theirs else "   <-- MISMATCH"
        shown = ["-" if n is None else str(n) for n in (mine, theirs)]
        say(f"   {word:<10} {shown[0]:>8} {shown[1]:>7}{flag}")
    if result.ok:
        say(f"all {len(direct)} totals match: each committed sentence was counted exactly once.")
    else:
        say("the totals DIFFER: exactly-once was violated.")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; 0 if the totals match, 1 if not."""
    parser = argparse.ArgumentParser(
        prog="python -m oncelog.demo", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--store", help="fsspec URL of the journal store (default: a temporary directory)"
    )
    parser.add_argument(
        "-o", "--storage-option", action="append", type=storage_option_arg, default=[],
        metavar="KEY=VALUE", help="an option for the store's filesystem (JSON values allowed)",
    )
    parser.add_argument("--seed", type=int, default=2024, help="seed of the producer's choices")
    args = parser.parse_args(argv)

    temporary = None
    url = args.store
    if url is None:
        temporary = url = tempfile.mkdtemp(prefix="oncelog-demo-")
    print(f"oncelog demo: exactly-once word count on {url}{' (temporary)' if temporary else ''}")
    client = open_journals(url, **dict(args.storage_option))
    try:
        result = run_demo(client, seed=args.seed)
    finally:
        client.close()
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
