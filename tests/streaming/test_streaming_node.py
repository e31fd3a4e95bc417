"""The streaming node against real servers: round trips, policies and filters, bad requests,
fencing, transactions, time ticks, latency of consumers."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import grpc
import pytest

from oncelog.message import OUTSIDE_TXN, Clock, build_uuid, clock_from_unix_ns, new_producer_id
from oncelog.reading import read_committed
from oncelog.streaming import (
    Code,
    ConsumedMessage,
    DeliverAll,
    DeliverLatest,
    StartAfter,
    StartFrom,
    StreamingError,
    StreamMessage,
    TimeTick,
    TimeTickGT,
    TimeTickGTE,
    VChannel,
)
from oncelog.streaming import streaming_pb2 as pb
from oncelog.streaming import streaming_pb2_grpc as pb_grpc
from oncelog.testing.fixtures import StoreTarget

WAIT = 30.0


def take(scanner: Any, n: int, timeout: float = WAIT) -> list[ConsumedMessage]:
    """The next `n` messages of a scanner (time ticks skipped), read in a thread so that a
    missing message fails the test after `timeout` instead of hanging it."""
    got: queue.Queue[Any] = queue.Queue()

    def run() -> None:
        try:
            for item in scanner:
                if isinstance(item, ConsumedMessage):
                    got.put(item)
        except Exception as exc:  # noqa: BLE001 - handed to the test
            got.put(exc)

    threading.Thread(target=run, daemon=True).start()
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        item = got.get(timeout=max(0.01, deadline - time.monotonic()))
        if isinstance(item, Exception):
            raise item
        out.append(item)
    scanner.close()
    return out


def raw_produce(address: str, channel: str, requests: list[pb.ProduceRequest], term: int = 0,
                token: str | None = None) -> list[pb.ProduceResponse]:
    """Send a create request and `requests` on one Produce stream; every response."""
    with grpc.insecure_channel(address) as ch:
        stub = pb_grpc.StreamingNodeServiceStub(ch)
        reqs = [pb.ProduceRequest(create=pb.CreateProducerRequest(
            channel=pb.ChannelInfo(name=channel, term=term))), *requests,
            pb.ProduceRequest(close=pb.CloseProducerRequest())]
        md = (("authorization", f"Bearer {token}"),) if token else ()
        return list(stub.Produce(iter(reqs), metadata=md, timeout=WAIT))


def produce(rid: int, *payloads: bytes, uuids: list[str] | None = None) -> pb.ProduceRequest:
    msgs = [pb.Message(payload=p, vchannel="v") for p in payloads]
    for m, u in zip(msgs, uuids or []):
        m.uuid = u
    return pb.ProduceRequest(produce=pb.ProduceMessageRequest(request_id=rid, messages=msgs))


def codes(responses: list[pb.ProduceResponse]) -> list[int]:
    return [r.produce.error.code for r in responses if r.WhichOneof("response") == "produce"]



def test_round_trip_policies_and_filters(any_store: StoreTarget, start_node: Any,
                                         client_of: Any) -> None:
    node = start_node(any_store, "n1")
    c = client_of(node.address)
    desc = c.create_channel("chan/a", "orders, multiplexed")
    assert (desc.term, desc.owner_node, desc.owner_address) == (1, "n1", node.address)
    assert desc.description == "orders, multiplexed"
    ids = [c.append("chan/a", f"m{i}", vchannel=f"v{i % 2}", properties={"i": str(i)})
           for i in range(6)]
    assert [i.begin for i in ids] == sorted(i.begin for i in ids)
    batch = c.append_messages("chan/a", [StreamMessage(b"\x00\xff", "v2"), "text"],
                              vchannel="v3")
    assert batch[0].end == batch[1].begin  # one atomic, contiguous append

    everything = take(c.read("chan/a", DeliverAll()), 8)
    assert [m.payload for m in everything] == [f"m{i}".encode() for i in range(6)] + [
        b"\x00\xff", b"text"]
    assert [m.vchannel for m in everything[-2:]] == ["v2", "v3"]
    assert everything[3].properties == {"i": "3"}
    assert [m.id for m in everything[:6]] == ids
    ticks = [m.time_tick for m in everything]
    assert ticks == sorted(ticks) and len(set(ticks)) == len(ticks)

    assert [m.payload for m in take(c.read("chan/a", StartFrom(ids[2])), 2)] == [b"m2", b"m3"]
    assert [m.payload for m in take(c.read("chan/a", StartAfter(ids[2])), 2)] == [b"m3", b"m4"]
    odd = take(c.read("chan/a", DeliverAll(), [VChannel("v1")]), 3)
    assert [m.payload for m in odd] == [b"m1", b"m3", b"m5"]
    both = take(c.read("chan/a", DeliverAll(), [VChannel("v1"), VChannel("v3")]), 4)
    assert [m.payload for m in both] == [b"m1", b"m3", b"m5", b"text"]
    gt = take(c.read("chan/a", DeliverAll(), [TimeTickGT(ticks[4])]), 3)
    assert [m.payload for m in gt] == [b"m5", b"\x00\xff", b"text"]
    gte = take(c.read("chan/a", DeliverAll(), [TimeTickGTE(ticks[4]), VChannel("v0")]), 1)
    assert [m.payload for m in gte] == [b"m4"]

    latest = c.read("chan/a", DeliverLatest())
    after = c.append("chan/a", "new", vchannel="v0")
    [m] = take(latest, 1)
    assert (m.payload, m.id) == (b"new", after)

    # The node's messages are ordinary journal messages: read committed from the store.
    client = any_store.open()
    try:
        docs = [e.message.doc for e in read_committed(client, "chan/a")]
    finally:
        client.close()
    assert [d.get("payload") for d in docs][:6] == [f"m{i}" for i in range(6)]
    assert docs[6]["payload_b64"] == "AP8=" and docs[7]["vchannel"] == "v3"
    assert len(docs) == 9


def test_consume_follows_appends_with_low_latency(local_store: StoreTarget, start_node: Any,
                                                  client_of: Any) -> None:
    node = start_node(local_store, "n1", tick=5.0)
    c = client_of(node.address)
    c.create_channel("lat")
    scanner = c.read("lat", DeliverLatest())
    got: queue.Queue[float] = queue.Queue()

    def run() -> None:
        for m in scanner:
            if isinstance(m, ConsumedMessage):
                got.put(time.monotonic())

    threading.Thread(target=run, daemon=True).start()
    latencies = []
    for i in range(10):
        sent = time.monotonic()
        c.append("lat", f"{i}")
        latencies.append(got.get(timeout=WAIT) - sent)
    scanner.close()
    latencies.sort()
    assert latencies[5] < 0.25, latencies  # the node's reader wakes on its own appends


def test_fenced_node_refuses_produce(any_store: StoreTarget, start_node: Any,
                                     client_of: Any) -> None:
    a = start_node(any_store, "node-a", "--no-failover")
    b = start_node(any_store, "node-b", "--no-failover")
    c = client_of([a.address, b.address])
    c.create_channel("fence", address=a.address)
    assert codes(raw_produce(a.address, "fence", [produce(1, b"before")])) == [0]
    desc = c.assign_channel("fence", b.address)
    assert (desc.term, desc.owner_node) == (2, "node-b")
    head = c.describe_channel("fence").head
    answers = raw_produce(a.address, "fence", [produce(1, b"zombie")])
    first = answers[0].create.error
    assert first.code == Code.CHANNEL_FENCED, answers
    assert c.describe_channel("fence").head == head  # nothing appended
    # B serves it; a producer stream already open on A when B took over is refused too.
    assert codes(raw_produce(b.address, "fence", [produce(1, b"after")])) == [0]
    # The client follows the owner.
    mid = c.append("fence", "through the client")
    assert mid.begin >= head


def test_fenced_while_streaming(local_store: StoreTarget, start_node: Any,
                                client_of: Any) -> None:
    a = start_node(local_store, "node-a", "--no-failover")
    b = start_node(local_store, "node-b", "--no-failover")
    c = client_of([a.address, b.address])
    c.create_channel("fence2", address=a.address)
    with grpc.insecure_channel(a.address) as ch:
        stub = pb_grpc.StreamingNodeServiceStub(ch)
        reqs: queue.Queue[Any] = queue.Queue()
        reqs.put(pb.ProduceRequest(create=pb.CreateProducerRequest(
            channel=pb.ChannelInfo(name="fence2"))))
        answers = stub.Produce(iter(reqs.get, None), timeout=WAIT)
        assert next(answers).create.channel.term == 1
        reqs.put(produce(1, b"ok"))
        assert next(answers).produce.WhichOneof("response") == "result"
        c.assign_channel("fence2", b.address)
        reqs.put(produce(2, b"late"))
        late = next(answers).produce
        assert late.error.code == Code.CHANNEL_FENCED, late
        # "late" was appended before the check and is not acknowledged; from now on the
        # fenced node appends nothing.
        head = c.describe_channel("fence2").head
        reqs.put(produce(3, b"later"))
        assert next(answers).produce.error.code == Code.CHANNEL_FENCED
        assert c.describe_channel("fence2").head == head
        reqs.put(None)


def test_bad_requests_are_refused_without_effect(local_store: StoreTarget, start_node: Any,
                                                 client_of: Any) -> None:
    node = start_node(local_store, "n1", "--max-message-bytes", "1000",
                      "--max-request-bytes", "65536")
    c = client_of(node.address)
    c.create_channel("bad")
    head = c.describe_channel("bad").head

    unknown = raw_produce(node.address, "no/such", [produce(1, b"x")])
    assert unknown[0].create.error.code == Code.CHANNEL_NOT_EXIST
    stale = raw_produce(node.address, "bad", [produce(1, b"x")], term=7)
    assert stale[0].create.error.code == Code.UNMATCHED_CHANNEL_TERM
    seq = raw_produce(node.address, "bad", [produce(5, b"a"), produce(5, b"b"), produce(3, b"c")])
    assert codes(seq) == [0, Code.INVALID_REQUEST_SEQ, Code.INVALID_REQUEST_SEQ]
    head_after_seq = c.describe_channel("bad").head
    assert head_after_seq > head
    big = raw_produce(node.address, "bad", [produce(1, b"x" * 1001)])
    assert codes(big) == [Code.INVALID_ARGUMENT]
    assert "1000 bytes" in big[1].produce.error.cause
    producer, clock = new_producer_id(), Clock()
    clock.update()
    u2, u1 = (str(build_uuid(producer, clock.tick(), OUTSIDE_TXN)) for _ in range(2))
    backwards = raw_produce(node.address, "bad", [produce(1, b"a", b"b", uuids=[u1, u2])])
    assert codes(backwards) == [Code.INVALID_ARGUMENT]
    assert c.describe_channel("bad").head == head_after_seq

    with pytest.raises(StreamingError) as info:
        c.append("bad", b"y" * 70_000)  # beyond gRPC's request limit of the node
    assert info.value.code == Code.INVALID_ARGUMENT
    with pytest.raises(StreamingError) as info:
        c.append("nope", "x")
    assert info.value.code == Code.CHANNEL_NOT_EXIST
    with pytest.raises(StreamingError) as info:
        c.create_channel("bad")
    assert info.value.code == Code.CHANNEL_EXIST
    assert c.describe_channel("bad").head == head_after_seq


def test_token_and_tls_free_loopback(local_store: StoreTarget, start_node: Any,
                                     client_of: Any) -> None:
    node = start_node(local_store, "n1", env={"ONCELOG_STREAMING_TOKEN": "s3cret"})
    assert node.address.startswith("127.0.0.1:")
    good = client_of(node.address, token="s3cret")
    good.create_channel("auth")
    good.append("auth", "one")
    head = good.describe_channel("auth").head
    for token in (None, "wrong"):
        bad = client_of(node.address, token=token)
        calls = [(bad.append, ("auth", "x")), (bad.describe_channel, ("auth",)),
                 (bad.read, ("auth",)), (bad.create_channel, ("auth2",))]
        for call, args in calls:
            with pytest.raises(StreamingError) as info:
                call(*args)
            assert info.value.code == Code.UNAUTHENTICATED
    answers = pytest.raises(grpc.RpcError, raw_produce, node.address, "auth",
                            [produce(1, b"x")], token="wrong")
    assert answers.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert good.describe_channel("auth").head == head
    assert [m.payload for m in take(good.read("auth"), 1)] == [b"one"]


def test_transactions(local_store: StoreTarget, start_node: Any, client_of: Any) -> None:
    node = start_node(local_store, "n1", tick=0.2)  # the expiry is observed through ticks
    c = client_of(node.address)
    c.create_channel("tx")
    with c.txn("tx", "vt", keepalive=10) as t:
        t.append("a")
        t.append_messages(["b", "c"])
    t2 = c.txn("tx", "vt")
    t2.append("rolled back")
    t2.rollback()
    t3 = c.txn("tx", "vt", keepalive=0.3)
    t3.append("expires")
    # The node's tick clock is its wall clock: a tick 0.2 s past the keepalive shows the
    # node's expiry has fired (the rollback is appended at once).
    expired_by = clock_from_unix_ns(time.time_ns() + 500_000_000)
    scanner = c.read("tx", DeliverAll(), time_ticks=True)
    deadline = time.monotonic() + WAIT
    for item in scanner:
        if isinstance(item, TimeTick) and item.time_tick > expired_by:
            break
        assert time.monotonic() < deadline
    scanner.close()
    with pytest.raises(StreamingError) as info:
        t3.commit()
    assert info.value.code == Code.TRANSACTION_EXPIRED
    c.append("tx", "last")
    assert [m.payload for m in take(c.read("tx"), 4)] == [b"a", b"b", b"c", b"last"]


def test_broadcast_is_atomic_across_channels(local_store: StoreTarget, start_node: Any,
                                             client_of: Any) -> None:
    node = start_node(local_store, "n1")
    c = client_of(node.address)
    for name in ("b/1", "b/2", "b/3"):
        c.create_channel(name)
    ids = c.broadcast(["b/1", "b/2", "b/3"], "hello", vchannel="all")
    assert [i.channel for i in ids] == ["b/1", "b/2", "b/3"]
    for name in ("b/1", "b/2", "b/3"):
        [m] = take(c.read(name), 1)
        assert (m.payload, m.vchannel) == (b"hello", "all")
    with pytest.raises(StreamingError) as info:
        c.broadcast(["b/1", "missing"], "x")
    assert info.value.code == Code.CHANNEL_NOT_EXIST


def test_idle_channels_get_time_ticks(local_store: StoreTarget, start_node: Any,
                                      client_of: Any) -> None:
    from oncelog.merge import read_time_ordered
    from oncelog.streaming import idle_ticks

    node = start_node(local_store, "n1", tick=0.1)
    c = client_of(node.address)
    c.create_channel("tt/busy", labels={"app": "tt"})
    c.create_channel("tt/idle", labels={"app": "tt"})
    c.append("tt/busy", "first")
    ticks: list[Any] = []
    scanner = c.read("tt/idle", DeliverAll(), time_ticks=True)
    for item in scanner:
        ticks.append(item)
        if len(ticks) == 2:
            break
    scanner.close()
    assert all(isinstance(t, TimeTick) for t in ticks) and ticks[0].time_tick < ticks[1].time_tick

    client = local_store.open()
    packs: queue.Queue[Any] = queue.Queue()

    def read() -> None:
        # Idle channels write nothing: their time comes from the node's heartbeat.
        idle = idle_ticks(client)
        for pack in read_time_ordered(client, "app=tt", tick=0.05, block=True, idle=idle):
            packs.put(pack)
            return

    threading.Thread(target=read, daemon=True).start()
    pack = packs.get(timeout=WAIT)  # the idle journal does not hold the pack back
    assert [e.message.doc["payload"] for e in pack.envelopes] == ["first"]
    client.close()


def test_graceful_stop(local_store: StoreTarget, start_node: Any, client_of: Any) -> None:
    node = start_node(local_store, "n1")
    c = client_of(node.address, retry_timeout=0.5)
    c.create_channel("stop")
    c.append("stop", "x")
    assert node.stop() == 0
    with pytest.raises(StreamingError) as info:
        c.append("stop", "y")
    assert info.value.code == Code.ON_SHUTDOWN
