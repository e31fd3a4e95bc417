"""Test your own pipelines with oncelog: strategies, a reference model, exactly-once checks.

- `histories()` / `run_history()`: hypothesis histories of interleaved producers with
  transactions, rollbacks, crashes and duplicated appends, performed with real Publishers.
- `ReadCommittedModel`: what a correct read-committed reader must deliver.
- `assert_exactly_once(inputs, outputs, key=...)`: every input once, nothing else.
- `read_committed_with_restarts()`: a reader that crashes and resumes from checkpoints.
- `consumer_machine(handler, expected, key=... | view=...)`: a hypothesis state machine
  that drives your consumer handler through upstream transactions, duplicates, consumer
  crashes, restarts and zombies, and checks its committed outputs against a reference.
- `json_messages()`, `json_documents()`, `csv_records()`: message strategies.
- Fixtures for pytest (`oncelog.testing.fixtures`): temporary local stores and an S3
  test server.
"""

from typing import TYPE_CHECKING

from oncelog._lazy import lazy_exports

if TYPE_CHECKING:
    from oncelog.testing.machine import (
        ConsumerCrash,
        ConsumerMachine,
        consumer_machine,
        sentences,
    )
    from oncelog.testing.model import (
        ExactlyOnceViolation,
        ReadCommittedModel,
        assert_exactly_once,
    )
    from oncelog.testing.strategies import (
        Action,
        HistoryRun,
        Step,
        csv_records,
        histories,
        json_documents,
        json_messages,
        read_committed_with_restarts,
        run_history,
    )

_HOMES = {
    **dict.fromkeys(
        ("ConsumerCrash", "ConsumerMachine", "consumer_machine", "sentences"),
        "oncelog.testing.machine",
    ),
    **dict.fromkeys(
        ("ExactlyOnceViolation", "ReadCommittedModel", "assert_exactly_once"),
        "oncelog.testing.model",
    ),
    **dict.fromkeys(
        ("Action", "HistoryRun", "Step", "csv_records", "histories", "json_documents",
         "json_messages", "read_committed_with_restarts", "run_history"),
        "oncelog.testing.strategies",
    ),
}
"""Where each name lives. They are imported on first use, so that a process importing only
`oncelog.testing.fixtures` or `.processes` (every SIGKILLed child of a fault test) does not
import hypothesis."""


__getattr__, __dir__ = lazy_exports("oncelog.testing", _HOMES, globals())


__all__ = [
    "Action",
    "ConsumerCrash",
    "ConsumerMachine",
    "ExactlyOnceViolation",
    "HistoryRun",
    "ReadCommittedModel",
    "Step",
    "assert_exactly_once",
    "consumer_machine",
    "csv_records",
    "histories",
    "json_documents",
    "json_messages",
    "read_committed_with_restarts",
    "run_history",
    "sentences",
]
