"""A hypothesis state machine: publishers, duplicates, rollbacks and reader restarts
against a reference model of read-committed delivery, on a real (memory://) journal store."""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from oncelog.framing import CONTENT_TYPE_JSON_LINES, for_content_type
from oncelog.journal import JournalSpec, open_journals
from oncelog.message import Envelope, JSONMessage
from oncelog.publisher import Publisher, TransactionError
from oncelog.reading import checkpoint_after_dequeued, read_committed
from oncelog.sequencer import Sequencer

J = "props/journal"
FRAMING = for_content_type(CONTENT_TYPE_JSON_LINES)
PRODUCERS = 3


def to_journal(_msg: object) -> tuple[str, str]:
    return J, CONTENT_TYPE_JSON_LINES


@dataclass
class Model:
    """What read-committed delivery must produce: committed messages, exactly once."""

    committed: list[int] = field(default_factory=list)
    pending: dict[int, list[int]] = field(default_factory=dict)
    # Frames a writer may legitimately repeat: committed messages and open transactions'
    # (a repeat of a rolled-back message after its rollback would begin a new span).
    repeatable: dict[int, bytes] = field(default_factory=dict)


class ReadCommittedMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.client = open_journals(f"memory:///props-{uuid.uuid4().hex}")
        self.client.create(JournalSpec(J, labels={"content-type": CONTENT_TYPE_JSON_LINES}))
        self.publishers = [Publisher(self.client) for _ in range(PRODUCERS)]
        self.model = Model(pending={p: [] for p in range(PRODUCERS)})
        self.next_n = 0
        self.frames: dict[int, bytes] = {}
        self.txn_of: dict[int, int] = {}
        self.delivered: list[Envelope] = []
        self.offsets: dict[str, int] = {J: 0}
        self.states: list = []

    def teardown(self) -> None:
        client = getattr(self, "client", None)
        if client is not None:
            self.read_all(ring=7)
            got = Counter(e.message.doc["n"] for e in self.delivered)
            assert got == Counter(self.model.committed), (
                f"delivered {sorted(got.elements())} != committed {sorted(self.model.committed)}"
            )
            client.close()

    def _message(self, producer: int) -> JSONMessage:
        n = self.next_n
        self.next_n += 1
        return JSONMessage({"n": n, "p": producer})

    def _frame(self, msg: JSONMessage) -> bytes:
        return FRAMING.marshal(msg)

    @rule(producer=st.integers(0, PRODUCERS - 1))
    def publish_committed(self, producer: int) -> None:
        msg = self._message(producer)
        if self.model.pending[producer]:
            # Would roll back the open transaction: the publisher refuses.
            with pytest.raises(TransactionError, match="uncommitted messages"):
                self.publishers[producer].publish_committed(to_journal, msg)
            return
        self.publishers[producer].publish_committed(to_journal, msg).result()
        n = msg.doc["n"]
        self.model.committed.append(n)
        self.model.repeatable[n] = self._frame(msg)

    @rule(producer=st.integers(0, PRODUCERS - 1))
    def publish_uncommitted(self, producer: int) -> None:
        msg = self._message(producer)
        self.publishers[producer].publish_uncommitted(to_journal, msg).result()
        n = msg.doc["n"]
        self.model.pending[producer].append(n)
        self.model.repeatable[n] = self._frame(msg)

    @rule(producer=st.integers(0, PRODUCERS - 1))
    def commit(self, producer: int) -> None:
        pub = self.publishers[producer]
        pub.append_intents(pub.build_ack_intents())
        self.model.committed.extend(self.model.pending[producer])
        self.model.pending[producer] = []

    @rule(producer=st.integers(0, PRODUCERS - 1))
    def rollback(self, producer: int) -> None:
        self.publishers[producer].rollback()
        for n in self.model.pending[producer]:
            del self.model.repeatable[n]
        self.model.pending[producer] = []

    @precondition(lambda self: bool(self.model.repeatable))
    @rule(data=st.data())
    def duplicate(self, data: st.DataObject) -> None:
        """A writer repeats an earlier append (a retry): readers must not see it twice."""
        n = data.draw(st.sampled_from(sorted(self.model.repeatable)))
        self.client.append(J, self.model.repeatable[n])

    @rule(limit=st.integers(0, 12), ring=st.integers(0, 9))
    def read_some_and_restart(self, limit: int, ring: int) -> None:
        """Read up to `limit` committed messages, checkpoint, and forget the reader."""
        seq = Sequencer(self.offsets, self.states, buffer=ring)
        it = read_committed(self.client, J, self.offsets[J], sequencer=seq)
        try:
            for _ in range(limit):
                env = next(it, None)
                if env is None:
                    break
                self.delivered.append(env)
            self.offsets, self.states = checkpoint_after_dequeued(seq)
        finally:
            it.close()

    def read_all(self, ring: int) -> None:
        seq = Sequencer(self.offsets, self.states, buffer=ring)
        self.delivered.extend(read_committed(self.client, J, self.offsets[J], sequencer=seq))
        self.offsets, self.states = checkpoint_after_dequeued(seq)

    @invariant()
    def exactly_once_so_far(self) -> None:
        if not hasattr(self, "delivered"):
            return
        ns = [e.message.doc["n"] for e in self.delivered]
        assert len(ns) == len(set(ns)), f"delivered twice: {sorted(ns)}"
        assert set(ns) <= set(self.model.committed), "delivered an uncommitted message"
        for p in range(PRODUCERS):
            clocks = [e.clock for e in self.delivered if e.message.doc["p"] == p]
            assert clocks == sorted(clocks), f"producer {p} out of clock order"


ReadCommittedMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None
)
TestReadCommitted = ReadCommittedMachine.TestCase
