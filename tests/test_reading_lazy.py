"""Lazy reading: JSON lines kept as their bytes (JSONLine), sequenced from the UUID read out of
the line, parsed only when `doc` is used. It must deliver exactly what eager reading does."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from speedups_support import MODES, speedups_mode

from oncelog.framing import CONTENT_TYPE_CSV, CONTENT_TYPE_JSON_LINES, MalformedFrame
from oncelog.framing.jsonlines import JSONFraming
from oncelog.journal import JournalSpec
from oncelog.message import Flags, JSONLine, JSONMessage, build_uuid
from oncelog.reading import read_committed, read_uncommitted
from oncelog.sequencer import Sequencer

JSON = {"content-type": CONTENT_TYPE_JSON_LINES}
P1, P2 = bytes([1, 2, 3, 4, 5, 6]), bytes([7, 2, 3, 4, 5, 9])
BASE = 1 << 60


def u(producer: bytes, clock: int, flags: int) -> str:
    return str(build_uuid(producer, BASE + clock, flags))


# Lines of every shape: the UUID first, last, in the middle, repeated (the last one counts),
# spelled with a \u escape, upper case, nil, missing, non-canonical, nested, with spaces.
SHAPES = [
    lambda v: b'{"uuid":"%s","a":1}\n' % v,
    lambda v: b'{"a":1,"uuid":"%s"}\n' % v,
    lambda v: b'{"a":[1,{"b":2}],"uuid":"%s","c":"x"}\n' % v,
    lambda v: b'{"uuid":"%s"}\n' % v,
    lambda v: b'{"uuid":"00000000-0000-1000-8000-000000000000","uuid":"%s"}\n' % v,
    lambda v: b'{"uuid":"%s","uuid":"00000000-0000-1000-8000-000000000000"}\n' % v,
    lambda v: b'{"uuid":"%s","\\u0075uid":"00000000-0000-1000-8000-000000000000"}\n' % v,
    lambda v: b'{"uuid":"%s","s":"a \\"uuid\\" in a string"}\n' % v,
    lambda v: b'{"nested":{"uuid":"00000000-0000-1000-8000-000000000000"},"uuid":"%s"}\n' % v,
    lambda v: b'{ "uuid" : "%s" }\n' % v,
    lambda v: b'{"x":"\\\\u","uuid":"%s"}\n' % v,
    lambda v: b'{"uuid":"%s","t":"\\u00e9t\\u00e9"}\n' % v,
]


def shaped(shape: int, text: str, upper: bool) -> bytes:
    value = text.upper() if upper else text
    return SHAPES[shape](value.encode())


@st.composite
def histories(draw: st.DrawFn) -> list[bytes]:
    """Lines of two producers: committed messages, transactions, duplicates, rollbacks,
    nil UUIDs, all in random line shapes."""
    clocks = {P1: 0, P2: 0}
    lines: list[bytes] = []
    for _ in range(draw(st.integers(1, 40))):
        producer = draw(st.sampled_from([P1, P2]))
        kind = draw(st.sampled_from(["outside", "txn", "dup", "nil", "rollback"]))
        shape = draw(st.integers(0, len(SHAPES) - 1))
        upper = draw(st.booleans())
        if kind == "nil":
            lines.append(b'{"a":%d}\n' % len(lines))
            continue
        if kind == "dup" and clocks[producer]:
            text = u(producer, clocks[producer], Flags.OUTSIDE_TXN)
            lines.append(shaped(shape, text, upper))
            continue
        if kind in ("txn", "rollback"):
            for _ in range(draw(st.integers(1, 4))):
                clocks[producer] += 1
                text = u(producer, clocks[producer], Flags.CONTINUE_TXN)
                lines.append(shaped(draw(st.integers(0, len(SHAPES) - 1)), text, upper))
            ack_clock = clocks[producer] + 1 if kind == "txn" else 0
            clocks[producer] += 1
            text = u(producer, max(ack_clock, 0), Flags.ACK_TXN)
            lines.append(b'{"uuid":"%s"}\n' % text.encode())
            continue
        clocks[producer] += 1
        lines.append(shaped(shape, u(producer, clocks[producer], Flags.OUTSIDE_TXN), upper))
    return lines


def summary(envs: Any) -> list[tuple[int, int, Any, Any]]:
    return [(e.begin, e.end, e.message.doc, e.ids) for e in envs]


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])
@given(lines=histories())
def test_lazy_reads_deliver_what_eager_reads_do(memory_store: Any, mode: str, lines: Any) -> None:
    client = memory_store.open()
    name = f"lazy/{uuid.uuid4().hex}"
    client.create(JournalSpec(name, labels=JSON))
    client.append(name, b"".join(lines))
    with speedups_mode(mode):
        eager = summary(read_committed(client, name, include_acks=True))
        lazy_envs = list(read_committed(client, name, include_acks=True, lazy=True))
        assert all(type(e.message) is JSONLine for e in lazy_envs)
        assert summary(lazy_envs) == eager
        assert summary(read_uncommitted(client, name, lazy=True)) == summary(
            read_uncommitted(client, name)
        )
        # A ring of 2: transactions are replayed from the journal, lazily too.
        tiny = summary(read_committed(client, name, sequencer=Sequencer({name: 0}, buffer=2),
                                      include_acks=True, lazy=True))
        assert tiny == eager
    client.close()


@pytest.mark.parametrize("mode", MODES)
def test_lines_that_need_no_parse_are_not_parsed(journals: Any, mode: str) -> None:
    """UUID first (not repeated) or last: read from the line. Anything that could hide
    another UUID key, or a line in another shape, is parsed at once."""
    journals.create(JournalSpec("lazy/p", labels=JSON))
    text = u(P1, 1, Flags.OUTSIDE_TXN)
    lines = [shaped(i, u(P1, i + 1, Flags.OUTSIDE_TXN), False) for i in range(len(SHAPES))]
    journals.append("lazy/p", b"".join(lines))
    with speedups_mode(mode):
        envs = list(read_uncommitted(journals, "lazy/p", lazy=True))
    parsed = [e.message.parsed for e in envs]
    expected = {2, 6, 9, 11}  # in the middle; a \u escape key; spaces; a \u escape in a value
    assert parsed == [i in expected for i in range(len(SHAPES))]
    assert envs[0].message.get_uuid() == uuid.UUID(u(P1, 1, Flags.OUTSIDE_TXN))
    assert not envs[0].message.parsed  # get_uuid reads the line too
    assert envs[0].message.line == lines[0] and text in lines[0].decode()


def test_a_malformed_line_is_reported_when_used_naming_journal_and_offsets(journals: Any) -> None:
    journals.create(JournalSpec("lazy/bad", labels=JSON))
    good = b'{"a":1,"uuid":"%s"}\n' % u(P1, 1, Flags.OUTSIDE_TXN).encode()
    bad = b'{"a":,"uuid":"%s"}\n' % u(P1, 2, Flags.OUTSIDE_TXN).encode()
    journals.append("lazy/bad", good + bad)
    envs = list(read_committed(journals, "lazy/bad", lazy=True))
    assert [e.message.doc["a"] for e in envs[:1]] == [1]
    with pytest.raises(MalformedFrame) as info:
        envs[1].message.doc
    err = info.value
    assert (err.journal, err.begin, err.end) == ("lazy/bad", len(good), len(good) + len(bad))
    assert "lazy/bad" in str(err)
    # Eager reading reports the same line when it is read.
    with pytest.raises(MalformedFrame) as eager:
        list(read_committed(journals, "lazy/bad"))
    assert (eager.value.begin, eager.value.end) == (err.begin, err.end)
    assert str(eager.value) == str(err)  # word for word


def test_a_line_lazy_reading_cannot_take_unparsed_fails_as_eagerly(journals: Any) -> None:
    journals.create(JournalSpec("lazy/bad2", labels=JSON))
    journals.append("lazy/bad2", b'{"a":1}\n[1,2]\n')
    got: list[Any] = []
    with pytest.raises(MalformedFrame, match="must be an object") as info:
        got.extend(read_uncommitted(journals, "lazy/bad2", lazy=True))
    assert (info.value.begin, info.value.end) == (8, 14)
    assert [e.message.doc for e in got] == [{"a": 1}]  # the line before it is delivered


def test_lazy_options(journals: Any) -> None:
    journals.create(JournalSpec("lazy/csv", labels={"content-type": CONTENT_TYPE_CSV}))
    text = u(P1, 1, Flags.OUTSIDE_TXN)
    journals.append("lazy/csv", f"{text},a,b\n".encode())
    (env,) = read_committed(journals, "lazy/csv", lazy=True)  # other framings: unchanged
    assert env.message.fields == [text, "a", "b"]
    journals.create(JournalSpec("lazy/j", labels=JSON))
    with pytest.raises(ValueError, match="new_message"):
        list(read_committed(journals, "lazy/j", lazy=True, new_message=dict))


def test_json_line_behaves_as_a_message() -> None:
    text = u(P2, 5, Flags.CONTINUE_TXN)
    line = JSONLine(b'{"n":1,"uuid":"%s"}\n' % text.encode(), journal="j", begin=10)
    assert line.get_uuid() == uuid.UUID(text) and not line.parsed
    assert line == JSONMessage({"n": 1, "uuid": text}) == line
    assert line.parsed
    ack = line.new_acknowledgement("j")
    assert isinstance(ack, JSONMessage) and ack.doc == {}
    new = uuid.UUID(u(P2, 6, Flags.ACK_TXN))
    line.set_uuid(new)
    assert line.get_uuid() == new and orjson.loads(line.line) == {"n": 1, "uuid": str(new)}
    assert repr(line).startswith("JSONLine(")


@pytest.mark.parametrize("mode", MODES)
def test_other_uuid_fields_and_chunk_edges(mode: str) -> None:
    """A framing with another UUID field; decode stops at the last whole line."""
    framing = JSONFraming(uuid_field="id")
    text = u(P1, 3, Flags.OUTSIDE_TXN)
    first, second = b'{"id":"%s","v":1}\n' % text.encode(), b'{"v":2,"id":"%s"}\n' % text.encode()
    data = first + second + b'{"v":3,"id":'
    with speedups_mode(mode):
        result = framing.decode(data, journal="j", base=100, new_message=JSONLine)
    assert not any(e.message.parsed for e in result.envelopes)
    assert [e.message.doc["v"] for e in result.envelopes] == [1, 2]
    ends = [100 + len(first), 100 + len(first) + len(second)]
    assert [(e.begin, e.end) for e in result.envelopes] == [(100, ends[0]), (ends[0], ends[1])]
    assert [e.ids for e in result.envelopes] == [JSONMessage({"id": text}, "id").uuid_fields()] * 2
    assert result.consumed == len(first) + len(second)
