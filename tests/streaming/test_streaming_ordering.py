"""Clock order under concurrency: whatever a client stamps (a producer and a clock) must
reach the journal in clock order per producer, or read-committed readers drop the late,
lower clocks as already acknowledged. Threads sharing one client broadcast, and share one
transaction; every acknowledged message is read committed exactly once. Also: a broadcast
is bounded by `--max-message-bytes` exactly as a produce request is (properties count)."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from oncelog.message import ACK_TXN, parse_uuid_fields
from oncelog.reading import read_committed, read_uncommitted
from oncelog.streaming import (
    Code,
    ConsumedMessage,
    DeliverAll,
    StreamingError,
    StreamMessage,
)
from oncelog.streaming import client as client_module
from oncelog.testing.fixtures import StoreTarget

WAIT = 60.0



def committed_docs(store: StoreTarget, channel: str) -> list[dict[str, Any]]:
    client = store.open()
    try:
        return [e.message.doc for e in read_committed(client, channel)]
    finally:
        client.close()


def stored_at(store: StoreTarget, channel: str) -> dict[tuple[int, int], str]:
    """Every message line of the journal (committed or not) by its byte range."""
    client = store.open()
    try:
        return {(e.begin, e.end): e.message.doc.get("payload")
                for e in read_uncommitted(client, channel)}
    finally:
        client.close()


def scan(c: Any, channel: str, n: int) -> list[ConsumedMessage]:
    """The first `n` messages a scanner delivers (read in a thread, bounded wait), then a
    check that nothing more is committed up to the head."""
    got: list[ConsumedMessage] = []
    done = threading.Event()
    error: list[BaseException] = []
    scanner = c.read(channel, DeliverAll())

    def run() -> None:
        try:
            for item in scanner:
                if isinstance(item, ConsumedMessage):
                    got.append(item)
                    if len(got) == n:
                        break
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            error.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    finished = done.wait(WAIT)
    scanner.close()
    assert finished, f"{channel}: the scanner delivered {len(got)} of {n} messages"
    assert not error, error
    return got


# -- concurrent broadcasts ------------------------------------------------------------------


def test_concurrent_broadcasts_of_one_client_are_each_read_committed_once(
        local_store: StoreTarget, start_node: Any, client_of: Any) -> None:
    node = start_node(local_store, "n1")
    c = client_of(node.address)
    names = ["cb/1", "cb/2", "cb/3"]
    for name in names:
        c.create_channel(name)
    threads, per_thread = 8, 8
    start = threading.Barrier(threads)

    def run(t: int) -> list[tuple[str, list[Any]]]:
        start.wait(WAIT)
        out = []
        for i in range(per_thread):
            payload = f"t{t}-{i}"
            out.append((payload, c.broadcast(names, payload, vchannel="all")))
        return out

    with ThreadPoolExecutor(threads) as pool:
        acked = [item for got in pool.map(run, range(threads)) for item in got]
    assert len(acked) == threads * per_thread
    expected = Counter(payload for payload, _ in acked)
    for k, name in enumerate(names):
        docs = committed_docs(local_store, name)
        assert Counter(d["payload"] for d in docs) == expected, name
        assert all(d["vchannel"] == "all" for d in docs)
        # The ids returned are those of the acknowledged copies, holding that payload.
        lines = stored_at(local_store, name)
        for payload, ids in acked:
            assert ids[k].channel == name
            assert lines[(ids[k].begin, ids[k].end)] == payload
    # The streaming consume API delivers the same, each once.
    delivered = scan(c, names[0], len(acked))
    assert Counter(m.payload.decode() for m in delivered) == expected


class _LostReply(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "the reply was lost (injected)"


class LoseEveryThirdBroadcastReply(grpc.UnaryUnaryClientInterceptor):
    """Lets every Broadcast call reach the node and complete there, and reports every third
    one failed, as a connection dropped after the node acted would (from any thread)."""

    def __init__(self) -> None:
        self.calls = 0
        self.lost = 0
        self._lock = threading.Lock()

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        outcome = continuation(details, request)
        if details.method.endswith("/Broadcast"):
            with self._lock:
                self.calls += 1
                lose = self.calls % 3 == 0
                self.lost += lose
            if lose:
                outcome.result()  # the node did it
                raise _LostReply()
        return outcome


def test_concurrent_broadcasts_resent_after_lost_replies_are_read_once(
        local_store: StoreTarget, start_node: Any, client_of: Any) -> None:
    node = start_node(local_store, "n1")
    lose = LoseEveryThirdBroadcastReply()
    c = client_of(node.address, interceptors=[lose])
    names = ["lr/1", "lr/2"]
    for name in names:
        c.create_channel(name)
    threads, per_thread = 6, 10
    start = threading.Barrier(threads)

    def run(t: int) -> list[str]:
        start.wait(WAIT)
        for i in range(per_thread):
            c.broadcast(names, f"t{t}-{i}")
        return [f"t{t}-{i}" for i in range(per_thread)]

    with ThreadPoolExecutor(threads) as pool:
        sent = [p for got in pool.map(run, range(threads)) for p in got]
    assert lose.lost >= len(sent) // 3  # resends happened: copies are in the journals
    for name in names:
        assert Counter(d["payload"] for d in committed_docs(local_store, name)) == Counter(sent)
        stored = Counter(stored_at(local_store, name).values())
        assert sum(stored[p] for p in sent) == len(sent) + lose.lost


def test_broadcasts_never_share_a_producer(local_store: StoreTarget, start_node: Any,
                                           client_of: Any) -> None:
    """Each broadcast is its own producer: a stale copy of one (a resend's twin, a zombie's
    late append, a recovered commit record's ACK) can never roll back another."""
    node = start_node(local_store, "n1")
    c = client_of(node.address)
    c.create_channel("sp/1")
    c.create_channel("sp/2")
    for i in range(3):
        c.broadcast(["sp/1", "sp/2"], f"m{i}")
    client = local_store.open()
    try:
        producers = [parse_uuid_fields(e.message.doc["uuid"])[0]
                     for e in read_committed(client, "sp/1")]
    finally:
        client.close()
    assert len(producers) == 3 and len(set(producers)) == 3


# -- transactions shared by threads ---------------------------------------------------------


class SignallingLock:
    """A lock that sets `contended` when a thread has to wait for it."""

    def __init__(self, inner: Any, contended: threading.Event) -> None:
        self._inner = inner
        self._contended = contended

    def __enter__(self) -> bool:
        if not self._inner.acquire(blocking=False):
            self._contended.set()
            self._inner.acquire()
        return True

    def __exit__(self, *exc: object) -> None:
        self._inner.release()


def test_txn_appends_from_two_threads_keep_clock_order(
        local_store: StoreTarget, start_node: Any, client_of: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Thread A stamps its message, then thread B appends before A sends: B must wait for A
    (else the node sees A's clock after B's larger one and refuses A's append)."""
    node = start_node(local_store, "n1")
    c = client_of(node.address)
    c.create_channel("tt")
    txn = c.txn("tt", "v", keepalive=WAIT)
    a_stamped = threading.Event()
    b_progress = threading.Event()  # B appended, or B waits for A
    # B waiting for A (for the transaction's lock) is progress too. (A client without the
    # lock ignores this attribute: there B appends, and A's clock then arrives too late.)
    txn._lock = SignallingLock(getattr(txn, "_lock", threading.Lock()), b_progress)
    real_build = client_module.build_uuid
    a_thread: list[threading.Thread] = []

    def build_uuid(*args: Any) -> Any:
        made = real_build(*args)
        if a_thread and threading.current_thread() is a_thread[0] and not a_stamped.is_set():
            a_stamped.set()
            assert b_progress.wait(WAIT), "B neither appended nor waited for A"
        return made

    monkeypatch.setattr(client_module, "build_uuid", build_uuid)
    results: dict[str, Any] = {}

    def append(name: str) -> None:
        try:
            results[name] = txn.append(name)
        except StreamingError as exc:
            results[name] = exc

    a = threading.Thread(target=append, args=("a",))
    a_thread.append(a)
    a.start()
    assert a_stamped.wait(WAIT)
    b = threading.Thread(target=append, args=("b",))
    b.start()
    b.join(WAIT)
    b_progress.set()  # B appended (the old client): let A send now
    a.join(WAIT)
    assert not a.is_alive() and not b.is_alive()
    assert not isinstance(results["a"], StreamingError), results["a"]
    assert not isinstance(results["b"], StreamingError), results["b"]
    txn.commit()
    assert sorted(d["payload"] for d in committed_docs(local_store, "tt")) == ["a", "b"]


# -- broadcast size ---------------------------------------------------------------------------


def test_broadcast_size_counts_properties_as_produce_does(
        local_store: StoreTarget, start_node: Any, client_of: Any) -> None:
    node = start_node(local_store, "n1", "--max-message-bytes", "4096")
    c = client_of(node.address)
    c.create_channel("sz/1")
    c.create_channel("sz/2")
    heads = {n: c.describe_channel(n).head for n in ("sz/1", "sz/2")}
    msg = StreamMessage(b"x" * 13, "v", {"k": "p" * 5000})  # 13 + 1 + 5000 = 5014 bytes
    with pytest.raises(StreamingError) as produced:
        c.append("sz/1", msg)
    assert produced.value.code == Code.INVALID_ARGUMENT
    with pytest.raises(StreamingError) as info:
        c.broadcast(["sz/1", "sz/2"], msg)
    assert info.value.code == Code.INVALID_ARGUMENT
    assert "5014 bytes" in info.value.cause and "4096 bytes" in info.value.cause
    assert "payload and properties" in info.value.cause
    assert {n: c.describe_channel(n).head for n in heads} == heads  # nothing appended
    # Within the limit with its properties: broadcast.
    ok = StreamMessage(b"y" * 13, "v", {"k": "p" * 4000})
    c.broadcast(["sz/1", "sz/2"], ok)
    for name in heads:
        assert [d["properties"]["k"] for d in committed_docs(local_store, name)] == ["p" * 4000]


# -- a transaction whose stream breaks while its node lives ----------------------------------


def ack_clocks(store: StoreTarget, channel: str, producer: bytes) -> list[int]:
    """The clocks of `producer`'s acknowledgements in the journal, in journal order."""
    client = store.open()
    try:
        out = []
        for e in read_uncommitted(client, channel):
            got, clock, flags = parse_uuid_fields(e.message.doc["uuid"])
            if got == producer and int(flags) == ACK_TXN:
                out.append(clock)
        return out
    finally:
        client.close()


def break_stream(txn: Any) -> None:
    """Drop the transaction's Produce stream as a network failure would (the node lives
    on and sees the call cancelled); return once the client has seen it break."""
    txn._stream.cancel()
    deadline = time.monotonic() + WAIT
    while not txn._stream._broken:
        assert time.monotonic() < deadline, "the stream did not break"
        time.sleep(0.01)


def test_txn_commit_after_its_stream_broke_commits_on_the_living_node(
        local_store: StoreTarget, start_node: Any, client_of: Any) -> None:
    """The node must not roll back (on the broken stream) what the client then commits
    through a new stream: commit() returned, so the messages are committed."""
    node = start_node(local_store, "n1")
    c = client_of(node.address)
    c.create_channel("tb")
    for round_ in range(5):
        txn = c.txn("tb", "v", keepalive=WAIT)
        txn.append(f"a{round_}")
        txn.append(f"b{round_}")
        break_stream(txn)
        txn.commit()
    payloads = [d["payload"] for d in committed_docs(local_store, "tb")]
    assert payloads == [p for r in range(5) for p in (f"a{r}", f"b{r}")]


def test_txn_expired_after_its_stream_broke_is_not_committed_by_a_late_commit(
        local_store: StoreTarget, start_node: Any, client_of: Any) -> None:
    """The node rolled the transaction back (its keepalive ran out after the stream broke):
    a later commit() must say so, not return as if it committed."""
    node = start_node(local_store, "n1")
    c = client_of(node.address)
    c.create_channel("te")
    txn = c.txn("te", "v", keepalive=0.5)
    txn.append("a")
    break_stream(txn)
    rollback = txn._first_clock - 1
    deadline = time.monotonic() + WAIT
    while rollback not in ack_clocks(local_store, "te", txn._producer):
        assert time.monotonic() < deadline, "the node never rolled the transaction back"
        time.sleep(0.05)
    with pytest.raises(StreamingError) as info:
        txn.commit()
    assert info.value.code == Code.TRANSACTION_EXPIRED
    assert "te" in info.value.cause
    assert committed_docs(local_store, "te") == []


# -- a zombie owner ------------------------------------------------------------------------------


@pytest.mark.slow
def test_concurrent_broadcasts_survive_a_paused_owner_resuming_late(
        local_store: StoreTarget, start_node: Any, client_of: Any) -> None:
    """The owner is paused (SIGSTOP) mid-broadcasts, the other node takes the channels over,
    the client resends there; then the zombie resumes and finishes its stale copies. Every
    acknowledged broadcast is read committed exactly once; one that raised at most once."""
    a = start_node(local_store, "node-a", lease=1.0)
    b = start_node(local_store, "node-b", lease=1.0)
    c = client_of([a.address, b.address], timeout=2.0, retry_timeout=WAIT)
    names = ["zb/1", "zb/2"]
    for name in names:
        c.create_channel(name, address=a.address)
    threads, per_thread = 6, 12
    progress = threading.Semaphore(0)
    outcomes: dict[str, bool] = {}
    lock = threading.Lock()

    def run(t: int) -> None:
        for i in range(per_thread):
            payload = f"t{t}-{i}"
            try:
                c.broadcast(names, payload)
                ok = True
            except StreamingError:
                ok = False  # outcome unknown: at most once
            with lock:
                outcomes[payload] = ok
            progress.release()

    workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for _ in range(threads):  # some broadcasts acknowledged by A first
        assert progress.acquire(timeout=WAIT)
    a.pause()
    try:
        deadline = time.monotonic() + WAIT
        while not all(c.describe_channel(n).owner_node == "node-b" for n in names):
            assert time.monotonic() < deadline, "node-b never took the channels"
            time.sleep(0.05)
        for _ in range(threads):  # more acknowledged by B while A is paused
            assert progress.acquire(timeout=WAIT)
    finally:
        a.proc.send_signal(signal.SIGCONT)  # the zombie finishes what it had started
    for w in workers:
        w.join(WAIT)
        assert not w.is_alive()
    assert len(outcomes) == threads * per_thread
    acked = {p for p, ok in outcomes.items() if ok}
    assert len(acked) >= threads * per_thread // 2
    for name in names:
        counts = Counter(d["payload"] for d in committed_docs(local_store, name))
        assert {p for p in acked if counts[p] != 1} == set(), name
        assert max(counts.values()) == 1 and set(counts) <= set(outcomes), name
