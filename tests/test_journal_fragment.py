"""Fragment content names, codecs, checksums and Gazette's cover-set rule."""

from __future__ import annotations

import gzip
import hashlib

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.journal import (
    Codec,
    Fragment,
    FragmentChecksumError,
    InvalidFragmentName,
    UnknownCodec,
    parse_content_name,
)
from oncelog.journal.fragment import (
    ZERO_SUM,
    content_sum,
    cover_set,
    covering,
    decode,
    encode,
    verify,
)

SUM = "0102030405060708090a0b0c0d0e0f1011121314"


def test_content_name_matches_gazette_layout() -> None:
    f = Fragment("a/journal", 1234567890, 0x7FFFFFFFFFFFFFFF, SUM, Codec.GZIP)
    assert f.content_name == f"00000000499602d2-7fffffffffffffff-{SUM}.gz"
    assert f.content_path == f"a/journal/00000000499602d2-7fffffffffffffff-{SUM}.gz"


def test_parse_gazette_example_with_path_postfix() -> None:
    f = parse_content_name("a/journal", f"a=1/b=2/00000000499602d2-7fffffffffffffff-{SUM}.gz")
    assert (f.begin, f.end, f.sum, f.codec, f.path_postfix) == (
        1234567890,
        0x7FFFFFFFFFFFFFFF,
        SUM,
        Codec.GZIP,
        "a=1/b=2",
    )
    assert f.content_path == f"a/journal/a=1/b=2/00000000499602d2-7fffffffffffffff-{SUM}.gz"


@pytest.mark.parametrize(
    ("ext", "codec"),
    [
        (".raw", Codec.NONE),
        (".gz", Codec.GZIP),
        (".gzip", Codec.GZIP),
        (".gzod", Codec.GZIP),
        ("", Codec.GZIP),
        (".zst", Codec.ZSTANDARD),
        (".zstandard", Codec.ZSTANDARD),
    ],
)
def test_gazette_extensions(ext: str, codec: Codec) -> None:
    assert parse_content_name("j", f"{0:016x}-{10:016x}-{SUM}{ext}").codec is codec


@given(
    begin=st.integers(0, 2**62),
    length=st.integers(0, 2**30),
    digest=st.binary(min_size=20, max_size=20),
    codec=st.sampled_from(list(Codec)),
)
def test_content_name_round_trips(begin: int, length: int, digest: bytes, codec: Codec) -> None:
    f = Fragment("j/k", begin, begin + length, digest.hex(), codec)
    assert parse_content_name("j/k", f.content_name) == f


@pytest.mark.parametrize("ext", [".sz", ".snappy", ".lz4", ".bin"])
def test_unknown_extension_is_an_unknown_codec(ext: str) -> None:
    with pytest.raises(UnknownCodec, match=ext.replace(".", r"\.")):
        parse_content_name("j", f"{0:016x}-{10:016x}-{SUM}{ext}")


@pytest.mark.parametrize(
    "name",
    [
        "notes.txt",
        f"{0:015x}-{10:016x}-{SUM}.raw",
        f"{0:016x}-{10:016x}-{SUM[:-1]}.raw",
        f"{0:016x}_{10:016x}-{SUM}.raw",
        f"{0:016X}-{10:016x}-{SUM}.raw".replace("0", "G", 1),
        f"{20:016x}-{10:016x}-{SUM}.raw",
        f"{0:016x}-{10:016x}-{SUM}.",
    ],
)
def test_non_content_names_are_rejected(name: str) -> None:
    with pytest.raises(InvalidFragmentName):
        parse_content_name("j", name)


def test_empty_content_has_gazettes_zero_sum() -> None:
    assert content_sum(b"") == ZERO_SUM
    assert content_sum(b"abc") == hashlib.sha1(b"abc").hexdigest()


@settings(max_examples=60)
@given(data=st.binary(max_size=5000), codec=st.sampled_from(list(Codec)))
def test_codecs_round_trip_and_verify(data: bytes, codec: Codec) -> None:
    f = Fragment("j", 7, 7 + len(data), content_sum(data), codec)
    stored = encode(codec, data)
    content = decode(f, bytes(stored))
    assert content == data
    verify(f, content)


def test_decoders_read_streams_written_by_other_tools() -> None:
    data = b"hello gazette\n" * 100
    multi_member_gzip = gzip.compress(data[:700]) + gzip.compress(data[700:])
    f = Fragment("j", 0, len(data), content_sum(data), Codec.GZIP)
    assert decode(f, multi_member_gzip) == data
    cctx = zstandard.ZstdCompressor()
    two_frames = cctx.compress(data[:100]) + cctx.compress(data[100:])
    fz = Fragment("j", 0, len(data), content_sum(data), Codec.ZSTANDARD)
    assert decode(fz, two_frames) == data


def test_checksum_mismatch_names_journal_fragment_and_offsets() -> None:
    f = Fragment("logs/a", 100, 103, content_sum(b"abc"))
    with pytest.raises(FragmentChecksumError) as info:
        verify(f, b"abd")
    text = str(info.value)
    assert "logs/a" in text and f.content_name in text and "100-103" in text


def test_wrong_length_is_a_checksum_error() -> None:
    f = Fragment("j", 0, 4, content_sum(b"abcd"))
    with pytest.raises(FragmentChecksumError, match="4 bytes"):
        verify(f, b"abc")


def test_corrupt_compressed_bytes_raise_checksum_error() -> None:
    f = Fragment("j", 0, 3, content_sum(b"abc"), Codec.GZIP)
    with pytest.raises(FragmentChecksumError, match="decompressed"):
        decode(f, b"\x1f\x8b\x08garbage")


def _frag(begin: int, end: int) -> Fragment:
    return Fragment("j", begin, end, SUM)


def test_cover_set_keeps_longest_fragments() -> None:
    frags = [_frag(0, 10), _frag(0, 20), _frag(5, 15), _frag(20, 30), _frag(25, 28), _frag(28, 40)]
    cover = cover_set(frags)
    assert [(f.begin, f.end) for f in cover] == [(0, 20), (20, 30), (28, 40)]
    begins = [f.begin for f in cover]
    found = covering(cover, begins, 7)
    assert found is not None and (found.begin, found.end) == (0, 20)
    assert covering(cover, begins, 29).end == 40  # type: ignore[union-attr]
    assert covering(cover, begins, 40) is None


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 20)), max_size=12), st.integers(0, 80))
def test_covering_picks_the_fragment_reaching_furthest(
    spans: list[tuple[int, int]], offset: int
) -> None:
    frags = [_frag(b, b + n) for b, n in spans]
    cover = cover_set(frags)
    found = covering(cover, [f.begin for f in cover], offset)
    holders = [f for f in frags if f.begin <= offset < f.end]
    if holders:
        assert found is not None and found.covers(offset)
        assert found.end == max(f.end for f in holders)
    else:
        later = [f.begin for f in frags if f.begin > offset]
        assert (found.begin if found else None) == (min(later) if later else None)
