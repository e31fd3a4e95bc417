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


class Backend(Protocol):
    """The storage calls oncelog makes. Paths are absolute in the backend's own form."""

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


def _version_tuple(text: str) -> tuple[int, ...]:
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

    def _no_create_reason(self) -> str:
        return (
            f"the {self.kind} filesystem {type(self.fs).__name__} at {self.root!r} cannot create "
            "objects only-if-absent, so two writers could claim the same offsets; oncelog "
            "appends only to local disk, memory:// and S3 (s3fs >= 2025.7.0)"
        )
