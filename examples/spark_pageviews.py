"""Page views on S3 journals, counted by Spark exactly once, counts published back to a journal.

Web servers publish page views to `pageviews/part-*` journals in transactions (some
roll back, and one is still open). A Spark job reads only the committed views
(`spark.read.format("oncelog")`), counts them per page and writes the counts to the
`aggregates/page-views` journal (`df.write.format("oncelog")`), where they become
visible only when Spark commits the job.

    python examples/spark_pageviews.py                       # a local S3 test server (moto)
    python examples/spark_pageviews.py --store s3://bucket/journals \\
        --endpoint-url http://127.0.0.1:9000 --key KEY --secret SECRET
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from typing import Any

from oncelog import (
    JournalClient,
    JournalExists,
    JournalSpec,
    JSONMessage,
    Publisher,
    open_journals,
    read_committed,
    read_uncommitted,
)

NDJSON = "application/x-ndjson"
PAGEVIEWS = [f"pageviews/part-{i:03d}" for i in range(3)]
COUNTS = "aggregates/page-views"
PAGES = ["/", "/docs", "/pricing", "/blog", "/about"]


def create_journals(client: JournalClient) -> None:
    specs = [JournalSpec(n, {"app": "pageviews", "content-type": NDJSON}) for n in PAGEVIEWS]
    specs.append(JournalSpec(COUNTS, {"app": "aggregates", "content-type": NDJSON}))
    for spec in specs:
        try:
            client.create(spec)
        except JournalExists:
            pass


def publish_views(client: JournalClient, transactions: int = 12, seed: int = 1) -> None:
    """Web servers' page views: transactions that commit, roll back, or are left open."""
    rng = random.Random(seed)
    servers = [Publisher(client) for _ in range(3)]
    for t in range(transactions):
        server = rng.choice(servers)
        try:
            with server.transaction():
                for _ in range(rng.randint(5, 20)):
                    journal = rng.choice(PAGEVIEWS)
                    view = {"page": rng.choice(PAGES), "user": f"u{rng.randint(1, 50)}"}
                    server.publish_uncommitted(lambda m, j=journal: (j, NDJSON), JSONMessage(view))
                if t % 5 == 4:
                    raise RuntimeError("the web server lost its session")  # rolled back
        except RuntimeError:
            pass
    # One transaction is still open when Spark reads: it is not counted.
    server = servers[0]
    pending = JSONMessage({"page": "/", "user": "open"})
    server.publish_uncommitted(lambda m: (PAGEVIEWS[0], NDJSON), pending)
    server.flush()


def spark_options(store: str, storage_options: dict[str, Any]) -> dict[str, str]:
    """Data source options reaching the store from every Spark executor."""
    return {"store": store, "storage_options": json.dumps(storage_options)}


def count_views(spark: Any, store: str, storage_options: dict[str, Any]) -> dict[str, int]:
    """The Spark job: committed page views per page, written to the counts journal."""
    from oncelog.spark import register

    register(spark)
    options = spark_options(store, storage_options)
    views = (
        spark.read.format("oncelog")
        .options(**options)
        .option("journals", "app=pageviews")
        .option("schema", "page string, user string")
        .load()
    )
    counts = views.groupBy("message.page").count().withColumnRenamed("count", "views")
    writer = counts.write.format("oncelog").options(**options).option("journal", COUNTS)
    writer.mode("append").save()
    return {row.page: row.views for row in counts.collect()}


def counts_in_journal(client: JournalClient) -> dict[str, int]:
    """The counts the job published (committed ones only)."""
    return {e.message.doc["page"]: e.message.doc["views"] for e in read_committed(client, COUNTS)}


def views_published(client: JournalClient) -> int:
    """Every page view message in the journals, committed or not, ACKs aside."""
    return sum(
        1 for j in PAGEVIEWS for env in read_uncommitted(client, j) if "page" in env.message.doc
    )


def expected_counts(client: JournalClient) -> dict[str, int]:
    """The same counts without Spark: read_committed over every page view journal."""
    out: dict[str, int] = {}
    for journal in PAGEVIEWS:
        for env in read_committed(client, journal):
            out[env.message.doc["page"]] = out.get(env.message.doc["page"], 0) + 1
    return out


def spark_session() -> tuple[Any, bool]:
    """The running Spark session, or a new local one on the loopback interface with this
    interpreter for its workers; and whether it is new (then the caller stops it)."""
    from oncelog.spark import local_session

    return local_session("oncelog-pageviews")


def _moto_store() -> tuple[Any, str, dict[str, Any]]:
    """A local S3 test server (moto) with a fresh bucket."""
    from oncelog.testing.fixtures import start_s3_server

    info, server = start_s3_server()
    info.create_bucket("pageviews")
    return server, "s3://pageviews/journals", dict(info.storage_options)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--store", help="s3://bucket/prefix of the journals (default: a local test server)"
    )
    parser.add_argument("--endpoint-url")
    parser.add_argument("--key")
    parser.add_argument("--secret")
    args = parser.parse_args(argv)
    server = None
    if args.store:
        keys = (("key", args.key), ("secret", args.secret))
        storage: dict[str, Any] = {k: v for k, v in keys if v}
        if args.endpoint_url:
            storage["client_kwargs"] = {
                "endpoint_url": args.endpoint_url,
                "region_name": "us-east-1",
            }
        store = args.store
    else:
        server, store, storage = _moto_store()
    try:
        client = open_journals(store, **storage)
        create_journals(client)
        publish_views(client)
        spark, started = spark_session()
        try:
            counted = count_views(spark, store, storage)
        finally:
            if started:
                spark.stop()
        for page, views in sorted(counted.items()):
            print(f"{page:10s} {views:5d}")
        ok = counts_in_journal(client) == counted == expected_counts(client)
        print("counts published to", COUNTS, "match read_committed:", ok)
        client.close()
        return 0 if ok else 1
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
