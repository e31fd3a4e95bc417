"""Segments of fixed-framed (protobuf) journals that record their message class (label
`oncelog.dev/protobuf-class`): compaction writes the messages' fields as a `doc` struct
beside their payloads, and `read_committed_arrow` / `dataset` read those columns instead of
parsing payloads, with exactly the rows of a read of the frames alone, and of
`read_committed` with the class.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proto_support import (
    EVENT_CLASS,
    EVENT_V2_CLASS,
    NODE_CLASS,
    WIDE_CLASS,
    Event,
    EventV2,
    Node,
    Wide,
)
from test_tables_csv import copy_of, doc_type, from_frames, same_rows

from oncelog.arrow import read_committed_arrow
from oncelog.framing import CONTENT_TYPE_PROTOBUF_FIXED, encode_fixed_frame
from oncelog.framing.protoclass import PROTOBUF_CLASS_LABEL
from oncelog.journal import JournalClient, JournalSpec
from oncelog.message import NIL_UUID, ProtoMessage
from oncelog.publisher import Publisher
from oncelog.reading import read_committed
from oncelog.spark.options import OptionError
from oncelog.tables import dataset, merge_on_read, protodoc
from oncelog.tables.segments import proto_struct, segment_records
from oncelog.testing.fixtures import StoreTarget

PROTO = CONTENT_TYPE_PROTOBUF_FIXED


def new_journal(client: JournalClient, name: str, proto_class: str | None) -> None:
    labels: dict[str, str | list[str]] = {"content-type": PROTO}
    if proto_class is not None:
        labels[PROTOBUF_CLASS_LABEL] = proto_class
    client.create(JournalSpec(name, labels=labels))


def record_class(client: JournalClient, name: str, proto_class: str) -> None:
    spec = client.get(name)
    client.update(replace(spec, labels=spec.labels.set(PROTOBUF_CLASS_LABEL, proto_class)),
                  expect=spec)


def write_round(client: JournalClient, name: str, a: Publisher, b: Publisher, r: int) -> None:
    """b commits an event; a writes one inside a transaction left open (committed by
    `commit`, after the next compaction); a nil-UUID frame (always delivered) follows."""
    to = lambda _m: (name, PROTO)  # noqa: E731
    b.publish_committed(to, ProtoMessage(Event(seq=r, user=f"b{r}", tags=["x", str(r)])))
    a.publish_uncommitted(to, ProtoMessage(Event(seq=100 + r, user=f"a{r}", ok=True,
                                                 blob=bytes([r, 0, 255]))))
    a.flush()
    b.flush()
    nil = Event(uuid=str(NIL_UUID), seq=-r, user="raw")
    client.append(name, encode_fixed_frame(nil.SerializeToString()))


def commit(a: Publisher) -> None:
    a.append_intents(a.build_ack_intents())


def expected_rows(client: JournalClient, name: str, cls: Any) -> list[dict[str, Any]]:
    """read_committed with the class: each message's offset and fields, in commit order."""
    struct = proto_struct(cls)
    assert struct is not None
    names = [struct.field(i).name for i in range(struct.num_fields)]
    out = []
    for env in read_committed(client, name, new_message=ProtoMessage.factory(cls)):
        row = protodoc.doc_array([env.message.proto], struct).to_pylist()[0]
        out.append({"begin": env.begin, **{n: row[n] for n in names}})
    return out


def payload_parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The row counts of every parse of payloads into columns from now on."""
    seen: list[int] = []
    original = protodoc.payload_documents

    def spy(payloads: Any, proto_class: Any, struct: pa.StructType) -> pa.StructArray:
        seen.append(len(payloads))
        return original(payloads, proto_class, struct)

    monkeypatch.setattr(protodoc, "payload_documents", spy)
    return seen


def assert_reads_equal(client: JournalClient, name: str, cls: Any, copy: str | None
                       ) -> pa.Table:
    """Every read of `name` equals its frames' read, read_committed's, and the copy's."""
    parsed = read_committed_arrow(client, name, parse=True)
    assert parsed.equals(from_frames(client, name, parse=True))
    assert dataset(client, [name]).to_table().equals(parsed)
    struct = proto_struct(cls)
    assert struct is not None
    fields = ["begin", *(struct.field(i).name for i in range(struct.num_fields))]
    assert parsed.select(fields).to_pylist() == expected_rows(client, name, cls)
    some = ["begin", "user", "commit_offset"] if "user" in fields else ["begin", "commit_offset"]
    picked = read_committed_arrow(client, name, parse=True, columns=some)
    assert picked.equals(parsed.select(some))
    payloads = read_committed_arrow(client, name)
    assert payloads.equals(from_frames(client, name))
    assert payloads.column("message").type == pa.binary()
    if copy is not None:
        assert same_rows(parsed, read_committed_arrow(client, copy, parse=True))
        assert same_rows(payloads, read_committed_arrow(client, copy))
    return parsed


def test_protobuf_segments_hold_fields_and_readers_use_them(
    journals: JournalClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "proto/events"
    new_journal(journals, name, EVENT_CLASS)
    a, b = Publisher(journals), Publisher(journals)
    for r in range(4):
        write_round(journals, name, a, b, r)
        journals.compact(name, target_length=64, retire_grace=0)  # a's transaction open
        commit(a)
    write_round(journals, name, a, b, 4)  # the tail: a's last transaction still open
    copy_of(journals, name, "proto/events-copy")

    records, bad = segment_records(journals, name)
    assert not bad and len(records) == 4
    assert any(r.start for r in records), "no segment began with an open transaction"
    for rec in records:
        assert rec.parsed, rec.describe()
        assert doc_type(journals, rec) == proto_struct(Event), rec.describe()

    seen = payload_parses(monkeypatch)
    parsed = assert_reads_equal(journals, name, Event, "proto/events-copy")
    assert parsed.column_names[-5:] == ["seq", "user", "ok", "tags", "blob"]
    assert "uuid" in parsed.column_names and "message" not in parsed.column_names
    # a's round-0 event, written before the first boundary, commits after it, after b's
    # and the nil-UUID frame, at the offset it was written at.
    assert parsed.column("user").to_pylist()[:4] == ["b0", "raw", "a0", "b1"]
    a0 = parsed.slice(2, 1).to_pylist()[0]
    assert a0["begin"] < records[0].end <= a0["commit_offset"] < records[1].end
    assert a0["blob"] == bytes([0, 0, 255]) and a0["ok"] is True
    # Sealed history came from the doc columns: the parses of payloads were the tail's.
    segment_rows = sum(r.rows for r in records)
    tail_rows = parsed.num_rows - segment_rows
    assert segment_rows and tail_rows
    seen.clear()
    read_committed_arrow(journals, name, parse=True)
    assert sum(seen) == tail_rows

    # A trim in the middle of a segment: a reader starting afresh reads frames until it
    # agrees with the segments again, and still returns exactly the frames' rows.
    cut = records[1].begin + (records[1].end - records[1].begin) // 2
    journals.trim(name, before=cut)
    trimmed = assert_reads_equal(journals, name, Event, None)
    assert min(trimmed.column("begin").to_pylist()) >= journals.first_offset(name)
    found = merge_on_read._parts(journals, name, None)
    assert found is not None and found[1] >= 1  # the reader agrees with a segment again


def test_a_new_version_of_the_class_reads_old_segments_by_their_payloads(
    memory_store: StoreTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Segments written by `Event` lack the field `EventV2` added: readers parse their
    payloads with the class recorded now, so every row has what that class reads (the
    new field's default), as a read of the frames does."""
    with memory_store.open() as client:
        name = "proto/evolving"
        new_journal(client, name, EVENT_CLASS)
        a, b = Publisher(client), Publisher(client)
        write_round(client, name, a, b, 0)
        client.compact(name, retire_grace=0)
        commit(a)
        record_class(client, name, EVENT_V2_CLASS)
        write_round(client, name, a, b, 1)
        client.compact(name, retire_grace=0)
        commit(a)
        write_round(client, name, a, b, 2)
        records, _ = segment_records(client, name)
        assert len(records) == 2
        assert doc_type(client, records[0]) == proto_struct(Event)
        assert doc_type(client, records[1]) == proto_struct(
            EventV2
        )
        seen = payload_parses(monkeypatch)
        parsed = assert_reads_equal(client, name, EventV2, None)
        assert parsed.column("score").to_pylist() == [0.0] * parsed.num_rows
        assert seen and seen[0] == records[0].rows  # the old segment's payloads, parsed


def test_every_field_kind_round_trips_exactly(local_store: StoreTarget) -> None:
    """Unsigned 64-bit, float32, enums by number, nested and repeated messages, maps (by
    key) and proto3 `optional` (null when unset) are the same from segments as from frames;
    a field named like a metadata column (`begin`) is left out, as for JSON documents."""
    with local_store.open() as client:
        name = "proto/wide"
        new_journal(client, name, WIDE_CLASS)
        pub = Publisher(client)
        to = lambda _m: (name, PROTO)  # noqa: E731
        inner = Wide().inner.__class__
        messages = [
            Wide(u64=2**64 - 1, f32=0.1, kind=1, inner=inner(a=-3, b="x"),
                 inners=[inner(a=1), inner(b="y")], counts={"z": 2, "a": -1}, maybe=0,
                 begin="shadowed"),
            Wide(kind=7),  # a number the enum does not name
            Wide(),
        ]
        for m in messages:
            pub.publish_committed(to, ProtoMessage(m))
        pub.flush()
        client.compact(name, retire_grace=0)
        pub.publish_committed(to, ProtoMessage(Wide(maybe=5)))
        pub.flush()
        records, _ = segment_records(client, name)
        assert len(records) == 1 and records[0].parsed
        parsed = assert_reads_equal(client, name, Wide, None)
        rows = parsed.select(["u64", "f32", "kind", "inner", "counts", "maybe"]).to_pylist()
        assert rows[0]["u64"] == 2**64 - 1 and rows[0]["kind"] == 1
        assert rows[0]["f32"] == pytest.approx(0.1)
        assert parsed.schema.field("f32").type == pa.float32()
        assert rows[0]["counts"] == [("a", -1), ("z", 2)]
        assert rows[0]["inner"] == {"a": -3, "b": "x"} and rows[2]["inner"] is None
        assert [r["maybe"] for r in rows] == [0, None, None, 5]
        assert rows[1]["kind"] == 7
        assert parsed.column("begin").to_pylist() == sorted(parsed.column("begin").to_pylist())
        assert "shadowed" not in str(parsed.to_pylist())


def test_a_recursive_class_keeps_payloads_only(memory_store: StoreTarget) -> None:
    """No struct holds a recursive message: its segments keep the payloads (read by
    parse=False exactly as from frames) and parse=True says why it cannot."""
    with memory_store.open() as client:
        name = "proto/tree"
        new_journal(client, name, NODE_CLASS)
        pub = Publisher(client)
        to = lambda _m: (name, PROTO)  # noqa: E731
        for i in range(3):
            pub.publish_committed(to, ProtoMessage(Node(name=f"n{i}", child=Node(name="c"))))
        pub.flush()
        client.compact(name, retire_grace=0)
        records, _ = segment_records(client, name)
        assert len(records) == 1 and not records[0].parsed
        assert doc_type(client, records[0]) is None
        payloads = read_committed_arrow(client, name)
        assert payloads.equals(from_frames(client, name))
        assert [Node.FromString(p).name for p in payloads.column("message").to_pylist()] == [
            "n0", "n1", "n2"]
        with pytest.raises(ValueError, match="recursive"):
            read_committed_arrow(client, name, parse=True)


def test_a_class_that_does_not_import(memory_store: StoreTarget,
                                      caplog: pytest.LogCaptureFixture) -> None:
    """Compaction writes no segments and warns, naming journal, label and class; readers
    report the same, and read the frames when given a class that imports."""
    with memory_store.open() as client:
        name = "proto/lost"
        new_journal(client, name, "nowhere_at_all.Event")
        pub = Publisher(client)
        pub.publish_committed(lambda _m: (name, PROTO), ProtoMessage(Event(seq=1)))
        pub.flush()
        with caplog.at_level(logging.WARNING):
            client.compact(name, retire_grace=0)
        assert segment_records(client, name) == ([], [])
        warned = " ".join(r.getMessage() for r in caplog.records)
        assert name in warned and PROTOBUF_CLASS_LABEL in warned and "nowhere_at_all" in warned
        with pytest.raises(OptionError, match="nowhere_at_all"):
            read_committed_arrow(client, name)
        table = read_committed_arrow(client, name, parse=True, proto_class=EVENT_CLASS)
        assert table.column("seq").to_pylist() == [1]


def test_a_journal_without_a_class_says_what_to_do(memory_store: StoreTarget) -> None:
    with memory_store.open() as client:
        name = "proto/unnamed"
        new_journal(client, name, None)
        pub = Publisher(client)
        pub.publish_committed(lambda _m: (name, PROTO), ProtoMessage(Event(seq=1)))
        pub.flush()
        client.compact(name, retire_grace=0)
        assert segment_records(client, name) == ([], [])
        with pytest.raises(ValueError, match=PROTOBUF_CLASS_LABEL):
            read_committed_arrow(client, name, parse=True)
        with pytest.raises(OptionError, match=PROTOBUF_CLASS_LABEL):
            read_committed_arrow(client, name)
        assert read_committed_arrow(client, name, proto_class=EVENT_CLASS).num_rows == 1


# -- the property: any protobuf history, compacted and trimmed at random points ---------------

_STEPS = st.one_of(
    st.tuples(st.just("commit"), st.integers(0, 2)),  # a message outside any transaction
    st.tuples(st.just("write"), st.integers(0, 2)),  # one inside the producer's transaction
    st.tuples(st.just("ack"), st.integers(0, 2)),  # its transaction commits
    st.tuples(st.just("rollback"), st.integers(0, 2)),  # or rolls back
    st.tuples(st.just("nil"), st.just(0)),  # a nil-UUID frame: always delivered
    st.tuples(st.just("duplicate"), st.just(0)),  # the journal's last frame again
    st.tuples(st.just("compact"), st.sampled_from([64, 300, 4096])),
)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=st.lists(_STEPS, min_size=1, max_size=40), trim=st.booleans())
def test_columnar_reads_equal_read_committed_on_any_protobuf_history(
    memory_store: StoreTarget, steps: list[tuple[str, int]], trim: bool
) -> None:
    with memory_store.open() as client:
        name = f"proto/h{uuid.uuid4().hex}"
        new_journal(client, name, EVENT_CLASS)
        to = lambda _m: (name, PROTO)  # noqa: E731
        pubs = [Publisher(client) for _ in range(3)]
        for i, (kind, arg) in enumerate(steps):
            if kind == "commit" and not pubs[arg].pending_journals():
                # (A producer with a transaction open cannot commit outside it.)
                pubs[arg].publish_committed(to, ProtoMessage(Event(seq=i, user=f"c{arg}")))
            elif kind == "write":
                pubs[arg].publish_uncommitted(to, ProtoMessage(Event(seq=i, tags=[str(arg)])))
            elif kind == "ack":
                pubs[arg].flush()
                pubs[arg].append_intents(pubs[arg].build_ack_intents())
            elif kind == "rollback":
                pubs[arg].flush()
                pubs[arg].append_intents(pubs[arg].build_rollback_intents())
            elif kind == "nil":
                nil = Event(uuid=str(NIL_UUID), seq=i, blob=b"\x00\xff")
                client.append(name, encode_fixed_frame(nil.SerializeToString()))
            elif kind == "duplicate" and client.head(name):
                with client.read(name, client.fragments(name)[-1].begin) as reader:
                    last = reader.read(1 << 20)
                client.append(name, last)
            for p in pubs:
                p.flush()
            if kind == "compact" and client.head(name):
                client.compact(name, target_length=arg, retire_grace=0)
        if trim and len(client.fragments(name)) > 1:
            frags = client.fragments(name)
            client.trim(name, before=frags[len(frags) // 2].begin)
        parsed = read_committed_arrow(client, name, parse=True)
        assert parsed.equals(from_frames(client, name, parse=True))
        struct = proto_struct(Event)
        assert struct is not None
        fields = ["begin", *(struct.field(i).name for i in range(struct.num_fields))]
        assert parsed.select(fields).to_pylist() == expected_rows(client, name, Event)
        assert read_committed_arrow(client, name).equals(from_frames(client, name))
