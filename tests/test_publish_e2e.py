"""End to end: three processes publish transactions to shared journals; read-committed
sees exactly the committed messages, on local disk and on the S3 test server."""

from __future__ import annotations

import multiprocessing
import random
from collections import Counter
from typing import Any

import pytest

from oncelog.framing import CONTENT_TYPE_JSON_LINES
from oncelog.journal import JournalSpec, open_journals
from oncelog.message import JSONMessage
from oncelog.publisher import Publisher
from oncelog.reading import read_committed

JOURNALS = ["e2e/part-0", "e2e/part-1"]


def publisher_process(url: str, options: dict[str, Any], worker: int, txns: int) -> list[int]:
    """Publish `txns` transactions over both journals; roll back every third. Returns the
    message numbers that were committed."""
    rng = random.Random(worker)
    client = open_journals(url, **options)
    pub = Publisher(client)
    committed: list[int] = []
    for t in range(txns):
        ns = [worker * 100_000 + t * 100 + i for i in range(rng.randint(1, 6))]
        try:
            with pub.transaction():
                for n in ns:
                    journal = JOURNALS[n % 2]
                    pub.publish_uncommitted(
                        lambda _m, j=journal: (j, CONTENT_TYPE_JSON_LINES), JSONMessage({"n": n})
                    )
                if t % 3 == 2:
                    raise RuntimeError("roll back")
            committed.extend(ns)
        except RuntimeError:
            pass
    client.close()
    return committed


@pytest.mark.slow
@pytest.mark.parametrize("store", ["local_store", "s3_store"])
def test_three_processes_publish_transactions(store: str, request: pytest.FixtureRequest) -> None:
    target = request.getfixturevalue(store)
    client = target.open()
    for name in JOURNALS:
        client.create(JournalSpec(name, labels={"content-type": CONTENT_TYPE_JSON_LINES}))
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        results = pool.starmap(
            publisher_process, [(target.url, target.storage_options, w, 12) for w in range(3)]
        )
    expected = Counter(n for r in results for n in r)
    got: Counter[int] = Counter()
    for name in JOURNALS:
        for env in read_committed(client, name):
            got[env.message.doc["n"]] += 1
            assert env.message.doc["n"] % 2 == JOURNALS.index(name)
    assert got == expected
    assert len(expected) > 0 and all(c == 1 for c in got.values())
    client.close()
