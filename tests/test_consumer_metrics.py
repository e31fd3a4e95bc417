"""Optional Prometheus metrics of consumers (the `metrics` extra)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

prom = pytest.importorskip("prometheus_client")

sys.path.insert(0, str(Path(__file__).parent))

from consumer_support import SELECTOR, create_journals, echo, write_upstream  # noqa: E402

from oncelog.consumer import CheckpointStore, Consumer, ConsumerMetrics, FencedOut  # noqa: E402


def value(registry, name: str, group: str = "m") -> float:
    got = registry.get_sample_value(name, {"group": group, "shard": ""})
    return 0.0 if got is None else got


def test_metrics_count_committed_work(memory_store) -> None:
    client = memory_store.open()
    create_journals(client)
    write_upstream(client, seed=1)
    registry = prom.CollectorRegistry()
    metrics = ConsumerMetrics(registry)
    handled = []

    def handler(env, txn) -> None:
        handled.append(env)
        echo(env, txn)

    consumer = Consumer(client, "m", SELECTOR, handler, initial_state={}, max_messages=5,
                        metrics=metrics)
    commits = consumer.run(until_idle=True)
    latest = CheckpointStore(client, "m").latest()
    assert latest is not None
    assert value(registry, "oncelog_consumer_messages_total") == len(handled) > 0
    assert value(registry, "oncelog_consumer_transactions_total") == commits
    assert value(registry, "oncelog_consumer_recoveries_total") == 1
    assert value(registry, "oncelog_consumer_checkpoint") == latest.seq
    assert value(registry, "oncelog_consumer_written_bytes_total") > 0
    assert value(registry, "oncelog_consumer_commit_seconds_count") == commits

    # A zombie's commit is counted as fenced, not as a transaction.
    zombie = consumer
    Consumer(client, "m", SELECTOR, echo, initial_state={}, metrics=metrics).recover()
    write_upstream(client, seed=2, transactions=2)
    with pytest.raises(FencedOut):
        zombie.run(until_idle=True)
    assert value(registry, "oncelog_consumer_fenced_total") == 1
    assert value(registry, "oncelog_consumer_transactions_total") == commits
