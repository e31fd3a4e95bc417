"""The producer transaction object (`oncelog.producer_transaction`): the clocks of the UUIDs
it issues, its state transitions and misuse errors, and keepalive expiry (an injected clock:
no sleeps); plus the Publisher's keepalive no longer deadlocking a commit it races."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from oncelog.errors import OncelogError, TransactionError, TransactionExpired
from oncelog.identity import ACK_TXN, CONTINUE_TXN, Clock, new_producer_id, uuid_fields
from oncelog.journal import JournalSpec
from oncelog.message import JSONMessage
from oncelog.producer_transaction import (
    Keepalive,
    ProducerTransaction,
    TxnState,
    keepalive_ms,
    keepalive_seconds,
    rollback_clock,
)
from oncelog.publisher import Publisher
from oncelog.reading import read_committed
from oncelog.testing.fixtures import StoreTarget

WAIT = 30.0
P = new_producer_id()


def fixed(value: int = 1000, **kwargs: object) -> ProducerTransaction:
    """A transaction of producer P on a clock at `value` that stays off the wall clock."""
    return ProducerTransaction(P, Clock(value), realtime=False, label="txn 7 on 'ch'",
                               **kwargs)  # type: ignore[arg-type]


def fields(u: object) -> tuple[bytes, int, int]:
    producer, clock, flags = uuid_fields(u)  # type: ignore[arg-type]
    return producer, clock, int(flags)


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


# -- clocks ---------------------------------------------------------------------------------


def test_continue_uuids_take_consecutive_ticks_and_record_first_and_last() -> None:
    txn = fixed()
    assert not txn.written and txn.first_clock == txn.last_clock == 0
    assert fields(txn.continue_uuid()) == (P, 1001, CONTINUE_TXN)
    assert [fields(u) for u in txn.continue_uuids(3)] == [
        (P, 1002, CONTINUE_TXN), (P, 1003, CONTINUE_TXN), (P, 1004, CONTINUE_TXN)]
    assert txn.written and (txn.first_clock, txn.last_clock) == (1001, 1004)
    with pytest.raises(ValueError, match="at least one"):
        txn.continue_uuids(0)


def test_realtime_moves_the_clock_to_now_first() -> None:
    txn = ProducerTransaction(P)  # realtime, its own clock at 0
    before = Clock()
    before.update()
    _, clock, _ = fields(txn.continue_uuid())
    assert clock > before.value
    _, ack, flags = fields(txn.commit_uuid())
    assert ack > clock and flags == ACK_TXN


def test_a_producer_is_chosen_at_the_first_message_unless_given() -> None:
    txn = ProducerTransaction(clock=Clock(5), realtime=False)
    assert txn.producer is None
    with pytest.raises(TransactionError, match="no producer"):
        txn.commit_uuid()
    producer, _, _ = fields(txn.continue_uuid())
    assert txn.producer == producer and len(producer) == 6


def test_commit_is_at_the_next_tick_and_never_below_the_last_message() -> None:
    txn = fixed()
    txn.continue_uuids(2)
    assert fields(txn.commit_uuid()) == (P, 1003, ACK_TXN)
    assert txn.ack_clock == 1003
    assert txn.state is TxnState.OPEN  # until the caller appended it
    # Clocks noted from elsewhere (a client's UUIDs) may be above the transaction's clock.
    ahead = fixed()
    ahead.note(5000, 5009)
    assert fields(ahead.commit_uuid()) == (P, 5009, ACK_TXN)


def test_rollback_reasserts_the_clock_before_the_first_message_or_the_last_ack() -> None:
    assert fixed().rollback_uuid() is None  # nothing written: nothing to roll back
    txn = fixed()
    txn.continue_uuids(3)
    assert fields(txn.rollback_uuid()) == (P, 1000, ACK_TXN)  # first clock (1001) - 1
    assert txn.ack_clock == 1000
    acked = fixed(acked=900)
    acked.continue_uuid()
    assert fields(acked.rollback_uuid()) == (P, 900, ACK_TXN)
    assert rollback_clock(1001) == 1000 and rollback_clock(1001, 900) == 900


def test_note_records_clocks_stamped_elsewhere_and_checks_them() -> None:
    txn = ProducerTransaction(clock=Clock(), realtime=False, label="txn 7 on 'ch'")
    txn.note(50, 52, P)
    assert (txn.producer, txn.first_clock, txn.last_clock) == (P, 50, 52)
    txn.note(60)
    assert (txn.first_clock, txn.last_clock) == (50, 60)
    other = new_producer_id()
    with pytest.raises(TransactionError, match=f"txn 7 on 'ch'.*{other.hex()}"):
        txn.note(70, 70, other)
    with pytest.raises(TransactionError, match="do not grow past .* last clock 60"):
        txn.note(60)
    with pytest.raises(TransactionError, match="do not grow"):
        txn.note(80, 79)
    assert (txn.first_clock, txn.last_clock) == (50, 60)  # refused notes change nothing


# -- states ---------------------------------------------------------------------------------


def test_commit_after_rollback_is_refused_naming_the_transaction() -> None:
    txn = fixed()
    txn.continue_uuid()
    rollback = txn.rollback_uuid()
    txn.finish(TxnState.ROLLED_BACK)
    assert txn.state is TxnState.ROLLED_BACK
    with pytest.raises(TransactionError, match="txn 7 on 'ch' is rolled back: cannot commit"):
        txn.commit_uuid()
    with pytest.raises(TransactionError, match="cannot commit"):
        txn.finish(TxnState.COMMITTED)
    with pytest.raises(TransactionError, match="cannot publish in"):
        txn.continue_uuid()
    with pytest.raises(TransactionError, match="cannot publish in"):
        txn.note(2000)
    # Rolled back again: the same ACK (a copy changes nothing), no error.
    assert txn.rollback_uuid() == rollback
    txn.finish(TxnState.ROLLED_BACK)
    assert txn.state is TxnState.ROLLED_BACK


def test_a_committed_transaction_takes_nothing_more() -> None:
    txn = fixed()
    txn.continue_uuid()
    txn.commit_uuid()
    txn.finish(TxnState.COMMITTED)
    txn.finish(TxnState.COMMITTED)  # again: no change
    for call, action in [(txn.rollback_uuid, "roll back"), (txn.commit_uuid, "commit"),
                         (txn.continue_uuid, "publish in"),
                         (lambda: txn.finish(TxnState.ROLLED_BACK), "roll back"),
                         (lambda: txn.finish(TxnState.EXPIRED), "roll back")]:
        with pytest.raises(TransactionError, match=f"is committed: cannot {action}") as info:
            call()
        assert isinstance(info.value, OncelogError)
        assert not isinstance(info.value, TransactionExpired)
    assert txn.state is TxnState.COMMITTED


def test_an_expired_transaction_refuses_a_commit_with_transaction_expired() -> None:
    txn = fixed(keepalive=Keepalive(2.5, now=FakeClock()))
    txn.continue_uuid()
    txn.finish(TxnState.EXPIRED)
    assert txn.keepalive is not None and txn.keepalive.closed  # leaving OPEN stops it
    with pytest.raises(TransactionExpired, match="txn 7 on 'ch' sent nothing for its "
                       "keepalive of 2.5 s and was rolled back: cannot commit"):
        txn.commit_uuid()
    with pytest.raises(TransactionExpired):
        txn.finish(TxnState.COMMITTED)
    txn.finish(TxnState.ROLLED_BACK)  # an expired transaction is rolled back already
    assert txn.state is TxnState.EXPIRED
    assert fields(txn.rollback_uuid()) == (P, 1000, ACK_TXN)


def test_finish_needs_a_final_state_and_state_words_are_the_messages_words() -> None:
    with pytest.raises(ValueError, match="final state"):
        fixed().finish(TxnState.OPEN)
    assert [f"{s}" for s in TxnState] == ["open", "committed", "rolled back", "expired"]


# -- keepalive ------------------------------------------------------------------------------


def test_keepalive_deadline_touch_and_expiry_on_an_injected_clock() -> None:
    now = FakeClock()
    calls: list[str] = []
    ka = Keepalive(10.0, lambda: calls.append("expired"), now=now, start=False)
    assert ka.deadline == 110.0 and ka.remaining() == 10.0 and not ka.expired()
    now.t = 105.0
    ka.touch()  # sent something: 10 s from now
    assert ka.deadline == 115.0
    now.t = 114.9
    assert not ka.expired() and not ka.fire() and calls == []
    now.t = 115.0
    assert ka.expired() and ka.remaining() == 0.0
    assert ka.fire() and calls == ["expired"]
    assert not ka.fire() and calls == ["expired"]  # at most once
    assert ka.closed


def test_a_closed_keepalive_never_calls_back() -> None:
    now = FakeClock()
    calls: list[str] = []
    ka = Keepalive(1.0, lambda: calls.append("expired"), now=now, start=False)
    ka.close()
    now.t += 5
    assert ka.expired() and not ka.fire() and calls == []


def test_the_timer_thread_calls_back_once_expired() -> None:
    fired = threading.Event()
    threads: list[threading.Thread] = []

    def on_expiry() -> None:
        threads.append(threading.current_thread())
        fired.set()

    # Made at t=100 with 0.5 s to live; every later reading is t=200: already expired, so
    # the timer's bounded wait ends at once.
    readings = iter([100.0])
    ka = Keepalive(0.5, on_expiry, now=lambda: next(readings, 200.0))
    assert fired.wait(WAIT), "the keepalive timer never called back"
    assert ka.join(WAIT) and threads[0].name == "oncelog-keepalive"
    assert threads == threads[:1] and ka.closed and not ka.fire()


def test_a_closed_timer_ends_without_calling_back() -> None:
    calls: list[str] = []
    ka = Keepalive(3600.0, lambda: calls.append("expired"))
    ka.close()
    assert ka.join(WAIT), "a closed keepalive's thread did not end"
    assert calls == []


def test_keepalive_conversions() -> None:
    assert keepalive_seconds(timedelta(milliseconds=1500)) == 1.5
    assert keepalive_seconds(2) == 2 and keepalive_seconds(None) is None
    assert keepalive_ms(None) == 0  # the node's default
    assert keepalive_ms(0.0001) == 1 and keepalive_ms(2.5) == 2500


# -- the Publisher's keepalive racing its commit --------------------------------------------


def test_a_keepalive_expiring_as_the_transaction_commits_does_not_deadlock(
    memory_store: StoreTarget,
) -> None:
    """The keepalive fires while the transaction's block is exiting: its callback waits for
    the publisher's transaction lock, held by the committing thread, which stops the
    keepalive. Stopping it must not wait for that callback (it used to join the timer
    thread: both waited forever). The commit wins: the message is committed, and the late
    expiry finds the transaction gone and does nothing."""
    client = memory_store.open()
    journal = "tx/race"
    client.create(JournalSpec(journal, labels={"content-type": "application/x-ndjson"}))
    pub = Publisher(client)
    original = pub._expire
    entered, returned = threading.Event(), threading.Event()

    def expire(seconds: float) -> None:
        entered.set()
        try:
            original(seconds)  # blocks on _txn_lock until the commit released it
        finally:
            returned.set()

    pub._expire = expire  # type: ignore[method-assign]
    outcome: list[object] = []

    def run() -> None:
        # Held (re-entrantly) from before the transaction to after its exit, so the
        # keepalive's callback is surely blocked on it while the exit stops the keepalive.
        with pub._txn_lock:
            try:
                with pub.transaction(keepalive=0.05):
                    pub.publish_uncommitted(lambda m: (journal, "application/x-ndjson"),
                                            JSONMessage({"n": 1}))
                    outcome.append(entered.wait(WAIT))
                outcome.append("committed")
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(WAIT)
    assert not worker.is_alive(), "the commit deadlocked with the keepalive's expiry"
    assert outcome == [True, "committed"]
    assert returned.wait(WAIT), "the keepalive's callback never returned"
    assert pub._expired is None  # the late expiry rolled nothing back
    assert [e.message.doc["n"] for e in read_committed(client, journal)] == [1]
    client.close()
