"""Mappings choose journals as Gazette does; PolledList keeps partitions fresh."""

from __future__ import annotations

import hashlib
import logging
import math
import os
import pickle
import random as stdlib_random
import threading
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.labels import CONTENT_TYPE, CONTENT_TYPE_JSON_LINES, LabelSet
from oncelog.mapping import (
    EmptyPartitions,
    MissingContentType,
    PolledList,
    content_type_of,
    fnv1a32,
    fnv1a32_pure,
    modulo,
    random,
    rendezvous,
)


def reference_fnv1a32(data: bytes) -> int:
    """FNV-1a, 32 bits, straight from its definition: xor the byte, multiply by the prime."""
    return reduce(lambda h, byte: ((h ^ byte) * 16777619) % 2**32, data, 2166136261)


@dataclass(frozen=True)
class Spec:
    name: str
    labels: Any = field(default_factory=lambda: LabelSet({CONTENT_TYPE: CONTENT_TYPE_JSON_LINES}))


def specs(names: list[str]) -> list[Spec]:
    return [Spec(name) for name in names]


def key_of(msg: Any) -> Any:
    return msg


# -- FNV-1a --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, expected",
    [(b"", 0x811C9DC5), (b"a", 0xE40C292C), (b"foobar", 0xBF9CF968)],
)
def test_fnv1a32_standard_vectors(data, expected):
    assert fnv1a32(data) == expected
    assert fnv1a32_pure(data) == expected
    assert fnv1a32(bytearray(data)) == expected
    assert fnv1a32(memoryview(data)) == expected
    assert fnv1a32_pure(memoryview(data)) == expected


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_fnv1a32_agrees_with_its_definition(data):
    expected = reference_fnv1a32(data)
    assert fnv1a32(data) == expected
    assert fnv1a32_pure(data) == expected


# -- choices -------------------------------------------------------------------------------


def gazette_fixture(count: int) -> list[Spec]:
    return specs([f"a/topic/part-{i:03d}" for i in range(count)])


QUOTES = [
    "It always", "seems", "impossible", "until", "it is done.", "- Nelson Mandela",
    "Shall I compare", "thee to", "a summer's day?", "Thou art more", "lovely and more",
    "temperate - Shakespeare",
]


def test_gazettes_modulo_regression_fixtures():
    # Partition indices from Gazette's message/routines_test.go (computed by Go):
    # the same keys and journals must land on the same partitions here.
    expected = [119, 54, 308, 97, 179, 437, 84, 300, 214, 135, 118, 228]
    parts = gazette_fixture(443)
    mapping = modulo(key_of, lambda: parts)
    for key, index in zip(QUOTES, expected):
        assert mapping(key) == (f"a/topic/part-{index:03d}", CONTENT_TYPE_JSON_LINES)


@pytest.mark.parametrize("count", [400, 500])
def test_gazettes_rendezvous_regression_fixtures(count):
    expected = [21, 179, 50, 13, 337, 29, 110, 395, 192, 394, 344, 75]
    parts = gazette_fixture(count)
    mapping = rendezvous(key_of, lambda: parts)
    for key, index in zip(QUOTES, expected):
        assert mapping(key) == (f"a/topic/part-{index:03d}", CONTENT_TYPE_JSON_LINES)


partition_names = st.lists(
    st.text("abcxyz019/-_.", min_size=1, max_size=12), min_size=1, max_size=64, unique=True
)
keys = st.one_of(st.binary(max_size=40), st.text(max_size=20))


def as_bytes(key: bytes | str) -> bytes:
    return key.encode() if isinstance(key, str) else key


@settings(max_examples=300)
@given(partition_names, keys, st.randoms(use_true_random=False))
def test_modulo_picks_hash_mod_count_of_the_name_ordered_partitions(names, key, rnd):
    shuffled = specs(names)
    rnd.shuffle(shuffled)
    ordered = sorted(names)
    expected = ordered[reference_fnv1a32(as_bytes(key)) % len(ordered)]
    assert modulo(key_of, lambda: shuffled)(key) == (expected, CONTENT_TYPE_JSON_LINES)


@settings(max_examples=300)
@given(partition_names, keys, st.randoms(use_true_random=False))
def test_rendezvous_picks_the_first_highest_xor_weight(names, key, rnd):
    shuffled = specs(names)
    rnd.shuffle(shuffled)
    h = reference_fnv1a32(as_bytes(key))
    best, expected = -1, None
    for name in sorted(names):  # in name order; a strictly larger weight replaces
        weight = h ^ reference_fnv1a32(name.encode())
        if weight > best:
            best, expected = weight, name
    assert rendezvous(key_of, lambda: shuffled)(key) == (expected, CONTENT_TYPE_JSON_LINES)


def test_rendezvous_ties_go_to_the_first_partition_by_name():
    # "liquid" and "costarring" are an FNV-1a collision: every key weighs them equally.
    assert fnv1a32(b"liquid") == fnv1a32(b"costarring")
    for order in (["liquid", "costarring"], ["costarring", "liquid"]):
        mapping = rendezvous(key_of, lambda order=order: specs(order))
        assert {mapping(k)[0] for k in sample_keys(50)} == {"costarring"}
    # Among other partitions too, each tied pair behaves as its first member.
    names = EIGHT + ["liquid", "costarring", "declinate", "macallums"]
    mapping = rendezvous(key_of, lambda: specs(names))
    for key in sample_keys(300):
        h = reference_fnv1a32(key)
        weights = [h ^ reference_fnv1a32(n.encode()) for n in sorted(names)]
        assert mapping(key)[0] == sorted(names)[weights.index(max(weights))]


def test_str_and_bytes_keys_map_alike():
    parts = gazette_fixture(7)
    for make in (modulo, rendezvous):
        mapping = make(key_of, lambda: parts)
        assert mapping("clé") == mapping("clé".encode()) == mapping(bytearray("clé".encode()))
        with pytest.raises(TypeError, match=r"a mapping key must be bytes or str, not int \(5\)"):
            mapping(5)


def sample_keys(count: int) -> list[bytes]:
    return [hashlib.sha256(i.to_bytes(4, "big")).hexdigest()[:16].encode() for i in range(count)]


# Chi-square critical values at significance 0.001, by degrees of freedom.
CHI2_CRITICAL_0_001 = {
    1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12
}


def chi_square(observed: dict[str, int], expected: dict[str, float]) -> float:
    return sum((observed.get(k, 0) - e) ** 2 / e for k, e in expected.items())


def tally(mapping, keys_: list[bytes]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key in keys_:
        name, _ = mapping(key)
        counts[name] = counts.get(name, 0) + 1
    return counts


EIGHT = [f"examples/part-{i:03d}" for i in range(8)]


def test_modulo_spreads_keys_evenly():
    counts = tally(modulo(key_of, lambda: specs(EIGHT)), sample_keys(1000))
    expected = {name: 1000 / 8 for name in EIGHT}
    assert chi_square(counts, expected) < CHI2_CRITICAL_0_001[7]


def xor_rendezvous_shares(name_hashes: list[int]) -> list[float]:
    """Exact chance that each partition wins for a uniformly random 32-bit key hash.

    ``h ^ n_i`` is largest for the partitions that differ from ``h`` at the highest bit
    where the candidates disagree: walk those bits, halving the chance at each split.
    """
    shares = [0.0] * len(name_hashes)

    def walk(candidates: list[int], bit: int, chance: float) -> None:
        if len(candidates) == 1 or bit < 0:
            shares[candidates[0]] += chance  # ties: the first partition wins
            return
        ones = [i for i in candidates if name_hashes[i] >> bit & 1]
        zeros = [i for i in candidates if not name_hashes[i] >> bit & 1]
        if ones and zeros:
            walk(ones, bit - 1, chance / 2)
            walk(zeros, bit - 1, chance / 2)
        else:
            walk(candidates, bit - 1, chance)

    walk(list(range(len(name_hashes))), 31, 1.0)
    return shares


def test_rendezvous_shares_follow_the_xor_weights():
    # Gazette's XOR weighting gives each partition a power-of-two share set by its name's
    # hash bits; it is not an even spread. Check the observed spread against that share.
    names = sorted(EIGHT)
    shares = xor_rendezvous_shares([reference_fnv1a32(n.encode()) for n in names])
    assert math.isclose(sum(shares), 1.0)
    counts = tally(rendezvous(key_of, lambda: specs(EIGHT)), sample_keys(1000))
    expected = {n: 1000 * s for n, s in zip(names, shares) if s > 0}
    assert set(counts) <= set(expected)
    assert chi_square(counts, expected) < CHI2_CRITICAL_0_001[len(expected) - 1]


def test_adding_a_partition_moves_rendezvous_keys_only_to_it():
    keys_ = sample_keys(1000)
    before = specs(EIGHT)
    after = before + specs(["examples/part-008"])
    old = rendezvous(key_of, lambda: before)
    new = rendezvous(key_of, lambda: after)
    moved = [k for k in keys_ if old(k) != new(k)]
    assert moved and all(new(k)[0] == "examples/part-008" for k in moved)
    # The new partition takes its own share of keys, from the others, and no more.
    names = sorted(p.name for p in after)
    share = xor_rendezvous_shares([reference_fnv1a32(n.encode()) for n in names])[
        names.index("examples/part-008")
    ]
    spread = 4 * math.sqrt(1000 * share * (1 - share))
    assert abs(len(moved) - 1000 * share) <= spread
    # Modulo, by contrast, moves most keys.
    modulo_moved = sum(
        modulo(key_of, lambda: before)(k) != modulo(key_of, lambda: after)(k) for k in keys_
    )
    assert modulo_moved > 2 * len(moved)


def test_random_mapping_uses_every_partition_evenly():
    mapping = random(lambda: specs(EIGHT), rng=stdlib_random.Random(7))
    counts: dict[str, int] = {}
    for _ in range(2000):
        name, content_type = mapping(object())
        assert content_type == CONTENT_TYPE_JSON_LINES
        counts[name] = counts.get(name, 0) + 1
    assert set(counts) == set(EIGHT)
    assert chi_square(counts, {n: 2000 / 8 for n in EIGHT}) < CHI2_CRITICAL_0_001[7]


# -- errors --------------------------------------------------------------------------------


def no_partitions() -> list[Spec]:
    return []


@pytest.mark.parametrize(
    "mapping",
    [modulo(key_of, no_partitions), rendezvous(key_of, no_partitions), random(no_partitions)],
)
def test_no_partitions_is_an_error(mapping):
    with pytest.raises(EmptyPartitions, match="no partitions to map the message to: .*no_partit"):
        mapping(b"key")


def test_a_chosen_partition_without_content_type_is_an_error_naming_it():
    parts = [Spec("with-ct"), Spec("without-ct", labels={"app": "shop"})]
    mapping = modulo(key_of, lambda: parts)
    chosen = {}
    for key in sample_keys(50):
        try:
            chosen[mapping(key)[0]] = True
        except MissingContentType as err:
            assert "journal 'without-ct' needs exactly one 'content-type' label" in str(err)
            chosen["error"] = True
    assert chosen == {"with-ct": True, "error": True}  # the good partition still maps


def test_content_type_of_reads_the_label():
    assert content_type_of(Spec("j1", labels={CONTENT_TYPE: "text/csv"})) == "text/csv"
    with pytest.raises(MissingContentType, match=r"journal 'j1' .* \(values \['a/b', 'c/d'\]\)"):
        content_type_of(Spec("j1", labels={CONTENT_TYPE: ["a/b", "c/d"]}))
    with pytest.raises(MissingContentType, match=r"journal 'j2' .* \(no such label\)"):
        content_type_of(Spec("j2", labels=LabelSet()))


def test_partitions_must_be_callable():
    with pytest.raises(TypeError, match="partitions must be a callable"):
        modulo(key_of, specs(EIGHT))  # type: ignore[arg-type]


# -- snapshots of the partitions -------------------------------------------------------------


class CountingSpec:
    """A spec that counts how often its labels are read."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.reads = 0

    @property
    def labels(self) -> dict[str, str]:
        self.reads += 1
        return {CONTENT_TYPE: CONTENT_TYPE_JSON_LINES}


def test_an_unchanged_partition_tuple_is_analysed_once():
    parts = tuple(CountingSpec(f"p-{i}") for i in range(4))
    mapping = rendezvous(key_of, lambda: parts)
    for key in sample_keys(20):
        mapping(key)
    assert [p.reads for p in parts] == [1, 1, 1, 1]


def test_a_list_changed_in_place_is_noticed():
    parts = specs(["only"])
    mapping = modulo(key_of, lambda: parts)
    assert {mapping(k)[0] for k in sample_keys(20)} == {"only"}
    parts.append(Spec("second"))
    assert {mapping(k)[0] for k in sample_keys(20)} == {"only", "second"}
    parts[:] = specs(["third"])
    assert {mapping(k)[0] for k in sample_keys(20)} == {"third"}


# -- PolledList ----------------------------------------------------------------------------


class FakeClient:
    """Stands in for a JournalClient: `list` returns the configured specs or raises."""

    def __init__(self, specs_: list[Spec]) -> None:
        self.specs = list(specs_)
        self.error: Exception | None = None
        self.calls = 0
        self.selectors: list[str] = []
        self.cond = threading.Condition()
        self.gate: threading.Event | None = None  # when set, list() waits for it
        self.entered = threading.Event()

    def set(self, specs_: list[Spec] | None = None, error: Exception | None = None) -> int:
        """Change what list() gives; returns the number of calls made before the change."""
        with self.cond:
            if specs_ is not None:
                self.specs = list(specs_)
            self.error = error
            return self.calls

    def list(self, selector: str) -> list[Spec]:
        with self.cond:
            self.calls += 1
            self.selectors.append(selector)
            self.cond.notify_all()
            specs_, error, gate = list(self.specs), self.error, self.gate
        if gate is not None:
            self.entered.set()
            assert gate.wait(10), "test gate never opened"
        if error is not None:
            raise error
        return specs_

    def wait_for_calls(self, count: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.calls >= count, timeout=10), (
                f"expected {count} list calls, saw {self.calls}"
            )


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def names_of(parts) -> list[str]:
    return [p.name for p in parts]


def test_polled_list_loads_at_once_sorted_by_name():
    client = FakeClient(specs(["b", "c", "a"]))
    with PolledList(client, "app = shop, name:prefix=x/", background=False) as polled:
        assert client.calls == 1
        assert client.selectors == ["app=shop,name:prefix=x/"]
        assert isinstance(polled(), tuple)
        assert names_of(polled()) == ["a", "b", "c"]
        assert repr(polled) == "PolledList('app=shop,name:prefix=x/', 3 journals)"


def test_polled_list_first_load_errors_propagate():
    client = FakeClient([])
    client.set(error=ConnectionError("store unreachable"))
    with pytest.raises(ConnectionError, match="store unreachable"):
        PolledList(client, "")


def test_polled_list_rejects_bad_arguments():
    with pytest.raises(ValueError, match="interval must be a positive number of seconds, not 0"):
        PolledList(FakeClient([]), "", interval=0)
    with pytest.raises(ValueError, match="bad label selector 'a in \\(b'"):
        PolledList(FakeClient([]), "a in (b")


def test_lazy_polled_list_refreshes_when_stale_and_keeps_the_last_good_list(caplog):
    client, clock = FakeClient(specs(["a"])), FakeClock()
    polled = PolledList(client, "app=shop", interval=10, background=False, clock=clock)
    clock.now = 9.9
    assert names_of(polled()) == ["a"] and client.calls == 1
    client.set(specs(["a", "b"]))
    clock.now = 10.0
    assert names_of(polled()) == ["a", "b"] and client.calls == 2
    assert polled.refreshed_at == 10.0

    failure = ConnectionError("store unreachable")
    client.set(specs(["zzz"]), error=failure)
    clock.now = 20.0
    with caplog.at_level(logging.WARNING, logger="oncelog.polled"):
        assert names_of(polled()) == ["a", "b"]
    assert client.calls == 3
    assert polled.last_error is failure
    assert "listing journals matching 'app=shop' failed; keeping the last 2" in caplog.text
    clock.now = 29.0  # the failed attempt counts: no retry before a whole interval
    polled()
    assert client.calls == 3

    client.set(specs(["c"]))
    clock.now = 30.0
    assert names_of(polled()) == ["c"]
    assert polled.last_error is None

    polled.close()
    clock.now = 100.0
    assert names_of(polled()) == ["c"] and client.calls == 4 and polled.closed


def test_refresh_lists_now_and_raises_on_failure():
    client = FakeClient(specs(["a"]))
    polled = PolledList(client, "", background=False)
    client.set(specs(["b", "a"]))
    assert names_of(polled.refresh()) == ["a", "b"]
    client.set(error=OSError("boom"))
    with pytest.raises(OSError, match="boom"):
        polled.refresh()
    assert names_of(polled()) == ["a", "b"]
    assert isinstance(polled.last_error, OSError)


def test_a_slow_refresh_does_not_block_other_callers():
    client, clock = FakeClient(specs(["a"])), FakeClock()
    polled = PolledList(client, "", interval=1, background=False, clock=clock)
    client.set(specs(["b"]))
    client.gate = threading.Event()
    clock.now = 5.0
    slow = threading.Thread(target=polled)
    slow.start()
    assert client.entered.wait(10)
    # The refresh is stuck inside list(): another caller gets the current list at once.
    assert names_of(polled()) == ["a"]
    assert client.calls == 2
    client.gate.set()
    slow.join(10)
    assert names_of(polled()) == ["b"]


def test_background_polled_list_refreshes_keeps_going_after_failures_and_stops(caplog):
    client = FakeClient(specs(["a"]))
    with caplog.at_level(logging.WARNING, logger="oncelog.polled"):
        with PolledList(client, "", interval=0.005) as polled:
            # Calls numbered after set() saw the change; the one after that proves it was stored.
            seen = client.set(specs(["x", "b"]))
            client.wait_for_calls(seen + 2)
            assert names_of(polled()) == ["b", "x"]

            seen = client.set(error=TimeoutError("slow store"))
            client.wait_for_calls(seen + 2)
            assert names_of(polled()) == ["b", "x"]
            assert isinstance(polled.last_error, TimeoutError)

            seen = client.set(specs(["c"]), error=None)
            client.wait_for_calls(seen + 2)
            assert names_of(polled()) == ["c"]
            assert polled.last_error is None
            thread = polled._thread
            assert thread is not None and thread.is_alive()
        assert not thread.is_alive() and polled.closed
    assert "slow store" in caplog.text


def test_an_unchanged_listing_keeps_the_same_tuple_so_mappings_stay_cached():
    parts = [CountingSpec("p-1"), CountingSpec("p-0")]
    client = FakeClient(parts)  # type: ignore[arg-type]
    polled = PolledList(client, "", background=False)
    mapping = modulo(key_of, polled)
    first = polled()
    mapping(b"key")
    polled.refresh()
    assert polled() is first and client.calls == 2
    mapping(b"key")
    assert [p.reads for p in parts] == [1, 1]


def test_mappings_follow_a_polled_list():
    client = FakeClient(specs(["p1"]))
    polled = PolledList(client, "", background=False)
    mapping = modulo(key_of, polled)
    assert {mapping(k)[0] for k in sample_keys(30)} == {"p1"}
    client.set(specs(["p1", "p2"]))
    polled.refresh()
    assert {mapping(k)[0] for k in sample_keys(30)} == {"p1", "p2"}
    client.set([])
    polled.refresh()
    with pytest.raises(EmptyPartitions, match=r"PolledList\('', 0 journals\) returned none"):
        mapping(b"key")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_refreshes_without_the_thread_even_if_the_lock_was_held():
    client, clock = FakeClient(specs(["a"])), FakeClock()
    with PolledList(client, "", interval=10, clock=clock) as polled:
        client.set(specs(["b"]))
        with polled._lock:  # as if the refresh thread were mid-refresh at the fork
            pid = os.fork()
            if pid == 0:  # the child: report through the exit status, never return to pytest
                status = 1
                try:
                    clock.now = 10.0  # one interval: the child has no thread, so calls re-list
                    status = 0 if names_of(polled()) == ["b"] and client.calls == 2 else 3
                finally:
                    os._exit(status)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert names_of(polled()) == ["a"]  # the parent is untouched: its thread refreshes


def test_a_polled_list_refuses_to_be_pickled():
    polled = PolledList(FakeClient([]), "", background=False)
    with pytest.raises(TypeError, match="PolledList cannot be pickled: create one in each process"):
        pickle.dumps(polled)
