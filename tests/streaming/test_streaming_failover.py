"""Failover: two nodes, four producer processes, the owner SIGKILLed mid-stream; every
acknowledged message is read committed exactly once afterwards."""

from __future__ import annotations

import queue
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for_line  # type: ignore[import-not-found]

from oncelog.reading import read_committed
from oncelog.streaming import connect
from oncelog.testing.fixtures import StoreTarget

HERE = Path(__file__).resolve().parent
COUNT = 2000


@pytest.mark.slow
def test_sigkill_owner_during_produce(any_store: StoreTarget, start_node: Any) -> None:
    a = start_node(any_store, "node-a", lease=1.0)
    b = start_node(any_store, "node-b", lease=1.0)
    client = connect([a.address, b.address])
    client.create_channel("fo", address=a.address)
    addresses = f"{a.address},{b.address}"
    producers = []
    for name in ("p1", "p2", "p3", "p4"):
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "streaming_producer.py"), addresses, "fo", name,
             str(COUNT)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        first, lines = wait_for_line(proc, "acked ", 60)
        producers.append((proc, [first], lines))
    # Let all get well under way, then kill the owner.
    for _, seen, lines in producers:
        while len(seen) < 50:
            line = lines.get(timeout=60)
            assert line is not None
            seen.append(line)
    at_kill = [len(seen) for _, seen, _ in producers]
    a.kill()
    acked: list[str] = []
    deadline = time.monotonic() + 120
    for proc, seen, lines in producers:
        while True:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                proc.kill()
                raise AssertionError(f"producer stuck after {len(seen)} lines") from None
            if line is None:
                break
            seen.append(line)
        assert proc.wait(timeout=30) == 0, proc.stderr.read() if proc.stderr else ""
        assert seen[-1] == "done", seen[-5:]
        assert not [s for s in seen if s.startswith("failed")], seen
        acked += [s.split()[1] for s in seen if s.startswith("acked ")]
    assert len(acked) == len(producers) * COUNT
    # All were still producing when the owner died.
    assert all(n < COUNT for n in at_kill), at_kill

    desc = client.describe_channel("fo")
    assert (desc.owner_node, desc.term) == ("node-b", 2)
    store = any_store.open()
    try:
        counts = Counter(e.message.doc["payload"] for e in read_committed(store, "fo"))
    finally:
        store.close()
    assert {p: n for p, n in counts.items() if n != 1} == {}
    assert set(acked) <= set(counts)
    client.close()
