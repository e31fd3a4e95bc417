"""A single-journal transaction commits in one append: its ACK joins its messages.

`Publisher.transaction()` over one journal (no transactional id) enqueues the ACK behind the
transaction's messages on the journal's appender and waits for the lot once: one fragment,
one claim, when the messages are still spooled at commit. What must hold around it:

- the ACK is never durable unless every message before it is (the appender fails, unwritten,
  every append queued behind a failed batch, the open batch included);
- commit reports the true outcome: not committed (AppendFailed, "nothing was committed"),
  unknown (TransactionError, "unknown outcome") or committed;
- a failed commit never comes back: the publisher continues under a new producer ID, so its
  later ACKs cannot commit messages of the failed transaction that did become durable.

SIGKILL sweeps over the fused path are in test_publisher_fused_crash.py.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable

import pytest
from journal_support import new_journal

from oncelog import JSONMessage, Publisher, read_committed
from oncelog.errors import TransactionError
from oncelog.identity import Flags, parse_uuid_fields
from oncelog.journal import AppendFailed, AppendResult, FragmentSpec, JournalClient, JournalSpec
from oncelog.testing.faults import INTERNAL_ERROR, FaultRule
from oncelog.testing.fixtures import FaultTarget, StoreTarget

NDJSON = "application/x-ndjson"


def make_journal(client: JournalClient, name: str, **fragment: Any) -> str:
    client.create(JournalSpec(name, {"content-type": NDJSON}, fragment=FragmentSpec(**fragment)))
    return name


def to(name: str) -> Callable[[Any], tuple[str, str]]:
    return lambda _msg: (name, NDJSON)


def committed(client: JournalClient, name: str) -> list[dict[str, Any]]:
    docs = [env.message.doc for env in read_committed(client, name)]
    return [{k: v for k, v in d.items() if k != "uuid"} for d in docs]


def frames(client: JournalClient, name: str) -> list[tuple[dict[str, Any], Flags | int]]:
    """Every frame stored in the journal (committed or not) with its UUID flags."""
    out = []
    for line in client.read(name).read().splitlines():
        doc = json.loads(line)
        out.append((doc, parse_uuid_fields(doc["uuid"])[2]))
    return out


def acks(client: JournalClient, name: str) -> list[dict[str, Any]]:
    return [doc for doc, flags in frames(client, name) if flags & Flags.ACK_TXN]


def claims_created(client: JournalClient) -> list[str]:
    """Record the claims the client's backend creates (put-if-absent writes of claims)."""
    backend: Any = client.store.backend
    seen: list[str] = []
    original = backend.create

    def spy(path: Any, *args: Any, **kwargs: Any) -> Any:
        if "/claims/" in str(path):
            seen.append(str(path))
        return original(path, *args, **kwargs)

    backend.create = spy
    return seen


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Bounded polling: True once `predicate()` holds, False after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.002)
    return predicate()


# -- one append per transaction ------------------------------------------------------------


def test_ten_single_journal_transactions_write_ten_fragments(store_url: StoreTarget) -> None:
    """10 transactions of 1 message: 10 fragments and 10 claims (20 of each before: the
    messages were made durable first, the ACK appended after). A long flush_interval keeps
    the appender from writing a batch before someone waits for it, so that the count does
    not depend on thread scheduling."""
    client = store_url.open()
    try:
        name = make_journal(client, "fused/ten", flush_interval=60.0)
        claims = claims_created(client)
        pub = Publisher(client)
        for i in range(10):
            with pub.transaction():
                pub.publish_uncommitted(to(name), JSONMessage({"txn": i}))
        assert len(client.fragments(name)) == 10
        assert len(claims) == 10
        assert committed(client, name) == [{"txn": i} for i in range(10)]
        # Each fragment holds one transaction whole: its message, then its ACK.
        fresh = store_url.open()
        try:
            for fragment in fresh.fragments(name):
                data = fresh.read(name, fragment.begin).read(fragment.end - fragment.begin)
                lines = data.splitlines()
                assert len(lines) == 2
                flags = [parse_uuid_fields(json.loads(line)["uuid"])[2] for line in lines]
                assert flags[0] & Flags.CONTINUE_TXN and flags[1] & Flags.ACK_TXN
        finally:
            fresh.close()
    finally:
        client.close()


def test_a_transaction_of_many_messages_is_one_fragment(memory_store: StoreTarget) -> None:
    client = memory_store.open()
    try:
        name = make_journal(client, "fused/many", flush_interval=60.0)
        pub = Publisher(client)
        with pub.transaction():
            for k in range(5):
                pub.publish_uncommitted(to(name), JSONMessage({"k": k}))
            pub.publish_many(to(name), [{"k": 5}, {"k": 6}])
        assert len(client.fragments(name)) == 1
        assert committed(client, name) == [{"k": k} for k in range(7)]
    finally:
        client.close()


def test_messages_forced_out_first_are_committed_by_a_later_ack(
    memory_store: StoreTarget,
) -> None:
    """A transaction larger than a fragment: its first messages are written while it runs;
    the ACK follows the rest. All committed, the ACK last, in the last fragment."""
    client = memory_store.open()
    try:
        name = make_journal(client, "fused/big", length=300, flush_interval=60.0)
        pub = Publisher(client)
        with pub.transaction():
            for k in range(20):
                pub.publish_uncommitted(to(name), JSONMessage({"k": k, "pad": "x" * 40}))
        fragments = client.fragments(name)
        assert len(fragments) > 2
        assert [k["k"] for k in committed(client, name)] == list(range(20))
        stored = frames(client, name)
        assert [flags & Flags.ACK_TXN for _, flags in stored].count(Flags.ACK_TXN) == 1
        assert stored[-1][1] & Flags.ACK_TXN
    finally:
        client.close()


def test_an_explicit_flush_then_the_ack_as_its_own_append(memory_store: StoreTarget) -> None:
    client = memory_store.open()
    try:
        name = make_journal(client, "fused/flushed", flush_interval=60.0)
        pub = Publisher(client)
        with pub.transaction():
            pub.publish_uncommitted(to(name), JSONMessage({"k": 1}))
            pub.flush()
        assert len(client.fragments(name)) == 2
        assert committed(client, name) == [{"k": 1}]
    finally:
        client.close()


# -- the appender: nothing queued behind a failed batch is written ----------------------------


class GatedFailure:
    """Makes the store's first fragment write (every attempt at it) fail, once `gate` is
    set; `entered` is set when that write begins; any other write, or any write after
    `failing` is cleared, is stored. Installed on `client`'s backend at construction."""

    def __init__(self, client: JournalClient) -> None:
        store_backend: Any = client.store.backend
        backend = store_backend.inner
        self.original = backend.write
        self.entered, self.gate = threading.Event(), threading.Event()
        self.failing = True
        self.doomed: list[str] = []
        backend.write = self.write

    def write(self, path: str, data: Any) -> None:
        if self.failing and (not self.doomed or self.doomed[0] == path):
            self.doomed[:1] = [path]
            self.entered.set()
            assert self.gate.wait(30)
            raise OSError("disk on fire")
        self.original(path, data)


def test_appends_queued_behind_a_failed_batch_are_not_written(memory_store: StoreTarget) -> None:
    """Batch A fails while B (released) and C (being appended) wait in the open batch: both
    fail, unwritten (before, the open batch was written after A failed), and the next append
    is independent of them."""
    client = memory_store.open(retry_timeout=0.2)
    try:
        name = new_journal(client)
        gated = GatedFailure(client)
        entered, gate = gated.entered, gated.gate

        a = client.start_append(name)
        a.write(b"first\n")
        a.release()
        assert entered.wait(30)  # A is in the writer: what follows queues behind it
        b = client.start_append(name)
        b.write(b"second\n")
        b.release()
        c = client.start_append(name)  # holds the write lock while A fails
        c.write(b"third\n")
        gate.set()
        assert wait_until(a.done)
        c.release()
        with pytest.raises(AppendFailed, match="disk on fire"):
            a.result(30)
        for queued in (b, c):
            with pytest.raises(AppendFailed, match="was not made: it was queued behind"):
                queued.result(30)
        gated.failing = False
        assert client.append(name, b"fourth\n") == AppendResult(0, 7)
        assert client.read(name).read() == b"fourth\n"
    finally:
        client.close()


def test_records_of_one_append_many_after_a_failed_run_are_not_written(
    memory_store: StoreTarget,
) -> None:
    """`start_append_many` spools its records in runs, one batch each; the first run's batch
    fails while the call waits for the writer (backpressure): the later runs fail too,
    unwritten (before, they were written after the failed one)."""
    client = memory_store.open(retry_timeout=0.2)
    try:
        name = make_journal(client, "fused/many-runs", length=8)
        store_backend: Any = client.store.backend
        backend = store_backend.inner
        original = backend.write
        first: list[str] = []

        def write(path: str, data: Any) -> None:
            if not first or first[0] == path:  # the first fragment fails, every attempt
                first[:1] = [path]
                raise OSError("disk on fire")
            original(path, data)

        backend.write = write
        appender = client._appender(name)
        appender._limit = 8  # one batch in the writer at most: the call waits between runs
        appender._update_room_locked()
        many = client.start_append_many(name, [b"rec-one\n", b"rec-two\n", b"rec-3rd\n"])
        with pytest.raises(AppendFailed):
            many.result(30)
        assert client.fragments(name) == []
        assert client.append(name, b"after\n") == AppendResult(0, 6)
        assert client.read(name).read() == b"after\n"
    finally:
        client.close()


# -- commit outcomes when storage fails --------------------------------------------------------


def test_messages_failing_behind_an_enqueued_ack_keep_it_from_being_durable(
    memory_store: StoreTarget,
) -> None:
    """The messages are already in the writer (forced out) when the ACK is enqueued, and
    then fail: the ACK's batch fails with them, unwritten; the commit raises saying nothing
    was committed (with the appender writing the open batch after a failure, the ACK was
    durable with its messages missing)."""
    client = memory_store.open(retry_timeout=0.2)
    try:
        name = make_journal(client, "fused/behind")
        gated = GatedFailure(client)
        entered, gate = gated.entered, gated.gate

        pub = Publisher(client)
        appender = client._appender(name)
        outcome: list[BaseException | None] = []

        def transact() -> None:
            try:
                with pub.transaction():
                    pub.publish_uncommitted(to(name), JSONMessage({"k": 1}))
                    assert entered.wait(30)  # the message's fragment is being written
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001 - checked below
                outcome.append(exc)

        thread = threading.Thread(target=transact)
        thread.start()
        # The ACK is released into the open batch behind the message's failing one.
        assert wait_until(lambda: appender._open.used)
        gate.set()
        thread.join(30)
        assert not thread.is_alive()
        (error,) = outcome
        assert isinstance(error, AppendFailed)
        assert "nothing was committed" in str(error) and "'fused/behind'" in str(error)
        gated.failing = False
        assert client.fragments(name) == []
        assert acks(client, name) == []
        # The publisher goes on under a new producer: its next commit is its own only.
        with pub.transaction():
            pub.publish_uncommitted(to(name), JSONMessage({"k": 2}))
        assert committed(client, name) == [{"k": 2}]
    finally:
        client.close()


def test_a_failed_fused_fragment_commits_nothing(s3_fault_proxy: FaultTarget) -> None:
    """The fragment holding the messages and their ACK cannot be written (the store answers
    500 until the retry timeout): the commit raises saying nothing was committed, and the
    journal holds no ACK."""
    client = s3_fault_proxy.open(retries=False, retry_timeout=1.0)
    try:
        name = make_journal(client, "fused/s3fail", flush_interval=60.0)
        pub = Publisher(client)
        rule = s3_fault_proxy.proxy.add_rule(
            FaultRule(INTERNAL_ERROR, method="PUT", key=r"fused/s3fail/.*\.raw$")
        )
        with pytest.raises(AppendFailed, match="nothing was committed") as raised:
            with pub.transaction():
                pub.publish_uncommitted(to(name), JSONMessage({"k": 1}))
                pub.publish_uncommitted(to(name), JSONMessage({"k": 2}))
        assert "'fused/s3fail'" in str(raised.value)
        assert rule.fired >= 1
        s3_fault_proxy.proxy.remove_rule(rule)
        direct = s3_fault_proxy.direct().open()
        try:
            assert direct.fragments(name) == []
            assert acks(direct, name) == []
        finally:
            direct.close()
        with pub.transaction():
            pub.publish_uncommitted(to(name), JSONMessage({"k": 3}))
        assert committed(client, name) == [{"k": 3}]
    finally:
        client.close()


def test_an_ack_whose_claim_outcome_is_unknown_says_so(s3_fault_proxy: FaultTarget) -> None:
    """The claim of the fragment holding the ACK keeps failing: it may exist, so the commit
    raises TransactionError saying its outcome is unknown (before: a bare AppendFailed)."""
    client = s3_fault_proxy.open(retries=False, retry_timeout=1.0)
    try:
        name = make_journal(client, "fused/unknown", flush_interval=60.0)
        pub = Publisher(client)
        rule = s3_fault_proxy.proxy.add_rule(
            FaultRule(INTERNAL_ERROR, method="PUT", key=r"\.oncelog/claims/fused/unknown/")
        )
        with pytest.raises(TransactionError, match="unknown outcome") as raised:
            with pub.transaction():
                pub.publish_uncommitted(to(name), JSONMessage({"k": 1}))
        assert "'fused/unknown'" in str(raised.value)
        assert rule.fired >= 1
        s3_fault_proxy.proxy.remove_rule(rule)
        assert not pub.fenced
        with pub.transaction():
            pub.publish_uncommitted(to(name), JSONMessage({"k": 2}))
        assert committed(client, name) == [{"k": 2}]
    finally:
        client.close()


def test_a_failed_ack_never_lets_a_later_commit_take_its_messages(
    s3_fault_proxy: FaultTarget,
) -> None:
    """The messages are durable (flushed), the ACK's fragment cannot be written: nothing
    committed, and the publisher's next transaction commits its own message only (before,
    its ACK, at a higher clock under the same producer, committed the stranded one too)."""
    client = s3_fault_proxy.open(retries=False, retry_timeout=1.0)
    try:
        name = make_journal(client, "fused/stranded", flush_interval=60.0)
        pub = Publisher(client)
        rule = FaultRule(INTERNAL_ERROR, method="PUT", key=r"fused/stranded/.*\.raw$")
        with pytest.raises(AppendFailed, match="nothing was committed"):
            with pub.transaction():
                pub.publish_uncommitted(to(name), JSONMessage({"k": 1}))
                pub.flush()  # durable, pending
                s3_fault_proxy.proxy.add_rule(rule)
        assert rule.fired >= 1
        s3_fault_proxy.proxy.remove_rule(rule)
        assert committed(client, name) == []
        with pub.transaction():
            pub.publish_uncommitted(to(name), JSONMessage({"k": 2}))
        assert committed(client, name) == [{"k": 2}]
    finally:
        client.close()


def test_multi_journal_and_transactional_id_commits_are_unchanged(
    memory_store: StoreTarget,
) -> None:
    """Not fused: several journals keep their record protocol (messages durable first, then
    each ACK its own append); a transactional id writes its record before the ACK."""
    client = memory_store.open()
    try:
        a = make_journal(client, "fused/a", flush_interval=60.0)
        b = make_journal(client, "fused/b", flush_interval=60.0)
        pub = Publisher(client)
        with pub.transaction():
            pub.publish_uncommitted(to(a), JSONMessage({"j": "a"}))
            pub.publish_uncommitted(to(b), JSONMessage({"j": "b"}))
        assert [len(client.fragments(n)) for n in (a, b)] == [2, 2]
        tid = Publisher(client, transactional_id="fused-svc")
        with tid.transaction():
            tid.publish_uncommitted(to(a), JSONMessage({"j": "a2"}))
        assert len(client.fragments(a)) == 4
        assert committed(client, a) == [{"j": "a"}, {"j": "a2"}]
        assert committed(client, b) == [{"j": "b"}]
    finally:
        client.close()
