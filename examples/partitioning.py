"""Partitioning with label selectors and mappings: spread, and what moves when a partition
is added.

It creates partitioned journals labelled by app and region, selects partitions with
label selectors, maps keys to them with Gazette's `modulo` and `rendezvous` mappings and
prints the spread. Then it adds a partition: rendezvous moves only the keys the new
partition wins (none between old partitions) where modulo reshuffles most keys. (How many
the new partition wins depends on the names' hashes: Gazette's XOR-of-FNV-1a rendezvous
is not a uniform hash, so it can be more than 1/n.) Finally it
publishes keyed orders and checks each landed in the partition its key maps to.

    python examples/partitioning.py [--store URL] [-o KEY=VALUE ...] [--keys N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter

from oncelog import (
    JournalClient,
    JournalExists,
    JournalSpec,
    JSONMessage,
    Publisher,
    modulo,
    open_journals,
    read_committed,
    rendezvous,
)
from oncelog.options import storage_option_arg

NDJSON = "application/x-ndjson"
PREFIX = "examples/orders"


def create_partition(client: JournalClient, region: str, index: int) -> str:
    name = f"{PREFIX}/{region}/part-{index:03d}"
    try:
        labels = {"content-type": NDJSON, "app": "orders", "region": region}
        client.create(JournalSpec(name, labels))
    except JournalExists:
        pass
    return name


def assignment(mapping, keys: list[str]) -> dict[str, str]:
    """Which journal each key maps to."""
    return {key: mapping(JSONMessage({"key": key}))[0] for key in keys}


def spread(assigned: dict[str, str]) -> str:
    counts = Counter(assigned.values())
    return ", ".join(f"{name.rsplit('/', 1)[-1]}: {counts[name]}" for name in sorted(counts))


def run(store: str, options: dict, keys_count: int) -> int:
    keys = [f"customer-{i}" for i in range(keys_count)]
    key = lambda msg: msg.doc["key"]  # noqa: E731
    ok = True
    with open_journals(store, **options) as client:
        for i in range(4):
            create_partition(client, "eu", i)
        for i in range(2):
            create_partition(client, "us", i)
        snapshot = tuple(client.list("app=orders, region=eu"))
        eu = lambda: snapshot  # noqa: E731  (a service would use a PolledList)
        print("journals matching 'app=orders, region=eu':", [s.name for s in eu()])
        print("journals matching 'app=orders, region!=eu':",
              [s.name for s in client.list("app=orders, region!=eu")])

        before = {"modulo": assignment(modulo(key, eu), keys),
                  "rendezvous": assignment(rendezvous(key, eu), keys)}
        for name, assigned in before.items():
            print(f"{name:>10} over {len(eu())} eu partitions: {spread(assigned)}")

        added = create_partition(client, "eu", len(eu()))
        snapshot = tuple(client.list("app=orders, region=eu"))
        n = len(eu())
        print(f"added {added}; now {n} eu partitions")
        for name, make in (("modulo", modulo), ("rendezvous", rendezvous)):
            after = assignment(make(key, eu), keys)
            moved = [k for k in keys if after[k] != before[name][k]]
            share = len(moved) / len(keys)
            print(f"{name:>10}: {len(moved)} of {len(keys)} keys moved"
                  f" ({share:.0%}; 1/n = {1 / n:.0%})")
            if name == "rendezvous":
                # Only keys the new partition wins move: none is reshuffled between old
                # partitions. (How many it wins depends on the names' hashes: Gazette's
                # XOR-of-FNV rendezvous is not a uniform hash.)
                ok &= all(after[k] == added for k in moved)
                ok &= len(moved) == Counter(after.values())[added]
                rendezvous_moved = len(moved)
            else:
                modulo_moved = len(moved)
                ok &= share > 0.5  # modulo reshuffles most keys
        ok &= rendezvous_moved < modulo_moved
        print("rendezvous moved keys only to the new partition; fewer than modulo:", ok)

        mapping = rendezvous(key, eu)
        publisher = Publisher(client)
        sample = keys[:100]
        for k in sample:
            publisher.publish_committed(mapping, JSONMessage({"key": k, "amount": len(k)}))
        publisher.flush()
        landed = {env.message.doc["key"]: spec.name
                  for spec in eu() for env in read_committed(client, spec.name)}
        placed = all(landed.get(k) == mapping(JSONMessage({"key": k}))[0] for k in sample)
        print(f"published {len(sample)} orders; each in its key's partition: {placed}")
        ok &= placed
    print("checks passed" if ok else "CHECK FAILED")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=None, help="fsspec URL or directory (default: temp dir)")
    parser.add_argument(
        "-o", "--storage-option", action="append", default=[], type=storage_option_arg,
        metavar="KEY=VALUE",
    )
    parser.add_argument("--keys", type=int, default=10_000)
    args = parser.parse_args(argv)
    options = dict(args.storage_option)
    if args.store is None:
        with tempfile.TemporaryDirectory(prefix="oncelog-partitioning-") as tmp:
            return run(tmp, options, args.keys)
    return run(args.store, options, args.keys)


if __name__ == "__main__":
    sys.exit(main())
