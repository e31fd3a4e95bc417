"""Damaged consumer state is named, never silently used: hand-corrupted checkpoints (JSON
state), SQLite snapshots and deltas (empty, a zeroed page, one changed digit, truncated)
make recovery raise CheckpointError naming the object, with nothing written; state objects
written before checksums existed are still read."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest

from oncelog.consumer import (
    CheckpointError,
    CheckpointStore,
    Consumer,
    SQLiteState,
    Transaction,
)
from oncelog.consumer.state import is_sqlite_ref, unseal
from oncelog.journal import JournalClient, JournalSpec
from oncelog.message import Envelope, JSONMessage
from oncelog.publisher import Publisher

NDJSON = "application/x-ndjson"
INPUT = "integrity/in"
MESSAGES = 30
STATE_DIR = "checkpoints/{group}/state"


def setup_input(client: JournalClient) -> None:
    client.create(JournalSpec(INPUT, {"content-type": NDJSON}))
    pub = Publisher(client)
    for i in range(MESSAGES):
        pub.publish_committed(lambda _m: (INPUT, NDJSON), JSONMessage({"i": i}))
    pub.flush()


def kv_handler(env: Envelope, txn: Transaction) -> None:
    assert txn.kv is not None
    i = env.message.doc["i"]
    # Values with digits to change, and padding so a snapshot spans several pages.
    txn.kv.put(f"k{i:03d}", {"n": 7_000_000 + i, "pad": "p" * 400})


def json_handler(env: Envelope, txn: Transaction) -> None:
    i = env.message.doc["i"]
    txn.state[f"k{i:03d}"] = 7_000_000 + i


def expected_kv() -> dict[str, Any]:
    return {f"k{i:03d}": {"n": 7_000_000 + i, "pad": "p" * 400} for i in range(MESSAGES)}


def kv_consumer(client: JournalClient, group: str = "kv") -> Consumer:
    return Consumer(client, group, [INPUT], kv_handler, max_messages=10,
                    state=SQLiteState(snapshot_every=3), keep_checkpoints=None)


def recovered_kv(client: JournalClient, group: str = "kv") -> dict[str, Any]:
    consumer = kv_consumer(client, group)
    consumer.recover()
    assert consumer.kv is not None
    out = consumer.kv.to_dict()
    consumer.close()
    return out


def overwrite(client: JournalClient, rel: str, data: bytes) -> None:
    """Replace a stored object's bytes (as damage on the store would)."""
    client.meta.delete(rel)
    assert client.meta.put_if_absent(rel, data)


def read(client: JournalClient, rel: str) -> bytes:
    data = client.meta.read(rel)
    assert data is not None, rel
    return data


def change_digit(data: bytes, after: bytes) -> bytes:
    """`data` with the last digit of the first number following `after` changed."""
    m = re.search(re.escape(after) + rb"(\d+)", data)
    assert m is not None, after
    at = m.end(1) - 1
    digit = data[at : at + 1]
    return data[:at] + (b"3" if digit != b"3" else b"4") + data[at + 1 :]


def sqlite_group(client: JournalClient) -> tuple[CheckpointStore, dict[str, Any]]:
    """Run the SQLite consumer to the end; its store and latest state reference (a
    snapshot and one delta after it)."""
    setup_input(client)
    consumer = kv_consumer(client)
    consumer.run(until_idle=True)
    consumer.close()
    store = CheckpointStore(client, "kv")
    latest = store.latest()
    assert latest is not None and is_sqlite_ref(latest.state)
    ref = latest.state
    assert ref["snapshot"] and ref["deltas"], ref
    assert recovered_kv(client) == expected_kv()
    return store, ref


def assert_refused(client: JournalClient, store: CheckpointStore, path: str, what: str) -> None:
    """Recovery raises CheckpointError naming `path` and saying `what`; nothing is written."""
    seqs = store.seqs()
    state_objects = client.meta.list(STATE_DIR.format(group=store.group))
    with pytest.raises(CheckpointError) as info:
        kv_consumer(client, store.group).recover()
    message = str(info.value)
    assert path in message and re.search(what, message), message
    assert store.seqs() == seqs
    assert client.meta.list(STATE_DIR.format(group=store.group)) == state_objects


SNAPSHOT_DAMAGE = {
    "empty": (lambda data: b"", "do not match the checksum"),
    "zeroed page": (
        lambda data: data[:4096] + bytes(4096) + data[8192:], "do not match the checksum"
    ),
    "changed digit": (lambda data: change_digit(data, b'"n":'), "do not match the checksum"),
    "truncated": (lambda data: data[: len(data) // 2], "do not match the checksum"),
}


@pytest.mark.parametrize("damage", SNAPSHOT_DAMAGE)
def test_damaged_snapshot_is_named(store_url, damage: str) -> None:
    client = store_url.open()
    store, ref = sqlite_group(client)
    rel = f"{STATE_DIR.format(group='kv')}/{ref['snapshot']}"
    original = read(client, rel)
    assert len(original) > 8192  # several pages
    corrupt, what = SNAPSHOT_DAMAGE[damage]
    overwrite(client, rel, corrupt(original))
    assert_refused(client, store, f"/.oncelog/{rel}", what)
    # Nothing was changed: with the object restored, recovery gives the committed state.
    overwrite(client, rel, original)
    assert recovered_kv(client) == expected_kv()


DELTA_DAMAGE = {
    "empty": (lambda data: b"", "not JSON|unexpected|EOF|Input is a zero-length"),
    "changed digit": (lambda data: change_digit(data, b'"n":'), "do not match its checksum"),
    "truncated": (lambda data: data[: len(data) // 2], "unexpected|EOF|Invalid|expected"),
    "changed checksum": (lambda data: data[:-3] + (b"0" if data[-3:-2] != b"0" else b"1")
                         + data[-2:], "match its checksum"),
}


@pytest.mark.parametrize("damage", DELTA_DAMAGE)
def test_damaged_delta_is_named(memory_store, damage: str) -> None:
    client = memory_store.open()
    store, ref = sqlite_group(client)
    rel = f"{STATE_DIR.format(group='kv')}/{ref['deltas'][-1]}"
    original = read(client, rel)
    corrupt, what = DELTA_DAMAGE[damage]
    damaged = corrupt(original)
    assert damaged != original
    overwrite(client, rel, damaged)
    assert_refused(client, store, f"/.oncelog/{rel}", what)
    overwrite(client, rel, original)
    assert recovered_kv(client) == expected_kv()


def test_damaged_json_state_is_named(store_url) -> None:
    client = store_url.open()
    setup_input(client)
    Consumer(client, "js", [INPUT], json_handler, initial_state={}, max_messages=10,
             keep_checkpoints=None).run(until_idle=True)
    store = CheckpointStore(client, "js")
    seq = store.seqs()[-1]
    rel = store.relative_path(seq)
    original = read(client, rel)
    assert b'"state_crc32c":"' in original
    for damaged, what in [
        (change_digit(original, b'"k005":'), "does not match its checksum"),
        (b"", "not JSON"),
        (original[: len(original) // 2], "not JSON"),
    ]:
        overwrite(client, rel, damaged)
        seqs = store.seqs()
        with pytest.raises(CheckpointError) as info:
            Consumer(client, "js", [INPUT], json_handler, initial_state={}).recover()
        assert store.path(seq) in str(info.value) and re.search(what, str(info.value))
        assert store.seqs() == seqs
    overwrite(client, rel, original)
    consumer = Consumer(client, "js", [INPUT], json_handler, initial_state={})
    consumer.recover()
    assert consumer.state == {f"k{i:03d}": 7_000_000 + i for i in range(MESSAGES)}


def strip_checksums(client: JournalClient, store: CheckpointStore) -> None:
    """Make the group's objects look as the previous version wrote them: no state
    checksum in the checkpoints, no snapshot checksum in the references, no delta
    checksum."""
    state_dir = STATE_DIR.format(group=store.group)
    for name in client.meta.list(state_dir):
        if name.endswith(".delta"):
            rel = f"{state_dir}/{name}"
            body, sealed = unseal(read(client, rel))
            assert sealed
            overwrite(client, rel, body)
    for seq in store.seqs():
        rel = store.relative_path(seq)
        doc = orjson.loads(read(client, rel))
        doc.pop("state_crc32c", None)
        if is_sqlite_ref(doc.get("state")):
            doc["state"].pop("snapshot_crc32c", None)
        overwrite(client, rel, orjson.dumps(doc))


def test_objects_without_checksums_are_still_read(memory_store) -> None:
    client = memory_store.open()
    store, ref = sqlite_group(client)
    strip_checksums(client, store)
    assert recovered_kv(client) == expected_kv()
    # And consuming goes on from them (new objects have checksums again).
    pub = Publisher(client)
    pub.publish_committed(lambda _m: (INPUT, NDJSON), JSONMessage({"i": MESSAGES}))
    pub.flush()
    kv_consumer(client).run(until_idle=True)
    want = expected_kv()
    want[f"k{MESSAGES:03d}"] = {"n": 7_000_000 + MESSAGES, "pad": "p" * 400}
    assert recovered_kv(client) == want


@pytest.mark.parametrize("damage", ["empty", "zeroed page", "truncated"])
def test_damaged_snapshot_without_checksum_is_named(memory_store, damage: str) -> None:
    """A snapshot written before checksums: SQLite's own checks name the damage (an empty
    one made recovery raise MemoryError, a zeroed page a bare sqlite3.DatabaseError)."""
    client = memory_store.open()
    store, ref = sqlite_group(client)
    strip_checksums(client, store)
    rel = f"{STATE_DIR.format(group='kv')}/{ref['snapshot']}"
    original = read(client, rel)
    corrupt, _what = SNAPSHOT_DAMAGE[damage]
    overwrite(client, rel, corrupt(original))
    assert_refused(client, store, f"/.oncelog/{rel}", "empty|integrity check|not a SQLite")
