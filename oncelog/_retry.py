"""The one bounded retry loop of oncelog: run a call until it returns, retrying the failures
its caller calls retriable with jittered, doubling backoff until a deadline, then hand the
last failure to the caller's `give_up`.

Every layer that retries uses this loop with its own classification of failures: the journal
layer retries transient storage errors (`oncelog.journal._retry`), the streaming client the
gRPC status codes after which a node may answer otherwise (a failover, a lost reply).

Invariants: the loop never sleeps past its deadline (it gives up instead), so a call made
through it takes at most `timeout` plus the duration of the last attempt; a failure the
caller does not call retriable is raised at once, unchanged; nothing but `Exception`s is
ever caught (KeyboardInterrupt, SystemExit pass through).
"""

from __future__ import annotations

import random
import time
from typing import Callable, NoReturn, TypeVar

__all__ = ["FIRST_DELAY", "MAX_DELAY", "retry"]

T = TypeVar("T")

FIRST_DELAY = 0.01
"""The first pause between attempts (seconds), doubled after each failed attempt..."""

MAX_DELAY = 1.0
"""...up to this pause at most. Each pause is jittered to 50-150 % of its nominal value, so
clients failing together do not retry in lockstep."""


def retry(
    op: Callable[[], T],
    timeout: float,
    give_up: Callable[[Exception], NoReturn],
    *,
    retriable: Callable[[Exception], bool],
    on_retry: Callable[[Exception], None] | None = None,
    first_delay: float = FIRST_DELAY,
    max_delay: float = MAX_DELAY,
) -> T:
    """Run `op` until it returns; return its result.

    A failure `retriable(exc)` rejects is raised at once (the same exception object). A
    retriable one is retried after a pause (`first_delay` doubling to `max_delay`, jittered)
    while the next pause still ends before the deadline, `timeout` seconds after the call
    began; otherwise `give_up(exc)` is called with the last failure and must raise the
    caller's error (it runs inside the `except` block: raise `from None` to hide `exc`).
    `on_retry(exc)`, if given, runs after a retriable failure that will be retried, before
    the pause (a log line, or a check that may raise to stop retrying: what it raises
    propagates). Bounded: attempts stop at the deadline whatever `op` and the callbacks do."""
    deadline = time.monotonic() + timeout
    delay = first_delay
    while True:
        try:
            return op()
        except Exception as exc:  # noqa: BLE001 - the caller's `retriable` decides
            if not retriable(exc):
                raise
            if time.monotonic() + delay > deadline:
                give_up(exc)
            if on_retry is not None:
                on_retry(exc)
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, max_delay)
