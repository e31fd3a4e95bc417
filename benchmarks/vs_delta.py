"""Benchmark: oncelog beside Delta Lake (`deltalake`, delta-rs) on the workloads users compare.

The same events, `{"user": int, "page": str, "ts": float, "n": int}`, landed exactly once on
local disk by both systems, in the same run, the two systems taking turns in every
repetition (which goes first alternates). Delta writes use idempotent app transactions
(`CommitProperties(app_transactions=...)`), its exactly-once mechanism. Workloads:

- ingest: N events (1M) in transactions of 10k. oncelog: `Publisher.transaction()` around
  10k `publish_uncommitted` calls; the bulk call `Publisher.publish_many` in the same
  transactions; and hand-built frames + `JournalClient.append_many` (a reference, no
  publisher). Delta: `write_deltalake(mode="append")` of `pyarrow.Table.from_pylist` of the
  10k dicts, one commit each.
- cold read to dicts: a new client reads the N committed events to Python dicts, with
  defaults (`read_committed`), against `DeltaTable(...).to_pyarrow_table().to_pylist()`.
- Arrow read: `oncelog.arrow.read_committed_arrow(parse=True)` against
  `DeltaTable(...).to_pyarrow_table()`.
- compacted journal (columnar segments): the ingested journal compacted (`compact`, which
  writes its Parquet segments; timed against compacting the frames journal with segments
  turned off, `oncelog.dev/segments=off`), then read as Arrow
  (`read_committed_arrow(parse=True, columns=<the events' four fields>)`: the columns
  Delta's table has), as dicts through Arrow (`.to_pylist()`) and as
  pandas (`.to_pandas()`, when pandas is installed), against Delta's
  `to_pyarrow_table()`, `.to_pylist()` and `to_pandas()`. Segment bytes are printed
  beside the JSON bytes they hold.
- 4 writers: 4 processes write N/4 events each, in transactions of 10k, to one journal /
  one Delta table (Delta retries its conflicting commits); oncelog with `publish_uncommitted`
  calls, then (against the same Delta figure) with `publish_many`.
- small transactions: T (2,000) durable one-event transactions, one process.
- publish_uncommitted, main-thread CPU per call: `time.thread_time` around 100k calls only
  (transactions of 10k, JSONMessages built beforehand, a lambda mapping; best of 3), beside
  the floor of framing one message measured in the same run (the same loop calling only
  `orjson.dumps(doc)` and a bytearray `+=`), as a ratio, and against its target of 1.2 us.

Generating the dicts is outside the timings; converting them (JSONMessage, Arrow) is inside.
Every figure is checked against the exact count of events read back. Rows of oncelog
variants without a Delta run of their own are compared with the Delta run of the row above
(same work). Printed: medians over
`--repeat` repetitions of wall time (as events or transactions per second) and of CPU time
(process CPU, all threads; for the 4 writers the children's), each oncelog figure beside
Delta's as a ratio (above 1: oncelog faster / cheaper).

    .venv/bin/python benchmarks/vs_delta.py [--quick] [--events N] [--small T] [--repeat R]
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing as mp
import os
import queue
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson  # noqa: E402
import pyarrow as pa  # noqa: E402
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake  # noqa: E402

from oncelog import _native  # noqa: E402
from oncelog.journal import JournalClient, JournalSpec, open_journals  # noqa: E402
from oncelog.message import JSONMessage  # noqa: E402
from oncelog.publisher import Publisher  # noqa: E402
from oncelog.reading import read_committed  # noqa: E402
from oncelog.sequencer import Sequencer  # noqa: E402

NDJSON = "application/x-ndjson"
JOURNAL = "bench/events"
ROUTE = (JOURNAL, NDJSON)
PAGES = [f"/page/{i:03d}" for i in range(64)]
TXN = 10_000


def to_journal(_msg: Any) -> tuple[str, str]:
    return ROUTE


def events(first: int, count: int) -> list[dict[str, Any]]:
    """Events first .. first + count - 1 (deterministic, fresh dicts every call)."""
    return [
        {"user": n * 7919 % 100_003, "page": PAGES[n % 64], "ts": 1.7e9 + n / 1000, "n": n}
        for n in range(first, first + count)
    ]


@dataclass
class Cost:
    """Wall and CPU seconds of one measured run, and how many units it did."""

    wall: float = 0.0
    cpu: float = 0.0
    units: int = 0

    def add(self, func: Callable[[], Any]) -> Any:
        w, c = time.perf_counter(), time.process_time()
        out = func()
        self.cpu += time.process_time() - c
        self.wall += time.perf_counter() - w
        return out


@dataclass
class Series:
    runs: list[Cost] = field(default_factory=list)

    def median(self) -> tuple[float, float]:
        """(units per wall second, CPU microseconds per unit), medians of the runs."""
        rate = statistics.median(r.units / r.wall for r in self.runs)
        cpu = statistics.median(r.cpu / r.units * 1e6 for r in self.runs)
        return rate, cpu


# -- oncelog --------------------------------------------------------------------------------


def new_journal(root: str) -> JournalClient:
    client = open_journals(root)
    client.create(JournalSpec(JOURNAL, labels={"content-type": NDJSON}))
    return client


def committed_count(root: str) -> int:
    with open_journals(root) as client:
        return sum(1 for _ in read_committed(client, JOURNAL))


def oncelog_ingest_publish(root: str, first: int, total: int, create: bool = True) -> Cost:
    """Transactions of TXN `publish_uncommitted` calls."""
    cost = Cost(units=total)
    client = new_journal(root) if create else open_journals(root)
    pub = Publisher(client)

    def txn(docs: list[dict[str, Any]]) -> None:
        with pub.transaction():
            publish = pub.publish_uncommitted
            for doc in docs:
                publish(to_journal, JSONMessage(doc))

    for start in range(first, first + total, TXN):
        docs = events(start, min(TXN, first + total - start))
        cost.add(lambda: txn(docs))
    client.close()
    return cost


def oncelog_ingest_bulk(root: str, first: int, total: int, create: bool = True) -> Cost:
    """Transactions of one `publish_many` call of TXN documents."""
    cost = Cost(units=total)
    client = new_journal(root) if create else open_journals(root)
    pub = Publisher(client)

    def txn(docs: list[dict[str, Any]]) -> None:
        with pub.transaction():
            pub.publish_many(to_journal, docs)

    for start in range(first, first + total, TXN):
        docs = events(start, min(TXN, first + total - start))
        cost.add(lambda: txn(docs))
    client.close()
    return cost


def oncelog_ingest_frames(root: str, first: int, total: int) -> Cost:
    """Reference without a publisher: frames stamped OUTSIDE_TXN by hand (a producer, a
    clock, `str(uuid)`), one `append_many` per TXN frames, waited for (durable)."""
    from oncelog.message import Clock, Flags, build_uuid, new_producer_id

    cost = Cost(units=total)
    client = new_journal(root)
    producer, clock = new_producer_id(), Clock()
    clock.update()
    dumps, tick = orjson.dumps, clock.tick

    def write(docs: list[dict[str, Any]]) -> None:
        frames = []
        for doc in docs:
            doc["uuid"] = str(build_uuid(producer, tick(), Flags.OUTSIDE_TXN))
            frames.append(dumps(doc, option=orjson.OPT_APPEND_NEWLINE))
        client.append_many(JOURNAL, frames)

    for start in range(first, first + total, TXN):
        docs = events(start, min(TXN, first + total - start))
        cost.add(lambda: write(docs))
    client.close()
    return cost


def oncelog_small(root: str, count: int) -> Cost:
    client = new_journal(root)
    pub = Publisher(client)
    cost = Cost(units=count)

    def txn(doc: dict[str, Any]) -> None:
        with pub.transaction():
            pub.publish_uncommitted(to_journal, JSONMessage(doc))

    for doc in events(0, count):
        cost.add(lambda: txn(doc))
    client.close()
    return cost


def oncelog_read_dicts(root: str, buffer: int | None = None) -> tuple[Cost, int]:
    """read_committed to dicts: the default (growing) ring, or a fixed ring of `buffer`."""
    cost = Cost()

    def read() -> int:
        seq = None if buffer is None else Sequencer({JOURNAL: 0}, buffer=buffer)
        with open_journals(root) as client:
            docs = [env.message.doc for env in read_committed(client, JOURNAL, sequencer=seq)]
        return len(docs)

    cost.units = cost.add(read)
    return cost, cost.units


def oncelog_read_arrow(root: str) -> tuple[Cost, int]:
    from oncelog.arrow import read_committed_arrow

    cost = Cost()

    def read() -> int:
        with open_journals(root) as client:
            return int(read_committed_arrow(client, JOURNAL, parse=True).num_rows)

    cost.units = cost.add(read)
    return cost, cost.units


def oncelog_compact(root: str, segments: bool) -> Cost:
    """Compact the journal (`segments=False`: with its segments label off)."""
    import dataclasses

    cost = Cost()
    with open_journals(root) as client:
        if not segments:
            spec = client.get(JOURNAL)
            client.update(dataclasses.replace(
                spec, labels=spec.labels.set("oncelog.dev/segments", "off")))
        result = cost.add(lambda: client.compact(JOURNAL, retire_grace=0))
        assert result.changed
    return cost


def segment_bytes(root: str) -> tuple[int, int]:
    """(bytes of the journal's segment files, bytes of JSON they hold)."""
    from oncelog.tables.segments import segment_records

    with open_journals(root) as client:
        records, _ = segment_records(client, JOURNAL)
        return sum(r.size for r in records), sum(r.end - r.begin for r in records)


DOC_FIELDS = ["user", "page", "ts", "n"]
"""The events' fields: what Delta's table holds, and what the compacted reads ask for."""


def oncelog_read_arrow_as(root: str, how: str) -> tuple[Cost, int]:
    """read_committed_arrow(parse=True, columns=the events' fields) then `how`: "arrow",
    "pylist" or "pandas" (the same columns Delta's table has)."""
    from oncelog.arrow import read_committed_arrow

    cost = Cost()

    def read() -> int:
        with open_journals(root) as client:
            table = read_committed_arrow(client, JOURNAL, parse=True, columns=DOC_FIELDS)
        if how == "pylist":
            return len(table.to_pylist())
        if how == "pandas":
            return len(table.to_pandas())
        return int(table.num_rows)

    cost.units = cost.add(read)
    return cost, cost.units


def delta_read_as(path: str, how: str) -> tuple[Cost, int]:
    cost = Cost()

    def read() -> int:
        if how == "pandas":
            return len(DeltaTable(path).to_pandas())
        table = DeltaTable(path).to_pyarrow_table()
        return len(table.to_pylist()) if how == "pylist" else int(table.num_rows)

    cost.units = cost.add(read)
    return cost, cost.units


# -- Delta Lake -------------------------------------------------------------------------------


def delta_write(path: str, docs: list[dict[str, Any]], app: str, version: int) -> None:
    props = CommitProperties(app_transactions=[Transaction(app, version)], max_commit_retries=1000)
    write_deltalake(path, pa.Table.from_pylist(docs), mode="append", commit_properties=props)


def delta_ingest(path: str, first: int, total: int, app: str = "bench") -> Cost:
    cost = Cost(units=total)
    for version, start in enumerate(range(first, first + total, TXN)):
        docs = events(start, min(TXN, first + total - start))
        cost.add(lambda: delta_write(path, docs, app, version))
    return cost


def delta_small(path: str, count: int) -> Cost:
    cost = Cost(units=count)
    for version, doc in enumerate(events(0, count)):
        cost.add(lambda: delta_write(path, [doc], "bench-small", version))
    return cost


def delta_count(path: str) -> int:
    return int(DeltaTable(path).to_pyarrow_table().num_rows)


def delta_read_dicts(path: str) -> tuple[Cost, int]:
    cost = Cost()
    cost.units = cost.add(lambda: len(DeltaTable(path).to_pyarrow_table().to_pylist()))
    return cost, cost.units


def delta_read_arrow(path: str) -> tuple[Cost, int]:
    cost = Cost()
    cost.units = cost.add(lambda: int(DeltaTable(path).to_pyarrow_table().num_rows))
    return cost, cost.units


# -- 4 writer processes ----------------------------------------------------------------------


def _writer(system: str, target: str, first: int, count: int, go: Any, out: Any) -> None:
    """One writer process: wait for `go`, write, report (CPU seconds, end time)."""
    go.wait()
    cpu = time.process_time()
    if system == "oncelog":
        oncelog_ingest_publish(target, first, count, create=False)
    elif system == "oncelog-bulk":
        oncelog_ingest_bulk(target, first, count, create=False)
    else:
        delta_ingest(target, first, count, app=f"writer-{first}")
    out.put((time.process_time() - cpu, time.monotonic()))


def writers(system: str, target: str, total: int, procs: int = 4) -> Cost:
    ctx = mp.get_context("spawn")
    if system.startswith("oncelog"):
        new_journal(target).close()
    else:  # created up front: writers creating it at once conflict on its metadata
        DeltaTable.create(target, schema=pa.Table.from_pylist(events(0, 1)).schema)
    go, out = ctx.Event(), ctx.Queue()
    per = total // procs
    children = [
        ctx.Process(target=_writer, args=(system, target, i * per, per, go, out))
        for i in range(procs)
    ]
    for child in children:
        child.start()
    time.sleep(3.0)  # let the children import; not a synchronisation: `go` is
    start = time.monotonic()
    go.set()
    reports = []
    deadline = start + 1800
    while len(reports) < len(children):  # bounded: each pass waits at most 1 s
        try:
            reports.append(out.get(timeout=1.0))
        except queue.Empty:
            dead = [c.exitcode for c in children if c.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                for child in children:
                    child.kill()
                raise RuntimeError(f"{system} writers failed (exit codes {dead})") from None
    for child in children:
        child.join(60)
        if child.exitcode != 0:
            raise RuntimeError(f"{system} writer exited with {child.exitcode}")
    return Cost(
        wall=max(end for _, end in reports) - start,
        cpu=sum(cpu for cpu, _ in reports),
        units=per * procs,
    )


# -- the run ------------------------------------------------------------------------------------


PUBLISH_CPU_TARGET_US = 1.2
"""Target of `publish_uncommitted`'s main-thread CPU per call (measured on a 1.91 us machine)."""


def publish_cpu_per_call(root: str, calls: int = 100_000) -> tuple[float, float]:
    """(publish_uncommitted, floor) main-thread CPU microseconds per call, best of 3 runs.

    Only the calls are timed (`time.thread_time`: the appender's writer thread is left
    out): transactions of TXN calls of JSONMessages built beforehand, a lambda mapping. The
    floor is the same loop over the same documents doing only what framing a message needs
    at least: `orjson.dumps(doc)` appended to a bytearray."""
    import gc

    client = open_journals(root)
    client.create(JournalSpec(JOURNAL, labels={"content-type": NDJSON}))
    pub = Publisher(client)
    mapping = lambda _m: ROUTE  # noqa: E731 - a lambda mapping, as users write them
    dumps = orjson.dumps
    best = floor = float("inf")
    try:
        for _ in range(3):
            msgs = [JSONMessage(doc) for doc in events(0, calls)]
            gc.collect()
            spent = 0.0
            for start in range(0, calls, TXN):
                with pub.transaction():
                    publish = pub.publish_uncommitted
                    t = time.thread_time()
                    for m in msgs[start:start + TXN]:
                        publish(mapping, m)
                    spent += time.thread_time() - t
            best = min(best, spent)
            docs = events(0, calls)
            gc.collect()
            buf = bytearray()
            t = time.thread_time()
            for doc in docs:
                buf += dumps(doc)
            floor = min(floor, time.thread_time() - t)
    finally:
        client.close()
    return 1e6 * best / calls, 1e6 * floor / calls


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="50k events, 100 small txns, 1 rep")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=2_000, help="one-event transactions")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    total, small, repeat = args.events, args.small, args.repeat
    if args.quick:
        total, small, repeat = 50_000, 100, 1
    bulk = hasattr(Publisher, "publish_many")
    import deltalake

    print(f"oncelog vs deltalake {deltalake.__version__}: {total:,} events, transactions of "
          f"{TXN:,}, {small:,} one-event transactions, {repeat} repetition(s), local disk; "
          f"oncelog {'C speed-ups' if _native.speedups is not None else 'pure Python'}; "
          f"load {os.getloadavg()[0]:.2f}")

    results: dict[str, tuple[Series, Series]] = {}
    sizes: list[tuple[int, int]] = []

    def pair(label: str) -> tuple[Series, Series]:
        return results.setdefault(label, (Series(), Series()))

    def check(what: str, got: int, want: int) -> None:
        if got != want:
            raise AssertionError(f"{what}: {got:,} events read back, expected {want:,}")

    for rep in range(repeat):
        tmp = tempfile.mkdtemp(prefix="oncelog-vs-delta-")
        try:
            def at(name: str) -> str:
                return os.path.join(tmp, name)

            # Each step: oncelog then Delta, or Delta then oncelog, alternating.
            def both(label: str, onc: Callable[[], Cost], delta: Callable[[], Cost]) -> None:
                o, d = pair(label)
                steps = [(o, onc), (d, delta)]
                for series, step in steps if rep % 2 == 0 else reversed(steps):
                    series.runs.append(step())

            both("ingest, Publisher.publish_uncommitted",
                 lambda: oncelog_ingest_publish(at("onc-publish"), 0, total),
                 lambda: delta_ingest(at("delta-ingest"), 0, total))
            check("oncelog publish", committed_count(at("onc-publish")), total)
            check("delta ingest", delta_count(at("delta-ingest")), total)
            if bulk:
                pair("ingest, Publisher.publish_many")[0].runs.append(
                    oncelog_ingest_bulk(at("onc-bulk"), 0, total))
                check("oncelog bulk", committed_count(at("onc-bulk")), total)
            pair("ingest, frames + append_many")[0].runs.append(
                oncelog_ingest_frames(at("onc-frames"), 0, total))
            check("oncelog frames", committed_count(at("onc-frames")), total)

            def read_check(fn: Callable[[], tuple[Cost, int]], what: str) -> Cost:
                cost, n = fn()
                check(what, n, total)
                return cost

            def read(label: str, onc: Callable[[], tuple[Cost, int]],
                     delta: Callable[[], tuple[Cost, int]]) -> None:
                def run(fn: Callable[[], tuple[Cost, int]], what: str) -> Callable[[], Cost]:
                    def go() -> Cost:
                        cost, n = fn()
                        check(what, n, total)
                        return cost
                    return go
                both(label, run(onc, f"oncelog {label}"), run(delta, f"delta {label}"))

            read("cold read to dicts",
                 lambda: oncelog_read_dicts(at("onc-publish")),
                 lambda: delta_read_dicts(at("delta-ingest")))
            pair("cold read to dicts, fixed ring of 1,024")[0].runs.append(
                read_check(lambda: oncelog_read_dicts(at("onc-publish"), 1024), "fixed ring"))
            read("Arrow read",
                 lambda: oncelog_read_arrow(at("onc-publish")),
                 lambda: delta_read_arrow(at("delta-ingest")))

            # The same journals compacted: with segments, and (the frames journal, same
            # events) without, as the baseline of what segments add to compaction.
            seg = Cost(units=total)
            seg.add(lambda: oncelog_compact(at("onc-publish"), True))
            plain = Cost(units=total)
            plain.add(lambda: oncelog_compact(at("onc-frames"), False))
            pair("compaction with segments")[0].runs.append(seg)
            pair("compaction with segments")[1].runs.append(plain)
            sizes.append(segment_bytes(at("onc-publish")))
            read("compacted: Arrow read",
                 lambda: oncelog_read_arrow_as(at("onc-publish"), "arrow"),
                 lambda: delta_read_as(at("delta-ingest"), "arrow"))
            read("compacted: dicts through Arrow",
                 lambda: oncelog_read_arrow_as(at("onc-publish"), "pylist"),
                 lambda: delta_read_as(at("delta-ingest"), "pylist"))
            if importlib.util.find_spec("pandas") is not None:  # not a dependency
                read("compacted: pandas",
                     lambda: oncelog_read_arrow_as(at("onc-publish"), "pandas"),
                     lambda: delta_read_as(at("delta-ingest"), "pandas"))

            both("4 writer processes",
                 lambda: writers("oncelog", at("onc-writers"), total),
                 lambda: writers("delta", at("delta-writers"), total))
            per4 = total // 4 * 4
            check("oncelog 4 writers", committed_count(at("onc-writers")), per4)
            check("delta 4 writers", delta_count(at("delta-writers")), per4)
            if bulk:
                pair("4 writer processes, publish_many")[0].runs.append(
                    writers("oncelog-bulk", at("onc-bulk-writers"), total))
                check("oncelog bulk 4 writers", committed_count(at("onc-bulk-writers")), per4)

            both("one-event transactions (txn/s)",
                 lambda: oncelog_small(at("onc-small"), small),
                 lambda: delta_small(at("delta-small"), small))
            check("oncelog small", committed_count(at("onc-small")), small)
            check("delta small", delta_count(at("delta-small")), small)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    delta_ref = {
        "ingest, Publisher.publish_many": "ingest, Publisher.publish_uncommitted",
        "ingest, frames + append_many": "ingest, Publisher.publish_uncommitted",
        "4 writer processes, publish_many": "4 writer processes",
        "cold read to dicts, fixed ring of 1,024": "cold read to dicts",
    }
    print(f"\n{'workload':38} {'oncelog/s':>11} {'delta/s':>11} {'ratio':>7}"
          f"   {'oncelog CPU us':>14} {'delta CPU us':>12} {'ratio':>7}")
    for label, (o, d) in results.items():
        if not d.runs:
            d = results[delta_ref[label]][1]
        o_rate, o_cpu = o.median()
        d_rate, d_cpu = d.median()
        print(f"{label:38} {o_rate:11,.0f} {d_rate:11,.0f} {o_rate / d_rate:6.2f}x"
              f"   {o_cpu:14.2f} {d_cpu:12.2f} {d_cpu / o_cpu:6.2f}x")
    if sizes:
        seg_bytes, json_bytes = sizes[-1]
        print(f"segments: {seg_bytes:,} bytes for {json_bytes:,} journal bytes "
              f"({seg_bytes / json_bytes:.2f}x); 'compaction with segments' compares "
              "compacting with segments (oncelog column) and without (delta column)")
    tmp = tempfile.mkdtemp(prefix="oncelog-pubcpu-")
    try:
        per_call, floor = publish_cpu_per_call(tmp, min(total, 100_000))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'publish_uncommitted, main-thread CPU per call':46} {per_call:6.2f} us "
          f"(target {PUBLISH_CPU_TARGET_US:.2f} us), floor (orjson.dumps + bytearray +=) "
          f"{floor:.2f} us: {per_call / floor:.2f}x the floor")
    print(f"(rates: medians of wall time; CPU: median microseconds per event or transaction, "
          f"ratio = Delta CPU / oncelog CPU; above 1 = oncelog ahead; load "
          f"{os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
