"""Coordination without a broker: the metadata store and the fenced chain.

Every ownership rule of oncelog rests on two pieces, defined here once:

- `MetaStore`: small objects under `<root>/.oncelog/`, created **only if absent**, read,
  listed (from a name on: S3 `StartAfter`) and deleted, with transient failures retried.
  A create whose reply was lost is resolved against a token of the caller's own: every
  object's bytes are unique to the attempt that wrote them (a random token inside), so an
  object found holding exactly our bytes is ours.
- `FencedChain`: numbered links `<directory>/<prefix><n:016x>.json`. An owner takes the chain
  by creating the link after the newest it saw (`claim`), and owns it while nothing newer
  exists. Consumer checkpoints, transactional-id records, a streaming channel's terms, a
  node's heartbeats and journal spec revisions are chains; what differs is only the codec
  of a link's bytes (and, for checkpoints, tombstones that fence a deleted group).

Why `claim` is sound (put-if-absent of link N, then a LIST from N on that finds nothing
newer), with links pruned behind the owner. The store guarantees: put-if-absent is atomic,
and a LIST reflects every write and delete completed before it started (S3 has been
strongly consistent since 2020; local disk and memory trivially). The chain keeps:

- I1 (the top survives): `prune` deletes a link only if a higher one was in the same
  listing, so once "a link above N exists" is true it stays true forever (a chain of
  deletions, each needing a higher survivor, ends at one never deleted).
- I2 (no skipping): a writer's next number is the number of a link it saw, plus one.

Let W's create of N succeed at t1 and its LIST at t2 > t1 show nothing above N. If a link
N had existed before (and was pruned, freeing the name), a higher link existed when it was
pruned (I1) and still exists at t2, where the LIST would have seen it: so N is new. Nobody
superseded N-1 by N (W's create would have failed) or by a higher link (I2: it would have
seen N-1 or N, and written N or N+1, which the LIST would show, or writes after t2 and then
sees W's N and numbers above it). So W owns the chain from t1 until a link above N exists.
A create that succeeded but finds a newer link (`Placement.SUPERSEDED`) landed in a number
freed by pruning, or was overtaken while its writer paused: the writer is fenced out.
Nothing here depends on an object that pruning or retention can delete: the proof of
ownership only grows.
"""

from __future__ import annotations

import enum
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn, TypeVar

if TYPE_CHECKING:
    from oncelog.journal.backends import Backend
    from oncelog.journal.client import JournalClient
    from oncelog.journal.store import FragmentStore

# oncelog.journal is imported inside functions: it imports this module (the client builds
# its `meta` here), so importing it at the top would be circular.

__all__ = [
    "RESERVED_DIRS",
    "FencedChain",
    "Link",
    "MetaStore",
    "Placement",
    "create_if_absent",
    "new_token",
    "retry_storage",
]

T = TypeVar("T")

_LINK = re.compile(r"^(?P<prefix>.*?)(?P<n>[0-9a-f]{16})\.json$")
_LATEST_ATTEMPTS = 5  # links vanishing (pruned) between a LIST and a GET, in a row

RESERVED_DIRS: tuple[str, ...] = ("claims", "journals", "compactions", "revisions", "segments")
"""The top directories of `<root>/.oncelog/` that belong to oncelog's own layers (claims,
journal specs, compaction records, spec revisions): only a `MetaStore` made with
`internal=True` writes or deletes there, so a user's object can never be taken for (or
overwrite) one of the journal layer's."""


def new_token() -> str:
    """A random token, unique to one write attempt (see `MetaStore.put_if_absent`)."""
    return uuid.uuid4().hex


def retry_storage(
    op: Callable[[], T], what: str, *, timeout: float, where: str, ambiguous: bool = False
) -> T:
    """Run a storage call, retrying transient failures (oncelog.journal's classification)
    for `timeout` seconds; then raise StorageUnavailable naming `where` (the client) and
    `what`, and saying whether the outcome is known: `ambiguous` is a write that may have
    taken effect (`outcome_known=False`), otherwise nothing was changed. Bounded: gives up
    at the deadline."""
    from oncelog.journal._retry import retry
    from oncelog.journal.errors import StorageUnavailable

    def give_up(exc: Exception) -> NoReturn:
        outcome = (
            "its outcome is unknown (it may have taken effect)" if ambiguous else
            "nothing was changed"
        )
        raise StorageUnavailable(
            f"{where}: could not {what} within {timeout} s; {outcome}: {exc!r}",
            outcome_known=not ambiguous,
        ) from exc

    return retry(op, timeout, give_up)


class _Vanished(Exception):
    """The object existed, then was deleted before it could be read: try again (transient
    to the retry loop, so bounded by its deadline)."""


def create_if_absent(
    backend: Backend, path: str, data: bytes, what: str, *, timeout: float, where: str
) -> bool:
    """Create `path` (a full path of `backend`) holding `data` only if absent; True if this
    call made it. Retried as `retry_storage` with `ambiguous=True`.

    Every caller's `data` is unique to the attempt (a token, a writer id and a time), so
    an object found with exactly these bytes was made by this call: an earlier try whose
    reply was lost (botocore, s3fs or this loop retried a PUT that had taken effect and
    then got 412). 409 conflicts and other transient answers are retried."""

    def attempt() -> bool:
        if backend.create(path, data):
            return True
        try:
            existing = backend.read(path)
        except FileNotFoundError:
            raise _Vanished() from None
        return bytes(existing) == data

    return retry_storage(attempt, what, timeout=timeout, where=where, ambiguous=True)


class MetaStore:
    """Small objects under `<root>/.oncelog/` of one journal store, by paths relative to it.

    It stands on the store alone: the `FragmentStore` (its backend), the `retry_timeout`
    of its writes, and `description`, which names the store (its client) in errors.
    `MetaStore.of(client)` takes all three from a `JournalClient` (`client.meta`). Paths
    are validated; only `internal=True` lets oncelog's own layers write inside
    `RESERVED_DIRS` (claims, specs, compaction records, spec revisions)."""

    __slots__ = ("_store", "_retry_timeout", "_description", "_internal")

    def __init__(
        self,
        store: FragmentStore,
        *,
        retry_timeout: float,
        description: str,
        internal: bool = False,
    ) -> None:
        self._store = store
        self._retry_timeout = retry_timeout
        self._description = description
        self._internal = internal

    @classmethod
    def of(cls, client: JournalClient, *, internal: bool = False) -> MetaStore:
        """The metadata store of `client`'s store, with its retry timeout, named as it is."""
        return cls(
            client.store,
            retry_timeout=client.retry_timeout,
            description=repr(client),
            internal=internal,
        )

    def __repr__(self) -> str:
        return f"MetaStore({self._description})"

    def _check_write(self, path: str) -> None:
        """InvalidObjectPath unless `path` is a safe relative path this store may write."""
        from oncelog.journal.errors import InvalidObjectPath
        from oncelog.journal.names import validate_object_path

        validate_object_path(path)
        if not self._internal and path.split("/", 1)[0] in RESERVED_DIRS:
            raise InvalidObjectPath(
                f"object path {path!r} is inside oncelog's own claims/ or journals/ directory"
            )

    def _retry(self, op: Callable[[], T], what: str, *, ambiguous: bool = False) -> T:
        return retry_storage(
            op, what, timeout=self._retry_timeout, where=self._description,
            ambiguous=ambiguous,
        )

    def put_if_absent(self, path: str, data: bytes) -> bool:
        """Store `data` at `path` only if nothing is there yet (durably); True if this call
        created it. `data` must be unique to the caller's attempt (hold a token): an object
        found with exactly these bytes is this call's own, whose reply was lost. Transient
        errors (5xx, 409 conflicts, resets) are retried for the store's retry_timeout,
        then StorageUnavailable with `outcome_known=False` (the object may exist)."""
        self._check_write(path)
        backend = self._store.backend
        backend.require_create()
        return create_if_absent(
            backend, self._store.meta_path(path), bytes(data), f"create {path!r}",
            timeout=self._retry_timeout, where=self._description,
        )

    def write(self, path: str, data: bytes) -> None:
        """Store `data` at `path`, replacing what is there (durably; retried). For objects
        whose every writer writes the same bytes (a compaction's claims object), never for
        a link of a chain."""
        self._check_write(path)
        full = self._store.meta_path(path)
        backend = self._store.backend
        self._retry(lambda: backend.write(full, bytes(data)), f"write {path!r}", ambiguous=True)

    def read(self, path: str) -> bytes | None:
        """The bytes at `path`, or None if absent (transient errors retried by the store)."""
        full = self._store.meta_path(path)
        try:
            return self._store.backend.read(full)
        except FileNotFoundError:
            return None

    def list(self, directory: str, after: str | None = None) -> list[str]:
        """Names of the objects directly in `directory`, sorted; only those after `after`
        when given (S3 lists from there)."""
        path = self._store.meta_path(directory.rstrip("/"))
        return self._store.backend.list_names_after(path, after)

    def delete(self, path: str) -> None:
        """Remove `path` (no error if absent)."""
        self._check_write(path)
        full = self._store.meta_path(path)
        backend = self._store.backend
        self._retry(lambda: backend.delete([full]), f"delete {path!r}")

    def display(self, path: str) -> str:
        """The object's full location, as named in errors."""
        return self._store.meta_path(path)


class Placement(enum.Enum):
    """How `FencedChain.claim` ended."""

    WON = "won"
    """Created, and nothing newer: the writer owns the chain."""
    TAKEN = "taken"
    """The number was taken: nothing was written; the writer is fenced out."""
    SUPERSEDED = "superseded"
    """Created, but a newer link (or fence) exists: the writer is fenced out. Its link
    landed in a number freed by pruning, or was overtaken while its writer paused."""


@dataclass(frozen=True, slots=True)
class Link:
    """One link of a chain: its number and stored bytes."""

    number: int
    data: bytes


class FencedChain:
    """The links `<directory>/<prefix><n:016x>.json` of one chain in a `MetaStore` (see the
    module for the protocol and why it is sound). `prefix` lets several chains share a
    directory (spec revisions: one chain per incarnation of a journal). Other objects in
    the directory (a checkpoint chain's tombstones, state) are ignored here."""

    def __init__(self, store: MetaStore, directory: str, prefix: str = "") -> None:
        self.store = store
        self.directory = directory.rstrip("/")
        self.prefix = prefix

    def __repr__(self) -> str:
        return f"FencedChain({self.store.display(self.directory)!r}, prefix={self.prefix!r})"

    def name(self, n: int) -> str:
        return f"{self.prefix}{n:016x}.json"

    def path(self, n: int) -> str:
        """Link `n`'s path in the store."""
        return f"{self.directory}/{self.name(n)}"

    def numbers_in(self, names: Sequence[str]) -> list[int]:
        """The link numbers of this chain among listed `names`, ascending."""
        out = []
        for name in names:
            m = _LINK.match(name.rsplit("/", 1)[-1])
            if m is not None and m.group("prefix") == self.prefix:
                out.append(int(m.group("n"), 16))
        return sorted(out)

    def listing(self, after: int | None = None) -> list[str]:
        """Every name in the chain's directory (links above `after` only, when given, and
        other objects sorting after them): one LIST."""
        start = None if after is None else self.name(after)
        return self.store.list(self.directory, after=start)

    def numbers(self, after: int | None = None) -> list[int]:
        """The links' numbers, ascending (only those above `after`): one LIST."""
        found = self.numbers_in(self.listing(after))
        return found if after is None else [n for n in found if n > after]

    def read(self, n: int) -> bytes | None:
        return self.store.read(self.path(n))

    def latest(self) -> Link | None:
        """The newest link, or None for an empty chain. A link pruned between the LIST and
        the GET makes it list again (bounded)."""
        for _ in range(_LATEST_ATTEMPTS):
            numbers = self.numbers()
            if not numbers:
                return None
            data = self.read(numbers[-1])
            if data is not None:
                return Link(numbers[-1], data)
        numbers = self.numbers()
        raise _vanishing(self, numbers[-1] if numbers else 0)

    def put(self, n: int, data: bytes) -> bool:
        """Create link `n` only if absent (no check after): see `claim`."""
        return self.store.put_if_absent(self.path(n), data)

    def newer(self, n: int) -> list[int]:
        """Links above `n` (one LIST from `n` on)."""
        return self.numbers(after=n)

    def claim(
        self, n: int, data: bytes, superseded: Callable[[int], bool] | None = None
    ) -> Placement:
        """Create link `n` only if absent, then check after write (one LIST from `n` on):
        WON only if created and nothing newer exists (`superseded(n)` decides "newer" for a
        chain with fences of its own, e.g. tombstones)."""
        if not self.put(n, data):
            return Placement.TAKEN
        above = superseded(n) if superseded is not None else bool(self.newer(n))
        return Placement.SUPERSEDED if above else Placement.WON

    def prune(self, keep: int) -> list[int]:
        """Delete all but the `keep` newest links (`keep` >= 1: the newest always stays, I1);
        returns the numbers deleted."""
        if not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be an int >= 1 (the newest link stays), not {keep!r}")
        numbers = self.numbers()
        doomed = numbers[:-keep]
        for n in doomed:
            self.store.delete(self.path(n))
        return doomed

    def delete_all(self) -> None:
        """Remove every link (the chain's owner object is gone: a deleted journal or
        channel). Not a fence: a chain that zombies may still write to needs one."""
        for n in self.numbers():
            self.store.delete(self.path(n))


def _vanishing(chain: FencedChain, n: int) -> Exception:
    from oncelog.journal.errors import StorageUnavailable

    return StorageUnavailable(
        f"{chain!r}: its newest link ({n}) kept vanishing between listing and reading "
        f"({_LATEST_ATTEMPTS} times): links are being pruned faster than they can be read"
    )
