"""append_many / start_append_many on every backend: each record one whole append, split
between fragments only at record boundaries, results right per record (also after lost
races), bad records refused before anything is appended, failures reported."""

from __future__ import annotations

import array
import itertools
import random
import threading
import time
from typing import Any

import journal_support
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oncelog.journal import (
    AppendFailed,
    AppendResult,
    AsyncAppendMany,
    JournalClient,
    JournalError,
    JournalNotFound,
)


def new_journal(client: JournalClient, **fragment: Any) -> str:
    return journal_support.new_journal(client, "many", **fragment)


def hold_writes(client: JournalClient) -> threading.Event:
    """Make the client's store hold every object write until the returned event is set."""
    backend = client.store.backend
    gate = threading.Event()
    original = backend.write

    def held(path: str, data: Any) -> None:
        assert gate.wait(30)
        original(path, data)

    backend.write = held  # type: ignore[method-assign]
    return gate


def records_of(sizes: list[int], seed: int, tag: bytes = b"") -> list[bytes]:
    """Distinct records of the given sizes (content recomputable from the seed)."""
    rng = random.Random(seed)
    return [(tag + b"%d|" % i + rng.randbytes(n))[:n] for i, n in enumerate(sizes)]


def check_results(
    content: bytes, records: list[bytes], results: list[AppendResult]
) -> None:
    """Every record is where its result says, whole."""
    assert len(results) == len(records)
    for record, result in zip(records, results):
        assert result.end - result.begin == len(record)
        assert content[result.begin : result.end] == record


def check_call_layout(results: list[AppendResult], fragment_ends: set[int]) -> None:
    """The records of one call are in order, and next to each other except where a fragment
    ends (other writers' appends may land between the fragments of a call)."""
    for a, b in zip(results, results[1:]):
        assert a.end == b.begin or (a.end in fragment_ends and a.end < b.begin)


def spans(client: JournalClient, name: str) -> list[tuple[int, int]]:
    return [(f.begin, f.end) for f in client.fragments(name)]


# -- round trips --------------------------------------------------------------------------------


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    calls=st.lists(st.lists(st.integers(0, 400), max_size=30), min_size=1, max_size=4),
    length=st.integers(1, 2000),
    compression=st.sampled_from(["none", "gzip", "zstd"]),
    seed=st.integers(0, 2**32),
)
def test_records_round_trip_and_split_only_between_records(
    journals: JournalClient,
    calls: list[list[int]],
    length: int,
    compression: str,
    seed: int,
) -> None:
    name = new_journal(journals, length=length, compression=compression)
    handles = []
    all_records: list[bytes] = []
    for k, sizes in enumerate(calls):
        records = records_of(sizes, seed + k, b"%d." % k)
        handles.append((records, journals.start_append_many(name, records)))
        all_records += records
    journals.flush()
    expected = b"".join(all_records)
    fresh = JournalClient(journals.fs, journals.root)  # a cold client sees the same journal
    content = fresh.read(name).read()
    assert content == expected
    boundaries = {0}
    offset = 0
    for records, handle in handles:
        assert handle.done() and len(handle) == len(records)
        results = handle.result()
        check_results(content, records, results)
        for record, result in zip(records, results):  # one writer: calls follow each other
            assert result.begin == offset
            offset += len(record)
        boundaries |= {r.end for r in results}
    frags = spans(fresh, name)
    assert [b for b, _ in frags[1:]] == [e for _, e in frags[:-1]]
    for begin, end in frags:  # fragments start and end only between records
        assert begin in boundaries and end in boundaries
        # A fragment closes once it holds `length` bytes: no record starts beyond that.
        assert all(b - begin < length for b in boundaries if begin < b < end)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=60),
    length=st.integers(1, 1500),
    seed=st.integers(0, 2**32),
)
def test_fragments_are_the_same_as_with_one_append_per_record(
    memory_store: Any, sizes: list[int], length: int, seed: int
) -> None:
    """Rollover is exactly that of start_append: a batch closes once it holds `length` bytes,
    the record that crosses it stays whole, a record larger than `length` is a fragment of
    its own (flush_interval keeps the writer from closing batches early)."""
    client = memory_store.open()
    one_by_one = new_journal(client, length=length, flush_interval=3600)
    batched = new_journal(client, length=length, flush_interval=3600)
    records = records_of(sizes, seed)
    for record in records:
        with client.start_append(one_by_one) as aa:
            aa.write(record)
    handle = client.start_append_many(batched, records)
    client.flush()
    assert spans(client, batched) == spans(client, one_by_one)
    check_results(client.read(batched).read(), records, handle.result())
    client.close()


def test_rollover_of_a_call_matches_single_appends(journals: JournalClient) -> None:
    name = new_journal(journals, length=100, flush_interval=60)
    records = [b"x" * 30] * 10 + [b"y" * 250, b"z" * 1000, b"w" * 10]
    results = journals.append_many(name, records)
    # A fragment closes once it holds `length` bytes; the record that crosses it stays
    # whole ("y" joins the batch at 240 that is below `length`); one larger than `length`
    # and alone in its batch is a fragment of its own ("z").
    assert spans(journals, name) == [(0, 120), (120, 240), (240, 550), (550, 1550), (1550, 1560)]
    assert (results[10].begin, results[10].end) == (300, 550)
    assert (results[11].begin, results[11].end) == (550, 1550)
    check_results(journals.read(name).read(), records, results)


def test_a_record_larger_than_length_is_a_fragment_of_its_own(journals: JournalClient) -> None:
    name = new_journal(journals, length=64, flush_interval=60)
    records = [b"a" * 10, b"B" * 500, b"C" * 700, b"d" * 10]
    results = journals.append_many(name, records)
    check_results(journals.read(name).read(), records, results)
    frags = journals.fragments(name)
    # "a" (10 bytes, below length) takes the big "B" along; "C" starts a fresh batch, which
    # it fills on its own; "d" starts the next.
    assert [(f.begin, f.end) for f in frags] == [(0, 510), (510, 1210), (1210, 1220)]


def test_empty_input_returns_at_once_and_appends_nothing(journals: JournalClient) -> None:
    name = new_journal(journals)
    assert journals.append_many(name, []) == []
    handle = journals.start_append_many(name, iter(()))
    assert len(handle) == 0 and handle.done() and handle.result(timeout=0) == []
    assert journals.head(name) == 0 and journals.fragments(name) == []
    with pytest.raises(JournalNotFound, match="no/such"):
        journals.append_many("no/such", [])


def test_any_bytes_like_record_and_any_iterable(memory_store: Any) -> None:
    client = memory_store.open()
    name = new_journal(client)
    ints = array.array("i", [1, 2, 3])  # len() is 3 items, 12 bytes
    records: list[Any] = [b"ab", bytearray(b"cd"), memoryview(b"efg"), ints, b""]
    results = client.append_many(name, (r for r in records))
    assert [(r.begin, r.end) for r in results] == [(0, 2), (2, 4), (4, 7), (7, 19), (19, 19)]
    assert client.read(name).read() == b"abcdefg" + ints.tobytes()
    assert all(r.journal == name for r in results)


@pytest.mark.parametrize(
    "bad, index, kind",
    [
        ([b"ok", "text", b"ok"], 1, "str"),
        ([b"ok", b"ok", 7], 2, "int"),
        ([None], 0, "NoneType"),
        ([b"ok"] * 1000 + [["nested"]], 1000, "list"),
    ],
)
def test_bad_records_are_refused_before_anything_is_appended(
    journals: JournalClient, bad: list[Any], index: int, kind: str
) -> None:
    name = new_journal(journals, length=1)  # one fragment per record, had they been appended
    journals.append(name, b"before")
    with pytest.raises(TypeError) as info:
        journals.start_append_many(name, bad)
    text = str(info.value)
    assert name in text and f"record {index} " in text and kind in text
    assert "nothing was appended" in text
    journals.flush()
    assert journals.head(name) == 6
    assert JournalClient(journals.fs, journals.root).read(name).read() == b"before"
    assert journals.append(name, b"+after").begin == 6  # the journal still works


@pytest.mark.parametrize("one", [b"bytes", bytearray(b"ba"), memoryview(b"mv"), "str"])
def test_one_record_instead_of_an_iterable_is_refused(memory_store: Any, one: Any) -> None:
    client = memory_store.open()
    name = new_journal(client)
    with pytest.raises(TypeError, match="iterable of records"):
        client.append_many(name, one)
    assert client.head(name) == 0


# -- the asynchronous handle ----------------------------------------------------------------------


def test_handle_waits_for_its_flush_and_flush_waits_for_it(memory_store: Any) -> None:
    client = memory_store.open()
    name = new_journal(client, flush_interval=3600)
    handle = client.start_append_many(name, [b"one\n", b"two\n"])
    assert isinstance(handle, AsyncAppendMany) and len(handle) == 2
    assert not handle.done()  # lingers: flush_interval has not passed
    client.flush()
    assert handle.done()
    assert [(r.begin, r.end) for r in handle.result(timeout=0)] == [(0, 4), (4, 8)]
    later = client.start_append_many(name, [b"three\n"])
    assert later.result(timeout=30) == [AppendResult(8, 14)]  # asks for its own flush
    assert handle.result() is handle.result()  # built once


def test_result_times_out_while_the_write_is_stuck(memory_store: Any) -> None:
    client = memory_store.open()
    name = new_journal(client)
    client.append(name, b"loaded")  # the index is loaded: the next write is the fragment's
    gate = hold_writes(client)
    handle = client.start_append_many(name, [b"a", b"b"])
    with pytest.raises(TimeoutError, match=name):
        handle.result(timeout=0.05)
    assert not handle.done()
    gate.set()
    assert [r.begin for r in handle.result(timeout=30)] == [6, 7]


# -- concurrency and races ----------------------------------------------------------------------


def test_calls_and_single_appends_from_many_threads(journals: JournalClient) -> None:
    """Each record whole and contiguous; the records of a call in order and, within a
    fragment, next to each other."""
    name = new_journal(journals, length=3000)
    found: list[tuple[bytes, AppendResult]] = []
    calls: list[list[AppendResult]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(4)

    def batches(t: int) -> None:
        rng = random.Random(t)
        barrier.wait()
        for k in range(6):
            records = [
                b"<%d.%d.%d:" % (t, k, i) + b"m" * rng.randrange(80) + b">"
                for i in range(rng.randrange(1, 40))
            ]
            results = journals.append_many(name, records)
            with lock:
                found.extend(zip(records, results))
                calls.append(results)

    def singles(t: int) -> None:
        rng = random.Random(t)
        barrier.wait()
        handles = []
        for i in range(60):
            data = b"<%d.s.%d:" % (t, i) + b"s" * rng.randrange(50) + b">"
            aa = journals.start_append(name)
            aa.write(data)
            aa.release()
            handles.append((data, aa))
        with lock:
            found.extend((data, aa.result(timeout=60)) for data, aa in handles)

    threads = [threading.Thread(target=batches, args=(t,)) for t in (0, 1)]
    threads += [threading.Thread(target=singles, args=(t,)) for t in (2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    content = JournalClient(journals.fs, journals.root).read(name).read()
    records = [data for data, _ in found]
    assert len(records) == 2 * 60 + sum(map(len, calls))
    check_results(content, records, [r for _, r in found])
    for results in calls:  # no backlog here: a call holds the write lock throughout
        check_call_layout(results, set())
    ordered = sorted((r.begin, r.end) for _, r in found)  # together they tile the journal
    assert ordered[0][0] == 0 and ordered[-1][1] == len(content)
    assert all(a[1] == b[0] for a, b in zip(ordered, ordered[1:]))


def test_results_follow_fragments_moved_by_a_lost_race(store_url: Any) -> None:
    """Another writer claims offsets between the fragments of one call: each fragment is
    renamed to the new head, and each record's result follows its own fragment."""
    ours, theirs = store_url.open(), store_url.open()
    name = new_journal(ours, length=50, flush_interval=3600)
    ours.append(name, b"ours-first\n")  # our index knows the head: 11
    backend = ours.store.backend
    original = backend.create
    interfered: list[int] = []

    attempts = itertools.count(1)

    def other_writer_first(path: str, data: Any) -> Any:
        # The other writer takes the offset of our 1st and 3rd claim attempts: the first
        # fragment of our call moves once, the second once more; the third follows on.
        if "/claims/" in path.replace("\\", "/") and next(attempts) in (1, 3):
            interfered.append(theirs.append(name, b"theirs-%d\n" % len(interfered)).begin)
        return original(path, data)

    backend.create = other_writer_first  # type: ignore[method-assign]
    records = [b"rec-%02d:" % i + b"r" * 22 + b"\n" for i in range(6)]  # 30 bytes each
    results = ours.append_many(name, records)
    assert interfered == [11, 80] and ours._appender(name).races_lost == 2
    content = store_url.open().read(name).read()
    check_results(content, records, results)
    # Fragments of two records: at 20 (after theirs-0), 89 (after theirs-1), then 149.
    assert [r.begin for r in results] == [20, 50, 89, 119, 149, 179]
    check_call_layout(results, {80})
    ours.close()
    theirs.close()


def test_two_clients_racing_with_calls(store_url: Any) -> None:
    clients = [store_url.open(), store_url.open()]
    name = new_journal(clients[0], length=400)
    barrier = threading.Barrier(2)
    found: list[tuple[bytes, AppendResult]] = []
    lock = threading.Lock()

    def records(c: int, k: int) -> list[bytes]:
        return [b"[%d.%d.%d]" % (c, k, i) + b"." * (i * 7 % 50) for i in range(25)]

    def work(c: int) -> None:
        barrier.wait()
        for k in range(8):
            results = clients[c].append_many(name, records(c, k))
            with lock:
                found.extend(zip(records(c, k), results))

    threads = [threading.Thread(target=work, args=(c,)) for c in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    reader = store_url.open()
    content = reader.read(name).read()
    every = [r for c in (0, 1) for k in range(8) for r in records(c, k)]
    assert sorted(r for r, _ in found) == sorted(every)
    assert len(content) == sum(map(len, every))
    check_results(content, [r for r, _ in found], [r for _, r in found])
    fragment_ends = {f.end for f in reader.fragments(name)}
    for c in (0, 1):
        for k in range(8):
            call = [r for rec, r in found if rec.startswith(b"[%d.%d." % (c, k))]
            check_call_layout(call, fragment_ends)
    for client in clients:
        client.close()


# -- back-pressure and failures -----------------------------------------------------------


def test_a_call_waits_for_the_writer_without_holding_the_write_lock(memory_store: Any) -> None:
    client = memory_store.open()
    name = new_journal(client, length=100)
    appender = client._appender(name)
    gate = hold_writes(client)
    appender._limit = 300  # a tiny backlog allowance, so the test stays small
    appender._update_room_locked()
    records = [b"%03d" % i + b"x" * 47 for i in range(40)]  # 2000 bytes: 20 fragments
    outcome: list[Any] = []
    call = threading.Thread(target=lambda: outcome.append(client.append_many(name, records)))
    call.start()
    deadline = time.monotonic() + 30
    while appender._sealed_bytes < appender._limit and time.monotonic() < deadline:
        time.sleep(0.005)
    assert appender._sealed_bytes >= appender._limit  # the call is held back by the backlog
    assert appender._write_lock.acquire(timeout=10)  # ...and lets the lock go meanwhile
    appender._write_lock.release()
    assert call.is_alive()
    gate.set()
    call.join(60)
    (results,) = outcome
    check_results(client.read(name).read(), records, results)
    assert max(e - b for b, e in spans(client, name)) <= 100


def test_a_failed_fragment_fails_the_call(store_url: Any) -> None:
    client = store_url.open(retry_timeout=0.2)
    name = new_journal(client, length=20, flush_interval=3600)
    client.append(name, b"kept")
    backend = client.store.backend
    original = backend.create
    claims = []

    def second_claim_fails(path: str, data: Any) -> Any:
        if "/claims/" in path.replace("\\", "/"):
            claims.append(path)
            if len(claims) >= 2:
                raise OSError("storage unavailable")
        return original(path, data)

    backend.create = second_claim_fails  # type: ignore[method-assign]
    handle = client.start_append_many(name, [b"a" * 15, b"b" * 15, b"c" * 15, b"d" * 15])
    with pytest.raises(AppendFailed, match=name):
        handle.result(timeout=60)
    assert handle.done() and len(claims) >= 2
    # The call's first fragment (a, b) made it; its second (c, d) failed, and nothing else.
    del backend.create
    assert store_url.open().read(name).read() == b"kept" + b"a" * 15 + b"b" * 15
    assert client.append(name, b"e").begin == 34  # storage is back: appends work again
    client.close()


def test_closed_client_refuses_calls(memory_store: Any) -> None:
    client = memory_store.open()
    name = new_journal(client)
    client.close()
    with pytest.raises(JournalError, match="closed"):
        client.append_many(name, [b"x"])
