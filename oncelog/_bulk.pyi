"""Type stub of the optional C bulk framing (oncelog/_bulk.c); see oncelog._bulkframing."""

from collections.abc import Callable
from typing import Any, NoReturn

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

class ClockCore:
    """The lock-free state of oncelog.identity.Clock (each operation is atomic)."""

    def __init__(self, value: int = 0) -> None: ...
    @property
    def value(self) -> int: ...
    def tick(self) -> int: ...
    def reserve(self, n: int, /) -> int: ...
    def advance(self) -> int: ...
    def _raise_to(self, target: int, /) -> int: ...

def stamp_json(
    doc: dict[str, Any],
    key: str,
    producer: bytes,
    clock: ClockCore,
    flags: int,
    fail: Callable[[BaseException | bytes], NoReturn],
    /,
) -> tuple[bytes, int]:
    """Advance `clock`, set doc[key] to the UUID text and return (the JSON line, the clock);
    encoding errors call `fail(exception or line)`, which raises."""
