"""Compaction, retirement and trimming: offsets and bytes never change, nothing is lost or
doubled under concurrent appenders, readers, racing compactors and SIGKILLed compactors,
and a cold read of a compacted journal costs O(big fragments) requests."""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from oncelog.journal import FragmentSpec, JournalClient, JournalSpec, compaction
from oncelog.journal.errors import FragmentChecksumError, OffsetNotAvailable
from oncelog.journal.fragment import cover_set
from oncelog.journal.index import GazetteIndex
from oncelog.journal.reader import JournalReader
from oncelog.testing.fixtures import StoreTarget
from oncelog.testing.processes import run_python
from tests.journal_support import new_journal


def msg(i: int) -> bytes:
    return b'{"n": %d}\n' % i


def append_singles(client: JournalClient, name: str, count: int, start: int = 0) -> list[Any]:
    return [client.append(name, msg(i)) for i in range(start, start + count)]


def read_all(client: JournalClient, name: str, offset: int = 0) -> bytes:
    with client.read(name, offset) as reader:
        return reader.read()


def records(client: JournalClient, name: str) -> list[compaction.RecordName]:
    return compaction.list_records(client.store, name)


def test_compaction_keeps_bytes_and_offsets(store_url: StoreTarget) -> None:
    client = store_url.open()
    name = new_journal(client, length=200)
    results = append_singles(client, name, 60)
    data = read_all(client, name)
    result = client.compact(name)
    assert result.record is not None and result.record_won
    assert result.through == len(data) and result.start == 0
    assert result.fragments_read == 60
    assert all(f.content_length >= 200 for f in result.fragments_written[:-1])
    # A cold client sees the big fragments and the same bytes at the same offsets.
    cold = store_url.open()
    frags = cold.fragments(name)
    assert len(frags) == len(result.fragments_written) < 10
    assert read_all(cold, name) == data
    for i, r in enumerate(results):
        assert read_all(cold, name, r.begin)[: r.end - r.begin] == msg(i)
    # Appends go on at the head, in both clients; a second compaction merges the new ones
    # with the record's undersized last fragment.
    more = append_singles(cold, name, 10, 60)
    assert more[0].begin == len(data)
    assert client.append(name, msg(70)).begin == more[-1].end
    again = client.compact(name)
    assert again.through == client.head(name)
    assert read_all(store_url.open(), name) == data + b"".join(msg(i) for i in range(60, 71))
    # Nothing left to do: no record.
    assert not client.compact(name).changed
    client.close()
    cold.close()


def test_dry_run_writes_nothing(memory_store: StoreTarget) -> None:
    client = memory_store.open()
    name = new_journal(client, length=100)
    append_singles(client, name, 30)
    before = client.store.list_fragments(name)
    result = client.compact(name, dry_run=True)
    assert result.dry_run and result.record and result.chunks
    assert client.store.list_fragments(name) == before and not records(client, name)


def test_min_age_leaves_young_fragments(memory_store: StoreTarget) -> None:
    client = memory_store.open()
    name = new_journal(client, length=1000)
    append_singles(client, name, 10)
    assert not client.compact(name, min_age=3600).changed
    assert client.compact(name, min_age=0).changed


def count_backend_calls(client: JournalClient) -> dict[str, int]:
    """Wrap the backend's request-making methods; counts are per call (read_many: per path)."""
    counts: dict[str, int] = {}
    backend: Any = client.store.backend.inner  # under the retrying wrapper

    for method in ("read", "read_range", "read_many", "exists", "list_dir",
                   "list_names_after", "walk"):
        original = getattr(backend, method)

        def wrapped(*args: Any, _m: str = method, _o: Any = original, **kw: Any) -> Any:
            n = len(args[0]) if _m == "read_many" else 1
            counts[_m] = counts.get(_m, 0) + n
            return _o(*args, **kw)

        setattr(backend, method, wrapped)
    return counts


@pytest.mark.parametrize("backend", ["memory", "s3"])
def test_cold_read_costs_big_fragments_not_small_ones(
    request: pytest.FixtureRequest, backend: str
) -> None:
    target: StoreTarget = request.getfixturevalue(f"{backend}_store")
    client = target.open()
    n = 120  # ~1.2 KB: a few compacted fragments of 400 bytes against 2n small objects
    name = new_journal(client, length=400)
    append_singles(client, name, n)
    data = read_all(client, name)
    before = target.open(read_ahead=False)
    counts = count_backend_calls(before)
    assert read_all(before, name) == data
    small = sum(counts.values())
    assert small >= 2 * n  # a claim and a fragment per append
    result = client.compact(name)
    m = len(result.fragments_written)
    assert 2 <= m < n // 10
    cold = target.open(read_ahead=False)
    counts = count_backend_calls(cold)
    assert read_all(cold, name) == data
    total = sum(counts.values())
    # Opening: LIST records + GET record + LIST claims + GET the last claim + probe at the
    # head + LIST records (the claims read count only if no record ends past them); M
    # fragments; at the end of the data a probe and a LIST of the records again (+ spec).
    assert total <= m + 10, counts
    client.close()


def test_appenders_and_readers_during_compaction(store_url: StoreTarget) -> None:
    client = store_url.open()
    name = new_journal(client, length=300)
    acked: list[tuple[int, int, bytes]] = []
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []

    def appender(k: int, other: JournalClient) -> None:
        i = 0
        try:
            while not stop.is_set() or i < 20:
                payload = b'{"w": %d, "i": %d}\n' % (k, i)
                r = other.append(name, payload)
                with lock:
                    acked.append((r.begin, r.end, payload))
                i += 1
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def reader() -> None:
        try:
            while not stop.is_set():
                fresh = store_url.open()
                got = read_all(fresh, name)
                with lock:
                    known = sorted(acked)
                for b, e, payload in known:
                    if e <= len(got):
                        assert got[b:e] == payload, (b, e)
                fresh.close()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    others = [store_url.open(), store_url.open()]
    threads = [threading.Thread(target=appender, args=(k, others[k])) for k in range(2)]
    threads += [threading.Thread(target=reader)]
    for t in threads:
        t.start()
    compactor = store_url.open()
    for _ in range(4):
        time.sleep(0.2)
        # Readers run throughout: retirement waits for its grace (a reader that read a
        # claim before gets that long to read its fragment).
        compactor.compact(name)
    stop.set()
    for t in threads:
        t.join(60)
    assert not errors, errors
    compactor.compact(name, retire_grace=0)
    got = read_all(store_url.open(), name)
    spans = sorted(acked)
    assert sum(e - b for b, e, _ in spans) == len(got)  # every byte is an acked append
    for (b, e, payload), nxt in zip(spans, spans[1:] + [(len(got), 0, b"")]):
        assert got[b:e] == payload and e == nxt[0]
    for c in (client, compactor, *others):
        c.close()


def test_two_compactors_race(store_url: StoreTarget) -> None:
    client = store_url.open()
    name = new_journal(client, length=150)
    append_singles(client, name, 80)
    data = read_all(client, name)
    clients = [store_url.open(), store_url.open(), client]
    results: list[Any] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def run(c: JournalClient) -> None:
        barrier.wait()
        try:
            results.append(c.compact(name, retire_grace=0))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(c,)) for c in (*clients, client)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(results) == 4 and any(r.record_won for r in results)
    assert {r.through for r in results} == {len(data)}
    names = {tuple(f.content_name for f in r.fragments_written) for r in results if r.record}
    assert len(names) <= 1  # deterministic: the same big fragments
    assert read_all(store_url.open(), name) == data
    assert client.append(name, b"x\n").begin == len(data)


CHILD = r"""
import json, os, signal, sys
from oncelog.journal import open_journals
url, options, name, kill_at = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
client = open_journals(url, **options)
from oncelog.testing.faults import kill_after_writes
writes = kill_after_writes(client, kill_at)
client.compact(name, retire_grace=0)
print("done", writes(), flush=True)
"""


def test_sigkilled_compactor_loses_and_doubles_nothing(local_store: StoreTarget) -> None:
    rng = random.Random(7)
    client = local_store.open()
    outcomes = {"killed": 0, "done": 0}
    for run in range(24):
        name = new_journal(client, length=rng.choice([40, 120, 400]))
        acked = append_singles(client, name, rng.randint(10, 40))
        if run % 3 == 0:  # an earlier compaction, then more appends
            client.compact(name, retire_grace=0)
            acked += append_singles(client, name, rng.randint(3, 15), 100)
        expected = read_all(client, name)
        proc = run_python(
            [sys.executable, "-c", CHILD, local_store.url,
             json.dumps(local_store.storage_options), name, str(rng.randint(1, 8))],
            text=True, timeout=120,
        )
        assert proc.returncode in (0, -signal.SIGKILL), proc.stderr
        outcomes["killed" if proc.returncode else "done"] += 1
        assert read_all(local_store.open(), name) == expected, run
        # A new append lands at the true head, and a rerun finishes the compaction.
        tail = client.append(name, b"tail\n")
        assert tail.begin == len(expected)
        client.compact(name, retire_grace=0)
        fresh = local_store.open()
        assert read_all(fresh, name) == expected + b"tail\n"
        assert len(fresh.fragments(name)) <= len(expected) // 40 + 3
        # gc removes a killed run's debris and keeps every byte.
        client.gc(name, grace=0)
        assert read_all(local_store.open(), name) == expected + b"tail\n"
    assert outcomes["killed"] >= 12, outcomes


def test_corrupt_small_fragment_is_refused(local_store: StoreTarget) -> None:
    client = local_store.open()
    name = new_journal(client, length=10_000)
    append_singles(client, name, 20)
    victim = client.fragments(name)[5]
    path = client.store.fragment_path(victim)
    with open(path, "r+b") as f:
        f.write(b"X")
    before = client.store.list_fragments(name)
    with pytest.raises(FragmentChecksumError) as info:
        client.compact(name)
    text = str(info.value)
    assert name in text and victim.content_name in text
    assert f"{victim.begin}-{victim.end}" in text
    assert client.store.list_fragments(name) == before and not records(client, name)


def test_retirement_keeps_the_head_for_fresh_appenders(store_url: StoreTarget) -> None:
    client = store_url.open()
    name = new_journal(client, length=100)
    append_singles(client, name, 40)
    data = read_all(client, name)
    warm = store_url.open(read_ahead=False)
    warm_reader = warm.read(name)
    assert warm_reader.read(10) == data[:10]  # its index knows the small claims
    result = client.compact(name, retire_grace=0)
    assert result.retired is not None
    store = client.store
    # Everything below `through` is retired but the last claim below it.
    (kept,) = store.list_claim_begins(name)
    assert result.retired.claims and max(result.retired.claims) < kept
    kept_claim = store.read_claim(name, kept)
    assert kept_claim is not None and kept_claim.parse_fragment(name).end == len(data)
    names = {f.content_name for f in store.list_fragments(name)}
    assert names >= {f.content_name for f in result.fragments_written}
    # A brand-new appender appends at the true head, not at 0.
    fresh = store_url.open()
    r = fresh.append(name, b"next\n")
    assert r.begin == len(data)
    assert read_all(store_url.open(), name) == data + b"next\n"
    # A warm index recovers: its claims are gone; it re-reads the records.
    assert warm.head(name) == len(data) + 5
    assert read_all(warm, name, 200) == (data + b"next\n")[200:]
    # An appender of an index that never saw the record (older oncelog: lists all claims)
    # still finds the head: the claims directory is never short of it.
    begins = store.list_claim_begins(name)
    last = store.read_claim(name, begins[-1])
    assert last is not None and last.parse_fragment(name).end == len(data) + 5
    warm_reader.close()


def test_trim_by_offset(store_url: StoreTarget) -> None:
    client = store_url.open()
    name = new_journal(client, length=100)
    results = append_singles(client, name, 30)
    client.compact(name, retire_grace=0)
    more = append_singles(client, name, 10, 30)
    data = read_all(client, name)
    point = more[3].begin
    dry = client.trim(name, before=point, dry_run=True)
    assert dry.first <= point and read_all(store_url.open(), name) == data
    result = client.trim(name, before=point)
    first = result.first
    assert first == dry.first and 0 < first <= point
    assert result.fragments and all(f.end <= first for f in result.fragments)
    cold = store_url.open()
    with pytest.raises(OffsetNotAvailable, match=rf"offset 5 of journal .*{first}"):
        read_all(cold, name, 5)
    assert read_all(cold, name, 0) == data[first:]  # offset 0: the first available
    assert read_all(cold, name, first) == data[first:]
    assert cold.append(name, b"z\n").begin == len(data)
    assert results[0].begin == 0
    # Trimming past the head keeps the last claim: appends go on at the head.
    client.trim(name, before=10**9)
    cold = store_url.open()
    assert read_all(cold, name) == b""
    assert cold.append(name, b"after\n").begin == len(data) + 2
    assert read_all(store_url.open(), name) == b"after\n"


def test_retention_trims_by_age(memory_store: StoreTarget) -> None:
    client = memory_store.open()
    name = f"ret/{os.getpid()}"
    client.create(JournalSpec(name, fragment=FragmentSpec(length=50, retention="1s")))
    assert client.get(name).fragment.retention == 1.0
    old = append_singles(client, name, 10)
    time.sleep(1.3)
    new = append_singles(client, name, 5, 10)
    result = client.trim(name)
    assert result.first == old[-1].end == new[0].begin
    assert read_all(memory_store.open(), name) == b"".join(msg(i) for i in range(10, 15))
    assert client.trim(name).fragments == []
    with pytest.raises(ValueError, match="no retention"):
        client.trim(new_journal(client))
    stamp = datetime.now(UTC)
    assert client.trim(name, before=stamp).first == new[-1].end


def test_gazette_reader_sees_the_same_bytes(local_store: StoreTarget) -> None:
    client = local_store.open()
    name = new_journal(client, length=120, compression="gzip")
    append_singles(client, name, 50)
    data = read_all(client, name)
    client.compact(name, retire_grace=3600)

    def gazette_read() -> bytes:
        index = GazetteIndex(client.store, name)
        index.refresh()
        return JournalReader(client.store, index, 0).read()

    assert gazette_read() == data  # small and big fragments side by side: the cover set
    assert all(f.codec.extension == ".gz" for f in cover_set(client.store.list_fragments(name)))
    client.compact(name, retire_grace=0)  # retired: only big fragments (+ the last claim's)
    assert gazette_read() == data


def test_auto_compaction(memory_store: StoreTarget, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compaction, "AUTO_POLL", 0.05)
    monkeypatch.setattr(compaction, "AUTO_MIN_INTERVAL", 0.1)
    client = memory_store.open()
    name = new_journal(client, length=200, compact_after=10)
    acked = append_singles(client, name, 40)
    deadline = time.monotonic() + 10
    while not records(client, name) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert records(client, name)
    acked += append_singles(client, name, 20, 40)
    assert [a.begin for a in acked] == sorted(a.begin for a in acked)
    assert read_all(memory_store.open(), name) == b"".join(msg(i) for i in range(60))
    client.close()


def test_compact_automatically_a_journal_whose_spec_does_not_ask(
    memory_store: StoreTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client appending to a journal whose spec sets no compact_after (a streaming
    node's channel created before) has it compacted behind its head when asked; with no
    compact_after anywhere the call is refused."""
    monkeypatch.setattr(compaction, "AUTO_POLL", 0.05)
    monkeypatch.setattr(compaction, "AUTO_MIN_INTERVAL", 0.1)
    writer, owner = memory_store.open(), memory_store.open()
    name = new_journal(writer, length=200)
    with pytest.raises(ValueError, match="compact_after"):
        owner.compact_automatically(name)
    owner.compact_automatically(name, compact_after=10)
    append_singles(owner, name, 40)
    deadline = time.monotonic() + 10
    while not records(owner, name) and time.monotonic() < deadline:  # bounded
        time.sleep(0.05)
    assert records(owner, name)
    assert read_all(memory_store.open(), name) == b"".join(msg(i) for i in range(40))
    writer.close()
    owner.close()


def test_spec_fields_round_trip_and_old_specs_read() -> None:
    spec = FragmentSpec(compact_after=100, retention=3600 * 24 * 30)
    assert spec.to_dict()["retention"] == "720h0m0s"
    assert FragmentSpec.from_dict(spec.to_dict()) == spec
    assert "retention" not in FragmentSpec().to_dict()
    assert FragmentSpec.from_dict({"length": 10}).retention == 0
    assert FragmentSpec(retention="1h30m").retention == 5400


def test_delete_removes_records(memory_store: StoreTarget) -> None:
    client = memory_store.open()
    name = new_journal(client, length=50)
    append_singles(client, name, 10)
    client.compact(name)
    client.delete(name)
    assert not records(client, name)
    # Nor the claims objects beside them.
    assert not client.store.backend.list_dir(compaction.records_dir(client.store, name))


def test_cli_compact_and_trim(local_store: StoreTarget) -> None:
    from click.testing import CliRunner

    from oncelog.cli import cli

    client = local_store.open()
    name = new_journal(client, length=100)
    append_singles(client, name, 30)
    data = read_all(client, name)
    runner = CliRunner()
    env = {"ONCELOG_STORE": local_store.url, "ONCELOG_NO_PROGRESS": "1"}
    out = runner.invoke(cli, ["journals", "compact", name, "--dry-run"], env=env)
    assert out.exit_code == 0, out.output
    assert f"{name}: would merge 30 fragments" in out.output and not records(client, name)
    out = runner.invoke(cli, ["journals", "compact", name, "--target-length", "50"], env=env)
    assert out.exit_code == 0, out.output
    assert f"{name}: merged 30 fragments" in out.output and records(client, name)
    out = runner.invoke(cli, ["journals", "trim", name, "--before", "150", "--dry-run"], env=env)
    assert out.exit_code == 0 and "would delete" in out.output, out.output
    out = runner.invoke(cli, ["journals", "trim", name, "--before", "150"], env=env)
    assert out.exit_code != 0 and "--yes" in out.output  # no terminal: refuses to guess
    out = runner.invoke(cli, ["journals", "trim", name, "--before", "150", "--yes"], env=env)
    assert out.exit_code == 0 and "first offset now" in out.output, out.output
    first = client.trim(name, before=0, dry_run=True).first
    assert 0 < first <= 150
    assert read_all(local_store.open(), name) == data[first:]


def test_a_reader_mid_way_keeps_reading_after_retirement(store_url: StoreTarget) -> None:
    """A reader whose index named small fragments that compaction then retired (grace 0)
    looks the journal up again and returns the same bytes."""
    writer = store_url.open()
    name = new_journal(writer)
    records = [b'{"n":%d}\n' % i for i in range(60)]
    for record in records:
        writer.append(name, record)
    reader_client = store_url.open(read_ahead=False)
    reader = reader_client.read(name)
    got = reader.read(len(records[0]) * 3)
    assert got == b"".join(records[:3])
    writer.compact(name, retire_grace=0)
    assert writer.store.list_fragments(name)  # big fragments only now
    got += reader.read()
    assert got == b"".join(records)
    reader.close()
    reader_client.close()
    writer.close()
