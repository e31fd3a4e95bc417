"""A consumer group split into shards: each shard counts the words of its own partitions.

Sentences are spread over 6 partitions by rendezvous hashing of their first word. Three
shard consumers (threads here; normally separate processes or machines) split the
partitions between them by rendezvous hashing of the partition names, each with its
own checkpoints and its own output journal. Then the group's position and lag.

    python examples/sharded_wordcount.py [--store URL] [-o KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
from collections import Counter

from oncelog import (
    Consumer,
    Envelope,
    JournalClient,
    JournalSpec,
    JSONMessage,
    PolledList,
    Publisher,
    Transaction,
    group_status,
    open_journals,
    read_committed,
    rendezvous,
)
from oncelog.options import storage_option_arg

NDJSON = "application/x-ndjson"
PARTITIONS = 6
SHARDS = 3
WORDS = "red orange yellow green blue indigo violet".split()


def create_journals(client: JournalClient, prefix: str) -> None:
    for i in range(PARTITIONS):
        client.create(JournalSpec(f"{prefix}/sentences/part-{i:03d}",
                                  {"content-type": NDJSON, "app": prefix, "role": "sentences"}))
    for shard in range(SHARDS):
        client.create(JournalSpec(f"{prefix}/counts/shard-{shard}",
                                  {"content-type": NDJSON, "app": prefix, "role": "counts"}))


def produce(client: JournalClient, prefix: str, count: int, seed: int = 1) -> Counter[str]:
    """Publish `count` sentences in transactions of 10; returns the words written."""
    partitions = PolledList(client, f"app={prefix}, role=sentences", background=False)
    mapping = rendezvous(lambda msg: msg.doc["text"].split()[0], partitions)
    publisher = Publisher(client)
    rng = random.Random(seed)
    written: Counter[str] = Counter()
    for start in range(0, count, 10):
        with publisher.transaction():
            for _ in range(min(10, count - start)):
                text = " ".join(rng.choices(WORDS, k=4))
                publisher.publish_uncommitted(mapping, JSONMessage({"text": text}))
                written.update(text.split())
    return written


def count_words(env: Envelope, txn: Transaction) -> None:
    counts = txn.state
    for word in env.message.doc["text"].split():
        counts[word] = counts.get(word, 0) + 1


def shard_consumer(client: JournalClient, prefix: str, shard: int) -> Consumer:
    output = f"{prefix}/counts/shard-{shard}"

    def publish_counts(txn: Transaction) -> None:
        txn.publish(lambda m: (output, NDJSON), JSONMessage({"shard": shard, "counts": txn.state}))

    return Consumer(client, f"{prefix}-counter", f"app={prefix}, role=sentences", count_words,
                    finalize=publish_counts, initial_state={}, shards=SHARDS, shard=shard)


def run(
    client: JournalClient, prefix: str = "colors", sentences: int = 300
) -> tuple[Counter, Counter]:
    """The whole example; returns (words written, sum of the shards' committed counts)."""
    create_journals(client, prefix)
    written = produce(client, prefix, sentences)
    consumers = [shard_consumer(client, prefix, shard) for shard in range(SHARDS)]
    threads = [threading.Thread(target=c.run, kwargs={"until_idle": True}) for c in consumers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for shard, consumer in enumerate(consumers):
        names = ", ".join(j.rsplit("/", 1)[-1] for j in consumer.journals)
        print(f"shard {shard} consumed {names}")
        consumer.close()
    combined: Counter[str] = Counter()
    for shard in range(SHARDS):
        latest = None
        for env in read_committed(client, f"{prefix}/counts/shard-{shard}"):
            latest = env.message.doc["counts"]
        combined.update(latest or {})
    status = group_status(client, f"{prefix}-counter")
    print(f"group {status.group}: {status.shards} shards, lag {status.lag} bytes")
    return written, combined


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="fsspec URL (default: a temporary directory)")
    parser.add_argument(
        "-o", "--storage-option", action="append", default=[], type=storage_option_arg,
        metavar="KEY=VALUE",
    )
    args = parser.parse_args(argv)
    options = dict(args.storage_option)
    with tempfile.TemporaryDirectory(prefix="oncelog-shards-") as tmp:
        with open_journals(args.store or tmp, **options) as client:
            prefix = f"colors-{random.randrange(16**6):06x}"
            written, combined = run(client, prefix)
    ok = written == combined
    print(f"words written {sum(written.values())}, counted by the shards {sum(combined.values())}:"
          f" {'exactly once' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
