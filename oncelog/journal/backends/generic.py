"""Any fsspec filesystem: readable; appends refused where it cannot create only-if-absent."""

from __future__ import annotations

from typing import Any, Iterable, Sequence, cast

from oncelog.journal.backends._base import ObjectInfo, _Base
from oncelog.journal.errors import AppendNotSupported


class GenericBackend(_Base):
    """Any fsspec filesystem through its public API; readable, but without create-if-absent."""

    def read(self, path: str, size_hint: int | None = None) -> bytes:
        return cast(bytes, self.fs.cat_file(path))

    def read_range(self, path: str, start: int, end: int) -> bytes:
        return cast(bytes, self.fs.cat_file(path, start=start, end=end))

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
        return cast(bool, self.fs.exists(path))

    def _ls(self, path: str) -> list[dict[str, Any]]:
        try:
            return cast("list[dict[str, Any]]", self.fs.ls(path, detail=True, refresh=True))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except TypeError:  # a filesystem without the refresh keyword
            try:
                return cast("list[dict[str, Any]]", self.fs.ls(path, detail=True))
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
            out.append(ObjectInfo(name, int(info.get("size") or 0), mtime_of(info)))
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
            out.append(ObjectInfo(rel, int(info.get("size") or 0), mtime_of(info)))
        out.sort(key=lambda o: o.name)
        return out

    def move(self, src: str, dst: str) -> None:
        """Give the object at `src` the name `dst` (replacing an object of the same content
        there) without sending its bytes again where the store can: a server-side copy,
        then the delete of `src`. A crash in between leaves both; `src` is then an unclaimed
        fragment that gc removes. Idempotent: a retry after a lost reply finds `dst` stored."""
        try:
            self.fs.copy(src, dst)
        except FileNotFoundError:  # moved by an attempt whose reply was lost?
            if not self.exists(dst):
                raise
        self.delete([src])

    def delete(self, paths: Iterable[str]) -> None:
        for p in paths:
            try:
                self.fs.rm_file(p)
            except FileNotFoundError:
                pass


def mtime_of(info: dict[str, Any]) -> float:
    """An fsspec listing entry's modification time (Unix seconds), whatever key it uses."""
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
