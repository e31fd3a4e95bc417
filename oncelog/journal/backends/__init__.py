"""Storage primitives per fsspec backend: durable writes, create-only-if-absent, listings.

Each backend offers the same small set of calls. The one that matters for correctness is
`create(path, data) -> bool`, which stores `data` only if nothing exists at `path`:

- local disk: write a temporary file in the same directory, fsync it, `os.link` it to the
  final name (fails with FileExistsError if present), unlink the temporary, fsync the directory;
- S3 (s3fs >= 2025.7.0): one PUT with `If-None-Match: *` (412 when the key exists);
- memory://: exists-then-store under a process-wide lock (memory:// is process-local anyway).

Any other fsspec filesystem is readable but cannot create-if-absent, so appends are refused.

The backend of a filesystem is picked by its fsspec protocol from a registry
(`register_backend(protocols, cls)`, `backend_class(protocols)`, `backend_for(fs, root)`),
in which the built-in backends are registered here; protocols without a registered class get
GenericBackend.
"""

from oncelog.journal.backends._base import (
    MIN_S3FS_VERSION,
    Backend,
    ObjectInfo,
    PieceReads,
    StagedFile,
    Staging,
)
from oncelog.journal.backends._registry import (
    BackendClass,
    backend_class,
    backend_for,
    backend_protocols,
    register_backend,
    unregister_backend,
)
from oncelog.journal.backends.generic import GenericBackend
from oncelog.journal.backends.local import LocalBackend
from oncelog.journal.backends.memory import MemoryBackend
from oncelog.journal.backends.s3 import S3Backend

__all__ = [
    "ObjectInfo",
    "StagedFile",
    "Backend",
    "Staging",
    "PieceReads",
    "LocalBackend",
    "MemoryBackend",
    "S3Backend",
    "GenericBackend",
    "BackendClass",
    "backend_class",
    "backend_for",
    "backend_protocols",
    "register_backend",
    "unregister_backend",
    "MIN_S3FS_VERSION",
]

# The built-in backends; any other protocol gets GenericBackend.
register_backend(("file", "local"), LocalBackend)
register_backend("memory", MemoryBackend)
register_backend(("s3", "s3a"), S3Backend)


def _conforms(
    local: LocalBackend, memory: MemoryBackend, s3: S3Backend, generic: GenericBackend
) -> list[Backend]:
    """Never called: mypy checks here that every backend satisfies the Backend protocol."""
    return [local, memory, s3, generic]
