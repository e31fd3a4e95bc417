"""The client's waits for a node, on the shared retry loop, without servers: a broadcast
against scripted node answers (`_unary` replaced) is resent with the same request (the same
UUID) after a lost or fenced node, gives up at once on a missing channel or a refusal, and
raises the node's last error once `retry_timeout` has passed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from oncelog.streaming import Code, StreamingClient, StreamingError, connect
from oncelog.streaming import streaming_pb2 as pb

OWNER = "127.0.0.1:1"  # never dialled: `_unary` is scripted


class ScriptedNodes:
    """`_unary` of a client: DescribeChannel answers from `missing`; Broadcast raises the
    scripted errors in turn, then acknowledges. Every Broadcast request is recorded."""

    def __init__(self, errors: list[StreamingError], missing: frozenset[str] = frozenset()):
        self.errors = errors
        self.missing = missing
        self.broadcasts: list[pb.BroadcastRequest] = []

    def __call__(self, method: str, request: Any, address: str | None = None) -> Any:
        if method == "DescribeChannel":
            if request.name in self.missing:
                return pb.DescribeChannelResponse(error=pb.StreamingError(
                    code=Code.CHANNEL_NOT_EXIST, cause=f"no channel {request.name!r}"))
            return pb.DescribeChannelResponse(channel=pb.ChannelDescription(
                channel=pb.ChannelInfo(name=request.name, term=1),
                owner=pb.ChannelOwner(node_id="n1", address=OWNER)))
        assert method == "Broadcast" and address == OWNER
        copy = pb.BroadcastRequest()
        copy.CopyFrom(request)
        self.broadcasts.append(copy)
        if self.errors:
            raise self.errors.pop(0)
        return pb.BroadcastResponse(ids=[
            pb.MessageID(channel=name, begin=0, end=10) for name in request.channels])


@pytest.fixture
def client() -> Iterator[StreamingClient]:
    c = connect(OWNER, retry_timeout=5.0)
    yield c
    c.close()


def scripted(client: StreamingClient, nodes: ScriptedNodes) -> ScriptedNodes:
    client._unary = nodes  # type: ignore[method-assign]
    return nodes


def test_broadcast_is_resent_with_the_same_uuid_after_lost_nodes(
        client: StreamingClient) -> None:
    nodes = scripted(client, ScriptedNodes([
        StreamingError(Code.ON_SHUTDOWN, "node unavailable"),
        StreamingError(Code.CHANNEL_FENCED, "fenced at term 2"),
        StreamingError(Code.CHANNEL_NOT_EXIST, "not the owner"),  # both channels exist
    ]))
    ids = client.broadcast(["b/1", "b/2"], "hello")
    assert [i.channel for i in ids] == ["b/1", "b/2"]
    assert len(nodes.broadcasts) == 4
    uuids = {r.message.uuid for r in nodes.broadcasts}
    assert len(uuids) == 1 and uuids != {""}
    assert all(r == nodes.broadcasts[0] for r in nodes.broadcasts)


def test_broadcast_gives_up_at_once_on_a_missing_channel(client: StreamingClient) -> None:
    nodes = scripted(client, ScriptedNodes(
        [StreamingError(Code.CHANNEL_NOT_EXIST, "not here")] * 50, missing=frozenset({"b/2"})))
    with pytest.raises(StreamingError) as info:
        client.broadcast(["b/1", "b/2"], "hello")
    assert info.value.code == Code.CHANNEL_NOT_EXIST
    assert info.value.cause == "no channel 'b/2'"
    assert len(nodes.broadcasts) == 1


def test_broadcast_raises_a_refusal_at_once(client: StreamingClient) -> None:
    refusal = StreamingError(Code.INVALID_ARGUMENT, "request too large")
    nodes = scripted(client, ScriptedNodes([refusal]))
    with pytest.raises(StreamingError) as info:
        client.broadcast(["b/1"], "hello")
    assert info.value is refusal
    assert len(nodes.broadcasts) == 1


def test_broadcast_raises_the_last_node_error_within_retry_timeout() -> None:
    c = connect(OWNER, retry_timeout=0.5)
    try:
        errors = [StreamingError(Code.ON_SHUTDOWN, f"node unavailable ({i})")
                  for i in range(1000)]
        nodes = scripted(c, ScriptedNodes(errors))
        start = time.monotonic()
        with pytest.raises(StreamingError) as info:
            c.broadcast(["b/1"], "hello")
        elapsed = time.monotonic() - start
    finally:
        c.close()
    assert info.value.code == Code.ON_SHUTDOWN
    assert info.value.cause == f"node unavailable ({len(nodes.broadcasts) - 1})"
    assert 1 < len(nodes.broadcasts) < 100
    assert elapsed < 0.5 + 0.5  # retry_timeout, plus at most half a pause of jitter


def test_a_recovery_that_fails_unexpectedly_fails_every_pending_request(
    client: StreamingClient,
) -> None:
    """`_open` raising something other than a StreamingError during recovery must not leave
    the producer 'recovering' with futures that never resolve."""
    from oncelog.streaming.client import _ChannelProducer, _Req

    producer = _ChannelProducer(client, "ch")
    req = _Req("produce", [pb.Message(payload=b"x")])
    req.key = 0
    producer._unacked[0] = req
    producer._recovering = True

    def broken_open() -> Any:
        raise RuntimeError("resolver exploded")

    producer._open = broken_open  # type: ignore[method-assign]
    producer._recover(StreamingError(Code.EOF, "stream broke"))
    assert not producer._recovering and not producer._unacked
    with pytest.raises(StreamingError, match="reconnecting failed: RuntimeError"):
        req.future.result(timeout=5)
