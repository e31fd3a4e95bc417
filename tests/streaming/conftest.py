"""Fixtures of the streaming tests: real nodes (`python -m oncelog.streaming`) in
subprocesses on 127.0.0.1, waited for by their "listening on" line (bounded), killed after."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from oncelog.testing.fixtures import StoreTarget

pytest.importorskip("grpc")

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 60.0


def store_args(store: StoreTarget) -> list[str]:
    """`--store` and `-o` options reaching `store` from a subprocess."""
    args = ["--store", store.url]
    for key, value in store.storage_options.items():
        args += ["-o", f"{key}:={json.dumps(value)}"]
    return args


@dataclass
class Node:
    """A node subprocess; `lines` collects its stdout after the "listening on" line."""

    proc: subprocess.Popen[str]
    address: str
    node_id: str
    lines: queue.Queue[str] = field(default_factory=queue.Queue)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def pause(self) -> None:
        """SIGSTOP: the node keeps its sockets but answers nothing (a zombie)."""
        self.proc.send_signal(signal.SIGSTOP)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


def wait_for_line(proc: subprocess.Popen[str], prefix: str, timeout: float) -> tuple[str, Any]:
    """The first stdout line of `proc` starting with `prefix` (bounded), and a queue that
    receives its later lines."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            proc.kill()
            raise TimeoutError(f"no {prefix!r} line within {timeout} s") from None
        if line is None:
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"process exited {proc.wait()} before {prefix!r}: {err}")
        if line.startswith(prefix):
            return line, lines


NodeFactory = Callable[..., Node]


@pytest.fixture
def start_node(tmp_path: Path) -> Iterator[NodeFactory]:
    """start_node(store, node_id, *extra_args) -> Node, serving on a free loopback port."""
    nodes: list[Node] = []

    # Time ticks are off in practice (an hour) unless a test asks for them: a tick grows an
    # idle channel's journal, which tests comparing heads must not see.
    def start(store: StoreTarget, node_id: str, *extra: str, env: dict[str, str] | None = None,
              heartbeat: float = 0.2, lease: float = 1.0, tick: float = 3600.0) -> Node:
        argv = [
            sys.executable, "-m", "oncelog.streaming", *store_args(store),
            "--listen", "127.0.0.1:0", "--node-id", node_id,
            "--heartbeat", str(heartbeat), "--lease", str(lease), "--tick", str(tick), *extra,
        ]
        stderr = open(tmp_path / f"{node_id}.stderr", "w")  # noqa: SIM115 - kept for the run
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                cwd=ROOT, env={**os.environ, **(env or {})})
        line, lines = wait_for_line(proc, "listening on ", START_TIMEOUT)
        node = Node(proc, line.split()[2], node_id, lines)
        nodes.append(node)
        return node

    yield start
    for node in nodes:
        node.kill()


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def any_store(request: pytest.FixtureRequest) -> StoreTarget:
    """Local disk and the S3 test server in turn."""
    return request.getfixturevalue(f"{request.param}_store")


@pytest.fixture
def client_of() -> Iterator[Any]:
    """`client_of(address, **options)`: a streaming client, closed after the test."""
    from oncelog.streaming import connect

    clients = []

    def make(*args: Any, **kwargs: Any) -> Any:
        c = connect(*args, **kwargs)
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.close()
