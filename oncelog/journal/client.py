"""JournalClient: journals on one fsspec store root — manage, append, read, collect garbage."""

from __future__ import annotations

import builtins
import logging
import os
import re
import threading
import time
import uuid
import weakref
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Callable, TypeVar, cast

from fsspec import AbstractFileSystem
from fsspec.core import split_protocol, url_to_fs

from oncelog._extras import needs_extra
from oncelog.coordination import MetaStore, create_if_absent, retry_storage
from oncelog.journal import _revisions, compaction
from oncelog.journal.appender import Appender, AppendResult, AsyncAppend, AsyncAppendMany
from oncelog.journal.errors import (
    AppendFailed,
    AppendNotSupported,
    CorruptSpec,
    InvalidJournalSpec,
    InvalidStoreURL,
    JournalError,
    JournalExists,
    JournalNotFound,
    StorageUnavailable,
    StoreNotFound,
)
from oncelog.journal.extensions import extensions
from oncelog.journal.fragment import Fragment
from oncelog.journal.index import ClaimsIndex, GazetteIndex, JournalIndex
from oncelog.journal.names import validate_journal_name
from oncelog.journal.reader import JournalReader
from oncelog.journal.spec import JournalSpec
from oncelog.journal.store import META_DIR, FragmentStore
from oncelog.journal.verify import VerifyReport, verify_journal
from oncelog.labels import LabelSelector

__all__ = ["JournalClient", "open_journals", "DEFAULT_GC_GRACE"]

DEFAULT_GC_GRACE = compaction.DEFAULT_GC_GRACE
"""Unclaimed fragments younger than this are left alone by `gc` (a writer may be about to
claim them)."""

log = logging.getLogger(__name__)

T = TypeVar("T")


class JournalClient:
    """Journals stored under one root of an fsspec filesystem.

    Thread-safe: all threads of a process should share one client, so appends to a journal
    share one appender (group commit) and readers share its fragment index.
    """

    def __init__(
        self,
        fs: AbstractFileSystem,
        root: str,
        *,
        retry_timeout: float = 30.0,
        read_ahead: bool = True,
        poll_interval: tuple[float, float] = (0.01, 1.0),
    ) -> None:
        self.store = FragmentStore(fs, root, retry_timeout)
        self._retry_timeout = retry_timeout
        self._read_ahead = read_ahead
        self._poll = poll_interval
        self._lock = threading.Lock()
        self._indexes: dict[str, JournalIndex] = {}
        self._appenders: dict[str, Appender] = {}
        # Per journal: held while an appender is made and while the journal is created or
        # deleted, so a delete never races the making of an appender of the same client.
        self._journal_locks: dict[str, threading.Lock] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False
        _LIVE_CLIENTS.add(self)

    # -- the store ---------------------------------------------------------------------------

    @property
    def fs(self) -> AbstractFileSystem:
        """The fsspec filesystem holding the journals."""
        return self.store.fs

    @property
    def root(self) -> str:
        """The store root, as a path of `fs`."""
        return self.store.root

    @property
    def retry_timeout(self) -> float:
        """Seconds a storage call is retried through transient failures before
        StorageUnavailable (set when the client is made)."""
        return self._retry_timeout

    @property
    def closed(self) -> bool:
        """Whether `close()` was called (the client then refuses calls)."""
        return self._closed

    @property
    def can_append(self) -> bool:
        """Whether this store can create objects only-if-absent (and so accept appends)."""
        return self.store.backend.can_create

    @property
    def location(self) -> str:
        """The store as its user named it: a local directory by its path (`/tmp/store`),
        any other store by its URL (`s3://bucket/prefix`, `memory:///name`). Every error
        message that names the store uses this, and so does the repr."""
        if self.store.backend.kind == "local":
            return self.root
        return str(self.fs.unstrip_protocol(self.root))

    def __repr__(self) -> str:
        return f"JournalClient({self.location!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _restore_client,
            (self.fs, self.root, self._retry_timeout, self._read_ahead, self._poll),
        )

    # -- journal management ------------------------------------------------------------------

    def create(self, spec: JournalSpec) -> JournalSpec:
        """Store a new journal's spec; JournalExists if the name is taken. Returns the stored
        spec, which carries a new `incarnation` token naming this creation.

        A create whose reply was lost and was retried (by botocore or by this client) finds
        the spec it made itself, recognises its own token and succeeds."""
        if not isinstance(spec, JournalSpec):
            raise TypeError(f"create() takes a JournalSpec, not {type(spec).__name__}")
        self.store.backend.require_create()
        spec = replace(spec, incarnation=uuid.uuid4().hex)
        with self._journal_lock(spec.name):
            if not self._create_object(
                self.store.spec_path(spec.name), spec.to_json(), f"create journal {spec.name!r}"
            ):
                raise JournalExists(
                    f"journal {spec.name!r} already exists in store {self.location}"
                )
            self._drop_cached(spec.name)
        return spec

    def update(self, spec: JournalSpec, *, expect: JournalSpec | None = None) -> JournalSpec:
        """Rewrite the spec of the existing journal `spec.name` (JournalNotFound if it has
        none) and return the stored spec. The journal keeps its `incarnation`: its offsets,
        fragments and claims carry on; the name cannot change.

        `expect`, like gazctl's mod revision: the spec the change was based on. If the
        stored spec differs from it (incarnations aside), JournalError is raised and
        nothing is written.

        Safe between processes and machines: the change is first claimed as the next
        revision of the spec, created only if absent, and only then written to spec.json;
        of two concurrent updates exactly one claims the revision and the other raises
        JournalError and writes nothing. A change whose spec.json write was interrupted is
        completed by the next update (see oncelog.journal._revisions).

        This client's appender and index of the journal are dropped (after flushing), so
        its next appends use the new fragment settings; other processes pick them up when
        they next open the journal (a new client, or after their appender is dropped)."""
        if not isinstance(spec, JournalSpec):
            raise TypeError(f"update() takes a JournalSpec, not {type(spec).__name__}")
        name = spec.name
        with self._journal_lock(name):
            self.store.backend.require_create()
            current = self.get(name)
            incarnation = current.incarnation
            newest = self._roll_forward(name, current)
            if newest is not None:
                current = self._parse_spec(name, newest.spec)
            if expect is not None:
                if expect.name != name:
                    raise ValueError(
                        f"expect names journal {expect.name!r}, the spec {name!r}"
                    )
                if replace(expect, incarnation=None).to_json() != replace(
                    current, incarnation=None
                ).to_json():
                    raise JournalError(
                        f"journal {name!r} was changed since it was read; re-read and retry"
                    )
            spec = replace(spec, incarnation=incarnation)
            data = spec.to_json()
            number = (newest.number if newest is not None else 0) + 1
            if not _revisions.chain(self, name, incarnation).put(
                number, _revisions.new_revision(number, data)
            ):
                raise JournalError(
                    f"journal {name!r} was changed by another writer at the same time "
                    f"(revision {number} of its spec, the one this change was to make, "
                    "exists): nothing was written; re-read and retry"
                )
            self._write_spec(name, data)
            self._roll_forward(name, spec)  # overtaken meanwhile: leave the newest
            self._drop_cached(name)
        return spec

    def _write_spec(self, name: str, data: bytes) -> None:
        path = self.store.spec_path(name)
        self._with_retry(
            lambda: self.store.backend.write(path, data),
            f"update the spec of journal {name!r}",
            ambiguous=True,
        )

    def _roll_forward(self, name: str, current: JournalSpec) -> _revisions.Revision | None:
        """The newest revision of the journal's spec (None if it never changed), written to
        spec.json first if spec.json (`current`) is not that revision's spec."""
        newest = _revisions.latest(self, name, current.incarnation)
        if newest is not None and newest.spec != current.to_json():
            self._write_spec(name, newest.spec)
        return newest

    def get(self, name: str) -> JournalSpec:
        """The spec of journal `name`; JournalNotFound if it has none, CorruptSpec (naming
        the journal and object) if it cannot be parsed."""
        data = self._read_spec(name)
        if data is None:
            raise self._not_found(f"journal {name!r} does not exist in store {self.location}")
        return self._parse_spec(name, data)

    def exists(self, name: str) -> bool:
        """Whether journal `name` has a spec here."""
        return self._read_spec(name) is not None

    def list(
        self,
        selector: LabelSelector | str | None = "",
        *,
        on_error: Callable[[str, JournalError], None] | None = None,
    ) -> builtins.list[JournalSpec]:
        """Specs of the journals whose labels (plus the `name` and `prefix` meta-labels)
        match `selector` (Gazette syntax, e.g. `app=web, name:prefix=logs/`), by name.

        A journal whose spec cannot be read or parsed does not hide the others: it is left
        out and reported to `on_error(name, error)` (by default, logged as a warning)."""
        sel = LabelSelector.from_value(selector or None)
        names = self.store.list_spec_names()  # reads are retried by the store
        if not names:
            self.check_store()
        paths = [self.store.spec_path(n) for n in names]
        results = self.store.backend.read_many(paths)
        out = []
        for name, data in zip(names, results):
            try:
                if isinstance(data, FileNotFoundError):
                    continue  # deleted since the listing
                if isinstance(data, BaseException):
                    raise data  # not transient: the store retried those alone already
                spec = self._parse_spec(name, data)
            except JournalError as exc:
                if on_error is None:
                    log.warning("%r: journal %r left out of the listing: %s", self, name, exc)
                else:
                    on_error(name, exc)
                continue
            if sel.matches_journal(spec.name, spec.labels):
                out.append(spec)
        return out

    def check_store(self) -> None:
        """Raise StoreNotFound if the store root is missing: a local directory that does not
        exist (or is a regular file), an S3 bucket that does not exist. Reading calls check
        this when they find nothing; `create` makes a missing local directory."""
        reason = self._with_retry(self.store.backend.missing_store, "look up the store root")
        if reason is not None:
            raise StoreNotFound(f"{reason}: {self._missing_hint()}")

    def _missing_hint(self) -> str:
        return self.store.backend.missing_hint()

    def _not_found(self, message: str) -> JournalNotFound:
        """JournalNotFound with `message`, or StoreNotFound if the whole store is missing."""
        reason = self._with_retry(self.store.backend.missing_store, "look up the store root")
        if reason is not None:
            return StoreNotFound(f"{message}: {reason}; {self._missing_hint()}")
        return JournalNotFound(message)

    def _read_spec(self, name: str) -> bytes | None:
        """The bytes of the journal's spec.json, or None if it has none; transient storage
        errors are retried for retry_timeout by the store (then StorageUnavailable)."""
        validate_journal_name(name)
        try:
            return self.store.read_spec_bytes(name)
        except StorageUnavailable as exc:  # say whose spec it was
            raise StorageUnavailable(f"could not read the spec of journal {name!r}: {exc}") from exc

    def _parse_spec(self, name: str, data: bytes) -> JournalSpec:
        where = self.store.spec_path(name)
        try:
            spec = JournalSpec.from_json(data)
        except (InvalidJournalSpec, ValueError, TypeError) as exc:
            raise CorruptSpec(
                f"the spec of journal {name!r} ({where}) is corrupt: {exc}; fix or restore "
                "that object (its fragments and claims are untouched)"
            ) from None
        if spec.name != name:
            raise CorruptSpec(
                f"the spec of journal {name!r} ({where}) names another journal: {spec.name!r}"
            )
        return spec

    def _with_retry(self, op: Callable[[], T], what: str, ambiguous: bool = False) -> T:
        """Run a storage call, retrying transient failures for retry_timeout; then raise
        StorageUnavailable saying whether the outcome is known (`ambiguous`: a write that may
        have taken effect). See oncelog.coordination.retry_storage."""
        return retry_storage(
            op, what, timeout=self._retry_timeout, where=f"the store {self.location}",
            ambiguous=ambiguous,
        )

    def _create_object(self, path: str, data: bytes, what: str) -> bool:
        """Create `path` (a full store path) holding `data` only if absent; True if this call
        made it; an object found holding exactly `data` is this call's own (its bytes are
        unique to the attempt). See oncelog.coordination.create_if_absent."""
        return create_if_absent(
            self.store.backend, path, data, what, timeout=self._retry_timeout,
            where=f"the store {self.location}",
        )

    def delete(self, name: str) -> None:
        """Remove the journal: its claims, fragments, then its spec (so an interrupted delete
        can be repeated). JournalNotFound if it does not exist. Stop its writers first: this
        client's own appends are excluded (they finish before, or fail after, the delete),
        other processes' are not (their late claims carry the deleted journal's incarnation
        and are reported as JournalRecreated by readers of a new journal of that name)."""
        with self._journal_lock(name):
            self._delete_locked(name)

    def _delete_locked(self, name: str) -> None:
        self.get(name)
        index = self._drop_cached(name)
        store = self.store
        store.delete_claims(name, store.list_claim_begins(name))
        compaction.delete_records(store, name)
        _revisions.delete_revisions(self, name)
        store.delete_fragments(store.list_fragments(name))
        store.backend.delete(
            [
                f"{directory}/{o.name}"
                for directory in (store.journal_dir(name), store.claims_dir(name))
                for o in _temp_files(store, directory)
            ]
        )
        store.backend.delete([store.spec_path(name)])
        # Leave no empty directories behind (local disk; a no-op on object stores).
        for directory in (
            store.journal_dir(name),
            store.claims_dir(name),
            store.backend.join(META_DIR, "journals", name),
            compaction.records_dir(store, name),
            _revisions.revisions_dir(store, name),
        ):
            store.backend.prune_dirs(directory)
        if index is not None:
            index.forget()

    # -- appending -----------------------------------------------------------------------------

    def start_append(self, name: str) -> AsyncAppend:
        """Begin an append to `name`: `.write()` bytes, `.release()`, then `.result()`.
        Holds the journal's write lock until released, so the bytes stay together."""
        return self._appender(name).start_append()

    def append_made(
        self, name: str, make: Callable[..., tuple[Any, Any]], *args: Any
    ) -> tuple[AsyncAppend, Any]:
        """One append to `name` whose record `make(*args) -> (data, token)` makes while
        holding the journal's write lock (so what it stamps follows the journal's append
        order): `start_append` + `write` + `release` in one call. Returns `(the released
        AsyncAppend, token)`; if `make` raises, nothing is appended and the error
        propagates (see `Appender.append_made`)."""
        return self._appender(name).append_made(make, *args)

    def append(self, name: str, data: bytes | bytearray | memoryview) -> AppendResult:
        """Append `data` as one append and return where it landed, once durable."""
        aa = self._appender(name).start_append()
        try:
            aa.write(data)
        except BaseException:
            aa.abort()
            raise
        aa.release()
        return aa.result()

    def start_append_many(
        self, name: str, records: Iterable[bytes | bytearray | memoryview]
    ) -> AsyncAppendMany:
        """Append each record as one append, in order, without waiting: `.result()` gives one
        AppendResult per record once all are durable. Every record stays whole and the
        records of a fragment are contiguous; records of other threads land only between
        fragments. TypeError (naming the record) if one is not bytes-like: then none is
        appended. For bulk loads and batch publishing: far cheaper per record than
        `start_append`."""
        return self._appender(name).start_append_many(records)

    def append_many(
        self, name: str, records: Iterable[bytes | bytearray | memoryview]
    ) -> builtins.list[AppendResult]:
        """Append each record as one append, in order, and return where each landed, once
        all are durable (see `start_append_many`)."""
        return self.start_append_many(name, records).result()

    def flush(self) -> None:
        """Wait until every append released so far is durable (raises a failed append's error)."""
        with self._lock:
            appenders = list(self._appenders.values())
        errors = []
        for appender in appenders:
            try:
                appender.flush()
            except JournalError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def _appender(self, name: str) -> Appender:
        appender = self._appenders.get(name)
        if appender is not None and not appender.index.stale:
            return appender
        validate_journal_name(name)
        self._check_open()
        self.store.backend.require_create()
        with self._journal_lock(name):  # a delete of this client waits, or went first
            appender = self._appenders.get(name)
            if appender is not None:
                if not appender.index.stale:
                    return appender
                self._drop_cached(name)  # the journal was deleted and created again
            try:
                data = self._read_spec(name)
            except StorageUnavailable as exc:
                raise AppendFailed(f"{exc}; the append was not made", made=False) from exc
            if data is None:
                if self.store.list_fragments(name, postfixes=True):
                    raise AppendNotSupported(
                        f"journal {name!r} has fragments but no oncelog spec: it is read as a "
                        "Gazette fragment store, which oncelog does not append to"
                    )
                raise self._not_found(
                    f"journal {name!r} does not exist in store {self.location}; create it first"
                )
            spec = self._parse_spec(name, data)
            index = cast(
                ClaimsIndex, self._index(name, gazette=False, incarnation=spec.incarnation)
            )
            appender = Appender(self.store, index, spec.fragment, retry_timeout=self._retry_timeout)
            if spec.fragment.compact_after:
                self._watch_compaction(name, spec)
            with self._lock:
                self._appenders[name] = appender
        return appender

    def _journal_lock(self, name: str) -> threading.Lock:
        with self._lock:
            lock = self._journal_locks.get(name)
            if lock is None:
                lock = self._journal_locks[name] = threading.Lock()
            return lock

    def _drop_cached(self, name: str) -> JournalIndex | None:
        """Forget this client's appender and index of `name` (the journal is being created
        or deleted): the appender is flushed and closed, so appends released before are
        durable in the journal they were made for and later ones fail."""
        with self._lock:
            appender = self._appenders.pop(name, None)
            index = self._indexes.pop(name, None)
        if appender is not None:
            try:
                appender.close()
            except JournalError:
                pass
        return index

    # -- reading -------------------------------------------------------------------------------

    def read(
        self, name: str, offset: int = 0, block: bool = False, *, exact: bool = False
    ) -> JournalReader:
        """A binary file-like reader of `name` from `offset` (-1: the write head; 0: the
        first available offset, which the reader's `offset` then reports, unless `exact`);
        `block=True` waits for new appends at the head instead of reporting end of data.
        Offsets below the first available one raise OffsetNotAvailable."""
        index = self._journal_index(name)
        executor = self._read_executor() if self._read_ahead else None
        return JournalReader(
            self.store,
            index,
            offset,
            block,
            executor=executor,
            poll_min=self._poll[0],
            poll_max=self._poll[1],
            exact=exact,
        )

    def first_offset(self, name: str) -> int:
        """The journal's first available offset: 0 until a trim or retention removed its
        oldest data, then the offset reading 0 starts at. Offsets never change: a message
        keeps the offsets it was written at whatever maintenance runs."""
        return self._journal_index(name).fresh_first()

    def head(self, name: str) -> int:
        """The journal's write head: the offset the next append will begin at."""
        return self._journal_index(name).refresh()

    def fragments(self, name: str) -> builtins.list[Fragment]:
        """The fragments making up the journal, in offset order, with stored sizes and
        modification times where the store lists them."""
        index = self._journal_index(name)
        index.refresh()
        frags = index.fragments()
        if index.gazette:
            return frags
        listed = {f.content_name: f for f in self.store.list_fragments(name)}
        return [
            replace(f, size=listed[f.content_name].size, mod_time=listed[f.content_name].mod_time)
            if f.content_name in listed
            else f
            for f in frags
        ]

    def _journal_index(self, name: str) -> JournalIndex:
        index = self._indexes.get(name)
        if index is not None and not index.stale:
            return index
        validate_journal_name(name)
        self._check_open()
        data = self._read_spec(name)
        if data is not None:
            spec = self._parse_spec(name, data)
            return self._index(name, gazette=False, incarnation=spec.incarnation)
        if self._is_gazette_store(name):
            return self._index(name, gazette=True)
        raise self._not_found(f"journal {name!r} does not exist in store {self.location}")

    def _is_gazette_store(self, name: str) -> bool:
        """Whether `name`, which has no spec, is a Gazette broker's fragment store: fragments
        directly under it, or in path-postfix directories (`name/date=.../`) that are not
        themselves oncelog journals (`odd/x=1` is a valid journal name; `odd` is then not a
        journal but the parent of one)."""
        fragments = self.store.list_fragments(name, postfixes=True)
        if any(not f.path_postfix for f in fragments):
            return True
        tops = {f.path_postfix.split("/", 1)[0] for f in fragments}
        return any(self._read_spec(f"{name}/{top}") is None for top in tops)

    def _index(self, name: str, gazette: bool, incarnation: str | None = None) -> JournalIndex:
        with self._lock:
            index = self._indexes.get(name)
            if (
                index is None
                or index.stale
                or index.gazette != gazette
                or (incarnation or "") != index.incarnation
            ):
                index = (
                    GazetteIndex(self.store, name)
                    if gazette
                    else ClaimsIndex(self.store, name, incarnation or "")
                )
                self._indexes[name] = index
            return index

    def loaded_index(self, name: str) -> JournalIndex | None:
        """This client's fragment index of journal `name` if one is loaded (the one its
        appender and readers share), else None. Never touches the store: compaction uses
        it to count uncompacted claims and to let the index take a new record."""
        with self._lock:
            return self._indexes.get(name)

    def _forget_threads(self) -> None:
        """In a forked child: drop what belongs to the parent's threads. The read-ahead pool's
        threads and the appenders' writer threads do not exist here (an inherited pool would
        accept work no thread runs), the locks may be held by them, and the appenders' spooled
        bytes are the parent's to write: writing them here too would append them twice."""
        self._lock = threading.Lock()
        self._journal_locks = {}
        self._executor = None
        self._appenders = {}
        self._indexes = {}

    def _read_executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(8, thread_name_prefix="oncelog-read")
            return self._executor

    # -- garbage collection ----------------------------------------------------------------------

    def gc(
        self, name: str, grace: timedelta | float = DEFAULT_GC_GRACE, *, dry_run: bool = False
    ) -> builtins.list[Fragment]:
        """Delete fragment objects of `name` that no claim names (writers that lost a race or
        died before claiming) and are older than `grace`; returns those deleted.

        `grace` must exceed the longest time a writer may take between storing a fragment
        and claiming it. With `dry_run`, nothing is deleted (neither fragments nor stale
        temporary files): the fragments a real run would delete now are returned."""
        seconds = grace.total_seconds() if isinstance(grace, timedelta) else float(grace)
        if seconds < 0:
            raise ValueError(f"gc grace must be >= 0, not {grace!r}")
        index = self._journal_index(name)
        if index.gazette:
            raise AppendNotSupported(
                f"journal {name!r} is a Gazette fragment store without claims; gc would "
                "delete its fragments"
            )
        cutoff = time.time() - seconds
        listed = self.store.list_fragments(name)  # list before reading claims: see docs
        index.refresh()
        claimed = {f.content_name for f in index.fragments()}
        # Below the newest compaction record's `through`, fragments (small ones it covers,
        # big ones of older records) are for `retire`, whose grace counts from the record.
        covered = compaction.gc_skips(self, name)
        doomed = [
            f
            for f in listed
            if f.content_name not in claimed
            and f.mod_time is not None
            and f.mod_time <= cutoff
            and f.end > covered
        ]
        for extension in extensions():  # derived objects (segments) nothing refers to
            extension.collect(self, name, seconds, dry_run)
        if dry_run:
            return doomed + compaction.retire(self, name, seconds, dry_run=True).fragments
        self.store.delete_fragments(doomed)
        doomed += compaction.retire(self, name, seconds).fragments
        stale = [
            f"{directory}/{o.name}"
            for directory in (self.store.journal_dir(name), self.store.claims_dir(name))
            for o in _temp_files(self.store, directory)
            if o.mtime <= cutoff
        ]
        self.store.backend.delete(stale)
        return doomed

    # -- integrity ---------------------------------------------------------------------------

    def verify(
        self, name: str, *, progress: Callable[[int, int], None] | None = None
    ) -> VerifyReport:
        """Check journal `name` in full and report every problem found (see
        oncelog.journal.verify): each fragment readers read (the newest compaction record's
        fragments from the first available offset, then the claimed ones from the record's
        end on) is read whole and checked against both the SHA1 in its name and the
        CRC-32Cs recorded for it (by the record, or by its claim); missing fragments,
        unreadable records and claims, and gaps are reported too, each naming the journal,
        the fragment and the offsets. Claims below the record's end (left for retirement)
        are counted, not checked: readers never use them. A compaction, retirement or trim
        running meanwhile makes it start over (bounded), never report a false "missing".
        `progress(done, total)` gets content bytes checked.

        Reads skip the SHA1 when CRC-32Cs are recorded; this is the check that the bytes
        stored are the bytes named. It reads the whole journal: about 1-2 GB/s per core for
        the SHA1, plus the store's read rate. JournalNotFound for an unknown journal."""
        index = self._journal_index(name)  # reads are retried by the store (RetryingReads)
        report = verify_journal(
            self.store,
            name,
            gazette=index.gazette,
            incarnation=index.incarnation,
            progress=progress,
        )
        for extension in extensions():  # what readers read besides fragments (segments)
            report.problems.extend(extension.verify(self, name))
        return report

    # -- compaction and retention ------------------------------------------------------------

    def compact(
        self,
        name: str,
        *,
        target_length: int | None = None,
        min_age: timedelta | float = 0,
        dry_run: bool = False,
        progress: Callable[[int, int], None] | None = None,
        retire_grace: timedelta | float = DEFAULT_GC_GRACE,
    ) -> compaction.CompactionResult:
        """Copy runs of small claimed fragments of `name` into fragments of about
        `target_length` bytes (default: the spec's FragmentSpec.length; a small fragment is
        never split) and write a compaction record naming them, so that readers open and
        read the journal with O(big fragments) requests instead of two per small one.

        Every small fragment copied is read whole and SHA1-verified: a corrupt one stops the
        run (FragmentChecksumError naming journal, fragment and offsets) before the record
        is written. Fragments stored less than `min_age` ago, and any after them, are left
        for a later run. Appends are never blocked: only claimed history below the head is
        read. Offsets never change; the record is written last (put-if-absent), so a run
        killed at any point leaves the journal as it was plus unreferenced big fragments
        (removed by `gc`), and a rerun finishes. Ranges compacted more than `retire_grace`
        ago are retired afterwards (`retire`: their small claims and fragments deleted,
        but the last claim below them). `progress(done, total)` gets bytes copied.
        `dry_run`: plan only, nothing read or written (the result says what would be)."""
        return compaction.compact(
            self,
            name,
            target_length=target_length,
            min_age=_seconds(min_age),
            dry_run=dry_run,
            progress=progress,
            retire_grace=_seconds(retire_grace),
        )

    def trim(
        self,
        name: str,
        before: int | datetime | None = None,
        *,
        dry_run: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> compaction.TrimResult:
        """Delete the oldest data of `name`: whole fragments (and their claims) ending at or
        before offset `before`, or stored at or before the datetime `before`, oldest first
        (without `before`: older than the spec's FragmentSpec.retention; ValueError if it
        has none). A record whose `start` is the new first offset is written first, so
        readers asking for earlier offsets get OffsetNotAvailable naming the journal, the
        offset and the first available one (offset 0 still means "the first available").
        The head and appends are never affected: the last claim is never removed.
        `dry_run`: report only."""
        return compaction.trim(self, name, before, dry_run=dry_run, progress=progress)

    def compact_automatically(self, name: str, compact_after: int | None = None) -> None:
        """Have this client's auto-compaction thread compact `name` behind its head, as it
        does for journals whose spec sets `FragmentSpec.compact_after` once they are
        appended to; `compact_after` overrides (or supplies) the spec's value. For a process
        that owns journals it may not append to for a while (the streaming node)."""
        spec = self.get(name)
        if compact_after is not None:
            spec = replace(spec, fragment=replace(spec.fragment, compact_after=compact_after))
        if not spec.fragment.compact_after:
            raise ValueError(
                f"journal {name!r}: its spec sets no compact_after; pass compact_after="
            )
        self._watch_compaction(name, spec)

    def _watch_compaction(self, name: str, spec: JournalSpec) -> None:
        """Start (or keep) the client's auto-compaction thread for `name` (its spec sets
        `compact_after`): see compaction.AutoCompactor."""
        with self._lock:
            auto = getattr(self, "_auto_compactor", None)
            if auto is None:
                auto = self._auto_compactor = compaction.AutoCompactor(self)
        auto.watch(name, spec.fragment)

    # -- other small objects under <root>/.oncelog/ --------------------------------------------

    @property
    def meta(self) -> MetaStore:
        """The store's small objects under `<root>/.oncelog/` (checkpoints, transaction
        records, channel terms, ...): put-if-absent, read, list, delete (see
        oncelog.coordination)."""
        return MetaStore.of(self)

    # -- life cycle -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise JournalError(f"the client of store {self.location} is closed")

    def close(self) -> None:
        """Flush and stop every appender, then release threads. Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            appenders = list(self._appenders.values())
            self._appenders.clear()
            executor, self._executor = self._executor, None
        errors = []
        for appender in appenders:
            try:
                appender.close()
            except JournalError as exc:
                errors.append(exc)
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        if errors:
            raise errors[0]

    def __enter__(self) -> JournalClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


_LIVE_CLIENTS: weakref.WeakSet[JournalClient] = weakref.WeakSet()


def _forget_threads_after_fork() -> None:
    for client in list(_LIVE_CLIENTS):
        client._forget_threads()


os.register_at_fork(after_in_child=_forget_threads_after_fork)


def _seconds(value: timedelta | float) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 0:
        raise ValueError(f"a duration must be >= 0, not {value!r}")
    return seconds


def _temp_files(store: FragmentStore, directory: str) -> list[Any]:
    return store.backend.list_temp(directory)


def _restore_client(
    fs: AbstractFileSystem,
    root: str,
    retry_timeout: float,
    read_ahead: bool,
    poll: tuple[float, float],
) -> JournalClient:
    return JournalClient(
        fs, root, retry_timeout=retry_timeout, read_ahead=read_ahead, poll_interval=poll
    )


def open_journals(
    url: str | os.PathLike[str],
    *,
    retry_timeout: float = 30.0,
    read_ahead: bool = True,
    poll_interval: tuple[float, float] = (0.01, 1.0),
    create: bool = False,
    **storage_options: Any,
) -> JournalClient:
    """Open the journals under an fsspec URL: `file:///dir`, a plain path (local disk),
    `memory://name` or `s3://bucket/prefix`. `storage_options` go to the filesystem (for
    S3: `endpoint_url`, `key`, `secret`, `client_kwargs`, ...); S3 listings are never cached.

    A URL that looks like a misspelled scheme (`s3:/bucket`, `s3:bucket`, `file:/dir`, a
    `scheme://` fsspec does not know) raises InvalidStoreURL; write a relative path with a
    colon as `./a:b`. A local path that is a regular file raises StoreNotFound. A local
    directory that does not exist is made by `create=True`; otherwise it is made by the
    first `JournalClient.create`, and reading calls that find nothing there (`list`,
    `get`, `head`, `read`, ...) raise StoreNotFound naming it. A missing S3 bucket raises
    StoreNotFound naming the bucket (oncelog never creates buckets).
    """
    text = os.fspath(url)
    check_store_url(text)
    protocol, _ = split_protocol(text)
    if protocol in ("s3", "s3a"):
        storage_options.setdefault("use_listings_cache", False)
        storage_options.setdefault("skip_instance_cache", True)
    with needs_extra("s3", f"the store {text}"):  # fsspec imports s3fs for s3:// here
        fs, root = url_to_fs(text, **storage_options)
    client = JournalClient(
        fs, root, retry_timeout=retry_timeout, read_ahead=read_ahead, poll_interval=poll_interval
    )
    try:
        client.store.backend.prepare_root(create)
    except BaseException:
        client.close()
        raise
    return client


_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):(.*)", re.DOTALL)


def check_store_url(url: str) -> None:
    """Raise InvalidStoreURL if `url` looks like a URL with a misspelled or unknown scheme
    (see `open_journals`); plain paths pass."""
    from fsspec.registry import known_implementations, registry

    match = _SCHEME.fullmatch(url)
    if match is None or (os.name == "nt" and len(match.group(1)) == 1):
        return  # a path (or a Windows drive letter)
    scheme, rest = match.group(1), match.group(2)
    known = scheme.lower() in known_implementations or scheme.lower() in registry
    if rest.startswith(":") and known:
        return  # a chained URL: simplecache::s3://...
    if not rest.startswith("//"):
        if scheme.lower() == "file":
            guess = "file:///" + rest.lstrip("/")
        else:
            guess = f"{scheme}://{rest.lstrip('/')}"
        raise InvalidStoreURL(
            f"invalid store URL {url!r}: '{scheme}:' must be followed by '//' "
            f"(did you mean {guess}?); a local path containing ':' can be written ./{url}"
        )
    if not known:
        raise InvalidStoreURL(
            f"invalid store URL {url!r}: fsspec knows no scheme {scheme!r} "
            "(oncelog stores: a path, file:///dir, memory://name, s3://bucket/prefix)"
        )
    if scheme.lower() in ("s3", "s3a") and not rest[2:].split("/", 1)[0]:
        raise InvalidStoreURL(
            f"invalid store URL {url!r}: no bucket (expected {scheme}://bucket/prefix)"
        )
