"""Type stub of the optional C speed-ups (oncelog/_speedups.c); see oncelog._native."""

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final, TypeAlias, final

from oncelog.identity import Envelope, Flags

_Ids: TypeAlias = tuple[bytes, int, Flags | int]
_StateRow: TypeAlias = tuple[str, bytes, int, int]
"""(journal, producer, last_ack, begin): a ProducerState's fields."""
_PartialState: TypeAlias = tuple[str, bytes, int, int, int, int, int, bool]
"""(journal, producer, min_clock, max_clock, begin, ring_start, ring_stop, tracked)."""
_Warn: TypeAlias = Callable[[Envelope, bytes, int, int, int, int, int], object]
"""warn(env, producer, last_ack, begin, clock, flags, code): code indexes WARNINGS."""

LAYOUT: Final[dict[str, int]]
"""The UUID layout and flag values compiled in (checked against oncelog.identity at load)."""
OUTCOMES: Final[tuple[str, ...]]
"""QueueOutcome values, by the outcome numbers Kernel returns."""
WARNINGS: Final[tuple[str, ...]]
"""What the warn codes of a Kernel mean (texts in oncelog.sequencer)."""

@final
class Decoder:
    """The JSON-lines decode hot path, building instances of the given classes."""

    def __new__(
        cls,
        envelope: type[Envelope],
        message: type[Any],
        loads: Callable[[bytes | bytearray], Any],
        flag_values: tuple[Flags | int, ...],
        nil_fields: _Ids,
        line: type[Any] | None = None,
        /,
    ) -> Decoder: ...
    def decode_json_lines(
        self, data: bytes, base: int, journal: str, uuid_field: str, limit: int, /
    ) -> tuple[list[Envelope], int]:
        """Envelopes of the complete lines of data[:limit], and where decoding stopped."""
    def decode_json_chunk(
        self, data: bytes, base: int, journal: str, uuid_field: str, limit: int, /
    ) -> tuple[list[Envelope], int]:
        """`decode_json_lines`, with the lines parsed by one `loads` call when each starts
        with `{` and none holds `[` (exact then; otherwise line by line): the same result."""
    def decode_json_lazy(
        self, data: bytes, base: int, journal: str, uuid_field: str, start: int, limit: int, /
    ) -> tuple[list[Envelope], int]:
        """Unparsed JSONLines for data[start:limit] up to the first line that does not start
        with its UUID field (or repeats its key), and where that line begins."""
    def uuid_ids(self, value: object, /) -> _Ids | None:
        """(producer, clock, flags) of a canonical UUID string; None if it is not one."""

@final
class _Partial:
    """A producer's partial sequence in one journal (a Kernel record; not made from Python)."""

@final
class SequenceIterator(Iterator[Envelope]):
    """Kernel.sequence(): queue_uncommitted then step per envelope."""

    def __next__(self) -> Envelope: ...
    def close(self) -> None:
        """Stop sequencing."""

@final
class Kernel:
    """SequencingKernel in C: the ring, the producer table, the offsets (see oncelog.sequencer)."""

    def __new__(
        cls,
        offsets: dict[str, int],
        states: Iterable[_StateRow],
        buffer: int,
        warn: _Warn,
        max_bytes: int = 0,
    ) -> Kernel: ...
    @property
    def dequeued(self) -> Envelope | None:
        """The envelope step() last returned."""
    @property
    def buffer(self) -> int:
        """The ring's size now (a growing ring, max_bytes > 0, doubles; never shrinks)."""
    @property
    def stepping(self) -> bool:
        """A committed sequence is being stepped through."""
    def queue_uncommitted(self, env: Envelope, /) -> int:
        """Evict the head, decide, apply: the outcome's index in OUTCOMES."""
    def decide(self, env: Envelope, /) -> tuple[int, _PartialState]:
        """(outcome index, partial state) of queueing env next; changes nothing."""
    def step(self) -> Envelope | None:
        """The next committed envelope, or None once the committed sequence is drained."""
    def replay_range(self) -> tuple[str, int, int]:
        """(journal, begin, end) to replay before stepping on."""
    def start_replay(self, envelopes: Iterable[Envelope], /) -> None:
        """Supply the envelopes of replay_range(), then step() on."""
    def offsets(self) -> dict[str, int]:
        """A copy of the read-through offsets."""
    def has_pending(self) -> bool:
        """True if a transaction begun since the last checkpoint is still open."""
    def checkpoint(
        self, prune_below: int, dequeued_processed: bool, /
    ) -> tuple[dict[str, int], list[_StateRow]]:
        """Offsets and producer states (prune_below -1: no pruning); clears the pending."""
    def sequence(
        self,
        envelopes: Iterable[Envelope],
        replay: Callable[[str, int, int], Iterable[Envelope]] | None,
        acks: bool,
        /,
    ) -> SequenceIterator:
        """Queue each envelope and yield the committed ones (Sequencer.sequence)."""
    def ring(self) -> tuple[list[Envelope | None], list[int], int]:
        """(envelopes, next links, head), for tests."""
    def partials(self, journal: str, /) -> dict[bytes, _PartialState]:
        """producer -> partial state of a journal, for tests."""
    def emitting(self) -> _PartialState | None:
        """The partial state of the sequence being stepped through, or None."""
    def pending(self) -> int:
        """How many transactions begun since the last checkpoint are open."""
    def producers(self) -> int:
        """How many producers are tracked."""

def object_lines(chunk: bytes, /) -> bytes | None:
    """The int64 lengths of chunk's lines if each is `{...}` (at most 1024 openers), else None."""

def uuid_columns(texts: Any, n: int, /) -> tuple[bytes, ...] | None:
    """The UUID columns' buffers of n canonical UUID texts back to back, or None."""
def pack_frames(envelopes: list[Envelope], /) -> tuple[bytes, ...]:
    """(data, starts, begins, ends, producers, clocks, flags): the envelopes' frames
    (`message.line`) back to back and their columns (oncelog.reading.CommittedBatch)."""
def committed_columns(
    data: bytes,
    base: int,
    uuid_field: str,
    table: bytes,
    carry_data: bytes,
    carry_frames: bytes,
    acks: bool,
    max_carry: int,
    /,
) -> tuple[bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes] | None:
    """oncelog.sequencing.columnar.committed_columns in C, result for result: a chunk's
    committed frames as columns, then the producer table and carry after it; or None."""
