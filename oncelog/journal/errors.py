"""Errors raised by the journal layer; every one derives from JournalError."""

from __future__ import annotations

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
]


class JournalError(Exception):
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
    """A fragment could not be written or claimed; the append did not happen."""


class OffsetNotAvailable(JournalError):
    """A read asked for an offset before the journal's first fragment or past its head."""


class ReaderClosed(JournalError):
    """The reader was closed (possibly from another thread) while in use."""
