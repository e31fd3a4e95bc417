"""Mappings pick the journal of each message, making the same choices as Gazette.

A mapping is a callable ``mapping(msg) -> (journal_name, content_type)``. It draws
from ``partitions()``, a callable returning the current journal specs (anything
with ``.name`` and ``.labels``; `PolledList` keeps such a list fresh). Partitions
are ordered by name, as a Gazette broker lists them, so a choice never depends on
the order ``partitions()`` happens to return them in:

- `modulo`: index ``fnv1a32(key(msg)) % len(partitions)``;
- `rendezvous`: the partition maximising ``fnv1a32(key(msg)) ^ fnv1a32(name)``
  (the first one wins ties); adding a partition moves keys only to it;
- `random`: any partition, uniformly.

The content type is the partition's ``content-type`` label.
"""

from __future__ import annotations

import functools
import logging
import random as _random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Union, cast

from oncelog.errors import EmptyPartitions, MissingContentType
from oncelog.labels import CONTENT_TYPE, LabelSet
from oncelog.polled import PolledList

__all__ = [
    "fnv1a32",
    "fnv1a32_pure",
    "FNV1A32_ACCELERATED",
    "PartitionSpec",
    "PartitionsFunc",
    "KeyFunc",
    "MappingFunc",
    "EmptyPartitions",
    "MissingContentType",
    "content_type_of",
    "modulo",
    "rendezvous",
    "random",
    "ModuloMapping",
    "RendezvousMapping",
    "RandomMapping",
    "PolledList",
]

_log = logging.getLogger(__name__)

# -- FNV-1a, 32 bits ----------------------------------------------------------------------

_FNV32_OFFSET = 0x811C9DC5
_FNV32_PRIME = 0x01000193
_MASK32 = 0xFFFFFFFF


def fnv1a32_pure(data: bytes | bytearray | memoryview) -> int:
    """32-bit FNV-1a of `data` in pure Python (the reference; `fnv1a32` is faster)."""
    h = _FNV32_OFFSET
    for byte in bytes(data) if isinstance(data, memoryview) else data:
        h = ((h ^ byte) * _FNV32_PRIME) & _MASK32
    return h


try:  # A C implementation, ~50x faster than the loop above, when installed.
    from fnv_hash_fast import fnv1a_32 as _fnv_bytes
except ImportError:  # pragma: no cover - depends on the environment
    _fnv_bytes = fnv1a32_pure

FNV1A32_ACCELERATED: bool = _fnv_bytes is not fnv1a32_pure
"""Whether `fnv1a32` runs in C (package ``fnv-hash-fast``) rather than pure Python."""


def fnv1a32(data: bytes | bytearray | memoryview) -> int:
    """32-bit FNV-1a of `data`, as Go's ``hash/fnv.New32a`` computes it."""
    return _fnv_bytes(data if data.__class__ is bytes else bytes(data))


@functools.lru_cache(maxsize=1 << 16)
def _name_hash(name: str) -> int:
    return _fnv_bytes(name.encode("utf-8"))


def _key_hash(key: bytes | str) -> int:
    """Hash a mapping key: str is UTF-8 encoded; bytes-like taken as is."""
    cls = key.__class__
    if cls is bytes:
        return _fnv_bytes(cast(bytes, key))
    if cls is str:
        return _fnv_bytes(key.encode("utf-8"))  # type: ignore[union-attr]
    if isinstance(key, (bytes, bytearray, memoryview)):
        return _fnv_bytes(bytes(key))
    if isinstance(key, str):
        return _fnv_bytes(key.encode("utf-8"))
    raise TypeError(f"a mapping key must be bytes or str, not {cls.__name__} ({key!r})")


# -- partitions ----------------------------------------------------------------------------


class PartitionSpec(Protocol):
    """What a mapping needs of a journal spec: its name and its labels."""

    @property
    def name(self) -> str: ...

    @property
    def labels(self) -> Union[LabelSet, Mapping[str, Any]]: ...


PartitionsFunc = Callable[[], Sequence[PartitionSpec]]
"""Returns the current partitions (journal specs) to map messages onto."""
KeyFunc = Callable[[Any], Union[bytes, str]]
"""Extracts a message's mapping key; a str is hashed as its UTF-8 bytes."""
MappingFunc = Callable[[Any], "tuple[str, str]"]
"""Picks a message's journal: ``mapping(msg) -> (journal_name, content_type)``."""


def content_type_of(spec: PartitionSpec) -> str:
    """The ``content-type`` label of a journal spec; MissingContentType if absent or several."""
    labels = LabelSet.from_value(spec.labels)
    values = labels.values(CONTENT_TYPE)
    if len(values) != 1 or not values[0]:
        found = "no such label" if not values else f"values {values!r}"
        raise MissingContentType(
            f"journal {spec.name!r} needs exactly one {CONTENT_TYPE!r} label to map "
            f"messages to it ({found})"
        )
    return values[0]


_Trie = Union[int, "tuple[int, _Trie, _Trie]"]
"""A partition index, or (bit mask, subtrie when the key's bit is clear, when set)."""


def _rendezvous_trie(name_hashes: list[int]) -> _Trie:
    """Index the argmax of ``key_hash ^ name_hash`` (first index on ties) by key bits.

    Among candidates agreeing on every higher bit, the first bit where they differ
    decides: those whose bit differs from the key's get the larger weight. So the
    winner is found by walking the bits where candidates split, in O(log n) steps
    instead of weighing every partition.
    """

    def build(candidates: list[int], bit: int) -> _Trie:
        while len(candidates) > 1 and bit >= 0:
            ones = [i for i in candidates if name_hashes[i] >> bit & 1]
            if 0 < len(ones) < len(candidates):
                zeros = [i for i in candidates if not name_hashes[i] >> bit & 1]
                return (1 << bit, build(ones, bit - 1), build(zeros, bit - 1))
            bit -= 1
        return candidates[0]  # equal hashes tie: the first partition by name wins

    return build(list(range(len(name_hashes))), 31)


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """Partitions ordered by name, with their content types and rendezvous trie."""

    names: tuple[str, ...]
    content_types: tuple[str | None, ...]
    problems: tuple[str | None, ...]
    trie: _Trie

    @classmethod
    def of(cls, parts: Sequence[PartitionSpec]) -> _Snapshot:
        ordered = sorted(parts, key=lambda spec: spec.name)
        content_types: list[str | None] = []
        problems: list[str | None] = []
        for spec in ordered:
            try:
                content_types.append(content_type_of(spec))
                problems.append(None)
            except (MissingContentType, TypeError, ValueError) as err:
                content_types.append(None)
                problems.append(str(err))
        names = tuple(spec.name for spec in ordered)
        return cls(
            names=names,
            content_types=tuple(content_types),
            problems=tuple(problems),
            trie=_rendezvous_trie([_name_hash(name) for name in names]),
        )

    def pick(self, index: int) -> tuple[str, str]:
        content_type = self.content_types[index]
        if content_type is None:
            raise MissingContentType(self.problems[index])
        return self.names[index], content_type


class _Partitions:
    """Calls ``partitions()`` and re-derives the snapshot only when its result changes."""

    __slots__ = ("func", "_cache")

    def __init__(self, func: PartitionsFunc) -> None:
        if not callable(func):
            raise TypeError(f"partitions must be a callable returning journal specs, not {func!r}")
        self.func = func
        # (partitions, snapshot), replaced as one object so that threads never see a
        # snapshot paired with partitions it was not derived from.
        self._cache: tuple[tuple[Any, ...], _Snapshot] | None = None

    def snapshot(self) -> _Snapshot:
        parts = self.func()
        # A tuple (as PolledList returns) is compared by identity; other sequences are
        # copied, so that one mutated in place is noticed.
        key = parts if parts.__class__ is tuple else tuple(parts)
        cache = self._cache
        if cache is not None:
            if key is cache[0]:
                return cache[1]
            if key == cache[0]:
                self._cache = (key, cache[1])  # equal content, new object: next time by identity
                return cache[1]
        if not key:
            raise EmptyPartitions(
                f"no partitions to map the message to: {self.func!r} returned none"
            )
        snapshot = _Snapshot.of(key)
        self._cache = (key, snapshot)
        return snapshot


# -- mappings ------------------------------------------------------------------------------


class ModuloMapping:
    """Maps a message to partition ``fnv1a32(key(msg)) % len(partitions)`` (Gazette's modulo)."""

    __slots__ = ("key", "_partitions")

    def __init__(self, key: KeyFunc, partitions: PartitionsFunc) -> None:
        self.key = key
        self._partitions = _Partitions(partitions)

    def __call__(self, msg: Any) -> tuple[str, str]:
        snapshot = self._partitions.snapshot()
        return snapshot.pick(_key_hash(self.key(msg)) % len(snapshot.names))

    def __repr__(self) -> str:
        return f"modulo({self.key!r}, {self._partitions.func!r})"


class RendezvousMapping:
    """Maps a message to the partition maximising ``fnv1a32(key) ^ fnv1a32(name)``.

    Gazette's RendezvousMapping (highest random weight): adding or removing a
    partition moves only the keys that map to it. The first partition by name wins ties.
    """

    __slots__ = ("key", "_partitions")

    def __init__(self, key: KeyFunc, partitions: PartitionsFunc) -> None:
        self.key = key
        self._partitions = _Partitions(partitions)

    def __call__(self, msg: Any) -> tuple[str, str]:
        snapshot = self._partitions.snapshot()
        h = _key_hash(self.key(msg))
        node = snapshot.trie
        while node.__class__ is tuple:
            mask, when_clear, when_set = node
            node = when_set if h & mask else when_clear
        return snapshot.pick(node)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"rendezvous({self.key!r}, {self._partitions.func!r})"


class RandomMapping:
    """Maps each message to a uniformly random partition (Gazette's RandomMapping)."""

    __slots__ = ("_partitions", "_rng")

    def __init__(self, partitions: PartitionsFunc, rng: _random.Random | None = None) -> None:
        self._partitions = _Partitions(partitions)
        self._rng = rng if rng is not None else _random.Random()

    def __call__(self, msg: Any) -> tuple[str, str]:
        snapshot = self._partitions.snapshot()
        return snapshot.pick(self._rng.randrange(len(snapshot.names)))

    def __repr__(self) -> str:
        return f"random({self._partitions.func!r})"


def modulo(key: KeyFunc, partitions: PartitionsFunc) -> ModuloMapping:
    """A mapping choosing partition ``fnv1a32(key(msg)) % len(partitions())``, ordered by name."""
    return ModuloMapping(key, partitions)


def rendezvous(key: KeyFunc, partitions: PartitionsFunc) -> RendezvousMapping:
    """A mapping choosing the partition whose ``fnv1a32(name) ^ fnv1a32(key(msg))`` is largest."""
    return RendezvousMapping(key, partitions)


def random(partitions: PartitionsFunc, rng: _random.Random | None = None) -> RandomMapping:
    """A mapping choosing a uniformly random partition (`rng` makes it reproducible)."""
    return RandomMapping(partitions, rng)
