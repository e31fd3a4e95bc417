"""Type stub of the optional C bulk framing (oncelog/_bulk.c); see oncelog._bulkframing."""

from collections.abc import Callable
from typing import Any

UUID_TEXT_LEN: int

def frame_json(
    docs: list[dict[str, Any]],
    key: str,
    key_json: bytes,
    producer: bytes,
    first_clock: int,
    flags: int,
    dumps: Callable[[Any], bytes],
    /,
) -> bytes | None:
    """JSON-lines frames of `docs` stamped with consecutive clocks from `first_clock`; None
    if the encoding cannot be cut (the caller takes the pure path)."""

def format_uuid(producer: bytes, clock: int, flags: int, /) -> str:
    """The canonical text of the message UUID of (producer, clock, flags)."""
