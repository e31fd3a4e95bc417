"""Every node serves `grpc.health.v1` (SERVING while it serves, NOT_SERVING once it stops,
without a token) and, with `--metrics-listen`, Prometheus metrics; through real
`oncelog serve` subprocesses."""

from __future__ import annotations

import signal
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest

from oncelog.streaming import Code, StreamingError, connect
from oncelog.testing.fixtures import StoreTarget

health_pb2 = pytest.importorskip("grpc_health.v1.health_pb2")
health_pb2_grpc = pytest.importorskip("grpc_health.v1.health_pb2_grpc")
parser = pytest.importorskip("prometheus_client.parser")

WAIT = 30.0
SERVICE = "oncelog.streaming.v1.StreamingNodeService"


def test_health_serving_then_not_serving(local_store: StoreTarget, start_node: Any,
                                         tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret")
    a = start_node(local_store, "node-a", "--token-file", str(token))
    channel = grpc.insecure_channel(a.address)
    stub = health_pb2_grpc.HealthStub(channel)
    # No token needed for health (probes carry none), while the service itself needs one.
    for service in ("", SERVICE):
        got = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=WAIT)
        assert got.status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(StreamingError) as info:
        connect(a.address).describe_channel("nothing")
    assert info.value.code == Code.UNAUTHENTICATED
    watch = stub.Watch(health_pb2.HealthCheckRequest(service=SERVICE), timeout=WAIT)
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    a.proc.send_signal(signal.SIGTERM)  # graceful stop: NOT_SERVING while calls finish
    assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
    assert a.proc.wait(timeout=WAIT) == 0
    channel.close()


def scrape(address: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=WAIT) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in parser.text_string_to_metric_families(text)
            for s in family.samples}


def test_metrics(local_store: StoreTarget, start_node: Any) -> None:
    a = start_node(local_store, "node-a", "--metrics-listen", "127.0.0.1:0")
    b = start_node(local_store, "node-b")
    line = a.lines.get(timeout=WAIT)
    assert line.startswith("metrics on 127.0.0.1:"), line
    metrics_address = line.split()[2]
    client = connect([a.address, b.address])
    client.create_channel("mx", address=a.address)
    ids = [client.append("mx", f"message {i}") for i in range(10)]
    txn = client.txn("mx", "v")
    txn.append("open")
    got = scrape(metrics_address)
    ch = (("channel", "mx"),)
    assert got[("oncelog_streaming_messages_total", ch)] == 11  # 10 + the txn's message
    assert got[("oncelog_streaming_appends_total", ch)] == 11
    assert got[("oncelog_streaming_bytes_total", ch)] >= sum(i.end - i.begin for i in ids)
    assert got[("oncelog_streaming_produce_seconds_count", ())] >= 12  # + the begin
    assert got[("oncelog_streaming_open_transactions", ())] == 1
    assert got[("oncelog_streaming_owned_channels", ())] == 1
    assert ("oncelog_streaming_fenced_total", ch) not in got
    txn.commit()
    # node-b takes the channel: node-a answers the next request CHANNEL_FENCED (the
    # client resends it to node-b) and owns nothing more.
    client.assign_channel("mx", b.address)
    client.append("mx", "after")
    got = scrape(metrics_address)
    assert got[("oncelog_streaming_fenced_total", ch)] >= 1
    assert got[("oncelog_streaming_owned_channels", ())] == 0
    assert got[("oncelog_streaming_open_transactions", ())] == 0
    assert got[("oncelog_streaming_messages_total", ch)] == 11  # "after" went to node-b
    client.close()
