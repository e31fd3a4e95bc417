"""memory://: create-if-absent under a process-wide lock (memory:// is process-local).

fsspec's memory filesystem is a dict shared by the process, and its reads and listings
look keys up more than once: a concurrent delete makes them fail with KeyError. Every
call here holds the one lock, so each sees the store before or after another's change.
"""

from __future__ import annotations

import threading
from typing import Any, Iterable

from oncelog.journal.backends._base import ObjectInfo
from oncelog.journal.backends.generic import GenericBackend

_MEMORY_LOCK = threading.RLock()


class MemoryBackend(GenericBackend):
    """fsspec's memory:// store; create-if-absent under one process-wide lock."""

    kind = "memory"

    @property
    def can_create(self) -> bool:
        return True

    def read(self, path: str, size_hint: int | None = None) -> bytes:
        with _MEMORY_LOCK:
            return super().read(path, size_hint)

    def read_range(self, path: str, start: int, end: int) -> bytes:
        with _MEMORY_LOCK:
            return super().read_range(path, start, end)

    def exists(self, path: str) -> bool:
        with _MEMORY_LOCK:
            return super().exists(path)

    def _ls(self, path: str) -> list[dict[str, Any]]:
        with _MEMORY_LOCK:
            return super()._ls(path)

    def walk(self, path: str) -> list[ObjectInfo]:
        with _MEMORY_LOCK:
            return super().walk(path)

    def write(self, path: str, data: bytes | bytearray | memoryview) -> None:
        with _MEMORY_LOCK:
            self.fs.pipe_file(path, bytes(data))

    def create(self, path: str, data: bytes) -> bool:
        with _MEMORY_LOCK:
            if self.fs.exists(path):
                return False
            self.fs.pipe_file(path, bytes(data))
            return True

    def move(self, src: str, dst: str) -> None:
        with _MEMORY_LOCK:
            if self.fs.exists(src):
                self.fs.pipe_file(dst, self.fs.cat_file(src))
                self.fs.rm_file(src)
            elif not self.fs.exists(dst):
                raise FileNotFoundError(src)

    def delete(self, paths: Iterable[str]) -> None:
        with _MEMORY_LOCK:
            super().delete(paths)
