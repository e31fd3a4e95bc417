"""Anchors carry producer states: a consumer started from an anchor drops resent copies of
messages acknowledged before it, exactly as a reader from offset 0 does.

Through real nodes (`python -m oncelog.streaming`) in subprocesses: a message is
acknowledged, the owner's beat carries an anchor after it, and then a second copy of that
message (same UUID, as a produce retried after a lost reply or resent after a failover
lands) is written straight into the channel's journal. Consumers started at `latest` and
`start_after` on the owner and on another node must not receive the copy, and still
receive whole the transaction that was open across the anchor; a consumer from `all`
receives every message once. In-process, the node's state tracker is checked against the
library Sequencer's checkpoints, and a consumer from a pruned anchor against a reader from
offset 0."""

from __future__ import annotations

import random
import time
from typing import Any

import orjson
from streaming_support import Collector  # noqa: E402

from oncelog.identity import ACK_TXN, CONTINUE_TXN, OUTSIDE_TXN
from oncelog.journal import JournalSpec
from oncelog.message import build_uuid
from oncelog.reading import read_uncommitted
from oncelog.sequencer import Sequencer
from oncelog.streaming import DeliverAll, DeliverLatest, StartAfter, meta
from oncelog.streaming.node import (
    ANCHOR_MAX_PRODUCERS,
    _ProducerStates,
    read_ticked,
)
from oncelog.testing.fixtures import StoreTarget

WAIT = 60.0


def _wait_for_anchor(direct: Any, node_id: str, channel: str, offset: int) -> dict[str, Any]:
    """The owner's beat entry of `channel` once its anchor is at `offset` (bounded poll)."""
    deadline = time.monotonic() + WAIT
    while True:
        beat = meta.read_beat(direct, node_id) or {}
        entry = (beat.get("channels") or {}).get(channel) or {}
        if entry.get("offset") == offset:
            return entry
        assert time.monotonic() < deadline, f"no anchor at {offset}: {entry}"
        time.sleep(0.05)  # polling the store, bounded by the deadline


def test_late_starters_drop_copies_acknowledged_before_the_anchor(
        any_store: StoreTarget, start_node: Any, client_of: Any) -> None:
    owner = start_node(any_store, "as-owner")
    reader = start_node(any_store, "as-reader", "--no-failover")
    c = client_of(owner.address)
    name = "anchor-states/a"
    c.create_channel(name, "")
    first = c.append(name, b"first")
    txn = c.txn(name, "v", keepalive=60)
    txn.__enter__()
    t1 = txn.append(b"t1")  # open across the anchor
    direct = any_store.open()
    try:
        head = direct.head(name)
        assert head == t1.end
        entry = _wait_for_anchor(direct, "as-owner", name, head)
        assert entry["open"] == [t1.begin], entry
        # Late starters, on the owner (its live anchor) and on another node (the beat's).
        late = {
            f"{where} {label}": Collector(client_of(node.address).read(name, policy))
            for where, node in (("owner", owner), ("reader", reader))
            for label, policy in (("latest", DeliverLatest()), ("after t1", StartAfter(t1)))
        }
        everything = Collector(client_of(reader.address).read(name, DeliverAll()))
        for scan in late.values():
            assert scan.scanner.start_offset == head
        # A second copy of `first`, appended after the anchor and after the starts.
        r = direct.read(name, first.begin, exact=True)
        try:
            copy = r.read(first.end - first.begin)
        finally:
            r.close()
        assert orjson.loads(copy)["payload"] == "first"
        landed = direct.append(name, copy)
        assert landed.begin >= head
        txn.append(b"t2")
        txn.__exit__(None, None, None)  # commits t1 and t2
        c.append(name, b"second")
        for label, scan in late.items():
            got = [m.payload for m in scan.messages(3)]
            assert got == [b"t1", b"t2", b"second"], (label, got)
            scan.close()
        got = [m.payload for m in everything.messages(4)]
        assert got == [b"first", b"t1", b"t2", b"second"], got
        everything.close()
        # The beat now carries the producer states, in the segment records' form.
        entry = _wait_for_anchor(direct, "as-owner", name, direct.head(name))
        producer = bytes.fromhex(orjson.loads(copy)["uuid"].replace("-", "")[-12:])
        assert entry["states"][producer.hex()][1] == -1, entry
    finally:
        direct.close()


def test_failover_owner_inherits_the_states(
        local_store: StoreTarget, start_node: Any, client_of: Any) -> None:
    """The new owner seeds its states from the dead owner's anchor: its own anchors, and a
    consumer started from them, still drop a copy of a message acknowledged before."""
    a = start_node(local_store, "fo-states-a", lease=1.0)
    c = client_of(a.address)
    name = "anchor-states/fo"
    c.create_channel(name, "")
    first = c.append(name, b"first")
    direct = local_store.open()
    try:
        head = direct.head(name)
        _wait_for_anchor(direct, "fo-states-a", name, head)
        a.kill()  # SIGKILL: its newest beat carries the anchor at `head`
        b = start_node(local_store, "fo-states-b", lease=1.0)
        deadline = time.monotonic() + WAIT
        while True:  # b takes the channel (bounded)
            record = meta.latest_term(direct, name)
            if record is not None and record.node_id == "fo-states-b":
                break
            assert time.monotonic() < deadline, record
            time.sleep(0.05)  # polling the store, bounded by the deadline
        entry = _wait_for_anchor(direct, "fo-states-b", name, head)
        assert entry.get("states"), entry  # seeded from a's anchor, not read from offset 0
        scan = Collector(client_of(b.address).read(name, DeliverLatest()))
        r = direct.read(name, first.begin, exact=True)
        try:
            copy = r.read(first.end - first.begin)
        finally:
            r.close()
        direct.append(name, copy)
        c2 = client_of(b.address)
        c2.append(name, b"second")
        assert [m.payload for m in scan.messages(1)] == [b"second"]
        scan.close()
    finally:
        direct.close()


# -- in process: the tracker is the Sequencer's state; pruned anchors fall back ---------------


def _random_lines(rng: random.Random, n: int, producers: int) -> list[bytes]:
    """JSON lines of `producers` producers: committed messages, transactions (committed,
    rolled back, left open), duplicates and out-of-order clocks."""
    ids = [bytes([rng.randrange(256) for _ in range(5)]) + bytes([k]) for k in range(producers)]
    clocks = {p: 1 << 40 for p in ids}
    sent: list[bytes] = []
    out: list[bytes] = []
    for _ in range(n):
        p = rng.choice(ids)
        roll = rng.random()
        if roll < 0.15 and sent:
            out.append(rng.choice(sent))  # a resent copy
            continue
        clocks[p] += rng.randrange(1, 40)
        if roll < 0.45:
            flags = OUTSIDE_TXN
        elif roll < 0.8:
            flags = CONTINUE_TXN
        else:
            flags = ACK_TXN
        clock = clocks[p] if rng.random() > 0.05 else clocks[p] - rng.randrange(1, 80)
        line = orjson.dumps({"uuid": str(build_uuid(p, clock, flags)), "n": len(out)}) + b"\n"
        out.append(line)
        sent.append(line)
    return out


def test_tracker_states_equal_the_sequencer_checkpoint(local_store: StoreTarget) -> None:
    client = local_store.open()
    try:
        for seed in range(6):
            rng = random.Random(seed)
            name = f"tracker/{seed}"
            client.create(JournalSpec(name, labels={"content-type": "application/x-ndjson"}))
            lines = _random_lines(rng, 400, 8)
            for k in range(0, len(lines), 37):
                client.append(name, b"".join(lines[k:k + 37]))
            tracker = _ProducerStates()
            seq = Sequencer(offsets={name: 0})
            for env in read_uncommitted(client, name, 0, end=client.head(name)):
                producer, clock, flags = env.ids
                tracker.apply(producer, clock, int(flags), env.begin)
                list(seq.sequence([env]))
                _, states = seq.checkpoint()
                expected = {s.producer.hex(): (s.last_ack, s.begin) for s in states}
                assert tracker.states() == expected, (seed, env.begin)
    finally:
        client.close()


def _committed_payloads(client: Any, name: str, start: int, end: int, **kwargs: Any) -> list[Any]:
    """Payloads `read_ticked` delivers from `start` until the line ending at `end`."""
    out = []
    it = read_ticked(client, name, start, **kwargs)
    try:
        for env, _tick in it:
            if env.ids[2] != ACK_TXN:
                out.append(env.message.doc["n"])
            if env.end >= end:
                break
    finally:
        it.close()
    return out


def test_pruned_anchor_falls_back_to_offset_0_never_to_a_wrong_answer(
        local_store: StoreTarget) -> None:
    client = local_store.open()
    try:
        name = "tracker/pruned"
        client.create(JournalSpec(name, labels={"content-type": "application/x-ndjson"}))
        old = bytes.fromhex("ff00000000a1")  # not one of the k + 1 below
        early = orjson.dumps({"uuid": str(build_uuid(old, 1000, OUTSIDE_TXN)), "n": 0}) + b"\n"
        client.append(name, early)
        # More producers than an anchor carries, all newer than `old`: it is pruned.
        lines = [orjson.dumps({"uuid": str(build_uuid(
            (k + 1).to_bytes(6, "big"), 10_000 + k, OUTSIDE_TXN)), "n": k + 1}) + b"\n"
            for k in range(ANCHOR_MAX_PRODUCERS + 10)]
        client.append(name, b"".join(lines))
        tracker = _ProducerStates()
        for env in read_uncommitted(client, name, 0, end=client.head(name)):
            producer, clock, flags = env.ids
            tracker.apply(producer, clock, int(flags), env.begin)
        snap = tracker.anchor()
        assert snap is not None
        states, pruned = snap
        assert len(states) <= ANCHOR_MAX_PRODUCERS and old.hex() not in states
        assert pruned > 1000
        anchor = client.head(name)
        client.append(name, early)  # a late copy of the pruned producer's message
        tail = orjson.dumps({"uuid": str(build_uuid(old, 20_000, OUTSIDE_TXN)),
                             "n": "tail"}) + b"\n"
        end = client.append(name, tail).end
        full = _committed_payloads(client, name, anchor, end)
        assert full == ["tail"]
        from_anchor = _committed_payloads(
            client, name, anchor, end, origin=(anchor, anchor, 0), states=states,
            pruned=pruned)
        assert from_anchor == full
    finally:
        client.close()
