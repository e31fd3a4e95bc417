"""Fixed framing (`application/x-protobuf-fixed`), byte-compatible with Gazette.

A frame is the magic word `66 33 93 36`, the payload length as a 4-byte
little-endian unsigned integer, then the payload (a serialized protobuf
message). The magic word lets a reader detect bytes that are not a frame
(a de-synchronization) and skip to the next frame.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

from oncelog.framing.base import (
    CONTENT_TYPE_PROTOBUF_FIXED,
    Buffer,
    DecodeResult,
    DesyncDetected,
    EncodeError,
    MalformedFrame,
    TruncatedFrame,
    batch_built,
    gc_paused,
    snippet,
)
from oncelog.identity import NIL_UUID, Envelope, Flags
from oncelog.message import ProtoMessage

__all__ = [
    "MAGIC_WORD",
    "HEADER_LENGTH",
    "MAX_PAYLOAD_LENGTH",
    "encode_fixed_frame",
    "unpack_fixed_frame",
    "RawPayload",
    "FixedFraming",
]

MAGIC_WORD = b"\x66\x33\x93\x36"
"""Gazette's `FixedFrameWord`: the first four bytes of every fixed frame."""
HEADER_LENGTH = 8
"""Magic word plus 4-byte little-endian payload length (Gazette's `FixedFrameHeaderLength`)."""
MAX_PAYLOAD_LENGTH = 0xFFFFFFFF

_HEADER = struct.Struct("<4sI")
_LENGTH = struct.Struct("<I")
_SCAN_CHUNK = 64 * 1024


def encode_fixed_frame(payload: bytes | bytearray | memoryview) -> bytes:
    """The fixed frame of `payload`: magic word, little-endian length, payload."""
    length = len(payload)
    if length > MAX_PAYLOAD_LENGTH:
        raise EncodeError(
            f"fixed frame payload of {length} bytes exceeds the {MAX_PAYLOAD_LENGTH}-byte limit"
        )
    return MAGIC_WORD + _LENGTH.pack(length) + bytes(payload)


def _magic_prefix(head: bytes) -> bool:
    """Whether `head` (1 or more bytes) is where a frame may start: the magic word or part of it."""
    return head[:4] == MAGIC_WORD if len(head) >= 4 else MAGIC_WORD.startswith(head)


def _partial_magic_suffix(data: bytes | bytearray, start: int) -> int:
    """Length (0-3) of the longest end of `data[start:]` that begins a magic word."""
    for keep in (3, 2, 1):
        if len(data) - keep >= start and data[len(data) - keep :] == MAGIC_WORD[:keep]:
            return keep
    return 0


# --- frame-at-a-time reading -------------------------------------------------------------


def _read_upto(reader: BinaryIO, n: int) -> bytes:
    """Read `n` bytes, fewer only at the end of data."""
    data = reader.read(n)
    if data is None:
        raise BlockingIOError("reader has no data available (non-blocking reader)")
    if len(data) == n or not data:
        return bytes(data)
    parts = [bytes(data)]
    got = len(data)
    while got < n:
        more = reader.read(n - got)
        if not more:
            break
        parts.append(bytes(more))
        got += len(more)
    return b"".join(parts)


def _seekable(reader: BinaryIO) -> bool:
    try:
        return bool(reader.seekable())
    except (AttributeError, ValueError):
        return False


def unpack_fixed_frame(reader: BinaryIO) -> bytes:
    """The next whole fixed frame of `reader`, header included; `b""` at a clean end of data.

    On a bad magic word it discards through to the next magic word (or to the end
    of data, but for a trailing start of a magic word) and raises DesyncDetected
    whose `.skipped` holds the discarded bytes; the next call continues in sync.
    A frame cut short by the end of data raises TruncatedFrame. As in Gazette, a
    lone `\\n` at the end of data is a clean end.

    `reader` is seekable (io.BytesIO, a file, io.BufferedReader over a file) or
    has `peek()` (io.BufferedReader over a pipe). A seekable reader is always
    re-synchronised at the exact magic word; a non-seekable one is scanned through
    what it has buffered, and where its buffer runs short mid-header the frame
    after a desync may be skipped too (its bytes are then in `.skipped`).
    """
    if _seekable(reader):
        return _unpack_seekable(reader)
    if not callable(getattr(reader, "peek", None)):
        raise TypeError(
            f"unpack_fixed_frame needs a seekable reader or one with peek(), "
            f"such as io.BufferedReader; got {type(reader).__name__}"
        )
    return _unpack_peekable(reader)


def _finish_frame(reader: BinaryIO, header: bytes) -> bytes:
    size = HEADER_LENGTH + _LENGTH.unpack_from(header, 4)[0]
    rest = _read_upto(reader, size - HEADER_LENGTH)
    frame = header + rest
    if len(frame) < size:
        raise TruncatedFrame(
            f"data ends {len(frame)} bytes into a {size}-byte frame",
            what="truncated fixed frame",
            data=frame,
        )
    return frame


def _truncated_header(head: bytes) -> TruncatedFrame:
    return TruncatedFrame(
        f"data ends {len(head)} bytes into a frame header: {snippet(head)}",
        what="truncated fixed frame",
        data=head,
    )


def _desync(skipped: bytes) -> DesyncDetected:
    return DesyncDetected(
        f"skipped {len(skipped)} bytes with no magic word (66 33 93 36): {snippet(skipped)}",
        data=skipped,
    )


def _unpack_seekable(reader: BinaryIO) -> bytes:
    start = reader.tell()
    head = _read_upto(reader, HEADER_LENGTH)
    if not head:
        return b""
    if _magic_prefix(head):
        if len(head) < HEADER_LENGTH:
            raise _truncated_header(head)
        return _finish_frame(reader, head)
    if head == b"\n":  # Gazette tolerates one trailing newline after the last frame
        return b""
    # De-synchronised: find the next magic word after the first byte, then rewind to it.
    reader.seek(start + 1)
    skipped = bytearray(head[:1])
    while True:
        chunk = _read_upto(reader, _SCAN_CHUNK)
        window = bytes(skipped[-3:]) + chunk
        found = window.find(MAGIC_WORD)
        if found >= 0:
            back = len(window) - found  # bytes read from the magic word on: give them back
            reader.seek(-back, io.SEEK_CUR)
            if back > len(chunk):  # the magic word began in the last bytes taken as skipped
                del skipped[len(skipped) - (back - len(chunk)) :]
            else:
                skipped += chunk[: len(chunk) - back]
            raise _desync(bytes(skipped))
        skipped += chunk
        if len(chunk) < _SCAN_CHUNK:
            # End of data: all garbage, but for a start of a magic word, which the next
            # call reports as a truncated frame.
            keep = _partial_magic_suffix(skipped, 1)
            if keep:
                del skipped[-keep:]
                reader.seek(-keep, io.SEEK_CUR)
            raise _desync(bytes(skipped))


def _unpack_peekable(reader: Any) -> bytes:
    head = reader.peek(HEADER_LENGTH)[:HEADER_LENGTH]
    if not head:
        return b""
    taken = b""
    if len(head) < HEADER_LENGTH:
        # The reader's buffer runs short: take the header bytes outright.
        head = taken = _read_upto(reader, HEADER_LENGTH)
    if _magic_prefix(head):
        if len(head) < HEADER_LENGTH:
            raise _truncated_header(head)
        if not taken:
            reader.read(HEADER_LENGTH)
        return _finish_frame(reader, head)
    if head == b"\n" and taken:
        return b""
    skipped = bytearray(taken or reader.read(1))
    while True:
        view = reader.peek(_SCAN_CHUNK)
        if not view:
            raise _desync(bytes(skipped))
        window = view[:_SCAN_CHUNK]
        found = window.find(MAGIC_WORD)
        if found >= 0:
            skipped += reader.read(found)
            raise _desync(bytes(skipped))
        keep = _partial_magic_suffix(window, 0)
        if keep == len(window):  # only a partial magic word is buffered: take it and go on
            keep = 0
        skipped += reader.read(len(window) - keep)


# --- messages ----------------------------------------------------------------------------

_NIL_FIELDS: tuple[bytes, int, Flags | int] = (bytes(6), 0, Flags.OUTSIDE_TXN)


@dataclass(slots=True)
class RawPayload:
    """A fixed-frame payload kept as bytes, for tools that read without the protobuf schema.

    It has the nil UUID, so every RawPayload is delivered as if outside any
    transaction: exactly-once reading needs a real factory such as
    `ProtoMessage.factory(MyProto)`.
    """

    payload: bytes

    def get_uuid(self) -> Any:
        return NIL_UUID

    def uuid_fields(self) -> tuple[bytes, int, Flags | int]:
        return _NIL_FIELDS

    def set_uuid(self, u: Any) -> None:
        raise TypeError("a RawPayload has no UUID field; publish a ProtoMessage instead")

    def new_acknowledgement(self, journal: str) -> "RawPayload":
        raise TypeError("a RawPayload cannot acknowledge; publish a ProtoMessage instead")


class FixedFraming:
    """Protobuf payloads in fixed frames (Gazette's FixedFraming).

    Decoding needs a `new_message(payload: bytes)` factory, given to the framing
    or to `decode`: usually `ProtoMessage.factory(MyProto)`, or `RawPayload` to
    keep payloads as bytes. There is no silent default, since payloads decoded
    without their schema have no UUID and would defeat exactly-once reading.
    """

    content_type = CONTENT_TYPE_PROTOBUF_FIXED

    def __init__(self, new_message: Callable[[bytes], Any] | None = None) -> None:
        self.new_message = new_message

    def __repr__(self) -> str:
        return f"FixedFraming(new_message={self.new_message!r})"

    def marshal(self, msg: Any) -> bytes:
        """The fixed frame of a ProtoMessage, a protobuf message, a RawPayload or raw bytes."""
        if isinstance(msg, ProtoMessage):
            payload = msg.proto.SerializeToString()
        elif isinstance(msg, RawPayload):
            payload = msg.payload
        elif isinstance(msg, (bytes, bytearray, memoryview)):
            payload = msg
        elif callable(getattr(msg, "SerializeToString", None)):
            payload = msg.SerializeToString()
        else:
            raise TypeError(
                "fixed framing marshals a ProtoMessage, a protobuf message, a RawPayload "
                f"or bytes, not {type(msg).__name__}"
            )
        return encode_fixed_frame(payload)

    def decode(
        self,
        buf: Buffer,
        *,
        journal: str,
        base: int = 0,
        final: bool = False,
        new_message: Callable[[bytes], Any] | None = None,
    ) -> DecodeResult:
        """Decode every whole frame of `buf` (see `Framing.decode`).

        Bytes that are not a frame raise DesyncDetected covering them up to the
        next magic word, or up to the end of the buffer but for a trailing start
        of a magic word (that may begin a frame: a partial frame as above).
        """
        factory = new_message or self.new_message
        if factory is None:
            raise TypeError(
                f"journal {journal}: decoding fixed frames needs new_message, e.g. "
                "ProtoMessage.factory(YourProto) (or RawPayload to keep raw payloads)"
            )
        n = len(buf)
        if not n:
            return DecodeResult([], 0, base)
        if not final and _incomplete_first_frame(buf, n):
            return DecodeResult([], 0, base)  # cheap when a big frame arrives in small pieces
        data = buf if isinstance(buf, bytes) else bytes(buf)

        envelopes: list[Envelope] = []
        append = envelopes.append
        unpack = _HEADER.unpack_from
        magic_word = MAGIC_WORD
        pos = 0
        with gc_paused():
            while n - pos >= HEADER_LENGTH:
                magic, size = unpack(data, pos)
                if magic != magic_word:
                    break
                end = pos + HEADER_LENGTH + size
                if end > n:
                    break
                try:
                    message = factory(data[pos + HEADER_LENGTH : end])
                except Exception as exc:
                    frame = data[pos:end]
                    raise MalformedFrame(
                        f"{type(exc).__name__}: {exc}: {snippet(frame)}",
                        what="malformed protobuf frame",
                        journal=journal,
                        begin=base + pos,
                        end=base + end,
                        data=frame,
                        envelopes=envelopes,
                    ) from exc
                append(Envelope(journal, base + pos, base + end, message))
                pos = end
            batch_built(len(envelopes))

        rest = n - pos
        if not rest:
            return DecodeResult(envelopes, pos, base + pos)
        if _magic_prefix(data[pos : pos + 4]):
            if not final:
                return DecodeResult(envelopes, pos, base + pos)
            raise TruncatedFrame(
                _truncation_reason(data, pos),
                what="truncated fixed frame",
                journal=journal,
                begin=base + pos,
                end=base + n,
                data=data[pos:],
                envelopes=envelopes,
            )
        if rest == 1 and data[pos] == 0x0A:  # Gazette tolerates one trailing newline
            if final:
                return DecodeResult(envelopes, n, base + n)
            return DecodeResult(envelopes, pos, base + pos)
        found = data.find(magic_word, pos + 1)
        if found < 0:  # garbage through the end, but for a start of a magic word
            found = n - _partial_magic_suffix(data, pos + 1)
        skipped = data[pos:found]
        raise DesyncDetected(
            f"skipped {len(skipped)} bytes with no magic word (66 33 93 36): {snippet(skipped)}",
            journal=journal,
            begin=base + pos,
            end=base + found,
            data=skipped,
            envelopes=envelopes,
        )


def _incomplete_first_frame(buf: Buffer, n: int) -> bool:
    """Whether `buf` starts with a frame (or frame header) that is not yet whole."""
    if n < HEADER_LENGTH:
        return _magic_prefix(bytes(buf[:4]))
    magic: bytes
    size: int
    magic, size = _HEADER.unpack_from(buf, 0)
    return magic == MAGIC_WORD and HEADER_LENGTH + size > n


def _truncation_reason(data: bytes, pos: int) -> str:
    rest = len(data) - pos
    if rest < HEADER_LENGTH:
        return f"data ends {rest} bytes into a frame header: {snippet(data[pos:])}"
    size = HEADER_LENGTH + _LENGTH.unpack_from(data, pos + 4)[0]
    return f"data ends {rest} bytes into a {size}-byte frame"
