"""Protobuf journals as tables: columnar reads through segments, beside the same reads from
the journal's frames (what every read cost before segments), and compaction's cost.

A local-disk journal of N protobuf events (`oncelog.test.Event`: uuid, seq, user, ok,
tags, blob) recording its class (label `oncelog.dev/protobuf-class`), published in bulk by
4 producers, then compacted (which writes its segments). Printed, each beside its baseline
measured in the same run, as a ratio (above 1: segments faster):

- `read_committed_arrow(parse=True)` (the messages' fields as columns) through segments,
  against the same call reading frames only (decode, sequence, `FromString` and convert
  each message);
- `read_committed_arrow()` (payloads) through segments, against frames only;
- `compact` with segments, against `compact` of a copy with segments off (label
  `oncelog.dev/segments=off`); and the segment bytes against the journal bytes they hold.

Wall time, best of `--rounds`.

    .venv/bin/python benchmarks/tables_protobuf.py [--quick] [-n N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from proto_support import EVENT_CLASS, Event  # noqa: E402

from oncelog import Publisher  # noqa: E402
from oncelog.arrow import read_committed_arrow  # noqa: E402
from oncelog.framing import CONTENT_TYPE_PROTOBUF_FIXED  # noqa: E402
from oncelog.framing.protoclass import PROTOBUF_CLASS_LABEL  # noqa: E402
from oncelog.journal import JournalClient, JournalSpec, open_journals  # noqa: E402
from oncelog.message import ProtoMessage  # noqa: E402
from oncelog.tables import SEGMENTS_LABEL, merge_on_read  # noqa: E402
from oncelog.tables.segments import segment_records  # noqa: E402

PROTO = CONTENT_TYPE_PROTOBUF_FIXED


def best(func: Callable[[], Any], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        func()
        times.append(time.perf_counter() - start)
    return min(times)


def frames_only(func: Callable[[], Any]) -> Callable[[], Any]:
    """`func` with segments out of the way: reads as before they existed."""

    def run() -> Any:
        original = merge_on_read.committed_table
        merge_on_read.committed_table = lambda *a, **k: None  # type: ignore[assignment]
        try:
            return func()
        finally:
            merge_on_read.committed_table = original

    return run


def fill(client: JournalClient, name: str, n: int, segments: bool) -> None:
    labels: dict[str, Any] = {"content-type": PROTO, PROTOBUF_CLASS_LABEL: EVENT_CLASS}
    if not segments:
        labels[SEGMENTS_LABEL] = "off"
    client.create(JournalSpec(name, labels=labels))
    to = lambda _m: (name, PROTO)  # noqa: E731
    pubs = [Publisher(client) for _ in range(4)]
    batch = 5_000
    for start in range(0, n, batch):
        pub = pubs[(start // batch) % len(pubs)]
        pub.publish_many(to, [
            ProtoMessage(Event(seq=i, user=f"user-{i % 5000:05d}", ok=i % 2 == 0,
                               tags=["web", "eu"], blob=i.to_bytes(4, "big")))
            for i in range(start, min(n, start + batch))
        ], committed=True)
        pub.flush()


def row(label: str, n: int, seconds: float, base: float) -> None:
    print(f"{label:46} {n / seconds:12,.0f} rows/s  baseline {n / base:12,.0f}/s"
          f"  {base / seconds:6.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=300_000)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    n = 30_000 if args.quick else args.n
    root = tempfile.mkdtemp(prefix="oncelog-bench-")
    try:
        client = open_journals(root)
        fill(client, "pb/seg", n, True)
        fill(client, "pb/plain", n, False)
        compact_seg = best(lambda: client.compact("pb/seg", retire_grace=0), 1)
        compact_plain = best(lambda: client.compact("pb/plain", retire_grace=0), 1)
        records, _ = segment_records(client, "pb/seg")
        assert records and sum(r.rows for r in records) == n, "no segments were written"
        parsed = read_committed_arrow(client, "pb/seg", parse=True)
        assert parsed.num_rows == n
        assert parsed.equals(frames_only(
            lambda: read_committed_arrow(client, "pb/seg", parse=True))())

        print(f"{n:,} protobuf events, {client.head('pb/seg') / 1e6:.1f} MB, local disk")
        seg = best(lambda: read_committed_arrow(client, "pb/seg", parse=True), args.rounds)
        raw = best(frames_only(lambda: read_committed_arrow(client, "pb/seg", parse=True)),
                   args.rounds)
        row("parse=True (fields as columns): segments", n, seg, raw)
        seg = best(lambda: read_committed_arrow(client, "pb/seg"), args.rounds)
        raw = best(frames_only(lambda: read_committed_arrow(client, "pb/seg")), args.rounds)
        row("payloads: segments", n, seg, raw)
        print(f"{'compact with segments':46} {compact_seg:10.2f} s    without "
              f"{compact_plain:8.2f} s        {compact_seg / compact_plain:6.2f}x the time")
        seg_bytes = sum(r.size for r in records)
        print(f"{'segment bytes':46} {seg_bytes / 1e6:10.1f} MB   journal "
              f"{client.head('pb/seg') / 1e6:8.1f} MB       "
              f"{seg_bytes / client.head('pb/seg'):6.2f}x the bytes")
        client.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
