"""Hypothesis strategies for producer histories and messages, and a runner for histories.

A *history* is a list of `Step`s: producers publishing committed or inside
transactions, committing, rolling back, crashing (abandoning an open
transaction), and writers repeating earlier appends (duplicates).
`run_history` performs it against a real journal store with real Publishers and
returns the `ReadCommittedModel` of what a correct reader must deliver.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from hypothesis import strategies as st

from oncelog.framing import CONTENT_TYPE_JSON_LINES, for_content_type
from oncelog.message import CSVRecord, Envelope, JSONMessage
from oncelog.publisher import Publisher
from oncelog.reading import checkpoint_after_dequeued, read_committed
from oncelog.sequencer import ProducerState, Sequencer
from oncelog.testing.model import ReadCommittedModel

if TYPE_CHECKING:
    from oncelog.journal import JournalClient

__all__ = [
    "Action",
    "Step",
    "histories",
    "run_history",
    "HistoryRun",
    "read_committed_with_restarts",
    "json_documents",
    "csv_records",
    "json_messages",
]


class Action(enum.Enum):
    COMMITTED = "committed"
    UNCOMMITTED = "uncommitted"
    COMMIT = "commit"
    ROLLBACK = "rollback"
    CRASH = "crash"
    DUPLICATE = "duplicate"


@dataclass(frozen=True, slots=True)
class Step:
    """One thing a producer (or a retrying writer) does."""

    action: Action
    producer: int
    journal: int = 0
    pick: int = 0  # DUPLICATE: which repeatable frame, modulo how many there are


def histories(
    *,
    producers: int = 3,
    journals: int = 1,
    min_steps: int = 0,
    max_steps: int = 40,
    duplicates: bool = True,
    crashes: bool = True,
) -> st.SearchStrategy[list[Step]]:
    """Interleaved histories of `producers` producers over `journals` journals."""
    actions = [Action.COMMITTED, Action.UNCOMMITTED, Action.UNCOMMITTED, Action.COMMIT,
               Action.ROLLBACK]
    if crashes:
        actions.append(Action.CRASH)
    if duplicates:
        actions.append(Action.DUPLICATE)
    step = st.builds(
        Step,
        action=st.sampled_from(actions),
        producer=st.integers(0, producers - 1),
        journal=st.integers(0, journals - 1),
        pick=st.integers(0, 1 << 16),
    )
    return st.lists(step, min_size=min_steps, max_size=max_steps)


@dataclass
class HistoryRun:
    """What running a history did: the model of correct delivery and the published keys."""

    model: ReadCommittedModel
    journals: list[str]
    published: list[Any] = field(default_factory=list)
    duplicates: int = 0


def run_history(
    client: "JournalClient",
    journals: Sequence[str],
    history: Sequence[Step],
    *,
    content_type: str = CONTENT_TYPE_JSON_LINES,
) -> HistoryRun:
    """Perform `history` with real Publishers on existing JSON-lines `journals`.

    Each message is `{"id": <int>, "producer": <index>}`. Publishing committed to a
    journal where the producer has an open transaction is skipped (the Publisher
    refuses it). Duplicates repeat frames of committed messages or of open
    transactions: never ACKs, whose repetition is Gazette's rollback signal, and
    never rolled-back messages, which a later ACK would otherwise commit.
    """
    framing = for_content_type(content_type)
    model = ReadCommittedModel()
    run = HistoryRun(model, list(journals))
    publishers: dict[int, Publisher] = {}
    repeatable: dict[int, tuple[str, bytes]] = {}
    open_keys: dict[int, list[int]] = {}
    next_id = 0

    def publisher(i: int) -> Publisher:
        if i not in publishers:
            publishers[i] = Publisher(client)
        return publishers[i]

    for step in history:
        journal = journals[step.journal % len(journals)]
        mapping = lambda _m, j=journal: (j, content_type)  # noqa: E731
        p = step.producer
        if step.action in (Action.COMMITTED, Action.UNCOMMITTED):
            msg = JSONMessage({"id": next_id, "producer": p})
            if step.action is Action.COMMITTED:
                if model.pending(p).get(journal):
                    continue
                publisher(p).publish_committed(mapping, msg)
                model.publish_committed(p, journal, next_id)
            else:
                publisher(p).publish_uncommitted(mapping, msg)
                model.publish_uncommitted(p, journal, next_id)
                open_keys.setdefault(p, []).append(next_id)
            repeatable[next_id] = (journal, framing.marshal(msg))
            run.published.append(next_id)
            next_id += 1
        elif step.action is Action.COMMIT:
            if p in publishers:
                pub = publishers[p]
                pub.flush()
                pub.append_intents(pub.build_ack_intents())
            model.commit(p)
            open_keys.pop(p, None)
        elif step.action in (Action.ROLLBACK, Action.CRASH):
            if p in publishers:
                if step.action is Action.ROLLBACK:
                    publishers[p].flush()
                    publishers[p].rollback()
                else:
                    publishers.pop(p).flush()  # dies: a new producer ID takes its place
            for key in open_keys.pop(p, []):
                del repeatable[key]
            model.rollback(p) if step.action is Action.ROLLBACK else model.crash(p)
        elif step.action is Action.DUPLICATE and repeatable:
            keys = sorted(repeatable)
            dup_journal, frame = repeatable[keys[step.pick % len(keys)]]
            for pub in publishers.values():
                pub.flush()  # the original append lands first
            client.append(dup_journal, frame)
            run.duplicates += 1
    for pub in publishers.values():
        pub.flush()
    return run


def read_committed_with_restarts(
    client: "JournalClient",
    journal: str,
    restarts: Sequence[int] = (),
    *,
    buffer: int = 1024,
) -> list[Envelope]:
    """Read `journal` committed to its head, restarting from a checkpoint after each
    count of messages in `restarts` (a fresh Sequencer each time), as a crashing and
    recovering reader would."""
    delivered: list[Envelope] = []
    offsets: dict[str, int] = {journal: 0}
    states: list[ProducerState] = []
    for limit in [*restarts, None]:
        seq = Sequencer(offsets, states, buffer=buffer)
        it = read_committed(client, journal, offsets.get(journal, 0), sequencer=seq)
        try:
            for env in it:
                delivered.append(env)
                if limit is not None:
                    limit -= 1
                    if limit <= 0:
                        break
            offsets, states = checkpoint_after_dequeued(seq)
        finally:
            it.close()
    return delivered


# --- messages ----------------------------------------------------------------------------

_json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
_json_values = st.recursive(
    _json_scalars,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


def json_documents(uuid_field: str = "uuid") -> st.SearchStrategy[dict[str, Any]]:
    """Arbitrary JSON objects (unicode keys and values) without the UUID field."""
    return st.dictionaries(
        st.text(max_size=10).filter(lambda k: k != uuid_field), _json_values, max_size=6
    )


def json_messages(uuid_field: str = "uuid") -> st.SearchStrategy[JSONMessage]:
    """JSONMessages of arbitrary documents, UUID unset (a Publisher stamps it)."""
    return json_documents(uuid_field).map(lambda d: JSONMessage(d, uuid_field))


def csv_records(max_fields: int = 6) -> st.SearchStrategy[CSVRecord]:
    """CSVRecords whose fields hold commas, quotes, CR/LF and unicode; field 0 is the UUID."""
    field_text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=12)
    fields = st.lists(field_text, min_size=0, max_size=max_fields)
    return fields.map(lambda fs: CSVRecord(["", *fs]))
