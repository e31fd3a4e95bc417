"""Per-block CRC-32C sums of raw fragments, so that a ranged read is verified too.

A fragment's SHA1 (in its name) can only check the whole fragment. A reader resuming in the
middle of a raw fragment (every consumer checkpoint) fetches just the bytes it needs, which
the SHA1 cannot check; so a writer also records, in the claim of a raw fragment, the CRC-32C
of each `BLOCK_SIZE` block of the fragment's content (the last block may be shorter). A
ranged read is widened to whole blocks, every block it touches is checked, and only then
are the asked bytes returned. Claims without sums (older writers) and compressed fragments
are read whole and SHA1-checked instead: no byte is returned unverified.

Invariants: block i covers content bytes [i * size, min((i + 1) * size, length)); a
fragment of `length` bytes has exactly ceil(length / size) sums; sums are kept as 4 bytes
each (big-endian uint32) in memory and as 8 lowercase hex digits each in claim JSON.

Block size, measured (2-core x86 box, `crc32c` 2.9, hardware CRC): summing 64 MiB costs
about 4.4 ms at any block size from 64 KiB to 4 MiB (SHA1 of the same: about 31 ms), so the
size only trades the bytes a ranged read fetches in excess (up to one block before the
asked offset) against the claim's size. At 1 MiB the excess costs one S3 GET's first-byte
latency or less (10-20 ms at S3's 50-100 MB/s per stream) and 0.1 ms from a local page
cache, while a 64 MiB fragment's claim grows by 64 sums = 512 hex digits (128 for a default
16 MiB fragment); claims are read 32 at a time and kept in every reader's index.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import crc32c

from oncelog.journal.errors import FragmentChecksumError
from oncelog.journal.fragment import Fragment

__all__ = [
    "BLOCK_SIZE",
    "BlockSums",
    "block_range",
    "block_sums",
    "verify_content",
    "verify_range",
]

BLOCK_SIZE = 1 << 20
"""Bytes per checksummed block written by this version (readers use the claim's own size)."""

_HEX_RE = re.compile(r"[0-9a-f]*")


@dataclass(frozen=True, slots=True)
class BlockSums:
    """CRC-32C of each `size`-byte block of a fragment's uncompressed content, packed as
    big-endian uint32s in `sums` (4 bytes per block)."""

    size: int
    sums: bytes

    def __len__(self) -> int:
        """Number of blocks."""
        return len(self.sums) // 4

    def sum_of(self, block: int) -> int:
        """The CRC-32C recorded for block number `block`."""
        return int.from_bytes(self.sums[4 * block : 4 * block + 4], "big")

    def to_hex(self) -> str:
        """The sums as recorded in a claim: 8 lowercase hex digits per block."""
        return self.sums.hex()

    @classmethod
    def from_hex(cls, size: object, text: object, length: int) -> BlockSums:
        """Parse sums recorded in a claim for a fragment of `length` content bytes; raises
        ValueError (naming what is wrong) unless `size` is a positive int and `text` holds
        exactly one 8-digit lowercase hex sum per block."""
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"block size must be a positive int, not {size!r}")
        if not isinstance(text, str) or _HEX_RE.fullmatch(text) is None:
            raise ValueError(f"block sums must be lowercase hex digits, not {str(text)[:40]!r}")
        blocks = -(-length // size)
        if len(text) != 8 * blocks:
            raise ValueError(
                f"{length} bytes in blocks of {size} need {blocks} sums ({8 * blocks} hex "
                f"digits), not {len(text)} hex digits"
            )
        return cls(size, bytes.fromhex(text))


def block_sums(data: bytes | bytearray | memoryview, block_size: int | None = None) -> BlockSums:
    """CRC-32C of each block of `data` (a fragment's uncompressed content), by slices of one
    view (no copies); `block_size` defaults to BLOCK_SIZE (read at call time). CRC-32C lets
    go of the GIL for large buffers, so this may run beside other threads' work."""
    size = BLOCK_SIZE if block_size is None else block_size
    view = memoryview(data).cast("B")
    out = bytearray()
    for start in range(0, len(view), size):
        out += crc32c.crc32c(view[start : start + size]).to_bytes(4, "big")
    return BlockSums(size, bytes(out))


def block_range(fragment: Fragment, start: int, end: int, block_size: int) -> tuple[int, int]:
    """The journal offsets [lo, hi) of the whole blocks of `fragment` covering the journal
    offsets [start, end) (which must lie within the fragment)."""
    first = (start - fragment.begin) // block_size
    last = -(-(end - fragment.begin) // block_size)
    return fragment.begin + first * block_size, min(
        fragment.begin + last * block_size, fragment.end
    )


def verify_range(
    journal: str,
    fragment: Fragment,
    start_offset: int,
    data: bytes | bytearray | memoryview,
    sums: BlockSums,
    block_size: int | None = None,
) -> None:
    """Check `data`, the fragment's content from journal offset `start_offset` (a block
    boundary) on, block by block against `sums` (of blocks of `block_size`, default
    `sums.size`); `data` must end at a block boundary or at the fragment's end. Raises
    FragmentChecksumError naming the journal, the fragment and the journal offsets of the
    first bad block."""
    if block_size is None:
        block_size = sums.size
    rel = start_offset - fragment.begin
    if rel < 0 or rel % block_size or start_offset + len(data) > fragment.end:
        raise FragmentChecksumError(
            f"fragment {fragment.content_name} of journal {journal!r}: offsets "
            f"{start_offset}-{start_offset + len(data)} are not whole blocks of "
            f"{block_size} bytes within {fragment.begin}-{fragment.end}"
        )
    end = start_offset + len(data)
    if len(data) % block_size and end != fragment.end:
        raise FragmentChecksumError(
            f"fragment {fragment.content_name} of journal {journal!r}: offsets "
            f"{start_offset}-{end} end inside a block of {block_size} bytes"
        )
    view = memoryview(data).cast("B")
    first = rel // block_size
    for i, pos in enumerate(range(0, len(view), block_size)):
        actual = crc32c.crc32c(view[pos : pos + block_size])
        expected = sums.sum_of(first + i)
        if actual != expected:
            lo = start_offset + pos
            hi = min(lo + block_size, end)
            raise FragmentChecksumError(
                f"fragment {fragment.content_name} of journal {journal!r}: block "
                f"{first + i} (offsets {lo}-{hi}) has CRC-32C {actual:08x}, its claim "
                f"records {expected:08x}; the stored object is corrupt"
            )


def verify_content(
    journal: str, fragment: Fragment, content: bytes | bytearray | memoryview, sums: BlockSums
) -> None:
    """Check a fragment's whole content against its block sums: first that it holds exactly
    the fragment's length (a prefix ending at a block boundary would otherwise pass), then
    every block. Raises FragmentChecksumError naming the journal, the fragment and the
    offsets. About 12-14 GB/s on one core (hardware CRC-32C), against 1.1-2 GB/s for the
    SHA1 of the name, which this stands for on reads."""
    if len(content) != fragment.content_length:
        raise FragmentChecksumError(
            f"fragment {fragment.content_name} of journal {journal!r} should hold offsets "
            f"{fragment.begin}-{fragment.end} ({fragment.content_length} bytes) but holds "
            f"{len(content)} bytes"
        )
    if len(sums) != -(-fragment.content_length // sums.size):
        raise FragmentChecksumError(
            f"fragment {fragment.content_name} of journal {journal!r} (offsets "
            f"{fragment.begin}-{fragment.end}): {len(sums)} block sums recorded for "
            f"{fragment.content_length} bytes in blocks of {sums.size}"
        )
    verify_range(journal, fragment, fragment.begin, content, sums)
