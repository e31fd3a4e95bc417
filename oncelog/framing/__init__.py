"""Framings: how messages are laid out as bytes in a journal, by content type.

`for_content_type(ct)` gives the framing of a journal's `content-type` label:

| content type | frame |
| --- | --- |
| `application/x-ndjson` | one JSON object per `\\n`-terminated line (JSONFraming) |
| `text/csv` | one RFC 4180 record, quoted newlines allowed (CSVFraming) |
| `application/x-protobuf-fixed` | `66 33 93 36`, little-endian length, payload (FixedFraming) |
"""

from oncelog.framing.base import (
    CONTENT_TYPE_CSV,
    CONTENT_TYPE_JSON_LINES,
    CONTENT_TYPE_PROTOBUF_FIXED,
    DecodeResult,
    DesyncDetected,
    EncodeError,
    FrameDecodeError,
    Framing,
    FramingError,
    MalformedFrame,
    TruncatedFrame,
    UnknownContentType,
    content_types,
    decode_batches,
    decode_stream,
    for_content_type,
    register,
    set_gc_pausing,
)
from oncelog.framing.csvlines import CSVFraming
from oncelog.framing.fixed import (
    HEADER_LENGTH,
    MAGIC_WORD,
    FixedFraming,
    RawPayload,
    encode_fixed_frame,
    unpack_fixed_frame,
)
from oncelog.framing.jsonlines import JSONFraming, unpack_line

__all__ = [
    "CONTENT_TYPE_CSV",
    "CONTENT_TYPE_JSON_LINES",
    "CONTENT_TYPE_PROTOBUF_FIXED",
    "HEADER_LENGTH",
    "MAGIC_WORD",
    "CSVFraming",
    "DecodeResult",
    "DesyncDetected",
    "EncodeError",
    "FixedFraming",
    "FrameDecodeError",
    "Framing",
    "FramingError",
    "JSONFraming",
    "MalformedFrame",
    "RawPayload",
    "TruncatedFrame",
    "UnknownContentType",
    "content_types",
    "decode_batches",
    "decode_stream",
    "encode_fixed_frame",
    "for_content_type",
    "register",
    "set_gc_pausing",
    "unpack_fixed_frame",
    "unpack_line",
]

register(JSONFraming())
register(CSVFraming())
register(FixedFraming())
