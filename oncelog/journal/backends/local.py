"""Local disk: durable writes (temp file, fsync, rename) and create-if-absent by os.link."""

from __future__ import annotations

import os
import threading
import uuid
from typing import Iterable, Sequence

from fsspec import AbstractFileSystem

from oncelog.journal.backends._base import ObjectInfo, PieceReads, StagedFile, Staging, _Base
from oncelog.journal.errors import StoreNotFound

READ_PIECE = 1 << 20
"""Bytes per read of a raw fragment with block sums (see LocalBackend.read_piece)."""


class LocalBackend(_Base):
    """Local disk through the os module: fsync'd temp files, `os.link` for create-if-absent."""

    kind = "local"

    def __init__(self, fs: AbstractFileSystem, root: str) -> None:
        super().__init__(fs, os.path.abspath(root))
        self._dirs: set[str] = set()
        self._dirs_lock = threading.Lock()

    def join(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    # -- capabilities ------------------------------------------------------------------------

    @property
    def staging(self) -> Staging:
        return self

    @property
    def piece_reads(self) -> PieceReads:
        return self

    @property
    def creates_root(self) -> bool:
        return True

    @property
    def read_piece(self) -> int:
        """READ_PIECE: pieces read into one reused buffer (LocalFragmentFile) stay in the
        CPU's cache between the read, the CRC-32C and the copy out (measured on a 2-core VM
        with 2 MiB of L2 per core: a fresh 64 MiB buffer filled from the page cache runs at
        ~1.7 GB/s for its page faults alone; 1 MiB pieces ran ~10-20% faster than 2 MiB
        ones, 4-8 MiB slower again)."""
        return READ_PIECE

    def open_fd(self, path: str) -> int:
        """A read-only descriptor of `path` (FileNotFoundError if absent); the caller closes it."""
        return os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))

    def prepare_root(self, create: bool) -> None:
        if os.path.lexists(self.root) and not os.path.isdir(self.root):
            raise StoreNotFound(
                f"the store {self.root!r} is not a directory (a regular file?): a local "
                "store is a directory"
            )
        if create:
            os.makedirs(self.root, exist_ok=True)

    def missing_hint(self) -> str:
        return (
            "check the path; a new store is made by creating a journal in it "
            "(`oncelog journals create`, JournalClient.create) or by "
            "open_journals(url, create=True)"
        )

    def missing_store(self) -> str | None:
        if os.path.isdir(self.root):
            return None
        if os.path.lexists(self.root):
            return f"the store {self.root!r} is not a directory (a regular file?)"
        return f"the store directory {self.root!r} does not exist"

    def read(self, path: str, size_hint: int | None = None) -> bytes:
        with open(path, "rb", buffering=0) as f:
            return f.read()

    def read_range(self, path: str, start: int, end: int) -> bytes:
        with open(path, "rb", buffering=0) as f:
            f.seek(start)
            return f.read(end - start)

    def read_many(self, paths: Sequence[str]) -> list[bytes | BaseException]:
        out: list[bytes | BaseException] = []
        for p in paths:
            try:
                out.append(self.read(p))
            except OSError as exc:
                out.append(exc)
        return out

    def _ensure_dir(self, path: str) -> None:
        if path not in self._dirs:
            self.ensure_dirs([path])

    def ensure_dirs(self, paths: Sequence[str]) -> None:
        """Create the directories (and their missing parents) durably: every new entry's
        parent directory is fsync'd before this returns."""
        missing: list[str] = []
        for path in paths:
            d = path
            while d not in missing and not os.path.isdir(d):
                missing.append(d)
                d = os.path.dirname(d)
        missing.sort(key=len)  # parents first
        for d in missing:
            try:
                os.mkdir(d)
            except FileExistsError:
                pass
        # Then make each new entry durable: the first fsync commits every mkdir above in
        # one filesystem journal transaction, so the others find nothing left to do (one
        # commit instead of one per level, 5-15 ms each here).
        for parent in dict.fromkeys(os.path.dirname(d) for d in missing):
            _fsync_dir(parent)
        with self._dirs_lock:
            self._dirs.update(paths)

    def _write_temp(self, directory: str, data: bytes | bytearray | memoryview) -> str:
        self._ensure_dir(directory)
        tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileNotFoundError:  # the directory was removed since we made it
            with self._dirs_lock:
                self._dirs.discard(directory)
            self._ensure_dir(directory)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        return tmp

    def write(self, path: str, data: bytes | bytearray | memoryview) -> None:
        """Durably store `data` at `path`: a temporary file written and fsync'd, renamed, the
        directory fsync'd."""
        self._rename_durably(self._write_temp(os.path.dirname(path), data), path)

    def write_staged(self, path: str, staged: StagedFile) -> None:
        """Name a file `stage`d in the same directory earlier (removed if the rename fails)."""
        self._rename_durably(staged.path, path)

    def _rename_durably(self, tmp: str, path: str) -> None:
        try:
            os.replace(tmp, path)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        _fsync_dir(os.path.dirname(path))

    def move(self, src: str, dst: str) -> None:
        """A rename within the store (both names in one directory for fragments), durable
        once the directories are fsync'd; no byte is written again."""
        try:
            os.replace(src, dst)
        except FileNotFoundError:
            if not os.path.exists(dst):
                raise
        _fsync_dir(os.path.dirname(dst))
        if os.path.dirname(src) != os.path.dirname(dst):
            _fsync_dir(os.path.dirname(src))

    def stage(self, directory: str, data: bytes | bytearray | memoryview) -> StagedFile:
        """The first half of `write`, for bytes whose final name is not known yet: store them
        durably in a temporary file of `directory` (invisible to listings)."""
        return StagedFile(self._write_temp(directory, data))

    def discard(self, staged: StagedFile) -> None:
        """Remove a staged file that will not be written under a name."""
        _unlink_quietly(staged.path)

    def create(self, path: str, data: bytes) -> bool:
        """Create `path` only if absent: a temporary file written and fsync'd, then linked
        (which fails if `path` exists). A temporary file removed before the link (a `gc`
        with a grace shorter than this writer's pause, or its directory pruned) is written
        again, a bounded number of times."""
        directory = os.path.dirname(path)
        for attempt in range(_CREATE_ATTEMPTS):
            tmp = self._write_temp(directory, data)
            try:
                os.link(tmp, path)
                created = True
            except FileExistsError:
                created = False
            except FileNotFoundError:
                if attempt == _CREATE_ATTEMPTS - 1:
                    raise
                with self._dirs_lock:
                    self._dirs.discard(directory)
                continue
            finally:
                _unlink_quietly(tmp)
            _fsync_dir(directory)
            return created
        raise AssertionError("unreachable")

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def list_dir(self, path: str) -> list[ObjectInfo]:
        try:
            entries = list(os.scandir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []
        out = []
        for e in entries:
            if e.name.startswith(".tmp-"):
                continue
            try:
                if e.is_file(follow_symlinks=False):
                    st = e.stat(follow_symlinks=False)
                    out.append(ObjectInfo(e.name, st.st_size, st.st_mtime))
            except FileNotFoundError:
                continue
        out.sort(key=lambda o: o.name)
        return out

    def prune_dirs(self, path: str) -> None:
        """Remove `path` and its parents below the root while they are empty."""
        with self._dirs_lock:
            self._dirs = {d for d in self._dirs if not (d == path or d.startswith(path + os.sep))}
        while path != self.root and path.startswith(self.root + os.sep):
            try:
                os.rmdir(path)
            except OSError:
                return
            with self._dirs_lock:
                self._dirs.discard(path)
            path = os.path.dirname(path)

    def list_temp(self, path: str) -> list[ObjectInfo]:
        """Temporary files left in `path` by writers that died mid-write."""
        out = []
        try:
            entries = list(os.scandir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []
        for e in entries:
            if e.name.startswith(".tmp-"):
                try:
                    out.append(ObjectInfo(e.name, 0, e.stat(follow_symlinks=False).st_mtime))
                except FileNotFoundError:
                    continue
        return out

    def list_names_after(self, path: str, after: str | None) -> list[str]:
        try:
            names = os.listdir(path)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(n for n in names if not n.startswith(".") and (after is None or n > after))

    def walk(self, path: str) -> list[ObjectInfo]:
        out = []
        for dirpath, _dirs, files in os.walk(path):
            rel = os.path.relpath(dirpath, path)
            for name in files:
                if name.startswith(".tmp-"):
                    continue
                full = os.path.join(dirpath, name)
                try:
                    st = os.stat(full)
                except FileNotFoundError:
                    continue
                out.append(
                    ObjectInfo(name if rel == "." else f"{rel}/{name}", st.st_size, st.st_mtime)
                )
        out.sort(key=lambda o: o.name)
        return out

    def delete(self, paths: Iterable[str]) -> None:
        dirs = set()
        for p in paths:
            try:
                os.unlink(p)
                dirs.add(os.path.dirname(p))
            except FileNotFoundError:
                pass
        for d in dirs:
            _fsync_dir(d)


_CREATE_ATTEMPTS = 3


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
