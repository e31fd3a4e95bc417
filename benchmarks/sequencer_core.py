"""Sequencing alone: pre-decoded envelopes through the Sequencer, no I/O or decoding.

1,000,000 messages from 16 interleaved producers, half of them in transactions
of 10 CONTINUE_TXN messages, each closed by an ACK_TXN (delivered too), half
OUTSIDE_TXN; UUIDs are parsed before timing (`env.ids` is cached). Prints the
envelopes/s of the per-call API (queue_uncommitted + step), of `committed()` and
of `sequence()`, each as a ratio to a floor measured in the same run: a plain
loop that touches each envelope's `.ids` and appends it to a list. Times are CPU
times, best of interleaved rounds, as the machine may be shared. The Sequencers are C
kernels where the speed-ups are built; `ONCELOG_PURE_PYTHON=1` measures the pure kernel.

    .venv/bin/python benchmarks/sequencer_core.py [--quick] [--messages N] [--repeat R]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from oncelog import _native  # noqa: E402
from oncelog.message import Envelope, Flags, JSONMessage, build_uuid  # noqa: E402
from oncelog.sequencer import QueueOutcome, Sequencer  # noqa: E402

JOURNAL = "bench/sequencer/part-000"


def build(
    messages: int, producers: int = 16, txn_share: float = 0.5, txn_len: int = 10, seed: int = 7
) -> list[Envelope]:
    """Envelopes of `messages` messages (ACKs not counted), with the number delivered."""
    rng = random.Random(seed)
    ids = [bytes([0x01 | (i << 1 & 0xFE), 0x5E, 0x9C, i, 0x00, 0x42]) for i in range(producers)]
    clocks = [1 << 60] * producers
    open_txn = [0] * producers  # messages left in each producer's open transaction
    envs: list[Envelope] = []
    offset = sent = 0
    # Start a transaction with the odds that put `txn_share` of messages in one.
    start_txn = txn_share / (txn_share + (1 - txn_share) * txn_len)

    def emit(p: int, flags: int) -> None:
        nonlocal offset
        clocks[p] += 1
        msg = JSONMessage({"uuid": str(build_uuid(ids[p], clocks[p], flags)), "n": len(envs)})
        size = 90
        envs.append(Envelope(JOURNAL, offset, offset + size, msg))
        offset += size

    while sent < messages:
        p = rng.randrange(producers)
        if open_txn[p]:
            emit(p, Flags.CONTINUE_TXN)
            sent += 1
            open_txn[p] -= 1
            if not open_txn[p]:
                emit(p, Flags.ACK_TXN)
        elif rng.random() < start_txn:
            open_txn[p] = txn_len  # the next messages of p are a transaction
        else:
            emit(p, Flags.OUTSIDE_TXN)
            sent += 1
    for p in range(producers):  # close what is still open
        if open_txn[p]:
            emit(p, Flags.ACK_TXN)
    for env in envs:
        _ = env.ids  # parse once, as a reader's decoder would have
    return envs


def floor_loop(envs: list[Envelope]) -> list[Envelope]:
    out: list[Envelope] = []
    append = out.append
    for env in envs:
        _ = env.ids
        append(env)
    return out


def per_call(envs: list[Envelope]) -> list[Envelope]:
    seq = Sequencer(buffer=1024)
    queue, step = seq.queue_uncommitted, seq.step
    replay_outcome = QueueOutcome.ACK_COMMIT_REPLAY
    out: list[Envelope] = []
    append = out.append
    for env in envs:
        if queue(env) is replay_outcome:
            raise AssertionError("the benchmark's transactions should fit the ring")
        while (committed := step()) is not None:
            append(committed)
    return out


def batch_list(envs: list[Envelope]) -> list[Envelope]:
    return Sequencer(buffer=1024).committed(envs)


def batch_iter(envs: list[Envelope]) -> list[Envelope]:
    out: list[Envelope] = []
    append = out.append
    for env in Sequencer(buffer=1024).sequence(envs):
        append(env)
    return out


def measure(
    fns: dict[str, Callable[[list[Envelope]], list[Envelope]]], envs: list[Envelope], repeat: int
) -> tuple[dict[str, float], dict[str, list[int]]]:
    """Best CPU time of each function; rounds interleave them so that load on a shared
    machine hits all alike."""
    best = dict.fromkeys(fns, float("inf"))
    outs: dict[str, list[int]] = {}
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.process_time()
            out = fn(envs)
            best[name] = min(best[name], time.process_time() - t0)
            outs[name] = [id(e) for e in out]
    return best, outs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a 50,000-message smoke run")
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    args = ap.parse_args(argv)
    if args.quick or os.environ.get("ONCELOG_BENCH_QUICK"):
        args.messages, args.repeat = 50_000, 1

    t0 = time.perf_counter()
    envs = build(args.messages)
    acks = sum(1 for e in envs if e.flags == Flags.ACK_TXN)
    print(
        f"{len(envs):,} envelopes ({args.messages:,} messages + {acks:,} ACKs), 16 producers,"
        f" built in {time.perf_counter() - t0:.1f}s; best CPU time of {args.repeat}; "
        + ("C kernel" if _native.speedups is not None else "pure Python")
    )
    fns = {
        "floor (touch .ids + append)": floor_loop,
        "per call: queue_uncommitted+step": per_call,
        "committed(batch)": batch_list,
        "sequence(iterable)": batch_iter,
    }
    best, outs = measure(fns, envs, args.repeat)
    floor_s = best["floor (touch .ids + append)"]
    reference = outs["per call: queue_uncommitted+step"]
    assert len(reference) == len(envs), "every message (and ACK) is delivered exactly once"
    for name, secs in best.items():
        if outs[name] != reference and name != "floor (touch .ids + append)":
            raise AssertionError(f"{name} delivered differently from the per-call API")
        ratio = "" if name.startswith("floor") else f"  {floor_s / secs:.2f}x floor"
        print(f"{name:34} {len(envs) / secs:>12,.0f} envelopes/s{ratio}")


if __name__ == "__main__":
    main()
