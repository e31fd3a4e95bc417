"""Message identity: v1 UUIDs whose clock and flags encode transactions (Gazette's layout).

A message UUID is an RFC 4122 version-1 UUID. Its 60-bit timestamp and 4-bit
sequence counter together form a 64-bit *Clock*; 10 bits of the clock-sequence
field carry *Flags* (outside a transaction, continue a transaction, acknowledge);
the 6-byte node field is the *ProducerID*. The bit layout is defined below, once.

This module holds the layout and everything that only needs it: building and parsing
UUIDs (one at a time and in bulk), clocks, flags, producer IDs, the `Message` protocol
and `Envelope`. It imports nothing else from oncelog (but the optional C extension
`oncelog._bulk`, a leaf, for the clock's lock-free state), so the framings, the sequencer and
the C speed-ups' load-time checks can all depend on it without cycles. The ready message
types (`JSONMessage`, `JSONLine`, `CSVRecord`, `ProtoMessage`) live in `oncelog.message`,
which also re-exports every name here.
"""

from __future__ import annotations

import enum
import os
import sys
import threading
import time
import uuid
from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

import uuid6

__all__ = [
    "Flags",
    "OUTSIDE_TXN",
    "CONTINUE_TXN",
    "ACK_TXN",
    "FLAGS_MASK",
    "CLOCK_SEQ_BYTE",
    "SEQ_COUNTER_SHIFT",
    "SEQ_COUNTER_MASK",
    "TIME_HI_MASK",
    "PRODUCER_BYTE",
    "PRODUCER_ID_LEN",
    "UNIX_EPOCH_OFFSET",
    "NIL_UUID",
    "Clock",
    "new_producer_id",
    "check_producer_id",
    "build_uuid",
    "uuid_text",
    "get_clock",
    "get_flags",
    "get_producer_id",
    "uuid_fields",
    "parse_uuid_fields",
    "clock_from_unix_ns",
    "clock_to_unix_ns",
    "time_sortable_key",
    "Message",
    "Envelope",
]

# --- the UUID bit layout (Gazette's message.UUID), defined here only -------------------
#
# bytes 0-3 time_low, 4-5 time_mid, 6-7 version nibble + time_hi (12 bits): a 60-bit
# timestamp of 100 ns ticks. Bytes 8-9, the clock-sequence field: variant (2 bits), the
# clock's 4-bit sequence counter, then 10 bits of flags. Bytes 10-15, the node: the
# producer ID. Clock = timestamp << 4 | sequence counter. `oncelog._speedups` (C) and
# `oncelog.spark.uuids` (Arrow) are checked against these at import.

FLAGS_MASK = 0x3FF
"""Only the low 10 bits of the clock-sequence field carry flags."""

CLOCK_SEQ_BYTE = 8
"""Byte offset of the 16-bit clock-sequence field (sequence counter and flags)."""

SEQ_COUNTER_SHIFT = 10
"""The clock's 4-bit sequence counter sits above the flags in the clock-sequence field."""

SEQ_COUNTER_MASK = 0xF
"""The sequence counter's width: the low 4 bits of a Clock."""

TIME_HI_MASK = 0x0FFF
"""The 12 timestamp bits of `time_hi` (its top nibble is the UUID version)."""

PRODUCER_BYTE = 10
"""Byte offset of the 6-byte producer ID (the node field)."""

PRODUCER_ID_LEN = 6

UNIX_EPOCH_OFFSET = 122192928000000000
"""100 ns intervals between the RFC 4122 epoch (1582-10-15) and the Unix epoch."""

NIL_UUID = uuid.UUID(int=0)

_MASK64 = (1 << 64) - 1
_MASK60 = (1 << 60) - 1
_time_ns = time.time_ns


OUTSIDE_TXN = 0
"""Flags of a message committed on its own (plain int, for hot loops; `Flags.OUTSIDE_TXN`)."""
CONTINUE_TXN = 1
"""Flags of a message inside a transaction (plain int; `Flags.CONTINUE_TXN`)."""
ACK_TXN = 2
"""Flags of an acknowledgement committing a transaction (plain int; `Flags.ACK_TXN`)."""


class Flags(enum.IntEnum):
    """Transaction flags carried in a message UUID; any other value is read as OUTSIDE_TXN."""

    OUTSIDE_TXN = OUTSIDE_TXN
    """A message committed on its own: delivered as soon as it is read."""
    CONTINUE_TXN = CONTINUE_TXN
    """Part of a transaction: delivered only when a later ACK_TXN commits it."""
    ACK_TXN = ACK_TXN
    """Acknowledges (commits) the producer's pending messages up to its clock."""


def _flags_value(value: int) -> Flags | int:
    try:
        return Flags(value)
    except ValueError:
        return value


_FLAG_VALUES: tuple[Flags | int, ...] = tuple(_flags_value(v) for v in range(FLAGS_MASK + 1))


def clock_from_unix_ns(ns: int) -> int:
    """The Clock of a Unix time in nanoseconds (sequence counter zero)."""
    return ((ns // 100 + UNIX_EPOCH_OFFSET) & _MASK60) << 4


def clock_to_unix_ns(clock: int) -> int:
    """The Unix time in nanoseconds of a Clock (its sequence counter is dropped)."""
    return ((clock >> 4) - UNIX_EPOCH_OFFSET) * 100


class _ClockState:
    """The pure-Python state of a `Clock` (its base class where `oncelog._bulk` is not built,
    or with ONCELOG_PURE_PYTHON=1): every operation holds one lock."""

    __slots__ = ("_value", "_lock")

    def __init__(self, value: int = 0) -> None:
        self._value = value
        self._lock = threading.Lock()

    @property
    def value(self) -> int:
        return self._value

    def tick(self) -> int:
        """Add one and return the new value."""
        with self._lock:
            self._value = (self._value + 1) & _MASK64
            return self._value

    def reserve(self, n: int) -> int:
        """Add `n` and return the first of the `n` values passed (value + 1 .. value + n):
        consecutive clocks for a batch of messages under one hold of the lock."""
        if n < 1:
            raise ValueError(f"reserve at least one clock, not {n}")
        with self._lock:
            first = (self._value + 1) & _MASK64
            self._value = (self._value + n) & _MASK64
            return first

    def advance(self) -> int:
        """`update()` then `tick()` under one hold of the lock: one past the larger of the
        clock and the clock of now (a publisher's next clock, once per message: kept lean)."""
        # clock_from_unix_ns(now); the 60-bit timestamp does not overflow before 5236 AD.
        target = (_time_ns() // 100 + UNIX_EPOCH_OFFSET) << 4
        lock = self._lock
        lock.acquire()
        try:
            value = self._value
            value = (value if value > target else target) + 1
            if value > _MASK64:
                value &= _MASK64
            self._value = value
        finally:
            lock.release()
        return value

    def _raise_to(self, target: int) -> int:
        """Move to `target` if that is larger (never decrease); return the value."""
        with self._lock:
            if target > self._value:
                self._value = target
            return self._value


def _clock_base() -> type[_ClockState]:
    """`oncelog._bulk.ClockCore` (C: each operation one C call, atomic under the GIL, so no
    lock; see oncelog/_bulk.c) where built and not disabled by ONCELOG_PURE_PYTHON=1, else
    `_ClockState`. Both keep the same values for the same calls (tests run both)."""
    if os.environ.get("ONCELOG_PURE_PYTHON", "") not in ("", "0"):
        return _ClockState
    try:
        from oncelog._bulk import ClockCore
    except ImportError:
        return _ClockState
    return cast("type[_ClockState]", ClockCore)


if TYPE_CHECKING:
    _ClockBase = _ClockState
else:
    _ClockBase = _clock_base()


class Clock(_ClockBase):
    """A thread-safe, monotonic 64-bit message clock.

    The upper 60 bits are an RFC 4122 timestamp, the low 4 bits a sequence
    counter so that up to 16 messages share one 100 ns tick.

    `tick()` adds one and returns the new value; `reserve(n)` adds `n` and returns the first
    value passed; `advance()` is `update()` then `tick()` as one operation; `update()` never
    decreases the clock. Each is atomic: its state (the base class) is `oncelog._bulk`'s C
    `ClockCore` where built (no lock: one C call runs whole under the GIL), else a
    lock-guarded pure-Python one.
    """

    __slots__ = ()

    def __init__(self, value: int = 0) -> None:
        if not 0 <= value <= _MASK64:
            raise ValueError(f"clock value {value} is outside the unsigned 64-bit range")
        super().__init__(value)

    def update(self, unix_ns: int | None = None) -> int:
        """Move to the clock of `unix_ns` (default: now) if that is larger; never decrease."""
        return self._raise_to(clock_from_unix_ns(time.time_ns() if unix_ns is None else unix_ns))

    def __repr__(self) -> str:
        return f"Clock({self.value:#x})"

    def __reduce__(self) -> tuple[type["Clock"], tuple[int]]:
        # Copies and pickles carry the value (a C-backed state would otherwise copy as 0).
        return (type(self), (self.value,))


def check_producer_id(producer: bytes) -> bytes:
    """Return `producer` as bytes, or raise ValueError if it is not exactly 6 bytes."""
    if not isinstance(producer, (bytes, bytearray, memoryview)):
        raise TypeError(f"producer ID must be bytes, not {type(producer).__name__}")
    producer = bytes(producer)
    if len(producer) != PRODUCER_ID_LEN:
        raise ValueError(
            f"producer ID must be {PRODUCER_ID_LEN} bytes, got {len(producer)}: {producer.hex()}"
        )
    return producer


def new_producer_id() -> bytes:
    """Six cryptographically random bytes with the multicast bit set (as RFC 4122 asks)."""
    b = bytearray(os.urandom(PRODUCER_ID_LEN))
    b[0] |= 0x01
    return bytes(b)


def build_uuid(producer: bytes, clock: int, flags: int) -> uuid.UUID:
    """Compose a v1 UUID from a producer ID, Clock and Flags (bit-exact with Gazette)."""
    producer = check_producer_id(producer)
    flags = int(flags)
    if not 0 <= flags <= FLAGS_MASK:
        raise ValueError(f"flags {flags:#x} do not fit in 10 bits (maximum {FLAGS_MASK:#x})")
    if not 0 <= clock <= _MASK64:
        raise ValueError(f"clock {clock} is outside the unsigned 64-bit range")
    ts = clock >> 4
    time_low = ts & 0xFFFFFFFF
    time_mid = (ts >> 32) & 0xFFFF
    time_hi = ((ts >> 48) & TIME_HI_MASK) | 0x1000  # version 1
    seq = ((clock & SEQ_COUNTER_MASK) << SEQ_COUNTER_SHIFT) | flags | 0x8000  # RFC 4122 variant
    value = (
        (time_low << 96)
        | (time_mid << 80)
        | (time_hi << 64)
        | (seq << 48)
        | int.from_bytes(producer, "big")
    )
    return uuid.UUID(int=value)


def uuid_text(producer: bytes, clock: int, flags: int) -> str:
    """`str(build_uuid(producer, clock, flags))` without building a `uuid.UUID`: the
    canonical lower-case text of a message UUID (publishing's hot path)."""
    if (
        len(producer) != PRODUCER_ID_LEN
        or not 0 <= flags <= FLAGS_MASK
        or not 0 <= clock <= _MASK64
    ):
        return str(build_uuid(producer, clock, flags))  # raises, naming what is wrong
    ts = clock >> 4
    return "%08x-%04x-%04x-%04x-%s" % (
        ts & 0xFFFFFFFF,
        (ts >> 32) & 0xFFFF,
        ((ts >> 48) & TIME_HI_MASK) | 0x1000,
        ((clock & SEQ_COUNTER_MASK) << SEQ_COUNTER_SHIFT) | flags | 0x8000,
        producer.hex(),
    )


_FLAGS_AT = (15 - CLOCK_SEQ_BYTE - 1) * 8
"""Bit position of the flags in a UUID's 128-bit int."""
_COUNTER_AT = _FLAGS_AT + SEQ_COUNTER_SHIFT
"""Bit position of the clock's sequence counter in a UUID's 128-bit int."""


def _clock_of_int(v: int) -> int:
    time_low = v >> 96
    time_mid = (v >> 80) & 0xFFFF
    time_hi = (v >> 64) & TIME_HI_MASK  # mask the version nibble
    seq = (v >> _COUNTER_AT) & SEQ_COUNTER_MASK
    return (((time_hi << 48) | (time_mid << 32) | time_low) << 4) | seq


_producer_bytes: dict[int, bytes] = {}


def _producer_of(node: int) -> bytes:
    """The producer ID of a node value, one shared bytes object per producer."""
    producer = _producer_bytes.get(node)
    if producer is None:
        if len(_producer_bytes) > 65536:  # bound the cache; producers are few in practice
            _producer_bytes.clear()
        producer = _producer_bytes[node] = node.to_bytes(PRODUCER_ID_LEN, "big")
    return producer


def _fields_of_int(v: int) -> tuple[bytes, int, Flags | int]:
    producer = _producer_bytes.get(v & 0xFFFFFFFFFFFF)
    if producer is None:
        producer = _producer_of(v & 0xFFFFFFFFFFFF)
    return (
        producer,
        ((((v >> 64) & TIME_HI_MASK) << 48 | ((v >> 80) & 0xFFFF) << 32 | (v >> 96)) << 4)
        | ((v >> _COUNTER_AT) & SEQ_COUNTER_MASK),
        _FLAG_VALUES[(v >> _FLAGS_AT) & FLAGS_MASK],
    )


def get_clock(u: uuid.UUID) -> int:
    """The 64-bit Clock of a message UUID."""
    return _clock_of_int(u.int)


def get_flags(u: uuid.UUID) -> Flags | int:
    """The 10 flag bits of a message UUID (a `Flags` member where one matches)."""
    return _FLAG_VALUES[(u.int >> _FLAGS_AT) & FLAGS_MASK]


def get_producer_id(u: uuid.UUID) -> bytes:
    """The 6-byte producer ID (node field) of a message UUID."""
    return (u.int & 0xFFFFFFFFFFFF).to_bytes(PRODUCER_ID_LEN, "big")


def uuid_fields(u: uuid.UUID) -> tuple[bytes, int, Flags | int]:
    """(producer, clock, flags) of a message UUID in one pass."""
    return _fields_of_int(u.int)


def parse_uuid_fields(text: str) -> tuple[bytes, int, Flags | int]:
    """(producer, clock, flags) straight from a canonical 36-character UUID string.

    Skips building a `uuid.UUID`; the hot path of JSON and CSV decoding.
    Raises ValueError naming the text if it is not a canonical UUID.
    """
    if len(text) == 36 and text[8:24:5] == "----":
        digits = text.replace("-", "")
        if len(digits) == 32 and digits.isascii() and "_" not in digits:
            try:
                return _fields_of_int(int(digits, 16))
            except ValueError:
                pass
    raise ValueError(f"not a canonical UUID string: {text!r}")


_LOW_NIBBLE = bytes(b & (TIME_HI_MASK >> 8) for b in range(256))
"""Byte table: clear the version nibble of `time_hi`'s first byte."""
_SEQ_NIBBLE = bytes((b >> (SEQ_COUNTER_SHIFT - 8)) & SEQ_COUNTER_MASK for b in range(256))
"""Byte table: the clock's 4-bit sequence counter from the clock-sequence field's first byte."""
_FLAG_HIGH_BITS = bytes(b & (FLAGS_MASK >> 8) for b in range(256))
"""Byte table: the two flag bits in the clock-sequence field's first byte."""
_NATIVE_LITTLE = sys.byteorder == "little"
_TIMESTAMP_BYTES = (6, 7, 4, 5, 0, 1, 2, 3)
"""The UUID bytes of a 60-bit timestamp, most significant first (time_hi, time_mid, time_low)."""


def _bulk_fields(raw: bytes, n: int) -> list[tuple[bytes, int, Flags | int]]:
    """(producer, clock, flags) of `n` packed 16-byte UUIDs.

    Each field is gathered from every UUID at once with strided byte copies and
    byte-table translations, and turned into Python ints by `array` and one big-int
    shift: no Python arithmetic per UUID.
    """
    # Clocks: the 60-bit timestamps as big-endian 64-bit words (time_hi, time_mid,
    # time_low), each shifted left 4 bits in one big-int shift (the top nibble of every
    # word is zero, so nothing crosses words), ORed with the sequence counters.
    stamps = bytearray(8 * n)
    for i, src in enumerate(_TIMESTAMP_BYTES):
        stamps[i::8] = raw[src::16]
    stamps[0::8] = stamps[0::8].translate(_LOW_NIBBLE)
    counters = bytearray(8 * n)
    counters[7::8] = raw[CLOCK_SEQ_BYTE::16].translate(_SEQ_NIBBLE)
    shifted = (int.from_bytes(stamps, "big") << 4) | int.from_bytes(counters, "big")
    clocks = array("Q", shifted.to_bytes(8 * n, "big"))
    # Producers: the 6-byte nodes as 64-bit ints, mapped to shared bytes objects.
    nodes = bytearray(8 * n)
    for k in range(PRODUCER_ID_LEN):
        nodes[2 + k :: 8] = raw[PRODUCER_BYTE + k :: 16]
    node_ints = array("Q", nodes)
    if _NATIVE_LITTLE:
        clocks.byteswap()
        node_ints.byteswap()
    node_list = node_ints.tolist()
    producers: list[bytes | None] = list(map(_producer_bytes.get, node_list))
    if producers.count(None):
        producers = [p if p is not None else _producer_of(v) for p, v in zip(producers, node_list)]
    # Flags: almost always below 256 (the two high bits clear), then one byte each.
    high = raw[CLOCK_SEQ_BYTE::16].translate(_FLAG_HIGH_BITS)
    low = raw[CLOCK_SEQ_BYTE + 1 :: 16]
    if high.count(0) == n:
        flags = list(map(_FLAG_VALUES.__getitem__, low))
    else:
        words = bytearray(2 * n)
        words[0::2] = high
        words[1::2] = low
        values = array("H", words)
        if _NATIVE_LITTLE:
            values.byteswap()
        flags = list(map(_FLAG_VALUES.__getitem__, values))
    return list(zip(cast(list[bytes], producers), clocks.tolist(), flags))


def time_sortable_key(u: uuid.UUID) -> str:
    """A key whose string order is the message's clock order (a v6 UUID, via `uuid6`).

    Sorts by timestamp, then sequence counter, then flags and producer: a total
    order of messages consistent with each producer's clock.
    """
    return str(uuid6.uuid1_to_uuid6(u))


@runtime_checkable
class Message(Protocol):
    """What oncelog needs of a message: a UUID it can read and set, and an ACK factory."""

    def get_uuid(self) -> uuid.UUID: ...

    def set_uuid(self, u: uuid.UUID) -> None: ...

    def new_acknowledgement(self, journal: str) -> "Message": ...


@dataclass(slots=True)
class Envelope:
    """A message and its byte range `[begin, end)` in a journal.

    `uuid`, `producer`, `clock` and `flags` are parsed from the message's UUID
    once, on first use.
    """

    journal: str
    begin: int
    end: int
    message: Any
    _ids: tuple[bytes, int, Flags | int] | None = field(
        default=None, repr=False, compare=False
    )

    def _parse(self) -> tuple[bytes, int, Flags | int]:
        ids = self._ids
        if ids is None:
            message = self.message
            fast = getattr(message, "uuid_fields", None)
            ids = self._ids = fast() if fast is not None else _fields_of_int(message.get_uuid().int)
        return ids

    @property
    def uuid(self) -> uuid.UUID:
        u: uuid.UUID = self.message.get_uuid()  # `message` is Any: any Message
        return u

    @property
    def producer(self) -> bytes:
        return self._parse()[0]

    @property
    def clock(self) -> int:
        return self._parse()[1]

    @property
    def flags(self) -> Flags | int:
        return self._parse()[2]

    @property
    def ids(self) -> tuple[bytes, int, Flags | int]:
        """(producer, clock, flags) in one access: the sequencer's hot path."""
        return self._parse()


_NIL_FIELDS: tuple[bytes, int, Flags | int] = (bytes(6), 0, Flags.OUTSIDE_TXN)
"""(producer, clock, flags) of a message with no UUID (the nil UUID's)."""
