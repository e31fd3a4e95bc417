"""Bounded retries of storage calls: transient failures are retried with jittered backoff
until a deadline, then reported with whether the call's outcome is known.

The loop itself is the shared one of `oncelog._retry`; this module says which storage
failures are transient, and its `retry` is that loop with this classification.

Transient: anything a network or an object store can answer and later answer otherwise
(5xx, 409 ConditionalRequestConflict, connection resets, timeouts, generic OSError).
Not transient, raised at once: oncelog's own errors, a missing or existing object, a
refused permission, and programming errors.
"""

from __future__ import annotations

from typing import Callable, NoReturn, TypeVar

from oncelog import _retry as _shared
from oncelog.journal.errors import JournalError

__all__ = ["PERMANENT", "retry", "is_transient", "is_credentials_error"]

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


def retry(
    op: Callable[[], T],
    timeout: float,
    give_up: Callable[[Exception], NoReturn],
) -> T:
    """Run `op` until it returns or raises a permanent error, retrying transient failures
    with backoff (10 ms doubling to 1 s, jittered) for at most `timeout` seconds; then
    `give_up(last_error)` raises the caller's error. Bounded: never loops past the deadline."""
    return _shared.retry(op, timeout, give_up, retriable=is_transient)
