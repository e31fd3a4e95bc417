"""The small objects a `Consumer` hands to its parts: its stage hook, its stop request,
and the state encoding they both need.

A consumer is composed of three objects, one module each: the input reader
(`_input.InputReader`: the round robin over journals, the Sequencer, the handler calls),
the commit pipeline (`_commit.CommitPipeline`: checkpoints, state objects, ACK intents, on
a commit thread) and the consumer itself (`core.Consumer`: options, recovery, the `run()`
loop, which wires the other two). The objects here are shared by reference between them;
each says who writes it and who reads it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import orjson

from oncelog.consumer.checkpoint import ConsumerError

__all__ = ["Stages", "StopRequest", "encode_state", "preview"]


class Stages:
    """The consumer's `on_stage` hook, called by the reader (the consumer's thread) and the
    commit pipeline (both threads).

    `hook` may be replaced while no `run()` is under way (tests do, through
    `Consumer._on_stage`); readers look it up at each call, so the replacement reaches
    every part at once. No lock: a reference assignment is atomic under the GIL.
    """

    __slots__ = ("hook",)

    def __init__(self, hook: Callable[[str], None] | None) -> None:
        self.hook = hook

    def __call__(self, name: str) -> None:
        hook = self.hook
        if hook is not None:
            hook(name)


class StopRequest:
    """`Consumer.stop()`'s request, from any thread, to end `run()` after committing.

    `requested` is set by `stop()` and cleared by `run()` on return; the reader reads it
    between envelopes (a plain attribute: the hot loop pays no call). `wait` sleeps
    between polls of idle journals, and wakes at once on a stop. No lock: both fields are
    set by single atomic stores under the GIL, and readers need only see them eventually.
    """

    __slots__ = ("requested", "_event")

    def __init__(self) -> None:
        self.requested = False
        self._event = threading.Event()

    def set(self) -> None:
        self.requested = True
        self._event.set()

    def clear(self) -> None:
        self.requested = False
        self._event.clear()

    def wait(self, timeout: float) -> None:
        """Sleep up to `timeout` seconds, or until `set()`."""
        self._event.wait(timeout)


def encode_state(state: Any, owner: str) -> bytes:
    """The JSON bytes of a consumer's state; ConsumerError naming `owner` (the consumer's
    repr) and a preview of the state if it is not JSON-serialisable."""
    try:
        return orjson.dumps(state)
    except TypeError as exc:
        raise ConsumerError(
            f"{owner}: the state is not JSON-serialisable ({exc}): {preview(state)}"
        ) from exc


def preview(value: Any, limit: int = 120) -> str:
    """`repr(value)`, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
