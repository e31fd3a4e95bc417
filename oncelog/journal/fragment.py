"""Fragments: contiguous byte ranges of a journal stored as one object under a Gazette
content name `<begin:016x>-<end:016x>-<sha1:040x>.<raw|gz|zst>`, plus their codecs."""

from __future__ import annotations

import bisect
import enum
import gzip
import hashlib
import re
import zlib
from dataclasses import dataclass

import zstandard

from oncelog.journal.errors import FragmentChecksumError, InvalidFragmentName, UnknownCodec

__all__ = [
    "Codec",
    "Fragment",
    "ZERO_SUM",
    "content_sum",
    "encode",
    "decode",
    "verify",
    "parse_content_name",
    "cover_set",
    "covering",
]

ZERO_SUM = "0" * 40
"""Gazette names an empty fragment with an all-zero sum rather than SHA1("")."""


class Codec(enum.Enum):
    """Compression codec of a stored fragment; the value is its canonical file extension."""

    NONE = ".raw"
    GZIP = ".gz"
    ZSTANDARD = ".zst"

    @property
    def extension(self) -> str:
        return self.value

    @classmethod
    def from_compression(cls, compression: str) -> Codec:
        """Map a FragmentSpec compression name (`none`, `gzip`, `zstd`) to its codec."""
        try:
            return _BY_COMPRESSION[compression.lower()]
        except (KeyError, AttributeError):
            raise UnknownCodec(
                f"unknown compression {compression!r}: expected one of none, gzip, zstd"
            ) from None

    @classmethod
    def from_extension(cls, extension: str, name: str = "") -> Codec:
        """Map a fragment file extension to its codec (Gazette's aliases included)."""
        try:
            return _BY_EXTENSION[extension.lower()]
        except KeyError:
            what = f" of fragment {name!r}" if name else ""
            raise UnknownCodec(
                f"unsupported compression extension {extension!r}{what}: "
                "oncelog reads .raw, .gz/.gzip/.gzod and .zst/.zstandard"
            ) from None


_BY_COMPRESSION = {
    "none": Codec.NONE,
    "raw": Codec.NONE,
    "gzip": Codec.GZIP,
    "zstd": Codec.ZSTANDARD,
    "zstandard": Codec.ZSTANDARD,
}
_BY_EXTENSION = {
    ".raw": Codec.NONE,
    ".gz": Codec.GZIP,
    ".gzip": Codec.GZIP,
    ".gzod": Codec.GZIP,  # Gazette's GZIP_OFFLOAD_DECOMPRESSION: gzip bytes at rest
    "": Codec.GZIP,  # older Gazette name of the same
    ".zst": Codec.ZSTANDARD,
    ".zstandard": Codec.ZSTANDARD,
}

_NAME_RE = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})-([0-9a-f]{40})(\.[A-Za-z0-9]+)?$")


@dataclass(frozen=True, slots=True)
class Fragment:
    """One stored fragment: journal bytes [begin, end) whose SHA1 is `sum`."""

    journal: str
    begin: int
    end: int
    sum: str
    codec: Codec = Codec.NONE
    path_postfix: str = ""
    """Directory between the journal and the content name (Gazette path postfixes)."""
    mod_time: float | None = None
    """Last-modified time (Unix seconds) when known from a listing."""
    size: int | None = None
    """Stored object size in bytes when known from a listing (compressed size)."""

    @property
    def content_length(self) -> int:
        """Number of journal bytes the fragment holds (uncompressed)."""
        return self.end - self.begin

    @property
    def content_name(self) -> str:
        """Gazette content name: `<begin:016x>-<end:016x>-<sha1>.<ext>`."""
        return f"{self.begin:016x}-{self.end:016x}-{self.sum}{self.codec.extension}"

    @property
    def content_path(self) -> str:
        """Path relative to the store root: `<journal>/[<postfix>/]<content name>`."""
        if self.path_postfix:
            return f"{self.journal}/{self.path_postfix}/{self.content_name}"
        return f"{self.journal}/{self.content_name}"

    @property
    def stored_name(self) -> str:
        """Name relative to the journal directory (postfix included)."""
        if self.path_postfix:
            return f"{self.path_postfix}/{self.content_name}"
        return self.content_name

    def covers(self, offset: int) -> bool:
        return self.begin <= offset < self.end

    def __str__(self) -> str:
        return f"{self.journal}:{self.stored_name} [{self.begin}, {self.end})"


def parse_content_name(journal: str, name: str, **extra: object) -> Fragment:
    """Parse `[<postfix>/]<content name>` relative to the journal's directory into a Fragment.

    Raises InvalidFragmentName for text that is not a content name and UnknownCodec for a
    content name with an extension oncelog cannot decode (e.g. Gazette's `.sz` snappy).
    """
    postfix, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    m = _NAME_RE.match(stem)
    if m is None or (dot and not ext):
        raise InvalidFragmentName(
            f"{name!r} in journal {journal!r} is not a fragment content name "
            "<begin:016x>-<end:016x>-<sha1:040x>.<ext>"
        )
    begin, end = int(m.group(1), 16), int(m.group(2), 16)
    if begin > end:
        raise InvalidFragmentName(f"fragment {name!r} of journal {journal!r} has begin > end")
    codec = Codec.from_extension(dot + ext, name=f"{journal}/{name}")
    sum_ = m.group(3)
    return Fragment(journal, begin, end, sum_, codec, postfix, **extra)  # type: ignore[arg-type]


def content_sum(data: bytes | bytearray | memoryview) -> str:
    """Gazette's content sum: hex SHA1 of the uncompressed bytes (all zeros when empty)."""
    if not len(data):
        return ZERO_SUM
    return hashlib.sha1(data, usedforsecurity=False).hexdigest()


def encode(codec: Codec, data: bytes | bytearray | memoryview) -> bytes | bytearray | memoryview:
    """Compress journal bytes for storage with `codec`."""
    if codec is Codec.NONE:
        return data
    if codec is Codec.GZIP:
        return gzip.compress(bytes(data) if isinstance(data, memoryview) else data, 6, mtime=0)
    return zstandard.ZstdCompressor(level=3).compress(data)


def decode(fragment: Fragment, stored: bytes) -> bytes:
    """Decompress a stored fragment object back to journal bytes."""
    codec = fragment.codec
    if codec is Codec.NONE:
        return stored
    try:
        if codec is Codec.GZIP:
            # wbits=47: a gzip or zlib header; concatenated gzip members are read in turn.
            parts = []
            buf = stored
            while buf:
                d = zlib.decompressobj(47)
                parts.append(d.decompress(buf))
                if not d.eof:
                    raise zlib.error("truncated gzip stream")
                buf = d.unused_data
            return parts[0] if len(parts) == 1 else b"".join(parts)  # b"" if no member
        with zstandard.ZstdDecompressor().stream_reader(stored, read_across_frames=True) as r:
            return r.read()
    except (zlib.error, zstandard.ZstdError, OSError, EOFError) as exc:
        raise FragmentChecksumError(
            f"fragment {fragment.content_name} of journal {fragment.journal!r} (offsets "
            f"{fragment.begin}-{fragment.end}) cannot be decompressed: {exc}"
        ) from exc


def verify(fragment: Fragment, content: bytes | memoryview) -> None:
    """Raise FragmentChecksumError unless `content` is exactly the fragment's journal bytes."""
    if len(content) != fragment.content_length:
        raise FragmentChecksumError(
            f"fragment {fragment.content_name} of journal {fragment.journal!r} should hold "
            f"offsets {fragment.begin}-{fragment.end} ({fragment.content_length} bytes) but "
            f"holds {len(content)} bytes"
        )
    actual = content_sum(content)
    if actual != fragment.sum:
        raise FragmentChecksumError(
            f"fragment {fragment.content_name} of journal {fragment.journal!r} (offsets "
            f"{fragment.begin}-{fragment.end}): SHA1 of content is {actual}, "
            f"name says {fragment.sum}"
        )


def cover_set(fragments: list[Fragment]) -> list[Fragment]:
    """Drop every fragment another one covers entirely (Gazette's CoverSet rule), returning
    fragments whose begins and ends both strictly increase, so lookups can bisect."""
    kept: list[Fragment] = []
    for f in sorted(fragments, key=lambda f: (f.begin, -f.end)):
        if f.end <= f.begin:
            continue
        if kept and f.end <= kept[-1].end:
            continue
        kept.append(f)
    return kept


def covering(cover: list[Fragment], begins: list[int], offset: int) -> Fragment | None:
    """In a cover set (with `begins` its begin offsets), the fragment reaching furthest past
    `offset` among those covering it; else the first fragment beginning after `offset`."""
    i = bisect.bisect_right(begins, offset) - 1
    if i >= 0 and cover[i].end > offset:
        return cover[i]
    return cover[i + 1] if i + 1 < len(cover) else None
