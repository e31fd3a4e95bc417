"""The Python client of streaming nodes, in the shape of Milvus's WAL accesser.

`connect(addresses, token=...)` gives a `StreamingClient`:

- `append(channel, msg, vchannel=...)`, `append_async`, `append_messages` (one atomic
  request, or with `atomic=False` one result per message), `broadcast(channels, msg)`
  (atomic across channels of one node; channels of several nodes are refused at once),
- `txn(channel, vchannel, keepalive)` with `append` / `commit` / `rollback`,
- `read(channel, policy, filters)`: a `Scanner` (an iterator with `close()`),
- channel management: `create_channel`, `describe_channel`, `destroy_channel`,
  `assign_channel`, `unassign_channel` (a graceful hand-over), `watch_channels` (ownership
  changes as a stream; producers follow a new owner through it).

Exactly once across failover: the client stamps every message with a Gazette UUID of its own
producer (one per channel, clocks growing in send order) before sending it. When a node is
fenced or unreachable, the client looks the channel's owner up again and resends every
unacknowledged request *with the same UUIDs*, in order, to the new owner. A message that the
old node had appended after all is then a duplicate, which read-committed readers drop.
Scanners, broadcasts and transactions also ride out a dead node (see their docstrings).

Throughput: a channel's producer coalesces the requests queued by every thread of the
process into batch stream messages, several pipelined (see `_Stream`).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, NoReturn, Self, overload

import grpc

from oncelog._retry import retry
from oncelog.message import OUTSIDE_TXN, Clock, build_uuid, new_producer_id
from oncelog.producer_transaction import (
    ProducerTransaction,
    TxnState,
    keepalive_ms,
    keepalive_seconds,
)
from oncelog.streaming import streaming_pb2 as pb
from oncelog.streaming import streaming_pb2_grpc as pb_grpc
from oncelog.streaming.errors import RETRIABLE, Code, StreamingError

__all__ = [
    "ChannelDescription",
    "ChannelWatch",
    "ConsumedMessage",
    "DeliverAll",
    "DeliverLatest",
    "MessageID",
    "Scanner",
    "StartAfter",
    "StartFrom",
    "StreamMessage",
    "StreamingClient",
    "TimeTick",
    "TimeTickGT",
    "TimeTickGTE",
    "Txn",
    "VChannel",
    "connect",
]

log = logging.getLogger(__name__)

_CLOSE = object()


# -- values ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MessageID:
    """Where a message landed: channel (journal) bytes [begin, end)."""

    channel: str
    begin: int
    end: int

    @classmethod
    def _of(cls, mid: pb.MessageID) -> MessageID:
        return cls(mid.channel, mid.begin, mid.end)

    def _pb(self) -> pb.MessageID:
        return pb.MessageID(channel=self.channel, begin=self.begin, end=self.end)


@dataclass(slots=True)
class StreamMessage:
    """A message to produce: payload bytes (str is UTF-8 encoded), vchannel, properties."""

    payload: bytes | str
    vchannel: str = ""
    properties: dict[str, str] = field(default_factory=dict)

    def _pb(self, default_vchannel: str = "") -> pb.Message:
        body = self.payload.encode("utf-8") if isinstance(self.payload, str) else self.payload
        return pb.Message(payload=bytes(body), vchannel=self.vchannel or default_vchannel,
                          properties=self.properties)


Payload = bytes | str | StreamMessage


def _message(msg: Payload, vchannel: str, properties: dict[str, str] | None = None) -> pb.Message:
    if not isinstance(msg, StreamMessage):
        msg = StreamMessage(msg, vchannel, dict(properties or {}))
    return msg._pb(vchannel)


@dataclass(frozen=True, slots=True)
class ConsumedMessage:
    """A committed message delivered by a Scanner."""

    id: MessageID
    payload: bytes
    vchannel: str
    properties: dict[str, str]
    uuid: str
    time_tick: int


@dataclass(frozen=True, slots=True)
class TimeTick:
    """Progress of a channel (Scanner with `time_ticks=True`): every message up to `offset`
    was delivered or filtered out."""

    time_tick: int
    offset: int


@dataclass(frozen=True, slots=True)
class ChannelDescription:
    """A channel, its current term and the node owning it at that term."""

    name: str
    term: int
    owner_node: str
    owner_address: str
    owner_description: str
    description: str
    head: int
    labels: dict[str, str]

    @classmethod
    def _of(cls, d: pb.ChannelDescription) -> ChannelDescription:
        return cls(d.channel.name, d.channel.term, d.owner.node_id, d.owner.address,
                   d.owner.description, d.description, d.head, dict(d.labels))


@dataclass(frozen=True, slots=True)
class DeliverAll:
    """Deliver from the channel's first message."""


@dataclass(frozen=True, slots=True)
class DeliverLatest:
    """Deliver only messages appended after the scanner starts."""


@dataclass(frozen=True, slots=True)
class StartFrom:
    """Deliver from this message on, itself included."""

    id: MessageID


@dataclass(frozen=True, slots=True)
class StartAfter:
    """Deliver the messages after this one."""

    id: MessageID


@dataclass(frozen=True, slots=True)
class TimeTickGT:
    """Only messages whose channel time tick is greater than `time_tick`."""

    time_tick: int


@dataclass(frozen=True, slots=True)
class TimeTickGTE:
    """Only messages whose time tick is at least `time_tick`."""

    time_tick: int


@dataclass(frozen=True, slots=True)
class VChannel:
    """Only messages of this vchannel (several VChannel filters: any of them)."""

    name: str


Policy = DeliverAll | DeliverLatest | StartFrom | StartAfter
Filter = TimeTickGT | TimeTickGTE | VChannel


def _policy_pb(policy: Policy) -> pb.DeliverPolicy:
    if isinstance(policy, DeliverAll):
        return pb.DeliverPolicy(all=pb.Empty())
    if isinstance(policy, DeliverLatest):
        return pb.DeliverPolicy(latest=pb.Empty())
    if isinstance(policy, StartFrom):
        return pb.DeliverPolicy(start_from=policy.id._pb())
    if isinstance(policy, StartAfter):
        return pb.DeliverPolicy(start_after=policy.id._pb())
    raise TypeError(f"not a deliver policy: {policy!r}")


def _filter_pb(f: Filter) -> pb.DeliverFilter:
    if isinstance(f, TimeTickGT):
        return pb.DeliverFilter(time_tick_gt=pb.DeliverFilterTimeTickGT(time_tick=f.time_tick))
    if isinstance(f, TimeTickGTE):
        return pb.DeliverFilter(time_tick_gte=pb.DeliverFilterTimeTickGTE(time_tick=f.time_tick))
    if isinstance(f, VChannel):
        return pb.DeliverFilter(vchannel=pb.DeliverFilterVChannel(vchannel=f.name))
    raise TypeError(f"not a deliver filter: {f!r}")


def _rpc_error(exc: grpc.RpcError, address: str = "") -> StreamingError:
    """The StreamingError of a gRPC failure (status codes the node never sends as answers)."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    where = f" ({address})" if address else ""
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return StreamingError(Code.UNAUTHENTICATED, f"{details}{where}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return StreamingError(Code.INVALID_ARGUMENT, f"request too large for the node{where}: "
                              f"{details}")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return StreamingError(Code.ON_SHUTDOWN, f"node unavailable{where}: {details}")
    if code == grpc.StatusCode.CANCELLED:
        return StreamingError(Code.EOF, f"the stream was cancelled{where}")
    return StreamingError(Code.UNKNOWN, f"{code}{where}: {details}")


def _check(error: pb.StreamingError) -> None:
    if error.code != 0:
        raise StreamingError(error.code, error.cause)


# -- retries ------------------------------------------------------------------------------
#
# Every wait for a node (a producer's new owner, a transaction's, a broadcast's, a scanner's
# next node) is the shared loop of `oncelog._retry`, bounded by the client's `retry_timeout`,
# with these pauses (50 ms doubling to 0.5 s, jittered) unless said otherwise.

_FIRST_DELAY = 0.05
_MAX_DELAY = 0.5

_NODE_GONE = frozenset({Code.ON_SHUTDOWN, Code.EOF})
"""Codes after which a reader tries another node: the node stopped, died or ended the call."""


def _reraise(exc: Exception) -> NoReturn:
    """A `give_up` for callers that report the last failure themselves."""
    raise exc


def _code_in(codes: frozenset[Code]) -> Callable[[Exception], bool]:
    """A `retriable` predicate: a StreamingError whose code is one of `codes`."""
    return lambda exc: isinstance(exc, StreamingError) and exc.code in codes


# -- produce streams ------------------------------------------------------------------------


@dataclass(eq=False)
class _Req:
    """One request: its messages (UUIDs stamped once, kept across resends) or a txn op.
    `future` gets the node's result (a channel producer's: the list of MessageIDs)."""

    kind: str
    messages: list[pb.Message] = field(default_factory=list)
    txn_id: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    future: Future[Any] = field(default_factory=Future)
    size: int = 0  # payload bytes, for sizing batches
    key: int = 0

    def body(self, rid: int) -> pb.ProduceMessageRequest:
        return pb.ProduceMessageRequest(request_id=rid, messages=self.messages,
                                        txn_id=self.txn_id)

    def to_pb(self, rid: int) -> pb.ProduceRequest:
        if self.kind == "produce":
            return pb.ProduceRequest(produce=self.body(rid))
        if self.kind == "begin_txn":
            return pb.ProduceRequest(begin_txn=pb.BeginTxnRequest(request_id=rid, **self.extra))
        if self.kind == "commit_txn":
            return pb.ProduceRequest(commit_txn=pb.CommitTxnRequest(
                request_id=rid, txn_id=self.txn_id, **self.extra))
        return pb.ProduceRequest(rollback_txn=pb.RollbackTxnRequest(
            request_id=rid, txn_id=self.txn_id, **self.extra))

    @property
    def batchable(self) -> bool:
        return self.kind == "produce" and not self.txn_id


MAX_IN_FLIGHT = 8
"""Stream messages (single requests or batches) a Produce stream has unanswered at most:
pipelining without letting a slow node's backlog grow without bound. While the window is
full, new requests wait in the stream's queue and leave together, as one batch."""

MAX_BATCH_BYTES = 1 << 20
"""Payload bytes of one batch at most (and at most a quarter of the node's request limit)."""

MAX_BATCH_REQUESTS = 4096


class _Stream:
    """One Produce stream to one node. Answers go to `on_answer(req, result | error)`;
    when the stream breaks, `on_broken(stream, error, unanswered)` is called once.

    The coalescer: requests queue up in `send` (from any thread); gRPC pulls the next stream
    message from `_requests` only once the previous one is written, and `_requests` packs
    every committed produce request queued by then into one ProduceBatchRequest (bounded by
    MAX_BATCH_BYTES / MAX_BATCH_REQUESTS). So concurrent appends of a process share stream
    messages and node appends, and up to MAX_IN_FLIGHT stream messages are pipelined.
    `_lock` guards `_by_id`, `_broken` and `_in_flight`; request ids are given in queue order
    under it, so they increase on the wire whatever thread sends."""

    def __init__(
        self,
        client: StreamingClient,
        address: str,
        channel: str,
        on_answer: Callable[[_Req, pb.ProduceMessageResult | StreamingError], None],
        on_broken: Callable[[_Stream, StreamingError, list[_Req]], None],
    ) -> None:
        self.address = address
        self.channel = channel
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._by_id: dict[int, _Req] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._window = threading.Condition(self._lock)
        self._in_flight = 0
        self._on_answer = on_answer
        self._on_broken = on_broken
        self._broken = False
        self._batch_bytes = 0  # 0: the node takes no batches
        self._call = client._stub(address).Produce(
            self._requests(), metadata=client._metadata
        )
        self._queue.put(pb.ProduceRequest(create=pb.CreateProducerRequest(
            channel=pb.ChannelInfo(name=channel))))
        try:
            first = next(self._call)
        except grpc.RpcError as exc:
            raise _rpc_error(exc, address) from None
        except StopIteration:
            raise StreamingError(Code.EOF, f"{address} closed the stream") from None
        _check(first.create.error)
        self.term = first.create.channel.term
        if first.create.max_request_bytes > 0:
            self._batch_bytes = min(MAX_BATCH_BYTES, first.create.max_request_bytes // 4)
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name="oncelog-streaming-answers")
        self._reader.start()

    def _requests(self) -> Iterator[pb.ProduceRequest]:
        held: Any = None  # a request taken from the queue that did not fit the last batch
        while True:
            item = held if held is not None else self._queue.get()
            held = None
            if item is _CLOSE:
                yield pb.ProduceRequest(close=pb.CloseProducerRequest())
                return
            if not isinstance(item, tuple):
                yield item  # the create request
                continue
            with self._window:
                while self._in_flight >= MAX_IN_FLIGHT and not self._broken:
                    self._window.wait()
                if self._broken:
                    continue  # on_broken resends what is unanswered
                self._in_flight += 1
            rid, req = item
            if not (self._batch_bytes and req.batchable):
                yield req.to_pb(rid)
                continue
            bodies = [req.body(rid)]
            size = req.size
            while len(bodies) < MAX_BATCH_REQUESTS:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if (not isinstance(nxt, tuple) or not nxt[1].batchable
                        or size + nxt[1].size > self._batch_bytes):
                    held = nxt
                    break
                bodies.append(nxt[1].body(nxt[0]))
                size += nxt[1].size
            if len(bodies) == 1:
                yield pb.ProduceRequest(produce=bodies[0])
            else:
                yield pb.ProduceRequest(batch=pb.ProduceBatchRequest(requests=bodies))

    def send(self, req: _Req) -> None:
        with self._lock:
            if self._broken:
                raise StreamingError(Code.EOF, "the stream is broken")
            rid = next(self._ids)
            self._by_id[rid] = req
            self._queue.put((rid, req))

    def close(self) -> None:
        self._queue.put(_CLOSE)

    def cancel(self) -> None:
        self._call.cancel()

    def _answers(self, answers: Iterable[pb.ProduceMessageResponse]) -> StreamingError | None:
        """Hand each answer to its request; a retriable error stops there (that request and
        every later one are resent elsewhere): returned."""
        for answer in answers:
            with self._lock:
                req = self._by_id.pop(answer.request_id, None)
            if req is None:
                continue
            if answer.WhichOneof("response") == "error":
                err = StreamingError(answer.error.code, answer.error.cause)
                if err.code in RETRIABLE:
                    with self._lock:
                        self._by_id[answer.request_id] = req  # unanswered: resent
                    return err
                self._on_answer(req, err)
            else:
                self._on_answer(req, answer.result)
        return None

    def _read(self) -> None:
        error: StreamingError | None = None
        try:
            for resp in self._call:
                kind = resp.WhichOneof("response")
                if kind == "produce":
                    error = self._answers((resp.produce,))
                elif kind == "batch":
                    error = self._answers(resp.batch.responses)
                else:
                    continue
                with self._window:
                    self._in_flight -= 1
                    self._window.notify()
                if error is not None:
                    break
        except grpc.RpcError as exc:
            error = _rpc_error(exc, self.address)
        with self._lock:
            self._broken = True
            self._window.notify_all()
            left = [self._by_id[k] for k in sorted(self._by_id)]
            self._by_id.clear()
        self._queue.put(_CLOSE)  # ends `_requests` (gRPC's sending thread) too
        if error is None:
            if not left:
                return
            error = StreamingError(Code.EOF, f"{self.address} ended the stream")
        self._call.cancel()
        self._on_broken(self, error, left)


def _retriable(exc: StreamingError) -> bool:
    return exc.code in RETRIABLE and not getattr(exc, "final", False)


class _ChannelProducer:
    """The client's producer of one channel: one UUID producer, one stream at a time, and
    every unacknowledged request kept (in order) for resending after a failover."""

    def __init__(self, client: StreamingClient, channel: str) -> None:
        self.client = client
        self.channel = channel
        self.producer = new_producer_id()
        self.clock = Clock()
        self._lock = threading.Lock()
        self._unacked: OrderedDict[int, _Req] = OrderedDict()
        self._seq = itertools.count()
        self._stream: _Stream | None = None
        self._recovering = False
        self._closed = False

    def submit(self, messages: list[pb.Message]) -> Future[list[MessageID]]:
        """Queue `messages` as one atomic request; the future gets their ids."""
        req = _Req("produce", messages,
                   size=sum(len(m.payload) + 64 for m in messages))
        with self._lock:
            if self._closed:
                raise StreamingError(Code.EOF, "the client is closed")
            self.clock.update()
            for m in messages:
                m.uuid = str(build_uuid(self.producer, self.clock.tick(), OUTSIDE_TXN))
            key = req.key = next(self._seq)
            self._unacked[key] = req
            if self._stream is None and not self._recovering:
                try:
                    self._stream = self._open()
                except StreamingError as exc:
                    if not _retriable(exc):
                        del self._unacked[key]
                        raise
                    self._start_recovery(exc)
                    return req.future
            if self._stream is not None:
                try:
                    self._stream.send(req)
                except StreamingError:
                    pass  # broken: its on_broken resends what is unacked
        return req.future

    def _open(self) -> _Stream:
        try:
            desc = self.client.describe_channel(self.channel)
        except StreamingError as exc:
            exc.final = True  # type: ignore[attr-defined]  # no such channel: do not retry
            raise
        return self._open_at(desc)

    def _open_at(self, desc: ChannelDescription) -> _Stream:
        """A stream to the owner `desc` names (retriable if none: a hand-over)."""
        if not desc.owner_address:
            raise _no_owner(desc)
        return _Stream(self.client, desc.owner_address, self.channel, self._answered,
                       self._broken)

    def _answered(self, req: _Req, got: pb.ProduceMessageResult | StreamingError) -> None:
        with self._lock:
            self._unacked.pop(req.key, None)
        if isinstance(got, StreamingError):
            req.future.set_exception(got)
        else:
            req.future.set_result([MessageID(i.channel, i.begin, i.end) for i in got.ids])

    def _broken(self, stream: _Stream, error: StreamingError, left: list[_Req]) -> None:
        with self._lock:
            if self._stream is stream:
                self._stream = None
            if self._closed or not self._unacked:
                return
            if not _retriable(error):
                # E.g. a request too large for the node, or a wrong token: the node ended
                # the stream; what it did not answer fails (it was not acknowledged).
                failed = list(self._unacked.values())
                self._unacked.clear()
                for req in failed:
                    req.future.set_exception(error)
                return
            log.info("channel %r: stream to %s broke (%s); resending %d requests",
                     self.channel, stream.address, error, len(self._unacked))
            if not self._recovering:
                self._start_recovery(error)

    def _start_recovery(self, error: StreamingError) -> None:
        self._recovering = True
        threading.Thread(target=self._recover, args=(error,), daemon=True,
                         name="oncelog-streaming-recover").start()

    def _recover(self, error: StreamingError) -> None:
        """Open a stream to the channel's owner (looking it up again, for up to the client's
        `retry_timeout`) and resend every unacknowledged request on it, in order, with its
        UUIDs. Past the deadline, on a closed producer or a final error (no such channel),
        every unacknowledged request fails instead."""

        def retriable(exc: Exception) -> bool:
            return isinstance(exc, StreamingError) and _retriable(exc) and not self._closed

        # The owner comes from a WatchChannels stream (no DescribeChannel polling): each
        # attempt waits (bounded) for the next ownership report, and opens a stream there.
        follower = _OwnerFollower(self.client, self.channel)
        seen = 0

        def attempt() -> _Stream:
            nonlocal seen
            desc, seen = follower.next(seen, _OWNER_WAIT)
            if desc is None:  # the watch is not available: ask once
                return self._open()
            return self._open_at(desc)

        try:
            stream = retry(attempt, self.client.retry_timeout, _reraise,
                           retriable=retriable, first_delay=0.02, max_delay=_MAX_DELAY)
        except Exception as exc:  # noqa: BLE001 - every unacknowledged request must resolve
            # A StreamingError past the deadline, or anything else `_open` raised (which
            # must not leave the producer "recovering" with futures that never resolve).
            if isinstance(exc, StreamingError):
                failure = StreamingError(
                    exc.code, f"gave up after {self.client.retry_timeout} s: {exc.cause}")
            else:
                failure = StreamingError(
                    Code.UNKNOWN, f"reconnecting failed: {type(exc).__name__}: {exc}")
            with self._lock:
                failed = list(self._unacked.values())
                self._unacked.clear()
                self._recovering = False
            for req in failed:
                req.future.set_exception(failure)
            return
        finally:
            follower.close()
        with self._lock:
            self._stream = stream
            self._recovering = False
            pending = list(self._unacked.values())
            try:
                for req in pending:
                    stream.send(req)
            except StreamingError:
                pass  # broke again: its on_broken starts another recovery

    def close(self) -> None:
        with self._lock:
            self._closed = True
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()


def _no_owner(desc: ChannelDescription) -> StreamingError:
    """The (retriable) error of a channel between owners: its newest term is released."""
    return StreamingError(Code.CHANNEL_FENCED, f"channel {desc.name!r} has no owner at term "
                          f"{desc.term} (it is being handed over): waiting for the next owner")


_OWNER_WAIT = 1.0
"""Seconds a recovering producer waits for the next ownership report before trying the
owner it knows again."""


class _OwnerFollower:
    """The owner of one channel as a WatchChannels stream reports it (in a thread), for a
    producer looking for the channel's next owner. `next(seen, timeout)` returns the newest
    report once it is newer than version `seen` (or after `timeout`, the newest anyway), or
    None if the watch could not be opened: the caller then asks DescribeChannel."""

    def __init__(self, client: StreamingClient, channel: str) -> None:
        self._client = client
        self._channel = channel
        self._cv = threading.Condition()
        self._latest: ChannelDescription | None = None
        self._version = 0
        self._ended = False
        self._watch: ChannelWatch | None = None
        self._closed = False
        threading.Thread(target=self._run, daemon=True, name="oncelog-streaming-owner").start()

    def _run(self) -> None:
        try:
            watch = self._client.watch_channels([self._channel])
            with self._cv:
                if self._closed:
                    watch.close()
                    return
                self._watch = watch
            for desc in watch:
                with self._cv:
                    self._latest = desc
                    self._version += 1
                    self._cv.notify_all()
        except Exception as exc:  # noqa: BLE001 - the caller falls back to DescribeChannel
            log.debug("watch of %r: %s", self._channel, exc)
        finally:
            with self._cv:
                self._ended = True
                self._cv.notify_all()

    def next(self, seen: int, timeout: float) -> tuple[ChannelDescription | None, int]:
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._version <= seen and not self._ended:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(left)
            if self._latest is None and self._ended:
                return None, self._version
            return self._latest, self._version

    def close(self) -> None:
        with self._cv:
            self._closed = True
            watch = self._watch
        if watch is not None:
            watch.close()


# -- transactions ---------------------------------------------------------------------------


class Txn:
    """A transaction writing one vchannel of one channel: `append` messages (invisible to
    read-committed readers), then `commit()` (all become visible at once) or `rollback()`.
    It expires (rolled back by the node) after `keepalive` without an append.

    If its node dies (or loses the channel), the transaction is finished on the channel's
    new owner, by this rule: a `commit()` (sent, or called afterwards) is **committed** there:
    every message was acknowledged durable when its `append` returned, so the client appends
    its commit ACK (the same UUID: a copy of an ACK the dead node wrote changes nothing)
    through the new owner and `commit()` returns. An `append()` (or `rollback()`) that meets
    the dead node **rolls the transaction back** there (an ACK re-asserting the clock before
    its first message) and raises TRANSACTION_EXPIRED. Both wait for the new owner for up to
    the client's `retry_timeout`; past it they raise (then nothing was committed by the
    client, and a commit's outcome is unknown).

    A transaction may be shared by threads: its UUIDs (one producer, clocks growing) are
    stamped and queued on its stream under one lock, so they reach the node in clock order
    (the node refuses a clock below one it has seen). They are issued by its
    `ProducerTransaction` (`oncelog.producer_transaction`), which also refuses an `append`
    or `commit` once the transaction was committed or rolled back, with TransactionError."""

    def __init__(self, client: StreamingClient, channel: str, vchannel: str,
                 keepalive: float | None) -> None:
        self.channel = channel
        self.vchannel = vchannel
        self._client = client
        # Its UUIDs, clocks and state; guarded by `_lock`.
        self._txn = ProducerTransaction(producer=new_producer_id(),
                                        label=f"a transaction on {channel!r}")
        # Held from stamping a request's UUIDs until it is queued on the stream: clocks
        # leave in the order they were stamped, whatever thread appends or commits.
        self._lock = threading.Lock()
        self._stream = _Stream(client, client._owner_address(channel), channel,
                               self._answered, self._broken)
        result = self._request(_Req("begin_txn", extra={
            "vchannel": vchannel, "keepalive_ms": keepalive_ms(keepalive)}))
        self.txn_id = result.txn_id
        self._txn.label = f"transaction {self.txn_id} on {channel!r}"

    @property
    def _producer(self) -> bytes:
        """The producer ID of the transaction's UUIDs."""
        producer = self._txn.producer
        assert producer is not None  # given at construction
        return producer

    @property
    def _first_clock(self) -> int:
        """The clock of the first message sent (0 before)."""
        return self._txn.first_clock

    @staticmethod
    def _answered(req: _Req, got: pb.ProduceMessageResult | StreamingError) -> None:
        if isinstance(got, StreamingError):
            req.future.set_exception(got)
        else:
            req.future.set_result(got)

    @staticmethod
    def _broken(stream: _Stream, error: StreamingError, left: list[_Req]) -> None:
        for req in left:
            req.future.set_exception(error)

    def _request(self, req: _Req) -> pb.ProduceMessageResult:
        self._stream.send(req)
        result: pb.ProduceMessageResult = req.future.result()  # as `_answered` sets it
        return result

    def _orphan(self, kind: str, ack: str, why: StreamingError) -> pb.ProduceMessageResult:
        """Append `ack` through the channel's current owner (waiting for a failover: a lost
        node or an unanswered request is retried for up to the client's `retry_timeout`,
        with the same `ack` UUID, so a copy that landed after all changes nothing)."""
        client = self._client

        def attempt() -> pb.ProduceMessageResult:
            try:
                stream = _Stream(client, client._owner_address(self.channel), self.channel,
                                 self._answered, self._broken)
                try:
                    req = _Req(kind, extra={"ack_uuid": ack, "orphan": True})
                    stream.send(req)
                    result: pb.ProduceMessageResult = req.future.result(timeout=client.timeout)
                    return result
                finally:
                    stream.close()
            except StreamingError as exc:
                if _node_lost(exc):
                    raise
                raise StreamingError(exc.code, f"transaction {self.txn_id} on "
                                     f"{self.channel!r}: its stream failed ({why.cause}) "
                                     f"and the channel's owner refused to finish it: "
                                     f"{exc.cause}") from None

        def retriable(exc: Exception) -> bool:
            return isinstance(exc, TimeoutError) or (
                isinstance(exc, StreamingError) and _node_lost(exc))

        def give_up(exc: Exception) -> NoReturn:
            if isinstance(exc, StreamingError):
                raise StreamingError(exc.code, f"transaction {self.txn_id} on "
                                     f"{self.channel!r}: its node failed ({why.cause}) and "
                                     f"the new owner could not be reached: {exc.cause}"
                                     ) from None
            raise StreamingError(Code.ON_SHUTDOWN, f"transaction {self.txn_id}: no "
                                 "answer from the channel's new owner") from None

        return retry(attempt, client.retry_timeout, give_up, retriable=retriable,
                     first_delay=_FIRST_DELAY, max_delay=_MAX_DELAY)

    def _roll_back_elsewhere(self, why: StreamingError) -> None:
        """Roll the transaction back through the channel's new owner (its rollback ACK;
        nothing if no message was sent)."""
        with self._lock:
            rollback = self._txn.rollback_uuid()
        if rollback is not None:
            self._orphan("rollback_txn", str(rollback), why)
        with self._lock:
            self._txn.finish(TxnState.ROLLED_BACK)

    def append(self, msg: Payload, *, properties: dict[str, str] | None = None) -> MessageID:
        """Append one message to the transaction; returns where it landed once durable."""
        return self.append_messages([msg], properties=properties)[0]

    def append_messages(self, msgs: Iterable[Payload], *,
                        properties: dict[str, str] | None = None) -> list[MessageID]:
        messages = [_message(m, self.vchannel, properties) for m in msgs]
        req = _Req("produce", messages, txn_id=self.txn_id)
        try:
            with self._lock:
                # Built through this module's build_uuid: tests hook the moment of stamping.
                for m, u in zip(messages, self._txn.continue_uuids(len(messages), build_uuid)):
                    m.uuid = str(u)
                self._stream.send(req)
            result = req.future.result()
        except StreamingError as exc:
            if not _node_lost(exc):
                raise
            self._roll_back_elsewhere(exc)
            raise StreamingError(Code.TRANSACTION_EXPIRED, f"transaction {self.txn_id} on "
                                 f"{self.channel!r} was rolled back on the channel's new owner: "
                                 f"its node failed ({exc.cause})") from None
        return [MessageID._of(i) for i in result.ids]

    def commit(self) -> int:
        """Commit: every appended message becomes visible at once. Returns the commit's time
        tick. TRANSACTION_EXPIRED if it outlived its keepalive (nothing is committed)."""
        try:
            try:
                with self._lock:
                    ack = str(self._txn.commit_uuid())  # TransactionError once finished
                    req = _Req("commit_txn", txn_id=self.txn_id, extra={"ack_uuid": ack})
                    self._stream.send(req)
                result = req.future.result()
            except StreamingError as exc:
                if not _node_lost(exc) or not self._txn.written:
                    raise
                result = self._orphan("commit_txn", ack, exc)
            with self._lock:
                self._txn.finish(TxnState.COMMITTED)
            return int(result.time_tick)
        finally:
            self._stream.close()

    def rollback(self) -> None:
        """Discard the transaction's messages. TransactionError once it was committed."""
        try:
            with self._lock:
                if self._txn.state is TxnState.COMMITTED:
                    self._txn.finish(TxnState.ROLLED_BACK)  # raises, naming it
            try:
                self._request(_Req("rollback_txn", txn_id=self.txn_id))
            except StreamingError as exc:
                if not _node_lost(exc):
                    raise
                self._roll_back_elsewhere(exc)
            else:
                with self._lock:
                    self._txn.finish(TxnState.ROLLED_BACK)
        finally:
            self._stream.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.commit()
        elif self._txn.state is TxnState.OPEN:  # else committed or rolled back already
            try:
                self.rollback()
            except StreamingError:
                pass


def _broadcast_uuid() -> str:
    """The UUID of one broadcast: a producer used for nothing else, its clock now.

    The node publishes channel k's copy at clock + k and then the ACKs (2 clocks per
    channel), and every resend repeats this UUID, so a copy appended twice (a lost reply, a
    node that failed after acting, a zombie that resumes late) is dropped by read-committed
    readers as a duplicate. A producer shared by two broadcasts would need their clocks to
    reach each journal in clock order, which nothing orders across concurrent unary calls,
    nor across a stale copy of an earlier broadcast (or a recovered commit record re-
    appending its ACKs) landing while a later one is half-written: a lower-clock ACK then
    rolls the later one back. With one producer per broadcast neither can happen; the cost
    is one producer state per broadcast and channel in readers (pruned by checkpoints'
    `prune_horizon`), as with every transaction (`Txn`) and every `Publisher`."""
    clock = Clock()
    clock.update()
    return str(build_uuid(new_producer_id(), clock.tick(), OUTSIDE_TXN))


def _node_lost(exc: StreamingError) -> bool:
    """The node serving a stream died, stopped or lost the channel (not: the request was
    refused on its merits)."""
    return exc.code in RETRIABLE or exc.code == Code.EOF


# -- consuming -------------------------------------------------------------------------------


class _ServerStream:
    """A server stream the client holds open (a scanner, a watch): `close()` cancels it,
    from any thread; the subclass sets `_lock`, `_closed` (guarded by `_lock`) and `_call`
    (the running call, or None between reconnects; guarded by `_lock`)."""

    _lock: threading.Lock
    _closed: bool
    _call: Any

    def close(self) -> None:
        with self._lock:
            self._closed = True
            call = self._call
        if call is not None:
            call.cancel()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Scanner(_ServerStream):
    """Committed messages of a channel, as a blocking iterator (tailing new appends).
    `close()` (from any thread) ends it; iteration then stops.

    When its node dies or stops, the scanner reconnects to another node of the client's
    list (backing off, for up to `retry_timeout`) and resumes exactly where it was: it asks
    for the same start offset, policy and filters, has the node pass over the `delivered`
    messages it already returned (read-committed delivery from one offset is a function of
    the journal's bytes, so that is the same sequence, sequencing state included) and checks
    that the last one passed over is `last_id`. No message is missed or repeated; time ticks
    not above `time_tick` are not repeated either. The cost: the new node re-reads the
    channel from the scanner's start offset."""

    def __init__(self, client: StreamingClient, request: pb.ConsumeRequest,
                 addresses: list[str]) -> None:
        self._client = client
        self._request = request
        self._addresses = addresses
        self._lock = threading.Lock()  # guards _call and _closed against close()
        self._call: Any = None
        self._address = ""
        self.time_tick = 0
        self.start_offset = 0
        self.delivered = 0  # messages returned so far
        self.last_id: MessageID | None = None
        self.reconnects = 0
        self._closed = False
        self.start_offset = self._open(request, addresses)

    def _open(self, request: pb.ConsumeRequest, addresses: list[str]) -> int:
        """Start the Consume call on the first node of `addresses` that answers."""
        error: StreamingError | None = None
        for target in addresses:
            call = self._client._stub(target).Consume(request, metadata=self._client._metadata)
            with self._lock:
                if self._closed:
                    call.cancel()
                    raise StreamingError(Code.EOF, "the scanner was closed")
                self._call, self._address = call, target
            try:
                first = next(call)
            except grpc.RpcError as exc:
                error = _rpc_error(exc, target)
                if error.code not in _NODE_GONE or self._closed:
                    raise error from None
                continue
            except StopIteration:
                error = StreamingError(Code.EOF, f"{target} ended the stream")
                continue
            if first.WhichOneof("response") == "error":
                _check(first.error)
            return int(first.create.start_offset)
        assert error is not None
        raise error

    def _resume(self, why: StreamingError) -> None:
        """Reconnect (another node first) and continue after the last delivered message."""
        request = pb.ConsumeRequest()
        request.CopyFrom(self._request)
        name = request.channel.name
        request.deliver_policy.CopyFrom(pb.DeliverPolicy(start_from=pb.MessageID(
            channel=name, begin=self.start_offset, end=self.start_offset)))
        request.skip = self.delivered
        if self.last_id is not None:
            request.resume_after.CopyFrom(self.last_id._pb())
        i = self._addresses.index(self._address) if self._address in self._addresses else -1
        order = self._addresses[i + 1:] + self._addresses[:i + 1]
        log.info("scanner of %r: %s; resuming after %d messages", name, why, self.delivered)

        def failed(exc: StreamingError) -> StreamingError:
            return StreamingError(exc.code, f"scanner of {name!r} could not resume "
                                  f"after {why.cause}: {exc.cause}")

        def attempt() -> None:
            try:
                self._open(request, order)
            except StreamingError as exc:
                if self._closed:
                    raise StopIteration from None
                if exc.code in _NODE_GONE:
                    raise
                raise failed(exc) from None

        def give_up(exc: Exception) -> NoReturn:
            assert isinstance(exc, StreamingError)
            raise failed(exc) from None

        retry(attempt, self._client.retry_timeout, give_up, retriable=_code_in(_NODE_GONE),
              first_delay=_FIRST_DELAY, max_delay=_MAX_DELAY)
        self.reconnects += 1

    def __iter__(self) -> Scanner:
        return self

    def __next__(self) -> ConsumedMessage | TimeTick:
        while True:
            try:
                resp = next(self._call)
            except grpc.RpcError as exc:
                if self._closed:
                    raise StopIteration from None
                err = _rpc_error(exc, self._address)
                if err.code not in _NODE_GONE:
                    raise err from None
                self._resume(err)
                continue
            except StopIteration:
                if self._closed:
                    raise
                self._resume(StreamingError(Code.EOF, f"{self._address} ended the stream"))
                continue
            kind = resp.WhichOneof("response")
            if kind == "consume":
                c = resp.consume
                m = c.message
                mid = MessageID._of(c.id)
                self.delivered += 1
                self.last_id = mid
                return ConsumedMessage(mid, m.payload, m.vchannel, dict(m.properties), m.uuid,
                                       c.time_tick)
            if kind == "time_tick":
                tick = resp.time_tick.time_tick
                if tick <= self.time_tick:
                    continue  # seen before a reconnect
                self.time_tick = tick
                return TimeTick(tick, resp.time_tick.offset)
            if kind == "error":
                _check(resp.error)



# -- watching ownership ---------------------------------------------------------------------


class ChannelWatch(_ServerStream):
    """Ownership of channels as it changes (WatchChannels): an iterator of
    ChannelDescription, first one per channel (its current term and owner), then one each
    time a channel's term changes (a new owner, or a released term: `owner_address` "").
    `close()` (from any thread) ends it. If its node dies, it reconnects to another node of
    the client's list (for up to `retry_timeout`), which reports every channel's current
    state again. A channel that does not exist ends it with CHANNEL_NOT_EXIST."""

    def __init__(self, client: StreamingClient, names: list[str], addresses: list[str]) -> None:
        self._client = client
        self._request = pb.WatchChannelsRequest(names=names)
        self._addresses = addresses
        self._lock = threading.Lock()
        self._call: Any = None
        self._address = ""
        self._closed = False
        self._open()

    def _open(self) -> None:
        """Start the call on the first node of `_addresses` (a failure shows in `next`)."""
        target = self._addresses[0]
        with self._lock:
            if self._closed:
                raise StopIteration
            self._call = self._client._stub(target).WatchChannels(
                self._request, metadata=self._client._metadata)
            self._address = target

    def __iter__(self) -> ChannelWatch:
        return self

    def __next__(self) -> ChannelDescription:
        deadline: float | None = None  # set by the first failure: retry_timeout in all
        pause = _FIRST_DELAY
        while True:
            try:
                resp = next(self._call)
            except (grpc.RpcError, StopIteration) as exc:
                if self._closed:
                    raise StopIteration from None
                if isinstance(exc, grpc.RpcError):
                    err = _rpc_error(exc, self._address)
                else:
                    err = StreamingError(Code.EOF, f"{self._address} ended the watch")
                if err.code not in _NODE_GONE:
                    raise err from None
                now = time.monotonic()
                deadline = deadline or now + self._client.retry_timeout
                if now + pause >= deadline:
                    raise StreamingError(err.code, f"watch of {list(self._request.names)}: "
                                         f"no node answered for {self._client.retry_timeout}"
                                         f" s: {err.cause}") from None
                log.info("watch of %s: %s; trying the next node", list(self._request.names),
                         err)
                time.sleep(pause)  # a backoff between nodes (bounded by the deadline)
                pause = min(pause * 2, _MAX_DELAY)
                self._addresses = self._addresses[1:] + self._addresses[:1]
                self._open()
                continue
            if resp.WhichOneof("response") == "error":
                _check(resp.error)
                continue
            return ChannelDescription._of(resp.channel)



# -- the client ------------------------------------------------------------------------------


class StreamingClient:
    """Talks to the streaming nodes of one store. Thread-safe; share one per process."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        token: str | None = None,
        tls_ca: bytes | None = None,
        tls: bool = False,
        retry_timeout: float = 30.0,
        timeout: float = 30.0,
        max_request_bytes: int = 64 << 20,
        interceptors: Sequence[Any] = (),
    ) -> None:
        if not addresses:
            raise ValueError("connect() needs at least one node address")
        self.addresses = list(addresses)
        self.retry_timeout = retry_timeout
        self.timeout = timeout
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._creds = grpc.ssl_channel_credentials(tls_ca) if (tls or tls_ca) else None
        self._options = [
            ("grpc.max_send_message_length", max_request_bytes),
            ("grpc.max_receive_message_length", 64 << 20),
        ]
        self._interceptors = list(interceptors)
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, pb_grpc.StreamingNodeServiceStub] = {}
        self._producers: dict[str, _ChannelProducer] = {}

    def _stub(self, address: str) -> pb_grpc.StreamingNodeServiceStub:
        with self._lock:
            stub = self._stubs.get(address)
            if stub is None:
                if self._creds is not None:
                    ch = grpc.secure_channel(address, self._creds, options=self._options)
                else:
                    ch = grpc.insecure_channel(address, options=self._options)
                self._channels[address] = ch
                if self._interceptors:
                    ch = grpc.intercept_channel(ch, *self._interceptors)
                stub = self._stubs[address] = pb_grpc.StreamingNodeServiceStub(ch)
            return stub

    def _unary(self, method: str, request: Any, address: str | None = None) -> Any:
        """Call `method` on `address`, or on each known node in turn until one answers."""
        targets = [address] if address else list(self.addresses)
        error: StreamingError | None = None
        for target in targets:
            try:
                return getattr(self._stub(target), method)(
                    request, metadata=self._metadata, timeout=self.timeout)
            except grpc.RpcError as exc:
                error = _rpc_error(exc, target)
                if error.code != Code.ON_SHUTDOWN:
                    raise error from None
        assert error is not None
        raise error

    def _owner_address(self, channel: str) -> str:
        desc = self.describe_channel(channel)
        if not desc.owner_address:
            raise _no_owner(desc)
        return desc.owner_address

    # Channels ---------------------------------------------------------------------------

    def create_channel(self, name: str, description: str = "", *,
                       labels: dict[str, str] | None = None,
                       address: str | None = None) -> ChannelDescription:
        """Create channel `name` (a journal) owned by `address` (default: the first node)."""
        resp = self._unary("CreateChannel", pb.CreateChannelRequest(
            name=name, description=description, labels=labels or {}),
            address or self.addresses[0])
        _check(resp.error)
        return ChannelDescription._of(resp.channel)

    def describe_channel(self, name: str) -> ChannelDescription:
        resp = self._unary("DescribeChannel", pb.DescribeChannelRequest(name=name))
        _check(resp.error)
        return ChannelDescription._of(resp.channel)

    def destroy_channel(self, name: str) -> None:
        resp = self._unary("DestroyChannel", pb.DestroyChannelRequest(name=name))
        _check(resp.error)

    def assign_channel(self, name: str, address: str) -> ChannelDescription:
        """Make the node at `address` take the channel (term + 1, fencing its owner). If
        that node owns it already, nothing is done: StreamingError CHANNEL_EXIST."""
        resp = self._unary("AssignChannel", pb.AssignChannelRequest(name=name), address)
        _check(resp.error)
        return ChannelDescription._of(resp.channel)

    def unassign_channel(self, name: str, to: str | None = None) -> ChannelDescription:
        """Hand channel `name` over gracefully: its owner stops taking requests, answers
        those it took once durable and releases the channel at the next term (producers
        resend what it refused to the next owner, with the same UUIDs). Then the node at
        `to` takes it (AssignChannel); without `to`, any other node takes it at its next
        failover scan. Returns the channel's description after the hand-over."""
        owner = self._owner_address(name)
        resp = self._unary("UnassignChannel", pb.UnassignChannelRequest(name=name), owner)
        _check(resp.error)
        if to is None:
            return ChannelDescription._of(resp.channel)
        try:
            return self.assign_channel(name, to)
        except StreamingError as exc:
            if exc.code != Code.CHANNEL_EXIST:
                raise
            return self.describe_channel(name)  # its failover scan took it first

    def watch_channels(self, names: Iterable[str], *,
                       address: str | None = None) -> ChannelWatch:
        """Follow the ownership of channels `names` (any node serves it: `address` first,
        then the client's others): see ChannelWatch."""
        targets = list(self.addresses)
        if address:
            targets = [address] + [a for a in targets if a != address]
        return ChannelWatch(self, list(dict.fromkeys(names)), targets)

    def list_channels(self, address: str) -> list[ChannelDescription]:
        """The channels the node at `address` owns."""
        resp = self._unary("ListChannels", pb.ListChannelsRequest(), address)
        return [ChannelDescription._of(c) for c in resp.channels]

    # Producing --------------------------------------------------------------------------

    def _producer(self, channel: str) -> _ChannelProducer:
        with self._lock:
            p = self._producers.get(channel)
            if p is None:
                p = self._producers[channel] = _ChannelProducer(self, channel)
            return p

    def append_async(self, channel: str, msgs: Iterable[Payload], *, vchannel: str = "",
                     properties: dict[str, str] | None = None) -> Future[list[MessageID]]:
        """Send messages as one atomic request without waiting: a future of their ids.

        The way to produce fast: keep many calls in flight (from one thread or many). The
        requests of concurrent calls leave together in one batch stream message, and the node
        appends them in one fragment; each keeps its own atomicity and result."""
        messages = [_message(m, vchannel, properties) for m in msgs]
        return self._producer(channel).submit(messages)

    def append(self, channel: str, msg: Payload, *, vchannel: str = "",
               properties: dict[str, str] | None = None) -> MessageID:
        """Append one committed message; returns its id once durable on the owner."""
        return self.append_async(channel, [msg], vchannel=vchannel,
                                 properties=properties).result()[0]

    @overload
    def append_messages(self, channel: str, msgs: Iterable[Payload], *, vchannel: str = "",
                        atomic: Literal[True] = True) -> list[MessageID]: ...

    @overload
    def append_messages(self, channel: str, msgs: Iterable[Payload], *, vchannel: str = "",
                        atomic: Literal[False]) -> list[MessageID | StreamingError]: ...

    def append_messages(self, channel: str, msgs: Iterable[Payload], *, vchannel: str = "",
                        atomic: bool = True) -> list[MessageID] | list[MessageID | StreamingError]:
        """Append messages (each with its own vchannel, if a StreamMessage).

        `atomic=True`: as one atomic request: all land together, contiguously, or none
        (the ids, or a StreamingError raised for all). `atomic=False` (Milvus's
        AppendMessages): each message is a request of its own (they still leave together in
        one batch and share one fragment when they can) and gets its own result, in order:
        its MessageID, or the StreamingError that refused it (an oversized message fails
        alone). Failovers are ridden out per message as by `append`."""
        if atomic:
            return self.append_async(channel, msgs, vchannel=vchannel).result()
        producer = self._producer(channel)
        futures = [producer.submit([_message(m, vchannel)]) for m in msgs]
        results: list[MessageID | StreamingError] = []
        for future in futures:
            try:
                results.append(future.result()[0])
            except StreamingError as exc:
                results.append(exc)
        return results

    def txn(self, channel: str, vchannel: str, keepalive: float | timedelta | None = None) -> Txn:
        """Open a transaction on one vchannel of `channel`."""
        return Txn(self, channel, vchannel, keepalive_seconds(keepalive))

    def broadcast(self, channels: Sequence[str], msg: Payload, *,
                  vchannel: str = "") -> list[MessageID]:
        """Append `msg` to every channel atomically (one transaction across them). The
        channels must be owned by one node: channels of different nodes are refused at once
        (INVALID_ARGUMENT naming each channel's owner; nothing appended by that attempt; if
        an earlier attempt got no answer, the error says that its outcome is unknown).
        After a lost reply or a failed node it is resent
        (for up to `retry_timeout`) with the same UUIDs, so readers get it once per channel;
        the ids returned are those of the copy that was acknowledged.

        Each broadcast is stamped with a producer of its own (see `_broadcast_uuid`), so
        concurrent broadcasts from any number of threads are independent: none can be
        dropped, or rolled back, by another's clocks reaching the journal in another order."""
        if not channels:
            raise ValueError("broadcast needs channels")
        message = _message(msg, vchannel)
        message.uuid = _broadcast_uuid()
        request = pb.BroadcastRequest(channels=list(channels), message=message)

        unanswered = False  # an attempt got no answer: it may have been appended

        def attempt() -> list[MessageID]:
            resp = self._unary("Broadcast", request, self._owner_address(channels[0]))
            if resp.error.code == Code.INVALID_ARGUMENT and unanswered:
                raise StreamingError(Code.INVALID_ARGUMENT, f"{resp.error.cause}; an earlier "
                                     "attempt of this broadcast got no answer: it may have "
                                     "been appended to every channel, or to none")
            _check(resp.error)
            return [MessageID._of(i) for i in resp.ids]

        def resend(exc: Exception) -> None:
            nonlocal unanswered
            # Lost replies, dead or fenced nodes: resend `request` as it is (same UUID; a
            # duplicate is dropped by readers). A channel that does not exist anywhere:
            # give up at once (describe_channel raises for it).
            assert isinstance(exc, StreamingError)
            unanswered = unanswered or exc.code == Code.ON_SHUTDOWN
            if exc.code == Code.CHANNEL_NOT_EXIST:
                for name in channels:
                    self.describe_channel(name)
            log.info("broadcast to %s: %s; resending", list(channels), exc)

        return retry(attempt, self.retry_timeout, _reraise, retriable=_code_in(RETRIABLE),
                     on_retry=resend, first_delay=_FIRST_DELAY, max_delay=_MAX_DELAY)

    # Consuming --------------------------------------------------------------------------

    def read(self, channel: str, policy: Policy | None = None,
             filters: Iterable[Filter] = (), *, time_ticks: bool = False,
             address: str | None = None) -> Scanner:
        """A Scanner over the committed messages of `channel` (any node serves reads:
        `address` first, then the client's others). It survives its node's death: see
        Scanner."""
        request = pb.ConsumeRequest(
            channel=pb.ChannelInfo(name=channel),
            deliver_policy=_policy_pb(policy or DeliverAll()),
            deliver_filters=[_filter_pb(f) for f in filters],
            time_ticks=time_ticks,
        )
        targets = list(self.addresses)
        if address:
            targets = [address] + [a for a in targets if a != address]
        return Scanner(self, request, targets)

    def close(self) -> None:
        with self._lock:
            producers = list(self._producers.values())
            self._producers.clear()
            channels = list(self._channels.values())
            self._channels.clear()
            self._stubs.clear()
        for p in producers:
            p.close()
        for ch in channels:
            ch.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(
    address: str | Sequence[str],
    token: str | None = None,
    *,
    tls_ca: bytes | str | Path | None = None,
    tls: bool = False,
    retry_timeout: float = 30.0,
    timeout: float = 30.0,
    interceptors: Sequence[Any] = (),
) -> StreamingClient:
    """A client of the streaming nodes at `address` (`host:port`, a comma-separated list, or
    a sequence). `token`: the nodes' bearer token. `tls_ca`: PEM bytes or a file of the CA
    to trust (or `tls=True` for the system's). `retry_timeout`: how long a producer keeps
    looking for a channel's new owner after a failure before failing its requests (and a
    scanner, a broadcast or a transaction how long they wait for a node to resume on).
    `interceptors`: gRPC client interceptors wrapped around every node channel (tracing,
    metrics, fault injection)."""
    addresses = [a.strip() for a in address.split(",")] if isinstance(address, str) \
        else list(address)
    ca: bytes | None
    if isinstance(tls_ca, (str, Path)):
        ca = Path(tls_ca).read_bytes()
    else:
        ca = tls_ca
    return StreamingClient([a for a in addresses if a], token=token, tls_ca=ca, tls=tls,
                           retry_timeout=retry_timeout, timeout=timeout,
                           interceptors=interceptors)
