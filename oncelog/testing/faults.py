"""Fault injection: a misbehaving S3 in front of a real one, and crashing processes.

The fault kit is two tools, each in its own module; this module re-exports the public names
of both, so `from oncelog.testing.faults import ...` keeps working for either:

- `oncelog.testing.s3proxy`: `S3FaultProxy`, an HTTP proxy on 127.0.0.1 in front of an
  S3-compatible server that injects S3 errors (`INTERNAL_ERROR`, `SLOW_DOWN`, ...),
  connection resets, lost replies, slow replies and truncated bodies, chosen by
  `FaultRule`s; and `without_botocore_retries` / `without_s3fs_retries`, which stop the
  libraries below oncelog from retrying the faults away.
- `oncelog.testing.processes`: child Python processes (`start_function`, `start_script`,
  `Child`) read with timeouts, paused (SIGSTOP), resumed and killed (SIGKILL) - at once, at a
  seeded random moment (`kill_at_random`), at a named step (`crash_point`) or right after
  the n-th storage write of a journal client (`kill_after_writes`).

See each module's docstring for the details.
"""

from __future__ import annotations

from oncelog.testing.processes import (
    CRASH_ENV,
    Child,
    ChildTimeout,
    RandomKill,
    crash_point,
    kill,
    kill_after_writes,
    kill_at_random,
    pause,
    resume,
    run_python,
    start_function,
    start_script,
)
from oncelog.testing.processes import (  # public here before the split, not in __all__
    WRITE_METHODS as WRITE_METHODS,
)
from oncelog.testing.s3proxy import (
    CONDITIONAL_CONFLICT,
    INTERNAL_ERROR,
    LOST_REPLY,
    RESET,
    SERVICE_UNAVAILABLE,
    SLOW_DOWN,
    Fault,
    FaultKind,
    FaultRule,
    ProxiedRequest,
    S3FaultProxy,
    without_botocore_retries,
    without_s3fs_retries,
)

__all__ = [
    "CONDITIONAL_CONFLICT",
    "CRASH_ENV",
    "INTERNAL_ERROR",
    "LOST_REPLY",
    "RESET",
    "SERVICE_UNAVAILABLE",
    "SLOW_DOWN",
    "Child",
    "ChildTimeout",
    "Fault",
    "FaultKind",
    "FaultRule",
    "ProxiedRequest",
    "RandomKill",
    "S3FaultProxy",
    "crash_point",
    "kill",
    "kill_after_writes",
    "kill_at_random",
    "pause",
    "resume",
    "run_python",
    "start_function",
    "start_script",
    "without_botocore_retries",
    "without_s3fs_retries",
]
