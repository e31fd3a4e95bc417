"""Reading a Gazette broker's fragment store: no spec, no claims; the fragment files define
the journal and overlapping fragments resolve to the longest covering one."""

from __future__ import annotations

import gzip
import random

import pytest
import zstandard

from oncelog.journal import (
    AppendNotSupported,
    Codec,
    Fragment,
    FragmentSpec,
    JournalClient,
    JournalSpec,
    UnknownCodec,
)
from oncelog.journal.fragment import content_sum

JOURNAL_BYTES = random.Random(7).randbytes(400)


def put_gazette_fragment(
    client: JournalClient, name: str, begin: int, end: int, codec: Codec, postfix: str = ""
) -> Fragment:
    content = JOURNAL_BYTES[begin:end]
    fragment = Fragment(name, begin, end, content_sum(content), codec, postfix)
    if codec is Codec.GZIP:
        stored = gzip.compress(content)
    elif codec is Codec.ZSTANDARD:
        stored = zstandard.ZstdCompressor().compress(content)
    else:
        stored = content
    client.store.backend.write(client.store.fragment_path(fragment), stored)
    return fragment


@pytest.fixture
def gazette_store(journals: JournalClient) -> JournalClient:
    name = "examples/stream/part-000"
    put_gazette_fragment(journals, name, 0, 100, Codec.NONE)
    put_gazette_fragment(journals, name, 0, 50, Codec.GZIP)  # covered by [0, 100)
    put_gazette_fragment(journals, name, 100, 250, Codec.ZSTANDARD)
    put_gazette_fragment(journals, name, 150, 300, Codec.NONE)  # reaches past [100, 250)
    put_gazette_fragment(journals, name, 300, 400, Codec.GZIP, postfix="date=2024-01-01/hour=03")
    readme = journals.store.journal_dir(name) + "/README.txt"
    journals.store.backend.write(readme, b"not a fragment")
    return journals


def test_reads_the_longest_covering_fragments(gazette_store: JournalClient) -> None:
    name = "examples/stream/part-000"
    assert gazette_store.read(name).read() == JOURNAL_BYTES
    assert gazette_store.head(name) == 400
    spans = [(f.begin, f.end, f.codec) for f in gazette_store.fragments(name)]
    assert spans == [
        (0, 100, Codec.NONE),
        (100, 250, Codec.ZSTANDARD),
        (150, 300, Codec.NONE),
        (300, 400, Codec.GZIP),
    ]
    for offset in (0, 42, 100, 149, 200, 260, 399):
        assert gazette_store.read(name, offset=offset).read() == JOURNAL_BYTES[offset:]


def test_gazette_journals_are_read_only(gazette_store: JournalClient) -> None:
    name = "examples/stream/part-000"
    with pytest.raises(AppendNotSupported, match="Gazette"):
        gazette_store.append(name, b"x")
    with pytest.raises(AppendNotSupported, match="Gazette"):
        gazette_store.gc(name, grace=0)
    assert gazette_store.read(name).read() == JOURNAL_BYTES


def test_holes_are_skipped_like_a_broker_does(journals: JournalClient) -> None:
    name = "holey"
    put_gazette_fragment(journals, name, 0, 100, Codec.NONE)
    put_gazette_fragment(journals, name, 200, 300, Codec.NONE)
    reader = journals.read(name)
    assert reader.read(1000) == JOURNAL_BYTES[0:100] + JOURNAL_BYTES[200:300]
    assert reader.offset == 300
    late = journals.read(name, offset=150)
    assert late.read() == JOURNAL_BYTES[200:300]


def test_unsupported_gazette_codec_is_reported(journals: JournalClient) -> None:
    name = "snappy"
    put_gazette_fragment(journals, name, 0, 100, Codec.NONE)
    journals.store.backend.write(
        journals.store.journal_dir(name) + f"/{100:016x}-{200:016x}-{'ab' * 20}.sz", b"..."
    )
    with pytest.raises(UnknownCodec, match=r"\.sz"):
        journals.read(name).read()


def test_oncelog_fragments_are_a_valid_gazette_store(journals: JournalClient) -> None:
    """Drop oncelog's claims and specs: the fragments alone still give the same journal."""
    name = "interop/part-000"
    journals.create(JournalSpec(name, fragment=FragmentSpec(length=64, compression="gzip")))
    rng = random.Random(3)
    chunks = [rng.randbytes(rng.randrange(1, 100)) for _ in range(20)]
    for chunk in chunks:
        journals.append(name, chunk)
    journals.fs.rm(journals.store.backend.join(".oncelog"), recursive=True)
    as_gazette = JournalClient(journals.fs, journals.root)
    assert as_gazette.read(name).read() == b"".join(chunks)
    assert [f.content_name for f in as_gazette.fragments(name)] == [
        f.content_name for f in as_gazette.store.list_fragments(name)
    ]
