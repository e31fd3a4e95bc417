"""Benchmark: an exactly-once word-count consumer against plain read-committed reading.

Writes N committed messages (upstream transactions of 100 messages) to one journal on
local disk, then measures, in the same run:

- baseline: `read_committed` of the journal, counting messages;
- a `Consumer` with a no-op handler: transactions of `--txn` messages (10,000 and 100,000
  by default) and their checkpoints, the consumer's own overhead;
- the baseline loop counting words (the handler's own work, for reference);
- a `Consumer` counting words in transactions of the same sizes, publishing the totals
  changed by each transaction (one output message per transaction) and checkpointing
  after each;
- the same word count with a batch handler (`Consumer(batch_handler=...)`: committed
  messages handed over `read_batch` at a time, sequenced by the reader's fast path).

Each is printed as messages per wall-clock second and per CPU second of the process (all
threads; steadier than wall time on a shared machine), with ratios to the baseline. The
best of `--repeat` interleaved rounds is kept.

Run: .venv/bin/python benchmarks/consumer.py [--messages N] [--txn 10000,100000] [--repeat R]
[--quick] (each consumer row for each transaction size of `--txn`).

With `--state`, it measures the commit cost of the consumer state instead: a state of
`--keys` distinct keys (comma-separated sizes), of which each transaction changes
`--changes`; per commit, the bytes written to the store and the time, for JSON state
(the whole state in each checkpoint) and SQLite state (a delta per commit, a snapshot every
`--snapshot-every`), and the recovery time of a fresh process after a consumer with the
largest SQLite state was SIGKILLed in the middle of a commit.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from math import inf

import orjson

from oncelog.consumer import Consumer, SQLiteState, Transaction
from oncelog.journal import JournalSpec, open_journals
from oncelog.message import (
    Envelope,
    Flags,
    JSONMessage,
    build_uuid,
    clock_from_unix_ns,
    new_producer_id,
)
from oncelog.publisher import Publisher
from oncelog.reading import read_committed

NDJSON = "application/x-ndjson"
INPUT = "bench/sentences"
OUTPUT = "bench/totals"
"""Each consumer group publishes to its own `bench/totals-<group>` (created before it
runs): a journal's append cost grows with its fragments, so a shared output journal would
penalise whichever consumer runs later."""
UPSTREAM_TXN = 100


def write_input(client, messages: int, seed: int = 1) -> None:
    """Append `messages` committed sentences, in upstream transactions, as raw frames."""
    rng = random.Random(seed)
    vocabulary = [f"word{i:03d}" for i in range(500)]
    producer = new_producer_id()
    clock = clock_from_unix_ns(time.time_ns())
    buf = bytearray()
    for i in range(messages):
        clock += 1
        text = " ".join(rng.choices(vocabulary, k=rng.randint(6, 10)))
        uuid = build_uuid(producer, clock, Flags.CONTINUE_TXN)
        buf += orjson.dumps({"uuid": str(uuid), "text": text}) + b"\n"
        if (i + 1) % UPSTREAM_TXN == 0 or i + 1 == messages:
            clock += 1
            buf += orjson.dumps({"uuid": str(build_uuid(producer, clock, Flags.ACK_TXN))}) + b"\n"
        if len(buf) >= 1 << 20:
            client.append(INPUT, bytes(buf))
            buf.clear()
    if buf:
        client.append(INPUT, bytes(buf))


def timed(fn: Callable[[], object]) -> tuple[object, float, float]:
    """fn's result, its wall-clock seconds and the process's CPU seconds (all threads)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def baseline(client) -> int:
    n = 0
    for _ in read_committed(client, INPUT):
        n += 1
    return n


def baseline_counting(client) -> int:
    counts: dict[str, int] = {}
    n = 0
    for env in read_committed(client, INPUT):
        for word in env.message.doc["text"].split():
            counts[word] = counts.get(word, 0) + 1
        n += 1
    return n


def count_words(env: Envelope, txn: Transaction) -> None:
    """The handler: the same counting loop as `baseline_counting`, on the group's state."""
    counts = txn.state["counts"]
    for word in env.message.doc["text"].split():
        counts[word] = counts.get(word, 0) + 1


def count_words_batch(envelopes: list[Envelope], txn: Transaction) -> None:
    """The batch handler: the same counting loop over a batch of committed messages."""
    counts = txn.state["counts"]
    get = counts.get
    for env in envelopes:
        for word in env.message.doc["text"].split():
            counts[word] = get(word, 0) + 1


def publish_totals(txn: Transaction) -> None:
    """Before each commit: publish the totals that changed in this transaction, as one
    message (the same totals as one message per word, for a fraction of the appends)."""
    counts, published = txn.state["counts"], txn.state["published"]
    changed = {word: total for word, total in counts.items() if published.get(word) != total}
    if changed:
        output = f"{OUTPUT}-{txn.group}"
        txn.publish(lambda m: (output, NDJSON), JSONMessage({"totals": changed}))
        published.update(changed)


def consume_noop(client, group: str, txn_size: int) -> int:
    """The consumer's own cost: the same transactions and checkpoints, a no-op handler."""
    consumer = Consumer(
        client, group, [INPUT], lambda env, txn: None,
        max_messages=txn_size, max_duration=3600, keep_checkpoints=None,
    )
    return consumer.run(until_idle=True)


def consume(client, group: str, txn_size: int, batch: bool = False) -> tuple[int, Consumer]:
    client.create(JournalSpec(f"{OUTPUT}-{group}", {"content-type": NDJSON}))
    consumer = Consumer(
        client,
        group,
        [INPUT],
        None if batch else count_words,
        batch_handler=count_words_batch if batch else None,
        finalize=publish_totals,
        initial_state={"counts": {}, "published": {}},
        max_messages=txn_size,
        max_duration=3600,
        keep_checkpoints=None,
    )
    commits = consumer.run(until_idle=True)
    return commits, consumer


# -- state commit cost ------------------------------------------------------------------------

UPDATES = "bench/updates"


def update_keys(i: int, keys: int, changes: int) -> list[str]:
    """The keys message `i` changes (deterministic)."""
    rng = random.Random(i)
    return [f"k{k:08d}" for k in rng.sample(range(keys), changes)]


def json_handler(env: Envelope, txn: Transaction) -> None:
    doc = env.message.doc
    if "populate" in doc:
        txn.state = {f"k{k:08d}": 0 for k in range(doc["populate"])}
        return
    state = txn.state
    for key in update_keys(doc["i"], doc["keys"], doc["changes"]):
        state[key] = doc["i"]


def sqlite_handler(env: Envelope, txn: Transaction) -> None:
    doc = env.message.doc
    kv = txn.kv
    assert kv is not None
    if "populate" in doc:
        kv.put_many((f"k{k:08d}", 0) for k in range(doc["populate"]))
        return
    kv.put_many((key, doc["i"]) for key in update_keys(doc["i"], doc["keys"], doc["changes"]))


class _Meter:
    """Counts the bytes of the small objects created (checkpoints, state objects), through
    the metadata store every client uses (`client.meta`); `close()` stops counting."""

    def __init__(self, client) -> None:
        from oncelog.coordination import MetaStore

        self.bytes = 0
        self._real = real = MetaStore.put_if_absent

        def put_if_absent(store: MetaStore, path: str, data: bytes) -> bool:
            self.bytes += len(data)
            return real(store, path, data)

        MetaStore.put_if_absent = put_if_absent  # type: ignore[method-assign]

    def close(self) -> None:
        from oncelog.coordination import MetaStore

        MetaStore.put_if_absent = self._real  # type: ignore[method-assign]


def _state_consumer(client, group: str, kind: str, snapshot_every: int, **kw) -> Consumer:
    if kind == "json":
        return Consumer(client, group, [UPDATES], json_handler, initial_state={},
                        max_messages=1, max_duration=3600, keep_checkpoints=None, **kw)
    return Consumer(client, group, [UPDATES], sqlite_handler,
                    state=SQLiteState(snapshot_every=snapshot_every), max_messages=1,
                    max_duration=3600, keep_checkpoints=None, **kw)


def measure_commits(client, kind: str, keys: int, commits: int, snapshot_every: int) -> dict:
    """Populate `keys` keys in one transaction, then time `commits` transactions of one
    message each (the handler's own work is timed apart and subtracted)."""
    group = f"{kind}-{keys}"
    meter = _Meter(client)
    handler_time = [0.0]
    consumer = _state_consumer(client, group, kind, snapshot_every)
    real = consumer._handler

    def timed_handler(env: Envelope, txn: Transaction) -> None:
        t = time.perf_counter()
        real(env, txn)
        handler_time[0] += time.perf_counter() - t

    consumer._handler = timed_handler
    consumer.run(max_transactions=1)  # recovery + populate
    rows = []
    for _ in range(commits):
        meter.bytes, handler_time[0] = 0, 0.0
        t = time.perf_counter()
        assert consumer.run(max_transactions=1) == 1
        rows.append((time.perf_counter() - t - handler_time[0], meter.bytes))
    consumer.close()
    meter.close()
    return {"rows": rows, "group": group}


def _kill_child(root: str, group: str, snapshot_every: int, commits: int) -> int:
    """Child process: run the SQLite consumer `commits` more transactions, then SIGKILL
    itself after writing the next transaction's state object (before its claim)."""
    client = open_journals(root)
    seen = [0]

    def on_stage(name: str) -> None:
        if name == "committed":
            seen[0] += 1
        if name == "state" and seen[0] >= commits:
            os.kill(os.getpid(), signal.SIGKILL)

    _state_consumer(client, group, "sqlite", snapshot_every, on_stage=on_stage).run()
    return 1


def state_benchmark(args: argparse.Namespace) -> None:
    sizes = [int(k) for k in args.keys.split(",")]
    root = tempfile.mkdtemp(prefix="oncelog-bench-state-")
    try:
        client = open_journals(root)
        print(f"{'state':8} {'keys':>9} {'commit ms (median)':>19} {'max ms':>8}"
              f" {'bytes/commit':>13} {'mean bytes':>12} {'commits':>8}")
        results: dict[tuple[str, int], dict] = {}
        for keys in sizes:
            name = f"bench/updates-{keys}"
            client.create(JournalSpec(name, {"content-type": NDJSON}))
            publisher = Publisher(client)
            publisher.publish_committed(lambda m, n=name: (n, NDJSON),
                                        JSONMessage({"populate": keys}))
            for i in range(1, args.commits + args.snapshot_every + 20):
                doc = {"i": i, "keys": keys, "changes": args.changes}
                publisher.publish_committed(lambda m, n=name: (n, NDJSON), JSONMessage(doc))
            publisher.flush()
            for kind in ("json", "sqlite"):
                n = args.commits if kind == "sqlite" else max(3, min(args.commits,
                                                                     2_000_000 // keys))
                if kind == "json" and keys > args.json_max:
                    continue
                _set_input(name)
                r = measure_commits(client, kind, keys, n, args.snapshot_every)
                results[(kind, keys)] = r
                times = [t for t, _ in r["rows"]]
                size = [b for _, b in r["rows"]]
                print(f"{kind:8} {keys:9,} {statistics.median(times) * 1000:19.2f}"
                      f" {max(times) * 1000:8.1f} {statistics.median(size):13,.0f}"
                      f" {statistics.mean(size):12,.0f} {n:8}")
        # Recovery after a SIGKILL, with the largest SQLite state.
        keys = sizes[-1]
        _set_input(f"bench/updates-{keys}")
        proc = subprocess.run(
            [sys.executable, __file__, "--kill-child", root, f"sqlite-{keys}",
             str(args.snapshot_every), str(args.snapshot_every // 2), f"bench/updates-{keys}"],
            check=False, capture_output=True, text=True,
        )
        assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr)
        consumer = _state_consumer(client, f"sqlite-{keys}", "sqlite", args.snapshot_every)
        t = time.perf_counter()
        consumer.recover()
        took = time.perf_counter() - t
        ref = consumer._checkpoint.state
        assert consumer.kv is not None and len(consumer.kv) == keys
        print(f"recovery after SIGKILL, SQLite state of {keys:,} keys: {took:.2f}s (snapshot"
              f" {'yes' if ref['snapshot'] else 'no'} + {len(ref['deltas'])} deltas)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _set_input(name: str) -> None:
    global UPDATES
    UPDATES = name


def main() -> None:
    if len(sys.argv) == 7 and sys.argv[1] == "--kill-child":
        _, _, root, group, every, commits, name = sys.argv
        _set_input(name)
        raise SystemExit(_kill_child(root, group, int(every), int(commits)))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", action="store_true", help="measure state commit costs")
    parser.add_argument("--keys", default="10000,100000,1000000", help="--state: key counts")
    parser.add_argument("--changes", type=int, default=1000, help="--state: keys per txn")
    parser.add_argument("--commits", type=int, default=30, help="--state: commits measured")
    parser.add_argument("--snapshot-every", type=int, default=100, help="--state: SQLite K")
    parser.add_argument("--json-max", type=int, default=1_000_000,
                        help="--state: largest JSON state measured")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--txn", default="10000,100000",
                        help="consumer transaction sizes (comma-separated)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds; the best of each is kept")
    parser.add_argument("--quick", action="store_true", help="a smoke-size run (50,000 messages)")
    args = parser.parse_args()
    if args.state:
        state_benchmark(args)
        return
    messages = 50_000 if args.quick else args.messages

    root = tempfile.mkdtemp(prefix="oncelog-bench-consumer-")
    try:
        client = open_journals(root)
        client.create(JournalSpec(INPUT, {"content-type": NDJSON}))
        start = time.perf_counter()
        write_input(client, messages)
        print(f"wrote {messages:,} committed messages in {time.perf_counter() - start:.1f}s")

        # Warm up caches (page cache, imports) so neither side pays them alone; then keep
        # the best of `--repeat` interleaved rounds (the machine may be shared).
        baseline(client)
        sizes = [int(t) for t in args.txn.split(",")]
        keys = ["base", "count"] + [f"{kind}-{t}" for t in sizes
                                    for kind in ("noop", "consumer", "batch")]
        best = {key: (inf, inf) for key in keys}
        commits: dict[int, int] = {}
        consumers: list[Consumer] = []
        for round_ in range(args.repeat):
            n_base, *t_base = timed(lambda: baseline(client))
            n_count, *t_count = timed(lambda: baseline_counting(client))
            assert n_base == n_count == messages, (n_base, n_count, messages)
            times = {"base": t_base, "count": t_count}
            consumers = []
            for t in sizes:
                _, *times[f"noop-{t}"] = timed(
                    lambda: consume_noop(client, f"noop-{t}-{round_}", t))
                (commits[t], consumer), *times[f"consumer-{t}"] = timed(
                    lambda: consume(client, f"bench-{t}-{round_}", t))
                (_, batch_consumer), *times[f"batch-{t}"] = timed(
                    lambda: consume(client, f"batch-{t}-{round_}", t, batch=True))
                consumers += [consumer, batch_consumer]
            for key, tm in times.items():
                best[key] = tuple(map(min, best[key], tm))

        expected: Counter[str] = Counter()
        for env in read_committed(client, INPUT):
            expected.update(env.message.doc["text"].split())
        ok = True
        for c in consumers:
            published = {}
            for env in read_committed(client, f"{OUTPUT}-{c.group}"):
                published.update(env.message.doc["totals"])
            ok = ok and published == dict(expected) == c.state["counts"]

        labels = {"base": "read_committed (baseline)", "count": "read_committed + word count"}
        for t in sizes:
            labels[f"noop-{t}"] = f"Consumer no-op handler, txn {t:,}"
            labels[f"consumer-{t}"] = f"Consumer word count, txn {t:,}"
            labels[f"batch-{t}"] = f"Consumer batch word count, txn {t:,}"
        print(f"{'':40} {'msgs/s':>9} {'vs baseline':>11} {'vs same work':>12}"
              f" {'msgs/CPU-s':>11} {'vs baseline':>11}")
        for key, label in labels.items():
            wall, cpu = best[key]
            rate, cpu_rate = messages / wall, messages / cpu
            same = (f"{best['count'][0] / wall:11.2f}x"
                    if key.startswith(("consumer", "batch")) else "")
            print(
                f"{label:40} {rate:9,.0f} {best['base'][0] / wall:10.2f}x {same:>12}"
                f" {cpu_rate:11,.0f} {best['base'][1] / cpu:10.2f}x"
            )
        print(
            "consumer: " + ", ".join(f"{n} transactions of {t:,}" for t, n in commits.items())
            + f", each checkpointed; published totals match the committed input: {ok}"
        )
        print(
            "(the no-op row is the consumer's own overhead; 'vs same work' compares the"
            " word-count consumer with a read_committed loop counting the same way)"
        )
        if not ok:
            raise SystemExit("consumer totals differ from the committed input")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
