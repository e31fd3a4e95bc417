"""Publisher: committed and transactional publishing, ACK intents, rollback, validation."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from oncelog.framing import CONTENT_TYPE_JSON_LINES
from oncelog.journal import JournalClient, JournalSpec
from oncelog.mapping import EmptyPartitions, modulo
from oncelog.message import Clock, Flags, JSONMessage
from oncelog.publisher import Publisher, TransactionError
from oncelog.reading import read_committed, read_uncommitted

JSON = {"content-type": CONTENT_TYPE_JSON_LINES}


def to(journal: str):
    return lambda _msg: (journal, CONTENT_TYPE_JSON_LINES)


def committed_docs(client: JournalClient, journal: str) -> list[Any]:
    return [env.message.doc["n"] for env in read_committed(client, journal)]


@pytest.fixture
def client(store_url) -> Any:
    c = store_url.open()
    c.create(JournalSpec("out/a", labels=JSON))
    c.create(JournalSpec("out/b", labels=JSON))
    yield c
    c.close()


def test_committed_messages_are_visible_at_once(client: JournalClient) -> None:
    pub = Publisher(client)
    appends = [pub.publish_committed(to("out/a"), JSONMessage({"n": i})) for i in range(5)]
    results = [a.result() for a in appends]
    assert [r.begin for r in results] == sorted(r.begin for r in results)
    assert committed_docs(client, "out/a") == [0, 1, 2, 3, 4]
    envs = list(read_uncommitted(client, "out/a"))
    assert {e.producer for e in envs} == {pub.producer_id}
    assert all(e.flags is Flags.OUTSIDE_TXN for e in envs)
    clocks = [e.clock for e in envs]
    assert clocks == sorted(clocks) and len(set(clocks)) == 5


def test_transaction_commits_every_journal(client: JournalClient) -> None:
    pub = Publisher(client)
    with pub.transaction():
        pub.publish_uncommitted(to("out/a"), JSONMessage({"n": 1}))
        pub.publish_uncommitted(to("out/b"), JSONMessage({"n": 2}))
        pub.publish_uncommitted(to("out/a"), JSONMessage({"n": 3}))
        client.flush()
        # Before the commit, read-committed sees nothing; read-uncommitted sees all.
        assert committed_docs(client, "out/a") == []
        assert [e.flags for e in read_uncommitted(client, "out/a")] == [Flags.CONTINUE_TXN] * 2
    assert committed_docs(client, "out/a") == [1, 3]
    assert committed_docs(client, "out/b") == [2]
    acks = [e for e in read_uncommitted(client, "out/a") if e.flags is Flags.ACK_TXN]
    assert len(acks) == 1 and acks[0].producer == pub.producer_id


def test_exception_rolls_back_the_transaction(client: JournalClient) -> None:
    pub = Publisher(client)
    pub.publish_committed(to("out/a"), JSONMessage({"n": 0}))
    with pytest.raises(KeyError):
        with pub.transaction():
            pub.publish_uncommitted(to("out/a"), JSONMessage({"n": 1}))
            pub.publish_uncommitted(to("out/b"), JSONMessage({"n": 2}))  # first ever in out/b
            raise KeyError("boom")
    with pub.transaction():
        pub.publish_uncommitted(to("out/a"), JSONMessage({"n": 3}))
        pub.publish_uncommitted(to("out/b"), JSONMessage({"n": 4}))
    assert committed_docs(client, "out/a") == [0, 3]
    assert committed_docs(client, "out/b") == [4]


def test_rollback_then_later_ack_cannot_resurrect(client: JournalClient) -> None:
    # A rolled-back transaction stays rolled back even though a later ACK carries a larger clock.
    pub = Publisher(client)
    for n in range(3):
        try:
            with pub.transaction():
                pub.publish_uncommitted(to("out/a"), JSONMessage({"n": n}))
                if n == 1:
                    raise RuntimeError("abort")
        except RuntimeError:
            pass
    assert committed_docs(client, "out/a") == [0, 2]


def test_build_ack_intents_one_per_journal(client: JournalClient) -> None:
    pub = Publisher(client)
    pub.publish_uncommitted(to("out/a"), JSONMessage({"n": 1}))
    pub.publish_uncommitted(to("out/a"), JSONMessage({"n": 2}))
    pub.publish_uncommitted(to("out/b"), JSONMessage({"n": 3}))
    assert sorted(pub.pending_journals()) == ["out/a", "out/b"]
    intents = pub.build_ack_intents()
    assert sorted(i.journal for i in intents) == ["out/a", "out/b"]
    assert pub.build_ack_intents() == []  # nothing pending any more
    pub.flush()
    assert committed_docs(client, "out/a") == []
    pub.append_intents(intents)
    assert committed_docs(client, "out/a") == [1, 2]
    ack_clock = [e for e in read_uncommitted(client, "out/a") if e.flags is Flags.ACK_TXN][0].clock
    envs = read_uncommitted(client, "out/a")
    msg_clocks = [e.clock for e in envs if e.flags is Flags.CONTINUE_TXN]
    assert ack_clock > max(msg_clocks)


def test_transaction_refuses_nesting_and_stray_uncommitted(client: JournalClient) -> None:
    pub = Publisher(client)
    with pub.transaction():
        with pytest.raises(TransactionError, match="already open"):
            with pub.transaction():
                pass
    pub.publish_uncommitted(to("out/a"), JSONMessage({"n": 1}))
    with pytest.raises(TransactionError, match="out/a"):
        with pub.transaction():
            pass


def test_invalid_message_is_not_published(client: JournalClient) -> None:
    class Checked(JSONMessage):
        __slots__ = ()

        def validate(self) -> None:
            if self.doc.get("n", 0) < 0:
                raise ValueError(f"n must be >= 0, got {self.doc['n']}")

    pub = Publisher(client)
    with pytest.raises(ValueError, match="n must be >= 0, got -1"):
        pub.publish_committed(to("out/a"), Checked({"n": -1}))
    pub.publish_committed(to("out/a"), Checked({"n": 1})).result()
    assert committed_docs(client, "out/a") == [1]


def test_mapping_errors_publish_nothing(client: JournalClient) -> None:
    pub = Publisher(client)
    mapping = modulo(lambda m: str(m.doc["n"]), lambda: [])
    with pytest.raises(EmptyPartitions):
        pub.publish_committed(mapping, JSONMessage({"n": 1}))
    assert client.head("out/a") == 0 and client.head("out/b") == 0


def test_broadcast_and_modulo_mapping(client: JournalClient) -> None:
    parts = lambda: client.list("name:prefix=out/")  # noqa: E731
    pub = Publisher(client)
    for a in pub.broadcast(parts, JSONMessage({"n": "all"})):
        a.result()
    mapping = modulo(lambda m: str(m.doc["n"]), parts)
    for n in range(20):
        pub.publish_committed(mapping, JSONMessage({"n": n}))
    pub.flush()
    a, b = committed_docs(client, "out/a"), committed_docs(client, "out/b")
    assert a[0] == "all" and b[0] == "all"
    assert sorted(a[1:] + b[1:]) == list(range(20))
    assert a[1:] and b[1:]  # both partitions used


def test_external_clock_is_not_auto_updated(client: JournalClient) -> None:
    clock = Clock(1000 << 4)
    pub = Publisher(client, clock=clock)
    pub.publish_committed(to("out/a"), JSONMessage({"n": 1})).result()
    assert [e.clock for e in read_uncommitted(client, "out/a")] == [(1000 << 4) + 1]


def test_concurrent_committed_publishing_keeps_clock_order(client: JournalClient) -> None:
    pub = Publisher(client)
    barrier = threading.Barrier(4)

    def work(t: int) -> None:
        barrier.wait()
        for i in range(100):
            pub.publish_committed(to("out/a"), JSONMessage({"n": t * 1000 + i}))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    pub.flush()
    envs = list(read_uncommitted(client, "out/a"))
    clocks = [e.clock for e in envs]
    assert clocks == sorted(clocks)  # journal order is clock order for one producer
    assert sorted(committed_docs(client, "out/a")) == sorted(
        t * 1000 + i for t in range(4) for i in range(100)
    )
