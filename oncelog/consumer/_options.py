"""The consumer's options, checked once when a `Consumer` is made.

`ConsumerOptions` holds every setting that does not change while the consumer runs (limits
of a transaction, intervals, where reading starts, sharding, pruning). `consumer_options`
checks the arguments of `Consumer(...)` and raises TypeError / ValueError naming the bad
one, before anything is read or written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from oncelog.labels import LabelSelector

__all__ = ["ConsumerOptions", "consumer_options", "seconds"]


def seconds(value: float | timedelta, what: str) -> float:
    """`value` in seconds (a number or a timedelta); ValueError unless positive."""
    out = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not out > 0:
        raise ValueError(f"{what} must be positive, not {value!r}")
    return out


@dataclass(frozen=True, slots=True)
class ConsumerOptions:
    """A consumer's fixed settings (see `Consumer` for what each means)."""

    selector: LabelSelector | None
    """The label selector of the group's journals, or None for a list of names."""
    names: list[str]
    """The journal names (without a selector), duplicates removed, in order."""
    shards: int
    shard: int | None
    """The shard index, or None when the group is not sharded (`shards == 1`)."""
    max_messages: int
    max_duration: float
    start: Literal["beginning", "head"]
    poll_interval: float
    refresh_interval: float
    prune_horizon: timedelta | float
    keep_checkpoints: int | None
    buffer: int | None
    read_batch: int
    split_upstream: bool
    on_trimmed: Literal["error", "skip"] = "error"
    """What recovery does when a checkpoint needs bytes trimmed from a journal
    (oncelog.consumer._trimmed)."""


def consumer_options(
    journals: LabelSelector | str | Sequence[str],
    handler: Callable[..., Any] | None,
    batch_handler: Callable[..., Any] | None,
    *,
    shards: int,
    shard: int,
    max_messages: int,
    max_duration: float | timedelta,
    start: Literal["beginning", "head"],
    poll_interval: float | timedelta,
    refresh_interval: float | timedelta,
    prune_horizon: timedelta | float,
    keep_checkpoints: int | None,
    buffer: int | None,
    read_batch: int,
    split_upstream: bool,
    on_trimmed: Literal["error", "skip"] = "error",
) -> ConsumerOptions:
    """Check `Consumer(...)`'s arguments (TypeError / ValueError naming the bad one)."""
    if isinstance(journals, (str, LabelSelector)):
        selector: LabelSelector | None = LabelSelector.from_value(journals)
        names: list[str] = []
    else:
        selector = None
        names = list(dict.fromkeys(journals))
        if not all(isinstance(j, str) for j in names):
            raise TypeError(f"journals must be a label selector or a list of names: {journals!r}")
    if (handler is None) == (batch_handler is None):
        raise TypeError("give exactly one of handler= and batch_handler=")
    if not callable(handler if batch_handler is None else batch_handler):
        raise TypeError(f"handler must be callable, not {handler or batch_handler!r}")
    if start not in ("beginning", "head"):
        raise ValueError(f"start must be 'beginning' or 'head', not {start!r}")
    if on_trimmed not in ("error", "skip"):
        raise ValueError(f"on_trimmed must be 'error' or 'skip', not {on_trimmed!r}")
    if not isinstance(max_messages, int) or max_messages < 1:
        raise ValueError(f"max_messages must be an int >= 1, not {max_messages!r}")
    if keep_checkpoints is not None and (
        not isinstance(keep_checkpoints, int) or keep_checkpoints < 1
    ):
        raise ValueError(
            f"keep_checkpoints must be None or an int >= 1, not {keep_checkpoints!r}"
        )
    if not isinstance(read_batch, int) or read_batch < 1:
        raise ValueError(f"read_batch must be an int >= 1, not {read_batch!r}")
    if not isinstance(shards, int) or shards < 1:
        raise ValueError(f"shards must be an int >= 1, not {shards!r}")
    if not isinstance(shard, int) or not 0 <= shard < shards:
        raise ValueError(f"shard must be an int in [0, {shards}), not {shard!r}")
    horizon = (
        prune_horizon.total_seconds() if isinstance(prune_horizon, timedelta) else prune_horizon
    )
    if isinstance(horizon, bool) or not isinstance(horizon, (int, float)) or not horizon >= 0:
        raise ValueError(
            f"prune_horizon must be a timedelta or seconds >= 0, not {prune_horizon!r}"
        )
    return ConsumerOptions(
        selector=selector,
        names=names,
        shards=shards,
        shard=None if shards == 1 else shard,
        max_messages=max_messages,
        max_duration=seconds(max_duration, "max_duration"),
        start=start,
        poll_interval=seconds(poll_interval, "poll_interval"),
        refresh_interval=seconds(refresh_interval, "refresh_interval"),
        prune_horizon=prune_horizon,
        keep_checkpoints=keep_checkpoints,
        buffer=buffer,
        read_batch=read_batch,
        split_upstream=bool(split_upstream),
        on_trimmed=on_trimmed,
    )
