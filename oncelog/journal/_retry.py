"""Bounded retries of storage calls: transient failures are retried with jittered backoff
until a deadline, then reported with whether the call's outcome is known.

Transient: anything a network or an object store can answer and later answer otherwise
(5xx, 409 ConditionalRequestConflict, connection resets, timeouts, generic OSError).
Not transient, raised at once: oncelog's own errors, a missing or existing object, a
refused permission, and programming errors.
"""

from __future__ import annotations

import random
import time
from typing import Callable, NoReturn, TypeVar

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

_FIRST_DELAY = 0.01
_MAX_DELAY = 1.0


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
    deadline = time.monotonic() + timeout
    delay = _FIRST_DELAY
    while True:
        try:
            return op()
        except PERMANENT:
            raise
        except Exception as exc:  # noqa: BLE001 - network and I/O errors are retried
            if is_credentials_error(exc):
                raise
            if time.monotonic() + delay > deadline:
                give_up(exc)
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, _MAX_DELAY)
