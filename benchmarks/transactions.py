"""Benchmark: what atomic commits across journals cost, against a one-journal commit.

Measures, in the same run, on local disk (durable: every commit is fsync'd) or on the S3
test server (`--s3`), durable `Publisher.transaction()` commits of M messages each:

- baseline: transactions over ONE journal (one ACK append: no record);
- transactions over 3 journals (record, 3 ACKs, settle marker, retire);
- the same with a `transactional_id` (one record in the id's chain per commit, plus a
  one-time record per journal);
- `append_messages` of the same batch to 3 journals (one call).

Prints commits per second and the ratio to the baseline (the best of `--repeat`
interleaved rounds is kept), and fragments written per commit (all journals of the
variant; the last round's). A one-journal commit whose messages are still spooled at commit
writes its ACK in the same fragment as them: 1 fragment per commit (2 before). The
one-journal rows also run with one message per commit (the smallest transaction).

Run: .venv/bin/python benchmarks/transactions.py [--commits N] [--repeat R] [--quick] [--s3]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

from oncelog import JSONMessage, Publisher, open_journals
from oncelog.journal import JournalClient, JournalSpec

NDJSON = "application/x-ndjson"


def run(
    client: JournalClient, journals: list[str], commits: int, per: int, tid: str | None
) -> float:
    pub = Publisher(client, transactional_id=tid)
    start = time.perf_counter()
    for c in range(commits):
        with pub.transaction():
            for i in range(per):
                name = journals[i % len(journals)]
                pub.publish_uncommitted(lambda _m, n=name: (n, NDJSON), JSONMessage({"c": c}))
    return commits / (time.perf_counter() - start)


def run_batch(client: JournalClient, journals: list[str], commits: int, per: int) -> float:
    pub = Publisher(client)
    start = time.perf_counter()
    for c in range(commits):
        msgs = [JSONMessage({"c": c, "to": journals[i % len(journals)]}) for i in range(per)]
        pub.append_messages(lambda m: (m.doc["to"], NDJSON), msgs)
    return commits / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=300)
    parser.add_argument("--messages", type=int, default=6, help="messages per commit")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--s3", action="store_true", help="on the S3 test server (moto)")
    args = parser.parse_args(argv)
    commits = 50 if args.quick else args.commits
    repeat = 1 if args.quick else args.repeat

    server: Any = None
    if args.s3:
        from oncelog.testing.fixtures import start_s3_server

        info, server = start_s3_server()
        info.create_bucket("bench")
        url, options, tmp = "s3://bench/txns", info.storage_options, None
    else:
        tmp = tempfile.mkdtemp(prefix="oncelog-bench-")
        url, options = tmp, {}
    try:
        client = open_journals(url, **options)
        names = [f"bench/part-{i}" for i in range(3)]
        for name in [*names, "bench/one"]:
            client.create(JournalSpec(name, {"content-type": NDJSON}))
        one = ["bench/one"]
        variants: dict[str, tuple[list[str], Callable[[], float]]] = {
            "1 journal (baseline)": (
                one, lambda: run(client, one, commits, args.messages, None)
            ),
            "1 journal, 1 message": (one, lambda: run(client, one, commits, 1, None)),
            "3 journals": (names, lambda: run(client, names, commits, args.messages, None)),
            "3 journals, transactional_id": (
                names, lambda: run(client, names, commits, args.messages, "bench-svc")
            ),
            "3 journals, append_messages": (
                names, lambda: run_batch(client, names, commits, args.messages)
            ),
        }

        def fragment_count(journals: list[str]) -> int:
            return sum(len(client.fragments(name)) for name in journals)

        best = {k: 0.0 for k in variants}
        per_commit = {k: 0.0 for k in variants}
        for _ in range(repeat):
            for label, (journals, fn) in variants.items():
                before = fragment_count(journals)
                best[label] = max(best[label], fn())
                per_commit[label] = (fragment_count(journals) - before) / commits
        base = best["1 journal (baseline)"]
        where = "S3 test server" if args.s3 else "local disk"
        print(f"durable transactions of {args.messages} messages, {commits} commits, {where}")
        for label, rate in best.items():
            print(
                f"  {label:32s} {rate:8.1f} commits/s   {rate / base:5.2f}x   "
                f"{per_commit[label]:5.2f} fragments/commit"
            )
        client.close()
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
