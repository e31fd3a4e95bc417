"""Errors of the test kit; every one derives from `oncelog.OncelogError` too, beside the
standard-library base a test runner expects (an AssertionError fails a test, a
TimeoutError says a bounded wait expired).

`oncelog.testing` re-exports them, and `oncelog.testing.faults` its `ChildTimeout`.
"""

from __future__ import annotations

from typing import Any

from oncelog.errors import OncelogError

__all__ = ["ExactlyOnceViolation", "ConsumerCrash", "ChildTimeout"]


class ExactlyOnceViolation(OncelogError, AssertionError):
    """Outputs are not exactly the inputs, once each: names the missing, doubled and extra keys."""

    def __init__(self, missing: list[Any], doubled: dict[Any, int], extra: list[Any]) -> None:
        self.missing, self.doubled, self.extra = missing, doubled, extra
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {_sample(missing)})")
        if doubled:
            sample = {k: doubled[k] for k in list(doubled)[:5]}
            parts.append(f"{len(doubled)} delivered more than once (key: count, e.g. {sample})")
        if extra:
            parts.append(f"{len(extra)} unexpected (e.g. {_sample(extra)})")
        super().__init__("not exactly once: " + "; ".join(parts))


def _sample(items: list[Any], n: int = 5) -> str:
    shown = ", ".join(repr(x) for x in items[:n])
    return shown + (", ..." if len(items) > n else "")


class ConsumerCrash(OncelogError):
    """Raised by the machine's stage hook to crash a consumer in the middle of a transaction."""


class ChildTimeout(OncelogError, TimeoutError):
    """A bounded wait on a child process expired."""
