"""Splitting a consumer group's journals among shards by rendezvous hashing.

Journal `j` belongs to the shard `i` with the highest score
`mix32(fnv1a32(j) ^ fnv1a32("shard-%03d" % i))` (the lowest index wins ties). It is
rendezvous (highest-random-weight) hashing: each journal's shard is stable, and going
from N to N+1 shards moves journals only to the new shard. `mix32` (MurmurHash3's
finaliser) spreads FNV's similar hashes of similar names, which a bare XOR would
leave unbalanced (`part-000`..`part-005` would mostly land on one shard).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from oncelog.mapping import fnv1a32

__all__ = ["shard_of", "shard_journals", "mix32"]


def mix32(h: int) -> int:
    """MurmurHash3's 32-bit finaliser: every input bit affects every output bit."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


@lru_cache(maxsize=64)
def _shard_hashes(shards: int) -> tuple[int, ...]:
    return tuple(fnv1a32(f"shard-{i:03d}".encode()) for i in range(shards))


def shard_of(journal: str, shards: int) -> int:
    """The index of the shard (of `shards`) that consumes `journal`."""
    if not isinstance(shards, int) or shards < 1:
        raise ValueError(f"shards must be an int >= 1, not {shards!r}")
    key = fnv1a32(journal.encode("utf-8"))
    best, best_score = 0, -1
    for i, h in enumerate(_shard_hashes(shards)):
        score = mix32(key ^ h)
        if score > best_score:
            best, best_score = i, score
    return best


def shard_journals(journals: Iterable[str], shard: int, shards: int) -> list[str]:
    """The journals, of `journals`, that shard `shard` of `shards` consumes (order kept)."""
    if not isinstance(shard, int) or not 0 <= shard < shards:
        raise ValueError(f"shard {shard!r} is not in [0, {shards!r})")
    return [j for j in journals if shard_of(j, shards) == shard]
