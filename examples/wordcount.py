"""Exactly-once word count: a producer writes sentences, a consumer group counts words.

The consumer reads the committed sentences, keeps the counts in its checkpointed state
and, before each commit, publishes the totals that changed. Run it twice on the same
store and the second run only counts what was added since.

    python examples/wordcount.py [--store URL] [-o KEY=VALUE ...] [SENTENCE ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from oncelog import (
    Consumer,
    Envelope,
    JournalClient,
    JournalExists,
    JournalSpec,
    JSONMessage,
    Publisher,
    Transaction,
    open_journals,
    read_committed,
)
from oncelog.options import storage_option_arg

NDJSON = "application/x-ndjson"
SENTENCES = "examples/wordcount/sentences"
TOTALS = "examples/wordcount/totals"


def create_journals(client: JournalClient) -> None:
    for name, role in ((SENTENCES, "sentences"), (TOTALS, "totals")):
        try:
            labels = {"content-type": NDJSON, "app": "wordcount", "role": role}
            client.create(JournalSpec(name, labels))
        except JournalExists:
            pass


def produce(client: JournalClient, sentences: list[str]) -> None:
    """Publish the sentences in one transaction: all of them are counted, or none."""
    publisher = Publisher(client)
    with publisher.transaction():
        for sentence in sentences:
            message = JSONMessage({"text": sentence})
            publisher.publish_uncommitted(lambda m: (SENTENCES, NDJSON), message)


def count_words(env: Envelope, txn: Transaction) -> None:
    """The handler: called once per committed sentence, exactly once across crashes."""
    counts = txn.state["counts"]
    for word in env.message.doc["text"].lower().split():
        counts[word] = counts.get(word, 0) + 1


def publish_totals(txn: Transaction) -> None:
    """Before each commit: publish the totals that changed, committed with the checkpoint."""
    counts, published = txn.state["counts"], txn.state["published"]
    for word in sorted(counts):
        if published.get(word) != counts[word]:
            total = JSONMessage({"word": word, "total": counts[word]})
            txn.publish(lambda m: (TOTALS, NDJSON), total)
            published[word] = counts[word]


def consume(client: JournalClient) -> int:
    """Count everything committed so far, then return the number of transactions."""
    consumer = Consumer(
        client,
        "wordcount",
        "app=wordcount, role=sentences",
        count_words,
        finalize=publish_totals,
        initial_state={"counts": {}, "published": {}},
        max_messages=100,
    )
    with consumer:
        return consumer.run(until_idle=True)


def totals(client: JournalClient) -> dict[str, int]:
    """The latest committed total of each word."""
    out = {}
    for env in read_committed(client, TOTALS):
        out[env.message.doc["word"]] = env.message.doc["total"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_store = os.path.join(tempfile.gettempdir(), "oncelog-wordcount-example")
    parser.add_argument("--store", default=default_store, help="fsspec URL or local directory")
    parser.add_argument(
        "-o", "--storage-option", action="append", default=[], type=storage_option_arg,
        metavar="KEY=VALUE",
    )
    parser.add_argument("sentences", nargs="*", default=["the cat sat", "the cat sat on the mat"])
    args = parser.parse_args(argv)
    options = dict(args.storage_option)
    with open_journals(args.store, **options) as client:
        create_journals(client)
        produce(client, args.sentences)
        commits = consume(client)
        print(f"{commits} consumer transaction(s) committed; totals so far:")
        for word, total in sorted(totals(client).items(), key=lambda wt: (-wt[1], wt[0])):
            print(f"  {word:<12} {total}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
