"""What reading the index costs: a cold client must not read every claim to find the head."""

from __future__ import annotations

from typing import Any

import pytest

from oncelog.journal import FragmentSpec, JournalClient, JournalSpec


def count_claim_reads(client: JournalClient) -> dict[str, int]:
    """Spy on the store: how many claims are read, and how many claim listings are made."""
    counts = {"claims": 0, "lists": 0}
    store: Any = client.store
    read_claim, read_claims = store.read_claim, store.read_claims
    list_begins = store.list_claim_begins

    def spy_read_claim(journal: str, begin: int) -> Any:
        counts["claims"] += 1
        return read_claim(journal, begin)

    def spy_read_claims(journal: str, begins: list[int]) -> Any:
        counts["claims"] += len(begins)
        return read_claims(journal, begins)

    def spy_list(journal: str, after: int | None = None) -> list[int]:
        counts["lists"] += 1
        return list_begins(journal, after)

    store.read_claim, store.read_claims, store.list_claim_begins = (
        spy_read_claim,
        spy_read_claims,
        spy_list,
    )
    return counts


N = 60  # fragments in the journal


@pytest.fixture(params=["memory", "local", "s3"])
def long_journal(request: pytest.FixtureRequest) -> tuple[Any, bytes]:
    target = request.getfixturevalue(f"{request.param}_store")
    client = target.open()
    client.create(JournalSpec("long", fragment=FragmentSpec(length=1)))
    data = b"".join(b"%04d\n" % i for i in range(N))
    for i in range(N):
        client.append("long", data[5 * i : 5 * i + 5])
    client.close()
    return target, data


def test_cold_head_lists_once_and_reads_only_the_last_claim(
    long_journal: tuple[Any, bytes],
) -> None:
    target, data = long_journal
    client = target.open()
    counts = count_claim_reads(client)
    assert client.head("long") == len(data)
    assert counts == {"claims": 2, "lists": 1}  # the last claim, and a probe past the head
    assert client.head("long") == len(data)
    assert counts == {"claims": 3, "lists": 1}  # a warm head costs one probe (a 404)


def test_cold_appender_finds_the_head_cheaply(long_journal: tuple[Any, bytes]) -> None:
    target, data = long_journal
    client = target.open()
    counts = count_claim_reads(client)
    result = client.append("long", b"next\n")
    assert (result.begin, result.end) == (len(data), len(data) + 5)
    assert counts["lists"] == 1 and counts["claims"] <= 3


def test_a_reader_in_the_middle_reads_claims_near_it_only(long_journal: tuple[Any, bytes]) -> None:
    target, data = long_journal
    client = target.open(read_ahead=False)
    counts = count_claim_reads(client)
    reader = client.read("long", offset=50)
    assert reader.read(5) == data[50:55]
    assert counts["claims"] <= 2 + 32 < N
    assert reader.read() == data[55:]
    assert counts["claims"] <= 2 + N


def test_a_warm_index_catches_up_on_many_new_claims(long_journal: tuple[Any, bytes]) -> None:
    target, data = long_journal
    watcher = target.open()
    assert watcher.head("long") == len(data)
    writer = target.open()
    more = [b"+%03d\n" % i for i in range(20)]
    for m in more:
        writer.append("long", m)
    counts = count_claim_reads(watcher)
    assert watcher.head("long") == len(data) + 100
    assert counts["lists"] == 1  # a few probes, then one listing from the known head
    assert watcher.read("long", offset=len(data)).read() == b"".join(more)
