"""Fencing that survives pruning and deletion, unique checkpoint bytes, unknown write
outcomes, and checkpoints checked completely before recovery acts on them.

A zombie instance (paused just before a checkpoint write, e.g. SIGSTOP or a long GC)
must be fenced out even after the checkpoint number it writes was pruned, or its group
deleted: see `CheckpointStore.claim` and docs/consumers.md.

This file is also the child process of the multi-process test:
`python tests/test_consumer_fencing.py child URL OPTIONS GROUP MAX_MESSAGES`.
"""

from __future__ import annotations

import json
import logging
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from consumer_support import (  # noqa: E402
    INPUTS,
    NDJSON,
    OUTPUTS,
    RARE,
    committed_echo,
    create_journals,
    echo_consumer,
    expected_echo,
    expected_words,
    write_upstream,
)

from oncelog.consumer import (  # noqa: E402
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    ConsumerError,
    FencedOut,
    delete_group,
    list_groups,
    prune_checkpoints,
    reset_group,
)
from oncelog.coordination import MetaStore
from oncelog.framing import for_content_type  # noqa: E402
from oncelog.journal import JournalSpec, open_journals  # noqa: E402
from oncelog.journal.errors import JournalError  # noqa: E402
from oncelog.message import CSVRecord, Flags, build_uuid, new_producer_id  # noqa: E402
from oncelog.publisher import AckIntent, Publisher  # noqa: E402
from oncelog.reading import read_uncommitted  # noqa: E402

try:
    from oncelog.journal.errors import StorageUnavailable
except ImportError:  # the journal layer's retry work is not there yet
    StorageUnavailable = JournalError  # type: ignore[misc,assignment]

WAIT = 30.0
"""Bound of every wait on another thread (seconds); none is reached when all goes well."""
ALL_JOURNALS = (*INPUTS, *OUTPUTS, RARE)


class Crash(BaseException):
    """Stands for the process dying at a stage (raised from the stage hook)."""


def crash_at(stage: str, nth: int = 1):
    seen = {"n": 0}

    def hook(name: str) -> None:
        if name == stage:
            seen["n"] += 1
            if seen["n"] == nth:
                raise Crash(f"{stage}#{nth}")

    return hook


def pause_at(stage: str) -> tuple[threading.Event, threading.Event, object]:
    """A stage hook that blocks the first time `stage` is reached, until released."""
    reached, release = threading.Event(), threading.Event()

    def hook(name: str) -> None:
        if name == stage and not reached.is_set():
            reached.set()
            if not release.wait(WAIT):
                raise AssertionError(f"never released from {stage!r}")

    return reached, release, hook


class PausingStore(CheckpointStore):
    """A checkpoint store whose first write blocks until released: an instance paused
    between reading the latest checkpoint and writing the next one."""

    def __init__(self, store: CheckpointStore) -> None:
        super().__init__(store.client, store.group, store.shard, store.shards)
        self.reached, self.release = threading.Event(), threading.Event()

    def write(self, cp: Checkpoint, data: bytes | None = None) -> bool:
        if not self.reached.is_set():
            self.reached.set()
            if not self.release.wait(WAIT):
                raise AssertionError("never released from the checkpoint write")
        return super().write(cp, data)


def in_thread(fn) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def target() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


def heads(client) -> dict[str, int]:
    return {j: client.head(j) for j in ALL_JOURNALS}


@pytest.fixture
def local(local_store):
    client = local_store.open()
    create_journals(client)
    yield client
    client.close()


# -- Defect 1: fencing must not depend on checkpoints that pruning deletes -----------------------


def test_a_paused_committer_whose_checkpoint_was_pruned_is_fenced_out(journals):
    """A recovers (checkpoint 1) and pauses just before writing checkpoint 2. B takes
    over (its recovery is 2), commits many transactions and prunes 2 (keep 2). A resumes:
    its put-if-absent of 2 succeeds, in the hole; A must see B's checkpoints above it and
    stop, without appending its ACKs (its outputs duplicate B's). On each store."""
    local = journals
    create_journals(local)
    write_upstream(local, seed=21, transactions=14)
    reached, release, hook = pause_at("checkpoint")
    a = echo_consumer(local, max_messages=2, keep_checkpoints=2, on_stage=hook)
    thread, out = in_thread(lambda: a.run(until_idle=True))
    assert reached.wait(WAIT)
    store = CheckpointStore(local, "echo")
    assert store.seqs() == [1]
    a_id = a.producer_id

    b = echo_consumer(local, max_messages=1, keep_checkpoints=2)
    assert b.run(until_idle=True) >= 4
    b_last = b.checkpoint_seq
    assert 2 not in store.seqs() and store.seqs()[-1] == b_last > 4  # 2 is a hole now
    assert committed_echo(local) == expected_echo(local)

    release.set()
    thread.join(WAIT)
    assert not thread.is_alive()
    error = out.get("error")
    assert isinstance(error, FencedOut), out
    assert store.path(2) in str(error) and "exists" in str(error)
    assert a.fenced
    # A's write did land (a hole checkpoint), but it is never the latest and nothing of
    # A's was acknowledged: the outputs are exactly those of a crash-free run.
    assert store.load(2).writer == a_id
    assert store.latest().seq == b_last
    assert committed_echo(local) == expected_echo(local)
    acks_from_a = [
        e for j in ALL_JOURNALS for e in read_uncommitted(local, j)
        if e.producer == a_id and e.flags == Flags.ACK_TXN
    ]
    assert acks_from_a == []
    # The next prune removes the hole checkpoint; the newest stay.
    prune_checkpoints(local, "echo", keep=2)
    assert store.seqs() == [b_last - 1, b_last]
    # And the group goes on from B's checkpoint.
    c = echo_consumer(local)
    assert c.recover() == b_last + 1
    assert c.state["words"] == expected_words(local)


def test_a_recovery_paused_before_its_write_retries_from_the_real_latest(local):
    """A reads the latest checkpoint (2) and pauses before writing 3; B takes over,
    commits and prunes 3. A's write of 3 lands in the hole: A must not resume from
    checkpoint 2's offsets and state, but retry its recovery from B's latest."""
    write_upstream(local, seed=22, transactions=14)
    first = echo_consumer(local, max_messages=1, keep_checkpoints=2)
    assert first.run(max_transactions=1) == 1
    first.close()
    store = CheckpointStore(local, "echo")
    assert store.seqs() == [1, 2]

    a = echo_consumer(local, max_messages=2, keep_checkpoints=2)
    a._store = paused = PausingStore(a._store)
    thread, out = in_thread(a.recover)
    assert paused.reached.wait(WAIT)

    b = echo_consumer(local, max_messages=1, keep_checkpoints=2)
    assert b.run(until_idle=True) >= 3
    b_last = b.checkpoint_seq
    assert 3 not in store.seqs() and b_last > 4

    paused.release.set()
    thread.join(WAIT)
    assert not thread.is_alive()
    assert "error" not in out, out
    assert out["result"] == a.checkpoint_seq == b_last + 1
    assert 3 in store.seqs()  # the unclaimed recovery checkpoint, in the hole
    assert store.latest().seq == b_last + 1 and store.latest().writer == a.producer_id
    assert a.state == b.state
    assert a.run(until_idle=True) == 0  # B consumed everything: nothing to redo
    assert committed_echo(local) == expected_echo(local)
    assert a.state["words"] == expected_words(local)


def test_a_recovery_whose_listing_goes_stale_before_its_read_retries(local, monkeypatch):
    """A lists the checkpoints (newest: 2) and pauses before reading 2; B commits on and
    prunes 2. A must list again and recover from B's newest, not fail on "missing"
    (found by the SIGSTOP campaign below). A newest checkpoint missing with nothing above
    it is damage and still raises, naming the file."""
    write_upstream(local, seed=24, transactions=14)
    first = echo_consumer(local, max_messages=1, keep_checkpoints=2)
    assert first.run(max_transactions=1) == 1
    first.close()
    store = CheckpointStore(local, "echo")
    assert store.seqs() == [1, 2]

    original = CheckpointStore._list
    stale: list[int] = []

    def list_then_pause(self, after=None):
        listing = original(self, after)
        if not stale:  # the first LIST only: others commit and prune while A is paused
            stale.append(listing.seqs[-1])
            b = echo_consumer(local, max_messages=1, keep_checkpoints=1)
            assert b.run(until_idle=True) >= 3
            b.close()
        return listing

    a = echo_consumer(local, max_messages=2, keep_checkpoints=2)
    monkeypatch.setattr(CheckpointStore, "_list", list_then_pause)
    recovered = a.recover()
    b_last = max(s for s in store.seqs() if s != recovered)
    assert stale == [2] and 2 not in store.seqs()
    assert recovered == a.checkpoint_seq == b_last + 1
    assert a.run(until_idle=True) == 0
    assert committed_echo(local) == expected_echo(local)
    assert a.state["words"] == expected_words(local)

    # A listing that names a checkpoint no GET finds, with nothing above it: damage.
    phantom = max(store.seqs()) + 1
    monkeypatch.setattr(
        CheckpointStore, "_list",
        lambda self, after=None: original(self, after)._replace(
            seqs=[*original(self, after).seqs, phantom]
        ),
    )
    monkeypatch.setattr(CheckpointStore, "superseded", lambda self, seq: None)
    with pytest.raises(CheckpointError, match=f"{phantom:016x}.json is missing"):
        echo_consumer(local).recover()


def test_recovery_gives_up_after_bounded_attempts_when_always_superseded(local, monkeypatch):
    monkeypatch.setattr(
        CheckpointStore, "superseded", lambda self, seq: f"checkpoint {seq + 1} exists"
    )
    with pytest.raises(FencedOut, match="could not take over"):
        echo_consumer(local).recover()
    assert heads(local) == {j: 0 for j in ALL_JOURNALS}


def test_a_reset_that_lands_in_a_pruned_hole_raises(local, monkeypatch):
    """reset_group reads the latest checkpoint, then (paused) others commit past it and
    prune its successor's number: the reset must not report a checkpoint that is not
    the group's."""
    write_upstream(local, seed=23, transactions=14)
    first = echo_consumer(local, max_messages=1, keep_checkpoints=2)
    first.run(max_transactions=1)
    first.close()
    store = CheckpointStore(local, "echo")
    assert store.seqs() == [1, 2]
    real_write = CheckpointStore.write
    others: dict = {}

    def write(self, cp, data=None):
        if cp.reason.startswith("reset") and "b" not in others:
            b = others["b"] = echo_consumer(local, max_messages=1, keep_checkpoints=2)
            b.run(until_idle=True)
            assert cp.seq not in self.seqs()
        return real_write(self, cp, data)

    monkeypatch.setattr(CheckpointStore, "write", write)
    with pytest.raises(ConsumerError, match="raced with a commit") as info:
        reset_group(local, "echo", "beginning")
    assert store.path(3) in str(info.value)
    monkeypatch.undo()
    b = others["b"]
    assert store.latest().seq == b.checkpoint_seq
    assert committed_echo(local) == expected_echo(local)


def test_a_zombie_of_a_deleted_group_is_fenced_out_by_its_tombstone(journals):
    """A pauses before writing checkpoint 2; the group is deleted (its checkpoint
    directory emptied). A's write of 2 then succeeds in an empty directory: only the
    tombstone can tell A it is a zombie. A later consumer starts the group afresh."""
    local = journals
    create_journals(local)
    write_upstream(local, seed=24)
    reached, release, hook = pause_at("checkpoint")
    a = echo_consumer(local, max_messages=3, on_stage=hook)
    thread, out = in_thread(lambda: a.run(until_idle=True))
    assert reached.wait(WAIT)
    assert delete_group(local, "echo") == 1
    store = CheckpointStore(local, "echo")
    assert store.seqs() == [] and list_groups(local) == []
    floor = store.floor()
    assert floor == 2  # above every number a zombie can still write

    release.set()
    thread.join(WAIT)
    assert not thread.is_alive()
    assert isinstance(out.get("error"), FencedOut), out
    assert "tombstone" in str(out["error"])
    assert committed_echo(local) == {}
    assert store.seqs() == [2] and store.latest() is None  # the zombie's, ignored

    fresh = echo_consumer(local)
    fresh.run(until_idle=True)
    assert store.load(floor + 1).reason == "recover"
    assert committed_echo(local) == expected_echo(local)
    assert fresh.state["words"] == expected_words(local)
    assert list_groups(local) == ["echo"]


def test_deleting_a_group_again_moves_the_tombstone_up(local):
    write_upstream(local, seed=25)
    echo_consumer(local).run(until_idle=True)
    delete_group(local, "echo")
    store = CheckpointStore(local, "echo")
    first_floor = store.floor()
    echo_consumer(local).run(until_idle=True)
    assert min(store.seqs()) == first_floor + 1
    delete_group(local, "echo")
    assert store.floor() > first_floor + 1
    names = local.meta.list(store.directory)
    assert names == [f"tombstone-{store.floor():016x}.json"]


def test_a_sharded_group_leaves_a_tombstone_per_shard(local):
    write_upstream(local, seed=28)
    for shard in range(2):
        echo_consumer(local, "sharded", shards=2, shard=shard).run(until_idle=True)
    stores = [CheckpointStore(local, "sharded", i, 2) for i in range(2)]
    tops = [store.seqs()[-1] for store in stores]
    delete_group(local, "sharded")
    assert [store.floor() for store in stores] == [top + 1 for top in tops]
    assert all(store.seqs() == [] for store in stores)
    for shard, store in enumerate(stores):
        consumer = echo_consumer(local, "sharded", shards=2, shard=shard)
        assert consumer.recover() == store.floor() + 1


def test_a_delete_racing_with_a_commit_fails_and_deletes_nothing(local, monkeypatch):
    write_upstream(local, seed=26)
    echo_consumer(local, max_messages=1).run(max_transactions=1)
    store = CheckpointStore(local, "echo")
    before = store.seqs()
    real_write = CheckpointStore.write

    def write(self, cp, data=None):
        if cp.reason == "deleted":  # a running instance commits first
            racer = echo_consumer(local, max_messages=1)
            racer.run(max_transactions=1)
        return real_write(self, cp, data)

    monkeypatch.setattr(CheckpointStore, "write", write)
    with pytest.raises(ConsumerError, match="raced with a commit"):
        delete_group(local, "echo")
    assert set(before) <= set(store.seqs()) and store.floor() == 0
    assert list_groups(local) == ["echo"]


def test_a_recovery_from_a_recovery_checkpoint_checks_the_original_producer(local):
    """A recovery checkpoint carries its base's ACK intents, which acknowledge the
    producer of the commit that built them, not the recovering writer."""
    write_upstream(local, seed=27)
    committer = echo_consumer(local, max_messages=1000, on_stage=crash_at("checkpointed"))
    with pytest.raises(Crash):
        committer.run(until_idle=True)
    store = CheckpointStore(local, "echo")
    committed = store.load(2)
    assert committed.reason == "commit" and committed.ack_producer == committed.writer
    recovering = echo_consumer(local, on_stage=crash_at("acked"))
    with pytest.raises(Crash):  # dies after the first re-appended ACK
        recovering.recover()
    cp = store.latest()
    assert cp.seq == 3 and cp.reason == "recover"
    assert cp.ack_intents == committed.ack_intents
    assert cp.writer is not None and cp.writer != committed.writer
    assert cp.ack_producer == committed.writer
    echo_consumer(local).run(until_idle=True)
    assert committed_echo(local) == expected_echo(local)


# -- Defect 2: unique bytes per write attempt; unknown outcomes ----------------------------------


def test_every_checkpoint_write_attempt_has_unique_bytes(local, monkeypatch):
    write_upstream(local, seed=31)
    written: list[tuple[str, bytes]] = []
    real = MetaStore.put_if_absent

    def put_if_absent(self, path, data):
        written.append((path, bytes(data)))
        return real(self, path, data)

    monkeypatch.setattr(MetaStore, "put_if_absent", put_if_absent)
    echo_consumer(local).run(until_idle=True)
    echo_consumer(local).recover()
    # The same checkpoint content twice (two resets of the same latest, the first
    # removed again) still gives two different objects.
    (cp,) = reset_group(local, "echo", "head")
    store = CheckpointStore(local, "echo")
    local.meta.delete(store.relative_path(cp.seq))
    reset_group(local, "echo", "head")
    delete_group(local, "echo")
    echo_consumer(local).recover()
    datas = [d for _, d in written]
    assert len(set(datas)) == len(datas)
    kinds = {p.split("/")[0] for p, _ in written}
    assert kinds == {"groups", "checkpoints"}
    for path, data in written:
        doc = orjson.loads(data)
        assert isinstance(doc.get("token"), str) and len(doc["token"]) == 32, path
    same = [orjson.loads(d) for p, d in written if p.endswith(f"/{cp.seq:016x}.json")]
    assert len(same) >= 2
    assert len({d["token"] for d in same}) == len(same)
    assert Checkpoint.from_json(cp.to_json(), "x") == cp
    assert cp.to_json() != cp.to_json()


@pytest.mark.fault
def test_lost_replies_of_checkpoint_writes_are_recognised_by_their_bytes(journals):
    """Every checkpoint and descriptor write takes effect, then its reply is lost (as
    when a retried PUT gets 412): the client reads the object back and, its bytes being
    unique to the attempt, knows it as its own. The consumer is never wrongly fenced."""
    create_journals(journals)
    write_upstream(journals, seed=35)
    backend = journals.store.backend
    create = backend.create
    lost: list[str] = []

    def lossy(path: str, data: bytes) -> bool:
        created = create(path, data)
        if ("/checkpoints/" in path or "/groups/" in path) and path not in lost:
            lost.append(path)
            assert created
            raise OSError("connection reset after the request was applied")
        return created

    backend.create = lossy
    consumer = echo_consumer(journals, max_messages=4)
    try:
        commits = consumer.run(until_idle=True)
    except (JournalError, OSError) as exc:  # the client does not retry lost replies yet
        pytest.skip(f"put_if_absent does not recognise its own lost writes: {exc!r}")
    assert commits >= 3 and len(lost) >= commits + 2
    assert not consumer.fenced
    assert committed_echo(journals) == expected_echo(journals)
    assert consumer.state["words"] == expected_words(journals)


@pytest.mark.parametrize("landed", [True, False], ids=["write-applied", "write-not-applied"])
def test_an_unknown_checkpoint_outcome_aborts_without_rollback_then_recovery_settles(
    local, monkeypatch, landed
):
    """put_if_absent raises StorageUnavailable (transient errors past retry_timeout):
    the checkpoint may or may not exist. The consumer acknowledges nothing, rolls
    nothing back, and the next run recovers: the outputs are exactly once either way."""
    write_upstream(local, seed=32)
    real = MetaStore.put_if_absent
    calls = {"n": 0}

    def put_if_absent(self, path, data):
        if path.startswith("checkpoints/"):
            calls["n"] += 1
            if calls["n"] == 3:  # recovery 1, commit 2, commit 3: the second commit
                if landed:
                    assert real(self, path, data)
                raise StorageUnavailable(f"create {path!r}: outcome unknown")
        return real(self, path, data)

    rollbacks = []
    monkeypatch.setattr(MetaStore, "put_if_absent", put_if_absent)
    monkeypatch.setattr(Publisher, "rollback", lambda self: rollbacks.append(self))
    consumer = echo_consumer(local, max_messages=3)
    with pytest.raises(StorageUnavailable):
        consumer.run(until_idle=True)
    assert rollbacks == []
    store = CheckpointStore(local, "echo")
    assert store.seqs() == ([1, 2, 3] if landed else [1, 2])
    producer = consumer.producer_id
    assert producer is None  # aborted: run() recovers next
    consumer.run(until_idle=True)
    assert rollbacks == []
    assert committed_echo(local) == expected_echo(local)
    assert consumer.state["words"] == expected_words(local)


def test_an_unknown_outcome_of_the_check_above_the_checkpoint_acknowledges_nothing(
    local, monkeypatch
):
    write_upstream(local, seed=33)
    real = CheckpointStore.superseded
    calls = {"n": 0}

    def superseded(self, seq):
        calls["n"] += 1
        if calls["n"] == 2:
            raise StorageUnavailable("list: outcome unknown")
        return real(self, seq)

    monkeypatch.setattr(CheckpointStore, "superseded", superseded)
    before = heads(local)
    consumer = echo_consumer(local, max_messages=1000)
    with pytest.raises(StorageUnavailable):
        consumer.run(until_idle=True)
    assert committed_echo(local) == {}  # checkpoint 2 exists, its ACKs not appended
    assert CheckpointStore(local, "echo").seqs() == [1, 2]
    assert heads(local) != before  # the outputs, uncommitted
    consumer.run(until_idle=True)  # recovery re-appends checkpoint 2's ACK intents
    assert committed_echo(local) == expected_echo(local)


def test_an_unknown_outcome_of_the_recovery_write_appends_nothing(local, monkeypatch):
    write_upstream(local, seed=34)
    committer = echo_consumer(local, max_messages=1000, on_stage=crash_at("checkpointed"))
    with pytest.raises(Crash):
        committer.run(until_idle=True)
    before = heads(local)
    real = MetaStore.put_if_absent

    def put_if_absent(self, path, data):
        if not path.startswith("checkpoints/"):
            return real(self, path, data)
        assert real(self, path, data)
        raise StorageUnavailable("outcome unknown")

    monkeypatch.setattr(MetaStore, "put_if_absent", put_if_absent)
    with pytest.raises(StorageUnavailable):
        echo_consumer(local).recover()
    assert heads(local) == before
    monkeypatch.undo()
    echo_consumer(local).run(until_idle=True)
    assert committed_echo(local) == expected_echo(local)


# -- Defect 4: a checkpoint is checked completely before recovery acts on it ---------------------


def _committed_but_unacked(client) -> tuple[CheckpointStore, Checkpoint]:
    """Checkpoint 2 commits a transaction whose ACK intents were never appended."""
    write_upstream(client, seed=41)
    consumer = echo_consumer(client, max_messages=1000, on_stage=crash_at("checkpointed"))
    with pytest.raises(Crash):
        consumer.run(until_idle=True)
    store = CheckpointStore(client, "echo")
    cp = store.latest()
    assert cp.seq == 2 and len(cp.ack_intents) >= 2
    return store, cp


def _edit_first_intent(store: CheckpointStore, cp: Checkpoint, how: str) -> str:
    journal = cp.ack_intents[0].journal
    clock = 12345
    if how == "garbage":
        intent = AckIntent(journal, b"\x00\x01 not a frame at all\n")
    elif how == "two frames":
        intent = AckIntent(journal, cp.ack_intents[0].intent * 2)
    elif how == "non-ACK message":
        uuid = build_uuid(cp.writer, clock, Flags.OUTSIDE_TXN)
        intent = AckIntent(journal, orjson.dumps({"uuid": str(uuid), "text": "x"}) + b"\n")
    elif how == "ACK of another producer":
        uuid = build_uuid(new_producer_id(), clock, Flags.ACK_TXN)
        intent = AckIntent(journal, orjson.dumps({"uuid": str(uuid)}) + b"\n")
    elif how == "invalid journal":
        journal = "../escape"
        intent = AckIntent(journal, cp.ack_intents[0].intent)
    else:
        raise AssertionError(how)
    edited = replace(cp, ack_intents=[intent, *cp.ack_intents[1:]])
    with open(store.path(cp.seq), "wb") as f:
        f.write(edited.to_json())
    return journal


@pytest.mark.parametrize(
    "how", ["garbage", "two frames", "non-ACK message", "ACK of another producer",
            "invalid journal"],
)
def test_a_checkpoint_with_a_bad_ack_intent_is_refused_before_anything_is_written(local, how):
    store, cp = _committed_but_unacked(local)
    journal = _edit_first_intent(store, cp, how)
    before = heads(local)
    with pytest.raises(CheckpointError) as info:
        echo_consumer(local).run(until_idle=True)
    message = str(info.value)
    assert store.path(cp.seq) in message and "#0" in message and journal in message
    assert store.seqs() == [1, 2]  # no recovery checkpoint
    assert heads(local) == before  # nothing appended anywhere
    # Every read of the outputs still works (nothing unreadable was appended).
    for j in ALL_JOURNALS:
        list(read_uncommitted(local, j))


def test_a_checkpoint_naming_an_invalid_input_journal_is_refused(local):
    store, cp = _committed_but_unacked(local)
    doc = orjson.loads(Path(store.path(cp.seq)).read_bytes())
    doc["offsets"]["bad//name"] = 0
    with open(store.path(cp.seq), "wb") as f:
        f.write(orjson.dumps(doc))
    before = heads(local)
    with pytest.raises(CheckpointError, match="invalid journal"):
        echo_consumer(local).recover()
    assert store.seqs() == [1, 2] and heads(local) == before


def test_an_intent_for_a_deleted_journal_is_skipped_with_a_warning(local, caplog):
    store, cp = _committed_but_unacked(local)
    gone = next(a.journal for a in cp.ack_intents if a.journal != OUTPUTS[0])
    kept = [a for a in cp.ack_intents if a.journal != gone]
    local.delete(gone)
    with caplog.at_level(logging.WARNING, logger="oncelog.consumer.checkpoint"):
        seq = echo_consumer(local).recover()
    assert seq == 3
    assert any(gone in r.getMessage() and "no longer exists" in r.getMessage()
               for r in caplog.records)
    assert not local.exists(gone)
    recovered = store.load(3)
    assert recovered.ack_intents == kept
    assert recovered.ack_producer == cp.writer
    # The kept intents were appended: their outputs are committed.
    committed = committed_echo(local, outputs=[a.journal for a in kept])
    assert sum(committed.values()) > 0


def test_an_old_recovery_checkpoint_without_ack_producer_is_still_accepted(local):
    """Checkpoints written before `ack_producer` existed: a commit's intents must be the
    writer's; a recovery's (copied from its base) must all be of one producer."""
    store, cp = _committed_but_unacked(local)
    doc = orjson.loads(Path(store.path(cp.seq)).read_bytes())
    del doc["ack_producer"]
    doc["reason"] = "recover"
    doc["writer"] = new_producer_id().hex()
    with open(store.path(cp.seq), "wb") as f:
        f.write(orjson.dumps(doc))
    echo_consumer(local).run(until_idle=True)
    assert committed_echo(local) == expected_echo(local)


def test_an_intent_is_checked_with_the_framing_of_its_journal(local):
    """Intents are decoded with the framing of their journal's content type (CSV here)."""
    from oncelog.consumer.checkpoint import recoverable_intents

    local.create(JournalSpec("down/csv", {"content-type": "text/csv"}))
    producer = new_producer_id()
    ack = build_uuid(producer, 7, Flags.ACK_TXN)
    good = for_content_type("text/csv").marshal(CSVRecord([str(ack)]))
    cp = Checkpoint("echo", 5, ack_intents=[AckIntent("down/csv", good)], writer=producer)
    assert recoverable_intents(local, cp, "the/checkpoint") == cp.ack_intents
    json_ack = orjson.dumps({"uuid": str(ack)}) + b"\n"
    bad = replace(cp, ack_intents=[AckIntent("down/csv", json_ack)])
    with pytest.raises(CheckpointError, match="the/checkpoint.*#0.*down/csv"):
        recoverable_intents(local, bad, "the/checkpoint")
    ndjson_ack = orjson.dumps({"uuid": str(ack)}) + b"\n"
    local.create(JournalSpec("down/json", {"content-type": NDJSON}))
    cp = Checkpoint("echo", 5, ack_intents=[AckIntent("down/json", ndjson_ack)], writer=producer)
    assert recoverable_intents(local, cp, "the/checkpoint") == cp.ack_intents


# -- many paused and killed instances, with pruning ---------------------------------------------

HERE = Path(__file__).resolve()
CHILD_ATTEMPTS = 300
CHILD_TIMEOUT = 60


def child(url: str, options: str, group: str, max_messages: int) -> int:
    """Consume until drained, starting over (a new instance) whenever fenced out."""
    client = open_journals(url, **json.loads(options))
    fenced = zombie = 0
    for _ in range(CHILD_ATTEMPTS):
        consumer = echo_consumer(client, group, keep_checkpoints=2, max_messages=max_messages)
        try:
            consumer.run(until_idle=True)
            break
        except FencedOut as exc:
            fenced += 1
            zombie += "was written, but" in str(exc)
    else:
        return 4
    print(json.dumps({"fenced": fenced, "zombie": zombie}), flush=True)
    client.close()
    return 0


def spawn(target, group: str, max_messages: int) -> subprocess.Popen:
    args = [sys.executable, str(HERE), "child", target.url, json.dumps(target.storage_options),
            group, str(max_messages)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.parametrize("seed", range(2))
def test_paused_and_killed_instances_with_pruning_commit_exactly_once(local_store, seed):
    """Three instances of one group race on local disk with keep_checkpoints=2 while
    they are paused (SIGSTOP ... SIGCONT) and killed (SIGKILL, then restarted) at random
    moments chosen by the seed. Whatever the timing, the committed outputs must equal a
    crash-free run's: every resumed zombie is fenced out, even after pruning."""
    rng = random.Random(5000 + seed)
    client = local_store.open()
    create_journals(client)
    write_upstream(client, 5000 + seed, transactions=40)
    procs = [spawn(local_store, "echo", rng.randint(1, 3)) for _ in range(3)]
    finished: list[subprocess.Popen] = []
    events: list[str] = []
    kills = 0
    deadline = time.monotonic() + 10
    try:
        while time.monotonic() < deadline:
            running = [p for p in procs if p.poll() is None]
            if not running:
                break
            victim = rng.choice(running)
            if kills < 3 and rng.random() < 0.2:
                victim.kill()
                victim.wait(WAIT)
                procs.remove(victim)
                finished.append(victim)
                procs.append(spawn(local_store, "echo", rng.randint(1, 3)))
                kills += 1
                events.append("kill")
            else:
                victim.send_signal(signal.SIGSTOP)
                time.sleep(rng.uniform(0.05, 0.5))  # a pause: the others go on meanwhile
                victim.send_signal(signal.SIGCONT)
                events.append("pause")
            time.sleep(rng.uniform(0.0, 0.15))
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=CHILD_TIMEOUT)
        assert p.returncode == 0, f"child failed with {p.returncode}:\n{err}"
        reports.append(json.loads(out.strip().splitlines()[-1]))
    for p in finished:
        p.communicate(timeout=CHILD_TIMEOUT)
    # Whatever is left (a killed instance's last transaction) is finished crash-free.
    echo_consumer(client, keep_checkpoints=2).run(until_idle=True)
    assert committed_echo(client) == expected_echo(client), (events, reports)
    store = CheckpointStore(client, "echo")
    assert store.latest().state["words"] == expected_words(client)
    client.close()


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "child":
        _, _, url, options, group, max_messages = sys.argv
        sys.exit(child(url, options, group, int(max_messages)))
    sys.exit(f"usage: {sys.argv[0]} child URL OPTIONS GROUP MAX_MESSAGES")
