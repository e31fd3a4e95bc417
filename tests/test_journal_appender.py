"""Appender internals that the client tests cannot reach: backpressure, the writer thread's
life cycle, and appends racing a slow writer."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from journal_support import new_journal

from oncelog.journal import AppendFailed, AppendResult, FragmentSpec, JournalSpec
from oncelog.journal import _persister as persister_module
from oncelog.journal import appender as appender_module
from oncelog.journal.errors import StorageUnavailable


def wait_until(predicate: Any, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


def test_start_append_blocks_while_too_many_bytes_wait(memory_store: Any) -> None:
    client = memory_store.open()
    client.create(JournalSpec("bp", fragment=FragmentSpec(length=100)))
    gate = threading.Event()
    backend = client.store.backend
    original = backend.write

    def slow_write(path: str, data: Any) -> None:
        assert gate.wait(30)
        original(path, data)

    backend.write = slow_write  # type: ignore[method-assign]
    appender = client._appender("bp")
    appender._limit = 300  # a tiny backlog allowance, so the test stays small
    appender._update_room_locked()
    handles = []
    # One 100-byte fragment is stuck in the writer, one waits behind it, one is open: the
    # next append would push a third 100 bytes into the backlog, so it must wait.
    for _ in range(3):
        aa = client.start_append("bp")
        aa.write(b"x" * 100)
        aa.release()
        handles.append(aa)
    blocked = threading.Event()
    unblocked = threading.Event()

    def fourth() -> None:
        blocked.set()
        aa = client.start_append("bp")
        unblocked.set()
        aa.write(b"y" * 10)
        aa.release()
        handles.append(aa)

    thread = threading.Thread(target=fourth, daemon=True)
    thread.start()
    assert blocked.wait(10)
    assert not unblocked.wait(0.2)  # still held back by the backlog
    gate.set()
    assert unblocked.wait(30)
    thread.join(30)
    client.flush()
    assert [h.result().begin for h in handles] == [0, 100, 200, 300]
    assert client.read("bp").read() == b"x" * 300 + b"y" * 10


def test_idle_writer_thread_exits_and_comes_back(memory_store: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(appender_module, "_IDLE_EXIT", 0.05)
    client = memory_store.open()
    client.create(JournalSpec("idle"))
    client.append("idle", b"one")
    appender = client._appender("idle")
    assert wait_until(lambda: appender._thread is None)
    assert client.append("idle", b"two").begin == 3
    assert client.read("idle").read() == b"onetwo"


def test_appends_keep_flowing_while_a_write_is_slow(local_store: Any) -> None:
    """Group commit: appends released during a slow write share the next fragment."""
    client = local_store.open()
    client.create(JournalSpec("gc"))
    first_write = threading.Event()
    gate = threading.Event()
    backend: Any = client.store.backend.staging
    original = backend.stage  # local disk: the fragment's bytes are written here

    def slow_first(directory: str, data: Any) -> Any:
        if not first_write.is_set():
            first_write.set()
            assert gate.wait(30)
        return original(directory, data)

    backend.stage = slow_first  # type: ignore[method-assign]
    first = client.start_append("gc")
    first.write(b"first\n")
    first.release()
    assert first_write.wait(30)  # the writer is now stuck in the first fragment
    rest = []
    for i in range(50):
        aa = client.start_append("gc")
        aa.write(b"%02d\n" % i)
        aa.release()
        rest.append(aa)
    assert not any(aa.done() for aa in rest)
    gate.set()
    client.flush()
    spans = [(f.begin, f.end) for f in client.fragments("gc")]
    assert spans == [(0, 6), (6, 6 + 50 * 3)]
    assert rest[-1].result().end == 156


def test_close_flushes_and_refuses_new_appends(memory_store: Any) -> None:
    client = memory_store.open()
    client.create(JournalSpec("closing", fragment=FragmentSpec(flush_interval=3600)))
    aa = client.start_append("closing")
    aa.write(b"last words")
    aa.release()
    client.close()
    assert aa.done() and aa.result().end == 10
    from oncelog.journal import JournalError

    with pytest.raises(JournalError, match="closed"):
        client.start_append("closing")
    assert memory_store.open().read("closing").read() == b"last words"


def _temp_files(root: str) -> list[str]:
    import os

    return [n for _, _, files in os.walk(root) for n in files if n.startswith(".tmp-")]


def test_local_fragments_are_staged_while_hashed_and_named_by_their_sha1(
    local_store: Any,
) -> None:
    """On local disk raw fragments are written under a temporary name while their SHA1 is
    computed, then renamed; compressed ones are written after encoding."""
    import hashlib

    client = local_store.open()
    client.create(JournalSpec("raw"))
    client.create(JournalSpec("zst", fragment=FragmentSpec(compression="zstd")))
    backend: Any = client.store.backend.staging
    staged: list[str] = []
    original = backend.stage

    def spy(directory: str, data: Any) -> Any:
        staged.append(directory)
        return original(directory, data)

    backend.stage = spy  # type: ignore[method-assign]
    payload = bytes(range(256)) * 4096
    assert client.append("raw", payload).end == len(payload)
    assert client.append("zst", payload).end == len(payload)
    assert staged == [client.store.journal_dir("raw")]
    (fragment,) = client.fragments("raw")
    assert fragment.sum == hashlib.sha1(payload).hexdigest()
    assert local_store.open().read("raw").read() == payload
    assert local_store.open().read("zst").read() == payload
    assert _temp_files(local_store.url) == []


def test_a_failed_rename_of_staged_bytes_is_retried_by_writing_them_afresh(
    local_store: Any, monkeypatch: Any
) -> None:
    import os

    from oncelog.journal.backends import local as backends_module

    client = local_store.open()
    client.create(JournalSpec("flaky"))
    journal_dir = client.store.journal_dir("flaky")
    real_replace = os.replace
    failures = []

    def flaky_replace(src: str, dst: str) -> None:
        if not failures and os.path.dirname(dst) == journal_dir:
            failures.append(src)
            raise OSError(5, "simulated I/O error", dst)
        real_replace(src, dst)

    monkeypatch.setattr(backends_module.os, "replace", flaky_replace)
    result = client.append("flaky", b"survives a failed rename\n")
    assert len(failures) == 1 and not os.path.exists(failures[0])  # the staged file is gone
    assert (result.begin, result.end) == (0, 25)
    assert local_store.open().read("flaky").read() == b"survives a failed rename\n"
    assert _temp_files(local_store.url) == []


def test_staged_bytes_are_removed_when_the_append_fails_before_naming_them(
    local_store: Any,
) -> None:
    from oncelog.journal import AppendFailed, JournalError

    client = local_store.open()
    client.create(JournalSpec("doomed"))
    assert client.append("doomed", b"first").end == 5
    appender = client._appender("doomed")

    def gone() -> None:
        raise JournalError("journal 'doomed' vanished")

    appender.index.ensure_loaded = gone  # type: ignore[method-assign]
    with pytest.raises(AppendFailed, match="vanished"):
        client.append("doomed", b"second")
    assert _temp_files(local_store.url) == []
    assert local_store.open().read("doomed").read() == b"first"


def test_a_forked_child_hashes_large_fragments_with_its_own_threads(local_store: Any) -> None:
    """The SHA1 thread pool is not inherited across fork (its threads are not)."""
    import multiprocessing

    client = local_store.open()
    client.create(JournalSpec("forked"))
    big = b"p" * (persister_module._OVERLAP_MIN + 1)
    assert client.append("forked", big).end == len(big)  # the parent's pool now exists
    assert persister_module._HASH_POOL is not None
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_append_in_child, args=(local_store.url, len(big)))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert local_store.open().read("forked").read() == big + b"c" * len(big)


def _append_in_child(url: str, size: int) -> None:
    from oncelog.journal import open_journals

    assert persister_module._HASH_POOL is None
    child_client = open_journals(url)
    assert child_client.append("forked", b"c" * size).begin == size


# -- what each batch stores ---------------------------------------------------------------------


def test_each_batch_stores_only_its_own_bytes(store_url: Any) -> None:
    """A small batch after a big one stores just its own bytes, and appends aborted or made
    of wider items land where their results say."""
    from array import array

    client = store_url.open()
    try:
        name = new_journal(client)
        big = bytes(range(256)) * 40  # 10,240 bytes
        assert client.append(name, big) == AppendResult(0, len(big))
        for i in range(3):  # each batch written before the next: buffers come back
            aa = client.start_append(name)
            aa.write(b"gone")
            aa.abort()
            with client.start_append(name) as aa:
                aa.write(b"x%d" % i)
            assert aa.result() == AppendResult(len(big) + 2 * i, len(big) + 2 * i + 2)
        wide = array("i", [1, 2, 3])
        with client.start_append(name) as aa:
            assert aa.write(memoryview(wide)) == 3  # the item count, as len() gives
            aa.write(bytearray(b"!"))
        end = len(big) + 6 + wide.itemsize * 3 + 1
        assert aa.result() == AppendResult(len(big) + 6, end)
        many = client.start_append_many(name, [b"a", b"bc"]).result()
        assert many == [AppendResult(end, end + 1), AppendResult(end + 1, end + 3)]
        expected = big + b"x0x1x2" + wide.tobytes() + b"!abc"
        fresh = store_url.open()
        try:
            assert fresh.read(name).read() == expected
            lengths = [f.end - f.begin for f in fresh.fragments(name)]
            assert lengths == [len(big), 2, 2, 2, wide.itemsize * 3 + 1, 3]
        finally:
            fresh.close()
    finally:
        client.close()


def test_an_append_after_a_failed_one_is_stored_intact(memory_store: Any) -> None:
    """A failed batch fails its appends only: the next append starts at the same offset and
    its bytes are stored intact."""
    client = memory_store.open(retry_timeout=0.2)
    try:
        name = new_journal(client)
        backend: Any = client.store.backend.inner
        original = backend.write
        failing = [True]

        def write(path: str, data: Any) -> None:
            if failing[0]:
                raise OSError("disk on fire")
            original(path, data)

        backend.write = write
        with pytest.raises(AppendFailed):
            client.append(name, b"first" * 100)
        failing[0] = False
        assert client.append(name, b"second") == AppendResult(0, 6)
        assert client.read(name).read() == b"second"
    finally:
        client.close()


def test_a_fragment_collected_while_its_writer_was_paused_is_stored_again(
    store_url: Any,
) -> None:
    """A writer stopped between storing a fragment and claiming it (a zombie, for longer than
    a gc's grace) wins a claim naming an object gc deleted: it notices, stores the same bytes
    again, and what it acknowledged is readable, by itself and by anyone else."""
    client, other = store_url.open(), store_url.open()
    try:
        name = new_journal(client)
        persister = client._appender(name)._persister
        persister.recheck_after = 0.0  # the pause below is simulated, not waited out
        claimer = persister._claimer
        real_claim = claimer.claim
        collected: list[Any] = []

        def claim_after_a_pause(sealed: Any) -> Any:
            # Where the writer was stopped: another process's gc ran meanwhile.
            collected.extend(other.gc(name, grace=0))
            return real_claim(sealed)

        claimer.claim = claim_after_a_pause  # type: ignore[method-assign]
        assert client.append(name, b"acknowledged\n") == AppendResult(0, 13)
        assert len(collected) == 1 and collected[0].begin == 0  # ours was deleted
        assert persister.fragments_restored == 1
        claimer.claim = real_claim  # type: ignore[method-assign]
        assert client.append(name, b"next\n") == AppendResult(13, 18)
        fresh = store_url.open()
        try:
            assert fresh.read(name).read() == b"acknowledged\nnext\n"
            report = fresh.verify(name)
            assert report.ok, report.problems
        finally:
            fresh.close()
    finally:
        other.close()
        client.close()


def test_a_prompt_claim_does_not_look_its_fragment_up_again(memory_store: Any) -> None:
    client = memory_store.open()
    try:
        name = new_journal(client)
        backend = client.store.backend
        looked_up: list[str] = []
        original = backend.exists

        def exists(path: str) -> bool:
            looked_up.append(path)
            return original(path)

        backend.exists = exists  # type: ignore[method-assign]
        persister = client._appender(name)._persister
        assert persister.recheck_after == persister_module.RECHECK_AFTER == 1.0
        for i in range(5):
            client.append(name, b"%d\n" % i)
        assert [p for p in looked_up if "/.oncelog/" not in p and name in p] == []
        persister.recheck_after = 0.0  # every claim now counts as late: checked, present
        client.append(name, b"late\n")
        assert len([p for p in looked_up if p.endswith(".raw")]) == 1
        assert persister.fragments_restored == 0
    finally:
        client.close()


def test_a_late_claim_whose_fragment_cannot_be_checked_reports_an_unknown_outcome(
    memory_store: Any,
) -> None:
    """The claim is won, so whatever stops the check after it (here the store's reads
    giving up), the append is reported with an unknown outcome, never as not made."""
    client = memory_store.open(retry_timeout=0.2)
    try:
        name = new_journal(client)
        persister = client._appender(name)._persister
        persister.recheck_after = 0.0
        backend = client.store.backend

        def unavailable(path: str) -> bool:
            raise StorageUnavailable(f"reads of {path} gave up")

        backend.exists = unavailable  # type: ignore[method-assign]
        with pytest.raises(AppendFailed, match="outcome is unknown") as info:
            client.append(name, b"claimed\n")
        assert info.value.made is None
        del backend.exists
        assert client.read(name).read() == b"claimed\n"  # it was made
    finally:
        client.close()
