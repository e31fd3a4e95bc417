"""Columnar segments and merge-on-read (oncelog.tables): every columnar read equals
`read_committed`, whatever compaction, trims, gc, corruption, races and kills did.

The reference is the journal read from its frames alone (read_committed_arrow with the
segments ignored), itself checked against `read_committed`'s envelopes (offsets, UUIDs,
documents) on every run.
"""

from __future__ import annotations

import random
import signal
import threading
import uuid
import warnings
from dataclasses import replace

import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oncelog.arrow import read_committed_arrow
from oncelog.coordination import MetaStore
from oncelog.journal import JournalClient, JournalSpec
from oncelog.journal.compaction import retire
from oncelog.message import JSONMessage
from oncelog.publisher import Publisher
from oncelog.reading import read_committed
from oncelog.sequencer import Sequencer
from oncelog.tables import SegmentWarning, dataset, merge_on_read
from oncelog.tables.segments import (
    ARROW_SCHEMA_LABEL,
    SEGMENTS_LABEL,
    file_path,
    seal,
    segment_records,
)
from oncelog.testing.fixtures import StoreTarget
from oncelog.testing.processes import kill_after_writes, start_function
from oncelog.testing.strategies import histories, run_history

NDJSON = "application/x-ndjson"


def new_journal(client: JournalClient, name: str = "ev", **labels: str | list[str]) -> str:
    client.create(JournalSpec(name, labels={"content-type": NDJSON, **labels}))
    return name


def from_frames(client: JournalClient, name: str, parse: bool = False) -> pa.Table:
    """read_committed_arrow without segments: what it returned before they existed."""
    original = merge_on_read.committed_table
    merge_on_read.committed_table = lambda *a, **k: None  # type: ignore[assignment]
    try:
        return read_committed_arrow(client, name, parse=parse)
    finally:
        merge_on_read.committed_table = original


def used_segments(client: JournalClient, name: str) -> int:
    found = merge_on_read._parts(client, name, None)
    return 0 if found is None else found[1]


def assert_exact(client: JournalClient, name: str) -> tuple[pa.Table, pa.Table]:
    """Columnar reads through segments equal the reads from frames and read_committed."""
    text = read_committed_arrow(client, name)
    parsed = read_committed_arrow(client, name, parse=True)
    assert text.equals(from_frames(client, name)), "text rows differ"
    assert parsed.equals(from_frames(client, name, parse=True)), "parsed rows differ"
    envs = list(read_committed(client, name))
    assert text.column("begin").to_pylist() == [e.begin for e in envs]
    # The same with a ring of one (every committed transaction replayed from the journal).
    tiny = read_committed(client, name, sequencer=Sequencer(buffer=1))
    assert [e.begin for e in tiny] == [e.begin for e in envs]
    assert text.column("end").to_pylist() == [e.end for e in envs]
    assert text.column("uuid").to_pylist() == [str(e.message.get_uuid()) for e in envs]
    docs = [{k: v for k, v in orjson.loads(m).items() if k != "uuid"}
            for m in text.column("message").to_pylist()]
    assert docs == [{k: v for k, v in e.message.doc.items() if k != "uuid"} for e in envs]
    return text, parsed


def publish_some(client: JournalClient, name: str, rng: random.Random, n: int,
                 pubs: list[Publisher]) -> None:
    to = lambda _m: (name, NDJSON)  # noqa: E731
    for i in range(n):
        p = rng.choice(pubs)
        if rng.random() < 0.5:
            p.publish_committed(to, JSONMessage({"user": f"u{i}", "n": i, "ts": i * 0.5}))
        else:
            with p.transaction():
                for k in range(rng.randint(1, 3)):
                    p.publish_uncommitted(to, JSONMessage({"user": f"t{i}", "n": k}))
    for p in pubs:
        p.flush()


def compacted_journal(client: JournalClient, *, seed: int, producers: int, rounds: int,
                      each: int, target: int) -> str:
    """A journal of `rounds` rounds of `publish_some`, each compacted (a segment each)."""
    name = new_journal(client)
    rng = random.Random(seed)
    pubs = [Publisher(client) for _ in range(producers)]
    for _ in range(rounds):
        publish_some(client, name, rng, each, pubs)
        client.compact(name, target_length=target, retire_grace=0)
    return name


# -- the property: any history, compacted and trimmed at random points --------------------------


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    history=histories(producers=4, max_steps=60),
    cuts=st.lists(st.integers(0, 60), min_size=1, max_size=4),
    target=st.sampled_from([64, 300, 4096]),
    trim_at=st.one_of(st.none(), st.integers(0, 3)),
)
def test_columnar_reads_equal_read_committed_on_any_history(
    memory_store: StoreTarget, history, cuts, target, trim_at
) -> None:
    with memory_store.open() as client:
        name = new_journal(client, f"h{uuid.uuid4().hex}")
        done = 0
        for i, cut in enumerate(sorted(set(cuts)) + [len(history)]):
            run_history(client, [name], history[done:cut])
            done = max(done, cut)
            if client.head(name):
                client.compact(name, target_length=target, retire_grace=0)
            if trim_at == i and client.head(name):
                frags = client.fragments(name)
                client.trim(name, before=frags[len(frags) // 2].begin)
            assert_exact(client, name)
        retire(client, name, 0)
        assert_exact(client, name)


def test_segments_are_used_and_transactions_span_their_boundaries(journals) -> None:
    """Transactions open across each compaction boundary commit in the next segment."""
    name = new_journal(journals)
    to = lambda _m: (name, NDJSON)  # noqa: E731
    a, b = Publisher(journals), Publisher(journals)
    for round_ in range(3):
        b.publish_committed(to, JSONMessage({"n": round_, "who": "b"}))
        a.publish_uncommitted(to, JSONMessage({"n": round_, "who": "a"}))
        a.flush()
        b.flush()
        journals.compact(name, retire_grace=0)  # a's transaction is open at the boundary
        a.append_intents(a.build_ack_intents())
    journals.compact(name, retire_grace=0)
    records, bad = segment_records(journals, name)
    assert not bad and len(records) >= 3
    assert any(r.start for r in records), "no segment began with an open transaction"
    text, parsed = assert_exact(journals, name)
    assert used_segments(journals, name) == len(records)
    assert parsed.column("who").to_pylist() == ["b", "a", "b", "a", "b", "a"]
    # A transaction committed in a later segment keeps the offsets it was written at: a's
    # message of round r was written before b's of round r+1, and delivered after it.
    begins = text.column("begin").to_pylist()
    assert begins[1] < begins[2] and begins[3] < begins[4]
    assert dataset(journals, [name]).to_table().equals(parsed)


def test_trim_across_segments_and_a_reader_starting_afresh(local_store: StoreTarget) -> None:
    with local_store.open() as client:
        name = compacted_journal(client, seed=3, producers=3, rounds=4, each=40, target=2048)
        records, _ = segment_records(client, name)
        assert len(records) >= 4
        cut = records[1].begin + (records[1].end - records[1].begin) // 2
        result = client.trim(name, before=cut)
        first = client.first_offset(name)
        assert first == result.first > records[0].end
        # Records wholly below the first offset are retired; offsets never change.
        left, _ = segment_records(client, name)
        assert all(r.end > first for r in left) and len(left) < len(records)
        text, _ = assert_exact(client, name)
        assert min(text.column("begin").to_pylist()) >= first
        assert used_segments(client, name) >= 1  # readers catch up with the chain again


def test_a_damaged_or_missing_segment_is_read_from_fragments_and_reported(
    local_store: StoreTarget,
) -> None:
    with local_store.open() as client:
        name = compacted_journal(client, seed=4, producers=2, rounds=3, each=30, target=1024)
        records, _ = segment_records(client, name)
        meta = MetaStore.of(client, internal=True)
        damaged, missing = records[0], records[-1]
        data = bytearray(meta.read(file_path(name, damaged.file)) or b"")
        data[len(data) // 2] ^= 0x40
        meta.write(file_path(name, damaged.file), bytes(data))
        meta.delete(file_path(name, missing.file))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert_exact(client, name)
        said = " ".join(str(w.message) for w in caught if w.category is SegmentWarning)
        assert damaged.name in said and "damaged" in said
        assert missing.name in said and "missing" in said
        report = client.verify(name)
        assert not report.ok
        where = {p.fragment for p in report.problems}
        assert f"segment {damaged.name}" in where and f"segment {missing.name}" in where
        assert all(p.journal == name for p in report.problems)
        # The read path never changed stored data.
        assert meta.read(file_path(name, damaged.file)) == bytes(data)


def test_racing_sealers_write_one_set_and_gc_collects_the_loser(local_store: StoreTarget) -> None:
    with local_store.open() as client:
        name = new_journal(client, **{SEGMENTS_LABEL: "off"})  # compaction writes none
        rng = random.Random(5)
        publish_some(client, name, rng, 60, [Publisher(client), Publisher(client)])
        client.compact(name, target_length=1 << 20, retire_grace=0)
        assert segment_records(client, name)[0] == []
        spec = client.get(name)
        client.update(replace(spec, labels=spec.labels.remove(SEGMENTS_LABEL)))
        through = client.head(name)
        results: list[object] = []
        barrier = threading.Barrier(3)

        def sealer() -> None:
            barrier.wait()
            results.append(seal(client, name, through))

        threads = [threading.Thread(target=sealer) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        records, _ = segment_records(client, name)
        assert len(records) == 1 and records[0].end == through
        assert all(r == [] or r[0].name == records[0].name for r in results)  # type: ignore[index, attr-defined]
        assert_exact(client, name)
        # An orphan file (a killed writer's) goes with gc after its grace, never a used one.
        meta = MetaStore.of(client, internal=True)
        meta.write(file_path(name, "0" * 40 + ".parquet"), b"orphan")
        client.gc(name, grace=0)
        assert meta.read(file_path(name, "0" * 40 + ".parquet")) is None
        assert meta.read(file_path(name, records[0].file)) is not None
        assert used_segments(client, name) == 1


def compact_killed(url: str, options: dict, name: str, kill_at: int) -> None:
    """Child: compact `name` (writing its segments), SIGKILLed after `kill_at` writes."""
    from oncelog.journal import open_journals

    client = open_journals(url, **options)
    kill_after_writes(client, kill_at)
    client.compact(name, target_length=1 << 20, retire_grace=0)
    print("done", flush=True)


@pytest.mark.slow
@pytest.mark.fault
def test_a_compactor_sigkilled_at_every_point_leaves_readers_exact(
    local_store: StoreTarget,
) -> None:
    with local_store.open() as client:
        name = new_journal(client)
        rng = random.Random(6)
        pubs = [Publisher(client) for _ in range(3)]
        publish_some(client, name, rng, 40, pubs)
        client.compact(name, target_length=1024, retire_grace=0)
        killed = 0
        # One big fragment per run: writes 1-3 are the fragment, claims object and record,
        # 4-5 the segment file and record, then retirement's deletes.
        for kill_at in range(1, 9):
            publish_some(client, name, rng, 10, pubs)
            child = start_function(
                compact_killed, (local_store.url, dict(local_store.storage_options), name, kill_at)
            )
            rc = child.wait(120)
            child.close()
            assert rc in (0, -signal.SIGKILL)
            killed += rc == -signal.SIGKILL
            assert_exact(client, name)  # readers exact after the kill, whatever it left
        assert killed >= 5, "the kills landed nowhere"
        client.compact(name, target_length=1 << 20, retire_grace=0)  # a rerun finishes
        records, _ = segment_records(client, name)
        assert max(r.end for r in records) == client.head(name)
        assert_exact(client, name)
        assert client.verify(name).ok


def test_declared_schema_label_types_the_columns(memory_store: StoreTarget) -> None:
    with memory_store.open() as client:
        name = new_journal(client, **{ARROW_SCHEMA_LABEL: ["n=double", "user=string"]})
        to = lambda _m: (name, NDJSON)  # noqa: E731
        pub = Publisher(client)
        for i in range(20):
            pub.publish_committed(to, JSONMessage({"user": f"u{i}", "n": i, "extra": True}))
        pub.flush()
        before = read_committed_arrow(client, name, parse=True)
        client.compact(name, retire_grace=0)
        assert used_segments(client, name) == 1
        after = read_committed_arrow(client, name, parse=True)
        assert after.equals(before)
        assert after.schema.field("n").type == pa.float64()
        assert after.schema.field("extra").type == pa.bool_()


def test_schema_evolution_across_segments_unifies_columns(memory_store: StoreTarget) -> None:
    with memory_store.open() as client:
        name = new_journal(client)
        to = lambda _m: (name, NDJSON)  # noqa: E731
        pub = Publisher(client)
        for i in range(5):
            pub.publish_committed(to, JSONMessage({"n": i}))
        pub.flush()
        client.compact(name, retire_grace=0)
        for i in range(5):
            pub.publish_committed(to, JSONMessage({"n": i + 0.5, "new": "x"}))
        pub.flush()
        client.compact(name, retire_grace=0)
        assert used_segments(client, name) == 2
        _, parsed = assert_exact(client, name)
        assert parsed.column("new").to_pylist() == [None] * 5 + ["x"] * 5


def test_columns_read_only_what_is_asked(local_store: StoreTarget) -> None:
    """`columns` gives the same projection through segments as through frames, in the
    order asked; an unknown column is named."""
    with local_store.open() as client:
        name = new_journal(client)
        rng = random.Random(9)
        pubs = [Publisher(client) for _ in range(2)]
        publish_some(client, name, rng, 30, pubs)
        client.compact(name, retire_grace=0)
        publish_some(client, name, rng, 10, pubs)  # a tail
        wanted = ["user", "begin", "n"]
        got = read_committed_arrow(client, name, parse=True, columns=wanted)
        assert got.column_names == wanted
        assert got.equals(from_frames(client, name, parse=True).select(wanted))
        assert used_segments(client, name) == 1
        text = read_committed_arrow(client, name, columns=["message", "uuid"])
        assert text.equals(from_frames(client, name).select(["message", "uuid"]))
        assert dataset(client, name, columns=["n"]).to_table().column_names == ["n"]
        with pytest.raises(ValueError, match="'nope'"):
            read_committed_arrow(client, name, parse=True, columns=["n", "nope"])
