"""JournalClient on every backend (memory://, local disk, moto S3): management, appends,
reads, gc, metadata objects, and the faults it must report rather than hide."""

from __future__ import annotations

import pickle
import random
import threading
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from journal_support import new_journal, spy_local_block_reads
from test_journal_blocks import rewrite_claim_without_sums

from oncelog.journal import (
    AppendFailed,
    AppendNotSupported,
    Codec,
    Fragment,
    FragmentChecksumError,
    FragmentSpec,
    InvalidObjectPath,
    JournalClient,
    JournalError,
    JournalExists,
    JournalNotFound,
    JournalOwner,
    JournalSpec,
    MissingFragment,
    OffsetNotAvailable,
    UnknownCodec,
)
from oncelog.journal.store import Claim


def payload(rng: random.Random, tag: int, size: int) -> bytes:
    head = b"%d:" % tag
    return (head + rng.randbytes(max(0, size - len(head))))[:size] if size else b""


# -- management ------------------------------------------------------------------------------


def test_create_get_list_delete(journals: JournalClient) -> None:
    owner = JournalOwner("producer", "host-1:8080", "pageview writer")
    web = JournalSpec("logs/web/part-000", {"app": "web", "content-type": "text/csv"}, owner=owner)
    api = JournalSpec("logs/api/part-000", {"app": "api"})
    other = JournalSpec("metrics/x", {"tier": "gold"})
    for spec in (web, api, other):
        assert journals.create(spec) == spec
    assert journals.get("logs/web/part-000") == web
    assert journals.get("logs/web/part-000").owner == owner
    with pytest.raises(JournalExists, match="logs/web/part-000"):
        journals.create(JournalSpec("logs/web/part-000"))

    def names(selector: str) -> list[str]:
        return [s.name for s in journals.list(selector)]

    assert names("") == ["logs/api/part-000", "logs/web/part-000", "metrics/x"]
    assert names("app=web") == ["logs/web/part-000"]
    assert names("app") == ["logs/api/part-000", "logs/web/part-000"]
    assert names("!app") == ["metrics/x"]
    assert names("name:prefix=logs/") == ["logs/api/part-000", "logs/web/part-000"]
    assert names("prefix=metrics/") == ["metrics/x"]
    assert names("name=metrics/x") == ["metrics/x"]

    journals.append("logs/web/part-000", b"a,b\n")
    journals.delete("logs/web/part-000")
    with pytest.raises(JournalNotFound, match="logs/web/part-000"):
        journals.get("logs/web/part-000")
    with pytest.raises(JournalNotFound):
        journals.delete("logs/web/part-000")
    with pytest.raises(JournalNotFound):
        journals.read("logs/web/part-000")
    assert names("") == ["logs/api/part-000", "metrics/x"]

    journals.create(JournalSpec("logs/web/part-000"))  # the name can be used again, empty
    assert journals.head("logs/web/part-000") == 0
    assert journals.read("logs/web/part-000").read() == b""


def test_delete_spares_parent_and_child_journals(journals: JournalClient) -> None:
    for name in ("a", "a/b", "a/bc"):
        journals.create(JournalSpec(name))
        journals.append(name, name.encode() * 3)
    journals.delete("a")
    fresh = JournalClient(journals.fs, journals.root)
    assert fresh.read("a/b").read() == b"a/ba/ba/b"
    assert fresh.read("a/bc").read() == b"a/bca/bca/bc"
    with pytest.raises(JournalNotFound):
        fresh.head("a")


def test_missing_journal_errors(journals: JournalClient) -> None:
    for op in (
        lambda: journals.get("no/such"),
        lambda: journals.read("no/such"),
        lambda: journals.head("no/such"),
        lambda: journals.fragments("no/such"),
        lambda: journals.append("no/such", b"x"),
        lambda: journals.start_append("no/such"),
        lambda: journals.delete("no/such"),
        lambda: journals.gc("no/such"),
    ):
        with pytest.raises(JournalNotFound, match="no/such"):
            op()


# -- appends and reads ------------------------------------------------------------------------


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    sizes=st.lists(st.integers(0, 700), min_size=1, max_size=25),
    compression=st.sampled_from(["none", "gzip", "zstd"]),
    length=st.sampled_from([64, 300, 1 << 20]),
    sync_every=st.integers(1, 6),
    seed=st.integers(0, 2**32),
)
def test_round_trip_of_random_appends(
    journals: JournalClient,
    sizes: list[int],
    compression: str,
    length: int,
    sync_every: int,
    seed: int,
) -> None:
    rng = random.Random(seed)
    name = new_journal(journals, length=length, compression=compression)
    datas = [payload(rng, i, n) for i, n in enumerate(sizes)]
    results = []
    pending = []
    for i, data in enumerate(datas):
        if i % sync_every == 0:
            results.append(journals.append(name, data))
        else:
            aa = journals.start_append(name)
            aa.write(data[: len(data) // 2])
            aa.write(data[len(data) // 2 :])
            aa.release()
            pending.append((len(results), aa))
            results.append(None)
    journals.flush()
    for i, aa in pending:
        assert aa.done()
        results[i] = aa.result()
    expected = b"".join(datas)
    offset = 0
    for data, result in zip(datas, results):
        assert (result.begin, result.end) == (offset, offset + len(data))
        offset += len(data)
    assert journals.head(name) == len(expected)

    fresh = JournalClient(journals.fs, journals.root)  # a cold client sees the same journal
    assert fresh.read(name).read() == expected
    frags = fresh.fragments(name)
    assert [f.begin for f in frags] == [0, *(f.end for f in frags[:-1])][: len(frags)]
    assert (frags[-1].end if frags else 0) == len(expected)
    assert all(f.codec is Codec.from_compression(compression) for f in frags)
    boundaries = {0, len(expected)} | {r.end for r in results}
    for f in frags:  # fragments split only between appends, and roll over at `length`
        assert f.begin in boundaries and f.end in boundaries
    for cut in sorted({rng.randrange(len(expected) + 1) for _ in range(3)}):
        reader = fresh.read(name, offset=cut)
        assert reader.offset == cut
        assert reader.read() == expected[cut:]
        assert reader.offset == len(expected)


def test_fragments_roll_over_at_length_and_appends_are_never_split(journals: JournalClient) -> None:
    name = new_journal(journals, length=100, flush_interval=60)
    for _ in range(10):
        aa = journals.start_append(name)
        aa.write(b"x" * 30)
        aa.release()
    journals.append(name, b"y" * 250)  # crosses `length`: kept whole, closes the fragment
    journals.append(name, b"z" * 1000)  # larger than `length`: one fragment of its own
    journals.flush()
    spans = [(f.begin, f.end) for f in journals.fragments(name)]
    # A fragment closes once it holds `length` bytes; the append that crossed it stays whole.
    assert spans == [(0, 120), (120, 240), (240, 550), (550, 1550)]


def test_group_commit_puts_many_appends_in_one_fragment(journals: JournalClient) -> None:
    name = new_journal(journals, flush_interval=60)
    handles = []
    for i in range(200):
        aa = journals.start_append(name)
        aa.write(b"%05d\n" % i)
        aa.release()
        handles.append(aa)
    assert not handles[0].done()  # lingering: flush_interval has not passed
    journals.flush()
    assert [(f.begin, f.end) for f in journals.fragments(name)] == [(0, 1200)]
    assert [h.result().begin for h in handles] == list(range(0, 1200, 6))


def test_result_asks_for_the_flush_it_waits_for(journals: JournalClient) -> None:
    name = new_journal(journals, flush_interval=3600)
    aa = journals.start_append(name)
    aa.write(b"now")
    aa.release()
    assert aa.result(timeout=30).end == 3


def test_flush_interval_writes_without_being_asked(journals: JournalClient) -> None:
    name = new_journal(journals, flush_interval=0.05)
    aa = journals.start_append(name)
    aa.write(b"later")
    aa.release()
    deadline = time.monotonic() + 30
    while not aa.done() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert aa.done()
    assert JournalClient(journals.fs, journals.root).read(name).read() == b"later"


def test_concurrent_threads_append_contiguously(journals: JournalClient) -> None:
    name = new_journal(journals, length=2000)
    results: dict[bytes, tuple[int, int]] = {}
    lock = threading.Lock()

    def work(t: int) -> None:
        rng = random.Random(t)
        handles = []
        for i in range(40):
            data = b"<%d.%d:" % (t, i) + b"z" * rng.randrange(60) + b">"
            aa = journals.start_append(name)
            aa.write(data)
            aa.release()
            handles.append((data, aa))
        for data, aa in handles:
            r = aa.result(timeout=60)
            with lock:
                results[data] = (r.begin, r.end)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    content = journals.read(name).read()
    spans = sorted(results.values())
    assert len(spans) == 240
    assert spans[0][0] == 0 and spans[-1][1] == len(content)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    for data, (begin, end) in results.items():
        assert content[begin:end] == data
    assert len(journals.fragments(name)) < 240  # group commit shared fragments


def test_aborted_append_leaves_no_trace(journals: JournalClient) -> None:
    name = new_journal(journals)
    journals.append(name, b"one")
    with pytest.raises(RuntimeError):
        with journals.start_append(name) as aa:
            aa.write(b"partial frame")
            raise RuntimeError("encoding failed")
    with pytest.raises(AppendFailed, match="aborted"):
        aa.result()
    with journals.start_append(name) as ok:
        ok.write(b"two")
    assert ok.result().begin == 3
    assert journals.read(name).read() == b"onetwo"


def test_misuse_of_async_append_is_reported(journals: JournalClient) -> None:
    name = new_journal(journals)
    aa = journals.start_append(name)
    with pytest.raises(JournalError, match="before release"):
        aa.result()
    aa.write(b"x")
    aa.release()
    with pytest.raises(JournalError, match="released"):
        aa.write(b"y")
    with pytest.raises(JournalError, match="released twice"):
        aa.release()
    assert aa.result().end == 1


def test_identical_appends_from_two_clients_are_both_kept(store_url: Any) -> None:
    a, b = store_url.open(), store_url.open()
    name = new_journal(a)
    barrier = threading.Barrier(2)

    def work(client: JournalClient) -> None:
        barrier.wait()
        for _ in range(15):
            client.append(name, b"same\n")

    threads = [threading.Thread(target=work, args=(c,)) for c in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store_url.open().read(name).read() == b"same\n" * 30
    a.close()
    b.close()


def test_reader_offsets_and_chunking(journals: JournalClient) -> None:
    name = new_journal(journals, length=10)
    parts = [bytes([65 + i]) * 10 for i in range(8)]
    for p in parts:
        journals.append(name, p)
    whole = b"".join(parts)
    with journals.read(name) as r:
        assert r.read(25) == whole[:25]  # spans three fragments in one call
        assert r.offset == 25
        buf = bytearray(20)
        assert r.readinto(buf) == 20 and bytes(buf) == whole[25:45]
        assert r.read() == whole[45:]
        assert r.read() == b""
    assert journals.read(name, offset=-1).read() == b""
    tail = journals.read(name, offset=-1)
    journals.append(name, b"new")
    assert tail.read() == b"new"
    assert journals.read(name, offset=len(whole) + 3).read() == b""  # exactly at the head
    for past in (len(whole) + 4, len(whole) + 50):
        expected = rf"offset {past} of journal .* head {len(whole) + 3}"
        with pytest.raises(OffsetNotAvailable, match=expected):
            journals.read(name, offset=past)
        with pytest.raises(OffsetNotAvailable):
            journals.read(name, offset=past, block=True)  # nothing to wait for there
    with pytest.raises(JournalError, match="offset"):
        journals.read(name, offset=-2)


def test_reads_inside_raw_fragments_fetch_only_the_blocks_needed(journals: JournalClient) -> None:
    """A read entering a raw fragment in the middle fetches the checksummed blocks holding
    the bytes asked (here the one block of a small fragment), never the whole fragment."""
    name = new_journal(journals)
    data = bytes(range(256)) * 40
    journals.append(name, data)
    backend = journals.store.backend
    calls: list[tuple] = []
    orig_range, orig_read = backend.read_range, backend.read

    def read_range(path, start, end):  # type: ignore[no-untyped-def]
        calls.append(("range", start, end))
        return orig_range(path, start, end)

    def read(path, size_hint=None):  # type: ignore[no-untyped-def]
        calls.append(("whole", path.rsplit("/", 1)[-1]))
        return orig_read(path, size_hint)

    backend.read_range, backend.read = read_range, read  # type: ignore[method-assign]
    fresh = JournalClient(journals.fs, journals.root)
    fresh_backend: Any = fresh.store.backend
    fresh_backend.read_range, fresh_backend.read = read_range, read
    spy_local_block_reads(fresh, calls)
    assert fresh.read(name, offset=10000).read() == data[10000:]
    fragment_reads = [c for c in calls if c[0] == "range" or c[1].endswith(".raw")]
    assert fragment_reads == [("range", 0, len(data))]


def test_blocking_reader_tails_appends_of_other_clients_and_stops_on_close(store_url: Any) -> None:
    writer = store_url.open()
    name = new_journal(writer)
    writer.append(name, b"old")
    reader_client = store_url.open(poll_interval=(0.005, 0.05))
    got = bytearray()
    arrived = threading.Event()
    finished = threading.Event()
    reader = reader_client.read(name, offset=-1, block=True)

    def tail() -> None:
        while True:
            chunk = reader.read(1 << 20)
            if not chunk:
                break
            got.extend(chunk)
            if len(got) >= 6:
                arrived.set()
        finished.set()

    thread = threading.Thread(target=tail, daemon=True)
    thread.start()
    writer.append(name, b"new")
    writer.append(name, b"est")
    assert arrived.wait(30)
    assert bytes(got) == b"newest"
    reader.close()
    assert finished.wait(10)
    thread.join(10)
    assert not thread.is_alive()
    assert reader.closed and reader.read() == b"" and reader.readinto(bytearray(4)) == 0
    writer.close()
    reader_client.close()


def test_blocking_reader_wakes_on_a_local_append(journals: JournalClient) -> None:
    name = new_journal(journals)
    reader = journals.read(name, block=True)
    result: list[bytes] = []
    thread = threading.Thread(target=lambda: result.append(reader.read(10)), daemon=True)
    thread.start()
    journals.append(name, b"hello")
    thread.join(30)
    assert result == [b"hello"]
    reader.close()


# -- gc and metadata objects --------------------------------------------------------------------


def test_gc_removes_only_old_unclaimed_fragments(journals: JournalClient) -> None:
    name = new_journal(journals)
    journals.append(name, b"kept")
    orphan = Fragment(name, 4, 9, "ab" * 20)  # e.g. a writer that died before claiming
    journals.store.write_fragment(orphan, b"lost!")
    assert journals.gc(name) == []  # younger than the default grace
    removed = journals.gc(name, grace=0)
    assert [f.content_name for f in removed] == [orphan.content_name]
    assert [f.content_name for f in journals.store.list_fragments(name)] == [
        f.content_name for f in journals.fragments(name)
    ]
    assert journals.read(name).read() == b"kept"
    journals.append(name, b"+more")
    assert journals.read(name).read() == b"kept+more"
    with pytest.raises(ValueError):
        journals.gc(name, grace=-1)


def test_metadata_objects_are_created_only_if_absent(journals: JournalClient) -> None:
    path = "checkpoints/group-a/%016x.json" % 1
    assert journals.meta.read(path) is None
    assert journals.meta.put_if_absent(path, b'{"n": 1}') is True
    assert journals.meta.put_if_absent(path, b'{"n": "zombie"}') is False
    assert journals.meta.read(path) == b'{"n": 1}'
    journals.meta.put_if_absent("checkpoints/group-a/%016x.json" % 2, b"{}")
    journals.meta.put_if_absent("checkpoints/group-a/%016x.json" % 3, b"{}")
    assert journals.meta.list("checkpoints/group-a") == [
        "%016x.json" % i for i in (1, 2, 3)
    ]
    assert journals.meta.list("checkpoints/group-a/", after="%016x.json" % 1) == [
        "%016x.json" % i for i in (2, 3)
    ]
    journals.meta.delete(path)
    assert journals.meta.read(path) is None
    assert journals.meta.list("checkpoints/none") == []
    for bad in ("../escape", "/abs", "claims/t/x", "journals/x/spec.json", "a//b"):
        with pytest.raises(InvalidObjectPath):
            journals.meta.put_if_absent(bad, b"x")


def test_concurrent_put_if_absent_has_one_winner(store_url: Any) -> None:
    clients = [store_url.open() for _ in range(4)]
    barrier = threading.Barrier(4)
    wins: list[bool] = []

    def work(i: int) -> None:
        barrier.wait()
        wins.append(clients[i].meta.put_if_absent("checkpoints/g/0001.json", b"%d" % i))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == [False, False, False, True]
    stored = clients[0].meta.read("checkpoints/g/0001.json")
    assert stored is not None and int(stored) in range(4)
    for c in clients:
        c.close()


def test_client_pickles_to_an_equivalent_client(journals: JournalClient) -> None:
    name = new_journal(journals)
    journals.append(name, b"pickled")
    clone = pickle.loads(pickle.dumps(journals))
    assert clone.read(name).read() == b"pickled"
    assert clone.append(name, b"!").begin == 7


# -- faults ---------------------------------------------------------------------------------------


def _only_fragment(client: JournalClient, name: str) -> Fragment:
    (fragment,) = client.fragments(name)
    return fragment


@pytest.mark.parametrize("compression", ["none", "gzip", "zstd"])
def test_corrupt_fragment_bytes_raise_a_checksum_error(
    journals: JournalClient, compression: str
) -> None:
    name = new_journal(journals, compression=compression)
    journals.append(name, b"precious data " * 20)
    fragment = _only_fragment(journals, name)
    if compression == "none":
        corrupt = b"precious dat! " + b"precious data " * 19
    else:
        from oncelog.journal.fragment import encode

        corrupt = bytes(encode(fragment.codec, b"tampered data " * 20))
    journals.store.backend.write(journals.store.fragment_path(fragment), corrupt)
    with pytest.raises(FragmentChecksumError) as info:
        JournalClient(journals.fs, journals.root).read(name).read()
    text = str(info.value)
    assert name in text and fragment.content_name in text and "0-280" in text


def test_missing_fragment_behind_a_claim(journals: JournalClient) -> None:
    name = new_journal(journals)
    journals.append(name, b"gone")
    fragment = _only_fragment(journals, name)
    journals.store.delete_fragments([fragment])
    with pytest.raises(MissingFragment) as info:
        JournalClient(journals.fs, journals.root).read(name).read()
    assert name in str(info.value) and "0-4" in str(info.value)


def test_unknown_codec_in_a_claim(journals: JournalClient) -> None:
    name = new_journal(journals)
    claim = Claim(0, f"{0:016x}-{5:016x}-{'cd' * 20}.sz", "foreign")
    assert journals.store.create_claim(name, claim)
    with pytest.raises(UnknownCodec, match=r"\.sz"):
        JournalClient(journals.fs, journals.root).read(name).read()


def test_corrupt_claim_is_reported(journals: JournalClient) -> None:
    from oncelog.journal import CorruptClaim

    name = new_journal(journals)
    journals.store.backend.create(journals.store.claim_path(name, 0), b"garbage")
    with pytest.raises(CorruptClaim, match="offset 0"):
        JournalClient(journals.fs, journals.root).head(name)


def test_removed_claims_are_reported_not_skipped(journals: JournalClient) -> None:
    name = new_journal(journals, length=1)
    for p in (b"aa", b"bb", b"cc"):
        journals.append(name, p)
    journals.store.delete_claims(name, [2])
    fresh = JournalClient(journals.fs, journals.root)
    with pytest.raises(MissingFragment, match="offsets 2-4"):
        fresh.read(name).read()
    journals.store.delete_claims(name, [0])  # retention removed the start: offset 0 jumps
    r = JournalClient(journals.fs, journals.root).read(name, offset=4)
    assert r.read() == b"cc"


def test_transient_storage_errors_are_retried(journals: JournalClient) -> None:
    name = new_journal(journals)
    backend = journals.store.backend
    original = backend.create
    failures = iter([ConnectionError("reset"), TimeoutError("slow")])

    def flaky(path, data):  # type: ignore[no-untyped-def]
        err = next(failures, None)
        if err is not None:
            raise err
        return original(path, data)

    backend.create = flaky  # type: ignore[method-assign]
    result = journals.append(name, b"survives")
    assert (result.begin, result.end) == (0, 8)
    assert next(failures, None) is None  # both failures happened and were retried
    assert journals.read(name).read() == b"survives"


def test_a_claim_whose_reply_was_lost_is_not_appended_twice(journals: JournalClient) -> None:
    name = new_journal(journals)
    backend = journals.store.backend
    original = backend.create
    lost_replies = [1]

    def lossy(path, data):  # type: ignore[no-untyped-def]
        created = original(path, data)
        if lost_replies and "/claims/" in path.replace("\\", "/"):
            lost_replies.pop()
            raise TimeoutError("the claim was stored but the reply was lost")
        return created

    backend.create = lossy  # type: ignore[method-assign]
    result = journals.append(name, b"exactly once")
    assert (result.begin, result.end) == (0, 12)
    assert journals.read(name).read() == b"exactly once"
    assert journals.append(name, b"!").begin == 12


def test_persistent_failure_fails_the_append_and_those_behind_it(store_url: Any) -> None:
    client = store_url.open(retry_timeout=0.2)
    name = new_journal(client, length=1, flush_interval=60)  # one fragment per append
    backend = client.store.backend

    def broken(path, data):  # type: ignore[no-untyped-def]
        raise OSError("storage unavailable")

    backend.create = broken  # type: ignore[method-assign]
    handles = []
    for data in (b"a", b"b", b"c"):
        aa = client.start_append(name)
        aa.write(data)
        aa.release()
        handles.append(aa)
    with pytest.raises(AppendFailed, match="outcome is unknown"):
        client.flush()
    for aa in handles:
        assert aa.done()
        with pytest.raises(AppendFailed, match=name):
            aa.result()
    with pytest.raises(AppendFailed):
        client.append(name, b"d")
    del backend.create  # storage is back: appends work again, nothing failed was written
    assert client.append(name, b"e").begin == 0
    assert client.read(name).read() == b"e"


def test_stores_without_create_if_absent_refuse_appends(memory_store: Any) -> None:
    import fsspec
    from fsspec.implementations.dirfs import DirFileSystem

    root = memory_store.url.removeprefix("memory://")
    fsspec.filesystem("memory").mkdir(root)
    client = JournalClient(DirFileSystem(path=root, fs=fsspec.filesystem("memory")), "")
    assert client.can_append is False
    with pytest.raises(AppendNotSupported, match="only-if-absent"):
        client.create(JournalSpec("x"))
    with pytest.raises(AppendNotSupported):
        client.meta.put_if_absent("checkpoints/g/1", b"x")


def test_local_delete_leaves_no_empty_directories(local_store: Any) -> None:
    import os

    client = local_store.open()
    client.create(JournalSpec("deep/tree/j"))
    client.create(JournalSpec("deep/keep"))
    client.append("deep/tree/j", b"x")
    client.append("deep/keep", b"y")
    other = local_store.open()
    other.meta.put_if_absent("checkpoints/g/1", b"{}")  # caches the directories it made
    client.delete("deep/tree/j")
    left = sorted(os.path.relpath(d, local_store.url) for d, _, _ in os.walk(local_store.url))
    assert not any("tree" in d for d in left)
    assert "deep" in left  # still holds deep/keep
    # Directories removed under a client that made them are made again when needed.
    import shutil

    shutil.rmtree(os.path.join(local_store.url, ".oncelog", "checkpoints"))
    assert other.meta.put_if_absent("checkpoints/g/2", b"{}") is True
    client.create(JournalSpec("deep/tree/j"))
    assert local_store.open().append("deep/tree/j", b"again").begin == 0


def test_reader_works_under_a_buffered_reader(journals: JournalClient) -> None:
    import io

    name = new_journal(journals, length=16)
    lines = [b"line %d\n" % i for i in range(40)]
    for line in lines:
        journals.append(name, line)
    buffered = io.BufferedReader(journals.read(name), buffer_size=1 << 20)
    assert [buffered.readline() for _ in range(40)] == lines
    assert buffered.readline() == b""


def test_file_urls_and_plain_paths_open_the_same_store(local_store: Any) -> None:
    import os

    from oncelog.journal import open_journals

    plain = open_journals(local_store.url)
    plain.create(JournalSpec("same"))
    plain.append("same", b"bytes")
    url = open_journals("file://" + os.path.abspath(local_store.url))
    assert url.root == plain.root
    assert url.read("same").read() == b"bytes"
    assert repr(url) == f"JournalClient({plain.root!r})"  # the store by its path


def test_a_cold_reader_verifies_the_next_fragments_while_reading_the_first(
    local_store: Any,
) -> None:
    """Read-ahead starts before the first fragment is fetched, so fragments are SHA1-verified
    on several cores at once rather than one after the other (claims without block sums, as
    older versions wrote them: raw fragments with sums are read by blocks in the reading
    thread on local disk)."""
    writer = local_store.open()
    writer.create(JournalSpec("ahead"))
    parts = [bytes([65 + i]) * 1000 for i in range(3)]
    for part in parts:
        writer.append("ahead", part)
    for fragment in writer.fragments("ahead"):
        rewrite_claim_without_sums(writer, "ahead", fragment.begin)
    reader = local_store.open()
    store = reader.store
    original = store.read_fragment
    second_started = threading.Event()
    overlapped: list[bool] = []

    def spy(fragment: Any, *rest: Any) -> bytes:
        if fragment.begin == 1000:
            second_started.set()
        elif fragment.begin == 0:
            overlapped.append(second_started.wait(30))
        return original(fragment, *rest)

    store.read_fragment = spy  # type: ignore[method-assign]
    with reader.read("ahead") as r:
        assert r.read() == b"".join(parts)
    assert overlapped == [True]


def test_a_forked_child_reads_and_appends_with_its_own_threads(local_store: Any) -> None:
    """Threads are not inherited across fork: a child using its parent's client starts its
    own read-ahead pool and writer threads, and never writes bytes the parent spooled."""
    import multiprocessing

    client = local_store.open()
    client.create(JournalSpec("fork/read", fragment=FragmentSpec(length=1)))
    parts = [bytes([65 + i]) * 100 for i in range(12)]
    for part in parts:
        client.append("fork/read", part)  # one fragment each: read-ahead runs on the pool
    assert client.read("fork/read").read() == b"".join(parts)
    assert client._executor is not None  # the parent's pool, with idle threads
    client.create(JournalSpec("fork/append", fragment=FragmentSpec(flush_interval=3600)))
    pending = client.start_append("fork/append")
    pending.write(b"parent\n")
    pending.release()  # spooled in the parent, not yet written
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_use_client_in_child, args=(client, b"".join(parts)))
    child.start()
    child.join(60)
    if child.is_alive():
        child.kill()
        child.join()
    assert child.exitcode == 0
    client.flush()
    assert pending.result().end - pending.result().begin == 7
    content = local_store.open().read("fork/append").read()
    assert sorted(content.splitlines(keepends=True)) == [b"child\n", b"parent\n"]
    client.close()


def _use_client_in_child(client: JournalClient, expected: bytes) -> None:
    assert client._executor is None and client._appenders == {}
    assert client.read("fork/read").read() == expected
    assert client.append("fork/append", b"child\n").end == 6
    client.close()
