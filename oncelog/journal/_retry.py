"""Bounded retries of storage calls: transient failures are retried with jittered backoff
until a deadline, then reported with whether the call's outcome is known.

The loop itself is the shared one of `oncelog._retry`; this module says which storage
failures are transient, and its `retry` is that loop with this classification.

Transient: anything a network or an object store can answer and later answer otherwise
(5xx, 409 ConditionalRequestConflict, connection resets, timeouts, generic OSError).
Not transient, raised at once: oncelog's own errors, a missing or existing object, a
refused permission, and programming errors.

A *refused connection* (nothing listens at the store's endpoint: a wrong port, a server not
started) is retried only for `REFUSED_BUDGET` seconds, not the whole timeout: unlike a 503 it
rarely heals by itself in seconds, and a request whose connection was refused never reached
the store, so giving up early changes no outcome. A call still failing `WARN_AFTER` seconds
into its retries logs one warning (logger `oncelog.journal`) naming the store's endpoint and
until when it is retried, so a dead endpoint is never 30 s of silence; the error given up
with names the endpoint too.
"""

from __future__ import annotations

import errno
import logging
import time
from typing import Callable, Iterator, NoReturn, TypeVar
from urllib.parse import urlsplit

from oncelog import _retry as _shared
from oncelog.journal.errors import JournalError

__all__ = [
    "PERMANENT",
    "REFUSED_BUDGET",
    "WARN_AFTER",
    "StoreNotAnswering",
    "endpoint_of",
    "is_connection_refused",
    "is_credentials_error",
    "is_transient",
    "retry",
    "tag_endpoint",
]

log = logging.getLogger("oncelog.journal")

WARN_AFTER = 2.0
"""Seconds of failing attempts after which a retried call logs its one warning."""

REFUSED_BUDGET = 3.0
"""Seconds a call whose connections keep being refused is retried before it gives up."""

_ENDPOINT_ATTR = "_oncelog_endpoint"

T = TypeVar("T")

PERMANENT: tuple[type[BaseException], ...] = (
    JournalError,
    FileNotFoundError,
    FileExistsError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    ValueError,
    TypeError,
    KeyError,
    AttributeError,
    AssertionError,
    NotImplementedError,
    RecursionError,
    MemoryError,
)
"""Failures that retrying cannot change."""

_CREDENTIAL_ERRORS = frozenset(
    {"NoCredentialsError", "PartialCredentialsError", "NoAuthTokenError", "ProfileNotFound"}
)


def is_credentials_error(exc: BaseException) -> bool:
    """Whether `exc` is botocore finding no (or incomplete) credentials: not transient."""
    return (
        type(exc).__name__ in _CREDENTIAL_ERRORS
        and type(exc).__module__.startswith("botocore")
    )


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the call that raised `exc` may succeed."""
    return (
        isinstance(exc, Exception)
        and not isinstance(exc, PERMANENT)
        and not is_credentials_error(exc)
    )


class StoreNotAnswering(JournalError):
    """Why a retried storage call gave up, naming the store's endpoint: handed to the
    caller's `give_up` (which raises the caller's own error from it), never raised alone."""


def tag_endpoint(exc: BaseException, endpoint: str) -> None:
    """Record on `exc` the endpoint of the store whose call raised it (a backend does this
    for its failures, so the retry loop's warning and error can name the endpoint)."""
    try:
        if getattr(exc, _ENDPOINT_ATTR, None) is None:
            setattr(exc, _ENDPOINT_ATTR, endpoint)
    except (AttributeError, TypeError):  # an exception type that takes no attributes
        pass


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, its causes and contexts, and the errors botocore and aiohttp wrap (bounded:
    at most 16 exceptions, each once)."""
    todo: list[BaseException] = [exc]
    seen: set[int] = set()
    while todo and len(seen) < 16:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        kwargs = getattr(e, "kwargs", None)
        nested = [e.__cause__, e.__context__, getattr(e, "os_error", None)]
        if isinstance(kwargs, dict):
            nested.append(kwargs.get("error"))
        todo.extend(n for n in nested if isinstance(n, BaseException))


def is_connection_refused(exc: BaseException) -> bool:
    """Whether `exc` is (or wraps) a refused TCP connection: nothing listens at the
    endpoint, and the request was never sent."""
    return any(
        isinstance(e, ConnectionRefusedError)
        or (isinstance(e, OSError) and e.errno == errno.ECONNREFUSED)
        for e in _chain(exc)
    )


def endpoint_of(exc: BaseException) -> str | None:
    """The endpoint (`scheme://host:port`) of the store whose call raised `exc`: as tagged
    by its backend, or as botocore names it in a connection error; None if unknown."""
    for e in _chain(exc):
        tagged = getattr(e, _ENDPOINT_ATTR, None)
        if isinstance(tagged, str):
            return tagged
    for e in _chain(exc):
        kwargs = getattr(e, "kwargs", None)
        url = kwargs.get("endpoint_url") if isinstance(kwargs, dict) else None
        if isinstance(url, str):
            parts = urlsplit(url)
            return f"{parts.scheme}://{parts.netloc}" if parts.netloc else url
    return None


def _clock(when: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(when))


def retry(
    op: Callable[[], T],
    timeout: float,
    give_up: Callable[[Exception], NoReturn],
) -> T:
    """Run `op` until it returns or raises a permanent error, retrying transient failures
    with backoff (10 ms doubling to 1 s, jittered) for at most `timeout` seconds; then
    `give_up(last_error)` raises the caller's error. Bounded: never loops past the deadline.

    Refused connections are retried for `REFUSED_BUDGET` seconds only. After `WARN_AFTER`
    seconds of failures one warning is logged. When the endpoint is known, `give_up` gets a
    StoreNotAnswering naming it (caused by the last failure) instead of the bare failure."""
    started = time.monotonic()
    until = _clock(time.time() + timeout)
    warned = False
    refused: list[float] = []  # when each attempt of the current run of refusals failed

    def named(exc: Exception, why: str) -> Exception:
        endpoint = endpoint_of(exc)
        if endpoint is None and not why:
            return exc
        where = f"the store at {endpoint}" if endpoint else "the store"
        reason = StoreNotAnswering(f"{where} {why}" if why else f"{where}: {exc!r}")
        reason.__cause__ = exc
        return reason

    def on_retry(exc: Exception) -> None:
        nonlocal warned
        now = time.monotonic()
        if is_connection_refused(exc):
            refused.append(now)
            if now - refused[0] >= REFUSED_BUDGET:
                give_up(named(exc, (
                    f"refused {len(refused)} connections in {now - refused[0]:.1f} s (is "
                    "anything listening there?); not retried further: the requests never "
                    "reached the store"
                )))
        else:
            refused.clear()
        if not warned and now - started >= WARN_AFTER:
            warned = True
            endpoint = endpoint_of(exc)
            where = f"the store at {endpoint}" if endpoint else "the store"
            if refused:
                log.warning(
                    "%s is refusing connections; retrying until %s", where,
                    _clock(time.time() + refused[0] + REFUSED_BUDGET - now),
                )
            else:
                log.warning(
                    "%s is not answering; retrying until %s (%s s): %r",
                    where, until, timeout, exc,
                )

    def final(exc: Exception) -> NoReturn:
        give_up(named(exc, ""))

    return _shared.retry(op, timeout, final, retriable=is_transient, on_retry=on_retry)
