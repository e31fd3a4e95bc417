"""SIGKILL at every storage write of single-journal transactions committed in one append.

A child process runs a fixed plan of transactions over one journal (small ones, whose ACK
joins their messages in one fragment, and one larger than a fragment, whose first messages
are forced out before the ACK) and is SIGKILLed right after its n-th storage write
(`oncelog.testing.faults.kill_after_writes`), for every n the plan makes. After each kill:

- every transaction is committed whole or not at all;
- every transaction the child reported committed is there, and only it and at most the one
  in flight are;
- what `read_committed` delivers is the crash-free run's delivery restricted to them;
- a restarted publisher that publishes the rest ends with exactly the crash-free delivery.
"""

from __future__ import annotations

import json
import signal
import sys

import pytest

from oncelog import JSONMessage, Publisher, read_committed
from oncelog.journal import FragmentSpec, JournalClient, JournalSpec
from oncelog.testing.fixtures import StoreTarget
from oncelog.testing.processes import run_python

NDJSON = "application/x-ndjson"
PLAN = [1, 3, 1, 12, 2, 1, 5, 1]  # messages per transaction; 12 of them span fragments
FRAGMENT = FragmentSpec(length=400, flush_interval=60.0)

CHILD = r"""
import json, sys
from oncelog import JSONMessage, Publisher, open_journals
from oncelog.testing.faults import kill_after_writes

url, options, name, kill_at, start, plan = (
    sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]),
    json.loads(sys.argv[6]))
client = open_journals(url, **options)
writes = kill_after_writes(client, kill_at)
pub = Publisher(client)
route = lambda _msg: (name, "application/x-ndjson")
for txn in range(start, len(plan)):
    with pub.transaction():
        for k in range(plan[txn]):
            pub.publish_uncommitted(route, JSONMessage({"txn": txn, "k": k, "pad": "p" * 20}))
    print("committed", txn, flush=True)
client.close()
print("writes", writes(), flush=True)
"""


def run_child(target: StoreTarget, name: str, kill_at: int, start: int = 0) -> tuple[str, str]:
    """Run the plan from transaction `start` in a child killed after write `kill_at` (0:
    never); returns ("killed" or "done", its stdout)."""
    proc = run_python(
        [
            sys.executable,
            "-c",
            CHILD,
            target.url,
            json.dumps(target.storage_options),
            name,
            str(kill_at),
            str(start),
            json.dumps(PLAN),
        ],
        text=True,
        timeout=120,
    )
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"child failed: {proc.returncode}\n{proc.stderr}")
    return ("killed" if proc.returncode == -signal.SIGKILL else "done"), proc.stdout


def publish_plan(client: JournalClient, name: str, start: int) -> None:
    """What CHILD does, in this process (a restarted publisher: a new producer ID)."""
    pub = Publisher(client)
    for txn in range(start, len(PLAN)):
        with pub.transaction():
            for k in range(PLAN[txn]):
                pub.publish_uncommitted(
                    lambda _msg: (name, NDJSON), JSONMessage({"txn": txn, "k": k, "pad": "p" * 20})
                )


def delivered(client: JournalClient, name: str) -> list[tuple[int, int]]:
    """(txn, k) of each message read_committed delivers, in order."""
    return [(env.message.doc["txn"], env.message.doc["k"]) for env in read_committed(client, name)]


def reported(stdout: str) -> list[int]:
    return [int(line.split()[1]) for line in stdout.splitlines() if line.startswith("committed")]


def sweep(target: StoreTarget) -> None:
    client = target.open()
    try:

        def journal(tag: str) -> str:
            name = f"fusedcrash/{tag}"
            client.create(JournalSpec(name, {"content-type": NDJSON}, FRAGMENT))
            return name

        free = journal("free")
        status, out = run_child(target, free, 0)
        assert status == "done" and reported(out) == list(range(len(PLAN)))
        expected = delivered(client, free)
        assert expected == [(t, k) for t, n in enumerate(PLAN) for k in range(n)]
        total = int(out.split("writes")[-1])
        # One fragment (stage, rename, claim on local disk) per small transaction, and
        # several for the large one: every one of these writes is a kill point.
        assert total >= 20, total
        assert len(client.fragments(free)) < 2 * len(PLAN)
        cut_between = 0
        for n in range(1, total + 1):
            name = journal(f"k{n}")
            status, out = run_child(target, name, n)
            assert status == "killed", n
            done = reported(out)
            assert done == list(range(len(done))), (n, done)
            got = delivered(client, name)
            txns = sorted({t for t, _ in got})
            for t in txns:  # all or nothing per transaction
                assert [k for tt, k in got if tt == t] == list(range(PLAN[t])), (n, t, got)
            # Committed: those reported, and perhaps the one in flight at the kill.
            assert txns in (done, [*done, len(done)]), (n, done, txns)
            assert got == [m for m in expected if m[0] in txns], (n, got)
            cut_between += txns == done and len(done) < len(PLAN)
            # A restart publishes what was not committed: the result is the crash-free one.
            publish_plan(client, name, start=len(txns))
            assert delivered(client, name) == expected, n
        # Some kills fell inside a transaction's commit (it is then not committed).
        assert cut_between > 0
    finally:
        client.close()


@pytest.mark.slow
@pytest.mark.fault
def test_sigkill_at_every_write_of_fused_commits_local(local_store: StoreTarget) -> None:
    sweep(local_store)
