"""pytest fixtures for testing pipelines on real stores: local disk, memory and an S3 server.

Enable them in a `conftest.py` with `pytest_plugins = ["oncelog.testing.fixtures"]`.

- `s3_server` (session): moto's S3 server on 127.0.0.1 at a free port (needs
  `moto[server]`, installed by the `testing` extra); `.storage_options` are what
  `open_journals("s3://...", **options)` needs to reach it.
- `memory_store`, `local_store`, `s3_store`: a fresh, empty `StoreTarget` per test
  (`.url`, `.storage_options`, `.kind`, `.open(**kw) -> JournalClient`).
- `store_url`: the same, parametrised over the three backends (ids memory, local, s3).
- `journals`: a JournalClient over `store_url`, closed after the test.
- `s3_fault_proxy`: a `FaultTarget` per test: a fresh bucket on `s3_server` reached through
  an `S3FaultProxy` (`oncelog.testing.faults`) that injects the faults a test asks for.
"""

from __future__ import annotations

import logging
import select
import socket
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator

import pytest

from oncelog.journal import JournalClient, open_journals
from oncelog.testing.faults import S3FaultProxy, without_s3fs_retries

__all__ = ["FaultTarget", "S3Server", "StoreTarget", "start_s3_server"]

S3_REGION = "us-east-1"


@dataclass
class S3Server:
    """A running S3-compatible test server."""

    endpoint: str
    storage_options: dict[str, Any]

    def create_bucket(self, name: str) -> None:
        import boto3

        boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=S3_REGION,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        ).create_bucket(Bucket=name)


@dataclass
class StoreTarget:
    """Where a test's journals live: an fsspec URL plus its storage options."""

    kind: str
    url: str
    storage_options: dict[str, Any] = field(default_factory=dict)

    def open(self, **kwargs: Any) -> JournalClient:
        return open_journals(self.url, **{**self.storage_options, **kwargs})


@dataclass
class FaultTarget:
    """An S3 store reached through an `S3FaultProxy`: `proxy` to add fault rules, `url` and
    `storage_options` for `open_journals(url, **storage_options)` through it, and
    `direct()` for the same store bypassing the proxy (to check what was really stored)."""

    proxy: S3FaultProxy
    server: S3Server
    bucket: str
    url: str
    kind: str = "s3"

    @property
    def storage_options(self) -> dict[str, Any]:
        """Options reaching the store through the proxy, with the libraries' retries on."""
        return self.proxy.storage_options

    @property
    def storage_options_no_retries(self) -> dict[str, Any]:
        """Options through the proxy with botocore's retries off (s3fs's are per instance:
        `open(retries=False)` turns them off too)."""
        return self.proxy.storage_options_no_retries

    def open(self, *, retries: bool = True, **kwargs: Any) -> JournalClient:
        """A JournalClient through the proxy. With `retries=False` neither botocore nor s3fs
        retries, so injected faults reach oncelog, which must cope by itself (aiohttp still
        resends an idempotent request once after a reset: see `oncelog.testing.faults`)."""
        options = self.storage_options if retries else self.storage_options_no_retries
        client = open_journals(self.url, **{**options, **kwargs})
        if not retries:
            without_s3fs_retries(client.fs)
        return client

    def direct(self) -> StoreTarget:
        """The same store without the proxy."""
        return StoreTarget("s3", self.url, dict(self.server.storage_options))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


_put_lock = threading.Lock()


def _make_object_writes_atomic() -> None:
    """Serialise moto's PutObject, as S3 itself is atomic per request.

    moto checks `If-None-Match: *` and then stores the object in two steps, so two
    concurrent conditional PUTs of one key can both succeed (and concurrent PUTs of
    one key can fail with a closed temporary file). Real S3 never lets two
    create-if-absent writes of a key both win; the test server must not either, or
    tests of racing writers would test moto instead of oncelog.
    """
    from moto.s3.responses import S3Response

    if getattr(S3Response.put_object, "_oncelog_atomic", False):
        return
    unlocked = S3Response.put_object

    def put_object(self: Any) -> Any:
        with _put_lock:
            return unlocked(self)

    put_object._oncelog_atomic = True  # type: ignore[attr-defined]
    S3Response.put_object = put_object  # type: ignore[method-assign]


class _ChildServer:
    """A `_s3_child` process: `.stop()` closes its stdin and waits (bounded), then kills."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def _start_child(port: int) -> _ChildServer:
    """Start `_s3_child` on `port` and wait (bounded) for its `ready` line."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "oncelog.testing._s3_child", str(port)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    child = _ChildServer(proc)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 60.0)
    line = proc.stdout.readline() if ready else b""
    if line.strip() != b"ready":
        child.stop()
        raise RuntimeError(
            f"the S3 test server did not start on 127.0.0.1:{port} (exit status"
            f" {proc.poll()}): is moto's server mode installed (oncelog[testing])?"
        )
    return child


def moto_in_process(port: int) -> Any:
    """moto's S3 server on 127.0.0.1:`port`, in this process's threads, started (object
    writes made atomic, request logging off); `.stop()` stops it."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "the S3 test server needs moto's server mode: pip install 'oncelog[testing]'"
        ) from exc
    _make_object_writes_atomic()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return server


def start_s3_server(*, in_process: bool = False) -> tuple[S3Server, Any]:
    """Start moto's S3 server on 127.0.0.1; returns the server info and a handle to `.stop()`.
    It runs in a child process (`in_process=True`: in this process's threads)."""
    port = _free_port()
    server = moto_in_process(port) if in_process else _start_child(port)
    endpoint = f"http://127.0.0.1:{port}"
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": S3_REGION},
    }
    return S3Server(endpoint, options), server


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server on 127.0.0.1 for the whole session."""
    info, server = start_s3_server()
    try:
        yield info
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_bucket(s3_server: S3Server) -> str:
    name = f"oncelog-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(name)
    return name


@pytest.fixture
def memory_store() -> Iterator[StoreTarget]:
    import fsspec

    root = f"/oncelog-{uuid.uuid4().hex}"
    yield StoreTarget("memory", f"memory://{root}")
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


@pytest.fixture
def local_store(tmp_path: Any) -> StoreTarget:
    return StoreTarget("local", str(tmp_path / "store"))


@pytest.fixture
def s3_store(s3_server: S3Server, s3_bucket: str) -> StoreTarget:
    return StoreTarget(
        "s3", f"s3://{s3_bucket}/{uuid.uuid4().hex}", dict(s3_server.storage_options)
    )


@pytest.fixture(params=["memory", "local", "s3"])
def store_url(request: pytest.FixtureRequest) -> StoreTarget:
    """A fresh store on each backend in turn."""
    store: StoreTarget = request.getfixturevalue(f"{request.param}_store")
    return store


@pytest.fixture
def journals(store_url: StoreTarget) -> Iterator[JournalClient]:
    """A JournalClient over `store_url`, closed after the test."""
    client = store_url.open()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def s3_fault_proxy(s3_server: S3Server) -> Iterator[FaultTarget]:
    """A fresh bucket on `s3_server` behind a new `S3FaultProxy`, stopped after the test."""
    bucket = f"oncelog-fault-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    with S3FaultProxy.for_server(s3_server) as proxy:
        yield FaultTarget(proxy, s3_server, bucket, f"s3://{bucket}/{uuid.uuid4().hex}")
