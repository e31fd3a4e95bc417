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

import re
import uuid
from dataclasses import dataclass

import orjson

from oncelog.journal.errors import CorruptSpec
from oncelog.journal.store import META_DIR, FragmentStore

__all__ = ["Revision", "latest", "new_revision", "revisions_dir", "delete_revisions"]

REVISIONS = "revisions"

_NAME_RE = re.compile(r"^(?P<incarnation>[0-9A-Za-z_]+)-(?P<rev>[0-9a-f]{16})\.json$")


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


def revision_path(store: FragmentStore, journal: str, incarnation: str | None, n: int) -> str:
    return store.backend.join(
        META_DIR, REVISIONS, journal, f"{_incarnation_key(incarnation)}-{n:016x}.json"
    )


def _numbers(store: FragmentStore, journal: str, incarnation: str | None) -> list[int]:
    key = _incarnation_key(incarnation)
    out = []
    for info in store.backend.list_dir(revisions_dir(store, journal)):
        m = _NAME_RE.match(info.name.rsplit("/", 1)[-1])
        if m is not None and m.group("incarnation") == key:
            out.append(int(m.group("rev"), 16))
    return out


def latest(store: FragmentStore, journal: str, incarnation: str | None) -> Revision | None:
    """The newest revision of this incarnation of the journal, or None if its spec was never
    changed (one LIST, and one GET when there is a revision)."""
    numbers = _numbers(store, journal, incarnation)
    if not numbers:
        return None
    n = max(numbers)
    path = revision_path(store, journal, incarnation, n)
    data = store.backend.read(path)
    try:
        doc = orjson.loads(data)
        spec = doc["spec"].encode()
        if doc["revision"] != n:
            raise ValueError(f"it says revision {doc['revision']}")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptSpec(
            f"revision {n} of journal {journal!r}'s spec ({path}) cannot be read: {exc}"
        ) from None
    return Revision(n, spec)


def new_revision(n: int, spec: bytes) -> bytes:
    """The bytes of revision object `n` setting spec.json to `spec` (unique to this attempt)."""
    return orjson.dumps(
        {"revision": n, "spec": spec.decode(), "token": uuid.uuid4().hex},
        option=orjson.OPT_INDENT_2,
    )


def delete_revisions(store: FragmentStore, journal: str) -> None:
    """Remove every revision object of the journal (when it is deleted)."""
    directory = revisions_dir(store, journal)
    names = [
        info.name.rsplit("/", 1)[-1]
        for info in store.backend.list_dir(directory)
        if _NAME_RE.match(info.name.rsplit("/", 1)[-1])
    ]
    store.backend.delete([store.backend.join(META_DIR, REVISIONS, journal, n) for n in names])
