"""Spark read throughput of the oncelog source against Spark's own JSON reader.

Writes JSON-lines messages (transactions of 100 messages from two producers per
journal, each closed by an ACK) across 8 journals on a local-disk store, then scans
them in one local[2] Spark session, each scan into Spark's `noop` sink:

1. baseline: `spark.read.schema(DDL).json(<the journals' fragment files>)`;
2. oncelog, read-committed with the same `schema`, one task per journal (the default
   fast path: Arrow JSON decoding, commits decided a batch at a time);
3. oncelog, read-committed message text parsed in the JVM (`from_json` with the schema);
4. the same as 2 through the per-message row path (`fast_path=false`), for comparison;
5. oncelog, the same journals cut into 4 MiB splits (the two-phase plan);
6. oncelog, the same journals on the S3 test server (moto, on 127.0.0.1);
7. oncelog, a copy of the journals compacted (`compact` writes their columnar segments:
   a task per segment, Parquet read by pyarrow, and the tail), locally and on the S3
   test server;
8. `spark.read.parquet` of the same committed rows written by pyarrow (what a table
   format's reader does), the reference for 7;
9. `oncelog.spark.committed.committed_dataframe` over the compacted copy: the segments read
   by Spark's own Parquet reader (page checksums verified), the tail by the source; its
   ratio to 8 is printed last.

Each figure is printed beside the baseline measured in the same run, as a ratio: of
wall time, and of the CPU time of this process's children (Spark's JVM and its Python
workers, read from /proc on Linux), which a busy machine disturbs less. Every scan runs
`--repeat` times (default 3), the scans interleaved in each repetition; figures are
medians.

    .venv/bin/python benchmarks/spark_read.py           # 2,000,000 messages
    .venv/bin/python benchmarks/spark_read.py --quick   # 200,000 messages
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from typing import Any

from oncelog.journal import FragmentSpec, JournalClient, JournalSpec, open_journals

JOURNALS = [f"bench/part-{i:02d}" for i in range(8)]
DDL = "user string, page string, ms bigint, score double, ref string"
PAGES = ["/", "/docs", "/pricing", "/blog", "/about", "/login", "/search"]
TXN = 100
PARQUET = "spark.read.parquet, same rows (pyarrow)"
JVM_SEGMENTS = "committed_dataframe, compacted (JVM Parquet)"


def uuid_text(producer: str, clock: int, flags: int) -> str:
    """The canonical v1 UUID string of (producer hex, clock, flags), as build_uuid makes it."""
    ts = clock >> 4
    seq = ((clock & 0xF) << 10) | flags | 0x8000
    return (
        f"{ts & 0xFFFFFFFF:08x}-{(ts >> 32) & 0xFFFF:04x}-{((ts >> 48) & 0x0FFF) | 0x1000:04x}"
        f"-{seq:04x}-{producer}"
    )


def write_journals(client: JournalClient, messages: int) -> int:
    """Transactions of TXN messages from two producers per journal; returns data messages."""
    per_journal = messages // len(JOURNALS)
    clock0 = 0x1F0000000000000 << 4
    for j, name in enumerate(JOURNALS):
        client.create(JournalSpec(name, fragment=FragmentSpec(length=16 << 20)))
        producers = [f"{0x010000000000 + 2 * j + k:012x}" for k in range(2)]
        block: list[str] = []
        size = 0
        clock = clock0
        for start in range(0, per_journal, TXN):
            producer = producers[(start // TXN) % 2]
            for i in range(start, min(start + TXN, per_journal)):
                clock += 1
                line = (
                    f'{{"uuid":"{uuid_text(producer, clock, 1)}","user":"u{i % 1000}",'
                    f'"page":"{PAGES[i % 7]}","ms":{i % 5000},"score":{(i % 100) / 4},'
                    f'"ref":"campaign-{i % 13}"}}\n'
                )
                block.append(line)
                size += len(line)
            clock += 1
            block.append(f'{{"uuid":"{uuid_text(producer, clock, 2)}"}}\n')
            if size > 4 << 20:
                client.append(name, "".join(block).encode())
                block, size = [], 0
        if block:
            client.append(name, "".join(block).encode())
    return per_journal * len(JOURNALS)


def spark_session() -> Any:
    from oncelog.spark import local_session

    return local_session("oncelog-spark-read-benchmark")[0]


def children_cpu() -> float | None:
    """CPU seconds of this process's descendants (live ones included); None without /proc."""
    if not os.path.isdir("/proc/self/task"):
        return None
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        cpu[int(entry)] = sum(int(x) for x in fields[11:15]) / tick
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    total, stack = 0.0, list(children.get(os.getpid(), []))
    while stack:
        pid = stack.pop()
        total += cpu.get(pid, 0.0)
        stack.extend(children.get(pid, []))
    return total


def timed_scan(df: Any) -> tuple[float, float | None]:
    """Wall seconds of a scan into the noop sink, and the CPU seconds Spark spent."""
    cpu = children_cpu()
    start = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    wall = time.perf_counter() - start
    after = children_cpu()
    return wall, None if cpu is None or after is None else after - cpu


def oncelog_df(spark: Any, store: str, **options: str) -> Any:
    return (
        spark.read.format("oncelog")
        .option("store", store)
        .option("journals", ",".join(JOURNALS))
        .option("schema", DDL)
        .options(**options)
        .load()
    )


def oncelog_text_df(spark: Any, store: str) -> Any:
    """Read-committed message text, parsed in the JVM by `from_json` with the same schema:
    the alternative to the source's own parse by Arrow in the Python worker."""
    from pyspark.sql.functions import col, from_json

    raw = (
        spark.read.format("oncelog")
        .option("store", store)
        .option("journals", ",".join(JOURNALS))
        .load()
    )
    return raw.withColumn("message", from_json(col("message"), DDL))


def start_s3() -> tuple[Any, str, dict[str, Any]]:
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    ).create_bucket(Bucket="bench")
    options = {"key": "testing", "secret": "testing",
               "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
    return server, "s3://bench/journals", options


def copy_journals(source: JournalClient, target: JournalClient) -> None:
    """The same journals, fragment for fragment, on another store."""
    for name in JOURNALS:
        target.create(source.get(name))
        for frag in source.fragments(name):
            reader = source.read(name, frag.begin)
            target.append(name, reader.read(frag.end - frag.begin))
            reader.close()


def write_parquet(client: JournalClient, directory: str) -> list[str]:
    """The journals' committed rows (documents as a struct, as the source gives them) as
    Parquet files written by pyarrow; returns their paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from oncelog.arrow import read_committed_arrow

    os.makedirs(directory, exist_ok=True)
    paths = []
    for i, name in enumerate(JOURNALS):
        table = read_committed_arrow(client, name, parse=True)
        fields = [c for c in table.column_names if c in ("user", "page", "ms", "score", "ref")]
        doc = pa.StructArray.from_arrays(
            [table.column(f).combine_chunks() for f in fields], names=fields
        )
        table = table.drop_columns(fields).append_column("message", doc)
        path = os.path.join(directory, f"part-{i:02d}.parquet")
        pq.write_table(table, path, compression="zstd")
        paths.append(path)
    return paths


def report(
    name: str, rows: int, timing: tuple[float, float | None], baseline: tuple[float, float] | None
) -> tuple[float, float]:
    """Print a figure (beside the baseline's, as ratios); returns (rows/s, rows/CPU s)."""
    seconds, cpu = timing
    rate = rows / seconds
    cpu_rate = rows / cpu if cpu else 0.0
    ratio = cpu_ratio = ""
    if baseline is not None:
        ratio = f"{rate / baseline[0]:6.2f}x Spark JSON"
        if cpu_rate and baseline[1]:
            cpu_ratio = f"  CPU {cpu_rate / baseline[1]:5.2f}x"
    cpu_text = f" (CPU {cpu:6.2f} s)" if cpu else ""
    line = (f"{name:44s} {rows:>10,d} rows {seconds:7.2f} s{cpu_text} {rate:>12,.0f} rows/s  "
            f"{ratio}{cpu_ratio}")
    print(line, flush=True)
    return rate, cpu_rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="200,000 messages instead of 2,000,000"
    )
    parser.add_argument("--messages", type=int, help="messages in all (default 2,000,000)")
    parser.add_argument("--no-s3", action="store_true", help="skip the S3 test server figure")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (medians are shown)")
    args = parser.parse_args(argv)
    messages = args.messages or (200_000 if args.quick else 2_000_000)

    root = tempfile.mkdtemp(prefix="oncelog-spark-bench-")
    server = None
    try:
        client = open_journals(os.path.join(root, "store"))
        t = time.perf_counter()
        rows = write_journals(client, messages)
        size = sum(f.end - f.begin for n in JOURNALS for f in client.fragments(n))
        print(f"load average {os.getloadavg()[0]:.2f} (1 min)")
        print(f"wrote {rows:,d} messages ({size / 2**20:.0f} MiB) in {len(JOURNALS)} journals "
              f"in {time.perf_counter() - t:.1f} s")
        files = [
            os.path.join(client.root, f.content_path) for n in JOURNALS for f in client.fragments(n)
        ]
        spark = spark_session()
        store = client.root
        # Warm up on a small journal: the first Python data source query and the first
        # JSON scan cost seconds.
        warm = open_journals(os.path.join(root, "warm"))
        write_journals(warm, 8000)
        warm_files = [os.path.join(warm.root, f.content_path) for f in warm.fragments(JOURNALS[0])]
        timed_scan(oncelog_df(spark, warm.root))
        timed_scan(spark.read.schema(DDL).json(warm_files))

        scans: dict[str, Any] = {
            "spark.read.json (baseline)": spark.read.schema(DDL).json(files),
            "oncelog committed, a task per journal": oncelog_df(spark, store),
            "oncelog committed text + from_json (JVM)": oncelog_text_df(spark, store),
            "oncelog committed, row path (fast_path=false)": oncelog_df(
                spark, store, fast_path="false"
            ),
            "oncelog committed, 4 MiB splits (two-phase)": oncelog_df(
                spark, store, split_bytes=str(4 << 20)
            ),
        }
        if not args.no_s3:
            import json

            server, s3_url, s3_options = start_s3()
            s3_client = open_journals(s3_url, **s3_options)
            copy_journals(client, s3_client)
            scans["oncelog committed, S3 test server (moto)"] = oncelog_df(
                spark, s3_url, storage_options=json.dumps(s3_options)
            )
        # The same journals compacted (with segments), and their rows as plain Parquet.
        compacted = open_journals(os.path.join(root, "compacted"))
        copy_journals(client, compacted)
        t = time.perf_counter()
        for name in JOURNALS:
            compacted.compact(name, retire_grace=0)
        print(f"compacted a copy (writing segments) in {time.perf_counter() - t:.1f} s")
        scans["oncelog committed, compacted (segments)"] = oncelog_df(spark, compacted.root)
        parquet_files = write_parquet(compacted, os.path.join(root, "parquet"))
        scans[PARQUET] = spark.read.parquet(*parquet_files)
        from oncelog.spark.committed import committed_dataframe

        scans[JVM_SEGMENTS] = committed_dataframe(spark, compacted.root, JOURNALS, schema=DDL)
        if not args.no_s3:
            s3_compacted = open_journals(s3_url.replace("journals", "compacted"), **s3_options)
            copy_journals(client, s3_compacted)
            for name in JOURNALS:
                s3_compacted.compact(name, retire_grace=0)
            scans["oncelog committed, compacted, S3 test server"] = oncelog_df(
                spark, s3_url.replace("journals", "compacted"),
                storage_options=json.dumps(s3_options),
            )
        timings: dict[str, list[tuple[float, float | None]]] = {name: [] for name in scans}
        for _ in range(max(1, args.repeat)):
            for name, df in scans.items():
                timings[name].append(timed_scan(df))
        baseline = None
        figures: dict[str, tuple[float, float]] = {}
        for name, runs in timings.items():
            wall = statistics.median(w for w, _ in runs)
            cpus = [c for _, c in runs if c is not None]
            figure = report(name, rows, (wall, statistics.median(cpus) if cpus else None),
                            baseline)
            figures[name] = figure
            baseline = baseline or figure
        mine, parquet = figures[JVM_SEGMENTS], figures[PARQUET]
        cpu_text = f", CPU {mine[1] / parquet[1]:.2f}x" if mine[1] and parquet[1] else ""
        print(f"{JVM_SEGMENTS} vs {PARQUET}: {mine[0] / parquet[0]:.2f}x{cpu_text}")
        print(f"load average {os.getloadavg()[0]:.2f} (1 min)")
        spark.stop()
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
