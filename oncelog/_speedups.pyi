"""Type stub of the optional C speed-ups (oncelog/_speedups.c); see oncelog._native."""

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeAlias

from oncelog.message import Envelope, Flags, JSONMessage

_Ids: TypeAlias = tuple[bytes, int, Flags | int]

def configure(
    envelope: type[Envelope],
    message: type[JSONMessage],
    loads: Callable[[bytes], Any],
    flag_values: tuple[Flags | int, ...],
    nil_fields: _Ids,
    /,
) -> None:
    """Set the classes decode_json_lines() builds (once, from oncelog._native)."""

def decode_json_lines(
    data: bytes, base: int, journal: str, uuid_field: str, limit: int, /
) -> tuple[list[Envelope], int]:
    """Envelopes of the complete lines of data[:limit], and where decoding stopped."""

def uuid_ids(value: object, /) -> _Ids | None:
    """(producer, clock, flags) of a canonical UUID string; None if it is not one."""

def configure_sequencer(kernel: type, partial: type, ack: Flags, /) -> None:
    """Set the kernel and partial classes Sequence() works on (from oncelog.sequencer)."""

class _SequenceIterator(Iterator[Envelope]):
    def __next__(self) -> Envelope: ...
    def close(self) -> None: ...

def Sequence(  # a factory, named as the iterator type it returns
    sequencer: Any,
    envelopes: Iterable[Envelope],
    replay: Callable[[str, int, int], Iterable[Envelope]] | None,
    acks: bool,
    /,
) -> _SequenceIterator:
    """Sequencer.sequence() in C, on the kernel's own state (see oncelog.sequencer)."""
