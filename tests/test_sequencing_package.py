"""The `oncelog.sequencing` package: the read-side rules in one place, under the same names.

- every module of the package imports first in a fresh interpreter, never loads PySpark,
  and (but for `bulkcommit`) not pyarrow either;
- the layering holds: the package imports only from below it, and nothing below imports
  the package (or `oncelog.sequencer`);
- the old homes (`oncelog.sequencer`, `oncelog.spark.plan`, `oncelog.spark.errors`) give
  the very same objects, and the public sequencing names keep `oncelog.sequencer` as their
  `__module__` (pickles, the API reference) and their logger;
- the C kernel's binding follows the one switch (`oncelog._native.speedups`) and refuses
  an extension whose outcomes or warnings are not the Python kernel's.
"""

from __future__ import annotations

import ast
import logging
import pickle
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
from speedups_support import BUILT, MODES, speedups_mode

import oncelog.sequencer as sequencer
from oncelog.errors import OncelogError
from oncelog.message import Envelope, Flags, JSONMessage, build_uuid
from oncelog.sequencing import errors, kernel, native, plan

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "oncelog" / "sequencing"
P1 = bytes([0x01, 0, 0, 0, 0, 1])

MODULES = [
    "oncelog.sequencing",
    "oncelog.sequencing.kernel",
    "oncelog.sequencing.native",
    "oncelog.sequencing.plan",
    "oncelog.sequencing.errors",
    "oncelog.sequencing.bulkcommit",
    "oncelog.sequencer",
    "oncelog.spark.plan",
]
NEEDS_PYARROW = {"oncelog.sequencing.bulkcommit"}

# What the package may import of oncelog: the layers below it, and itself.
ALLOWED_BELOW = (
    "oncelog.identity",
    "oncelog.message",
    "oncelog.errors",
    "oncelog._native",
    "oncelog._speedups",
    "oncelog.framing",
    "oncelog.journal",
    "oncelog.sequencing",
)
# Modules below the package: none may import it, nor the Sequencer built on it.
BELOW = ["oncelog/identity.py", "oncelog/message.py", "oncelog/errors.py", "oncelog/_native.py"]
BELOW_PACKAGES = ["oncelog/framing", "oncelog/journal"]


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, anywhere in it (TYPE_CHECKING blocks and functions
    too); `from pkg import name` counts as `pkg.name` as well as `pkg`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            raise AssertionError(f"{path}: relative import at line {node.lineno}")
    return found


def test_the_package_holds_the_modules() -> None:
    """Guards the walks below: they would pass vacuously over an empty package."""
    names = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert names == [
        "__init__.py", "bulkcommit.py", "columnar.py", "errors.py", "kernel.py", "native.py",
        "plan.py",
    ]
    assert "oncelog.sequencing.kernel" in imported_modules(PACKAGE / "plan.py")
    assert "oncelog._native" in imported_modules(PACKAGE / "native.py")


def test_the_package_imports_only_from_below() -> None:
    wrong = sorted(
        f"{path.name}: {module}"
        for path in PACKAGE.glob("*.py")
        for module in imported_modules(path)
        if module.split(".")[0] == "pyspark"
        or (module.startswith("oncelog.") and not module.startswith(ALLOWED_BELOW))
    )
    assert not wrong, f"oncelog.sequencing imports from above it: {wrong}"


def test_nothing_below_imports_the_package() -> None:
    paths = [ROOT / p for p in BELOW]
    for package in BELOW_PACKAGES:
        paths += sorted((ROOT / package).rglob("*.py"))
    assert len(paths) > 10
    wrong = sorted(
        f"{path.relative_to(ROOT)}: {module}"
        for path in paths
        for module in imported_modules(path)
        if module.startswith(("oncelog.sequencing", "oncelog.sequencer", "oncelog.reading"))
    )
    assert not wrong, f"modules below oncelog.sequencing import it: {wrong}"


def test_each_module_imports_first_without_pyspark() -> None:
    """In a fresh interpreter where PySpark cannot be imported, each module imports first;
    PySpark is never loaded, nor pyarrow but by `bulkcommit`."""
    code = (
        "import importlib, sys\n"
        "sys.modules['pyspark'] = None\n"
        "importlib.import_module(sys.argv[1])\n"
        "loaded = sorted(m.split('.')[0] for m in sys.modules"
        " if m.split('.')[0] in ('pyspark', 'pyarrow') and sys.modules[m] is not None)\n"
        "print(','.join(sorted(set(loaded))))\n"
    )

    def run(module: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", code, module], cwd=ROOT, capture_output=True, text=True,
            timeout=120,
        )

    with ThreadPoolExecutor(max_workers=2) as pool:  # the CI machine has 2 cores
        results = dict(zip(MODULES, pool.map(run, MODULES)))
    failures = {m: p.stderr.strip().splitlines()[-3:] for m, p in results.items() if p.returncode}
    assert not failures, failures
    for module, proc in results.items():
        loaded = set(filter(None, proc.stdout.strip().split(",")))
        assert "pyspark" not in loaded, module
        if module not in NEEDS_PYARROW:
            assert "pyarrow" not in loaded, module


def test_old_homes_give_the_same_objects() -> None:
    import oncelog
    import oncelog.spark.errors as spark_errors
    import oncelog.spark.plan as spark_plan
    from oncelog.sequencing import bulkcommit

    for name in ("DEFAULT_MAX_BYTES", "ProducerState", "QueueOutcome", "ReplayFunc",
                 "SequencingKernel", "decide_outcome"):
        assert getattr(sequencer, name) is getattr(kernel, name), name
    assert set(kernel.__all__) <= set(sequencer.__all__)
    for name in ("Sequencer", "QueueOutcome", "ProducerState"):
        assert getattr(oncelog, name) is getattr(sequencer, name), name
    assert issubclass(sequencer.Sequencer, kernel.SequencingKernel)
    assert spark_plan.__all__ and set(spark_plan.__all__) <= set(plan.__all__)
    for name in spark_plan.__all__:
        assert getattr(spark_plan, name) is getattr(plan, name), name
    assert spark_errors.Diverged is plan.Diverged is errors.Diverged
    assert bulkcommit.NotBulk is errors.NotBulk


def test_planner_errors_are_oncelog_errors_naming_the_offset() -> None:
    diverged = errors.Diverged(40, ([], []), "a clock went backwards")
    assert isinstance(diverged, OncelogError)
    assert str(diverged) == "offset 40: a clock went backwards"
    assert diverged.offset == 40 and diverged.committed == ([], [])
    not_bulk = errors.NotBulk(7, "a producer's clock does not grow")
    assert isinstance(not_bulk, OncelogError)
    assert str(not_bulk) == "at offset 7: a producer's clock does not grow"
    assert (not_bulk.offset, not_bulk.reason) == (7, "a producer's clock does not grow")


def test_public_names_keep_their_home() -> None:
    """`oncelog.sequencer` stays the home users, pickles and the API reference see."""
    for obj in (kernel.QueueOutcome, kernel.ProducerState, kernel.SequencingKernel,
                kernel.decide_outcome, sequencer.Sequencer):
        assert obj.__module__ == "oncelog.sequencer", obj
    state = kernel.ProducerState("a/j", P1, 12, -1)
    data = pickle.dumps(state)
    assert b"oncelog.sequencer" in data and b"oncelog.sequencing" not in data
    assert pickle.loads(data) == state
    outcome = kernel.QueueOutcome.ACK_COMMIT_RING
    assert pickle.loads(pickle.dumps(outcome)) is outcome


@pytest.mark.parametrize("mode", MODES)
def test_the_kernel_logs_as_oncelog_sequencer(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Both kernels log the rules' warnings through the `oncelog.sequencer` logger."""
    with speedups_mode(mode):
        seq = sequencer.Sequencer(buffer=8)
    envs = [
        Envelope("a/j", 0, 10, JSONMessage({"uuid": str(build_uuid(P1, 5, Flags.CONTINUE_TXN))})),
        Envelope("a/j", 10, 20, JSONMessage({"uuid": str(build_uuid(P1, 6, 0x100))})),
    ]
    with caplog.at_level(logging.WARNING, logger="oncelog.sequencer"):
        assert seq.committed(envs) == [envs[1]]
    names = {(r.name, r.levelno) for r in caplog.records}
    assert ("oncelog.sequencer", logging.WARNING) in names, caplog.records
    assert {n for n, _ in names} == {"oncelog.sequencer"}
    assert "unexpected UUID flags" in caplog.text and "'a/j' offsets [10, 20)" in caplog.text


@pytest.mark.parametrize("mode", MODES)
def test_the_binding_follows_the_one_switch(mode: str) -> None:
    with speedups_mode(mode):
        made = sequencer.Sequencer()
        kernel_type = native.kernel_type()
    if mode == "pure":
        assert kernel_type is None and type(made) is sequencer.Sequencer
        with speedups_mode("pure"), pytest.raises(RuntimeError, match="not loaded"):
            native.new_kernel(None, None, None, None)
    else:
        assert BUILT is not None and kernel_type is BUILT.module.Kernel
        assert type(made) is not sequencer.Sequencer and isinstance(made, sequencer.Sequencer)
        assert sorted(native.OUTCOMES, key=lambda o: o.value) == sorted(
            kernel.QueueOutcome, key=lambda o: o.value
        )


def test_the_binding_refuses_other_outcomes_or_warnings() -> None:
    values = [o.value for o in reversed(kernel.QueueOutcome)]
    warnings = list(range(len(kernel._WARNINGS)))
    same = SimpleNamespace(OUTCOMES=values, WARNINGS=warnings)
    assert native.outcomes_of(same) == tuple(reversed(kernel.QueueOutcome))  # type: ignore[arg-type]
    with pytest.raises(ImportError, match="other queue outcomes"):
        native.outcomes_of(SimpleNamespace(OUTCOMES=values[1:], WARNINGS=warnings))  # type: ignore[arg-type]
    with pytest.raises(ImportError, match="other warnings"):
        native.outcomes_of(SimpleNamespace(OUTCOMES=values, WARNINGS=warnings[1:]))  # type: ignore[arg-type]
