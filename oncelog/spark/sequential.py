"""Sequential read-committed helpers: the Sequencer's decisions with the offset that made each.

Every committed message is delivered when its commit is read: its own position for
an OUTSIDE_TXN message, its producer's ACK for a transaction. That *commit offset*
is what the Spark source reports beside each row, so that rows sorted by
`(commit_offset, begin)` are in exactly `read_committed`'s order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from oncelog.message import ACK_TXN, Envelope
from oncelog.sequencer import Sequencer

__all__ = ["sequence_with_commits"]


def sequence_with_commits(
    sequencer: Sequencer,
    envelopes: Iterable[Envelope],
    replay: Callable[[str, int, int], Iterable[Envelope]] | None = None,
    *,
    include_acks: bool = False,
) -> Iterator[tuple[Envelope, int]]:
    """`(envelope, commit offset)` of each committed envelope, in `read_committed` order.

    The commit offset is the begin offset of the envelope whose queueing committed it
    (replayed envelopes are attributed to the ACK that required the replay).
    """
    last: list[Envelope | None] = [None]

    def tracked() -> Iterator[Envelope]:
        for env in envelopes:
            last[0] = env
            yield env

    for env in sequencer.sequence(tracked(), replay):
        if include_acks or (env._ids or env.ids)[2] != ACK_TXN:
            yield env, last[0].begin  # type: ignore[union-attr]
