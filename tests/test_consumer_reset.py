"""Resetting consumer groups to offsets and to times, dry runs, and lag in messages."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from test_cli import cli  # noqa: F401 - the CLI fixture

from oncelog.consumer import (
    CheckpointStore,
    Consumer,
    group_status,
    reset_group,
)
from oncelog.consumer.groups import count_messages, offset_at_time
from oncelog.journal import JournalSpec
from oncelog.message import JSONMessage
from oncelog.publisher import Publisher
from oncelog.reading import read_committed

NDJSON = "application/x-ndjson"
A, B = "in/a", "in/b"


def publish(client: Any, journal: str, docs: list[dict], txn: bool = False) -> None:
    pub = Publisher(client)

    def route(_m: object) -> tuple[str, str]:
        return journal, NDJSON

    if txn:
        with pub.transaction():
            for doc in docs:
                pub.publish_uncommitted(route, JSONMessage(doc))
    else:
        for doc in docs:
            pub.publish_committed(route, JSONMessage(doc))
        pub.flush()


def setup(client: Any) -> list[Any]:
    for name in (A, B):
        client.create(JournalSpec(name, {"content-type": NDJSON}))
    publish(client, A, [{"n": i} for i in range(3)])
    publish(client, B, [{"n": 10 + i} for i in range(2)], txn=True)
    seen: list[Any] = []
    Consumer(client, "g", [A, B], lambda env, txn: seen.append(env.message.doc["n"]),
             initial_state={}).run(until_idle=True)
    return seen


def run(client: Any) -> list[Any]:
    seen: list[Any] = []
    Consumer(client, "g", [A, B], lambda env, txn: seen.append(env.message.doc["n"]),
             initial_state={}).run(until_idle=True)
    return seen


def test_reset_to_offsets_moves_only_those_journals(memory_store) -> None:
    client = memory_store.open()
    assert sorted(setup(client)) == [0, 1, 2, 10, 11]
    second = [e.begin for e in read_committed(client, A)][1]
    before = CheckpointStore(client, "g").latest()
    assert before is not None
    [cp] = reset_group(client, "g", {A: second}, keep_state=True)
    assert cp.offsets == {A: second, B: before.offsets[B]}
    assert cp.reason == f"reset to {A}={second}"
    assert {p.journal for p in cp.producers} == {p.journal for p in before.producers} - {A}
    assert run(client) == [1, 2]
    with pytest.raises(ValueError, match=r"must be an int in \[0, "):
        reset_group(client, "g", {A: client.head(A) + 1})
    with pytest.raises(ValueError, match="must be an int"):
        reset_group(client, "g", {A: "3"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="to must be"):
        reset_group(client, "g", "middle")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timezone-aware"):
        reset_group(client, "g", datetime(2024, 1, 1))


def test_reset_to_a_time(memory_store) -> None:
    client = memory_store.open()
    setup(client)
    time.sleep(0.01)
    when = datetime.now(UTC)
    time.sleep(0.01)
    publish(client, A, [{"n": 3}, {"n": 4}])
    publish(client, B, [{"n": 12}], txn=True)
    assert sorted(run(client)) == [3, 4, 12]
    # Back to `when`: just the messages published after it, once more.
    [cp] = reset_group(client, "g", when)
    assert cp.reason == f"reset to {when.isoformat()}"
    assert sorted(run(client)) == [3, 4, 12]
    # A time before everything: the beginning; after everything: the head.
    early = datetime(2000, 1, 1, tzinfo=UTC)
    assert {j: offset_at_time(client, j, early) for j in (A, B)} == {A: 0, B: 0}
    late = datetime.now(UTC) + timedelta(hours=1)
    assert offset_at_time(client, A, late) == client.head(A)


def test_offset_at_time_skips_old_fragments(local_store, monkeypatch) -> None:
    client = local_store.open()
    client.create(JournalSpec(A, {"content-type": NDJSON}))
    for i in range(5):
        publish(client, A, [{"n": i}])  # a fragment each, persisted now
    frags = client.fragments(A)
    assert len(frags) >= 2 and all(f.mod_time is not None for f in frags)
    from oncelog import reading

    starts: list[int] = []
    real = reading.read_uncommitted

    def spy(client: Any, journal: str, offset: Any = 0, **kw: Any) -> Any:
        starts.append(offset)
        return real(client, journal, offset, **kw)

    monkeypatch.setattr(reading, "read_uncommitted", spy)
    late = datetime.now(UTC) + timedelta(hours=1)
    assert offset_at_time(client, A, late) == client.head(A)
    assert starts == [client.head(A)]  # every fragment is older than `late - skew`: none read


def test_dry_run_writes_nothing(memory_store) -> None:
    client = memory_store.open()
    setup(client)
    store = CheckpointStore(client, "g")
    seqs = store.seqs()
    [cp] = reset_group(client, "g", "beginning", dry_run=True)
    assert cp.offsets == {A: 0, B: 0} and cp.seq == seqs[-1] + 1
    assert store.seqs() == seqs
    assert run(client) == []


def test_lag_in_messages(memory_store) -> None:
    client = memory_store.open()
    setup(client)
    publish(client, A, [{"n": 3}, {"n": 4}])
    publish(client, B, [{"n": 12}], txn=True)
    status = group_status(client, "g", count=True)
    assert {j.journal: j.messages for j in status.members[0].journals} == {A: 2, B: 1}
    assert status.messages == 3 and status.members[0].messages == 3
    assert group_status(client, "g").messages is None
    assert count_messages(client, A, 0, client.head(A)) == 5
    assert count_messages(client, A, 5, 5) == 0


def test_cli_reset(cli) -> None:  # noqa: F811
    client = cli.client
    setup(client)
    head_a = client.head(A)
    out = cli.run("groups", "reset", "g", "--to", f"{A}=0", "--dry-run").stdout.decode()
    assert out.splitlines()[-2].split()[-3:] == [A, str(head_a), "0"]
    assert CheckpointStore(client, "g").latest().reason == "commit"  # type: ignore[union-attr]
    res = cli.run("groups", "reset", "g", "--to", f"{A}=0", "--yes")
    assert res.stderr.decode().startswith(f"oncelog: reset consumer group g to {A}=0:")
    assert sorted(run(client)) == [0, 1, 2]
    cli.run("groups", "reset", "g", "--at", "2000-01-01T00:00:00Z", "--yes")
    assert sorted(run(client)) == [0, 1, 2, 10, 11]
    assert "exactly one of --to and --at" in cli.error("groups", "reset", "g", "--yes", rc=2)
    assert "no time zone" in cli.error(
        "groups", "reset", "g", "--at", "2000-01-01T00:00:00", "--yes", rc=2
    )
    assert "JOURNAL=OFFSET" in cli.error("groups", "reset", "g", "--to", "x=y", "--yes", rc=2)
    shown = cli.json("groups", "show", "g", "-f", "json")
    assert shown["messages"] == 0
    assert cli.json("groups", "show", "g", "--no-messages", "-f", "json")["messages"] is None


def test_reset_inside_a_message_is_refused(memory_store) -> None:
    from oncelog.consumer import NotAMessageBoundary

    client = memory_store.open()
    setup(client)
    envs = list(read_committed(client, A))
    store = CheckpointStore(client, "g")
    seqs = store.seqs()
    for inside in (envs[1].begin + 1, envs[1].end - 1):
        for dry_run in (True, False):
            with pytest.raises(NotAMessageBoundary) as info:
                reset_group(client, "g", {A: inside}, dry_run=dry_run)
            err = info.value
            assert (err.journal, err.offset, err.before, err.after) == (
                A, inside, envs[1].begin, envs[1].end)
            assert (f"offset {inside} of journal {A!r} is inside a message" in str(err)
                    and f"{envs[1].begin} (before) and {envs[1].end} (after)" in str(err))
            assert isinstance(err, ValueError)
    assert store.seqs() == seqs  # nothing written
    # Boundaries are accepted: a message's begin, the head, 0.
    for ok in (envs[1].begin, envs[2].end, client.head(A), 0):
        reset_group(client, "g", {A: ok}, dry_run=True)
    assert run(client) == []  # the group is where it was


def test_reset_below_the_first_available_offset_is_refused(memory_store) -> None:
    from oncelog.consumer import NotAMessageBoundary
    from oncelog.journal import FragmentSpec

    client = memory_store.open()
    client.create(JournalSpec(A, {"content-type": NDJSON}, fragment=FragmentSpec(length=30)))
    for i in range(4):
        publish(client, A, [{"n": i}])
    Consumer(client, "g", [A], lambda env, txn: None).run(until_idle=True)
    first = client.trim(A, before=client.fragments(A)[2].begin).first
    assert first > 0
    with pytest.raises(NotAMessageBoundary, match=f"before its first available offset {first}"):
        reset_group(client, "g", {A: first - 1})
    # "beginning" and 0 mean the first available offset (recorded as it is).
    [cp] = reset_group(client, "g", "beginning")
    assert cp.offsets == {A: first}
    [cp] = reset_group(client, "g", {A: 0})
    assert cp.offsets == {A: first}
    seen: list[Any] = []
    Consumer(client, "g", [A], lambda env, txn: seen.append(env.message.doc["n"])).run(
        until_idle=True)
    assert seen == [2, 3]


def test_cli_reset_inside_a_message_is_refused(cli) -> None:  # noqa: F811
    client = cli.client
    setup(client)
    envs = list(read_committed(client, A))
    inside = envs[1].begin + 3
    store = CheckpointStore(client, "g")
    seqs = store.seqs()
    for extra in (["--dry-run"], ["--yes"]):
        line = cli.error("groups", "reset", "g", "--to", f"{A}={inside}", *extra)
        assert f"offset {inside} of journal '{A}' is inside a message" in line
        assert f"use --to {A}={envs[1].begin} or --to {A}={envs[1].end}" in line
        assert "nothing was written" in line
    assert store.seqs() == seqs
    assert run(client) == []
