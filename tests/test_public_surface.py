"""The public surface: one error tree under `oncelog.OncelogError`, each error defined once
(in its package's `errors` module, re-exported where it used to live), and an `oncelog`
namespace a user can learn in one import, without import cycles or a slower `import oncelog`.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import oncelog
from oncelog import OncelogError

ROOT = Path(__file__).resolve().parent.parent


def _public_modules() -> list[str]:
    """Every module of oncelog a user may import: no component starts with `_`, and no
    `__main__` (importing it runs the program)."""
    names = ["oncelog"]
    for info in pkgutil.walk_packages(oncelog.__path__, "oncelog."):
        if any(part.startswith("_") for part in info.name.split(".")[1:]):
            continue
        names.append(info.name)
    return sorted(names)


def _public_names(module: object) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in vars(module) if not n.startswith("_")]
    return list(names)


def _public_errors() -> dict[type[BaseException], list[str]]:
    """Every exception class oncelog defines that some public module exports, with where."""
    found: dict[type[BaseException], list[str]] = {}
    for modname in _public_modules():
        module = importlib.import_module(modname)
        for name in _public_names(module):
            obj = getattr(module, name)
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__.startswith("oncelog")
            ):
                found.setdefault(obj, []).append(f"{modname}.{name}")
    return found


PUBLIC_ERRORS = _public_errors()


def test_the_walk_finds_the_errors() -> None:
    """Guards the walk itself: a walk that found nothing would pass everything below."""
    names = {cls.__name__ for cls in PUBLIC_ERRORS}
    for expected in ("JournalNotFound", "TransactionError", "ConsumerError", "OptionError",
                     "StreamingError", "ExactlyOnceViolation", "InvalidGroupName",
                     "InvalidTransactionalId", "BadMessage", "Diverged"):
        assert expected in names, expected
    assert len(PUBLIC_ERRORS) >= 50


def test_every_public_error_derives_from_oncelog_error() -> None:
    strays = sorted(
        f"{cls.__module__}.{cls.__qualname__} (exported as {where[0]})"
        for cls, where in PUBLIC_ERRORS.items()
        if not issubclass(cls, OncelogError)
    )
    assert not strays, f"errors not derived from oncelog.OncelogError: {strays}"


def test_every_public_error_is_defined_in_an_errors_module() -> None:
    """One module per package holds its errors; every other module re-exports them."""
    elsewhere = sorted(
        f"{cls.__module__}.{cls.__qualname__}"
        for cls in PUBLIC_ERRORS
        if cls.__module__.rsplit(".", 1)[-1] != "errors"
    )
    assert not elsewhere, f"errors defined outside an errors module: {elsewhere}"


def test_each_error_name_is_defined_once() -> None:
    """No two error classes share a name, except the consumers' FencedOut, which is the
    root FencedOut specialised (a ConsumerError too): catching `oncelog.FencedOut` catches
    both."""
    by_name: dict[str, list[type[BaseException]]] = {}
    for cls in PUBLIC_ERRORS:
        by_name.setdefault(cls.__name__, []).append(cls)
    twice = {n: sorted(c.__module__ for c in cs) for n, cs in by_name.items() if len(cs) > 1}
    assert set(twice) <= {"FencedOut"}, twice
    from oncelog.consumer import FencedOut as ConsumerFencedOut

    assert issubclass(ConsumerFencedOut, oncelog.FencedOut)


def test_bad_message_is_one_class() -> None:
    from oncelog.cli.frames import BadMessage as CLIBadMessage
    from oncelog.spark.batches import BadMessage as SparkBadMessage

    assert CLIBadMessage is SparkBadMessage is oncelog.BadMessage
    located = oncelog.BadMessage("not a UUID", journal="a/b", begin=3, end=9)
    assert str(located) == "journal a/b: bad message at offset 3-9: not a UUID"
    assert (located.journal, located.begin, located.end) == ("a/b", 3, 9)
    assert isinstance(located, ValueError)
    plain = oncelog.BadMessage("journal 'a/b': document at offsets [0, 4) does not fit")
    assert str(plain).startswith("journal 'a/b'") and plain.journal is None


def test_transaction_record_error_is_a_transaction_error() -> None:
    from oncelog.transactions import TransactionRecordError

    assert issubclass(TransactionRecordError, oncelog.TransactionError)
    assert issubclass(TransactionRecordError, ValueError)  # as before


@pytest.mark.parametrize(
    ("old", "name"),
    [
        ("oncelog.publisher", "TransactionError"),
        ("oncelog.publisher", "TransactionExpired"),
        ("oncelog.transactions", "TransactionRecordError"),
        ("oncelog.sequencer", "SequencerError"),
        ("oncelog.sequencer", "ReplayError"),
        ("oncelog.sequencer", "ReplayRequired"),
        ("oncelog.mapping", "EmptyPartitions"),
        ("oncelog.mapping", "MissingContentType"),
        ("oncelog.labels", "SelectorError"),
        ("oncelog.framing", "FrameDecodeError"),
        ("oncelog.framing.base", "TruncatedFrame"),
        ("oncelog.journal", "StorageUnavailable"),
        ("oncelog.journal.compaction", "CorruptRecord"),
        ("oncelog.journal.store", "CorruptClaim"),
        ("oncelog.consumer.checkpoint", "ConsumerError"),
        ("oncelog.consumer.checkpoint", "CheckpointError"),
        ("oncelog.consumer.checkpoint", "FencedOut"),
        ("oncelog.consumer._trimmed", "CheckpointTrimmed"),
        ("oncelog.consumer.groups", "GroupNotFound"),
        ("oncelog.consumer.groups", "NotAMessageBoundary"),
        ("oncelog.consumer.state", "StateObjectMissing"),
        ("oncelog.consumer", "InvalidGroupName"),
        ("oncelog.spark.options", "OptionError"),
        ("oncelog.spark.schema", "SchemaError"),
        ("oncelog.spark.plan", "Diverged"),
        ("oncelog.testing", "ExactlyOnceViolation"),
        ("oncelog.testing", "ConsumerCrash"),
        ("oncelog.testing.faults", "ChildTimeout"),
    ],
)
def test_old_import_paths_still_work(old: str, name: str) -> None:
    cls = getattr(importlib.import_module(old), name)
    home = importlib.import_module(cls.__module__)
    assert cls.__module__.endswith(".errors") or cls.__module__ == "oncelog.errors"
    assert getattr(home, name) is cls
    assert issubclass(cls, OncelogError)


# -- the new validation errors --------------------------------------------------------------


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "sp ace", "x" * 129, 5])
def test_bad_group_names_raise_invalid_group_name(name: object) -> None:
    from oncelog.consumer import ConsumerError, InvalidGroupName, validate_group_name

    with pytest.raises(InvalidGroupName, match="consumer group name") as info:
        validate_group_name(name)
    assert isinstance(info.value, ValueError) and isinstance(info.value, ConsumerError)
    assert repr(name)[:40] in str(info.value)  # names the bad value
    assert oncelog.InvalidGroupName is InvalidGroupName


def test_consumer_refuses_a_bad_group_name(tmp_path: Path) -> None:
    client = oncelog.open_journals(str(tmp_path))
    with pytest.raises(oncelog.InvalidGroupName, match=r"'a/b'.*letters"):
        oncelog.Consumer(client, "a/b", "app=x", lambda txn, env: None)


@pytest.mark.parametrize("tid", ["", ".x", "a/b", "x" * 129, 7])
def test_bad_transactional_ids_raise_invalid_transactional_id(tmp_path: Path, tid: object) -> None:
    client = oncelog.open_journals(str(tmp_path))
    with pytest.raises(oncelog.InvalidTransactionalId, match="transactional id") as info:
        oncelog.Publisher(client, transactional_id=tid)  # type: ignore[arg-type]
    err = info.value
    assert isinstance(err, ValueError) and isinstance(err, oncelog.TransactionError)
    assert repr(tid)[:40] in str(err) and "letters, digits" in str(err)


def test_bad_write_id_is_an_invalid_transactional_id_too() -> None:
    from oncelog.transactions import validate_transaction_id

    with pytest.raises(oncelog.InvalidTransactionalId, match=r"write id 'a b'"):
        validate_transaction_id("a b", "write id")


# -- `import oncelog` -----------------------------------------------------------------------

CONTRACT = [
    "open_journals", "JournalSpec", "FragmentSpec", "Envelope", "Flags", "Clock", "build_uuid",
    "get_clock", "get_flags", "get_producer_id", "new_producer_id", "JSONMessage", "CSVRecord",
    "Publisher", "Sequencer", "QueueOutcome", "ProducerState", "read_uncommitted",
    "read_committed", "OncelogError", "JournalClient",
]
ADDED = [
    "Consumer", "Transaction", "group_status", "FencedOut", "StorageUnavailable",
    "JournalNotFound", "JournalExists", "OffsetNotAvailable", "AppendFailed",
    "TransactionError", "TransactionExpired", "CheckpointError", "ConsumerError",
    "CheckpointTrimmed", "InvalidGroupName", "InvalidTransactionalId", "InvalidJournalName",
    "FrameDecodeError", "BadMessage", "modulo", "rendezvous", "ModuloMapping",
    "RendezvousMapping", "RandomMapping", "PolledList", "clock_from_unix_ns",
]


def test_import_oncelog_exposes_the_names() -> None:
    missing = [n for n in CONTRACT + ADDED if n not in oncelog.__all__]
    assert not missing, missing
    for name in oncelog.__all__:
        assert getattr(oncelog, name) is not None, name
        assert name in dir(oncelog), name
    assert len(set(oncelog.__all__)) == len(oncelog.__all__)
    namespace: dict[str, object] = {}
    exec("from oncelog import *", namespace)
    assert set(oncelog.__all__) <= set(namespace)
    with pytest.raises(AttributeError, match="no_such_name"):
        oncelog.no_such_name  # noqa: B018


def test_exported_names_are_the_canonical_objects() -> None:
    from oncelog.consumer import Consumer, Transaction
    from oncelog.errors import FencedOut
    from oncelog.journal import StorageUnavailable
    from oncelog.mapping import PolledList, modulo

    assert oncelog.Consumer is Consumer and oncelog.Transaction is Transaction
    assert oncelog.FencedOut is FencedOut and oncelog.StorageUnavailable is StorageUnavailable
    assert oncelog.PolledList is PolledList and oncelog.modulo is modulo
    for name in oncelog.__all__:
        obj = getattr(oncelog, name)
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            assert issubclass(obj, OncelogError), name


# Modules imported first, each in a fresh interpreter: an import cycle shows up as an
# ImportError ("partially initialized module") only for some orders.
FIRST_IMPORTS = [
    "oncelog",
    "oncelog.errors",
    "oncelog.journal.errors",
    "oncelog.consumer.errors",
    "oncelog.spark.errors",
    "oncelog.testing.errors",
    "oncelog.streaming.errors",
    "oncelog.framing.errors",
    "oncelog.consumer.checkpoint",
    "oncelog.consumer._trimmed",
    "oncelog.consumer.state",
    "oncelog.transactions",
    "oncelog.publisher",
    "oncelog.sequencer",
    "oncelog.mapping",
    "oncelog.labels",
    "oncelog.cli.frames",
    "oncelog.spark.batches",
    "oncelog.spark.plan",
]


def test_no_circular_import() -> None:
    """Each module imports first in a fresh interpreter, then `from oncelog import *` (which
    resolves every lazy export) works there too."""
    code = "import importlib, sys; importlib.import_module(sys.argv[1]); from oncelog import *"

    def run(module: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", code, module], cwd=ROOT, capture_output=True, text=True,
            timeout=120,
        )

    with ThreadPoolExecutor(max_workers=3) as pool:  # the CI machine has 2 cores
        results = dict(zip(FIRST_IMPORTS, pool.map(run, FIRST_IMPORTS)))
    failures = {
        module: proc.stderr.strip().splitlines()[-3:]
        for module, proc in results.items()
        if proc.returncode != 0
    }
    assert not failures, failures


def test_import_oncelog_stays_light() -> None:
    """The consumer package (and Spark, streaming, the CLI, testing) load only when one of
    their names is first used, so `import oncelog` costs what it did before they were
    exported."""
    code = (
        "import sys, oncelog\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[:2] in (['oncelog', 'consumer'],"
        " ['oncelog', 'spark'], ['oncelog', 'streaming'], ['oncelog', 'cli'],"
        " ['oncelog', 'testing']))\n"
        "assert not heavy, heavy\n"
        "oncelog.Consumer\n"
        "assert 'oncelog.consumer' in sys.modules\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
