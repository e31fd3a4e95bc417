"""Exactly-once consumers in one process: transactions, checkpoints, recovery, fencing,
bad input, tailing, journal discovery, shards and group operations."""

from __future__ import annotations

import base64
import os
import threading
import types
from collections import Counter
from datetime import datetime, timezone

import orjson
import pytest
from consumer_support import (
    INPUTS,
    NDJSON,
    OUTPUTS,
    RARE,
    SELECTOR,
    committed_echo,
    create_journals,
    echo,
    echo_consumer,
    expected_echo,
    expected_words,
    to,
    write_upstream,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oncelog.consumer import (
    STAGES,
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    Consumer,
    ConsumerError,
    FencedOut,
    GroupNotFound,
    _input,
    core,
    delete_group,
    group_status,
    list_groups,
    prune_checkpoints,
    reset_group,
    shard_journals,
    shard_of,
    validate_group_name,
)
from oncelog.consumer.shards import mix32
from oncelog.journal import JournalSpec, open_journals
from oncelog.message import Envelope, Flags, JSONMessage, build_uuid, new_producer_id
from oncelog.publisher import AckIntent, Publisher
from oncelog.reading import read_committed, read_uncommitted
from oncelog.sequencer import ProducerState, QueueOutcome, Sequencer
from oncelog.testing import assert_exactly_once, histories, run_history


class Crash(BaseException):
    """Stands for the process dying at a stage (raised from the stage hook)."""


def crash_at(stage: str, nth: int = 1):
    seen = Counter()

    def hook(name: str) -> None:
        seen[name] += 1
        if name == stage and seen[name] == nth:
            raise Crash(f"{stage}#{nth}")

    return hook


def committed_docs(client, journal):
    return [env.message.doc for env in read_committed(client, journal)]


def strip_uuids(docs):
    return [{k: v for k, v in d.items() if k != "uuid"} for d in docs]


@pytest.fixture
def local(local_store):
    client = local_store.open()
    create_journals(client)
    yield client
    client.close()


# -- the pipeline ---------------------------------------------------------------------------------


def test_echo_pipeline_is_exactly_once_on_each_store(journals):
    create_journals(journals)
    write_upstream(journals, seed=7)
    consumer = echo_consumer(journals)
    commits = consumer.run(until_idle=True)
    expected = expected_echo(journals)
    assert sum(expected.values()) > 20
    assert commits >= 4
    assert committed_echo(journals) == expected
    assert consumer.state["words"] == expected_words(journals)
    # One unbroken chain of checkpoints: the recovery one, then one per commit.
    store = CheckpointStore(journals, "echo")
    assert store.seqs() == list(range(1, commits + 2))
    assert store.load(1).reason == "recover"


def test_checkpoint_records_offsets_producers_intents_and_state(local):
    write_upstream(local, seed=8)
    consumer = echo_consumer(local, max_messages=1000)
    assert consumer.run(until_idle=True) == 1
    cp = CheckpointStore(local, "echo").latest()
    assert cp.seq == consumer.checkpoint_seq == 2
    assert cp.group == "echo" and cp.shard is None and cp.reason == "commit"
    assert cp.offsets == {j: local.head(j) for j in INPUTS}
    assert cp.writer == consumer.producer_id
    assert cp.state == consumer.state
    assert (datetime.now(timezone.utc) - cp.created).total_seconds() < 60
    # The producer states are the sequencer's: both upstream producers, per input.
    assert {(p.journal, p.producer) for p in cp.producers} >= {
        (j, env.producer) for j in INPUTS for env in read_committed(local, j)
    }
    # One ACK per output written, from this instance, re-appendable as is.
    rare = any(kind == "<rare>" for _, _, kind in expected_echo(local))
    assert sorted(a.journal for a in cp.ack_intents) == sorted(
        {OUTPUTS[0], OUTPUTS[1]} | ({RARE} if rare else set())
    )
    for intent in cp.ack_intents:
        doc = orjson.loads(intent.intent)
        env = Envelope(intent.journal, 0, len(intent.intent), JSONMessage(doc))
        assert env.flags == Flags.ACK_TXN and env.producer == consumer.producer_id


def test_recovery_resumes_from_the_checkpoint_with_a_new_producer(local):
    write_upstream(local, seed=9)
    first = echo_consumer(local, max_messages=3)
    assert first.run(until_idle=True, max_transactions=2) == 2
    state = first.state
    first.close()
    second = echo_consumer(local, max_messages=3)
    second.recover()
    assert second.state == state
    assert second.producer_id != first.producer_id
    second.run(until_idle=True)
    assert committed_echo(local) == expected_echo(local)
    assert second.state["words"] == expected_words(local)


def test_recovery_reappends_the_ack_intents_of_the_latest_checkpoint(local):
    write_upstream(local, seed=10)
    consumer = echo_consumer(local, max_messages=1000, on_stage=crash_at("checkpointed"))
    with pytest.raises(Crash):
        consumer.run(until_idle=True)
    # Checkpointed but not acknowledged: nothing visible yet.
    assert CheckpointStore(local, "echo").latest().reason == "commit"
    assert committed_echo(local) == Counter()
    recovered = echo_consumer(local)
    recovered.recover()
    assert committed_echo(local) == expected_echo(local)
    # Re-appending them again (another recovery) changes nothing.
    echo_consumer(local).recover()
    echo_consumer(local).run(until_idle=True)
    assert committed_echo(local) == expected_echo(local)


def test_a_duplicated_ack_is_an_ack_rollback_that_delivers_nothing_again():
    producer = new_producer_id()

    def env(offset, clock, flags):
        doc = {"uuid": str(build_uuid(producer, clock, flags))}
        return Envelope("j", offset, offset + 1, JSONMessage(doc))

    seq = Sequencer()
    assert seq.queue_uncommitted(env(0, 10, Flags.CONTINUE_TXN)) is QueueOutcome.CONTINUE_BEGIN_SPAN
    assert seq.queue_uncommitted(env(1, 11, Flags.ACK_TXN)) is QueueOutcome.ACK_COMMIT_RING
    assert [e.begin for e in iter(seq.step, None)] == [0, 1]
    # The same ACK again (a recovery re-appends it), and again later: nothing redelivered.
    assert seq.queue_uncommitted(env(2, 11, Flags.ACK_TXN)) is QueueOutcome.ACK_ROLLBACK
    assert seq.step() is None
    # A message published after the ACK by the dead producer is rolled back by the re-ACK.
    assert seq.queue_uncommitted(env(3, 12, Flags.CONTINUE_TXN)) is QueueOutcome.CONTINUE_BEGIN_SPAN
    assert seq.queue_uncommitted(env(4, 11, Flags.ACK_TXN)) is QueueOutcome.ACK_ROLLBACK
    assert seq.step() is None
    offsets, states = seq.checkpoint()
    assert states == [ProducerState("j", producer, 11, -1)]


def test_upstream_rollbacks_and_duplicates_do_not_reach_the_outputs(local):
    upstream = Publisher(local)
    with upstream.transaction():
        upstream.publish_uncommitted(to(INPUTS[0]), JSONMessage({"text": "kept"}))
    with pytest.raises(KeyError):
        with upstream.transaction():
            upstream.publish_uncommitted(to(INPUTS[0]), JSONMessage({"text": "rolled back"}))
            raise KeyError
    upstream.publish_committed(to(INPUTS[0]), JSONMessage({"text": "solo"})).result()
    first = next(read_uncommitted(local, INPUTS[0]))
    with local.read(INPUTS[0], first.begin) as reader:
        local.append(INPUTS[0], reader.read(first.end - first.begin))  # a duplicate
    upstream.publish_uncommitted(to(INPUTS[0]), JSONMessage({"text": "pending"}))
    upstream.flush()
    echo_consumer(local).run(until_idle=True)
    assert [d["text"] for d in committed_docs(local, OUTPUTS[0])] == ["kept", "solo"]


# -- aborts and bad input -------------------------------------------------------------------------


def test_a_handler_exception_aborts_the_transaction_with_nothing_published(local):
    write_upstream(local, seed=11)
    calls = 0

    def flaky(env, txn):
        nonlocal calls
        calls += 1
        echo(env, txn)  # publishes first, then fails
        if calls == 7:
            raise ValueError("handler bug")

    consumer = Consumer(local, "echo", SELECTOR, flaky, initial_state={}, max_messages=5)
    with pytest.raises(ValueError, match="handler bug"):
        consumer.run(until_idle=True)
    # Only the first transaction (5 messages) is visible; the aborted one's outputs are
    # in the journals, rolled back.
    visible = committed_echo(local)
    first = {(src, i) for src, i, _ in visible}
    assert len(first) == 5
    assert visible == Counter({k: v for k, v in expected_echo(local).items() if k[:2] in first})
    appended = sum(len(list(read_uncommitted(local, j))) for j in (*OUTPUTS, RARE))
    assert appended > sum(visible.values())
    # Running again recovers from the last checkpoint and completes exactly once.
    consumer.run(until_idle=True)
    assert committed_echo(local) == expected_echo(local)
    assert consumer.state["words"] == expected_words(local)


def test_a_state_that_is_not_json_is_an_error_and_nothing_is_published(local):
    write_upstream(local, seed=12)

    def bad(env, txn):
        echo(env, txn)
        txn.state["when"] = object()

    consumer = Consumer(local, "echo", SELECTOR, bad, initial_state={})
    with pytest.raises(ConsumerError, match="not JSON-serialisable"):
        consumer.run(until_idle=True)
    assert committed_echo(local) == Counter()
    assert CheckpointStore(local, "echo").seqs() == [1]


def test_an_initial_state_that_is_not_json_is_refused(local):
    with pytest.raises(ConsumerError, match="not JSON-serialisable"):
        Consumer(local, "g", SELECTOR, echo, initial_state={1j}).recover()


def _corrupt(doc_bytes: bytes, how: str) -> bytes:
    doc = orjson.loads(doc_bytes)
    if how == "not json":
        return b"{not json"
    if how == "not an object":
        return b"[1, 2]"
    if how == "format":
        doc["format"] = "something-else/9"
    elif how == "missing offsets":
        del doc["offsets"]
    elif how == "bad offset":
        doc["offsets"] = {INPUTS[0]: -5}
    elif how == "bad intent":
        doc["ack_intents"] = [{"journal": OUTPUTS[0], "intent": "**not base64**"}]
    elif how == "bad producer":
        doc["producers"] = [{"journal": INPUTS[0], "producer": "zz", "last_ack": 1, "begin": -1}]
    elif how == "another seq":
        doc["seq"] = 99
    elif how == "another group":
        doc["group"] = "other"
    return orjson.dumps(doc)


@pytest.mark.parametrize(
    "how",
    ["not json", "not an object", "format", "missing offsets", "bad offset", "bad intent",
     "bad producer", "another seq", "another group"],
)
def test_a_corrupt_checkpoint_is_an_error_naming_the_file(local_store, how):
    client = local_store.open()
    create_journals(client)
    write_upstream(client, seed=13)
    echo_consumer(client).run(until_idle=True)
    store = CheckpointStore(client, "echo")
    seqs = store.seqs()
    path = store.path(seqs[-1])
    with open(path, "rb") as f:
        good = f.read()
    with open(path, "wb") as f:
        f.write(_corrupt(good, how))
    with pytest.raises(CheckpointError) as info:
        echo_consumer(client).run(until_idle=True)
    assert path in str(info.value)
    assert store.seqs() == seqs  # never silently restarted from zero
    with pytest.raises(CheckpointError, match="corrupt"):
        group_status(client, "echo")


def test_an_unreadable_checkpoint_is_an_error_naming_the_file(local_store):
    client = local_store.open()
    create_journals(client)
    echo_consumer(client).recover()
    store = CheckpointStore(client, "echo")
    os.mkdir(store.path(7))  # listed as checkpoint 7, but cannot be read
    with pytest.raises(CheckpointError, match="cannot read") as info:
        echo_consumer(client).recover()
    assert store.path(7) in str(info.value)


# -- fencing --------------------------------------------------------------------------------------


def test_a_fenced_out_instance_publishes_nothing_more(local):
    write_upstream(local, seed=14)
    zombie = echo_consumer(local)
    zombie.recover()  # checkpoint 1
    zombie_id = zombie.producer_id
    successor = echo_consumer(local)
    successor.recover()  # takes the group over: checkpoint 2
    with pytest.raises(FencedOut, match="0000000000000002.json"):
        zombie.run(until_idle=True)  # its first commit would be checkpoint 2: taken
    assert zombie.fenced
    with pytest.raises(FencedOut):
        zombie.run(until_idle=True)
    zombie_outputs = {
        (j, e.begin) for j in (*OUTPUTS, RARE) for e in read_uncommitted(local, j)
        if e.producer == zombie_id
    }
    assert zombie_outputs  # it did publish (uncommitted) before its commit failed
    successor.run(until_idle=True)
    assert committed_echo(local) == expected_echo(local)
    committed_from_zombie = [
        e for j in (*OUTPUTS, RARE) for e in read_committed(local, j)
        if (j, e.begin) in zombie_outputs
    ]
    assert committed_from_zombie == []


def test_racing_threads_commit_each_checkpoint_once(local):
    write_upstream(local, seed=15, transactions=15)
    errors = []

    def instance():
        for _ in range(100):
            try:
                echo_consumer(local, keep_checkpoints=None, max_messages=2).run(until_idle=True)
                return
            except FencedOut:
                continue
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
                return

    threads = [threading.Thread(target=instance) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    assert committed_echo(local) == expected_echo(local)
    seqs = CheckpointStore(local, "echo").seqs()
    assert seqs == list(range(1, seqs[-1] + 1))


# -- transactions, tailing, discovery -------------------------------------------------------------


def _committed_messages(client, journal, n):
    publisher = Publisher(client)
    for i in range(n):
        publisher.publish_committed(to(journal), JSONMessage({"text": f"m{i}"}))
    publisher.flush()


def test_transactions_are_bounded_by_max_messages(local):
    _committed_messages(local, INPUTS[0], 23)
    sizes = []
    consumer = Consumer(local, "g", [INPUTS[0]], lambda e, t: None, max_messages=5,
                        finalize=lambda txn: sizes.append(txn.messages))
    assert consumer.run(until_idle=True) == 5
    assert sizes == [5, 5, 5, 5, 3]


def test_transactions_are_bounded_by_duration(local, monkeypatch):
    _committed_messages(local, INPUTS[0], 10)
    now = [1000.0]
    clock = types.SimpleNamespace(monotonic=lambda: now[0])
    monkeypatch.setattr(core, "time", clock)  # transactions' deadlines
    monkeypatch.setattr(_input, "time", clock)  # and the reading loop's checks of them

    def slow(env, txn):
        now[0] += 1.0  # each message takes a (fake) second

    sizes = []
    consumer = Consumer(local, "g", [INPUTS[0]], slow, max_duration=2.5,
                        finalize=lambda txn: sizes.append(txn.messages))
    consumer.run(until_idle=True)
    assert sizes == [3, 3, 3, 1]


def test_a_transaction_can_close_itself(local):
    _committed_messages(local, INPUTS[0], 6)
    sizes = []

    def handler(env, txn):
        if env.message.doc["text"] == "m1":
            txn.close()

    Consumer(local, "g", [INPUTS[0]], handler,
             finalize=lambda txn: sizes.append(txn.messages)).run(until_idle=True)
    assert sizes == [2, 4]


def test_tailing_consumes_new_input_until_stopped(local):
    committed = threading.Condition()
    commits = [0]

    def on_stage(name):
        if name == "committed":
            with committed:
                commits[0] += 1
                committed.notify_all()

    consumer = echo_consumer(local, poll_interval=0.01, on_stage=on_stage)
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("n", consumer.run()))
    thread.start()
    try:
        for journal, count in ((INPUTS[0], 3), (INPUTS[1], 2)):
            _committed_messages(local, journal, count)
            expected = expected_echo(local)
            with committed:  # re-checked after each commit of the consumer
                assert committed.wait_for(lambda: committed_echo(local) == expected, timeout=30)
    finally:
        consumer.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert result["n"] >= 2
    assert committed_echo(local) == expected_echo(local)


def test_new_journals_matching_the_selector_are_picked_up(local):
    _committed_messages(local, INPUTS[0], 2)
    consumer = echo_consumer(local, refresh_interval=1e-6)
    consumer.run(until_idle=True)
    assert consumer.journals == list(INPUTS)
    local.create(JournalSpec("up/in-late", {"content-type": NDJSON, "role": "input"}))
    _committed_messages(local, "up/in-late", 3)
    consumer.run(until_idle=True)
    assert "up/in-late" in consumer.journals
    srcs = Counter(d["src"] for d in committed_docs(local, OUTPUTS[0]))
    assert srcs == {INPUTS[0]: 2, "up/in-late": 3}
    assert CheckpointStore(local, "echo").latest().offsets["up/in-late"] == local.head("up/in-late")


def test_start_at_head_skips_earlier_input_and_remembers_where(local):
    _committed_messages(local, INPUTS[0], 4)
    consumer = echo_consumer(local, start="head")
    consumer.recover()
    head = local.head(INPUTS[0])
    assert CheckpointStore(local, "echo").latest().offsets[INPUTS[0]] == head
    consumer.close()
    _committed_messages(local, INPUTS[0], 2)  # appended while no instance runs
    echo_consumer(local, start="head").run(until_idle=True)
    assert [d["text"] for d in committed_docs(local, OUTPUTS[0])] == ["m0", "m1"]


def test_a_journal_list_and_nil_uuid_messages(local):
    local.append(INPUTS[1], b'{"text": "no uuid"}\n')
    outputs = []
    Consumer(local, "g", [INPUTS[1]], lambda e, t: outputs.append(e.message.doc["text"])).run(
        until_idle=True
    )
    assert outputs == ["no uuid"]


# -- shards ---------------------------------------------------------------------------------------


def test_shards_split_the_journals_and_keep_their_own_checkpoints(local):
    names = [f"up/part-{i:02d}" for i in range(8)]
    for name in names:
        local.create(JournalSpec(name, {"content-type": NDJSON, "role": "input"}))
        _committed_messages(local, name, 2)
    seen = {}
    for shard in range(3):
        consumer = echo_consumer(local, "sharded", shards=3, shard=shard)
        consumer.run(until_idle=True)
        seen[shard] = consumer.journals
        assert sorted(consumer.journals) == sorted(shard_journals(names + list(INPUTS), shard, 3))
        assert CheckpointStore(local, "sharded", shard, 3).latest().offsets.keys() == set(
            consumer.journals
        )
    assert sorted(j for js in seen.values() for j in js) == sorted(names + list(INPUTS))
    srcs = Counter(d["src"] for j in OUTPUTS for d in committed_docs(local, j) if "text" in d)
    assert srcs == {name: 2 for name in names}
    status = group_status(local, "sharded")
    assert status.shards == 3 and [m.shard for m in status.members] == [0, 1, 2]
    assert status.lag == 0
    with pytest.raises(ConsumerError, match="3 shard"):
        echo_consumer(local, "sharded", shards=2, shard=0).recover()


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=30, unique=True),
       st.integers(1, 12))
def test_shard_of_is_rendezvous_over_shard_names(journals, shards):
    from oncelog.consumer.shards import mix32
    from oncelog.mapping import fnv1a32

    for journal in journals:
        i = shard_of(journal, shards)
        key = fnv1a32(journal.encode())
        scores = [mix32(key ^ fnv1a32(f"shard-{k:03d}".encode())) for k in range(shards)]
        assert i == scores.index(max(scores))
        # One more shard moves a journal to the new shard or nowhere.
        assert shard_of(journal, shards + 1) in (i, shards)
    parts = [shard_journals(journals, k, shards) for k in range(shards)]
    assert sorted(j for p in parts for j in p) == sorted(journals)


# -- group operations -----------------------------------------------------------------------------


def test_shards_are_balanced_for_similar_names():
    names = [f"logs/part-{i:03d}" for i in range(120)]
    sizes = [len(shard_journals(names, k, 4)) for k in range(4)]
    assert min(sizes) >= 15 and sum(sizes) == 120


def test_mix32_matches_murmur3_finaliser():
    assert mix32(0) == 0
    # MurmurHash3_x86_32("", seed=1) is fmix32(1): a published test vector.
    assert mix32(1) == 0x514E28B7


def test_group_status_reports_position_and_lag(local):
    _committed_messages(local, INPUTS[0], 3)
    echo_consumer(local).run(until_idle=True)
    before = local.head(INPUTS[0])
    _committed_messages(local, INPUTS[0], 2)
    status = group_status(local, "echo")
    assert list_groups(local) == ["echo"]
    (member,) = status.members
    lags = {j.journal: j for j in member.journals}
    assert lags[INPUTS[0]].offset == before
    assert lags[INPUTS[0]].lag == local.head(INPUTS[0]) - before > 0
    assert lags[INPUTS[1]].lag == 0
    assert status.lag == member.lag == lags[INPUTS[0]].lag
    with pytest.raises(GroupNotFound):
        group_status(local, "nobody")


def test_reset_to_the_beginning_reprocesses_and_fences_running_instances(local):
    _committed_messages(local, INPUTS[0], 3)
    running = echo_consumer(local)
    running.run(until_idle=True)
    (cp,) = reset_group(local, "echo", "beginning")
    assert cp.offsets == {INPUTS[0]: 0, INPUTS[1]: 0}
    assert cp.producers == [] and not cp.has_state and cp.reason == "reset to beginning"
    _committed_messages(local, INPUTS[0], 1)
    with pytest.raises(FencedOut):
        running.run(until_idle=True)
    fresh = echo_consumer(local)
    fresh.run(until_idle=True)
    assert fresh.state["seen"] == {INPUTS[0]: 4}  # state restarted with the input
    texts = [d["text"] for d in committed_docs(local, OUTPUTS[0])]
    assert texts == ["m0", "m1", "m2", "m0", "m1", "m2", "m0"]


def test_reset_to_the_head_keeps_state_on_request(local):
    _committed_messages(local, INPUTS[0], 3)
    consumer = echo_consumer(local)
    consumer.run(until_idle=True)
    _committed_messages(local, INPUTS[0], 2)  # to be skipped
    (cp,) = reset_group(local, "echo", "head", keep_state=True)
    assert cp.offsets == {j: local.head(j) for j in INPUTS}
    assert cp.state == consumer.state
    resumed = echo_consumer(local)
    resumed.run(until_idle=True)
    assert resumed.state == consumer.state
    assert len(committed_docs(local, OUTPUTS[0])) == 3
    with pytest.raises(ValueError, match="beginning"):
        reset_group(local, "echo", "middle")


def test_prune_and_automatic_pruning_keep_the_newest(local):
    _committed_messages(local, INPUTS[0], 12)
    echo_consumer(local, max_messages=1, keep_checkpoints=None).run(until_idle=True)
    store = CheckpointStore(local, "echo")
    assert store.seqs() == list(range(1, 14))
    assert prune_checkpoints(local, "echo", keep=3) == 10
    assert store.seqs() == [11, 12, 13]
    with pytest.raises(ValueError, match="keep"):
        prune_checkpoints(local, "echo", keep=0)
    _committed_messages(local, INPUTS[0], 12)
    echo_consumer(local, max_messages=1, keep_checkpoints=4).run(until_idle=True)
    seqs = store.seqs()
    assert seqs[-1] == 26 and len(seqs) <= 2 * 4
    assert committed_echo(local) == expected_echo(local)


def test_delete_group(local):
    echo_consumer(local).recover()
    echo_consumer(local, "other").recover()
    assert list_groups(local) == ["echo", "other"]
    assert delete_group(local, "echo") == 1
    assert list_groups(local) == ["other"]
    assert CheckpointStore(local, "echo").seqs() == []


# -- validation and formats -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "sp ace", "x" * 129, 5])
def test_bad_group_names_are_refused(name):
    with pytest.raises(ValueError, match="group name"):
        validate_group_name(name)


def test_bad_options_are_refused(local):
    with pytest.raises(ValueError, match="max_messages"):
        Consumer(local, "g", SELECTOR, echo, max_messages=0)
    with pytest.raises(ValueError, match="shard"):
        Consumer(local, "g", SELECTOR, echo, shards=2, shard=2)
    with pytest.raises(ValueError, match="start"):
        Consumer(local, "g", SELECTOR, echo, start="middle")
    with pytest.raises(TypeError, match="journals"):
        Consumer(local, "g", [INPUTS[0], 3], echo)
    with pytest.raises(ValueError, match="max_duration"):
        Consumer(local, "g", SELECTOR, echo, max_duration=0)
    with pytest.raises(ValueError, match="shard"):
        Consumer(local, "g", SELECTOR, echo, shard=1)
    with pytest.raises(ValueError, match="prune_horizon"):
        Consumer(local, "g", SELECTOR, echo, prune_horizon=-1)
    with pytest.raises(ValueError, match="keep_checkpoints"):
        Consumer(local, "g", SELECTOR, echo, keep_checkpoints=0)


_states = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=10,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    offsets=st.dictionaries(st.sampled_from(["a", "b/c", "d-e"]), st.integers(0, 2**62)),
    producers=st.lists(
        st.builds(ProducerState, st.sampled_from(["a", "b/c"]), st.binary(min_size=6, max_size=6),
                  st.integers(0, 2**64 - 1), st.integers(-1, 2**40)),
        max_size=4,
    ),
    intents=st.lists(st.builds(AckIntent, st.sampled_from(["x", "y/z"]), st.binary(max_size=40)),
                     max_size=3),
    state=_states,
    shard=st.none() | st.integers(0, 3),
)
def test_checkpoint_json_round_trips(offsets, producers, intents, state, shard):
    cp = Checkpoint("g", 42, offsets, producers, intents, state, True,
                    shard=shard, shards=1 if shard is None else 4, writer=new_producer_id())
    again = Checkpoint.from_json(cp.to_json(), "test")
    assert again == cp
    assert Checkpoint.from_json(cp.to_json(orjson.dumps(state)), "test") == cp


def test_ack_intents_are_stored_as_base64():
    cp = Checkpoint("g", 1, ack_intents=[AckIntent("j", b"\x00\xffbytes\n")])
    doc = orjson.loads(cp.to_json())
    encoded = base64.b64encode(b"\x00\xffbytes\n").decode()
    assert doc["ack_intents"] == [{"journal": "j", "intent": encoded}]
    assert "state" not in doc


# -- property: random upstream histories, random crashes ------------------------------------------


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    history=histories(producers=2, journals=2, min_steps=20, max_steps=40),
    max_messages=st.integers(1, 6),
    crashes=st.lists(st.tuples(st.sampled_from(STAGES), st.integers(1, 4)), max_size=3),
)
def test_exactly_once_over_random_histories_and_crashes(history, max_messages, crashes):
    """Upstream histories from oncelog.testing (interleaved producers, rollbacks, producer
    crashes, duplicated appends); the consumer dies (an exception from the stage hook) at
    random stages and is restarted. Each committed input is output exactly once."""
    import uuid

    import fsspec

    root = f"/consumer-prop-{uuid.uuid4().hex}"
    client = open_journals(f"memory://{root}")
    inputs = ["p/in-0", "p/in-1"]
    try:
        create_journals(client, inputs=inputs, outputs=["p/out-0", "p/out-1"])
        run = run_history(client, inputs, history)

        def forward(env, txn):
            doc = env.message.doc
            txn.publish(to(f"p/out-{doc['id'] % 2}"), JSONMessage({"id": doc["id"]}))

        def consumer(**kw):
            return Consumer(client, "fwd", inputs, forward, max_messages=max_messages, **kw)

        for stage, nth in crashes:
            try:
                consumer(on_stage=crash_at(stage, nth)).run(until_idle=True)
            except Crash:
                pass
        consumer().run(until_idle=True)
        outputs = [d for j in ("p/out-0", "p/out-1") for d in committed_docs(client, j)]
        assert_exactly_once(run.model.committed_keys(), outputs, output_key=lambda d: d["id"])
    finally:
        client.close()
        fs = fsspec.filesystem("memory")
        if fs.exists(root):
            fs.rm(root, recursive=True)
