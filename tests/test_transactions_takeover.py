"""Transactional ids under takeovers: the outcome a publisher paused between writing its
commit record and its check-after-write reports is the true one, and a takeover SIGKILLed
at any of its storage writes leaves the predecessor's commit for the next one to finish.

Run as a script (`python test_transactions_takeover.py takeover URL OPTIONS TID KILL_AT`),
it is the child process of the SIGKILL tests: one takeover of TID, SIGKILLed right after
its KILL_AT-th storage write (0: never; it then prints how many writes it made)."""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import oncelog.transactions as txmod
from oncelog import JSONMessage, Publisher, open_journals, read_committed
from oncelog.errors import FencedOut
from oncelog.journal import JournalClient, JournalSpec
from oncelog.publisher import TransactionError
from oncelog.testing.faults import kill_after_writes
from oncelog.testing.fixtures import StoreTarget
from oncelog.testing.processes import run_python
from oncelog.transactions import TransactionalLog, read_record

HERE = Path(__file__).resolve()
NDJSON = "application/x-ndjson"
CHILD_TIMEOUT = 120
WAIT = 30.0  # bound of every wait on the paused publisher's thread


def make_journals(client: JournalClient, prefix: str, n: int = 2) -> list[str]:
    names = [f"{prefix}/j{i}" for i in range(n)]
    for name in names:
        client.create(JournalSpec(name, {"content-type": NDJSON}))
    return names


def to(name: str) -> Any:
    return lambda _msg: (name, NDJSON)


def tags(client: JournalClient, journal: str) -> list[str]:
    """The `tag` of every message read_committed delivers from `journal`, in order."""
    return [env.message.doc["tag"] for env in read_committed(client, journal)]


@pytest.fixture(params=["memory", "local"])
def store(request: pytest.FixtureRequest) -> StoreTarget:
    target: StoreTarget = request.getfixturevalue(f"{request.param}_store")
    return target


# -- a publisher paused between its commit record and its check-after-write ---------------


class PauseBeforeCheck:
    """Holds `pub`'s thread right after it created a commit record, before the listing
    that checks nothing newer exists (the check-after-write): `reached` is set there, and
    the thread goes on once `resume` is set. Placed by the record's kind, so a journals
    record written before a transaction's first message does not stop there."""

    def __init__(self, pub: Publisher) -> None:
        self.reached = threading.Event()
        self.resume = threading.Event()
        assert pub._log is not None
        log = pub._log
        real = log.chain.newer

        def newer(after: int) -> list[int]:
            if not self.reached.is_set():
                record = read_record(log.client, log.path(after))
                if record is not None and record.kind == "commit":
                    self.reached.set()
                    assert self.resume.wait(WAIT), "the test never resumed the publisher"
            return real(after)

        log.chain.newer = newer  # type: ignore[method-assign]


class CommitInThread:
    """`pub` commits one message tagged `tag` to each of `names` in a thread of its own;
    `outcome()` waits for it and returns None (committed) or the exception raised."""

    def __init__(self, pub: Publisher, names: list[str], tag: str) -> None:
        self._result: list[BaseException | None] = []

        def run() -> None:
            try:
                with pub.transaction():
                    for name in names:
                        pub.publish_uncommitted(to(name), JSONMessage({"tag": tag}))
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                self._result.append(exc)
            else:
                self._result.append(None)

        self._thread = threading.Thread(target=run, name=f"commit-{tag}", daemon=True)
        self._thread.start()

    def outcome(self) -> BaseException | None:
        self._thread.join(WAIT)
        assert not self._thread.is_alive(), "the paused commit did not finish"
        return self._result[0]


def warm_up(pub: Publisher, names: list[str]) -> None:
    """A first commit, so the journals records are written and the next record is the
    commit's."""
    with pub.transaction():
        for name in names:
            pub.publish_uncommitted(to(name), JSONMessage({"tag": "warm"}))


def test_commit_taken_over_while_paused_reports_committed(store: StoreTarget) -> None:
    """Paused between its commit record and its check, the old instance is taken over: the
    new one's fence names that record and rolls it forward, so the commit IS committed in
    every journal, and the old instance reports it so (it is fenced out from then on)."""
    client = store.open()
    names = make_journals(client, "paused")
    old = Publisher(client, transactional_id="svc")
    warm_up(old, names)
    pause = PauseBeforeCheck(old)
    commit = CommitInThread(old, names, "old")
    assert pause.reached.wait(WAIT)
    other = store.open()
    new = Publisher(other, transactional_id="svc")  # takes over while `old` is stopped
    pause.resume.set()
    assert commit.outcome() is None  # reported committed...
    for name in names:  # ...and committed, in every journal
        assert tags(client, name) == ["warm", "old"]
    assert old.fenced
    # The durable evidence: the record after the commit's is the new instance's fence,
    # naming it.
    tlog = TransactionalLog(client, "svc")
    seq, commit_record = old._seq + 1, read_record(client, tlog.path(old._seq + 1))
    fence = read_record(client, tlog.path(seq + 1))
    assert commit_record is not None and fence is not None and fence.kind == "fence"
    assert (fence.previous_seq, fence.previous_token) == (seq, commit_record.token)
    with pytest.raises(FencedOut, match="svc"):
        with old.transaction():
            pass
    with new.transaction():
        for name in names:
            new.publish_uncommitted(to(name), JSONMessage({"tag": "new"}))
    for name in names:
        assert tags(other, name) == ["warm", "old", "new"]
    other.close()
    client.close()


def test_commit_into_a_pruned_seq_reports_not_committed(store: StoreTarget) -> None:
    """A zombie whose commit record lands in a seq freed by pruning was never taken over:
    FencedOut, and its transaction is in no journal, even after a later takeover."""
    client = store.open()
    names = make_journals(client, "pruned")
    zombie = Publisher(client, transactional_id="svc", keep_records=100)
    warm_up(zombie, names)
    other = store.open()
    live = Publisher(other, transactional_id="svc", keep_records=100)
    with live.transaction():
        for name in names:
            live.publish_uncommitted(to(name), JSONMessage({"tag": "live"}))
    TransactionalLog(other, "svc", keep=1).prune()  # frees the seq the zombie writes next
    outcome = CommitInThread(zombie, names, "zombie").outcome()
    assert isinstance(outcome, FencedOut) and "not committed" in str(outcome), outcome
    Publisher(other, transactional_id="svc")  # a later takeover rolls nothing of it forward
    for name in names:
        assert tags(client, name) == ["warm", "live"]
    other.close()
    client.close()


def test_commit_whose_evidence_was_pruned_reports_an_unknown_outcome(
    store: StoreTarget,
) -> None:
    """Paused while its successor wrote more than `keep_records` records, the old instance
    can no longer tell from the records whether its commit was taken over: it says the
    outcome is unknown (TransactionError, not FencedOut's "not committed")."""
    client = store.open()
    names = make_journals(client, "unknown")
    old = Publisher(client, transactional_id="svc")
    warm_up(old, names)
    pause = PauseBeforeCheck(old)
    commit = CommitInThread(old, names, "old")
    assert pause.reached.wait(WAIT)
    other = store.open()
    new = Publisher(other, transactional_id="svc", keep_records=2)
    for n in range(4):
        with new.transaction():
            new.publish_uncommitted(to(names[0]), JSONMessage({"tag": f"new{n}"}))
    pause.resume.set()
    outcome = commit.outcome()
    assert isinstance(outcome, TransactionError) and not isinstance(outcome, FencedOut)
    assert "outcome is unknown" in str(outcome)
    assert old.fenced
    for name in names:  # it was in fact taken over: committed everywhere
        assert "old" in tags(client, name)
    other.close()
    client.close()


def test_commit_taken_over_by_a_takeover_killed_after_its_fence(
    local_store: StoreTarget,
) -> None:
    """Paused between its commit record and its check while a takeover that is SIGKILLed
    right after writing its fence names that record: the commit is committed (the fence is
    the proof), so the old instance reports success and appends its ACKs itself; every
    journal shows it at once."""
    client = local_store.open()
    names = make_journals(client, "killed")
    old = Publisher(client, transactional_id="svc")
    warm_up(old, names)
    pause = PauseBeforeCheck(old)
    commit = CommitInThread(old, names, "old")
    assert pause.reached.wait(WAIT)
    assert run_takeover(local_store, "svc", kill_at=1) == "killed"
    pause.resume.set()
    assert commit.outcome() is None
    for name in names:
        assert tags(client, name) == ["warm", "old"]
    client.close()


# -- takeovers SIGKILLed at each of their storage writes ----------------------------------


def takeover_child(url: str, options: str, tid: str, kill_at: int) -> None:
    """The child: take `tid` over, SIGKILLed right after storage write `kill_at`."""
    client = open_journals(url, **json.loads(options))
    writes = kill_after_writes(client, kill_at)
    Publisher(client, transactional_id=tid)
    print(json.dumps({"writes": writes()}), flush=True)
    client.close()


def run_takeover(target: StoreTarget, tid: str, kill_at: int) -> str:
    """Run one takeover child: "killed", or the number of writes it made (as text)."""
    proc = run_python(
        [sys.executable, str(HERE), "takeover", target.url,
         json.dumps(target.storage_options), tid, str(kill_at)],
        text=True, timeout=CHILD_TIMEOUT,
    )
    if proc.returncode == -signal.SIGKILL:
        return "killed"
    assert proc.returncode == 0, f"takeover child failed with {proc.returncode}:\n{proc.stderr}"
    return str(json.loads(proc.stdout.strip().splitlines()[-1])["writes"])


def partial_commit(client: JournalClient, tid: str) -> tuple[str, str]:
    """The predecessor's commit, cut short: planned 2 messages in j3 and 1 in j4, its
    record written, only j4's ACK appended (then the process "died")."""
    j3, j4 = "kill/j3", "kill/j4"
    for name in (j3, j4):
        client.create(JournalSpec(name, {"content-type": NDJSON}))
    pub = Publisher(client, transactional_id=tid)
    real = txmod.append_intents

    def only_j4(client_: JournalClient, intents: Any) -> Any:
        real(client_, [a for a in intents if a.journal == j4])
        raise ConnectionError("died after j4's ACK")

    txmod.append_intents = only_j4  # type: ignore[assignment]
    try:
        with pytest.raises(TransactionError, match="committed"):
            with pub.transaction():
                pub.publish_uncommitted(to(j3), JSONMessage({"tag": "a"}))
                pub.publish_uncommitted(to(j3), JSONMessage({"tag": "b"}))
                pub.publish_uncommitted(to(j4), JSONMessage({"tag": "c"}))
    finally:
        txmod.append_intents = real  # type: ignore[assignment]
    assert (tags(client, j3), tags(client, j4)) == ([], ["c"])  # partial, as a crash leaves
    return j3, j4


def listed_journals(target: StoreTarget, tid: str) -> list[str]:
    """What `oncelog txns list` shows for `tid`'s newest record."""
    from click.testing import CliRunner

    from oncelog.cli import cli

    listed = CliRunner().invoke(cli, ["--store", target.url, "txns", "list", "--format", "json"])
    assert listed.exit_code == 0, listed.output
    (doc,) = [d for d in json.loads(listed.stdout) if d["status"].startswith(f"id {tid} ")]
    journals: list[str] = doc["journals"]
    return journals


@pytest.mark.slow
@pytest.mark.fault
def test_takeover_sigkilled_at_each_write_leaves_the_commit_recoverable(
    tmp_path: Path,
) -> None:
    """For every storage write a takeover makes, a takeover SIGKILLed right after it (on a
    fresh copy of the predecessor's partial commit), then a clean takeover: the commit is
    complete in every journal. A kill right after the fence is the case where the fence
    used to carry none of the predecessor's ACKs."""

    def fresh(point: str) -> tuple[StoreTarget, JournalClient, str, str]:
        target = StoreTarget("local", str(tmp_path / point))
        client = target.open()
        j3, j4 = partial_commit(client, "svc")
        return target, client, j3, j4

    target, client, j3, j4 = fresh("clean")
    total = int(run_takeover(target, "svc", kill_at=0))
    assert (tags(client, j3), tags(client, j4)) == (["a", "b"], ["c"])
    client.close()
    assert total >= 5  # the fence, then an ACK and a rollback per journal
    for kill_at in range(1, total + 1):
        target, client, j3, j4 = fresh(f"kill-{kill_at}")
        assert run_takeover(target, "svc", kill_at) == "killed", kill_at
        if kill_at == 1:  # only the fence was written: it shows the commit as pending
            assert listed_journals(target, "svc") == [j3, j4]
        Publisher(client, transactional_id="svc")  # the final, clean takeover
        assert (tags(client, j3), tags(client, j4)) == (["a", "b"], ["c"]), kill_at
        client.close()


@pytest.mark.slow
@pytest.mark.fault
def test_takeovers_sigkilled_in_a_row_leave_the_commit_recoverable(
    local_store: StoreTarget,
) -> None:
    """Several takeovers in a row, each SIGKILLed early (each fence carries on what the
    one before carried), then `oncelog txns recover --id`: the commit is complete."""
    from click.testing import CliRunner

    from oncelog.cli import cli

    client = local_store.open()
    j3, j4 = partial_commit(client, "svc")
    for kill_at in (1, 1):  # two fences in a row, no ACK appended
        assert run_takeover(local_store, "svc", kill_at) == "killed"
    assert (tags(client, j3), tags(client, j4)) == ([], ["c"])
    assert run_takeover(local_store, "svc", 2) == "killed"
    done = CliRunner().invoke(
        cli, ["--store", local_store.url, "txns", "recover", "--id", "svc", "--yes"]
    )
    assert done.exit_code == 0, done.output
    assert (tags(client, j3), tags(client, j4)) == (["a", "b"], ["c"])
    client.close()


if __name__ == "__main__" and sys.argv[1:2] == ["takeover"]:
    takeover_child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
