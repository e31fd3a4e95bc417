"""Reading many journals at once: merged streams and time-ordered packs.

`read_selector` merges the messages of every journal matching a label selector.
`read_time_ordered` groups read-committed messages of those journals into *packs*
of consecutive time ticks, each emitted only once every journal has passed the
tick's end, so that packs come out in time order across journals.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Callable, Iterator

from oncelog.message import Envelope, Flags, clock_to_unix_ns
from oncelog.reading import OnError, read_committed, read_uncommitted

if TYPE_CHECKING:
    from oncelog.journal import JournalClient

__all__ = ["IdleTicks", "read_selector", "read_time_ordered", "Pack"]

_END = object()  # a journal's reader reached the end of its data (non-blocking) or stopped


@dataclass(slots=True)
class Pack:
    """Messages whose UUID clocks fall in `[begin_clock, end_clock)`, sorted by clock.

    `late` holds messages that arrived after the pack of their tick was emitted
    (see `read_time_ordered`); they are delivered in the next pack instead.
    """

    begin_clock: int
    end_clock: int
    envelopes: list[Envelope] = field(default_factory=list)
    late: list[Envelope] = field(default_factory=list)

    @property
    def start(self) -> datetime:
        return datetime.fromtimestamp(clock_to_unix_ns(self.begin_clock) / 1e9, tz=timezone.utc)

    @property
    def end(self) -> datetime:
        return datetime.fromtimestamp(clock_to_unix_ns(self.end_clock) / 1e9, tz=timezone.utc)

    def __len__(self) -> int:
        return len(self.envelopes) + len(self.late)


class _Feeder:
    """One thread per journal pushing envelopes into a shared, bounded queue."""

    def __init__(
        self, make_iter: Callable[[str, Callable[[Any], None]], Iterator[Envelope]],
        maxsize: int = 4096,
    ) -> None:
        self.queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize)
        self._make_iter = make_iter
        self._stop = threading.Event()
        self._threads: dict[str, threading.Thread] = {}
        self._readers: list[Any] = []  # JournalReaders, closed to stop blocked reads
        self._lock = threading.Lock()

    def add(self, journal: str) -> None:
        with self._lock:
            if journal in self._threads or self._stop.is_set():
                return
            t = threading.Thread(target=self._run, args=(journal,), daemon=True,
                                 name=f"oncelog-merge-{journal}")
            self._threads[journal] = t
        t.start()

    def journals(self) -> list[str]:
        with self._lock:
            return list(self._threads)

    def _put(self, item: tuple[str, Any]) -> bool:
        while not self._stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _opened(self, reader: Any) -> None:
        with self._lock:
            self._readers.append(reader)
            stopped = self._stop.is_set()
        if stopped:
            reader.close()

    def _run(self, journal: str) -> None:
        it = self._make_iter(journal, self._opened)
        try:
            for env in it:
                if not self._put((journal, env)):
                    return
        except BaseException as exc:  # handed to the consuming thread
            self._put((journal, exc))
            return
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()
        self._put((journal, _END))

    def close(self) -> None:
        """Stop every feeder: closing its journal reader ends a blocked read."""
        with self._lock:
            self._stop.set()
            readers = list(self._readers)
            threads = list(self._threads.values())
        for reader in readers:
            reader.close()
        for t in threads:
            t.join(timeout=10)


def _iter_factory(
    client: "JournalClient",
    committed: bool,
    block: bool,
    include_acks: bool,
    new_message: Any,
    on_error: OnError,
) -> Callable[..., Iterator[Envelope]]:
    def make(journal: str, on_open: Callable[[Any], None] | None = None) -> Iterator[Envelope]:
        if committed:
            return read_committed(client, journal, block=block, include_acks=include_acks,
                                  new_message=new_message, on_error=on_error, on_open=on_open)
        return read_uncommitted(client, journal, block=block, new_message=new_message,
                                on_error=on_error, on_open=on_open)

    return make


def read_selector(
    client: "JournalClient",
    selector: str = "",
    *,
    committed: bool = True,
    block: bool = False,
    poll_interval: float = 5.0,
    new_message: Any = None,
    on_error: OnError = "raise",
) -> Iterator[Envelope]:
    """Messages of every journal matching `selector`, merged.

    Each journal's messages keep their order; journals interleave as they are read.
    Non-blocking, journals are read one after another to their heads. With
    `block=True` every journal is tailed at once, and journals created later that
    match the selector are picked up every `poll_interval` seconds.
    """
    make = _iter_factory(client, committed, block, False, new_message, on_error)
    if not block:
        for spec in client.list(selector):
            yield from make(spec.name)
        return
    feeder = _Feeder(make)
    try:
        next_poll = 0.0
        while True:
            now = time.monotonic()
            if now >= next_poll:
                for spec in client.list(selector):
                    feeder.add(spec.name)
                next_poll = now + poll_interval
            try:
                journal, item = feeder.queue.get(timeout=max(0.05, next_poll - now))
            except queue.Empty:
                continue
            if isinstance(item, BaseException):
                raise item
            if item is not _END:
                yield item
    finally:
        feeder.close()


IdleTicks = Callable[[str], "tuple[int, int] | None"]
"""`idle(journal)`: `(offset, clock)` if every message of the journal after `offset` will
have a clock above `clock` (it is idle there), else None. See `read_time_ordered`."""


def _tick_seconds(tick: timedelta | float) -> float:
    return tick.total_seconds() if isinstance(tick, timedelta) else float(tick)


def _tick_clock(tick: timedelta | float) -> int:
    seconds = tick.total_seconds() if isinstance(tick, timedelta) else float(tick)
    if seconds <= 0:
        raise ValueError(f"tick must be positive, not {tick!r}")
    return max(1, round(seconds * 1e7)) << 4  # 100 ns units above 4 sequence bits


def read_time_ordered(
    client: "JournalClient",
    selector: str = "",
    tick: timedelta | float = timedelta(seconds=1),
    *,
    block: bool = False,
    new_message: Any = None,
    on_error: OnError = "raise",
    idle: IdleTicks | None = None,
) -> Iterator[Pack]:
    """Read-committed messages of the journals matching `selector`, in packs of time ticks.

    Guarantee: pack `[t, t + tick)` is emitted only after every journal has *passed*
    `t + tick`: it delivered a committed message or an acknowledgement with a clock
    at or beyond `t + tick`, or (non-blocking) reached the end of its data. So,
    provided each producer's clocks only grow (as a Publisher's do), packs cover
    disjoint, increasing ticks, and within a pack messages are sorted by
    (clock, journal, offset). A committed message whose clock falls in a tick
    already emitted (a transaction committed long after it began, or a producer
    whose clock lags) is not dropped: it is delivered in the next pack, in `late`.
    Messages with a nil UUID have no time and go into the pack being assembled.
    Empty ticks are skipped. Journals are fixed when reading starts; with
    `block=True`, an idle journal holds packs back until it writes again, unless `idle`
    says how far it has passed without writing: `idle(journal)` gives `(offset, clock)`
    when every message after `offset` will have a later clock (the streaming node's idle
    ticks: `oncelog.streaming.idle_ticks(client)`); once the journal was read to `offset`,
    its watermark moves to `clock`. It is asked after `tick` without news.
    """
    width = _tick_clock(tick)
    journals = [spec.name for spec in client.list(selector)]
    if not journals:
        return
    make = _iter_factory(client, True, block, True, new_message, on_error)
    feeder = _Feeder(make)
    watermark = {j: 0 for j in journals}
    position = {j: 0 for j in journals}  # the end of the last envelope read
    quiet = max(_tick_seconds(tick), 0.01) if idle is not None and block else None
    done: set[str] = set()
    buffered: list[Envelope] = []  # committed messages not yet in an emitted pack
    nil: list[Envelope] = []
    late: list[Envelope] = []
    emitted_end = 0  # clock before which every pack was emitted
    try:
        for j in journals:
            feeder.add(j)
        while True:
            # Emit every pack whose end all journals have passed.
            low = min((w for j, w in watermark.items() if j not in done), default=None)
            while buffered or nil or late:
                start_clock = min((e.ids[1] for e in buffered), default=None)
                if start_clock is None:
                    start_clock = emitted_end
                begin = start_clock - start_clock % width
                end = begin + width
                if low is not None and low < end:
                    break
                keep = [e for e in buffered if e.ids[1] < end]
                buffered = [e for e in buffered if e.ids[1] >= end]
                keep.sort(key=lambda e: (e.ids[1], e.journal, e.begin))
                pack = Pack(begin, end, nil + keep, late)
                nil, late = [], []
                emitted_end = max(emitted_end, end)
                if len(pack):
                    yield pack
            if len(done) == len(journals):
                return
            try:
                journal, item = feeder.queue.get(timeout=quiet)
            except queue.Empty:  # only with `quiet`: ask the idle journals how far they are
                assert idle is not None
                for j in journals:
                    if j in done:
                        continue
                    passed = idle(j)
                    if passed is not None and position[j] >= passed[0]:
                        watermark[j] = max(watermark[j], passed[1])
                continue
            if item is _END:
                done.add(journal)
                continue
            if isinstance(item, BaseException):
                raise item
            env: Envelope = item
            position[journal] = max(position[journal], env.end)
            clock, flags = env.ids[1], env.ids[2]
            if clock == 0:
                nil.append(env)
                continue
            watermark[journal] = max(watermark[journal], clock)
            if flags == Flags.ACK_TXN:
                continue  # progress only
            if clock < emitted_end:
                late.append(env)
            else:
                buffered.append(env)
    finally:
        feeder.close()
