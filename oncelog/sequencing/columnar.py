"""Read-committed over columns: the fast path of `oncelog.reading.read_committed_batches`.

A chunk of whole JSON lines is sequenced without a Python object per line: each line's UUID
is read out of it as lazy reading reads it, and the commit outcomes are decided over the
columns with a small per-producer table, by the rules of `decide_outcome` (Gazette's).
`committed_columns` states that decision in Python; `oncelog._speedups.committed_columns` is
the same function in C, result for result (the tests run them side by side).

It handles the common case only, and says so by returning None for a chunk that is not it,
which the reader then sequences as envelopes with its `Sequencer` (the exact path):

- a line that lazy reading would parse (its UUID not read out of it), or a non-canonical UUID;
- a zero or nil clock (clock < 2: a new producer's record starts at clock - 1, which must be
  a real clock), or flags other than OUTSIDE_TXN, CONTINUE_TXN and ACK_TXN;
- an OUTSIDE_TXN message while its producer's transaction is open, or an ACK_TXN below its
  producer's last ACK (the cases where the kernel logs a warning);
- more than `max_carry` bytes of frames pending at the chunk's end.

State between chunks, all bytes in native order: the producer `table` (32-byte records:
producer padded to 8 bytes, last ACK clock `min`, largest pending clock `max`, `begin` of
the open transaction or -1; in first-seen order), and the frames still pending (their bytes
back to back in `carry_data`, 40-byte records in `carry_frames`: begin, end, start in
carry_data, clock, producer index, flags; in journal order). Invariants: a producer's
pending frames are exactly its CONTINUE_TXN frames with clocks in (min, max], increasing,
the first at `begin`; a producer with none has begin -1 and min == max (as the kernel's
record after `step()` drained).

`ColumnarState` keeps that state for one journal and brings a `Sequencer` to the same state
(`sync`) by queueing to it a few messages: an ACK_TXN at the last ACK clock closes a
transaction without committing it (ACK_ROLLBACK), one above it moves the last ACK there
(ACK_EMPTY), and the pending frames themselves reopen a transaction; a duplicate
OUTSIDE_TXN moves the journal's offset. Checkpoints taken from the Sequencer afterwards are
those the envelope path would have.
"""

from __future__ import annotations

import struct
from array import array
from typing import Any, Protocol

from oncelog.errors import SequencerError
from oncelog.identity import ACK_TXN, CONTINUE_TXN, OUTSIDE_TXN, Envelope, parse_uuid_fields
from oncelog.message import JSONLine, lazy_uuid_text


class Sequencer(Protocol):
    """What the fast path uses of `oncelog.sequencer.Sequencer` (above this package, so
    named here by its methods)."""

    @property
    def dequeued(self) -> Any: ...

    def has_pending(self) -> bool: ...

    def checkpoint(self, prune_horizon: Any = ...) -> tuple[dict[str, int], list[Any]]: ...

    def committed(self, envelopes: Any, replay: Any = ..., *, acks: bool = ...) -> Any: ...

__all__ = ["ColumnarState", "committed_columns", "MAX_CARRY"]

MAX_CARRY = 4 << 20
"""Bytes of pending frames the fast path carries between chunks; beyond, the Sequencer
(whose ring has its own budget, and replays) takes over."""

PRODUCER = struct.Struct("=8sQQq")
"""A producer record of the table."""
FRAME = struct.Struct("=qqqQii")
"""A carried frame's record."""

Columns = tuple[bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes]
"""(data, starts, begins, ends, producers, clocks, flags, table, carry_data, carry_frames)."""


def committed_columns(
    data: bytes, base: int, uuid_field: str, table: bytes, carry_data: bytes,
    carry_frames: bytes, acks: bool, max_carry: int,
) -> Columns | None:
    """The committed frames of `data` (whole JSON lines read at journal offset `base`) in
    commit order, as `CommittedBatch`'s seven columns, then the table and the carry after
    the chunk; None if the chunk is not the simple case (see the module). ACK_TXN frames
    are included only with `acks` (as `Sequencer.committed(acks=...)`)."""
    if not data or data[-1:] != b"\n":
        return None
    key = b'"' + uuid_field.encode() + b'"'
    prefix = b"{" + key + b':"'
    prods = [list(r) for r in PRODUCER.iter_unpack(table)]
    index = {r[0][:6]: i for i, r in enumerate(prods)}
    # frames: [begin, end, bytes, clock, producer index, flags]; pending: their indices.
    frames = []
    for begin, end, start, clock, p, flags in FRAME.iter_unpack(carry_frames):
        frames.append([begin, end, carry_data[start : start + end - begin], clock, p, flags])
    pending: dict[int, list[int]] = {}
    for j, fr in enumerate(frames):
        pending.setdefault(fr[4], []).append(j)
    emitted: list[int] = []
    pos = 0
    for line in [x + b"\n" for x in data.split(b"\n")[:-1]]:
        text = lazy_uuid_text(line, prefix, key)
        if text is None:
            return None
        try:
            producer, clock, flags = parse_uuid_fields(text.decode("ascii"))
        except (ValueError, UnicodeDecodeError):
            return None
        if clock < 2 or int(flags) not in (OUTSIDE_TXN, CONTINUE_TXN, ACK_TXN):
            return None
        p = index.get(producer)
        if p is None:
            p = index[producer] = len(prods)
            prods.append([producer + bytes(2), clock - 1, clock - 1, -1])
        g = len(frames)
        frames.append([base + pos, base + pos + len(line), line, clock, p, int(flags)])
        pos += len(line)
        rec = prods[p]
        if flags == CONTINUE_TXN:
            if clock <= rec[2]:
                continue  # already acknowledged, or held by the open transaction
            if rec[3] == -1:
                rec[3] = base + pos - len(line)
            pending.setdefault(p, []).append(g)
            rec[2] = clock
        elif flags == ACK_TXN:
            if clock < rec[1]:
                return None
            span = pending.pop(p, [])
            if clock > rec[1]:  # a commit (ACK_COMMIT_* or ACK_EMPTY); else ACK_ROLLBACK
                delivered = [h for h in span if frames[h][3] <= clock]
                emitted += delivered
                if acks and not (delivered and frames[delivered[-1]][3] == clock):
                    emitted.append(g)
            rec[1] = rec[2] = clock
            rec[3] = -1
        else:
            if clock <= rec[1]:
                continue
            if rec[3] != -1:
                return None
            emitted.append(g)
            rec[1] = rec[2] = clock
    carried = sorted(h for span in pending.values() for h in span)
    if sum(frames[h][1] - frames[h][0] for h in carried) > max_carry:
        return None
    out = [frames[h] for h in emitted]
    starts = array("q", [0])
    for fr in out:
        starts.append(starts[-1] + len(fr[2]))
    new_carry = b"".join(frames[h][2] for h in carried)
    records, at = [], 0
    for h in carried:
        begin, end, _, clock, p, flags = frames[h]
        records.append(FRAME.pack(begin, end, at, clock, p, flags))
        at += end - begin
    return (
        b"".join(fr[2] for fr in out),
        starts.tobytes(),
        array("q", [fr[0] for fr in out]).tobytes(),
        array("q", [fr[1] for fr in out]).tobytes(),
        b"".join(prods[fr[4]][0][:6] for fr in out),
        array("Q", [fr[3] for fr in out]).tobytes(),
        array("i", [fr[5] for fr in out]).tobytes(),
        b"".join(PRODUCER.pack(*r) for r in prods),
        new_carry,
        b"".join(records),
    )


class ColumnarState:
    """The fast path's state for one journal, and what the `Sequencer` was last told of it.

    Entered (`enter`) only from a Sequencer with no transaction open in the journal and no
    committed sequence being stepped through; from then on the table and carry here are
    the truth, and the Sequencer lags behind until `sync` brings it level (before a chunk
    the envelope path must take, before a checkpoint, and when reading ends).
    `_told` maps a producer index to the (min, begin, frames queued) the Sequencer has.
    """

    __slots__ = ("journal", "uuid_field", "table", "carry_data", "carry_frames", "offset",
                 "_told", "fast_chunks")

    def __init__(self, journal: str, uuid_field: str) -> None:
        self.journal, self.uuid_field = journal, uuid_field
        self.table = self.carry_data = self.carry_frames = b""
        self.offset = -1  # where the last chunk ended (-1: nothing to tell the Sequencer)
        self._told: dict[int, tuple[int, int, int]] = {}
        self.fast_chunks = 0
        """How many chunks took the fast path (tests check it ran)."""

    @classmethod
    def enter(cls, sequencer: Sequencer, journal: str, uuid_field: str) -> ColumnarState | None:
        """The state of `sequencer` for `journal`, if the fast path may start from it: no
        transaction open there (none begun since its last checkpoint, and no restored one),
        nothing being stepped through, every last ACK a real clock. Else None."""
        if sequencer.has_pending() or sequencer.dequeued is not None:
            return None
        _, states = sequencer.checkpoint()  # nothing pending: it changes nothing
        mine = [s for s in states if s.journal == journal]
        if any(s.begin != -1 or s.last_ack < 1 for s in mine):
            return None
        state = cls(journal, uuid_field)
        state.table = b"".join(
            PRODUCER.pack(s.producer + bytes(2), s.last_ack, s.last_ack, -1) for s in mine
        )
        state._told = {i: (s.last_ack, -1, 0) for i, s in enumerate(mine)}
        return state

    def sync(self, sequencer: Sequencer) -> None:
        """Queue to `sequencer` what brings its state for the journal level with this one
        (producers, open transactions and their frames, the offset); nothing is delivered."""
        if self.offset < 0:
            return
        journal, field = self.journal, self.uuid_field
        acks: list[Envelope] = []
        frames: list[Envelope] = []
        told = self._told
        pending: dict[int, list[tuple[int, int, int, int, int, int]]] = {}
        for rec in FRAME.iter_unpack(self.carry_frames):
            pending.setdefault(rec[4], []).append(rec)
        at, offset = self.offset, self.offset
        for i, (pad, low, _, begin) in enumerate(PRODUCER.iter_unpack(self.table)):
            producer = pad[:6]
            mine = pending.get(i, [])
            was = told.get(i)
            if was is not None and was[0] == low and was[1] == begin:
                new = mine[was[2]:]  # the same transaction (or none): only its new frames
            else:
                new = mine
                if was is not None and was[1] != -1:  # close it, committing nothing
                    acks.append(Envelope(journal, at, at, None, (producer, was[0], ACK_TXN)))
                if was is None or low > was[0]:
                    acks.append(Envelope(journal, at, at, None, (producer, low, ACK_TXN)))
            for begin_, end, start, clock, _, flags in new:
                line = self.carry_data[start : start + end - begin_]
                env = Envelope(journal, begin_, end, JSONLine(line, field, journal, begin_))
                env._ids = (producer, clock, flags)
                frames.append(env)
            told[i] = (low, begin, len(mine))
        frames.sort(key=lambda e: e.begin)
        envs = acks + frames
        for pad, low, _, _ in PRODUCER.iter_unpack(self.table[: PRODUCER.size]):
            # A duplicate: moves the offset to where the last chunk ended, and nothing else.
            envs.append(Envelope(journal, offset, offset, None, (pad[:6], low, OUTSIDE_TXN)))
        if sequencer.committed(envs, None, acks=False):
            raise SequencerError(
                f"columnar read of journal {journal!r}: bringing the sequencer to offset"
                f" {offset} delivered messages (a bug)"
            )
        self.offset = -1
