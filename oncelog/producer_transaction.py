"""One producer transaction: the UUIDs it issues, its state, and its keepalive.

A producer's transaction in a journal is a run of CONTINUE_TXN messages of one producer ID
at growing clocks, finished by one ACK_TXN of the same producer (Gazette's rules, read by
`oncelog.sequencer`):

- a **commit** ACK carries a clock at least every message's clock: it commits them all;
- a **rollback** ACK re-asserts the clock readers last saw acknowledged from that producer
  (for a producer that never acknowledged there: the first message's clock - 1), so the
  messages above it are discarded.

`ProducerTransaction` issues those UUIDs and tracks the first and last clock and the state
(open, committed, rolled back, expired), refusing misuse (a commit after a rollback, a
message after a commit) with a `TransactionError` naming the transaction. `Keepalive` owns
keepalive expiry: a monotonic deadline that every message pushes back, and an optional
timer that calls back once when it runs out, so its owner rolls the transaction back.

`Publisher` (one object per journal of a transaction), the streaming node (one per
transaction of a Produce stream) and the streaming client's `Txn` all follow these rules
through this module. It imports only the identity layer and the errors, never a publisher
or the streaming package.

Neither class locks: the caller holds its own lock around every call (the Publisher its
transaction lock, the node the transaction's lock, the client its stamping lock). Only
the keepalive timer thread runs on its own, and it only reads the deadline and calls back.
"""

from __future__ import annotations

import enum
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable

from oncelog.errors import TransactionError, TransactionExpired
from oncelog.identity import ACK_TXN, CONTINUE_TXN, Clock, build_uuid, new_producer_id

__all__ = [
    "Keepalive",
    "ProducerTransaction",
    "TxnState",
    "keepalive_ms",
    "keepalive_seconds",
    "rollback_clock",
]


class TxnState(enum.StrEnum):
    """Where a transaction is; only OPEN accepts messages. The other three are final. The
    values are the words error messages use ("transaction 3 is rolled back")."""

    OPEN = "open"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled back"
    EXPIRED = "expired"
    """Rolled back because it sent nothing for its keepalive."""


def rollback_clock(first_clock: int, acked: int | None = None) -> int:
    """The clock of the ACK rolling back a producer's pending messages in one journal: the
    clock readers last saw acknowledged from the producer there (`acked`), or, if it never
    acknowledged there, the clock just before its first message (`first_clock` - 1).
    Re-asserting an acknowledged clock commits nothing new and discards everything above."""
    return first_clock - 1 if acked is None else acked


def keepalive_seconds(keepalive: float | timedelta | None) -> float | None:
    """A keepalive given as seconds or a `timedelta`, in seconds (None stays None)."""
    return keepalive.total_seconds() if isinstance(keepalive, timedelta) else keepalive


def keepalive_ms(seconds: float | None) -> int:
    """A keepalive in whole milliseconds for the streaming protocol, where 0 means "the
    node's default": None is 0, anything else at least 1."""
    return 0 if seconds is None else max(1, int(seconds * 1000))


class Keepalive:
    """A transaction's keepalive: it expires once `seconds` pass without a `touch()`.

    `deadline` is `last + seconds` on the monotonic clock `now` (injectable for tests);
    `touch()` moves it to `seconds` from now, `expired()` tells whether it passed. With
    `on_expiry`, a daemon thread waits for the deadline (a bounded wait, re-armed while
    touches keep pushing it back, no polling) and calls `on_expiry()` once, unless
    `close()` came first.

    Invariants: `on_expiry` is called at most once, from the timer thread or from `fire()`;
    never after `close()` returned (unless it had already started). `close()` never waits
    for the timer thread: a callback that takes the owner's lock may be blocked behind the
    very caller closing it under that lock, so the callback must check under that lock
    whether the transaction is still open (the Publisher's and the node's do). `last` is
    written by the owner's thread and read by the timer thread (one float: no lock needed).
    """

    __slots__ = ("seconds", "last", "_now", "_on_expiry", "_closed", "_fired", "_lock",
                 "_thread")

    def __init__(
        self,
        seconds: float,
        on_expiry: Callable[[], None] | None = None,
        *,
        now: Callable[[], float] = time.monotonic,
        start: bool = True,
    ) -> None:
        self.seconds = seconds
        self._now = now
        self.last = now()
        self._on_expiry = on_expiry
        self._closed = threading.Event()
        self._fired = False
        self._lock = threading.Lock()  # guards _fired: one call back at most
        self._thread: threading.Thread | None = None
        if on_expiry is not None and start:
            self._thread = threading.Thread(
                target=self._run, name="oncelog-keepalive", daemon=True
            )
            self._thread.start()

    @property
    def deadline(self) -> float:
        """When it expires, on the `now` clock, unless touched before."""
        return self.last + self.seconds

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def touch(self) -> None:
        """Something was sent: the deadline moves to `seconds` from now."""
        self.last = self._now()

    def remaining(self) -> float:
        """Seconds until the deadline (0 once passed)."""
        return max(0.0, self.deadline - self._now())

    def expired(self) -> bool:
        """True once the deadline passed (whether or not it was closed since)."""
        return self._now() >= self.deadline

    def fire(self) -> bool:
        """Call `on_expiry` if the deadline passed, it is not closed and it was not called
        yet; True if it was called now. (The timer thread's step, callable directly.)"""
        if self._closed.is_set() or not self.expired():
            return False
        with self._lock:
            if self._fired:
                return False
            self._fired = True
        self._closed.set()
        if self._on_expiry is not None:
            self._on_expiry()
        return True

    def close(self) -> None:
        """Stop the timer (the transaction finished); returns without waiting for it."""
        self._closed.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the timer thread to end (bounded by `timeout`); True if it has."""
        if self._thread is None or self._thread is threading.current_thread():
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self._closed.wait(self.remaining()):
            if self.fire():
                return


def _misuse(label: str, state: TxnState, action: str, keepalive: Keepalive | None
            ) -> TransactionError:
    if state is TxnState.EXPIRED:
        seconds = f" of {keepalive.seconds:g} s" if keepalive is not None else ""
        return TransactionExpired(
            f"{label} sent nothing for its keepalive{seconds} and was rolled back: "
            f"cannot {action} it"
        )
    return TransactionError(f"{label} is {state}: cannot {action} it")


@dataclass(slots=True, eq=False)
class ProducerTransaction:
    """The rules of one producer's transaction in one journal (see the module docstring).

    Fields: `producer` (None until the first message: then a new random one, or the one
    `note` is given), `clock` (the producer's clock: shared with the Publisher's committed
    publishing, private to a node's or client's transaction), `realtime` (move the clock to
    now before issuing a batch of messages or a commit: the node and client; the Publisher
    drives its clock itself), `acked` (the clock readers last saw acknowledged from
    `producer` in the journal before this transaction, None if none: what a rollback
    re-asserts), `keepalive`, and `label` (how errors name it: journal or channel and id).

    Invariants: `0 < first_clock <= last_clock` once a message is written (`written`), both
    0 before; clocks only grow; a commit ACK's clock is >= `last_clock`; a rollback ACK's is
    `rollback_clock(first_clock, acked)`; `state` leaves OPEN once, and leaving it closes the
    keepalive. Not locked: the caller holds its own lock (see the module docstring).
    """

    producer: bytes | None = None
    clock: Clock = field(default_factory=Clock)
    realtime: bool = True
    acked: int | None = None
    keepalive: Keepalive | None = None
    label: str = "transaction"
    first_clock: int = 0
    last_clock: int = 0
    ack_clock: int = 0
    """The clock of the last ACK issued (`commit_uuid` or `rollback_uuid`), 0 before."""
    state: TxnState = TxnState.OPEN

    @property
    def written(self) -> bool:
        """True once a message of the transaction was stamped (issued or noted)."""
        return self.first_clock != 0

    def check_open(self, action: str = "use") -> None:
        """Raise TransactionError (TransactionExpired if it expired) unless OPEN."""
        if self.state is not TxnState.OPEN:
            raise _misuse(self.label, self.state, action, self.keepalive)

    def continue_uuid(self) -> uuid.UUID:
        """The UUID of the transaction's next message (CONTINUE_TXN, the next clock)."""
        return self.continue_uuids(1)[0]

    def continue_uuids(
        self, n: int, build: Callable[[bytes, int, int], uuid.UUID] = build_uuid
    ) -> list[uuid.UUID]:
        """The UUIDs of the transaction's next `n` messages: CONTINUE_TXN at consecutive
        clock ticks (after moving the clock to now, if `realtime`), recorded as written.
        `build` composes each UUID (`identity.build_uuid`; a caller may pass its own
        module's name for it, so that tests can observe the moment of stamping)."""
        self.check_open("publish in")
        if n < 1:
            raise ValueError(f"{self.label}: issue at least one message UUID, not {n}")
        if self.producer is None:
            self.producer = new_producer_id()
        clock = self.clock
        if self.realtime:
            clock.update()
        clocks = [clock.tick() for _ in range(n)]
        self.note(clocks[0], clocks[-1])
        producer = self.producer
        return [build(producer, c, CONTINUE_TXN) for c in clocks]

    def note(self, first: int, last: int | None = None, producer: bytes | None = None) -> None:
        """Record messages stamped elsewhere at clocks `first`..`last` (default `first`),
        of `producer` (default: the transaction's; the first one noted becomes it): the
        Publisher's hot path stamps its own, a node checks a client's."""
        if self.state is not TxnState.OPEN:
            raise _misuse(self.label, self.state, "publish in", self.keepalive)
        if last is None:
            last = first
        if producer is not None and producer != self.producer:
            if self.producer is not None:
                raise TransactionError(
                    f"{self.label}: messages of producer {producer.hex()} in a transaction "
                    f"of producer {self.producer.hex()}"
                )
            self.producer = producer
        if not 0 < first <= last or first <= self.last_clock:
            raise TransactionError(
                f"{self.label}: message clocks {first}..{last} do not grow past the "
                f"transaction's last clock {self.last_clock}"
            )
        if not self.first_clock:
            self.first_clock = first
        self.last_clock = last

    def touch(self) -> None:
        """Something was sent: push the keepalive's deadline back (if it has one)."""
        if self.keepalive is not None:
            self.keepalive.touch()

    def stop_keepalive(self) -> None:
        """Stop the keepalive timer (it will not call back), leaving the state as it is."""
        if self.keepalive is not None:
            self.keepalive.close()

    def commit_uuid(self) -> uuid.UUID:
        """The ACK_TXN committing every message: at the next clock tick (after moving the
        clock to now, if `realtime`), and never below `last_clock`. The state stays OPEN
        until the caller, having appended (or sent) it, calls `finish(COMMITTED)`."""
        self.check_open("commit")
        if self.producer is None:
            raise TransactionError(f"{self.label} has no producer yet: nothing to commit")
        clock = self.clock
        if self.realtime:
            clock.update()
        tick = clock.tick()
        self.ack_clock = tick if tick > self.last_clock else self.last_clock
        return build_uuid(self.producer, self.ack_clock, ACK_TXN)

    def rollback_uuid(self) -> uuid.UUID | None:
        """The ACK_TXN discarding every message (`rollback_clock(first_clock, acked)`), or
        None if none was written (nothing to roll back). Issued again, it is the same UUID
        (a copy of a rollback changes nothing); refused once COMMITTED."""
        if self.state is TxnState.COMMITTED:
            raise _misuse(self.label, self.state, "roll back", self.keepalive)
        if not self.first_clock or self.producer is None:
            return None
        self.ack_clock = rollback_clock(self.first_clock, self.acked)
        return build_uuid(self.producer, self.ack_clock, ACK_TXN)

    def finish(self, state: TxnState) -> None:
        """Leave OPEN for `state` (the caller appended, or sent, the ACK deciding it) and
        stop the keepalive. Finishing again the same way changes nothing (a rolled-back or
        expired transaction rolled back again included); any other change is refused:
        TransactionExpired for a commit of an expired one, else TransactionError."""
        if state is TxnState.OPEN:
            raise ValueError(f"{self.label}: finish in a final state, not {state}")
        if self.state is TxnState.OPEN:
            self.state = state
            self.stop_keepalive()
            return
        if self.state is state or (
            state is TxnState.ROLLED_BACK and self.state is TxnState.EXPIRED
        ):
            return
        action = "commit" if state is TxnState.COMMITTED else "roll back"
        raise _misuse(self.label, self.state, action, self.keepalive)
