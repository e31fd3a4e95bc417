"""Reading many journals: merged streams by label selector and time-ordered packs."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

from oncelog.framing import CONTENT_TYPE_JSON_LINES
from oncelog.journal import JournalClient, JournalSpec
from oncelog.merge import read_selector, read_time_ordered
from oncelog.message import Clock, JSONMessage, clock_to_unix_ns
from oncelog.publisher import Publisher

BASE = 1_900_000_000 * 10**9  # Unix ns of the first tick used below
SECOND = 10**9


def make(client: JournalClient, name: str, app: str = "clicks") -> str:
    client.create(JournalSpec(name, labels={"content-type": CONTENT_TYPE_JSON_LINES, "app": app}))
    return name


def to(journal: str):
    return lambda _m: (journal, CONTENT_TYPE_JSON_LINES)


@pytest.fixture
def client(memory_store) -> Any:
    c = memory_store.open()
    yield c
    c.close()


class TimedPublisher:
    """A publisher whose clock is set to given times (seconds after BASE)."""

    def __init__(self, client: JournalClient) -> None:
        self.clock = Clock()
        self.pub = Publisher(client, clock=self.clock)

    def at(self, seconds: float) -> Publisher:
        self.clock.update(BASE + int(seconds * SECOND))
        return self.pub


def test_read_selector_merges_matching_journals(store_url) -> None:
    client = store_url.open()
    names = [make(client, f"merge/part-{i}") for i in range(3)]
    make(client, "other/x", app="views")
    pub = Publisher(client)
    for i in range(30):
        pub.publish_committed(to(names[i % 3]), JSONMessage({"n": i}))
    pub.publish_committed(to("other/x"), JSONMessage({"n": -1}))
    pub.flush()
    envs = list(read_selector(client, "app=clicks"))
    assert sorted(e.message.doc["n"] for e in envs) == list(range(30))
    for name in names:
        mine = [e.message.doc["n"] for e in envs if e.journal == name]
        assert mine == sorted(mine)  # per-journal order kept
    client.close()


def test_read_selector_tails_and_picks_up_new_journals(client: JournalClient) -> None:
    make(client, "tail/a")
    pub = Publisher(client)
    got: list[int] = []
    enough = threading.Event()
    stream = read_selector(client, "app=clicks", block=True, poll_interval=0.05)

    def consume() -> None:
        for env in stream:
            got.append(env.message.doc["n"])
            if len(got) == 3:
                enough.set()
                return

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    pub.publish_committed(to("tail/a"), JSONMessage({"n": 1})).result()
    make(client, "tail/b")  # created after reading started
    pub.publish_committed(to("tail/b"), JSONMessage({"n": 2})).result()
    pub.publish_committed(to("tail/a"), JSONMessage({"n": 3})).result()
    assert enough.wait(30), f"saw only {got}"
    t.join(10)
    stream.close()
    assert sorted(got) == [1, 2, 3]


def test_time_ordered_packs(client: JournalClient) -> None:
    a, b, c = (make(client, f"time/{x}") for x in "abc")
    pa, pb, pc = TimedPublisher(client), TimedPublisher(client), TimedPublisher(client)
    pa.at(0.1).publish_committed(to(a), JSONMessage({"n": "a0.1"}))
    pb.at(0.5).publish_committed(to(b), JSONMessage({"n": "b0.5"}))
    pa.at(1.2).publish_committed(to(a), JSONMessage({"n": "a1.2"}))
    pc.at(0.9).publish_committed(to(c), JSONMessage({"n": "c0.9"}))
    pc.at(3.5).publish_committed(to(c), JSONMessage({"n": "c3.5"}))
    pb.at(1.7).publish_committed(to(b), JSONMessage({"n": "b1.7"}))
    # A transaction begun at 2.1 s and committed at 6 s: its message commits "late".
    txn = pa.at(2.1)
    txn.publish_uncommitted(to(a), JSONMessage({"n": "a2.1-txn"}))
    pa.at(3.0).flush()
    pa.at(6.0).append_intents(txn.build_ack_intents())
    for p in (pa, pb, pc):
        p.pub.flush()

    packs = list(read_time_ordered(client, "app=clicks", timedelta(seconds=1)))
    seconds = [(clock_to_unix_ns(p.begin_clock) - BASE) // SECOND for p in packs]
    contents = [[e.message.doc["n"] for e in p.envelopes] for p in packs]
    late = [[e.message.doc["n"] for e in p.late] for p in packs]
    delivered = [n for p in contents for n in p] + [n for p in late for n in p]
    assert sorted(delivered) == sorted(
        ["a0.1", "b0.5", "c0.9", "a1.2", "b1.7", "c3.5", "a2.1-txn"]
    )
    assert contents[0] == ["a0.1", "b0.5", "c0.9"]  # sorted by clock across journals
    assert contents[1] == ["a1.2", "b1.7"]
    for pack in packs:
        assert all(pack.begin_clock <= e.clock < pack.end_clock for e in pack.envelopes)
        assert [e.clock for e in pack.envelopes] == sorted(e.clock for e in pack.envelopes)
    begins = [p.begin_clock for p in packs]
    assert begins == sorted(begins) and len(set(begins)) == len(begins)
    assert seconds[:2] == [0, 1]
    # The late transaction either fell in its own tick or arrived late: never lost or doubled.
    assert delivered.count("a2.1-txn") == 1


def test_time_ordered_blocking_waits_for_every_journal(client: JournalClient) -> None:
    a, b = make(client, "wait/a"), make(client, "wait/b")
    pa, pb = TimedPublisher(client), TimedPublisher(client)
    packs: list[list[str]] = []
    first = threading.Event()
    stream = read_time_ordered(client, "app=clicks", timedelta(seconds=1), block=True)

    def consume() -> None:
        for pack in stream:
            packs.append([e.message.doc["n"] for e in pack.envelopes])
            first.set()
            return

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    pa.at(10.2).publish_committed(to(a), JSONMessage({"n": "a10.2"})).result()
    pa.at(11.5).publish_committed(to(a), JSONMessage({"n": "a11.5"})).result()
    pb.at(10.7).publish_committed(to(b), JSONMessage({"n": "b10.7"})).result()
    assert not first.is_set() or packs == [["a10.2", "b10.7"]]
    pb.at(11.1).publish_committed(to(b), JSONMessage({"n": "b11.1"})).result()  # b passes 11 s
    assert first.wait(30)
    t.join(10)
    stream.close()
    assert packs == [["a10.2", "b10.7"]]


def test_time_ordered_idle_journals_pass_time_through_idle_ticks(client: JournalClient) -> None:
    """A journal that writes nothing holds packs back, unless `idle` says how far it has
    passed (the streaming node's heartbeat ticks); then only once it was read that far."""
    from oncelog.message import clock_from_unix_ns

    a, b = make(client, "idle/a"), make(client, "idle/b")
    TimedPublisher(client).at(10.2).publish_committed(to(a), JSONMessage({"n": "a"})).result()
    asked: list[str] = []
    passed = {a: (client.head(a), clock_from_unix_ns(BASE + 12 * SECOND)),
              b: (0, clock_from_unix_ns(BASE + 12 * SECOND))}

    def idle(journal: str) -> tuple[int, int] | None:
        asked.append(journal)
        return passed[journal]

    stream = read_time_ordered(client, "app=clicks", timedelta(seconds=1), block=True,
                               idle=idle)
    packs: list[list[str]] = []
    done = threading.Event()

    def consume() -> None:
        for pack in stream:
            packs.append([e.message.doc["n"] for e in pack.envelopes])
            done.set()
            return

    threading.Thread(target=consume, daemon=True).start()
    assert done.wait(30)
    stream.close()
    assert packs == [["a"]] and {a, b} <= set(asked)


def test_bad_tick_is_rejected(client: JournalClient) -> None:
    make(client, "x/a")
    with pytest.raises(ValueError, match="tick must be positive"):
        list(read_time_ordered(client, "", 0))
