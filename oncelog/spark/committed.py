"""Committed reads whose sealed history Spark's own Parquet reader reads: `committed_dataframe`.

The `oncelog` data source (a Python DataSource) reads columnar segments with pyarrow in
Python tasks and hands Arrow batches to the JVM. A Python DataSource cannot return a JVM
scan, so this module builds the DataFrame itself, in the driver:

1. per journal it plans exactly what the segmented source plans
   (`oncelog.tables.merge_on_read.usable_prefix`: the segments a reader starting at the
   journal's first offset takes one after another, and the states after them), and checks
   every segment file against its record: size, CRC-32C of the whole file, and the Parquet
   footer (row count, the columns and types the read needs);
2. on a local-disk store it reads those files with `spark.read.parquet`, with Parquet page
   checksums verified by the JVM reader (`parquet.page.verify-checksum.enabled`), corrupt
   or missing files never ignored, and no partition discovery; the columns are selected in
   the source's order and types (`doc` becomes `message` for a `schema` read);
3. it unions (by name) the rest, read by the `oncelog` source: each journal's tail after its
   last usable segment, with the producer states planned there (the source's `tails`
   option, `TailsReader`), and the journals the segments cannot serve, read as before.

Invariants: the rows are exactly those of `spark.read.format("oncelog")` (and of
`read_committed`) for every journal, with the same columns, types and offsets. A segment
that fails a check is never handed to the JVM: its journal is read from that segment's
start through the source (its range from frames), with a `SegmentWarning` naming it. A
file damaged after the check fails the query (a page checksum error), never giving other
rows. Journals on other stores (S3), reads the segments cannot give exactly (another
`uuid_field`, `fast_path=false`, uncommitted reads, document fields of other types), and
journals without segments are read by the source alone.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import crc32c
import orjson
from pyspark.sql.datasource import InputPartition

from oncelog.spark.batch import OncelogBatchReader
from oncelog.spark.errors import OptionError
from oncelog.spark.options import ReadOptions, json_object_option
from oncelog.spark.schema import arrow_schema
from oncelog.spark.segmented import TailPartition, usable_with
from oncelog.tables.errors import SegmentWarning
from oncelog.tables.segments import SegmentRecord, States, file_path

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from oncelog.journal import JournalClient, JournalSpec

__all__ = [
    "PAGE_CHECKSUM_OPTION",
    "SegmentPlan",
    "TailsReader",
    "committed_dataframe",
    "parse_tails",
    "plan_segments",
]

log = logging.getLogger(__name__)

PAGE_CHECKSUM_OPTION = "parquet.page.verify-checksum.enabled"
"""The Parquet reader's setting (a per-read option: Spark passes read options to the Hadoop
configuration of the scan) that verifies each page's CRC, which segments are written with."""

_SELECTOR_MARKS = ("=", "!", "(", " in ", " notin ")
_UNSAFE_PATH = re.compile(r"[\\*?\[\]{}:%,\s]")
"""Characters a path handed to Spark's file sources may not hold: glob patterns, URI
syntax, and the comma and space some options split on."""
_CHUNK = 8 << 20


@dataclass(frozen=True)
class SegmentPlan:
    """How one journal is read: the local paths of the segment files Spark's Parquet reader
    reads (checked), the journal's first offset (a reader starts there), and its tail
    `[tail_begin, tail_end)` the source reads from frames with the states there
    (`tail_begin == tail_end`: none)."""

    journal: str
    content_type: str
    first: int
    paths: tuple[str, ...]
    tail_begin: int
    tail_end: int
    tail_states: States


# -- the tail: the source's `tails` option -----------------------------------------------------


def tails_option(planned: Iterable[SegmentPlan]) -> str:
    """The `tails` option of the source for these journals' tails (canonical JSON)."""
    return orjson.dumps(
        {
            p.journal: {
                "content_type": p.content_type,
                "begin": p.tail_begin,
                "end": p.tail_end,
                "states": [[q, a, b] for q, (a, b) in sorted(p.tail_states.items())],
            }
            for p in planned
        },
        option=orjson.OPT_SORT_KEYS,
    ).decode()


def parse_tails(text: str) -> dict[str, TailPartition]:
    """The tail partitions the `tails` option asks for, by journal (offsets `[begin, end)`
    read from frames with the producer states at `begin`); OptionError naming the journal
    if the option is not such a JSON object."""
    doc = json_object_option("tails", text, " of journals")
    out: dict[str, TailPartition] = {}
    for journal, tail in doc.items():
        try:
            begin, end = int(tail["begin"]), int(tail["end"])
            states = tuple(sorted((str(p), int(a), int(b)) for p, a, b in tail["states"]))
            content_type = str(tail["content_type"])
        except (KeyError, TypeError, ValueError) as exc:
            raise OptionError(
                f"option 'tails': journal {journal!r} needs begin, end, states "
                f"[[producer, last ack, begin], ...] and content_type: {exc!r}"
            ) from None
        if not 0 <= begin <= end:
            raise OptionError(
                f"option 'tails': journal {journal!r} offsets {begin}-{end} are not a range"
            )
        out[str(journal)] = TailPartition(str(journal), content_type, begin, end, states)
    return out


class TailsReader(OncelogBatchReader):
    """A batch read whose `tails` journals are read only over their planned tail (from
    frames, with the planned states, one task each); the other journals as always."""

    def __init__(
        self, options: ReadOptions, schema: StructType, tails: Mapping[str, TailPartition]
    ) -> None:
        super().__init__(options, schema)
        self.tails = dict(tails)

    def partitions(self) -> list[InputPartition]:
        options = self.options
        with options.store.open() as client:
            listed = [spec.name for spec in options.list_journals(client)]
        missing = sorted(set(self.tails) - set(listed))
        if missing:
            raise OptionError(
                f"option 'tails' names journals {missing} that the read does not select"
            )
        rest = tuple(name for name in listed if name not in self.tails)
        out: list[InputPartition] = []
        if rest:
            others = OncelogBatchReader(replace(options, journals=rest, selector=""), self.schema)
            out.extend(others.partitions())
        out.extend(t for t in self.tails.values() if t.begin < t.end)
        return out


# -- planning in the driver ------------------------------------------------------------------


def _file_crc(path: str) -> tuple[int, int]:
    """(size, CRC-32C) of a file, read in chunks."""
    value = size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            value = crc32c.crc32c(chunk, value)
            size += len(chunk)
    return size, value


def _damage(rec: SegmentRecord, path: str) -> str | None:
    """What is wrong with a segment's file (missing, size, CRC-32C), or None."""
    try:
        size = os.stat(path).st_size
        if size != rec.size:
            return f"its file data/{rec.file} has {size} bytes, recorded {rec.size}"
        size, crc = _file_crc(path)
    except OSError as exc:
        return f"its file data/{rec.file} cannot be read: {exc}"
    if size != rec.size or crc != rec.crc32c:
        return (
            f"its file data/{rec.file} is damaged ({size} bytes, CRC-32C {crc:08x}; recorded"
            f" {rec.size} bytes, {rec.crc32c:08x})"
        )
    return None


def _fits(file_schema: pa.Schema, arrow: pa.Schema, uuid_field: str) -> bool:
    """Whether Spark reading a segment file with the read's columns gives exactly the rows
    the source gives (`oncelog.spark.segmented`'s rules: document fields the segment lacks
    are null; a field of another type, or one left out of `doc`, cannot be given)."""
    import pyarrow as pa

    names = file_schema.names
    for field in arrow:
        if field.name == "message" and pa.types.is_struct(field.type):
            continue
        if names.count(field.name) != 1 or file_schema.field(field.name).type != field.type:
            return False
    wanted = arrow.field("message").type
    if not pa.types.is_struct(wanted):
        return True
    if names.count("doc") != 1 or not pa.types.is_struct(file_schema.field("doc").type):
        return False
    doc: pa.StructType = file_schema.field("doc").type
    fields = [doc.field(i) for i in range(doc.num_fields)]
    for i in range(wanted.num_fields):
        want = wanted.field(i)
        if want.name == uuid_field or want.name in arrow.names:
            return False  # a field the segment leaves out of `doc`
        # Spark matches Parquet fields by name ignoring case (by default): the field must
        # be there exactly once, or (null) not at all under any case.
        like = [f for f in fields if f.name.lower() == want.name.lower()]
        if like and (len(like) != 1 or like[0].name != want.name or like[0].type != want.type):
            return False
    return True


def _footer(rec: SegmentRecord, path: str) -> pa.Schema | str:
    """The file's Arrow schema from its Parquet footer, or what is wrong with the footer
    (unreadable, another row count than recorded)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        meta = pq.read_metadata(path)
        schema = meta.schema.to_arrow_schema()
    except (pa.ArrowException, OSError) as exc:
        return f"its file data/{rec.file} has an unreadable footer: {exc}"
    if meta.num_rows != rec.rows:
        return f"its file data/{rec.file} has {meta.num_rows} rows, recorded {rec.rows}"
    return schema


def _csv_names_fit(spec: JournalSpec, file_schema: pa.Schema) -> bool:
    """For a CSV journal that records column names: whether the segment's `doc` holds its
    records by the names recorded now (a segment written under other names is read by the
    source, which parses its text). Other journals: always."""
    from oncelog.framing.csvlines import csv_columns
    from oncelog.tables.segments import csv_doc_fits

    if spec.content_type != "text/csv" or "doc" not in file_schema.names:
        return True
    try:
        names = csv_columns(spec)
    except ValueError:
        return False
    if not names:
        return True
    doc = file_schema.field("doc").type
    return pa.types.is_struct(doc) and csv_doc_fits(doc, names)


def _plan_journal(
    client: JournalClient,
    options: ReadOptions,
    spec: JournalSpec,
    arrow: pa.Schema,
    pool: ThreadPoolExecutor,
) -> SegmentPlan | None:
    """The JVM part of one journal's read, or None to read it all through the source."""
    from oncelog.tables.merge_on_read import usable_prefix

    if not usable_with(options, spec.content_type):
        return None
    frags = client.fragments(spec.name)
    if not frags:
        return None
    stop = frags[-1].end
    prefix = usable_prefix(client, spec.name, stop)
    if prefix is None:
        return None
    taken, position, states = prefix
    paths = [client.store.meta_path(file_path(spec.name, rec.file)) for rec, _ in taken]
    if any(_UNSAFE_PATH.search(p) for p in paths):
        log.info("journal %r: segment paths Spark cannot take literally; read by the source",
                 spec.name)
        return None
    damages = list(pool.map(lambda job: _damage(*job), zip((r for r, _ in taken), paths)))
    for i, ((rec, at), path) in enumerate(zip(taken, paths)):
        problem = damages[i]
        found = _footer(rec, path) if problem is None else problem
        if isinstance(found, str):
            warnings.warn(
                f"{rec.describe()}: {found}; its range is read from the journal",
                SegmentWarning, stacklevel=3,
            )
        elif _fits(found, arrow, options.uuid_field) and _csv_names_fit(spec, found):
            continue
        if i == 0:
            return None  # nothing for the JVM: the source reads the journal as always
        # The segments before this one, and the rest from its start with its states.
        taken, position, states = taken[:i], rec.begin, at
        break
    return SegmentPlan(
        spec.name, spec.content_type, client.first_offset(spec.name),
        tuple(paths[: len(taken)]), position, stop, dict(states),
    )


def plan_segments(
    client: JournalClient, options: ReadOptions, specs: Iterable[JournalSpec], arrow: pa.Schema
) -> dict[str, SegmentPlan]:
    """The plans of the journals of `specs` (on a local-disk store) that Spark's Parquet
    reader can read part of, for a read with `options` whose rows have the Arrow schema
    `arrow`; journals left out are read by the source alone. Warns (`SegmentWarning`) of
    each segment that fails its checks."""
    out: dict[str, SegmentPlan] = {}
    with ThreadPoolExecutor(options.facts_threads, thread_name_prefix="oncelog-crc") as pool:
        for spec in specs:
            plan = _plan_journal(client, options, spec, arrow, pool)
            if plan is not None:
                out[spec.name] = plan
    return out


def _journals_text(journals: str | Sequence[str]) -> str:
    """The source's `journals` option for `journals` (a selector or names, or a list of
    names)."""
    return journals.strip() if isinstance(journals, str) else ",".join(journals)


def committed_dataframe(
    spark: SparkSession,
    store: str,
    journals: str | Sequence[str],
    schema: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    **options: str,
) -> DataFrame:
    """The committed messages of `journals` (names, or a label selector) of `store`, as
    `spark.read.format("oncelog")` reads them with these options, with each journal's
    sealed history read by Spark's own Parquet reader where it can (see the module).

    `schema`: DDL of the JSON documents (the source's `schema` option); `storage_options`:
    fsspec options of the store; `options`: any other read option of the source. The
    segmented journals are planned now (their heads as of this call, like a streaming
    micro-batch's end); the others when the DataFrame is evaluated, as the source does.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructField, StructType

    given = {str(k).lower(): str(v) for k, v in options.items()}
    for name in ("store", "journals", "selector", "schema", "storage_options", "tails"):
        if name in given:
            raise OptionError(
                f"committed_dataframe: give {name!r} as its own argument, not an option"
            )
    text = _journals_text(journals)
    source_opts: dict[str, str] = {"store": str(store), **given}
    if storage_options:
        source_opts["storage_options"] = orjson.dumps(dict(storage_options)).decode()
    if schema is not None:
        source_opts["schema"] = schema
    base = spark.read.format("oncelog").options(**source_opts).option("journals", text).load()
    read = ReadOptions.parse({**source_opts, "journals": text})
    if not read.committed:
        return base
    client = read.store.open()
    try:
        if client.store.backend.kind != "local":
            return base
        target: StructType = base.schema
        arrow = arrow_schema(target)
        specs = read.list_journals(client)
        if any(m in s.name for s in specs for m in _SELECTOR_MARKS):
            return base  # names the source would take for a selector
        planned = list(plan_segments(client, read, specs, arrow).values())
    finally:
        client.close()
    if not planned:
        return base
    log.info("committed_dataframe: %d of %d journals through Spark's Parquet reader",
             len(planned), len(specs))
    metas = [f for f in target.fields if f.name != "message"]
    message = target["message"]
    parsed = isinstance(message.dataType, StructType)
    read_schema = StructType(
        [*metas, StructField("doc" if parsed else "message", message.dataType, True)]
    )
    paths = [f"file://{p}" for j in planned for p in j.paths]
    segments = (
        spark.read.schema(read_schema)
        .option(PAGE_CHECKSUM_OPTION, "true")
        .option("ignoreCorruptFiles", "false")
        .option("ignoreMissingFiles", "false")
        .option("mergeSchema", "false")
        .option("recursiveFileLookup", "true")  # no partition columns from `x=y` directories
        .parquet(*paths)
    )
    trimmed = [j for j in planned if j.first > 0]
    if trimmed:
        # Rows below a journal's first offset are never read (a reader starts there); the
        # planned segments hold none, this states it for Spark.
        keep = ~F.col("journal").isin([j.journal for j in trimmed])
        for j in trimmed:
            keep = keep | ((F.col("journal") == j.journal) & (F.col("begin") >= j.first))
        segments = segments.where(keep)
    columns = [F.col(f.name) for f in metas]
    columns.append(F.col("doc" if parsed else "message").alias("message"))
    out = segments.select(*columns)
    planned_names = {j.journal for j in planned}
    with_tail = [j for j in planned if j.tail_begin < j.tail_end]
    rest = [s.name for s in specs if s.name not in planned_names]
    if with_tail or rest:
        names = [j.journal for j in with_tail] + rest
        reader = spark.read.format("oncelog").options(**source_opts)
        if with_tail:
            reader = reader.option("tails", tails_option(with_tail))
        out = out.unionByName(reader.option("journals", ",".join(names)).load())
    return out
