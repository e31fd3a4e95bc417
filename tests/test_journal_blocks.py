"""Per-block CRC-32C sums: every byte a reader returns is verified, also when it enters a raw
fragment in the middle (a consumer resuming at its checkpoint), on every backend.

Most tests shrink the block size (`oncelog.journal._blocks.BLOCK_SIZE`, read by writers at
append time and recorded in each claim) so that small fragments span many blocks.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any
from unittest import mock

import crc32c
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from journal_support import new_journal, spy_local_block_reads

from oncelog.framing import CONTENT_TYPE_JSON_LINES
from oncelog.journal import (
    Fragment,
    FragmentChecksumError,
    FragmentSpec,
    JournalClient,
    JournalSpec,
    _blocks,
)
from oncelog.journal._blocks import BlockSums, block_range, block_sums, verify_range
from oncelog.journal.store import Claim, CorruptClaim
from oncelog.message import JSONMessage
from oncelog.publisher import Publisher
from oncelog.reading import read_committed


@pytest.fixture
def small_blocks() -> Iterator[int]:
    """Writers record sums of 64-byte blocks while the test runs."""
    with mock.patch.object(_blocks, "BLOCK_SIZE", 64):
        yield 64


def fragment_of(client: JournalClient, name: str, offset: int) -> Fragment:
    """The fragment holding `offset` of journal `name`."""
    (fragment,) = [f for f in client.fragments(name) if f.begin <= offset < f.end]
    return fragment


def corrupt(client: JournalClient, kind: str, fragment: Fragment, at: int) -> None:
    """Flip bits of the byte at journal offset `at` inside the stored (raw) fragment object:
    in place on local disk, by overwriting the object elsewhere (as bit rot or a bad copy
    would leave it)."""
    path = client.store.fragment_path(fragment)
    pos = at - fragment.begin
    if kind == "local":
        with open(path, "r+b") as f:
            f.seek(pos)
            old = f.read(1)
            f.seek(pos)
            f.write(bytes([old[0] ^ 0x55]))
    else:
        data = bytearray(client.store.backend.read(path))
        data[pos] ^= 0x55
        client.store.fs.pipe_file(path, bytes(data))


def rewrite_claim_without_sums(client: JournalClient, name: str, begin: int) -> None:
    """Make the claim at `begin` look as written by a version without block sums."""
    path = client.store.claim_path(name, begin)
    doc = orjson.loads(client.store.backend.read(path))
    assert "block_crc32c" in doc and "block_size" in doc
    del doc["block_crc32c"], doc["block_size"]
    client.store.fs.pipe_file(path, orjson.dumps(doc))


def spy_reads(client: JournalClient) -> list[tuple[Any, ...]]:
    """Record the fragment reads of `client`: ("range", start, end) and ("whole", name)."""
    backend: Any = client.store.backend
    calls: list[tuple[Any, ...]] = []
    orig_range, orig_read = backend.read_range, backend.read

    def read_range(path: str, start: int, end: int) -> bytes:
        calls.append(("range", start, end))
        return orig_range(path, start, end)

    def read(path: str, size_hint: int | None = None) -> bytes:
        if path.endswith(".raw"):
            calls.append(("whole", path.rsplit("/", 1)[-1]))
        return orig_read(path, size_hint)

    backend.read_range, backend.read = read_range, read
    spy_local_block_reads(client, calls)
    return calls


# -- the block sums and their claim encoding ----------------------------------------------------


def test_block_sums_are_crc32c_of_each_block_and_round_trip_through_hex() -> None:
    data = bytes(range(256)) * 3 + b"tail"
    sums = block_sums(data, 100)
    assert sums.size == 100 and len(sums) == 8
    assert [sums.sum_of(i) for i in range(8)] == [
        crc32c.crc32c(data[i : i + 100]) for i in range(0, len(data), 100)
    ]
    assert BlockSums.from_hex(100, sums.to_hex(), len(data)) == sums
    assert block_sums(b"", 100) == BlockSums(100, b"")
    assert block_sums(memoryview(data)[:200], 100) == block_sums(data[:200], 100)
    assert block_sums(data).size == _blocks.BLOCK_SIZE == 1 << 20


def test_block_range_widens_to_whole_blocks_within_the_fragment() -> None:
    f = Fragment("j", 1000, 1250, "ab" * 20)
    assert block_range(f, 1000, 1250, 100) == (1000, 1250)
    assert block_range(f, 1099, 1101, 100) == (1000, 1200)
    assert block_range(f, 1100, 1200, 100) == (1100, 1200)
    assert block_range(f, 1201, 1250, 100) == (1200, 1250)


def test_verify_range_names_journal_fragment_and_offsets_of_the_bad_block() -> None:
    data = bytes(range(250))
    f = Fragment("logs/x", 1000, 1250, "ab" * 20)
    sums = block_sums(data, 100)
    verify_range("logs/x", f, 1100, data[100:], sums, 100)
    verify_range("logs/x", f, 1000, data[:100], sums)
    bad = bytearray(data)
    bad[210] ^= 1
    with pytest.raises(FragmentChecksumError) as info:
        verify_range("logs/x", f, 1100, bad[100:], sums, 100)
    message = str(info.value)
    assert "'logs/x'" in message and f.content_name in message
    assert "offsets 1200-1250" in message
    with pytest.raises(FragmentChecksumError, match="not whole blocks"):
        verify_range("logs/x", f, 1150, data[150:], sums, 100)
    with pytest.raises(FragmentChecksumError, match="inside a block"):
        verify_range("logs/x", f, 1000, data[:150], sums, 100)


def test_claims_round_trip_their_sums_and_claims_without_sums_stay_readable() -> None:
    name = f"{0:016x}-{250:016x}-{'ab' * 20}.raw"
    sums = block_sums(bytes(250), 100)
    claim = Claim(0, name, "w1", "inc", sums)
    doc = orjson.loads(claim.to_bytes())
    assert doc["block_size"] == 100 and doc["block_crc32c"] == sums.to_hex()
    assert len(doc["block_crc32c"]) == 3 * 8
    assert Claim.from_bytes("j", 0, claim.to_bytes()) == claim
    old = Claim.from_bytes("j", 0, orjson.dumps({"fragment": name, "writer": "w1"}))
    assert old == Claim(0, name, "w1") and old.blocks is None
    assert b"block" not in Claim(0, name, "w1").to_bytes()


@pytest.mark.parametrize(
    "extra",
    [
        {"block_size": 100, "block_crc32c": "00" * 8},  # 2 sums for 3 blocks
        {"block_size": 100, "block_crc32c": "00" * 16},  # 4 sums for 3 blocks
        {"block_size": 100, "block_crc32c": "zz" * 12},  # not hex
        {"block_size": 100, "block_crc32c": "AB" * 12},  # not lowercase
        {"block_size": 100, "block_crc32c": 7},
        {"block_size": 0, "block_crc32c": ""},
        {"block_size": "100", "block_crc32c": "00" * 12},
        {"block_size": True, "block_crc32c": "00" * 12},
        {"block_crc32c": "00" * 12},  # no block size
        {"block_size": 100},  # no sums
    ],
)
def test_claims_with_malformed_sums_are_corrupt(extra: dict[str, Any]) -> None:
    name = f"{0:016x}-{250:016x}-{'ab' * 20}.raw"
    data = orjson.dumps({"fragment": name, "writer": "w", **extra})
    with pytest.raises(CorruptClaim, match="offset 0 of journal 'logs/x'.*block sums"):
        Claim.from_bytes("logs/x", 0, data)


def test_claims_with_sums_for_an_unparseable_fragment_name_are_corrupt() -> None:
    data = orjson.dumps({"fragment": "junk", "writer": "w", "block_size": 1, "block_crc32c": ""})
    with pytest.raises(CorruptClaim, match="junk"):
        Claim.from_bytes("j", 0, data)


# -- writers record sums -----------------------------------------------------------------------


def test_raw_fragments_get_sums_and_compressed_ones_none(store_url: Any, small_blocks: int) -> None:
    client = store_url.open()
    try:
        raw = new_journal(client)
        gz = new_journal(client, compression="gzip")
        data = bytes(range(200))
        client.append(raw, data)
        client.append(gz, data)
        fresh = store_url.open()
        try:
            (claim,) = [fresh.store.read_claim(raw, 0)]
            assert claim is not None and claim.blocks == block_sums(data, small_blocks)
            gz_claim = fresh.store.read_claim(gz, 0)
            assert gz_claim is not None and gz_claim.blocks is None
            assert fresh.read(gz, offset=150).read() == data[150:]  # read whole, SHA1'd
        finally:
            fresh.close()
    finally:
        client.close()


def test_sums_are_computed_once_per_batch_not_per_claim_attempt(
    store_url: Any, small_blocks: int
) -> None:
    a, b = store_url.open(), store_url.open()
    try:
        name = new_journal(a)
        a.append(name, b"first")
        b.append(name, b"second")  # a's index is stale: its next claim loses a race
        calls: list[int] = []
        real = _blocks.block_sums

        def counting(data: Any, block_size: int | None = None) -> BlockSums:
            calls.append(len(data))
            return real(data, block_size)

        import oncelog.journal._persister as persister_module

        # Wherever the persister takes block_sums from (this module or its own namespace).
        with (
            mock.patch.object(_blocks, "block_sums", counting),
            mock.patch.object(persister_module, "block_sums", counting, create=True),
        ):
            a.append(name, b"third")
        assert a._appender(name).races_lost == 1
        assert calls == [5]
        fresh = store_url.open()
        try:
            assert fresh.read(name, offset=7).read() == b"condthird"
            assert fresh.store.read_claim(name, 11).blocks == real(b"third", small_blocks)
        finally:
            fresh.close()
    finally:
        a.close()
        b.close()


# -- ranged reads are verified and return exactly the asked bytes --------------------------------


def _offsets(sizes: list[int], block: int, every: bool) -> list[int]:
    total = sum(sizes)
    if every:
        return list(range(total + 1))
    points = {0, total}
    begin = 0
    for size in sizes:
        for rel in range(0, size + 1, block):
            points.update({begin + rel - 1, begin + rel, begin + rel + 1})
        points.update({begin + 1, begin + size - 1})
        begin += size
    return sorted(p for p in points if 0 <= p <= total)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    sizes=st.lists(st.integers(1, 300), min_size=1, max_size=5),
    block=st.sampled_from([1, 7, 16, 64, 1 << 20]),
    seed=st.binary(min_size=1, max_size=16),
)
def test_reads_from_any_offset_return_exactly_the_journal_bytes(
    store_url: Any, sizes: list[int], block: int, seed: bytes
) -> None:
    writer = store_url.open()
    try:
        name = new_journal(writer)
        parts = [(seed * (size // len(seed) + 1))[:size] for size in sizes]
        parts = [bytes((b + i) % 256 for b in p) for i, p in enumerate(parts)]
        with mock.patch.object(_blocks, "BLOCK_SIZE", block):
            for part in parts:
                writer.append(name, part)
        whole = b"".join(parts)
        reader = store_url.open()
        try:
            assert [f.content_length for f in reader.fragments(name)] == sizes
            offsets = _offsets(sizes, block, every=store_url.kind != "s3")
            if store_url.kind == "s3":  # a GET each: a sample of the boundaries +- 1
                offsets = offsets[:: max(1, len(offsets) // 6)]
            for offset in offsets:
                with reader.read(name, offset=offset) as r:
                    assert r.read() == whole[offset:], offset
                with reader.read(name, offset=offset) as r:  # small reads across fragments
                    got = b"".join(iter(lambda: r.read(5), b""))
                    assert got == whole[offset:], offset
        finally:
            reader.close()
    finally:
        writer.close()


def test_a_mid_fragment_read_fetches_only_the_blocks_it_touches(
    store_url: Any, small_blocks: int
) -> None:
    client = store_url.open()
    try:
        name = new_journal(client)
        data = bytes(range(256)) * 4
        client.append(name, data)
        fresh = store_url.open()
        try:
            calls = spy_reads(fresh)
            assert fresh.read(name, offset=700).read() == data[700:]
            assert calls == [("range", 640, len(data))]  # from block 10 (640-704) on
            del calls[:]
            assert fresh.read(name, offset=704).read() == data[704:]
            assert calls == [("range", 704, len(data))]
        finally:
            fresh.close()
    finally:
        client.close()


# -- corruption is detected --------------------------------------------------------------------


def test_corruption_in_a_touched_block_is_reported_and_intact_blocks_still_read(
    store_url: Any, small_blocks: int
) -> None:
    client = store_url.open()
    try:
        name = new_journal(client)
        head = b"h" * 100
        data = bytes(range(250)) * 4  # fragment [100, 1100)
        client.append(name, head)
        client.append(name, data)
        fragment = fragment_of(client, name, 500)
        assert fragment.begin == 100
        corrupt(client, store_url.kind, fragment, 500)  # block 6: offsets 484-548
        reader = store_url.open()
        try:
            for offset in (484, 500, 547, 300, 101):
                with pytest.raises(FragmentChecksumError) as info:
                    reader.read(name, offset=offset).read()
                message = str(info.value)
                assert repr(name) in message and fragment.content_name in message, message
                assert "offsets 484-548" in message, message
            assert reader.read(name, offset=548).read() == data[448:]
            assert reader.read(name, offset=1000).read() == data[900:]
            assert reader.read(name, offset=50).read(50) == head[50:]
            # Read from its first byte, the fragment is checked against the same sums.
            with pytest.raises(FragmentChecksumError, match="CRC-32C") as info:
                reader.read(name, offset=100).read()
            assert fragment.content_name in str(info.value)
            assert "offsets 484-548" in str(info.value)
            with pytest.raises(FragmentChecksumError):
                reader.read(name).read()  # whole journal: the fragment is read whole
        finally:
            reader.close()
    finally:
        client.close()


def test_claims_without_sums_fall_back_to_the_whole_fragment_sha1(
    store_url: Any, small_blocks: int
) -> None:
    client = store_url.open()
    try:
        name = new_journal(client)
        data = bytes(range(250)) * 4
        client.append(name, b"h" * 100)
        client.append(name, data)
        fragment = fragment_of(client, name, 500)
        rewrite_claim_without_sums(client, name, fragment.begin)
        reader = store_url.open()
        try:
            calls = spy_reads(reader)
            assert reader.read(name, offset=900).read() == data[800:]
            assert calls == [("whole", fragment.content_name)]  # no unverified ranged read
            assert reader.store.read_claim(name, fragment.begin).blocks is None
        finally:
            reader.close()
        corrupt(client, store_url.kind, fragment, 500)
        reader = store_url.open()
        try:
            for offset in (900, 500, 101):  # even far from the corrupt byte
                with pytest.raises(FragmentChecksumError, match="SHA1") as info:
                    reader.read(name, offset=offset).read()
                assert repr(name) in str(info.value)
                assert fragment.content_name in str(info.value)
        finally:
            reader.close()
    finally:
        client.close()


def test_gazette_stores_read_mid_fragment_through_the_sha1(local_store: Any) -> None:
    """A store without specs (a Gazette broker's) has no claims: a mid-fragment read takes
    the whole fragment and checks its SHA1."""
    import hashlib
    import os

    data = b"gazette fragment bytes\n" * 10
    sum_ = hashlib.sha1(data).hexdigest()
    directory = os.path.join(local_store.url, "gz", "j")
    os.makedirs(directory)
    path = os.path.join(directory, f"{0:016x}-{len(data):016x}-{sum_}.raw")
    with open(path, "wb") as f:
        f.write(data[:40] + b"X" + data[41:])
    client = local_store.open()
    try:
        with pytest.raises(FragmentChecksumError, match="SHA1"):
            client.read("gz/j", offset=100).read()
    finally:
        client.close()


# -- end to end: a consumer resuming mid-fragment never gets a wrong value ----------------------


@pytest.mark.parametrize("old_claims", [False, True], ids=["sums", "old-claims"])
def test_read_committed_from_mid_fragment_raises_on_a_garbled_digit(
    store_url: Any, old_claims: bool
) -> None:
    journal = "e2e/blocks"
    labels = {"content-type": CONTENT_TYPE_JSON_LINES}
    client = store_url.open()
    try:
        client.create(JournalSpec(journal, labels=labels, fragment=FragmentSpec()))
        pub = Publisher(client)

        def route(_msg: Any) -> tuple[str, str]:
            return journal, CONTENT_TYPE_JSON_LINES

        # Two appends (each one append, so one fragment each however slow the machine).
        pub.publish_many(route, [JSONMessage({"n": n}) for n in range(1000, 1010)])
        pub.flush()
        pub.publish_many(route, [JSONMessage({"n": n}) for n in range(1010, 1030)])
        pub.flush()
        envs = list(read_committed(client, journal))
        assert [e.message.doc["n"] for e in envs] == list(range(1000, 1030))
        target = next(e for e in envs if e.message.doc["n"] == 1016)
        fragment = fragment_of(client, journal, target.begin)
        assert fragment.begin > 0
        resume = next(e for e in envs if e.message.doc["n"] == 1012).begin
        assert fragment.begin < resume < target.begin
        if old_claims:
            rewrite_claim_without_sums(client, journal, fragment.begin)
        stored = client.store.backend.read(client.store.fragment_path(fragment))
        rel = target.begin - fragment.begin
        line = stored[rel : target.end - fragment.begin]
        digit = rel + re.search(rb'"n":1016', line).start() + len(b'"n":')  # type: ignore[union-attr]
        garbled = stored[:digit] + b"9" + stored[digit + 1 :]
        client.store.fs.pipe_file(client.store.fragment_path(fragment), garbled)
        consumer = store_url.open()
        try:
            with pytest.raises(FragmentChecksumError) as info:
                values = [e.message.doc["n"] for e in read_committed(consumer, journal, resume)]
                pytest.fail(f"read_committed returned {values} from a corrupt fragment")
            assert repr(journal) in str(info.value)
            assert fragment.content_name in str(info.value)
        finally:
            consumer.close()
    finally:
        client.close()


# -- local disk: pieces read into reused buffers ------------------------------------------------


def test_local_reads_by_pieces_return_the_right_bytes_across_reused_buffers(
    local_store: Any, small_blocks: int
) -> None:
    """On local disk pieces of whole blocks are read into two buffers used in turn: reads
    of any size, spanning many pieces and fragments, get exactly the journal's bytes, and a
    fragment deleted while a reader is inside it (retirement, trim) is still read whole."""
    from oncelog.journal.backends import local as local_module

    client = local_store.open()
    try:
        name = new_journal(client)
        parts = [bytes([i]) * 7 + bytes(range(i, 256)) * (i + 1) for i in range(0, 250, 50)]
        for part in parts:
            client.append(name, part)
        data = b"".join(parts)
        with mock.patch.object(local_module, "READ_PIECE", 3 * small_blocks):
            fresh = local_store.open()
            try:
                calls: list[tuple[Any, ...]] = []
                spy_local_block_reads(fresh, calls)
                for size in (1, 5, 64, 100, 191, 192, 193, 1000, len(data), -1):
                    with fresh.read(name) as reader:
                        got = bytearray()
                        while chunk := reader.read(size):
                            got += chunk
                        assert bytes(got) == data, size
                assert calls and all(e - s <= 3 * small_blocks for _, s, e in calls)
                with fresh.read(name, offset=10) as reader:
                    head = reader.read(20)
                    first = fragment_of(fresh, name, 0)
                    os.unlink(fresh.store.fragment_path(first))
                    assert head + reader.read(-1) == data[10:]
            finally:
                fresh.close()
    finally:
        client.close()


def test_a_local_fragment_whose_file_has_the_wrong_size_is_refused(
    local_store: Any,
) -> None:
    """A raw fragment file longer or shorter than its name says is reported (journal,
    fragment, offsets) before any of its bytes are returned."""
    client = local_store.open()
    try:
        name = new_journal(client)
        client.append(name, b"x" * 100)
        fragment = fragment_of(client, name, 0)
        path = client.store.fragment_path(fragment)
        for content in (b"x" * 99, b"x" * 101):
            with open(path, "wb") as f:
                f.write(content)
            fresh = local_store.open()
            try:
                with pytest.raises(FragmentChecksumError, match=r"offsets 0-100.*holds"):
                    fresh.read(name).read()
            finally:
                fresh.close()
    finally:
        client.close()
