"""Channel time ticks are barriers, and a consumer started mid-channel loses nothing.

Through real nodes (`python -m oncelog.streaming`) in subprocesses, on local disk and the
S3 test server: a producer whose clock lags 5 s appends after others, and a consumer that
resumes with `time_tick_gt(last tick seen)` still receives it, with the same ticks on every
node; a consumer started at `latest` while a transaction is open receives that transaction
once it commits."""

from __future__ import annotations

import time
from typing import Any

import pytest
from streaming_support import Collector  # noqa: E402

from oncelog.message import Clock
from oncelog.streaming import (
    DeliverAll,
    DeliverLatest,
    StartAfter,
    TimeTickGT,
)
from oncelog.streaming import client as client_module
from oncelog.testing.fixtures import StoreTarget

WAIT = 30.0
LAG_NS = 5_000_000_000


class LaggingClock(Clock):
    """A producer clock 5 s behind the machine's: `update()` moves to now - 5 s."""

    __slots__ = ()

    def update(self, unix_ns: int | None = None) -> int:
        return super().update((time.time_ns() if unix_ns is None else unix_ns) - LAG_NS)




def test_lagging_producer_is_delivered_after_a_tick_barrier(
        any_store: StoreTarget, start_node: Any, client_of: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    owner = start_node(any_store, "tick-owner")
    other = start_node(any_store, "tick-other")
    c = client_of(owner.address)
    c.create_channel("ticks/lag", "")
    first = [c.append("ticks/lag", f"on time {i}".encode(), vchannel="v") for i in range(3)]
    reader = Collector(c.read("ticks/lag", DeliverAll()))
    seen = reader.messages(3)
    reader.close()
    assert [m.id for m in seen] == first
    last = seen[-1].time_tick

    # A second producer whose clock is 5 s behind appends after the others.
    monkeypatch.setattr(client_module, "Clock", LaggingClock)
    lagging = client_of(owner.address)
    late_id = lagging.append("ticks/lag", b"late", vchannel="v")
    monkeypatch.undo()

    # The Milvus recovery pattern: resume from the last tick seen.
    resumed = Collector(c.read("ticks/lag", DeliverAll(), [TimeTickGT(last)]))
    [late] = resumed.messages(1)
    resumed.close()
    assert (late.payload, late.id) == (b"late", late_id)
    assert late.time_tick > last

    # Every node computes the same ticks, strictly increasing in journal order, and a
    # consumer starting mid-channel continues the same sequence.
    everything = {}
    for address in (owner.address, other.address):
        scan = Collector(client_of(address).read("ticks/lag", DeliverAll()))
        got = scan.messages(4)
        scan.close()
        ticks = [m.time_tick for m in got]
        assert ticks == sorted(set(ticks)), ticks
        everything[address] = [(m.id, m.time_tick) for m in got]
    assert everything[owner.address] == everything[other.address]
    mid = Collector(client_of(other.address).read("ticks/lag", StartAfter(first[1])))
    got = mid.messages(2)
    mid.close()
    assert [(m.id, m.time_tick) for m in got] == everything[owner.address][2:]


def test_append_results_carry_the_channel_ticks(
        local_store: StoreTarget, start_node: Any, client_of: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The tick an append (or a commit) is answered with is the one consumers see."""
    node = start_node(local_store, "tick-results")
    c = client_of(node.address)
    c.create_channel("ticks/results", "")
    c.append("ticks/results", b"a", vchannel="v")
    monkeypatch.setattr(client_module, "Clock", LaggingClock)
    lagging = client_of(node.address)
    lagging.append("ticks/results", b"late", vchannel="v")
    txn = lagging.txn("ticks/results", "v")
    txn.append(b"in txn")
    commit_tick = txn.commit()
    monkeypatch.undo()
    scan = Collector(c.read("ticks/results", DeliverAll()))
    a, late, in_txn = scan.messages(3)
    scan.close()
    assert [a.payload, late.payload, in_txn.payload] == [b"a", b"late", b"in txn"]
    assert a.time_tick < late.time_tick < in_txn.time_tick
    assert in_txn.time_tick == commit_tick  # a transaction's messages carry its commit's tick


def test_consumer_started_inside_an_open_transaction_receives_it(
        any_store: StoreTarget, start_node: Any, client_of: Any) -> None:
    node = start_node(any_store, "tick-start")
    c = client_of(node.address)
    c.create_channel("ticks/start", "")
    c.append("ticks/start", b"before", vchannel="v")
    txn = c.txn("ticks/start", "v", keepalive=60)
    txn.append(b"open 1")
    txn.append(b"open 2")
    # Started while the transaction is open: its start offset is past both messages.
    latest = Collector(c.read("ticks/start", DeliverLatest()))
    other = client_of(node.address)
    other.append("ticks/start", b"after start", vchannel="v")
    [after] = latest.messages(1)  # the consumer is running (it started before this one)
    assert after.payload == b"after start"
    txn.commit()
    got = latest.messages(2)
    latest.close()
    assert [m.payload for m in got] == [b"open 1", b"open 2"]
    # Nothing committed before the start point is delivered.
    assert all(m.id.begin >= 0 for m in got)
