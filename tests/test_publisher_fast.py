"""The fast path of `Publisher.publish_uncommitted` / `publish_committed` (JSONMessages to
JSON-lines journals): the same bytes, UUIDs, clocks, offsets, results and errors as the
general path, C and pure Python; safe with threads; and it steps aside where it must.

The general path is the one a publisher with `_stamper = None` takes (the code every message
took before the fast path existed), run side by side with the same producer ID and clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from speedups_support import BULK_BUILT, BULK_MODES, BULK_PURE_REQUESTED, bulk_mode

from oncelog import _bulkframing, identity
from oncelog import publisher as publisher_module
from oncelog.framing import CONTENT_TYPE_JSON_LINES, EncodeError
from oncelog.framing.jsonlines import JSONFraming
from oncelog.journal import FragmentSpec, JournalClient, JournalSpec, _spoolcore, open_journals
from oncelog.journal.appender import Appender
from oncelog.journal.errors import AppendFailed
from oncelog.message import Clock, JSONMessage, clock_from_unix_ns, uuid_text
from oncelog.publisher import Publisher
from oncelog.reading import read_committed, read_uncommitted

JSON = {"content-type": CONTENT_TYPE_JSON_LINES}
BUILT, PURE_REQUESTED, MODES = BULK_BUILT, BULK_PURE_REQUESTED, BULK_MODES
FUTURE_NS = time.time_ns() + 10**9 * 86400 * 365  # clocks then tick deterministically
DEADLINE = 60.0


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """Stamping takes the C path ("c": `oncelog._bulk.stamp_json` on a C-backed clock) or
    pure Python ("pure")."""
    with bulk_mode(request.param):
        yield request.param


@pytest.fixture
def client(tmp_path: Path) -> Iterator[JournalClient]:
    c = open_journals(str(tmp_path / "store"))
    for side in ("fast", "slow", "real"):
        for name in ("a", "b", "c"):
            c.create(JournalSpec(f"{side}/{name}", labels=JSON))
    yield c
    c.close()


class Checked(JSONMessage):
    """A JSONMessage subclass with `validate()`: the general path's business."""

    __slots__ = ()
    validated = 0

    def validate(self) -> None:
        Checked.validated += 1


class Doc(dict):  # type: ignore[type-arg]
    """A dict subclass document: the general path's business."""


def to_journal(journal: str) -> Any:
    return lambda _msg: (journal, CONTENT_TYPE_JSON_LINES)


def route(side: str) -> Any:
    return lambda msg: (f"{side}/{msg.doc['to']}", CONTENT_TYPE_JSON_LINES)


def twin_publishers(client: JournalClient) -> tuple[Publisher, Publisher]:
    """A fast publisher and a general-path one with the same producer ID and clock value."""
    fast, slow = Publisher(client), Publisher(client)
    slow._stamper = None
    slow.producer_id = fast.producer_id
    fast.clock.update(FUTURE_NS)
    slow.clock.update(FUTURE_NS)
    assert fast.clock.value == slow.clock.value
    return fast, slow


def history(pub: Publisher, side: str) -> list[Any]:
    """One fixed sequence of publishing calls; returns what each observably gave."""
    to = route(side)
    seen: list[Any] = []

    def publish(msg: JSONMessage, committed: bool = False) -> None:
        call = pub.publish_committed if committed else pub.publish_uncommitted
        try:
            append = call(to, msg)
        except EncodeError as exc:
            stamped = {k: v for k, v in msg.doc.items() if k != "x"}  # x: not comparable
            seen.append(("error", type(exc).__name__, str(exc), stamped))
            return
        result = append.result()
        seen.append((result.begin, result.end, msg.doc[msg.uuid_field], pub.clock.value))

    for i in range(3):
        publish(JSONMessage({"to": "a", "n": i}), committed=True)
    with pub.transaction():
        for i in range(5):
            publish(JSONMessage({"to": "b", "n": i}))
        for i in range(3):
            publish(JSONMessage({"to": "c", "n": i, "uuid": "replaced in place"}))
        publish(Checked({"to": "b", "n": "checked"}))
        publish(JSONMessage(Doc({"to": "b", "n": "dict subclass"})))
        publish(JSONMessage({"to": "c", "n": "own field"}, uuid_field="id"))
        publish(JSONMessage({"to": "b", "n": "bad", "x": object()}))  # EncodeError
        publish(JSONMessage({"to": "b", "n": "raw", "x": orjson.Fragment(b'"x\ny"')}))
        publish(JSONMessage({"to": "b", "n": "after the errors"}))
    with pytest.raises(RuntimeError, match="roll back"):
        with pub.transaction():
            for i in range(3):
                publish(JSONMessage({"to": "b", "n": f"rolled back {i}"}))
            raise RuntimeError("roll back")
    for i in range(2):
        publish(JSONMessage({"to": "a", "n": f"late {i}"}), committed=True)
    with pub.transaction():
        publish(JSONMessage({"to": "b", "n": "last"}))
        publish(JSONMessage({"to": "b", "n": "last but one"}))
    return seen


def count_fast_appends(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The journals of the appends the fast paths make, in order (stamping errors included).
    `publish_committed`'s goes through `Appender.append_made`, counted here; the publisher's
    lanes are replaced by the pure `Lane`, which makes its appends through that method (the C
    lane makes them in C, out of a patch's reach: tests/test_spool_cores.py tests it against
    the pure one, and the fast-path tests run it unpatched beside the counted run)."""
    made: list[str] = []
    original = Appender.append_made

    def counting(self: Appender, *args: Any) -> Any:
        made.append(self.journal)
        return original(self, *args)

    monkeypatch.setattr(Appender, "append_made", counting)
    monkeypatch.setattr(publisher_module, "Lane", _spoolcore.Lane)
    return made


def journal_bytes(client: JournalClient, journal: str) -> bytes:
    with client.read(journal) as reader:
        return bytes(reader.read())


def test_fast_path_gives_the_general_paths_bytes_uuids_clocks_and_errors(
    client: JournalClient, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast, slow = twin_publishers(client)
    real, _ = twin_publishers(client)  # its lanes as built (C where built), not counted
    real.producer_id = slow.producer_id
    with monkeypatch.context() as patches:
        made = count_fast_appends(patches)
        want = history(slow, "slow")
        assert made == []  # the general path never takes it
        got = history(fast, "fast")
    assert history(real, "real") == want
    assert got == want
    for name in ("a", "b", "c"):
        want_bytes = journal_bytes(client, f"slow/{name}")
        assert journal_bytes(client, f"fast/{name}") == want_bytes
        assert journal_bytes(client, f"real/{name}") == want_bytes
    # The fast path was taken: all 5 committed messages, and every uncommitted JSONMessage
    # with a plain dict after a transaction's first in its journal (the errors included).
    assert made.count("fast/a") == 5
    assert made.count("fast/b") == 4 + 3 + 2 + 1
    assert made.count("fast/c") == 2 + 1
    errors = [s for s in got if s[0] == "error"]
    assert [e[2].split(":")[0] for e in errors] == [
        str(_marshal_error(JSONMessage({"x": object()}))).split(":")[0],
        str(_marshal_error(JSONMessage({"x": orjson.Fragment(b'"x\ny"')}))).split(":")[0],
    ]
    committed = [e.message.doc["n"] for e in read_committed(client, "fast/b")]
    assert committed == [0, 1, 2, 3, 4, "checked", "dict subclass", "after the errors",
                         "last", "last but one"]


def _marshal_error(msg: JSONMessage) -> EncodeError:
    with pytest.raises(EncodeError) as info:
        JSONFraming().marshal(msg)
    return info.value


def test_concurrent_publishing_keeps_clock_order_and_loses_nothing(
    client: JournalClient, mode: str
) -> None:
    pub = Publisher(client)
    threads_n, each = 4, 250
    barrier = threading.Barrier(threads_n)
    errors: list[BaseException] = []

    def work(t: int, journal: str, committed: bool) -> None:
        try:
            barrier.wait(DEADLINE)
            call = pub.publish_committed if committed else pub.publish_uncommitted
            for i in range(each):
                call(to_journal(journal), JSONMessage({"n": t * 1000 + i}))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def run(journal: str, committed: bool) -> None:
        threads = [threading.Thread(target=work, args=(t, journal, committed))
                   for t in range(threads_n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(DEADLINE)
            assert not th.is_alive()

    run("fast/a", True)
    with pub.transaction():
        pub.publish_uncommitted(to_journal("fast/b"), JSONMessage({"n": -1}))
        run("fast/b", False)  # under the open transaction, from four threads
    assert errors == []
    pub.flush()
    expected = sorted(t * 1000 + i for t in range(threads_n) for i in range(each))
    for journal, extra in (("fast/a", []), ("fast/b", [-1])):
        envs = read_uncommitted(client, journal)
        clocks = [e.clock for e in envs if e.producer == pub.producer_id]
        assert all(a < b for a, b in zip(clocks, clocks[1:])), journal
        docs = [e.message.doc["n"] for e in read_committed(client, journal)]
        assert sorted(docs) == sorted(extra + expected)


def test_fast_path_steps_aside(client: JournalClient, mode: str,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    made = count_fast_appends(monkeypatch)
    to_b = route("fast")
    # A transactional id, or a clock of the caller's: the general path throughout.
    for pub in (Publisher(client, transactional_id="svc"), Publisher(client, Clock(5))):
        with pub.transaction():
            for i in range(3):
                pub.publish_uncommitted(to_b, JSONMessage({"to": "b", "n": i}))
        assert made == []
    # The journal deleted and created again under an open transaction: the general path
    # finds the new appender (as `start_append` would) instead of the closed one.
    pub = Publisher(client)
    with pytest.raises(RuntimeError, match="done"):
        with pub.transaction():
            pub.publish_uncommitted(to_b, JSONMessage({"to": "c", "n": 0}))
            pub.publish_uncommitted(to_b, JSONMessage({"to": "c", "n": 1}))
            assert made == ["fast/c"]
            client.delete("fast/c")
            client.create(JournalSpec("fast/c", labels=JSON))
            pub.publish_uncommitted(to_b, JSONMessage({"to": "c", "n": 2}))
            assert made == ["fast/c"]  # not on the dropped appender
            raise RuntimeError("done")


def test_stamp_json_c_and_pure_agree() -> None:
    producer = bytes([0x81, 0x02, 0x40, 0x08, 0x10, 0xFF])
    variants = [(_bulkframing.stamp_json_pure, Clock)]
    if BUILT is not None and not PURE_REQUESTED:
        variants.append((BUILT.stamp_json, Clock))
    outputs = []
    for stamp, make_clock in variants:
        clock = make_clock()
        clock.update(FUTURE_NS)
        doc: dict[str, Any] = {"b": [1, 2], "uuid": "old", "z": "é"}
        line, value = stamp(doc, "uuid", producer, clock, 1, _bulkframing.stamp_failed)
        assert value == clock.value == clock_from_unix_ns(FUTURE_NS) + 1
        assert doc["uuid"] == uuid_text(producer, value, 1)
        assert line == JSONFraming().marshal(doc)
        errors = []
        for bad in ({"x": object()}, {"x": orjson.Fragment(b'"a\nb"')}, {1: 2}):
            with pytest.raises(EncodeError) as info:
                stamp(dict(bad), "uuid", producer, clock, 1, _bulkframing.stamp_failed)
            errors.append(str(info.value))
        assert clock.value == value + 3  # the clock moved for each, as on the general path
        outputs.append((line, errors))
    assert all(o == outputs[0] for o in outputs)


def _clock_bases() -> list[type]:
    bases: list[type] = [identity._ClockState]
    if BUILT is not None and not PURE_REQUESTED:
        bases.append(BUILT.ClockCore)
    return bases


@pytest.mark.parametrize("base", _clock_bases(), ids=lambda b: b.__name__)
def test_clock_states_agree(base: type) -> None:
    c = base(10)
    assert (c.tick(), c.reserve(5), c.value) == (11, 12, 16)
    assert c._raise_to(100) == 100 and c._raise_to(50) == 100
    with pytest.raises(ValueError, match="at least one"):
        c.reserve(0)
    top = base((1 << 64) - 1)
    assert top.tick() == 0  # wraps as a 64-bit clock
    top = base((1 << 64) - 2)
    assert top.reserve(3) == (1 << 64) - 1 and top.value == 1
    late = base(clock_from_unix_ns(FUTURE_NS))
    assert late.advance() == clock_from_unix_ns(FUTURE_NS) + 1  # ahead of now: +1
    now = base(0)
    before = clock_from_unix_ns(time.time_ns())
    got = now.advance()
    assert before < got <= clock_from_unix_ns(time.time_ns()) + 1  # moved to now, +1


@pytest.mark.parametrize("base", _clock_bases(), ids=lambda b: b.__name__)
def test_clock_state_is_atomic_under_threads(base: type) -> None:
    """Every value is issued once, and each thread sees its own values grow."""
    clock = base(clock_from_unix_ns(FUTURE_NS))
    threads_n, each = 6, 3000
    barrier = threading.Barrier(threads_n)
    seen: list[list[int]] = [[] for _ in range(threads_n)]

    def work(t: int) -> None:
        barrier.wait(DEADLINE)
        out = seen[t]
        for i in range(each):
            out.append(clock.advance() if i % 3 else clock.tick())
            if i % 97 == 0:
                first = clock.reserve(4)
                out.extend(range(first, first + 4))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(threads_n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(DEADLINE)
        assert not th.is_alive()
    values = [v for out in seen for v in out]
    assert len(set(values)) == len(values)
    assert all(all(a < b for a, b in zip(out, out[1:])) for out in seen)
    assert clock.value == max(values) == clock_from_unix_ns(FUTURE_NS) + len(values)


def test_clock_is_backed_by_the_c_state_when_built() -> None:
    if PURE_REQUESTED or BUILT is None:
        assert identity._ClockBase is identity._ClockState
    else:
        assert issubclass(Clock, BUILT.ClockCore)
    c = Clock(7)
    assert repr(c) == "Clock(0x7)" and c.value == 7
    with pytest.raises(ValueError, match="64-bit"):
        Clock(1 << 64)


def test_append_made_is_start_write_release(client: JournalClient) -> None:
    appender = client._appender("fast/a")
    first = client.start_append("fast/a")
    first.write(b"one\n")
    first.release()
    made, token = appender.append_made(lambda a, b: (a + b, "token"), b"two", b"\n")
    assert token == "token"

    def broken() -> tuple[bytes, Any]:
        raise EncodeError("cannot make it")

    with pytest.raises(EncodeError, match="cannot make it"):
        appender.append_made(broken)
    # The write lock was let go: another thread appends at once.
    done = threading.Event()
    results = []

    def other() -> None:
        results.append(client.append("fast/a", b"three\n"))
        done.set()

    threading.Thread(target=other, daemon=True).start()
    assert done.wait(DEADLINE)
    assert (first.result().begin, first.result().end) == (0, 4)
    assert (made.result().begin, made.result().end) == (4, 8)
    assert (results[0].begin, results[0].end) == (8, 14)
    assert journal_bytes(client, "fast/a") == b"one\ntwo\nthree\n"



def test_a_clock_copies_and_pickles_with_its_value() -> None:
    # Whichever state backs it (C where built): a copy or an unpickled clock has the value,
    # and a state of its own.
    import copy
    import pickle

    clock = Clock(12345)
    clock.tick()
    for twin in (copy.copy(clock), copy.deepcopy(clock), pickle.loads(pickle.dumps(clock))):
        assert type(twin) is Clock and twin.value == 12346
        twin.tick()
        assert (twin.value, clock.value) == (12347, 12346)


def test_a_transaction_keeps_an_outstanding_append_per_fragment_not_per_message(
    client: JournalClient, mode: str
) -> None:
    pub = Publisher(client)
    with pub.transaction():
        appends = [pub.publish_uncommitted(to_journal("fast/a"), JSONMessage({"n": i}))
                   for i in range(3000)]
        batches = {id(a._batch) for a in appends}
        # The latest append of each batch (fragment-to-be) stands for the ones before it.
        assert len(pub._outstanding) == len(batches) < 10
    assert all(a.done() for a in appends)
    docs = [e.message.doc["n"] for e in read_committed(client, "fast/a")]
    assert docs == list(range(3000))


def fail_nth_fragment(client: JournalClient, journal: str, nth: int) -> list[int]:
    """Make the `nth` fragment the journal's appender writes from now on fail ("disk on
    fire"); returns the sizes of the batches it was asked to write, which grows as it
    writes."""
    appender = client._appender(journal)
    real = appender._persister.persist
    calls: list[int] = []

    def persist(buf: bytearray) -> int:
        calls.append(len(buf))
        if len(calls) == nth:
            raise OSError("disk on fire")
        return real(buf)

    appender._persister.persist = persist  # type: ignore[method-assign]
    return calls


def test_flush_reports_an_earlier_fragment_that_failed_though_later_ones_were_written(
    client: JournalClient, mode: str
) -> None:
    pub = Publisher(client)
    to_a = to_journal("fast/a")
    pub.publish_committed(to_a, JSONMessage({"n": 0})).result()
    fail_nth_fragment(client, "fast/a", 1)
    failed = pub.publish_committed(to_a, JSONMessage({"n": 1}))
    with pytest.raises(AppendFailed, match="disk on fire"):
        failed.result(DEADLINE)
    later = pub.publish_committed(to_a, JSONMessage({"n": 2}))
    assert later.result(DEADLINE).begin > 0 and failed._batch is not later._batch
    with pytest.raises(AppendFailed, match="disk on fire"):
        pub.flush(DEADLINE)  # the failed fragment is still reported: never a false success
    pub.flush(DEADLINE)  # reported once
    assert [e.message.doc["n"] for e in read_committed(client, "fast/a")] == [0, 2]


def test_a_failed_append_is_never_forgotten_by_pruning(memory_store: Any) -> None:
    """Pruning drops durable appends from the front of what a commit waits for, never a
    failed one (it is `done()` too): a transaction that lost a message does not commit, however
    many appends came after it."""
    client = memory_store.open(retry_timeout=0.2)
    try:
        client.create(JournalSpec("tiny/a", labels=JSON, fragment=FragmentSpec(length=64)))
        pub = Publisher(client)
        to_a = to_journal("tiny/a")
        calls = fail_nth_fragment(client, "tiny/a", 2)
        pad = "x" * 64  # every message fills a fragment of its own
        with pytest.raises(AppendFailed, match="nothing was committed"):
            with pub.transaction():
                first = pub.publish_uncommitted(to_a, JSONMessage({"n": 0, "pad": pad}))
                lost = pub.publish_uncommitted(to_a, JSONMessage({"n": 1, "pad": pad}))
                assert first._batch is not lost._batch
                with pytest.raises(AppendFailed, match="disk on fire"):
                    lost.result(DEADLINE)
                for i in range(2, 1040):  # past the bound (1,024 entries): pruning runs
                    pub.publish_uncommitted(to_a, JSONMessage({"n": i, "pad": pad}))
        assert len(calls) > 2
        assert list(read_committed(client, "tiny/a")) == []
    finally:
        client.close()
