"""S3 through s3fs: conditional PUT (If-None-Match) for create, direct GETs and listings."""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Callable, Iterable, Sequence, TypeVar, cast

from fsspec import AbstractFileSystem

from oncelog._extras import needs_extra
from oncelog.journal._retry import is_connection_refused, tag_endpoint
from oncelog.journal.backends._base import MIN_S3FS_VERSION, ObjectInfo, version_tuple
from oncelog.journal.backends.generic import GenericBackend, mtime_of
from oncelog.journal.errors import StoreNotFound

F = TypeVar("F", bound=Callable[..., Any])


class S3Backend(GenericBackend):
    """S3 through s3fs, calling S3 directly where s3fs would cache or add requests:
    one GET per small read, conditional PUT for create, ListObjectsV2 with StartAfter."""

    kind = "s3"

    _SMALL = 64 << 20  # below this one GET; above, s3fs's HEAD + concurrent ranged GETs
    _GATHER = 32  # concurrent GETs in read_many

    def __init__(self, fs: AbstractFileSystem, root: str) -> None:
        super().__init__(fs, root)
        with needs_extra("s3", f"the S3 store {root}"):
            import s3fs

        self._s3fs_version = getattr(s3fs, "__version__", "0")
        _fail_fast_when_refused(fs)

    @property
    def endpoint(self) -> str:
        """The S3 endpoint the store's requests go to (named by its errors and warnings)."""
        client = getattr(self.fs, "_s3", None)
        url = getattr(getattr(client, "meta", None), "endpoint_url", None)
        if not url:
            url = getattr(self.fs, "endpoint_url", None) or (
                getattr(self.fs, "client_kwargs", None) or {}
            ).get("endpoint_url")
        return str(url or "https://s3.amazonaws.com")

    @property
    def can_create(self) -> bool:
        return version_tuple(self._s3fs_version) >= MIN_S3FS_VERSION

    def _no_create_reason(self) -> str:
        return (
            f"s3fs {self._s3fs_version} is older than 2025.7.0 and ignores mode='create' for "
            "small objects (it would silently overwrite claims); upgrade s3fs to append on S3"
        )

    def read(self, path: str, size_hint: int | None = None) -> bytes:
        if size_hint is not None and size_hint >= self._SMALL:
            return cast(bytes, self.fs.cat_file(path))  # concurrent ranged GETs for large objects
        return cast(bytes, self.fs.cat_file(path, max_concurrency=1))

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
            self.fs.call_s3("list_objects_v2", Bucket=bucket, MaxKeys=1)
        except FileNotFoundError as exc:
            if _no_such_bucket(exc):
                return f"the S3 bucket {bucket!r} does not exist"
            raise
        return None

    def move(self, src: str, dst: str) -> None:
        """One CopyObject (the server copies the bytes; s3fs's copy would add a HEAD), then
        the delete of `src`. Objects of 5 GB and more go through s3fs's multipart copy."""
        bucket, key, _ = self.fs.split_path(src)
        dst_bucket, dst_key, _ = self.fs.split_path(dst)
        try:
            self._call(
                "copy_object",
                dst_bucket,
                Key=dst_key,
                CopySource={"Bucket": bucket, "Key": key},
            )
        except FileNotFoundError:  # moved by an attempt whose reply was lost?
            if not self.exists(dst):
                raise
        except (OSError, ValueError) as exc:
            if "EntityTooLarge" not in repr(exc) and "InvalidRequest" not in repr(exc):
                raise
            self.fs.copy(src, dst)
        self.delete([src])

    def _call(self, method: str, bucket: str, **kwargs: Any) -> Any:
        try:
            return self.fs.call_s3(method, Bucket=bucket, **kwargs)
        except FileNotFoundError as exc:
            if _no_such_bucket(exc):
                raise StoreNotFound(
                    f"the S3 bucket {bucket!r} does not exist (store s3://{self.root})"
                ) from exc
            raise

    def _list(
        self, path: str, delimiter: str, start_after: str | None = None
    ) -> list[dict[str, Any]]:
        bucket, key, _ = self.fs.split_path(path)
        prefix = key.rstrip("/") + "/" if key else ""
        kwargs: dict[str, Any] = {"bucket": bucket, "Prefix": prefix}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        if start_after is not None:
            kwargs["StartAfter"] = prefix + start_after
        contents: list[dict[str, Any]] = []
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
            ObjectInfo(c["Rel"], int(c.get("Size", 0)), mtime_of(c))
            for c in self._list(path, "/")
            if c["Rel"] and not c["Rel"].startswith(".tmp-")
        ]
        out.sort(key=lambda o: o.name)
        return out

    def list_names_after(self, path: str, after: str | None) -> list[str]:
        return sorted(c["Rel"] for c in self._list(path, "/", after) if c["Rel"])

    def walk(self, path: str) -> list[ObjectInfo]:
        out = [
            ObjectInfo(c["Rel"], int(c.get("Size", 0)), mtime_of(c))
            for c in self._list(path, "")
            if c["Rel"] and not c["Rel"].rsplit("/", 1)[-1].startswith(".tmp-")
        ]
        out.sort(key=lambda o: o.name)
        return out

    def delete(self, paths: Iterable[str]) -> None:
        by_bucket: dict[str, list[str]] = {}
        for p in paths:
            bucket, key, _ = self.fs.split_path(p)
            by_bucket.setdefault(bucket, []).append(key)
        for bucket, keys in by_bucket.items():
            for i in range(0, len(keys), 1000):  # one DeleteObjects request per 1000 keys
                objects = [{"Key": k} for k in keys[i : i + 1000]]
                self.fs.call_s3(
                    "delete_objects", Bucket=bucket, Delete={"Objects": objects, "Quiet": True}
                )


def _naming_endpoint(method: F) -> F:
    """`method` of S3Backend, tagging what it raises with the store's endpoint (see
    oncelog.journal._retry.tag_endpoint)."""

    @functools.wraps(method)
    def call(self: S3Backend, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            tag_endpoint(exc, self.endpoint)
            raise

    return cast(F, call)


for _name in (
    "read", "read_range", "read_many", "write", "create", "exists", "list_dir",
    "list_names_after", "walk", "delete", "move", "missing_store",
):
    setattr(S3Backend, _name, _naming_endpoint(getattr(S3Backend, _name)))


def _refuse_retry(caught_exception: BaseException | None = None, **_: Any) -> None:
    """botocore `needs-retry` hook: a refused connection is raised at once, not retried
    by botocore (4 more attempts with backoff: about 9 s per call) below oncelog's own
    bounded loop, which gives refusals a budget of their own (oncelog.journal._retry)."""
    if caught_exception is not None and is_connection_refused(caught_exception):
        raise caught_exception


def _fail_fast_when_refused(fs: AbstractFileSystem) -> None:
    """Install `_refuse_retry` on the filesystem's botocore client (made now if it was not:
    no request is sent). Filesystems without one (test doubles) are left as they are."""
    try:
        client = fs.connect() if getattr(fs, "_s3", None) is None else fs._s3
        client.meta.events.register_first(
            "needs-retry.s3", _refuse_retry, unique_id="oncelog-refused-no-retry"
        )
    except (AttributeError, TypeError):
        pass


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
