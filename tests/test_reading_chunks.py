"""How readers cut a journal into chunks for decoding: adaptive sizes, long frames."""

from __future__ import annotations

from typing import Any

import pytest

from oncelog import framing as framing_module
from oncelog.framing import CONTENT_TYPE_JSON_LINES
from oncelog.journal import JournalSpec
from oncelog.reading import _ChunkSizer, read_uncommitted, read_uncommitted_batches

JSON = {"content-type": CONTENT_TYPE_JSON_LINES}


def lines(sizes: list[int]) -> list[bytes]:
    return [b'{"n":%d,"p":"%s"}\n' % (i, b"x" * size) for i, size in enumerate(sizes)]


@pytest.mark.parametrize("chunk_size", [None, 1, 7, 4096, 1 << 20])
def test_every_chunk_size_gives_the_same_messages(journals: Any, chunk_size: Any) -> None:
    """Frames of very different sizes, some far longer than a chunk, decode identically
    whatever the chunking (adaptive or fixed, down to one byte per read)."""
    journals.create(JournalSpec("chunks/j", labels=JSON))
    frames = lines([1, 300_000, 3, 5_000, 2, 1_200_000, 0, 70, 70, 70])
    journals.append("chunks/j", b"".join(frames))
    envs = list(read_uncommitted(journals, "chunks/j", chunk_size=chunk_size))
    assert [e.message.doc["n"] for e in envs] == list(range(len(frames)))
    offsets = [0]
    for frame in frames:
        offsets.append(offsets[-1] + len(frame))
    assert [(e.begin, e.end) for e in envs] == list(zip(offsets, offsets[1:]))


def test_a_frame_longer_than_many_chunks_is_decoded_a_logarithmic_number_of_times(
    journals: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a long frame is incomplete, decoding waits for the pending bytes to double:
    a 2 MB line read 4 KiB at a time is looked at ~10 times, not ~500 (which would scan
    O(length^2 / chunk) bytes)."""
    journals.create(JournalSpec("chunks/long", labels=JSON))
    frames = lines([10, 2_000_000, 10])
    journals.append("chunks/long", b"".join(frames))
    calls: list[int] = []
    framing = framing_module.for_content_type(CONTENT_TYPE_JSON_LINES)
    real = type(framing).decode

    def counting(self: Any, data: Any, **kw: Any) -> Any:
        calls.append(len(data))
        return real(self, data, **kw)

    monkeypatch.setattr(type(framing), "decode", counting)
    envs = list(read_uncommitted(journals, "chunks/long", chunk_size=4096))
    assert [len(e.message.doc["p"]) for e in envs] == [10, 2_000_000, 10]
    assert 2_000_000 // 4096 > 400
    assert len(calls) < 20, calls


def test_the_adaptive_size_follows_the_frames() -> None:
    """About 128 frames' worth of bytes per read, within [16 KiB, 1 MiB]; a fixed size
    stays fixed and a bad one is refused."""
    from oncelog.message import Envelope

    sizer = _ChunkSizer(None)
    assert not sizer.fixed and 16 << 10 <= sizer.size <= 1 << 20

    def batch(frame: int, n: int) -> list[Envelope]:
        return [Envelope("j", i * frame, (i + 1) * frame, None) for i in range(n)]

    sizer.saw(batch(1000, 50))
    assert sizer.size == 128 * 1000
    sizer.saw(batch(10, 500))
    assert sizer.size == 16 << 10
    sizer.saw(batch(5 << 20, 1))
    assert sizer.size == 1 << 20
    assert _ChunkSizer(4096).fixed and _ChunkSizer(4096).size == 4096
    with pytest.raises(ValueError, match="chunk_size"):
        _ChunkSizer(0)


def test_batches_of_a_journal_of_small_frames_are_small(journals: Any) -> None:
    """Adaptive reading hands over batches of about a hundred small messages, not a
    megabyte's worth at once (which is what made reading slow: see _ChunkSizer)."""
    journals.create(JournalSpec("chunks/small", labels=JSON))
    journals.append("chunks/small", b"".join(lines([20] * 20_000)))
    sizes = [len(b) for b in read_uncommitted_batches(journals, "chunks/small")]
    assert sum(sizes) == 20_000
    assert len(sizes) > 20 and max(sizes[1:]) < 1000
