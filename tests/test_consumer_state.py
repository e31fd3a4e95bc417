"""Pluggable consumer state: the SQLite key-value state (deltas + snapshots written before
the checkpoint claim), its rollback, recovery, pruning and deletion, and SIGKILLs at random
storage writes (local disk and the S3 test server) compared with a crash-free run.

This file is also the child process: `python tests/test_consumer_state.py child ...`.
"""

from __future__ import annotations

import json
import random
import signal
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from consumer_support import (
    INPUTS,
    OUTPUTS,
    RARE,
    SELECTOR,
    committed_echo,
    create_journals,
    expected_echo,
    expected_words,
    to,
    write_upstream,
)

from oncelog.consumer import (
    CheckpointError,
    CheckpointStore,
    Consumer,
    ConsumerError,
    SQLiteState,
    Transaction,
    delete_group,
    prune_checkpoints,
    reset_group,
)
from oncelog.consumer.state import is_sqlite_ref, state_object_names
from oncelog.coordination import MetaStore
from oncelog.journal import JournalClient, open_journals
from oncelog.message import Envelope, JSONMessage
from oncelog.publisher import Publisher
from oncelog.testing.faults import kill_after_writes
from oncelog.testing.processes import run_python

HERE = Path(__file__).resolve()
CHILD_TIMEOUT = 120
STATE_DIR = "checkpoints/kv/state"


# -- an echo pipeline whose state is in SQLite ----------------------------------------------


def kv_echo(env: Envelope, txn: Transaction) -> None:
    """consumer_support.echo with its state in `txn.kv`: per journal the number of messages
    seen, per word its count."""
    kv = txn.kv
    assert kv is not None
    index = kv.get(f"seen:{env.journal}", 0)
    kv.put(f"seen:{env.journal}", index + 1)
    words = env.message.doc["text"].split()
    counts = kv.get_many(f"word:{w}" for w in set(words))
    for word in words:
        counts[f"word:{word}"] = counts.get(f"word:{word}", 0) + 1
    kv.update(counts)
    out = OUTPUTS[INPUTS.index(env.journal) % len(OUTPUTS)]
    text = env.message.doc["text"]
    txn.publish(to(out), JSONMessage({"src": env.journal, "i": index, "text": text}))
    if index % 2 == 0:
        other = OUTPUTS[(OUTPUTS.index(out) + 1) % len(OUTPUTS)]
        txn.publish(to(other), JSONMessage({"src": env.journal, "i": index, "mirror": True}))
    ws = text.split()
    if len(ws) >= 3 and ws[0] == "zeta":
        txn.publish(to(RARE), JSONMessage({"src": env.journal, "i": index, "rare": True}))


def kv_echo_batch(envs: list[Envelope], txn: Transaction) -> None:
    for env in envs:
        kv_echo(env, txn)


def kv_consumer(client: JournalClient, batch: bool = False, **kwargs: Any) -> Consumer:
    kwargs.setdefault("max_messages", 5)
    kwargs.setdefault("keep_checkpoints", 3)
    kwargs.setdefault("state", SQLiteState(snapshot_every=3))
    if batch:
        return Consumer(client, "kv", SELECTOR, batch_handler=kv_echo_batch, **kwargs)
    return Consumer(client, "kv", SELECTOR, kv_echo, **kwargs)


def final_kv(client: JournalClient) -> dict[str, Any]:
    consumer = kv_consumer(client)
    consumer.recover()
    assert consumer.kv is not None
    out = consumer.kv.to_dict()
    consumer.close()
    return out


def expected_kv(client: JournalClient) -> dict[str, Any]:
    out: dict[str, Any] = {f"word:{w}": c for w, c in expected_words(client).items()}
    seen = Counter(j for (j, _i, kind) in expected_echo(client).elements()
                   if kind not in ("<mirror>", "<rare>"))
    out.update({f"seen:{j}": n for j, n in seen.items()})
    return out


def check_exactly_once(client: JournalClient, context: object = None) -> None:
    assert committed_echo(client) == expected_echo(client), context
    assert final_kv(client) == expected_kv(client), context


# -- the API and local behaviour ---------------------------------------------------------------


def test_kv_state_commits_and_recovers(local_store) -> None:
    client = local_store.open()
    create_journals(client)
    write_upstream(client, seed=1)
    consumer = kv_consumer(client)
    assert consumer.run(until_idle=True) > 3
    assert consumer.kv is not None and consumer.kv.to_dict() == expected_kv(client)
    consumer.close()
    check_exactly_once(client)
    cp = CheckpointStore(client, "kv").latest()
    assert cp is not None and is_sqlite_ref(cp.state)
    assert len(cp.state["deltas"]) < 3  # snapshot_every=3
    # The checkpoint is small: it references objects, it does not hold the state.
    assert b"word:" not in cp.to_json()


def test_batch_handler_with_kv_state(local_store) -> None:
    client = local_store.open()
    create_journals(client)
    write_upstream(client, seed=2)
    kv_consumer(client, batch=True).run(until_idle=True)
    check_exactly_once(client)


def test_kv_api(memory_store) -> None:
    client = memory_store.open()
    create_journals(client)
    Publisher(client).publish_committed(to(INPUTS[0]), JSONMessage({"text": "x"})).result()
    seen: dict[str, Any] = {}

    def handler(env: Envelope, txn: Transaction) -> None:
        kv = txn.kv
        assert kv is not None and txn.state is None
        kv["a"] = {"n": 1, "t": (1, 2)}
        kv.put("b", [1])
        kv.update({"c": None, "d": "x"})
        kv.delete("b")
        del kv["d"]
        seen.update(
            a=kv["a"], has_b="b" in kv, c=kv.get("c", 5), missing=kv.get("zz", 7), n=len(kv),
            keys=list(kv.keys()), many=kv.get_many(["a", "c", "q"]),
        )
        with pytest.raises(KeyError):
            kv["b"]
        with pytest.raises(TypeError):
            kv.put(1, 2)  # type: ignore[arg-type]
        with pytest.raises(ConsumerError, match="not JSON-serialisable"):
            kv.put("bad", object())

    Consumer(client, "kv", [INPUTS[0]], handler, state=SQLiteState()).run(until_idle=True)
    assert seen == {
        "a": {"n": 1, "t": [1, 2]}, "has_b": False, "c": None, "missing": 7, "n": 2,
        "keys": ["a", "c"], "many": {"a": {"n": 1, "t": [1, 2]}, "c": None},
    }
    assert final_kv_of(client, "kv", [INPUTS[0]]) == {"a": {"n": 1, "t": [1, 2]}, "c": None}
    with pytest.raises(ValueError, match="snapshot_every"):
        SQLiteState(snapshot_every=0)
    with pytest.raises(ValueError, match="initial_state"):
        Consumer(client, "kv", [INPUTS[0]], handler, state=SQLiteState(), initial_state={})
    with pytest.raises(ValueError, match="state must be"):
        Consumer(client, "kv", [INPUTS[0]], handler, state="yaml")  # type: ignore[arg-type]


def final_kv_of(client: JournalClient, group: str, journals: list[str]) -> dict[str, Any]:
    consumer = Consumer(client, group, journals, lambda e, t: None, state=SQLiteState())
    consumer.recover()
    assert consumer.kv is not None
    out = consumer.kv.to_dict()
    consumer.close()
    return out


class Boom(Exception):
    pass


def test_aborted_transaction_leaves_no_change(memory_store) -> None:
    """A handler error aborts the transaction: its KV writes are rolled back locally and
    never reach the store; the next run redoes the input exactly once."""
    client = memory_store.open()
    create_journals(client)
    pub = Publisher(client)
    for i in range(6):
        pub.publish_committed(to(INPUTS[0]), JSONMessage({"text": f"w{i}"}))
    pub.flush()
    fail = {"at": "w4"}

    def handler(env: Envelope, txn: Transaction) -> None:
        assert txn.kv is not None
        txn.kv.put("n", txn.kv.get("n", 0) + 1)
        txn.kv.put(env.message.doc["text"], True)
        if env.message.doc["text"] == fail["at"]:
            raise Boom

    consumer = Consumer(client, "kv", [INPUTS[0]], handler, state=SQLiteState(),
                        max_messages=3)
    with pytest.raises(Boom):
        consumer.run(until_idle=True)
    assert consumer.kv is not None
    assert consumer.kv.to_dict() == {"n": 3, "w0": True, "w1": True, "w2": True}
    fail["at"] = ""
    consumer.run(until_idle=True)
    assert consumer.kv.to_dict()["n"] == 6
    assert final_kv_of(client, "kv", [INPUTS[0]])["n"] == 6


def test_finalizer_writes_join_the_transaction(memory_store) -> None:
    client = memory_store.open()
    create_journals(client)
    pub = Publisher(client)
    for i in range(5):
        pub.publish_committed(to(INPUTS[0]), JSONMessage({"text": f"w{i}"}))
    pub.flush()

    def finalize(txn: Transaction) -> None:
        assert txn.kv is not None
        txn.kv.put("commits", txn.kv.get("commits", 0) + 1)

    n = Consumer(client, "kv", [INPUTS[0]], lambda e, t: None, finalize=finalize,
                 state=SQLiteState(), max_messages=2).run(until_idle=True)
    assert final_kv_of(client, "kv", [INPUTS[0]]) == {"commits": n}


def test_snapshots_deltas_and_pruning(local_store) -> None:
    client = local_store.open()
    create_journals(client)
    write_upstream(client, seed=3, transactions=20)
    consumer = kv_consumer(client, max_messages=2, keep_checkpoints=None,
                           state=SQLiteState(snapshot_every=4))
    commits = consumer.run(until_idle=True)
    consumer.close()
    assert commits > 10
    names = client.meta.list(STATE_DIR)
    assert any(n.endswith(".sqlite") for n in names) and any(n.endswith(".delta") for n in names)
    store = CheckpointStore(client, "kv")
    refs = [store.load(s).state for s in store.seqs()]
    assert all(len(r["deltas"]) < 4 for r in refs if is_sqlite_ref(r))
    # Every checkpoint's state can be rebuilt (recovery replays a snapshot and its deltas).
    assert prune_checkpoints(client, "kv", keep=2) > 0
    kept = [store.load(s).state for s in store.seqs()]
    referenced = set().union(*(state_object_names(r) for r in kept))
    left = set(client.meta.list(STATE_DIR))
    assert referenced <= left
    assert len(left) < len(names)
    check_exactly_once(client)
    # A consumer started from a *fresh process state* (no local database) rebuilds it.
    more = Publisher(client)
    more.publish_committed(to(INPUTS[1]), JSONMessage({"text": "alpha late"}))
    more.flush()
    kv_consumer(client).run(until_idle=True)
    check_exactly_once(client)


def test_working_database_on_disk(local_store, tmp_path) -> None:
    """`SQLiteState(directory=...)`: the working database is a file there while the
    consumer runs, removed by close(), rebuilt from the store by the next run; the
    objects in the store are the same as with the database in memory."""
    work = tmp_path / "work"
    work.mkdir()
    client = local_store.open()
    create_journals(client)
    write_upstream(client, seed=11)
    consumer = kv_consumer(client, state=SQLiteState(snapshot_every=3, directory=str(work)))
    assert consumer.run(until_idle=True) > 3
    files = list(work.iterdir())
    assert len(files) == 1 and files[0].stat().st_size > 0
    assert consumer.kv is not None and consumer.kv.to_dict() == expected_kv(client)
    consumer.close()
    assert list(work.iterdir()) == []
    more = Publisher(client)
    more.publish_committed(to(INPUTS[1]), JSONMessage({"text": "alpha late"}))
    more.flush()
    assert consumer.run(until_idle=True) >= 1  # recovers: snapshot + deltas, into a file
    assert len(list(work.iterdir())) == 1
    assert consumer.kv.to_dict() == expected_kv(client)
    consumer.close()
    check_exactly_once(client)  # read back by an in-memory instance
    with pytest.raises(ValueError, match="directory"):
        SQLiteState(directory=str(tmp_path / "missing"))


def test_recovery_skips_reload_of_its_own_state(memory_store, monkeypatch) -> None:
    client = memory_store.open()
    create_journals(client)
    write_upstream(client, seed=4)
    consumer = kv_consumer(client)
    consumer.run(until_idle=True)
    reads: list[str] = []
    real = MetaStore.read

    def spy(meta: MetaStore, path: str) -> bytes | None:
        reads.append(path)
        return real(meta, path)

    monkeypatch.setattr(MetaStore, "read", spy)
    consumer.recover()
    assert not [p for p in reads if "/state/" in p]
    consumer.close()
    fresh = kv_consumer(client)
    fresh.recover()
    assert [p for p in reads if "/state/" in p]
    fresh.close()


@pytest.mark.parametrize("stage", ["handler", "flushed", "state", "checkpoint", "checkpointed",
                                   "acked", "committed"])
def test_same_instance_recovers_after_a_failed_commit(memory_store, stage) -> None:
    """A commit that fails before its claim leaves the local database ahead of the group's
    state: the same instance's next run() must rebuild it (and must not when the claim
    happened)."""
    client = memory_store.open()
    create_journals(client)
    write_upstream(client, seed=8)
    fail = {"n": 2}

    def on_stage(name: str) -> None:
        if name == stage:
            fail["n"] -= 1
            if fail["n"] == 0:
                raise Boom(stage)

    consumer = kv_consumer(client, on_stage=on_stage)
    with pytest.raises(Boom):
        consumer.run(until_idle=True)
    consumer.run(until_idle=True)
    assert consumer.kv is not None and consumer.kv.to_dict() == expected_kv(client)
    consumer.close()
    check_exactly_once(client, stage)


def test_missing_state_object_is_reported(memory_store) -> None:
    client = memory_store.open()
    create_journals(client)
    write_upstream(client, seed=5)
    kv_consumer(client, keep_checkpoints=None).run(until_idle=True)
    for name in client.meta.list(STATE_DIR):
        client.meta.delete(f"{STATE_DIR}/{name}")
    with pytest.raises(CheckpointError, match="does not exist"):
        kv_consumer(client).recover()
    seqs = CheckpointStore(client, "kv").seqs()
    kv_consumer(client)  # nothing was written by the failed recovery
    assert CheckpointStore(client, "kv").seqs() == seqs


def test_json_and_sqlite_groups_do_not_mix(memory_store) -> None:
    client = memory_store.open()
    create_journals(client)
    write_upstream(client, seed=6)
    kv_consumer(client).run(until_idle=True)
    with pytest.raises(ConsumerError, match="SQLite state"):
        Consumer(client, "kv", SELECTOR, lambda e, t: None).recover()
    Consumer(client, "js", SELECTOR, lambda e, t: None, initial_state={}).run(until_idle=True)
    with pytest.raises(ConsumerError, match="JSON state"):
        Consumer(client, "js", SELECTOR, kv_echo, state=SQLiteState()).recover()


def test_reset_and_delete_group_with_kv_state(memory_store) -> None:
    client = memory_store.open()
    create_journals(client)
    write_upstream(client, seed=7)
    kv_consumer(client).run(until_idle=True)
    words = final_kv(client)
    reset_group(client, "kv", "head", keep_state=True)
    assert final_kv(client) == words
    reset_group(client, "kv", "head")
    assert final_kv(client) == {}
    assert client.meta.list(STATE_DIR)
    delete_group(client, "kv")
    assert client.meta.list(STATE_DIR) == []


# -- the consumer state machine, with SQLite state and a batch handler ---------------------


def kv_count(envs: list[Envelope], txn: Transaction) -> None:
    kv = txn.kv
    assert kv is not None
    for env in envs:
        for word in env.message.doc["text"].split():
            kv.put(f"count:{word}", kv.get(f"count:{word}", 0) + 1)


def kv_publish_totals(txn: Transaction) -> None:
    kv = txn.kv
    assert kv is not None
    state = kv.to_dict()
    for key, total in sorted(state.items()):
        if key.startswith("count:") and state.get(f"pub:{key[6:]}") != total:
            txn.publish(to("machine/out"), JSONMessage({"word": key[6:], "total": total}))
            kv.put(f"pub:{key[6:]}", total)


def test_state_machine_with_kv_state_and_batch_handler() -> None:
    from hypothesis import HealthCheck, settings
    from hypothesis.stateful import run_state_machine_as_test
    from test_consumer_machine import last_totals, word_counts

    from oncelog.testing import consumer_machine

    machine = consumer_machine(
        kv_count,
        word_counts,
        view=last_totals,
        finalize=kv_publish_totals,
        batch=True,
        consumer_options={"state": SQLiteState(snapshot_every=2)},
        name="KVWordCountMachine",
    )
    run_state_machine_as_test(machine, settings=settings(
        max_examples=30, stateful_step_count=30, deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow],
    ))


# -- SIGKILL after a random storage write ---------------------------------------------------


def child(url: str, options: str, kill_at: int, batch: bool, disk: bool = False) -> int:
    client = open_journals(url, **json.loads(options))
    writes = kill_after_writes(client, kill_at)
    kwargs: dict[str, Any] = {}
    if disk:  # the working database in a file (left behind by a crash, like a temp file)
        kwargs["state"] = SQLiteState(snapshot_every=3, directory=tempfile.mkdtemp())
    kv_consumer(client, batch=batch, **kwargs).run(until_idle=True)
    print(json.dumps({"writes": writes()}), flush=True)
    client.close()
    return 0


def run_child(target: Any, kill_at: int, batch: bool, disk: bool = False) -> tuple[int, str]:
    mode = ("batch" if batch else "each") + ("-disk" if disk else "")
    proc = run_python(
        [sys.executable, str(HERE), "child", target.url, json.dumps(target.storage_options),
         str(kill_at), mode],
        text=True, timeout=CHILD_TIMEOUT,
    )
    if proc.returncode not in (0, -signal.SIGKILL):
        pytest.fail(f"consumer child failed with {proc.returncode}:\n{proc.stderr}")
    return proc.returncode, proc.stdout


def kill_until_done(
    target: Any, seed: int, transactions: int, kills: int, disk: bool = False
) -> int:
    """Kill children after random storage writes until one completes; check the outputs and
    the final state equal a crash-free run's. Returns the number of kills."""
    rng = random.Random(seed)
    client = target.open()
    create_journals(client)
    write_upstream(client, seed, transactions)
    done = 0
    for _ in range(kills + 1):
        batch = rng.random() < 0.3
        # Within the first 20 storage writes of each child: a crash-free run makes 40-60, a
        # resumed one fewer, so each of the `kills` children dies before completing while
        # every point is still reached (recovery, state objects, claim, ACKs of a commit).
        kill_at = rng.randint(1, 20) if done < kills else 10**9
        code, _ = run_child(target, kill_at, batch, disk)
        if code == 0:
            break
        done += 1
    else:
        pytest.fail("the consumer never completed")
    check_exactly_once(client, (seed, done))
    client.close()
    return done


def test_sigkill_crash_free_reference(local_store) -> None:
    client = local_store.open()
    create_journals(client)
    write_upstream(client, seed=500)
    code, out = run_child(local_store, 10**9, batch=False)
    # More storage writes than the random kill points of kill_until_done (1-20) reach.
    assert code == 0 and json.loads(out)["writes"] > 20
    assert sum(expected_echo(client).values()) > 20
    check_exactly_once(client)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_sigkill_at_random_storage_writes_local(local_store, seed) -> None:
    """6 scenarios x 4 kills (24 SIGKILLs), each after a random storage write: outputs and
    the SQLite state equal the crash-free reference."""
    assert kill_until_done(local_store, 600 + seed, transactions=12, kills=4) == 4


@pytest.mark.slow
@pytest.mark.parametrize("first", [1, 11, 21, 31])
def test_sigkill_after_each_storage_write(local_store, first: int) -> None:
    """A sweep: SIGKILLed right after its k-th storage write, for every k over the first
    commits (every point between the state objects, the checkpoint claim and the ACKs; ten
    points per case, 1-40 in all), then run to completion in this process (a fresh store
    client, as a restarted process has): outputs and state equal the crash-free reference."""
    base = local_store.url
    for k in range(first, first + 10):
        target = type(local_store)(local_store.kind, f"{base}-{k}", local_store.storage_options)
        each = target.open()
        create_journals(each)
        write_upstream(each, seed=600)
        code, _ = run_child(target, k, batch=k % 3 == 0)
        assert code == -signal.SIGKILL, k
        each.close()
        each = target.open()
        consumer = kv_consumer(each)
        consumer.run(until_idle=True)
        consumer.close()
        check_exactly_once(each, k)
        each.close()


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_sigkill_at_random_storage_writes_with_the_working_database_on_disk(
    local_store, seed
) -> None:
    """As above, with `SQLiteState(directory=...)`: 3 scenarios x 4 kills."""
    assert kill_until_done(local_store, 650 + seed, transactions=12, kills=4, disk=True) == 4


@pytest.mark.slow
def test_sigkill_at_random_storage_writes_s3(s3_store) -> None:
    assert kill_until_done(s3_store, 700, transactions=8, kills=3) == 3


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "child":
        _, _, url, options, kill_at, mode = sys.argv
        sys.exit(child(url, options, int(kill_at), mode.startswith("batch"),
                       mode.endswith("-disk")))
    sys.exit(f"usage: {sys.argv[0]} child URL OPTIONS KILL_AT each|batch[-disk]")
