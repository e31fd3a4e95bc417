"""The seal step of appending (`oncelog.journal._seal`): pure, so tested without a store.

A sealed fragment's sums are what readers verify and its name is what the claim names, so
each test checks them against an independent computation (hashlib, crc32c, decompression)
rather than against the module's own helpers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from array import array
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.journal import _blocks
from oncelog.journal import _seal as seal_module
from oncelog.journal._blocks import BlockSums
from oncelog.journal._seal import SealedFragment, seal
from oncelog.journal.fragment import ZERO_SUM, Codec, Fragment, decode, parse_content_name

BLOCK = 4  # a tiny block size, so a few bytes span many blocks


@pytest.fixture
def tiny_blocks(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    monkeypatch.setattr(_blocks, "BLOCK_SIZE", BLOCK)
    yield BLOCK


def _crcs(data: bytes, size: int) -> list[int]:
    """Block CRC-32Cs computed independently of `_blocks`."""
    return [crc32c.crc32c(data[i : i + size]) for i in range(0, len(data), size)]


def test_a_raw_batch_is_named_by_its_sha1_and_summed_per_block(tiny_blocks: int) -> None:
    data = bytearray(b"hello, sealed world")
    sealed = seal("logs/a", data, Codec.NONE, begin=7)
    sha1 = hashlib.sha1(data).hexdigest()
    assert (sealed.journal, sealed.begin, sealed.end, sealed.size) == ("logs/a", 7, 26, 19)
    assert sealed.sum == sha1
    assert sealed.stored is data  # raw: the batch itself, not a copy
    assert sealed.stored_crc32c is None
    assert sealed.blocks is not None and sealed.blocks.size == tiny_blocks
    assert [sealed.blocks.sum_of(i) for i in range(len(sealed.blocks))] == _crcs(
        bytes(data), tiny_blocks
    )
    # Gazette's content name, and the fragment it parses back to.
    assert sealed.name == f"{7:016x}-{26:016x}-{sha1}.raw"
    assert sealed.fragment == Fragment("logs/a", 7, 26, sha1, Codec.NONE)
    assert parse_content_name("logs/a", sealed.name) == sealed.fragment


@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.ZSTANDARD])
def test_a_compressed_batch_stores_its_compression_with_a_crc_of_it(codec: Codec) -> None:
    data = b"compress me " * 100
    sealed = seal("logs/z", data, codec, begin=100)
    assert sealed.sum == hashlib.sha1(data).hexdigest()  # of the content, not the stored bytes
    assert len(sealed.stored) < len(data)
    assert decode(sealed.fragment, bytes(sealed.stored)) == data
    assert sealed.stored_crc32c == crc32c.crc32c(bytes(sealed.stored))
    assert sealed.blocks is None  # compressed fragments are read whole
    assert (sealed.begin, sealed.end) == (100, 100 + len(data))
    assert sealed.name.endswith(codec.extension)


@pytest.mark.parametrize("codec", list(Codec))
def test_sealing_is_deterministic(codec: Codec) -> None:
    """The same content seals to the same sums and stored bytes (gzip without a time), so a
    writer that seals again (another process, a retry) names the very same object."""
    data = b"same bytes, same fragment\n" * 50
    first, second = seal("j", data, codec), seal("j", bytearray(data), codec)
    assert bytes(first.stored) == bytes(second.stored)
    assert (first.sum, first.blocks, first.stored_crc32c, first.name) == (
        second.sum,
        second.blocks,
        second.stored_crc32c,
        second.name,
    )


def test_placing_at_new_offsets_keeps_the_bytes_and_sums_and_renames() -> None:
    data = bytearray(b"moved after a lost race")
    sealed = seal("j", data, Codec.NONE)
    assert (sealed.begin, sealed.end) == (0, len(data))  # sealed before the head is known
    moved = sealed.at(1000)
    assert (moved.begin, moved.end, moved.size) == (1000, 1000 + len(data), len(data))
    assert moved.stored is sealed.stored  # nothing copied
    assert (moved.sum, moved.blocks, moved.stored_crc32c, moved.codec) == (
        sealed.sum,
        sealed.blocks,
        sealed.stored_crc32c,
        sealed.codec,
    )
    assert moved.name == f"{1000:016x}-{1000 + len(data):016x}-{sealed.sum}.raw"
    assert sealed.name != moved.name
    assert (sealed.begin, sealed.end) == (0, len(data))  # the original is unchanged


def test_a_sealed_fragment_is_immutable() -> None:
    sealed = seal("j", b"fixed", Codec.NONE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sealed.begin = 5  # type: ignore[misc]
    assert not hasattr(sealed, "__dict__")  # slots: no attribute can be added either


def test_empty_content_seals_to_gazettes_zero_sum() -> None:
    sealed = seal("j", b"", Codec.NONE, begin=3)
    assert (sealed.begin, sealed.end, sealed.sum) == (3, 3, ZERO_SUM)
    assert sealed.blocks == BlockSums(_blocks.BLOCK_SIZE, b"")
    assert sealed.name == f"{3:016x}-{3:016x}-{ZERO_SUM}.raw"


def test_a_view_of_wide_items_is_measured_in_bytes(tiny_blocks: int) -> None:
    items = array("I", range(10))  # 40 bytes, 10 items
    view = memoryview(items)
    sealed = seal("j", view, Codec.NONE)
    raw = items.tobytes()
    assert (sealed.begin, sealed.end) == (0, len(raw))
    assert sealed.sum == hashlib.sha1(raw).hexdigest()
    assert sealed.blocks is not None and len(sealed.blocks) == len(raw) // tiny_blocks


def test_a_pool_computes_the_block_sums_with_the_same_result(tiny_blocks: int) -> None:
    data = bytearray(range(256)) * 8
    with ThreadPoolExecutor(1) as pool:
        pooled = seal("j", data, Codec.NONE, begin=9, pool=pool)
    assert pooled == seal("j", data, Codec.NONE, begin=9)


class _RecordingPool(ThreadPoolExecutor):
    """A pool that keeps the futures of the work handed to it."""

    def __init__(self) -> None:
        super().__init__(1)
        self.futures: list[Future[Any]] = []

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        future = super().submit(fn, *args, **kwargs)
        self.futures.append(future)
        return future


def test_a_failed_seal_leaves_no_thread_reading_the_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The appender may reuse or free a batch once sealing returned, even by raising: the
    block sums handed to the pool must be finished by then."""
    sha1_failed = threading.Event()
    real_block_sums = _blocks.block_sums

    def slow_block_sums(data: Any, block_size: int | None = None) -> BlockSums:
        # Finishes only after the SHA1 failed: a seal not waiting for it returns first.
        assert sha1_failed.wait(30)
        return real_block_sums(data, block_size)

    def failing_sum(data: Any) -> str:
        sha1_failed.set()
        raise MemoryError("no room for the SHA1")

    monkeypatch.setattr(_blocks, "block_sums", slow_block_sums)
    monkeypatch.setattr(seal_module, "content_sum", failing_sum)
    pool = _RecordingPool()
    try:
        with pytest.raises(MemoryError, match="no room"):
            seal("j", bytearray(b"x" * 64), Codec.NONE, pool=pool)
        assert len(pool.futures) == 1 and pool.futures[0].done()
    finally:
        sha1_failed.set()
        pool.shutdown(wait=True)


@settings(max_examples=60, deadline=None)
@given(
    data=st.binary(max_size=300),
    codec=st.sampled_from(list(Codec)),
    begin=st.integers(0, 1 << 40),
    block=st.integers(1, 64),
)
def test_sealed_fragments_keep_their_invariants(
    data: bytes, codec: Codec, begin: int, block: int
) -> None:
    saved = _blocks.BLOCK_SIZE
    _blocks.BLOCK_SIZE = block
    try:
        sealed = seal("logs/p", bytearray(data), codec, begin=begin)
    finally:
        _blocks.BLOCK_SIZE = saved
    assert sealed.end - sealed.begin == len(data) and sealed.begin == begin
    assert sealed.sum == (hashlib.sha1(data).hexdigest() if data else ZERO_SUM)
    assert decode(sealed.fragment, bytes(sealed.stored)) == data
    assert parse_content_name("logs/p", sealed.name) == sealed.fragment
    if codec is Codec.NONE:
        assert sealed.stored_crc32c is None and sealed.blocks is not None
        assert sealed.blocks.size == block
        assert [sealed.blocks.sum_of(i) for i in range(len(sealed.blocks))] == _crcs(data, block)
    else:
        assert sealed.blocks is None
        assert sealed.stored_crc32c == crc32c.crc32c(bytes(sealed.stored))
    assert isinstance(sealed, SealedFragment)
