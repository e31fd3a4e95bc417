"""CSV framing: RFC 4180 quoting, records spanning lines, bad quoting, truncation."""

from __future__ import annotations

import csv
import io

import pytest
from framing_support import decode_chunks, decode_one_shot, split_at
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.framing import (
    CSVFraming,
    EncodeError,
    MalformedFrame,
    TruncatedFrame,
    for_content_type,
)
from oncelog.message import CSVRecord, Flags, build_uuid

FRAMING = CSVFraming()
PRODUCER = bytes([0x01, 2, 3, 4, 5, 6])

field_text = st.text(
    st.one_of(
        st.sampled_from([",", '"', "\r", "\n", " ", "a", "b"]),
        st.characters(blacklist_categories=["Cs"]),
    ),
    max_size=8,
)
records = st.lists(field_text, min_size=1, max_size=5)


def fields_of(data: bytes, **kwargs: object) -> list[list[str]]:
    return [e.message.fields for e in FRAMING.decode(data, journal="logs/c", **kwargs).envelopes]


def test_registered_under_text_csv() -> None:
    framing = for_content_type("text/csv")
    assert isinstance(framing, CSVFraming) and framing.content_type == "text/csv"


def test_marshal_quotes_as_rfc4180_asks_with_newline_line_ends() -> None:
    assert FRAMING.marshal(CSVRecord(["a", "b", ""])) == b"a,b,\n"
    assert FRAMING.marshal(["x,y", 'say "hi"', "two\nlines", "cr\rhere", "crlf\r\n"]) == (
        b'"x,y","say ""hi""","two\nlines","cr\rhere","crlf\r\n"\n'
    )
    assert FRAMING.marshal([""]) == b'""\n'  # a lone empty field is not a blank line
    assert FRAMING.marshal(("é", 1, None)) == "é,1,\n".encode()


def test_marshal_rejects_what_is_no_record() -> None:
    with pytest.raises(TypeError, match="CSVRecord or a list of fields"):
        FRAMING.marshal("a,b")
    with pytest.raises(EncodeError, match="at least one field"):
        FRAMING.marshal([])
    with pytest.raises(EncodeError, match="cannot encode record"):
        FRAMING.marshal(["\udcff"])


def test_decode_records_offsets_and_lazy_uuids() -> None:
    u = str(build_uuid(PRODUCER, 5 << 4, Flags.ACK_TXN))
    lines = [FRAMING.marshal([u, "plain", "1"]), FRAMING.marshal([u, "quoted,\nnewline", "2"])]
    data = b"".join(lines)
    result = FRAMING.decode(data + b"partial,li", journal="logs/c", base=40)
    assert (result.consumed, result.next_offset) == (len(data), 40 + len(data))
    assert [e.message for e in result.envelopes] == [
        CSVRecord([u, "plain", "1"]),
        CSVRecord([u, "quoted,\nnewline", "2"]),
    ]
    assert [(e.begin, e.end) for e in result.envelopes] == [
        (40, 40 + len(lines[0])),
        (40 + len(lines[0]), 40 + len(data)),
    ]
    assert result.envelopes[1].clock == 5 << 4 and result.envelopes[1].flags == Flags.ACK_TXN
    (bad,) = FRAMING.decode(b"nope,x\n", journal="logs/c").envelopes
    with pytest.raises(ValueError, match="not a UUID"):
        bad.clock  # UUIDs are parsed when asked for, not while decoding


def test_crlf_line_ends_blank_lines_and_non_ascii_offsets() -> None:
    data = "é,1\r\n\n\r\n\"q\r\nx\",2\r\nlast,3\n".encode()
    result = FRAMING.decode(data, journal="logs/c", final=True)
    assert [e.message.fields for e in result.envelopes] == [["é", "1"], ["q\r\nx", "2"],
                                                           ["last", "3"]]
    # Blank lines carry no record: the next record's frame starts after them.
    assert [(e.begin, e.end) for e in result.envelopes] == [(0, 6), (9, 19), (19, 26)]
    assert result.consumed == len(data)


def test_fast_path_agrees_with_csv_module() -> None:
    text = "".join(f"{i},a b,,c{i}, lead,trail \n" for i in range(50))
    assert fields_of(text.encode()) == list(csv.reader(io.StringIO(text)))
    # The same records beside one quoted record take the csv.reader path.
    quoted = text + '"q",1\n'
    assert fields_of(quoted.encode()) == list(csv.reader(io.StringIO(quoted)))


def test_message_factory_and_its_errors() -> None:
    data = b"a,1\nb,x\nc,3\n"
    assert fields_of(data, new_message=lambda f: CSVRecord(f[::-1])) == [
        ["1", "a"], ["x", "b"], ["3", "c"]
    ]

    def numeric(fields: list[str]) -> CSVRecord:
        int(fields[1])
        return CSVRecord(fields)

    for buf in (data, data + b'"quoted",4\n'):  # fast path and csv.reader path
        with pytest.raises(MalformedFrame) as info:
            FRAMING.decode(buf, journal="logs/c", base=100, new_message=numeric)
        err = info.value
        assert (err.begin, err.end, err.data) == (104, 108, b"b,x\n")
        assert [e.message.fields for e in err.envelopes] == [["a", "1"]]
        assert "CSV frame rejected by new_message at offset 104-108: ValueError" in str(err)


@pytest.mark.parametrize(
    "bad, reason",
    [
        (b'x,"quoted"tail,y\n', "bad CSV quoting: ',' expected after '\"'"),
        (b"lone\rcarriage,return\n", "new-line character seen in unquoted field"),
        (b'"spans\nlines"oops\n', "bad CSV quoting"),
        (b"caf\xe9,latin1\n", "invalid UTF-8"),
    ],
)
def test_malformed_record_names_journal_offsets_and_text(bad: bytes, reason: str) -> None:
    good = b"good,1\n"
    data = good + bad + good
    with pytest.raises(MalformedFrame) as info:
        FRAMING.decode(data, journal="logs/c", base=1000, final=True)
    err = info.value
    assert (err.begin, err.end, err.data) == (1007, 1007 + len(bad), bad)
    assert str(err).startswith(f"journal logs/c: malformed CSV frame at offset 1007-{err.end}: ")
    assert reason in str(err)
    assert [e.message.fields for e in err.envelopes] == [["good", "1"]]
    envelopes, ranges = decode_chunks(FRAMING, [data])
    assert [e.message.fields for e in envelopes] == [["good", "1"], ["good", "1"]]
    assert ranges == [("MalformedFrame", len(good), len(good) + len(bad), bad)]


def test_unterminated_quote_waits_then_truncates() -> None:
    data = b'a,1\n"open quote,\nstill open\n'
    result = FRAMING.decode(data, journal="logs/c", base=0)
    assert result.consumed == 4  # the open record may yet be closed by more data
    with pytest.raises(TruncatedFrame) as info:
        FRAMING.decode(data, journal="logs/c", base=0, final=True)
    assert (info.value.begin, info.value.end) == (4, len(data))
    assert "inside a quoted CSV field" in str(info.value)
    with pytest.raises(TruncatedFrame, match="no newline") as info:
        FRAMING.decode(b"a,1\nb,2", journal="logs/c", final=True)
    assert (info.value.begin, info.value.end, info.value.data) == (4, 7, b"b,2")


@settings(max_examples=150, deadline=None)
@given(recs=st.lists(records, max_size=8), base=st.integers(min_value=0, max_value=1 << 40))
def test_round_trip_arbitrary_fields(recs: list[list[str]], base: int) -> None:
    lines = [FRAMING.marshal(r) for r in recs]
    data = b"".join(lines)
    result = FRAMING.decode(data, journal="logs/c", base=base, final=True)
    assert [e.message.fields for e in result.envelopes] == recs
    assert [e.end - e.begin for e in result.envelopes] == [len(line) for line in lines]
    assert result.next_offset == base + len(data)


def test_split_at_every_boundary_matches_one_shot() -> None:
    data = (
        FRAMING.marshal(["plain", "1"])
        + FRAMING.marshal(["multi\nline", 'with "quotes"', "é"])
        + b'bad,"quo"te\n'
        + b"\n"
        + FRAMING.marshal(["", "crlf\r\nin field"])
        + b'"unterminated\n'
    )
    expected = decode_one_shot(FRAMING, data)
    assert len(expected[0]) == 3
    assert [r[0] for r in expected[1]] == ["MalformedFrame", "TruncatedFrame"]
    for cut in range(len(data) + 1):
        assert decode_chunks(FRAMING, split_at(data, [cut])) == expected
    assert decode_chunks(FRAMING, [data[i : i + 1] for i in range(len(data))]) == expected


@settings(max_examples=100, deadline=None)
@given(
    recs=st.lists(records, max_size=6),
    cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=6),
)
def test_any_chunking_matches_one_shot(recs: list[list[str]], cuts: list[int]) -> None:
    data = b"".join(FRAMING.marshal(r) for r in recs)
    assert decode_chunks(FRAMING, split_at(data, cuts)) == decode_one_shot(FRAMING, data)
