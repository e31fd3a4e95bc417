"""Atomic transactions across journals: records, roll-forward, transactional ids and
fencing, keepalive expiry, atomic broadcast and append_messages, and SIGKILLed publishers."""

from __future__ import annotations

import json
import random
import signal
import sys
import threading
from typing import Any

import pytest

from oncelog import JSONMessage, Publisher, read_committed
from oncelog.errors import FencedOut
from oncelog.journal import JournalClient, JournalSpec
from oncelog.mapping import PolledList
from oncelog.publisher import TransactionError, TransactionExpired
from oncelog.testing.fixtures import StoreTarget
from oncelog.testing.processes import run_python
from oncelog.transactions import (
    TransactionalLog,
    append_intents,
    pending_records,
    recover_pending,
)

NDJSON = "application/x-ndjson"


def make_journals(client: JournalClient, n: int, prefix: str = "tx") -> list[str]:
    names = [f"{prefix}/part-{i:03d}" for i in range(n)]
    for name in names:
        client.create(JournalSpec(name, {"content-type": NDJSON}))
    return names


def to(name: str) -> Any:
    return lambda _msg: (name, NDJSON)


def by_field(msg: JSONMessage) -> tuple[str, str]:
    return msg.doc["to"], NDJSON


def committed_docs(client: JournalClient, journal: str) -> list[dict[str, Any]]:
    return [env.message.doc for env in read_committed(client, journal)]


def count_calls(client: JournalClient, method: str) -> list[str]:
    """Record the paths passed to the backend's `method`."""
    backend = client.store.backend
    seen: list[str] = []
    original = getattr(backend, method)

    def spy(path: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(str(path))
        return original(path, *args, **kwargs)

    setattr(backend, method, spy)
    return seen


# -- records and roll-forward ------------------------------------------------------------


def test_single_journal_commit_is_one_append_and_writes_no_record(
    store_url: StoreTarget,
) -> None:
    client = store_url.open()
    (name,) = make_journals(client, 1)
    pub = Publisher(client)
    creates = count_calls(client, "create")
    with pub.transaction():
        pub.publish_uncommitted(to(name), JSONMessage({"n": 1}))
    assert not [p for p in creates if "/txns/" in p]
    docs = committed_docs(client, name)
    assert docs == [{"n": 1, "uuid": docs[0]["uuid"]}]
    client.close()


def test_multi_journal_commit_records_then_retires(store_url: StoreTarget) -> None:
    client = store_url.open()
    names = make_journals(client, 3)
    pub = Publisher(client)
    creates = count_calls(client, "create")
    with pub.transaction():
        for i, name in enumerate(names):
            pub.publish_uncommitted(to(name), JSONMessage({"n": i}))
    records = [p for p in creates if "/txns/pending/" in p]
    assert len(records) == 2  # the record and its settle marker
    assert pending_records(client) == []
    assert client.meta.list("txns/pending") == []
    for i, name in enumerate(names):
        assert [d["n"] for d in committed_docs(client, name)] == [i]
    client.close()


def test_commit_cut_short_between_acks_is_rolled_forward(store_url: StoreTarget) -> None:
    client = store_url.open()
    names = make_journals(client, 3)
    pub = Publisher(client)
    import oncelog.transactions as txmod

    real = txmod.append_intents
    calls = {"n": 0}

    def crash_after_first(client_: JournalClient, intents: Any) -> Any:
        calls["n"] += 1
        real(client_, list(intents)[:1])  # the first ACK lands, then the "crash"
        raise ConnectionError("process died")

    txmod.append_intents = crash_after_first  # type: ignore[assignment]
    try:
        with pytest.raises(TransactionError, match="committed.*txns recover"):
            with pub.transaction():
                for i, name in enumerate(names):
                    pub.publish_uncommitted(to(name), JSONMessage({"n": i}))
    finally:
        txmod.append_intents = real  # type: ignore[assignment]
    # A mix is visible until someone rolls the record forward...
    assert [len(committed_docs(client, n)) for n in names] == [1, 0, 0]
    (record,) = pending_records(client)
    assert record.intent_journals == names
    other = store_url.open()
    assert [r.path for r in recover_pending(other)] == [record.path]
    for i, name in enumerate(names):
        assert [d["n"] for d in committed_docs(other, name)] == [i]
    assert pending_records(other) == []
    # The publisher refuses to go on under its old producer after an unknown outcome.
    with pytest.raises(TransactionError, match="new publisher"):
        with pub.transaction():
            pass
    other.close()
    client.close()


def test_publisher_that_loses_its_settle_marker_moves_to_a_new_producer(
    memory_store: StoreTarget,
) -> None:
    """A recoverer that settled a record may append its ACKs at any later time: the
    publisher then continues under a new producer ID, so a late ACK of the old one cannot
    roll back the publisher's next transaction."""
    client = memory_store.open()
    names = make_journals(client, 2)
    pub = Publisher(client)
    import oncelog.transactions as txmod

    real_settle = txmod.settle
    taken: list[Any] = []

    def recoverer_settles_first(client_: JournalClient, record: Any, who: str) -> bool:
        assert real_settle(client_, record, "recover")  # a recoverer wins the marker...
        taken.append(record)  # ...and is slow to append the ACKs
        return real_settle(client_, record, who)

    first = pub.producer_id
    txmod.settle = recoverer_settles_first  # type: ignore[assignment]
    try:
        with pub.transaction():
            for name in names:
                pub.publish_uncommitted(to(name), JSONMessage({"n": 1}))
    finally:
        txmod.settle = real_settle  # type: ignore[assignment]
    assert pub.producer_id != first
    with pub.transaction():
        for name in names:
            pub.publish_uncommitted(to(name), JSONMessage({"n": 2}))
    pub._in_transaction = True  # a third transaction, open when the late ACKs land
    for name in names:
        pub.publish_uncommitted(to(name), JSONMessage({"n": 3}))
    pub.flush()
    append_intents(client, taken[0].intents)  # the recoverer's late re-append
    pub._in_transaction = False
    pub.append_intents(pub.build_ack_intents())
    for name in names:
        assert [d["n"] for d in committed_docs(client, name)] == [1, 2, 3]
    client.close()


# -- atomic broadcast and append_messages ---------------------------------------------------


def test_broadcast_and_append_messages_are_atomic(store_url: StoreTarget) -> None:
    client = store_url.open()
    names = make_journals(client, 3)
    pub = Publisher(client)
    parts = PolledList(client, "name:prefix=tx/", interval=3600)
    pub.broadcast(parts, JSONMessage({"all": True}))
    for name in names:
        assert [d["all"] for d in committed_docs(client, name)] == [True]
    results = pub.append_messages(
        by_field, [JSONMessage({"to": names[i % 3], "i": i}) for i in range(7)]
    )
    assert len(results) == 7 and all(r.end > r.begin for r in results)
    for k, name in enumerate(names):
        assert [d["i"] for d in committed_docs(client, name) if "i" in d] == list(range(k, 7, 3))
    # A failing message rolls the whole batch back.

    class Bad(JSONMessage):
        def validate(self) -> None:
            raise ValueError("bad message")

    with pytest.raises(ValueError, match="bad message"):
        batch = [JSONMessage({"to": names[0], "x": 1}), Bad({"to": names[1]})]
        pub.append_messages(by_field, batch)
    assert not [d for d in committed_docs(client, names[0]) if "x" in d]
    parts.close()
    client.close()


# -- keepalive -----------------------------------------------------------------------------


def test_transaction_expires_after_its_keepalive(memory_store: StoreTarget) -> None:
    client = memory_store.open()
    names = make_journals(client, 2)
    pub = Publisher(client)
    expired = threading.Event()
    original = pub._expire

    def expire(seconds: float) -> None:
        original(seconds)
        expired.set()

    pub._expire = expire  # type: ignore[method-assign]
    with pytest.raises(TransactionExpired, match="keepalive of 0.2 s"):
        with pub.transaction(keepalive=0.2):
            pub.publish_uncommitted(to(names[0]), JSONMessage({"n": 1}))
            assert expired.wait(10)
            pub.publish_uncommitted(to(names[1]), JSONMessage({"n": 2}))
    for name in names:
        assert committed_docs(client, name) == []
    with pub.transaction(keepalive=30):  # the publisher is usable again
        pub.publish_uncommitted(to(names[0]), JSONMessage({"n": 3}))
    assert [d["n"] for d in committed_docs(client, names[0])] == [3]
    with pytest.raises(ValueError, match="keepalive"):
        with pub.transaction(keepalive=0):
            pass
    client.close()


# -- transactional ids ----------------------------------------------------------------------


def test_new_instance_fences_the_old_one(store_url: StoreTarget) -> None:
    client = store_url.open()
    names = make_journals(client, 2)
    old = Publisher(client, transactional_id="orders-svc")
    with old.transaction():
        for name in names:
            old.publish_uncommitted(to(name), JSONMessage({"who": "old", "n": 1}))
    with pytest.raises(FencedOut, match="orders-svc"):
        with old.transaction():
            for name in names:
                old.publish_uncommitted(to(name), JSONMessage({"who": "old", "n": 2}))
            new = Publisher(client, transactional_id="orders-svc")  # takes over meanwhile
    assert old.fenced
    with new.transaction():
        for name in names:
            new.publish_uncommitted(to(name), JSONMessage({"who": "new", "n": 3}))
    for name in names:
        assert [(d["who"], d["n"]) for d in committed_docs(client, name)] == [
            ("old", 1),
            ("new", 3),
        ]
    with pytest.raises(FencedOut):
        old.publish_uncommitted(to(names[0]), JSONMessage({"who": "old", "n": 4}))
    client.close()


def test_zombie_is_fenced_even_after_its_seq_was_pruned(memory_store: StoreTarget) -> None:
    client = memory_store.open()
    (name,) = make_journals(client, 1)
    zombie = Publisher(client, transactional_id="svc", keep_records=2)
    with zombie.transaction():
        zombie.publish_uncommitted(to(name), JSONMessage({"who": "zombie", "n": 0}))
    live = Publisher(client, transactional_id="svc", keep_records=2)
    for n in range(1, 8):
        with live.transaction():
            live.publish_uncommitted(to(name), JSONMessage({"who": "live", "n": n}))
    log = TransactionalLog(client, "svc")
    assert zombie._seq + 1 not in log.seqs()  # the zombie's next seq was pruned
    with pytest.raises(FencedOut):
        with zombie.transaction():
            zombie.publish_uncommitted(to(name), JSONMessage({"who": "zombie", "n": 99}))
    assert [d["n"] for d in committed_docs(client, name)] == list(range(8))
    client.close()


def test_new_instance_rolls_back_what_the_old_one_left_uncommitted(
    store_url: StoreTarget,
) -> None:
    client = store_url.open()
    names = make_journals(client, 3)
    old = Publisher(client, transactional_id="svc")
    # An open transaction, never committed: its writer "dies".
    for name in names:
        with pytest.raises(RuntimeError):
            with old.transaction():
                old.publish_uncommitted(to(name), JSONMessage({"n": -1}))
                raise RuntimeError("rolled back explicitly")
    old._in_transaction = True  # the dead process's transaction, left open
    for name in names:
        old.publish_uncommitted(to(name), JSONMessage({"n": 0}))
    old.flush()
    new = Publisher(client, transactional_id="svc")
    with new.transaction():
        new.publish_uncommitted(to(names[0]), JSONMessage({"n": 1}))
    assert [d["n"] for d in committed_docs(client, names[0])] == [1]
    assert committed_docs(client, names[1]) == []
    # The leftovers are rolled back, not merely pending: a reader's checkpoint holds no
    # pending span of the old producer.
    from oncelog.sequencer import Sequencer

    seq = Sequencer()
    list(read_committed(client, names[1], sequencer=seq))
    _, states = seq.checkpoint()
    assert all(s.begin == -1 for s in states)
    client.close()


# -- SIGKILLed publishers: all journals or none --------------------------------------------

CHILD = r"""
import json, os, signal, sys
from oncelog import JSONMessage, Publisher, open_journals

url, options, tid, names, kill_at, txn = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], \
    sys.argv[4].split(","), int(sys.argv[5]), int(sys.argv[6])
client = open_journals(url, **options)
from oncelog.testing.faults import kill_after_writes
writes = kill_after_writes(client, kill_at)
pub = Publisher(client, transactional_id=tid.split("+")[0] or None)
if tid.endswith("+broadcast"):
    specs = [client.get(name) for name in names]
    pub.broadcast(lambda: specs, JSONMessage({"txn": txn}))
else:
    with pub.transaction():
        for name in names:
            pub.publish_uncommitted(lambda m, n=name: (n, "application/x-ndjson"),
                                    JSONMessage({"txn": txn, "to": name}))
print("done", writes(), flush=True)
"""


def _run_child(target: StoreTarget, tid: str, names: list[str], kill_at: int, txn: int) -> str:
    proc = run_python(
        [
            sys.executable,
            "-c",
            CHILD,
            target.url,
            json.dumps(target.storage_options),
            tid,
            ",".join(names),
            str(kill_at),
            str(txn),
        ],
        text=True,
        timeout=120,
    )
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"child failed: {proc.returncode}\n{proc.stderr}")
    return "killed" if proc.returncode == -signal.SIGKILL else "done"


def _kill_runs(target: StoreTarget, runs: int, seed: int) -> None:
    rng = random.Random(seed)
    client = target.open()
    names = make_journals(client, 5)
    outcomes = {"killed": 0, "done": 0, "mixed before recovery": 0}

    def counts(chosen: list[str], run: int) -> list[int]:
        return [
            len([d for d in committed_docs(client, name) if d.get("txn") == run])
            for name in chosen
        ]

    for run in range(runs):
        k = rng.randint(2, 5)
        chosen = rng.sample(names, k)
        tid = rng.choice(["", "svc-a", "svc-b", "+broadcast", "svc-a+broadcast"])
        # A commit over k journals makes about 7k + 2 storage writes: kill at any of them.
        status = _run_child(target, tid, chosen, rng.randint(1, 7 * k + 4), run)
        outcomes[status] += 1
        if len(set(counts(chosen, run))) > 1:
            outcomes["mixed before recovery"] += 1
        # Recovery: a new instance with the id, or the pending records' roll-forward.
        if tid.split("+")[0]:
            Publisher(client, transactional_id=tid.split("+")[0])
        else:
            recover_pending(client)
        after = counts(chosen, run)
        assert after in ([1] * k, [0] * k), (run, tid, status, after)
        if status == "done":
            assert after == [1] * k
    # The runs must really have been cut (at every stage: the kill point is uniform over
    # the commit's writes; a cut between two journals' ACKs is shown mixed above, when the
    # two ACK appends, which run concurrently, are far enough apart).
    assert outcomes["killed"] >= runs // 2, outcomes
    client.close()


@pytest.mark.slow
@pytest.mark.fault
def test_sigkilled_publishers_commit_all_journals_or_none_local(local_store: StoreTarget) -> None:
    """24 runs of transactions and broadcasts over 2-5 journals, with and without a
    transactional id, each SIGKILLed after a random one of its storage writes."""
    _kill_runs(local_store, runs=24, seed=11)


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.s3
def test_sigkilled_publishers_commit_all_journals_or_none_s3(s3_store: StoreTarget) -> None:
    _kill_runs(s3_store, runs=8, seed=12)


def test_cli_txns_list_and_recover(local_store: StoreTarget) -> None:
    from click.testing import CliRunner

    from oncelog.cli import cli

    client = local_store.open()
    names = make_journals(client, 2)
    pub = Publisher(client)
    import oncelog.transactions as txmod

    real = txmod.append_intents

    def die(client_: JournalClient, intents: Any) -> Any:
        raise ConnectionError("died before the ACKs")

    txmod.append_intents = die  # type: ignore[assignment]
    try:
        with pytest.raises(TransactionError):
            with pub.transaction():
                for name in names:
                    pub.publish_uncommitted(to(name), JSONMessage({"n": 1}))
    finally:
        txmod.append_intents = real  # type: ignore[assignment]
    Publisher(client, transactional_id="svc-x")
    runner = CliRunner()
    listed = runner.invoke(cli, ["--store", local_store.url, "txns", "list", "--format", "json"])
    assert listed.exit_code == 0, listed.output
    docs = json.loads(listed.stdout)
    assert [d["status"] for d in docs] == ["pending", "id svc-x #1"]
    assert docs[0]["journals"] == names
    done = runner.invoke(cli, ["--store", local_store.url, "txns", "recover", "--yes"])
    assert done.exit_code == 0, done.output
    assert "1 pending commit rolled forward" in done.output
    for name in names:
        assert [d["n"] for d in committed_docs(client, name)] == [1]
    assert append_intents(client, []) == []
    client.close()
