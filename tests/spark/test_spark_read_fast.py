"""The fast read path (Arrow JSON decoding, commits decided a batch at a time) against the
per-message row path (`fast_path=false`): the same rows, column for column.

Most tests drive the read functions without a JVM; the last compares Spark DataFrames.
"""

from __future__ import annotations

import uuid as uuidlib

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import LongType, StringType, StructField, StructType
from spark_history import JSON, committed_rows, to, write_history
from test_spark_plan import histories, sequential_read

from oncelog.errors import OncelogError
from oncelog.journal import FragmentSpec, JournalSpec, open_journals
from oncelog.message import Flags, JSONMessage, build_uuid
from oncelog.publisher import Publisher
from oncelog.sequencing.bulkcommit import BulkCommitter, NotBulk, bulk_facts
from oncelog.sequencing.plan import NIL_PRODUCER, gather_facts
from oncelog.spark.batch import OncelogBatchReader
from oncelog.spark.batches import RangeDecoder
from oncelog.spark.options import ReadOptions
from oncelog.spark.read import journal_batches
from oncelog.spark.schema import arrow_schema, message_kind, source_struct

JOURNAL = "events/part-000"
DOC = StructType([StructField("n", LongType()), StructField("page", StringType())])
SCHEMAS = {None: source_struct(StringType()), "n bigint, page string": source_struct(DOC)}


@pytest.fixture
def client(tmp_path):
    c = open_journals(str(tmp_path / "store"), create=True)
    yield c
    c.close()


def decoder(client, journal: str, schema: str | None, fast: bool, chunk_bytes: int) -> RangeDecoder:
    arrow = arrow_schema(SCHEMAS[schema])
    return RangeDecoder(
        client, journal, message_kind(JSON, schema), arrow.field("message").type,
        chunk_bytes=chunk_bytes, fast=fast,
    )


def read_journal(client, journal: str, schema: str | None, fast: bool, chunk_bytes: int):
    arrow = arrow_schema(SCHEMAS[schema])
    dec = decoder(client, journal, schema, fast, chunk_bytes)
    batches = list(journal_batches(dec, 0, client.head(journal), arrow, batch_rows=7))
    return sorted_table(batches, arrow)


def sorted_table(batches, arrow: pa.Schema) -> pa.Table:
    table = pa.Table.from_batches(batches, schema=arrow)
    return table.sort_by([("journal", "ascending"), ("commit_offset", "ascending"),
                          ("begin", "ascending")])


def read_source(client, journals: str, schema: str | None, **options: str) -> pa.Table:
    raw = {"store": client.root, "journals": journals, **options}
    if schema:
        raw["schema"] = schema
    reader = OncelogBatchReader(ReadOptions.parse(raw), SCHEMAS[schema])
    batches = [b for p in reader.partitions() for b in reader.read(p)]
    return sorted_table(batches, arrow_schema(SCHEMAS[schema]))


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    appends=histories(),
    chunk_bytes=st.sampled_from([40, 200, 1 << 20]),
    schema=st.sampled_from([None, "n bigint, page string"]),
)
def test_fast_path_equals_row_path_over_random_histories(
    client, appends, chunk_bytes, schema
) -> None:
    """Rollbacks, partial ACKs, clocks going backwards, duplicates, nil and odd UUIDs, in
    batches of a few frames: the fast path (falling back where it must) gives the row
    path's rows, which are read_committed's."""
    journal = f"{JOURNAL}-{uuidlib.uuid4().hex[:8]}"
    client.create(JournalSpec(journal, fragment=FragmentSpec(length=150)))
    for frames in appends:
        client.append(journal, b"".join(frames))
    fast = read_journal(client, journal, schema, True, chunk_bytes)
    rows = read_journal(client, journal, schema, False, chunk_bytes)
    assert fast.equals(rows)
    expected = sorted(sequential_read(client, journal))
    got = list(zip(fast.column("commit_offset").to_pylist(), fast.column("begin").to_pylist()))
    assert got == expected
    for split_bytes in ("1", "200"):
        assert read_source(client, journal, schema, split_bytes=split_bytes).equals(
            read_source(client, journal, schema, split_bytes=split_bytes, fast_path="false")
        )


def test_fast_path_on_publisher_journals_with_rollbacks_and_replays(client, monkeypatch) -> None:
    """Publisher histories (rollbacks, open transactions, nil UUIDs, re-appended frames)
    and a transaction larger than the Sequencer's ring (read_committed replays it), read
    whole and in splits: the same rows both ways, and read_committed's messages. The
    bulk rules hand over to the per-message ones at the rollback."""
    handovers = []
    handover = BulkCommitter.handover

    def counted(self, plan, guard):
        handovers.append(guard)
        return handover(self, plan, guard)

    monkeypatch.setattr(BulkCommitter, "handover", counted)
    names = []
    for seed in range(6):
        name = f"hist/{seed}"
        write_history(client, name, seed=seed, rounds=30, fragment=300)
        names.append(name)
    big = "hist/replay"
    client.create(JournalSpec(big, fragment=FragmentSpec(length=8000)))
    pubs = [Publisher(client) for _ in range(2)]
    for i in range(1500):  # two interleaved transactions, each past the 1,024-message ring
        pubs[i % 2].publish_uncommitted(to(big), JSONMessage({"n": i, "page": f"p{i % 3}"}))
    for pub in pubs:
        pub.flush()
        pub.append_intents(pub.build_ack_intents())
    pubs[0].publish_uncommitted(to(big), JSONMessage({"n": -1, "page": "rolled back"}))
    pubs[0].flush()
    pubs[0].rollback()
    pubs[1].publish_committed(to(big), JSONMessage({"n": -2, "page": "after"}))
    pubs[1].flush()
    names.append(big)
    for name in names:
        for schema in SCHEMAS:
            for chunk in (300, 4096, 1 << 20):
                fast = read_journal(client, name, schema, True, chunk)
                assert fast.equals(read_journal(client, name, schema, False, chunk)), name
        if name == big:
            assert handovers  # the rollback at its end
        expected = sorted(committed_rows(client, name), key=lambda r: r[1])
        assert sorted(zip(fast.column("journal").to_pylist(), fast.column("begin").to_pylist()),
                      key=lambda r: r[1]) == expected
    joined = ",".join(names)
    for split_bytes in ("300", str(64 << 20)):
        for schema in SCHEMAS:
            fast = read_source(client, joined, schema, split_bytes=split_bytes, chunk_bytes="4096")
            rows = read_source(
                client, joined, schema, split_bytes=split_bytes, chunk_bytes="4096",
                fast_path="false",
            )
            assert fast.equals(rows)
            assert fast.num_rows == sum(len(committed_rows(client, n)) for n in names)


def _line(n: int, clock: int, flags: Flags, extra: bytes = b"") -> bytes:
    producer = bytes([1, 0, 0, 0, 0, 1])
    doc = b'{"uuid":"%s","n":%d,"page":"p"%s}' % (
        str(build_uuid(producer, clock, flags)).encode(), n, extra
    )
    return doc


BAD_OR_ODD_LINES = [
    b'{"uuid":null,"n":1}',
    b"null",
    b"[1,2]",
    b"5",
    b'{"n":1}{"n":2}',
    b'{"n":1,"x":NaN}',
    b'{"n":1,"x":-Infinity}',
    b'{"n":1,"x":[Inf]}',
    b'{"n":1,"page":"NaN and Info"}',
    b'{"n":1,"x":"\xff"}',
    b'{"n":1,"x":"\xed\xa0\x80"}',
    b'{"n":1,"x":"\xc3\xa9"}',
    b"\xef\xbb\xbf{\"n\":1}",
    b'{"n":1,"x":' + b"[" * 1030 + b"]" * 1030 + b"}",
    b'{"n":1,"x":' + b"[" * 1023 + b"]" * 1023 + b"}",
    b'{"n":1,"x":' + b"[" * 1024 + b"]" * 1024 + b"}",
    b'{"n":1,"n":2}',
    b'{"uuid":5,"n":1}',
    b'{"uuid":"not a uuid","n":1}',
    b'{"uuid":"","n":1}',
    b'{"n":"text"}',
    b'{"n":1,\r"page":"p"}',
    b'{"n":1}\r',
    b"",
    b"  ",
    b'{"n":',
]


@pytest.mark.parametrize("bad", BAD_OR_ODD_LINES)
@pytest.mark.parametrize("schema", list(SCHEMAS))
def test_arrow_decoding_judges_lines_as_the_framing_does(client, bad: bytes, schema) -> None:
    """A chunk with one odd line among good ones: the fast decoder gives exactly the row
    path's batch, or fails with the same error (never accepts what the framing rejects)."""
    chunk = b"\n".join([_line(0, 10, Flags.OUTSIDE_TXN), bad, _line(2, 12, Flags.OUTSIDE_TXN)])
    client.create(JournalSpec(JOURNAL))
    client.append(JOURNAL, chunk + b"\n")
    outcomes = []
    for fast in (True, False):
        try:
            table = read_journal(client, JOURNAL, schema, fast, 1 << 20)
            outcomes.append(("rows", table))
        except OncelogError as exc:
            outcomes.append(("error", type(exc)))
    (kind_fast, fast_out), (kind_rows, rows_out) = outcomes
    assert kind_fast == kind_rows
    if kind_fast == "rows":
        assert fast_out.equals(rows_out)
    else:
        assert fast_out is rows_out


def test_bulk_committer_hands_over_at_the_batch_that_needs_the_row_rules(client) -> None:
    """Batches of growing clocks are decided in bulk; a rollback (an ACK reusing an old
    clock) raises NotBulk at its batch, with nothing of that batch decided."""
    client.create(JournalSpec(JOURNAL))
    frames = [_line(i, 10 + i, Flags.CONTINUE_TXN) for i in range(5)]
    frames.append(_line(5, 15, Flags.ACK_TXN))
    frames += [_line(6, 16, Flags.CONTINUE_TXN), _line(7, 15, Flags.ACK_TXN)]  # rollback
    client.append(JOURNAL, b"".join(f + b"\n" for f in frames))
    dec = decoder(client, JOURNAL, None, True, 1 << 20)
    ends = [0]
    for f in frames:
        ends.append(ends[-1] + len(f) + 1)
    committer = BulkCommitter()
    first = next(dec.batches(0, ends[6]))
    decided = committer.feed(first.uuids, first.columns[1], 0, first.base)
    assert decided.mask.to_pylist() == [True] * 5 + [False]
    assert set(decided.commits.filter(decided.mask).to_pylist()) == {ends[5]}
    second = next(dec.batches(ends[6], ends[8]))
    with pytest.raises(NotBulk) as info:
        committer.feed(second.uuids, second.columns[1], 6, second.base)
    assert info.value.offset == ends[6]
    rules = committer.handover(None, guard=True)
    assert rules.oldest_pending() is None
    refs, _ = rules.feed(second.producers, second.clocks, second.flags, second.begins, [6, 7])
    assert refs == []  # the rollback discards message 6
    fast = read_journal(client, JOURNAL, None, True, 1 << 20)
    assert fast.equals(read_journal(client, JOURNAL, None, False, 1 << 20))
    assert fast.num_rows == 5


def test_spark_dataframes_of_both_paths_are_identical(spark, tmp_path) -> None:
    """In Spark: the default (fast) read and `fast_path=false` give the same DataFrame,
    whole journals and splits, over rollbacks, open transactions and a replay."""
    client = open_journals(str(tmp_path / "store"))
    names = [f"hist/{seed}" for seed in range(3)]
    for seed, name in enumerate(names):
        write_history(client, name, seed=seed, rounds=25, fragment=300)
    big = "hist/replay"
    client.create(JournalSpec(big, fragment=FragmentSpec(length=20000)))
    pub = Publisher(client)
    for i in range(1200):
        pub.publish_uncommitted(to(big), JSONMessage({"n": i, "page": "big"}))
    pub.flush()
    pub.append_intents(pub.build_ack_intents())
    pub.publish_uncommitted(to(big), JSONMessage({"n": -1, "page": "rolled back"}))
    pub.flush()
    pub.rollback()
    names.append(big)
    order = ["journal", "commit_offset", "begin"]
    for split_bytes in (str(64 << 20), "500"):
        for schema in ("n bigint, page string", None):
            def load(**extra: str):
                reader = (
                    spark.read.format("oncelog").option("store", client.root)
                    .option("journals", ",".join(names)).option("split_bytes", split_bytes)
                )
                if schema:
                    reader = reader.option("schema", schema)
                return reader.options(**extra).load().orderBy(*order)

            fast = load().collect()
            rows = load(fast_path="false").collect()
            assert fast == rows
            assert len(fast) == sum(len(committed_rows(client, n)) for n in names)


growing_ids = st.lists(
    st.tuples(st.integers(0, 3), st.sampled_from([0, 1, 1, 1, 2, 3]), st.integers(1, 3)),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=growing_ids, first=st.integers(1, 50))
def test_bulk_facts_equal_gather_facts_for_growing_clocks(ops, first) -> None:
    """Phase 1 in bulk gives `gather_facts`'s summary, field for field (producer 3 writes
    nil UUIDs); with a clock that does not grow it declines (None)."""
    clocks = [first] * 3
    ids = []
    for offset, (who, flags, step) in enumerate(ops):
        if who == 3:
            ids.append((NIL_PRODUCER, 0, 0, offset))
            continue
        clocks[who] += step
        ids.append((f"{0x010000000000 + who:012x}", clocks[who], flags, offset))
    columns = [list(col) for col in zip(*ids)] if ids else [[], [], [], []]
    assert bulk_facts(*columns) == gather_facts(ids)
    producers = [i for i, (p, *_rest) in enumerate(ids) if p != NIL_PRODUCER]
    if len(producers) >= 2:
        # The same clock twice from one producer: no longer growing.
        k = producers[-1]
        p, c, f, b = ids[k]
        ids.append((p, c, f, b + 1))
        columns = [list(col) for col in zip(*ids)]
        assert bulk_facts(*columns) is None
