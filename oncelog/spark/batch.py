"""Batch reads: `spark.read.format("oncelog")`, parallel across journals and within them.

Planning (on the driver) lists the journals and cuts each at fragment boundaries
into splits of about `split_bytes`. A journal of one split is read by one task
applying the commit rules from its start (`journal_batches`). A larger one gets the
two-phase plan of `oncelog.sequencing.plan`: the driver gathers each split's facts (in
threads: fetching and JSON parsing overlap, UUIDs are parsed by Arrow kernels),
resolves them, and every split becomes a task that filters its own messages.
Reading uncommitted needs no plan. A journal whose history starts with columnar segments
(written by compaction) is read a task per segment plus a task for its tail
(oncelog.spark.segmented).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceReader, InputPartition

from oncelog.framing import set_gc_pausing
from oncelog.journal import JournalClient, JournalSpec
from oncelog.sequencing.plan import JournalPlan, Split, SplitPlan, plan_splits, resolve
from oncelog.spark.batches import decoder_for, new_message_factory
from oncelog.spark.options import ReadOptions
from oncelog.spark.read import journal_batches, split_batches, split_facts, uncommitted_batches
from oncelog.spark.schema import arrow_schema, check_schema
from oncelog.spark.segmented import (
    SegmentPartition,
    TailPartition,
    read_partition,
    segment_partitions,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

__all__ = ["OncelogBatchReader", "RangePartition", "SplitPartition", "new_message_factory"]


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """Offsets `[begin, end)` of one journal, read sequentially (committed) or as they are."""

    journal: str
    content_type: str
    begin: int
    end: int
    committed: bool


@dataclass(frozen=True)
class SplitPartition(InputPartition):
    """One split of a journal read with the two-phase plan."""

    content_type: str
    plan: SplitPlan


class OncelogBatchReader(DataSourceReader):
    """Plans the splits of a batch read and reads each into Arrow record batches."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        check_schema(schema)
        self.options = options
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        options = self.options
        arrow = arrow_schema(self.schema)
        client = options.store.open()
        try:
            specs = options.list_journals(client)
            journal_splits: list[tuple[JournalSpec, list[Split]]] = []
            segmented: list[InputPartition] = []
            for spec in specs:
                # Fails early if a journal cannot be read as the options ask.
                decoder_for(
                    client, options, spec.name, spec.content_type, arrow.field("message").type
                )
                frags = [(f.begin, f.end) for f in client.fragments(spec.name)]
                if options.committed and frags:
                    # Sealed history from its columnar segments, then the tail (see
                    # oncelog.spark.segmented); a journal without any plans as before.
                    parts = segment_partitions(
                        client, options, spec.name, spec.content_type, frags[-1][1]
                    )
                    if parts is not None:
                        segmented.extend(parts)
                        continue
                if frags:
                    # A trim may cut the first fragment (compacted before the trim point).
                    begin = max(frags[0][0], client.first_offset(spec.name))
                    journal_splits.append(
                        (spec, plan_splits(spec.name, frags, options.split_bytes, begin=begin))
                    )
            if not options.committed:
                return [
                    RangePartition(s.journal, spec.content_type, s.begin, s.end, False)
                    for spec, splits in journal_splits
                    for s in splits
                ]
            plans = self._plans(client, arrow, [js for js in journal_splits if len(js[1]) > 1])
        finally:
            client.close()
        out: list[InputPartition] = list(segmented)
        for spec, splits in journal_splits:
            plan = plans.get(spec.name)
            if plan is None or plan.sequential is not None:
                out.append(
                    RangePartition(
                        spec.name, spec.content_type, splits[0].begin, splits[-1].end, True
                    )
                )
            else:
                out.extend(SplitPartition(spec.content_type, sp) for sp in plan.splits)
        return out

    def _plans(
        self,
        client: JournalClient,
        arrow: pa.Schema,
        journal_splits: list[tuple[JournalSpec, list[Split]]],
    ) -> dict[str, JournalPlan]:
        """Phases 1 and 1.5 of the split plan for journals of several splits."""
        if not journal_splits:
            return {}
        options = self.options
        message_type = arrow.field("message").type
        jobs = [(spec, split) for spec, splits in journal_splits for split in splits]

        def facts(job: tuple[JournalSpec, Split]) -> Any:
            spec, split = job
            decoder = decoder_for(client, options, spec.name, spec.content_type, message_type)
            return split_facts(decoder, split)

        with ThreadPoolExecutor(options.facts_threads, thread_name_prefix="oncelog-facts") as pool:
            gathered = list(pool.map(facts, jobs))
        plans: dict[str, JournalPlan] = {}
        i = 0
        for spec, splits in journal_splits:
            plans[spec.name] = resolve(spec.name, splits, gathered[i : i + len(splits)])
            i += len(splits)
        return plans

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(
            partition, (SplitPartition, RangePartition, SegmentPartition, TailPartition)
        ):
            return  # Spark's stand-in partition when there is nothing to read
        # Spark's Python worker is a process this data source owns: bulk decoding may pause
        # its collector (see oncelog.framing.set_gc_pausing).
        set_gc_pausing(True)
        options = self.options
        arrow = arrow_schema(self.schema)
        message_type = arrow.field("message").type
        client = options.store.open()
        try:
            if isinstance(partition, (SegmentPartition, TailPartition)):
                journal = (
                    partition.record.journal
                    if isinstance(partition, SegmentPartition) else partition.journal
                )
                decoder = decoder_for(
                    client, options, journal, partition.content_type, message_type
                )
                yield from read_partition(client, partition, decoder, arrow, options.batch_rows)
                return
            if isinstance(partition, SplitPartition):
                split = partition.plan.split
                decoder = decoder_for(
                    client, options, split.journal, partition.content_type, message_type
                )
                yield from split_batches(decoder, partition.plan, arrow, options.batch_rows)
                return
            decoder = decoder_for(
                client, options, partition.journal, partition.content_type, message_type
            )
            if partition.committed:
                yield from journal_batches(
                    decoder, partition.begin, partition.end, arrow, options.batch_rows
                )
            else:
                yield from uncommitted_batches(
                    decoder, partition.begin, partition.end, arrow, options.batch_rows
                )
        finally:
            client.close()
