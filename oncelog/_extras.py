"""Optional dependencies: which extra installs each one, and the error when one is missing.

oncelog's core needs only its required dependencies; Arrow reads, S3, Spark, the streaming
node, metrics, pandas and Delta exports need packages that the extras of the same names
install (`pip install 'oncelog[arrow]'`, ...). Every import of such a package is made
inside `needs_extra(extra, feature)`, so that a missing package raises `MissingExtra`
naming the feature that needs it and the exact command that installs it, instead of a bare
`ModuleNotFoundError` (or fsspec's "Install s3fs") that names neither.

Invariant: `EXTRAS` lists, for each extra, the top-level modules its packages provide, and
agrees with `[project.optional-dependencies]` in pyproject.toml (tests/test_packaging.py
checks it). Only a missing module of the named extra is translated; any other import error
(a broken installation, a missing name inside an installed package) propagates unchanged,
so the error never blames an extra that is installed.

This module imports nothing from oncelog but the error root, so any module can use it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from oncelog.errors import MissingExtra

__all__ = ["EXTRAS", "MissingExtra", "needs_extra"]

EXTRAS: dict[str, tuple[str, ...]] = {
    "arrow": ("pyarrow",),
    "s3": ("s3fs",),
    "spark": ("pyspark", "pyarrow"),
    "streaming": ("grpc", "grpc_health"),
    "metrics": ("prometheus_client",),
    "pandas": ("pandas", "pyarrow"),
    "delta": ("deltalake", "pyarrow"),
}
"""Each extra's top-level import names (what `pip install 'oncelog[extra]'` makes importable)."""


def install_command(extra: str) -> str:
    """The shell command that installs `extra` (quoted for any POSIX shell)."""
    return f"pip install 'oncelog[{extra}]'"


def _missing_module(exc: BaseException, modules: tuple[str, ...]) -> str | None:
    """The top-level module of `modules` whose absence caused `exc`, if any: `exc` itself
    or an error it was raised from (fsspec raises `ImportError("Install s3fs ...")` from
    the `ModuleNotFoundError`). Bounded: an exception chain is walked at most 16 deep."""
    seen: BaseException | None = exc
    for _ in range(16):
        if seen is None:
            return None
        if isinstance(seen, ModuleNotFoundError) and not isinstance(seen, MissingExtra):
            root = (seen.name or "").split(".", 1)[0]
            if root in modules:
                return root
        seen = seen.__cause__ or seen.__context__
    return None


@contextmanager
def needs_extra(extra: str, feature: str) -> Iterator[None]:
    """Run imports of `extra`'s packages for `feature`; a missing one raises MissingExtra.

        with needs_extra("arrow", "read_committed_arrow"):
            import pyarrow as pa

    `feature` is what the user called or configured (a function, a store URL, a command),
    so the message tells them what needs the package. A MissingExtra raised inside (a
    nested feature's) propagates unchanged; other errors too.
    """
    modules = EXTRAS[extra]
    try:
        yield
    except ImportError as exc:
        if isinstance(exc, MissingExtra):
            raise
        missing = _missing_module(exc, modules)
        if missing is None:
            raise
        raise MissingExtra(feature, extra, missing) from exc
