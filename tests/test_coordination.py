"""The fenced chain every ownership rule rests on: claims that win, lose, or land in a
number freed by pruning; the newest link always survives; chains sharing a directory stay
apart; a create whose reply was lost is recognised by its own bytes."""

from __future__ import annotations

import threading

import pytest

from oncelog.coordination import FencedChain, Placement, new_token
from oncelog.journal.errors import InvalidObjectPath
from oncelog.testing.fixtures import StoreTarget


def link(n: int) -> bytes:
    return b'{"n": %d, "token": "%s"}' % (n, new_token().encode())


def test_claims_win_lose_and_are_superseded(store_url: StoreTarget) -> None:
    client = store_url.open()
    chain = FencedChain(client.meta, "test/chain")
    assert chain.latest() is None and chain.numbers() == []
    assert chain.claim(1, link(1)) is Placement.WON
    assert chain.claim(1, link(1)) is Placement.TAKEN  # another writer's bytes: lost
    assert chain.claim(2, link(2)) is Placement.WON
    assert chain.claim(3, link(3)) is Placement.WON
    # Pruning frees 1 and 2; a zombie that read 1 as the newest writes 2: created, yet
    # a newer link exists, so it is fenced out.
    assert chain.prune(1) == [1, 2]
    assert chain.claim(2, link(2)) is Placement.SUPERSEDED
    latest = chain.latest()
    assert latest is not None and latest.number == 3 and b'"n": 3' in latest.data
    assert chain.newer(1) == [2, 3] and chain.numbers(after=2) == [3]
    with pytest.raises(ValueError, match="newest link stays"):
        chain.prune(0)
    client.close()


def test_chains_sharing_a_directory_stay_apart(memory_store: StoreTarget) -> None:
    client = memory_store.open()
    a = FencedChain(client.meta, "test/shared", prefix="a-")
    b = FencedChain(client.meta, "test/shared", prefix="b-")
    assert a.claim(1, link(1)) is Placement.WON
    assert b.claim(1, link(1)) is Placement.WON
    assert b.claim(2, link(2)) is Placement.WON
    # Other objects in the directory are not links.
    client.meta.put_if_absent("test/shared/tombstone-0000000000000009.json", link(9))
    assert a.numbers() == [1] and b.numbers() == [1, 2]
    assert a.claim(2, link(2)) is Placement.WON  # b's 2 is not above a's
    client.close()


def test_one_winner_among_racing_claims(store_url: StoreTarget) -> None:
    clients = [store_url.open() for _ in range(6)]
    results: list[tuple[int, Placement]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(clients))

    def race(k: int) -> None:
        chain = FencedChain(clients[k].meta, "test/race")
        barrier.wait(30)
        placement = chain.claim(1, link(k))
        with lock:
            results.append((k, placement))

    threads = [threading.Thread(target=race, args=(k,)) for k in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(p.value for _, p in results).count("won") == 1
    assert sum(p is Placement.TAKEN for _, p in results) == len(clients) - 1
    for c in clients:
        c.close()


def test_a_create_whose_reply_was_lost_is_ours(memory_store: StoreTarget) -> None:
    """The object exists with exactly our bytes (our first attempt made it): created."""
    client = memory_store.open()
    meta = client.meta
    data = link(1)
    backend = client.store.backend.inner  # under the retrying wrapper
    real = backend.create
    calls: list[str] = []

    def create(path: str, payload: bytes) -> bool:
        calls.append(path)
        made = real(path, payload)
        return made if len(calls) > 1 else False  # the first reply "lost" after applying

    backend.create = create
    try:
        assert meta.put_if_absent("test/lost/0000000000000001.json", data)
    finally:
        backend.create = real
    assert meta.read("test/lost/0000000000000001.json") == data
    # Someone else's bytes there: not ours.
    assert not meta.put_if_absent("test/lost/0000000000000001.json", link(1))
    client.close()


def test_users_cannot_write_into_oncelog_directories(memory_store: StoreTarget) -> None:
    client = memory_store.open()
    for path in ("claims/x/0000000000000000", "journals/x/spec.json",
                 "compactions/x/a.json", "revisions/x/none-0000000000000001.json"):
        with pytest.raises(InvalidObjectPath):
            client.meta.put_if_absent(path, b"{}")
    client.close()
