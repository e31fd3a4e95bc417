"""The store layout on any fsspec filesystem: fragments, claims, specs and other metadata.

```
<root>/<journal>/<begin:016x>-<end:016x>-<sha1:040x>.<raw|gz|zst>  fragments
<root>/.oncelog/claims/<journal>/<begin:016x>                      names the fragment at begin
<root>/.oncelog/journals/<journal>/spec.json                       JournalSpec
<root>/.oncelog/<relative path>                                    other metadata (checkpoints)
```
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, cast

import orjson
from fsspec import AbstractFileSystem

from oncelog.journal.backends import Backend, LocalBackend, ObjectInfo, StagedFile, backend_for
from oncelog.journal.errors import (
    InvalidFragmentName,
    JournalError,
    MissingFragment,
)
from oncelog.journal.fragment import Fragment, decode, parse_content_name, verify
from oncelog.journal.names import validate_journal_name, validate_object_path

__all__ = ["Claim", "FragmentStore", "META_DIR", "CorruptClaim"]

META_DIR = ".oncelog"


class CorruptClaim(JournalError):
    """A claim object cannot be parsed or names a fragment at another offset."""


@dataclass(frozen=True, slots=True)
class Claim:
    """The claim of offset `begin` of a journal: which fragment holds the bytes from there,
    and a token unique to the writer attempt that created it."""

    begin: int
    fragment: str
    writer: str

    def to_bytes(self) -> bytes:
        return orjson.dumps({"fragment": self.fragment, "writer": self.writer})

    @classmethod
    def from_bytes(cls, journal: str, begin: int, data: bytes) -> Claim:
        try:
            doc = orjson.loads(data)
            claim = cls(begin, str(doc["fragment"]), str(doc.get("writer", "")))
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise CorruptClaim(
                f"claim at offset {begin} of journal {journal!r} is not a claim document: "
                f"{bytes(data[:100])!r}"
            ) from exc
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
        return fragment


class FragmentStore:
    """Paths and object operations of one store root, over one backend."""

    def __init__(self, fs: AbstractFileSystem, root: str) -> None:
        self.backend: Backend = backend_for(fs, root)
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
        self.backend.write(self.fragment_path(fragment), stored)

    @property
    def can_stage(self) -> bool:
        """Whether fragment bytes can be stored before their name is known (local disk), so
        the SHA1 that names them can be computed while they are being written."""
        return isinstance(self.backend, LocalBackend)

    def stage_fragment(self, journal: str, stored: bytes | bytearray | memoryview) -> StagedFile:
        """Durably store fragment bytes of `journal` under a temporary name (local disk only);
        `write_fragment(fragment, staged)` then names them, `discard_staged` drops them."""
        return cast(LocalBackend, self.backend).stage(self.journal_dir(journal), stored)

    def discard_staged(self, staged: StagedFile) -> None:
        cast(LocalBackend, self.backend).discard(staged)

    def read_fragment(self, fragment: Fragment) -> bytes:
        """The fragment's whole journal bytes, decompressed and SHA1-verified."""
        stored = self._read(fragment)
        content = decode(fragment, stored)
        verify(fragment, content)
        return content

    def read_fragment_from(self, fragment: Fragment, offset: int, end: int | None = None) -> bytes:
        """Journal bytes [offset, end) of an uncompressed fragment, by a ranged read (a part of
        a fragment cannot be checked against its SHA1)."""
        end = fragment.end if end is None else end
        path = self.fragment_path(fragment)
        try:
            data = self.backend.read_range(path, offset - fragment.begin, end - fragment.begin)
        except FileNotFoundError:
            raise self._missing(fragment) from None
        if len(data) != end - offset:
            raise MissingFragment(
                f"fragment {fragment.content_name} of journal {fragment.journal!r} is short: "
                f"offsets {offset}-{end} asked, {len(data)} bytes read"
            )
        return data

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
