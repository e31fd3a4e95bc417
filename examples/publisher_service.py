"""A small publisher service: committed events spread over partitions picked by labels.

The service lists its partitions with a label selector (a `PolledList`, kept fresh in
the background, so partitions created later are picked up), maps each event to a
partition by its user with Gazette's `modulo` or `rendezvous` mapping, and publishes it
committed. It then reads the partitions back, read-committed, and checks that every
event of this run is there exactly once and that each user's events share a partition.

    python examples/publisher_service.py [--store URL] [-o KEY=VALUE ...]
        [--events N] [--partitions N] [--mapping modulo|rendezvous]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import uuid
from collections import defaultdict

from oncelog import (
    JournalClient,
    JournalExists,
    JournalSpec,
    JSONMessage,
    PolledList,
    Publisher,
    modulo,
    open_journals,
    read_committed,
    rendezvous,
)
from oncelog.options import storage_option_arg

NDJSON = "application/x-ndjson"
SELECTOR = "app=clicks, role=events"


def create_partitions(client: JournalClient, count: int) -> None:
    """`clicks/part-000` ... with labels the service selects on, plus a journal it must not
    pick (same app, another role)."""
    names = [(f"examples/clicks/part-{i:03d}", "events") for i in range(count)]
    for name, role in [*names, ("examples/clicks/audit", "audit")]:
        try:
            labels = {"content-type": NDJSON, "app": "clicks", "role": role}
            client.create(JournalSpec(name, labels))
        except JournalExists:
            pass


class ClickService:
    """Publishes click events committed, each to the partition its user maps to."""

    def __init__(self, client: JournalClient, mapping: str = "rendezvous") -> None:
        self.partitions = PolledList(client, SELECTOR, interval=5.0)
        choose = {"modulo": modulo, "rendezvous": rendezvous}[mapping]
        self.mapping = choose(lambda msg: msg.doc["user"], self.partitions)
        self.publisher = Publisher(client)

    def publish(self, event: dict) -> str:
        """Publish one event; returns the partition it went to."""
        msg = JSONMessage(event)
        journal, _ = self.mapping(msg)
        self.publisher.publish_committed(self.mapping, msg)
        return journal

    def close(self) -> None:
        self.publisher.flush()  # every append durable
        self.partitions.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=None, help="fsspec URL or directory (default: temp dir)")
    parser.add_argument(
        "-o", "--storage-option", action="append", default=[], type=storage_option_arg,
        metavar="KEY=VALUE",
    )
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--mapping", choices=["modulo", "rendezvous"], default="rendezvous")
    args = parser.parse_args(argv)
    options = dict(args.storage_option)
    if args.store is None:
        with tempfile.TemporaryDirectory(prefix="oncelog-publisher-service-") as tmp:
            return run_service(tmp, options, args)
    return run_service(args.store, options, args)


def run_service(store: str, options: dict, args: argparse.Namespace) -> int:
    """Publish `args.events` events to `store`, read them back and check them."""
    run = uuid.uuid4().hex[:8]  # this run's events, even on a store reused across runs
    with open_journals(store, **options) as client:
        create_partitions(client, args.partitions)
        service = ClickService(client, args.mapping)
        sent: dict[int, str] = {}
        for i in range(args.events):
            event = {"run": run, "seq": i, "user": f"user-{i % 23}", "page": f"/p/{i % 7}"}
            sent[i] = service.publish(event)
        service.close()
        print(f"published {len(sent)} events with {args.mapping} over "
              f"{len(service.partitions())} partitions selected by {SELECTOR!r}:")

        got: dict[int, list[str]] = defaultdict(list)
        users: dict[str, set[str]] = defaultdict(set)
        for spec in client.list(SELECTOR):
            n = 0
            for env in read_committed(client, spec.name):
                doc = env.message.doc
                if doc.get("run") == run:
                    got[doc["seq"]].append(spec.name)
                    users[doc["user"]].add(spec.name)
                    n += 1
            print(f"  {spec.name:<28} {n:4d} events")
        ok = (
            all(got.get(i) == [journal] for i, journal in sent.items())
            and len(got) == len(sent)
            and all(len(parts) == 1 for parts in users.values())
        )
        print(f"every event once, in its mapped partition; each user in one partition: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
