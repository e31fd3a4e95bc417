"""Framing decode throughput beside raw parsing baselines measured in the same run.

    .venv/bin/python benchmarks/framing.py            # 1,000,000 messages per framing
    .venv/bin/python benchmarks/framing.py --quick    # 50,000 messages

Each figure is the least CPU time of a few rounds. A framing decodes one buffer into
Envelopes (offsets, message objects; UUIDs left to parse lazily); its baseline
only parses the same frames with the same library and keeps the results:
- JSON lines: `[orjson.loads(line) for line in buf.split(b"\\n")]`
- fixed protobuf: `Event.FromString(payload)` for each payload, already cut out
- CSV: `list(csv.reader(io.StringIO(text)))`
Both run with the garbage collector on, as user code would. A decode pauses the
collector while it builds a batch, which the baselines cannot, so two more
ratios are shown: against the baseline run with the collector off (the raw
parsing floor), and with a full collection after each side (counting the
collector work each leaves for later: Envelopes are tracked objects).
"""

from __future__ import annotations

import argparse
import csv
import gc
import io
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from framing_support import event_class  # noqa: E402

from oncelog.framing import CSVFraming, FixedFraming, JSONFraming  # noqa: E402
from oncelog.message import Flags, ProtoMessage, build_uuid, new_producer_id  # noqa: E402

JOURNAL = "bench/framing/part-000"


def best_of(rounds: int, func: Callable[[], Any]) -> tuple[float, float]:
    """Least CPU time of `func` over `rounds` runs, without and with a full collection
    right after it (which counts the collector work a run leaves behind).

    CPU time rather than wall time, so that other work on the machine skews
    neither figure of a ratio. Each result is dropped before the next run.
    """
    best = best_total = float("inf")
    for _ in range(rounds):
        gc.collect()
        start = time.process_time()
        result = func()
        elapsed = time.process_time() - start
        gc.collect()
        total = time.process_time() - start
        del result
        best, best_total = min(best, elapsed), min(best_total, total)
    return best, best_total


def without_gc(func: Callable[[], Any]) -> Callable[[], Any]:
    """`func` run with the collector off."""

    def run() -> Any:
        gc.disable()
        try:
            return func()
        finally:
            gc.enable()

    return run


def compare(name: str, n: int, nbytes: int, rounds: int, decode: Callable[[], Any],
            baseline: Callable[[], Any]) -> None:
    """Measure a decode and its baseline and print the figures side by side."""
    ours, ours_total = best_of(rounds, decode)
    base, base_total = best_of(rounds, baseline)
    raw, _ = best_of(rounds, without_gc(baseline))
    print(f"{name}: {n:,} messages, {nbytes / n:.0f} bytes each")
    print(f"  decode               {n / ours:>11,.0f} msg/s  {nbytes / ours / 1e6:6.1f} MB/s")
    print(f"  baseline             {n / base:>11,.0f} msg/s  ratio {base / ours:.2f}")
    print(f"  baseline, gc off     {n / raw:>11,.0f} msg/s  ratio {raw / ours:.2f}")
    print(f"  each with a full collection after it:  ratio {base_total / ours_total:.2f}")


def uuids(n: int) -> list[str]:
    producer = new_producer_id()
    return [str(build_uuid(producer, (i + 1) << 4, Flags.CONTINUE_TXN)) for i in range(n)]


def bench_json(n: int, rounds: int) -> None:
    framing = JSONFraming()
    buf = b"".join(
        framing.marshal({"uuid": u, "seq": i, "user": f"user-{i % 5000:05d}",
                         "event": "page_view", "ms": 17 + i % 300, "ok": i % 2 == 0})
        for i, u in enumerate(uuids(n))
    )

    def baseline() -> list[Any]:
        lines = buf.split(b"\n")
        lines.pop()
        return [orjson.loads(line) for line in lines]

    def decode() -> list[Any]:
        return framing.decode(buf, journal=JOURNAL, final=True).envelopes

    assert len(decode()) == n and len(baseline()) == n
    compare("JSON lines", n, len(buf), rounds, decode, baseline)


def bench_fixed(n: int, rounds: int) -> None:
    event = event_class()
    framing = FixedFraming(new_message=ProtoMessage.factory(event))
    payloads = [
        event(uuid=u, seq=i, user=f"user-{i % 5000:05d}", ok=i % 2 == 0,
              tags=["web", "eu"]).SerializeToString()
        for i, u in enumerate(uuids(n))
    ]
    buf = b"".join(framing.marshal(p) for p in payloads)
    from_string = event.FromString

    def baseline() -> list[Any]:
        return [from_string(p) for p in payloads]

    def decode() -> list[Any]:
        return framing.decode(buf, journal=JOURNAL, final=True).envelopes

    assert len(decode()) == n and len(baseline()) == n
    compare("fixed protobuf", n, len(buf), rounds, decode, baseline)


def bench_csv(n: int, rounds: int) -> None:
    framing = CSVFraming()
    rows = [[u, str(i), f"user-{i % 5000:05d}", "page_view", str(17 + i % 300)]
            for i, u in enumerate(uuids(n))]
    rows[n // 2][3] = "quoted, with a comma"  # one quoted record: the csv.reader path
    for label, data in (("CSV, unquoted", rows[: n // 2]), ("CSV, with a quoted record", rows)):
        buf = b"".join(framing.marshal(r) for r in data)
        text = buf.decode()

        def baseline() -> list[Any]:
            return list(csv.reader(io.StringIO(text)))

        def decode() -> list[Any]:
            return framing.decode(buf, journal=JOURNAL, final=True).envelopes  # noqa: B023

        assert len(decode()) == len(data) == len(baseline())
        compare(label, len(data), len(buf), rounds, decode, baseline)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="50,000 messages, smoke-size run")
    parser.add_argument(
        "--gc", choices=("pause", "leave"), default="pause",
        help="pause the collector while decoding (as the oncelog CLI and Spark workers do; "
        "ONCELOG_GC_PAUSE=1), or leave it alone (an embedding library's default)",
    )
    parser.add_argument("--messages", type=int, help="messages per framing")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from oncelog.framing import set_gc_pausing

    set_gc_pausing(args.gc == "pause")
    print(f"garbage collector while decoding: {args.gc}")
    n = args.messages or (50_000 if args.quick else 1_000_000)
    bench_json(n, args.rounds)
    bench_fixed(n, args.rounds)
    bench_csv(n, args.rounds)


if __name__ == "__main__":
    main()
