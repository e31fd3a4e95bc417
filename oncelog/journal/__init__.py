"""Journals: named, append-only byte streams stored as Gazette fragments on any fsspec store.

`open_journals(url)` gives a JournalClient for local disk, memory:// or s3://. Appends are
spooled, written as content-named fragments and claimed with create-only-if-absent objects,
so many writers on many machines append safely without a broker. See docs/storage.md.
"""

from oncelog.journal.appender import AppendResult, AsyncAppend, AsyncAppendMany
from oncelog.journal.client import DEFAULT_GC_GRACE, JournalClient, open_journals
from oncelog.journal.errors import (
    AppendFailed,
    AppendNotSupported,
    CorruptSpec,
    FragmentChecksumError,
    InvalidFragmentName,
    InvalidJournalName,
    InvalidJournalSpec,
    InvalidObjectPath,
    InvalidStoreURL,
    JournalError,
    JournalExists,
    JournalNotFound,
    JournalRecreated,
    MissingFragment,
    OffsetNotAvailable,
    ReaderClosed,
    StorageUnavailable,
    StoreNotFound,
    UnknownCodec,
)
from oncelog.journal.fragment import Codec, Fragment, parse_content_name
from oncelog.journal.names import MAX_JOURNAL_NAME_LEN, validate_journal_name
from oncelog.journal.reader import JournalReader
from oncelog.journal.spec import DEFAULT_FRAGMENT_LENGTH, FragmentSpec, JournalOwner, JournalSpec
from oncelog.journal.store import Claim, CorruptClaim
from oncelog.journal.verify import VerifyProblem, VerifyReport

__all__ = [
    "open_journals",
    "JournalClient",
    "JournalSpec",
    "FragmentSpec",
    "JournalOwner",
    "Fragment",
    "Codec",
    "Claim",
    "AppendResult",
    "AsyncAppend",
    "AsyncAppendMany",
    "JournalReader",
    "VerifyReport",
    "VerifyProblem",
    "parse_content_name",
    "validate_journal_name",
    "MAX_JOURNAL_NAME_LEN",
    "DEFAULT_FRAGMENT_LENGTH",
    "DEFAULT_GC_GRACE",
    "JournalError",
    "JournalNotFound",
    "JournalExists",
    "InvalidJournalName",
    "InvalidJournalSpec",
    "InvalidObjectPath",
    "InvalidFragmentName",
    "FragmentChecksumError",
    "MissingFragment",
    "CorruptClaim",
    "UnknownCodec",
    "AppendNotSupported",
    "AppendFailed",
    "OffsetNotAvailable",
    "ReaderClosed",
    "StorageUnavailable",
    "CorruptSpec",
    "JournalRecreated",
    "StoreNotFound",
    "InvalidStoreURL",
]
