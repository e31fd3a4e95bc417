"""`oncelog serve`: run a streaming node (gRPC Produce/Consume over the store's journals).

Binds 127.0.0.1 by default; pass `--listen 0.0.0.0:PORT` deliberately, ideally with
`--tls-cert/--tls-key` and `--token`. Prints `listening on HOST:PORT` (flushed) once serving,
then runs until SIGINT or SIGTERM. See docs/streaming.md.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click

from oncelog._extras import needs_extra
from oncelog.cli.app import State, cli, pass_state, store_options

__all__ = ["serve"]

DEFAULT_LISTEN = "127.0.0.1:7470"


@cli.command()
@store_options
@click.option("--listen", "-l", default=DEFAULT_LISTEN, show_default=True, metavar="HOST:PORT",
              help="Address to bind (port 0: any free port).")
@click.option("--advertise", default="", metavar="HOST:PORT",
              help="Address clients are sent to for this node's channels [default: the bound one].")
@click.option("--node-id", default="", help="Node identity [default: HOSTNAME-PORT].")
@click.option("--description", default="", help="Owner description recorded with each term.")
@click.option("--token-file", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="File holding the bearer token clients must send [env ONCELOG_STREAMING_TOKEN].")
@click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="PEM certificate chain: serve TLS (with --tls-key).")
@click.option("--tls-key", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="PEM private key of --tls-cert.")
@click.option("--take", multiple=True, metavar="CHANNEL",
              help="Take this channel at start (term + 1, fencing its owner). Repeatable.")
@click.option("--heartbeat", default=1.0, show_default=True, type=click.FloatRange(min=0.01),
              help="Seconds between heartbeats (and failover scans).")
@click.option("--lease", default=5.0, show_default=True, type=click.FloatRange(min=0.05),
              help="Seconds without a heartbeat after which a node's channels are taken over.")
@click.option("--failover/--no-failover", default=True, show_default=True,
              help="Take over channels of nodes whose lease expired.")
@click.option("--tick", default=1.0, show_default=True, type=click.FloatRange(min=0.01),
              help="Idle seconds after which a channel gets a time tick.")
@click.option("--max-message-bytes", default=1 << 20, show_default=True,
              type=click.IntRange(min=1), help="Largest message payload accepted.")
@click.option("--max-request-bytes", default=4 << 20, show_default=True,
              type=click.IntRange(min=1024), help="Largest gRPC request accepted.")
@click.option("--metrics-listen", default="", metavar="HOST:PORT",
              help="Serve Prometheus metrics over HTTP here (port 0: any free port; needs "
                   "oncelog[metrics]). Prints `metrics on HOST:PORT`.")
@pass_state
def serve(
    state: State,
    listen: str,
    advertise: str,
    node_id: str,
    description: str,
    token_file: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    take: tuple[str, ...],
    heartbeat: float,
    lease: float,
    failover: bool,
    tick: float,
    max_message_bytes: int,
    max_request_bytes: int,
    metrics_listen: str,
) -> None:
    """Run a streaming node: channels produced to and consumed from over gRPC."""
    try:
        with needs_extra("streaming", "oncelog serve"):
            from oncelog.streaming.node import NodeConfig
            from oncelog.streaming.node import serve as start
    except ImportError as exc:  # MissingExtra names the command that installs grpcio
        raise click.ClickException(str(exc)) from None
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    token = os.environ.get("ONCELOG_STREAMING_TOKEN") or None
    if token_file is not None:
        token = token_file.read_text().strip() or None
    if lease <= heartbeat:
        raise click.UsageError("--lease must be longer than --heartbeat")
    config = NodeConfig(
        node_id=node_id, address=advertise, description=description, token=token,
        max_message_bytes=max_message_bytes, max_request_bytes=max_request_bytes,
        heartbeat_interval=heartbeat, lease_timeout=lease, failover=failover,
        tick_interval=tick, take=list(take),
    )
    metrics, metrics_server = _metrics(metrics_listen) if metrics_listen else (None, None)
    client = state.client()
    server, node, bound = start(
        client, listen, config,
        tls_cert=tls_cert.read_bytes() if tls_cert else None,
        tls_key=tls_key.read_bytes() if tls_key else None,
        metrics=metrics,
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    scheme = "tls" if tls_cert else "plaintext"
    print(f"listening on {bound} ({scheme}, node {config.node_id})", flush=True)
    if metrics_server is not None:
        host = metrics_listen.rsplit(":", 1)[0]
        print(f"metrics on {host}:{metrics_server.server_port}", flush=True)
    stop.wait()
    node.close()
    server.stop(grace=2).wait()
    if metrics_server is not None:
        metrics_server.shutdown()
    print("stopped", file=sys.stderr, flush=True)


def _metrics(listen: str) -> tuple[Any, Any]:
    """The node's metrics in a registry of their own, served over HTTP on `listen`
    (`HOST:PORT`): (NodeMetrics, the HTTP server)."""
    try:
        with needs_extra("metrics", "oncelog serve --metrics-listen"):
            import prometheus_client as prom

            from oncelog.streaming.node import NodeMetrics
    except ImportError as exc:  # MissingExtra names the command that installs it
        raise click.ClickException(str(exc)) from None
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise click.UsageError(f"--metrics-listen takes HOST:PORT, not {listen!r}")
    registry = prom.CollectorRegistry()
    metrics = NodeMetrics(registry)
    server, _ = prom.start_http_server(int(port), host or "127.0.0.1", registry)
    return metrics, server
