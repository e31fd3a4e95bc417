"""The optional C speed-ups (`oncelog._speedups`), configured for this process, or None.

Built from `oncelog/_speedups.c` when oncelog is installed on a machine with a C
compiler; without it (or with `ONCELOG_PURE_PYTHON=1` in the environment) oncelog
runs the equivalent pure-Python code. Both paths give the same results: the tests
run each.
"""

from __future__ import annotations

import os
from types import ModuleType

import orjson

from oncelog.message import _FLAG_VALUES, _NIL_FIELDS, Envelope, JSONMessage

__all__ = ["speedups", "PURE_ENV"]

PURE_ENV = "ONCELOG_PURE_PYTHON"
"""Set to 1 to run without the C speed-ups even where they are built."""


def _load() -> ModuleType | None:
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return None
    try:
        from oncelog import _speedups
    except ImportError:
        return None
    _speedups.configure(Envelope, JSONMessage, orjson.loads, _FLAG_VALUES, _NIL_FIELDS)
    return _speedups


speedups: ModuleType | None = _load()
"""The configured C module, or None when running pure Python."""
