"""JournalClient: journals on one fsspec store root — manage, append, read, collect garbage."""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import timedelta
from types import TracebackType
from typing import Any, cast

from fsspec import AbstractFileSystem
from fsspec.core import split_protocol, url_to_fs

from oncelog.journal.appender import Appender, AppendResult, AsyncAppend, AsyncAppendMany
from oncelog.journal.errors import (
    AppendNotSupported,
    InvalidObjectPath,
    JournalError,
    JournalExists,
    JournalNotFound,
)
from oncelog.journal.fragment import Fragment
from oncelog.journal.index import ClaimsIndex, GazetteIndex, JournalIndex
from oncelog.journal.names import validate_journal_name, validate_object_path
from oncelog.journal.reader import JournalReader
from oncelog.journal.spec import JournalSpec
from oncelog.journal.store import META_DIR, FragmentStore
from oncelog.labels import LabelSelector

__all__ = ["JournalClient", "open_journals", "DEFAULT_GC_GRACE"]

DEFAULT_GC_GRACE = timedelta(hours=1)
"""Unclaimed fragments younger than this are left alone by `gc` (a writer may be about to
claim them)."""

_RESERVED_META = ("claims", "journals")


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
        self.store = FragmentStore(fs, root)
        self._retry_timeout = retry_timeout
        self._read_ahead = read_ahead
        self._poll = poll_interval
        self._lock = threading.Lock()
        self._indexes: dict[str, JournalIndex] = {}
        self._appenders: dict[str, Appender] = {}
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
    def can_append(self) -> bool:
        """Whether this store can create objects only-if-absent (and so accept appends)."""
        return self.store.backend.can_create

    def __repr__(self) -> str:
        return f"JournalClient({self.store.backend.kind}:{self.root!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _restore_client,
            (self.fs, self.root, self._retry_timeout, self._read_ahead, self._poll),
        )

    # -- journal management ------------------------------------------------------------------

    def create(self, spec: JournalSpec) -> JournalSpec:
        """Store a new journal's spec; JournalExists if the name is taken."""
        if not isinstance(spec, JournalSpec):
            raise TypeError(f"create() takes a JournalSpec, not {type(spec).__name__}")
        self.store.backend.require_create()
        if not self.store.backend.create(self.store.spec_path(spec.name), spec.to_json()):
            raise JournalExists(f"journal {spec.name!r} already exists in {self!r}")
        with self._lock:
            self._indexes.pop(spec.name, None)
        return spec

    def get(self, name: str) -> JournalSpec:
        """The spec of journal `name`; JournalNotFound if it has none."""
        data = self.store.read_spec_bytes(validate_journal_name(name))
        if data is None:
            raise JournalNotFound(f"journal {name!r} does not exist in {self!r}")
        return _parse_spec(name, data)

    def exists(self, name: str) -> bool:
        """Whether journal `name` has a spec here."""
        return self.store.read_spec_bytes(validate_journal_name(name)) is not None

    def list(self, selector: LabelSelector | str | None = "") -> list[JournalSpec]:
        """Specs of the journals whose labels (plus the `name` and `prefix` meta-labels)
        match `selector` (Gazette syntax, e.g. `app=web, name:prefix=logs/`), by name."""
        sel = LabelSelector.from_value(selector or None)
        names = self.store.list_spec_names()
        paths = [self.store.spec_path(n) for n in names]
        out = []
        for name, data in zip(names, self.store.backend.read_many(paths)):
            if isinstance(data, FileNotFoundError):
                continue  # deleted since the listing
            if isinstance(data, BaseException):
                raise data
            spec = _parse_spec(name, data)
            if sel.matches_journal(spec.name, spec.labels):
                out.append(spec)
        return out

    def delete(self, name: str) -> None:
        """Remove the journal: its claims, fragments, then its spec (so an interrupted delete
        can be repeated). JournalNotFound if it does not exist. Stop its writers first."""
        self.get(name)
        with self._lock:
            appender = self._appenders.pop(name, None)
            index = self._indexes.pop(name, None)
        if appender is not None:
            try:
                appender.close()
            except JournalError:
                pass
        store = self.store
        store.delete_claims(name, store.list_claim_begins(name))
        store.delete_fragments(store.list_fragments(name))
        store.backend.delete(
            [
                f"{directory}/{o.name}"
                for directory in (store.journal_dir(name), store.claims_dir(name))
                for o in _temp_files(store, directory)
            ]
        )
        store.backend.delete([store.spec_path(name)])
        prune = getattr(store.backend, "prune_dirs", None)
        if prune is not None:  # local disk: leave no empty directories behind
            for directory in (
                store.journal_dir(name),
                store.claims_dir(name),
                store.backend.join(META_DIR, "journals", name),
            ):
                prune(directory)
        if index is not None:
            index.forget()

    # -- appending -----------------------------------------------------------------------------

    def start_append(self, name: str) -> AsyncAppend:
        """Begin an append to `name`: `.write()` bytes, `.release()`, then `.result()`.
        Holds the journal's write lock until released, so the bytes stay together."""
        appender = self._appenders.get(name)
        if appender is None:
            appender = self._appender(name)
        return appender.start_append()

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
        appender = self._appenders.get(name)
        if appender is None:
            appender = self._appender(name)
        return appender.start_append_many(records)

    def append_many(
        self, name: str, records: Iterable[bytes | bytearray | memoryview]
    ) -> list[AppendResult]:
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
        if appender is not None:
            return appender
        validate_journal_name(name)
        self._check_open()
        self.store.backend.require_create()
        data = self.store.read_spec_bytes(name)
        if data is None:
            if self.store.list_fragments(name, postfixes=True):
                raise AppendNotSupported(
                    f"journal {name!r} has fragments but no oncelog spec: it is read as a "
                    "Gazette fragment store, which oncelog does not append to"
                )
            raise JournalNotFound(f"journal {name!r} does not exist in {self!r}; create it first")
        spec = _parse_spec(name, data)
        index = cast(ClaimsIndex, self._index(name, gazette=False))
        with self._lock:
            appender = self._appenders.get(name)
            if appender is None:
                appender = Appender(
                    self.store, index, spec.fragment, retry_timeout=self._retry_timeout
                )
                self._appenders[name] = appender
        return appender

    # -- reading -------------------------------------------------------------------------------

    def read(self, name: str, offset: int = 0, block: bool = False) -> JournalReader:
        """A binary file-like reader of `name` from `offset` (-1: the write head);
        `block=True` waits for new appends at the head instead of reporting end of data."""
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
        )

    def head(self, name: str) -> int:
        """The journal's write head: the offset the next append will begin at."""
        return self._journal_index(name).refresh()

    def fragments(self, name: str) -> list[Fragment]:
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
        if index is not None:
            return index
        validate_journal_name(name)
        self._check_open()
        if self.store.read_spec_bytes(name) is not None:
            return self._index(name, gazette=False)
        if self.store.list_fragments(name, postfixes=True):
            return self._index(name, gazette=True)
        raise JournalNotFound(f"journal {name!r} does not exist in {self!r}")

    def _index(self, name: str, gazette: bool) -> JournalIndex:
        with self._lock:
            index = self._indexes.get(name)
            if index is None or index.gazette != gazette:
                index = (GazetteIndex if gazette else ClaimsIndex)(self.store, name)
                self._indexes[name] = index
            return index

    def _forget_threads(self) -> None:
        """In a forked child: drop what belongs to the parent's threads. The read-ahead pool's
        threads and the appenders' writer threads do not exist here (an inherited pool would
        accept work no thread runs), the locks may be held by them, and the appenders' spooled
        bytes are the parent's to write: writing them here too would append them twice."""
        self._lock = threading.Lock()
        self._executor = None
        self._appenders = {}
        self._indexes = {}

    def _read_executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(8, thread_name_prefix="oncelog-read")
            return self._executor

    # -- garbage collection ----------------------------------------------------------------------

    def gc(self, name: str, grace: timedelta | float = DEFAULT_GC_GRACE) -> list[Fragment]:
        """Delete fragment objects of `name` that no claim names (writers that lost a race or
        died before claiming) and are older than `grace`; returns those deleted.

        `grace` must exceed the longest time a writer may take between storing a fragment
        and claiming it."""
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
        doomed = [
            f
            for f in listed
            if f.content_name not in claimed and f.mod_time is not None and f.mod_time <= cutoff
        ]
        self.store.delete_fragments(doomed)
        stale = [
            f"{directory}/{o.name}"
            for directory in (self.store.journal_dir(name), self.store.claims_dir(name))
            for o in _temp_files(self.store, directory)
            if o.mtime <= cutoff
        ]
        self.store.backend.delete(stale)
        return doomed

    # -- other small objects under <root>/.oncelog/ --------------------------------------------

    def put_if_absent(self, path: str, data: bytes) -> bool:
        """Store `data` at `<root>/.oncelog/<path>` only if nothing is there yet (durably);
        True if this call created it. Used for checkpoints, which must never be overwritten."""
        self._check_meta_write(path)
        self.store.backend.require_create()
        return self.store.backend.create(self.store.meta_path(path), bytes(data))

    def read_object(self, path: str) -> bytes | None:
        """The bytes at `<root>/.oncelog/<path>`, or None if absent."""
        try:
            return self.store.backend.read(self.store.meta_path(path))
        except FileNotFoundError:
            return None

    def list_objects(self, directory: str, after: str | None = None) -> list[str]:
        """Names of the objects directly in `<root>/.oncelog/<directory>/`, sorted, only
        those after `after` when given (S3 lists from there)."""
        path = self.store.meta_path(directory.rstrip("/"))
        return self.store.backend.list_names_after(path, after)

    def delete_object(self, path: str) -> None:
        """Remove `<root>/.oncelog/<path>` (no error if absent)."""
        self._check_meta_write(path)
        self.store.backend.delete([self.store.meta_path(path)])

    @staticmethod
    def _check_meta_write(path: str) -> None:
        validate_object_path(path)
        if path.split("/", 1)[0] in _RESERVED_META:
            raise InvalidObjectPath(
                f"object path {path!r} is inside oncelog's own claims/ or journals/ directory"
            )

    # -- life cycle -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise JournalError(f"{self!r} is closed")

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


def _parse_spec(name: str, data: bytes) -> JournalSpec:
    spec = JournalSpec.from_json(data)
    if spec.name != name:
        raise JournalError(f"spec.json of journal {name!r} names another journal: {spec.name!r}")
    return spec


def _temp_files(store: FragmentStore, directory: str) -> list[Any]:
    lister = getattr(store.backend, "list_temp", None)
    return lister(directory) if lister is not None else []


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
    **storage_options: Any,
) -> JournalClient:
    """Open the journals under an fsspec URL: `file:///dir`, a plain path (local disk),
    `memory://name` or `s3://bucket/prefix`. `storage_options` go to the filesystem (for
    S3: `endpoint_url`, `key`, `secret`, `client_kwargs`, ...); S3 listings are never cached.
    """
    text = os.fspath(url)
    protocol, _ = split_protocol(text)
    if protocol in ("s3", "s3a"):
        storage_options.setdefault("use_listings_cache", False)
        storage_options.setdefault("skip_instance_cache", True)
    fs, root = url_to_fs(text, **storage_options)
    return JournalClient(
        fs, root, retry_timeout=retry_timeout, read_ahead=read_ahead, poll_interval=poll_interval
    )
