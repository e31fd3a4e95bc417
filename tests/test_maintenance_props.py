"""Exactly once after maintenance, as a property: random interleavings of raw appends from
several long-lived clients (some idle for many steps), Publisher messages and transactions
(committed, rolled back, left open), compaction (retirement grace 0 or long), gc, trims by
offset and by time, readers opened early and advanced later, and head() calls.

A model keeps every acknowledged append (its offsets and bytes: every byte of the journal
is an acknowledged append, ACK intents included). After every step: a fresh client and
every long-lived one read exactly the model from the first available offset, at the
offsets each message was acknowledged at; read_committed delivers every committed message
at or above the first available offset exactly once; readers opened earlier deliver the
true continuation (or OffsetNotAvailable when their position was trimmed, never a jump);
head() is the true head; verify() finds nothing wrong.

Two properties: one whose raw payloads are all distinct, and one where writers append the
same bytes (repeated lines are legitimate data: `b'{"tick": 1}\\n'` appended twice is two
appends, and both must be in the journal).
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Iterator

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oncelog import JSONMessage, Publisher, read_committed, read_uncommitted
from oncelog.journal import JournalClient, JournalReader, compaction
from oncelog.journal.errors import OffsetNotAvailable
from oncelog.testing.fixtures import StoreTarget
from tests.journal_support import new_journal

WRITERS = 3
PULL_TIMEOUT = 20.0  # seconds a blocking read_committed iterator may take per envelope


@dataclass
class Span:
    """One acknowledged append: `data` is None until first read (publisher messages, whose
    bytes the publisher frames; `doc` then says what they must be)."""

    begin: int
    end: int
    data: bytes | None
    kind: str  # "raw" (JSON lines without UUIDs), "pub" (one message), "ack" (an ACK intent)
    doc: dict[str, Any] | None = None
    committed: bool = True  # False for the messages of an open or rolled-back transaction
    txn: int | None = None  # the transaction id of an uncommitted message


@dataclass
class CommittedIter:
    """A read_committed iterator opened at some step and advanced at later ones."""

    it: Iterator[Any]
    pool: ThreadPoolExecutor
    reader: list[Any] = field(default_factory=list)  # its JournalReader (via on_open)
    start: int | None = None
    delivered: Counter[tuple[int, int]] = field(default_factory=Counter)
    dead: bool = False


class Model:
    def __init__(self, target: StoreTarget) -> None:
        self.target = target
        self.clients = [target.open() for _ in range(WRITERS)]
        self.maint = target.open()
        # Long-lived clients that only read (checks on the writers' clients would refresh
        # their indexes after every step: they could never go stale).
        self.readers = [target.open() for _ in range(2)]
        self.name = new_journal(self.maint, length=120)
        self.pub_committed = Publisher(self.clients[0])
        self.pub_txn = Publisher(self.clients[1])
        self.to = lambda m: (self.name, "application/x-ndjson")
        self.spans: dict[int, Span] = {}
        self.head = 0
        self.first = 0
        self.counter = 0
        self.txn = 0
        self.txn_open: list[int] = []  # begins of the open transaction's messages
        self.stamps: list[float] = []  # times right after acknowledgements
        self.raw_readers: list[tuple[JournalReader, list[int]]] = []  # reader, [position]
        self.iters: list[CommittedIter] = []
        self.log: list[str] = []

    # -- the model ------------------------------------------------------------------------

    def ack(self, begin: int, end: int, span: Span) -> None:
        assert begin == self.head, (
            f"append acknowledged at {begin}-{end} but the head was {self.head}: "
            f"{self.log}"
        )
        assert end > begin
        self.spans[begin] = span
        self.head = end
        self.stamps.append(time.time())

    def lines(self) -> list[Span]:
        """Every message (JSON line) in offset order, as spans of their own."""
        out = []
        for b in sorted(self.spans):
            s = self.spans[b]
            if s.kind != "raw":
                out.append(s)
                continue
            assert s.data is not None
            at = b
            for line in s.data.splitlines(keepends=True):
                out.append(Span(at, at + len(line), line, "raw"))
                at += len(line)
        return out

    # -- steps ------------------------------------------------------------------------------

    def payload(self, lines: int, repeated: bool) -> bytes:
        out = []
        for _ in range(lines):
            self.counter += 1
            out.append(b'{"tick": 1}\n' if repeated else b'{"n": %d}\n' % self.counter)
        return b"".join(out)

    def append(self, w: int, lines: int, repeated: bool) -> None:
        data = self.payload(lines, repeated)
        r = self.clients[w].append(self.name, data)
        self.ack(r.begin, r.end, Span(r.begin, r.end, data, "raw"))

    def publish(self, op: str, count: int) -> None:
        if op == "committed":
            for _ in range(count):
                self.counter += 1
                doc = {"p": self.counter}
                msg = JSONMessage(dict(doc))
                r = self.pub_committed.publish_committed(self.to, msg).result()
                self.ack(r.begin, r.end, Span(r.begin, r.end, None, "pub", msg.doc))
        elif op == "uncommitted":
            if not self.txn_open:
                self.txn += 1
            for _ in range(count):
                self.counter += 1
                msg = JSONMessage({"t": self.counter})
                r = self.pub_txn.publish_uncommitted(self.to, msg).result()
                span = Span(r.begin, r.end, None, "pub", msg.doc, False, self.txn)
                self.ack(r.begin, r.end, span)
                self.txn_open.append(r.begin)
        elif op in ("commit", "rollback"):
            if not self.txn_open:
                return
            intents = (
                self.pub_txn.build_ack_intents()
                if op == "commit"
                else self.pub_txn.build_rollback_intents()
            )
            for intent in intents:
                r = self.clients[2].append(intent.journal, intent.intent)
                self.ack(r.begin, r.end, Span(r.begin, r.end, intent.intent, "ack"))
            if op == "commit":
                for b in self.txn_open:
                    self.spans[b].committed = True
            self.txn_open = []

    def compact(self, who: int, grace0: bool, retire_again: bool) -> None:
        c = self.maint if who >= WRITERS else self.clients[who]
        c.compact(self.name, retire_grace=0 if grace0 else 3600)
        if retire_again:
            compaction.retire(c, self.name, 0)

    def gc(self) -> None:
        self.maint.gc(self.name, grace=0)

    def trim(self, fraction: float, by_time: bool) -> None:
        before_first = self.first
        if by_time:
            if not self.stamps:
                return
            stamp = self.stamps[min(int(fraction * len(self.stamps)), len(self.stamps) - 1)]
            result = self.maint.trim(self.name, before=datetime.fromtimestamp(stamp, UTC))
            bound = self.head
        else:
            lines = [s for s in self.lines() if s.begin >= self.first]
            if not lines:
                return
            bound = lines[min(int(fraction * len(lines)), len(lines) - 1)].begin
            result = self.maint.trim(self.name, before=bound)
        boundaries = {s.begin for s in self.spans.values()} | {self.head}
        assert result.first in boundaries, (result.first, sorted(boundaries))
        assert before_first <= result.first <= bound, (before_first, result.first, bound)
        self.first = max(self.first, result.first)

    def head_of(self, w: int) -> None:
        assert self.clients[w].head(self.name) == self.head

    def client(self, k: int) -> JournalClient:
        """Writer k's client (its index then goes fresh), or a long-lived reader's."""
        return self.clients[k] if k < WRITERS else self.readers[k % 2]

    def open_raw(self, w: int, at_head: bool) -> None:
        offset = self.head if at_head else 0
        reader = self.client(w).read(self.name, offset)
        want = offset if at_head else self.first
        assert reader.offset == want, (reader.offset, want)
        self.raw_readers.append((reader, [reader.offset]))

    def open_committed(self, w: int, at_head: bool) -> None:
        holder: list[Any] = []
        offset = self.head if at_head else 0
        it = read_committed(
            self.client(w), self.name, offset, block=True, on_open=holder.append
        )
        ci = CommittedIter(iter(it), ThreadPoolExecutor(1), holder)
        ci.start = offset if at_head else None
        self.iters.append(ci)

    def advance_raw(self, k: int, n: int) -> None:
        if not self.raw_readers:
            return
        reader, pos = self.raw_readers[k % len(self.raw_readers)]
        if pos[0] < 0:
            return  # failed before
        assert reader.offset == pos[0]
        image = self.image()
        try:
            data = reader.read(n)
        except OffsetNotAvailable:
            assert pos[0] < self.first, (
                f"a reader at {pos[0]} raised OffsetNotAvailable; first is {self.first}"
            )
            pos[0] = -1
            return
        assert data == image[pos[0] : pos[0] + len(data)], (
            f"a reader opened earlier at {pos[0]} delivered other bytes: {data!r}"
        )
        if pos[0] < self.head:
            assert data, f"a reader at {pos[0]} < head {self.head} returned nothing"
        pos[0] += len(data)
        assert reader.offset == pos[0]

    def advance_committed(self, k: int) -> None:
        live = [ci for ci in self.iters if not ci.dead]
        if not live:
            return
        ci = live[k % len(live)]
        lines = self.lines()
        start = ci.start
        if start is None:
            # Not opened yet: it opens now (offset 0 -> the first available offset).
            start = self.first
        want = Counter(
            (s.begin, s.end)
            for s in lines
            if s.begin >= start and s.committed and s.kind != "ack"
        )
        todo = want - ci.delivered
        got: Counter[tuple[int, int]] = Counter()
        by_begin = {s.begin: s for s in lines}
        for _ in range(sum(todo.values())):
            fut = ci.pool.submit(next, ci.it)
            try:
                env = fut.result(PULL_TIMEOUT)
            except FutureTimeout:
                pytest.fail(
                    f"read_committed opened at {start} delivered {dict(got)} of "
                    f"{dict(todo)} and then nothing for {PULL_TIMEOUT} s; log {self.log}"
                )
            except OffsetNotAvailable:
                at = ci.reader[0].offset if ci.reader else start
                assert at < self.first, (
                    f"read_committed raised OffsetNotAvailable at {at}, first {self.first}"
                )
                ci.dead = True
                return
            if ci.start is None:
                assert ci.reader, "on_open was not called"
                ci.start = start
            key = (env.begin, env.end)
            span = by_begin.get(env.begin)
            assert span is not None and span.end == env.end, (
                f"read_committed delivered {key}, not an acknowledged message's offsets"
            )
            check_message(span, env)
            got[key] += 1
        ci.delivered += got
        assert got == todo, (dict(got), dict(todo))

    def image(self) -> bytes:
        """The journal's bytes from 0 to the head (publisher messages as first read)."""
        out = bytearray()
        for b in sorted(self.spans):
            s = self.spans[b]
            assert s.data is not None, f"publisher message at {b} never read"
            out += s.data
        return bytes(out)

    # -- the invariants ----------------------------------------------------------------------

    def check(self) -> None:
        fresh = self.target.open()
        try:
            for c in [fresh, *self.readers]:
                self.check_client(c)
            report = fresh.verify(self.name)
            assert report.ok, f"verify: {report.problems}; log {self.log}"
        finally:
            fresh.close()

    def check_client(self, c: JournalClient) -> None:
        assert c.first_offset(self.name) == self.first, (c.first_offset(self.name), self.first)
        assert c.head(self.name) == self.head
        with c.read(self.name, 0) as reader:
            assert reader.offset == self.first
            data = reader.read()
        lines = [s for s in self.lines() if s.begin >= self.first]
        assert len(data) == self.head - self.first
        # Learn the publisher's bytes at their acknowledged offsets, then compare all.
        envs = list(read_uncommitted(c, self.name))
        assert [(e.begin, e.end) for e in envs] == [(s.begin, s.end) for s in lines], (
            f"read_uncommitted offsets differ from the acknowledged ones; log {self.log}"
        )
        for env, span in zip(envs, lines):
            check_message(span, env)
            chunk = data[env.begin - self.first : env.end - self.first]
            if span.kind == "pub" and self.spans[span.begin].data is None:
                self.spans[span.begin].data = chunk
            span = self.spans.get(span.begin, span)
            if span.kind == "raw":
                continue
            assert chunk == span.data, (env.begin, chunk, span.data)
        image = self.image() if self.first == 0 or self.all_known() else None
        if image is not None:
            assert data == image[self.first :]
        for s in self.lines():
            if s.kind == "raw" and s.begin >= self.first:
                assert data[s.begin - self.first : s.end - self.first] == s.data
        committed = Counter(
            (e.begin, e.end) for e in read_committed(c, self.name)
        )
        want = Counter(
            (s.begin, s.end) for s in lines if s.committed and s.kind != "ack"
        )
        assert committed == want, (
            f"read_committed from 0: extra {dict(committed - want)}, missing "
            f"{dict(want - committed)}; log {self.log}"
        )
        if self.first > 0:
            below = [s for s in self.lines() if s.end <= self.first]
            if below:
                with pytest.raises(OffsetNotAvailable):
                    c.read(self.name, below[-1].begin, exact=True).read()

    def all_known(self) -> bool:
        return all(s.data is not None for s in self.spans.values())

    def close(self) -> None:
        for reader, _ in self.raw_readers:
            reader.close()
        for c in [*self.clients, *self.readers, self.maint]:
            c.close()  # wakes the blocked committed iterators: their readers end
        for ci in self.iters:
            ci.pool.shutdown(wait=False, cancel_futures=True)


def check_message(span: Span, env: Any) -> None:
    """An envelope at a span's offsets is that span's message."""
    if span.kind == "pub":
        assert env.message.doc == span.doc, (env.begin, env.message.doc, span.doc)
    elif span.kind == "raw":
        assert span.data is not None
        assert env.message.doc == orjson.loads(span.data), (env.begin, span.data)


# -- steps ------------------------------------------------------------------------------------

writer = st.integers(0, WRITERS - 1)
STEPS = st.one_of(
    st.tuples(st.just("append"), writer, st.integers(1, 3)),
    st.tuples(st.just("append"), writer, st.integers(1, 3)),
    st.tuples(st.just("publish"), st.sampled_from(
        ["committed", "uncommitted", "uncommitted", "commit", "rollback"]
    ), st.integers(1, 3)),
    st.tuples(st.just("compact"), st.integers(0, WRITERS), st.booleans(), st.booleans()),
    st.tuples(st.just("gc")),
    st.tuples(st.just("trim"), st.floats(0, 1), st.booleans()),
    st.tuples(st.just("head"), writer),
    st.tuples(st.just("open_raw"), st.integers(0, WRITERS + 1), st.booleans()),
    st.tuples(st.just("open_committed"), st.integers(0, WRITERS + 1), st.booleans()),
    st.tuples(st.just("advance_raw"), st.integers(0, 7), st.integers(1, 300)),
    st.tuples(st.just("advance_committed"), st.integers(0, 7)),
)


def run(target: StoreTarget, steps: list[tuple[Any, ...]], repeated: bool) -> None:
    model = Model(target)
    try:
        # A few appends by every writer first, so that each has learned a head to go stale.
        for w in range(WRITERS):
            model.append(w, 1, repeated)
        model.check()
        for step in steps:
            model.log.append(repr(step))
            kind = step[0]
            if kind == "append":
                model.append(step[1], step[2], repeated)
            elif kind == "publish":
                model.publish(step[1], step[2])
            elif kind == "compact":
                model.compact(step[1], step[2], step[3])
            elif kind == "gc":
                model.gc()
            elif kind == "trim":
                model.trim(step[1], step[2])
            elif kind == "head":
                model.head_of(step[1])
            elif kind == "open_raw":
                model.open_raw(step[1], step[2])
            elif kind == "open_committed":
                model.open_committed(step[1], step[2])
            elif kind == "advance_raw":
                model.advance_raw(step[1], step[2])
            elif kind == "advance_committed":
                model.advance_committed(step[1])
            model.check()
        # Finally every reader opened along the way delivers the rest.
        for k in range(len(model.raw_readers)):
            for _ in range(50):  # bounded: each read returns bytes or ends the loop
                before = model.raw_readers[k][1][0]
                model.advance_raw(k, 10_000)
                if model.raw_readers[k][1][0] in (before, -1):
                    break
            pos = model.raw_readers[k][1][0]
            assert pos in (-1, model.head), (k, pos, model.head)
        for k in range(len(model.iters)):
            model.advance_committed(k)
        # And every writer, idle or not, knows the true head and reads the model.
        for c in model.clients:
            model.check_client(c)
    finally:
        model.close()


SETTINGS = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=False,
)


@settings(max_examples=150, **SETTINGS)  # type: ignore[arg-type]
@given(steps=st.lists(STEPS, min_size=1, max_size=24))
def test_maintenance_property_memory(memory_store: StoreTarget, steps: list[Any]) -> None:
    run(memory_store, steps, repeated=False)


@settings(max_examples=150, **SETTINGS)  # type: ignore[arg-type]
@given(steps=st.lists(STEPS, min_size=1, max_size=24))
def test_maintenance_property_repeated_payloads_memory(
    memory_store: StoreTarget, steps: list[Any]
) -> None:
    run(memory_store, steps, repeated=True)


@pytest.mark.slow
@settings(max_examples=50, **SETTINGS)  # type: ignore[arg-type]
@given(steps=st.lists(STEPS, min_size=1, max_size=16))
def test_maintenance_property_local(local_store: StoreTarget, steps: list[Any]) -> None:
    run(local_store, steps, repeated=False)
