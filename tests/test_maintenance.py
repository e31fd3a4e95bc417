"""Exactly once after maintenance: writers, readers and consumers left idle while their
journal is compacted, retired and trimmed keep every acknowledged append, see every new
one, and report every message at the offsets it was first written at."""

from __future__ import annotations

from typing import Any

import pytest

from oncelog import JSONMessage, Publisher, Sequencer, read_committed, read_uncommitted
from oncelog.journal import JournalClient, compaction
from oncelog.journal.errors import OffsetNotAvailable
from oncelog.testing.fixtures import StoreTarget
from tests.journal_support import new_journal


def msg(i: int, who: str = "o") -> bytes:
    return b'{"w": "%s", "n": %d}\n' % (who.encode(), i)


def read_all(client: JournalClient, name: str, offset: int = 0) -> tuple[int, bytes]:
    """(the offset reading started at, the bytes) of a fresh read."""
    with client.read(name, offset) as reader:
        start = reader.offset
        return start, reader.read()


def compact_and_retire(client: JournalClient, name: str) -> None:
    client.compact(name, retire_grace=0)
    # A second pass retires what the first record made redundant, whatever its age.
    compaction.retire(client, name, 0)


# -- 7. an idle writer's append after retirement ---------------------------------------------


def test_idle_writer_append_after_retirement_is_never_lost(store_url: StoreTarget) -> None:
    idle = store_url.open()
    other = store_url.open()
    name = new_journal(idle, length=200)
    for i in range(3):
        idle.append(name, msg(i, "idle"))
    head = idle.head(name)
    # While `idle` sleeps, others append, compact and retire the claims above its head.
    for i in range(40):
        other.append(name, msg(i))
    compact_and_retire(other, name)
    assert other.store.read_claim(name, head) is None  # retired: the hazard is real
    result = idle.append(name, msg(99, "idle"))
    assert result.begin >= other.head(name) - len(msg(99, "idle"))
    fresh = store_url.open()
    start, data = read_all(fresh, name)
    assert start == 0
    assert data[result.begin : result.end] == msg(99, "idle")
    assert data.count(msg(99, "idle")) == 1
    assert fresh.head(name) == result.end == idle.head(name)
    for c in (idle, other, fresh):
        c.close()


def test_idle_writer_never_follows_a_stale_claim(store_url: StoreTarget) -> None:
    """A writer killed right after claiming a retired offset leaves a stale claim there: a
    second idle writer (or reader) that meets it must not take its end for the head."""
    a, b, other = store_url.open(), store_url.open(), store_url.open()
    name = new_journal(a, length=200)
    a.append(name, msg(0, "a"))
    b.head(name)  # b remembers the same head as a
    head = a.head(name)
    for i in range(40):
        other.append(name, msg(i))
    compact_and_retire(other, name)
    # A writer that died between its claim and its check: its claim names a big fragment.
    from oncelog.journal.fragment import Fragment, content_sum
    from oncelog.journal.store import Claim

    junk = b"x" * 500 + b"\n"
    frag = Fragment(name, head, head + len(junk), content_sum(junk), _codec(a, name))
    a.store.write_fragment(frag, junk)
    assert a.store.create_claim(name, Claim(head, frag.content_name, "dead", _inc(a, name)))
    r = b.append(name, msg(1, "b"))
    fresh = store_url.open()
    _, data = read_all(fresh, name)
    assert data[r.begin : r.end] == msg(1, "b") and junk not in data
    assert fresh.head(name) == r.end
    # A reader whose head was the stale offset sees the journal, not the stale claim.
    _, again = read_all(a, name)
    assert again == data
    for c in (a, b, other, fresh):
        c.close()


def _codec(client: JournalClient, name: str) -> Any:
    return client.get(name).fragment.codec


def _inc(client: JournalClient, name: str) -> str:
    return client.get(name).incarnation or ""


# -- 8. readers and heads after retirement ----------------------------------------------------


def test_idle_reader_and_head_see_new_data_after_retirement(store_url: StoreTarget) -> None:
    idle = store_url.open()
    other = store_url.open()
    name = new_journal(idle, length=200)
    for i in range(3):
        other.append(name, msg(i))
    reader = idle.read(name, 0)
    first = reader.read()
    assert reader.read() == b""
    for i in range(3, 60):
        other.append(name, msg(i))
    compact_and_retire(other, name)
    for i in range(60, 70):
        other.append(name, msg(i))
    assert idle.head(name) == other.head(name)
    rest = reader.read()
    reader.close()
    assert first + rest == b"".join(msg(i) for i in range(70))
    idle.close()
    other.close()


def test_tailing_reader_keeps_delivering_across_retirement(store_url: StoreTarget) -> None:
    import threading

    idle = store_url.open()
    other = store_url.open()
    name = new_journal(idle, length=200)
    other.append(name, msg(0))
    got = bytearray()
    want = b"".join(msg(i) for i in range(50))
    done = threading.Event()
    reader = idle.read(name, 0, block=True)

    def tail() -> None:
        while len(got) < len(want):
            data = reader.read()
            if not data:
                break
            got.extend(data)
        done.set()

    t = threading.Thread(target=tail)
    t.start()
    for i in range(1, 30):
        other.append(name, msg(i))
    compact_and_retire(other, name)
    for i in range(30, 50):
        other.append(name, msg(i))
    finished = done.wait(30)
    reader.close()
    t.join(10)
    assert finished and bytes(got) == want
    idle.close()
    other.close()


# -- 1, 10. offsets are identity across trims -------------------------------------------------


def test_trim_keeps_every_offset(store_url: StoreTarget) -> None:
    client = store_url.open()
    name = new_journal(client, length=100)
    pub = Publisher(client)
    to = lambda m: (name, "application/x-ndjson")  # noqa: E731
    for i in range(30):
        pub.publish_committed(to, JSONMessage({"n": i, "pad": "x" * (i % 7)})).result()
    before = [(e.begin, e.end, e.message.doc["n"]) for e in read_committed(client, name)]
    cut = before[10][0]
    result = client.trim(name, before=cut)
    assert result.first == cut
    for reader_client in (client, store_url.open()):
        after = [(e.begin, e.end, e.message.doc["n"]) for e in read_committed(reader_client, name)]
        assert after == before[10:]
        raw = [(e.begin, e.end) for e in read_uncommitted(reader_client, name)]
        assert raw == [(b, e) for b, e, _ in before[10:]]
        start, data = read_all(reader_client, name)
        assert start == cut
    client.close()


def test_trim_during_compaction_reads_from_the_first_offset(store_url: StoreTarget) -> None:
    client = store_url.open()
    trimmer = store_url.open()
    name = new_journal(client, length=300)
    spans = [client.append(name, msg(i)) for i in range(60)]
    cut = spans[25].begin
    trimmed: list[int] = []

    def progress(done: int, total: int) -> None:
        if not trimmed:  # a trim lands while the compaction copies
            trimmed.append(trimmer.trim(name, before=cut).first)

    client.compact(name, progress=progress, retire_grace=3600)
    assert trimmed == [cut]
    for c in (client, trimmer, store_url.open()):
        assert c.first_offset(name) == cut
        start, data = read_all(c, name)
        assert start == cut
        assert data == b"".join(msg(i) for i in range(25, 60))
        with pytest.raises(OffsetNotAvailable):
            read_all(c, name, spans[3].begin)
    client.close()
    trimmer.close()


# -- 9. a replay that cannot be exact is an error ----------------------------------------------


def test_replay_of_a_trimmed_transaction_start_is_an_error(store_url: StoreTarget) -> None:
    client = store_url.open()
    name = new_journal(client, length=100)
    to = lambda m: (name, "application/x-ndjson")  # noqa: E731
    txn = Publisher(client)
    plain = Publisher(client)
    for i in range(3):
        txn.publish_uncommitted(to, JSONMessage({"txn": i})).result()
    for i in range(10):
        plain.publish_committed(to, JSONMessage({"plain": i})).result()
    # A ring of 2: the transaction's start leaves it, so its commit replays the journal.
    seq = Sequencer(offsets={name: 0}, buffer=2)
    seen = [e.message.doc["plain"] for e in read_committed(client, name, 0, sequencer=seq)]
    assert seen == list(range(10))
    offsets, states = seq.checkpoint()
    assert any(s.begin == 0 for s in states)
    # Trim past the transaction's first message, then commit it.
    spans = [(e.begin, e.end) for e in read_uncommitted(client, name)]
    client.trim(name, before=spans[1][1])
    for ack in txn.build_ack_intents():
        client.append(ack.journal, ack.intent)
    resumed = Sequencer(offsets=offsets, states=states, buffer=2)
    with pytest.raises(OffsetNotAvailable, match="before its first available offset"):
        list(read_committed(client, name, offsets[name], sequencer=resumed))
    client.close()


# -- 1. consumers and bulk reads started after a trim ----------------------------------------


def test_consumer_started_after_a_trim_checkpoints_true_offsets(store_url: StoreTarget) -> None:
    from oncelog.consumer import Consumer

    client = store_url.open()
    name = new_journal(client, length=100)
    to = lambda m: (name, "application/x-ndjson")  # noqa: E731
    pub = Publisher(client)
    for i in range(40):
        # Messages of varied sizes: a false offset would land inside one.
        pub.publish_committed(to, JSONMessage({"n": i, "pad": "y" * (i * 7 % 23)})).result()
    spans = [(e.begin, e.end) for e in read_uncommitted(client, name)]
    cut = spans[15][0]
    assert client.trim(name, before=cut).first == cut
    pub.publish_committed(to, JSONMessage({"n": 40})).result()
    seen: list[tuple[int, int, int]] = []

    def handler(env: Any, txn: Any) -> None:
        seen.append((env.begin, env.end, env.message.doc["n"]))

    for _ in range(2):  # a restarted consumer resumes from its checkpoint
        consumer = Consumer(client, "g-trim", [name], handler, max_messages=7)
        consumer.run(until_idle=True)
        consumer.close()
        pub.publish_committed(to, JSONMessage({"n": 41 + len(seen)})).result()
    ends = {b: e for b, e in spans}
    assert [n for _, _, n in seen][:25] == list(range(15, 40))
    for begin, end, _n in seen[:25]:
        assert ends[begin] == end  # the offsets it was written at
    assert len({b for b, _, _ in seen}) == len(seen)  # each once
    client.close()


def test_arrow_read_of_a_trimmed_journal(store_url: StoreTarget) -> None:
    from oncelog.arrow import read_committed_arrow

    client = store_url.open()
    name = new_journal(client, length=100)
    to = lambda m: (name, "application/x-ndjson")  # noqa: E731
    pub = Publisher(client)
    for i in range(30):
        pub.publish_committed(to, JSONMessage({"n": i})).result()
    envs = list(read_committed(client, name))
    cut = envs[12].begin
    client.trim(name, before=cut)
    table = read_committed_arrow(client, name)
    assert table.column("begin").to_pylist() == [e.begin for e in envs[12:]]
    assert table.column("end").to_pylist() == [e.end for e in envs[12:]]
    client.close()


def test_claim_whose_temp_file_a_gc_removed_is_written_again(
    local_store: StoreTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gc with a grace shorter than a paused writer's pause removes the temporary file of
    its claim before the link: the claim is written again, not failed."""
    import os

    from oncelog.journal.backends import local

    client = local_store.open()
    name = new_journal(client)
    real_link = os.link
    removed: list[str] = []

    def link(src: str, dst: str) -> None:
        if "claims" in dst and not removed:
            os.unlink(src)  # as `gc(grace=0)` in another process would
            removed.append(src)
        real_link(src, dst)

    monkeypatch.setattr(local.os, "link", link)
    result = client.append(name, msg(1))
    assert removed and result.begin == 0
    assert read_all(local_store.open(), name) == (0, msg(1))
    client.close()


def test_fragment_whose_staged_file_a_gc_removed_is_written_again(
    local_store: StoreTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gc with a grace shorter than a writer's stage-to-rename time removes the staged
    file of its fragment (seen under load with gc(grace=0)): the fragment is written again
    from the bytes in memory, and the append succeeds."""
    import os

    from oncelog.journal.backends import local

    client = local_store.open()
    name = new_journal(client)
    real_replace = os.replace
    removed: list[str] = []

    def replace(src: str, dst: str) -> None:
        if os.path.basename(src).startswith(".tmp-") and dst.endswith(".raw") and not removed:
            os.unlink(src)  # as `gc(grace=0)` in another process would
            removed.append(src)
        real_replace(src, dst)

    monkeypatch.setattr(local.os, "replace", replace)
    result = client.append(name, msg(1))
    assert removed and result.begin == 0
    assert read_all(local_store.open(), name) == (0, msg(1))
    client.close()


def test_idle_writer_of_the_same_bytes_as_a_retired_append_is_not_lost(
    store_url: StoreTarget,
) -> None:
    """The record's bytes at a stale claim's offsets can equal the idle writer's own (the
    same line appended by another writer there): only the compaction's claims object says
    whether the record consumed *this* claim."""
    writers = [store_url.open() for _ in range(3)]
    other = store_url.open()
    name = new_journal(other, length=200)
    same = b'{"tick": 1}\n'
    for w in writers:
        w.append(name, same)  # at 0, 12, 24: writers[0] remembers head 12
    other.compact(name, retire_grace=3600)
    compaction.retire(other, name, 0)
    assert other.store.read_claim(name, 12) is None
    result = writers[0].append(name, same)
    assert result.begin == 36
    _, data = read_all(store_url.open(), name)
    assert data == same * 4
    for c in (*writers, other):
        c.close()


def test_claim_consumed_by_a_compaction_before_its_check_counts(
    store_url: StoreTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compaction (and retirement) that reads a writer's new claim between its creation
    and the writer's check: the record holds the append; it is acknowledged there, once."""
    from oncelog.journal.index import ClaimsIndex

    writer = store_url.open()
    other = store_url.open()
    name = new_journal(other, length=50)
    for i in range(5):
        other.append(name, msg(i))
    writer.head(name)
    original = ClaimsIndex.check_own_claim
    ran: list[int] = []

    def check_own_claim(self: ClaimsIndex, begin: int) -> bool:
        if not ran:
            ran.append(begin)
            other.compact(name, retire_grace=0)  # covers (and retires) the new claim
            compaction.retire(other, name, 0)
        return original(self, begin)

    monkeypatch.setattr(ClaimsIndex, "check_own_claim", check_own_claim)
    result = writer.append(name, msg(5, "w"))
    assert ran == [result.begin]
    # A record ends past the claim: the writer's check could not take it at its word.
    assert compaction.list_records(other.store, name)[-1].through >= result.end
    _, data = read_all(store_url.open(), name)
    assert data == b"".join(msg(i) for i in range(5)) + msg(5, "w")
    assert data[result.begin : result.end] == msg(5, "w")
    assert writer.head(name) == len(data)
    for c in (writer, other):
        c.close()


def test_idle_consumer_sees_everything_after_compaction_and_retirement(
    store_url: StoreTarget,
) -> None:
    from oncelog.consumer import Consumer

    client = store_url.open()  # the consumer's long-lived client
    other = store_url.open()
    name = new_journal(other, length=150)
    to = lambda m: (name, "application/x-ndjson")  # noqa: E731
    pub = Publisher(other)
    seen: list[tuple[int, int]] = []
    consumer = Consumer(client, "g-idle", [name], lambda env, txn: seen.append(
        (env.begin, env.message.doc["n"])), max_messages=5)
    for i in range(20):
        pub.publish_committed(to, JSONMessage({"n": i})).result()
    consumer.run(until_idle=True)
    assert [n for _, n in seen] == list(range(20))
    # Idle while others publish, compact and retire past its position.
    for i in range(20, 45):
        pub.publish_committed(to, JSONMessage({"n": i})).result()
    compact_and_retire(other, name)
    for i in range(45, 50):
        pub.publish_committed(to, JSONMessage({"n": i})).result()
    consumer.run(until_idle=True)
    consumer.close()
    assert [n for _, n in seen] == list(range(50))
    assert [b for b, _ in seen] == [e.begin for e in read_committed(store_url.open(), name)]
    client.close()
    other.close()
