"""Errors raised by the journal layer; every one derives from JournalError."""

from __future__ import annotations

from typing import Any

from oncelog.errors import OncelogError

__all__ = [
    "JournalError",
    "InvalidJournalName",
    "InvalidJournalSpec",
    "InvalidObjectPath",
    "JournalNotFound",
    "JournalExists",
    "FragmentChecksumError",
    "MissingFragment",
    "UnknownCodec",
    "InvalidFragmentName",
    "AppendNotSupported",
    "AppendFailed",
    "OffsetNotAvailable",
    "ReaderClosed",
    "StorageUnavailable",
    "CorruptSpec",
    "JournalRecreated",
    "StoreNotFound",
    "InvalidStoreURL",
    "CorruptClaim",
    "CorruptRecord",
]


class JournalError(OncelogError):
    """Base class of every error raised by oncelog.journal."""


class InvalidJournalName(JournalError, ValueError):
    """A journal name breaks the naming rules (checked before any storage call)."""


class InvalidJournalSpec(JournalError, ValueError):
    """A JournalSpec or FragmentSpec field holds a value that cannot be used."""


class InvalidObjectPath(JournalError, ValueError):
    """A relative object path under `<root>/.oncelog/` is unsafe or malformed."""


class JournalNotFound(JournalError, LookupError):
    """The journal has no spec (and, for reads, no fragments) in this store."""


class JournalExists(JournalError):
    """`create` found a spec already stored under the journal's name."""


class FragmentChecksumError(JournalError):
    """A fragment's content does not match the SHA1 sum in its name."""


class MissingFragment(JournalError):
    """A claimed fragment (or a claim inside the journal) is absent from the store."""


class UnknownCodec(JournalError, ValueError):
    """A fragment name or spec uses a compression codec oncelog cannot decode."""


class InvalidFragmentName(JournalError, ValueError):
    """A text is not a Gazette fragment content name."""


class AppendNotSupported(JournalError):
    """Appending is refused: the store cannot create objects only-if-absent, or the
    journal is a read-only Gazette fragment store."""


class AppendFailed(JournalError):
    """A fragment could not be written or claimed.

    `made` states the append's outcome where it is known: False when it certainly was not
    made (nothing of it can appear in the journal), None when it may have been (a claim
    whose reply was lost, an unexpected failure). The message says the same in words;
    callers deciding on the outcome (a commit reporting what it committed) use `made`.
    """

    def __init__(self, message: str, *, made: bool | None = None) -> None:
        super().__init__(message)
        self.made = made

    def __reduce__(self) -> tuple[Any, ...]:
        return _append_failed, (str(self), self.made)


def _append_failed(message: str, made: bool | None) -> AppendFailed:
    return AppendFailed(message, made=made)


class OffsetNotAvailable(JournalError):
    """A read asked for an offset before the journal's first fragment or past its head."""


class ReaderClosed(JournalError):
    """The reader was closed (possibly from another thread) while in use."""


class StorageUnavailable(JournalError):
    """A storage call kept failing with transient errors (5xx, 409 conflicts, resets,
    timeouts) for the client's `retry_timeout`. `outcome_known` says whether a write may
    have taken effect: False means it may or may not exist now (read it back to know)."""

    def __init__(self, message: str, *, outcome_known: bool = True) -> None:
        super().__init__(message)
        self.outcome_known = outcome_known


class CorruptSpec(JournalError, ValueError):
    """A stored spec.json cannot be parsed; the message names the journal and the object."""


class JournalRecreated(JournalError):
    """The journal was deleted and created again under the same name while it was being
    read or appended to: offsets of the old journal mean nothing in the new one."""


class StoreNotFound(JournalNotFound):
    """The store itself is missing: its local directory does not exist (or is a regular
    file), or its S3 bucket does not exist. The message names the directory or bucket.
    A JournalNotFound too, as every journal of a missing store is."""


class InvalidStoreURL(JournalError, ValueError):
    """A store URL that cannot be right: a misspelled scheme (`s3:/bucket`, `s3:bucket`,
    `file:/dir`), a scheme fsspec does not know, or an S3 URL without a bucket."""


class CorruptClaim(JournalError):
    """A claim object cannot be parsed or names a fragment at another offset."""


class CorruptRecord(JournalError):
    """A compaction record cannot be parsed or does not describe contiguous fragments."""
