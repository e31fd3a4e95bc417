"""Columnar segments: a journal's sealed history as Parquet, read-committed already.

When compaction seals a journal's history below an offset (its record's `through`), the
committed messages of what it sealed are written as Parquet **segments**, so bulk readers
(Arrow, pandas, DuckDB, Spark, the Delta export) read columns instead of decoding,
sequencing and parsing JSON. A segment covers journal offsets `[begin, end)` and holds
exactly the rows `read_committed_arrow` gives for that range, in commit order: the
messages *committed* by a frame in the range (a transaction begun earlier but committed
here belongs here; one still open at `end` does not), acknowledgements left out.

Layout under `<root>/.oncelog/segments/<journal>/`:

```
data/<sha1 of the file>.parquet          the rows (zstd, Parquet page checksums)
<begin:016x>-<end:016x>.json             its record, created put-if-absent, never changed
```

A record names the file, its CRC-32C and size (checked on every read), the row count, and
the read-committed state at both ends: `start`, the producer states (last ACK clock,
pending-span begin) of the producers with frames in the range as the writer had them at
`begin`, and `final`, every producer's state at `end`. Sequencing a range depends on the
state before it only through the producers that have frames in it, so a reader whose
state agrees with `start` on those producers may take the segment's rows instead of
reading the range, and its state afterwards is its own with those producers' entries taken
from `final`. A reader whose state disagrees (after a trim, say, it starts afresh at the
first available offset) reads the range's fragments instead, which brings it back into
agreement soon after (one acknowledgement per producer). Either way the rows are exactly
`read_committed`'s, and offsets are those the messages were written at.

Invariants:
- The record is written last, put-if-absent, after its file: a writer killed at any point
  leaves at most an unreferenced file (collected by `gc` after its grace) and readers that
  read fragments; the next compaction (or `seal`) writes what is missing.
- Racing writers of one range compute the same rows; one record wins, the other's file (if
  its bytes differ at all) is unreferenced.
- A segment whose file is missing, short or fails its CRC-32C is never used: readers warn,
  naming it, and read the fragments; `journals verify` reports it.
- Segments never change what any reader reports: offsets, rows and order are
  `read_committed`'s.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import crc32c
import orjson

from oncelog._extras import needs_extra
from oncelog.coordination import MetaStore, new_token
from oncelog.framing.errors import ProtoClassError
from oncelog.framing.protoclass import recorded_proto_class
from oncelog.tables.errors import SegmentError

if TYPE_CHECKING:
    import pyarrow as pa

    from oncelog.journal import JournalClient
    from oncelog.journal.spec import JournalSpec
    from oncelog.spark.batches import RangeDecoder

__all__ = [
    "ARROW_SCHEMA_LABEL",
    "SEGMENTS_LABEL",
    "SegmentRecord",
    "States",
    "seal",
    "segment_records",
    "read_segment",
]

log = logging.getLogger(__name__)

SEGMENTS = "segments"
"""The directory of segments under `<root>/.oncelog/`."""

SEGMENTS_LABEL = "oncelog.dev/segments"
"""Journal label: `off` stops compaction from writing segments for the journal."""

ARROW_SCHEMA_LABEL = "oncelog.dev/arrow-schema"
"""Journal label declaring the Arrow types of a JSON-lines journal's document fields, one
`name=type` value per field (a label may hold several values): `user=string`, `n=int64`.
Types: `ARROW_TYPES`. Fields it does not name are inferred; a document whose value does
not fit its declared type keeps its segment's rows as text (never a changed value)."""

ARROW_TYPES: dict[str, str] = {
    "string": "string", "int64": "int64", "int32": "int32", "double": "double",
    "float": "float", "bool": "bool", "binary": "binary", "date32": "date32",
    "timestamp-s": "timestamp[s]", "timestamp-ms": "timestamp[ms]",
    "timestamp-us": "timestamp[us]",
}
"""Type names `ARROW_SCHEMA_LABEL` accepts, and the Arrow types they stand for."""

SEGMENT_TARGET_BYTES = 64 << 20
"""A sealed range is cut into segments of about this many journal bytes (at fragment
boundaries), so no segment needs more memory than that to write or read."""

_RECORD_NAME = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})\.json$")

_FRAMED = ("application/x-ndjson", "text/csv")
"""Content types whose journals get segments; fixed-framed (protobuf) journals get them too
when their spec records their message class (label `oncelog.dev/protobuf-class`), which
their UUIDs cannot be found without."""

States = dict[str, tuple[int, int]]
"""Producer states by producer id (12 hex digits): (last ACK clock, pending begin or -1)."""



@dataclass(frozen=True, slots=True)
class SegmentRecord:
    """The record of one segment: journal offsets `[begin, end)`, its file and checksums,
    and the read-committed states around it (see the module)."""

    journal: str
    begin: int
    end: int
    file: str
    """Name under `segments/<journal>/data/`: the SHA1 of its bytes, `.parquet`."""
    crc32c: int
    size: int
    rows: int
    parsed: bool
    """Whether the rows hold a `doc` struct: the JSON documents' fields, the CSV records'
    fields by the column names their journal recorded when the segment was written (see
    `csv_documents`), or the protobuf messages' fields by the class their journal recorded
    (`oncelog.tables.protodoc`; the `message` column keeps their payloads)."""
    producers: frozenset[str]
    """Producers with at least one frame in `[begin, end)`."""
    start: States
    """The states of `producers` at `begin` (a producer without one is absent)."""
    final: States
    """Every producer's state at `end`."""
    incarnation: str = ""
    token: str = ""

    @property
    def name(self) -> str:
        return f"{self.begin:016x}-{self.end:016x}.json"

    def describe(self) -> str:
        return f"segment {self.name} of journal {self.journal!r} (offsets {self.begin}-{self.end})"

    def matches(self, states: States) -> bool:
        """Whether a reader in `states` at `begin` reads exactly this segment's rows."""
        return all(states.get(p) == self.start.get(p) for p in self.producers)

    def advance(self, states: States) -> States:
        """A reader's states after taking this segment's rows in `states`."""
        out = dict(states)
        for p in self.producers:
            if p in self.final:
                out[p] = self.final[p]
            else:
                out.pop(p, None)
        return out

    def to_bytes(self) -> bytes:
        return orjson.dumps({
            "journal": self.journal, "begin": self.begin, "end": self.end, "file": self.file,
            "crc32c": self.crc32c, "size": self.size, "rows": self.rows, "parsed": self.parsed,
            "producers": sorted(self.producers),
            "start": {p: list(v) for p, v in sorted(self.start.items())},
            "final": {p: list(v) for p, v in sorted(self.final.items())},
            "incarnation": self.incarnation, "token": self.token,
        }, option=orjson.OPT_SORT_KEYS)

    @classmethod
    def from_bytes(cls, journal: str, name: str, data: bytes) -> SegmentRecord:
        """Parse a record; SegmentError naming it if it is not one, or not at its place."""
        try:
            d = orjson.loads(data)
            rec = cls(
                d["journal"], int(d["begin"]), int(d["end"]), str(d["file"]), int(d["crc32c"]),
                int(d["size"]), int(d["rows"]), bool(d["parsed"]), frozenset(d["producers"]),
                {p: (int(v[0]), int(v[1])) for p, v in d["start"].items()},
                {p: (int(v[0]), int(v[1])) for p, v in d["final"].items()},
                str(d.get("incarnation", "")), str(d.get("token", "")),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, IndexError) as exc:
            raise SegmentError(
                f"segment record {name} of journal {journal!r} is corrupt: {exc}"
            ) from None
        if rec.journal != journal or rec.name != name or not rec.begin < rec.end:
            raise SegmentError(
                f"segment record {name} of journal {journal!r} names journal {rec.journal!r}"
                f" offsets {rec.begin}-{rec.end}: not its place"
            )
        return rec


def _meta(client: JournalClient) -> MetaStore:
    return MetaStore.of(client, internal=True)


def _dir(journal: str) -> str:
    return f"{SEGMENTS}/{journal}"


def record_path(journal: str, name: str) -> str:
    """A record's path under `<root>/.oncelog/`."""
    return f"{_dir(journal)}/{name}"


def file_path(journal: str, file: str) -> str:
    """A segment file's path under `<root>/.oncelog/`."""
    return f"{_dir(journal)}/data/{file}"


def enabled(spec: JournalSpec) -> bool:
    """Whether compaction writes segments for journals of `spec`."""
    if (spec.labels.value(SEGMENTS_LABEL) or "").lower() in ("off", "false", "no", "0"):
        return False
    if recorded_proto_class(spec) is not None:
        return True
    return spec.content_type.split(";", 1)[0].strip().lower() in _FRAMED


def segment_records(
    client: JournalClient, journal: str, incarnation: str | None = None
) -> tuple[list[SegmentRecord], list[str]]:
    """The journal's segment records (of its current incarnation), by `begin` then `end`,
    and descriptions of the records that could not be read (corrupt ones)."""
    meta = _meta(client)
    if incarnation is None:
        incarnation = client.get(journal).incarnation or ""
    names = [n for n in meta.list(_dir(journal)) if _RECORD_NAME.match(n)]
    records: list[SegmentRecord] = []
    bad: list[str] = []
    for name in names:
        data = meta.read(record_path(journal, name))
        if data is None:
            continue  # retired since the listing
        try:
            rec = SegmentRecord.from_bytes(journal, name, data)
        except SegmentError as exc:
            bad.append(str(exc))
            continue
        if rec.incarnation == incarnation:
            records.append(rec)
    records.sort(key=lambda r: (r.begin, r.end))
    return records, bad


def read_segment(client: JournalClient, rec: SegmentRecord, *, skip_text: bool = False,
                 skip: Iterable[str] = ()) -> pa.Table:
    """The rows of segment `rec`, checked against its size and CRC-32C; SegmentError
    naming the segment if it is missing, damaged or unreadable. `skip_text`: without the
    `message` column (the documents' text; their fields are in `doc`); `skip`: without
    these columns either (Parquet decodes only what is read)."""
    with needs_extra("arrow", "columnar segments (oncelog.tables)"):
        import pyarrow as pa
        import pyarrow.parquet as pq

    data = _meta(client).read(file_path(rec.journal, rec.file))
    if data is None:
        raise SegmentError(f"{rec.describe()}: its file data/{rec.file} is missing")
    if len(data) != rec.size or crc32c.crc32c(data) != rec.crc32c:
        raise SegmentError(
            f"{rec.describe()}: its file data/{rec.file} is damaged ({len(data)} bytes,"
            f" CRC-32C {crc32c.crc32c(data):08x}; recorded {rec.size} bytes, {rec.crc32c:08x})"
        )
    try:
        source = pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True)
        names = source.schema_arrow.names
        left_out = {*skip, *(["message"] if skip_text else [])}
        table = source.read(
            columns=[n for n in names if n not in left_out] if left_out else None
        )
    except (pa.ArrowException, OSError) as exc:
        raise SegmentError(f"{rec.describe()}: unreadable: {exc}") from None
    if table.num_rows != rec.rows:
        raise SegmentError(f"{rec.describe()}: {table.num_rows} rows, recorded {rec.rows}")
    return table


# -- writing ---------------------------------------------------------------------------------


def text_decoder(client: JournalClient, journal: str, content_type: str) -> RangeDecoder:
    """The decoder `read_committed_arrow` reads a journal's frames with (message as text)."""
    with needs_extra("arrow", "columnar segments (oncelog.tables)"):
        import pyarrow as pa

    from oncelog.spark.batches import decoder_for
    from oncelog.spark.options import ReadOptions
    from oncelog.spark.schema import message_kind

    kind = message_kind(content_type, None)
    message_type = pa.string() if kind.spark_type == "string" else pa.binary()
    options = ReadOptions.parse({"store": "-", "journals": journal})
    return decoder_for(client, options, journal, content_type, message_type, threads=True)


def text_schema(decoder: RangeDecoder) -> pa.Schema:
    from oncelog.spark.schema import source_arrow_schema

    return source_arrow_schema(decoder.message_type)


def read_range(
    decoder: RangeDecoder, begin: int, end: int, states: States,
    producers: set[str] | None = None,
) -> tuple[list[pa.RecordBatch], States]:
    """The committed rows of `[begin, end)` for a reader in `states` at `begin` (batches in
    offset order; sort by (commit_offset, begin) for commit order), and its states at `end`.
    Transactions open at `begin` are replayed from the journal when they commit.
    `producers`, if given, gets the producers of the range's frames."""
    from oncelog.sequencer import ProducerState, Sequencer
    from oncelog.spark.read import sequential_batches

    journal = decoder.journal
    seq = Sequencer(
        {journal: begin},
        [ProducerState(journal, bytes.fromhex(p), a, b) for p, (a, b) in states.items()],
    )
    batches = list(sequential_batches(
        decoder, begin, end, text_schema(decoder), seq, producers=producers
    ))
    _, after = seq.checkpoint()
    return batches, {
        s.producer.hex(): (s.last_ack, s.begin) for s in after if s.journal == journal
    }


def in_commit_order(batches: Sequence[pa.RecordBatch], schema: pa.Schema) -> pa.Table:
    """The batches as one table sorted by (commit_offset, begin) (`read_committed`'s order)."""
    with needs_extra("arrow", "columnar segments (oncelog.tables)"):
        import pyarrow as pa
        import pyarrow.compute as pc

    if not batches:
        return schema.empty_table()
    table = pa.Table.from_batches(list(batches))
    n = table.num_rows
    if n < 2:
        return table
    commits = table.column("commit_offset").combine_chunks()
    begins = table.column("begin").combine_chunks()
    c0, c1 = commits.slice(0, n - 1), commits.slice(1)
    b0, b1 = begins.slice(0, n - 1), begins.slice(1)
    ordered = pc.or_(pc.less(c0, c1), pc.and_(pc.equal(c0, c1), pc.less(b0, b1)))
    if pc.all(ordered).as_py():
        return table
    return table.sort_by([("commit_offset", "ascending"), ("begin", "ascending")])


def declared_schema(spec: JournalSpec) -> pa.Schema | None:
    """The Arrow schema the journal's `ARROW_SCHEMA_LABEL` declares for its documents, if
    any; ValueError naming the journal, the label and the value if it cannot be parsed."""
    with needs_extra("arrow", "columnar segments (oncelog.tables)"):
        import pyarrow as pa

    values = spec.labels.values(ARROW_SCHEMA_LABEL)
    if not values:
        return None
    fields = []
    for value in values:
        name, _, kind = value.partition("=")
        if not name or kind not in ARROW_TYPES:
            raise ValueError(
                f"journal {spec.name!r}: label {ARROW_SCHEMA_LABEL} value {value!r} is not"
                f" `field=type` with a type among {', '.join(ARROW_TYPES)}"
            )
        fields.append(pa.field(name, pa.type_for_alias(ARROW_TYPES[kind])))
    return pa.schema(fields)


def parse_documents(messages: pa.ChunkedArray | pa.Array, schema: pa.Schema | None,
                    exclude: Iterable[str], *, strict: bool = False) -> pa.Table | None:
    """The JSON documents `messages` hold as columns (the fields named in `exclude` left
    out), typed by `schema` where it names the field, inferred elsewhere;
    None if they cannot be read that way exactly (a value of another type, a non-object).
    `strict`: Arrow's error is raised instead, and the result is never None."""
    with needs_extra("arrow", "columnar segments (oncelog.tables)"):
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.json as pajson

    if len(messages) == 0:
        return None
    if isinstance(messages, pa.ChunkedArray):
        messages = messages.combine_chunks()
    text_array = messages.cast(pa.large_string())
    lines = pa.LargeListArray.from_arrays(pa.array([0, len(text_array)], pa.int64()), text_array)
    text = pc.binary_join(lines, pa.scalar("\n", pa.large_string()))[0].as_buffer()
    parse = None
    if schema is not None:
        parse = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer")
    try:
        docs: pa.Table = pajson.read_json(pa.BufferReader(text), parse_options=parse)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        if strict:
            raise
        return None
    excluded = set(exclude)
    docs = docs.drop_columns([n for n in docs.column_names if n in excluded])
    if strict:
        return docs
    if docs.num_rows != len(messages) or not docs.column_names:
        return None
    return docs


def _recorded_csv_columns(spec: JournalSpec) -> list[str] | None:
    """The column names a CSV journal's spec records (label `oncelog.dev/csv-columns`), or
    None: not CSV, no names, or a malformed label (its segments then keep the text only;
    readers report the label)."""
    from oncelog.framing.csvlines import CSVColumnsError, csv_columns

    if spec.content_type.split(";", 1)[0].strip().lower() != "text/csv":
        return None
    try:
        return csv_columns(spec)
    except CSVColumnsError:
        return None


def csv_documents(table: pa.Table, journal: str, names: Sequence[str]) -> pa.Table | None:
    """The CSV records of `table` (text in `message`, every metadata column present) as the
    string columns `read_committed_arrow(parse=True)` gives them for the journal's recorded
    column names `names` (its own mapping, `oncelog.tables.csvdoc.csv_fields`: the UUID column
    under its name unless named like a metadata column, null for a field a record lacks,
    `_<n>` past the header), without the metadata columns; None if they cannot be columns
    of one struct (a name repeated by a `_<n>` column, records that do not parse one by
    one). Invariant: the columns are `csv_doc_fits` for `names`."""
    from oncelog.errors import BadMessage
    from oncelog.tables.csvdoc import csv_fields

    meta = [n for n in table.column_names if n != "message"]
    try:
        fields = csv_fields(table, journal, list(names))
    except BadMessage:
        return None
    docs = fields.drop_columns(meta)
    if len(set(docs.column_names)) != docs.num_columns:
        return None
    return docs


def csv_doc_fits(doc: pa.StructType, names: Sequence[str]) -> bool:
    """Whether a segment's `doc` struct holds a CSV journal's records by the column names
    `names` (those it records now): the names, those of metadata columns left out, then
    `_<n>` for each position n past them, all strings. A segment written while the journal
    recorded other names does not fit: readers parse its text instead."""
    with needs_extra("arrow", "columnar segments (oncelog.tables)"):
        import pyarrow as pa

    from oncelog.spark.schema import METADATA_COLUMNS

    meta = {n for n, _ in METADATA_COLUMNS}
    got = [doc.field(i).name for i in range(doc.num_fields)]
    expected = [n for n in names if n not in meta]
    extra = got[len(expected):]
    return (
        got[: len(expected)] == expected
        and extra == [f"_{p}" for p in range(len(names), len(names) + len(extra))]
        and all(doc.field(i).type == pa.string() for i in range(doc.num_fields))
    )


def proto_struct(proto_class: Any) -> pa.StructType | None:
    """The `doc` struct of a fixed-framed journal's messages of `proto_class`: their fields
    but the UUID field and those named like metadata columns (as JSON documents' are),
    or None if they cannot be columns (`oncelog.tables.protodoc.doc_struct`)."""
    from oncelog.spark.schema import METADATA_COLUMNS
    from oncelog.tables.protodoc import doc_struct

    return doc_struct(proto_class.DESCRIPTOR, ["uuid", *(n for n, _ in METADATA_COLUMNS)])


def _recorded_proto(spec: JournalSpec) -> tuple[Any, pa.StructType | None] | None:
    """For a journal recording its protobuf class: the class and its `doc` struct; None for
    other journals; ProtoClassError naming journal, label and why if the class does not
    import here."""
    from oncelog.framing.protoclass import import_recorded_class

    cls = import_recorded_class(spec)
    return None if cls is None else (cls, proto_struct(cls))


def _cut_points(client: JournalClient, journal: str, begin: int, end: int,
                target: int) -> list[int]:
    """Ends of the segments `[begin, end)` is cut into: fragment boundaries about `target`
    bytes apart (fragments hold whole frames)."""
    cuts: list[int] = []
    last = begin
    for frag in client.fragments(journal):
        if frag.end <= begin or frag.end > end:
            continue
        if frag.end - last >= target:
            cuts.append(frag.end)
            last = frag.end
    if not cuts or cuts[-1] != end:
        cuts.append(end)
    return cuts


def seal(
    client: JournalClient, journal: str, through: int, *, target_bytes: int = SEGMENT_TARGET_BYTES
) -> list[SegmentRecord]:
    """Write the segments `journal` lacks below `through` (from the end of its last segment,
    or from its first available offset), each record put-if-absent after its file; returns
    the records written (or found written by a racing writer). Does nothing for journals
    without segments (see `enabled`)."""
    spec = client.get(journal)
    if not enabled(spec):
        return []
    incarnation = spec.incarnation or ""
    records, _ = segment_records(client, journal, incarnation)
    first = client.first_offset(journal)
    last = max(records, key=lambda r: r.end, default=None)
    if last is not None and last.end >= first:
        begin, states = last.end, dict(last.final)
    else:
        begin, states = first, {}
    if begin >= through:
        return []
    schema = declared_schema(spec)
    names = _recorded_csv_columns(spec)
    try:
        proto = _recorded_proto(spec)
    except ProtoClassError as exc:
        log.warning("%s: no segments are written for it (its readers read fragments)", exc)
        return []
    decoder = text_decoder(client, journal, spec.content_type)
    written: list[SegmentRecord] = []
    for end in _cut_points(client, journal, begin, through, target_bytes):
        rec = _seal_one(client, journal, decoder, begin, end, states, schema, names,
                        proto, incarnation)
        written.append(rec)
        begin, states = end, dict(rec.final)
    return written


def _seal_one(
    client: JournalClient,
    journal: str,
    decoder: RangeDecoder,
    begin: int,
    end: int,
    states: States,
    doc_schema: pa.Schema | None,
    csv_names: list[str] | None,
    proto: tuple[Any, pa.StructType | None] | None,
    incarnation: str,
) -> SegmentRecord:
    with needs_extra("arrow", "columnar segments (oncelog.tables)"):
        import pyarrow as pa
        import pyarrow.parquet as pq

    seen: set[str] = set()
    batches, final = read_range(decoder, begin, end, states, seen)
    table = in_commit_order(batches, text_schema(decoder))
    producers = frozenset(seen)
    parsed = False
    if decoder.kind.content_type == "application/x-ndjson" and table.num_rows:
        docs = parse_documents(table.column("message"), doc_schema,
                               [decoder.uuid_field, *table.column_names])
        if docs is not None:
            doc = pa.StructArray.from_arrays(
                [c.combine_chunks() for c in docs.columns], names=docs.column_names
            )
            table = table.append_column("doc", doc)
            parsed = True
    elif csv_names is not None and decoder.kind.content_type == "text/csv" and table.num_rows:
        fields = csv_documents(table, journal, csv_names)
        if fields is not None:
            doc = pa.StructArray.from_arrays(
                [c.combine_chunks() for c in fields.columns], names=fields.column_names
            )
            table = table.append_column("doc", doc)
            parsed = True
    elif proto is not None and proto[1] is not None and table.num_rows:
        from oncelog.tables.protodoc import payload_documents

        cls, struct = proto
        table = table.append_column(
            "doc", payload_documents(table.column("message"), cls, struct)
        )
        parsed = True
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", write_page_checksum=True,
                   row_group_size=1 << 20)
    data = sink.getvalue().to_pybytes()
    file = hashlib.sha1(data).hexdigest() + ".parquet"
    meta = _meta(client)
    meta.write(file_path(journal, file), data)
    rec = SegmentRecord(
        journal, begin, end, file, crc32c.crc32c(data), len(data), table.num_rows, parsed,
        producers, {p: states[p] for p in producers if p in states}, final, incarnation,
        new_token(),
    )
    if not meta.put_if_absent(record_path(journal, rec.name), rec.to_bytes()):
        theirs = meta.read(record_path(journal, rec.name))
        if theirs is not None:  # a racing writer's record of the same range: the same rows
            return SegmentRecord.from_bytes(journal, rec.name, theirs)
    return rec


# -- maintenance -----------------------------------------------------------------------------


def retire_below(client: JournalClient, journal: str, first: int) -> list[str]:
    """Delete the records (not files: `collect` does, after its grace) of segments ending at
    or before `first`: no reader starting at the first available offset uses them."""
    meta = _meta(client)
    records, _ = segment_records(client, journal)
    doomed = [r for r in records if r.end <= first]
    for rec in doomed:
        meta.delete(record_path(journal, rec.name))
    return [r.name for r in doomed]


def collect(
    client: JournalClient, journal: str, grace: float, dry_run: bool
) -> list[str]:
    """Segment files no record names, older than `grace` seconds (a killed or losing
    writer's), deleted unless `dry_run`; returns their paths under `.oncelog/`. Records of
    a deleted journal's earlier incarnation go too."""
    import time

    store = client.store
    meta = _meta(client)
    spec = client.get(journal)
    incarnation = spec.incarnation or ""
    names = [n for n in meta.list(_dir(journal)) if _RECORD_NAME.match(n)]
    referenced: set[str] = set()
    foreign: list[str] = []
    for name in names:
        data = meta.read(record_path(journal, name))
        if data is None:
            continue
        try:
            rec = SegmentRecord.from_bytes(journal, name, data)
        except SegmentError:
            continue  # reported by verify; never deleted here
        if rec.incarnation == incarnation:
            referenced.add(rec.file)
        else:
            foreign.append(record_path(journal, name))
    cutoff = time.time() - grace
    try:
        listed = store.backend.list_dir(store.meta_path(f"{_dir(journal)}/data"))
    except FileNotFoundError:
        listed = []
    doomed = [
        file_path(journal, o.name) for o in listed
        if o.name.endswith(".parquet") and o.name not in referenced and o.mtime <= cutoff
    ]
    if not dry_run:
        for path in foreign + doomed:
            meta.delete(path)
    return foreign + doomed


def chain(records: Sequence[SegmentRecord]) -> dict[int, SegmentRecord]:
    """The record to use at each `begin`: the one reaching furthest."""
    out: dict[int, SegmentRecord] = {}
    for rec in records:
        if rec.begin not in out or rec.end > out[rec.begin].end:
            out[rec.begin] = rec
    return out


def iter_problems(client: JournalClient, journal: str) -> Iterator[tuple[str, int, int, str]]:
    """(segment, begin, end, what) for each segment record or file a reader could use that
    is unreadable, missing or damaged."""
    records, bad = segment_records(client, journal)
    for what in bad:
        yield ("segment record", 0, 0, what)
    first = client.first_offset(journal)
    for rec in chain(records).values():
        if rec.end <= first:
            continue
        try:
            read_segment(client, rec)
        except SegmentError as exc:
            yield (f"segment {rec.name}", rec.begin, rec.end, str(exc))

