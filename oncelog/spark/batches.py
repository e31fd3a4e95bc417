"""Decoding byte ranges of a journal into Arrow columns, a chunk of whole frames at a time.

The journal's framing decodes each chunk (so malformed frames fail exactly as they
do for `read_uncommitted`); the columns are then built in bulk: offsets from the
envelopes, UUID columns by `oncelog.spark.uuids`, and the message column straight
from the chunk's bytes (document text), or parsed by pyarrow's JSON reader into a
struct when the source has a `schema`. A CSV journal that records its column names
(label `oncelog.dev/csv-columns`) is read into a struct keyed by them when the source's
`message` is a struct: the framing's fields, as `read_committed_arrow(parse=True)` gives
them.
"""

from __future__ import annotations

import array
import functools
import io
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from oncelog import _native
from oncelog.errors import BadMessage
from oncelog.framing import (
    CONTENT_TYPE_CSV,
    CONTENT_TYPE_JSON_LINES,
    CSVFraming,
    Framing,
    JSONFraming,
    for_content_type,
)
from oncelog.framing.base import gc_paused, snippet
from oncelog.framing.csvlines import csv_columns
from oncelog.framing.errors import ProtoClassError
from oncelog.framing.protoclass import (
    PROTOBUF_CLASS_LABEL,
    import_proto_class,
    is_protobuf,
    recorded_class_label,
    recorded_proto_class,
)
from oncelog.journal import JournalClient
from oncelog.message import FLAGS_MASK, CSVRecord, Envelope, Flags, JSONMessage, ProtoMessage
from oncelog.spark.options import OptionError, ReadOptions
from oncelog.spark.schema import MessageKind, SchemaError, message_kind
from oncelog.spark.uuids import NIL_TEXT, UUIDColumns, canonical_uuid_text, uuid_columns

__all__ = [
    "BadMessage",
    "DecodedBatch",
    "RangeDecoder",
    "decoder_for",
    "new_message_factory",
    "record_batch",
]


class _UseFraming(Exception):
    """A fast path met something only the framing decides."""


@dataclass(slots=True)
class DecodedBatch:
    """Consecutive whole frames of a journal, `[base, end)`, as Arrow columns.

    `columns` are every source column but `commit_offset`, in schema order (none for
    `ids_only` batches); `uuids` the UUID columns and `begin_col` the frames' offsets;
    `begins`, `producers`, `clocks` and `flags` the same as Python lists, made on first
    use (the per-message commit rules need them, the bulk ones do not); `envelopes`
    are kept only when asked for (sequential reads hand them to a Sequencer).
    """

    journal: str
    base: int
    end: int
    begin_col: pa.Array
    uuids: UUIDColumns
    columns: list[pa.Array]
    envelopes: list[Envelope] | None = None
    _begins: list[int] | None = None
    _ids: tuple[list[str], list[int], list[int]] | None = None

    def __len__(self) -> int:
        return len(self.begin_col)

    @property
    def begins(self) -> list[int]:
        if self._begins is None:
            self._begins = self.begin_col.to_pylist()
        return self._begins

    def _lists(self) -> tuple[list[str], list[int], list[int]]:
        if self._ids is None:
            self._ids = self.uuids.ids()
        return self._ids

    @property
    def producers(self) -> list[str]:
        return self._lists()[0]

    @property
    def clocks(self) -> list[int]:
        return self._lists()[1]

    @property
    def flags(self) -> list[int]:
        return self._lists()[2]


def record_batch(
    batch: DecodedBatch,
    schema: pa.Schema,
    rows: Sequence[int] | pa.Array | None = None,
    commits: Sequence[int] | None = None,
) -> pa.RecordBatch:
    """The rows of `batch` (all, or those at `rows`) with their commit offsets (or nulls)."""
    columns = batch.columns
    if rows is not None:
        indices = rows if isinstance(rows, pa.Array) else pa.array(rows, pa.int32())
        columns = [col.take(indices) for col in columns]
    n = len(batch) if rows is None else len(rows)
    commit = pa.nulls(n, pa.int64()) if commits is None else pa.array(commits, pa.int64())
    return pa.RecordBatch.from_arrays(columns[:3] + [commit] + columns[3:], schema=schema)


_FLAGS: tuple[Flags | int, ...] = tuple(
    Flags(v) if v in Flags._value2member_map_ else v for v in range(FLAGS_MASK + 1)
)
_producer_cache: dict[str, bytes] = {}


def _prime(envs: list[Envelope], producers: list[str], clocks: list[int], flags: list[int]) -> None:
    """Give each envelope the ids parsed with its batch's columns, so that a Sequencer does
    not parse every UUID again (the values are those `Envelope.ids` would compute)."""
    cache = _producer_cache
    if len(cache) > 65536:
        cache.clear()
    raw = [cache.get(p) or cache.setdefault(p, bytes.fromhex(p)) for p in producers]
    for env, ids in zip(envs, zip(raw, clocks, map(_FLAGS.__getitem__, flags))):
        env._ids = ids


def _json_factory(uuid_field: str) -> Callable[[Any], Any] | None:
    return None if uuid_field == "uuid" else functools.partial(JSONMessage, uuid_field=uuid_field)


class RangeDecoder:
    """Reads byte ranges of one journal and decodes them into DecodedBatches."""

    def __init__(
        self,
        client: JournalClient,
        journal: str,
        kind: MessageKind,
        message_type: pa.DataType,
        *,
        chunk_bytes: int = 8 << 20,
        uuid_field: str = "uuid",
        new_message: Callable[[Any], Any] | None = None,
        fast: bool = True,
        threads: bool = False,
        strict_fields: bool = False,
    ) -> None:
        """`fast`: JSON lines are parsed by Arrow in one pass where that is exact, and the
        read functions of oncelog.spark.read decide commits a batch at a time (False: the
        per-message path, as a reference). `threads`: Arrow's JSON reader may use its thread
        pool on each chunk (for a reader in the caller's process; a Spark task reads with
        one thread, tasks being parallel already). `strict_fields` (with a parsed `kind`): a
        document with a field the struct does not name is a BadMessage too, raised at once
        without locating the document (for a caller that inferred the struct and falls back
        on any mismatch)."""
        self.client = client
        self.journal = journal
        self.kind = kind
        self.message_type = message_type
        self.chunk_bytes = chunk_bytes
        self.framing: Framing = for_content_type(kind.content_type)
        self.uuid_field = uuid_field
        self.fast = fast
        self.threads = threads
        self.strict_fields = strict_fields
        if new_message is None and isinstance(self.framing, JSONFraming):
            new_message = _json_factory(uuid_field)
        self.new_message = new_message
        self._journal_scalar = pa.scalar(journal, pa.string())
        self._fast_schema = _fast_schema(uuid_field, kind, message_type) if fast else None

    def batches(
        self, begin: int, end: int, *, keep_envelopes: bool = False, ids_only: bool = False
    ) -> Iterator[DecodedBatch]:
        """Batches covering the whole frames of `[begin, end)`, in offset order.

        `ids_only`: build only `begins` and the ids (for the plan's facts), no columns.
        JSON lines are decoded without building Envelopes unless `keep_envelopes`; a chunk
        with anything unusual goes through the framing, which reports bad frames.
        """
        if end <= begin:
            return
        if not keep_envelopes and isinstance(self.framing, JSONFraming):
            for chunk, base in self._line_chunks(begin, end):
                batch = self._arrow_batch(chunk, base, ids_only)
                if batch is None:
                    batch = self._json_batch(chunk, base, ids_only)
                if batch is None:
                    result = self.framing.decode(
                        chunk, journal=self.journal, base=base, final=True,
                        new_message=self.new_message,
                    )
                    if not result.envelopes:
                        continue
                    batch = self._build(chunk, base, result.envelopes, False, ids_only)
                yield batch
            return
        pending = bytearray()
        base = begin
        for data, pos in self._read_range(begin, end):
            pending += data
            result = self.framing.decode(
                pending, journal=self.journal, base=base, final=pos >= end,
                new_message=self.new_message,
            )
            if result.envelopes:
                chunk = bytes(pending[: result.consumed])
                yield self._build(chunk, base, result.envelopes, keep_envelopes, ids_only)
            del pending[: result.consumed]
            base = result.next_offset

    def ids(
        self, begin: int, end: int
    ) -> Iterator[tuple[list[str], list[int], list[int], list[int]]]:
        """(producers, clocks, flags, begins) of the frames of `[begin, end)`, chunk by chunk.

        For the split plan's facts. JSON lines take a fast path: Arrow's JSON reader
        extracts just the UUID field, without the GIL. A chunk it cannot read exactly
        (blank lines, odd UUID values, ...) goes through the framing like `batches()`;
        other malformed frames are reported by the reading task (phase 2), which decodes
        with the framing.
        """
        if not isinstance(self.framing, JSONFraming):
            for batch in self.batches(begin, end, ids_only=True):
                yield batch.producers, batch.clocks, batch.flags, batch.begins
            return
        uuid_field = self.uuid_field
        schema = pa.schema([(uuid_field, pa.string())])
        for chunk, base in self._line_chunks(begin, end):
            fast = _json_ids(chunk, base, schema) if _object_lines(chunk) is not None else None
            if fast is not None:
                yield fast
                continue
            result = self.framing.decode(
                chunk, journal=self.journal, base=base, final=True, new_message=self.new_message
            )
            if result.envelopes:
                batch = self._build(chunk, base, result.envelopes, False, True)
                yield batch.producers, batch.clocks, batch.flags, batch.begins

    def _line_chunks(self, begin: int, end: int) -> Iterator[tuple[bytes, int]]:
        """Chunks of `[begin, end)` cut after a newline (the last may end without one)."""
        pending = b""
        for data, pos in self._read_range(begin, end):
            pending += data
            cut = len(pending) if pos >= end else pending.rfind(b"\n") + 1
            if cut:
                yield pending[:cut], pos - len(pending)
                pending = pending[cut:]

    def _read_range(self, begin: int, end: int) -> Iterator[tuple[bytes, int]]:
        """The bytes of `[begin, end)` in chunks, each with the offset just after it; a
        journal ending before `end` is a BadMessage (the plan promised those bytes). The
        range is exact: offset 0 is not "the first available" here (OffsetNotAvailable if
        `begin` was trimmed), so a replay never starts later than asked."""
        pos = begin
        reader = self.client.read(self.journal, begin, exact=True)
        try:
            while pos < end:
                data = reader.read(min(self.chunk_bytes, end - pos))
                if not data:
                    raise BadMessage(
                        f"journal {self.journal!r} ends at offset {pos}, before the planned "
                        f"end {end}"
                    )
                pos += len(data)
                yield data, pos
        finally:
            reader.close()

    # -- columns ---------------------------------------------------------------------------

    def _build(
        self, chunk: bytes, base: int, envs: list[Envelope], keep: bool, ids_only: bool
    ) -> DecodedBatch:
        """A batch of envelopes the framing decoded from `chunk`."""
        begins = [e.begin for e in envs]
        uuids = uuid_columns(self._uuid_texts(envs), functools.partial(self._fix_uuid, envs))
        message = None
        if self.kind.columns is not None and not ids_only:
            message = self._csv_struct(envs)
        batch = self._columns(chunk, base, begins, envs[-1].end, uuids, ids_only, message)
        if keep:
            _prime(envs, batch.producers, batch.clocks, batch.flags)
            batch.envelopes = envs
        return batch

    def _arrow_batch(self, chunk: bytes, base: int, ids_only: bool) -> DecodedBatch | None:
        """A batch of whole JSON lines parsed in one pass of Arrow's JSON reader (the UUID
        field and, with a `schema`, the document's fields), without a Python object per
        message; None where Arrow might judge a line otherwise than the framing does
        (see `_object_lines`), or cannot read it as asked (the slower paths decide)."""
        schema = self._fast_schema
        if schema is None:
            return None
        lengths = _object_lines(chunk)
        if lengths is None:
            return None
        try:
            table = _read_json(chunk, schema, self.threads, self.strict_fields)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        if table.num_rows != len(lengths):
            return None
        table = table.combine_chunks()
        texts = table.column(0).chunk(0) if table.num_rows else pa.array([], pa.string())

        def nil_or_fail(row: int) -> str:
            if texts[row].as_py() in (None, ""):
                return NIL_TEXT  # as JSONMessage: a missing or empty UUID is the nil UUID
            raise _UseFraming

        try:
            uuids = uuid_columns(texts, nil_or_fail)
        except (_UseFraming, ValueError):
            return None
        ends = pc.cumulative_sum(pc.add(lengths, 1), start=base).cast(pa.int64())
        begins = pa.concat_arrays([pa.array([base], pa.int64()), ends.slice(0, len(ends) - 1)])
        last = base + len(chunk)
        message = None
        if self.kind.parsed and not ids_only:
            struct: pa.StructType = self.message_type
            fields = [struct.field(i) for i in range(struct.num_fields)]
            arrays = [
                table.column(f.name).chunk(0) if table.num_rows else pa.array([], f.type)
                for f in fields
            ]
            message = pa.StructArray.from_arrays(arrays, fields=fields)
        return self._columns(chunk, base, begins, last, uuids, ids_only, message)

    def _json_batch(self, chunk: bytes, base: int, ids_only: bool) -> DecodedBatch | None:
        """A batch of whole JSON lines decoded without Envelopes, accepting exactly what the
        JSON framing accepts (an object per line); None if the framing must decide."""
        if not chunk.endswith(b"\n"):
            return None
        lines = chunk.split(b"\n")
        lines.pop()
        with gc_paused():
            try:
                docs = list(map(orjson.loads, lines))
            except orjson.JSONDecodeError:
                return None
            if not all(map(isinstance, docs, repeat(dict))):
                return None
            field = self.uuid_field
            texts = [d.get(field) for d in docs]
        del docs

        def nil_or_framing(row: int) -> str:
            if texts[row] is None or texts[row] == "":
                return NIL_TEXT  # as JSONMessage: no UUID is the nil UUID
            raise _UseFraming

        try:
            uuids = uuid_columns(texts, nil_or_framing)
        except _UseFraming:
            return None
        begins = list(accumulate(map((1).__add__, map(len, lines)), initial=base))
        last = begins.pop()
        return self._columns(chunk, base, begins, last, uuids, ids_only)

    def _columns(
        self,
        chunk: bytes,
        base: int,
        begins: list[int] | pa.Array,
        last: int,
        uuids: UUIDColumns,
        ids_only: bool,
        message: pa.Array | None = None,
    ) -> DecodedBatch:
        begin_col = begins if isinstance(begins, pa.Array) else pa.array(begins, pa.int64())
        batch = DecodedBatch(self.journal, base, last, begin_col, uuids, [])
        if isinstance(begins, list):
            batch._begins = begins
        if ids_only:
            return batch
        end_col = pa.concat_arrays([begin_col[1:], pa.array([last], pa.int64())])
        if message is None:
            message = self._message_column(chunk, base, batch.begins, last)
        batch.columns = [
            pa.repeat(self._journal_scalar, len(begin_col)),
            begin_col,
            end_col,
            uuids.uuid,
            uuids.producer,
            uuids.clock,
            uuids.time,
            uuids.flags,
            uuids.key,
            message,
        ]
        return batch

    @staticmethod
    def _uuid_texts(envs: list[Envelope]) -> list[object]:
        first = envs[0].message
        if type(first) is JSONMessage:
            field = first.uuid_field
            return [e.message.doc.get(field) for e in envs]
        if type(first) is CSVRecord:
            return [e.message.fields[0] if e.message.fields else None for e in envs]
        if type(first) is ProtoMessage and not first._is_bytes_field():
            # The UUID strings as stored (a row that is not canonical is fixed by `_fix_uuid`).
            field = first.uuid_field
            return [getattr(e.message.proto, field) for e in envs]
        return [None] * len(envs)

    def _fix_uuid(self, envs: list[Envelope], row: int) -> str:
        env = envs[row]
        try:
            return canonical_uuid_text(*env.ids)
        except (ValueError, TypeError) as exc:
            raise BadMessage(
                f"journal {self.journal!r}: message at offsets [{env.begin}, {env.end}) has a "
                f"bad UUID: {exc}"
            ) from None

    def _offsets(self, base: int, begins: list[int], last: int) -> pa.Buffer:
        rel = array.array("i", [b - base for b in begins])
        rel.append(last - base)
        return pa.py_buffer(rel)

    def _message_column(self, chunk: bytes, base: int, begins: list[int], last: int) -> pa.Array:
        n = len(begins)
        kind = self.kind
        if kind.parsed:
            return self._parse_json(chunk, base, begins)
        offsets = self._offsets(base, begins, last)
        if kind.spark_type == "binary":
            raw = pa.Array.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(chunk)])
            # Drop the fixed frame's header. `stop` is given: with its default, pyarrow's
            # binary_slice overflows sizing its output (apache/arrow#51222).
            return pc.binary_slice(raw, 8, max(len(chunk), 8))
        text = pa.Array.from_buffers(pa.string(), n, [None, offsets, pa.py_buffer(chunk)])
        if isinstance(self.framing, CSVFraming):
            text.validate(full=True)
        return pc.utf8_rtrim(text, characters=kind.trim) if kind.trim else text

    def _csv_struct(self, envs: list[Envelope]) -> pa.Array:
        """The `message` struct of CSV records keyed by the journal's recorded column names
        (`kind.columns`): each struct field takes the record field at its column's position
        (`_<n>` names position n past the header, as `csv_record_doc` keys it); a field a
        record lacks, or a name no column has, is null. Strings are the fields exactly as
        `read_committed_arrow(parse=True)` gives them; other types are cast from them (an
        empty field is null), a field that does not cast being a BadMessage naming the
        journal and the record's offsets."""
        struct: pa.StructType = self.message_type
        rows = [e.message.fields for e in envs]
        children: list[pa.Array] = []
        for field, position in zip(struct, self._csv_positions()):
            if position is None:
                children.append(pa.nulls(len(rows), field.type))
                continue
            values = [r[position] if position < len(r) else None for r in rows]
            if field.type == pa.string():
                children.append(pa.array(values, pa.string()))
                continue
            values = [v if v != "" else None for v in values]
            children.append(self._cast_field(envs, values, field))
        return pa.StructArray.from_arrays(children, fields=list(struct))

    def _csv_positions(self) -> list[int | None]:
        """For each field of the `message` struct, the position of its CSV column (None:
        no column has its name)."""
        columns = self.kind.columns or ()
        index: dict[str, int] = {}
        for at, name in enumerate(columns):
            index.setdefault(name, at)
        positions: list[int | None] = []
        for field in self.message_type:
            position: int | None = index.get(field.name)
            digits = field.name[1:]
            if position is None and field.name[:1] == "_" and digits.isascii() and digits.isdigit():
                position = int(digits) if int(digits) >= len(columns) else None
            positions.append(position)
        return positions

    def _cast_field(self, envs: list[Envelope], values: list[str | None], field: pa.Field
                    ) -> pa.Array:
        text = pa.array(values, pa.string())
        try:
            return text.cast(field.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            for env, value in zip(envs, values):
                try:
                    pa.array([value], pa.string()).cast(field.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as row_exc:
                    raise BadMessage(
                        f"journal {self.journal!r}: CSV record at offsets [{env.begin}, "
                        f"{env.end}) does not fit option 'schema': column {field.name!r} "
                        f"value {value!r} is not {field.type}: {row_exc}"
                    ) from None
            raise BadMessage(
                f"journal {self.journal!r}: CSV column {field.name!r} does not fit option "
                f"'schema' ({field.type}): {exc}"
            ) from None

    def _parse_json(self, chunk: bytes, base: int, begins: list[int]) -> pa.Array:
        struct: pa.StructType = self.message_type
        fields = [struct.field(i) for i in range(struct.num_fields)]
        try:
            table = _read_json(chunk, pa.schema(fields), self.threads, self.strict_fields)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            if self.strict_fields:
                raise BadMessage(
                    f"journal {self.journal!r}: documents at offsets [{base}, "
                    f"{base + len(chunk)}) do not fit {struct}: {exc}"
                ) from None
            raise self._locate_schema_error(chunk, base, begins, pa.schema(fields), exc) from None
        if table.num_rows != len(begins):
            raise BadMessage(
                f"journal {self.journal!r}: {table.num_rows} documents parsed from offsets "
                f"[{base}, {base + len(chunk)}) which hold {len(begins)} frames"
            )
        table = table.combine_chunks()
        arrays = [
            table.column(i).chunk(0) if table.column(i).num_chunks else pa.array([], f.type)
            for i, f in enumerate(fields)
        ]
        return pa.StructArray.from_arrays(arrays, fields=fields)

    def _locate_schema_error(
        self, chunk: bytes, base: int, begins: list[int], schema: pa.Schema, exc: Exception
    ) -> BadMessage:
        ends = begins[1:] + [base + len(chunk)]
        for begin, end in zip(begins, ends):
            line = chunk[begin - base : end - base]
            try:
                _read_json(line, schema)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as line_exc:
                return BadMessage(
                    f"journal {self.journal!r}: document at offsets [{begin}, {end}) does not "
                    f"fit option 'schema': {line_exc}: {snippet(line)}"
                )
        return BadMessage(f"journal {self.journal!r}: documents do not fit option 'schema': {exc}")


_MAX_DEPTH = 1024
"""The deepest nesting of arrays and objects orjson (the framing's parser) accepts."""


def _object_lines(chunk: bytes) -> pa.Array | None:
    """The byte lengths of the lines of `chunk` (without their newlines) if Arrow's JSON
    reader judges each line exactly as the JSON framing (orjson) does; None if it might
    not (then the framing decides).

    Arrow's reader parses a stream of values across newlines and accepts what orjson
    rejects: NaN and Infinity, invalid UTF-8, nesting deeper than orjson's limit (and it
    crashes on a line `null`). Every line must start with `{` and end with `}`: then no
    value can continue past a line end (after a closing `}` only `,` `]` `}` or a new
    top-level value may follow, and the next line starts with `{`), so with as many rows
    as lines each line is exactly one object. Whitespace is the same four bytes for both
    parsers; the other differences are ruled out here, conservatively (a chunk merely
    mentioning `NaN` in a string takes the slower path).
    """
    if not chunk.endswith(b"}\n") or not chunk.startswith(b"{"):
        return None
    if (b"N" in chunk and b"NaN" in chunk) or (b"I" in chunk and b"Inf" in chunk):
        return None
    if not chunk.isascii():
        try:
            chunk.decode("utf-8")  # strict: no surrogates, no overlong forms
        except UnicodeDecodeError:
            return None
    native = _native.speedups
    if native is not None:  # the same scan in one pass of C
        lengths = native.object_lines(chunk)
        if lengths is None:
            return None
        return pa.Array.from_buffers(pa.int64(), len(lengths) // 8, [None, pa.py_buffer(lengths)])
    whole = pa.array([chunk], pa.large_binary())
    lines = pc.list_flatten(pc.split_pattern(whole, b"\n"))
    n = len(lines) - 1  # the chunk ends with a newline: the last piece is empty
    lines = lines.slice(0, n)
    if not pc.all(pc.starts_with(lines, "{")).as_py():
        return None
    if not pc.all(pc.ends_with(lines, "}")).as_py():
        return None
    if chunk.count(b"{") + chunk.count(b"[") - n >= _MAX_DEPTH:
        # Some line may nest deeper than orjson allows: count each line's openers.
        opens = pc.add(pc.count_substring(lines, "{"), pc.count_substring(lines, "["))
        if pc.max(opens).as_py() > _MAX_DEPTH:
            return None
    return pc.binary_length(lines)


def _fast_schema(uuid_field: str, kind: MessageKind, message_type: pa.DataType) -> pa.Schema | None:
    """What one pass of Arrow's JSON reader extracts: the UUID field (a string), then the
    fields of the `schema` option; None if they cannot share a pass (the schema names the
    UUID field with another type)."""
    if kind.content_type != CONTENT_TYPE_JSON_LINES:
        return None
    fields = [pa.field(uuid_field, pa.string())]
    if kind.parsed:
        struct: pa.StructType = message_type
        for i in range(struct.num_fields):
            f = struct.field(i)
            if f.name == uuid_field:
                if f.type != pa.string():
                    return None
                continue
            fields.append(f)
    if len({f.name for f in fields}) != len(fields):
        return None
    return pa.schema(fields)


_THREAD_BLOCK = 1 << 20
"""Bytes per block of Arrow's JSON reader when it uses its threads."""


def _read_json(
    data: bytes, schema: pa.Schema, threads: bool = False, strict: bool = False
) -> pa.Table:
    """`data`'s JSON lines as a table of `schema`'s fields (others ignored, or an error if
    `strict`): in one block on the calling thread, or in blocks of `_THREAD_BLOCK` on
    Arrow's thread pool."""
    block = _THREAD_BLOCK if threads else max(len(data) + 1, 1 << 16)
    return pajson.read_json(
        io.BytesIO(data),
        read_options=pajson.ReadOptions(use_threads=threads, block_size=block),
        parse_options=pajson.ParseOptions(
            explicit_schema=schema, unexpected_field_behavior="error" if strict else "ignore"
        ),
    )


def _json_ids(
    chunk: bytes, base: int, schema: pa.Schema
) -> tuple[list[str], list[int], list[int], list[int]] | None:
    """Ids of a chunk of whole JSON lines via Arrow's JSON reader; None if it cannot be
    done exactly (then the framing decodes the chunk)."""
    if not chunk.endswith(b"\n"):
        return None
    lines = chunk.split(b"\n")
    lines.pop()
    try:
        table = _read_json(chunk, schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != len(lines):
        return None  # blank lines, or several documents on one line
    texts = table.column(0).combine_chunks()

    def nil_or_fail(row: int) -> str:
        if texts[row].as_py() in (None, ""):
            return NIL_TEXT  # JSONMessage: a missing or empty UUID is the nil UUID
        raise ValueError("not canonical")

    try:
        cols = uuid_columns(texts, nil_or_fail)
    except ValueError:
        return None
    begins = list(accumulate(map((1).__add__, map(len, lines)), initial=base))
    begins.pop()
    producers, clocks, flags = cols.ids()
    return producers, clocks, flags, begins


def new_message_factory(
    options: ReadOptions, content_type: str, journal: str, recorded: str | None = None
) -> Callable[[Any], Any] | None:
    """The `new_message` a journal's frames decode with: protobuf frames need a class,
    option `proto_class`, else `recorded` (the class the journal's spec records, label
    `oncelog.dev/protobuf-class`); OptionError if there is none or it does not import."""
    if not is_protobuf(content_type):
        return None
    path, what = options.proto_class, "option proto_class"
    if not path and recorded:
        path, what = recorded, recorded_class_label(journal)
    if not path:
        raise OptionError(
            f"journal {journal!r} holds protobuf frames: give option proto_class "
            "(module:Class of the generated message, importable on every executor), or "
            f"record the class on the journal (label {PROTOBUF_CLASS_LABEL})"
        )
    try:
        cls = import_proto_class(path, uuid_field=options.uuid_field, what=what)
    except ProtoClassError as exc:
        raise OptionError(str(exc)) from None
    return ProtoMessage.factory(cls, options.uuid_field)


def decoder_for(
    client: JournalClient,
    options: ReadOptions,
    journal: str,
    content_type: str,
    message_type: Any,
    *,
    threads: bool = False,
) -> RangeDecoder:
    """A RangeDecoder of `journal` as the source's options ask (`threads`: see RangeDecoder).

    A `text/csv` journal read into a struct `message_type` (its recorded column names, or
    option `schema`) is keyed by the names its spec records; a SchemaError naming the
    journal if it records none."""
    columns = None
    if (
        content_type.split(";", 1)[0].strip().lower() == CONTENT_TYPE_CSV
        and pa.types.is_struct(message_type)
    ):
        columns = csv_columns(client.get(journal), journal)
        if columns is None and options.schema is None:
            raise SchemaError(
                f"CSV journal {journal} is read as records keyed by their column names, but "
                "it records none (label oncelog.dev/csv-columns): read it separately"
            )
    return RangeDecoder(
        client,
        journal,
        message_kind(content_type, options.schema, columns, journal=journal),
        message_type,
        chunk_bytes=options.chunk_bytes,
        uuid_field=options.uuid_field,
        new_message=new_message_factory(
            options, content_type, journal,
            recorded_proto_class(client.get(journal)) if is_protobuf(content_type) else None,
        ),
        fast=options.fast_path,
        threads=threads,
    )
