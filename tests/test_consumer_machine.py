"""oncelog's own consumer checked with the user-facing state machine (oncelog.testing):
a word count whose outputs depend on transaction boundaries (compared by view), a
one-output-per-input transform (compared by keys), and broken handlers it must catch."""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from oncelog.consumer import Transaction
from oncelog.journal import open_journals
from oncelog.message import Envelope, JSONMessage
from oncelog.publisher import Publisher
from oncelog.testing import ConsumerMachine, ExactlyOnceViolation, consumer_machine

NDJSON = "application/x-ndjson"
OUT = "machine/out"
RUN = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def to_out(_msg: object) -> tuple[str, str]:
    return OUT, NDJSON


# -- word count: running totals published by the finalizer ----------------------------------


def count_words(env: Envelope, txn: Transaction) -> None:
    counts = txn.state["counts"]
    for word in env.message.doc["text"].split():
        counts[word] = counts.get(word, 0) + 1


def publish_totals(txn: Transaction) -> None:
    counts, published = txn.state["counts"], txn.state["published"]
    for word in sorted(counts):
        if published.get(word) != counts[word]:
            txn.publish(to_out, JSONMessage({"word": word, "total": counts[word]}))
            published[word] = counts[word]


def last_totals(outputs: list[Envelope]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for env in outputs:
        totals[env.message.doc["word"]] = env.message.doc["total"]
    return totals


def word_counts(docs: list[dict]) -> dict[str, int]:
    return dict(Counter(w for d in docs for w in d["text"].split()))


WordCountMachine = consumer_machine(
    count_words,
    word_counts,
    view=last_totals,
    finalize=publish_totals,
    initial_state={"counts": {}, "published": {}},
    name="WordCountMachine",
)


def test_word_count_is_exactly_once() -> None:
    run_state_machine_as_test(WordCountMachine, settings=RUN)


# -- one output per input ---------------------------------------------------------------------


def shout(env: Envelope, txn: Transaction) -> None:
    doc = env.message.doc
    txn.publish(to_out, JSONMessage({"n": doc["n"], "text": doc["text"].upper()}))


def numbered() -> object:
    from hypothesis import strategies as st

    return st.builds(
        lambda n, ws: {"n": n, "text": " ".join(ws)},
        st.integers(0, 3),
        st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=2),
    )


ShoutMachine = consumer_machine(
    shout,
    lambda docs: [(d["n"], d["text"].upper()) for d in docs],
    key=lambda env: (env.message.doc["n"], env.message.doc["text"]),
    documents=numbered(),  # type: ignore[arg-type]
    name="ShoutMachine",
)


def test_transform_is_exactly_once() -> None:
    run_state_machine_as_test(ShoutMachine, settings=RUN)


class LocalDiskShoutMachine(ShoutMachine):  # type: ignore[misc, valid-type]
    """Subclassing: the same checks on a local-disk store."""

    def open_store(self):  # type: ignore[no-untyped-def]
        self.tmp = tempfile.mkdtemp(prefix="oncelog-machine-")
        return open_journals(self.tmp)

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            shutil.rmtree(self.tmp)


def test_transform_on_local_disk() -> None:
    run_state_machine_as_test(LocalDiskShoutMachine, settings=settings(RUN, max_examples=5))


# The same machine as a unittest-style TestCase, the way users may collect it.
TestShoutMachine = ShoutMachine.TestCase
TestShoutMachine.settings = settings(RUN, max_examples=5)


# -- the machine catches what is not exactly-once ------------------------------------------

FIND = settings(RUN, max_examples=150, phases=[Phase.generate])


def test_catches_committed_outputs() -> None:
    """Outputs published committed, outside the consumer's transaction, are re-published
    when a crash makes the consumer handle the same input again: at-least-once."""

    def at_least_once(env: Envelope, txn: Transaction) -> None:
        publisher = Publisher(txn._consumer.client)  # the machine's store, for this test
        publisher.publish_committed(to_out, JSONMessage({"text": env.message.doc["text"]}))
        publisher.flush()

    machine = consumer_machine(
        at_least_once,
        lambda docs: [d["text"] for d in docs],
        key=lambda env: env.message.doc["text"],
    )
    with pytest.raises(ExactlyOnceViolation, match="more than once"):
        run_state_machine_as_test(machine, settings=FIND)


def test_catches_lost_outputs() -> None:
    """A handler that drops some inputs loses outputs: reported as missing."""

    def lossy(env: Envelope, txn: Transaction) -> None:
        if "gamma" not in env.message.doc["text"]:
            txn.publish(to_out, JSONMessage({"text": env.message.doc["text"]}))

    machine = consumer_machine(
        lossy, lambda docs: [d["text"] for d in docs], key=lambda env: env.message.doc["text"]
    )
    with pytest.raises(ExactlyOnceViolation, match="missing"):
        run_state_machine_as_test(machine, settings=FIND)


def test_catches_wrong_view() -> None:
    """A view that differs from the reference fails with both shown."""
    machine = consumer_machine(
        count_words,
        lambda docs: {w: c + 1 for w, c in word_counts(docs).items()},
        view=last_totals,
        finalize=publish_totals,
        initial_state={"counts": {}, "published": {}},
    )
    with pytest.raises(AssertionError, match="differ from the crash-free reference"):
        run_state_machine_as_test(machine, settings=FIND)


def test_module_docstring_example_runs() -> None:
    import importlib
    import textwrap

    # (the module is oncelog.testing.machine; `consumer_machine` is the function)
    doc = importlib.import_module("oncelog.testing.machine").__doc__ or ""
    code = textwrap.dedent(doc.split("Example::\n")[1].split("\nWith `key`")[0])
    namespace: dict = {}
    exec(compile(code, "consumer_machine example", "exec"), namespace)
    machine = namespace["UpperMachine"]
    assert namespace["TestUpper"].settings.max_examples == 25
    run_state_machine_as_test(machine, settings=settings(RUN, max_examples=5))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="exactly one of key"):
        consumer_machine(shout, list)
    with pytest.raises(ValueError, match="exactly one of key"):
        consumer_machine(shout, list, key=str, view=list)
    with pytest.raises(TypeError, match="handler must be callable"):
        consumer_machine("shout", list, key=str)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one input"):
        consumer_machine(shout, list, key=str, outputs=())
    assert issubclass(ShoutMachine, ConsumerMachine)
