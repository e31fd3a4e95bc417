"""Appender internals that the client tests cannot reach: backpressure, the writer thread's
life cycle, and appends racing a slow writer."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from oncelog.journal import FragmentSpec, JournalSpec
from oncelog.journal import appender as appender_module


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
    backend = client.store.backend
    original = backend.write

    def slow_first(path: str, data: Any) -> None:
        if not first_write.is_set():
            first_write.set()
            assert gate.wait(30)
        original(path, data)

    backend.write = slow_first  # type: ignore[method-assign]
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
