"""Streaming nodes: Produce/Consume over gRPC on oncelog journals (needs `oncelog[streaming]`).

A *channel* is an oncelog journal of JSON-lines messages, each carrying a `vchannel`; a node
owns channels under *terms* recorded in the store, group-commits every producer of a channel
into shared fragments, and answers a produce only once it is durable and the node is still
the channel's owner. `oncelog serve` runs a node; `connect()` is the client. See
docs/streaming.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from oncelog._extras import needs_extra
from oncelog.streaming.errors import Code, StreamingError

if TYPE_CHECKING:
    from oncelog.streaming.client import (
        ChannelDescription,
        ChannelWatch,
        ConsumedMessage,
        DeliverAll,
        DeliverLatest,
        MessageID,
        Scanner,
        StartAfter,
        StartFrom,
        StreamingClient,
        StreamMessage,
        TimeTick,
        TimeTickGT,
        TimeTickGTE,
        Txn,
        VChannel,
        connect,
    )
    from oncelog.streaming.meta import idle_ticks

__all__ = [
    "ChannelDescription",
    "ChannelWatch",
    "Code",
    "ConsumedMessage",
    "DeliverAll",
    "DeliverLatest",
    "MessageID",
    "Scanner",
    "StartAfter",
    "StartFrom",
    "StreamMessage",
    "StreamingClient",
    "StreamingError",
    "TimeTick",
    "TimeTickGT",
    "TimeTickGTE",
    "Txn",
    "VChannel",
    "connect",
    "idle_ticks",
]

_CLIENT_NAMES = set(__all__) - {"Code", "StreamingError", "idle_ticks"}


def __getattr__(name: str) -> Any:
    # The client imports grpc: only when used, so `oncelog.streaming.errors` needs no grpcio.
    if name == "idle_ticks":  # no grpc needed: store readers use it
        from oncelog.streaming.meta import idle_ticks

        return idle_ticks
    if name in _CLIENT_NAMES:
        with needs_extra("streaming", f"oncelog.streaming.{name}"):
            from oncelog.streaming import client

        return getattr(client, name)
    raise AttributeError(f"module 'oncelog.streaming' has no attribute {name!r}")
