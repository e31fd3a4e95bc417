"""Support for the journal tests: fresh journals with unique names."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

from oncelog.journal import FragmentSpec, JournalClient, JournalSpec

_names = itertools.count()


def new_journal(client: JournalClient, prefix: str = "t", **fragment: Any) -> str:
    """Create a journal with a name no other test uses (FragmentSpec fields as keywords)."""
    name = f"{prefix}/j-{next(_names)}-{uuid.uuid4().hex[:6]}"
    client.create(JournalSpec(name, fragment=FragmentSpec(**fragment)))
    return name


def spy_local_block_reads(client: JournalClient, calls: list[tuple[Any, ...]]) -> None:
    """Record the reads of raw fragments by blocks from local disk (which go through open
    files, not the backend's read_range) as ("range", start, end) in the fragment."""
    store = client.store
    original = store.open_pieces

    class Spy:
        def __init__(self, inner: Any) -> None:
            self.inner = inner
            self.fragment, self.blocks = inner.fragment, inner.blocks

        def read_blocks(self, lo: int, hi: int, buffer: bytearray) -> Any:
            begin = self.fragment.begin
            calls.append(("range", lo - begin, hi - begin))
            return self.inner.read_blocks(lo, hi, buffer)

        def close(self) -> None:
            self.inner.close()

    def open_pieces(fragment: Any, blocks: Any) -> Any:
        return Spy(original(fragment, blocks))

    store.open_pieces = open_pieces  # type: ignore[method-assign]


def write_pipeline_output(client: JournalClient, name: str) -> None:
    """Journal `name` (created beforehand, JSON lines) as a pipeline leaves it: committed
    messages n=1 and n=5, a committed transaction of n=2 and n=3 (with its ACK), and a
    rolled-back one of n=4 (its pending message plus a rollback ACK)."""
    import pytest

    from oncelog.framing import CONTENT_TYPE_JSON_LINES
    from oncelog.message import JSONMessage
    from oncelog.publisher import Publisher

    pub = Publisher(client)
    to = lambda _msg: (name, CONTENT_TYPE_JSON_LINES)  # noqa: E731
    pub.publish_committed(to, JSONMessage({"n": 1})).result()
    with pub.transaction():
        for n in (2, 3):
            pub.publish_uncommitted(to, JSONMessage({"n": n}))
    with pytest.raises(RuntimeError):
        with pub.transaction():
            pub.publish_uncommitted(to, JSONMessage({"n": 4}))
            raise RuntimeError("roll back")
    pub.publish_committed(to, JSONMessage({"n": 5})).result()
