"""A reference model of read-committed delivery, and exactly-once checks.

The model knows nothing of bytes, rings or replays: it records what each
producer published and what it committed, and says which messages a correct
read-committed reader must deliver, each exactly once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable

from oncelog.testing.errors import ExactlyOnceViolation

__all__ = ["ReadCommittedModel", "ExactlyOnceViolation", "assert_exactly_once"]


def assert_exactly_once(
    inputs: Iterable[Any],
    outputs: Iterable[Any],
    key: Callable[[Any], Hashable] = lambda x: x,
    *,
    output_key: Callable[[Any], Hashable] | None = None,
) -> None:
    """Assert every input's key appears in the outputs exactly once, and nothing else does.

    `key` maps an input (and, unless `output_key` is given, an output) to a hashable
    identity, e.g. `lambda env: env.message.doc["id"]`. Raises ExactlyOnceViolation
    listing what is missing, doubled and unexpected.
    """
    okey = key if output_key is None else output_key
    want = Counter(key(x) for x in inputs)
    doubled_inputs = {k: c for k, c in want.items() if c > 1}
    if doubled_inputs:
        raise ValueError(f"inputs must have distinct keys; repeated: {doubled_inputs}")
    got = Counter(okey(x) for x in outputs)
    missing = [k for k in want if k not in got]
    doubled = {k: c for k, c in got.items() if c > 1 and k in want}
    extra = [k for k in got if k not in want]
    if missing or doubled or extra:
        raise ExactlyOnceViolation(missing, doubled, extra)


@dataclass
class _Producer:
    pending: dict[str, list[Any]] = field(default_factory=dict)  # journal -> uncommitted keys


@dataclass
class ReadCommittedModel:
    """What a read-committed reader must deliver, given what producers did.

    Call the methods as your producers act; `committed` lists the deliverable keys
    in commit order, `committed_in(journal)` per journal. Crashing a producer
    abandons its open transactions: they are never delivered.
    """

    committed: list[tuple[str, Any]] = field(default_factory=list)
    rolled_back: list[tuple[str, Any]] = field(default_factory=list)
    _producers: dict[Hashable, _Producer] = field(default_factory=dict)

    def _producer(self, producer: Hashable) -> _Producer:
        return self._producers.setdefault(producer, _Producer())

    def publish_committed(self, producer: Hashable, journal: str, key: Any) -> None:
        if self._producer(producer).pending.get(journal):
            raise ValueError(
                f"producer {producer!r} has uncommitted messages in {journal!r}: "
                "a committed publish there would roll them back"
            )
        self.committed.append((journal, key))

    def publish_uncommitted(self, producer: Hashable, journal: str, key: Any) -> None:
        self._producer(producer).pending.setdefault(journal, []).append(key)

    def commit(self, producer: Hashable) -> None:
        """The producer's ACKs were appended to every journal it wrote."""
        p = self._producer(producer)
        for journal, keys in p.pending.items():
            self.committed.extend((journal, k) for k in keys)
        p.pending.clear()

    def rollback(self, producer: Hashable) -> None:
        p = self._producer(producer)
        for journal, keys in p.pending.items():
            self.rolled_back.extend((journal, k) for k in keys)
        p.pending.clear()

    def crash(self, producer: Hashable) -> None:
        """The producer died: its open transactions never commit."""
        self.rollback(producer)

    def pending(self, producer: Hashable) -> dict[str, list[Any]]:
        return {j: list(ks) for j, ks in self._producer(producer).pending.items() if ks}

    def committed_keys(self) -> list[Any]:
        return [k for _, k in self.committed]

    def committed_in(self, journal: str) -> list[Any]:
        return [k for j, k in self.committed if j == journal]
