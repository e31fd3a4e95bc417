"""read_committed to dicts on the C path: the lines of a chunk parsed by one orjson call
(`Decoder.decode_json_chunk`) and read a chunk at a time by `oncelog.reading._json_batches`.

Both are optimisations only: the envelopes (journal, offsets, documents, UUID fields), their
order, the errors (with journal and offsets) and the sequencer's checkpoint at every message
must be those of the reference, the pure-Python Sequencer over pure-Python
`read_uncommitted`, whatever the history: transactions, rollbacks, duplicates, nil UUIDs,
replays of transactions that left a small ring, malformed lines (`on_error` raise or skip),
lines that a joined parse could misread, lines longer than the chunks, a partial last line.
"""

from __future__ import annotations

import threading
import uuid
import weakref
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from speedups_support import BUILT, MODES, PURE_REQUESTED, speedups_mode

from oncelog.framing import CONTENT_TYPE_JSON_LINES, FrameDecodeError
from oncelog.identity import _FLAG_VALUES, _NIL_FIELDS, Envelope
from oncelog.journal import JournalSpec
from oncelog.message import Flags, JSONLine, JSONMessage, build_uuid
from oncelog.reading import (
    checkpoint_after_dequeued,
    read_committed,
    read_uncommitted,
    read_uncommitted_batches,
)
from oncelog.sequencer import Sequencer

JSON = {"content-type": CONTENT_TYPE_JSON_LINES}
PRODUCERS = [bytes([7, 2, 3, 4, 5, p]) for p in range(3)]
BASE = 1 << 60
needs_c = pytest.mark.skipif(PURE_REQUESTED, reason="ONCELOG_PURE_PYTHON is set")

# Lines that are not one JSON object each, several of which a parse of the lines joined
# into one array could misread as one object per line if it were not guarded (a value
# spread over lines, two values on one line, a string cut by a newline, arrays).
BAD_LINES = [
    b'{"a":{"b":1\n', b'{}}\n', b'{},{}\n', b'{} {}\n', b'{"s":"x\n', b'y"}\n',
    b'{"a":[{}\n', b'{}]}\n', b'{}],[{}\n', b"[1, 2]\n", b"not json\n", b"\n", b"{\n",
    b'{"a":1},\n', b'{"big":18446744073709551616}\n', b'{"u":"\xff"}\n', b"1\n",
    b'{"a":' * 1100 + b"1" + b"}" * 1100 + b"\n",
]


def u(producer: bytes, clock: int, flags: int, upper: bool = False) -> bytes:
    text = str(build_uuid(producer, BASE + clock, flags)).encode()
    return text.upper() if upper else text


def message(n: int, uid: bytes | None, shape: int) -> bytes:
    """A good line of one of several shapes: UUID first or last, nested objects, an array
    (its chunk is then parsed line by line), leading whitespace, CRLF, a nil UUID."""
    field = b"" if uid is None else b'"uuid":"%s",' % uid
    if shape == 0:
        return b'{%s"n":%d}\n' % (field, n)
    if shape == 1:
        return b'{"n":%d,"o":{"p":{"q":"}\\"{,"}},%s"z":null}\n' % (n, field)
    if shape == 2:
        return b'{%s"n":%d,"k":[1,{"a":2}]}\n' % (field, n)
    if shape == 3:
        return b' {%s"n":%d}\n' % (field, n)
    if shape == 4:
        return b'{%s"n":%d}\r\n' % (field, n)
    return b'{"uuid":null,"n":%d}\n' % n if uid is None else b'{"n":%d,"uuid":"%s"}\n' % (
        n, uid.upper()
    )


@st.composite
def histories(draw: st.DrawFn, bad: bool = True) -> list[bytes]:
    """Lines of three interleaved producers: committed messages, transactions (committed,
    rolled back, partly acknowledged, left open), duplicates, repeated ACKs, nil UUIDs,
    and (with `bad`) malformed lines."""
    clocks = dict.fromkeys(PRODUCERS, 0)
    sent: dict[bytes, list[bytes]] = {p: [] for p in PRODUCERS}
    lines: list[bytes] = []
    kinds = ["outside", "outside", "txn", "txn", "rollback", "partial", "dup", "nil", "reack"]
    for _ in range(draw(st.integers(1, 40))):
        p = draw(st.sampled_from(PRODUCERS))
        kind = draw(st.sampled_from(kinds + (["bad"] if bad else [])))
        shape = draw(st.integers(0, 5))
        if kind == "bad":
            lines.append(draw(st.sampled_from(BAD_LINES)))
        elif kind == "nil":
            lines.append(message(len(lines), None, shape))
        elif kind == "dup" and sent[p]:
            lines.append(draw(st.sampled_from(sent[p])))
        elif kind == "reack" and clocks[p]:
            lines.append(b'{"uuid":"%s"}\n' % u(p, clocks[p], Flags.ACK_TXN))
        elif kind in ("txn", "rollback", "partial"):
            first = clocks[p]
            for _ in range(draw(st.integers(1, 5))):
                clocks[p] += 1
                frame = message(len(lines), u(p, clocks[p], Flags.CONTINUE_TXN), shape)
                lines.append(frame)
                sent[p].append(frame)
            if kind == "txn":
                clocks[p] += 1
                lines.append(b'{"uuid":"%s"}\n' % u(p, clocks[p], Flags.ACK_TXN, shape == 5))
            elif kind == "rollback":
                lines.append(b'{"uuid":"%s"}\n' % u(p, first, Flags.ACK_TXN))
            else:  # an ACK of the transaction's first message only
                lines.append(b'{"uuid":"%s"}\n' % u(p, first + 1, Flags.ACK_TXN))
        else:
            clocks[p] += 1
            frame = message(len(lines), u(p, clocks[p], Flags.OUTSIDE_TXN), shape)
            lines.append(frame)
            sent[p].append(frame)
    return lines


def new_journal(store: Any, lines: list[bytes], cuts: list[int], tail: bytes = b"") -> tuple[
    Any, str
]:
    """A journal of `lines`, appended in pieces cut at `cuts` (several fragments), then `tail`."""
    client = store.open()
    name = f"dicts/{uuid.uuid4().hex}"
    client.create(JournalSpec(name, labels=JSON))
    bounds = [0, *sorted(set(cuts)), len(lines)]
    for a, b in zip(bounds, bounds[1:]):
        if a < b:
            client.append(name, b"".join(lines[a:b]))
    if tail:
        client.append(name, tail)
    return client, name


Row = tuple[Any, ...]


def row(env: Envelope, sequencer: Sequencer) -> Row:
    msg = env.message
    assert type(msg) is JSONMessage
    return (
        env.journal, env.begin, env.end, msg.doc, msg.uuid_field, env.ids,
        checkpoint_after_dequeued(sequencer),
    )


def collect(rows: Any, sequencer: Sequencer) -> tuple[list[Row], Any]:
    """Every envelope (with the checkpoint at it), then the error that ended reading."""
    out: list[Row] = []
    try:
        for env in rows:
            out.append(row(env, sequencer))
    except FrameDecodeError as exc:
        return out, (type(exc), exc.journal, exc.begin, exc.end, bytes(exc.data or b""))
    return out, None


def reference(
    client: Any, name: str, buffer: int, on_error: Any, acks: bool
) -> tuple[list[Row], Any, Any]:
    """The pure-Python Sequencer over pure-Python read_uncommitted, replays included."""
    with speedups_mode("pure"):
        sequencer = Sequencer(offsets={name: 0}, buffer=buffer)

        def replay(journal: str, begin: int, end: int) -> Any:
            return read_uncommitted(client, journal, begin, end=end, on_error=on_error,
                                    exact=True)

        rows, error = collect(
            sequencer.sequence(read_uncommitted(client, name, on_error=on_error), replay,
                               acks=acks),
            sequencer,
        )
        return rows, error, sequencer.checkpoint()


def subject(
    client: Any, name: str, mode: str, buffer: int, on_error: Any, acks: bool,
    chunk_size: int | None,
) -> tuple[list[Row], Any, Any]:
    with speedups_mode(mode):
        sequencer = Sequencer(offsets={name: 0}, buffer=buffer)
        rows, error = collect(
            read_committed(client, name, sequencer=sequencer, on_error=on_error,
                           include_acks=acks, chunk_size=chunk_size),
            sequencer,
        )
        return rows, error, sequencer.checkpoint()


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])
@given(lines=histories(), data=st.data())
def test_read_committed_gives_what_the_pure_reference_gives(
    memory_store: Any, mode: str, lines: list[bytes], data: st.DataObject
) -> None:
    cuts = data.draw(st.lists(st.integers(1, max(1, len(lines) - 1)), max_size=4))
    tail = data.draw(st.sampled_from([b"", b"", b'{"uuid":"partial']))
    client, name = new_journal(memory_store, lines, cuts, tail)
    buffer = data.draw(st.sampled_from([2, 3, 5, 1024]))  # small rings replay transactions
    on_error = data.draw(st.sampled_from(["raise", "skip"]))
    acks = data.draw(st.booleans())
    chunk_size = data.draw(st.sampled_from([None, 16, 64, 200, 1 << 16]))
    expected = reference(client, name, buffer, on_error, acks)
    assert subject(client, name, mode, buffer, on_error, acks, chunk_size) == expected
    client.close()


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])
@given(lines=histories(), data=st.data())
def test_batches_are_cut_where_decode_batches_cuts_them(
    memory_store: Any, mode: str, lines: list[bytes], data: st.DataObject
) -> None:
    """read_uncommitted_batches: the same batches (so the same adaptive chunk sizes) with
    the C chunk loop as with decode_batches (the pure path), errors included."""
    cuts = data.draw(st.lists(st.integers(1, max(1, len(lines) - 1)), max_size=4))
    tail = data.draw(st.sampled_from([b"", b'{"uuid":"partial']))
    client, name = new_journal(memory_store, lines, cuts, tail)
    on_error = data.draw(st.sampled_from(["raise", "skip"]))
    chunk_size = data.draw(st.sampled_from([None, 8, 40, 100, 1 << 16]))

    def batches(m: str) -> tuple[list[list[tuple[int, int, Any, Any]]], Any]:
        out: list[list[tuple[int, int, Any, Any]]] = []
        with speedups_mode(m):
            try:
                for batch in read_uncommitted_batches(client, name, on_error=on_error,
                                                      chunk_size=chunk_size):
                    out.append([(e.begin, e.end, e.message.doc, e.ids) for e in batch])
            except FrameDecodeError as exc:
                return out, (type(exc), exc.begin, exc.end)
        return out, None

    assert batches(mode) == batches("pure")
    client.close()


def c_decoder(loads: Any) -> Any:
    """A C Decoder like oncelog._native's, parsing with `loads`."""
    assert BUILT is not None
    return BUILT.module.Decoder(Envelope, JSONMessage, loads, _FLAG_VALUES, _NIL_FIELDS, JSONLine)


def good_chunk(n: int, base_clock: int = 1) -> bytes:
    return b"".join(
        message(i, u(PRODUCERS[i % 3], base_clock + i, Flags.OUTSIDE_TXN), i % 2)
        for i in range(n)
    )


@needs_c
def test_a_chunk_of_objects_is_parsed_by_one_loads_call() -> None:
    calls: list[int] = []

    def loads(data: Any) -> Any:
        calls.append(len(data))
        return orjson.loads(data)

    decoder = c_decoder(loads)
    data = good_chunk(50) + b'{"uuid":"partial'
    cut = data.rfind(b"\n") + 1
    envelopes, done = decoder.decode_json_chunk(data, 100, "j", "uuid", len(data))
    assert len(calls) == 1 and done == cut
    assert (envelopes, done) == decoder.decode_json_lines(data, 100, "j", "uuid", len(data))
    assert [e.begin for e in envelopes][:2] == [100, envelopes[0].end]
    assert envelopes[-1].end == 100 + cut
    # Ineligible (an array in it): line by line, the same results.
    calls.clear()
    data = good_chunk(5) + message(5, u(PRODUCERS[0], 99, 0), 2) + good_chunk(3, 200)
    assert decoder.decode_json_chunk(data, 0, "j", "uuid", len(data)) == (
        decoder.decode_json_lines(data, 0, "j", "uuid", len(data))
    )
    assert len(calls) == 2 * 9  # each call decoded each line alone


@needs_c
@pytest.mark.parametrize("bad", BAD_LINES)
def test_a_chunk_with_a_bad_line_stops_where_line_by_line_decoding_stops(bad: bytes) -> None:
    decoder = c_decoder(orjson.loads)
    for data in (good_chunk(4) + bad + good_chunk(3, 50), bad + good_chunk(2), good_chunk(3) + bad):
        got = decoder.decode_json_chunk(data, 7, "j", "uuid", len(data))
        assert got == decoder.decode_json_lines(data, 7, "j", "uuid", len(data))


@needs_c
@pytest.mark.parametrize("lines", [
    [b'{"a":[{}\n', b"{}]}\n", b"{},{}\n"],  # joined: [{"a":[{},{}]},{},{}]
    [b'{"a":1\n', b'"b":2}\n', b"{},{}\n"],  # joined: [{"a":1,"b":2},{},{}]
    [b'{"a":[{}\n', b"{}]}\n"],  # joined: one object for two lines
    [b"{},{}\n", b"{}\n"],  # joined: three objects for two lines
])
def test_lines_that_make_objects_only_once_joined_are_not_taken_for_objects(
    lines: list[bytes],
) -> None:
    """Each of these chunks parses, joined into one array, to one object per line (or
    nearly); none of its lines is one object: the chunk stops at the first, as line by
    line decoding does, and reading reports it."""
    decoder = c_decoder(orjson.loads)
    for data in (b"".join(lines), good_chunk(3) + b"".join(lines) + good_chunk(2, 9)):
        envelopes, done = decoder.decode_json_chunk(data, 0, "j", "uuid", len(data))
        assert (envelopes, done) == decoder.decode_json_lines(data, 0, "j", "uuid", len(data))
        assert done == data.index(lines[0])


# Pieces of JSON-like text (no newlines of their own but one), from which random chunks are
# made: most are not one object per line, and some would parse as one array if joined.
PIECES = [b"{", b"}", b"[", b"]", b",", b":", b'"a"', b'"', b"1", b" ", b"\n", b"\\", b"{}",
          b'{"uuid":"%s"}' % u(PRODUCERS[0], 5, 0), b'"uuid":', b"null", b'"x\\"y"']


@needs_c
@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=40), st.integers(0, 3))
def test_any_chunk_decodes_as_line_by_line_decoding_does(pieces: list[bytes], base: int) -> None:
    """Random text, mostly invalid or ambiguous: decode_json_chunk parses the lines joined
    only where that is exact, else it is decode_json_lines; either way the same result."""
    decoder = c_decoder(orjson.loads)
    data = b"".join(pieces)
    for limit in (len(data), data.rfind(b"\n") + 1):
        got = decoder.decode_json_chunk(data, base, "j", "uuid", limit)
        assert got == decoder.decode_json_lines(data, base, "j", "uuid", limit)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_bad_line_after_fast_chunks_is_reported_with_its_offsets(
    memory_store: Any, mode: str, on_error: str
) -> None:
    """Fast chunks, then a chunk with a line that is not an object: decode_batches takes
    over from there, with the same error (journal, offsets) or the same skipping."""
    lines = [message(i, u(PRODUCERS[0], i + 1, 0), 0) for i in range(300)]
    lines[250] = b"[1, 2]\n"
    client, name = new_journal(memory_store, lines, [100, 200])
    bad_begin = sum(map(len, lines[:250]))
    with speedups_mode(mode):
        got: list[int] = []
        if on_error == "raise":
            with pytest.raises(FrameDecodeError) as info:
                for env in read_committed(client, name, chunk_size=512):
                    got.append(env.message.doc["n"])
            assert (info.value.journal, info.value.begin, info.value.end) == (
                name, bad_begin, bad_begin + 7
            )
            assert got == list(range(250))
        else:
            got = [e.message.doc["n"] for e in read_committed(client, name, on_error="skip",
                                                               chunk_size=512)]
            assert got == [n for n in range(300) if n != 250]
    client.close()


@pytest.mark.parametrize("mode", MODES)
def test_lines_longer_than_the_chunks_and_a_partial_last_line(
    memory_store: Any, mode: str
) -> None:
    lines = [message(i, u(PRODUCERS[1], i + 1, 0), 0) for i in range(20)]
    lines[7] = b'{"uuid":"%s","pad":"%s"}\n' % (u(PRODUCERS[1], 8, 0), b"x" * 5000)
    client, name = new_journal(memory_store, lines, [5, 8], tail=b'{"uuid":"cut')
    with speedups_mode(mode):
        got: list[int] = []
        with pytest.raises(FrameDecodeError) as info:
            for env in read_committed(client, name, chunk_size=64):
                got.append(env.end)
    ends = [sum(map(len, lines[: i + 1])) for i in range(20)]
    assert got == ends
    assert (info.value.begin, info.value.end) == (ends[-1], ends[-1] + 12)
    assert "truncated" in str(info.value) or "no newline" in str(info.value)
    client.close()


@pytest.mark.parametrize("mode", MODES)
def test_a_tailing_reader_gets_lines_appended_in_pieces(memory_store: Any, mode: str) -> None:
    """block=True: each message is delivered once its line is whole, a line split across
    two appends included; closing the reader ends the read."""
    client, name = new_journal(memory_store, [message(0, u(PRODUCERS[2], 1, 0), 0)], [])
    got: list[int] = []
    readers: list[Any] = []
    ready = threading.Semaphore(0)
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            with speedups_mode(mode):
                for env in read_committed(client, name, block=True, on_open=readers.append):
                    got.append(env.message.doc["n"])
                    ready.release()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
            ready.release()

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    try:
        assert ready.acquire(timeout=30) and got == [0]
        second = message(1, u(PRODUCERS[2], 2, 0), 0)
        client.append(name, second[:10])
        client.append(name, second[10:] + message(2, u(PRODUCERS[2], 3, 0), 0))
        assert ready.acquire(timeout=30) and ready.acquire(timeout=30)
        assert got == [0, 1, 2] and not errors
    finally:
        for reader in readers:
            reader.close()
        thread.join(timeout=30)
    assert not thread.is_alive()
    client.close()


class _Tracked(JSONMessage):
    """A message a weak reference can watch: freed when its envelope is."""

    __slots__ = ("__weakref__",)


def _tracked(journal: str, at: int, clock: int, flags: int) -> Envelope:
    doc = {"uuid": str(build_uuid(PRODUCERS[0], BASE + clock, flags))}
    return Envelope(journal, at, at + 1, _Tracked(doc))


def _deliver(seq: Sequencer, env: Envelope) -> int:
    """Queue `env` and step through what it commits; returns how many were delivered."""
    seq.queue_uncommitted(env)
    n = 0
    while seq.step() is not None:
        n += 1
    return n


@needs_c
def test_the_c_kernel_frees_a_small_transaction_soon_after_delivering_it() -> None:
    """Delivered envelopes of small transactions are freed one per envelope queued, a few
    queueings later while still in the CPU's caches, rather than a turn of the ring later
    when their slots are reused (the collector's pacing stays one free per allocation)."""
    with speedups_mode("c"):
        seq = Sequencer(offsets={"j": 0})
        at, clock = 0, 0
        watched = []
        for _ in range(3):
            clock += 1
            env = _tracked("j", at, clock, Flags.CONTINUE_TXN)
            watched.append(weakref.ref(env.message))
            assert _deliver(seq, env) == 0
            at += 1
        clock += 1
        assert _deliver(seq, _tracked("j", at, clock, Flags.ACK_TXN)) == 3 + 1  # and the ACK
        at += 1
        del env
        assert all(w() is not None for w in watched)  # still held by the kernel
        for _ in range(8):
            clock += 1
            assert _deliver(seq, _tracked("j", at, clock, Flags.OUTSIDE_TXN)) == 1
            at += 1
        assert [w() for w in watched] == [None, None, None]
        assert seq.checkpoint()[0] == {"j": at}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("txn", [1, 5, 300])
def test_no_delivered_envelope_outlives_a_turn_of_the_ring(mode: str, txn: int) -> None:
    """Whatever the transaction's size (above the C kernel's recent-delivery window, 256,
    its envelopes stay in their ring slots), each delivered envelope is freed within a turn
    of a fixed ring."""
    ring = 512
    with speedups_mode(mode):
        seq = Sequencer(offsets={"j": 0}, buffer=ring)
        at, clock = 0, 0
        watched = []
        for _ in range(txn):
            clock += 1
            env = _tracked("j", at, clock, Flags.CONTINUE_TXN)
            watched.append(weakref.ref(env.message))
            _deliver(seq, env)
            at += 1
        clock += 1
        assert _deliver(seq, _tracked("j", at, clock, Flags.ACK_TXN)) == txn + 1
        at += 1
        del env
        for _ in range(ring):
            clock += 1
            _deliver(seq, _tracked("j", at, clock, Flags.OUTSIDE_TXN))
            at += 1
        assert [w() for w in watched] == [None] * txn
