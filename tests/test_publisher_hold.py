"""An open transaction holds its journals' appenders: its messages wait for its ACK.

With the default flush_interval (0) an idle appender writes whatever was released as soon
as its writer is free. Inside `Publisher.transaction()` that split a transaction published
message by message into several fragments (each one write, fsync and claim, and, with other
writers on the journal, each one more race to lose) before its ACK: the single-journal
commit could join only the messages still spooled. The transaction now holds the appender
(`Appender.hold`) from before its first message there until it ends; what must hold:

- one fragment per transaction (messages and ACK), with the default fragment spec;
- a held appender still writes at once for anyone who waits (`result`, `flush`), and by
  itself after `HOLD_LIMIT` seconds;
- every hold is released when the transaction ends, committed, rolled back or failed.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

import pytest

from oncelog import JSONMessage, Publisher, read_committed
from oncelog.identity import Flags, parse_uuid_fields
from oncelog.journal import JournalClient, JournalSpec
from oncelog.journal import appender as appender_module
from oncelog.testing.fixtures import StoreTarget

NDJSON = "application/x-ndjson"


def make_journal(client: JournalClient, name: str) -> str:
    client.create(JournalSpec(name, {"content-type": NDJSON}))  # flush_interval 0
    return name


def to(name: str) -> Callable[[Any], tuple[str, str]]:
    return lambda _msg: (name, NDJSON)


def wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    """Bounded polling: True once `predicate()` holds, False after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.002)
    return predicate()


def holds(client: JournalClient, name: str) -> int:
    return client._appender(name)._holds


def test_a_transaction_published_message_by_message_is_one_fragment(
    store_url: StoreTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the first message was written alone as soon as the writer was free (its
    `done()` turned True within milliseconds), the rest in further fragments, the ACK last."""
    monkeypatch.setattr(appender_module, "HOLD_LIMIT", 60.0)
    client = store_url.open()
    try:
        name = make_journal(client, "hold/one")
        pub = Publisher(client)
        for txn in range(3):
            with pub.transaction():
                first = pub.publish_uncommitted(to(name), JSONMessage({"txn": txn, "k": 0}))
                assert holds(client, name) == 1
                # Ample time for an idle writer to take the first message on its own.
                assert not wait_until(first.done, timeout=0.3)
                for k in range(1, 50):
                    pub.publish_uncommitted(to(name), JSONMessage({"txn": txn, "k": k}))
            assert first.done()
            assert holds(client, name) == 0
        fragments = client.fragments(name)
        assert len(fragments) == 3
        for fragment in fragments:  # each: one transaction whole, its ACK last
            data = client.read(name, fragment.begin).read(fragment.end - fragment.begin)
            flags = [parse_uuid_fields(json.loads(line)["uuid"])[2] for line in data.splitlines()]
            assert len(flags) == 51
            assert all(f & Flags.CONTINUE_TXN for f in flags[:-1]) and flags[-1] & Flags.ACK_TXN
        docs = [env.message.doc for env in read_committed(client, name)]
        assert [(d["txn"], d["k"]) for d in docs] == [(t, k) for t in range(3) for k in range(50)]
    finally:
        client.close()


def test_a_held_appender_writes_at_once_for_whoever_waits(
    memory_store: StoreTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another publisher of the same process (same appender) waiting for its committed
    message is not delayed by the open transaction; the transaction still commits."""
    monkeypatch.setattr(appender_module, "HOLD_LIMIT", 60.0)
    client = memory_store.open()
    try:
        name = make_journal(client, "hold/waiter")
        pub, other = Publisher(client), Publisher(client)
        with pub.transaction():
            pub.publish_uncommitted(to(name), JSONMessage({"k": "txn"}))
            started = time.monotonic()
            other.publish_committed(to(name), JSONMessage({"k": "other"})).result(timeout=30)
            assert time.monotonic() - started < 30
        docs = [env.message.doc["k"] for env in read_committed(client, name)]
        assert sorted(docs) == ["other", "txn"]
    finally:
        client.close()


def test_a_held_batch_is_written_after_the_hold_limit(
    memory_store: StoreTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nobody waits and the transaction stays open: the batch still goes out after
    HOLD_LIMIT (a forgotten transaction does not keep other appends unwritten)."""
    monkeypatch.setattr(appender_module, "HOLD_LIMIT", 0.05)
    client = memory_store.open()
    try:
        name = make_journal(client, "hold/limit")
        pub, other = Publisher(client), Publisher(client)
        with pub.transaction():
            pub.publish_uncommitted(to(name), JSONMessage({"k": "txn"}))
            unwaited = other.publish_committed(to(name), JSONMessage({"k": "other"}))
            assert wait_until(unwaited.done, timeout=30)
            assert holds(client, name) == 1
        # Read committed: the transaction's message comes with its ACK, after "other".
        assert [env.message.doc["k"] for env in read_committed(client, name)] == ["other", "txn"]
    finally:
        client.close()


@pytest.mark.parametrize("how", ["exception", "rollback-expired"])
def test_every_hold_is_released_when_the_transaction_ends(
    memory_store: StoreTarget, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Rolled back (an exception in the block, or a keepalive expiring it): the holds of
    every journal written are released, and an append nobody waits for is written."""
    monkeypatch.setattr(appender_module, "HOLD_LIMIT", 600.0)
    client = memory_store.open()
    try:
        names = [make_journal(client, f"hold/end-{i}") for i in range(2)]
        pub, other = Publisher(client), Publisher(client)
        if how == "exception":
            with pytest.raises(RuntimeError, match="boom"):
                with pub.transaction():
                    for name in names:
                        pub.publish_uncommitted(to(name), JSONMessage({"k": name}))
                    assert [holds(client, n) for n in names] == [1, 1]
                    raise RuntimeError("boom")
        else:
            from oncelog.errors import TransactionExpired

            with pytest.raises(TransactionExpired):
                with pub.transaction(keepalive=0.05):
                    for name in names:
                        pub.publish_uncommitted(to(name), JSONMessage({"k": name}))
                    assert wait_until(lambda: pub._expired is not None, timeout=30)
        assert [holds(client, n) for n in names] == [0, 0]
        unwaited = [other.publish_committed(to(n), JSONMessage({"k": "after"})) for n in names]
        assert wait_until(lambda: all(a.done() for a in unwaited), timeout=30)
        for name in names:
            assert [env.message.doc["k"] for env in read_committed(client, name)] == ["after"]
    finally:
        client.close()


def test_unhold_without_hold_is_refused(memory_store: StoreTarget) -> None:
    from oncelog.journal import JournalError

    client = memory_store.open()
    try:
        name = make_journal(client, "hold/unbalanced")
        with pytest.raises(JournalError, match="hold/unbalanced"):
            client._appender(name).unhold()
    finally:
        client.close()
