"""Reading journal ranges into Arrow record batches: the work of one Spark task.

Three ways, all yielding `pyarrow.RecordBatch`es of the source's schema:

- `uncommitted_batches`: every message, with its UUID flags;
- `split_batches`: phase 2 of the split plan (`oncelog.sequencing.plan`) for one split;
- `journal_batches`: a whole journal in one task, by the plan's commit rules (a
  Sequencer takes over where those could differ from it);
- `sequential_batches`: a Sequencer over a range, resumable from producer states
  (streaming micro-batches).

With the decoder's `fast` path (the default), `split_batches` and `journal_batches`
decide commits a batch at a time (`oncelog.sequencing.bulkcommit`) and hand over to the
per-message rules of `SplitCommitter` only where a batch needs them; both give the same
rows (tests/spark/test_spark_read_fast.py).

Pure pyarrow: no Spark is needed to run (or test) them.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from oncelog.message import Envelope
from oncelog.sequencer import Sequencer
from oncelog.sequencing.bulkcommit import BulkCommitter, NotBulk, bulk_facts
from oncelog.sequencing.plan import (
    Diverged,
    Split,
    SplitCommitter,
    SplitFacts,
    SplitPlan,
    gather_facts,
)
from oncelog.spark.batches import DecodedBatch, RangeDecoder, record_batch
from oncelog.spark.sequential import sequence_with_commits

__all__ = [
    "split_facts",
    "uncommitted_batches",
    "split_batches",
    "journal_batches",
    "sequential_batches",
]


def _sliced(batch: pa.RecordBatch, rows: int) -> Iterator[pa.RecordBatch]:
    if batch.num_rows <= rows:
        if batch.num_rows:
            yield batch
        return
    for start in range(0, batch.num_rows, rows):
        yield batch.slice(start, rows)


_MAX_RUNS = 64
"""Above this many runs of selected rows, a batch is filtered (copied) instead of sliced."""


def _selected(batch: pa.RecordBatch, mask: pa.BooleanArray, rows: int) -> Iterator[pa.RecordBatch]:
    """The rows of `batch` where `mask` is true (null: false), at most `rows` a batch: zero-copy
    slices of its runs of true rows when there are few (the usual case: all but a
    transaction's ACK and the rows still pending), one filtered copy otherwise."""
    n = len(mask)
    if n == 0:
        return
    if mask.null_count:
        mask = pc.fill_null(mask, False)
    selected = pc.sum(mask).as_py() or 0
    if selected == n:
        yield from _sliced(batch, rows)
        return
    if selected == 0:
        return
    changes = pc.indices_nonzero(pc.not_equal(mask.slice(1), mask.slice(0, n - 1)))
    if len(changes) > 2 * _MAX_RUNS:
        yield from _sliced(batch.filter(mask), rows)
        return
    edges = [0, *(i + 1 for i in changes.to_pylist()), n]
    value = mask[0].as_py()
    for start, stop in zip(edges, edges[1:]):
        if value:
            yield from _sliced(batch.slice(start, stop - start), rows)
        value = not value


def split_facts(decoder: RangeDecoder, split: Split) -> SplitFacts:
    """Phase 1 of the split plan: the producers' facts of one split."""
    if decoder.fast:
        producers: list[str] = []
        clocks: list[int] = []
        flags: list[int] = []
        begins: list[int] = []
        for p, c, f, b in decoder.ids(split.begin, split.end):
            producers += p
            clocks += c
            flags += f
            begins += b
        bulk = bulk_facts(producers, clocks, flags, begins)
        if bulk is not None:
            return bulk
        return gather_facts(zip(producers, clocks, flags, begins))
    facts = SplitFacts()
    for producers, clocks, flags, begins in decoder.ids(split.begin, split.end):
        gather_facts(zip(producers, clocks, flags, begins), facts)
    return facts


def uncommitted_batches(
    decoder: RangeDecoder, begin: int, end: int, schema: pa.Schema, batch_rows: int = 65536
) -> Iterator[pa.RecordBatch]:
    """Every message of `[begin, end)`, committed or not (null commit offsets)."""
    for batch in decoder.batches(begin, end):
        yield from _sliced(record_batch(batch, schema), batch_rows)


def _emit(
    live: dict[int, DecodedBatch],
    starts: list[int],
    committed: tuple[list[int], list[int]],
    schema: pa.Schema,
    batch_rows: int,
) -> Iterator[pa.RecordBatch]:
    """Record batches of committed rows (global row numbers, commit offsets), by source batch."""
    refs, commits = committed
    if not refs:
        return
    newest = starts[-1]
    if min(refs) >= newest:  # the usual case: all from the batch just fed
        rows = pc.subtract(pa.array(refs, pa.int64()), pa.scalar(newest, pa.int64()))
        yield from _sliced(record_batch(live[newest], schema, rows, commits), batch_rows)
        return
    ordered = sorted(zip(refs, commits))
    i = 0
    while i < len(ordered):
        start = starts[bisect.bisect_right(starts, ordered[i][0]) - 1]
        batch = live[start]
        stop = start + len(batch)
        group_rows, group_commits = [], []
        while i < len(ordered) and ordered[i][0] < stop:
            group_rows.append(ordered[i][0] - start)
            group_commits.append(ordered[i][1])
            i += 1
        yield from _sliced(record_batch(batch, schema, group_rows, group_commits), batch_rows)


def _committed_batches(
    decoder: RangeDecoder,
    begin: int,
    end: int,
    plan: SplitPlan | None,
    schema: pa.Schema,
    batch_rows: int,
) -> Iterator[pa.RecordBatch]:
    """The committed messages of `[begin, end)`: of a split by its `plan`, or (no plan)
    of a journal read from its start, guarded (Diverged where a Sequencer must decide).

    With the decoder's fast path, batches are decided in bulk (`BulkCommitter`) until one
    needs the per-message rules, which then take over in the same state; without, the
    per-message rules decide all (`SplitCommitter`).
    """
    guard = plan is None
    bulk = BulkCommitter(plan.states, plan.commits) if plan is not None else BulkCommitter()
    fast: BulkCommitter | None = bulk if decoder.fast else None
    rows_rules: SplitCommitter[int] | None = (
        None if fast is not None else SplitCommitter(plan, guard=guard)
    )
    live: dict[int, DecodedBatch] = {}
    starts: list[int] = []
    row = 0
    for batch in decoder.batches(begin, end):
        n = len(batch)
        live[row] = batch
        starts.append(row)
        if fast is not None:
            try:
                decided = fast.feed(batch.uuids, batch.columns[1], row, batch.base)
            except NotBulk:
                rows_rules = fast.handover(plan, guard)
                fast = None
            else:
                yield from _emit(live, starts, decided.carried, schema, batch_rows)
                cols = batch.columns
                rows = pa.RecordBatch.from_arrays(
                    cols[:3] + [decided.commits] + cols[3:], schema=schema
                )
                yield from _selected(rows, decided.mask, batch_rows)
        if rows_rules is not None:
            try:
                out = rows_rules.feed(
                    batch.producers, batch.clocks, batch.flags, batch.begins, range(row, row + n)
                )
            except Diverged as exc:
                yield from _emit(live, starts, exc.committed, schema, batch_rows)
                raise
            yield from _emit(live, starts, out, schema, batch_rows)
        row += n
        # Drop batches no pending transaction still refers to.
        oldest = rows_rules.oldest_pending() if rows_rules is not None else bulk.oldest_pending()
        horizon = row if oldest is None else oldest
        while len(starts) > 1 and starts[1] <= horizon:
            del live[starts.pop(0)]
        if starts and starts[0] + len(live[starts[0]]) <= horizon:
            del live[starts.pop(0)]
    last = rows_rules.finish() if rows_rules is not None else bulk.finish()
    yield from _emit(live, starts, last, schema, batch_rows)


def split_batches(
    decoder: RangeDecoder, plan: SplitPlan, schema: pa.Schema, batch_rows: int = 65536
) -> Iterator[pa.RecordBatch]:
    """Phase 2 of the split plan: the committed messages of one split."""
    split = plan.split
    return _committed_batches(decoder, split.begin, split.end, plan, schema, batch_rows)


def journal_batches(
    decoder: RangeDecoder, begin: int, end: int, schema: pa.Schema, batch_rows: int = 65536
) -> Iterator[pa.RecordBatch]:
    """The committed messages of a journal read from its start (`begin`) to `end`.

    The split plan's commit rules run over the whole range, guarded: should the journal
    hold what the Sequencer may decide otherwise (`Diverged`), what was committed before
    that point stands and a Sequencer reads the rest.
    """
    try:
        yield from _committed_batches(decoder, begin, end, None, schema, batch_rows)
    except Diverged as exc:
        yield from sequential_batches(
            decoder, begin, end, schema, batch_rows=batch_rows, commits_from=exc.offset
        )


def sequential_batches(
    decoder: RangeDecoder,
    begin: int,
    end: int,
    schema: pa.Schema,
    sequencer: Sequencer | None = None,
    batch_rows: int = 65536,
    commits_from: int = 0,
    producers: set[str] | None = None,
) -> Iterator[pa.RecordBatch]:
    """The committed messages of `[begin, end)` as the Sequencer decides them.

    `sequencer` carries producer states from an earlier read (streaming); transactions
    that began before `begin` are replayed from the journal when their ACK comes. Only
    messages committed at or after offset `commits_from` are returned. `producers`, if
    given, is filled with the producers (hex) of every frame of `[begin, end)`.
    """
    seq = Sequencer() if sequencer is None else sequencer
    journal = decoder.journal
    kept: list[DecodedBatch] = []
    producer_ids: dict[str, bytes] = {}

    def replay(j: str, replay_begin: int, replay_end: int) -> Iterable[Envelope]:
        if not kept or replay_begin < kept[0].base:
            stop = min(replay_end, kept[0].base) if kept else replay_end
            kept[:0] = list(decoder.batches(replay_begin, stop))
        for b in list(kept):
            if b.end <= replay_begin:
                continue
            if b.base >= replay_end:
                break
            for env in _id_envelopes(b, producer_ids):
                if replay_begin <= env.begin and env.end <= replay_end:
                    yield env

    def source_of(begin: int) -> DecodedBatch:
        return kept[bisect.bisect_right([b.base for b in kept], begin) - 1]

    for batch in decoder.batches(begin, end):
        kept.append(batch)
        if producers is not None:
            producers.update(batch.producers)
        # Begin offsets and commit offsets of the committed messages of this batch, and of
        # older ones (a replay may add older batches to `kept` meanwhile).
        here_begins: list[int] = []
        here_commits: list[int] = []
        older: list[tuple[int, int]] = []
        base = batch.base
        envelopes = _id_envelopes(batch, producer_ids)
        for env, commit in sequence_with_commits(seq, envelopes, replay):
            if commit < commits_from:
                continue
            if env.begin >= base:
                here_begins.append(env.begin)
                here_commits.append(commit)
            else:
                older.append((env.begin, commit))
        by_source: dict[int, tuple[DecodedBatch, list[int], list[int]]] = {}
        for b, commit in older:
            src = source_of(b)
            _, begins_, commits_ = by_source.setdefault(id(src), (src, [], []))
            begins_.append(b)
            commits_.append(commit)
        for src, begins_, commits_ in [(batch, here_begins, here_commits), *by_source.values()]:
            if begins_:
                rows = None if begins_ == src.begins else _rows_of(src, begins_)
                yield from _sliced(record_batch(src, schema, rows, commits_), batch_rows)
        # Keep only what an open transaction may still deliver.
        _, states = seq.checkpoint()
        opens = [s.begin for s in states if s.journal == journal and s.begin != -1]
        horizon = min(opens) if opens else batch.end
        while kept and kept[0].end <= horizon:
            kept.pop(0)


def _id_envelopes(batch: DecodedBatch, producer_ids: dict[str, bytes]) -> list[Envelope]:
    """Envelopes of `batch`'s frames that carry only what a Sequencer reads (journal,
    offsets, UUID ids), without decoding a message: the rows come from the batch's
    columns. `producer_ids` caches producer hex to bytes across batches."""
    journal = batch.journal
    begins = batch.begins
    ends = [*begins[1:], batch.end]
    out: list[Envelope] = []
    append = out.append
    for b, e, p, c, f in zip(begins, ends, batch.producers, batch.clocks, batch.flags):
        pid = producer_ids.get(p)
        if pid is None:
            pid = producer_ids[p] = bytes.fromhex(p)
        append(Envelope(journal, b, e, None, (pid, c, f)))
    return out


def _rows_of(batch: DecodedBatch, begins: list[int]) -> list[int]:
    """Row numbers in `batch` of messages starting at `begins`."""
    index = pc.index_in(pa.array(begins, pa.int64()), value_set=batch.columns[1])
    rows: list[int] = index.to_pylist()  # every one of `begins` starts a row of `batch`
    return rows
