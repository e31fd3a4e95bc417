"""Reading: read-uncommitted / read-committed iterators, positions, filters, replays, bad frames."""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from typing import Any

import pytest

from oncelog.framing import CONTENT_TYPE_JSON_LINES, MalformedFrame
from oncelog.journal import JournalClient, JournalSpec
from oncelog.message import Clock, Flags, JSONMessage
from oncelog.publisher import Publisher
from oncelog.reading import MessageReader, read_committed, read_uncommitted, time_filter
from oncelog.sequencer import Sequencer

JSON = {"content-type": CONTENT_TYPE_JSON_LINES}
J = "in/a"


def to(journal: str):
    return lambda _msg: (journal, CONTENT_TYPE_JSON_LINES)


def ns(envs: Any) -> list[Any]:
    return [e.message.doc["n"] for e in envs]


@pytest.fixture
def client(store_url) -> Any:
    c = store_url.open()
    c.create(JournalSpec(J, labels=JSON))
    yield c
    c.close()


@pytest.fixture
def mem_client(memory_store) -> Any:
    c = memory_store.open()
    c.create(JournalSpec(J, labels=JSON))
    yield c
    c.close()


def publish(pub: Publisher, *values: Any, txn: bool = False) -> None:
    if txn:
        with pub.transaction():
            for v in values:
                pub.publish_uncommitted(to(J), JSONMessage({"n": v}))
    else:
        for v in values:
            pub.publish_committed(to(J), JSONMessage({"n": v}))
        pub.flush()


def test_positions_offset_head_and_after_envelope(client: JournalClient) -> None:
    pub = Publisher(client)
    publish(pub, 0, 1, 2)
    envs = list(read_committed(client, J))
    assert ns(envs) == [0, 1, 2]
    assert envs[0].begin == 0 and envs[1].begin == envs[0].end
    assert ns(read_committed(client, J, envs[0])) == [1, 2]  # after an envelope
    assert ns(read_committed(client, J, envs[1].begin)) == [1, 2]  # from an offset
    assert ns(read_committed(client, J, -1)) == []  # at the head
    with pytest.raises(ValueError, match="after an envelope of 'other'"):
        list(read_committed(client, J, type(envs[0])("other", 0, 1, envs[0].message)))
    with pytest.raises(ValueError, match="int >= -1"):
        list(read_committed(client, J, -5))


def test_resume_from_checkpoint_mid_transaction(client: JournalClient) -> None:
    a, b = Publisher(client), Publisher(client)
    publish(a, "a0")
    a.publish_uncommitted(to(J), JSONMessage({"n": "a1"}))
    publish(b, "b0", "b1", txn=True)
    a.flush()
    seq = Sequencer()
    first = ns(read_committed(client, J, sequencer=seq))
    assert first == ["a0", "b0", "b1"]
    offsets, states = seq.checkpoint()
    # a's open transaction started before the checkpoint offset: its state says where.
    a.publish_uncommitted(to(J), JSONMessage({"n": "a2"}))
    a.append_intents(a.build_ack_intents())
    resumed = read_committed(
        client, J, offsets[J], sequencer=Sequencer(offsets, states, buffer=1)
    )
    assert ns(resumed) == ["a1", "a2"]


def test_replay_when_transaction_left_the_ring(client: JournalClient) -> None:
    a, b = Publisher(client), Publisher(client)
    for i in range(10):
        a.publish_uncommitted(to(J), JSONMessage({"n": f"a{i}"}))
        b.publish_committed(to(J), JSONMessage({"n": f"b{i}"}))
    a.append_intents(a.build_ack_intents())
    b.flush()
    got = ns(read_committed(client, J, sequencer=Sequencer(buffer=3)))
    assert got == [f"b{i}" for i in range(10)] + [f"a{i}" for i in range(10)]


def test_acks_are_hidden_unless_asked(client: JournalClient) -> None:
    pub = Publisher(client)
    publish(pub, 1, txn=True)
    assert [e.flags for e in read_committed(client, J)] == [Flags.CONTINUE_TXN]
    assert [e.flags for e in read_committed(client, J, include_acks=True)] == [
        Flags.CONTINUE_TXN,
        Flags.ACK_TXN,
    ]


def test_nil_uuid_messages_are_always_delivered(client: JournalClient) -> None:
    client.append(J, b'{"n": "plain"}\n{"n": "again"}\n')
    assert ns(read_committed(client, J)) == ["plain", "again"]


def test_duplicates_are_dropped(client: JournalClient) -> None:
    pub = Publisher(client)
    publish(pub, 1, 2)
    raw = [e for e in read_uncommitted(client, J)]
    frames = b"".join(
        b'{"n":%d,"uuid":"%s"}\n' % (e.message.doc["n"], e.message.doc["uuid"].encode())
        for e in raw
    )
    client.append(J, frames)  # a writer retried both appends
    assert len(list(read_uncommitted(client, J))) == 4
    assert ns(read_committed(client, J)) == [1, 2]


def test_time_filters(client: JournalClient) -> None:
    base = 1_800_000_000_000_000_000
    clock = Clock()
    pub = Publisher(client, clock=clock)
    for i in range(4):
        clock.update(base + i * 1_000_000_000)
        pub.publish_committed(to(J), JSONMessage({"n": i}))
    pub.flush()
    t2 = datetime.fromtimestamp((base + 2 * 10**9) / 1e9, tz=timezone.utc)
    assert ns(MessageReader(client, J, since=t2)) == [2, 3]
    assert ns(MessageReader(client, J, after=t2)) == [3]
    assert ns(MessageReader(client, J, since=base + 100)) == [1, 2, 3]  # one 100 ns tick later
    keep = time_filter(since=base + 10**9)
    assert ns(filter(keep, read_committed(client, J))) == [1, 2, 3]
    with pytest.raises(ValueError, match="timezone-aware"):
        MessageReader(client, J, since=datetime(2030, 1, 1))


def test_message_reader_seek_and_checkpoint(client: JournalClient) -> None:
    pub = Publisher(client)
    publish(pub, 0, 1, 2, 3)
    reader = MessageReader(client, J)
    first = next(reader)
    assert first.message.doc["n"] == 0 and reader.offset == first.end
    offsets, states = reader.checkpoint()
    assert [s.producer for s in states] == [pub.producer_id]
    resumed = MessageReader(client, J, offsets[J], sequencer=Sequencer(offsets, states))
    assert ns(resumed) == [1, 2, 3]  # the checkpoint counts the yielded message as processed
    assert ns(reader) == [1, 2, 3]
    reader.seek(first)  # seeking back with fresh sequencing state re-reads
    assert ns(reader) == [1, 2, 3]
    reader.seek(0, states=states)  # with the checkpointed states, 0 is a duplicate
    assert ns(reader) == [1, 2, 3]
    reader.close()
    raw = MessageReader(client, J, committed=False)
    assert len(list(raw)) == 4
    with pytest.raises(ValueError, match="uncommitted"):
        raw.checkpoint()


def test_malformed_frame_raises_with_offsets_or_is_skipped(client: JournalClient) -> None:
    pub = Publisher(client)
    publish(pub, 0)
    bad = client.append(J, b'{"n": oops}\n')
    publish(pub, 1)
    with pytest.raises(MalformedFrame) as info:
        ns(read_committed(client, J))
    assert info.value.journal == J and (info.value.begin, info.value.end) == (bad.begin, bad.end)
    assert f"{bad.begin}-{bad.end}" in str(info.value)
    assert ns(read_committed(client, J, on_error="skip")) == [0, 1]
    seen: list[Any] = []
    assert ns(read_committed(client, J, on_error=seen.append)) == [0, 1]
    assert [(e.begin, e.end) for e in seen] == [(bad.begin, bad.end)]
    with pytest.raises(ValueError, match="on_error"):
        list(read_committed(client, J, on_error="ignore"))  # type: ignore[arg-type]


def test_unknown_journal_is_a_clear_error(client: JournalClient) -> None:
    with pytest.raises(Exception, match="nope/x"):
        list(read_committed(client, "nope/x"))


def test_blocking_reader_tails_new_messages(mem_client: JournalClient) -> None:
    pub = Publisher(mem_client)
    got: list[Any] = []
    done = threading.Event()
    reader = MessageReader(mem_client, J, block=True)

    def consume() -> None:
        for env in reader:
            got.append(env.message.doc["n"])
            if len(got) == 3:
                break
        done.set()

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    publish(pub, 1)
    publish(pub, 2, 3, txn=True)
    assert done.wait(30), f"tailing reader saw only {got}"
    assert got == [1, 2, 3]
    reader.close()
    t.join(10)
