"""Journal histories for the Spark tests: transactions, rollbacks, duplicates, nil UUIDs."""

from __future__ import annotations

import random

from oncelog.journal import FragmentSpec, JournalClient, JournalSpec
from oncelog.message import JSONMessage
from oncelog.publisher import Publisher
from oncelog.reading import read_committed, read_uncommitted

JSON = "application/x-ndjson"


def to(journal: str):
    return lambda _msg: (journal, JSON)


def write_history(
    client: JournalClient, journal: str, *, seed: int, rounds: int = 12, fragment: int = 400
) -> None:
    """A journal written by three publishers: committed messages, transactions that commit
    or roll back, transactions left open, nil-UUID messages and re-appended duplicates."""
    rng = random.Random(seed)
    spec = JournalSpec(journal, labels={"app": "test"}, fragment=FragmentSpec(length=fragment))
    client.create(spec)
    pubs = [Publisher(client) for _ in range(3)]
    n = 0
    for _ in range(rounds):
        pub = rng.choice(pubs)
        action = rng.random()
        if action < 0.3:
            for _ in range(rng.randint(1, 3)):
                pub.publish_committed(to(journal), JSONMessage({"n": n, "page": f"p{n % 4}"}))
                n += 1
        elif action < 0.75:
            for _ in range(rng.randint(1, 4)):
                pub.publish_uncommitted(to(journal), JSONMessage({"n": n, "page": f"p{n % 4}"}))
                n += 1
            pub.flush()
            if action < 0.6:
                pub.append_intents(pub.build_ack_intents())
            else:
                pub.rollback()
        elif action < 0.85:
            client.append(journal, b'{"n": %d, "page": "nil"}\n' % n)
            n += 1
        else:
            pub.flush()
            old = list(read_uncommitted(client, journal))
            if old:
                env = rng.choice(old)
                reader = client.read(journal, env.begin)
                client.append(journal, reader.read(env.end - env.begin))
                reader.close()
    # One transaction stays open: never visible.
    pubs[0].publish_uncommitted(to(journal), JSONMessage({"n": n, "page": "open"}))
    for pub in pubs:
        pub.flush()


def committed_rows(client: JournalClient, journal: str) -> list[tuple[str, int]]:
    """(journal, begin) of read_committed's messages, in its order."""
    return [(journal, env.begin) for env in read_committed(client, journal)]
