"""Backend primitives: create-only-if-absent on each backend, and S3 quirks."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from oncelog.journal import AppendNotSupported
from oncelog.journal.backends import (
    GenericBackend,
    LocalBackend,
    MemoryBackend,
    S3Backend,
    backend_class,
    backend_for,
    backend_protocols,
    register_backend,
    unregister_backend,
)
from oncelog.journal.store import FragmentStore


def test_backend_is_chosen_by_protocol(tmp_path: Any) -> None:
    assert isinstance(backend_for(fsspec.filesystem("file"), str(tmp_path)), LocalBackend)
    assert isinstance(backend_for(fsspec.filesystem("memory"), "/x"), MemoryBackend)
    from fsspec.implementations.dirfs import DirFileSystem

    dirfs = DirFileSystem(path="/x", fs=fsspec.filesystem("memory"))
    generic = backend_for(dirfs, "")
    assert type(generic) is GenericBackend and not generic.can_create
    with pytest.raises(AppendNotSupported, match="only-if-absent"):
        generic.create("a", b"x")


class _CustomProtocolFS(MemoryFileSystem):
    """A filesystem under protocols of its own (storage is memory://'s, never written here)."""

    protocol = ("oncelog-test-custom", "oncelog-test-custom-alias")


class _UnknownProtocolFS(MemoryFileSystem):
    protocol = ("oncelog-test-unknown",)


class _CustomBackend(GenericBackend):
    """A backend a user registers for their own protocol."""


@pytest.fixture
def custom_backend_registered() -> Iterator[None]:
    previous = register_backend(_CustomProtocolFS.protocol, _CustomBackend)
    try:
        yield
    finally:
        unregister_backend(_CustomProtocolFS.protocol)
        for protocol, cls in previous.items():
            register_backend(protocol, cls)


def test_builtin_backends_are_registered_by_protocol() -> None:
    assert {"file", "local", "memory", "s3", "s3a"} <= set(backend_protocols())
    assert backend_class("file") is LocalBackend and backend_class("local") is LocalBackend
    assert backend_class("memory") is MemoryBackend
    assert backend_class(("s3", "s3a")) is S3Backend and backend_class("s3a") is S3Backend
    assert backend_class("gcs") is GenericBackend


def test_registered_backend_is_picked_for_its_protocol(custom_backend_registered: None) -> None:
    fs = _CustomProtocolFS()
    backend = backend_for(fs, "/custom")
    assert type(backend) is _CustomBackend and backend.root == "/custom"
    assert backend_class("oncelog-test-custom-alias") is _CustomBackend
    # The journal store picks its backend through the same registry.
    store_backend = FragmentStore(fs, "/custom").backend
    assert type(getattr(store_backend, "inner", store_backend)) is _CustomBackend
    # Unknown protocols still get the generic backend, registered ones theirs.
    assert type(backend_for(_UnknownProtocolFS(), "/u")) is GenericBackend
    assert type(backend_for(fsspec.filesystem("memory"), "/m")) is MemoryBackend


def test_unregistered_protocol_falls_back_to_generic(custom_backend_registered: None) -> None:
    assert unregister_backend("oncelog-test-custom") == {"oncelog-test-custom": _CustomBackend}
    # The alias keeps its class; the main protocol, first in fs.protocol, is tried first.
    assert type(backend_for(_CustomProtocolFS(), "/c")) is _CustomBackend
    unregister_backend("oncelog-test-custom-alias")
    assert type(backend_for(_CustomProtocolFS(), "/c")) is GenericBackend
    assert "oncelog-test-custom" not in backend_protocols()


def test_register_backend_returns_what_it_replaces() -> None:
    previous = register_backend("memory", _CustomBackend)
    try:
        assert previous == {"memory": MemoryBackend}
        assert type(backend_for(fsspec.filesystem("memory"), "/x")) is _CustomBackend
    finally:
        restored = register_backend("memory", previous.get("memory", MemoryBackend))
    assert restored == {"memory": _CustomBackend}
    assert type(backend_for(fsspec.filesystem("memory"), "/x")) is MemoryBackend


@pytest.mark.parametrize("protocols", ["", (), ("s3", ""), (None,)])
def test_register_backend_rejects_bad_protocols(protocols: Any) -> None:
    with pytest.raises(ValueError, match="protocol names"):
        register_backend(protocols, _CustomBackend)


def test_register_backend_rejects_a_non_callable() -> None:
    with pytest.raises(TypeError, match="callable"):
        register_backend("oncelog-test-bad", "not a class")  # type: ignore[arg-type]
    assert "oncelog-test-bad" not in backend_protocols()


def test_create_has_exactly_one_winner_under_contention(store_url: Any) -> None:
    client = store_url.open()
    backend = client.store.backend
    path = backend.join(".oncelog", "contended")
    barrier = threading.Barrier(6)
    wins: list[tuple[int, bool]] = []

    def attempt(i: int) -> None:
        barrier.wait()
        wins.append((i, backend.create(path, b"writer %d" % i)))

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, won in wins if won]
    assert len(winners) == 1
    assert backend.read(path) == b"writer %d" % winners[0]


def test_local_writes_leave_no_temporary_files(tmp_path: Any) -> None:
    backend = LocalBackend(fsspec.filesystem("file"), str(tmp_path))
    target = backend.join("deep", "dir", "obj")
    backend.write(target, b"one")
    backend.write(target, bytearray(b"two"))
    assert backend.create(backend.join("deep", "dir", "claim"), b"c") is True
    assert backend.create(backend.join("deep", "dir", "claim"), b"d") is False
    assert sorted(os.listdir(tmp_path / "deep" / "dir")) == ["claim", "obj"]
    assert backend.read(target) == b"two"
    assert backend.read_range(target, 1, 3) == b"wo"


def test_local_listing_hides_and_reports_debris(tmp_path: Any) -> None:
    backend = LocalBackend(fsspec.filesystem("file"), str(tmp_path))
    backend.write(backend.join("j", "a"), b"1")
    (tmp_path / "j" / ".tmp-dead").write_bytes(b"partial")
    (tmp_path / "j" / "sub").mkdir()
    assert [o.name for o in backend.list_dir(backend.join("j"))] == ["a"]
    assert [o.name for o in backend.list_temp(backend.join("j"))] == [".tmp-dead"]
    assert backend.list_names_after(backend.join("j"), None) == ["a", "sub"]
    assert backend.list_dir(backend.join("missing")) == []


class _FakeS3:
    """Just enough of an s3fs filesystem for S3Backend.create."""

    protocol = ("s3", "s3a")

    def __init__(self, error: BaseException | None) -> None:
        self.error = error

    def pipe_file(self, path: str, data: bytes, mode: str = "overwrite") -> None:
        assert mode == "create"
        if self.error is not None:
            raise self.error


def _client_error(code: str, status: int) -> OSError:
    exc = OSError(5, "s3 said no")
    cause = Exception(code)
    cause.response = {  # type: ignore[attr-defined]
        "Error": {"Code": code},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    exc.__cause__ = cause
    return exc


def test_s3_bare_412_means_the_object_exists() -> None:
    fake: Any = _FakeS3(_client_error("PreconditionFailed", 412))
    backend = S3Backend(fake, "b")
    assert backend.create("b/k", b"x") is False
    assert S3Backend(_FakeS3(None), "b").create("b/k", b"x") is True  # type: ignore[arg-type]


def test_s3_other_errors_propagate_for_retry() -> None:
    fake: Any = _FakeS3(_client_error("ConditionalRequestConflict", 409))
    backend = S3Backend(fake, "b")
    with pytest.raises(OSError, match="s3 said no"):
        backend.create("b/k", b"x")


def test_old_s3fs_is_refused_for_appends() -> None:
    backend = S3Backend(_FakeS3(None), "b")  # type: ignore[arg-type]
    backend._s3fs_version = "2024.12.0"
    assert not backend.can_create
    with pytest.raises(AppendNotSupported, match="2025.7.0"):
        backend.create("b/k", b"x")


def test_memory_reads_and_listings_survive_concurrent_deletes() -> None:
    """fsspec's memory store looks keys up twice while listing and reading: a delete in
    between made them fail with KeyError (seen with two compactors retiring claims). Lists
    and reads racing deletes see each object whole or not at all."""
    import uuid

    backend = MemoryBackend(fsspec.filesystem("memory"), f"/race-{uuid.uuid4().hex}")
    directory = backend.join("claims")
    paths = [backend.join("claims", f"{i:06d}") for i in range(400)]
    stop = threading.Event()
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            while not stop.is_set():
                backend.delete(paths)
                for p in paths:
                    backend.write(p, b"claim")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    for p in paths:
        backend.write(p, b"claim")
    writer = threading.Thread(target=churn)
    writer.start()
    try:
        for _ in range(300):
            listed = backend.list_dir(directory)
            assert all(o.size == len(b"claim") for o in listed)
            try:
                assert backend.read(paths[0]) == b"claim"
            except FileNotFoundError:
                pass  # deleted just before: a clean miss
    finally:
        stop.set()
        writer.join(30)
    assert not errors
