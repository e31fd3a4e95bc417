"""Segments of CSV journals that record their column names (label `oncelog.dev/csv-columns`):
compaction writes the records' fields as a `doc` struct of string columns, and
`read_committed_arrow(parse=True)` / `dataset` read those columns instead of parsing the
records' text, with exactly the rows of a read without segments (of an uncompacted copy of
the journal, and of its frames alone), whenever the names were recorded.
"""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from oncelog.arrow import read_committed_arrow
from oncelog.coordination import MetaStore
from oncelog.framing.csvlines import CSV_COLUMNS_LABEL, csv_column_labels
from oncelog.journal import JournalClient, JournalSpec
from oncelog.message import CSVRecord
from oncelog.publisher import Publisher
from oncelog.reading import read_committed
from oncelog.tables import SEGMENTS_LABEL, csvdoc, dataset, merge_on_read
from oncelog.tables.segments import SegmentRecord, file_path, segment_records
from oncelog.testing.fixtures import StoreTarget

CSV = "text/csv"
COLUMNS = ["uuid", "page", "ms"]
RAW_RECORDS = b',/long,1,x,y\n,/short\n,"/q,""uote""",\n,/wide,2,z\n'
"""Nil-UUID records (committed, outside any transaction): two fields past the header's
columns, a short one, a quoted one with an empty field, one field past the header."""


def new_csv(client: JournalClient, name: str, columns: list[str] | None) -> None:
    labels: dict[str, str | list[str]] = {"content-type": CSV}
    if columns is not None:
        labels[CSV_COLUMNS_LABEL] = csv_column_labels(columns)
    client.create(JournalSpec(name, labels=labels))


def record_columns(client: JournalClient, name: str, columns: list[str]) -> None:
    """Record `columns` on `name` as `oncelog append --header` does (a conditional update)."""
    spec = client.get(name)
    labels = spec.labels.set(CSV_COLUMNS_LABEL, csv_column_labels(columns))
    client.update(replace(spec, labels=labels), expect=spec)


def write_round(client: JournalClient, name: str, a: Publisher, b: Publisher, r: int) -> None:
    """b commits a record; a writes one inside a transaction left open (committed by
    `commit`, after the next compaction); raw records with nil UUIDs follow."""
    to = lambda _m: (name, CSV)  # noqa: E731
    b.publish_committed(to, CSVRecord(["", f"/b{r}", str(r)]))
    a.publish_uncommitted(to, CSVRecord(["", f"/a{r}", str(10 + r)]))
    a.flush()
    b.flush()
    client.append(name, RAW_RECORDS)


def commit(a: Publisher) -> None:
    a.append_intents(a.build_ack_intents())


def copy_of(client: JournalClient, name: str, copy: str) -> None:
    """An uncompacted copy of `name` (segments off): its bytes at the same offsets."""
    spec = client.get(name)
    client.create(JournalSpec(copy, labels=spec.labels.set(SEGMENTS_LABEL, "off")))
    chunks = []
    with client.read(name, 0) as reader:
        for _ in range(10_000):
            data = reader.read(1 << 20)
            if not data:
                break
            chunks.append(data)
    client.append(copy, b"".join(chunks))
    assert client.head(copy) == client.head(name)


def from_frames(client: JournalClient, name: str, **kwargs: object) -> pa.Table:
    """read_committed_arrow without segments: what it returned before they existed."""
    original = merge_on_read.committed_table
    merge_on_read.committed_table = lambda *a, **k: None  # type: ignore[assignment]
    try:
        return read_committed_arrow(client, name, **kwargs)  # type: ignore[arg-type]
    finally:
        merge_on_read.committed_table = original


def same_rows(one: pa.Table, other: pa.Table) -> bool:
    """Equal tables but for the `journal` column (a copy has another name)."""
    drop = lambda t: t.drop_columns(["journal"]) if "journal" in t.column_names else t  # noqa: E731
    return drop(one).equals(drop(other))


def doc_type(client: JournalClient, rec: SegmentRecord) -> pa.DataType | None:
    """The type of the segment file's `doc` column (from its Parquet schema), if any."""
    data = MetaStore.of(client, internal=True).read(file_path(rec.journal, rec.file))
    assert data is not None
    schema = pq.read_schema(pa.BufferReader(data))
    return schema.field("doc").type if "doc" in schema.names else None


def csv_parsed_rows(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The row counts of every CSV text parse (`csv_fields`) from now on."""
    seen: list[int] = []
    original = csvdoc.csv_fields

    def spy(table: pa.Table, journal: str, names: list[str]) -> pa.Table:
        seen.append(table.num_rows)
        return original(table, journal, names)

    monkeypatch.setattr(csvdoc, "csv_fields", spy)
    return seen


def assert_reads_equal(client: JournalClient, name: str, copy: str | None) -> pa.Table:
    """Every parsed read of `name` equals its frames' (and the copy's, if given)."""
    parsed = read_committed_arrow(client, name, parse=True)
    assert parsed.equals(from_frames(client, name, parse=True))
    assert dataset(client, [name]).to_table().equals(parsed)
    some = ["begin", "page", "_4", "commit_offset"]
    picked = read_committed_arrow(client, name, parse=True, columns=some)
    assert picked.equals(parsed.select(some))
    text = read_committed_arrow(client, name)
    assert text.equals(from_frames(client, name))
    assert text.column("begin").to_pylist() == [e.begin for e in read_committed(client, name)]
    if copy is not None:
        assert same_rows(parsed, read_committed_arrow(client, copy, parse=True))
        assert same_rows(dataset(client, [name]).to_table(), dataset(client, [copy]).to_table())
        assert same_rows(picked, read_committed_arrow(client, copy, parse=True, columns=some))
    return parsed


def test_named_csv_segments_hold_doc_columns_and_readers_use_them(
    journals: JournalClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "csv/views"
    new_csv(journals, name, COLUMNS)
    a, b = Publisher(journals), Publisher(journals)
    for r in range(4):
        write_round(journals, name, a, b, r)
        # (Small fragments: a trim can cut inside a segment below.)
        journals.compact(name, target_length=64, retire_grace=0)  # a's transaction open
        commit(a)
    write_round(journals, name, a, b, 4)  # the tail: a's last transaction still open
    copy_of(journals, name, "csv/views-copy")

    records, bad = segment_records(journals, name)
    assert not bad and len(records) == 4
    assert any(r.start for r in records), "no segment began with an open transaction"
    for rec in records:
        assert rec.parsed, rec.describe()
        doc = doc_type(journals, rec)
        assert isinstance(doc, pa.StructType), rec.describe()
        assert [doc.field(i).name for i in range(doc.num_fields)] == ["page", "ms", "_3", "_4"]
        assert all(doc.field(i).type == pa.string() for i in range(doc.num_fields))

    seen = csv_parsed_rows(monkeypatch)
    parsed = assert_reads_equal(journals, name, "csv/views-copy")
    assert parsed.column_names[-4:] == ["page", "ms", "_3", "_4"]
    assert "uuid" in parsed.column_names and "message" not in parsed.column_names
    pages = parsed.column("page").to_pylist()
    # a's round-0 record, written before the first boundary, commits after it (in the next
    # segment), after b's and the raw records, at the offset it was written at.
    assert pages[:7] == ["/b0", "/long", "/short", '/q,"uote"', "/wide", "/a0", "/b1"]
    a0 = parsed.slice(5, 1).to_pylist()[0]
    assert a0["begin"] < records[0].end <= a0["commit_offset"] < records[1].end
    assert parsed.column("ms").to_pylist()[2:4] == [None, ""]
    # The segments' rows came from their doc columns: only the tail was parsed as text.
    segment_rows = sum(r.rows for r in records)
    assert segment_rows and segment_rows < parsed.num_rows
    assert seen and seen[0] == parsed.num_rows - segment_rows

    # A trim in the middle of a segment: a reader starting afresh reads frames until it
    # agrees with the segments again, and still returns exactly the frames' rows.
    cut = records[1].begin + (records[1].end - records[1].begin) // 2
    journals.trim(name, before=cut)
    assert journals.first_offset(name) > records[0].end
    trimmed = assert_reads_equal(journals, name, None)
    assert min(trimmed.column("begin").to_pylist()) >= journals.first_offset(name)
    found = merge_on_read._parts(journals, name, None)
    assert found is not None and found[1] >= 1  # the reader agrees with a segment again


def test_names_recorded_after_the_first_compaction(local_store: StoreTarget) -> None:
    """Segments written before the names were recorded hold text only: readers parse it;
    later ones hold doc columns; the rows are the same as without any segment."""
    with local_store.open() as client:
        name = "csv/late"
        new_csv(client, name, None)
        a, b = Publisher(client), Publisher(client)
        write_round(client, name, a, b, 0)
        client.compact(name, retire_grace=0)
        commit(a)
        record_columns(client, name, COLUMNS)
        write_round(client, name, a, b, 1)
        client.compact(name, retire_grace=0)
        commit(a)
        write_round(client, name, a, b, 2)
        copy_of(client, name, "csv/late-copy")

        records, _ = segment_records(client, name)
        assert len(records) == 2
        assert not records[0].parsed and doc_type(client, records[0]) is None
        assert records[1].parsed and isinstance(doc_type(client, records[1]), pa.StructType)
        assert merge_on_read._parts(client, name, None) is not None
        parsed = assert_reads_equal(client, name, "csv/late-copy")
        assert parsed.column("page").to_pylist()[:2] == ["/b0", "/long"]


def test_doc_columns_of_other_names_are_not_used(memory_store: StoreTarget) -> None:
    """Names changed after a segment was written (another order): its doc columns no longer
    fit, and readers parse its text by the names recorded now."""
    with memory_store.open() as client:
        name = "csv/renamed"
        new_csv(client, name, COLUMNS)
        a, b = Publisher(client), Publisher(client)
        write_round(client, name, a, b, 0)
        client.compact(name, retire_grace=0)
        commit(a)
        record_columns(client, name, ["uuid", "ms", "page"])
        write_round(client, name, a, b, 1)
        records, _ = segment_records(client, name)
        assert len(records) == 1 and records[0].parsed
        parsed = assert_reads_equal(client, name, None)
        assert parsed.column("ms").to_pylist()[0] == "/b0"
