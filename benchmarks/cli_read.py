"""Benchmark: `oncelog read -c` (the command, printing every message) against the library's
`read_committed` of the same journal, in the same run.

Writes N committed JSON messages (Publisher.append_messages, transactions of 10,000) to a
local-disk journal, then times, best of `--repeat`:

- baseline: `read_committed(client, journal)` in this process, counting messages;
- `oncelog read NAME -c` in a subprocess, output to /dev/null (start-up included);
- `oncelog read NAME -c --format json` likewise.

Run: .venv/bin/python benchmarks/cli_read.py [--messages N] [--repeat R] [--quick]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from oncelog import JSONMessage, Publisher, open_journals, read_committed
from oncelog.journal import JournalSpec

JOURNAL = "bench/cli"
NDJSON = "application/x-ndjson"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="30,000 messages, one round")
    args = parser.parse_args(argv)
    n = 30_000 if args.quick else args.messages
    repeat = 1 if args.quick else args.repeat
    tmp = Path(tempfile.mkdtemp(prefix="oncelog-bench-"))
    try:
        store = str(tmp / "store")
        client = open_journals(store, create=True)
        client.create(JournalSpec(JOURNAL, {"content-type": NDJSON}))
        pub = Publisher(client)
        for k in range(0, n, 10_000):
            stop = min(n, k + 10_000)
            batch = [JSONMessage({"i": i, "text": "hello world"}) for i in range(k, stop)]
            pub.append_messages(lambda _m: (JOURNAL, NDJSON), batch)
        cli = [sys.executable, "-m", "oncelog.cli", "-s", store, "read", JOURNAL, "-c"]
        runs = {
            "read_committed (library, baseline)": None,
            "oncelog read -c": cli,
            "oncelog read -c --format json": [*cli, "--format", "json"],
        }
        best = {label: float("inf") for label in runs}
        for _ in range(repeat):
            for label, command in runs.items():
                start = time.perf_counter()
                if command is None:
                    count = sum(1 for _ in read_committed(open_journals(store), JOURNAL))
                    assert count == n
                else:
                    subprocess.run(command, stdout=subprocess.DEVNULL, check=True, timeout=600)
                best[label] = min(best[label], time.perf_counter() - start)
        base = n / best["read_committed (library, baseline)"]
        print(f"{n:,} committed messages, local disk")
        for label, seconds in best.items():
            rate = n / seconds
            print(f"  {label:36s} {rate:12,.0f} msg/s  {rate / base:5.2f}x")
        client.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
