"""Journal storage under faults: lost replies of conditional writes, transient errors and
409 conflicts, corrupt and hand-made objects, deleted and re-created journals.

Faults are injected at the backend (the call made to the store), on every backend; the
same scenarios through a real HTTP fault proxy in front of the S3 server are in
tests/test_s3_faults.py.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import pytest
from journal_support import new_journal

from oncelog.journal import (
    AppendFailed,
    CorruptClaim,
    CorruptSpec,
    JournalClient,
    JournalExists,
    JournalNotFound,
    JournalRecreated,
    JournalSpec,
    StorageUnavailable,
)
from oncelog.journal.store import Claim
from oncelog.testing.fixtures import StoreTarget

pytestmark = pytest.mark.fault


class Transient(OSError):
    """What a 500, 503 or 409 answer, or a reset connection, looks like to the backend."""


def _patch(client: JournalClient, name: str, wrapper: Callable[[Callable[..., Any]], Any]) -> None:
    """Inject faults at the storage backend itself, below the store's retries of reads."""
    backend = getattr(client.store.backend, "inner", client.store.backend)
    setattr(backend, name, wrapper(getattr(backend, name)))


def lose_reply_once(match: str) -> Callable[[Callable[..., Any]], Any]:
    """The first call whose path contains `match` takes effect, then its reply is lost."""
    state = {"lost": 0}

    def wrap(create: Callable[..., Any]) -> Any:
        def lossy(path: str, data: bytes) -> bool:
            result = create(path, data)
            if match in path and state["lost"] == 0:
                state["lost"] += 1
                assert result, "the first attempt must have created the object"
                raise Transient("connection reset after the request was applied")
            return result

        lossy.state = state  # type: ignore[attr-defined]
        return lossy

    return wrap


def fail_times(n: int, match: str = "", error: type[Exception] = Transient) -> Any:
    """Fail the first `n` calls whose first argument contains `match`, then pass through."""
    count = {"failed": 0}

    def wrap(call: Callable[..., Any]) -> Any:
        def failing(path: Any, *args: Any, **kwargs: Any) -> Any:
            if match in str(path) and count["failed"] < n:
                count["failed"] += 1
                raise error("503 SlowDown / 409 ConditionalRequestConflict")
            return call(path, *args, **kwargs)

        return failing

    wrap.count = count  # type: ignore[attr-defined]
    return wrap


# -- lost replies: a conditional write that took effect is never reported as lost ----------


def test_create_whose_reply_was_lost_succeeds(store_url: StoreTarget) -> None:
    client = store_url.open(retry_timeout=5)
    wrap = lose_reply_once("spec.json")
    _patch(client, "create", wrap)
    spec = client.create(JournalSpec("lost/reply", {"content-type": "application/x-ndjson"}))
    assert client.get("lost/reply") == spec
    assert client.get("lost/reply").incarnation == spec.incarnation
    # A second, genuine create of the name is still refused.
    with pytest.raises(JournalExists):
        client.create(JournalSpec("lost/reply"))
    client.close()


def test_put_if_absent_whose_reply_was_lost_is_ours(store_url: StoreTarget) -> None:
    client = store_url.open(retry_timeout=5)
    _patch(client, "create", lose_reply_once("objs/a"))
    assert client.meta.put_if_absent("objs/a", b"token-1")
    assert client.meta.read("objs/a") == b"token-1"
    # Another writer's attempt (other bytes) at the same path loses, reply lost or not.
    assert not client.meta.put_if_absent("objs/a", b"token-2")
    assert client.meta.read("objs/a") == b"token-1"
    client.close()


def test_conditional_writes_retry_conflicts_then_say_the_outcome_is_unknown(
    store_url: StoreTarget,
) -> None:
    client = store_url.open(retry_timeout=2)
    wrap = fail_times(3, "objs/b")
    _patch(client, "create", wrap)
    assert client.meta.put_if_absent("objs/b", b"x")  # three 409s, then created
    assert wrap.count["failed"] == 3
    forever = fail_times(10**9, "objs/c")
    _patch(client, "create", forever)
    start = time.monotonic()
    with pytest.raises(StorageUnavailable, match="objs/c.*outcome is unknown") as info:
        client.meta.put_if_absent("objs/c", b"y")
    assert info.value.outcome_known is False
    assert time.monotonic() - start < 10  # bounded by retry_timeout
    client.close()


# -- transient errors on reads: retried, then a clear error ---------------------------------


def test_first_append_of_a_fresh_client_survives_a_transient_spec_read(
    store_url: StoreTarget,
) -> None:
    setup = store_url.open()
    name = new_journal(setup)
    setup.close()
    client = store_url.open(retry_timeout=3)
    wrap = fail_times(1, "spec.json")
    _patch(client, "read", wrap)
    assert client.append(name, b"one\n").end == 4
    assert wrap.count["failed"] == 1
    client.close()
    client = store_url.open(retry_timeout=0.5)
    _patch(client, "read", fail_times(10**9, "spec.json"))
    with pytest.raises(AppendFailed, match=f"spec of journal '{name}'.*not made"):
        client.append(name, b"two\n")
    client.close()
    check = store_url.open()
    assert check.read(name).read() == b"one\n"
    check.close()


def test_corrupt_spec_is_named_and_does_not_hide_other_journals(store_url: StoreTarget) -> None:
    client = store_url.open()
    good = new_journal(client, "ok")
    bad = new_journal(client, "bad")
    client.store.backend.write(client.store.spec_path(bad), b"{not json")
    with pytest.raises(CorruptSpec, match=rf"journal '{bad}' \(.*spec.json\) is corrupt"):
        client.get(bad)
    seen: list[tuple[str, Exception]] = []
    listed = client.list(on_error=lambda name, exc: seen.append((name, exc)))
    assert [s.name for s in listed] == [good]
    assert [n for n, _ in seen] == [bad] and isinstance(seen[0][1], CorruptSpec)
    assert [s.name for s in client.list()] == [good]  # default: logged, not raised
    client.close()


# -- hand-made and foreign objects ----------------------------------------------------------


def test_claim_of_an_empty_fragment_fails_appends_instead_of_spinning(
    store_url: StoreTarget,
) -> None:
    client = store_url.open(retry_timeout=2)
    name = new_journal(client)
    client.append(name, b"abc\n")
    empty = Claim(4, f"{4:016x}-{4:016x}-{'0' * 40}.raw", "hand-made")
    client.store.backend.write(client.store.claim_path(name, 4), empty.to_bytes())
    other = store_url.open(retry_timeout=2)
    start = time.monotonic()
    with pytest.raises(AppendFailed, match=r"offset 4 .*empty fragment"):
        other.append(name, b"def\n")
    assert time.monotonic() - start < 10
    with pytest.raises(CorruptClaim, match="empty fragment"):
        other.head(name)
    other.close()
    client.close()


def test_a_name_with_no_spec_is_not_read_from_a_child_journal(store_url: StoreTarget) -> None:
    client = store_url.open()
    client.create(JournalSpec("odd/x=1"))
    client.append("odd/x=1", b"secret\n")
    assert not client.exists("odd")
    with pytest.raises(JournalNotFound):
        client.read("odd")
    with pytest.raises(JournalNotFound):
        client.head("odd")
    client.close()


# -- deleted and re-created journals --------------------------------------------------------


def test_tailing_reader_of_another_client_detects_a_recreated_journal(
    store_url: StoreTarget,
) -> None:
    a = store_url.open(poll_interval=(0.001, 0.01))
    b = store_url.open()
    name = new_journal(a)
    a.append(name, b"old-1\n")
    a.append(name, b"old-2\n")
    reader = a.read(name, offset=0, block=True)
    assert reader.read(12) == b"old-1\nold-2\n"
    b.delete(name)
    b.create(JournalSpec(name))
    b.append(name, b"new-0\n" * 2)  # 12 bytes: the new journal has a claim at old head 12
    b.append(name, b"new-1\n")
    with pytest.raises(JournalRecreated, match=f"offset 12 of journal '{name}'"):
        reader.read(6)
    reader.close()
    assert a.read(name).read() == b"new-0\nnew-0\nnew-1\n"  # a fresh read sees the new one
    a.close()
    b.close()


def test_delete_and_appends_of_one_client_exclude_each_other(store_url: StoreTarget) -> None:
    """Appends racing a delete either land before it (and go with the journal) or fail, or
    land in the journal created again, from its offset 0: never at the deleted journal's
    offsets, and nothing acknowledged before the delete began shows up in the new one."""
    client = store_url.open(retry_timeout=5)
    name = new_journal(client)
    stop = threading.Event()
    deleting = threading.Event()
    before: list[bytes] = []
    counter = iter(range(10**9))

    def appender() -> None:
        while not stop.is_set():
            payload = f"old-{next(counter)}\n".encode()
            try:
                client.append(name, payload)
            except Exception:  # noqa: BLE001 - not found, closed appender, failed append
                continue
            if not deleting.is_set():
                before.append(payload)

    threads = [threading.Thread(target=appender) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 10
        while client.head(name) < 200 and time.monotonic() < deadline:
            client.flush()
        deleting.set()
        client.delete(name)
        client.create(JournalSpec(name))
        client.append(name, b"new\n")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    client.flush()
    assert len(before) > 10
    fresh = store_url.open()
    data = fresh.read(name).read()
    lines = data.splitlines(keepends=True)
    assert b"new\n" in lines
    assert not set(lines) & set(before)
    fragments = fresh.fragments(name)
    assert fragments[0].begin == 0
    assert all(a.end == b.begin for a, b in zip(fragments, fragments[1:]))
    assert fresh.head(name) == len(data)
    fresh.close()
    client.close()


def test_a_reader_finalized_while_its_index_is_locked_does_not_deadlock(
    memory_store: StoreTarget,
) -> None:
    """The collector may finalize an abandoned reader (closing it) at any allocation, also
    one made while the same thread holds its journal index's lock: closing must not block."""
    client = memory_store.open()
    name = new_journal(client)
    client.append(name, b"x\n")
    reader = client.read(name)
    index = client._journal_index(name)
    done = threading.Event()

    def close_under_lock() -> None:
        with index._cond:  # as ClaimsIndex.locate does when a finalizer runs inside it
            reader.close()
        done.set()

    thread = threading.Thread(target=close_under_lock, daemon=True)
    thread.start()
    thread.join(10)
    assert done.is_set(), "closing a reader under its index's lock deadlocked"
    client.close()
