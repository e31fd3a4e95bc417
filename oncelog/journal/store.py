"""The store layout on any fsspec filesystem: fragments, claims, specs and other metadata.

```
<root>/<journal>/<begin:016x>-<end:016x>-<sha1:040x>.<raw|gz|zst>  fragments
<root>/.oncelog/claims/<journal>/<begin:016x>                      names the fragment at begin
<root>/.oncelog/journals/<journal>/spec.json                       JournalSpec
<root>/.oncelog/<relative path>                                    other metadata (checkpoints)
```
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, NoReturn, Sequence, TypeVar, cast

import crc32c
import orjson
from fsspec import AbstractFileSystem

from oncelog.journal._blocks import BlockSums, block_range, verify_content, verify_range
from oncelog.journal._retry import is_transient, retry
from oncelog.journal.backends import Backend, ObjectInfo, StagedFile, Staging, backend_for
from oncelog.journal.errors import (
    CorruptClaim,
    FragmentChecksumError,
    InvalidFragmentName,
    JournalError,
    MissingFragment,
    StorageUnavailable,
    UnknownCodec,
)
from oncelog.journal.fragment import Codec, Fragment, decode, parse_content_name, verify
from oncelog.journal.names import validate_journal_name, validate_object_path

__all__ = [
    "Claim",
    "FragmentStore",
    "LocalFragmentFile",
    "RetryingReads",
    "META_DIR",
    "CorruptClaim",
]

T = TypeVar("T")

META_DIR = ".oncelog"

_CRC_RE = re.compile(r"[0-9a-f]{8}")

@dataclass(frozen=True, slots=True)
class Claim:
    """The claim of offset `begin` of a journal: which fragment holds the bytes from there,
    a token unique to the writer attempt that created it (so a writer whose reply was lost
    recognises its own claim), and the incarnation of the journal it was made for (so a
    claim left by a writer of a deleted journal is never taken for part of a new journal
    of the same name; empty in claims made before incarnations existed).

    `blocks`: CRC-32C sums of each block of a raw fragment's content (JSON `block_size`
    and `block_crc32c`, 8 hex digits per block), so that reads entering the fragment in
    the middle are verified (see oncelog.journal._blocks); None when unknown: compressed
    fragments, and claims made before block sums existed (read whole and SHA1-checked).

    `stored_crc32c`: CRC-32C of the whole stored object of a compressed fragment (JSON
    `stored_crc32c`, 8 hex digits), checked before it is decompressed; None for raw
    fragments (their block sums cover them) and claims made before it existed. Together
    with the content length, it stands for the SHA1 on reads: the writer computed it from
    the very bytes it compressed from the content the SHA1 names."""

    begin: int
    fragment: str
    writer: str
    incarnation: str = ""
    blocks: BlockSums | None = None
    stored_crc32c: int | None = None

    def to_bytes(self) -> bytes:
        doc: dict[str, object] = {"fragment": self.fragment, "writer": self.writer}
        if self.incarnation:
            doc["incarnation"] = self.incarnation
        if self.blocks is not None:
            doc["block_size"] = self.blocks.size
            doc["block_crc32c"] = self.blocks.to_hex()
        if self.stored_crc32c is not None:
            doc["stored_crc32c"] = f"{self.stored_crc32c:08x}"
        return orjson.dumps(doc)

    @classmethod
    def from_bytes(cls, journal: str, begin: int, data: bytes) -> Claim:
        try:
            doc = orjson.loads(data)
            claim = cls(
                begin,
                str(doc["fragment"]),
                str(doc.get("writer", "")),
                str(doc.get("incarnation") or ""),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptClaim(
                f"claim at offset {begin} of journal {journal!r} is not a claim document: "
                f"{bytes(data[:100])!r}"
            ) from exc
        if "block_size" in doc or "block_crc32c" in doc:
            try:
                length = parse_content_name(journal, claim.fragment).content_length
                blocks = BlockSums.from_hex(doc.get("block_size"), doc.get("block_crc32c"), length)
            except (InvalidFragmentName, UnknownCodec, ValueError) as exc:
                raise CorruptClaim(
                    f"claim at offset {begin} of journal {journal!r} has malformed block "
                    f"sums for fragment {claim.fragment!r}: {exc}"
                ) from exc
            claim = replace(claim, blocks=blocks)
        if "stored_crc32c" in doc:
            text = doc["stored_crc32c"]
            if not isinstance(text, str) or _CRC_RE.fullmatch(text) is None:
                raise CorruptClaim(
                    f"claim at offset {begin} of journal {journal!r} has a malformed "
                    f"stored_crc32c for fragment {claim.fragment!r}: {str(text)[:40]!r} is not "
                    "8 lowercase hex digits"
                )
            claim = replace(claim, stored_crc32c=int(text, 16))
        return claim

    def parse_fragment(self, journal: str) -> Fragment:
        """The claimed fragment; raises if its name is bad or begins elsewhere."""
        try:
            fragment = parse_content_name(journal, self.fragment)
        except InvalidFragmentName as exc:
            raise CorruptClaim(
                f"claim at offset {self.begin} of journal {journal!r}: {exc}"
            ) from exc
        if fragment.begin != self.begin or fragment.path_postfix:
            raise CorruptClaim(
                f"claim at offset {self.begin} of journal {journal!r} names fragment "
                f"{self.fragment!r} which does not begin there"
            )
        if fragment.end <= fragment.begin:
            # Appends are never empty, so no writer makes such a claim; following it would
            # leave the head where it is and every later append retrying forever.
            raise CorruptClaim(
                f"claim at offset {self.begin} of journal {journal!r} names the empty "
                f"fragment {self.fragment!r}: no oncelog writer makes one; the claim was "
                "written by hand or by another tool"
            )
        return fragment


class RetryingReads:
    """A backend whose read-only calls (reads, listings, existence checks: all idempotent)
    retry transient failures (5xx, resets, truncated bodies, timeouts) for `timeout`
    seconds, then raise StorageUnavailable; every other call goes straight through, so
    writers keep their own retries, which know whether a write may have taken effect."""

    def __init__(self, inner: Backend, timeout: float) -> None:
        self.inner = inner
        self.timeout = timeout

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def staging(self) -> Staging | None:
        """This wrapper, if the inner backend stages: staged writes then go through it like
        every other call (and through whatever wraps it, e.g. a test's fault hooks)."""
        return cast(Staging, self) if self.inner.staging is not None else None

    def _retry(self, op: Callable[[], T], what: str) -> T:
        started = time.monotonic()

        def give_up(exc: Exception) -> NoReturn:
            inner = self.inner
            where = inner.root if inner.kind == "local" else inner.fs.unstrip_protocol(inner.root)
            raise StorageUnavailable(
                f"the store {where}: could not {what}; gave up after "
                f"{time.monotonic() - started:.1f} s (retry timeout {self.timeout:g} s): {exc!r}"
            ) from exc

        return retry(op, self.timeout, give_up)

    def read(self, path: str, size_hint: int | None = None) -> bytes:
        return self._retry(lambda: self.inner.read(path, size_hint), f"read {path}")

    def read_range(self, path: str, start: int, end: int) -> bytes:
        return self._retry(
            lambda: self.inner.read_range(path, start, end), f"read {path} [{start}, {end})"
        )

    def read_many(self, paths: Sequence[str]) -> list[bytes | BaseException]:
        results = self._retry(lambda: self.inner.read_many(paths), f"read {len(paths)} objects")
        # One failed GET of many: retried alone (a missing object is an answer, not a fault).
        return [
            self.read(p) if isinstance(r, Exception) and is_transient(r) else r
            for p, r in zip(paths, results)
        ]

    def exists(self, path: str) -> bool:
        return self._retry(lambda: self.inner.exists(path), f"look up {path}")

    def list_dir(self, path: str) -> list[ObjectInfo]:
        return self._retry(lambda: self.inner.list_dir(path), f"list {path}")

    def list_names_after(self, path: str, after: str | None) -> list[str]:
        return self._retry(lambda: self.inner.list_names_after(path, after), f"list {path}")

    def walk(self, path: str) -> list[ObjectInfo]:
        return self._retry(lambda: self.inner.walk(path), f"list {path}")


class LocalFragmentFile:
    """One raw fragment on local disk, open for reads of whole blocks, each checked against
    its CRC-32C before the bytes are handed out (FragmentStore.open_local).

    A reader keeps one open while it reads through the fragment and reads into a buffer
    of its own that it reuses: no open, allocation or page fault per piece, so a piece
    costs a copy from the page cache, its CRC-32C and the copy out to the reader's caller
    (the copy a raw read makes, plus the check). The file stays readable if the fragment
    is deleted meanwhile (retirement, trim): its name holds the SHA1 of its content, so
    the bytes are the ones named. `_lock` guards the descriptor: `close` may come from
    another thread while a read is in progress, and a descriptor closed (and its number
    reused by another file) under a read would read another file's bytes."""

    __slots__ = ("fragment", "blocks", "_fd", "_lock")

    def __init__(self, fragment: Fragment, blocks: BlockSums, fd: int) -> None:
        self.fragment = fragment
        self.blocks = blocks  # the CRC-32Cs of its blocks, from its claim
        self._fd = fd
        self._lock = threading.Lock()

    def read_blocks(self, lo: int, hi: int, buffer: bytearray) -> memoryview:
        """Journal bytes [lo, hi) of the fragment (whole blocks of `blocks`, or up to the
        fragment's end) read into the start of `buffer` (at least hi - lo bytes, not
        resized while the view is in use) and verified: a view of `buffer`. Raises
        FragmentChecksumError naming journal, fragment and offsets for a bad block, and
        MissingFragment if the file is short or closed."""
        fragment = self.fragment
        view = memoryview(buffer)[: hi - lo]
        with self._lock:
            if self._fd < 0:
                raise MissingFragment(
                    f"fragment {fragment.content_name} of journal {fragment.journal!r}: "
                    "read after the reader was closed"
                )
            got = os.preadv(self._fd, [view], lo - fragment.begin)
        if got != hi - lo:
            raise MissingFragment(
                f"fragment {fragment.content_name} of journal {fragment.journal!r} is "
                f"short: offsets {lo}-{hi} asked, {got} bytes read"
            )
        verify_range(fragment.journal, fragment, lo, view, self.blocks, self.blocks.size)
        return view

    def close(self) -> None:
        """Close the file (idempotent, from any thread)."""
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


class FragmentStore:
    """Paths and object operations of one store root, over one backend (whose reads are
    retried for `retry_timeout`, see RetryingReads)."""

    def __init__(self, fs: AbstractFileSystem, root: str, retry_timeout: float = 30.0) -> None:
        self.backend: Backend = cast(Backend, RetryingReads(backend_for(fs, root), retry_timeout))
        self.fs = fs

    @property
    def root(self) -> str:
        return self.backend.root

    # -- paths ------------------------------------------------------------------------------

    def journal_dir(self, journal: str) -> str:
        return self.backend.join(validate_journal_name(journal))

    def fragment_path(self, fragment: Fragment) -> str:
        return self.backend.join(fragment.journal, fragment.stored_name)

    def claims_dir(self, journal: str) -> str:
        return self.backend.join(META_DIR, "claims", validate_journal_name(journal))

    def claim_path(self, journal: str, begin: int) -> str:
        return self.backend.join(META_DIR, "claims", journal, f"{begin:016x}")

    def spec_path(self, journal: str) -> str:
        return self.backend.join(META_DIR, "journals", validate_journal_name(journal), "spec.json")

    def specs_dir(self) -> str:
        return self.backend.join(META_DIR, "journals")

    def meta_path(self, relative: str) -> str:
        return self.backend.join(META_DIR, validate_object_path(relative))

    # -- fragments --------------------------------------------------------------------------

    def write_fragment(
        self, fragment: Fragment, stored: bytes | bytearray | memoryview | StagedFile
    ) -> None:
        """Store a fragment object under its content name (idempotent: same name, same bytes);
        `stored` may be bytes staged by `stage_fragment` (renamed, not copied)."""
        if isinstance(stored, StagedFile):
            self._staging().write_staged(self.fragment_path(fragment), stored)
        else:
            self.backend.write(self.fragment_path(fragment), stored)

    def move_fragment(self, old: Fragment, new: Fragment) -> None:
        """Give a stored fragment the name of the same bytes at other offsets (`new` has
        `old`'s content sum and length): a rename on local disk, a server-side copy and a
        delete on object stores; the bytes are not sent again."""
        if (new.sum, new.content_length, new.codec) != (old.sum, old.content_length, old.codec):
            raise ValueError(f"move_fragment: {new} does not hold the bytes of {old}")
        self.backend.move(self.fragment_path(old), self.fragment_path(new))

    @property
    def can_stage(self) -> bool:
        """Whether fragment bytes can be stored before their name is known (the backend's
        `staging` capability), so the SHA1 that names them is computed while they are written."""
        return self.backend.staging is not None

    def _staging(self) -> Staging:
        staging = self.backend.staging
        if staging is None:
            raise JournalError(f"the {self.backend.kind} store cannot stage fragments")
        return staging

    @property
    def read_piece(self) -> int | None:
        """How many bytes a reader fetches at a time from a raw fragment whose claim records
        block sums (rounded to whole blocks), read into one reused buffer (`open_pieces`),
        or None to fetch whole fragments (object stores, which s3fs fetches by concurrent
        ranged GETs). The backend's `piece_reads` capability decides."""
        pieces = self.backend.piece_reads
        return None if pieces is None else pieces.read_piece

    def stage_fragment(self, journal: str, stored: bytes | bytearray | memoryview) -> StagedFile:
        """Durably store fragment bytes of `journal` under a temporary name (needs `can_stage`);
        `write_fragment(fragment, staged)` then names them, `discard_staged` drops them."""
        return self._staging().stage(self.journal_dir(journal), stored)

    def prepare_journal(self, journal: str) -> None:
        """Create the directories a first append to `journal` writes into (its fragments and
        its claims), durably, where directories are real (local disk; nothing on object
        stores). The writer creates them too when missing: this lets the appending thread do
        it up front, where it costs a few system calls, instead of the writer thread, which
        has to win the GIL back from the appending thread after each of them (up to 5 ms
        apiece)."""
        self.backend.ensure_dirs([self.journal_dir(journal), self.claims_dir(journal)])

    def discard_staged(self, staged: StagedFile) -> None:
        self._staging().discard(staged)

    def open_pieces(self, fragment: Fragment, blocks: BlockSums) -> LocalFragmentFile:
        """Open a raw fragment for reads of whole blocks into a buffer the caller reuses (see
        LocalFragmentFile; needs `read_piece`); raises MissingFragment if it is absent and
        FragmentChecksumError if its size is not the fragment's length."""
        pieces = self.backend.piece_reads
        if pieces is None:
            raise JournalError(f"the {self.backend.kind} store has no piecewise reads")
        try:
            fd = pieces.open_fd(self.fragment_path(fragment))
        except FileNotFoundError:
            raise self._missing(fragment) from None
        try:
            size = os.fstat(fd).st_size
        except BaseException:
            os.close(fd)
            raise
        if size != fragment.content_length:
            os.close(fd)
            raise FragmentChecksumError(
                f"fragment {fragment.content_name} of journal {fragment.journal!r} should "
                f"hold offsets {fragment.begin}-{fragment.end} ({fragment.content_length} "
                f"bytes) but its file holds {size} bytes"
            )
        return LocalFragmentFile(fragment, blocks, fd)

    def read_fragment(self, fragment: Fragment, claim: Claim | None = None) -> bytes:
        """The fragment's whole journal bytes, decompressed and verified.

        With `claim` (the fragment's own claim: it must name this very content name, else it
        is ignored) recording CRC-32Cs, those are checked instead of the SHA1 in the name,
        about ten times cheaper: a raw fragment's block sums over its content, or a
        compressed fragment's `stored_crc32c` over the stored object before it is
        decompressed (and then the content length). Otherwise (Gazette stores, claims of
        older versions) the SHA1 of the content is checked. Either way no byte is returned
        unverified; FragmentChecksumError names the journal, the fragment and the offsets.
        """
        stored = self._read(fragment)
        if claim is not None and claim.fragment == fragment.content_name:
            if claim.blocks is not None and fragment.codec is Codec.NONE:
                verify_content(fragment.journal, fragment, stored, claim.blocks)
                return stored
            if claim.stored_crc32c is not None:
                actual = crc32c.crc32c(stored)
                if actual != claim.stored_crc32c:
                    raise FragmentChecksumError(
                        f"fragment {fragment.content_name} of journal {fragment.journal!r} "
                        f"(offsets {fragment.begin}-{fragment.end}): the stored object "
                        f"({len(stored)} bytes) has CRC-32C {actual:08x}, its claim records "
                        f"{claim.stored_crc32c:08x}; the stored object is corrupt"
                    )
                content = decode(fragment, stored)
                if len(content) != fragment.content_length:
                    raise FragmentChecksumError(
                        f"fragment {fragment.content_name} of journal {fragment.journal!r} "
                        f"should hold offsets {fragment.begin}-{fragment.end} "
                        f"({fragment.content_length} bytes) but holds {len(content)} bytes"
                    )
                return content
        content = decode(fragment, stored)
        verify(fragment, content)
        return content

    def read_fragment_from(
        self,
        fragment: Fragment,
        offset: int,
        end: int | None = None,
        blocks: BlockSums | None = None,
    ) -> memoryview:
        """Verified journal bytes [offset, end) of a fragment (`end`: its end by default).

        With `blocks`, the block sums from the fragment's claim (raw fragments only), just
        the whole blocks covering the range are fetched, by one ranged read, and each is
        checked against its CRC-32C. Without them (claims of older writers, Gazette stores,
        compressed fragments) the whole fragment is read and checked against its SHA1. No
        byte is ever returned unverified: FragmentChecksumError names the journal, the
        fragment and the offsets. The result is a view, so the bytes fetched around the
        range are not copied.
        """
        end = fragment.end if end is None else end
        if not fragment.begin <= offset <= end <= fragment.end:
            raise JournalError(
                f"offsets {offset}-{end} of journal {fragment.journal!r} are not within "
                f"fragment {fragment.content_name} (offsets {fragment.begin}-{fragment.end})"
            )
        if offset == end:
            return memoryview(b"")
        if blocks is None or fragment.codec is not Codec.NONE:
            content = self.read_fragment(fragment)
            return memoryview(content)[offset - fragment.begin : end - fragment.begin]
        lo, hi = block_range(fragment, offset, end, blocks.size)
        path = self.fragment_path(fragment)
        try:
            data = self.backend.read_range(path, lo - fragment.begin, hi - fragment.begin)
        except FileNotFoundError:
            raise self._missing(fragment) from None
        if len(data) != hi - lo:
            raise MissingFragment(
                f"fragment {fragment.content_name} of journal {fragment.journal!r} is short: "
                f"offsets {lo}-{hi} asked, {len(data)} bytes read"
            )
        verify_range(fragment.journal, fragment, lo, data, blocks, blocks.size)
        return memoryview(data)[offset - lo : end - lo]

    def _read(self, fragment: Fragment) -> bytes:
        # The stored size when listed; else the content length, which bounds a raw fragment
        # exactly and a compressed one from above: large objects are fetched in parallel.
        size_hint = fragment.size if fragment.size is not None else fragment.content_length
        try:
            return self.backend.read(self.fragment_path(fragment), size_hint)
        except FileNotFoundError:
            raise self._missing(fragment) from None

    @staticmethod
    def _missing(fragment: Fragment) -> MissingFragment:
        return MissingFragment(
            f"fragment {fragment.stored_name} of journal {fragment.journal!r} (offsets "
            f"{fragment.begin}-{fragment.end}) is missing from the store"
        )

    def list_fragments(self, journal: str, postfixes: bool = False) -> list[Fragment]:
        """Fragment objects stored under the journal's directory (claimed or not), with their
        sizes and times. With `postfixes`, also those in Gazette path-postfix directories
        (every component holding `=`, e.g. `date=2024-01-01/`); other names are skipped."""
        directory = self.journal_dir(journal)
        infos: list[ObjectInfo] = (
            self.backend.walk(directory) if postfixes else self.backend.list_dir(directory)
        )
        out = []
        for info in infos:
            postfix, _, _ = info.name.rpartition("/")
            if postfix and not all("=" in part for part in postfix.split("/")):
                continue
            try:
                out.append(
                    parse_content_name(journal, info.name, mod_time=info.mtime, size=info.size)
                )
            except InvalidFragmentName:
                continue
        out.sort(key=lambda f: (f.begin, f.end, f.stored_name))
        return out

    def delete_fragments(self, fragments: Sequence[Fragment]) -> None:
        self.backend.delete([self.fragment_path(f) for f in fragments])

    # -- claims -----------------------------------------------------------------------------

    def create_claim(self, journal: str, claim: Claim) -> bool:
        """Create the claim only if no claim exists at its offset; True if this call made it."""
        return self.backend.create(self.claim_path(journal, claim.begin), claim.to_bytes())

    def read_claim(self, journal: str, begin: int) -> Claim | None:
        """The claim at `begin`, or None if there is none (one GET)."""
        try:
            data = self.backend.read(self.claim_path(journal, begin))
        except FileNotFoundError:
            return None
        return Claim.from_bytes(journal, begin, data)

    def read_claims(self, journal: str, begins: Sequence[int]) -> list[Claim | None]:
        """Claims at many offsets at once (concurrent GETs where the backend allows)."""
        results = self.backend.read_many([self.claim_path(journal, b) for b in begins])
        out: list[Claim | None] = []
        for begin, result in zip(begins, results):
            if isinstance(result, FileNotFoundError):
                out.append(None)
            elif isinstance(result, BaseException):
                raise result
            else:
                out.append(Claim.from_bytes(journal, begin, result))
        return out

    def list_claim_begins(self, journal: str, after: int | None = None) -> list[int]:
        """Offsets holding claims, ascending; only those past `after` when given (one LIST
        page per 1000 claims on S3, using StartAfter)."""
        names = self.backend.list_names_after(
            self.claims_dir(journal), None if after is None else f"{after:016x}"
        )
        out = []
        for name in names:
            if len(name) == 16:
                try:
                    out.append(int(name, 16))
                except ValueError:
                    continue
        out.sort()
        return out

    def delete_claims(self, journal: str, begins: Sequence[int]) -> None:
        self.backend.delete([self.claim_path(journal, b) for b in begins])

    # -- specs ------------------------------------------------------------------------------

    def read_spec_bytes(self, journal: str) -> bytes | None:
        try:
            return self.backend.read(self.spec_path(journal))
        except FileNotFoundError:
            return None

    def list_spec_names(self) -> list[str]:
        """Names of every journal with a spec.json."""
        suffix = "/spec.json"
        out = []
        for info in self.backend.walk(self.specs_dir()):
            name = info.name.replace("\\", "/")
            if name.endswith(suffix):
                out.append(name[: -len(suffix)])
        return sorted(out)
