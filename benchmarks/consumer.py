"""Benchmark: an exactly-once word-count consumer against plain read-committed reading.

Writes N committed messages (upstream transactions of 100 messages) to one journal on
local disk, then measures, in the same run:

- baseline: `read_committed` of the journal, counting messages;
- the same loop counting words (the handler's own work, for reference);
- a `Consumer` counting words in transactions of 10,000 messages, publishing the totals
  changed by each transaction and checkpointing after each.

Run: .venv/bin/python benchmarks/consumer.py [--messages N] [--quick]
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable

import orjson

from oncelog.consumer import Consumer, Transaction
from oncelog.journal import JournalSpec, open_journals
from oncelog.message import Envelope, Flags, JSONMessage, build_uuid, clock_from_unix_ns, new_producer_id
from oncelog.reading import read_committed

NDJSON = "application/x-ndjson"
INPUT = "bench/sentences"
OUTPUT = "bench/totals"
UPSTREAM_TXN = 100


def write_input(client, messages: int, seed: int = 1) -> None:
    """Append `messages` committed sentences, in upstream transactions, as raw frames."""
    rng = random.Random(seed)
    vocabulary = [f"word{i:03d}" for i in range(500)]
    producer = new_producer_id()
    clock = clock_from_unix_ns(time.time_ns())
    buf = bytearray()
    for i in range(messages):
        clock += 1
        text = " ".join(rng.choices(vocabulary, k=rng.randint(6, 10)))
        uuid = build_uuid(producer, clock, Flags.CONTINUE_TXN)
        buf += orjson.dumps({"uuid": str(uuid), "text": text}) + b"\n"
        if (i + 1) % UPSTREAM_TXN == 0 or i + 1 == messages:
            clock += 1
            buf += orjson.dumps({"uuid": str(build_uuid(producer, clock, Flags.ACK_TXN))}) + b"\n"
        if len(buf) >= 1 << 20:
            client.append(INPUT, bytes(buf))
            buf.clear()
    if buf:
        client.append(INPUT, bytes(buf))


def timed(fn: Callable[[], int]) -> tuple[int, float]:
    start = time.perf_counter()
    n = fn()
    return n, time.perf_counter() - start


def baseline(client) -> int:
    n = 0
    for _ in read_committed(client, INPUT):
        n += 1
    return n


def baseline_counting(client) -> int:
    counts: dict[str, int] = {}
    n = 0
    for env in read_committed(client, INPUT):
        for word in env.message.doc["text"].split():
            counts[word] = counts.get(word, 0) + 1
        n += 1
    return n


def count_words(env: Envelope, txn: Transaction) -> None:
    """The handler: the same counting loop as `baseline_counting`, on the group's state."""
    counts = txn.state["counts"]
    for word in env.message.doc["text"].split():
        counts[word] = counts.get(word, 0) + 1


def publish_totals(txn: Transaction) -> None:
    """Before each commit: publish the totals that changed in this transaction."""
    counts, published = txn.state["counts"], txn.state["published"]
    for word, total in counts.items():
        if published.get(word) != total:
            txn.publish(lambda m: (OUTPUT, NDJSON), JSONMessage({"word": word, "total": total}))
            published[word] = total


def consume(client, group: str, txn_size: int) -> tuple[int, Consumer]:
    consumer = Consumer(
        client,
        group,
        [INPUT],
        count_words,
        finalize=publish_totals,
        initial_state={"counts": {}, "published": {}},
        max_messages=txn_size,
        max_duration=3600,
        keep_checkpoints=None,
    )
    commits = consumer.run(until_idle=True)
    return commits, consumer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--txn", type=int, default=10_000, help="consumer transaction size")
    parser.add_argument("--quick", action="store_true", help="a smoke-size run (50,000 messages)")
    args = parser.parse_args()
    messages = 50_000 if args.quick else args.messages

    root = tempfile.mkdtemp(prefix="oncelog-bench-consumer-")
    try:
        client = open_journals(root)
        for name in (INPUT, OUTPUT):
            client.create(JournalSpec(name, {"content-type": NDJSON}))
        start = time.perf_counter()
        write_input(client, messages)
        print(f"wrote {messages:,} committed messages in {time.perf_counter() - start:.1f}s")

        # Warm up caches (page cache, imports) so neither side pays them alone.
        baseline(client)
        n_base, t_base = timed(lambda: baseline(client))
        n_count, t_count = timed(lambda: baseline_counting(client))
        (commits, consumer), t_cons = (lambda s: (consume(client, "bench", args.txn), time.perf_counter() - s))(
            time.perf_counter()
        )
        assert n_base == n_count == messages, (n_base, n_count, messages)

        expected: Counter[str] = Counter()
        for env in read_committed(client, INPUT):
            expected.update(env.message.doc["text"].split())
        published = {}
        for env in read_committed(client, OUTPUT):
            published[env.message.doc["word"]] = env.message.doc["total"]
        ok = published == dict(expected) == consumer.state["counts"]

        base_rate = n_base / t_base
        rows = [
            ("read_committed (baseline)", n_base / t_base),
            ("read_committed + word count", n_count / t_count),
            (f"Consumer word count, txn {args.txn:,}", messages / t_cons),
        ]
        print(f"{'':38} {'msgs/s':>12} {'vs baseline':>12}")
        for label, rate in rows:
            print(f"{label:38} {rate:12,.0f} {rate / base_rate:11.2f}x")
        print(f"consumer: {commits} transactions committed; totals match the input: {ok}")
        if not ok:
            raise SystemExit("consumer totals differ from the committed input")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
