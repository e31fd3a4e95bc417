"""Messages of a journal with the exact bytes of their frames, and how the CLI prints them.

`read` prints frames as they are stored (`--format raw`), so it decodes journal bytes
itself: each Envelope's message is a `Framed` holding the decoded message and its frame's
bytes. Committed reading runs these through a Sequencer, exactly as `read_committed` does.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Generator, Iterator, Sequence
from datetime import UTC
from typing import TYPE_CHECKING, Any

import orjson

from oncelog.errors import BadMessage
from oncelog.framing import (
    CONTENT_TYPE_JSON_LINES,
    CONTENT_TYPE_PROTOBUF_FIXED,
    FrameDecodeError,
    Framing,
    RawPayload,
    decode_stream,
)
from oncelog.framing.csvlines import csv_record_doc
from oncelog.message import (
    CSVRecord,
    Envelope,
    Flags,
    JSONLine,
    JSONMessage,
    ProtoMessage,
    build_uuid,
    clock_to_unix_ns,
    uuid_fields,
)

if TYPE_CHECKING:
    from oncelog.cli.output import Progress
    from oncelog.journal import JournalClient

__all__ = [
    "Framed",
    "BadMessage",
    "framed_envelopes",
    "committed_envelopes",
    "new_message_for",
    "FORMATTERS",
    "table_header",
]

CHUNK = 1 << 20
"""Journal bytes read per decode call."""


class Framed:
    """A decoded message together with the bytes of its frame."""

    __slots__ = ("message", "raw")

    def __init__(self, message: Any, raw: bytes) -> None:
        self.message = message
        self.raw = raw

    def uuid_fields(self) -> tuple[bytes, int, int]:
        fast = getattr(self.message, "uuid_fields", None)
        return fast() if fast is not None else uuid_fields(self.message.get_uuid())

    def get_uuid(self) -> Any:
        return self.message.get_uuid()


def new_message_for(
    content_type: str, fmt: str = "json", proto_class: type | None = None
) -> Callable[[Any], Any] | None:
    """The message factory the CLI decodes `content_type` with: protobuf payloads are
    parsed with `proto_class` (the class the journal records), else kept as bytes; JSON
    lines printed as text (`raw`, `table`) are read lazily (JSONLine: the UUID taken from
    the line, the document never parsed); other framings and formats use their default
    messages."""
    if content_type == CONTENT_TYPE_PROTOBUF_FIXED:
        return RawPayload if proto_class is None else ProtoMessage.factory(proto_class)
    if content_type == CONTENT_TYPE_JSON_LINES and fmt in ("raw", "table"):
        return JSONLine
    return None


ErrorHandler = Callable[[Exception], None]


def framed_envelopes(
    client: JournalClient,
    journal: str,
    framing: Framing,
    offset: int,
    *,
    new_message: Callable[[Any], Any] | None = None,
    block: bool = False,
    end: int | None = None,
    on_error: ErrorHandler | None = None,
    progress: Progress | None = None,
    exact: bool = False,
) -> Generator[Envelope, None, None]:
    """Envelopes of `journal` from `offset` (to `end`, or the head, or forever with `block`),
    each message a `Framed` with its UUID fields already parsed. Bad frames and bad
    messages raise, or go to `on_error` and are skipped. `exact`: offset 0 is not "the
    first available" (a replay)."""
    reader = client.read(journal, offset, block=block, exact=exact)
    window = bytearray()  # journal bytes from `window_base` that may hold frames to come
    window_base = reader.offset
    consumed = reader.offset  # the end of the last frame handed out
    start = reader.offset

    def chunks() -> Iterator[bytes]:
        nonlocal window_base
        while True:
            size = CHUNK if end is None else min(CHUNK, end - reader.offset)
            if size <= 0:
                return
            chunk = reader.read(size)
            if not chunk:
                return
            # Drop the frames handed out, once per chunk (not per frame: a bytearray
            # shrinks from the front by moving what follows).
            del window[: consumed - window_base]
            window_base = consumed
            window.extend(chunk)
            if progress is not None:
                progress.update(reader.offset - start)
            yield chunk

    def skip(exc: FrameDecodeError) -> None:
        assert on_error is not None
        on_error(exc)

    try:
        for env in decode_stream(
            framing,
            chunks(),
            journal=journal,
            offset=start,
            new_message=new_message,
            on_error=skip if on_error is not None else None,
        ):
            message = env.message
            raw = (
                message.line
                if type(message) is JSONLine
                else bytes(window[env.begin - window_base : env.end - window_base])
            )
            framed = Framed(message, raw)
            consumed = env.end
            out = Envelope(journal, env.begin, env.end, framed)
            try:
                # Parsed once, here, where the offsets are known for errors; the decoder
                # has usually parsed them already (in bulk), so they are carried over.
                out._ids = env.ids
            except (ValueError, TypeError) as exc:
                bad = BadMessage(str(exc), journal=journal, begin=env.begin, end=env.end)
                if on_error is None:
                    raise bad from None
                on_error(bad)
                continue
            yield out
    finally:
        reader.close()


def committed_envelopes(
    client: JournalClient,
    journal: str,
    framing: Framing,
    offset: int,
    *,
    new_message: Callable[[Any], Any] | None = None,
    block: bool = False,
    on_error: ErrorHandler | None = None,
    progress: Progress | None = None,
) -> Iterator[Envelope]:
    """The committed envelopes of `journal` from `offset`, each once, acknowledgements
    left out; rolled-back and duplicate messages are dropped, replays read as needed."""
    from oncelog.sequencer import Sequencer

    def replay(name: str, begin: int, stop: int) -> Iterator[Envelope]:
        return framed_envelopes(
            client, name, framing, begin, new_message=new_message, end=stop,
            on_error=on_error, exact=True,
        )

    uncommitted = framed_envelopes(
        client,
        journal,
        framing,
        offset,
        new_message=new_message,
        block=block,
        on_error=on_error,
        progress=progress,
    )
    try:
        for env in Sequencer().sequence(uncommitted, replay):
            if env.ids[2] != Flags.ACK_TXN:
                yield env
    finally:
        uncommitted.close()


# -- printing ---------------------------------------------------------------------------------


def _flags_name(flags: int) -> str | int:
    try:
        return Flags(flags).name
    except ValueError:
        return flags


def _time(clock: int) -> str | None:
    if not clock:
        return None
    ns = clock_to_unix_ns(clock)
    from datetime import datetime

    moment = datetime.fromtimestamp(ns // 1_000_000_000, tz=UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{ns % 1_000_000_000 // 100:07d}Z"


def _body(message: Any) -> Any:
    if isinstance(message, (JSONMessage, JSONLine)):
        return message.doc
    if isinstance(message, CSVRecord):
        return message.fields
    if isinstance(message, RawPayload):
        return base64.b64encode(message.payload).decode("ascii")
    if isinstance(message, ProtoMessage):
        return _proto_json(message)
    return repr(message)


def _proto_json(message: ProtoMessage) -> Any:
    """A protobuf message as its canonical JSON mapping (field names as in the .proto)."""
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(message.proto, preserving_proto_field_name=True)


def format_raw(env: Envelope) -> bytes:
    """The frame exactly as stored."""
    raw: bytes = env.message.raw
    return raw


def format_json(env: Envelope, columns: Sequence[str] | None = None) -> bytes:
    """One JSON object per message: where it is, its UUID parts, and the message
    (a JSON document, a list of CSV fields, or a base64 protobuf payload). With `columns`
    (a CSV journal's recorded header), a CSV record is an object keyed by them."""
    producer, clock, flags = env.ids
    message = env.message.message
    body = (
        csv_record_doc(message.fields, columns)
        if columns is not None and isinstance(message, CSVRecord)
        else _body(message)
    )
    doc = {
        "journal": env.journal,
        "begin": env.begin,
        "end": env.end,
        "uuid": str(build_uuid(producer, clock, flags)) if clock else None,
        "producer": producer.hex(),
        "clock": clock,
        "time": _time(clock),
        "flags": _flags_name(flags),
        "message": body,
    }
    return orjson.dumps(doc, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS)


def _text(framed: Framed) -> str:
    if isinstance(framed.message, ProtoMessage):
        return orjson.dumps(_proto_json(framed.message)).decode("utf-8")
    if isinstance(framed.message, RawPayload):
        payload = framed.message.payload
        more = "..." if len(payload) > 16 else ""
        return f"<{len(payload)}-byte payload {payload[:16].hex()}{more}>"
    text = framed.raw.decode("utf-8", errors="backslashreplace").rstrip("\r\n")
    return text.replace("\r", "\\r").replace("\n", "\\n")


_TABLE_ROW = "{:<24} {:>12} {:<28} {:<13} {}\n"


def table_header() -> bytes:
    """The header line of `--format table`."""
    return _TABLE_ROW.format("JOURNAL", "OFFSET", "TIME", "FLAGS", "MESSAGE").encode()


def format_table(env: Envelope) -> bytes:
    """One aligned line per message: journal, offset, time, flags and the frame's text."""
    _, clock, flags = env.ids
    line = _TABLE_ROW.format(
        env.journal, env.begin, _time(clock) or "-", str(_flags_name(flags)), _text(env.message)
    )
    return line.encode("utf-8", errors="backslashreplace")


FORMATTERS: dict[str, Callable[[Envelope], bytes]] = {
    "raw": format_raw,
    "json": format_json,
    "table": format_table,
}
"""How `read --format` prints one message."""
