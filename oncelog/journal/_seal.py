"""Sealing a batch: the bytes a writer stores and the sums that name and check them.

The first half of persisting an appender's batch (as Gazette's spool.go seals a fragment
before its persister.go stores it): `seal` turns the batch's content into a
`SealedFragment`, which holds

- the SHA1 of the content, which names the fragment (Gazette's content sum);
- the bytes to store: the content itself for raw fragments, its compression otherwise;
- what the claim records so that reads are verified: the CRC-32C of each block of a raw
  fragment's content (`_blocks`: ranged reads entering it in the middle), or the CRC-32C of
  a compressed fragment's stored object (checked before it is decompressed);
- the offsets [begin, end) it is placed at, hence its content name.

Sealing is pure: no I/O, no clock, no randomness; the same content and codec always seal to
the same sums and bytes (gzip is written with mtime 0). The sums do not depend on the
offsets, only the name does: `SealedFragment.at` places the same bytes at other offsets
(after a lost race) without summing them again. Storing and claiming a sealed fragment are
`oncelog.journal._persister` and `oncelog.journal._claim`.

Invariants of a SealedFragment: `end - begin == content length`; `sum` is the SHA1 of the
content (all zeros when empty); `blocks` is not None exactly when `codec` is Codec.NONE,
and then `stored` is the content and `stored_crc32c` is None; otherwise `stored` decodes to
the content and `stored_crc32c` is the CRC-32C of `stored`.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import Executor
from dataclasses import dataclass

import crc32c

import oncelog.journal._blocks as _blocks
from oncelog.journal._blocks import BlockSums
from oncelog.journal.fragment import Codec, Fragment, content_sum, encode

__all__ = ["SealedFragment", "seal"]


@dataclass(frozen=True, slots=True)
class SealedFragment:
    """A batch's content sealed for storage as the fragment [begin, end) of `journal`.

    `stored` is the caller's buffer for raw fragments (sealing copies nothing): it must not
    change while the sealed fragment is in use (an appender never writes a sealed batch).
    """

    journal: str
    begin: int
    end: int
    sum: str
    """Hex SHA1 of the uncompressed content: the fragment's name and whole-content check."""
    codec: Codec
    stored: bytes | bytearray | memoryview
    """The bytes to store: the content (raw) or its compression."""
    blocks: BlockSums | None
    """CRC-32C of each block of a raw fragment's content; None for compressed ones."""
    stored_crc32c: int | None
    """CRC-32C of a compressed fragment's stored bytes; None for raw ones."""

    @property
    def size(self) -> int:
        """The number of journal bytes (content) it holds."""
        return self.end - self.begin

    @property
    def fragment(self) -> Fragment:
        """The fragment it is stored as, at its offsets."""
        return Fragment(self.journal, self.begin, self.end, self.sum, self.codec)

    @property
    def name(self) -> str:
        """Its content name at its offsets: `<begin:016x>-<end:016x>-<sha1>.<ext>`."""
        return self.fragment.content_name

    def at(self, begin: int) -> SealedFragment:
        """The same bytes and sums placed at [begin, begin + size) (nothing is summed again)."""
        return dataclasses.replace(self, begin=begin, end=begin + self.size)


def seal(
    journal: str,
    data: bytes | bytearray | memoryview,
    codec: Codec,
    begin: int = 0,
    pool: Executor | None = None,
) -> SealedFragment:
    """Seal `data` (a batch's content) as a fragment of `journal` at [begin, begin + len).

    Writers seal before they know where the batch goes (the head may move meanwhile), so
    `begin` defaults to 0 and `SealedFragment.at` places the result. `pool`: for a raw
    fragment, the block sums are computed there while the SHA1 is computed here (both let
    go of the GIL), and always waited for before returning, so nothing keeps reading
    `data` afterwards; the result is the same with or without a pool.
    """
    size = memoryview(data).nbytes  # bytes, also for views of wider items
    if codec is Codec.NONE:
        # Looked up at call time: `_blocks.block_sums` is the one to use even when replaced.
        summing = pool.submit(_blocks.block_sums, data) if pool is not None else None
        blocks: BlockSums | None = None
        try:
            digest = content_sum(data)
            if summing is None:
                blocks = _blocks.block_sums(data)
        finally:
            if summing is not None:  # never leave the thread reading `data` behind
                blocks = summing.result()
        return SealedFragment(journal, begin, begin + size, digest, codec, data, blocks, None)
    digest = content_sum(data)
    stored = encode(codec, data)
    # Readers check this before decompressing, instead of the content's SHA1.
    return SealedFragment(
        journal, begin, begin + size, digest, codec, stored, None, crc32c.crc32c(stored)
    )
