"""Reading messages from journals: read-uncommitted and read-committed iterators.

`read_uncommitted` yields every framed message of a journal with its byte range.
`read_committed` runs them through a Sequencer, so only committed messages come
out, each exactly once, with replays of the journal performed when a committed
transaction left the sequencer's ring.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timezone
from itertools import chain
from typing import TYPE_CHECKING, Any, Callable, Generator, Iterable, Iterator, Literal

import orjson

from oncelog import _native
from oncelog.errors import SequencerError
from oncelog.framing import FrameDecodeError, decode_batches, for_content_type
from oncelog.framing.base import batch_built, gc_paused
from oncelog.framing.jsonlines import JSONFraming
from oncelog.identity import Envelope, clock_from_unix_ns
from oncelog.message import JSONLine, prime_ids
from oncelog.sequencer import ProducerState, Sequencer
from oncelog.sequencing import columnar as _columnar
from oncelog.sequencing.columnar import ColumnarState

if TYPE_CHECKING:
    from oncelog.journal import JournalClient

__all__ = [
    "read_uncommitted",
    "read_committed",
    "read_committed_batches",
    "read_uncommitted_batches",
    "CommittedBatch",
    "MessageReader",
    "OnError",
    "time_filter",
    "checkpoint_after_dequeued",
]

log = logging.getLogger(__name__)

DEFAULT_CHUNK: int | None = None
"""Bytes read from a journal per decode; None: adaptive (see `_ChunkSizer`)."""

_FRAMES_PER_CHUNK = 128
_MIN_CHUNK = 16 << 10
_MAX_CHUNK = 1 << 20
_FIRST_CHUNK = 64 << 10


class _ChunkSizer:
    """How many bytes a reader takes per decode: about `_FRAMES_PER_CHUNK` frames' worth at
    the size of the frames of the last batch, within [16 KiB, 1 MiB].

    Measured (1M JSON lines of ~70 bytes in 1,000-message transactions, read_committed on
    local disk): 1 MiB chunks ran at 0.78M messages/s, 64 KiB at 1.18M, 16 KiB at 1.61M; with
    ~1 KB lines 64 KiB was best (0.64M/s against 0.40M at 1 MiB and 0.56M at 16 KiB). A
    chunk's envelopes then stay in the CPU's caches from decoding to their use, and fewer
    objects are alive when the young-generation collector runs; small chunks also let the
    GIL go more often to other threads of the process (a consumer's commit thread). A fixed
    `chunk_size` disables the adaptation.
    """

    __slots__ = ("size", "fixed")

    def __init__(self, chunk_size: int | None) -> None:
        if chunk_size is not None and chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, not {chunk_size!r}")
        self.fixed = chunk_size is not None
        self.size = chunk_size if chunk_size is not None else _FIRST_CHUNK

    def saw(self, batch: list[Envelope]) -> None:
        """Adapt to the frames of a decoded batch (non-empty)."""
        span = batch[-1].end - batch[0].begin
        self.size = min(max(span * _FRAMES_PER_CHUNK // len(batch), _MIN_CHUNK), _MAX_CHUNK)

OnError = Literal["raise", "skip"] | Callable[[FrameDecodeError], None]
"""What to do with a malformed frame: raise it, skip it (logged), or call a handler
(which may raise to stop reading)."""

Position = int | Envelope
"""Where reading starts: a byte offset, -1 for the write head, or an Envelope (just after it)."""

TimeBound = datetime | int
"""A message time: an aware datetime or Unix nanoseconds."""


def _resolve_offset(journal: str, position: Position) -> int:
    if isinstance(position, Envelope):
        if position.journal != journal:
            raise ValueError(
                f"cannot start reading journal {journal!r} after an envelope of "
                f"{position.journal!r}"
            )
        return position.end
    if isinstance(position, bool) or not isinstance(position, int) or position < -1:
        raise ValueError(
            f"read offset of journal {journal!r} must be an int >= -1, not {position!r}"
        )
    return position


def _error_handler(on_error: OnError) -> Callable[[FrameDecodeError], None] | None:
    if on_error == "raise":
        return None
    if on_error == "skip":

        def skip(exc: FrameDecodeError) -> None:
            log.warning("skipping bad bytes: %s", exc)

        return skip
    if callable(on_error):
        return on_error
    raise ValueError(f"on_error must be 'raise', 'skip' or a callable, not {on_error!r}")


def _chunks(reader: Any, end: int | None, sizer: _ChunkSizer) -> Iterator[bytes]:
    while True:
        size = sizer.size
        if end is not None:
            size = min(size, end - reader.offset)
            if size <= 0:
                return
        chunk = reader.read(size)
        if not chunk:
            return
        yield chunk


def read_uncommitted(
    client: "JournalClient",
    journal: str,
    offset: Position = 0,
    *,
    new_message: Callable[[Any], Any] | None = None,
    block: bool = False,
    end: int | None = None,
    on_error: OnError = "raise",
    chunk_size: int | None = DEFAULT_CHUNK,
    on_open: Callable[[Any], None] | None = None,
    lazy: bool = False,
    exact: bool = False,
) -> Generator[Envelope, None, None]:
    """Every message of `journal` from `offset` on, committed or not, with its byte range.

    Stops at the write head (or at `end`), or tails new appends with `block=True`
    until the generator is closed. Bad frames raise a FrameDecodeError naming the
    journal and offsets, or are skipped with `on_error="skip"`. `on_open` receives
    the JournalReader once opened: closing it from another thread ends a blocked read.
    `chunk_size` fixes the bytes read per decode; by default it adapts to about 128
    frames (16 KiB to 1 MiB), which keeps decoded messages in the CPU's caches.
    `lazy=True` yields JSON lines as `JSONLine`s, parsed only when their `doc` is used
    (other framings are unaffected). Offset 0 means the first available offset (envelopes
    carry the offsets their messages were written at); `exact=True` makes it offset 0
    itself, so that a replay raises OffsetNotAvailable rather than start later.
    """
    for batch in read_uncommitted_batches(
        client, journal, offset, new_message=new_message, block=block, end=end,
        on_error=on_error, chunk_size=chunk_size, on_open=on_open, prime=False, lazy=lazy,
        exact=exact,
    ):
        yield from batch


def read_uncommitted_batches(
    client: "JournalClient",
    journal: str,
    offset: Position = 0,
    *,
    new_message: Callable[[Any], Any] | None = None,
    block: bool = False,
    end: int | None = None,
    on_error: OnError = "raise",
    chunk_size: int | None = DEFAULT_CHUNK,
    on_open: Callable[[Any], None] | None = None,
    prime: bool = True,
    lazy: bool = False,
    exact: bool = False,
) -> Generator[list[Envelope], None, None]:
    """`read_uncommitted`, a decoded chunk (a list of envelopes) at a time: the fast path
    for code that sequences or processes batches itself. With `prime=True` the batch's
    UUIDs are parsed in bulk first (`oncelog.message.prime_ids`)."""
    start = _resolve_offset(journal, offset)
    handler = _error_handler(on_error)
    sizer = _ChunkSizer(chunk_size)
    adapt = not sizer.fixed
    framing = for_content_type(client.get(journal).content_type)
    if lazy:
        new_message = _lazy_factory(framing, new_message)
    reader = client.read(journal, start, block=block, exact=exact)
    if on_open is not None:
        on_open(reader)
    native = _native.speedups
    try:
        chunks = _chunks(reader, end, sizer)
        if native is not None and new_message is None and type(framing) is JSONFraming:
            decoded = _json_batches(
                framing, chunks, journal, reader.offset, handler,
                native.decoder.decode_json_chunk,
            )
        else:
            decoded = decode_batches(
                framing, chunks, journal=journal, offset=reader.offset,
                new_message=new_message, on_error=handler,
            )
        for batch in decoded:
            if adapt and batch:
                sizer.saw(batch)
            if prime:
                with gc_paused():  # one tuple per envelope: no collections while built
                    prime_ids(batch)
                    batch_built(len(batch))
            yield batch
    finally:
        reader.close()


def _json_batches(
    framing: JSONFraming,
    chunks: Iterator[bytes],
    journal: str,
    offset: int,
    on_error: Callable[[FrameDecodeError], None] | None,
    decode: Callable[[bytes, int, str, str, int], tuple[list[Envelope], int]],
) -> Iterator[list[Envelope]]:
    """`decode_batches(framing, chunks, ...)` for eager JSON lines of the default message
    type, with the C decoder (`decode`: `Decoder.decode_json_chunk`): the same batches,
    envelopes and errors, with one copy of each chunk instead of three.

    Each chunk is decoded where `decode_batches` would decode it: the whole lines of the
    bytes pending (a line longer than the chunks waits for twice the bytes, as there).
    While the C decoder takes every line, its envelopes are the batch. At the first
    chunk it stops in (a line that is not a JSON object), `decode_batches` takes over the
    rest of the stream from the same pending bytes, in the same state, so the error (or
    `on_error`'s handling of it, and everything after) is exactly its own; so does the
    partial line left at the end of the data (its TruncatedFrame).
    """
    field = framing.uuid_field
    pending: list[bytes] = []  # the bytes not decoded yet, in pieces joined when needed
    size = 0  # their length
    base = offset
    wait_for = 0
    for chunk in chunks:
        pending.append(chunk)
        size += len(chunk)
        if size < wait_for:
            continue  # (joined only once there are enough: linear in a long line's bytes)
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        cut = data.rfind(b"\n") + 1
        if not cut:
            wait_for = 2 * len(data)
            pending = [data]
            continue
        with gc_paused():
            envelopes, done = decode(data, base, journal, field, cut)
            batch_built(len(envelopes))
        if done < cut:
            del envelopes
            yield from decode_batches(
                framing, chain([data], chunks), journal=journal, offset=base,
                on_error=on_error,
            )
            return
        wait_for = 0
        rest = data[cut:]
        pending = [rest] if rest else []
        size = len(rest)
        base += cut
        yield envelopes
    if size:
        yield from decode_batches(
            framing, [b"".join(pending)], journal=journal, offset=base, on_error=on_error
        )


def _lazy_factory(
    framing: Any, new_message: Callable[[Any], Any] | None
) -> Callable[[Any], Any] | None:
    """The message factory of a lazy read: JSONLine for JSON lines, else unchanged."""
    if new_message is not None and new_message is not JSONLine:
        raise ValueError("lazy=True reads JSONLine messages: it cannot take new_message")
    return JSONLine if isinstance(framing, JSONFraming) else None


def _replayer(
    client: "JournalClient",
    new_message: Callable[[Any], Any] | None,
    on_error: OnError,
    lazy: bool = False,
) -> Callable[[str, int, int], Iterable[Envelope]]:
    def replay(journal: str, begin: int, end: int) -> Iterable[Envelope]:
        # Exactly from `begin`: a transaction whose start was trimmed cannot be delivered
        # whole, and must not be delivered in part.
        return read_uncommitted(
            client, journal, begin, new_message=new_message, end=end, on_error=on_error,
            lazy=lazy, exact=True,
        )

    return replay


def read_committed(
    client: "JournalClient",
    journal: str,
    offset: Position = 0,
    *,
    sequencer: Sequencer | None = None,
    new_message: Callable[[Any], Any] | None = None,
    block: bool = False,
    include_acks: bool = False,
    on_error: OnError = "raise",
    chunk_size: int | None = DEFAULT_CHUNK,
    on_open: Callable[[Any], None] | None = None,
    lazy: bool = False,
) -> Generator[Envelope, None, None]:
    """The committed messages of `journal` from `offset` on, each exactly once, in commit order.

    Duplicates and rolled-back transactions are dropped; a transaction whose
    start has left the sequencer's ring is replayed from the journal. To resume
    from a checkpoint, pass `sequencer=Sequencer(offsets, states)` and
    `offset=offsets[journal]`. Acknowledgements themselves are not yielded
    unless `include_acks=True`. `lazy=True`: JSON lines come as `JSONLine`s, sequenced
    from the UUID at the start of each line and parsed only when `doc` is used.
    """
    start = _resolve_offset(journal, offset)
    if sequencer is None:
        if start == -1:
            start = client.head(journal)
        sequencer = Sequencer(offsets={journal: start})
    batches = read_uncommitted_batches(
        client, journal, start, new_message=new_message, block=block, on_error=on_error,
        chunk_size=chunk_size, on_open=on_open, lazy=lazy,
    )
    replay = _replayer(client, new_message, on_error, lazy)
    try:
        # One sequencing pass over the whole stream (UUIDs parsed in bulk a batch at a
        # time), dropping acknowledgements inside the sequencer's loop.
        yield from sequencer.sequence(
            chain.from_iterable(batches), replay, acks=include_acks
        )
    finally:
        batches.close()


class CommittedBatch:
    """The committed messages of one decoded chunk of a JSON-lines journal, as columns.

    Exactly the messages `read_committed` yields for that stretch of the journal, in the
    same order: frame `i` is `data[starts[i]:starts[i + 1]]` (the line as stored, newline
    included), read at journal offsets `[begins[i], ends[i])`, its UUID's fields
    `producers[6 * i:6 * i + 6]`, `clocks[i]` and `flags[i]`. No Python object is made per
    message: `data` and `producers` are bytes, the other columns read-only memoryviews of
    native int64 (`clocks`: uint64, `flags`: int32). `frames()` forwards frames without
    parsing them; `docs()` parses them.

    `checkpoint()` is the reader's checkpoint just after the batch (every message of it
    processed); it can be taken only until the next batch is read, as the reader moves on.
    """

    __slots__ = (
        "journal", "uuid_field", "data", "starts", "begins", "ends", "producers", "clocks",
        "flags", "_reader",
    )

    journal: str
    uuid_field: str
    data: bytes
    starts: memoryview
    begins: memoryview
    ends: memoryview
    producers: bytes
    clocks: memoryview
    flags: memoryview

    def __init__(
        self, journal: str, uuid_field: str, columns: Sequence[bytes],
        reader: "_BatchReader | None" = None,
    ) -> None:
        data, starts, begins, ends, producers, clocks, flags = columns
        self.journal, self.uuid_field, self.data, self.producers = (
            journal, uuid_field, data, producers,
        )
        self.starts = memoryview(starts).cast("q")
        self.begins = memoryview(begins).cast("q")
        self.ends = memoryview(ends).cast("q")
        self.clocks = memoryview(clocks).cast("Q")
        self.flags = memoryview(flags).cast("i")
        self._reader = reader

    def __len__(self) -> int:
        return len(self.begins)

    def __repr__(self) -> str:
        span = f"[{self.begins[0]}, {self.ends[-1]})" if len(self) else "[]"
        return f"CommittedBatch({self.journal!r}, {len(self)} messages, offsets {span})"

    def frame(self, i: int) -> memoryview:
        """Frame `i`'s bytes (a view of `data`)."""
        return memoryview(self.data)[self.starts[i] : self.starts[i + 1]]

    def frames(self) -> Iterator[memoryview]:
        """Each frame's bytes, newline included, as a view of `data` (nothing parsed)."""
        view, starts = memoryview(self.data), self.starts
        return (view[starts[i] : starts[i + 1]] for i in range(len(self)))

    def ids(self, i: int) -> tuple[bytes, int, int]:
        """(producer, clock, flags) of message `i`, as `Envelope.ids` has them."""
        return self.producers[6 * i : 6 * i + 6], self.clocks[i], self.flags[i]

    def docs(self) -> list[dict[str, Any]]:
        """Every message's document, parsed with orjson. A frame that is not a JSON object
        raises MalformedFrame naming the journal and its offsets, as eager reading does."""
        loads, data, starts = orjson.loads, self.data, self.starts
        try:
            docs = [loads(data[starts[i] : starts[i + 1]]) for i in range(len(self))]
        except orjson.JSONDecodeError:
            docs = None
        if docs is not None and all(type(d) is dict for d in docs):
            return docs
        # A bad frame: JSONLine parses as eager reading does, raising its MalformedFrame.
        return [
            JSONLine(bytes(self.frame(i)), self.uuid_field, self.journal, self.begins[i]).doc
            for i in range(len(self))
        ]

    def checkpoint(self, prune_horizon: Any = 0) -> tuple[dict[str, int], list[ProducerState]]:
        """Offsets and producer states from which a reader resumes just after this batch
        (`read_committed_batches(..., sequencer=Sequencer(offsets, states))`). Raises
        SequencerError once the next batch has been read: the reader has moved on."""
        reader = self._reader
        if reader is None or reader.current is not self:
            end = self.ends[-1] if len(self) else "?"
            raise SequencerError(
                f"checkpoint() of a batch of journal {self.journal!r} (ending at offset"
                f" {end}) taken after the next batch was read: take it before reading on"
            )
        columnar = reader.columnar
        if columnar is not None:
            columnar.sync(reader.sequencer)  # the fast path's state, told to the sequencer
            if prune_horizon:
                # Pruning forgets producers in the sequencer: it alone knows the state now.
                reader.columnar = None
        return reader.sequencer.checkpoint(prune_horizon)


class _BatchReader:
    """The reader state batches share: its sequencer, the batch last yielded, and the fast
    path's state while it runs (`columnar`: then the truth, the sequencer lagging behind it
    until told; None: the sequencer is exact)."""

    __slots__ = ("sequencer", "current", "columnar")

    def __init__(self, sequencer: Sequencer) -> None:
        self.sequencer = sequencer
        self.current: CommittedBatch | None = None
        self.columnar: ColumnarState | None = None


def _pack_frames(envelopes: list[Envelope]) -> tuple[bytes, ...]:
    """The columns of `CommittedBatch` for committed envelopes of JSONLines (C where built)."""
    native = _native.speedups
    if native is not None:
        packed: tuple[bytes, ...] = native.module.pack_frames(envelopes)
        return packed
    from array import array

    lines = [e.message.line for e in envelopes]
    starts = array("q", [0])
    pos = 0
    for line in lines:
        pos += len(line)
        starts.append(pos)
    ids = [e._ids or e.ids for e in envelopes]
    return (
        b"".join(lines),
        starts.tobytes(),
        array("q", [e.begin for e in envelopes]).tobytes(),
        array("q", [e.end for e in envelopes]).tobytes(),
        b"".join([i[0] for i in ids]),
        array("Q", [i[1] for i in ids]).tobytes(),
        array("i", [int(i[2]) for i in ids]).tobytes(),
    )


def read_committed_batches(
    client: "JournalClient",
    journal: str,
    offset: Position = 0,
    *,
    sequencer: Sequencer | None = None,
    block: bool = False,
    include_acks: bool = False,
    on_error: OnError = "raise",
    chunk_size: int | None = DEFAULT_CHUNK,
    on_open: Callable[[Any], None] | None = None,
) -> Generator[CommittedBatch, None, None]:
    """`read_committed(..., lazy=True)` of a JSON-lines journal, a `CommittedBatch` per
    decoded chunk: the same messages, order, offsets and UUID fields, as one buffer of
    frames and columns, with a checkpoint per batch (`batch.checkpoint()`).

    Chunks that commit nothing yield no batch. Lines are sequenced from the UUID read out
    of each line, as lazy reading does: a frame is parsed only if its UUID cannot be
    read out of it, or by `docs()`. Offsets, `sequencer`, `block`, `include_acks`,
    `on_error`, `chunk_size` and `on_open` are `read_committed`'s. A journal of another
    content type is a ValueError: its frames are not kept as bytes when decoded.
    """
    framing = for_content_type(client.get(journal).content_type)
    if not isinstance(framing, JSONFraming):
        raise ValueError(
            f"read_committed_batches reads JSON-lines journals; journal {journal!r} holds"
            f" {framing.content_type}: use read_committed"
        )
    start = _resolve_offset(journal, offset)
    if sequencer is None:
        if start == -1:
            start = client.head(journal)
        sequencer = Sequencer(offsets={journal: start})
    state = _BatchReader(sequencer)
    if on_error == "raise":
        yield from _columnar_batches(
            client, journal, start, state, framing, block, include_acks, chunk_size, on_open
        )
    else:
        yield from _envelope_batches(
            client, journal, start, state, framing, block, include_acks, on_error, chunk_size,
            on_open,
        )


def _envelope_batches(
    client: "JournalClient", journal: str, start: int, state: _BatchReader,
    framing: JSONFraming, block: bool, include_acks: bool, on_error: OnError,
    chunk_size: int | None, on_open: Callable[[Any], None] | None,
) -> Generator[CommittedBatch, None, None]:
    """`read_committed_batches` through envelopes alone (with an `on_error` handler)."""
    sequencer = state.sequencer
    batches = read_uncommitted_batches(
        client, journal, start, block=block, on_error=on_error, chunk_size=chunk_size,
        on_open=on_open, lazy=True,
    )
    replay = _replayer(client, None, on_error, lazy=True)
    field = framing.uuid_field
    try:
        for chunk in batches:
            state.current = None  # the previous batch's checkpoint is gone from here on
            committed = sequencer.committed(chunk, replay, acks=include_acks)
            if not committed:
                continue
            with gc_paused():
                batch = CommittedBatch(journal, field, _pack_frames(committed), state)
            state.current = batch
            yield batch
    finally:
        state.current = None
        batches.close()


def _adapt(sizer: _ChunkSizer, span: int, frames: int) -> None:
    """`_ChunkSizer.saw` for a decoded chunk of `frames` frames over `span` bytes (the fast
    path has no envelopes): the same sizes, so that both paths cut the same chunks."""
    sizer.size = min(max(span * _FRAMES_PER_CHUNK // frames, _MIN_CHUNK), _MAX_CHUNK)


def _columnar_batches(
    client: "JournalClient", journal: str, start: int, state: _BatchReader,
    framing: JSONFraming, block: bool, include_acks: bool, chunk_size: int | None,
    on_open: Callable[[Any], None] | None,
) -> Generator[CommittedBatch, None, None]:
    """`read_committed_batches` over columns where it can (`oncelog.sequencing.columnar`),
    through envelopes where it cannot, batch for batch the same.

    The journal's bytes are cut where `decode_batches` cuts them (whole lines, the same
    waits for a long line, the same chunk sizes), so each decoded chunk is the same in
    both paths. A chunk goes to `committed_columns` (C where built) while the fast path
    holds the state; on None the state is told to the sequencer (`ColumnarState.sync`) and
    the chunk is decoded into envelopes and sequenced; after such a chunk the fast path
    takes over again once no transaction is open (`ColumnarState.enter`).
    """
    sequencer = state.sequencer
    field = framing.uuid_field
    native = _native.speedups
    committed_columns = (
        native.module.committed_columns if native is not None else _columnar.committed_columns
    )
    sizer = _ChunkSizer(chunk_size)
    adapt = not sizer.fixed
    reader = client.read(journal, start, block=block)
    if on_open is not None:
        on_open(reader)
    replay = _replayer(client, None, "raise", lazy=True)
    state.columnar = ColumnarState.enter(sequencer, journal, field)

    def envelope_path(data: bytes, at: int) -> Iterator[CommittedBatch]:
        for envelopes in decode_batches(
            framing, [data], journal=journal, offset=at, new_message=JSONLine
        ):
            if adapt and envelopes:
                sizer.saw(envelopes)
            with gc_paused():
                prime_ids(envelopes)
                batch_built(len(envelopes))
            committed = sequencer.committed(envelopes, replay, acks=include_acks)
            if committed:
                with gc_paused():
                    batch = CommittedBatch(journal, field, _pack_frames(committed), state)
                state.current = batch
                yield batch
                state.current = None

    pending = bytearray()
    base = reader.offset
    wait_for = 0  # as decode_batches: a line longer than the chunks waits for twice the bytes
    try:
        for chunk in chain(_chunks(reader, None, sizer), [b""]):
            final = not chunk
            pending += chunk
            if not final and len(pending) < wait_for:
                continue
            cut = pending.rfind(b"\n") + 1
            wait_for = 0 if cut else 2 * len(pending)
            if cut:
                data = bytes(pending[:cut])
                del pending[:cut]
                at = base
                base += cut
                state.current = None
                columnar = state.columnar
                if columnar is not None:
                    columns = committed_columns(
                        data, at, field, columnar.table, columnar.carry_data,
                        columnar.carry_frames, include_acks, _columnar.MAX_CARRY,
                    )
                    if columns is not None:
                        (columnar.table, columnar.carry_data, columnar.carry_frames) = columns[7:]
                        columnar.offset = base
                        columnar.fast_chunks += 1
                        if adapt:
                            _adapt(sizer, cut, data.count(b"\n"))
                        if len(columns[2]):
                            batch = CommittedBatch(journal, field, columns[:7], state)
                            state.current = batch
                            yield batch
                        continue
                    columnar.sync(sequencer)
                    state.columnar = None
                yield from envelope_path(data, at)
                state.columnar = ColumnarState.enter(sequencer, journal, field)
            if final and pending:  # a partial last line: decoding raises TruncatedFrame
                state.current = None
                if state.columnar is not None:
                    state.columnar.sync(sequencer)
                    state.columnar = None
                yield from envelope_path(bytes(pending), base)
    finally:
        state.current = None
        reader.close()
        if state.columnar is not None:
            state.columnar.sync(sequencer)  # a sequencer passed in ends where reading did


def checkpoint_after_dequeued(
    sequencer: Sequencer, prune_horizon: Any = 0
) -> tuple[dict[str, int], list[ProducerState]]:
    """`sequencer.checkpoint()`, counting the envelope it last yielded as processed.

    A Sequencer tightens its producer state past a dequeued envelope only when it
    is stepped again, and an iterator suspended at a yield has not been: resuming
    from a plain checkpoint taken there would deliver that envelope once more.
    """
    return sequencer.checkpoint(prune_horizon, dequeued_processed=True)


def clock_of_bound(bound: TimeBound) -> int:
    """The UUID clock of a time bound (an aware datetime, or Unix nanoseconds)."""
    if isinstance(bound, datetime):
        if bound.tzinfo is None:
            raise ValueError(f"time bound {bound!r} must be timezone-aware (e.g. UTC)")
        delta = bound - datetime(1970, 1, 1, tzinfo=timezone.utc)
        ns = (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000
        return clock_from_unix_ns(ns)
    if isinstance(bound, int) and not isinstance(bound, bool):
        return clock_from_unix_ns(bound)
    raise TypeError(f"a time bound is an aware datetime or Unix nanoseconds, not {bound!r}")


def time_filter(
    *, since: TimeBound | None = None, after: TimeBound | None = None
) -> Callable[[Envelope], bool]:
    """A predicate keeping messages whose UUID time is at least `since` / later than `after`.

    Times compare at the UUID clock's 100 ns resolution. Nil-UUID messages have no
    time and always pass.
    """
    low = 0
    if since is not None:
        low = max(low, clock_of_bound(since))
    if after is not None:
        # Strictly later than `after`: its clock tick and every sequence number within it.
        low = max(low, clock_of_bound(after) + 16)

    def keep(env: Envelope) -> bool:
        clock = env.ids[1]
        return clock == 0 or clock >= low

    return keep


class MessageReader:
    """An iterator over one journal's messages that can be seeked and checkpointed.

    Committed (default) or uncommitted; optional time bounds; `seek()` restarts
    reading at another position, with fresh sequencing state (or the `states`
    given).
    """

    def __init__(
        self,
        client: "JournalClient",
        journal: str,
        offset: Position = 0,
        *,
        committed: bool = True,
        sequencer: Sequencer | None = None,
        new_message: Callable[[Any], Any] | None = None,
        block: bool = False,
        since: TimeBound | None = None,
        after: TimeBound | None = None,
        include_acks: bool = False,
        on_error: OnError = "raise",
    ) -> None:
        self.client = client
        self.journal = journal
        self.committed = committed
        self._options = dict(new_message=new_message, block=block, on_error=on_error)
        self._include_acks = include_acks
        self._keep = time_filter(since=since, after=after) if (since or after) else None
        self.sequencer = sequencer
        self._gen: Iterator[Envelope] | None = None  # the generator to close
        self._it: Iterator[Envelope] | None = None  # the same, filtered
        self._offset = _resolve_offset(journal, offset)
        self._open(self._offset)

    def _open(self, offset: int) -> None:
        self.close()
        if self.committed:
            if self.sequencer is None:
                if offset == -1:
                    offset = self.client.head(self.journal)
                self.sequencer = Sequencer(offsets={self.journal: offset})
            it = read_committed(
                self.client,
                self.journal,
                offset,
                sequencer=self.sequencer,
                include_acks=self._include_acks,
                **self._options,  # type: ignore[arg-type]
            )
        else:
            it = read_uncommitted(self.client, self.journal, offset, **self._options)  # type: ignore[arg-type]
        self._gen = it
        self._it = it if self._keep is None else filter(self._keep, it)

    def __iter__(self) -> "MessageReader":
        return self

    def __next__(self) -> Envelope:
        assert self._it is not None
        env = next(self._it)
        self._offset = env.end
        return env

    @property
    def offset(self) -> int:
        """The end offset of the last message yielded (where reading would resume)."""
        return self._offset

    def seek(self, position: Position, states: list[Any] | None = None) -> None:
        """Continue reading from `position`; a committed reader starts a new sequencer
        (from `states`, if given, else knowing no producers)."""
        self._offset = _resolve_offset(self.journal, position)
        if self._offset == -1:
            self._offset = self.client.head(self.journal)
        if self.committed:
            self.sequencer = None if states is None else Sequencer(
                offsets={self.journal: self._offset}, states=states
            )
        self._open(self._offset)

    def checkpoint(self, prune_horizon: Any = 0) -> tuple[dict[str, int], list[ProducerState]]:
        """Offsets and producer states from which a new reader resumes just after the
        last message this one yielded."""
        if self.sequencer is None:
            raise ValueError(f"reader of {self.journal!r} is uncommitted: nothing to checkpoint")
        return checkpoint_after_dequeued(self.sequencer, prune_horizon)

    def close(self) -> None:
        if self._gen is not None:
            self._gen.close()  # type: ignore[attr-defined]
            self._gen = None

    def __enter__(self) -> "MessageReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
