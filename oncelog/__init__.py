"""oncelog: exactly-once journals for Python in the style of Gazette.

The everyday names are re-exported here; each lives in a module of its own.
"""

from oncelog.errors import OncelogError
from oncelog.journal import FragmentSpec, JournalClient, JournalSpec, open_journals
from oncelog.message import (
    Clock,
    CSVRecord,
    Envelope,
    Flags,
    JSONMessage,
    build_uuid,
    get_clock,
    get_flags,
    get_producer_id,
    new_producer_id,
)
from oncelog.publisher import Publisher
from oncelog.reading import read_committed, read_uncommitted
from oncelog.sequencer import ProducerState, QueueOutcome, Sequencer

__version__ = "0.1.0"

__all__ = [
    "OncelogError",
    "open_journals",
    "JournalClient",
    "JournalSpec",
    "FragmentSpec",
    "Envelope",
    "Flags",
    "Clock",
    "build_uuid",
    "get_clock",
    "get_flags",
    "get_producer_id",
    "new_producer_id",
    "JSONMessage",
    "CSVRecord",
    "Publisher",
    "Sequencer",
    "QueueOutcome",
    "ProducerState",
    "read_uncommitted",
    "read_committed",
]
