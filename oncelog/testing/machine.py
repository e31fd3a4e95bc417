"""A hypothesis state machine that checks *your* consumer handler is exactly-once.

`consumer_machine(handler, expected, ...)` builds a `RuleBasedStateMachine` that
interleaves, in any order hypothesis picks:

- upstream producers publishing your documents committed or in transactions, committing,
  rolling back, dying with a transaction open, and re-appending frames (duplicates);
- running your consumer for a few transactions;
- crashing it at a random point of a transaction (any of `oncelog.consumer.STAGES`, e.g.
  after its outputs are durable but before the checkpoint, or between two ACK intents),
  and restarting a new instance of the group, which recovers from the last checkpoint;
- starting a second instance while the first is alive, which fences the first out (a
  zombie that runs again must get `FencedOut` and publish nothing visible).

At teardown it drains the input with a crash-free run, reads the output journals
committed, and compares them with what your crash-free reference `expected` computes
from the committed input documents. Example::

    from hypothesis import settings
    from oncelog.message import JSONMessage
    from oncelog.testing import consumer_machine

    def upper(env, txn):
        doc = env.message.doc
        txn.publish(lambda m: ("machine/out", "application/x-ndjson"),
                    JSONMessage({"text": doc["text"].upper()}))

    UpperMachine = consumer_machine(
        upper,
        expected=lambda docs: [d["text"].upper() for d in docs],
        key=lambda env: env.message.doc["text"],
    )
    TestUpper = UpperMachine.TestCase
    TestUpper.settings = settings(max_examples=25, deadline=None)

With `key`, outputs are compared with `expected(docs)` as multisets of keys (each
expected output exactly once, nothing else). With `view` instead, `view(outputs)` (the
committed output envelopes) must equal `expected(docs)`: use it when outputs depend on how
input was cut into transactions (e.g. running totals: compare the last total per word).
`docs` lists the committed input documents in commit order; only the order within one
input journal is a delivery guarantee, so a reference must not depend on the order
across journals.

Determinism: what hypothesis draws and which preconditions hold depend only on earlier
draws, never on time or load. Consumers run with `max_duration=inf`, so a transaction ends
at `max_messages`, when the input runs dry, or at an injected crash, and a loaded machine
replays an example exactly (a wall-clock deadline used to cut transactions at different
points under load, hence `FlakyStrategyDefinition`). Every message a rule publishes is
durable before the rule returns, so what "the input runs dry" means does not depend on how
soon an appender's writer thread wrote it either. Keep your handler deterministic too.
"""

from __future__ import annotations

import copy
import math
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from oncelog.consumer import STAGES, BatchHandler, Consumer, FencedOut, Finalizer, Handler
from oncelog.framing import CONTENT_TYPE_JSON_LINES, for_content_type
from oncelog.journal import JournalClient, JournalSpec, open_journals
from oncelog.message import Envelope, JSONMessage
from oncelog.publisher import Publisher
from oncelog.reading import read_committed
from oncelog.testing.errors import ConsumerCrash, ExactlyOnceViolation
from oncelog.testing.model import ReadCommittedModel

__all__ = ["consumer_machine", "ConsumerMachine", "ConsumerCrash", "sentences"]

NDJSON = CONTENT_TYPE_JSON_LINES
_WORDS = "alpha beta gamma delta epsilon zeta".split()


def sentences() -> st.SearchStrategy[dict[str, Any]]:
    """Default input documents: `{"text": "<1-4 words from a small vocabulary>"}`."""
    return st.lists(st.sampled_from(_WORDS), min_size=1, max_size=4).map(
        lambda ws: {"text": " ".join(ws)}
    )



def _to(journal: str) -> Callable[[Any], tuple[str, str]]:
    """A mapping of every message to `journal`."""
    return lambda _msg: (journal, NDJSON)


class ConsumerMachine(RuleBasedStateMachine):
    """Base of the machines `consumer_machine()` builds; subclass it directly to override
    `open_store()` (default: a fresh `memory://` store per example), `documents()`, or add
    rules. Callables set as class attributes (`handler`, `expected`, `key`, `view`,
    `finalize`) must be `staticmethod`s."""

    # Set by consumer_machine() (or by a subclass).
    handler: Handler | BatchHandler
    batch: bool = False
    """True if `handler` is a batch handler (`Consumer(batch_handler=...)`)."""
    consumer_options: dict[str, Any] = {}
    """Extra keyword arguments for every Consumer the machine starts (e.g. `state=`)."""
    expected: Callable[[list[dict[str, Any]]], Any]
    key: Callable[[Envelope], Hashable] | None = None
    view: Callable[[list[Envelope]], Any] | None = None
    finalize: Finalizer | None = None
    initial_state: Any = None
    inputs: Sequence[str] = ("machine/in-0", "machine/in-1")
    outputs: Sequence[str] = ("machine/out",)
    group: str = "machine"
    max_messages: int = 3
    max_duration: float = math.inf
    """Transactions are closed by `max_messages`, the input running dry, or a crash rule:
    never by wall-clock time (keep it infinite). A finite value makes where a transaction
    ends depend on the machine's load, so which rules' preconditions hold (is the consumer
    alive, is there a zombie) could differ between hypothesis' generation and its replay
    of one example: `FlakyStrategyDefinition`."""
    producers: int = 2

    def __init__(self) -> None:
        super().__init__()
        self._memory_root: str | None = None
        self.client = self.open_store()
        for name in self.inputs:
            self.client.create(JournalSpec(name, {"content-type": NDJSON, "role": "input"}))
        for name in self.outputs:
            self.client.create(JournalSpec(name, {"content-type": NDJSON, "role": "output"}))
        self.framing = for_content_type(NDJSON)
        self.model = ReadCommittedModel()
        self.docs: dict[int, dict[str, Any]] = {}
        self.publishers: dict[int, Publisher] = {}
        self.open_ids: dict[int, list[int]] = {}
        self.repeatable: dict[int, tuple[str, bytes]] = {}
        self.next_id = 0
        self.consumer: Consumer | None = None
        self.zombies: list[Consumer] = []
        self._crash_at: tuple[str, int] | None = None
        self._seen = 0
        self._lock = threading.Lock()
        self.crashes = 0

    # ----------------------------------------------------------------- the store

    def open_store(self) -> JournalClient:
        """A fresh, empty store for one example (removed at teardown)."""
        self._memory_root = f"/oncelog-machine-{uuid.uuid4().hex}"
        return open_journals(f"memory://{self._memory_root}")

    def _new_consumer(self) -> Consumer:
        handler = type(self).handler
        return Consumer(
            self.client,
            self.group,
            list(self.inputs),
            None if self.batch else handler,  # type: ignore[arg-type]
            batch_handler=handler if self.batch else None,  # type: ignore[arg-type]
            finalize=type(self).finalize,
            initial_state=copy.deepcopy(self.initial_state),
            max_messages=self.max_messages,
            max_duration=self.max_duration,
            on_stage=self._on_stage,
            keep_checkpoints=None,
            **self.consumer_options,
        )

    def _on_stage(self, stage: str) -> None:
        with self._lock:
            if self._crash_at is None or stage != self._crash_at[0]:
                return
            self._seen += 1
            if self._seen < self._crash_at[1]:
                return
            self._crash_at = None
        raise ConsumerCrash(f"crash injected at stage {stage!r}")

    # ------------------------------------------------------------------ upstream

    def _publisher(self, p: int) -> Publisher:
        if p not in self.publishers:
            self.publishers[p] = Publisher(self.client)
        return self.publishers[p]

    @rule(
        producer=st.integers(0, 7),
        journal=st.integers(0, 7),
        transactional=st.booleans(),
        data=st.data(),
    )
    def publish(self, producer: int, journal: int, transactional: bool, data: Any) -> None:
        """A producer publishes one document, committed or inside its transaction."""
        p = producer % self.producers
        name = self.inputs[journal % len(self.inputs)]
        doc = data.draw(self.documents(), label="document")
        msg = JSONMessage(copy.deepcopy(doc))
        mapping = lambda _m: (name, NDJSON)  # noqa: E731
        key = self.next_id
        self.next_id += 1
        publisher = self._publisher(p)
        if transactional or self.model.pending(p).get(name):
            publisher.publish_uncommitted(mapping, msg)
            self.model.publish_uncommitted(p, name, key)
            self.open_ids.setdefault(p, []).append(key)
        else:
            publisher.publish_committed(mapping, msg)
            self.model.publish_committed(p, name, key)
        # Durable before the next rule: whether a consumer run sees this message must not
        # depend on how soon the appender's writer thread got to it (see "Determinism").
        publisher.flush()
        self.docs[key] = doc
        self.repeatable[key] = (name, self.framing.marshal(msg))

    @initialize(data=st.data())
    def seed(self, data: Any) -> None:
        """Start with one committed upstream transaction, so every example has input."""
        self.publish_batch(data, commit=True)

    @rule(data=st.data(), commit=st.booleans())
    def publish_batch(self, data: Any, commit: bool) -> None:
        """A short-lived producer publishes a transaction over the inputs, then commits or
        rolls it back."""
        docs = data.draw(st.lists(self.documents(), min_size=1, max_size=6), label="batch")
        where = data.draw(
            st.lists(st.integers(0, len(self.inputs) - 1), min_size=len(docs),
                     max_size=len(docs)),
            label="journals",
        )
        publisher = Publisher(self.client)
        producer = ("batch", self.next_id)
        for doc, j in zip(docs, where):
            name = self.inputs[j]
            msg = JSONMessage(copy.deepcopy(doc))
            publisher.publish_uncommitted(_to(name), msg)
            self.model.publish_uncommitted(producer, name, self.next_id)
            self.docs[self.next_id] = doc
            self.next_id += 1
        publisher.flush()
        if commit:
            publisher.append_intents(publisher.build_ack_intents())
            self.model.commit(producer)
        else:
            publisher.rollback()
            self.model.rollback(producer)

    @classmethod
    def documents(cls) -> st.SearchStrategy[dict[str, Any]]:
        """The strategy of input documents (JSON objects without a "uuid" field)."""
        return sentences()

    @rule(producer=st.integers(0, 7))
    def commit(self, producer: int) -> None:
        p = producer % self.producers
        if p in self.publishers:
            pub = self.publishers[p]
            pub.flush()
            pub.append_intents(pub.build_ack_intents())
        self.model.commit(p)
        self.open_ids.pop(p, None)

    @rule(producer=st.integers(0, 7), crash=st.booleans())
    def rollback(self, producer: int, crash: bool) -> None:
        """Roll back the producer's open transaction, or let it die with it open."""
        p = producer % self.producers
        if p in self.publishers:
            if crash:
                self.publishers.pop(p).flush()
            else:
                self.publishers[p].flush()
                self.publishers[p].rollback()
        for key in self.open_ids.pop(p, []):
            del self.repeatable[key]
        (self.model.crash if crash else self.model.rollback)(p)

    @precondition(lambda self: self.repeatable)
    @rule(pick=st.integers(0, 1 << 16))
    def duplicate(self, pick: int) -> None:
        """Re-append a message frame, as a retried append would."""
        keys = sorted(self.repeatable)
        journal, frame = self.repeatable[keys[pick % len(keys)]]
        for pub in self.publishers.values():
            pub.flush()
        self.client.append(journal, frame)

    # ------------------------------------------------------------------ consumer

    @rule(transactions=st.integers(1, 3))
    def run_consumer(self, transactions: int) -> None:
        """Run the consumer (recovering a new instance if none is live) for a few commits."""
        if self.consumer is None:
            self.consumer = self._new_consumer()
        self.consumer.run(until_idle=True, max_transactions=transactions)

    @rule(stage=st.sampled_from(STAGES), nth=st.integers(1, 3))
    def crash_consumer(self, stage: str, nth: int) -> None:
        """Run the consumer until the `nth` time it reaches `stage`, and crash it there."""
        if self.consumer is None:
            self.consumer = self._new_consumer()
        with self._lock:
            self._crash_at, self._seen = (stage, nth), 0
        try:
            self.consumer.run(until_idle=True)
        except ConsumerCrash:
            self.crashes += 1
            self.consumer = None  # abandoned: the next run recovers a new instance
        finally:
            with self._lock:
                self._crash_at = None

    @precondition(lambda self: self.consumer is not None)
    @rule()
    def take_over(self) -> None:
        """A second instance recovers the group while the first is still alive."""
        assert self.consumer is not None
        self.zombies.append(self.consumer)
        self.consumer = self._new_consumer()
        self.consumer.recover()

    @precondition(lambda self: self.zombies)
    @rule()
    def run_zombie(self) -> None:
        """The fenced-out instance runs again: it must fail to commit anything."""
        zombie = self.zombies.pop()
        try:
            committed = zombie.run(until_idle=True, max_transactions=1)
        except FencedOut:
            return
        finally:
            zombie.close()
        if committed:
            raise AssertionError(f"a fenced-out instance committed {committed} transaction(s)")

    # ------------------------------------------------------------------ checking

    def committed_docs(self) -> list[dict[str, Any]]:
        """The committed input documents, in commit order (copies)."""
        return [copy.deepcopy(self.docs[k]) for k in self.model.committed_keys()]

    def committed_outputs(self) -> list[Envelope]:
        """The output journals' messages as a read-committed reader sees them."""
        return [env for name in self.outputs for env in read_committed(self.client, name)]

    def check(self) -> None:
        """Drain the input with a crash-free run and compare outputs with the reference."""
        for pub in self.publishers.values():
            pub.flush()
        consumer = self.consumer or self._new_consumer()
        consumer.run(until_idle=True)
        consumer.close()
        outputs = self.committed_outputs()
        want = type(self).expected(self.committed_docs())
        if self.key is not None:
            key = type(self).key
            assert key is not None
            _compare_keys(Counter(want), Counter(key(env) for env in outputs))
        else:
            assert self.view is not None
            view = type(self).view
            assert view is not None
            got = view(outputs)
            if got != want:
                raise AssertionError(
                    f"consumer outputs differ from the crash-free reference:\n"
                    f"  reference: {want!r}\n  committed: {got!r}"
                )

    def teardown(self) -> None:
        try:
            self.check()
        finally:
            for zombie in self.zombies:
                zombie.close()
            self.client.close()
            if self._memory_root is not None:
                import fsspec

                fs = fsspec.filesystem("memory")
                if fs.exists(self._memory_root):
                    fs.rm(self._memory_root, recursive=True)


def _compare_keys(want: Counter[Any], got: Counter[Any]) -> None:
    missing = sorted((want - got).elements(), key=repr)
    doubled = {k: got[k] for k in got if k in want and got[k] > want[k]}
    extra = sorted((k for k in got if k not in want), key=repr)
    if missing or doubled or extra:
        raise ExactlyOnceViolation(missing, doubled, extra)


def consumer_machine(
    handler: Handler | BatchHandler,
    expected: Callable[[list[dict[str, Any]]], Iterable[Hashable] | Any],
    *,
    batch: bool = False,
    consumer_options: dict[str, Any] | None = None,
    key: Callable[[Envelope], Hashable] | None = None,
    view: Callable[[list[Envelope]], Any] | None = None,
    finalize: Finalizer | None = None,
    initial_state: Any = None,
    documents: st.SearchStrategy[dict[str, Any]] | None = None,
    inputs: Sequence[str] = ("machine/in-0", "machine/in-1"),
    outputs: Sequence[str] = ("machine/out",),
    max_messages: int = 3,
    producers: int = 2,
    name: str = "ConsumerMachineForHandler",
) -> type[ConsumerMachine]:
    """A state machine class that checks `handler` (and `finalize`) is exactly-once.

    The handler reads NDJSON documents from `inputs` and publishes to `outputs` (journals
    the machine creates in a fresh store). Give exactly one of `key` (outputs compared with
    `expected(docs)` as multisets of keys) or `view` (`view(outputs) == expected(docs)`).
    With `batch=True`, `handler` is a batch handler (`handler(envelopes, txn)`).
    `consumer_options` are passed to every Consumer (e.g. a `state=` factory).
    Run it with `run_state_machine_as_test(machine)` or its `.TestCase`.
    """
    if (key is None) == (view is None):
        raise ValueError("give exactly one of key= (compare keys) or view= (compare views)")
    if not callable(handler):
        raise TypeError(f"handler must be callable, not {handler!r}")
    if not inputs or not outputs:
        raise ValueError(f"need at least one input and one output journal: {inputs=} {outputs=}")
    attrs: dict[str, Any] = {
        "handler": staticmethod(handler),
        "batch": batch,
        "consumer_options": dict(consumer_options or {}),
        "expected": staticmethod(expected),
        "key": None if key is None else staticmethod(key),
        "view": None if view is None else staticmethod(view),
        "finalize": None if finalize is None else staticmethod(finalize),
        "initial_state": initial_state,
        "inputs": tuple(inputs),
        "outputs": tuple(outputs),
        "max_messages": max_messages,
        "producers": producers,
    }
    if documents is not None:
        attrs["documents"] = classmethod(lambda cls: documents)
    return type(name, (ConsumerMachine,), attrs)
