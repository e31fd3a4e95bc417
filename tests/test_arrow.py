"""Read-committed journals as Arrow tables: the same messages as read_committed, in order,
with rolled-back transactions and duplicates left out."""

from __future__ import annotations

import subprocess
import sys
import uuid
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from speedups_support import MODES, speedups_mode

from oncelog import JSONMessage, Publisher, read_committed
from oncelog.arrow import read_committed_arrow
from oncelog.journal import JournalSpec
from oncelog.testing import histories, run_history
from oncelog.testing.fixtures import StoreTarget

NDJSON = "application/x-ndjson"


def to(name: str):  # type: ignore[no-untyped-def]
    return lambda _m: (name, NDJSON)


def test_arrow_table_equals_read_committed(store_url: StoreTarget) -> None:
    client = store_url.open()
    client.create(JournalSpec("arrow/j", {"content-type": NDJSON}))
    pub, other = Publisher(client), Publisher(client)
    for i in range(5):
        pub.publish_committed(to("arrow/j"), JSONMessage({"n": i, "who": "a"}))
    with pytest.raises(RuntimeError):
        with other.transaction():
            other.publish_uncommitted(to("arrow/j"), JSONMessage({"n": -1, "who": "rolled"}))
            raise RuntimeError("roll back")
    with other.transaction():
        for i in range(5, 8):
            other.publish_uncommitted(to("arrow/j"), JSONMessage({"n": i, "who": "b"}))
    pub.flush()
    first = next(iter(read_committed(client, "arrow/j")))
    with client.read("arrow/j", first.begin) as reader:  # a duplicate of the first frame
        client.append("arrow/j", reader.read(first.end - first.begin))
    expected = [(e.begin, e.message.doc["n"]) for e in read_committed(client, "arrow/j")]
    table = read_committed_arrow(client, "arrow/j", parse=True)
    assert list(zip(table.column("begin").to_pylist(), table.column("n").to_pylist())) == expected
    assert set(table.column("who").to_pylist()) == {"a", "b"}
    raw = read_committed_arrow(client, "arrow/j")
    assert raw.num_rows == len(expected) and "message" in raw.column_names
    assert raw.to_pylist()[0]["begin"] == expected[0][0]
    client.close()


def test_empty_journal_and_wrong_content_type(memory_store: StoreTarget) -> None:
    client = memory_store.open()
    client.create(JournalSpec("arrow/empty", {"content-type": NDJSON}))
    assert read_committed_arrow(client, "arrow/empty").num_rows == 0
    assert read_committed_arrow(client, "arrow/empty", parse=True).num_rows == 0
    client.create(JournalSpec("arrow/csv", {"content-type": "text/csv"}))
    with pytest.raises(ValueError, match="parse=True reads JSON"):
        read_committed_arrow(client, "arrow/csv", parse=True)
    client.close()


def test_no_pyspark_is_needed(tmp_path: Any) -> None:
    """With PySpark made unimportable, Arrow reads work (raw and parsed, and empty)."""
    code = f"""
import sys
sys.modules["pyspark"] = None  # any import of pyspark now raises ImportError
from oncelog import JSONMessage, Publisher
from oncelog.arrow import read_committed_arrow
from oncelog.journal import JournalSpec, open_journals
client = open_journals({str(tmp_path / "store")!r})
client.create(JournalSpec("a/j", {{"content-type": "{NDJSON}"}}))
client.create(JournalSpec("a/empty", {{"content-type": "{NDJSON}"}}))
pub = Publisher(client)
with pub.transaction():
    for i in range(3):
        pub.publish_uncommitted(lambda _m: ("a/j", "{NDJSON}"), JSONMessage({{"n": i}}))
assert read_committed_arrow(client, "a/j", parse=True).column("n").to_pylist() == [0, 1, 2]
assert read_committed_arrow(client, "a/j").num_rows == 3
assert read_committed_arrow(client, "a/empty").num_rows == 0
assert not [m for m in sys.modules if m.startswith("pyspark") and sys.modules[m] is not None]
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.parametrize("mode", MODES)
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    history=histories(producers=3, journals=1, max_steps=40),
    chunk=st.sampled_from([4096, 1 << 20]),
)
def test_arrow_rows_are_read_committed_on_random_histories(
    memory_store: StoreTarget, mode: str, history: Any, chunk: int
) -> None:
    """Random Publisher histories (transactions, rollbacks, crashes, duplicates) read in
    chunks of 4 KiB (transactions span many) and of 1 MiB: the rows of read_committed."""
    client = memory_store.open()
    name = f"arrow/{uuid.uuid4().hex[:8]}"
    client.create(JournalSpec(name))
    run_history(client, [name], history)
    with speedups_mode(mode):
        expected = [(e.begin, e.end, str(e.uuid), e.message.doc) for e in
                    read_committed(client, name)]
        table = read_committed_arrow(client, name, chunk_bytes=chunk)
    got = list(zip(
        table.column("begin").to_pylist(), table.column("end").to_pylist(),
        table.column("uuid").to_pylist(),
        [orjson.loads(m) for m in table.column("message").to_pylist()],
    ))
    assert got == expected
    client.close()


@pytest.mark.parametrize("mode", MODES)
def test_transactions_longer_than_a_chunk(memory_store: StoreTarget, mode: str) -> None:
    """Two producers' transactions of 300 messages interleaved with committed messages and
    a rollback, read 4 KiB at a time: every transaction spans many chunks."""
    client = memory_store.open()
    client.create(JournalSpec("arrow/long", {"content-type": NDJSON}))
    a, b, c = Publisher(client), Publisher(client), Publisher(client)
    with pytest.raises(RuntimeError), b.transaction():
        for i in range(50):
            b.publish_uncommitted(to("arrow/long"), JSONMessage({"n": -i, "pad": "x" * 40}))
        raise RuntimeError("roll back")
    with a.transaction(), b.transaction():
        for i in range(300):
            a.publish_uncommitted(to("arrow/long"), JSONMessage({"n": i, "pad": "a" * 40}))
            b.publish_uncommitted(to("arrow/long"), JSONMessage({"n": 1000 + i, "pad": "b"}))
            if i % 50 == 0:
                c.publish_committed(to("arrow/long"), JSONMessage({"n": 5000 + i}))
        c.flush()
    with speedups_mode(mode):
        expected = [(e.begin, e.message.doc["n"]) for e in read_committed(client, "arrow/long")]
        table = read_committed_arrow(client, "arrow/long", parse=True, chunk_bytes=4096)
    assert len(expected) == 606
    assert list(zip(table.column("begin").to_pylist(), table.column("n").to_pylist())) == expected
    client.close()


@settings(max_examples=200, deadline=None)
@given(
    mask=st.lists(st.booleans(), max_size=300),
    rows=st.integers(1, 50),
    runs=st.sampled_from([1, 3, 64]),
)
def test_selected_rows_are_a_filter(mask: list[bool], rows: int, runs: int) -> None:
    """Committed rows are taken as zero-copy runs or one filtered copy: either way the rows
    of `filter(mask)`, in order, in batches of at most `rows`."""
    import pyarrow as pa

    import oncelog.spark.read as spark_read

    n = len(mask)
    batch = pa.RecordBatch.from_pydict({"i": list(range(n)), "s": [f"m{i}" for i in range(n)]})
    arrow_mask = pa.array(mask, pa.bool_())
    saved = spark_read._MAX_RUNS
    spark_read._MAX_RUNS = runs
    try:
        out = list(spark_read._selected(batch, arrow_mask, rows))
    finally:
        spark_read._MAX_RUNS = saved
    assert all(0 < b.num_rows <= rows for b in out)
    got = [r for b in out for r in b.to_pylist()]
    assert got == batch.filter(arrow_mask).to_pylist()


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value


_DOCS = st.fixed_dictionaries(
    {"n": st.integers(-1000, 1000)},
    optional={
        "x": st.one_of(st.integers(-5, 5), st.floats(-5, 5, allow_nan=False).map(float)),
        "s": st.text("abc", max_size=3),
        "nested": st.fixed_dictionaries({"k": st.integers(0, 9)}),
        "late": st.booleans(),
    },
)


@pytest.mark.parametrize("mode", MODES)
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    first=st.lists(_DOCS.map(lambda d: {k: v for k, v in d.items() if k != "late"}), max_size=8),
    rest=st.lists(_DOCS, max_size=30),
    txn=st.integers(1, 5),
    infer=st.sampled_from([150, 1 << 20]),
)
def test_parsed_documents_equal_read_committed(
    memory_store: StoreTarget, monkeypatch: Any, mode: str, first: list[dict[str, Any]],
    rest: list[dict[str, Any]], txn: int, infer: int,
) -> None:
    """Documents whose fields come and go and change type (ints then floats, a field first
    seen late): parsed in one pass where the first lines' types hold, from the text
    otherwise; the same documents as read_committed either way."""
    import oncelog.arrow as arrow_module

    monkeypatch.setattr(arrow_module, "_INFER_BYTES", infer)
    passes: list[str] = []
    flattened = arrow_module._flattened
    monkeypatch.setattr(
        arrow_module, "_flattened", lambda t: passes.append("one") or flattened(t)
    )
    client = memory_store.open()
    name = f"arrow/{uuid.uuid4().hex[:8]}"
    client.create(JournalSpec(name, {"content-type": NDJSON}))
    pub, other = Publisher(client), Publisher(client)
    docs = first + rest
    for i in range(0, len(docs), txn):
        with pub.transaction():
            for doc in docs[i : i + txn]:
                pub.publish_uncommitted(to(name), JSONMessage(dict(doc)))
        if i % 3 == 0:  # a rolled-back transaction with a field nothing committed has
            with pytest.raises(RuntimeError), other.transaction():
                other.publish_uncommitted(to(name), JSONMessage({"n": -1, "ghost": 1}))
                raise RuntimeError("roll back")
    with speedups_mode(mode):
        expected = [
            (e.begin, _without_nulls({k: v for k, v in e.message.doc.items() if k != "uuid"}))
            for e in read_committed(client, name)
        ]
        table = read_committed_arrow(client, name, parse=True)
    meta = {"journal", "begin", "end", "commit_offset", "uuid", "producer", "clock", "time",
            "flags", "uuid_key"}
    got = [
        (row["begin"], _without_nulls({k: v for k, v in row.items() if k not in meta}))
        for row in table.to_pylist()
    ]
    assert got == expected
    assert passes == (["one"] if passes else [])  # one pass at most, never twice
    client.close()


def test_types_that_change_late_fall_back_to_the_text(
    memory_store: StoreTarget, monkeypatch: Any
) -> None:
    import oncelog.arrow as arrow_module

    monkeypatch.setattr(arrow_module, "_INFER_BYTES", 4096)
    client = memory_store.open()
    client.create(JournalSpec("arrow/late", {"content-type": NDJSON}))
    pub = Publisher(client)
    for i in range(200):
        pub.publish_committed(to("arrow/late"), JSONMessage({"n": i}))
    pub.publish_committed(to("arrow/late"), JSONMessage({"n": 0.5, "new": "x"}))
    pub.flush()
    table = read_committed_arrow(client, "arrow/late", parse=True)
    assert table.column("n").type == pa_double() and table.column("n").to_pylist()[-1] == 0.5
    assert table.column("new").to_pylist()[-1] == "x"
    ones = [r["n"] for r in table.select(["n"]).to_pylist()[:3]]
    assert ones == [0, 1, 2]
    client.close()


def pa_double() -> Any:
    import pyarrow as pa

    return pa.float64()


_LINE = st.one_of(
    st.text("{}[]a\":,1 ", max_size=12),
    st.builds(lambda d: "{" + "[" * d + "]" * d + "}", st.sampled_from([0, 3, 1023, 1024, 1100])),
    st.builds(lambda d: "{" + '"a":{' * d + "}" * d + "}", st.sampled_from([1, 1023, 1024])),
    st.just('{"uuid":"x","n":1}'),
)


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=300, deadline=None)
@given(lines=st.lists(_LINE, max_size=6), newline=st.booleans())
def test_object_line_scan_is_the_same_in_c_and_python(
    mode: str, lines: list[str], newline: bool
) -> None:
    """Which chunks take Arrow's one-pass read, and their line lengths: the C scan and the
    Arrow-kernel scan agree (each against the other: both modes must give the reference)."""
    from oncelog.spark.batches import _object_lines

    chunk = "\n".join(lines).encode() + (b"\n" if newline else b"")
    with speedups_mode("pure"):
        reference = _object_lines(chunk)
    with speedups_mode(mode):
        got = _object_lines(chunk)
    if reference is None:
        assert got is None
    else:
        assert got is not None and got.to_pylist() == reference.to_pylist()
        assert got.to_pylist() == [len(line) for line in chunk.split(b"\n")[:-1]]


@settings(max_examples=200, deadline=None)
@given(
    ids=st.lists(
        st.tuples(
            st.binary(min_size=6, max_size=6),
            st.integers(0, (1 << 63) - 1),
            st.integers(0, 0x3FF),
        ),
        max_size=20,
    ),
    upper=st.booleans(),
    nil=st.booleans(),
    as_list=st.booleans(),
)
def test_uuid_columns_are_the_same_in_c_and_python(
    ids: list[tuple[bytes, int, int]], upper: bool, nil: bool, as_list: bool
) -> None:
    """Clock, flags, time (null for the nil UUID), producer and key of canonical UUID
    strings in any case: the C pass equals the Arrow-kernel one, column for column."""
    import pyarrow as pa

    from oncelog.message import build_uuid
    from oncelog.spark.uuids import NIL_TEXT, uuid_columns

    texts = [str(build_uuid(p, c, f)) for p, c, f in ids] + ([NIL_TEXT] if nil else [])
    texts = [t.upper() for t in texts] if upper else texts
    column: Any = texts if as_list else pa.array(texts, pa.string())
    with speedups_mode("pure"):
        reference = uuid_columns(column)
    if "c" not in MODES:
        return
    with speedups_mode("c"):
        got = uuid_columns(column)
    for name in ("uuid", "producer", "clock", "time", "flags", "key"):
        assert getattr(got, name).equals(getattr(reference, name)), name
    assert got.ids() == reference.ids()


@pytest.mark.parametrize("mode", MODES)
def test_uuid_columns_refuse_clocks_beyond_63_bits(mode: str) -> None:
    import pyarrow as pa

    from oncelog.message import build_uuid
    from oncelog.spark.uuids import uuid_columns

    text = str(build_uuid(b"\x01" * 6, 1 << 63, 0))
    with speedups_mode(mode), pytest.raises(ValueError, match="2\\*\\*63"):
        uuid_columns(pa.array([text]))


def test_parse_of_a_journal_whose_first_lines_are_only_uuids(memory_store: StoreTarget) -> None:
    """Trimmed to just after a transaction's messages, a journal starts with its ACK: the
    types Arrow infers from the first lines have no fields. parse=True reads it as
    read_committed does (it raised "Arrays were not all the same length: 0 vs 1")."""
    client = memory_store.open()
    name = f"t/{uuid.uuid4().hex[:8]}"
    client.create(JournalSpec(name, labels={"content-type": "application/x-ndjson"}))
    pub = Publisher(client)
    with pub.transaction():
        pub.publish_uncommitted(lambda _m: (name, "application/x-ndjson"), JSONMessage({"n": 1}))
        pub.flush()  # the messages in a fragment of their own, the ACK in the next
        ack = client.head(name)
    client.trim(name, before=ack)
    assert client.first_offset(name) == ack
    assert read_committed_arrow(client, name, parse=True).num_rows == 0
    assert list(read_committed(client, name)) == []
    pub.publish_committed(lambda _m: (name, "application/x-ndjson"), JSONMessage({"n": 2}))
    pub.flush()
    table = read_committed_arrow(client, name, parse=True)
    assert table.column("begin").to_pylist() == [e.begin for e in read_committed(client, name)]
    client.close()
