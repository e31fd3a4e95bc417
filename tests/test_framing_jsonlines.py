"""JSON lines framing: marshal, batch decode, bad lines, truncation, unpack_line."""

from __future__ import annotations

import io
from typing import Any

import orjson
import pytest
from framing_support import decode_chunks, decode_one_shot, split_at
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.framing import (
    EncodeError,
    FramingError,
    JSONFraming,
    MalformedFrame,
    TruncatedFrame,
    for_content_type,
    unpack_line,
)
from oncelog.message import Flags, JSONMessage, build_uuid

FRAMING = JSONFraming()
PRODUCER = bytes([0x01, 2, 3, 4, 5, 6])

text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=12)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(text, children, max_size=4),
    max_leaves=8,
)
documents = st.dictionaries(text, json_values, max_size=5)


def doc(seq: int, flags: int = Flags.OUTSIDE_TXN) -> dict[str, Any]:
    return {"uuid": str(build_uuid(PRODUCER, (seq + 1) << 4, flags)), "seq": seq, "text": "é\n,\""}


def test_registered_under_ndjson() -> None:
    framing = for_content_type("application/x-ndjson")
    assert isinstance(framing, JSONFraming)
    assert framing.content_type == "application/x-ndjson"


def test_marshal_is_one_compact_line() -> None:
    document = {"uuid": "", "a": [1, 2.5, None], "s": "line\nbreak \u2028 é"}
    line = FRAMING.marshal(JSONMessage(document))
    assert line == orjson.dumps(document) + b"\n"
    assert line.count(b"\n") == 1
    assert FRAMING.marshal(document) == line


def test_marshal_rejects_what_is_not_one_json_object_line() -> None:
    with pytest.raises(TypeError, match="JSONMessage or a dict"):
        FRAMING.marshal([1, 2])
    with pytest.raises(EncodeError, match="must be an object"):
        FRAMING.marshal(JSONMessage([1, 2]))  # type: ignore[arg-type]
    with pytest.raises(EncodeError, match="cannot encode document as JSON"):
        FRAMING.marshal({"n": 1 << 70})
    with pytest.raises(EncodeError, match="raw newline"):
        FRAMING.marshal({"raw": orjson.Fragment(b'"a"\n')})


def test_decode_envelopes_offsets_and_lazy_uuids() -> None:
    docs = [doc(i, Flags.CONTINUE_TXN) for i in range(4)] + [{"uuid": "not a uuid"}]
    lines = [FRAMING.marshal(d) for d in docs]
    data = b"".join(lines)
    result = FRAMING.decode(data + b'{"partial', journal="logs/j", base=500)
    assert (result.consumed, result.next_offset) == (len(data), 500 + len(data))
    assert [e.message for e in result.envelopes] == [JSONMessage(d) for d in docs]
    begin = 500
    for env, line in zip(result.envelopes, lines):
        assert (env.journal, env.begin, env.end) == ("logs/j", begin, begin + len(line))
        begin += len(line)
    assert [e.clock for e in result.envelopes[:4]] == [(i + 1) << 4 for i in range(4)]
    assert result.envelopes[0].flags == Flags.CONTINUE_TXN
    with pytest.raises(ValueError, match="not a UUID"):
        result.envelopes[4].clock  # parsed only when asked for


def test_decode_accepts_bytearray_and_memoryview_and_crlf() -> None:
    data = b'{"uuid":"","a":1}\r\n{"uuid":"","a":2}\n{"a":\r3}\n'
    for buf in (data, bytearray(data), memoryview(data)):
        result = FRAMING.decode(buf, journal="logs/j", final=True)
        assert [e.message.doc["a"] for e in result.envelopes] == [1, 2, 3]
        assert [(e.begin, e.end) for e in result.envelopes] == [(0, 19), (19, 37), (37, 46)]


def test_uuid_field_and_message_factory() -> None:
    data = b'{"id":"x","v":1}\n'
    framing = JSONFraming(uuid_field="id")
    (env,) = framing.decode(data, journal="logs/j").envelopes
    assert env.message.uuid_field == "id" and env.message.doc == {"id": "x", "v": 1}

    made: list[dict[str, Any]] = []

    def factory(document: dict[str, Any]) -> JSONMessage:
        made.append(document)
        return JSONMessage(document, "id")

    (env,) = FRAMING.decode(data, journal="logs/j", new_message=factory).envelopes
    assert made == [{"id": "x", "v": 1}] and env.message.uuid_field == "id"


def test_factory_errors_are_malformed_frames() -> None:
    def picky(document: dict[str, Any]) -> JSONMessage:
        if "v" not in document:
            raise KeyError("v")
        return JSONMessage(document)

    data = b'{"v":1}\n{"w":2}\n{"v":3}\n'
    with pytest.raises(MalformedFrame) as info:
        FRAMING.decode(data, journal="logs/j", new_message=picky)
    err = info.value
    assert (err.begin, err.end, err.data) == (8, 16, b'{"w":2}\n')
    assert [e.message.doc for e in err.envelopes] == [{"v": 1}]
    assert "JSON frame rejected by new_message at offset 8-16: KeyError" in str(err)


def test_malformed_line_names_journal_offsets_reason_and_text() -> None:
    good = FRAMING.marshal(doc(1))
    data = good + b'{"uuid": oops}\n' + good
    with pytest.raises(MalformedFrame) as info:
        FRAMING.decode(data, journal="logs/a", base=1234, final=True)
    err = info.value
    begin = 1234 + len(good)
    assert (err.journal, err.begin, err.end) == ("logs/a", begin, begin + 15)
    assert err.data == b'{"uuid": oops}\n'
    assert str(err).startswith(
        f"journal logs/a: malformed JSON frame at offset {begin}-{begin + 15}: "
    )
    assert "unexpected character" in str(err) and "oops" in str(err)
    assert [e.message.doc for e in err.envelopes] == [doc(1)]
    assert isinstance(err, FramingError)
    # Skipping it loses only that line.
    envelopes, bad = decode_chunks(FRAMING, [data])
    assert [e.message.doc for e in envelopes] == [doc(1), doc(1)]
    assert bad == [("MalformedFrame", len(good), len(good) + 15, b'{"uuid": oops}\n')]


@pytest.mark.parametrize(
    "line, reason",
    [
        (b"\n", "input data is empty"),
        (b" \r\n", "input data is empty"),
        (b"[1,2]\n", "must be an object, not list"),
        (b'"text"\n', "must be an object, not str"),
        (b'{"a":1} {"b":2}\n', "unexpected content after document"),
        (b'{"a":"\xff"}\n', "UTF-8"),
    ],
)
def test_each_kind_of_bad_line(line: bytes, reason: str) -> None:
    with pytest.raises(MalformedFrame, match=reason) as info:
        FRAMING.decode(b'{"ok":1}\n' + line, journal="logs/a", base=0)
    assert (info.value.begin, info.value.end) == (9, 9 + len(line))


def test_truncated_final_line() -> None:
    data = FRAMING.marshal(doc(1)) + b'{"uuid":"x", "cut'
    result = FRAMING.decode(data, journal="logs/a", base=7)
    assert result.consumed == len(FRAMING.marshal(doc(1)))
    with pytest.raises(TruncatedFrame) as info:
        FRAMING.decode(data, journal="logs/a", base=7, final=True)
    err = info.value
    assert (err.begin, err.end) == (7 + result.consumed, 7 + len(data))
    assert err.data == b'{"uuid":"x", "cut'
    assert "no newline" in str(err) and str(err).startswith("journal logs/a: truncated JSON frame")
    assert [e.message.doc for e in err.envelopes] == [doc(1)]


@settings(max_examples=60, deadline=None)
@given(docs=st.lists(documents, max_size=8), base=st.integers(min_value=0, max_value=1 << 40))
def test_round_trip_arbitrary_documents(docs: list[dict[str, Any]], base: int) -> None:
    lines = [FRAMING.marshal(JSONMessage(d)) for d in docs]
    data = b"".join(lines)
    result = FRAMING.decode(data, journal="logs/j", base=base, final=True)
    decoded = [e.message.doc for e in result.envelopes]
    assert decoded == docs
    assert [e.end - e.begin for e in result.envelopes] == [len(line) for line in lines]
    assert result.next_offset == base + len(data)


def test_split_at_every_boundary_matches_one_shot() -> None:
    data = (
        b"".join(FRAMING.marshal(doc(i)) for i in range(3))
        + b"{not json}\n"
        + FRAMING.marshal({"uuid": "", "multi": "byte ☃ é"})
        + b'{"tail": 1'
    )
    expected = decode_one_shot(FRAMING, data)
    assert len(expected[0]) == 4
    assert [r[0] for r in expected[1]] == ["MalformedFrame", "TruncatedFrame"]
    for cut in range(len(data) + 1):
        assert decode_chunks(FRAMING, split_at(data, [cut])) == expected
    assert decode_chunks(FRAMING, [data[i : i + 1] for i in range(len(data))]) == expected


@settings(max_examples=60, deadline=None)
@given(
    docs=st.lists(documents, max_size=6),
    cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=6),
)
def test_any_chunking_matches_one_shot(docs: list[dict[str, Any]], cuts: list[int]) -> None:
    data = b"".join(FRAMING.marshal(d) for d in docs)
    assert decode_chunks(FRAMING, split_at(data, cuts)) == decode_one_shot(FRAMING, data)


@pytest.mark.parametrize("buffered", [False, True])
def test_unpack_line(buffered: bool) -> None:
    data = b'{"a":1}\n\n{"b":2}\npartial'
    reader: Any = io.BytesIO(data)
    if buffered:
        reader = io.BufferedReader(reader, buffer_size=4)
    assert unpack_line(reader) == b'{"a":1}\n'
    assert unpack_line(reader) == b"\n"
    assert unpack_line(reader) == b'{"b":2}\n'
    with pytest.raises(TruncatedFrame) as info:
        unpack_line(reader)
    assert info.value.data == b"partial"
    assert "7 bytes with no newline" in str(info.value)
    assert unpack_line(reader) == b""
    assert unpack_line(io.BytesIO(b"")) == b""
