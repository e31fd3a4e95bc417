"""Assignment done right, through real `oncelog serve` subprocesses: assigning a channel to
its owner is a no-op answered CHANNEL_EXIST; UnassignChannel hands a channel over without
losing or refusing acknowledged work; WatchChannels reports ownership changes (and producers
follow a new owner through it, not by polling DescribeChannel); a broadcast over channels of
different nodes is refused at once, naming them; append_messages(atomic=False) gives one
result per message."""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from typing import Any

import grpc
import orjson
import pytest

from oncelog.reading import read_committed
from oncelog.streaming import Code, MessageID, StreamingError, connect
from oncelog.streaming import streaming_pb2 as pb
from oncelog.testing.fixtures import StoreTarget

WAIT = 30.0


def committed_payloads(store: StoreTarget, channel: str) -> Counter[str]:
    client = store.open()
    try:
        return Counter(e.message.doc["payload"] for e in read_committed(client, channel))
    finally:
        client.close()


def raw_uuids(store: StoreTarget, channel: str) -> list[str]:
    """The UUID of every line in the journal, duplicates and ACKs included."""
    client = store.open()
    try:
        with client.read(channel) as reader:
            data = reader.read()
    finally:
        client.close()
    return [orjson.loads(line)["uuid"] for line in data.splitlines() if line]


def drain_into(it: Any, out: queue.Queue[Any]) -> threading.Thread:
    """Iterate `it` in a thread, putting each item (or the exception that ended it)."""

    def run() -> None:
        try:
            for item in it:
                out.put(item)
        except Exception as exc:  # noqa: BLE001 - handed to the test
            out.put(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_assign_to_owner_is_a_noop(any_store: StoreTarget, start_node: Any) -> None:
    a = start_node(any_store, "node-a")
    client = connect(a.address)
    client.create_channel("own", address=a.address)
    client.append("own", "before")
    stream = client._producer("own")._stream
    assert stream is not None
    with pytest.raises(StreamingError) as info:
        client.assign_channel("own", a.address)
    assert info.value.code == Code.CHANNEL_EXIST
    assert "own" in info.value.cause and "node-a" in info.value.cause
    assert client.describe_channel("own").term == 1  # no new term
    client.append("own", "after")
    assert client._producer("own")._stream is stream  # the owner's stream was not fenced
    assert committed_payloads(any_store, "own") == Counter({"before": 1, "after": 1})
    client.close()


def test_unassign_hands_over_without_refusing_acknowledged_work(
        any_store: StoreTarget, start_node: Any) -> None:
    a = start_node(any_store, "node-a")
    b = start_node(any_store, "node-b")
    client = connect([a.address, b.address])
    client.create_channel("moving", address=a.address)
    started = threading.Event()
    stop = threading.Event()
    futures: list[Any] = []

    def produce() -> None:
        i = 0
        while not stop.is_set() and i < 20_000:
            futures.append(client.append_async("moving", [f"m{i}"]))
            i += 1
            if i == 200:
                started.set()
            if len(futures) > 64:
                futures[-64].result(timeout=WAIT)  # a window of calls in flight

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    assert started.wait(WAIT)
    desc = client.unassign_channel("moving", to=b.address)
    assert (desc.owner_node, desc.owner_address) == ("node-b", b.address)
    assert desc.term == 3  # 1: node-a, 2: released, 3: node-b
    deadline = time.monotonic() + WAIT
    while len(futures) < 400 and time.monotonic() < deadline:
        futures[-1].result(timeout=WAIT)
    stop.set()
    t.join(WAIT)
    assert not t.is_alive()
    ids = [f.result(timeout=WAIT)[0] for f in futures]  # every request acknowledged
    assert len(ids) >= 400
    counts = committed_payloads(any_store, "moving")
    assert set(counts) == {f"m{i}" for i in range(len(futures))}
    assert set(counts.values()) == {1}
    # Graceful: node-a answered every request it had appended (none was left unanswered
    # and resent), so no message is in the journal twice.
    uuids = raw_uuids(any_store, "moving")
    assert len(uuids) == len(set(uuids))
    # node-a no longer owns it: a second unassign there is refused.
    resp = client._unary("UnassignChannel", pb.UnassignChannelRequest(name="moving"),
                         a.address)
    assert resp.error.code in (Code.CHANNEL_FENCED, Code.CHANNEL_NOT_EXIST)
    client.close()


def test_watch_reports_ownership_changes(local_store: StoreTarget, start_node: Any) -> None:
    a = start_node(local_store, "node-a")
    b = start_node(local_store, "node-b")
    client = connect([b.address, a.address])
    client.create_channel("w", address=a.address)
    seen: queue.Queue[Any] = queue.Queue()
    watch = client.watch_channels(["w"], address=b.address)
    drain_into(watch, seen)
    first = seen.get(timeout=WAIT)
    assert (first.name, first.term, first.owner_node) == ("w", 1, "node-a")
    client.assign_channel("w", b.address)
    second = seen.get(timeout=WAIT)
    assert (second.term, second.owner_node, second.owner_address) == (2, "node-b", b.address)
    # node-b releases it; node-c's failover scan takes it at once (no lease to wait for;
    # node-a still believes it owns the channel until it checks, so it does not race).
    c = start_node(local_store, "node-c", lease=30.0)
    client.unassign_channel("w")
    released = seen.get(timeout=WAIT)
    assert (released.term, released.owner_node, released.owner_address) == (3, "", "")
    taken = seen.get(timeout=WAIT)
    assert (taken.term, taken.owner_node, taken.owner_address) == (4, "node-c", c.address)
    watch.close()
    client.close()


class _CountDescribe(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    def __init__(self) -> None:
        self.calls = 0

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        if details.method.endswith("/DescribeChannel"):
            self.calls += 1
        return continuation(details, request)


def test_producer_follows_new_owner_through_watch(local_store: StoreTarget,
                                                   start_node: Any) -> None:
    a = start_node(local_store, "node-a")
    b = start_node(local_store, "node-b")
    counter = _CountDescribe()
    client = connect([a.address, b.address], interceptors=[counter])
    client.create_channel("f", address=a.address)
    client.append("f", "one")  # opens the stream (one DescribeChannel)
    assert counter.calls == 1
    other = connect([a.address, b.address])
    other.assign_channel("f", b.address)  # node-a is fenced
    client.append("f", "two")  # refused by node-a, resent to node-b
    assert client._producer("f")._stream.address == b.address  # type: ignore[union-attr]
    assert counter.calls == 1  # the new owner came from WatchChannels
    assert committed_payloads(local_store, "f") == Counter({"one": 1, "two": 1})
    other.close()
    client.close()


def test_broadcast_across_owners_is_refused_at_once(any_store: StoreTarget,
                                                     start_node: Any) -> None:
    a = start_node(any_store, "node-a")
    b = start_node(any_store, "node-b")
    client = connect([a.address, b.address], retry_timeout=10.0)
    client.create_channel("bx", address=a.address)
    client.create_channel("by", address=b.address)
    heads = (client.describe_channel("bx").head, client.describe_channel("by").head)
    began = time.monotonic()
    with pytest.raises(StreamingError) as info:
        client.broadcast(["bx", "by"], "reset")
    assert time.monotonic() - began < 5.0  # at once, not after retry_timeout
    assert info.value.code == Code.INVALID_ARGUMENT
    cause = info.value.cause
    for word in ("'bx'", "'by'", "node-a", "node-b", a.address, b.address,
                 "nothing was appended"):
        assert word in cause, cause
    assert (client.describe_channel("bx").head, client.describe_channel("by").head) == heads
    # Moved to one node, the same broadcast goes through, once per channel.
    client.assign_channel("by", a.address)
    ids = client.broadcast(["bx", "by"], "reset")
    assert [i.channel for i in ids] == ["bx", "by"]
    assert committed_payloads(any_store, "bx") == Counter({"reset": 1})
    assert committed_payloads(any_store, "by") == Counter({"reset": 1})
    client.close()


def test_append_messages_has_per_message_results(any_store: StoreTarget,
                                                 start_node: Any) -> None:
    a = start_node(any_store, "node-a", "--max-message-bytes", "100")
    client = connect(a.address)
    client.create_channel("pm", address=a.address)
    results = client.append_messages("pm", ["a", "x" * 500, "b"], atomic=False)
    assert len(results) == 3
    assert isinstance(results[0], MessageID) and isinstance(results[2], MessageID)
    assert isinstance(results[1], StreamingError)
    assert results[1].code == Code.INVALID_ARGUMENT and "100" in results[1].cause
    assert results[0].end <= results[2].begin
    # The atomic form stays: one oversized message refuses the whole request.
    with pytest.raises(StreamingError) as info:
        client.append_messages("pm", ["c", "y" * 500])
    assert info.value.code == Code.INVALID_ARGUMENT
    assert committed_payloads(any_store, "pm") == Counter({"a": 1, "b": 1})
    client.close()
