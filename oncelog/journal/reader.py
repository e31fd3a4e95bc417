"""JournalReader: a binary file-like view of a journal from an offset, across fragments.

A fragment read from its first byte is fetched whole, decompressed and SHA1-verified before
any of its bytes are returned; a raw fragment entered in the middle is fetched by a ranged
read of the bytes needed (a part cannot be checked against the fragment's sum). The next
fragment is fetched in the background while the current one is consumed. At the write head
a non-blocking reader reports end of data; a blocking one polls the store with backoff (and
wakes at once for appends of the same client) until data arrives or it is closed.
"""

from __future__ import annotations

import collections
import io
import threading
from concurrent.futures import CancelledError, Executor, Future
from typing import Any

from oncelog.journal.errors import JournalError
from oncelog.journal.fragment import Codec, Fragment
from oncelog.journal.index import JournalIndex
from oncelog.journal.store import FragmentStore

__all__ = ["JournalReader", "READ_AHEAD_FRAGMENTS", "READ_AHEAD_BYTES"]

READ_AHEAD_FRAGMENTS = 8
"""At most this many fragments are fetched ahead of a reader..."""
READ_AHEAD_BYTES = 128 << 20
"""...and no more than about this many bytes of them (at least two fragments of the bulk-load
size 64 MiB, so that two fragments are SHA1-verified at once on two cores)."""


class JournalReader(io.RawIOBase):
    """Reads journal bytes from `offset` on (`offset=-1`: from the write head).

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
        self._chunk: memoryview = memoryview(b"")
        self._chunk_offset = 0
        self._pos = 0
        self._ahead: collections.deque[tuple[Fragment, Future[bytes]]] = collections.deque()
        index.ensure_loaded()
        if offset == -1:
            offset = index.refresh()
        self._chunk_offset = offset
        self.fragments_read = 0

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
        pieces: list[bytes] = []
        got = 0
        while limit is None or got < limit:
            if not self._next_chunk(wait=not pieces):
                break
            avail = len(self._chunk) - self._pos
            take = avail if limit is None else min(avail, limit - got)
            pieces.append(self._chunk[self._pos : self._pos + take].tobytes())
            self._pos += take
            got += take
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

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
            for _, future in list(self._ahead):
                future.cancel()
        super().close()

    # -- internals ---------------------------------------------------------------------------------

    def _next_chunk(self, wait: bool) -> bool:
        """Make unread bytes available in the current chunk; False at end of available data
        (after waiting for more, for a blocking reader, when `wait`)."""
        if self._pos < len(self._chunk):
            return True
        offset = self.offset
        delay = self._poll_min
        while not self._stop.is_set():
            fragment = self._index.locate(offset)
            if fragment is None:
                version = self._index.version
                self._index.refresh()
                fragment = self._index.locate(offset)
            if fragment is not None:
                self._load(fragment, max(offset, fragment.begin))
                return True
            if not (self.block and wait):
                return False
            self._index.wait_for_change(version, delay)
            delay = min(delay * 2, self._poll_max)
        return False

    def _load(self, fragment: Fragment, offset: int) -> None:
        if offset == fragment.begin or fragment.codec is not Codec.NONE:
            data = self._take_ahead(fragment)
            if data is None:
                # Start fetching the following fragments first, so they are read and verified
                # on other cores while this one is (SHA1 bounds a reader, not the disk).
                self._read_ahead(fragment)
                data = self._store.read_fragment(fragment)
            view = memoryview(data)[offset - fragment.begin :]
        else:
            self._drop_ahead()
            view = memoryview(self._store.read_fragment_from(fragment, offset))
        self.fragments_read += 1
        self._chunk, self._chunk_offset, self._pos = view, offset, 0
        self._read_ahead(fragment)

    def _take_ahead(self, fragment: Fragment) -> bytes | None:
        ahead = self._ahead
        while ahead and ahead[0][0].begin < fragment.begin:
            ahead.popleft()[1].cancel()
        if ahead and ahead[0][0] == fragment:
            try:
                return ahead.popleft()[1].result()
            except CancelledError:  # closed meanwhile
                return None
        self._drop_ahead()
        return None

    def _drop_ahead(self) -> None:
        while self._ahead:
            self._ahead.popleft()[1].cancel()

    def _read_ahead(self, fragment: Fragment) -> None:
        """Keep the next few whole fragments (up to READ_AHEAD_FRAGMENTS, READ_AHEAD_BYTES)
        being fetched and verified in the background."""
        if self._executor is None:
            return
        ahead = self._ahead
        offset = ahead[-1][0].end if ahead else fragment.end
        queued = sum(f.content_length for f, _ in ahead)
        while len(ahead) < READ_AHEAD_FRAGMENTS and queued < READ_AHEAD_BYTES:
            try:
                nxt = self._index.locate(offset)
            except JournalError:
                return
            if nxt is None or nxt.begin != offset:
                return
            ahead.append((nxt, self._executor.submit(self._store.read_fragment, nxt)))
            queued += nxt.content_length
            offset = nxt.end

    def __repr__(self) -> str:
        return f"JournalReader({self.journal!r}, offset={self.offset}, block={self.block})"
