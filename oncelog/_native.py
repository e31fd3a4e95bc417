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

from oncelog.message import (
    _FLAG_VALUES,
    _NIL_FIELDS,
    FLAGS_MASK,
    SEQ_COUNTER_MASK,
    Envelope,
    JSONMessage,
    build_uuid,
    parse_uuid_fields,
)

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
    _check_layout(_speedups)
    return _speedups


def _check_layout(module: ModuleType) -> None:
    """The C parser hard-codes the UUID layout of oncelog.message: check that they agree
    on UUIDs with every field at its extremes (a mismatch is a build bug, not a fallback)."""
    producer = bytes([0x81, 0x02, 0x40, 0x08, 0x10, 0xFF])
    for clock in (1, SEQ_COUNTER_MASK, (1 << 64) - 1, 0x0123456789ABCDEF):
        for flags in (0, 1, 2, FLAGS_MASK):
            text = str(build_uuid(producer, clock, flags))
            for t in (text, text.upper()):
                if module.uuid_ids(t) != parse_uuid_fields(text):
                    raise ImportError(
                        f"oncelog._speedups parses {t} as {module.uuid_ids(t)}, oncelog.message"
                        f" as {parse_uuid_fields(text)}: rebuild the extension"
                    )


speedups: ModuleType | None = _load()
"""The configured C module, or None when running pure Python."""
