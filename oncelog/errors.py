"""The root of every error oncelog raises, and the errors of oncelog's top-level modules.

`OncelogError` is the one base class a caller can catch for anything oncelog raises on
purpose. Each package defines its errors in one module, `errors`, and every other module
re-exports the ones it raises (so `from oncelog.publisher import TransactionError` keeps
working); the everyday ones are re-exported by `oncelog` itself. The tree (each family
keeps the standard-library base it had, so existing `except ValueError` /
`except LookupError` handlers keep working):

- `JournalError`: storage, names, specs, fragments, appends, reads (`oncelog.journal.errors`)
  - `StorageUnavailable`: a storage call kept failing for the retry timeout
- `FramingError`: bytes that are not frames of the journal's framing (`oncelog.framing.errors`)
- `BadMessage`: a frame decoded, but its message is unusable (CLI, Arrow and Spark reads)
- `SequencerError`: sequencing and replays (`oncelog.sequencer`)
- `TransactionError`: publisher transactions (`oncelog.publisher`, `oncelog.transactions`)
  - `TransactionExpired`: no append for the transaction's keepalive: rolled back
  - `TransactionRecordError`: a transaction record cannot be parsed or written
  - `InvalidTransactionalId`: a transactional id or write id breaks the naming rule
- `ConsumerError`: consumers, checkpoints and groups (`oncelog.consumer.errors`)
  - `InvalidGroupName`: a consumer group name breaks the naming rule
- `FencedOut`: a newer instance of the same identity took over (consumers, publishers)
- `EmptyPartitions`, `MissingContentType`: mappings (`oncelog.mapping`)
- `SelectorError`: label selectors (`oncelog.labels`)
- `MissingExtra`: a feature's optional package is not installed (also a ModuleNotFoundError)
- `OptionError`, `SchemaError`: the Spark data source (`oncelog.spark.errors`)
- `Diverged`, `NotBulk`: the split planner (`oncelog.sequencing.errors`)
- `TablesError`, `SegmentError`, `SegmentWarning`, `ExportError`: columnar segments and
  exports (`oncelog.tables.errors`)
- `StreamingError`: answers of a streaming node (`oncelog.streaming.errors`)
- `ExactlyOnceViolation`, `ConsumerCrash`, `ChildTimeout`: the test kit
  (`oncelog.testing.errors`)

This module imports nothing from oncelog, so any module can import it without a cycle.
"""

from __future__ import annotations

__all__ = [
    "OncelogError",
    "FencedOut",
    "BadMessage",
    "TransactionError",
    "TransactionExpired",
    "TransactionRecordError",
    "InvalidTransactionalId",
    "SequencerError",
    "ReplayError",
    "ReplayRequired",
    "EmptyPartitions",
    "MissingContentType",
    "SelectorError",
    "MissingExtra",
]


class OncelogError(Exception):
    """Base class of every error oncelog raises on purpose."""


class FencedOut(OncelogError, RuntimeError):
    """Another instance with the same identity (consumer group, transactional id, channel)
    took over: this one must stop writing. Nothing it commits from now on becomes visible."""


class BadMessage(OncelogError, ValueError):
    """A frame decoded but its message is unusable: its UUID field is not a UUID, or (Arrow
    and Spark reads) its document does not fit the requested schema. The message names the
    journal and the offsets.

    `BadMessage(reason, journal=..., begin=..., end=...)` formats them into the message and
    keeps them as attributes; `BadMessage(text)` takes a message that names them already
    (the attributes are None then)."""

    def __init__(
        self,
        reason: str,
        *,
        journal: str | None = None,
        begin: int | None = None,
        end: int | None = None,
    ) -> None:
        self.journal, self.begin, self.end = journal, begin, end
        if journal is None:
            super().__init__(reason)
        else:
            super().__init__(f"journal {journal}: bad message at offset {begin}-{end}: {reason}")


# -- publisher transactions (oncelog.publisher, oncelog.transactions) ----------------------


class TransactionError(OncelogError, RuntimeError):
    """A transaction could not be committed; its messages were rolled back where possible."""


class TransactionExpired(TransactionError):
    """The transaction published nothing for its keepalive and was rolled back."""


class TransactionRecordError(TransactionError, ValueError):
    """A transaction record cannot be parsed; the message names the object."""


class InvalidTransactionalId(TransactionError, ValueError):
    """A transactional id (or a Spark write id) is not one path component of 1 to 128
    letters, digits and `-_+.=%` not starting with `.`; checked before any storage call.
    The message names the value and the rule."""


# -- sequencing (oncelog.sequencer) --------------------------------------------------------


class SequencerError(OncelogError, RuntimeError):
    """The Sequencer was used out of order (e.g. queued while committed messages remain)."""


class ReplayError(SequencerError, ValueError):
    """A replay yielded an envelope outside `replay_range()` (wrong journal or offsets)."""


class ReplayRequired(SequencerError):
    """`sequence()` met a commit whose messages left the ring, and has no `replay` to read them.

    The sequencer is left exactly as after `queue_uncommitted()` returned
    ACK_COMMIT_REPLAY: call `start_replay()` with a reader of
    `(journal, begin, end)`, then `step()` until it returns None.
    """

    def __init__(self, journal: str, begin: int, end: int) -> None:
        super().__init__(
            f"a replay of journal {journal!r} offsets [{begin}, {end}) is needed to deliver a"
            " committed sequence that left the ring: pass replay= to sequence(), or call"
            " start_replay() and step()"
        )
        self.journal = journal
        self.begin = begin
        self.end = end


# -- mappings (oncelog.mapping) and label selectors (oncelog.labels) -----------------------


class EmptyPartitions(OncelogError, LookupError):
    """There is no partition to map a message to: ``partitions()`` returned none."""


class MissingContentType(OncelogError, ValueError):
    """A partition chosen for a message has no usable ``content-type`` label."""


class MissingExtra(OncelogError, ModuleNotFoundError):
    """A feature needs an optional package that is not installed.

    The message names the feature, the missing module and the command that installs it:
    `read_committed_arrow needs pyarrow, which is not installed: pip install
    'oncelog[arrow]'`. It is a `ModuleNotFoundError` (so an `ImportError`) as well as an
    `OncelogError`, so handlers written for the bare import error keep working.
    Attributes: `feature`, `extra`, `module` (the missing top-level module; also `name`).
    """

    def __init__(self, feature: str, extra: str, module: str) -> None:
        self.feature, self.extra, self.module = feature, extra, module
        super().__init__(
            f"{feature} needs {module}, which is not installed: "
            f"pip install 'oncelog[{extra}]'",
            name=module,
        )

    def __reduce__(self) -> tuple[type[MissingExtra], tuple[str, str, str]]:
        # Spark and multiprocessing pickle errors across processes: keep the arguments.
        return type(self), (self.feature, self.extra, self.module)


class SelectorError(OncelogError, ValueError):
    """A label selector could not be parsed; names the text, the reason and the position."""

    def __init__(self, text: str, reason: str, position: int) -> None:
        super().__init__(f"bad label selector {text!r}: {reason} at {position}")
        self.text = text
        self.reason = reason
        self.position = position
