"""The metadata store on its own: built from a FragmentStore (no JournalClient behind it),
giving up on a failing store with the outcome it knows, keeping users out of oncelog's own
directories; and no module of oncelog reaching into JournalClient's private names."""

from __future__ import annotations

import ast
import pathlib
from typing import Any

import pytest

import oncelog
from oncelog.coordination import RESERVED_DIRS, FencedChain, MetaStore, Placement, new_token
from oncelog.journal import FragmentSpec, JournalSpec, _revisions, records
from oncelog.journal.errors import InvalidObjectPath, StorageUnavailable
from oncelog.journal.store import META_DIR, FragmentStore
from oncelog.testing.fixtures import StoreTarget

PACKAGE = pathlib.Path(oncelog.__file__).parent
CLIENT_MODULE = PACKAGE / "journal" / "client.py"


def test_a_meta_store_stands_on_a_fragment_store_alone(memory_store: StoreTarget) -> None:
    """No client behind it: the store, a retry timeout and a description are all it needs;
    what it writes is what a client's `meta` of the same root sees."""
    client = memory_store.open()
    meta = MetaStore(
        FragmentStore(client.fs, client.root, 1.0), retry_timeout=1.0, description="the store"
    )
    assert repr(meta) == "MetaStore(the store)"
    data = b'{"token": "%s"}' % new_token().encode()
    assert meta.put_if_absent("test/solo/a.json", data)
    assert not meta.put_if_absent("test/solo/a.json", b'{"token": "other"}')
    meta.write("test/solo/b.json", b"{}")
    assert meta.list("test/solo") == ["a.json", "b.json"]
    assert meta.list("test/solo", after="a.json") == ["b.json"]
    assert client.meta.read("test/solo/a.json") == data
    meta.delete("test/solo/b.json")
    assert client.meta.read("test/solo/b.json") is None and meta.read("test/solo/b.json") is None
    assert meta.display("test/solo/a.json").endswith(f"{META_DIR}/test/solo/a.json")
    chain = FencedChain(meta, "test/solo-chain")
    assert chain.claim(1, b'{"n": 1, "token": "%s"}' % new_token().encode()) is Placement.WON
    assert FencedChain(client.meta, "test/solo-chain").numbers() == [1]
    client.close()


def test_client_meta_takes_the_clients_timeout_and_name(memory_store: StoreTarget) -> None:
    client = memory_store.open(retry_timeout=0.25)
    assert client.retry_timeout == 0.25
    assert repr(client.meta) == f"MetaStore({client!r})"
    assert repr(MetaStore.of(client, internal=True)) == f"MetaStore({client!r})"
    client.close()


class _Unreachable(ConnectionResetError):
    """A transient failure (retried until the deadline)."""


def test_a_failing_store_is_reported_with_the_outcome_known(memory_store: StoreTarget) -> None:
    """Writes that keep failing transiently end in StorageUnavailable naming the client, the
    object and the timeout: a create or a write may have taken effect (outcome unknown), a
    delete changes nothing if it failed (outcome known)."""
    client = memory_store.open(retry_timeout=0.2)
    backend: Any = client.store.backend.inner  # under the retrying wrapper
    calls: list[str] = []

    def fail(*args: Any) -> Any:
        calls.append(repr(args[0]))
        raise _Unreachable("connection reset by peer")

    saved = {name: getattr(backend, name) for name in ("create", "write", "delete")}
    for name in saved:
        setattr(backend, name, fail)
    try:
        with pytest.raises(StorageUnavailable) as created:
            client.meta.put_if_absent("test/down/a.json", b"{}")
        with pytest.raises(StorageUnavailable) as written:
            client.meta.write("test/down/b.json", b"{}")
        with pytest.raises(StorageUnavailable) as deleted:
            client.meta.delete("test/down/c.json")
    finally:
        for name, real in saved.items():
            setattr(backend, name, real)
    assert len(calls) >= 6  # each retried at least once before the deadline
    for caught, what in ((created, "create"), (written, "write")):
        assert caught.value.outcome_known is False
        assert str(caught.value).startswith(
            f"{client!r}: could not {what} 'test/down/"
        ), str(caught.value)
        assert "within 0.2 s; its outcome is unknown (it may have taken effect)" in str(
            caught.value
        )
        assert "connection reset by peer" in str(caught.value)
    assert deleted.value.outcome_known is True
    assert str(deleted.value).startswith(
        f"{client!r}: could not delete 'test/down/c.json' within 0.2 s; nothing was changed"
    ), str(deleted.value)
    client.close()


def test_reserved_directories_are_oncelog_own(memory_store: StoreTarget) -> None:
    """RESERVED_DIRS covers every directory the journal layer keeps under .oncelog/, users'
    stores may not write there, and oncelog's internal stores may."""
    client = memory_store.open()
    store = client.store
    layer_dirs = {
        store.claims_dir("x").split(f"{META_DIR}/", 1)[1].split("/", 1)[0],
        store.specs_dir().split(f"{META_DIR}/", 1)[1].split("/", 1)[0],
        records.RECORDS,
        _revisions.REVISIONS,
    }
    assert layer_dirs <= set(RESERVED_DIRS)
    internal = MetaStore.of(client, internal=True)
    for top in RESERVED_DIRS:
        path = f"{top}/test-reserved/{new_token()}.json"
        for write in (client.meta.put_if_absent, client.meta.write):
            with pytest.raises(InvalidObjectPath, match="oncelog's own"):
                write(path, b"{}")
        with pytest.raises(InvalidObjectPath):
            client.meta.delete(path)
        assert client.meta.read(path) is None  # nothing was written
        assert internal.put_if_absent(path, b"{}")
        internal.delete(path)
        assert internal.read(path) is None
    with pytest.raises(InvalidObjectPath):
        internal.put_if_absent("../escape.json", b"{}")  # still validated
    client.close()


def test_loaded_index_and_closed(memory_store: StoreTarget) -> None:
    client = memory_store.open()
    client.create(JournalSpec("test/loaded", fragment=FragmentSpec(length=1 << 20)))
    assert client.loaded_index("test/loaded") is None  # nothing read or appended yet
    client.append("test/loaded", b"hello\n")
    index = client.loaded_index("test/loaded")
    assert index is not None and client.loaded_index("test/loaded") is index
    assert client.head("test/loaded") == 6
    assert not client.closed
    client.close()
    assert client.closed


def _journal_client_privates() -> set[str]:
    tree = ast.parse(CLIENT_MODULE.read_text())
    (cls,) = (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "JournalClient")
    names = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_no_module_uses_journal_client_privates() -> None:
    """Outside its module, JournalClient is used through public names only: no attribute
    named like one of its private ones is read on anything but `self`/`cls`."""
    privates = _journal_client_privates()
    assert {"_with_retry", "_indexes", "_closed", "_create_object"} <= privates
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == CLIENT_MODULE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in privates
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "setattr", "hasattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in privates
                and not (isinstance(node.args[0], ast.Name) and node.args[0].id == "self")
            ):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []
