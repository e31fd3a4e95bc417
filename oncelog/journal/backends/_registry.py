"""Which backend serves a filesystem: a registry from fsspec protocol to backend class.

Like fsspec's own registry of filesystem implementations (and oncelog's registry of
framings by content type), a backend class is registered under the protocols it serves;
`backend_for(fs, root)` takes the first of the filesystem's protocols (in `fs.protocol`
order, the main one first) that has a registered class, and falls back to GenericBackend
(readable, no create-only-if-absent, so appends are refused) for any other filesystem.

The built-in backends are registered by `oncelog.journal.backends` when it is imported:
`file`/`local` -> LocalBackend, `memory` -> MemoryBackend, `s3`/`s3a` -> S3Backend.
Registering a class for a protocol must only be done for a backend that keeps the Backend
contract, above all that `create` stores an object only if none exists at its path.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from fsspec import AbstractFileSystem

from oncelog.journal.backends._base import Backend
from oncelog.journal.backends.generic import GenericBackend

BackendClass = Callable[[AbstractFileSystem, str], Backend]
"""A backend class (or any factory): called as `cls(fs, root)`."""

_registry: dict[str, BackendClass] = {}
_registry_lock = threading.Lock()


def _protocol_names(protocols: str | Iterable[str]) -> tuple[str, ...]:
    names = (protocols,) if isinstance(protocols, str) else tuple(protocols)
    if not names or not all(isinstance(p, str) and p for p in names):
        raise ValueError(f"protocols must be non-empty protocol names, not {protocols!r}")
    return names


def register_backend(protocols: str | Iterable[str], cls: BackendClass) -> dict[str, BackendClass]:
    """Serve filesystems of `protocols` (one name or several, e.g. `("s3", "s3a")`) with
    `cls`, called as `cls(fs, root)`. Returns the classes it replaces, by protocol (empty
    when none was registered for them)."""
    if not callable(cls):
        raise TypeError(f"a backend class must be callable as cls(fs, root), not {cls!r}")
    names = _protocol_names(protocols)
    with _registry_lock:
        previous = {p: _registry[p] for p in names if p in _registry}
        for p in names:
            _registry[p] = cls
    return previous


def unregister_backend(protocols: str | Iterable[str]) -> dict[str, BackendClass]:
    """Forget the classes registered for `protocols` (those filesystems then get
    GenericBackend); returns the classes removed, by protocol."""
    names = _protocol_names(protocols)
    with _registry_lock:
        return {p: _registry.pop(p) for p in names if p in _registry}


def backend_class(protocols: str | Iterable[str]) -> BackendClass:
    """The class registered for the first of `protocols` that has one (a filesystem's
    `fs.protocol`, a string or a tuple), or GenericBackend if none has."""
    names = (protocols,) if isinstance(protocols, str) else tuple(protocols)
    with _registry_lock:
        for p in names:
            cls = _registry.get(p)
            if cls is not None:
                return cls
    return GenericBackend


def backend_protocols() -> list[str]:
    """The protocols that have a registered backend class, sorted."""
    with _registry_lock:
        return sorted(_registry)


def backend_for(fs: AbstractFileSystem, root: str) -> Backend:
    """The backend for an fsspec filesystem, picked by its protocol (see `backend_class`)."""
    return backend_class(fs.protocol)(fs, root)
