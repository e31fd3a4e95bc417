"""The streaming node under the failures its clients must ride out, and its batched produce:
batches answered per request (only once durable), scanners that resume on another node,
broadcasts resent after a lost reply, transactions whose node dies, TLS."""

from __future__ import annotations

import datetime
import ipaddress
import queue
import subprocess
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from oncelog.message import ACK_TXN, CONTINUE_TXN, parse_uuid_fields
from oncelog.reading import read_committed, read_uncommitted
from oncelog.streaming import (
    Code,
    ConsumedMessage,
    DeliverAll,
    Scanner,
    StreamingError,
)
from oncelog.streaming import streaming_pb2 as pb
from oncelog.streaming import streaming_pb2_grpc as pb_grpc
from oncelog.testing.fixtures import StoreTarget

WAIT = 60.0



def committed(store: StoreTarget, channel: str) -> list[str]:
    client = store.open()
    try:
        return [e.message.doc["payload"] for e in read_committed(client, channel)]
    finally:
        client.close()


def raw_docs(store: StoreTarget, channel: str) -> list[dict[str, Any]]:
    """Every JSON line of the journal, committed or not, acknowledgements included."""
    client = store.open()
    try:
        return [e.message.doc for e in read_uncommitted(client, channel)]
    finally:
        client.close()


class Reader:
    """Iterates a scanner in a thread; `next(n)` gives its next n messages (bounded wait)."""

    def __init__(self, scanner: Scanner) -> None:
        self.scanner = scanner
        self.got: queue.Queue[Any] = queue.Queue()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            for item in self.scanner:
                if isinstance(item, ConsumedMessage):
                    self.got.put(item)
        except Exception as exc:  # noqa: BLE001 - handed to the test
            self.got.put(exc)

    def next(self, n: int) -> list[bytes]:
        out = []
        for _ in range(n):
            item = self.got.get(timeout=WAIT)
            if isinstance(item, Exception):
                raise item
            out.append(item.payload)
        return out


# -- batched produce ---------------------------------------------------------------------------


def message_request(rid: int, *payloads: bytes, txn_id: int = 0) -> pb.ProduceMessageRequest:
    return pb.ProduceMessageRequest(
        request_id=rid, txn_id=txn_id,
        messages=[pb.Message(payload=p, vchannel="v") for p in payloads])


def test_batch_answers_each_request_once_durable(local_store: StoreTarget, start_node: Any,
                                                 client_of: Any) -> None:
    node = start_node(local_store, "n1", "--max-message-bytes", "100")
    c = client_of(node.address)
    c.create_channel("batch")
    batch = pb.ProduceBatchRequest(requests=[
        message_request(1, b"a"),
        message_request(1, b"same id"),  # not above the previous id
        message_request(2, b"x" * 101),  # oversized: this request only
        message_request(3, b"b", b"c"),
        message_request(4, b"in a txn", txn_id=7),  # transactions are not batched
        message_request(5, b"d"),
    ])
    with grpc.insecure_channel(node.address) as ch:
        stub = pb_grpc.StreamingNodeServiceStub(ch)
        answers = stub.Produce(iter([
            pb.ProduceRequest(create=pb.CreateProducerRequest(
                channel=pb.ChannelInfo(name="batch"))),
            pb.ProduceRequest(batch=batch),
        ]), timeout=WAIT)
        create = next(answers).create
        assert create.max_request_bytes > 0  # the node takes batches
        resp = next(answers)
        # Answered: so durable, and in the store already.
        stored = {(e.begin, e.end): e.message.doc["payload"]
                  for e in read_committed(local_store.open(), "batch")}
    assert resp.WhichOneof("response") == "batch"
    got = resp.batch.responses
    assert [r.request_id for r in got] == [1, 1, 2, 3, 4, 5]
    assert [r.error.code for r in got] == [0, Code.INVALID_REQUEST_SEQ, Code.INVALID_ARGUMENT,
                                           0, Code.INVALID_ARGUMENT, 0]
    assert "101 bytes" in got[2].error.cause
    ids = {r.request_id: [(i.begin, i.end) for i in r.result.ids] for r in got
           if r.WhichOneof("response") == "result"}
    assert {stored[span] for span in ids[1]} == {"a"}
    assert [stored[span] for span in ids[3]] == ["b", "c"]
    assert ids[3][0][1] == ids[3][1][0]  # one request: contiguous
    assert [stored[span] for span in ids[5]] == ["d"]
    assert sorted(stored.values()) == ["a", "b", "c", "d"]


def test_concurrent_appends_coalesce_with_their_own_results(
        local_store: StoreTarget, start_node: Any, client_of: Any) -> None:
    node = start_node(local_store, "n1")
    c = client_of(node.address)
    c.create_channel("co")
    sent: dict[str, Any] = {}
    lock = threading.Lock()

    def produce(t: int) -> None:
        futures = [(f"t{t}-{i}", c.append_async("co", [f"t{t}-{i}"])) for i in range(300)]
        with lock:
            sent.update(futures)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(produce, range(4)))
    ids = {payload: f.result(timeout=WAIT) for payload, f in sent.items()}
    client = local_store.open()
    try:
        stored = {(e.begin, e.end): e.message.doc["payload"] for e in read_committed(client, "co")}
        fragments = len(client.fragments("co"))
    finally:
        client.close()
    assert len(stored) == 1200
    for payload, [mid] in ids.items():
        assert stored[(mid.begin, mid.end)] == payload
    # One thread's calls keep their order in the journal.
    for t in range(4):
        begins = [ids[f"t{t}-{i}"][0].begin for i in range(300)]
        assert begins == sorted(begins)
    assert fragments < 1200  # requests shared stream messages and fragments


# -- scanners ------------------------------------------------------------------------------------


def test_scanner_resumes_on_another_node_exactly(local_store: StoreTarget, start_node: Any,
                                                 client_of: Any) -> None:
    reader_node = start_node(local_store, "reader", "--no-failover")
    owner = start_node(local_store, "owner", "--no-failover")
    c = client_of([reader_node.address, owner.address], retry_timeout=WAIT)
    c.create_channel("sc", address=owner.address)
    for i in range(10):
        c.append("sc", f"m{i}")
    txn = c.txn("sc", "v")
    txn.append("t")  # begins before the scanner's resume point, commits after it
    scanner = c.read("sc", DeliverAll(), address=reader_node.address)
    reader = Reader(scanner)
    assert reader.next(5) == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    reader_node.kill()
    c.append("sc", "m10")
    txn.commit()
    assert reader.next(7) == [b"m5", b"m6", b"m7", b"m8", b"m9", b"m10", b"t"]
    c.append("sc", "m11")
    assert reader.next(1) == [b"m11"]  # nothing repeated in between
    assert scanner.reconnects == 1 and scanner.delivered == 13
    scanner.close()


# -- broadcast -----------------------------------------------------------------------------------


class _LostReply(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "the reply was lost (injected)"


class LoseFirstBroadcastReply(grpc.UnaryUnaryClientInterceptor):
    """Lets the first Broadcast call reach the node and complete there, then reports it
    failed, as a connection dropped after the node acted would."""

    def __init__(self) -> None:
        self.lost = 0

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        outcome = continuation(details, request)
        if details.method.endswith("/Broadcast") and not self.lost:
            outcome.result()  # the node did it
            self.lost += 1
            raise _LostReply()
        return outcome


def test_broadcast_resent_after_lost_reply_is_not_doubled(
        any_store: StoreTarget, start_node: Any, client_of: Any) -> None:
    node = start_node(any_store, "n1")
    lose = LoseFirstBroadcastReply()
    c = client_of(node.address, interceptors=[lose])
    names = ["bc/1", "bc/2", "bc/3"]
    for name in names:
        c.create_channel(name)
    c.broadcast(names, "first", vchannel="all")
    c.broadcast(names, "second", vchannel="all")
    assert lose.lost == 1
    for name in names:
        assert committed(any_store, name) == ["first", "second"]
        # The lost one was appended twice: readers drop the second copy.
        assert Counter(d.get("payload") for d in raw_docs(any_store, name)) == {
            "first": 2, "second": 1, None: 3}


# -- transactions whose node dies -----------------------------------------------------------


def two_nodes(store: StoreTarget, start_node: Any, client_of: Any, channel: str) -> Any:
    a = start_node(store, "node-a", lease=1.0)
    b = start_node(store, "node-b", lease=1.0)
    c = client_of([a.address, b.address], retry_timeout=WAIT)
    c.create_channel(channel, address=a.address)
    return a, b, c


def test_txn_whose_node_dies_is_rolled_back_on_the_new_owner(
        local_store: StoreTarget, start_node: Any, client_of: Any) -> None:
    a, b, c = two_nodes(local_store, start_node, client_of, "tx/rb")
    c.append("tx/rb", "before")
    txn = c.txn("tx/rb", "v")
    txn.append("t1")
    a.kill()
    with pytest.raises(StreamingError) as info:
        txn.append("t2")
    assert info.value.code == Code.TRANSACTION_EXPIRED
    assert "rolled back" in info.value.cause
    assert c.describe_channel("tx/rb").owner_node == "node-b"
    c.append("tx/rb", "after")
    assert committed(local_store, "tx/rb") == ["before", "after"]
    docs = raw_docs(local_store, "tx/rb")
    [t1] = [d for d in docs if d.get("payload") == "t1"]
    producer, clock, flags = parse_uuid_fields(t1["uuid"])
    assert flags == CONTINUE_TXN
    # The new owner appended the rollback: an ACK of t1's producer re-asserting the clock
    # before it.
    acks = [parse_uuid_fields(d["uuid"]) for d in docs if "payload" not in d]
    assert (producer, clock - 1, ACK_TXN) in acks


def test_txn_commit_in_flight_when_its_node_dies_is_committed_on_the_new_owner(
        local_store: StoreTarget, start_node: Any, client_of: Any) -> None:
    a, b, c = two_nodes(local_store, start_node, client_of, "tx/c")
    txn = c.txn("tx/c", "v")
    txn.append("t1")
    txn.append("t2")
    a.pause()  # the commit reaches a node that does nothing with it ...
    with ThreadPoolExecutor(1) as pool:
        commit = pool.submit(txn.commit)
        a.kill()  # ... and then dies
        assert commit.result(timeout=WAIT) > 0
    assert c.describe_channel("tx/c").owner_node == "node-b"
    c.append("tx/c", "after")
    assert committed(local_store, "tx/c") == ["t1", "t2", "after"]


# -- TLS -------------------------------------------------------------------------------------------


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 / localhost and its key (PEM files)."""
    cert_file, key_file = directory / "node.crt", directory / "node.key"
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-days", "1", "-subj", "/CN=localhost", "-keyout", str(key_file),
             "-out", str(cert_file), "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
            check=True, capture_output=True,
        )
        return cert_file, key_file
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


def test_tls_serves_tls_clients_and_refuses_plaintext(
        local_store: StoreTarget, start_node: Any, client_of: Any, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    node = start_node(local_store, "n1", "--tls-cert", str(cert), "--tls-key", str(key))
    c = client_of(node.address, tls_ca=cert)
    c.create_channel("tls")
    mid = c.append("tls", "over tls")
    reader = Reader(c.read("tls", DeliverAll()))
    assert reader.next(1) == [b"over tls"]
    reader.scanner.close()

    plain = client_of(node.address, timeout=10, retry_timeout=0.5)
    for call, args in ((plain.append, ("tls", "plaintext")),
                       (plain.describe_channel, ("tls",)),
                       (plain.create_channel, ("tls2",))):
        with pytest.raises(StreamingError) as info:
            call(*args)
        assert info.value.code == Code.ON_SHUTDOWN  # no TLS handshake: nothing served
    with grpc.insecure_channel(node.address) as ch, pytest.raises(grpc.RpcError):
        pb_grpc.StreamingNodeServiceStub(ch).DescribeChannel(
            pb.DescribeChannelRequest(name="tls"), timeout=10)
    assert c.describe_channel("tls").head == mid.end
    assert committed(local_store, "tls") == ["over tls"]
