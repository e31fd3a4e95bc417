"""Publisher: maps, stamps and appends messages, committed or inside transactions.

Committed messages (Flags.OUTSIDE_TXN) are visible to read-committed readers at
once. Uncommitted ones (Flags.CONTINUE_TXN) stay invisible until an ACK_TXN
acknowledgement from the same producer commits them; an acknowledgement that
re-asserts an earlier clock rolls them back. Semantics follow Gazette's
`message.Publisher`.
"""

from __future__ import annotations

import threading
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

from oncelog.framing import Framing, for_content_type
from oncelog.mapping import PartitionSpec, content_type_of
from oncelog.message import Clock, Flags, Message, build_uuid, new_producer_id

if TYPE_CHECKING:
    from oncelog.journal import AppendResult, AsyncAppend, JournalClient

__all__ = ["Publisher", "AckIntent", "TransactionError", "Mapping"]

Mapping = Callable[[Any], "tuple[str, str]"]
"""A mapping picks a message's journal: `mapping(msg) -> (journal_name, content_type)`."""


class TransactionError(RuntimeError):
    """A transaction could not be committed; its messages were rolled back where possible."""


@dataclass(frozen=True, slots=True)
class AckIntent:
    """A framed ACK_TXN acknowledgement and the journal it must be appended to."""

    journal: str
    intent: bytes


@dataclass(slots=True)
class _Pending:
    """What a transaction wrote to one journal: its first clock and an ACK template."""

    ack: Message
    framing: Framing
    first_clock: int


class Publisher:
    """Publishes messages to journals under one random producer ID.

    `publish_committed` is safe from many threads; transactional publishing
    (`publish_uncommitted`, `build_ack_intents`, `transaction`) belongs to one
    thread at a time, as in Gazette.
    """

    def __init__(self, client: "JournalClient", clock: Clock | None = None) -> None:
        self.client = client
        self._auto_clock = clock is None
        self.clock = Clock() if clock is None else clock
        self.producer_id = new_producer_id()
        self._pending: dict[str, _Pending] = {}
        # Per journal, the clock a read-committed reader last saw acknowledged from us:
        # a rollback re-asserts it.
        self._acked: dict[str, int] = {}
        self._outstanding: deque[AsyncAppend] = deque()
        self._lock = threading.Lock()
        self._in_transaction = False

    # -- publishing ------------------------------------------------------------------

    def publish_committed(self, mapping: Mapping, msg: Message) -> "AsyncAppend":
        """Append `msg` for immediate read-committed delivery (Flags.OUTSIDE_TXN)."""
        journal, _, clock, append = self._publish(mapping, msg, Flags.OUTSIDE_TXN)
        with self._lock:
            if clock > self._acked.get(journal, 0):
                self._acked[journal] = clock
        return append

    def publish_uncommitted(self, mapping: Mapping, msg: Message) -> "AsyncAppend":
        """Append `msg` as part of the open transaction (Flags.CONTINUE_TXN).

        It is delivered to read-committed readers only once an acknowledgement
        from `build_ack_intents` (or `transaction()`'s commit) is appended.
        """
        journal, framing, clock, append = self._publish(mapping, msg, Flags.CONTINUE_TXN)
        if journal not in self._pending:
            self._pending[journal] = _Pending(msg.new_acknowledgement(journal), framing, clock)
        return append

    def broadcast(self, partitions: Callable[[], Sequence[PartitionSpec]], msg: Message) -> list["AsyncAppend"]:
        """Publish `msg`, committed, to every journal of `partitions()`."""
        return [
            self.publish_committed(lambda _m, p=part: (p.name, content_type_of(p)), msg)
            for part in partitions()
        ]

    def _publish(
        self, mapping: Mapping, msg: Message, flags: Flags
    ) -> tuple[str, Framing, int, "AsyncAppend"]:
        if self._auto_clock:
            self.clock.update()
        validate = getattr(msg, "validate", None)
        if validate is not None:
            validate()  # raises: the message is not published
        journal, content_type = mapping(msg)
        if flags is Flags.OUTSIDE_TXN and journal in self._pending:
            raise TransactionError(
                f"journal {journal!r} has uncommitted messages of this publisher: a committed "
                "message there would roll them back (Gazette's sequencing); commit or roll "
                "back first"
            )
        framing = for_content_type(content_type)
        append = self.client.start_append(journal)
        try:
            # The UUID is stamped only while holding the journal's append order, so
            # clocks increase in journal order even under concurrent publishing.
            clock = self.clock.tick()
            msg.set_uuid(build_uuid(self.producer_id, clock, flags))
            append.write(framing.marshal(msg))
        finally:
            append.release()
        self._track(append)
        return journal, framing, clock, append

    def _track(self, append: "AsyncAppend") -> None:
        with self._lock:
            outstanding = self._outstanding
            outstanding.append(append)
            while outstanding and outstanding[0].done():
                outstanding.popleft()

    # -- transactions ------------------------------------------------------------------

    def pending_journals(self) -> list[str]:
        """Journals written by publish_uncommitted since the last acknowledgement."""
        return list(self._pending)

    def build_ack_intents(self) -> list[AckIntent]:
        """One framed ACK_TXN per journal written uncommitted since the last call.

        The caller appends them (after checkpointing them, for atomicity across
        journals: see oncelog.consumer). The transaction's messages are committed
        once the intents are appended.
        """
        intents = self._build_intents(rollback=False)
        return intents

    def build_rollback_intents(self) -> list[AckIntent]:
        """ACKs that re-assert each journal's last acknowledged clock, discarding the
        pending messages published uncommitted since the last acknowledgement."""
        return self._build_intents(rollback=True)

    def _build_intents(self, *, rollback: bool) -> list[AckIntent]:
        intents = []
        for journal, pending in self._pending.items():
            if rollback:
                # Equal to the reader's last-ACK clock for us in this journal (or to
                # the clock just before our first message there): an ACK_ROLLBACK.
                clock = self._acked.get(journal, pending.first_clock - 1)
            else:
                clock = self.clock.tick()
                with self._lock:
                    self._acked[journal] = clock
            pending.ack.set_uuid(build_uuid(self.producer_id, clock, Flags.ACK_TXN))
            intents.append(AckIntent(journal, pending.framing.marshal(pending.ack)))
        self._pending.clear()
        return intents

    def append_intents(self, intents: Iterable[AckIntent]) -> list["AppendResult"]:
        """Append ACK intents and wait until all are durable."""
        appends = []
        for intent in intents:
            append = self.client.start_append(intent.journal)
            try:
                append.write(intent.intent)
            finally:
                append.release()
            appends.append(append)
        return [a.result() for a in appends]

    @contextmanager
    def transaction(self) -> Iterator["Publisher"]:
        """Publish uncommitted inside the block; commit on exit, roll back on exception.

        Commit waits for the transaction's messages, then appends and waits for its
        ACKs. Each journal's ACK is atomic, but a crash between the ACKs of several
        journals can commit some and not others: use a consumer (which checkpoints
        its intents first) where atomicity across journals matters.
        """
        if self._in_transaction:
            raise TransactionError("a transaction is already open on this publisher")
        if self._pending:
            raise TransactionError(
                "publish_uncommitted was used outside a transaction; "
                f"acknowledge journals {sorted(self._pending)} first"
            )
        self._in_transaction = True
        try:
            try:
                yield self
                self.flush()
            except BaseException:
                self.rollback()
                raise
            self.append_intents(self.build_ack_intents())
        finally:
            self._in_transaction = False

    def rollback(self) -> None:
        """Discard messages published uncommitted since the last acknowledgement."""
        if self._pending:
            self.append_intents(self.build_rollback_intents())

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every message this publisher appended is durable (raises the first failure)."""
        with self._lock:
            outstanding = list(self._outstanding)
            self._outstanding.clear()
        for append in outstanding:
            append.result(timeout)
