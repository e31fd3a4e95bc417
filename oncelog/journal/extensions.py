"""Hooks through which layers above the journal keep derived data in step with maintenance.

The journal layer compacts, trims, collects and verifies journals; a layer above it may keep
objects derived from a journal's history (oncelog.tables keeps columnar segments of sealed
history). Such a layer registers a `JournalExtension` once (at import); the journal layer
calls every registered one after each maintenance step, without importing the layer: the
dependency points down only.

Invariants: a hook never changes what readers of the journal read (offsets, bytes, claims,
records); a hook that fails is logged and does not undo or fail the maintenance step it
follows, except `verify`, whose problems are the point.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from oncelog.journal.client import JournalClient
    from oncelog.journal.verify import VerifyProblem

__all__ = ["JournalExtension", "extensions", "register_extension"]

log = logging.getLogger(__name__)


class JournalExtension(Protocol):
    """What a layer keeping data derived from journals implements."""

    name: str
    """Short name, used in log lines."""

    def after_compaction(self, client: JournalClient, journal: str, through: int) -> None:
        """History of `journal` below `through` is sealed by a compaction record."""

    def after_trim(self, client: JournalClient, journal: str, first: int) -> None:
        """`journal` now begins at `first`: nothing below it is read any more."""

    def collect(
        self, client: JournalClient, journal: str, grace: float, dry_run: bool
    ) -> list[str]:
        """`gc`: delete (or, `dry_run`, list) derived objects no longer referenced and
        older than `grace` seconds; returns their names."""
        ...

    def verify(self, client: JournalClient, journal: str) -> list[VerifyProblem]:
        """Problems with the derived objects readers of `journal` would use."""
        ...


_lock = threading.Lock()
_registered: list[JournalExtension] = []  # guarded by _lock (copied on read)


def register_extension(extension: JournalExtension) -> None:
    """Register `extension` (once per name: a second registration replaces the first)."""
    with _lock:
        _registered[:] = [e for e in _registered if e.name != extension.name]
        _registered.append(extension)


def extensions() -> list[JournalExtension]:
    """The registered extensions, in registration order (a copy)."""
    with _lock:
        return list(_registered)


def _notify(journal: str, step: str, call: Callable[[JournalExtension], None]) -> None:
    """`call(extension)` for every extension; a failure is logged (naming the journal, the
    extension and the maintenance `step`), never raised: derived data only, the step stands."""
    for ext in extensions():
        try:
            call(ext)
        except Exception as exc:
            log.warning("journal %r: %s after %s failed: %s: %s",
                        journal, ext.name, step, type(exc).__name__, exc)


def notify_compaction(client: JournalClient, journal: str, through: int) -> None:
    """Call every extension's `after_compaction`; failures are logged, never raised."""
    _notify(journal, f"compaction through {through}",
            lambda ext: ext.after_compaction(client, journal, through))


def notify_trim(client: JournalClient, journal: str, first: int) -> None:
    """Call every extension's `after_trim`; failures are logged, never raised."""
    _notify(journal, f"trim to {first}", lambda ext: ext.after_trim(client, journal, first))
