"""A Spark Structured Streaming job from journals to a journal, exactly once across restarts.

Producers publish clicks to `clickstream/part-*` in transactions (some roll back, one
stays open across the job's runs). A streaming query reads them committed
(`spark.readStream.format("oncelog")`), enriches each click and writes it to
`clickstream-enriched/all` (`writeStream.format("oncelog")` with a `writer_id`), with
`trigger(availableNow=True)` and a Spark checkpoint. The job is run, more clicks are
published (and the open transaction commits), and the job is run again from its
checkpoint: the output then holds every committed click exactly once.

    python examples/spark_streaming.py [--store URL] [-o KEY=VALUE ...] [--checkpoint DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter
from typing import Any

from oncelog import (
    JournalClient,
    JournalExists,
    JournalSpec,
    JSONMessage,
    Publisher,
    open_journals,
    read_committed,
)
from oncelog.options import storage_option_arg

NDJSON = "application/x-ndjson"
CLICKS = [f"clickstream/part-{i:03d}" for i in range(2)]
ENRICHED = "clickstream-enriched/all"
PAGES = ["/", "/docs", "/pricing"]


class Rollback(Exception):
    """Raised inside a transaction to roll it back."""


def create_journals(client: JournalClient) -> None:
    for name, app in [*((c, "clickstream") for c in CLICKS), (ENRICHED, "enriched")]:
        try:
            client.create(JournalSpec(name, {"content-type": NDJSON, "app": app}))
        except JournalExists:
            pass


def publish_clicks(
    publisher: Publisher, first_id: int, count: int, *, roll_back: bool = False
) -> None:
    """One transaction of `count` clicks over the partitions, committed or rolled back."""
    try:
        with publisher.transaction():
            for i in range(first_id, first_id + count):
                click = JSONMessage({"id": i, "page": PAGES[i % len(PAGES)]})
                journal = CLICKS[i % len(CLICKS)]
                publisher.publish_uncommitted(lambda m, j=journal: (j, NDJSON), click)
            if roll_back:
                raise Rollback
    except Rollback:
        pass


def run_stream(spark: Any, store: str, storage: dict[str, Any], checkpoint: str) -> None:
    """The streaming job: read what is committed now, enrich it, write it, stop."""
    from pyspark.sql import functions as F

    from oncelog.spark import register

    register(spark)
    options = {"store": store, "storage_options": json.dumps(storage)}
    clicks = (
        spark.readStream.format("oncelog").options(**options)
        .option("journals", "app=clickstream")
        .option("schema", "id bigint, page string")
        .load()
    )
    enriched = clicks.select(
        F.col("message.id").alias("id"),
        F.col("message.page").alias("page"),
        F.col("journal").alias("source"),
        F.col("time").cast("string").alias("clicked_at"),
    )
    query = (
        enriched.writeStream.format("oncelog").options(**options)
        .option("journal", ENRICHED)
        .option("writer_id", "clickstream-enricher")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def committed_ids(client: JournalClient, journals: list[str]) -> Counter:
    return Counter(env.message.doc["id"] for j in journals for env in read_committed(client, j))


def spark_session() -> tuple[Any, bool]:
    """The running Spark session, or a new local one (and whether the caller stops it)."""
    from oncelog.spark import local_session

    return local_session("oncelog-streaming")


def run(store: str, storage: dict[str, Any], checkpoint: str) -> int:
    spark, started = spark_session()
    try:
        with open_journals(store, **storage) as client:
            create_journals(client)
            web, app = Publisher(client), Publisher(client)
            publish_clicks(web, 0, 6)
            publish_clicks(web, 100, 4, roll_back=True)
            # A transaction left open while the job runs: committed only afterwards.
            for i in (200, 201):
                click = JSONMessage({"id": i, "page": "/"})
                app.publish_uncommitted(lambda m: (CLICKS[0], NDJSON), click)
            app.flush()

            run_stream(spark, store, storage, checkpoint)
            first = committed_ids(client, [ENRICHED])
            print(f"run 1: {sum(first.values())} clicks enriched (the open transaction waits)")

            app.append_intents(app.build_ack_intents())  # the open transaction commits
            publish_clicks(web, 6, 5)
            run_stream(spark, store, storage, checkpoint)  # restarts from its checkpoint
            out = committed_ids(client, [ENRICHED])
            print(f"run 2: {sum(out.values()) - sum(first.values())} more; "
                  f"{sum(out.values())} in {ENRICHED}")

            want = committed_ids(client, CLICKS)
            ok = out == want and max(out.values()) == 1 and set(first) < set(out)
            print(f"every committed click exactly once, none rolled back: {ok}")
            return 0 if ok else 1
    finally:
        if started:
            spark.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=None, help="fsspec URL or directory (default: temp dir)")
    parser.add_argument(
        "-o", "--storage-option", action="append", default=[], type=storage_option_arg,
        metavar="KEY=VALUE",
    )
    parser.add_argument("--checkpoint", default=None,
                        help="the query's Spark checkpoint directory (default: in a temp dir)")
    args = parser.parse_args(argv)
    storage = dict(args.storage_option)
    with tempfile.TemporaryDirectory(prefix="oncelog-spark-streaming-") as tmp:
        store = args.store or os.path.join(tmp, "store")
        checkpoint = args.checkpoint or os.path.join(tmp, "checkpoint")
        return run(store, storage, checkpoint)


if __name__ == "__main__":
    sys.exit(main())
