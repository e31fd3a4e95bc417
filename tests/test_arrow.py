"""Read-committed journals as Arrow tables: the same messages as read_committed, in order,
with rolled-back transactions and duplicates left out."""

from __future__ import annotations

import pytest

from oncelog import JSONMessage, Publisher, read_committed
from oncelog.arrow import read_committed_arrow
from oncelog.journal import JournalSpec
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
