"""Optional Prometheus metrics of consumers: `pip install oncelog[metrics]`.

    from prometheus_client import start_http_server
    from oncelog.consumer import Consumer, ConsumerMetrics

    metrics = ConsumerMetrics()            # registers in prometheus_client's default registry
    Consumer(client, "wordcount", "role=sentences", handler, metrics=metrics).run()

One `ConsumerMetrics` serves any number of consumers (labelled by group and shard).
Updated by the consumer at commit points only: a transaction's messages count once its
checkpoint is claimed, so the counters never include aborted work.
"""

from __future__ import annotations

from typing import Any

from oncelog._extras import needs_extra

__all__ = ["ConsumerMetrics"]


class ConsumerMetrics:
    """Counters, gauges and a histogram of consumer activity, labelled `group`, `shard`
    (the shard index, or "" for an unsharded group).

    - `<ns>_consumer_messages_total`: committed input messages handled;
    - `<ns>_consumer_transactions_total`: transactions committed (checkpoints claimed);
    - `<ns>_consumer_recoveries_total`, `<ns>_consumer_fenced_total`;
    - `<ns>_consumer_checkpoint`: the number of the last checkpoint claimed;
    - `<ns>_consumer_written_bytes_total`: checkpoint and state-object bytes written;
    - `<ns>_consumer_commit_seconds`: from a transaction's close to its ACKs appended.
    """

    def __init__(self, registry: Any = None, namespace: str = "oncelog") -> None:
        with needs_extra("metrics", "ConsumerMetrics"):
            import prometheus_client as prom
        kw: dict[str, Any] = {"namespace": namespace, "labelnames": ("group", "shard")}
        if registry is not None:
            kw["registry"] = registry
        self.messages = prom.Counter(
            "consumer_messages", "Committed input messages handled by consumers", **kw
        )
        self.transactions = prom.Counter(
            "consumer_transactions", "Consumer transactions committed", **kw
        )
        self.recoveries = prom.Counter("consumer_recoveries", "Consumer recoveries", **kw)
        self.fenced = prom.Counter("consumer_fenced", "Consumers fenced out", **kw)
        self.checkpoint = prom.Gauge(
            "consumer_checkpoint", "Number of the last checkpoint claimed", **kw
        )
        self.written = prom.Counter(
            "consumer_written_bytes", "Checkpoint and state-object bytes written", **kw
        )
        self.commit_seconds = prom.Histogram(
            "consumer_commit_seconds", "From a transaction's close to its ACKs appended", **kw
        )

    @staticmethod
    def labels(group: str, shard: int | None) -> tuple[str, str]:
        """The label values of a consumer."""
        return group, "" if shard is None else str(shard)

    def recovered(self, labels: tuple[str, str], seq: int) -> None:
        self.recoveries.labels(*labels).inc()
        self.checkpoint.labels(*labels).set(seq)

    def committed(
        self, labels: tuple[str, str], seq: int, messages: int, written: int
    ) -> None:
        self.transactions.labels(*labels).inc()
        self.messages.labels(*labels).inc(messages)
        self.written.labels(*labels).inc(written)
        self.checkpoint.labels(*labels).set(seq)

    def acked(self, labels: tuple[str, str], seconds: float) -> None:
        self.commit_seconds.labels(*labels).observe(seconds)

    def fenced_out(self, labels: tuple[str, str]) -> None:
        self.fenced.labels(*labels).inc()
