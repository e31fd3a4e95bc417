"""What the parts of a `Consumer` share: its fields and the few helpers every part calls.

A consumer is three parts, one module each: input reading (`_input.InputReading`: the
round robin over journals, the Sequencer, the handler calls), the commit pipeline
(`_commit.CommitPipeline`: checkpoints, state objects, ACK intents, on a commit thread) and
the rest (`core.Consumer`: options, recovery, the `run()` loop). `ConsumerBase` declares
the fields they share, so that each part's use of them is type-checked.

Threads: every field here belongs to the thread calling `run()`, except what a commit job
carries (`_commit._CommitJob`), which the commit thread reads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import orjson

from oncelog.consumer._options import ConsumerOptions
from oncelog.consumer.checkpoint import Checkpoint, CheckpointStore, ConsumerError, FencedOut
from oncelog.consumer.metrics import ConsumerMetrics
from oncelog.consumer.sink import SQLiteSinkEngine
from oncelog.consumer.state import SQLiteStateEngine
from oncelog.message import Envelope
from oncelog.publisher import Publisher
from oncelog.sequencer import Sequencer

if TYPE_CHECKING:
    from oncelog.consumer._input import _Input
    from oncelog.consumer.core import Transaction
    from oncelog.journal import JournalClient

__all__ = ["ConsumerBase", "preview"]


class ConsumerBase:
    """The fields of a consumer (set by `Consumer.__init__` and `recover`)."""

    client: JournalClient
    group: str
    shards: int
    shard: int | None
    _options: ConsumerOptions
    _store: CheckpointStore
    _engine: SQLiteStateEngine | None
    _sink: SQLiteSinkEngine | None
    _handler: Callable[[Envelope, Transaction], None] | None
    _batch_handler: Callable[[list[Envelope], Transaction], None] | None
    _finalize: Callable[[Transaction], None] | None
    _new_message: Callable[[Any], Any] | None
    _lazy: bool
    _on_stage: Callable[[str], None] | None
    _metrics: ConsumerMetrics | None
    _labels: tuple[str, str]
    # Set by recover(); _seq is None whenever the consumer must recover before reading.
    _seq: Sequencer | None
    _publisher: Publisher | None
    _checkpoint: Checkpoint | None
    _state: Any
    _positions: dict[str, int]
    _inputs: dict[str, _Input]
    _dirty: bool
    _txn: Transaction | None
    _carry: Iterator[Envelope] | None
    """With split_upstream: the sequencing iterator suspended mid upstream transaction,
    resumed by the next transaction (None when the Sequencer is between sequences)."""
    _fenced: str | None
    _stopping: bool
    _stop_event: threading.Event

    def _close_inputs(self) -> None:
        carry, self._carry = self._carry, None
        if carry is not None and hasattr(carry, "close"):
            carry.close()
        for inp in self._inputs.values():
            inp.close()

    def _check_not_fenced(self) -> None:
        if self._fenced is not None:
            raise FencedOut(self._fenced)

    def _stage(self, name: str) -> None:
        if self._on_stage is not None:
            self._on_stage(name)

    def _encode_state(self, state: Any) -> bytes:
        try:
            return orjson.dumps(state)
        except TypeError as exc:
            raise ConsumerError(
                f"{self!r}: the state is not JSON-serialisable ({exc}): {preview(state)}"
            ) from exc


def preview(value: Any, limit: int = 120) -> str:
    """`repr(value)`, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
