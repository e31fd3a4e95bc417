"""oncelog: exactly-once journals for Python in the style of Gazette.

The everyday names are re-exported here, so one `import oncelog` (or `from oncelog import
...`) reaches journals, messages, publishing, reading, mappings, consumers and the errors
a caller catches; each name lives in a module of its own, where docs/api.md lists it.
Every error oncelog raises on purpose derives from `OncelogError`.

The consumer names (`Consumer`, `Transaction`, `group_status` and the consumer errors) are
loaded on first use (PEP 562 `__getattr__`): importing `oncelog.consumer` costs about a
sixth of `import oncelog`, and a program that never consumes should not pay it. `__all__`
lists them all the same, so `from oncelog import *` and `dir(oncelog)` see them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import oncelog.tables as _tables  # noqa: E402,F401  (registers the segments extension)
from oncelog._lazy import lazy_exports
from oncelog.errors import (
    BadMessage,
    EmptyPartitions,
    FencedOut,
    InvalidTransactionalId,
    MissingContentType,
    MissingExtra,
    OncelogError,
    ReplayError,
    ReplayRequired,
    SelectorError,
    SequencerError,
    TransactionError,
    TransactionExpired,
    TransactionRecordError,
)
from oncelog.framing.errors import EncodeError, FrameDecodeError, FramingError, UnknownContentType
from oncelog.journal import FragmentSpec, JournalClient, JournalSpec, open_journals
from oncelog.journal.errors import (
    AppendFailed,
    AppendNotSupported,
    FragmentChecksumError,
    InvalidJournalName,
    InvalidJournalSpec,
    JournalError,
    JournalExists,
    JournalNotFound,
    JournalRecreated,
    MissingFragment,
    OffsetNotAvailable,
    StorageUnavailable,
    StoreNotFound,
)
from oncelog.mapping import (
    ModuloMapping,
    PolledList,
    RandomMapping,
    RendezvousMapping,
    modulo,
    rendezvous,
)
from oncelog.message import (
    Clock,
    CSVRecord,
    Envelope,
    Flags,
    JSONMessage,
    build_uuid,
    clock_from_unix_ns,
    get_clock,
    get_flags,
    get_producer_id,
    new_producer_id,
)
from oncelog.publisher import Publisher
from oncelog.reading import (
    CommittedBatch,
    read_committed,
    read_committed_batches,
    read_uncommitted,
)
from oncelog.sequencer import ProducerState, QueueOutcome, Sequencer

if TYPE_CHECKING:
    from oncelog.consumer import (
        CheckpointError,
        CheckpointTrimmed,
        Consumer,
        ConsumerError,
        GroupNotFound,
        InvalidGroupName,
        Transaction,
        group_status,
    )

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    "Consumer": "oncelog.consumer",
    "Transaction": "oncelog.consumer",
    "group_status": "oncelog.consumer",
    "ConsumerError": "oncelog.consumer",
    "CheckpointError": "oncelog.consumer",
    "CheckpointTrimmed": "oncelog.consumer",
    "GroupNotFound": "oncelog.consumer",
    "InvalidGroupName": "oncelog.consumer",
}
"""Exported names loaded on first use, and the module each comes from."""


__getattr__, __dir__ = lazy_exports("oncelog", _LAZY, globals())


__all__ = [
    # journals
    "open_journals",
    "JournalClient",
    "JournalSpec",
    "FragmentSpec",
    # messages
    "Envelope",
    "Flags",
    "Clock",
    "build_uuid",
    "clock_from_unix_ns",
    "get_clock",
    "get_flags",
    "get_producer_id",
    "new_producer_id",
    "JSONMessage",
    "CSVRecord",
    # publishing and mappings
    "Publisher",
    "modulo",
    "rendezvous",
    "ModuloMapping",
    "RendezvousMapping",
    "RandomMapping",
    "PolledList",
    # reading
    "Sequencer",
    "QueueOutcome",
    "ProducerState",
    "read_uncommitted",
    "read_committed",
    "read_committed_batches",
    "CommittedBatch",
    # consuming (loaded on first use)
    "Consumer",
    "Transaction",
    "group_status",
    # errors: the root, then by family
    "OncelogError",
    "FencedOut",
    "JournalError",
    "JournalNotFound",
    "StoreNotFound",
    "JournalExists",
    "InvalidJournalName",
    "InvalidJournalSpec",
    "OffsetNotAvailable",
    "AppendFailed",
    "AppendNotSupported",
    "StorageUnavailable",
    "FragmentChecksumError",
    "MissingFragment",
    "JournalRecreated",
    "FramingError",
    "FrameDecodeError",
    "UnknownContentType",
    "EncodeError",
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
    "ConsumerError",
    "CheckpointError",
    "CheckpointTrimmed",
    "GroupNotFound",
    "InvalidGroupName",
]
