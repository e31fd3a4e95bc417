"""The root of every error oncelog raises.

`OncelogError` is the one base class a caller can catch for anything oncelog raises on
purpose. The tree (each family keeps the standard-library base it had, so existing
`except ValueError` / `except LookupError` handlers keep working):

- `JournalError`: storage, names, specs, fragments, appends, reads (`oncelog.journal.errors`)
  - `StorageUnavailable`: a storage call kept failing for the retry timeout
- `FramingError`: bytes that are not frames of the journal's framing (`oncelog.framing`)
- `SequencerError`: sequencing and replays (`oncelog.sequencer`)
- `TransactionError`: publisher transactions (`oncelog.publisher`)
  - `TransactionExpired`: no append for the transaction's keepalive: rolled back
- `ConsumerError`: consumers, checkpoints and groups (`oncelog.consumer`)
- `FencedOut`: a newer instance of the same identity took over (consumers, publishers)
- `EmptyPartitions`, `MissingContentType`: mappings (`oncelog.mapping`)
- `SelectorError`: label selectors (`oncelog.labels`)
- `OptionError`, `SchemaError`: the Spark data source (`oncelog.spark`)
"""

from __future__ import annotations

__all__ = ["OncelogError", "FencedOut"]


class OncelogError(Exception):
    """Base class of every error oncelog raises on purpose."""


class FencedOut(OncelogError, RuntimeError):
    """Another instance with the same identity (consumer group, transactional id, channel)
    took over: this one must stop writing. Nothing it commits from now on becomes visible."""
