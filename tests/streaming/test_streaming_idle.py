"""Idle channels cost nothing per channel: their time ticks travel in the node's heartbeat.

Through real nodes (`python -m oncelog.streaming`) in subprocesses: an idle channel's journal
keeps its head while consumers (on the owner and on another node) see ticks advance, and a
producer whose clock lags still gets a tick above them; the store requests of an idle node
(counted by the S3 fault proxy, per heartbeat) do not grow from 2 to 50 channels; a consumer
started at `latest` reads from the owner's anchor, not from offset 0, and still gets the
transaction open at its start; ticks stay strictly increasing across a failover."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from streaming_support import Collector  # noqa: E402

from oncelog.message import Clock
from oncelog.streaming import (
    ConsumedMessage,
    DeliverAll,
    DeliverLatest,
    TimeTick,
    meta,
)
from oncelog.streaming import client as client_module
from oncelog.testing.fixtures import FaultTarget, StoreTarget

WAIT = 30.0
LAG_NS = 5_000_000_000


class LaggingClock(Clock):
    """A producer clock 5 s behind the machine's."""

    __slots__ = ()

    def update(self, unix_ns: int | None = None) -> int:
        return super().update((time.time_ns() if unix_ns is None else unix_ns) - LAG_NS)

_FRAGMENT = re.compile(r"/([0-9a-f]{16})-([0-9a-f]{16})-[0-9a-f]{40}\.")



def ticks_of(collector: Collector, n: int, timeout: float = WAIT) -> list[Any]:
    """The next `n` TimeTick items of `collector` (messages are kept too), bounded."""
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while sum(isinstance(i, TimeTick) for i in out) < n:
        left = deadline - time.monotonic()
        assert left > 0, f"only {out} within {timeout} s"
        try:
            item = collector.items.get(timeout=left)
        except Exception:  # noqa: BLE001 - queue.Empty: the assertion above reports it
            continue
        if isinstance(item, Exception):
            raise item
        out.append(item)
    return out


def test_idle_channel_keeps_its_head_while_consumers_see_ticks(
        any_store: StoreTarget, start_node: Any, client_of: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    owner = start_node(any_store, "idle-owner", tick=0.2)
    other = start_node(any_store, "idle-other", "--no-failover", tick=0.2)
    c = client_of(owner.address)
    c.create_channel("idle/a", "")
    first = c.append("idle/a", b"first")
    store = any_store.open()
    head = store.head("idle/a")
    assert head == first.end

    seen: dict[str, list[int]] = {}
    for address in (owner.address, other.address):
        scan = Collector(client_of(address).read("idle/a", DeliverAll(), time_ticks=True))
        items = ticks_of(scan, 4)
        scan.close()
        ticks = [i.time_tick for i in items]
        assert ticks == sorted(set(ticks)), ticks
        # (a tick may come first: the floor line the node wrote before the message)
        [msg] = [i for i in items if isinstance(i, ConsumedMessage)]
        assert msg.id == first
        seen[address] = [t.time_tick for t in items[items.index(msg) + 1:]]
        assert len(seen[address]) >= 2
    # The ticks advanced, and not one byte was written to the channel for them.
    assert store.head("idle/a") == head

    # A producer whose clock lags 5 s appends after the idle ticks: its tick is above them.
    last = max(max(v) for v in seen.values())
    monkeypatch.setattr(client_module, "Clock", LaggingClock)
    lagging = client_of(owner.address)
    late = lagging.append("idle/a", b"late")
    monkeypatch.undo()
    scan = Collector(client_of(other.address).read("idle/a", DeliverAll()))
    got = scan.messages(2)
    scan.close()
    assert got[1].id == late
    assert got[1].time_tick > last, (got[1].time_tick, last)
    store.close()


def _count_per_beat(target: FaultTarget, root_key: str, beats: int) -> tuple[int, int]:
    """(requests, beat PUTs) under `root_key` while the node writes `beats` more beats
    (bounded polling of the proxy's log; the beats are the clock, not time)."""
    def of_root() -> list[Any]:
        # Every request through the proxy: one node runs at a time (listings and batch
        # deletes name the bucket, not the root).
        return list(target.proxy.requests)

    def beat_puts(reqs: list[Any]) -> int:
        return sum(1 for r in reqs if r.method == "PUT" and "/beats/" in r.key)

    base = of_root()
    start_beats = beat_puts(base)
    deadline = time.monotonic() + 60
    while True:
        now = of_root()
        if beat_puts(now) - start_beats >= beats:
            window = now[len(base):]
            return len(window), beat_puts(window)
        assert time.monotonic() < deadline, (
            f"only {beat_puts(now) - start_beats} of {beats} beats in 60 s, with "
            f"{len(now) - len(base)} store requests: the node's rounds are too costly")
        time.sleep(0.05)  # polling the proxy's log, bounded by the deadline


@pytest.mark.s3
def test_idle_node_requests_do_not_grow_with_channels(
        s3_fault_proxy: FaultTarget, start_node: Any, client_of: Any) -> None:
    per_beat: dict[int, float] = {}
    for n in (2, 50):
        sub = f"idle{n}"
        store = StoreTarget("s3", f"{s3_fault_proxy.url}/{sub}",
                            dict(s3_fault_proxy.storage_options))
        node = start_node(store, f"cost-{n}", heartbeat=0.2, tick=0.2)
        c = client_of(node.address)
        with ThreadPoolExecutor(8) as pool:  # one shared client, as applications do
            list(pool.map(lambda i: c.create_channel(f"cost/{i:03d}", ""), range(n)))
        c.append("cost/000", b"one message")
        root_key = s3_fault_proxy.url.split("/", 3)[3] + "/" + sub + "/"
        _count_per_beat(s3_fault_proxy, root_key, 3)  # settle: catch-up, first ticks
        requests, beats = _count_per_beat(s3_fault_proxy, root_key, 10)
        per_beat[n] = requests / beats
        print(f"idle node, {n} channels: {requests} requests in {beats} beats "
              f"({per_beat[n]:.2f} per beat of 0.2 s)")
        node.kill()
    # Bounded per node: a beat's PUT and DELETE and one listing, whatever the channels.
    assert per_beat[50] <= per_beat[2] + 0.5, per_beat
    assert per_beat[50] <= 4.5, per_beat


@pytest.mark.s3
def test_latest_consumer_starts_at_the_anchor_and_keeps_open_transactions(
        s3_fault_proxy: FaultTarget, start_node: Any, client_of: Any) -> None:
    store = StoreTarget("s3", s3_fault_proxy.url, dict(s3_fault_proxy.storage_options))
    owner = start_node(store, "anchor-owner", tick=0.2)
    reader_node = start_node(store, "anchor-reader", "--no-failover", tick=0.2)
    c = client_of(owner.address)
    c.create_channel("anchor/a", "")
    for i in range(4):  # history: four fragments
        c.append_messages("anchor/a", [f"old {i}.{k}".encode() for k in range(50)])
    txn = c.txn("anchor/a", "v", keepalive=60)
    txn.__enter__()
    txn.append(b"open at the start")
    direct = s3_fault_proxy.direct().open()
    head = direct.head("anchor/a")
    deadline = time.monotonic() + WAIT
    while True:  # the owner's beat carries an anchor at the head (bounded)
        beat = meta.read_beat(direct, "anchor-owner") or {}
        entry = (beat.get("channels") or {}).get("anchor/a") or {}
        if entry.get("offset") == head:
            break
        assert time.monotonic() < deadline, f"no anchor at {head}: {entry}"
        time.sleep(0.05)  # polling the store, bounded by the deadline
    assert entry["open"], entry  # the open transaction's begin travels with the anchor
    mark = len(s3_fault_proxy.proxy.requests)
    scan = Collector(client_of(reader_node.address).read("anchor/a", DeliverLatest()))
    txn.__exit__(None, None, None)  # commits
    after = c.append("anchor/a", b"after the start")
    got = scan.messages(2)
    scan.close()
    assert [m.payload for m in got] == [b"open at the start", b"after the start"]
    assert got[1].id == after and got[0].time_tick < got[1].time_tick
    # Nothing before the open transaction's begin was read: no fragment from offset 0.
    read_from = [int(m.group(1), 16) for r in s3_fault_proxy.proxy.requests[mark:]
                 if r.method == "GET" and "anchor/a" in r.key
                 and (m := _FRAGMENT.search(r.key)) is not None]
    assert read_from and min(read_from) >= entry["open"][0] > 0, (read_from, entry)
    direct.close()


def test_failover_keeps_ticks_strictly_increasing(
        local_store: StoreTarget, start_node: Any, client_of: Any) -> None:
    a = start_node(local_store, "fo-a", tick=0.2, heartbeat=0.2, lease=1.0)
    b = start_node(local_store, "fo-b", tick=0.2, heartbeat=0.2, lease=1.0)
    c = client_of(f"{a.address},{b.address}")
    c.create_channel("fo/a", "")
    c.append("fo/a", b"before")
    store = local_store.open()
    head = store.head("fo/a")
    scan = Collector(client_of(b.address).read("fo/a", DeliverAll(), time_ticks=True))
    before = ticks_of(scan, 3)
    assert store.head("fo/a") == head  # idle: ticks without appends
    a.kill()
    deadline = time.monotonic() + WAIT
    while True:  # b takes the channel (bounded)
        record = meta.latest_term(store, "fo/a")
        if record is not None and record.node_id == "fo-b":
            break
        assert time.monotonic() < deadline, record
        time.sleep(0.05)  # polling the store, bounded by the deadline
    after = ticks_of(scan, 3)
    after_id = c.append("fo/a", b"after")
    rest: list[Any] = []
    deadline = time.monotonic() + WAIT
    while not any(isinstance(i, ConsumedMessage) and i.id == after_id for i in rest):
        assert time.monotonic() < deadline, rest
        item = scan.items.get(timeout=WAIT)
        if isinstance(item, Exception):
            raise item
        rest.append(item)
    scan.close()
    ticks = [i.time_tick for i in before + after + rest]
    assert ticks == sorted(set(ticks)), ticks
    store.close()
