"""Splitting a consumer group's journals among shards by rendezvous hashing.

Journal `j` belongs to the shard `i` maximising `fnv1a32(j) ^ fnv1a32("shard-%03d" % i)`
(the lowest index wins ties), as oncelog.mapping's rendezvous mapping chooses a
partition: each shard's set is stable, and adding journals moves no others.
"""

from __future__ import annotations

from collections.abc import Iterable

from oncelog.mapping import fnv1a32

__all__ = ["shard_of", "shard_journals"]


def _shard_hashes(shards: int) -> list[int]:
    return [fnv1a32(f"shard-{i:03d}".encode()) for i in range(shards)]


def shard_of(journal: str, shards: int) -> int:
    """The index of the shard (of `shards`) that consumes `journal`."""
    if not isinstance(shards, int) or shards < 1:
        raise ValueError(f"shards must be an int >= 1, not {shards!r}")
    key = fnv1a32(journal.encode("utf-8"))
    best, best_score = 0, -1
    for i, h in enumerate(_shard_hashes(shards)):
        score = key ^ h
        if score > best_score:
            best, best_score = i, score
    return best


def shard_journals(journals: Iterable[str], shard: int, shards: int) -> list[str]:
    """The journals, of `journals`, that shard `shard` of `shards` consumes (order kept)."""
    if not isinstance(shard, int) or not 0 <= shard < shards:
        raise ValueError(f"shard {shard!r} is not in [0, {shards!r})")
    return [j for j in journals if shard_of(j, shards) == shard]
