"""The `oncelog` format in a real Spark (local[2], one session for all): few, whole-path tests.

Rows come back in no particular order: results are compared as sets keyed by
(journal, begin), checked for duplicates, and sorted by (commit_offset, begin) to
check `read_committed`'s order.
"""

from __future__ import annotations

from collections import Counter

import pytest
from spark_history import committed_rows, write_history

from oncelog.journal import JournalSpec
from oncelog.reading import read_committed, read_uncommitted

# Keep the Spark tests on one test worker (`--dist loadgroup`): one SparkSession.
pytestmark = pytest.mark.xdist_group("spark")


def test_batch_read_equals_read_committed(spark, local_store) -> None:
    client = local_store.open()
    for i in range(3):
        write_history(client, f"web/part-{i}", seed=100 + i, rounds=16, fragment=300)
    df = (
        spark.read.format("oncelog")
        .option("store", local_store.url)
        .option("journals", "app=test")
        .option("schema", "n bigint, page string")
        .option("split_bytes", "700")  # several splits per journal: the two-phase plan
        .load()
    )
    rows = df.select("journal", "begin", "commit_offset", "flags", "message.page").collect()
    got = [(r.journal, r.begin) for r in rows]
    expected = [row for i in range(3) for row in committed_rows(client, f"web/part-{i}")]
    assert sorted(got) == sorted(expected) and len(set(got)) == len(got)
    by_commit = sorted(rows, key=lambda r: (r.journal, r.commit_offset, r.begin))
    ordered = [(r.journal, r.begin) for r in by_commit]
    assert ordered == expected
    pages = Counter(r.page for r in rows)
    assert pages == Counter(
        e.message.doc["page"] for i in range(3) for e in read_committed(client, f"web/part-{i}")
    )

    uncommitted = (
        spark.read.format("oncelog")
        .option("store", local_store.url)
        .option("journals", "web/part-0")
        .option("committed", "false")
        .load()
        .groupBy("flags")
        .count()
        .collect()
    )
    assert {r.flags: r["count"] for r in uncommitted} == dict(
        Counter(int(e.flags) for e in read_uncommitted(client, "web/part-0"))
    )
    client.close()


def _rows(spark, store: str, first: int, fail_at: int, always: bool = False):
    """Rows (id, page, pad) in two partitions; the task holding `fail_at` fails there, in its first
    attempt only unless `always`. A first attempt fails only once the writer has durably
    published some of its rows (polled, with a deadline), so that there is partial output
    to hide."""

    def run(ids):
        import time

        from pyspark import TaskContext

        from oncelog.journal import open_journals
        from oncelog.reading import read_uncommitted

        attempt = TaskContext.get().attemptNumber()
        for i in ids:
            if i == fail_at and (always or attempt == 0):
                if attempt == 0:
                    deadline = time.monotonic() + 60
                    with open_journals(store) as client:
                        while time.monotonic() < deadline:
                            ours = [
                                e for e in read_uncommitted(client, "out/events")
                                if fail_at - 10 <= e.message.doc.get("id", -1) < fail_at
                            ]
                            if len(ours) >= 4:
                                break
                            time.sleep(0.05)
                raise RuntimeError(f"injected failure at id {i} (attempt {attempt})")
            # Big rows fill the worker's output buffer, so rows flow on before the failure.
            yield i, f"p{i % 3}", "x" * 20000

    rdd = spark.sparkContext.parallelize(range(first, first + 40), 2).mapPartitions(run)
    return spark.createDataFrame(rdd, "id bigint, page string, pad string")


def test_failed_task_attempts_and_aborted_jobs_stay_invisible(spark, local_store) -> None:
    client = local_store.open()
    client.create(JournalSpec("out/events"))
    options = {"store": local_store.url, "journal": "out/events"}
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "4")
    try:
        # Partition 1's first attempt publishes rows, then fails; its retry succeeds.
        df = _rows(spark, local_store.url, 0, 30)
        df.write.format("oncelog").options(**options).mode("append").save()
        docs = [e.message.doc for e in read_committed(client, "out/events")]
        assert sorted(d["id"] for d in docs) == list(range(40))
        uncommitted = [e for e in read_uncommitted(client, "out/events") if int(e.flags) == 1]
        assert len(uncommitted) > 40  # the failed attempt did publish: it is never delivered
        assert len({e.producer for e in uncommitted}) == 3

        # Every attempt of one partition fails: the job aborts and nothing of it is visible.
        with pytest.raises(Exception, match="injected failure"):
            df = _rows(spark, local_store.url, 100, 130, always=True)
            df.write.format("oncelog").options(**options).mode("append").save()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    ids = sorted(e.message.doc["id"] for e in read_committed(client, "out/events"))
    assert ids == list(range(40))
    # The aborted job's ACKs, if any (its other task may or may not have finished before
    # the abort), are rollbacks: below every clock their producer published.
    by_producer: dict[bytes, list] = {}
    for env in read_uncommitted(client, "out/events"):
        by_producer.setdefault(env.producer, []).append(env)
    for envs in by_producer.values():
        acks = [e.clock for e in envs if int(e.flags) == 2]
        data = [e for e in envs if int(e.flags) == 1]
        if data[0].message.doc["id"] >= 100:
            assert all(a < min(e.clock for e in data) for a in acks)
        else:
            assert len(acks) <= 1 and all(a > e.clock for a in acks for e in data)
    client.close()


def test_stream_restarts_from_its_checkpoint_exactly_once(spark, local_store, tmp_path) -> None:
    client = local_store.open()
    client.create(JournalSpec("sink/all"))
    write_history(client, "src/a", seed=200, rounds=10)

    def run_query() -> None:
        stream = (
            spark.readStream.format("oncelog")
            .option("store", local_store.url)
            .option("journals", "app=test")
            .option("max_messages_per_trigger", "15")
            .load()
            .selectExpr("journal AS source", "begin AS source_begin", "message")
        )
        query = (
            stream.writeStream.format("oncelog")
            .option("store", local_store.url)
            .option("journal", "sink/all")
            .option("writer_id", "copy-all")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(300)
        assert query.exception() is None

    run_query()
    first = len(list(read_committed(client, "sink/all")))
    assert first == len(committed_rows(client, "src/a"))
    write_history(client, "src/b", seed=201, rounds=8)  # a new journal
    write_history(client, "src/c", seed=202, rounds=4)
    run_query()  # restarted from the checkpoint

    docs = [e.message.doc for e in read_committed(client, "sink/all")]
    got = [(d["source"], d["source_begin"]) for d in docs]
    expected = [r for j in ("src/a", "src/b", "src/c") for r in committed_rows(client, j)]
    assert sorted(got) == sorted(expected) and len(got) == len(set(got))
    assert len(client.meta.list("spark/writers/copy-all/batches")) >= 2
    client.close()
