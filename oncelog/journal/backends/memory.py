"""memory://: create-if-absent under a process-wide lock (memory:// is process-local)."""

from __future__ import annotations

import threading
from typing import Iterable

from oncelog.journal.backends.generic import GenericBackend

_MEMORY_LOCK = threading.Lock()


class MemoryBackend(GenericBackend):
    """fsspec's memory:// store; create-if-absent under one process-wide lock."""

    kind = "memory"

    @property
    def can_create(self) -> bool:
        return True

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
