"""Benchmark: producing through a streaming node against appending directly with the library.

Measures, in the same run and on the same store (local disk by default: every fragment is
fsync'd; `--s3` for the S3 test server). Both sides are the API each side's docs recommend
for throughput, one call per message, a window of W messages in flight per process, and
store the same JSON line per message (`{"uuid", "vchannel", "payload"}`):

- baseline: N producer processes each publishing 200-byte messages straight to one journal
  with the library's asynchronous, group-committed appends (`Publisher.publish_committed`,
  which stamps a UUID and returns an `AsyncAppend`; a process's concurrent appends share
  its fragments);
- the same N processes producing the same messages to one channel through one node with
  `StreamingClient.append_async` (the client coalesces a process's queued calls into batch
  stream messages, several pipelined; the node group-commits all producers of the channel).

Prints throughput (messages/s) and its ratio to the baseline, p50/p99 produce latency (call
to durable acknowledgement), fragments written and messages per fragment (each node
fragment is one flush of the channel shared by every producer: one fragment per channel per
flush), and publish-to-consume p50/p99 of a node consumer (`read(DeliverLatest())`) beside a
polling reader's (`read_committed(block=True)` in another client, library defaults).

Run: .venv/bin/python benchmarks/streaming.py [--producers N] [--messages M] [--quick] [--s3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from typing import Any

SIZE = 200


def _payload(worker: int, i: int) -> bytes:
    head = f'{{"w":{worker},"i":{i},"pad":"'
    return (head + "x" * (SIZE - len(head) - 3) + '"}').encode()


def _worker(mode: str, target: str, name: str, worker: int, count: int, window: int,
            options: dict[str, Any]) -> None:
    """One producer process: prints one JSON line of its start, end and latencies."""
    latencies: list[float] = []
    pending: deque[tuple[float, Any]] = deque()
    if mode == "node":
        from oncelog.streaming import connect

        client: Any = connect(target)
        client.append("bench/warmup", b"{}")  # open the stream before the clock starts

        def send(i: int) -> Any:
            return client.append_async(name, [_payload(worker, i)])
    else:
        from oncelog.journal import open_journals
        from oncelog.message import JSONMessage
        from oncelog.publisher import Publisher

        client = open_journals(target, **options)
        client.head(name)
        publisher = Publisher(client)
        route = (name, "application/x-ndjson")

        def send(i: int) -> Any:
            doc = {"vchannel": "", "payload": _payload(worker, i).decode()}
            return publisher.publish_committed(lambda _m: route, JSONMessage(doc))

    start = time.time()
    for i in range(count):
        pending.append((time.perf_counter(), send(i)))
        if len(pending) >= window:
            t0, f = pending.popleft()
            f.result()
            latencies.append(time.perf_counter() - t0)
    while pending:
        t0, f = pending.popleft()
        f.result()
        latencies.append(time.perf_counter() - t0)
    end = time.time()
    client.close()
    print(json.dumps({"start": start, "end": end, "lat": latencies}), flush=True)


def _run_workers(mode: str, target: str, name: str, n: int, count: int, window: int,
                 options: dict[str, Any]) -> dict[str, Any]:
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", mode, target, name, str(w), str(count),
             str(window), json.dumps(options)],
            stdout=subprocess.PIPE, text=True,
        )
        for w in range(n)
    ]
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"{mode} worker failed ({p.returncode})")
        results.append(json.loads(out.strip().splitlines()[-1]))
    lat = sorted(x for r in results for x in r["lat"])
    span = max(r["end"] for r in results) - min(r["start"] for r in results)
    return {
        "rate": n * count / span,
        "span": span,
        "p50": lat[len(lat) // 2] * 1e3,
        "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3,
    }


def _start_node(store: str, options: dict[str, Any]) -> tuple[subprocess.Popen[str], str]:
    argv = [sys.executable, "-m", "oncelog.streaming", "--store", store, "--listen",
            "127.0.0.1:0", "--tick", "5", "--no-failover"]
    for key, value in options.items():
        argv += ["-o", f"{key}:={json.dumps(value)}"]
    node = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert node.stdout is not None
    line = node.stdout.readline()
    if not line.startswith("listening on "):
        raise SystemExit(f"node did not start: {line!r}")
    return node, line.split()[2]


def _consume_latency(address: str, store: str, options: dict[str, Any], probes: int) -> tuple[
    list[float], list[float]
]:
    """Publish-to-consume latency (ms) of a node consumer and of a polling library reader."""
    from oncelog.journal import open_journals
    from oncelog.reading import read_committed
    from oncelog.streaming import ConsumedMessage, DeliverLatest, connect

    client = connect(address)
    client.create_channel("bench/latency")
    journals = open_journals(store, **options)
    start = journals.head("bench/latency")
    node_lat: list[float] = []
    poll_lat: list[float] = []
    ready = threading.Barrier(3)
    scanner = client.read("bench/latency", DeliverLatest())

    def node_reader() -> None:
        ready.wait()
        for item in scanner:
            if isinstance(item, ConsumedMessage):
                node_lat.append((time.time() - float(item.payload)) * 1e3)
                if len(node_lat) == probes:
                    return

    def poll_reader() -> None:
        ready.wait()
        for env in read_committed(journals, "bench/latency", start, block=True):
            poll_lat.append((time.time() - float(env.message.doc["payload"])) * 1e3)
            if len(poll_lat) == probes:
                return

    threads = [threading.Thread(target=f, daemon=True) for f in (node_reader, poll_reader)]
    for t in threads:
        t.start()
    ready.wait()
    for _ in range(probes):
        client.append("bench/latency", repr(time.time()))
        time.sleep(0.02)  # pacing: idle gaps like a real trickle of messages
    for t in threads:
        t.join(timeout=60)
    scanner.close()
    client.close()
    journals.close()
    return sorted(node_lat), sorted(poll_lat)


def _quantile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        mode, target, name, w, count, window, opts = sys.argv[2:9]
        _worker(mode, target, name, int(w), int(count), int(window), json.loads(opts))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--messages", type=int, default=3000, help="per producer")
    parser.add_argument("--window", type=int, default=32, help="requests in flight each")
    parser.add_argument("--probes", type=int, default=200, help="consume-latency probes")
    parser.add_argument("--quick", action="store_true", help="small run (smoke test)")
    parser.add_argument("--s3", action="store_true", help="use the S3 test server")
    args = parser.parse_args()
    if args.quick:
        args.producers, args.messages, args.probes = 2, 300, 20

    from oncelog.journal import JournalSpec, open_journals

    tmp = tempfile.mkdtemp(prefix="oncelog-bench-streaming-")
    server = None
    options: dict[str, Any] = {}
    store = os.path.join(tmp, "store")
    if args.s3:
        import uuid

        from oncelog.testing.fixtures import start_s3_server

        info, server = start_s3_server()
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        info.create_bucket(bucket)
        store, options = f"s3://{bucket}/streaming", dict(info.storage_options)
    node = None
    try:
        journals = open_journals(store, **options)
        journals.create(JournalSpec("bench/direct"))
        node, address = _start_node(store, options)
        from oncelog.streaming import connect

        admin = connect(address)
        admin.create_channel("bench/node")
        admin.create_channel("bench/warmup")

        n, m, w = args.producers, args.messages, args.window
        print(f"{n} producer processes x {m} messages of {SIZE} B, {w} in flight each, "
              f"store {'S3 test server' if args.s3 else 'local disk'}")
        direct = _run_workers("direct", store, "bench/direct", n, m, w, options)
        via = _run_workers("node", address, "bench/node", n, m, w, options)
        frag_direct = len(journals.fragments("bench/direct"))
        frag_node = len(journals.fragments("bench/node"))
        total = n * m
        print(f"{'':26}{'direct (baseline)':>20}{'through the node':>20}{'ratio':>9}")
        print(f"{'throughput msg/s':26}{direct['rate']:20.0f}{via['rate']:20.0f}"
              f"{via['rate'] / direct['rate']:9.2f}")
        for key in ("p50", "p99"):
            print(f"{key + ' produce latency ms':26}{direct[key]:20.2f}{via[key]:20.2f}"
                  f"{via[key] / direct[key]:9.2f}")
        print(f"{'fragments written':26}{frag_direct:20d}{frag_node:20d}"
              f"{frag_node / max(1, frag_direct):9.2f}")
        print(f"{'messages per fragment':26}{total / frag_direct:20.1f}{total / frag_node:20.1f}"
              f"{(total / frag_node) / (total / frag_direct):9.2f}")
        print(f"{'fragments per second':26}{frag_direct / direct['span']:20.1f}"
              f"{frag_node / via['span']:20.1f}"
              f"{(frag_node / via['span']) / (frag_direct / direct['span']):9.2f}")
        print("(direct: each process flushes its own fragments; node: one fragment per flush "
              "of the channel, shared by every producer)")
        node_lat, poll_lat = _consume_latency(address, store, options, args.probes)
        if node_lat and poll_lat:
            print(f"{'':26}{'polling reader':>20}{'node consumer':>20}{'ratio':>9}")
            for q, label in ((0.5, "p50"), (0.99, "p99")):
                pn, pp = _quantile(node_lat, q), _quantile(poll_lat, q)
                print(f"{'publish->consume ' + label + ' ms':26}{pp:20.2f}{pn:20.2f}"
                      f"{pn / pp:9.2f}")
        admin.close()
        journals.close()
    finally:
        if node is not None:
            node.terminate()
            node.wait(timeout=30)
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
