"""The C speed-ups (`oncelog._speedups`) against the pure-Python path they replace.

Decoding and sequencing must give the same envelopes, the same parsed UUID fields,
the same errors at the same offsets, and leave a Sequencer in the same state at
every envelope yielded. The property tests of the sequencer and of reading run in
both modes as well (see speedups_support).
"""

from __future__ import annotations

import uuid

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from speedups_support import BUILT, PURE_REQUESTED, speedups_mode

from oncelog import _native
from oncelog.framing import FrameDecodeError, decode_stream
from oncelog.framing.jsonlines import JSONFraming
from oncelog.message import Envelope, Flags, JSONMessage, build_uuid, parse_uuid_fields
from oncelog.sequencer import Sequencer, SequencerError

# With ONCELOG_PURE_PYTHON set (a run of the whole suite on the pure-Python path), only
# the first test applies; the test command runs them all.
needs_c = pytest.mark.skipif(PURE_REQUESTED, reason="ONCELOG_PURE_PYTHON is set")


def test_extension_is_built_and_used():
    # The test command installs oncelog with a C compiler at hand: the fast path must be
    # there (a silently missing extension would leave only the slow path tested and used).
    if PURE_REQUESTED:
        assert _native.speedups is None
        return
    assert BUILT is not None
    env = JSONFraming().decode(b'{"uuid": "%s"}\n' % str(uuid.uuid1()).encode(), journal="j")
    assert env.envelopes[0]._ids is not None  # parsed while decoding: the C path ran


# --- UUID fields ---------------------------------------------------------------------------

producers = st.binary(min_size=6, max_size=6)
clocks = st.integers(1, (1 << 64) - 1)
flag_values = st.integers(0, 0x3FF)


@needs_c
@settings(max_examples=300)
@given(producer=producers, clock=clocks, flags=flag_values, upper=st.booleans())
def test_uuid_fields_match_python(producer, clock, flags, upper):
    text = str(build_uuid(producer, clock, flags))
    text = text.upper() if upper else text
    fields = BUILT.uuid_ids(text)
    assert fields == parse_uuid_fields(text)
    assert fields[2] is parse_uuid_fields(text)[2]  # Flags members where one matches


@pytest.mark.parametrize(
    "value",
    [
        "00000000-0000-1000-8000-00000000000g",  # not hex
        "00000000+0000-1000-8000-000000000000",  # a dash missing
        "{00000000-0000-1000-8000-0000000000}",
        "00000000-0000-1000-8000-0000000000000",  # too long
        "00000000-0000-1000-8000-00000000000",  # too short
        "00000000-0000-1000-8000-00000000000\u00e9",  # not ASCII
        12,
        b"0123456789abcdef",
    ],
)
@needs_c
def test_unusual_uuid_values_are_left_to_python(value):
    assert BUILT.uuid_ids(value) is None


@needs_c
def test_missing_uuid_is_nil():
    nil = BUILT.uuid_ids(None)
    assert nil == (bytes(6), 0, Flags.OUTSIDE_TXN) == BUILT.uuid_ids("")


# --- JSON lines decoding -------------------------------------------------------------------

uuid_texts = st.one_of(
    st.builds(lambda p, c, f: str(build_uuid(p, c, f)), producers, clocks, flag_values),
    st.builds(lambda p, c, f: str(build_uuid(p, c, f)).upper(), producers, clocks, flag_values),
    st.sampled_from(["", "not-a-uuid", "{12345678-1234-1234-1234-123456789abc}"]),
)
good_lines = st.builds(
    lambda u, n, drop: orjson.dumps({"n": n} if drop else {"uuid": u, "n": n}) + b"\n",
    uuid_texts, st.integers(-5, 5), st.booleans(),
)
odd_lines = st.sampled_from([
    b'{"uuid": null}\n',
    b'{"uuid": 7, "x": [1, {"y": 2}]}\n',
    b'{"uuid": "%s"}\r\n' % str(uuid.UUID(int=1 << 76)).encode(),
    b"[1, 2]\n",  # not an object
    b"17\n",
    b"{not json\n",
    b"\n",
    b'{"a": "\xff"}\n',  # not UTF-8
])
streams = st.lists(st.one_of(good_lines, good_lines, odd_lines), max_size=30)


def decode_all(data: bytes, chunk: int, field: str = "uuid") -> tuple[list[tuple], list[tuple]]:
    """Every envelope (with its parsed ids) and every skipped error of a stream of `data`."""
    errors: list[tuple] = []

    def on_error(exc: FrameDecodeError) -> None:
        errors.append((type(exc).__name__, exc.begin, exc.end, exc.data))

    chunks = [data[i : i + chunk] for i in range(0, len(data), chunk)] or [b""]
    out = []
    try:
        for env in decode_stream(JSONFraming(field), chunks, journal="j/x", offset=3,
                                 on_error=on_error):
            try:
                ids = env.ids
            except ValueError as exc:  # an unparseable UUID: the same error on both paths
                ids = str(exc)
            out.append((env.journal, env.begin, env.end, env.message.doc, ids))
    except FrameDecodeError as exc:  # a truncated final line is raised, not skipped
        errors.append(("raised", type(exc).__name__, exc.begin, exc.end))
    return out, errors


@needs_c
@settings(max_examples=300)
@given(
    lines=streams,
    tail=st.sampled_from([b"", b'{"uuid": "']),
    chunk=st.integers(1, 200),
    field=st.sampled_from(["uuid", "n"]),  # "n": an int where the UUID should be
)
def test_json_decoding_matches_python(lines, tail, chunk, field):
    data = b"".join(lines) + tail
    with speedups_mode("c"):
        fast = decode_all(data, chunk, field)
    with speedups_mode("pure"):
        slow = decode_all(data, chunk, field)
    assert fast == slow


@needs_c
def test_decoding_with_a_factory_takes_the_python_path():
    line = b'{"uuid": "%s"}\n' % str(uuid.uuid1()).encode()
    with speedups_mode("c"):
        result = JSONFraming(new_message=lambda d: JSONMessage(d)).decode(line, journal="j")
    assert result.envelopes[0]._ids is None  # parsed lazily, as in pure Python
    assert result.envelopes[0].clock == parse_uuid_fields(orjson.loads(line)["uuid"])[1]


@needs_c
def test_decoder_rejects_classes_without_slots():
    class Loose:
        pass

    Decoder = BUILT.module.Decoder
    with pytest.raises(TypeError, match="Loose.journal must be a slot"):
        Decoder(Loose, JSONMessage, orjson.loads, tuple(range(1024)), (b"", 0, 0))
    with pytest.raises(ValueError, match="1024"):
        Decoder(Envelope, JSONMessage, orjson.loads, (0,), (b"", 0, 0))


@needs_c
def test_decoder_builds_instances_through_their_attributes():
    # A decoder of other (slots) classes: it builds them through their own __new__ and
    # attribute descriptors, so it works with any layout, and a property with a setter
    # takes part like a slot.
    class Msg:
        __slots__ = ("doc", "_field")

        @property
        def uuid_field(self) -> str:
            return self._field

        @uuid_field.setter
        def uuid_field(self, value: str) -> None:
            self._field = value.upper()

    class Env:
        __slots__ = ("extra", "_ids", "message", "end", "begin", "journal")

    nil = (bytes(6), 0, 0)
    decoder = BUILT.module.Decoder(Env, Msg, orjson.loads, tuple(range(1024)), nil)
    text = str(build_uuid(P1, 77, 1))
    envs, done = decoder.decode_json_lines(b'{"uuid": "%s"}\n{}\n' % text.encode(), 5, "j",
                                           "uuid", -1)
    assert done == len(text) + 13 + 3
    assert [type(e) for e in envs] == [Env, Env]
    assert (envs[0].journal, envs[0].begin, envs[0].end) == ("j", 5, 5 + len(text) + 13)
    assert envs[1].begin is envs[0].end
    assert envs[0]._ids == (P1, 77, 1) and envs[1]._ids is nil
    assert envs[0].message.doc == {"uuid": text} and envs[0].message.uuid_field == "UUID"
    assert not hasattr(envs[0], "extra")  # nothing else is touched


@needs_c
def test_interleaved_producers_share_one_bytes_object_each():
    # Producer IDs handed out in sequence (one byte apart), interleaved: each keeps one
    # shared bytes object (no allocation, and an identity hit in the sequencer's producer
    # table), including two IDs that share a set of the cache.
    ids = [bytes([0x01, 0x5E, 0x9C, i, 0x00, 0x42]) for i in range(64)]
    lines = b"".join(b'{"uuid": "%s"}\n' % str(build_uuid(ids[k % 64], 1 + k, 0)).encode()
                     for k in range(640))
    envs, _ = BUILT.module.Decoder(
        Envelope, JSONMessage, orjson.loads, tuple(range(1024)), (b"", 0, 0)
    ).decode_json_chunk(lines, 0, "j", "uuid", -1)
    first: dict[bytes, bytes] = {}
    for env in envs:
        producer = env._ids[0]
        assert producer is first.setdefault(producer, producer)
    assert sorted(first) == sorted(ids)


@needs_c
def test_slots_are_written_where_their_own_class_lays_them_out():
    # Slot members are stored straight into the instance; that is valid only for members
    # of the instance's own layout. A subclass adding slots keeps its base's at their
    # offsets; a member descriptor borrowed from an unrelated class is left to its own
    # __set__, which rejects the instance (as setattr does) instead of writing at an offset
    # that means something else in this layout.
    class Base:
        __slots__ = ("journal", "begin", "end")

    class Env(Base):
        __slots__ = ("pad1", "pad2", "message", "_ids")

    class Other:
        __slots__ = ("a", "b", "c", "d", "e", "f", "g", "journal")

    class Borrowing:
        __slots__ = ("begin", "end", "message", "_ids")
        journal = Other.__dict__["journal"]

    nil = (bytes(6), 0, 0)
    line = b'{"uuid": "%s", "n": 1}\n' % str(build_uuid(P1, 9, 0)).encode()
    decoder = BUILT.module.Decoder(Env, JSONMessage, orjson.loads, tuple(range(1024)), nil)
    for decode in (decoder.decode_json_lines, decoder.decode_json_chunk):
        (env,), _ = decode(line * 1, 3, "j", "uuid", -1)
        assert type(env) is Env and not hasattr(env, "pad1") and not hasattr(env, "pad2")
        assert (env.journal, env.begin, env.end, env._ids) == ("j", 3, 3 + len(line), (P1, 9, 0))
        assert env.message.doc == {"uuid": str(build_uuid(P1, 9, 0)), "n": 1}
    borrowing = BUILT.module.Decoder(Borrowing, JSONMessage, orjson.loads, tuple(range(1024)),
                                     nil)
    with pytest.raises(TypeError, match="Other"):
        borrowing.decode_json_chunk(line, 0, "j", "uuid", -1)


@needs_c
def test_layout_and_outcomes_are_the_python_definitions():
    from oncelog import message
    from oncelog.sequencer import QueueOutcome

    assert BUILT.module.LAYOUT == {k: getattr(message, k) for k in BUILT.module.LAYOUT}
    assert {"ACK_TXN", "FLAGS_MASK", "PRODUCER_BYTE"} <= set(BUILT.module.LAYOUT)
    assert sorted(BUILT.module.OUTCOMES) == sorted(o.value for o in QueueOutcome)
    # A mismatch is a build error, not a silent fallback.

    class Other:
        LAYOUT = {**BUILT.module.LAYOUT, "ACK_TXN": 3}

    with pytest.raises(ImportError, match="ACK_TXN"):
        _native._check_layout(Other)  # type: ignore[arg-type]


@needs_c
def test_the_extension_is_a_multi_phase_module_with_its_own_types():
    import importlib.util
    import sys

    # A second, independent instance of the module (multi-phase init): its types are its
    # own, and kernels of either work.
    spec = importlib.util.find_spec("oncelog._speedups")
    assert spec is not None and spec.loader is not None
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)  # type: ignore[union-attr]
    assert other is not sys.modules["oncelog._speedups"]
    assert other.Kernel is not BUILT.module.Kernel
    k = other.Kernel({}, [], 4, lambda *a: None)
    envs = envelopes([(P1, 5, Flags.OUTSIDE_TXN), (P1, 6, Flags.OUTSIDE_TXN)])
    assert list(k.sequence(envs, None, True)) == envs
    assert k.checkpoint(-1, False) == ({"j": 20}, [("j", P1, 6, -1)])


@needs_c
def test_kernel_is_freed_with_its_envelopes():
    import gc
    import weakref

    class Msg:  # weakly referenceable
        pass

    envs = [
        Envelope("j", 0, 10, Msg(), (P1, 5, Flags.OUTSIDE_TXN)),
        Envelope("j", 10, 20, Msg(), (P2, 7, Flags.CONTINUE_TXN)),
    ]
    ref = weakref.ref(envs[1].message)
    with speedups_mode("c"):
        seq = Sequencer(buffer=4)
    it = seq.sequence(envs)
    assert next(it) is envs[0]
    del envs, seq
    gc.collect()
    assert ref() is not None  # held by the ring, through the iterator
    del it
    gc.collect()
    assert ref() is None


# --- sequencing ----------------------------------------------------------------------------

P1, P2 = b"\x01\x00\x00\x00\x00\x01", b"\x01\x00\x00\x00\x00\x02"


def envelopes(spec: list[tuple[bytes, int, int]]) -> list[Envelope]:
    out = []
    for i, (producer, clock, flags) in enumerate(spec):
        msg = JSONMessage({"uuid": str(build_uuid(producer, clock, flags)), "i": i})
        out.append(Envelope("j", 10 * i, 10 * i + 10, msg))
    return out


@needs_c
@pytest.mark.parametrize("mode", ["c", "pure"])
def test_stepping_while_suspended_is_an_error(mode):
    envs = envelopes([(P1, 5, Flags.OUTSIDE_TXN), (P1, 6, Flags.OUTSIDE_TXN)])
    with speedups_mode(mode):
        seq = Sequencer(states=None)
        it = seq.sequence(envs)
        # The first message of a producer goes through queue_uncommitted + step.
        assert next(it) is envs[0]
        assert seq.step() is None  # steps past it behind the iterator's back
        with pytest.raises(SequencerError, match="stepped while this iterator was suspended"):
            next(it)


@needs_c
@pytest.mark.parametrize("mode", ["c", "pure"])
def test_checkpoint_at_each_yield_is_the_same(mode):
    spec = [
        (P1, 5, Flags.OUTSIDE_TXN), (P2, 7, Flags.CONTINUE_TXN), (P1, 6, Flags.OUTSIDE_TXN),
        (P2, 8, Flags.CONTINUE_TXN), (P1, 6, Flags.OUTSIDE_TXN), (P2, 9, Flags.ACK_TXN),
        (P2, 10, Flags.CONTINUE_TXN), (P2, 9, Flags.ACK_TXN), (P1, 0, Flags.OUTSIDE_TXN),
    ]
    envs = envelopes(spec)

    def replay(journal: str, begin: int, end: int) -> list[Envelope]:
        return [e for e in envs if e.begin >= begin and e.end <= end]

    def run(m: str) -> list:
        # A ring of 3: P2's transaction leaves it before its ACK and is replayed.
        seen = []
        with speedups_mode(m):
            seq = Sequencer(offsets={"j": 0}, buffer=3)
            for env in seq.sequence(envs, replay, acks=False):
                seen.append((env.begin, seq.checkpoint(dequeued_processed=True)))
        seen.append(seq.checkpoint())
        return seen

    assert run(mode) == run("pure")
    # P1's 5 and 6, P2's 7 and 8 at its ACK, the duplicate and the rollback dropped, nil.
    assert [b for b, _ in run(mode)[:-1]] == [0, 20, 10, 30, 80]


@needs_c
def test_subclasses_take_the_python_path():
    class Custom(Sequencer):
        __slots__ = ()

    envs = envelopes([(P1, 5, Flags.OUTSIDE_TXN), (P1, 6, Flags.OUTSIDE_TXN)])
    with speedups_mode("c"):
        custom = Custom()
        assert type(custom) is Custom and not hasattr(custom, "_kernel")
        it = custom.sequence(envs)
        native = Sequencer()
        assert isinstance(native, Sequencer) and native._kernel is not None  # type: ignore[attr-defined]
    assert not isinstance(it, BUILT.module.SequenceIterator)
    assert list(it) == envs


@needs_c
def test_closing_the_c_iterator_stops_it():
    envs = envelopes([(P1, 5, Flags.OUTSIDE_TXN), (P1, 6, Flags.OUTSIDE_TXN)])
    with speedups_mode("c"):
        it = Sequencer().sequence(envs)
    assert next(it) is envs[0]
    it.close()
    assert list(it) == []
