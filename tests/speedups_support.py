"""Run a test on both paths: the C speed-ups (`oncelog._speedups`) and pure Python."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from oncelog import _bulkframing, _native

PURE_REQUESTED = os.environ.get(_native.PURE_ENV, "") not in ("", "0")
"""ONCELOG_PURE_PYTHON is set: the run is about the pure-Python path only."""
MODES = ["pure"] if PURE_REQUESTED else ["c", "pure"]
BUILT = _native.speedups


@contextmanager
def speedups_mode(mode: str) -> Iterator[None]:
    """Within the block, decoding and sequencing take the C path ("c") or pure Python ("pure")."""
    if mode not in ("c", "pure"):
        raise ValueError(mode)
    if mode == "c" and BUILT is None:
        raise AssertionError("oncelog._speedups is not built (or ONCELOG_PURE_PYTHON is set)")
    saved = _native.speedups
    _native.speedups = BUILT if mode == "c" else None
    try:
        yield
    finally:
        _native.speedups = saved


BULK_BUILT = _bulkframing.native
BULK_PURE_REQUESTED = os.environ.get(_bulkframing.PURE_ENV, "") not in ("", "0")
BULK_MODES = ["pure"] if BULK_PURE_REQUESTED else ["c", "pure"]


@contextmanager
def bulk_mode(mode: str) -> Iterator[str]:
    """Within the block, publishing's stamping and framing (`oncelog._bulk`) take the C path
    ("c") or pure Python ("pure")."""
    if mode == "c" and BULK_BUILT is None:
        raise AssertionError("oncelog._bulk is not built (or ONCELOG_PURE_PYTHON is set)")
    saved = _bulkframing.native
    _bulkframing.native = BULK_BUILT if mode == "c" else None
    try:
        yield mode
    finally:
        _bulkframing.native = saved
