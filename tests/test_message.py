"""Message identity: bit-exact UUID layout, clocks, flags, producer IDs and message types."""

from __future__ import annotations

import threading
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncelog.message import (
    FLAGS_MASK,
    NIL_UUID,
    UNIX_EPOCH_OFFSET,
    Clock,
    CSVRecord,
    Envelope,
    Flags,
    JSONMessage,
    Message,
    ProtoMessage,
    build_uuid,
    check_producer_id,
    clock_from_unix_ns,
    clock_to_unix_ns,
    get_clock,
    get_flags,
    get_producer_id,
    new_producer_id,
    parse_uuid_fields,
    time_sortable_key,
    uuid_fields,
)

producers = st.binary(min_size=6, max_size=6)
clocks = st.integers(min_value=0, max_value=(1 << 64) - 1)
flag_values = st.integers(min_value=0, max_value=FLAGS_MASK)


def test_uuid_byte_vector() -> None:
    # Every byte position of DESIGN.md §2, computed by hand for a clock with all fields distinct.
    producer = bytes.fromhex("0102030405 06".replace(" ", ""))
    clock = (0x0ABCDEF012345678 << 4) | 0x9  # 60-bit timestamp, then sequence counter 9
    u = build_uuid(producer, clock, Flags.ACK_TXN)
    b = u.bytes
    assert b[0:4] == (0x12345678).to_bytes(4, "big")  # timestamp low 32 bits
    assert b[4:6] == (0xDEF0).to_bytes(2, "big")  # timestamp middle 16 bits
    assert b[6:8] == (0x0ABC | 0x1000).to_bytes(2, "big")  # high 12 bits + version 1
    assert b[8:10] == ((0x9 << 10) | 0x2 | 0x8000).to_bytes(2, "big")
    assert b[10:16] == producer
    assert str(u) == "12345678-def0-1abc-a402-010203040506"
    assert u.version == 1 and u.variant == uuid.RFC_4122


def test_uuid_matches_stdlib_v1_time() -> None:
    producer = new_producer_id()
    clock = clock_from_unix_ns(1_700_000_000_123_456_700) + 3
    u = build_uuid(producer, clock, Flags.CONTINUE_TXN)
    assert u.time == clock >> 4  # stdlib reads the same 60-bit timestamp
    assert u.node == int.from_bytes(producer, "big")
    assert (u.clock_seq >> 10) & 0xF == 3


@given(producers, clocks, flag_values)
def test_uuid_round_trip(producer: bytes, clock: int, flags: int) -> None:
    u = build_uuid(producer, clock, flags)
    assert get_clock(u) == clock
    assert int(get_flags(u)) == flags
    assert get_producer_id(u) == producer
    assert uuid_fields(u) == (producer, clock, flags)
    assert parse_uuid_fields(str(u)) == (producer, clock, flags)
    assert parse_uuid_fields(str(u).upper()) == (producer, clock, flags)


def test_get_flags_returns_enum_members() -> None:
    u = build_uuid(new_producer_id(), 1 << 8, 2)
    assert get_flags(u) is Flags.ACK_TXN
    assert get_flags(build_uuid(new_producer_id(), 1 << 8, 0x155)) == 0x155


def test_flags_over_ten_bits_rejected() -> None:
    with pytest.raises(ValueError, match="0x400 do not fit in 10 bits"):
        build_uuid(new_producer_id(), 1, 0x400)


@pytest.mark.parametrize("bad", [b"", b"12345", b"1234567"])
def test_wrong_length_producer_rejected(bad: bytes) -> None:
    with pytest.raises(ValueError, match=f"6 bytes, got {len(bad)}"):
        build_uuid(bad, 1, 0)
    with pytest.raises(ValueError, match="6 bytes"):
        check_producer_id(bad)


def test_clock_out_of_range_rejected() -> None:
    with pytest.raises(ValueError, match="64-bit"):
        build_uuid(new_producer_id(), 1 << 64, 0)
    with pytest.raises(ValueError, match="64-bit"):
        Clock(-1)


@pytest.mark.parametrize(
    "text", ["", "not-a-uuid", "12345678-def0-1abc-a402-01020304050g", "x" * 36]
)
def test_parse_uuid_fields_rejects_bad_text(text: str) -> None:
    with pytest.raises(ValueError, match="not a canonical UUID"):
        parse_uuid_fields(text)


def test_new_producer_id_is_random_multicast() -> None:
    ids = {new_producer_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(len(p) == 6 and p[0] & 0x01 for p in ids)


@given(st.integers(min_value=0, max_value=(1 << 59) * 100 - UNIX_EPOCH_OFFSET * 100))
def test_unix_clock_conversion(ns: int) -> None:
    c = clock_from_unix_ns(ns)
    assert c & 0xF == 0
    assert clock_to_unix_ns(c) == ns // 100 * 100


def test_clock_tick_and_update() -> None:
    c = Clock(10)
    assert c.tick() == 11 and c.value == 11
    now = 1_700_000_000_000_000_000
    assert c.update(now) == clock_from_unix_ns(now)
    c.tick()
    ticked = c.value
    assert c.update(now) == ticked  # never decreases, keeps the ticks
    assert c.update(now - 10**9) == ticked
    later = c.update(now + 100)
    assert later == clock_from_unix_ns(now + 100) and later & 0xF == 0


def test_clock_is_thread_safe() -> None:
    c = Clock(0)
    barrier = threading.Barrier(8)

    def work() -> None:
        barrier.wait()
        for _ in range(2000):
            c.tick()

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c.value == 16000


@given(st.lists(st.tuples(clocks, flag_values, producers), min_size=2, max_size=20))
def test_time_sortable_key_orders_by_clock(items: list[tuple[int, int, bytes]]) -> None:
    uuids = [build_uuid(p, c, f) for c, f, p in items]
    by_key = sorted(uuids, key=time_sortable_key)
    clocks_in_key_order = [get_clock(u) for u in by_key]
    assert clocks_in_key_order == sorted(clocks_in_key_order)


def test_json_message() -> None:
    m = JSONMessage({"word": "hi"})
    assert isinstance(m, Message)
    assert m.get_uuid() == NIL_UUID
    u = build_uuid(new_producer_id(), 12345, Flags.CONTINUE_TXN)
    m.set_uuid(u)
    assert m.doc["uuid"] == str(u) and m.get_uuid() == u
    assert m.uuid_fields() == uuid_fields(u)
    ack = m.new_acknowledgement("a/b")
    assert isinstance(ack, JSONMessage) and ack.doc == {} and ack.get_uuid() == NIL_UUID
    custom = JSONMessage({"_meta": str(u)}, uuid_field="_meta")
    assert custom.get_uuid() == u
    assert custom.new_acknowledgement("j").uuid_field == "_meta"


def test_json_message_bad_uuid_names_field() -> None:
    with pytest.raises(ValueError, match="JSON field 'uuid': not a UUID: 'nope'"):
        JSONMessage({"uuid": "nope"}).get_uuid()
    with pytest.raises(ValueError, match="not a UUID"):
        Envelope("j", 0, 10, JSONMessage({"uuid": 5})).clock


def test_csv_record() -> None:
    r = CSVRecord(["", "a", "b"])
    assert r.get_uuid() == NIL_UUID
    u = build_uuid(new_producer_id(), 99, Flags.OUTSIDE_TXN)
    r.set_uuid(u)
    assert r.fields == [str(u), "a", "b"]
    assert r.uuid_fields() == uuid_fields(u)
    assert r.new_acknowledgement("j").get_uuid() == NIL_UUID


def test_envelope_parses_uuid_once() -> None:
    u = build_uuid(b"\x01\x02\x03\x04\x05\x06", 777, Flags.ACK_TXN)

    class Counting(JSONMessage):
        __slots__ = ("calls",)

        def uuid_fields(self):  # type: ignore[override]
            self.calls += 1
            return super().uuid_fields()

    msg = Counting({"uuid": str(u)})
    msg.calls = 0
    env = Envelope("a/b", 10, 20, msg)
    assert (env.producer, env.clock, env.flags) == (b"\x01\x02\x03\x04\x05\x06", 777, Flags.ACK_TXN)
    assert env.ids == (env.producer, env.clock, env.flags)
    assert msg.calls == 1
    assert env.uuid == u


def test_envelope_of_plain_message_protocol() -> None:
    u = build_uuid(new_producer_id(), 5 << 4, Flags.CONTINUE_TXN)

    class Plain:
        def get_uuid(self) -> uuid.UUID:
            return u

        def set_uuid(self, v: uuid.UUID) -> None:
            pass

        def new_acknowledgement(self, journal: str) -> "Plain":
            return Plain()

    env = Envelope("j", 0, 1, Plain())
    assert env.clock == 5 << 4 and env.flags is Flags.CONTINUE_TXN


def _proto_class():
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fdp = descriptor_pb2.FileDescriptorProto(name="oncelog_test_msg.proto", package="oncelogtest")
    msg = fdp.message_type.add(name="Event")
    msg.field.add(name="uuid", number=1, type=9, label=1)  # string
    msg.field.add(name="raw_uuid", number=2, type=12, label=1)  # bytes
    msg.field.add(name="word", number=3, type=9, label=1)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("oncelogtest.Event"))


def test_proto_message_string_and_bytes_fields() -> None:
    Event = _proto_class()
    u = build_uuid(new_producer_id(), 1234 << 4, Flags.ACK_TXN)
    m = ProtoMessage(Event(word="x"))
    assert m.get_uuid() == NIL_UUID
    m.set_uuid(u)
    assert m.proto.uuid == str(u) and m.get_uuid() == u
    raw = ProtoMessage(Event(), uuid_field="raw_uuid")
    raw.set_uuid(u)
    assert raw.proto.raw_uuid == u.bytes and raw.get_uuid() == u
    decoded = ProtoMessage.factory(Event)(m.proto.SerializeToString())
    assert decoded == m and decoded.proto.word == "x"
    ack = m.new_acknowledgement("j")
    assert ack.get_uuid() == NIL_UUID and ack.proto.word == ""


def test_proto_message_without_uuid_field_rejected() -> None:
    Event = _proto_class()
    with pytest.raises(ValueError, match="no field 'id'"):
        ProtoMessage(Event(), uuid_field="id")


@given(st.lists(st.tuples(producers, clocks, flag_values), min_size=1, max_size=30))
def test_prime_ids_matches_lazy_parsing(items: list[tuple[bytes, int, int]]) -> None:
    from oncelog.message import prime_ids

    envs = [
        Envelope("j", i, i + 1, JSONMessage({"uuid": str(build_uuid(p, c, f))}))
        for i, (p, c, f) in enumerate(items)
    ]
    prime_ids(envs)
    assert [e._ids for e in envs] == [(p, c, f) for p, c, f in items]
    assert all(type(e.ids[2]) is type(get_flags(e.uuid)) for e in envs)


def test_prime_ids_leaves_odd_batches_to_lazy_parsing() -> None:
    from oncelog.message import prime_ids

    u = build_uuid(new_producer_id(), 99 << 4, Flags.ACK_TXN)
    batches = [
        [Envelope("j", 0, 1, JSONMessage({"uuid": str(u)})), Envelope("j", 1, 2, JSONMessage({}))],
        [Envelope("j", 0, 1, JSONMessage({"uuid": str(u).replace("-", "")}))],
        [Envelope("j", 0, 1, JSONMessage({"uuid": str(u)[:-1] + "z"}))],
        [Envelope("j", 0, 1, CSVRecord([str(u)]))],
    ]
    for batch in batches:
        prime_ids(batch)
        assert all(e._ids is None for e in batch)
    assert batches[0][1].ids == (bytes(6), 0, Flags.OUTSIDE_TXN)
    assert batches[1][0].ids == uuid_fields(u)  # non-canonical but valid: parsed lazily
    with pytest.raises(ValueError, match="not a UUID"):
        batches[2][0].clock


def _json_envelopes(items: list[tuple[bytes, int, int]]) -> list[Envelope]:
    return [
        Envelope("j", i, i + 1, JSONMessage({"uuid": str(build_uuid(p, c, f))}))
        for i, (p, c, f) in enumerate(items)
    ]


@pytest.mark.parametrize("high_flags", [False, True])
def test_prime_ids_bulk_batch_matches_lazy_parsing(high_flags: bool) -> None:
    """A large batch (clocks spanning the whole 64-bit range, flags with or without
    their two high bits) parses exactly as one UUID at a time, with shared producers."""
    from random import Random

    from oncelog.message import prime_ids

    rng = Random(4)
    ids = [new_producer_id() for _ in range(5)]
    top = FLAGS_MASK if high_flags else 2
    items = [
        (rng.choice(ids), rng.choice([0, 1, (1 << 64) - 1, rng.getrandbits(64)]),
         rng.randint(0, top))
        for _ in range(3000)
    ]
    if high_flags:
        items[1234] = (ids[0], 5, 0x300)
    envs = _json_envelopes(items)
    prime_ids(envs)
    lazy = [uuid_fields(e.uuid) for e in envs]
    expected = [(p, c, get_flags(build_uuid(p, c, f))) for p, c, f in items]
    assert [e._ids for e in envs] == lazy == expected
    assert [type(e._ids[2]) for e in envs] == [type(x[2]) for x in lazy]
    first: dict[bytes, bytes] = {}
    for e in envs:  # one bytes object per producer, so sequencer lookups hit by identity
        assert first.setdefault(e._ids[0], e._ids[0]) is e._ids[0]


def test_prime_ids_rejects_whitespace_hex_digits() -> None:
    """`bytes.fromhex` skips whitespace: such a batch is left to lazy parsing."""
    from oncelog.message import prime_ids

    good = str(build_uuid(new_producer_id(), 77 << 4, Flags.OUTSIDE_TXN))
    bad = "  " + good[2:]
    envs = [
        Envelope("j", 0, 1, JSONMessage({"uuid": good})),
        Envelope("j", 1, 2, JSONMessage({"uuid": bad})),
    ]
    prime_ids(envs)
    assert all(e._ids is None for e in envs)
    assert envs[0].clock == 77 << 4
    assert envs[1].ids == uuid_fields(envs[1].uuid)  # whatever uuid.UUID makes of it


@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 6), st.sampled_from(list(Flags))),
        min_size=1,
        max_size=60,
    ),
    st.integers(min_value=4, max_value=12),
)
def test_sequencer_without_acks_drops_only_acknowledgements(
    steps: list[tuple[int, int, Flags]], ring: int
) -> None:
    """`Sequencer.sequence(acks=False)` yields what `acks=True` yields minus the ACKs,
    and leaves the sequencer in the same state (duplicates, rollbacks and replays included)."""
    from oncelog.message import prime_ids
    from oncelog.sequencer import Sequencer

    producer_ids = [bytes([1, 0, 0, 0, 0, i]) for i in range(3)]
    clocks = [1 << 8] * 3
    items = []
    for who, back, flags in steps:
        clocks[who] += 1
        # Some clocks go back: duplicates.
        items.append((producer_ids[who], max(1, clocks[who] - back), flags))
    envs = _json_envelopes(items)
    prime_ids(envs)

    def replay(journal: str, begin: int, end: int) -> list[Envelope]:
        return envs[begin:end]

    with_acks, without = Sequencer({"j": 0}, buffer=ring), Sequencer({"j": 0}, buffer=ring)
    all_out = with_acks.committed(envs, replay)
    out = without.committed(envs, replay, acks=False)
    assert out == [e for e in all_out if e.flags is not Flags.ACK_TXN]
    assert without.checkpoint() == with_acks.checkpoint()
