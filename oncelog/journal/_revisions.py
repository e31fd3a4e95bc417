"""Spec revisions: what makes `JournalClient.update` safe between processes and machines.

Each change of a journal's spec is first claimed as revision N+1, written only if absent at
`.oncelog/revisions/<journal>/<incarnation>-<N+1:016x>.json` (the full new spec, the
revision it was based on and a random token, so a retried create whose first reply was lost
recognises its own object), and only then copied over spec.json. Of two updaters based on
revision N exactly one creates N+1; the other is refused and writes nothing. Revision
numbers only grow and are never reused within an incarnation (a re-created journal has a
new incarnation and starts again at 1), so a revision is a proof that cannot be replayed.

spec.json follows the newest revision: an updater that finds a newer revision than the
spec it read (a crash between the two writes, or a slow writer overtaken) rolls spec.json
forward first, and every updater re-checks after its own spec.json write and rolls forward
again if it was overtaken meanwhile, so the last write is always the newest revision.
Readers of spec.json (`get`) may see the previous revision until that write lands.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

from oncelog.coordination import FencedChain, MetaStore
from oncelog.journal.errors import CorruptSpec
from oncelog.journal.store import META_DIR, FragmentStore

if TYPE_CHECKING:
    from oncelog.journal.client import JournalClient

__all__ = ["Revision", "chain", "latest", "new_revision", "revisions_dir", "delete_revisions"]

REVISIONS = "revisions"


@dataclass(frozen=True, slots=True)
class Revision:
    """One claimed revision of a journal's spec: its number and the spec.json bytes it set."""

    number: int
    spec: bytes


def revisions_dir(store: FragmentStore, journal: str) -> str:
    return store.backend.join(META_DIR, REVISIONS, journal)


def _incarnation_key(incarnation: str | None) -> str:
    # Journals created before incarnations existed share one key; they still number
    # their revisions from 1.
    return incarnation or "none"


def chain(client: JournalClient, journal: str, incarnation: str | None) -> FencedChain:
    """The revision chain of this incarnation of the journal: links
    `revisions/<journal>/<incarnation>-<n:016x>.json` (oncelog.coordination). Revisions are
    never pruned, so a created link is never in a freed number: `put` alone decides."""
    return FencedChain(
        MetaStore.of(client, internal=True),
        f"{REVISIONS}/{journal}",
        prefix=f"{_incarnation_key(incarnation)}-",
    )


def latest(client: JournalClient, journal: str, incarnation: str | None) -> Revision | None:
    """The newest revision of this incarnation of the journal, or None if its spec was never
    changed (one LIST, and one GET when there is a revision)."""
    revisions = chain(client, journal, incarnation)
    link = revisions.latest()
    if link is None:
        return None
    n = link.number
    try:
        doc = orjson.loads(link.data)
        spec = doc["spec"].encode()
        if doc["revision"] != n:
            raise ValueError(f"it says revision {doc['revision']}")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        where = revisions.store.display(revisions.path(n))
        raise CorruptSpec(
            f"revision {n} of journal {journal!r}'s spec ({where}) cannot be read: {exc}"
        ) from None
    return Revision(n, spec)


def new_revision(n: int, spec: bytes) -> bytes:
    """The bytes of revision object `n` setting spec.json to `spec` (unique to this attempt)."""
    return orjson.dumps(
        {"revision": n, "spec": spec.decode(), "token": uuid.uuid4().hex},
        option=orjson.OPT_INDENT_2,
    )


def delete_revisions(client: JournalClient, journal: str) -> None:
    """Remove every revision object of the journal, of every incarnation (when it is
    deleted)."""
    meta = MetaStore.of(client, internal=True)
    directory = f"{REVISIONS}/{journal}"
    for name in meta.list(directory):
        if name.endswith(".json"):
            meta.delete(f"{directory}/{name}")
