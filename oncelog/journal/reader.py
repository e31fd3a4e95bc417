"""JournalReader: a binary file-like view of a journal from an offset, across fragments.

Every byte is verified before it is returned, by the cheapest check the fragment's claim
allows (see FragmentStore.read_fragment). A raw fragment whose claim records per-block
CRC-32C sums is fetched in whole blocks, each checked against its sum: from the block
holding the first byte needed to the fragment's end (object stores), or by pieces of a few
blocks (local disk: in the reading thread, into one reused buffer, from the fragment's file
kept open; see LocalFragmentFile); a consumer resuming in the middle of a fragment fetches
only the blocks it needs. A compressed fragment whose claim records the CRC-32C of its
stored object is fetched whole and that is checked before it is decompressed. Anything
else (Gazette stores, claims of older versions) is fetched whole, decompressed and checked
against the SHA1 in its name. Whole fragments are fetched and verified by a thread pool
while the current one is consumed (on object stores, pieces too). At the write head
a non-blocking reader reports end of data; a blocking one polls the store with backoff (and
wakes at once for appends of the same client) until data arrives or it is closed.
"""

from __future__ import annotations

import collections
import io
import threading
from concurrent.futures import CancelledError, Executor, Future
from dataclasses import dataclass
from typing import Any

from oncelog.journal._blocks import BlockSums, block_range
from oncelog.journal.errors import JournalError, MissingFragment, OffsetNotAvailable
from oncelog.journal.fragment import Codec, Fragment
from oncelog.journal.index import ClaimsIndex, JournalIndex
from oncelog.journal.store import Claim, FragmentStore, LocalFragmentFile

__all__ = ["JournalReader", "READ_AHEAD_FRAGMENTS", "READ_AHEAD_BYTES"]

READ_AHEAD_FRAGMENTS = 8
"""At most this many fragments (or pieces of fragments, see FragmentStore.read_piece) are
fetched ahead of a reader..."""
READ_AHEAD_BYTES = 128 << 20
"""...and no more than about this many bytes of them (at least two fragments of the bulk-load
size 64 MiB, so that two fragments are verified at once on two cores)."""

# Pieces of raw fragments on local disk are not read ahead by other threads: a piece (1
# MiB) takes ~0.1 ms to read and check, in a few calls that each let go of the GIL and
# must take it back from the consumer, which holds it while it copies bytes out; so the
# helper thread only progressed while the consumer waited for it (measured, 200 MB from
# the page cache on 2 cores: the same rate with 1 piece ahead as with none, less with 2
# or 8), and a reused buffer cannot be shared with it. Whole fragments checked by SHA1
# (hashed in one call without the GIL) are still read ahead on every store.

Buffer = bytes | memoryview


@dataclass(frozen=True, slots=True)
class _Ahead:
    """Journal bytes [lo, hi) of `fragment` being fetched and verified in the background."""

    fragment: Fragment
    lo: int
    hi: int
    future: Future[Buffer]


class JournalReader(io.RawIOBase):
    """Reads journal bytes from `offset` on (`offset=-1`: from the write head; 0: from the
    first available offset, unless `exact`).

    `offset` (the property) is always the true journal offset of the next byte: a reader
    opened at 0 of a trimmed journal starts at its first available offset and says so, and
    never jumps later on. An offset below the first available one (trimmed or retained
    away, before or while reading) raises OffsetNotAvailable; so does offset 0 with `exact`
    (a replay that must start exactly there).

    `read(n)` returns up to n bytes, spanning fragments when more are available; `b""`
    means the head was reached (never, for a blocking reader, until it is closed).
    `close()` may be called from another thread to stop a blocked read cleanly.
    """

    def __init__(
        self,
        store: FragmentStore,
        index: JournalIndex,
        offset: int = 0,
        block: bool = False,
        *,
        executor: Executor | None = None,
        poll_min: float = 0.01,
        poll_max: float = 1.0,
        exact: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < -1:
            raise JournalError(
                f"read offset of journal {index.journal!r} must be an int >= -1, not {offset!r}"
            )
        self.journal = index.journal
        self.block = block
        self._store = store
        self._index = index
        self._executor = executor
        self._poll_min = poll_min
        self._poll_max = poll_max
        self._stop = threading.Event()
        self._recovered: set[str] = set()  # fragments found missing and looked up again
        self._chunk: memoryview = memoryview(b"")
        self._chunk_offset = 0
        self._pos = 0
        self._ahead: collections.deque[_Ahead] = collections.deque()
        if offset == 0 and not exact:
            offset = index.fresh_first()  # "the first available", as the store says now
        head = index.ensure_loaded()
        if offset == -1:
            offset = index.refresh()
        elif offset < index.first:
            raise OffsetNotAvailable(
                f"offset {offset} of journal {self.journal!r} is before its first available "
                f"offset {index.first} (the data before was trimmed)"
            )
        elif offset > head and offset > index.refresh():
            # At the head a reader waits (or ends); past it there is nothing to wait for: the
            # offset was never written (a checkpoint of another journal, or of a journal
            # deleted and created again).
            raise OffsetNotAvailable(
                f"offset {offset} of journal {self.journal!r} is past its write head "
                f"{index.head}: no byte was ever written there"
            )
        self._chunk_offset = offset
        self._fragment: Fragment | None = None  # the fragment the current chunk is of
        self.fragments_read = 0
        # Local disk: the raw fragment being read by blocks, and the two buffers its pieces
        # are read into in turn (reused: `_chunk`, and `read` while it collects, view the
        # newest two pieces).
        self._local: LocalFragmentFile | None = None
        self._buffers = [bytearray(), bytearray()]
        self._flip = 0

    # -- file-like API ----------------------------------------------------------------------------

    @property
    def offset(self) -> int:
        """Journal offset of the next byte `read` returns."""
        return self._chunk_offset + self._pos

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.offset

    def read(self, size: int | None = -1) -> bytes:
        """Up to `size` bytes (all currently available for size < 0); b"" at the head of a
        non-blocking reader, and once closed (so a tailing loop ends cleanly whenever another
        thread closes the reader)."""
        if size == 0 or self._stop.is_set():
            return b""
        limit = None if size is None or size < 0 else size
        # Views of the chunks, copied once at the end. A view of a local piece lives in one
        # of the two reused buffers, which the next load but one overwrites: so before each
        # load, every view but the newest is copied out (only reads spanning 3+ chunks).
        pieces: list[Buffer] = []
        got = 0
        while limit is None or got < limit:
            if len(pieces) >= 2 and isinstance(pieces[-2], memoryview):
                pieces[-2] = pieces[-2].tobytes()
            if not self._next_chunk(wait=not pieces):
                break
            avail = len(self._chunk) - self._pos
            take = avail if limit is None else min(avail, limit - got)
            pieces.append(self._chunk[self._pos : self._pos + take])
            self._pos += take
            got += take
        if len(pieces) == 1:
            return bytes(pieces[0])
        return b"".join(pieces)

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        if self._stop.is_set():
            return 0
        out = memoryview(buffer).cast("B")
        got = 0
        while got < len(out):
            if not self._next_chunk(wait=got == 0):
                break
            take = min(len(self._chunk) - self._pos, len(out) - got)
            out[got : got + take] = self._chunk[self._pos : self._pos + take]
            self._pos += take
            got += take
        return got

    def close(self) -> None:
        """Stop reading; a read blocked in another thread returns b"" promptly, and later
        reads return b"". Safe to call from any thread."""
        if not self._stop.is_set():
            self._stop.set()
            self._index.notify()
            for ahead in list(self._ahead):
                ahead.future.cancel()
            local, self._local = self._local, None
            if local is not None:
                local.close()
        super().close()

    # -- internals ---------------------------------------------------------------------------------

    def _next_chunk(self, wait: bool) -> bool:
        """Make unread bytes available in the current chunk; False at end of available data
        (after waiting for more, for a blocking reader, when `wait`)."""
        if self._pos < len(self._chunk):
            return True
        offset = self.offset
        local = self._local
        if local is not None and offset < local.fragment.end and not self._stop.is_set():
            # The next piece of the local fragment being read (the common case, kept short:
            # the same fragment holds these bytes whatever the index says now).
            self._load_local(local.fragment, offset, local.blocks)
            return True
        delay = self._poll_min
        refresh = self._index.refresh  # a full look first; then polls (see JournalIndex.poll)
        while not self._stop.is_set():
            fragment = self._index.locate(offset)
            if fragment is None:
                version = self._index.version
                refresh()
                refresh = self._index.poll
                fragment = self._index.locate(offset)
            if fragment is not None:
                try:
                    self._load(fragment, max(offset, fragment.begin))
                except MissingFragment:
                    # Compaction's retirement may have removed a small fragment this index
                    # still named: re-read the records once per fragment and locate again.
                    recover = getattr(self._index, "recover", None)
                    if fragment.content_name in self._recovered or recover is None:
                        raise
                    self._recovered.add(fragment.content_name)
                    self._drop_ahead()
                    if not recover(fragment):
                        raise
                    continue
                return True
            if not (self.block and wait):
                return False
            self._index.wait_for_change(version, delay)
            delay = min(delay * 2, self._poll_max)
        return False

    def _load(self, fragment: Fragment, offset: int) -> None:
        claim = self._claim_of(fragment)
        lo, hi = self._piece(fragment, offset, claim)
        if self._by_local_blocks(fragment, claim):
            assert claim is not None and claim.blocks is not None
            self._drop_ahead()
            if fragment != self._fragment:
                self._fragment = fragment
                self.fragments_read += 1
            self._load_local(fragment, offset, claim.blocks)
            return
        self._close_local()
        data = self._take_ahead(fragment, lo, hi)
        if data is None:
            # Start fetching what follows first, so that it is read and verified on other
            # cores while this piece is (verification bounds a reader, not the disk).
            self._drop_ahead()
            self._read_ahead(fragment, hi)
            # Entering a fragment in the middle: a ranged read even when its blocks span it.
            data = self._fetch(fragment, lo, hi, claim, ranged=offset != fragment.begin)
        if fragment != self._fragment:
            self._fragment = fragment
            self.fragments_read += 1
        self._chunk, self._chunk_offset, self._pos = memoryview(data)[offset - lo :], offset, 0
        self._read_ahead(fragment, hi)

    def _by_local_blocks(self, fragment: Fragment, claim: Claim | None) -> bool:
        """Whether `fragment` is read here by pieces of whole checked blocks from local disk."""
        return (
            self._store.read_piece is not None
            and claim is not None
            and claim.blocks is not None
            and fragment.codec is Codec.NONE
        )

    def _load_local(self, fragment: Fragment, offset: int, blocks: BlockSums) -> None:
        """Make the piece of a raw fragment on local disk holding `offset` the current chunk:
        whole blocks from the one holding `offset`, read into the reused buffer not holding
        the newest piece, and checked block by block."""
        lo, hi = block_range(fragment, offset, offset + 1, blocks.size)
        piece = self._store.read_piece or blocks.size
        hi = min(lo + max(blocks.size, piece - piece % blocks.size), fragment.end)
        local = self._local
        if local is None or local.fragment != fragment:
            self._close_local()
            local = self._local = self._store.open_pieces(fragment, blocks)
        self._flip ^= 1
        buffer = self._buffers[self._flip]
        if len(buffer) < hi - lo:  # a new buffer: views of the old one may still be alive
            buffer = self._buffers[self._flip] = bytearray(
                max(hi - lo, self._store.read_piece or 0)
            )
        data = local.read_blocks(lo, hi, buffer)
        self._chunk, self._chunk_offset, self._pos = data[offset - lo :], offset, 0
        if hi == fragment.end:
            self._read_ahead(fragment, hi)

    def _close_local(self) -> None:
        local, self._local = self._local, None
        if local is not None:
            local.close()

    def _claim_of(self, fragment: Fragment) -> Claim | None:
        """The fragment's claim as the index read it (its CRC-32Cs let reads skip the SHA1 and
        ranged reads be verified); None for Gazette stores and for a claim naming other
        content (then the fragment is read whole and SHA1-checked)."""
        if not isinstance(self._index, ClaimsIndex):
            return None
        claim = self._index.claim(fragment.begin)
        if claim is None or claim.fragment != fragment.content_name:
            return None
        return claim

    def _piece(self, fragment: Fragment, offset: int, claim: Claim | None) -> tuple[int, int]:
        """The journal offsets [lo, hi) to fetch from `fragment` to read `offset`: the whole
        fragment, unless its claim records block sums (a raw fragment), which let a ranged
        read be verified: then from the block holding `offset` to the fragment's end, or
        (local disk) for the store's read piece, in whole blocks."""
        blocks = claim.blocks if claim is not None else None
        if blocks is None or fragment.codec is not Codec.NONE:
            return fragment.begin, fragment.end
        lo, _ = block_range(fragment, offset, offset + 1, blocks.size)
        piece = self._store.read_piece
        if piece is None:
            return lo, fragment.end
        piece = max(blocks.size, piece - piece % blocks.size)
        return lo, min(lo + piece, fragment.end)

    def _fetch(
        self, fragment: Fragment, lo: int, hi: int, claim: Claim | None, ranged: bool = False
    ) -> Buffer:
        """Journal bytes [lo, hi) of `fragment`, verified (runs in read-ahead threads too):
        a whole fragment by one read (concurrent GETs for big S3 objects) unless `ranged`,
        else by a ranged read of whole blocks, each checked against its CRC-32C."""
        blocks = claim.blocks if claim is not None else None
        whole = lo == fragment.begin and hi == fragment.end
        if blocks is None or fragment.codec is not Codec.NONE or (whole and not ranged):
            return self._store.read_fragment(fragment, claim)
        return self._store.read_fragment_from(fragment, lo, hi, blocks)

    def _take_ahead(self, fragment: Fragment, lo: int, hi: int) -> Buffer | None:
        ahead = self._ahead
        while ahead and ahead[0].lo < lo:  # pieces are queued in journal order
            ahead.popleft().future.cancel()
        if ahead and (ahead[0].fragment, ahead[0].lo, ahead[0].hi) == (fragment, lo, hi):
            try:
                return ahead.popleft().future.result()
            except CancelledError:  # closed meanwhile
                return None
        return None

    def _drop_ahead(self) -> None:
        while self._ahead:
            self._ahead.popleft().future.cancel()

    def _read_ahead(self, fragment: Fragment, hi: int) -> None:
        """Keep what follows journal offset `hi` of `fragment` (up to READ_AHEAD_FRAGMENTS
        pieces or whole fragments, READ_AHEAD_BYTES) being fetched and verified in the
        background."""
        if self._executor is None:
            return
        ahead = self._ahead
        if ahead:
            fragment, hi = ahead[-1].fragment, ahead[-1].hi
        queued = sum(a.hi - a.lo for a in ahead)
        while len(ahead) < READ_AHEAD_FRAGMENTS and queued < READ_AHEAD_BYTES:
            if hi >= fragment.end:
                try:
                    nxt = self._index.locate(hi)
                except JournalError:
                    return
                if nxt is None or nxt.begin != hi:
                    return
                fragment = nxt
            claim = self._claim_of(fragment)
            if self._by_local_blocks(fragment, claim):
                return  # read by the consumer's thread when it gets there
            lo, hi = self._piece(fragment, hi, claim)
            future = self._executor.submit(self._fetch, fragment, lo, hi, claim)
            ahead.append(_Ahead(fragment, lo, hi, future))
            queued += hi - lo

    def __repr__(self) -> str:
        return f"JournalReader({self.journal!r}, offset={self.offset}, block={self.block})"
