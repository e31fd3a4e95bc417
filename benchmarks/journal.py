"""Journal append and read throughput against raw file I/O on the same filesystem.

Appends N MB in 1 KiB appends (an AsyncAppend per record, group commit, one flush at the
end, fragments of up to 64 MiB: `--length`), appends the same records again in calls of
1,000 records (`start_append_many`, one flush at the end), then reads the first journal back
with a fresh client in 1 MiB reads, on local disk and on an S3 test server (moto, started in
a child process). Baselines,
measured in the same run: writing one plain file of the same bytes (local: write + fsync;
S3: one PUT / multipart upload) and reading it back (local: also reading it back while
computing the CRC-32C of every 1 MiB read, the least any reader that checks every byte
can do). Each oncelog figure is printed beside its baseline as a ratio.

    .venv/bin/python benchmarks/journal.py            # 200 MB, local disk and S3
    .venv/bin/python benchmarks/journal.py --quick    # 20 MB smoke run
    .venv/bin/python benchmarks/journal.py --backend local --mb 500
    .venv/bin/python benchmarks/journal.py --backend local --repeat 5   # best of 5
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator

import crc32c

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from oncelog.journal import FragmentSpec, JournalClient, JournalSpec, open_journals  # noqa: E402

RECORD = 1024
READ_SIZE = 1 << 20
MANY = 1000  # records per start_append_many call


def make_records(total_mb: int) -> tuple[list[bytes], bytes]:
    """1 KiB records ending in a newline, and their concatenation."""
    block = os.urandom(RECORD * 1024)
    records = []
    count = total_mb * 1024
    for i in range(count):
        start = (i * 7919 % 1024) * RECORD
        rec = block[start : start + RECORD - 1] + b"\n"
        records.append(rec)
    return records, b"".join(records)


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def append_all(
    client: JournalClient, journal: str, records: list[bytes], flush: bool = True
) -> None:
    start_append = client.start_append
    for rec in records:
        aa = start_append(journal)
        aa.write(rec)
        aa.release()
    if flush:
        client.flush()


def append_many_all(
    client: JournalClient, journal: str, calls: list[list[bytes]], flush: bool = True
) -> None:
    start_append_many = client.start_append_many
    for records in calls:
        start_append_many(journal, records)
    if flush:
        client.flush()


def read_all(client: JournalClient, journal: str, expected_len: int) -> None:
    got = 0
    with client.read(journal) as reader:
        while chunk := reader.read(READ_SIZE):
            got += len(chunk)
    if got != expected_len:
        raise SystemExit(f"read {got} bytes, expected {expected_len}")


@contextmanager
def moto_server() -> Iterator[dict[str, Any]]:
    """moto's S3 server in a child process; yields storage options for open_journals."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("moto server did not start") from None
                time.sleep(0.1)
        yield {
            "key": "bench",
            "secret": "bench",
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        }
    finally:
        proc.terminate()
        proc.wait(30)


@dataclass
class Row:
    """One printed figure: oncelog's rate beside a baseline of the same run."""

    backend: str
    operation: str
    value: float
    unit: str = "MB/s"
    baseline_name: str = ""
    baseline: float | None = None
    target: float | None = None
    note: str = ""


def bench_local(records: list[bytes], data: bytes, sync_appends: int) -> list[Row]:
    root = tempfile.mkdtemp(prefix="oncelog-bench-")
    try:
        raw_path = os.path.join(root, "raw.bin")

        def raw_write() -> None:
            with open(raw_path, "wb") as f:
                view = memoryview(data)
                for i in range(0, len(view), READ_SIZE):
                    f.write(view[i : i + READ_SIZE])
                f.flush()
                os.fsync(f.fileno())

        def raw_write_named() -> None:
            # The least a writer of Gazette-named fragments does: the same write and fsync,
            # plus the SHA1 of the bytes (the fragment's content name).
            digest = hashlib.sha1()
            with open(raw_path, "wb") as f:
                view = memoryview(data)
                for i in range(0, len(view), READ_SIZE):
                    digest.update(view[i : i + READ_SIZE])
                    f.write(view[i : i + READ_SIZE])
                f.flush()
                os.fsync(f.fileno())
            digest.hexdigest()

        def raw_read() -> None:
            with open(raw_path, "rb") as f:
                while f.read(READ_SIZE):
                    pass

        def raw_read_crc() -> None:
            with open(raw_path, "rb") as f:
                while chunk := f.read(READ_SIZE):
                    crc32c.crc32c(chunk)

        suite = Suite("local", f"file://{root}/journals", {}, "raw write + fsync")
        return suite.run(
            records, data, raw_write, raw_read, sync_appends, raw_read_crc, raw_write_named
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def bench_s3(records: list[bytes], data: bytes, sync_appends: int) -> list[Row]:
    import boto3
    import fsspec

    with moto_server() as options:
        endpoint = options["client_kwargs"]["endpoint_url"]
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        ).create_bucket(Bucket=bucket)
        fs = fsspec.filesystem("s3", skip_instance_cache=True, use_listings_cache=False, **options)
        raw_path = f"{bucket}/raw.bin"

        def raw_write() -> None:
            fs.pipe_file(raw_path, data)

        def raw_read() -> None:
            fs.cat_file(raw_path)  # s3fs: concurrent ranged GETs of one object

        suite = Suite("s3 (moto)", f"s3://{bucket}/journals", options, "raw write (PUT)")
        return suite.run(records, data, raw_write, raw_read, sync_appends)


@dataclass
class Suite:
    """The same measurements on one store."""

    label: str
    url: str
    options: dict[str, Any]
    write_baseline: str
    spec: ClassVar[FragmentSpec] = FragmentSpec()

    def run(
        self,
        records: list[bytes],
        data: bytes,
        raw_write: Callable[[], None],
        raw_read: Callable[[], None],
        sync_appends: int,
        raw_read_crc: Callable[[], None] | None = None,
        raw_write_named: Callable[[], None] | None = None,
    ) -> list[Row]:
        mb = len(data) / 1e6
        t_raw_write_named = timed(raw_write_named) if raw_write_named is not None else None
        t_raw_write = timed(raw_write)
        t_raw_read = timed(raw_read)
        t_raw_read_crc = timed(raw_read_crc) if raw_read_crc is not None else None

        writer = open_journals(self.url, **self.options)
        writer.create(JournalSpec("bench/part-000", fragment=self.spec))
        start = time.perf_counter()
        append_all(writer, "bench/part-000", records, flush=False)
        t_loop = time.perf_counter() - start
        writer.flush()
        t_append = time.perf_counter() - start
        fragments = writer.fragments("bench/part-000")
        writer.close()

        calls = [records[i : i + MANY] for i in range(0, len(records), MANY)]
        batch_writer = open_journals(self.url, **self.options)
        batch_writer.create(JournalSpec("bench/many-000", fragment=self.spec))
        start = time.perf_counter()
        append_many_all(batch_writer, "bench/many-000", calls, flush=False)
        t_many_loop = time.perf_counter() - start
        batch_writer.flush()
        t_many = time.perf_counter() - start
        many_fragments = batch_writer.fragments("bench/many-000")
        if batch_writer.head("bench/many-000") != len(data):
            raise SystemExit("append_many: the journal's head is not the bytes appended")
        batch_writer.close()

        reader = open_journals(self.url, **self.options)  # cold: reads claims from the store
        t_read = timed(lambda: read_all(reader, "bench/part-000", len(data)))
        reader.close()

        rows = [
            Row(
                self.label,
                f"append {len(records)} x 1 KiB, async + flush",
                mb / t_append,
                baseline_name=self.write_baseline,
                baseline=mb / t_raw_write,
                target=0.5,
                note=f"{len(fragments)} fragments of up to {self.spec.length >> 20} MiB; "
                f"appending took {t_loop:.2f} s, "
                f"the last fragment {t_append - t_loop:.2f} s more",
            ),
            Row(
                self.label,
                f"append_many {len(calls)} calls x {MANY} x 1 KiB, async + flush",
                mb / t_many,
                baseline_name=self.write_baseline,
                baseline=mb / t_raw_write,
                target=0.7,
                note=f"start_append_many per {MANY} records, one flush; "
                f"{len(many_fragments)} fragments; appending took {t_many_loop:.2f} s, "
                f"the last fragment {t_many - t_many_loop:.2f} s more",
            ),
        ]
        if t_raw_write_named is not None:
            rows.append(
                Row(
                    self.label,
                    "append_many (the same)",
                    mb / t_many,
                    baseline_name="raw write + fsync + SHA1",
                    baseline=mb / t_raw_write_named,
                    note="the floor of any writer of Gazette-named fragments: the raw write, "
                    "plus the SHA1 that names the bytes",
                )
            )
        rows += [
            Row(
                self.label,
                "read back, 1 MiB reads, CRC-32C-verified",
                mb / t_read,
                baseline_name="raw read",
                baseline=mb / t_raw_read,
                target=0.7,
            ),
        ]
        if t_raw_read_crc is not None:
            rows.append(
                Row(
                    self.label,
                    "read back (the same read)",
                    mb / t_read,
                    baseline_name="raw read + CRC-32C",
                    baseline=mb / t_raw_read_crc,
                    note="the floor of any reader checking every byte: the raw read, plus "
                    "the CRC-32C of each 1 MiB it read",
                )
            )
        if sync_appends:
            client = open_journals(self.url, **self.options)
            client.create(JournalSpec("bench/sync", fragment=FragmentSpec()))
            few = records[:sync_appends]
            t_sync = timed(lambda: [client.append("bench/sync", r) for r in few])
            client.close()
            rows.append(
                Row(
                    self.label,
                    f"append() x {sync_appends}, each durable",
                    sync_appends / t_sync,
                    unit="appends/s",
                )
            )
        return rows


def sha1_rates(data: bytes, threads: int) -> tuple[float, float]:
    """SHA1 MB/s of one core, and of `threads` threads hashing separate parts at once (best
    of 3 each): with every fragment verified before its bytes are returned, the second bounds
    any reader on this machine, the first a single-fragment one."""
    view = memoryview(data)

    def one() -> None:
        hashlib.sha1(view).digest()

    def many() -> None:
        step = -(-len(view) // threads)
        workers = [
            threading.Thread(target=lambda p=view[i : i + step]: hashlib.sha1(p).digest())
            for i in range(0, len(view), step)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    mb = len(data) / 1e6
    return mb / min(timed(one) for _ in range(3)), mb / min(timed(many) for _ in range(3))


def best_of(repeat: int, run: Callable[[], list[Row]]) -> list[Row]:
    """Run a suite `repeat` times; keep each figure's best and each baseline's best (on a
    shared machine the best run is the one least disturbed)."""
    best = run()
    for _ in range(repeat - 1):
        for kept, row in zip(best, run()):
            if row.value > kept.value:
                kept.value, kept.note = row.value, row.note
            if row.baseline is not None and kept.baseline is not None:
                kept.baseline = max(kept.baseline, row.baseline)
    return best


def print_rows(rows: list[Row]) -> None:
    head = f"{'backend':<10} {'operation':<46} {'oncelog':>16} {'baseline':<18} {'raw':>10}"
    print(head + f" {'ratio':>7} {'target':>7}")
    for r in rows:
        line = f"{r.backend:<10} {r.operation:<46} {r.value:>6.0f} {r.unit:<9}"
        if r.baseline is not None:
            ratio = r.value / r.baseline
            line += f" {r.baseline_name:<18} {r.baseline:>5.0f} MB/s {ratio:>6.2f}x"
            if r.target is not None:
                verdict = "ok" if ratio >= r.target else "below"
                line += f" {r.target:>5.1f}x {verdict}"
        print(line)
        if r.note:
            print(f"{'':<11}  ({r.note})")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="20 MB instead of 200 MB")
    parser.add_argument("--mb", type=int, default=None, help="megabytes to append (default 200)")
    parser.add_argument("--backend", choices=["local", "s3", "all"], default="all")
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per backend, best figures kept (default 1)"
    )
    parser.add_argument(
        "--length",
        type=int,
        default=64,
        help="FragmentSpec.length in MiB (default 64: a bulk load; the spec default is 16)",
    )
    args = parser.parse_args()
    Suite.spec = FragmentSpec(length=args.length << 20)
    total_mb = args.mb or (20 if args.quick else 200)
    sync_appends = 200 if args.quick else 1000

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"oncelog journal benchmark: {total_mb} MB in 1 KiB appends "
        f"(python {sys.version.split()[0]}, {os.cpu_count()} cpus, load {load:.1f})"
    )
    records, data = make_records(total_mb)
    rows: list[Row] = []
    if args.backend in ("local", "all"):
        rows += best_of(args.repeat, lambda: bench_local(records, data, sync_appends))
    if args.backend in ("s3", "all"):
        rows += best_of(args.repeat, lambda: bench_s3(records, data, sync_appends))
    print()
    print_rows(rows)
    cores = os.cpu_count() or 1
    one, many = sha1_rates(data, cores)
    print(
        f"\nfor scale: SHA1 of the same bytes runs at {one:.0f} MB/s on one core and "
        f"{many:.0f} MB/s on {cores} threads now; every byte appended is hashed once (the "
        "SHA1 names its fragment), beside the write."
    )
    crc = len(data) / 1e6 / min(timed(lambda: crc32c.crc32c(data)) for _ in range(3))
    print(
        f"CRC-32C (what reads check when claims record it) runs at {crc:.0f} MB/s on one core; "
        "SHA1 is computed once per append (the fragment's name) and by `verify`."
    )
    local = [r for r in rows if r.backend == "local" and r.operation.startswith("read back")]
    if len(local) == 2 and local[0].baseline and local[1].baseline and local[0].target:
        raw, floor, target = local[0].baseline, local[1].baseline, local[0].target
        print(
            f"local read ceiling: the raw read plus the CRC-32C of each 1 MiB it read ran at "
            f"{floor:.0f} MB/s = {floor / raw:.2f}x the raw read ({raw:.0f} MB/s, page cache "
            f"to a fresh 1 MiB buffer); a checking reader also copies the checked bytes to its "
            f"caller. The {target}x target needs {target * raw:.0f} MB/s: more than one core "
            "reads and checks, so only checking spread over cores could reach it."
        )


if __name__ == "__main__":
    main()
