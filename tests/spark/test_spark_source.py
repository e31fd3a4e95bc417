"""The data source's reader, stream reader and writers driven directly, as Spark drives them.

Spark calls these classes' methods (pickling them between driver and workers); here
they are called in-process, with the same pickling, so every protocol detail is
tested in milliseconds without a JVM. tests/spark/test_spark_integration.py runs them
in a real Spark.
"""

from __future__ import annotations

import json
import uuid as uuidlib

import orjson
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark import cloudpickle
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType
from spark_history import JSON, committed_rows, to, write_history

from oncelog.journal import FragmentSpec, JournalSpec
from oncelog.message import (
    JSONMessage,
    build_uuid,
    clock_to_unix_ns,
    parse_uuid_fields,
    time_sortable_key,
)
from oncelog.publisher import Publisher
from oncelog.reading import read_committed, read_uncommitted
from oncelog.spark import OncelogDataSource
from oncelog.spark.batch import OncelogBatchReader, RangePartition, SplitPartition
from oncelog.spark.batches import BadMessage
from oncelog.spark.options import OptionError, ReadOptions, WriteOptions
from oncelog.spark.schema import SchemaError, source_struct
from oncelog.spark.schema import arrow_schema as arrow_schema_of
from oncelog.spark.stream import OncelogStreamReader, decode_offset
from oncelog.spark.uuids import NIL_TEXT, uuid_columns
from oncelog.spark.write import TaskCommit

RAW = source_struct(StringType())
PARSED = source_struct(
    StructType([StructField("n", LongType()), StructField("page", StringType())])
)


def roundtrip(obj):
    """What Spark does to readers, writers, partitions and commit messages."""
    return cloudpickle.loads(cloudpickle.dumps(obj))


def read_all(reader) -> pa.Table:
    batches = []
    for partition in roundtrip(reader.partitions()):
        batches.extend(roundtrip(reader).read(partition))
    return pa.Table.from_batches(batches, schema=batches[0].schema) if batches else pa.table({})


def keys(table: pa.Table) -> list[tuple[str, int]]:
    return list(zip(table.column("journal").to_pylist(), table.column("begin").to_pylist()))


def commit_order(table: pa.Table) -> list[tuple[str, int]]:
    rows = zip(
        table.column("journal").to_pylist(),
        table.column("commit_offset").to_pylist(),
        table.column("begin").to_pylist(),
    )
    return [(j, b) for j, _, b in sorted(rows)]


# --- UUID columns -------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.binary(min_size=6, max_size=6),
            st.integers(1, (1 << 63) - 1),
            st.integers(0, 0x3FF),
            st.booleans(),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_uuid_columns_match_message_parsing(rows) -> None:
    texts = []
    for producer, clock, flags, upper in rows:
        text = str(build_uuid(producer, clock, flags))
        texts.append(text.upper() if upper else text)
    cols = uuid_columns(texts)
    producers, clocks, flags = cols.ids()
    for i, text in enumerate(texts):
        p, c, f = parse_uuid_fields(text)
        u = uuidlib.UUID(text)
        assert (producers[i], clocks[i], flags[i]) == (p.hex(), c, int(f))
        assert cols.uuid[i].as_py() == str(u)
        assert cols.key[i].as_py() == time_sortable_key(u)
        micros = clock_to_unix_ns(c) // 1000
        assert cols.time.cast(pa.int64())[i].as_py() == micros


def test_uuid_columns_fix_rows_that_are_not_canonical() -> None:
    good = str(build_uuid(bytes.fromhex("0123456789ab"), 12345, 1))
    texts = [good, None, "{" + good + "}", 7]
    fixed = {1: NIL_TEXT, 2: good, 3: good}
    cols = uuid_columns(texts, fixed.__getitem__)
    assert cols.uuid.to_pylist() == [good, NIL_TEXT, good, good]
    assert cols.time[1].as_py() is None and cols.clock[1].as_py() == 0
    with pytest.raises(ValueError, match="row 1: not a canonical UUID"):
        uuid_columns(texts)


# --- batch reads --------------------------------------------------------------------------


@pytest.fixture
def store(local_store):
    client = local_store.open()
    yield local_store, client
    client.close()


def test_batch_reader_equals_read_committed_across_splits(store) -> None:
    target, client = store
    for i in range(3):
        write_history(client, f"site/part-{i}", seed=i, rounds=14, fragment=300)
    options = {"store": target.url, "journals": "app=test", "split_bytes": "600"}
    reader = OncelogBatchReader(ReadOptions.parse(options), RAW)
    partitions = reader.partitions()
    # Large journals are split (several partitions each), and every journal is covered.
    assert any(isinstance(p, SplitPartition) for p in partitions)
    assert len(partitions) > 3
    table = read_all(reader)
    expected = [row for i in range(3) for row in committed_rows(client, f"site/part-{i}")]
    assert sorted(keys(table)) == sorted(expected)
    assert len(set(keys(table))) == table.num_rows  # no message twice
    assert commit_order(table) == expected  # read_committed's order, per journal

    # Every column describes its message.
    docs = {(j, e.begin): e for j in {k[0] for k in expected} for e in read_committed(client, j)}
    for row in table.to_pylist():
        env = docs[(row["journal"], row["begin"])]
        assert row["end"] == env.end
        assert orjson.loads(row["message"]) == env.message.doc
        assert row["flags"] == int(env.flags)
        assert row["producer"] == env.producer.hex()
        assert row["clock"] == env.clock
        if env.clock:
            assert row["uuid"] == str(env.uuid)
            assert row["uuid_key"] == time_sortable_key(env.uuid)


def test_batch_reader_parses_documents_by_schema_and_reads_uncommitted(store) -> None:
    target, client = store
    write_history(client, "site/x", seed=7, rounds=10)
    options = {"store": target.url, "journals": "site/x", "schema": "n bigint, page string"}
    table = read_all(OncelogBatchReader(ReadOptions.parse(options), PARSED))
    committed = list(read_committed(client, "site/x"))
    assert table.column("message").to_pylist() == [
        {"n": e.message.doc["n"], "page": e.message.doc["page"]} for e in committed
    ]

    options = {"store": target.url, "journals": "site/x", "committed": "false"}
    partitions = OncelogBatchReader(ReadOptions.parse(options), RAW).partitions()
    assert all(isinstance(p, RangePartition) and not p.committed for p in partitions)
    table = read_all(OncelogBatchReader(ReadOptions.parse(options), RAW))
    everything = list(read_uncommitted(client, "site/x"))
    assert table.column("begin").to_pylist() == [e.begin for e in everything]
    assert table.column("flags").to_pylist() == [int(e.flags) for e in everything]
    assert table.column("commit_offset").null_count == table.num_rows


def test_nothing_to_read_gives_no_rows(store) -> None:
    from pyspark.sql.datasource import InputPartition

    target, client = store
    client.create(JournalSpec("empty/j", labels={"app": "empty"}))
    options = ReadOptions.parse({"store": target.url, "journals": "app=empty"})
    reader = OncelogBatchReader(options, RAW)
    assert reader.partitions() == []
    # Spark then reads one stand-in partition.
    assert list(reader.read(InputPartition(None))) == []
    nothing = OncelogDataSource({"store": target.url, "journals": "app=none"})
    assert "message` string" in nothing.schema()


def test_odd_uuids_make_a_journal_read_sequentially(store) -> None:
    target, client = store
    client.create(JournalSpec("odd/j", fragment=FragmentSpec(length=50)))
    pub = Publisher(client)
    for i in range(6):
        pub.publish_committed(to("odd/j"), JSONMessage({"n": i}))
        pub.flush()
        # A zero clock from a real producer (not the nil UUID): the plan cannot split this.
        bad = str(uuidlib.UUID(int=0x1234)).encode()
        client.append("odd/j", b'{"n": -1, "uuid": "%s"}\n' % bad)
    reader = OncelogBatchReader(
        ReadOptions.parse({"store": target.url, "journals": "odd/j", "split_bytes": "1"}), RAW
    )
    partitions = reader.partitions()
    assert len(partitions) == 1 and isinstance(partitions[0], RangePartition)
    assert keys(read_all(reader)) == committed_rows(client, "odd/j")


def test_bad_documents_and_options_fail_with_clear_errors(store) -> None:
    target, client = store
    client.create(JournalSpec("bad/j"))
    client.append("bad/j", b'{"n": 1, "page": "a"}\n{"n": "x", "page": "b"}\n')
    options = {"store": target.url, "journals": "bad/j", "schema": "n bigint, page string"}
    reader = OncelogBatchReader(ReadOptions.parse(options), PARSED)
    with pytest.raises(BadMessage, match=r"offsets \[22, 46\) does not fit option 'schema'"):
        read_all(reader)

    client.create(JournalSpec("bad/uuid"))
    client.append("bad/uuid", b'{"uuid": "not-a-uuid"}\n')
    bad_uuid = ReadOptions.parse({"store": target.url, "journals": "bad/uuid"})
    reader = OncelogBatchReader(bad_uuid, RAW)
    with pytest.raises(BadMessage, match=r"message at offsets \[0, 23\) has a bad UUID"):
        read_all(reader)

    client.create(JournalSpec("bad/csv", labels={"content-type": "text/csv"}))
    with pytest.raises(SchemaError, match="parses JSON documents"):
        csv = ReadOptions.parse({**options, "journals": "bad/csv"})
        OncelogBatchReader(csv, PARSED).partitions()
    mixed = OncelogDataSource({"store": target.url, "journals": "bad/j,bad/csv,bad/uuid"})
    assert "message` string" in mixed.schema()  # JSON and CSV are both text
    client.create(JournalSpec("bad/proto", labels={"content-type": "application/x-protobuf-fixed"}))
    with pytest.raises(SchemaError, match="different message column types"):
        OncelogDataSource({"store": target.url, "journals": "bad/j,bad/proto"}).schema()
    with pytest.raises(OptionError, match="proto_class"):
        OncelogBatchReader(
            ReadOptions.parse({"store": target.url, "journals": "bad/proto"}),
            source_struct(BinaryType()),
        ).partitions()
    with pytest.raises(SchemaError, match="columns"):
        OncelogBatchReader(ReadOptions.parse({"store": target.url, "journals": "bad/j"}),
                           StructType([StructField("x", StringType())]))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"journals": "a"}, "'store' is required"),
        ({"store": "/x"}, "'journals' is required"),
        ({"store": "/x", "journals": "app in (a"}, "bad label selector"),
        ({"store": "/x", "journals": "a", "committed": "maybe"}, "'committed' must be true"),
        ({"store": "/x", "journals": "a", "split_bytes": "-1"}, "'split_bytes' must be at least 1"),
        ({"store": "/x", "journals": "a", "chunk_bytes": "big"}, "'chunk_bytes' must be an int"),
        ({"store": "/x", "journals": "a", "storage_options": "[1]"}, "must be a JSON object"),
        ({"store": "/x", "journals": "a", "prune_horizon": "-3"}, "'prune_horizon' must be"),
    ],
)
def test_read_options_are_checked(options, message) -> None:
    with pytest.raises(OptionError, match=message):
        ReadOptions.parse(options)


def test_read_options_storage_options_and_selectors() -> None:
    opts = ReadOptions.parse(
        {
            "STORE": "s3://b/p",
            "Journals": "a/one, a/two",
            "key": "k",
            "secret": "s",
            "endpoint_url": "http://127.0.0.1:1",
            "region": "eu-west-1",
            "storage_options": '{"use_ssl": false}',
        }
    )
    assert opts.journals == ("a/one", "a/two") and opts.selector == ""
    assert opts.store.storage_options == {
        "use_ssl": False,
        "key": "k",
        "secret": "s",
        "endpoint_url": "http://127.0.0.1:1",
        "client_kwargs": {"region_name": "eu-west-1"},
    }
    assert ReadOptions.parse({"store": "/x", "journals": "app=web"}).selector == "app=web"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"store": "/x"}, "'journal' .* is required"),
        ({"store": "/x", "journal": "a", "selector": "app=b"}, "one of 'journal', 'journals'"),
        ({"store": "/x", "selector": "app=b"}, "'key_column' is required"),
        ({"store": "/x", "journals": "a,b"}, "'key_column' is required"),
        ({"store": "/x", "journals": "app=b", "key": "k", "selector": "x=y"}, "one of"),
        ({"store": "/x", "journal": "a", "mapping": "hash"}, "modulo or rendezvous"),
        ({"store": "/x", "journal": "a", "writer_id": "a/b"}, "plain name"),
    ],
)
def test_write_options_are_checked(options, message) -> None:
    with pytest.raises(OptionError, match=message):
        WriteOptions.parse(options)


def test_sequential_reads_resume_from_any_fragment_boundary(store) -> None:
    """Two ranges read with the states of the first's end: the committed messages of the
    whole journal, each once, with the right rows (the stream's micro-batch contract)."""
    from oncelog.sequencer import Sequencer
    from oncelog.spark.batch import decoder_for
    from oncelog.spark.read import sequential_batches

    target, client = store
    write_history(client, "cut/j", seed=31, rounds=30, fragment=120)
    pub = Publisher(client)
    pub.publish_uncommitted(to("cut/j"), JSONMessage({"n": "spans-the-cut"}))
    pub.flush()
    write_history(client, "cut/k", seed=32, rounds=1)  # unrelated: a second journal
    pub.append_intents(pub.build_ack_intents())
    options = ReadOptions.parse({"store": target.url, "journals": "cut/j"})
    schema = arrow_schema_of(RAW)
    decoder = decoder_for(client, options, "cut/j", JSON, pa.string())
    head = client.head("cut/j")
    expected = committed_rows(client, "cut/j")
    docs = {e.begin: e.message.doc for e in read_committed(client, "cut/j")}
    for frag in client.fragments("cut/j")[1:]:
        seq = Sequencer()
        first = list(sequential_batches(decoder, 0, frag.begin, schema, seq))
        offsets, states = seq.checkpoint()
        resumed = Sequencer(offsets, states)
        second = list(sequential_batches(decoder, frag.begin, head, schema, resumed))
        rows = [r for b in first + second for r in b.to_pylist()]
        assert sorted((r["journal"], r["begin"]) for r in rows) == sorted(expected)
        assert len(rows) == len(expected)
        assert all(orjson.loads(r["message"]) == docs[r["begin"]] for r in rows)


# --- streaming reads ----------------------------------------------------------------------


def test_stream_reader_resumes_from_offsets_exactly_once(store) -> None:
    target, client = store
    options = {"store": target.url, "journals": "app=test"}
    write_history(client, "s/a", seed=11, rounds=8)
    pub = Publisher(client)
    # A transaction open across micro-batches: its ACK lands in a later batch.
    pub.publish_uncommitted(to("s/a"), JSONMessage({"n": "span-1"}))
    pub.flush()

    def run(reader, start, limit=None):
        limit = ReadAllAvailable() if limit is None else limit
        end = reader.latestOffset(start, limit)
        # Offsets are canonical JSON: Spark compares them as strings.
        assert json.dumps(end) == json.dumps(end, sort_keys=True)
        partitions = roundtrip(reader.partitions(start, end))
        batches = [b for p in partitions for b in roundtrip(reader).read(p)]
        return end, [(r["journal"], r["begin"]) for b in batches for r in b.to_pylist()]

    reader = OncelogStreamReader(ReadOptions.parse(options), RAW)
    start = reader.initialOffset()
    offset1, rows1 = run(reader, start)
    assert offset1["journals"]["s/a"]["states"]  # producer states travel with the offset
    # Nothing new: the same offset, no rows.
    assert run(reader, offset1) == (offset1, [])

    pub.publish_uncommitted(to("s/a"), JSONMessage({"n": "span-2"}))
    pub.flush()
    pub.append_intents(pub.build_ack_intents())
    write_history(client, "s/b", seed=12, rounds=6)  # a new journal is picked up

    # A restarted query: a fresh reader resumes from the checkpointed offset.
    restarted = OncelogStreamReader(ReadOptions.parse(options), RAW)
    offset2, rows2 = run(restarted, offset1)
    # A failed batch is re-planned from the same logged offsets: the same rows again.
    assert run(restarted, offset1)[1] == rows2

    expected = committed_rows(client, "s/a") + committed_rows(client, "s/b")
    assert sorted(rows1 + rows2) == sorted(expected)
    assert len(set(rows1 + rows2)) == len(rows1 + rows2)
    assert set(decode_offset(offset2)) == {"s/a", "s/b"}


def test_stream_reader_limits_and_trigger_available_now(store) -> None:
    target, client = store
    write_history(client, "lim/a", seed=21, rounds=10)
    options = {"store": target.url, "journals": "lim/a", "max_messages_per_trigger": "3"}
    reader = OncelogStreamReader(ReadOptions.parse(options), RAW)
    assert reader.getDefaultReadLimit() == ReadMaxRows(3)
    reader.prepareForTriggerAvailableNow()
    client.append("lim/a", b'{"n": "late"}\n')  # after the target: not read
    offset, rows, batches = reader.initialOffset(), [], 0
    while True:
        end = reader.latestOffset(offset, reader.getDefaultReadLimit())
        if end == offset:
            break
        batches += 1
        got = [b for p in reader.partitions(offset, end) for b in reader.read(p)]
        rows += [r["begin"] for b in got for r in b.to_pylist()]
        offset = end
    uncommitted = list(read_uncommitted(client, "lim/a"))
    assert batches >= (len(uncommitted) - 1) // 3
    expected = [b for _, b in committed_rows(client, "lim/a")]
    assert sorted(rows) == sorted(b for b in expected if b < uncommitted[-1].begin)


def test_stream_limits_are_shared_among_journals(store) -> None:
    target, client = store
    for name in ("fair/a", "fair/b", "fair/c"):
        client.create(JournalSpec(name, labels={"app": "fair"}))
        for i in range(5):
            client.append(name, b'{"n": %d}\n' % i)
    options = {"store": target.url, "journals": "app=fair", "max_messages_per_trigger": "4"}
    reader = OncelogStreamReader(ReadOptions.parse(options), RAW)
    offset = reader.initialOffset()
    step = len(b'{"n": 0}\n')
    totals = [0]
    while totals[-1] < 15 and len(totals) < 10:
        offset = reader.latestOffset(offset, reader.getDefaultReadLimit())
        read = {n: jo.offset // step for n, jo in decode_offset(offset).items()}
        if len(totals) == 1:
            assert sorted(read.values()) == [1, 1, 2]  # shared out: none waits
        totals.append(sum(read.values()))
    steps = [b - a for a, b in zip(totals, totals[1:])]
    assert totals[-1] == 15 and all(1 <= n <= 4 for n in steps) and len(steps) <= 6


# --- writes -------------------------------------------------------------------------------


def _arrow_rows(rows: list[dict]) -> pa.RecordBatch:
    schema = pa.schema([("page", pa.string()), ("n", pa.int64())])
    return pa.RecordBatch.from_pylist(rows, schema=schema)


WRITE_SCHEMA = StructType([StructField("page", StringType()), StructField("n", LongType())])


def _docs(client, journal: str) -> list[dict]:
    return [e.message.doc for e in read_committed(client, journal)]


def test_batch_writer_commits_only_on_job_commit(store) -> None:
    target, client = store
    client.create(JournalSpec("out/j"))
    source = OncelogDataSource({"store": target.url, "journal": "out/j"})
    writer = roundtrip(source.writer(WRITE_SCHEMA, False))
    rows = [{"page": f"p{i}", "n": i} for i in range(6)]
    failed = roundtrip(writer).write(iter([_arrow_rows(rows[:2])]))  # an attempt that fails
    del failed
    messages = [
        roundtrip(roundtrip(writer).write(iter([_arrow_rows(rows[i : i + 3])]))) for i in (0, 3)
    ]
    assert all(isinstance(m, TaskCommit) and m.rows == 3 for m in messages)
    assert _docs(client, "out/j") == []  # published, not yet visible
    writer.commit(messages)
    got = _docs(client, "out/j")
    assert sorted(d["n"] for d in got) == list(range(6))
    assert all(set(d) == {"page", "n", "uuid"} for d in got)

    aborted = roundtrip(source.writer(WRITE_SCHEMA, False))
    done = aborted.write(iter([_arrow_rows([{"page": "x", "n": 99}])]))
    aborted.abort([done, None])
    assert sorted(d["n"] for d in _docs(client, "out/j")) == list(range(6))
    # The rollback is in the journal, and the aborted message is never delivered.
    assert any(e.message.doc.get("n") == 99 for e in read_uncommitted(client, "out/j"))
    with pytest.raises(SchemaError, match="append"):
        source.writer(WRITE_SCHEMA, True)


def test_writer_maps_rows_by_key_over_selected_journals(store) -> None:
    from oncelog.mapping import modulo

    target, client = store
    # keyed/0 has no content-type label: JSON lines by default.
    specs = [
        JournalSpec(f"keyed/{i}", labels={"app": "keyed", "content-type": JSON}) for i in range(3)
    ]
    client.create(JournalSpec("keyed/0", labels={"app": "keyed"}))
    for spec in specs[1:]:
        client.create(spec)
    source = OncelogDataSource(
        {"store": target.url, "selector": "app=keyed", "key_column": "page", "mapping": "modulo"}
    )
    writer = source.writer(WRITE_SCHEMA, False)
    rows = [{"page": f"p{i}", "n": i} for i in range(12)]
    writer.commit([writer.write(iter([_arrow_rows(rows)]))])
    pick = modulo(lambda m: m.doc["page"], lambda: specs)
    for spec in specs:
        got = sorted(d["n"] for d in _docs(client, spec.name))
        assert got == [r["n"] for r in rows if pick(JSONMessage(dict(r)))[0] == spec.name]
    with pytest.raises(OptionError, match="not a column"):
        OncelogDataSource(
            {"store": target.url, "selector": "app=keyed", "key_column": "zzz"}
        ).writer(WRITE_SCHEMA, False)


def test_stream_writer_skips_a_batch_id_it_already_committed(store) -> None:
    target, client = store
    client.create(JournalSpec("out/s"))
    options = {"store": target.url, "journal": "out/s", "writer_id": "q1"}
    with pytest.raises(OptionError, match="writer_id"):
        OncelogDataSource({**options, "writer_id": ""}).streamWriter(WRITE_SCHEMA, False)
    writer = OncelogDataSource(options).streamWriter(WRITE_SCHEMA, False)
    two = [{"page": "a", "n": 1}, {"page": "b", "n": 2}]
    first = [roundtrip(writer).write(iter([_arrow_rows(two)]))]
    writer.commit(first, 0)
    # The driver failed after committing batch 0: Spark replays it with new task attempts.
    again = [roundtrip(writer).write(iter([_arrow_rows(two)]))]
    roundtrip(writer).commit(again, 0)
    nxt = [writer.write(iter([_arrow_rows([{"page": "c", "n": 3}])]))]
    writer.commit(nxt, 1)
    assert sorted(d["n"] for d in _docs(client, "out/s")) == [1, 2, 3]
    assert client.meta.list("spark/writers/q1/batches") == [
        "00000000000000000000.json", "00000000000000000001.json"
    ]
    writer.abort([writer.write(iter([_arrow_rows([{"page": "d", "n": 4}])]))], 2)
    assert sorted(d["n"] for d in _docs(client, "out/s")) == [1, 2, 3]


def test_stream_writer_finishes_a_recorded_commit_that_was_not_appended(store) -> None:
    target, client = store
    client.create(JournalSpec("out/r"))
    writer = OncelogDataSource(
        {"store": target.url, "journal": "out/r", "writer_id": "q2"}
    ).streamWriter(WRITE_SCHEMA, False)
    first = [writer.write(iter([_arrow_rows([{"page": "a", "n": 1}])]))]
    # Simulate a crash between recording batch 5 and appending its ACKs.
    import base64

    acks = [[j, base64.b64encode(i).decode()] for m in first for j, i in m.acks]
    path = "spark/writers/q2/batches/00000000000000000005.json"
    assert client.meta.put_if_absent(path, orjson.dumps({"batch": 5, "acks": acks}))
    assert _docs(client, "out/r") == []
    replay = [writer.write(iter([_arrow_rows([{"page": "a", "n": 1}])]))]
    writer.commit(replay, 5)
    assert [d["n"] for d in _docs(client, "out/r")] == [1]


def test_csv_journals_are_written_with_the_uuid_first(store) -> None:
    target, client = store
    client.create(JournalSpec("out/csv", labels={"content-type": "text/csv"}))
    source = OncelogDataSource({"store": target.url, "journal": "out/csv"})
    writer = source.writer(WRITE_SCHEMA, False)
    rows = [{"page": "a,b", "n": 1}, {"page": None, "n": 2}]
    writer.commit([writer.write(iter([_arrow_rows(rows)]))])
    got = [e.message.fields for e in read_committed(client, "out/csv")]
    assert [f[1:] for f in got] == [["a,b", "1"], ["", "2"]]
    options = ReadOptions.parse({"store": target.url, "journals": "out/csv"})
    table = read_all(OncelogBatchReader(options, RAW))
    assert [m.split(",", 1)[1] for m in table.column("message").to_pylist()] == ['"a,b",1', ",2"]


def test_pyspark_finds_the_default_source_module() -> None:
    """PySpark registers `DefaultSource` of installed `pyspark_*` modules by itself."""
    from pyspark.sql.datasource import DataSource

    import pyspark_oncelog

    assert pyspark_oncelog.DefaultSource is OncelogDataSource
    assert issubclass(pyspark_oncelog.DefaultSource, DataSource)
    assert pyspark_oncelog.DefaultSource.name() == "oncelog"
