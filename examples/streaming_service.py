"""A streaming node and its clients: produce over gRPC, consume filtered, read from the store.

Starts `oncelog serve` on a free loopback port (a subprocess, as a deployment would run it),
creates a channel multiplexing two vchannels, produces from several threads through one
node (whose group commit packs them into shared fragments), commits a transaction, then
consumes one vchannel through the node and checks that the same messages are ordinary
read-committed journal messages in the store.

    python examples/streaming_service.py [--store URL] [-o KEY=VALUE ...] [--messages N]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
from collections import Counter

from oncelog import open_journals, read_committed
from oncelog.options import storage_option_arg
from oncelog.streaming import ConsumedMessage, DeliverAll, VChannel, connect

CHANNEL = "examples/stream/orders"


def start_node(store: str, options: dict) -> tuple[subprocess.Popen[str], str]:
    """Run a node; its address once it prints "listening on HOST:PORT"."""
    argv = [sys.executable, "-m", "oncelog.streaming", "--store", store,
            "--listen", "127.0.0.1:0", "--tick", "0.2"]
    for key, value in options.items():
        argv += ["-o", f"{key}:={json.dumps(value)}"]
    node = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert node.stdout is not None
    line = node.stdout.readline()  # the node prints it first, or exits
    if not line.startswith("listening on "):
        node.kill()
        raise SystemExit(f"the node did not start: {line!r}")
    return node, line.split()[2]


def run(store: str, options: dict, messages: int) -> int:
    node, address = start_node(store, options)
    try:
        client = connect(address)
        desc = client.create_channel(CHANNEL, "orders of the example shop")
        print(f"channel {desc.name} owned by {desc.owner_node} at term {desc.term}")

        def produce(worker: int) -> None:
            futures = [
                client.append_async(CHANNEL, [json.dumps({"order": i, "worker": worker})],
                                    vchannel="orders" if i % 2 == 0 else "audit")
                for i in range(worker, messages, 4)
            ]
            for f in futures:
                f.result()  # durable on the node

        threads = [threading.Thread(target=produce, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with client.txn(CHANNEL, "orders", keepalive=10) as txn:
            txn.append(json.dumps({"order": "txn-1"}))
            txn.append(json.dumps({"order": "txn-2"}))
        expected = (messages + 1) // 2 + 2

        got = []
        with client.read(CHANNEL, DeliverAll(), [VChannel("orders")]) as scanner:
            for item in scanner:
                if isinstance(item, ConsumedMessage):
                    got.append(json.loads(item.payload))
                    if len(got) == expected:
                        break
        print(f"consumed {len(got)} messages of vchannel orders through the node")

        journals = open_journals(store, **options)
        docs = [e.message.doc for e in read_committed(journals, CHANNEL)]
        fragments = len(journals.fragments(CHANNEL))
        journals.close()
        counts = Counter(d["vchannel"] for d in docs)
        print(f"read committed from the store: {dict(sorted(counts.items()))}")
        print(f"fragments: {fragments} for {len(docs)} messages")
        ok = counts == {"orders": expected, "audit": messages // 2} and len(got) == expected
        print(f"every message exactly once: {ok}")
        client.close()
        return 0 if ok else 1
    finally:
        node.terminate()
        node.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=None, help="fsspec URL or directory (default: temp dir)")
    parser.add_argument("-o", "--storage-option", action="append", default=[],
                        type=storage_option_arg, metavar="KEY=VALUE")
    parser.add_argument("--messages", type=int, default=200)
    args = parser.parse_args(argv)
    options = dict(args.storage_option)
    if args.store is None:
        with tempfile.TemporaryDirectory(prefix="oncelog-streaming-") as tmp:
            return run(tmp, options, args.messages)
    return run(args.store, options, args.messages)


if __name__ == "__main__":
    sys.exit(main())
