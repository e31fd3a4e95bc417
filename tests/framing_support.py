"""Support for the framing tests and benchmark: a run-time protobuf class, stream helpers.

`event_class()` is `oncelog.test.Event { string uuid = 1; int64 seq = 2; string user = 3;
bool ok = 4; repeated string tags = 5; bytes blob = 6; }`, made from a
FileDescriptorProto in a private descriptor pool, so no generated code is needed.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from oncelog.framing import DesyncDetected, FrameDecodeError, Framing, decode_stream
from oncelog.message import Envelope

_F = descriptor_pb2.FieldDescriptorProto

_FIELDS = [
    ("uuid", _F.TYPE_STRING, _F.LABEL_OPTIONAL),
    ("seq", _F.TYPE_INT64, _F.LABEL_OPTIONAL),
    ("user", _F.TYPE_STRING, _F.LABEL_OPTIONAL),
    ("ok", _F.TYPE_BOOL, _F.LABEL_OPTIONAL),
    ("tags", _F.TYPE_STRING, _F.LABEL_REPEATED),
    ("blob", _F.TYPE_BYTES, _F.LABEL_OPTIONAL),
]


@functools.cache
def event_class() -> Any:
    """The `oncelog.test.Event` message class (built once)."""
    file_proto = descriptor_pb2.FileDescriptorProto(
        name="oncelog_test_event.proto", package="oncelog.test", syntax="proto3"
    )
    message = file_proto.message_type.add(name="Event")
    for number, (name, kind, label) in enumerate(_FIELDS, start=1):
        message.field.add(name=name, number=number, type=kind, label=label)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("oncelog.test.Event"))


def decode_chunks(
    framing: Framing,
    chunks: Iterable[bytes],
    *,
    journal: str = "logs/test",
    offset: int = 0,
    new_message: Any = None,
) -> tuple[list[Envelope], list[tuple[str, int, int, bytes]]]:
    """Decode chunks, skipping bad bytes: the envelopes and the bad ranges.

    Bad ranges are (error class name, begin, end, bytes); adjacent desync ranges
    are merged, since where a chunk ends decides how far one report reaches.
    """
    errors: list[FrameDecodeError] = []
    envelopes = list(
        decode_stream(
            framing, chunks, journal=journal, offset=offset, new_message=new_message,
            on_error=errors.append,
        )
    )
    return envelopes, _ranges(errors)


def decode_one_shot(
    framing: Framing,
    data: bytes,
    *,
    journal: str = "logs/test",
    offset: int = 0,
    new_message: Any = None,
) -> tuple[list[Envelope], list[tuple[str, int, int, bytes]]]:
    """Like `decode_chunks`, but with `decode(final=True)` calls on the whole data only."""
    envelopes: list[Envelope] = []
    errors: list[FrameDecodeError] = []
    base = offset
    while True:
        try:
            result = framing.decode(
                data[base - offset :], journal=journal, base=base, final=True,
                new_message=new_message,
            )
        except FrameDecodeError as err:
            envelopes.extend(err.envelopes)
            errors.append(err)
            assert err.end is not None and err.end > base
            base = err.end
            continue
        envelopes.extend(result.envelopes)
        assert result.next_offset == offset + len(data)
        return envelopes, _ranges(errors)


def _ranges(errors: list[FrameDecodeError]) -> list[tuple[str, int, int, bytes]]:
    ranges: list[tuple[str, int, int, bytes]] = []
    for err in errors:
        assert err.end is not None and err.begin is not None
        if (
            ranges
            and isinstance(err, DesyncDetected)
            and ranges[-1][0] == "DesyncDetected"
            and ranges[-1][2] == err.begin
        ):
            name, begin, _, data = ranges.pop()
            ranges.append((name, begin, err.end, data + err.data))
        else:
            ranges.append((type(err).__name__, err.begin, err.end, err.data))
    return ranges


def split_at(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    """`data` cut at the given offsets (sorted, deduplicated)."""
    points = [0, *sorted(set(c for c in cuts if 0 < c < len(data))), len(data)]
    return [data[a:b] for a, b in zip(points, points[1:])]
