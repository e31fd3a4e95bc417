"""JSON lines framing (`application/x-ndjson`): one JSON object per `\\n`-terminated line."""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat
from operator import add
from typing import Any, BinaryIO

import orjson

from oncelog import _native
from oncelog.framing.base import (
    CONTENT_TYPE_JSON_LINES,
    Buffer,
    DecodeResult,
    EncodeError,
    FrameDecodeError,
    MalformedFrame,
    TruncatedFrame,
    batch_built,
    build_envelopes,
    frame_offsets,
    gc_paused,
    map_until_error,
    snippet,
)
from oncelog.identity import Envelope, parse_uuid_fields
from oncelog.message import JSONLine, JSONMessage, lazy_uuid_text

__all__ = ["JSONFraming", "unpack_line"]

_loads = orjson.loads
_dumps = orjson.dumps
_APPEND_NEWLINE = orjson.OPT_APPEND_NEWLINE

# `new_message=JSONLine` asks for lazy decoding. JSONLine is a marker there, not a factory of
# documents (it is built from the line), so it is compared as a plain object.
_LAZY: object = JSONLine


def unpack_line(reader: BinaryIO) -> bytes:
    """The next line of `reader` including its `\\n`; `b""` at a clean end of data.

    A final line with no `\\n` raises TruncatedFrame holding the partial line.
    """
    line = reader.readline()
    if not line or line[-1:] == b"\n":
        return bytes(line)
    raise TruncatedFrame(
        f"data ends inside a line of {len(line)} bytes with no newline: {snippet(line)}",
        what="truncated line",
        data=line,
    )


class JSONFraming:
    """JSON documents, one object per line, written by orjson.

    Decoding yields `JSONMessage(doc, uuid_field)` unless a `new_message(doc)`
    factory is given (to the framing or to one `decode` call). UUIDs are not
    parsed while decoding: Envelopes parse them on first use.
    """

    content_type = CONTENT_TYPE_JSON_LINES

    def __init__(
        self,
        uuid_field: str = "uuid",
        new_message: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        self.uuid_field = uuid_field
        self.new_message = new_message

    def __repr__(self) -> str:
        return f"JSONFraming(uuid_field={self.uuid_field!r})"

    def marshal(self, msg: JSONMessage | dict[str, Any]) -> bytes:
        """One line: the compact JSON of a JSONMessage's document (or of a dict) and `\\n`."""
        if isinstance(msg, JSONMessage):
            doc = msg.doc
        elif isinstance(msg, dict):
            doc = msg
        else:
            raise TypeError(
                f"JSON framing marshals a JSONMessage or a dict, not {type(msg).__name__}"
            )
        if not isinstance(doc, dict):
            raise EncodeError(f"a JSON frame must be an object, not {type(doc).__name__}")
        try:
            line = _dumps(doc, option=_APPEND_NEWLINE)
        except orjson.JSONEncodeError as exc:
            raise EncodeError(f"cannot encode document as JSON: {exc}") from exc
        if line.find(b"\n") != len(line) - 1:  # only an orjson.Fragment can smuggle one in
            raise EncodeError(f"JSON encoding contains a raw newline: {snippet(line)}")
        return line

    def decode(
        self,
        buf: Buffer,
        *,
        journal: str,
        base: int = 0,
        final: bool = False,
        new_message: Callable[[dict[str, Any]], Any] | None = None,
    ) -> DecodeResult:
        """Decode every complete line of `buf` (see `Framing.decode`)."""
        # Lines cut from bytes parse faster than lines cut from a bytearray.
        data = buf if type(buf) is bytes else bytes(buf)
        cut = data.rfind(b"\n") + 1
        factory = new_message or self.new_message
        if factory is _LAZY:
            return self._decode_lazy(data, journal, base, final, cut)
        envelopes: list[Envelope] = []
        done = 0
        native = _native.speedups
        if native is not None and factory is None and cut:
            # C: every line up to the first one that is not a JSON object, UUIDs parsed;
            # the lines parsed by one orjson call where that is exact (decode_json_chunk).
            with gc_paused():
                envelopes, done = native.decoder.decode_json_chunk(
                    data, base, journal, self.uuid_field, cut
                )
                batch_built(len(envelopes))
        if done < cut:
            try:
                envelopes += self._decode_lines(data[done:cut], journal, base + done, factory)
            except FrameDecodeError as exc:
                exc.envelopes[:0] = envelopes
                raise
        return _result(data, cut, journal, base, final, envelopes)

    def _decode_lazy(
        self, data: bytes, journal: str, base: int, final: bool, cut: int
    ) -> DecodeResult:
        """`decode` into JSONLines (see oncelog.message.JSONLine): lines whose UUID field is
        their last member (`..., "uuid":"<uuid>"}`: what `publish_many` writes), or their first
        with no later occurrence of the key nor a `\\u` escape (either could hide a second,
        overriding key), are not parsed: their UUID is read from the line. Any other line is
        parsed as eager decoding would, with the same errors."""
        field = self.uuid_field
        prefix = b'{"' + field.encode() + b'":"'
        key = b'"' + field.encode() + b'"'
        native = _native.speedups
        lazy_c = native.decode_json_lazy if native is not None else None
        envelopes: list[Envelope] = []
        pos = 0
        with gc_paused():
            while pos < cut:
                if lazy_c is not None:
                    # C: the run of lines it can take unparsed, up to the first it cannot.
                    run, pos = lazy_c(data, base, journal, field, pos, cut)
                    envelopes += run
                    if pos >= cut:
                        break
                    stop = data.index(b"\n", pos) + 1
                else:
                    stop = cut
                for line in _split_lines(data[pos:stop]):
                    begin = base + pos
                    pos += len(line)
                    ids = None
                    text = lazy_uuid_text(line, prefix, key)
                    if text is not None:
                        try:
                            ids = parse_uuid_fields(text.decode("ascii"))
                        except (ValueError, UnicodeDecodeError):
                            ids = None
                    if ids is not None:
                        msg = JSONLine(line, field, journal, begin)
                        env = Envelope(journal, begin, pos + base, msg)
                        env._ids = ids
                    else:
                        try:
                            (eager,) = self._decode_lines(line, journal, begin, None)
                        except FrameDecodeError as exc:
                            exc.envelopes[:0] = envelopes
                            raise
                        doc = eager.message.doc
                        msg = JSONLine(line, field, journal, begin, doc)
                        env = Envelope(journal, begin, pos + base, msg)
                        env._ids = eager._ids
                    envelopes.append(env)
            batch_built(len(envelopes))
        return _result(data, cut, journal, base, final, envelopes)

    def _decode_lines(
        self,
        data: bytes,
        journal: str,
        base: int,
        factory: Callable[[dict[str, Any]], Any] | None,
    ) -> list[Envelope]:
        """Envelopes of the whole lines `data` holds (pure Python); a bad line raises
        MalformedFrame carrying the envelopes before it."""
        lines = _split_lines(data)

        with gc_paused():
            docs, limit, cause = map_until_error(_loads, lines)
            what, reason = "malformed JSON frame", str(cause)
            if not all(map(isinstance, docs, repeat(dict))):
                limit = next(i for i, d in enumerate(docs) if not isinstance(d, dict))
                reason = f"a JSON frame must be an object, not {type(docs[limit]).__name__}"
                cause = None
                del docs[limit:]
            if factory is None:
                uuid_field = self.uuid_field
                if uuid_field == "uuid":
                    messages: Any = map(JSONMessage, docs)
                else:
                    messages = map(JSONMessage, docs, repeat(uuid_field))
            else:
                messages, bad, error = map_until_error(factory, docs)
                if bad is not None:
                    limit, cause = bad, error
                    what = "JSON frame rejected by new_message"
                    reason = f"{type(error).__name__}: {error}"
            offsets = frame_offsets(map(len, lines), base)
            envelopes = build_envelopes(journal, offsets, messages)
            batch_built(len(envelopes))

        if limit is not None:
            bad_line = bytes(lines[limit])
            raise MalformedFrame(
                f"{reason}: {snippet(bad_line)}",
                what=what,
                journal=journal,
                begin=offsets[limit],
                end=offsets[limit + 1],
                data=bad_line,
                envelopes=envelopes,
            ) from cause
        return envelopes


def _reparse_line(line: JSONLine) -> dict[str, Any]:
    """The document of a JSONLine whose line turned out not to be a JSON object, decoded
    again as eager reading decodes it: raises the MalformedFrame that raises, naming the
    journal and offsets (installed as `JSONLine._reparse`: oncelog.message cannot import
    this module, which imports it)."""
    (env,) = JSONFraming(line.uuid_field)._decode_lines(line.line, line.journal, line.begin, None)
    return env.message.doc  # type: ignore[no-any-return]


JSONLine._reparse = _reparse_line


def _split_lines(data: bytes) -> list[bytes]:
    """The whole lines of `data` (which ends with a newline), each with its newline."""
    if b"\r" in data:  # splitlines() would also split at a lone \r
        lines = data.split(b"\n")
        lines.pop()
        return list(map(add, lines, repeat(b"\n")))
    return data.splitlines(keepends=True)


def _result(
    data: bytes, cut: int, journal: str, base: int, final: bool, envelopes: list[Envelope]
) -> DecodeResult:
    """The result of decoding the lines of `data[:cut]` into `envelopes`; TruncatedFrame if
    the data is `final` and a line after `cut` has no newline."""
    if final and len(data) > cut:
        tail = data[cut:]
        raise TruncatedFrame(
            f"data ends inside a JSON line of {len(tail)} bytes with no newline: "
            f"{snippet(tail)}",
            what="truncated JSON frame",
            journal=journal,
            begin=base + cut,
            end=base + len(data),
            data=tail,
            envelopes=envelopes,
        )
    return DecodeResult(envelopes, cut, base + cut)
