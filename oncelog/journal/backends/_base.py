"""What every backend shares: listings, staged files, the Backend protocol and a base class."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

from fsspec import AbstractFileSystem

from oncelog.journal.errors import AppendNotSupported

MIN_S3FS_VERSION = (2025, 7, 0)
"""Earlier s3fs versions ignore `mode="create"` for small objects and silently overwrite."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """A listed object: name relative to the listed directory, stored size, modification time."""

    name: str
    size: int
    mtime: float


@dataclass(frozen=True, slots=True)
class StagedFile:
    """Bytes already stored durably under a temporary name (LocalBackend.stage), waiting for
    `write` to give them their final name."""

    path: str


class Staging(Protocol):
    """A backend capability: store a fragment's bytes durably before their name (which is
    their SHA1) is known, so the hash runs while they are written; then name them."""

    def stage(self, directory: str, data: bytes | bytearray | memoryview) -> StagedFile: ...
    def write_staged(self, path: str, staged: StagedFile) -> None: ...
    def discard(self, staged: StagedFile) -> None: ...


class PieceReads(Protocol):
    """A backend capability: read a fragment a piece at a time through a file descriptor
    into a buffer the reader reuses (see FragmentStore.open_pieces)."""

    @property
    def read_piece(self) -> int: ...

    def open_fd(self, path: str) -> int: ...


class Backend(Protocol):
    """The storage calls oncelog makes. Paths are absolute in the backend's own form.

    Optional capabilities are properties returning an object or None (`staging`,
    `piece_reads`), never type or name checks by the caller.
    """

    kind: str
    fs: AbstractFileSystem
    root: str

    def join(self, *parts: str) -> str: ...
    def read(self, path: str, size_hint: int | None = None) -> bytes: ...
    def read_range(self, path: str, start: int, end: int) -> bytes: ...
    def read_many(self, paths: Sequence[str]) -> list[bytes | BaseException]: ...
    def write(self, path: str, data: bytes | bytearray | memoryview) -> None: ...
    def create(self, path: str, data: bytes) -> bool: ...
    def exists(self, path: str) -> bool: ...
    def list_dir(self, path: str) -> list[ObjectInfo]: ...
    def list_names_after(self, path: str, after: str | None) -> list[str]: ...
    def walk(self, path: str) -> list[ObjectInfo]: ...
    def delete(self, paths: Iterable[str]) -> None: ...

    @property
    def can_create(self) -> bool: ...

    def require_create(self) -> None: ...

    def missing_store(self) -> str | None: ...

    def list_temp(self, path: str) -> list[ObjectInfo]: ...

    def prune_dirs(self, path: str) -> None: ...

    def ensure_dirs(self, paths: Sequence[str]) -> None: ...

    def move(self, src: str, dst: str) -> None: ...

    @property
    def staging(self) -> Staging | None: ...

    @property
    def piece_reads(self) -> PieceReads | None: ...

    @property
    def creates_root(self) -> bool: ...

    def prepare_root(self, create: bool) -> None: ...

    def missing_hint(self) -> str: ...


def version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


class _Base:
    kind = "generic"

    def __init__(self, fs: AbstractFileSystem, root: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/") or "/"

    def join(self, *parts: str) -> str:
        base = self.root if self.root != "/" else ""
        return "/".join((base, *parts))

    @property
    def can_create(self) -> bool:
        return True

    def require_create(self) -> None:
        if not self.can_create:
            raise AppendNotSupported(self._no_create_reason())

    def missing_store(self) -> str | None:
        """Why the store root does not exist (a sentence naming the directory or bucket),
        or None if it does or the backend cannot tell (memory:// roots always exist)."""
        return None

    def list_temp(self, path: str) -> list[ObjectInfo]:
        """Temporary files left in `path` by writers that died mid-write: none, for stores
        whose writes are atomic (object stores); local disk lists its own."""
        return []

    def prune_dirs(self, path: str) -> None:
        """Remove `path` and its parents while empty: nothing to do where directories are
        not real (object stores); local disk removes them."""

    def ensure_dirs(self, paths: Sequence[str]) -> None:
        """Make sure the directories exist, durably: nothing to do where directories are
        not real (object stores); local disk creates and fsyncs them."""

    @property
    def staging(self) -> Staging | None:
        """Staged writes (local disk), or None: the bytes are written once their name is known."""
        return None

    @property
    def piece_reads(self) -> PieceReads | None:
        """Piecewise reads into a reused buffer (local disk), or None: whole-fragment reads."""
        return None

    @property
    def creates_root(self) -> bool:
        """Whether the store's root is made by its first journal (a local directory); an
        object store's bucket is never created by oncelog."""
        return False

    def prepare_root(self, create: bool) -> None:
        """Check the root can be a store, and make it if `create` and `creates_root`
        (raises StoreNotFound naming it otherwise); nothing to check for object stores."""

    def missing_hint(self) -> str:
        """What to tell a user whose store root is missing."""
        return "check the URL; oncelog does not create buckets"

    def _no_create_reason(self) -> str:
        return (
            f"the {self.kind} filesystem {type(self.fs).__name__} at {self.root!r} cannot create "
            "objects only-if-absent, so two writers could claim the same offsets; oncelog "
            "appends only to local disk, memory:// and S3 (s3fs >= 2025.7.0)"
        )
