"""The producer transaction rules through a real node: the client refuses to use a finished
transaction (instead of sending into its closed stream), and a node takes a transaction's
first clock only from messages it appended (a refused request leaves no trace in it)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from oncelog.errors import TransactionError
from oncelog.message import CONTINUE_TXN, build_uuid, clock_from_unix_ns, new_producer_id
from oncelog.reading import read_committed
from oncelog.streaming import Code
from oncelog.streaming import streaming_pb2 as pb
from oncelog.streaming import streaming_pb2_grpc as pb_grpc
from oncelog.testing.fixtures import StoreTarget

WAIT = 30.0



def bounded(call: Callable[[], object]) -> object:
    """What `call()` returns or raises (as the exception), run in a thread: a call that
    hangs fails the test after WAIT instead of hanging it."""
    got: list[object] = []

    def run() -> None:
        try:
            got.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            got.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(WAIT)
    assert not worker.is_alive(), f"{call} hung"
    return got[0]


def test_a_finished_transaction_refuses_commit_and_append(
    local_store: StoreTarget, start_node: Any, client_of: Any
) -> None:
    node = start_node(local_store, "n1")
    c = client_of(node.address)
    c.create_channel("tr")
    rolled_back = c.txn("tr", "v")
    rolled_back.append("discarded")
    rolled_back.rollback()
    got = bounded(rolled_back.commit)
    assert isinstance(got, TransactionError), got
    assert f"transaction {rolled_back.txn_id} on 'tr' is rolled back: cannot commit" in str(got)

    committed = c.txn("tr", "v")
    committed.append("kept")
    committed.commit()
    got = bounded(lambda: committed.append("late"))
    assert isinstance(got, TransactionError), got
    assert "is committed: cannot publish in" in str(got)
    got = bounded(committed.rollback)
    assert isinstance(got, TransactionError), got
    assert "is committed: cannot roll back" in str(got)

    c.append("tr", "last")  # committed: read-committed delivery reaches past the ACKs
    client = local_store.open()
    try:
        payloads = [e.message.doc["payload"] for e in read_committed(client, "tr")]
    finally:
        client.close()
    assert payloads == ["kept", "last"]


def test_a_refused_request_leaves_the_transactions_first_clock(
    local_store: StoreTarget, start_node: Any, client_of: Any
) -> None:
    """A client-stamped request refused half-way (its second UUID is of another producer)
    appends nothing, so its first clock is not the transaction's: the rollback ACK must
    re-assert the clock before the first message appended after it, which is lower. (Had
    the refused request's clock stayed, the "rollback" ACK would commit the message.)"""
    node = start_node(local_store, "n1")
    c = client_of(node.address)
    c.create_channel("tq")
    producer, other = new_producer_id(), new_producer_id()
    now = clock_from_unix_ns(time.time_ns())

    def uuid_at(who: bytes, clock: int) -> str:
        return str(build_uuid(who, clock, CONTINUE_TXN))

    def txn_produce(rid: int, uuids: list[str]) -> pb.ProduceRequest:
        msgs = [pb.Message(payload=b"m%d" % i, vchannel="v", uuid=u) for i, u in enumerate(uuids)]
        return pb.ProduceRequest(produce=pb.ProduceMessageRequest(
            request_id=rid, messages=msgs, txn_id=1))

    requests = [
        pb.ProduceRequest(create=pb.CreateProducerRequest(channel=pb.ChannelInfo(name="tq"))),
        pb.ProduceRequest(begin_txn=pb.BeginTxnRequest(request_id=1, vchannel="v",
                                                      keepalive_ms=600_000)),
        txn_produce(2, [uuid_at(producer, now + 100), uuid_at(other, now + 101)]),
        txn_produce(3, [uuid_at(producer, now + 10)]),
        pb.ProduceRequest(rollback_txn=pb.RollbackTxnRequest(request_id=4, txn_id=1)),
        pb.ProduceRequest(close=pb.CloseProducerRequest()),
    ]
    with grpc.insecure_channel(node.address) as ch:
        stub = pb_grpc.StreamingNodeServiceStub(ch)
        answers = [r for r in stub.Produce(iter(requests), timeout=WAIT)
                   if r.WhichOneof("response") == "produce"]
    assert [a.produce.error.code for a in answers] == [0, Code.INVALID_ARGUMENT, 0, 0]
    c.append("tq", "after")  # committed: read-committed delivery reaches past the rollback
    client = local_store.open()
    try:
        payloads = [e.message.doc["payload"] for e in read_committed(client, "tq")]
    finally:
        client.close()
    assert payloads == ["after"], f"the rolled-back message was delivered: {payloads}"
