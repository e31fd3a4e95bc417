"""The optional C speed-ups (`oncelog._speedups`) for this process, or None.

Built from `oncelog/_speedups.c` when oncelog is installed on a machine with a C
compiler; without it (or with `ONCELOG_PURE_PYTHON=1` in the environment) oncelog
runs the equivalent pure-Python code. Both paths give the same results: the tests
run each.

The extension keeps no process-wide configuration: it has a `Decoder` type (made here
once, with the classes it builds) and a `Kernel` type (one per `Sequencer`, which
delegates to it; bound in `oncelog.sequencing.native`, which checks the kernel's queue
outcomes against the Python kernel's). Its UUID layout and flag values are compiled in;
they are checked here, at load, against their one definition in oncelog.identity (a
mismatch is a build bug, not a reason to fall back).

This module sits below framing (which decodes with it): of oncelog it imports only
identity and the message types. `speedups` is the one switch between the C and the
pure-Python paths.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import orjson

from oncelog import identity
from oncelog.identity import (
    _FLAG_VALUES,
    _NIL_FIELDS,
    FLAGS_MASK,
    SEQ_COUNTER_MASK,
    Envelope,
    build_uuid,
    parse_uuid_fields,
)
from oncelog.message import JSONLine, JSONMessage

if TYPE_CHECKING:
    from oncelog._speedups import Decoder

__all__ = ["PURE_ENV", "Speedups", "speedups"]

PURE_ENV = "ONCELOG_PURE_PYTHON"
"""Set to 1 to run without the C speed-ups even where they are built."""

_LAYOUT_NAMES = (
    "UNIX_EPOCH_OFFSET",
    "OUTSIDE_TXN",
    "CONTINUE_TXN",
    "ACK_TXN",
    "FLAGS_MASK",
    "CLOCK_SEQ_BYTE",
    "SEQ_COUNTER_SHIFT",
    "SEQ_COUNTER_MASK",
    "TIME_HI_MASK",
    "PRODUCER_BYTE",
    "PRODUCER_ID_LEN",
)


class Speedups:
    """The loaded extension: its module, and the decoder made for this process's classes.

    `decode_json_lines` and `uuid_ids` are the decoder's own (C) methods. The module's
    sequencing kernel type, `module.Kernel`, is bound in `oncelog.sequencing.native`.
    """

    __slots__ = (
        "decode_json_lazy",
        "decode_json_lines",
        "decoder",
        "module",
        "object_lines",
        "uuid_columns",
        "uuid_ids",
    )

    def __init__(self, module: ModuleType, decoder: Decoder) -> None:
        self.module = module
        self.decoder = decoder
        self.decode_json_lines: Callable[
            [bytes, int, str, str, int], tuple[list[Envelope], int]
        ] = decoder.decode_json_lines
        """Envelopes of the complete lines of data[:limit], and where decoding stopped."""
        self.decode_json_lazy: Callable[
            [bytes, int, str, str, int, int], tuple[list[Envelope], int]
        ] = decoder.decode_json_lazy
        """Envelopes of unparsed JSONLines for data[start:limit], up to the first line that
        does not start with its UUID field (or repeats its key), and where that line begins."""
        self.uuid_ids: Callable[[object], tuple[bytes, int, Any] | None] = decoder.uuid_ids
        """(producer, clock, flags) of a canonical UUID string; None if it is not one."""
        self.object_lines: Callable[[bytes], bytes | None] = module.object_lines
        """The int64 lengths of a chunk's lines if each is `{...}`, else None."""
        self.uuid_columns: Callable[[Any, int], tuple[bytes, ...] | None] = module.uuid_columns
        """The UUID columns' buffers of n canonical UUID texts back to back, or None."""


def _load() -> Speedups | None:
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return None
    try:
        from oncelog import _speedups
    except ImportError:
        return None
    _check_layout(_speedups)
    decoder = _speedups.Decoder(
        Envelope, JSONMessage, orjson.loads, _FLAG_VALUES, _NIL_FIELDS, JSONLine
    )
    _check_uuids(decoder)
    return Speedups(_speedups, decoder)


def _check_layout(module: ModuleType) -> None:
    """The C constants against oncelog.identity's (their one definition)."""
    expected = {name: getattr(identity, name) for name in _LAYOUT_NAMES}
    if module.LAYOUT != expected:
        wrong = sorted(k for k in expected if module.LAYOUT.get(k) != expected[k])
        raise ImportError(
            f"oncelog._speedups was built with another UUID layout or flags ({', '.join(wrong)}:"
            f" {[module.LAYOUT.get(k) for k in wrong]}, oncelog.identity has"
            f" {[expected[k] for k in wrong]}): rebuild the extension"
        )


def _check_uuids(decoder: Decoder) -> None:
    """The C parser against oncelog.identity on UUIDs with every field at its extremes."""
    producer = bytes([0x81, 0x02, 0x40, 0x08, 0x10, 0xFF])
    for clock in (1, SEQ_COUNTER_MASK, (1 << 64) - 1, 0x0123456789ABCDEF):
        for flags in (0, 1, 2, FLAGS_MASK):
            text = str(build_uuid(producer, clock, flags))
            for t in (text, text.upper()):
                if decoder.uuid_ids(t) != parse_uuid_fields(text):
                    raise ImportError(
                        f"oncelog._speedups parses {t} as {decoder.uuid_ids(t)}, oncelog.identity"
                        f" as {parse_uuid_fields(text)}: rebuild the extension"
                    )


speedups: Speedups | None = _load()
"""The loaded C speed-ups, or None when running pure Python."""
