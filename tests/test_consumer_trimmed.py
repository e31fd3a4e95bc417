"""A consumer whose checkpoint is older than a journal's first available offset (retention
or a trim ran): `on_trimmed="error"` (the default) names group, journal, offsets and the
command to go on, writing nothing; `on_trimmed="skip"` goes on from the first available
offset and logs what was skipped, including a pending transaction that lost its start.
On memory://, local disk and the S3 test server."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from oncelog.consumer import CheckpointStore, CheckpointTrimmed, Consumer, reset_group
from oncelog.journal import FragmentSpec, JournalClient, JournalSpec
from oncelog.message import Envelope, JSONMessage
from oncelog.publisher import Publisher
from oncelog.reading import read_uncommitted

NDJSON = "application/x-ndjson"
J = "trim/in"


def route(_m: object) -> tuple[str, str]:
    return J, NDJSON


def publish(pub: Publisher, numbers: range, committed: bool = True) -> None:
    """One fragment per message (each is flushed alone)."""
    for n in numbers:
        if committed:
            pub.publish_committed(route, JSONMessage({"n": n}))
        else:
            pub.publish_uncommitted(route, JSONMessage({"n": n}))
        pub.flush()


class Seen:
    def __init__(self) -> None:
        self.numbers: list[int] = []

    def __call__(self, env: Envelope, txn: Any) -> None:
        self.numbers.append(env.message.doc["n"])


def consumer(client: JournalClient, seen: Seen, **kwargs: Any) -> Consumer:
    return Consumer(client, "g", [J], seen, max_messages=2, **kwargs)


def begins(client: JournalClient) -> dict[int, int]:
    """Offset of each message, by its number (read from a fresh position, not offset 0)."""
    first = client.fragments(J)[0].begin
    return {e.message.doc["n"]: e.begin for e in read_uncommitted(client, J, first)
            if "n" in e.message.doc}


def behind_a_trim(client: JournalClient) -> tuple[int, int]:
    """Messages 0-9; the group has read 0 and 1; then the fragments before message 6 are
    trimmed. Returns the checkpoint's offset and the first available offset."""
    client.create(JournalSpec(J, {"content-type": NDJSON}, fragment=FragmentSpec(length=50)))
    pub = Publisher(client)
    publish(pub, range(5))
    seen = Seen()
    with consumer(client, seen) as c:
        c.run(max_transactions=1)
    assert seen.numbers == [0, 1]
    publish(pub, range(5, 10))
    at = begins(client)
    offset = CheckpointStore(client, "g").latest().offsets[J]  # type: ignore[union-attr]
    assert offset == at[2]
    first = client.trim(J, before=at[6]).first
    assert first == at[6]
    return offset, first


def test_default_refuses_and_names_the_way_on(store_url) -> None:
    client = store_url.open()
    offset, first = behind_a_trim(client)
    store = CheckpointStore(client, "g")
    seqs = store.seqs()
    seen = Seen()
    with pytest.raises(CheckpointTrimmed) as info:
        consumer(client, seen).run(until_idle=True)
    message = str(info.value)
    assert "'g'" in message and repr(J) in message
    assert f"checkpoint offset {offset}, first available offset {first}" in message
    assert f"({first - offset} unread bytes were trimmed)" in message
    assert f"oncelog groups reset g --to {J}={first}" in message
    assert store.path(seqs[-1]) in message
    assert info.value.journals[0].first == first
    assert store.seqs() == seqs and seen.numbers == []  # nothing written, nothing handled
    # The command it names goes on from the first available offset.
    reset_group(client, "g", {J: first}, keep_state=True)
    consumer(client, seen).run(until_idle=True)
    assert seen.numbers == [6, 7, 8, 9]


def test_skip_goes_on_from_the_first_available_offset(store_url, caplog) -> None:
    client = store_url.open()
    offset, first = behind_a_trim(client)
    seen = Seen()
    with caplog.at_level(logging.WARNING, logger="oncelog.consumer.core"):
        c = consumer(client, seen, on_trimmed="skip")
        c.run(until_idle=True)
        c.close()
    assert seen.numbers == [6, 7, 8, 9]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert (f"journal {J!r} was trimmed below the checkpoint: skipping offsets [{offset},"
            f" {first}) ({first - offset} bytes)") in warnings[0]
    store = CheckpointStore(client, "g")
    assert any(f"skipped trimmed {J}={offset}..{first}" in store.load(s).reason
               for s in store.seqs())
    # The skip is recorded: the next start neither warns nor fails (with either policy).
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="oncelog.consumer.core"):
        consumer(client, seen).run(until_idle=True)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    assert seen.numbers == [6, 7, 8, 9]


def pending_across_a_trim(client: JournalClient) -> tuple[Publisher, int, int]:
    """Producer A leaves a transaction open (messages 100, 101); B's committed messages
    are read (the checkpoint holds A's pending span); A adds 102; the fragments before
    101 are trimmed, so A's span lost its start though the read offset is still there."""
    client.create(JournalSpec(J, {"content-type": NDJSON}, fragment=FragmentSpec(length=50)))
    a, b = Publisher(client), Publisher(client)
    publish(a, range(100, 102), committed=False)
    publish(b, range(2))
    seen = Seen()
    with consumer(client, seen) as c:
        c.run(until_idle=True)
    assert seen.numbers == [0, 1]
    cp = CheckpointStore(client, "g").latest()
    assert cp is not None
    [state] = [p for p in cp.producers if p.producer == a.producer_id]
    at = begins(client)
    assert state.begin == at[100]
    publish(a, range(102, 103), committed=False)
    first = client.trim(J, before=at[101]).first
    assert state.begin < first <= cp.offsets[J]
    a.append_intents(a.build_ack_intents())  # A commits 100-102
    return a, state.begin, first


def test_pending_transaction_trimmed_default_refuses(store_url) -> None:
    client = store_url.open()
    a, begin, first = pending_across_a_trim(client)
    with pytest.raises(CheckpointTrimmed) as info:
        consumer(client, Seen()).recover()
    message = str(info.value)
    assert f"pending transaction(s) of producer(s) {a.producer_id.hex()} (since offset {begin})"\
        in message and f"first available offset {first}" in message


def test_pending_transaction_trimmed_skip_says_it_is_incomplete(store_url, caplog) -> None:
    client = store_url.open()
    a, begin, first = pending_across_a_trim(client)
    seen = Seen()
    with caplog.at_level(logging.WARNING, logger="oncelog.consumer.core"):
        consumer(client, seen, on_trimmed="skip").run(until_idle=True)
    # What is left of A's transaction is delivered (100 was trimmed).
    assert seen.numbers == [101, 102]
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (f"producer {a.producer_id.hex()}'s pending transaction began at offset {begin},"
            f" before {first}: its messages before {first} are lost") in warning
    assert "not exactly once" in warning


def test_on_trimmed_is_checked() -> None:
    with pytest.raises(ValueError, match="on_trimmed must be 'error' or 'skip'"):
        Consumer(None, "g", [J], Seen(), on_trimmed="earliest")  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", ["error", "skip"])
def test_trim_while_running_applies_the_policy(memory_store, policy: str) -> None:
    """A trim of unread data while a consumer runs: its next read fails, it recovers once,
    and the policy applies."""
    client = memory_store.open()
    client.create(JournalSpec(J, {"content-type": NDJSON}, fragment=FragmentSpec(length=50)))
    pub = Publisher(client)
    publish(pub, range(4))
    seen = Seen()
    c = consumer(client, seen, on_trimmed=policy)
    c.run(until_idle=True)
    assert seen.numbers == [0, 1, 2, 3]
    publish(pub, range(4, 7))
    at = begins(client)
    assert client.trim(J, before=at[5]).first == at[5]
    if policy == "error":
        with pytest.raises(CheckpointTrimmed, match=f"first available offset {at[5]}"):
            c.run(until_idle=True)
        assert seen.numbers == [0, 1, 2, 3]
    else:
        c.run(until_idle=True)
        assert seen.numbers == [0, 1, 2, 3, 5, 6]
    c.close()
