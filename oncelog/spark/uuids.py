"""Message UUID columns for Arrow batches, parsed a whole column at a time.

Parsing each UUID in Python costs more than decoding its message. Here canonical
UUID strings are joined into one buffer and taken apart with C-speed byte slicing
and Arrow compute kernels: clock, flags, producer, time and a time-sortable key for
every row in a handful of passes. Rows that are not canonical strings (nil UUIDs,
other spellings) are first rewritten, one by one, from the message's own parse.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from oncelog import _native
from oncelog.message import (
    CLOCK_SEQ_BYTE,
    FLAGS_MASK,
    PRODUCER_BYTE,
    PRODUCER_ID_LEN,
    SEQ_COUNTER_MASK,
    SEQ_COUNTER_SHIFT,
    TIME_HI_MASK,
    UNIX_EPOCH_OFFSET,
    build_uuid,
)

__all__ = ["NIL_TEXT", "UUIDColumns", "canonical_uuid_text", "uuid_columns"]

NIL_TEXT = "00000000-0000-0000-0000-000000000000"

_U64 = pa.uint64()
_I64 = pa.int64()
_UNIX_OFFSET_US = pa.scalar(UNIX_EPOCH_OFFSET // 10, _I64)
_TIMESTAMP = pa.timestamp("us", tz="UTC")
_DASHES = (8, 13, 18, 23)
_PRODUCER_CHAR = 2 * PRODUCER_BYTE + len(_DASHES)
"""Where the producer ID's hex digits start in a canonical UUID string (the layout of
oncelog.message)."""
_HEX = b"0123456789abcdef"
# The time-sortable key (a version 6 UUID) from a lower-case version 1 string: which
# character of the v1 string goes to each position (None: a literal).
_KEY_SOURCE: tuple[int | None, ...] = (
    (15, 16, 17, 9, 10, 11, 12, 0, None, 1, 2, 3, 4, None, None, 5, 6, 7) + tuple(range(18, 36))
)


def _u64(value: int) -> pa.Scalar:
    return pa.scalar(value, _U64)


@dataclass(slots=True)
class UUIDColumns:
    """Arrow columns of a batch's message UUIDs, and the ids the plan needs as lists."""

    uuid: pa.Array
    producer: pa.Array
    clock: pa.Array
    time: pa.Array
    flags: pa.Array
    key: pa.Array

    def ids(self) -> tuple[list[str], list[int], list[int]]:
        """(producer hex, clock, flags) per row, as Python lists."""
        return self.producer.to_pylist(), self.clock.to_pylist(), self.flags.to_pylist()


def canonical_uuid_text(producer: bytes, clock: int, flags: int) -> str:
    """A canonical UUID string with these ids (the nil UUID's for a zero clock and producer)."""
    if not clock and not any(producer):
        return NIL_TEXT
    return str(build_uuid(producer, clock, flags))


def _fixed_strings(buf: bytes | bytearray, width: int, n: int) -> pa.Array:
    arr = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), n, [None, pa.py_buffer(buf)])
    return arr.cast(pa.string())


def _canonical_buffer(texts: Sequence[object] | pa.Array) -> bytes | None:
    """The rows' lower-case UUID strings back to back, if every row is a canonical string."""
    n = len(texts)
    if isinstance(texts, pa.Array):
        values = _texts_36(texts)
        if values is None:
            return None
        raw: bytes = values.to_pybytes()
    else:
        try:
            joined = "".join(texts)  # type: ignore[arg-type]
        except TypeError:
            return None  # a None or a non-string
        if len(joined) != 36 * n or (n and max(map(len, texts)) != 36):
            return None
        try:
            raw = joined.encode("ascii")
        except UnicodeEncodeError:
            return None
    low = raw.lower()
    dashes = b"-" * n
    if any(low[p::36] != dashes for p in _DASHES):
        return None
    digits = low.translate(None, b"-")
    if len(digits) != 32 * n or digits.translate(None, _HEX):
        return None
    return low


def _is_canonical(text: object) -> bool:
    if type(text) is not str or len(text) != 36:
        return False
    try:
        return _canonical_buffer([text]) is not None
    except (TypeError, ValueError):
        return False


def uuid_columns(
    texts: Sequence[object] | pa.Array, fix: Callable[[int], str] | None = None
) -> UUIDColumns:
    """Columns of `texts` (one message UUID per row, as found in the messages: a list, or
    an Arrow string array).

    A row that is not a canonical UUID string is replaced by `fix(row)` (which must
    return one, or raise naming the bad message); without `fix` it raises ValueError.
    """
    native = _native.speedups
    if native is not None and isinstance(texts, pa.Array):
        raw = _texts_36(texts)
        if raw is not None:
            buffers = native.uuid_columns(raw, len(texts))
            if buffers is not None:
                return _from_buffers(buffers, len(texts))
    low = _canonical_buffer(texts)
    if low is None:
        if isinstance(texts, pa.Array):
            texts = texts.to_pylist()
        fixed = list(texts)
        for i, text in enumerate(texts):
            if not _is_canonical(text):
                if fix is None:
                    raise ValueError(f"row {i}: not a canonical UUID string: {text!r}")
                fixed[i] = fix(i)
        low = _canonical_buffer(fixed)
        if low is None:
            raise ValueError("fix() returned a UUID string that is not canonical")
    return _parse(low, len(texts))


def _texts_36(texts: pa.Array) -> pa.Buffer | None:
    """The bytes of a string array's values back to back (no copy), if each is a string of
    36 characters (no nulls); None otherwise."""
    n = len(texts)
    if texts.null_count or not pa.types.is_string(texts.type):
        return None
    if not n:
        return pa.py_buffer(b"")
    if pc.min_max(pc.binary_length(texts)).as_py() != {"min": 36, "max": 36}:
        return None
    offsets, data = texts.buffers()[1], texts.buffers()[2]
    if offsets is None or data is None:
        return None
    first = int.from_bytes(offsets[texts.offset * 4 : texts.offset * 4 + 4].to_pybytes(), "little")
    return data.slice(first, 36 * n)


def _from_buffers(buffers: tuple[bytes, ...], n: int) -> UUIDColumns:
    """UUIDColumns over the buffers of `_speedups.uuid_columns`."""
    low, producer, key, off36, off12, clock, time, valid, flags = map(pa.py_buffer, buffers)
    return UUIDColumns(
        uuid=pa.Array.from_buffers(pa.string(), n, [None, off36, low]),
        producer=pa.Array.from_buffers(pa.string(), n, [None, off12, producer]),
        clock=pa.Array.from_buffers(_I64, n, [None, clock]),
        time=pa.Array.from_buffers(_TIMESTAMP, n, [valid, time]),
        flags=pa.Array.from_buffers(pa.int32(), n, [None, flags]),
        key=pa.Array.from_buffers(pa.string(), n, [None, off36, key]),
    )


def _parse(low: bytes, n: int) -> UUIDColumns:
    native = _native.speedups
    if native is not None:  # the same columns in one pass of C
        buffers = native.uuid_columns(low, n)
        if buffers is not None:
            return _from_buffers(buffers, n)
    raw = bytes.fromhex(low.translate(None, b"-").decode("ascii"))

    def byte(k: int) -> pa.Array:
        return pa.Array.from_buffers(pa.uint8(), n, [None, pa.py_buffer(raw[k::16])]).cast(_U64)

    shl, shr, bor, band = pc.shift_left, pc.shift_right, pc.bit_wise_or, pc.bit_wise_and
    b = [byte(k) for k in range(PRODUCER_BYTE)]
    time_low = bor(bor(shl(b[0], _u64(24)), shl(b[1], _u64(16))), bor(shl(b[2], _u64(8)), b[3]))
    time_mid = bor(shl(b[4], _u64(8)), b[5])
    time_hi = bor(shl(band(b[6], _u64(TIME_HI_MASK >> 8)), _u64(8)), b[7])
    ts = bor(bor(shl(time_hi, _u64(48)), shl(time_mid, _u64(32))), time_low)
    seq = bor(shl(b[CLOCK_SEQ_BYTE], _u64(8)), b[CLOCK_SEQ_BYTE + 1])
    counter = band(shr(seq, _u64(SEQ_COUNTER_SHIFT)), _u64(SEQ_COUNTER_MASK))
    clock = bor(shl(ts, _u64(SEQ_COUNTER_MASK.bit_length())), counter)
    flags = band(seq, _u64(FLAGS_MASK)).cast(pa.int32())
    try:
        clock_signed = clock.cast(_I64)
    except pa.ArrowInvalid:
        raise ValueError(
            "a message UUID has a clock of 2**63 or more, beyond the Spark `clock` column"
        ) from None
    unix_us = pc.subtract(pc.divide(ts, _u64(10)).cast(_I64), _UNIX_OFFSET_US)
    time = pc.if_else(
        pc.equal(clock, _u64(0)), pa.scalar(None, _I64), unix_us
    ).cast(_TIMESTAMP)

    width = 2 * PRODUCER_ID_LEN
    producer = bytearray(width * n)
    for j in range(width):
        producer[j::width] = low[_PRODUCER_CHAR + j :: 36]
    key = bytearray(36 * n)
    for j, src in enumerate(_KEY_SOURCE):
        if src is not None:
            key[j::36] = low[src::36]
    key[8::36] = key[13::36] = b"-" * n
    key[14::36] = b"6" * n
    return UUIDColumns(
        uuid=_fixed_strings(low, 36, n),
        producer=_fixed_strings(producer, width, n),
        clock=clock_signed,
        time=time,
        flags=flags,
        key=_fixed_strings(key, 36, n),
    )
