"""Publisher.publish_many: bulk stamping and framing, C and pure Python side by side.

The frames are byte for byte those of per-message publishing at the same clocks; each
journal's part of a call is one append (one fragment), so a SIGKILL at any storage write
leaves all of it or none of it; in a transaction an exception rolls back everything.
"""

from __future__ import annotations

import random
import signal
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from speedups_support import BULK_BUILT, BULK_MODES, BULK_PURE_REQUESTED, bulk_mode

from oncelog import _bulkframing
from oncelog.framing import CONTENT_TYPE_JSON_LINES, EncodeError
from oncelog.framing.jsonlines import JSONFraming
from oncelog.journal import FragmentSpec, JournalClient, JournalSpec, open_journals
from oncelog.message import (
    FLAGS_MASK,
    Clock,
    CSVRecord,
    Flags,
    JSONMessage,
    build_uuid,
    new_producer_id,
    uuid_text,
)
from oncelog.publisher import Publisher, TransactionError
from oncelog.reading import read_committed, read_uncommitted
from oncelog.testing.faults import kill_after_writes, start_function

JSON = {"content-type": CONTENT_TYPE_JSON_LINES}
BUILT, PURE_REQUESTED, MODES = BULK_BUILT, BULK_PURE_REQUESTED, BULK_MODES
MASK64 = (1 << 64) - 1


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """Publishing takes the C path ("c") or pure Python ("pure") within the test."""
    with bulk_mode(request.param):
        yield request.param


def to(journal: str) -> Any:
    return lambda _msg: (journal, CONTENT_TYPE_JSON_LINES)


def one_by_one(docs: list[dict[str, Any]], key: str, producer: bytes, first: int,
               flags: int) -> bytes:
    """The reference: JSONMessage.set_uuid + JSONFraming.marshal, message by message."""
    framing = JSONFraming()
    out = []
    for i, doc in enumerate(docs):
        msg = JSONMessage(dict(doc), key)
        msg.set_uuid(build_uuid(producer, (first + i) & MASK64, flags))
        out.append(framing.marshal(msg))
    return b"".join(out)


# -- the framing itself ----------------------------------------------------------------------

json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12),
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8,
)
KEYS = st.sampled_from(["uuid", "id", 'q"uo\\te', "ünï", "\n", ""])


@settings(max_examples=300, deadline=None)
@given(
    docs=st.lists(st.dictionaries(st.text(max_size=8) | KEYS, json_value, max_size=5),
                  max_size=12),
    key=KEYS,
    clock=st.integers(0, MASK64) | st.sampled_from([0, MASK64, MASK64 - 3]),
    flags=st.integers(0, FLAGS_MASK),
)
def test_c_and_pure_frames_are_identical_and_equal_one_by_one(
    docs: list[dict[str, Any]], key: str, clock: int, flags: int
) -> None:
    producer = new_producer_id()
    expected = one_by_one(docs, key, producer, clock, flags)
    snapshot = orjson.dumps(docs)
    pure = _bulkframing.frame_json_pure(docs, key, producer, clock, flags)
    assert pure == expected
    if not PURE_REQUESTED:
        assert BUILT is not None
        native = BUILT.frame_json(docs, key, orjson.dumps(key), producer, clock, flags,
                                  orjson.dumps)
        assert native == expected
    assert orjson.dumps(docs) == snapshot  # the documents are not modified


def test_uuid_text_is_the_uuid_string() -> None:
    rng = random.Random(5)
    for _ in range(2000):
        producer = new_producer_id()
        clock, flags = rng.getrandbits(64), rng.randrange(FLAGS_MASK + 1)
        want = str(build_uuid(producer, clock, flags))
        assert uuid_text(producer, clock, flags) == want
        if BUILT is not None:
            assert BUILT.format_uuid(producer, clock, flags) == want
    with pytest.raises(ValueError, match="flags"):
        uuid_text(producer, 1, FLAGS_MASK + 1)
    with pytest.raises(ValueError, match="6 bytes"):
        uuid_text(b"abc", 1, 0)


def test_bad_input_raises_encode_error_on_both_paths(mode: str) -> None:
    producer = new_producer_id()
    with pytest.raises(EncodeError, match="document 1 of the batch is a list"):
        _bulkframing.frame_json([{}, [1]], "uuid", producer, 1, 0)
    with pytest.raises(EncodeError, match="cannot encode"):
        _bulkframing.frame_json([{"a": {1, 2}}], "uuid", producer, 1, 0)
    # A raw newline can only come from an orjson.Fragment: the C cutter declines, and the
    # pure path names the error.
    with pytest.raises(EncodeError, match="raw newline"):
        _bulkframing.frame_json([{"a": orjson.Fragment(b'"x\ny"')}], "uuid", producer, 1, 0)
    # Fragments that unbalance the encoding: the C cutter declines (None), the caller
    # takes the pure path; the bytes are the same either way.
    for raw in (b"{", b"}", b'"', b"{]", b"]", b"[1,"):
        docs = [{"a": orjson.Fragment(raw)}, {"b": 1}]
        pure = _bulkframing.frame_json_pure(docs, "uuid", producer, 1, 0)
        assert _bulkframing.frame_json(docs, "uuid", producer, 1, 0) == pure


def test_clock_reserve_gives_consecutive_clocks() -> None:
    clock = Clock(10)
    assert clock.reserve(5) == 11 and clock.value == 15
    assert clock.tick() == 16
    with pytest.raises(ValueError):
        clock.reserve(0)


# -- publishing ------------------------------------------------------------------------------


@pytest.fixture
def client(local_store: Any) -> Iterator[JournalClient]:
    c = local_store.open()
    for name in ("out/a", "out/b", "out/c"):
        c.create(JournalSpec(name, labels=JSON))
    yield c
    c.close()


def docs_of(client: JournalClient, journal: str) -> list[dict[str, Any]]:
    return [env.message.doc for env in read_committed(client, journal)]


def sample_docs(n: int, seed: int = 1) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    docs: list[dict[str, Any]] = [
        {"user": rng.randrange(10**6), "page": f"/p/{rng.randrange(50)}\"é",
         "ts": rng.random(), "n": i}
        for i in range(n)
    ]
    docs[3] = {}
    docs[5] = {"uuid": "stale", "n": 5}  # stamped in place, as set_uuid would
    return docs


@pytest.mark.parametrize("committed", [True, False])
def test_bulk_publish_equals_per_message_publishing(
    client: JournalClient, mode: str, committed: bool
) -> None:
    docs = sample_docs(500)
    bulk = Publisher(client, clock=Clock(1 << 61))
    single = Publisher(client, clock=Clock(1 << 61))
    single.producer_id = bulk.producer_id
    if committed:
        bulk.publish_many(to("out/a"), [dict(d) for d in docs])
        for d in docs:
            single.publish_committed(to("out/b"), JSONMessage(dict(d)))
    else:
        with bulk.transaction():
            bulk.publish_many(to("out/a"), [JSONMessage(dict(d)) for d in docs])
        with single.transaction():
            for d in docs:
                single.publish_uncommitted(to("out/b"), JSONMessage(dict(d)))
    client.flush()
    assert client.read("out/a").read() == client.read("out/b").read()
    got = docs_of(client, "out/a")
    assert got == docs_of(client, "out/b")
    assert [{k: v for k, v in d.items() if k != "uuid"} for d in got] == [
        {k: v for k, v in d.items() if k != "uuid"} for d in docs
    ]
    envs = [e for e in read_uncommitted(client, "out/a") if e.flags is not Flags.ACK_TXN]
    clocks = [e.clock for e in envs]
    assert clocks == list(range(clocks[0], clocks[0] + len(docs)))
    want = Flags.OUTSIDE_TXN if committed else Flags.CONTINUE_TXN
    assert {e.flags for e in envs} == {want} and {e.producer for e in envs} == {bulk.producer_id}


def test_documents_are_not_modified_and_other_framings_work(client: JournalClient) -> None:
    client.create(JournalSpec("out/csv", labels={"content-type": "text/csv"}))
    pub = Publisher(client)
    docs = [{"n": i} for i in range(3)]
    pub.publish_many(to("out/a"), docs)
    assert docs == [{"n": 0}, {"n": 1}, {"n": 2}]
    records = [CSVRecord(["", str(i)]) for i in range(3)]
    (append,) = pub.publish_many(lambda _m: ("out/csv", "text/csv"), records)
    assert append.result().begin == 0
    assert [e.message.fields[1] for e in read_committed(client, "out/csv")] == ["0", "1", "2"]
    with pytest.raises(TypeError, match="message 0 is a dict"):
        pub.publish_many(lambda _m: ("out/csv", "text/csv"), [{"n": 1}])
    assert pub.publish_many(to("out/a"), []) == []


def test_a_mapping_may_return_a_list(client: JournalClient) -> None:
    pub = Publisher(client)
    route = lambda d: ["out/a" if d["n"] % 2 else "out/b", CONTENT_TYPE_JSON_LINES]  # noqa: E731
    appends = pub.publish_many(route, [{"n": i} for i in range(6)])
    assert [a.journal for a in appends] == ["out/b", "out/a"]
    pub.flush()
    assert [d["n"] for d in docs_of(client, "out/a")] == [1, 3, 5]


def test_one_append_per_journal_never_split_across_fragments(client: JournalClient) -> None:
    client.create(JournalSpec("out/small", labels=JSON, fragment=FragmentSpec(length=1024)))
    pub = Publisher(client)
    docs = [{"n": i, "to": "out/small" if i % 3 else "out/c"} for i in range(3000)]
    appends = pub.publish_many(lambda d: (d["to"], CONTENT_TYPE_JSON_LINES), docs)
    assert [a.journal for a in appends] == ["out/c", "out/small"]
    for append in appends:
        result = append.result()
        assert result.begin == 0 and result.end == client.head(append.journal)
        assert len(client.fragments(append.journal)) == 1
    assert [d["n"] for d in docs_of(client, "out/small")] == [i for i in range(3000) if i % 3]
    assert [d["n"] for d in docs_of(client, "out/c")] == list(range(0, 3000, 3))


def test_inside_a_transaction_an_exception_rolls_back_all(
    client: JournalClient, mode: str
) -> None:
    pub = Publisher(client)
    pub.publish_many(to("out/a"), [{"n": -1}])
    route = lambda d: ("out/a" if d["n"] % 2 else "out/b", CONTENT_TYPE_JSON_LINES)  # noqa: E731
    with pytest.raises(RuntimeError, match="boom"):
        with pub.transaction():
            appends = pub.publish_many(route, [{"n": i} for i in range(100)])
            assert len(appends) == 2
            pub.publish_many(to("out/c"), [{"n": 1000}])
            raise RuntimeError("boom")
    assert [d["n"] for d in docs_of(client, "out/a")] == [-1]
    assert docs_of(client, "out/b") == [] and docs_of(client, "out/c") == []
    with pub.transaction():
        pub.publish_many(route, [{"n": i} for i in range(4)])
    assert [d["n"] for d in docs_of(client, "out/a")] == [-1, 1, 3]
    assert [d["n"] for d in docs_of(client, "out/b")] == [0, 2]


def test_committed_default_follows_the_transaction(client: JournalClient) -> None:
    pub = Publisher(client)
    with pub.transaction():
        pub.publish_many(to("out/a"), [{"n": 1}])
        assert pub.pending_journals() == ["out/a"]
        with pytest.raises(TransactionError, match="uncommitted messages"):
            pub.publish_many(to("out/a"), [{"n": 2}], committed=True)
        (append,) = pub.publish_many(to("out/b"), [{"n": 3}], committed=True)  # outside it
        append.result()
        assert docs_of(client, "out/b")[0]["n"] == 3
        assert docs_of(client, "out/a") == []
    assert [d["n"] for d in docs_of(client, "out/a")] == [1]
    assert {e.flags for e in read_uncommitted(client, "out/b")} == {Flags.OUTSIDE_TXN}


def test_bad_batches_publish_nothing(client: JournalClient) -> None:
    pub = Publisher(client)
    with pytest.raises(EncodeError):
        pub.publish_many(to("out/a"), [{"n": 1}, "not a dict"])
    with pytest.raises(KeyError):
        pub.publish_many(lambda d: (d["to"], CONTENT_TYPE_JSON_LINES), [{"to": "out/a"}, {}])
    pub.publish_many(to("out/a"), [{"n": 2}])
    pub.flush()
    assert [d["n"] for d in docs_of(client, "out/a")] == [2]


def test_transactional_id_publisher_rolls_back_leftovers(client: JournalClient) -> None:
    first = Publisher(client, transactional_id="svc")
    first.publish_many(to("out/a"), [{"n": i} for i in range(5)], committed=False)
    client.flush()
    Publisher(client, transactional_id="svc")  # takes over: rolls the leftovers back
    assert docs_of(client, "out/a") == []
    with pytest.raises(TransactionError):
        with first.transaction():
            first.publish_many(to("out/a"), [{"n": 9}])


# -- SIGKILL at every storage write of a call ------------------------------------------------

BATCH = {"out/a": 4000, "out/b": 2500}


def publish_child(root: str, kill_at: int, in_txn: bool) -> None:
    """Publish one batch to two journals, SIGKILLed right after storage write `kill_at`."""
    client = open_journals(root)
    writes = kill_after_writes(client, kill_at)
    pub = Publisher(client)
    docs = [{"n": i, "to": j} for j, count in BATCH.items() for i in range(count)]
    route = lambda d: (d["to"], CONTENT_TYPE_JSON_LINES)  # noqa: E731
    if in_txn:
        with pub.transaction():
            pub.publish_many(route, docs)
    else:
        pub.publish_many(route, docs)
        pub.flush()
    client.close()
    print(f"writes {writes()}", flush=True)


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.parametrize("in_txn", [False, True], ids=["committed", "transaction"])
def test_sigkill_mid_call_leaves_nothing_partial(tmp_path: Any, in_txn: bool) -> None:
    def fresh(n: int) -> str:
        root = str(tmp_path / f"store-{n}")
        with open_journals(root) as c:
            for name in BATCH:
                c.create(JournalSpec(name, labels=JSON))
        return root

    with start_function(publish_child, (fresh(0), 0, in_txn)) as child:
        total = int(child.expect("writes").split()[1])
        assert child.wait(60) == 0
    assert total >= 4
    seen = set()
    for kill_at in range(1, total + 1):
        root = fresh(kill_at)
        with start_function(publish_child, (root, kill_at, in_txn)) as child:
            code = child.wait(60)
        assert code in (0, -signal.SIGKILL), child.stderr_text()
        with open_journals(root) as c:
            counts = tuple(sum(1 for _ in read_committed(c, j)) for j in BATCH)
            for journal, count in zip(BATCH, counts):
                assert count in (0, BATCH[journal]), (kill_at, journal, count)
                docs = [e.message.doc["n"] for e in read_committed(c, journal)]
                assert docs == list(range(count))
        seen.add(counts)
    assert (0, 0) in seen and tuple(BATCH.values()) in seen
