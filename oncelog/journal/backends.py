"""Storage primitives per fsspec backend: durable writes, create-only-if-absent, listings.

Each backend offers the same small set of calls. The one that matters for correctness is
`create(path, data) -> bool`, which stores `data` only if nothing exists at `path`:

- local disk: write a temporary file in the same directory, fsync it, `os.link` it to the
  final name (fails with FileExistsError if present), unlink the temporary, fsync the directory;
- S3 (s3fs >= 2025.7.0): one PUT with `If-None-Match: *` (412 when the key exists);
- memory://: exists-then-store under a process-wide lock (memory:// is process-local anyway).

Any other fsspec filesystem is readable but cannot create-if-absent, so appends are refused.
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Iterable, Protocol, Sequence

from fsspec import AbstractFileSystem

from oncelog.journal.errors import AppendNotSupported, StoreNotFound

__all__ = [
    "ObjectInfo",
    "StagedFile",
    "Backend",
    "LocalBackend",
    "MemoryBackend",
    "S3Backend",
    "GenericBackend",
    "backend_for",
    "MIN_S3FS_VERSION",
]

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

    def _no_create_reason(self) -> str:
        return (
            f"the {self.kind} filesystem {type(self.fs).__name__} at {self.root!r} cannot create "
            "objects only-if-absent, so two writers could claim the same offsets; oncelog "
            "appends only to local disk, memory:// and S3 (s3fs >= 2025.7.0)"
        )


class LocalBackend(_Base):
    """Local disk through the os module: fsync'd temp files, `os.link` for create-if-absent."""

    kind = "local"

    def __init__(self, fs: AbstractFileSystem, root: str) -> None:
        super().__init__(fs, os.path.abspath(root))
        self._dirs: set[str] = set()
        self._dirs_lock = threading.Lock()

    def join(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

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

    def write(self, path: str, data: bytes | bytearray | memoryview | StagedFile) -> None:
        """Durably store `data` at `path`: a temporary file written and fsync'd, renamed, the
        directory fsync'd. `data` may be a file `stage`d in the same directory earlier: it is
        renamed (and removed if the rename fails)."""
        directory = os.path.dirname(path)
        tmp = data.path if isinstance(data, StagedFile) else self._write_temp(directory, data)
        try:
            os.replace(tmp, path)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        _fsync_dir(directory)

    def stage(self, directory: str, data: bytes | bytearray | memoryview) -> StagedFile:
        """The first half of `write`, for bytes whose final name is not known yet: store them
        durably in a temporary file of `directory` (invisible to listings)."""
        return StagedFile(self._write_temp(directory, data))

    def discard(self, staged: StagedFile) -> None:
        """Remove a staged file that will not be written under a name."""
        _unlink_quietly(staged.path)

    def create(self, path: str, data: bytes) -> bool:
        directory = os.path.dirname(path)
        tmp = self._write_temp(directory, data)
        try:
            os.link(tmp, path)
            created = True
        except FileExistsError:
            created = False
        finally:
            _unlink_quietly(tmp)
        _fsync_dir(directory)
        return created

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


class GenericBackend(_Base):
    """Any fsspec filesystem through its public API; readable, but without create-if-absent."""

    def read(self, path: str, size_hint: int | None = None) -> bytes:
        return self.fs.cat_file(path)

    def read_range(self, path: str, start: int, end: int) -> bytes:
        return self.fs.cat_file(path, start=start, end=end)

    def read_many(self, paths: Sequence[str]) -> list[bytes | BaseException]:
        out: list[bytes | BaseException] = []
        for p in paths:
            try:
                out.append(self.read(p))
            except (FileNotFoundError, OSError) as exc:
                out.append(exc)
        return out

    def write(self, path: str, data: bytes | bytearray | memoryview) -> None:
        self.fs.pipe_file(path, bytes(data) if isinstance(data, memoryview) else data)

    def create(self, path: str, data: bytes) -> bool:
        raise AppendNotSupported(self._no_create_reason())

    @property
    def can_create(self) -> bool:
        return False

    def exists(self, path: str) -> bool:
        return self.fs.exists(path)

    def _ls(self, path: str) -> list[dict[str, Any]]:
        try:
            return self.fs.ls(path, detail=True, refresh=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except TypeError:  # a filesystem without the refresh keyword
            try:
                return self.fs.ls(path, detail=True)
            except (FileNotFoundError, NotADirectoryError):
                return []

    def list_dir(self, path: str) -> list[ObjectInfo]:
        prefix = path.rstrip("/") + "/"
        out = []
        for info in self._ls(path):
            if info.get("type") != "file":
                continue
            name = info["name"]
            name = name[len(prefix):] if name.startswith(prefix) else name.rsplit("/", 1)[-1]
            if "/" in name or name.startswith(".tmp-"):
                continue
            out.append(ObjectInfo(name, int(info.get("size") or 0), _mtime(info)))
        out.sort(key=lambda o: o.name)
        return out

    def list_names_after(self, path: str, after: str | None) -> list[str]:
        return [o.name for o in self.list_dir(path) if after is None or o.name > after]

    def walk(self, path: str) -> list[ObjectInfo]:
        prefix = path.rstrip("/") + "/"
        try:
            found = self.fs.find(path, detail=True)
        except FileNotFoundError:
            return []
        out = []
        for name, info in found.items():
            if not name.startswith(prefix) or info.get("type", "file") != "file":
                continue
            rel = name[len(prefix):]
            if rel.rsplit("/", 1)[-1].startswith(".tmp-"):
                continue
            out.append(ObjectInfo(rel, int(info.get("size") or 0), _mtime(info)))
        out.sort(key=lambda o: o.name)
        return out

    def delete(self, paths: Iterable[str]) -> None:
        for p in paths:
            try:
                self.fs.rm_file(p)
            except FileNotFoundError:
                pass


def _mtime(info: dict[str, Any]) -> float:
    for key in ("LastModified", "mtime", "last_modified", "created", "modified", "updated"):
        value = info.get(key)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        try:
            return float(value)
        except (TypeError, ValueError):
            continue
    return 0.0


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

    def delete(self, paths: Iterable[str]) -> None:
        with _MEMORY_LOCK:
            super().delete(paths)


class S3Backend(GenericBackend):
    """S3 through s3fs, calling S3 directly where s3fs would cache or add requests:
    one GET per small read, conditional PUT for create, ListObjectsV2 with StartAfter."""

    kind = "s3"

    _SMALL = 64 << 20  # below this one GET; above, s3fs's HEAD + concurrent ranged GETs
    _GATHER = 32  # concurrent GETs in read_many

    def __init__(self, fs: AbstractFileSystem, root: str) -> None:
        super().__init__(fs, root)
        import s3fs

        self._s3fs_version = getattr(s3fs, "__version__", "0")

    @property
    def can_create(self) -> bool:
        return _version_tuple(self._s3fs_version) >= MIN_S3FS_VERSION

    def _no_create_reason(self) -> str:
        return (
            f"s3fs {self._s3fs_version} is older than 2025.7.0 and ignores mode='create' for "
            "small objects (it would silently overwrite claims); upgrade s3fs to append on S3"
        )

    def read(self, path: str, size_hint: int | None = None) -> bytes:
        if size_hint is not None and size_hint >= self._SMALL:
            return self.fs.cat_file(path)  # concurrent ranged GETs for large objects
        return self.fs.cat_file(path, max_concurrency=1)

    def read_many(self, paths: Sequence[str]) -> list[bytes | BaseException]:
        from fsspec.asyn import sync

        fs: Any = self.fs
        out: list[bytes | BaseException] = []
        for i in range(0, len(paths), self._GATHER):
            batch = paths[i : i + self._GATHER]

            async def gather(batch: Sequence[str] = batch) -> list[Any]:
                return await asyncio.gather(
                    *(fs._cat_file(p, max_concurrency=1) for p in batch), return_exceptions=True
                )

            out.extend(sync(fs.loop, gather))
        return out

    def write(self, path: str, data: bytes | bytearray | memoryview) -> None:
        self.fs.pipe_file(path, bytes(data) if isinstance(data, memoryview) else data)

    def create(self, path: str, data: bytes) -> bool:
        self.require_create()
        try:
            self.fs.pipe_file(path, data, mode="create")
        except FileExistsError:
            return False
        except FileNotFoundError as exc:
            if _no_such_bucket(exc):
                bucket = self.root.split("/", 1)[0]
                raise StoreNotFound(
                    f"the S3 bucket {bucket!r} does not exist (store s3://{self.root})"
                ) from exc
            raise
        except OSError as exc:
            # s3fs maps 412 to FileExistsError only when the reply names the If-None-Match
            # condition (AWS, moto); other S3 implementations send a bare 412.
            if _precondition_failed(exc):
                return False
            raise
        return True

    def exists(self, path: str) -> bool:
        try:
            self.fs.info(path, refresh=True)
            return True
        except FileNotFoundError:
            return False

    def missing_store(self) -> str | None:
        bucket = self.root.split("/", 1)[0]
        try:
            self.fs.call_s3("list_objects_v2", Bucket=bucket, MaxKeys=1)  # type: ignore[attr-defined]
        except FileNotFoundError as exc:
            if _no_such_bucket(exc):
                return f"the S3 bucket {bucket!r} does not exist"
            raise
        return None

    def _call(self, method: str, bucket: str, **kwargs: Any) -> Any:
        try:
            return self.fs.call_s3(method, Bucket=bucket, **kwargs)  # type: ignore[attr-defined]
        except FileNotFoundError as exc:
            if _no_such_bucket(exc):
                raise StoreNotFound(
                    f"the S3 bucket {bucket!r} does not exist (store s3://{self.root})"
                ) from exc
            raise

    def _list(self, path: str, delimiter: str, start_after: str | None = None) -> list[dict]:
        bucket, key, _ = self.fs.split_path(path)  # type: ignore[attr-defined]
        prefix = key.rstrip("/") + "/" if key else ""
        kwargs: dict[str, Any] = {"bucket": bucket, "Prefix": prefix}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        if start_after is not None:
            kwargs["StartAfter"] = prefix + start_after
        contents: list[dict] = []
        while True:
            resp = self._call("list_objects_v2", **kwargs)
            for item in resp.get("Contents", ()):
                item = dict(item)
                item["Rel"] = item["Key"][len(prefix):]
                contents.append(item)
            if not resp.get("IsTruncated"):
                return contents
            kwargs["ContinuationToken"] = resp["NextContinuationToken"]
            kwargs.pop("StartAfter", None)

    def list_dir(self, path: str) -> list[ObjectInfo]:
        out = [
            ObjectInfo(c["Rel"], int(c.get("Size", 0)), _mtime(c))
            for c in self._list(path, "/")
            if c["Rel"] and not c["Rel"].startswith(".tmp-")
        ]
        out.sort(key=lambda o: o.name)
        return out

    def list_names_after(self, path: str, after: str | None) -> list[str]:
        return sorted(c["Rel"] for c in self._list(path, "/", after) if c["Rel"])

    def walk(self, path: str) -> list[ObjectInfo]:
        out = [
            ObjectInfo(c["Rel"], int(c.get("Size", 0)), _mtime(c))
            for c in self._list(path, "")
            if c["Rel"] and not c["Rel"].rsplit("/", 1)[-1].startswith(".tmp-")
        ]
        out.sort(key=lambda o: o.name)
        return out

    def delete(self, paths: Iterable[str]) -> None:
        by_bucket: dict[str, list[str]] = {}
        for p in paths:
            bucket, key, _ = self.fs.split_path(p)  # type: ignore[attr-defined]
            by_bucket.setdefault(bucket, []).append(key)
        for bucket, keys in by_bucket.items():
            for i in range(0, len(keys), 1000):  # one DeleteObjects request per 1000 keys
                objects = [{"Key": k} for k in keys[i : i + 1000]]
                self.fs.call_s3(  # type: ignore[attr-defined]
                    "delete_objects", Bucket=bucket, Delete={"Objects": objects, "Quiet": True}
                )


def _no_such_bucket(exc: BaseException) -> bool:
    """Whether an s3fs error is S3's NoSuchBucket."""
    response = getattr(exc.__cause__, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", "")) == "NoSuchBucket"
    return "bucket does not exist" in str(exc)


def _precondition_failed(exc: BaseException) -> bool:
    cause = exc.__cause__
    response = getattr(cause, "response", None)
    if not isinstance(response, dict):
        return False
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in ("PreconditionFailed", "412") or status == 412


def backend_for(fs: AbstractFileSystem, root: str) -> Backend:
    """Pick the backend for an fsspec filesystem by its protocol."""
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    if "file" in protocols or "local" in protocols:
        return LocalBackend(fs, root)
    if "memory" in protocols:
        return MemoryBackend(fs, root)
    if "s3" in protocols or "s3a" in protocols:
        return S3Backend(fs, root)
    return GenericBackend(fs, root)
