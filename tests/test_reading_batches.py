"""`read_committed_batches`: the committed messages of a JSON-lines journal as one buffer of
frames plus columns per chunk. Each batch must hold exactly what `read_committed` yields for
that stretch, in order, with the same offsets and UUID fields, whatever the history
(transactions, rollbacks, duplicates, several producers, chunks cut inside transactions,
replays, trimmed starts), on the C path and in pure Python alike."""

from __future__ import annotations

import random
import uuid
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from speedups_support import BUILT, MODES, speedups_mode

from oncelog import CommittedBatch, SequencerError, read_committed_batches
from oncelog.framing import CONTENT_TYPE_CSV, CONTENT_TYPE_JSON_LINES, MalformedFrame
from oncelog.journal import JournalSpec
from oncelog.message import Flags, build_uuid
from oncelog.reading import read_committed
from oncelog.sequencer import Sequencer
from oncelog.sequencing import columnar
from oncelog.sequencing.columnar import ColumnarState

JSON = {"content-type": CONTENT_TYPE_JSON_LINES}
PRODUCERS = [bytes([1, 2, 3, 4, 5, p]) for p in range(3)]
BASE = 1 << 60


def u(producer: bytes, clock: int, flags: int) -> bytes:
    return str(build_uuid(producer, BASE + clock, flags)).encode()


def line(n: int, uid: bytes, shape: int) -> bytes:
    """A message line with its UUID first, last, or parsed (neither: lazy reading parses)."""
    if shape == 0:
        return b'{"uuid":"%s","n":%d}\n' % (uid, n)
    if shape == 1:
        return b'{"n":%d,"pad":"%s","uuid":"%s"}\n' % (n, b"x" * (n % 7), uid)
    return b'{ "n" : %d, "uuid" : "%s", "k": [1, {"a": 2}] }\n' % (n, uid)


@st.composite
def histories(draw: st.DrawFn) -> list[bytes]:
    """Lines of three interleaved producers: committed messages, transactions (committed,
    rolled back, partly acknowledged, abandoned by an OUTSIDE message), duplicate frames of
    committed and pending messages, ACKs repeated, nil UUIDs."""
    clocks = dict.fromkeys(PRODUCERS, 0)
    sent: dict[bytes, list[bytes]] = {p: [] for p in PRODUCERS}
    lines: list[bytes] = []
    for _ in range(draw(st.integers(1, 30))):
        p = draw(st.sampled_from(PRODUCERS))
        kind = draw(st.sampled_from(
            ["outside", "txn", "txn", "rollback", "partial", "dup", "nil", "open", "reack"]
        ))
        shape = draw(st.integers(0, 2))
        if kind == "nil":
            lines.append(b'{"n":%d}\n' % len(lines))
        elif kind == "dup" and sent[p]:
            lines.append(draw(st.sampled_from(sent[p])))
        elif kind == "reack" and clocks[p]:
            lines.append(b'{"uuid":"%s"}\n' % u(p, clocks[p], Flags.ACK_TXN))
        elif kind in ("txn", "rollback", "partial", "open"):
            first = clocks[p]
            for _ in range(draw(st.integers(1, 4))):
                clocks[p] += 1
                frame = line(len(lines), u(p, clocks[p], Flags.CONTINUE_TXN), shape)
                lines.append(frame)
                sent[p].append(frame)
            if kind == "txn":
                clocks[p] += 1
                lines.append(b'{"uuid":"%s"}\n' % u(p, clocks[p], Flags.ACK_TXN))
            elif kind == "rollback":
                lines.append(b'{"uuid":"%s"}\n' % u(p, first, Flags.ACK_TXN))
            elif kind == "partial":  # an ACK of the transaction's first messages only
                lines.append(b'{"uuid":"%s"}\n' % u(p, first + 1, Flags.ACK_TXN))
        else:
            clocks[p] += 1
            frame = line(len(lines), u(p, clocks[p], Flags.OUTSIDE_TXN), shape)
            lines.append(frame)
            sent[p].append(frame)
    return lines


def reference(client: Any, name: str, **kw: Any) -> list[tuple[int, int, bytes, Any, Any]]:
    """read_committed's messages: offsets, frame bytes (lazy), UUID fields, document (eager)."""
    eager = list(read_committed(client, name, **kw))
    lazy = list(read_committed(client, name, lazy=True, **kw))
    assert [(e.begin, e.end) for e in lazy] == [(e.begin, e.end) for e in eager]
    return [
        (e.begin, e.end, lz.message.line, tuple(map(int, e.ids[1:])), e.message.doc)
        for e, lz in zip(eager, lazy)
    ]


def flattened(batches: list[CommittedBatch]) -> list[tuple[int, int, bytes, Any, Any]]:
    out = []
    for b in batches:
        assert isinstance(b.data, bytes) and len(b) > 0
        assert b.starts[0] == 0 and b.starts[len(b)] == len(b.data)
        frames = [bytes(f) for f in b.frames()]
        assert b"".join(frames) == b.data
        assert [bytes(b.frame(i)) for i in range(len(b))] == frames
        for i, (frame, doc) in enumerate(zip(frames, b.docs())):
            producer, clock, flags = b.ids(i)
            assert len(producer) == 6
            out.append((b.begins[i], b.ends[i], frame, (clock, flags), doc, producer))
    return [o[:5] for o in out]


def producers_of(batches: list[CommittedBatch]) -> list[bytes]:
    return [b.ids(i)[0] for b in batches for i in range(len(b))]


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])
@given(lines=histories(), data=st.data())
def test_batches_hold_exactly_what_read_committed_yields(
    memory_store: Any, mode: str, lines: list[bytes], data: st.DataObject
) -> None:
    client = memory_store.open()
    name = f"batches/{uuid.uuid4().hex}"
    client.create(JournalSpec(name, labels=JSON))
    # Several appends: several fragments, so that the start of the journal can be trimmed.
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(lines) - 1)), max_size=4)))
    bounds = [0, *cuts, len(lines)]
    for a, b in zip(bounds, bounds[1:]):
        if a < b:
            client.append(name, b"".join(lines[a:b]))
    if data.draw(st.booleans()) and len(client.fragments(name)) > 1:
        client.trim(name, before=client.fragments(name)[0].end)  # offsets stay the true ones
    chunk = data.draw(st.sampled_from([None, 40, 97, 256]))  # 40: below a line's size
    with speedups_mode(mode):
        for acks in (False, True):
            want = reference(client, name, include_acks=acks)
            got = list(read_committed_batches(client, name, include_acks=acks, chunk_size=chunk))
            assert flattened(got) == want
            # The envelope path alone (an on_error handler turns the fast path off): the
            # same batches, cut at the same chunks.
            slow = list(read_committed_batches(
                client, name, include_acks=acks, chunk_size=chunk, on_error=reraise
            ))
            assert [flattened([b]) for b in slow] == [flattened([b]) for b in got]
            ids = [e.ids[0] for e in read_committed(client, name, include_acks=acks)]
            assert producers_of(got) == ids
        # A ring of 2: transactions are replayed from the journal inside a batch.
        tiny = list(read_committed_batches(
            client, name, sequencer=Sequencer({name: client.first_offset(name)}, buffer=2),
            chunk_size=chunk,
        ))
        assert flattened(tiny) == reference(client, name)
    client.close()


def reraise(exc: Exception) -> None:
    raise exc


def history(n: int) -> bytes:
    """`n` messages of two producers, in transactions of 3 interleaved with single ones."""
    out, clocks = [], [0, 0]
    for i in range(n):
        p = i % 2
        clocks[p] += 1
        flags = Flags.CONTINUE_TXN if p == 0 else Flags.OUTSIDE_TXN
        out.append(line(i, u(PRODUCERS[p], clocks[p], flags), i % 3))
        if p == 0 and clocks[p] % 4 == 3:
            clocks[p] += 1
            out.append(b'{"uuid":"%s"}\n' % u(PRODUCERS[p], clocks[p], Flags.ACK_TXN))
    return b"".join(out)


@pytest.mark.parametrize("mode", MODES)
def test_each_batch_checkpoint_resumes_just_after_it(journals: Any, mode: str) -> None:
    name = "batches/checkpoints"
    journals.create(JournalSpec(name, labels=JSON))
    journals.append(name, history(60))
    with speedups_mode(mode):
        whole = flattened(list(read_committed_batches(journals, name, chunk_size=200)))
        assert len(whole) >= 40
        reader = read_committed_batches(journals, name, chunk_size=200)
        seen: list[Any] = []
        resumed_some = False
        for batch in reader:
            seen += flattened([batch])
            offsets, states = batch.checkpoint()
            rest = flattened(list(read_committed_batches(
                journals, name, offsets[name], sequencer=Sequencer(offsets, states),
                chunk_size=200,
            )))
            assert seen + rest == whole, f"resuming after offset {batch.ends[-1]}"
            resumed_some = resumed_some or bool(rest)
        assert seen == whole and resumed_some


def test_a_checkpoint_is_refused_once_the_reader_moved_on(journals: Any) -> None:
    name = "batches/stale"
    journals.create(JournalSpec(name, labels=JSON))
    journals.append(name, history(40))
    reader = read_committed_batches(journals, name, chunk_size=200)
    first = next(reader)
    first.checkpoint()
    second = next(reader)
    with pytest.raises(SequencerError, match=r"batches/stale.*after the next batch"):
        first.checkpoint()
    second.checkpoint()
    reader.close()
    with pytest.raises(SequencerError, match="batches/stale"):
        second.checkpoint()


def test_other_content_types_are_refused_naming_the_journal(journals: Any) -> None:
    journals.create(JournalSpec("batches/csv", labels={"content-type": CONTENT_TYPE_CSV}))
    with pytest.raises(ValueError, match=r"batches/csv.*text/csv"):
        next(read_committed_batches(journals, "batches/csv"))


@pytest.mark.parametrize("mode", MODES)
def test_a_malformed_frame_is_forwarded_and_docs_names_it(journals: Any, mode: str) -> None:
    name = "batches/malformed"
    journals.create(JournalSpec(name, labels=JSON))
    good = line(0, u(PRODUCERS[0], 1, Flags.OUTSIDE_TXN), 0)
    bad = b'{"n":,"uuid":"%s"}\n' % u(PRODUCERS[0], 2, Flags.OUTSIDE_TXN)  # UUID last: unparsed
    journals.append(name, good + bad)
    with speedups_mode(mode):
        (batch,) = read_committed_batches(journals, name)
        assert [bytes(f) for f in batch.frames()] == [good, bad]  # forwarded as it is
        with pytest.raises(MalformedFrame) as info:
            batch.docs()
    assert info.value.journal == name
    assert (info.value.begin, info.value.end) == (len(good), len(good) + len(bad))


def test_columns_are_flat_buffers_with_no_object_per_message(journals: Any) -> None:
    name = "batches/columns"
    journals.create(JournalSpec(name, labels=JSON))
    journals.append(name, history(10))
    (batch,) = read_committed_batches(journals, name)
    for column, fmt in ((batch.starts, "q"), (batch.begins, "q"), (batch.ends, "q"),
                        (batch.clocks, "Q"), (batch.flags, "i")):
        assert isinstance(column, memoryview) and column.format == fmt and column.readonly
    assert len(batch.producers) == 6 * len(batch)
    assert orjson.loads(batch.frame(0))["n"] == 1  # 0 opened a transaction: it commits later
    assert "batches/columns" in repr(batch)


def many_producers(n: int, seed: int) -> list[bytes]:
    """`n` messages of 16 interleaved producers (half in transactions of 3, some rolled back,
    some frames written twice): transactions are open at nearly every chunk's end."""
    rng = random.Random(seed)
    producers = [bytes([9, 8, 7, 6, 5, p]) for p in range(16)]
    clocks, acked, left = [1] * 16, [1] * 16, [0] * 16
    out: list[bytes] = []
    for i in range(n):
        p = rng.randrange(16)
        clocks[p] += 1
        if not left[p] and rng.random() < 0.2:
            left[p] = 3
        flags = Flags.CONTINUE_TXN if left[p] else Flags.OUTSIDE_TXN
        out.append(line(i, u(producers[p], clocks[p], flags), rng.randrange(2)))
        if rng.random() < 0.02:
            out.append(out[-1])
        if left[p]:
            left[p] -= 1
            if not left[p]:
                clocks[p] += 1
                ack = acked[p] if rng.random() < 0.1 else clocks[p]
                acked[p] = ack
                out.append(b'{"uuid":"%s"}\n' % u(producers[p], ack, Flags.ACK_TXN))
        else:
            acked[p] = clocks[p]
    return out


def counting_chunks(monkeypatch: Any) -> list[Any]:
    """Record every ColumnarState the reader makes (their `fast_chunks` count fast chunks)."""
    made: list[Any] = []
    real = ColumnarState.enter

    def enter(*args: Any) -> Any:
        state = real(*args)
        if state is not None:
            made.append(state)
        return state

    monkeypatch.setattr(ColumnarState, "enter", enter)
    return made


@pytest.mark.parametrize("mode", MODES)
def test_most_chunks_take_the_fast_path_and_give_the_same_batches(
    journals: Any, mode: str, monkeypatch: Any
) -> None:
    name = "batches/fast"
    journals.create(JournalSpec(name, labels=JSON))
    lines = many_producers(3000, seed=5)
    # One line that lazy reading parses (UUID in the middle), and a nil UUID: two chunks
    # that must go through envelopes, in the middle of open transactions.
    lines.insert(1000, line(10_000, u(PRODUCERS[0], 1, Flags.OUTSIDE_TXN), 2))
    lines.insert(2000, b'{"n":1}\n')
    journals.append(name, b"".join(lines))
    made = counting_chunks(monkeypatch)
    with speedups_mode(mode):
        for acks in (False, True):
            made.clear()
            got = list(read_committed_batches(journals, name, include_acks=acks, chunk_size=2048))
            fast = sum(s.fast_chunks for s in made)
            chunks = len(b"".join(lines)) // 2048
            assert fast >= chunks // 2, (fast, chunks)  # the fast path ran, most of the time
            assert len(made) >= 2  # and took over again after the envelope path
            assert flattened(got) == reference(journals, name, include_acks=acks)
            slow = list(read_committed_batches(
                journals, name, include_acks=acks, chunk_size=2048, on_error=reraise
            ))
            assert [flattened([b]) for b in slow] == [flattened([b]) for b in got]
        # Checkpoints taken on the fast path resume exactly, and say what the envelope
        # path's say.
        whole = flattened(got := list(read_committed_batches(journals, name, chunk_size=2048)))
        slow_points = [
            b.checkpoint() for b in read_committed_batches(
                journals, name, chunk_size=2048, on_error=reraise
            )
        ]
        seen: list[Any] = []
        for k, batch in enumerate(read_committed_batches(journals, name, chunk_size=2048)):
            seen += flattened([batch])
            offsets, states = batch.checkpoint()
            assert (offsets, states) == slow_points[k]
            if k % 7 == 3:
                rest = flattened(list(read_committed_batches(
                    journals, name, offsets[name], sequencer=Sequencer(offsets, states),
                    chunk_size=2048,
                )))
                assert seen + rest == whole, f"resuming after offset {batch.ends[-1]}"
        assert len(got) == len(slow_points)


@pytest.mark.parametrize("mode", MODES)
def test_a_sequencer_passed_in_ends_where_reading_did(journals: Any, mode: str) -> None:
    name = "batches/passed"
    journals.create(JournalSpec(name, labels=JSON))
    journals.append(name, b"".join(many_producers(800, seed=9)))
    with speedups_mode(mode):
        fast, slow = Sequencer({name: 0}), Sequencer({name: 0})
        a = list(read_committed_batches(journals, name, sequencer=fast, chunk_size=1024))
        b = list(read_committed_batches(
            journals, name, sequencer=slow, chunk_size=1024, on_error=reraise
        ))
        assert [flattened([x]) for x in a] == [flattened([x]) for x in b]
        assert fast.checkpoint() == slow.checkpoint()


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 12), st.integers(0, 3),
                             st.integers(0, 2)), min_size=1, max_size=40),
    cut=st.integers(0, 40), acks=st.booleans(), max_carry=st.sampled_from([0, 200, 1 << 20]),
)
def test_c_and_python_decide_a_chunk_alike(
    lines: list[tuple[int, int, int, int]], cut: int, acks: bool, max_carry: int
) -> None:
    if BUILT is None:
        pytest.skip("the C speed-ups are not built")  # pragma: no cover
    frames = [
        line(i, u(bytes([1, 1, 1, 1, 1, p]), clock, flags), shape)
        for i, (p, clock, flags, shape) in enumerate(lines)
    ]
    first, second = b"".join(frames[:cut]), b"".join(frames[cut:])
    state: tuple[bytes, bytes, bytes] = (b"", b"", b"")
    for data, base in ((first, 100), (second, 100 + len(first))):
        py = columnar.committed_columns(data, base, "uuid", *state, acks, max_carry)
        c = BUILT.module.committed_columns(data, base, "uuid", *state, acks, max_carry)
        assert py == c
        if py is None:
            return
        state = py[7:]
