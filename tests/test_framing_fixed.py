"""Fixed framing: Gazette's byte layout, frame-at-a-time reading, batch decoding, desync."""

from __future__ import annotations

import io
import uuid

import pytest
from framing_support import decode_chunks, decode_one_shot, event_class, split_at
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.framing import (
    DesyncDetected,
    EncodeError,
    FixedFraming,
    FramingError,
    MalformedFrame,
    RawPayload,
    TruncatedFrame,
    encode_fixed_frame,
    for_content_type,
    unpack_fixed_frame,
)
from oncelog.message import NIL_UUID, Flags, ProtoMessage, build_uuid

MAGIC = bytes([0x66, 0x33, 0x93, 0x36])
TEST_CONTENT = b"test message content"
# Gazette's own fixture (message/fixed_framing_test.go): a 20-byte payload.
GAZETTE_FRAME = bytes([0x66, 0x33, 0x93, 0x36, 0x14, 0x0, 0x0, 0x0]) + TEST_CONTENT
FRAMING = FixedFraming()
PRODUCER = bytes([0x01, 2, 3, 4, 5, 6])


class _Pipe(io.RawIOBase):
    """A non-seekable raw stream over bytes, handing out at most `step` bytes a read."""

    def __init__(self, data: bytes, step: int = 1 << 20) -> None:
        self._data = memoryview(data)
        self._pos = 0
        self._step = step

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray) -> int:  # type: ignore[override]
        n = min(len(b), self._step, len(self._data) - self._pos)
        b[:n] = self._data[self._pos : self._pos + n]
        self._pos += n
        return n


def readers(data: bytes) -> list[io.IOBase]:
    """The same bytes behind each kind of reader unpack_fixed_frame accepts."""
    return [
        io.BytesIO(data),
        io.BufferedReader(io.BytesIO(data), buffer_size=16),
        io.BufferedReader(io.BytesIO(data)),
        io.BufferedReader(_Pipe(data), buffer_size=1 << 16),
    ]


def unpack_all(reader: io.IOBase) -> list[bytes | tuple[str, bytes]]:
    """Frames and ("desync", skipped) markers until a clean end of data."""
    out: list[bytes | tuple[str, bytes]] = []
    while True:
        try:
            frame = unpack_fixed_frame(reader)
        except DesyncDetected as exc:
            out.append(("desync", exc.skipped))
            continue
        if not frame:
            return out
        out.append(frame)


def event(seq: int, flags: int = Flags.OUTSIDE_TXN) -> ProtoMessage:
    cls = event_class()
    u = build_uuid(PRODUCER, (seq + 1) << 4, flags)
    return ProtoMessage(cls(uuid=str(u), seq=seq, user=f"user-{seq}", ok=seq % 2 == 0,
                            tags=["a", "b"][: seq % 3]))


# --- byte vectors ------------------------------------------------------------------------


def test_encode_matches_gazette_fixture_bytes() -> None:
    assert encode_fixed_frame(TEST_CONTENT) == GAZETTE_FRAME
    assert encode_fixed_frame(b"foo") == bytes([0x66, 0x33, 0x93, 0x36, 3, 0, 0, 0]) + b"foo"
    assert encode_fixed_frame(b"") == MAGIC + bytes(4)
    assert encode_fixed_frame(b"x" * 0x0102) [:8] == MAGIC + bytes([0x02, 0x01, 0, 0])


def test_marshal_accepts_protos_raw_payloads_and_bytes() -> None:
    msg = event(7)
    payload = msg.proto.SerializeToString()
    expected = MAGIC + len(payload).to_bytes(4, "little") + payload
    assert FRAMING.marshal(msg) == expected
    assert FRAMING.marshal(msg.proto) == expected
    assert FRAMING.marshal(RawPayload(payload)) == expected
    assert FRAMING.marshal(bytearray(payload)) == expected
    with pytest.raises(TypeError, match="fixed framing marshals a ProtoMessage"):
        FRAMING.marshal({"not": "a proto"})


def test_payload_too_long_for_the_length_field_is_refused() -> None:
    class Huge:
        def __len__(self) -> int:
            return 1 << 32

    with pytest.raises(EncodeError, match="exceeds"):
        encode_fixed_frame(Huge())  # type: ignore[arg-type]


def test_registered_under_gazette_content_type() -> None:
    framing = for_content_type("application/x-protobuf-fixed")
    assert isinstance(framing, FixedFraming)
    assert framing.content_type == "application/x-protobuf-fixed"


# --- unpack_fixed_frame --------------------------------------------------------------------


@pytest.mark.parametrize("kind", range(4))
def test_unpack_reads_exactly_one_frame(kind: int) -> None:
    reader = readers(GAZETTE_FRAME + b"extra")[kind]
    assert unpack_fixed_frame(reader) == GAZETTE_FRAME
    assert reader.read() == b"extra"


@pytest.mark.parametrize("kind", range(4))
def test_unpack_clean_end_and_trailing_newline(kind: int) -> None:
    assert unpack_fixed_frame(readers(b"")[kind]) == b""
    reader = readers(GAZETTE_FRAME + b"\n")[kind]
    assert unpack_fixed_frame(reader) == GAZETTE_FRAME
    assert unpack_fixed_frame(reader) == b""  # a lone trailing newline is a clean end


@pytest.mark.parametrize("kind", range(4))
def test_unpack_desync_skips_to_next_magic_word(kind: int) -> None:
    reader = readers(b"foobar" + GAZETTE_FRAME + b"xyz" + GAZETTE_FRAME)[kind]
    with pytest.raises(DesyncDetected) as info:
        unpack_fixed_frame(reader)
    assert info.value.skipped == b"foobar"
    assert isinstance(info.value, FramingError)
    assert "skipped 6 bytes" in str(info.value) and "b'foobar'" in str(info.value)
    assert unpack_fixed_frame(reader) == GAZETTE_FRAME
    with pytest.raises(DesyncDetected) as info:
        unpack_fixed_frame(reader)
    assert info.value.skipped == b"xyz"
    assert unpack_fixed_frame(reader) == GAZETTE_FRAME
    assert unpack_fixed_frame(reader) == b""


@pytest.mark.parametrize("cut", range(1, len(GAZETTE_FRAME)))
@pytest.mark.parametrize("kind", range(4))
def test_unpack_truncated_frame_raises(kind: int, cut: int) -> None:
    reader = readers(GAZETTE_FRAME[:cut])[kind]
    with pytest.raises(TruncatedFrame) as info:
        unpack_fixed_frame(reader)
    assert isinstance(info.value, FramingError)
    assert info.value.data == GAZETTE_FRAME[:cut]
    assert "data ends" in str(info.value)


def _garbage(n: int) -> bytes:
    """n bytes of garbage with partial magic words in it, but never the whole word."""
    pattern = b"\x66\x33\x93\x00\x66\x66\x33\x36\x93\x36\x66\x33"
    return (pattern * (n // len(pattern) + 1))[:n]


@pytest.mark.parametrize("length", range(0, 40))
def test_unpack_desync_at_every_garbage_length(length: int) -> None:
    garbage = _garbage(length)
    assert MAGIC not in garbage
    data = garbage + GAZETTE_FRAME + encode_fixed_frame(b"second")
    for reader in readers(data)[:3]:  # seekable readers resynchronise exactly
        expected: list[bytes | tuple[str, bytes]] = [("desync", garbage)] if garbage else []
        assert unpack_all(reader) == [*expected, GAZETTE_FRAME, encode_fixed_frame(b"second")]


@settings(max_examples=150, deadline=None)
@given(
    parts=st.lists(
        st.one_of(
            st.binary(max_size=40).map(encode_fixed_frame),
            st.binary(min_size=1, max_size=12),
            st.sampled_from([MAGIC[:1], MAGIC[:2], MAGIC[:3], b"\n"]),
        ),
        max_size=8,
    ),
    buffer_size=st.integers(min_value=1, max_value=64),
    step=st.integers(min_value=1, max_value=64),
)
def test_unpack_never_loses_bytes(parts: list[bytes], buffer_size: int, step: int) -> None:
    """Every byte comes back in a frame, a skipped range or a truncated tail, in order."""
    data = b"".join(parts)
    for reader in [
        io.BytesIO(data),
        io.BufferedReader(io.BytesIO(data), buffer_size=buffer_size),
        io.BufferedReader(_Pipe(data, step), buffer_size=buffer_size),
    ]:
        seen: list[bytes] = []
        while True:
            try:
                frame = unpack_fixed_frame(reader)
            except DesyncDetected as exc:
                assert exc.skipped
                seen.append(exc.skipped)
                continue
            except TruncatedFrame as exc:
                seen.append(exc.data)
                continue
            if not frame:
                break
            assert frame[:4] == MAGIC
            assert len(frame) == 8 + int.from_bytes(frame[4:8], "little")
            seen.append(frame)
        joined = b"".join(seen)
        assert joined == data or joined + b"\n" == data  # a lone trailing newline is dropped


def test_unpack_rejects_a_reader_it_cannot_look_ahead_in() -> None:
    with pytest.raises(TypeError, match="seekable reader or one with peek"):
        unpack_fixed_frame(_Pipe(GAZETTE_FRAME))  # type: ignore[arg-type]


# --- batch decoding --------------------------------------------------------------------------


def test_decode_protobuf_frames_into_envelopes() -> None:
    messages = [event(i, Flags.CONTINUE_TXN if i % 2 else Flags.OUTSIDE_TXN) for i in range(5)]
    frames = [FRAMING.marshal(m) for m in messages]
    data = b"".join(frames)
    result = FRAMING.decode(
        data + frames[0][:5], journal="logs/p", base=1000,
        new_message=ProtoMessage.factory(event_class()),
    )
    assert result.consumed == len(data)
    assert result.next_offset == 1000 + len(data)
    assert [e.message for e in result.envelopes] == messages
    begin = 1000
    for env, frame, msg in zip(result.envelopes, frames, messages):
        assert (env.journal, env.begin, env.end) == ("logs/p", begin, begin + len(frame))
        assert env.uuid == uuid.UUID(msg.proto.uuid)
        assert env.flags == (Flags.CONTINUE_TXN if msg.proto.seq % 2 else Flags.OUTSIDE_TXN)
        begin += len(frame)


def test_decode_needs_a_message_factory() -> None:
    with pytest.raises(TypeError, match=r"ProtoMessage\.factory"):
        FRAMING.decode(GAZETTE_FRAME, journal="logs/p")
    framing = FixedFraming(new_message=RawPayload)
    result = framing.decode(GAZETTE_FRAME, journal="logs/p", final=True)
    assert result.envelopes[0].message == RawPayload(TEST_CONTENT)
    assert result.envelopes[0].uuid == NIL_UUID
    assert result.envelopes[0].clock == 0


def test_raw_payload_cannot_take_a_uuid() -> None:
    with pytest.raises(TypeError, match="no UUID field"):
        RawPayload(b"x").set_uuid(NIL_UUID)
    with pytest.raises(TypeError, match="cannot acknowledge"):
        RawPayload(b"x").new_acknowledgement("logs/p")


def test_decode_leaves_partial_frames_and_truncates_at_the_end() -> None:
    frame = encode_fixed_frame(b"payload")
    for cut in range(1, len(frame)):
        data = frame + frame[:cut]
        result = FRAMING.decode(data, journal="logs/p", base=10, new_message=RawPayload)
        assert (result.consumed, result.next_offset) == (len(frame), 10 + len(frame))
        with pytest.raises(TruncatedFrame) as info:
            FRAMING.decode(data, journal="logs/p", base=10, final=True, new_message=RawPayload)
        err = info.value
        assert (err.begin, err.end) == (10 + len(frame), 10 + len(data))
        assert err.data == frame[:cut]
        assert [e.message for e in err.envelopes] == [RawPayload(b"payload")]
        assert str(err).startswith(f"journal logs/p: truncated fixed frame at offset {err.begin}-")


def test_decode_desync_inside_a_buffer_reports_and_resumes() -> None:
    one, two = encode_fixed_frame(b"one"), encode_fixed_frame(b"two")
    data = one + b"junk!" + two
    with pytest.raises(DesyncDetected) as info:
        FRAMING.decode(data, journal="logs/p", base=100, final=True, new_message=RawPayload)
    err = info.value
    assert (err.begin, err.end, err.skipped) == (100 + len(one), 105 + len(one), b"junk!")
    assert [e.message for e in err.envelopes] == [RawPayload(b"one")]
    assert f"journal logs/p: fixed-frame desync at offset {err.begin}-{err.end}" in str(err)
    rest = data[err.end - 100 :]
    result = FRAMING.decode(rest, journal="logs/p", base=err.end, final=True,
                            new_message=RawPayload)
    assert [(e.begin, e.message) for e in result.envelopes] == [(err.end, RawPayload(b"two"))]


@pytest.mark.parametrize("length", range(0, 30))
def test_decode_desync_at_every_garbage_length(length: int) -> None:
    garbage = _garbage(length)
    frame = encode_fixed_frame(b"after garbage")
    envelopes, bad = decode_one_shot(FRAMING, garbage + frame, new_message=RawPayload)
    assert bad == ([("DesyncDetected", 0, length, garbage)] if length else [])
    assert [(e.begin, e.end, e.message) for e in envelopes] == [
        (length, length + len(frame), RawPayload(b"after garbage"))
    ]


def test_decode_trailing_garbage_and_trailing_partial_magic() -> None:
    frame = encode_fixed_frame(b"x")
    _, bad = decode_chunks(FRAMING, [frame + b"zz\x66\x33"], new_message=RawPayload)
    # The garbage is skipped; what may begin a frame is reported as a truncated frame.
    assert bad == [
        ("DesyncDetected", len(frame), len(frame) + 2, b"zz"),
        ("TruncatedFrame", len(frame) + 2, len(frame) + 4, b"\x66\x33"),
    ]
    with pytest.raises(DesyncDetected) as info:
        FRAMING.decode(frame + b"zz\x66\x33", journal="logs/p", final=True,
                       new_message=RawPayload)
    assert (info.value.skipped, info.value.end) == (b"zz", len(frame) + 2)
    reader = io.BytesIO(frame + b"zz\x66\x33")
    assert unpack_fixed_frame(reader) == frame
    with pytest.raises(DesyncDetected, match="skipped 2 bytes"):
        unpack_fixed_frame(reader)
    with pytest.raises(TruncatedFrame):
        unpack_fixed_frame(reader)
    assert unpack_fixed_frame(reader) == b""
    _, bad = decode_chunks(FRAMING, [frame + b"\x66\x33"], new_message=RawPayload)
    assert bad == [("TruncatedFrame", len(frame), len(frame) + 2, b"\x66\x33")]
    envelopes, bad = decode_chunks(FRAMING, [frame + b"\n"], new_message=RawPayload)
    assert bad == [] and len(envelopes) == 1  # Gazette's tolerated trailing newline


def test_decode_malformed_protobuf_payload() -> None:
    good = FRAMING.marshal(event(1))
    bad = encode_fixed_frame(b"\xff\xff\xff\xff")
    factory = ProtoMessage.factory(event_class())
    with pytest.raises(MalformedFrame) as info:
        FRAMING.decode(good + bad + good, journal="logs/p", base=5, new_message=factory)
    err = info.value
    assert (err.begin, err.end, err.data) == (5 + len(good), 5 + len(good) + len(bad), bad)
    assert [e.message for e in err.envelopes] == [event(1)]
    assert str(err).startswith(
        f"journal logs/p: malformed protobuf frame at offset {err.begin}-{err.end}: DecodeError"
    )
    envelopes, ranges = decode_chunks(FRAMING, [good + bad + good], new_message=factory)
    assert [e.message for e in envelopes] == [event(1), event(1)]
    assert [r[0] for r in ranges] == ["MalformedFrame"]


def test_uuid_parsing_is_left_to_the_envelope() -> None:
    cls = event_class()
    frame = FRAMING.marshal(cls(uuid="not-a-uuid", seq=1))
    result = FRAMING.decode(frame, journal="logs/p", new_message=ProtoMessage.factory(cls))
    (env,) = result.envelopes
    assert env.message.proto.seq == 1
    with pytest.raises(ValueError, match="not a UUID"):
        env.clock


frames_strategy = st.lists(st.binary(max_size=60), max_size=12)


@settings(max_examples=200, deadline=None)
@given(payloads=frames_strategy, base=st.integers(min_value=0, max_value=1 << 40))
def test_round_trip_arbitrary_payloads(payloads: list[bytes], base: int) -> None:
    data = b"".join(FRAMING.marshal(p) for p in payloads)
    result = FRAMING.decode(data, journal="logs/p", base=base, final=True,
                            new_message=RawPayload)
    assert [e.message.payload for e in result.envelopes] == payloads
    assert result.consumed == len(data)
    offsets = [base, *(e.end for e in result.envelopes)]
    assert [e.begin for e in result.envelopes] == offsets[:-1]
    assert offsets[-1] == base + len(data)


@settings(max_examples=100, deadline=None)
@given(
    seqs=st.lists(st.integers(min_value=0, max_value=1 << 40), min_size=1, max_size=6),
    uuids=st.lists(st.uuids(), min_size=6, max_size=6),
)
def test_round_trip_protobuf_messages(seqs: list[int], uuids: list[uuid.UUID]) -> None:
    cls = event_class()
    messages = [ProtoMessage(cls(uuid=str(u), seq=s, blob=s.to_bytes(6, "big")))
                for s, u in zip(seqs, uuids)]
    data = b"".join(FRAMING.marshal(m) for m in messages)
    result = FRAMING.decode(data, journal="logs/p", final=True,
                            new_message=ProtoMessage.factory(cls))
    assert [e.message for e in result.envelopes] == messages
    assert [e.uuid for e in result.envelopes] == uuids[: len(seqs)]


def test_split_at_every_boundary_matches_one_shot() -> None:
    data = (
        b"".join(encode_fixed_frame(bytes([i]) * i) for i in range(6))
        + b"garbage\x66\x33"
        + encode_fixed_frame(b"after")
        + encode_fixed_frame(MAGIC * 2)  # a payload holding magic words is still one frame
        + b"\x00\x66\x33\x93"
    )
    expected = decode_one_shot(FRAMING, data, new_message=RawPayload)
    assert len(expected[0]) == 8
    assert [(name, skipped) for name, _, _, skipped in expected[1]] == [
        ("DesyncDetected", b"garbage\x66\x33"),
        ("DesyncDetected", b"\x00"),
        ("TruncatedFrame", b"\x66\x33\x93"),
    ]
    for cut in range(len(data) + 1):
        assert decode_chunks(FRAMING, split_at(data, [cut]), new_message=RawPayload) == expected


@settings(max_examples=150, deadline=None)
@given(
    parts=st.lists(
        st.one_of(
            st.binary(max_size=30).map(encode_fixed_frame),
            st.binary(min_size=1, max_size=10).filter(lambda b: MAGIC not in b),
        ),
        max_size=10,
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_any_chunking_matches_one_shot(parts: list[bytes], cuts: list[int]) -> None:
    data = b"".join(parts)
    assert decode_chunks(FRAMING, split_at(data, cuts), new_message=RawPayload) == (
        decode_one_shot(FRAMING, data, new_message=RawPayload)
    )
