"""Publisher: maps, stamps and appends messages, committed or inside transactions.

Committed messages (Flags.OUTSIDE_TXN) are visible to read-committed readers at
once. Uncommitted ones (Flags.CONTINUE_TXN) stay invisible until an ACK_TXN
acknowledgement from the same producer commits them; an acknowledgement that
re-asserts an earlier clock rolls them back. Semantics follow Gazette's
`message.Publisher`.
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

from oncelog import _bulkframing
from oncelog.errors import FencedOut, TransactionError, TransactionExpired
from oncelog.framing import Framing, for_content_type
from oncelog.framing.base import EncodeError
from oncelog.framing.base import registered_get as _framing_of
from oncelog.framing.jsonlines import JSONFraming
from oncelog.intents import AckIntent, start_intents
from oncelog.journal.appender import Lane, Outstanding, appender_of, first_failure
from oncelog.journal.errors import AppendFailed
from oncelog.mapping import PartitionSpec, content_type_of
from oncelog.message import (
    Clock,
    Flags,
    JSONMessage,
    Message,
    build_uuid,
    new_producer_id,
    uuid_text,
)
from oncelog.producer_transaction import (
    Keepalive,
    ProducerTransaction,
    TxnState,
    keepalive_seconds,
    rollback_clock,
)

if TYPE_CHECKING:
    from oncelog.journal import AppendResult, AsyncAppend, JournalClient
    from oncelog.journal.appender import Appender
    from oncelog.transactions import TransactionalLog, TransactionRecord

__all__ = [
    "Publisher",
    "AckIntent",
    "TransactionError",
    "TransactionExpired",
    "FencedOut",
    "Mapping",
    "start_intents",
]

log = logging.getLogger(__name__)

RECOVERY_ATTEMPTS = 8
_MASK64 = (1 << 64) - 1


_OUTSIDE_TXN = Flags.OUTSIDE_TXN
_CONTINUE_TXN = Flags.CONTINUE_TXN

Mapping = Callable[[Any], "tuple[str, str]"]
"""A mapping picks a message's journal: `mapping(msg) -> (journal_name, content_type)`."""

Stamp = _bulkframing.Stamp
_stamp_failed = _bulkframing.stamp_failed
_OPEN = TxnState.OPEN


def _durable(append: AsyncAppend) -> bool:
    """Whether `append` is done and written (done() is true of a failed one too)."""
    if not append.done():
        return False
    try:
        append.result(0)
    except Exception:  # noqa: BLE001 - failed: not durable, whatever the error
        return False
    return True


@dataclass(slots=True)
class _Pending:
    """What a transaction wrote to one journal: an ACK template, and the journal's
    `ProducerTransaction` (clocks and state; guarded by the publisher's `_txn_lock`).

    `appender`: the client's appender of the journal (the one `client.start_append` gave
    the transaction's first message there, held by an open `transaction()`). `lane`: how
    `publish_uncommitted`'s fast path appends the journal's next JSONMessages (a `Lane` on
    `appender`: made by the publisher's `_stamper` with its producer ID, clock and
    CONTINUE_TXN, remembered in its `_outstanding`). None where the fast path never applies
    (a transactional id, a clock of the caller's, a framing other than exactly
    `JSONFraming`) or no longer does (the producer ID changed). Invariant: `lane` is not
    None only if `framing` is exactly a `JSONFraming`."""

    ack: Message
    framing: Framing
    txn: ProducerTransaction
    appender: Appender
    lane: Lane | None = None


@dataclass(slots=True)
class _Template:
    """An ACK template for a journal we ever wrote uncommitted, and the clock of our first
    message there: what a rollback re-asserts where we never acknowledged."""

    ack: Message
    framing: Framing
    first_clock: int


def _not_made(exc: BaseException) -> bool:
    """Whether a failed append certainly was not made (`AppendFailed.made` is False); an
    unknown outcome, or any other error, may have been made."""
    return isinstance(exc, AppendFailed) and exc.made is False


def _fixed_route(route: tuple[str, str]) -> Mapping:
    """A mapping sending every message to one journal."""
    return lambda _msg: route


class Publisher:
    """Publishes messages to journals under one random producer ID.

    `publish_committed` is safe from many threads; transactional publishing
    (`publish_uncommitted`, `build_ack_intents`, `transaction`) belongs to one
    thread at a time, as in Gazette.

    Commits are atomic across journals: a transaction over several journals records its
    ACK intents durably (`oncelog.transactions`) before appending the first ACK, so a crash
    leaves either nothing committed or a record that `oncelog txns recover` (or, with a
    `transactional_id`, the next instance with that id) rolls forward in every journal.
    A transaction over one journal commits with its ACK in the same append as its messages
    when they are still spooled (one fragment, one claim), the ACK never durable unless they
    all are (`_commit_fused`).

    With `transactional_id`, instances of one service take over from each other: a new
    instance finishes the last commit of the one before (rolls it forward), rolls back
    what that one left uncommitted, and fences it out: the older instance's next commit
    raises `FencedOut` and commits nothing. (A commit whose record the older instance had
    written when the new one took over is finished by the new one: it is committed, and the
    older instance reports it so, then raises `FencedOut` from its next use.) Creating such
    a publisher reads and writes the id's records (a few requests). Each commit then writes
    one record before its ACKs.
    """

    def __init__(
        self,
        client: "JournalClient",
        clock: Clock | None = None,
        *,
        transactional_id: str | None = None,
        keep_records: int = 10,
    ) -> None:
        self.client = client
        self._auto_clock = clock is None
        self.clock = Clock() if clock is None else clock
        self.producer_id = new_producer_id()
        # Per journal written uncommitted in the open transaction: its ProducerTransaction.
        self._pending: dict[str, _Pending] = {}
        # Per journal, the clock a read-committed reader last saw acknowledged from us:
        # a rollback re-asserts it.
        self._acked: dict[str, int] = {}
        # What flush and commits wait for: atomic operations, `add` without a lock; `take`
        # and `restore` under `_lock` (flush and pruning must not interleave).
        self._outstanding = Outstanding()
        self._lock = threading.Lock()
        self._in_transaction = False
        # Appenders of the journals the open transaction() wrote, held (`Appender.hold`) so
        # that its messages wait in the spool for its ACK: one fragment per commit.
        self._holding: list[Appender] = []
        # Guards the open transaction against its keepalive expiring it meanwhile.
        self._txn_lock = threading.RLock()
        self._keepalive: Keepalive | None = None
        self._expired: str | None = None
        self._broken: str | None = None  # a commit whose outcome is unknown: start anew
        self._fenced: str | None = None
        # With a transactional id: the id's record chain, the seq of our last record, and
        # an ACK template per journal we ever wrote uncommitted (rollbacks re-assert there).
        self.transactional_id = transactional_id
        self._log: TransactionalLog | None = None
        self._seq = 0
        self._templates: dict[str, _Template] = {}
        # What the fast path of publish_* stamps and frames JSONMessages with, chosen once
        # (None: every message takes the general path). It needs our own clock (it moves
        # as `Clock.advance`), no transactional id (no hook before a message), and a client
        # appending records made under its write lock (`_bulkframing.stamper`: the bytes,
        # UUID text and errors of stamping + `JSONFraming.marshal`).
        self._stamper: Stamp | None = None
        if (
            self._auto_clock
            and transactional_id is None
            and callable(getattr(client, "append_made", None))
        ):
            self._stamper = _bulkframing.stamper(self.clock)
        if transactional_id is not None:
            from oncelog.transactions import TransactionalLog

            self._log = TransactionalLog(client, transactional_id, keep_records)
            self._take_over()

    def __repr__(self) -> str:
        tid = self.transactional_id
        who = "" if tid is None else f", transactional_id={tid!r}"
        return f"Publisher({self.client!r}, producer={self.producer_id.hex()}{who})"

    @property
    def fenced(self) -> bool:
        """True once a newer instance with the same transactional id took over."""
        return self._fenced is not None

    # -- publishing ------------------------------------------------------------------

    def publish_committed(self, mapping: Mapping, msg: Message) -> "AsyncAppend":
        """Append `msg` for immediate read-committed delivery (Flags.OUTSIDE_TXN)."""
        if self._fenced or self._broken or self._expired:
            self._check_usable()
        stamp = self._stamper
        if stamp is None or type(msg) is not JSONMessage:
            return self._publish(mapping, msg, _OUTSIDE_TXN)[3]
        # The fast path (see `_stamper`): what `_publish` does, for a JSONMessage of a
        # JSON-lines journal, with the stamping and framing in one call under the lock.
        journal, content_type = mapping(msg)
        framing = _framing_of(content_type)
        doc = msg.doc
        if type(framing) is not JSONFraming or type(doc) is not dict or journal in self._pending:
            return self._publish_to(journal, content_type, msg, _OUTSIDE_TXN)[3]
        append, clock = self.client.append_made(
            journal, stamp, doc, msg.uuid_field, self.producer_id, self.clock, _OUTSIDE_TXN,
            _stamp_failed,
        )
        self._track(append, journal, clock)
        return append

    def publish_uncommitted(self, mapping: Mapping, msg: Message) -> "AsyncAppend":
        """Append `msg` as part of the open transaction (Flags.CONTINUE_TXN).

        It is delivered to read-committed readers only once an acknowledgement
        from `build_ack_intents` (or `transaction()`'s commit) is appended.

        A JSONMessage to a JSON-lines journal this transaction already wrote takes a fast
        path (`_Pending.lane`): the same checks, clock, bytes, errors and bookkeeping as
        the general path, with the per-journal work done once, at the transaction's first
        message there, and the stamping, framing and append made in one call each.
        """
        txn_lock = self._txn_lock
        txn_lock.acquire()
        try:
            if self._fenced or self._broken or self._expired:
                self._check_usable()
            if type(msg) is not JSONMessage or self._stamper is None:
                # _before_uncommitted matters only with a transactional id.
                before = None if self._log is None else self._before_uncommitted
                journal, framing, clock, append = self._publish(
                    mapping, msg, _CONTINUE_TXN, before
                )
            else:
                # A JSONMessage with our own clock and no transactional id: `_publish`
                # would call the mapping first thing, as here.
                journal, content_type = mapping(msg)
                pending = self._pending.get(journal)
                doc = msg.doc
                made: tuple[AsyncAppend, int] | None
                if (
                    pending is not None
                    and (lane := pending.lane) is not None
                    and _framing_of(content_type) is pending.framing
                    and type(doc) is dict
                    # Stamped, framed, appended and tracked (`_track`) in one call, unless
                    # the appender is no longer the one `client.start_append(journal)`
                    # would give (None: `appender.reusable` is false; the client closes it
                    # when the journal is deleted or the client closed, and a deletion
                    # elsewhere makes its index stale). Not the transaction's first
                    # message in the journal: its appender is held already (`_hold`), and
                    # the framing is the one it was opened with.
                    and (made := lane.append(doc, msg.uuid_field)) is not None
                ):
                    append, clock = made
                    txn = pending.txn
                    if clock > txn.last_clock and txn.state is _OPEN:
                        txn.last_clock = clock  # what txn.note(clock) does here
                    else:
                        txn.note(clock)  # raises, as on the general path
                    if self._keepalive is not None:
                        self._keepalive.touch()
                    return append
                journal, framing, clock, append = self._publish_to(
                    journal, content_type, msg, _CONTINUE_TXN
                )
            pending = self._pending.get(journal)
            if pending is None:
                self._open_journal(journal, framing, msg, clock, clock, appender_of(append))
            else:
                pending.txn.note(clock)
            if self._keepalive is not None:
                self._keepalive.touch()
            return append
        finally:
            txn_lock.release()

    def _open_journal(
        self,
        journal: str,
        framing: Framing,
        msg: Message,
        first: int,
        last: int,
        appender: "Appender",
    ) -> None:
        """Our first uncommitted messages in `journal` in this transaction (clocks `first`
        ..`last`, appended on `appender`) open its ProducerTransaction (caller holds
        _txn_lock)."""
        txn = ProducerTransaction(
            self.producer_id,
            self.clock,
            realtime=False,  # the clock is ours to drive: no clock of now is forced in
            acked=self._acked.get(journal),
            label=f"the transaction of producer {self.producer_id.hex()} in journal "
            f"{journal!r}",
        )
        txn.note(first, last)
        ack = msg.new_acknowledgement(journal)
        lane = None
        if self._stamper is not None and type(framing) is JSONFraming:
            lane = Lane(
                appender,
                self._stamper,
                (self.producer_id, self.clock, _CONTINUE_TXN, _stamp_failed),
                self._outstanding,
                self._prune,
            )
        self._pending[journal] = _Pending(ack, framing, txn, appender, lane)
        if journal not in self._templates:
            self._templates[journal] = _Template(ack, framing, first)

    def _before_uncommitted(self, journal: str, framing: Framing, msg: Message) -> None:
        """With a transactional id, name a journal in our records before its first
        uncommitted message, so a successor can roll our leftovers back there."""
        if self._log is None or journal in self._templates:
            return
        # Reserve a clock: our first message there takes the next one, so a reader's
        # sequencer starts us at exactly this clock, and the rollback ACK re-asserts it
        # (an ACK below where a reader started a producer would be logged as an error).
        reserved = self.clock.tick()
        self._templates[journal] = _Template(
            msg.new_acknowledgement(journal), framing, reserved + 1
        )
        try:
            self._write_record("journals", [])
        except BaseException:
            del self._templates[journal]
            raise

    def broadcast(
        self, partitions: Callable[[], Sequence[PartitionSpec]], msg: Message
    ) -> list["AsyncAppend"]:
        """Publish `msg` to every journal of `partitions()`, atomically: all journals or
        none. Outside a transaction it is one transaction of its own (durable and committed
        on return); inside one, it is part of that transaction."""
        routes = [(p.name, content_type_of(p)) for p in partitions()]

        def publish_all() -> list["AsyncAppend"]:
            return [self.publish_uncommitted(_fixed_route(route), msg) for route in routes]

        if self._in_transaction:
            return publish_all()
        with self.transaction():
            appends = publish_all()
        return appends

    def append_messages(
        self, mapping: Mapping, messages: Iterable[Message]
    ) -> list["AppendResult"]:
        """Publish a batch of messages, to any number of journals, as one atomic
        transaction (or as part of the open one); returns where each landed, once durable
        (and, outside a transaction, committed)."""
        if self._in_transaction:
            appends = [self.publish_uncommitted(mapping, m) for m in messages]
            return [a.result() for a in appends]
        with self.transaction():
            appends = [self.publish_uncommitted(mapping, m) for m in messages]
        return [a.result() for a in appends]

    def publish_many(
        self,
        mapping: Mapping,
        messages: Iterable[Any],
        *,
        committed: bool | None = None,
    ) -> list["AsyncAppend"]:
        """Publish many messages with one append per journal, stamped and framed in bulk.

        `messages` are JSON documents (dicts, or `JSONMessage`s) or any other `Message`;
        `mapping` is called with each as given. `committed`: True stamps them
        `OUTSIDE_TXN` (as `publish_committed`), False `CONTINUE_TXN` (as
        `publish_uncommitted`: part of the open transaction), None (the default) picks
        False inside `transaction()` and True outside.

        Per journal, the messages take consecutive clocks under one producer and flags and
        are written as ONE append (never split across fragments): a crash leaves all of a
        journal's part or none of it. Committed over several journals, each journal's part
        is atomic on its own; inside a transaction, the transaction is atomic as a whole.
        To JSON-lines journals the UUID text is formatted straight into the frames (the C
        path, `oncelog._bulk`, encodes the whole batch with one `orjson.dumps`), which are
        byte for byte what `publish_*` of the same documents at the same clocks write.
        Unlike `publish_*`, the documents are NOT modified (no UUID field is set in them);
        other messages are stamped with `set_uuid` and marshalled one by one, still into
        one append per journal.

        Nothing is appended if a message fails `validate()`, a mapping fails, or a JSON
        batch is not all dicts (EncodeError); an encoding error in one journal's part
        leaves the parts of journals before it appended. Safe from many threads when
        committed (as `publish_committed`); uncommitted, it belongs to the transaction's
        thread. Returns one `AsyncAppend` per journal, in the order of first appearance.
        """
        items = messages if type(messages) is list else list(messages)
        if not items:
            return []
        if committed is None:
            committed = not self._in_transaction
        if committed:
            self._check_usable()
            return self._publish_many(mapping, items, Flags.OUTSIDE_TXN)
        with self._txn_lock:
            self._check_usable()
            appends = self._publish_many(mapping, items, Flags.CONTINUE_TXN)
            if self._keepalive is not None:
                self._keepalive.touch()
            return appends

    def _publish_many(
        self, mapping: Mapping, items: list[Any], flags: Flags
    ) -> list["AsyncAppend"]:
        for item in items:
            if type(item) is not dict and type(item) is not JSONMessage:
                validate = getattr(item, "validate", None)
                if validate is not None:
                    validate()  # raises: nothing is published
        routes = list(map(mapping, items))
        first_route = routes[0]
        if type(first_route) is not tuple:  # a list, say: group by a hashable route
            routes = [(journal, content_type) for journal, content_type in routes]
            first_route = routes[0]
        groups: dict[tuple[str, str], list[Any]]
        if routes.count(first_route) == len(routes):
            groups = {first_route: items}
        else:
            groups = {}
            for route, item in zip(routes, items):
                group = groups.get(route)
                if group is None:
                    groups[route] = [item]
                else:
                    group.append(item)
        plans = []
        for (journal, content_type), group in groups.items():
            if flags is Flags.OUTSIDE_TXN and journal in self._pending:
                raise TransactionError(
                    f"journal {journal!r} has uncommitted messages of this publisher: a "
                    "committed message there would roll them back (Gazette's sequencing); "
                    "commit or roll back first"
                )
            framing = _framing_of(content_type) or for_content_type(content_type)
            plans.append((journal, framing, self._bulk_form(journal, framing, group)))
        appends = []
        for journal, framing, (docs, key, template) in plans:
            if self._auto_clock:
                self.clock.update()
            if flags is Flags.CONTINUE_TXN:
                self._before_uncommitted(journal, framing, template)
            append = self.client.start_append(journal)
            try:
                # Clocks are taken only while holding the journal's append order (as in
                # _publish), so they increase in journal order under concurrent publishing.
                first = self.clock.reserve(len(docs))
                if key is not None:
                    data = _bulkframing.frame_json(docs, key, self.producer_id, first, flags)
                else:
                    data = self._marshal_each(framing, docs, first, flags)
                append.write(data)
            except BaseException:
                append.abort()
                raise
            append.release()
            self._track(append)
            last = first + len(docs) - 1
            if flags is Flags.OUTSIDE_TXN:
                with self._lock:
                    if last > self._acked.get(journal, 0):
                        self._acked[journal] = last
            else:
                pending = self._pending.get(journal)
                if pending is None:
                    self._open_journal(
                        journal, framing, template, first, last, appender_of(append)
                    )
                else:
                    pending.txn.note(first, last)
            appends.append(append)
        return appends

    @staticmethod
    def _bulk_form(
        journal: str, framing: Framing, group: list[Any]
    ) -> tuple[list[Any], str | None, Message]:
        """(documents or messages, the UUID field if they are JSON documents framed in bulk
        else None, a message to build ACKs from) of one journal's part of a batch."""
        first = group[0]
        if isinstance(framing, JSONFraming):
            if type(first) is dict:
                key = framing.uuid_field
                if all(type(d) is dict for d in group):
                    return group, key, JSONMessage({}, key)
            elif type(first) is JSONMessage:
                key = first.uuid_field
                docs = [m.doc for m in group if type(m) is JSONMessage and m.uuid_field == key]
                if len(docs) == len(group):
                    return docs, key, first
            for index, item in enumerate(group):
                if not isinstance(item, (dict, JSONMessage)):
                    raise EncodeError(
                        f"publish_many to journal {journal!r}: message {index} is a "
                        f"{type(item).__name__}, not a dict or a JSONMessage: a JSON frame "
                        "must be an object; nothing was published"
                    )
            # Mixed dicts and messages, or several UUID fields: one at a time.
            messages = [d if isinstance(d, JSONMessage) else JSONMessage(d) for d in group]
            return messages, None, messages[0]
        for index, item in enumerate(group):
            if not isinstance(item, Message):
                raise TypeError(
                    f"publish_many to journal {journal!r} ({framing.content_type}): message "
                    f"{index} is a {type(item).__name__}, not a Message; nothing was published"
                )
        return group, None, first

    def _marshal_each(self, framing: Framing, messages: list[Any], first: int, flags: int) -> bytes:
        """Stamp and marshal messages one at a time (framings without a bulk path)."""
        producer = self.producer_id
        parts = []
        for i, msg in enumerate(messages):
            clock = (first + i) & _MASK64
            if type(msg) is JSONMessage:
                msg.doc[msg.uuid_field] = _bulkframing.format_uuid(producer, clock, flags)
            else:
                msg.set_uuid(build_uuid(producer, clock, flags))
            parts.append(framing.marshal(msg))
        return b"".join(parts)

    def _publish(
        self,
        mapping: Mapping,
        msg: Message,
        flags: Flags,
        before: Callable[[str, Framing, Message], None] | None = None,
    ) -> tuple[str, Framing, int, "AsyncAppend"]:
        # The general path of every publish (`publish_*` take a faster one for most
        # JSONMessages). With a transactional id, `before` may reserve a clock for the
        # journal's first message: the clock moves to now before that (else together with
        # the tick).
        if self._auto_clock and self._log is not None:
            self.clock.update()
        if type(msg) is not JSONMessage:
            validate = getattr(msg, "validate", None)
            if validate is not None:
                validate()  # raises: the message is not published
        journal, content_type = mapping(msg)
        return self._publish_to(journal, content_type, msg, flags, before)

    def _publish_to(
        self,
        journal: str,
        content_type: str,
        msg: Message,
        flags: Flags,
        before: Callable[[str, Framing, Message], None] | None = None,
    ) -> tuple[str, Framing, int, "AsyncAppend"]:
        """`_publish` once the message is validated and mapped to (journal, content_type)."""
        advance = self._auto_clock and self._log is None
        json = type(msg) is JSONMessage
        committed = flags is _OUTSIDE_TXN
        if committed and journal in self._pending:
            raise TransactionError(
                f"journal {journal!r} has uncommitted messages of this publisher: a committed "
                "message there would roll them back (Gazette's sequencing); commit or roll "
                "back first"
            )
        # The registry's keys are normalized content types: a hit is what for_content_type
        # would find; anything else takes the full lookup.
        framing = _framing_of(content_type) or for_content_type(content_type)
        if before is not None:
            before(journal, framing, msg)
        append = self.client.start_append(journal)
        try:
            if not committed and self._in_transaction and journal not in self._pending:
                self._hold(append)  # the transaction's first message in this journal
            # The UUID is stamped only while holding the journal's append order, so
            # clocks increase in journal order even under concurrent publishing.
            clock = self.clock.advance() if advance else self.clock.tick()
            if json:
                native = _bulkframing.native
                msg.doc[msg.uuid_field] = (  # type: ignore[attr-defined]
                    native.format_uuid(self.producer_id, clock, flags)
                    if native is not None
                    else uuid_text(self.producer_id, clock, flags)
                )
            else:
                msg.set_uuid(build_uuid(self.producer_id, clock, flags))
            append.write(framing.marshal(msg))
        finally:
            append.release()
        self._track(append, journal if committed else None, clock)
        return journal, framing, clock, append

    def _hold(self, append: "AsyncAppend") -> None:
        """Hold the appender of `append` until the open transaction ends (its messages then
        wait for its ACK in the spool instead of being written as soon as the writer is
        free; see oncelog.journal.appender). Called holding the append's write lock, before
        it is released, so that not even the first message is written alone."""
        appender = appender_of(append)
        if appender not in self._holding:
            appender.hold()
            self._holding.append(appender)

    def _unhold_all(self) -> None:
        """The transaction ended: release the appenders it held."""
        holding, self._holding = self._holding, []
        for appender in holding:
            appender.unhold()

    def _track(
        self, append: "AsyncAppend", committed_to: str | None = None, clock: int = 0
    ) -> None:
        """Remember `append` until it is durable (`flush`, commits), and, for a committed
        message at `clock` to journal `committed_to`, that it acknowledges the journal up
        to there. Every publish ends here.

        `_outstanding` keeps the latest append of each batch, one entry per fragment rather
        than one per message (appends in one batch share one fragment and one outcome, and
        tracked appends are released, never aborted)."""
        if self._outstanding.add(append):
            self._prune()
        if committed_to is not None:
            with self._lock:
                if clock > self._acked.get(committed_to, 0):
                    self._acked[committed_to] = clock

    def _prune(self) -> None:
        """Forget the appends already durable from the front of `_outstanding`. Done in bulk,
        once it outgrows its bound, rather than per publish: the bound doubles while appends
        stay pending, and shrinks back once they are done. A failed append is kept (it is
        done too): the next `flush` or commit must still report it."""
        with self._lock:
            taken = self._outstanding.take()
            first = 0
            while first < len(taken) and _durable(taken[first]):
                first += 1
            self._outstanding.restore(taken[first:])

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
            txn = pending.txn
            if rollback:
                ack = txn.rollback_uuid()
                assert ack is not None  # a pending journal has messages
                txn.finish(TxnState.ROLLED_BACK)
            else:
                ack = txn.commit_uuid()
                txn.finish(TxnState.COMMITTED)
                with self._lock:
                    self._acked[journal] = txn.ack_clock
            pending.ack.set_uuid(ack)
            intents.append(AckIntent(journal, pending.framing.marshal(pending.ack)))
        self._pending.clear()
        return intents

    def append_intents(self, intents: Iterable[AckIntent]) -> list["AppendResult"]:
        """Append ACK intents and wait until all are durable."""
        return [a.result() for a in start_intents(self.client, intents) if a is not None]

    @contextmanager
    def transaction(
        self, keepalive: float | timedelta | None = None
    ) -> Iterator["Publisher"]:
        """Publish uncommitted inside the block; commit on exit, roll back on exception.

        Commit makes the transaction's messages durable and commits them in every journal
        written, atomically (see the class docstring): over one journal the ACK is enqueued
        behind the messages and written with them; over several, after them. A failed
        commit raises AppendFailed when nothing was committed. `keepalive`: a transaction that
        publishes nothing for that long is rolled back by itself; publishing in it, or
        leaving the block, then raises `TransactionExpired`.

        Raises `FencedOut` (committing nothing) when a newer instance with the same
        transactional id took over, and TransactionError when the commit's outcome is
        unknown (its record may exist and be rolled forward later): this publisher then
        refuses further transactions; make a new one. A commit whose record the newer
        instance took over is committed: it returns normally, and `fenced` is True (the
        next transaction raises `FencedOut`).
        """
        if self._in_transaction:
            raise TransactionError("a transaction is already open on this publisher")
        if self._pending:
            raise TransactionError(
                "publish_uncommitted was used outside a transaction; "
                f"acknowledge journals {sorted(self._pending)} first"
            )
        self._check_usable()
        seconds = keepalive_seconds(keepalive)
        if seconds is not None and not seconds > 0:
            raise ValueError(f"keepalive must be a positive duration, not {keepalive!r}")
        self._in_transaction = True
        self._expired = None
        if seconds is not None:
            self._keepalive = Keepalive(seconds, lambda: self._expire(seconds))
        try:
            try:
                yield self
                held = self._flush_for_commit()
            except BaseException:
                with self._txn_lock:
                    self._stop_keepalive()
                    if self._expired is None and self._fenced is None:
                        self.rollback()
                raise
            with self._txn_lock:
                self._stop_keepalive()
                if self._expired is not None:
                    raise TransactionExpired(self._expired)
                self._commit(held)
        finally:
            self._stop_keepalive()
            self._in_transaction = False
            self._unhold_all()

    def _stop_keepalive(self) -> None:
        """Stop the keepalive timer without waiting for its thread: it may be blocked in
        `_expire` on `_txn_lock`, held by our caller; `_expire` then finds no keepalive and
        returns."""
        keepalive, self._keepalive = self._keepalive, None
        if keepalive is not None:
            keepalive.close()

    def _expire(self, seconds: float) -> None:
        """The keepalive fired: roll the open transaction back (from the keepalive thread)."""
        with self._txn_lock:
            if not self._in_transaction or self._keepalive is None:
                return  # committed or rolled back meanwhile
            self._keepalive = None
            self._expired = (
                f"{self!r}: the transaction published nothing for its keepalive of "
                f"{seconds:g} s and was rolled back"
            )
            log.warning("%s", self._expired)
            try:
                self.rollback()
            except Exception as exc:  # noqa: BLE001 - readers drop them anyway: never ACKed
                log.warning("%r: rolling back the expired transaction failed: %s", self, exc)
                self._pending.clear()

    def _check_usable(self) -> None:
        if self._fenced is not None:
            raise FencedOut(self._fenced)
        if self._expired is not None and self._in_transaction:
            raise TransactionExpired(self._expired)
        if self._broken is not None:
            raise TransactionError(self._broken)

    def _flush_for_commit(self) -> list["AsyncAppend"] | None:
        """Before a commit: wait until what this publisher appended is durable (raising the
        first failure: the transaction is then rolled back), except, when the commit can be
        fused (one journal written, no transactional id), the appends to that journal. Those
        are returned, still in flight: the commit's ACK is enqueued behind them on the same
        appender and waited for with them (`_commit_fused`). None: everything was waited for.
        """
        if self._log is not None or len(self._pending) != 1:
            self.flush()
            return None
        (journal,) = self._pending
        with self._lock:
            outstanding = self._outstanding.take()
        held = []
        for append in outstanding:
            if append.journal == journal:
                held.append(append)
            else:
                append.result()  # another journal: durable before the commit, as before
        return held

    def _commit(self, held: list["AsyncAppend"] | None = None) -> None:
        """Commit the open transaction (caller holds _txn_lock). The messages are durable,
        unless `held` lists the appends of the one journal written still in flight (from
        `_flush_for_commit`): the ACK then joins them (`_commit_fused`)."""
        from oncelog.transactions import (
            TransactionRecord,
            append_intents,
            retire,
            settle,
            write_pending,
        )

        journals = sorted(self._pending)
        intents = self.build_ack_intents()
        if held is not None and self._log is None and len(intents) == 1:
            self._commit_fused(intents[0], held)
            return
        for append in held or ():
            append.result()
        if self._log is not None:
            self._write_record("commit", intents)  # FencedOut: no ACK is appended
            self._finish(intents, append_intents, "the next instance with its id")
            return
        if len(intents) <= 1:
            self.append_intents(intents)  # one journal: one atomic append
            return
        record = TransactionRecord("commit", intents, self.producer_id, self.clock.value)
        try:
            record = write_pending(self.client, record)
        except BaseException as exc:
            # The record may exist (a reply lost for good): a recoverer may append our
            # ACKs at any time from now on, so this producer ID must never publish again.
            self._rotate_producer()
            raise TransactionError(
                f"{self!r}: the commit over journals {journals} has an unknown outcome: "
                f"its record could not be written ({exc}); `oncelog txns recover` finishes "
                "it if the record exists, else nothing was committed"
            ) from exc
        self._finish(intents, append_intents, "`oncelog txns recover`")
        try:
            if settle(self.client, record, "publisher"):
                retire(self.client, record)
            else:
                # A recoverer took the record: it may re-append our ACKs after we publish
                # again, which would roll back newer messages of this producer ID.
                self._rotate_producer()
        except Exception as exc:  # noqa: BLE001 - committed; the record is only left over
            log.warning("%r: retiring transaction record %s failed: %s", self, record.path, exc)
            self._rotate_producer()

    def _commit_fused(self, intent: AckIntent, held: list["AsyncAppend"]) -> None:
        """Commit a transaction over one journal with its ACK in the same append as its
        messages, when they are still spooled (the common case): one fragment, one claim,
        one fsync for the lot. Messages already forced out (a transaction larger than a
        fragment, an explicit flush) are in earlier fragments; the ACK is then enqueued
        behind them and written after them, as a separate append.

        Invariant: the ACK is never durable unless every message before it is, at lower
        offsets. The ACK is enqueued on the appender of the journal behind `held` (this
        publisher's appends there, the transaction's messages among them), and the appender
        fails, unwritten, every append started before a batch's failure is recorded
        (`oncelog.journal.appender`). So, holding the ACK's write lock, a message that
        already failed is seen failed here (and the ACK is dropped), and one that fails
        later fails the ACK's batch too (or shares its fragment, and its fate).

        The outcome reported is the true one. Committed: returns. Not committed (a message
        or the ACK was not made, or the ACK was queued behind a failed message): raises
        AppendFailed saying nothing was committed. The ACK's fragment written with an
        unknown outcome (its claim may exist): raises TransactionError saying so. Either
        way the publisher continues under a new producer ID, so that no later ACK of this
        one commits messages of the failed transaction that did become durable."""
        journal = intent.journal
        where = f"{self!r}: the commit in journal {journal!r}"
        try:
            ack = self.client.start_append(journal)
        except BaseException as exc:
            self._rotate_producer()
            raise AppendFailed(
                f"{where} was not made: its ACK could not be started ({exc}); "
                "nothing was committed",
                made=False,
            ) from exc
        try:
            failed = first_failure(held, wait=False)  # a message known to have failed
            if failed is not None:
                raise failed
            ack.write(intent.intent)
        except BaseException as exc:
            ack.abort()
            self._rotate_producer()
            raise AppendFailed(
                f"{where} was not made: a message of the transaction could not be "
                f"appended ({exc}); its ACK was not appended: nothing was committed",
                made=False,
            ) from exc
        ack.release()
        message_error: BaseException | None = None
        ack_error: BaseException | None = None
        try:
            message_error = first_failure(held)
            try:
                ack.result()
            except AppendFailed as exc:
                ack_error = exc
        except BaseException:
            # Interrupted while waiting (KeyboardInterrupt, ...): the outcome is unknown.
            self._rotate_producer()
            raise
        if ack_error is None and message_error is None:
            return
        self._rotate_producer()
        if ack_error is None:
            # Not possible on one appender (see above): say what is durable.
            raise TransactionError(
                f"{where}: its ACK is durable but a message before it failed "
                f"({message_error}); the transaction is committed without that message"
            ) from message_error
        if message_error is not None and message_error is not ack_error:
            # The ACK was queued behind the failed message's batch: never written.
            raise AppendFailed(
                f"{where} was not made: a message of the transaction could not be "
                f"appended ({message_error}); the ACK queued behind it was not written: "
                "nothing was committed",
                made=False,
            ) from message_error
        # The ACK's own fragment failed (holding the messages too, if message_error).
        if _not_made(ack_error):
            raise AppendFailed(
                f"{where} was not made: the fragment holding its ACK could not be "
                f"written ({ack_error}): nothing was committed",
                made=False,
            ) from ack_error
        raise TransactionError(
            f"{where} has an unknown outcome: the fragment holding its ACK"
            f"{' and messages' if message_error is not None else ''} may or may not have "
            f"been claimed ({ack_error}); read the journal to know"
        ) from ack_error

    def _finish(self, intents: list[AckIntent], append: Any, who: str) -> None:
        """Append the ACKs of a recorded commit; on failure the commit stays durable in its
        record and is finished later by `who`."""
        try:
            append(self.client, intents)
        except Exception as exc:
            self._broken = (
                f"{self!r}: a commit is recorded but its ACKs could not all be appended "
                f"({exc}); it is committed, and {who} finishes it. Make a new publisher"
            )
            self._rotate_producer()
            raise TransactionError(self._broken) from exc

    def _rotate_producer(self) -> None:
        """Continue under a new producer ID (with no acknowledged clocks)."""
        with self._lock:
            self.producer_id = new_producer_id()
            self._acked = {}
        self._templates = {}
        for pending in self._pending.values():
            pending.lane = None  # stamped with the old ID: later messages take the general path

    # -- transactional ids ------------------------------------------------------------------

    def _take_over(self) -> None:
        """Become the owner of our transactional id: fence the previous instance by writing
        the record after its last one, then roll its last commit forward and its
        uncommitted leftovers back (both harmless if already done).

        The fence carries those ACKs (the previous record's intents and rollbacks) and is
        written before they are appended: killed at any point of this, we leave a newest
        record from which the next instance appends them again. We write no other record
        (the only writes that prune) before they are all durable."""
        assert self._log is not None
        for _ in range(RECOVERY_ATTEMPTS):
            seq, previous = self._log.latest()
            fence = self._log.fence(seq, previous, self.producer_id, self.clock.value)
            if self._log.write(seq + 1, fence):
                break
        else:
            raise FencedOut(
                f"{self!r} could not take over its transactional id: other instances wrote "
                f"{RECOVERY_ATTEMPTS} records meanwhile"
            )
        self._seq = seq + 1
        self._roll_forward(fence)

    def _roll_forward(self, fence: "TransactionRecord") -> None:
        """Append what our fence took over: the last commit's ACKs, then the rollbacks of
        what the previous instance(s) left uncommitted."""
        from oncelog.transactions import append_intents

        if fence.intents:
            log.info(
                "%r: rolling forward the commit of record %d of transactional id %r",
                self, fence.previous_seq, self.transactional_id,
            )
        append_intents(self.client, fence.intents)
        append_intents(self.client, fence.rollbacks)

    def _write_record(self, kind: str, intents: list[AckIntent]) -> None:
        """Write our next record (caller holds _txn_lock); FencedOut if another instance
        of our id wrote one first.

        A commit record that was created, but found a newer record right after (we were
        paused between the two steps while a new instance took over), may have been taken
        over, and then it IS committed: the fence of the instance that took it over names
        it, and that instance (or the next) rolls it forward. Its fate is read from that
        durable state (`TransactionalLog.taken_over`): taken over, we return normally (the
        caller appends the ACKs too, harmless) with this publisher fenced out from then on;
        not taken over, FencedOut (nothing committed); no longer knowable (the evidence was
        pruned), TransactionError saying so."""
        from oncelog.coordination import Placement
        from oncelog.transactions import TransactionRecord

        assert self._log is not None
        seq = self._seq + 1
        record = TransactionRecord(
            kind,
            intents,
            self.producer_id,
            self.clock.value,
            acked=dict(self._acked),
            journals=sorted(self._templates),
            rollbacks=self._rollback_everywhere(),
        )
        tid = self.transactional_id
        try:
            placement = self._log.put(seq, record)
            fate = (
                self._log.taken_over(seq, record)
                if placement is Placement.SUPERSEDED and kind == "commit"
                else False
            )
        except Exception as exc:
            self._broken = (
                f"{self!r}: writing record {seq} of transactional id {tid!r} failed with an "
                f"unknown outcome ({exc}); make a new publisher with the id: it finishes or "
                "rolls back this one's work"
            )
            raise TransactionError(self._broken) from exc
        if placement is Placement.WON:
            self._seq = seq
            if self._seq % self._log.keep == 0:
                self._log.prune()
            return
        self._pending.clear()
        if fate is True:
            self._fenced = (
                f"{self!r} is fenced out: another instance with transactional id {tid!r} "
                f"took over; its last commit (record {seq}, journals "
                f"{sorted({a.journal for a in intents})}) was taken over by that instance and "
                "IS committed"
            )
            log.warning("%s", self._fenced)
            return
        if fate is None:
            self._fenced = (
                f"{self!r} is fenced out: another instance with transactional id {tid!r} "
                f"took over while this publisher was paused after writing commit record "
                f"{seq} (journals {sorted({a.journal for a in intents})}), and the records "
                "that tell whether it was taken over were pruned since"
            )
            raise TransactionError(
                f"{self._fenced}: the commit's outcome is unknown (committed if that "
                "instance took it over, else not); read the journals to know"
            )
        if placement is Placement.TAKEN:
            why = f"record {seq} was taken"
        elif kind == "commit":
            why = f"record {seq} landed in a seq freed by pruning and was never taken over"
        else:
            why = f"a record newer than {seq} exists"
        self._fenced = (
            f"{self!r} is fenced out: another instance with transactional id {tid!r} took "
            f"over ({why}); this {kind} was not committed"
        )
        raise FencedOut(self._fenced)

    def _rollback_everywhere(self) -> list[AckIntent]:
        """Per journal we ever wrote uncommitted: an ACK re-asserting our last acknowledged
        clock there (just below our first message where we never acknowledged), which
        discards whatever we publish there after this point unless a later ACK commits it."""
        out = []
        for journal, template in self._templates.items():
            clock = rollback_clock(template.first_clock, self._acked.get(journal))
            template.ack.set_uuid(build_uuid(self.producer_id, clock, Flags.ACK_TXN))
            out.append(AckIntent(journal, template.framing.marshal(template.ack)))
        return out

    def rollback(self) -> None:
        """Discard messages published uncommitted since the last acknowledgement."""
        if self._pending:
            self.append_intents(self.build_rollback_intents())

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every message this publisher appended is durable (raises the first
        failure)."""
        with self._lock:
            outstanding = self._outstanding.take()
        for append in outstanding:
            append.result(timeout)
