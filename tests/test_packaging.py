"""Packaging: what an install of oncelog gives, as the README's commands make it.

- The `oncelog` Spark format is found by PySpark without `register(spark)` in this
  project's own (editable) virtualenv, as in a regular install.
- A feature used without its optional package raises MissingExtra (an OncelogError and an
  ImportError) naming the feature and the `pip install 'oncelog[extra]'` that fixes it.
- The extras in pyproject.toml agree with `oncelog._extras.EXTRAS`.
- scripts/venv.sh and scripts/test.sh say what they are doing, one line per step, without
  pip's output.

Each check runs in a fresh interpreter (a subprocess): an install, or a module made
unimportable, is a property of a whole process.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from oncelog import OncelogError
from oncelog._extras import EXTRAS, MissingExtra, install_command

ROOT = Path(__file__).resolve().parent.parent


def _run(code: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `code` with this interpreter in `cwd` (never the project root, which `python -c`
    would put on sys.path and so hide how the installed package is found)."""
    assert cwd.resolve() != ROOT
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )


# --- the Spark format without register() -------------------------------------------------


def test_pyspark_lookup_lists_pyspark_oncelog(tmp_path: Path) -> None:
    """PySpark finds Python data sources with `pkgutil.iter_modules()` (see
    pyspark/sql/worker/lookup_data_sources.py): `pyspark_oncelog` must be listed, from any
    working directory, by the interpreter oncelog is installed in. An editable install
    through setuptools' import hook imports it but does not list it."""
    done = _run(
        """
        import pkgutil
        print([m.name for m in pkgutil.iter_modules() if m.name.startswith("pyspark_")])
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "pyspark_oncelog" in done.stdout, (
        f"pkgutil.iter_modules() does not list pyspark_oncelog: {done.stdout.strip()}"
    )


@pytest.mark.slow
@pytest.mark.xdist_group("spark")  # one JVM at a time with the other Spark tests
def test_spark_reads_the_format_without_register(tmp_path: Path) -> None:
    """`spark.read.format("oncelog")` in a fresh session, oncelog never registered: what a
    user of the README's environment runs. Before the fix: DATA_SOURCE_NOT_FOUND."""
    pytest.importorskip("pyspark")
    store = tmp_path / "store"
    work = tmp_path / "work"
    work.mkdir()
    done = _run(
        f"""
        import json, os, sys
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        from oncelog import JournalSpec, JSONMessage, Publisher, open_journals
        client = open_journals({str(store)!r}, create=True)
        client.create(JournalSpec("pk/a", labels={{"content-type": "application/x-ndjson"}}))
        pub = Publisher(client)
        for n in (1, 2):
            pub.publish_committed(lambda m: ("pk/a", "application/x-ndjson"),
                                  JSONMessage({{"n": n}}))
        from pyspark.sql import SparkSession
        spark = (SparkSession.builder.master("local[2]").appName("packaging")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.driver.host", "127.0.0.1")
                 .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
        try:
            rows = (spark.read.format("oncelog").option("store", {str(store)!r})
                    .option("journals", "pk/a").option("schema", "n bigint").load()
                    .select("message.n").collect())
            print("RESULT", json.dumps(sorted(r[0] for r in rows)))
        finally:
            spark.stop()
        """,
        work,
        timeout=300,
    )
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and result, (
        "DATA_SOURCE_NOT_FOUND" if "DATA_SOURCE_NOT_FOUND" in done.stderr else "",
        done.stderr[-3000:],
    )
    assert json.loads(result[0].removeprefix("RESULT ")) == [1, 2]


# --- missing extras --------------------------------------------------------------------

_SETUP = """
import sys
for name in {blocked!r}:
    sys.modules[name] = None  # what an environment without the package looks like
import tempfile
from oncelog import JournalSpec, JSONMessage, Publisher, open_journals
client = open_journals(tempfile.mkdtemp())
client.create(JournalSpec("ex/a", labels={{"content-type": "application/x-ndjson"}}))
Publisher(client).publish_committed(lambda m: ("ex/a", "application/x-ndjson"),
                                    JSONMessage({{"n": 1}}))
try:
{call}
except Exception as exc:
    from oncelog import OncelogError
    print("ERROR", type(exc).__name__, isinstance(exc, OncelogError),
          isinstance(exc, ImportError), "|", exc)
else:
    print("NO ERROR")
"""

# (what is called, modules made unimportable, the feature named, the extra, the module)
_CASES = [
    ("from oncelog.arrow import read_committed_arrow\n"
     "read_committed_arrow(client, 'ex/a')",
     ["pyarrow"], "read_committed_arrow", "arrow", "pyarrow"),
    ("from oncelog.arrow import committed_record_batches\n"
     "next(iter(committed_record_batches(client, 'ex/a')))",
     ["pyarrow"], "committed_record_batches", "arrow", "pyarrow"),
    ("from oncelog.tables import dataset\ndataset(client, 'ex/a')",
     ["pyarrow"], "oncelog.tables.dataset", "arrow", "pyarrow"),
    ("open_journals('s3://some-bucket/journals')",
     ["s3fs"], "the store s3://some-bucket/journals", "s3", "s3fs"),
    ("from oncelog.spark import register\nregister(None)",
     ["pyspark"], "the Spark data source", "spark", "pyspark"),
    ("from oncelog.spark import local_session\nlocal_session()",
     ["pyspark"], "oncelog.spark.local_session", "spark", "pyspark"),
    ("import pyspark_oncelog",
     ["pyspark"], "the Spark data source (pyspark_oncelog)", "spark", "pyspark"),
    ("from oncelog.streaming import connect",
     ["grpc"], "oncelog.streaming.connect", "streaming", "grpc"),
    ("from oncelog.consumer import ConsumerMetrics\nConsumerMetrics()",
     ["prometheus_client"], "ConsumerMetrics", "metrics", "prometheus_client"),
    ("from oncelog.tables import export_delta\n"
     "export_delta(client, 'ex/a', tempfile.mkdtemp())",
     ["deltalake"], "export_delta", "delta", "deltalake"),
]


@pytest.mark.parametrize(
    "call, blocked, feature, extra, module", _CASES, ids=[c[2] for c in _CASES]
)
def test_a_missing_extra_names_the_feature_and_the_install_command(
    tmp_path: Path, call: str, blocked: list[str], feature: str, extra: str, module: str
) -> None:
    """Before: a bare ModuleNotFoundError ("No module named 'pyarrow'"), or fsspec's
    "Install s3fs to access S3", naming neither the feature nor oncelog's extra."""
    code = _SETUP.format(blocked=blocked, call=textwrap.indent(call, "    "))
    done = _run(code, tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout.strip().splitlines()[-1]
    assert out.startswith("ERROR MissingExtra True True | "), out
    message = out.split(" | ", 1)[1]
    assert message.startswith(f"{feature}"), message
    assert f"needs {module}, which is not installed" in message, message
    assert message.endswith(f"pip install 'oncelog[{extra}]'"), message


def test_cli_export_delta_without_deltalake_names_the_extra(tmp_path: Path) -> None:
    """Before: "export delta needs the deltalake package: pip install deltalake"."""
    args = ["oncelog", "export", "delta", "a/b", "--store", str(tmp_path / "store"),
            "--table", str(tmp_path / "table")]
    done = _run(
        f"""
        import sys
        sys.modules["deltalake"] = None
        sys.argv = {args!r}
        from oncelog.cli import main
        main()
        """,
        tmp_path,
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.strip().endswith(
        "oncelog export delta needs deltalake, which is not installed: "
        "pip install 'oncelog[delta]'"
    ), done.stderr


def test_missing_extra_is_an_oncelog_error_and_an_import_error() -> None:
    err = MissingExtra("read_committed_arrow", "arrow", "pyarrow")
    assert isinstance(err, OncelogError) and isinstance(err, ModuleNotFoundError)
    assert err.name == "pyarrow" and (err.feature, err.extra) == ("read_committed_arrow", "arrow")
    assert str(err) == (
        "read_committed_arrow needs pyarrow, which is not installed: "
        "pip install 'oncelog[arrow]'"
    )
    import pickle

    again = pickle.loads(pickle.dumps(err))
    assert type(again) is MissingExtra and str(again) == str(err)


def test_other_import_errors_are_not_blamed_on_an_extra() -> None:
    """A missing module that is not the extra's (a broken install) keeps its own error."""
    from oncelog._extras import needs_extra

    with pytest.raises(ModuleNotFoundError) as caught:
        with needs_extra("arrow", "read_committed_arrow"):
            import oncelog_no_such_module  # type: ignore[import-not-found]  # noqa: F401
    assert not isinstance(caught.value, MissingExtra)


# --- the extras in pyproject.toml ------------------------------------------------------


def _extras() -> dict[str, list[str]]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    extras: dict[str, list[str]] = project["optional-dependencies"]
    return extras


def _names(requirements: list[str]) -> set[str]:
    """Distribution names, with `oncelog[a,b]` expanded to `extra:a`, `extra:b`."""
    names = set()
    for req in requirements:
        name = req.split(";")[0].split(">")[0].split("=")[0].split("<")[0].strip()
        if name.startswith("oncelog["):
            names |= {f"extra:{e.strip()}" for e in name[8:-1].split(",")}
        else:
            names.add(name.split("[")[0].lower().replace("_", "-"))
    return names


def test_every_extra_the_code_names_exists_and_installs_its_modules() -> None:
    extras = _extras()
    dist_of = {"pyarrow": "pyarrow", "s3fs": "s3fs", "pyspark": "pyspark", "grpc": "grpcio",
               "grpc_health": "grpcio-health-checking", "prometheus_client": "prometheus-client",
               "pandas": "pandas", "deltalake": "deltalake"}
    for extra, modules in EXTRAS.items():
        assert extra in extras, f"oncelog._extras names extra {extra!r}; pyproject lacks it"
        for module in modules:
            assert dist_of[module] in _names(extras[extra]), (extra, module)
        assert install_command(extra) == f"pip install 'oncelog[{extra}]'"


def test_all_dev_and_bench_include_the_features() -> None:
    extras = _extras()
    features = set(EXTRAS)
    assert {f"extra:{e}" for e in features} <= _names(extras["all"])
    # What the tests exercise: export_delta (delta), the docs test's pandas examples.
    assert {"extra:testing", "extra:delta", "extra:pandas"} <= _names(extras["dev"])
    assert {"duckdb", "polars", "pytest-xdist", "ruff", "mypy"} <= _names(extras["dev"])
    assert {"extra:all", "extra:testing"} <= _names(extras["bench"])


# --- the set-up scripts say what they do -----------------------------------------------

_FAKE_PYTHON = """#!/usr/bin/env bash
# Stands in for python: records its arguments, prints noise on stdout and stderr.
echo "$0 $*" >> "$FAKE_LOG"
echo "pip-like noise on stdout $*"
echo "pip-like noise on stderr" >&2
if [ "${1:-}" = "-m" ] && [ "${2:-}" = "venv" ]; then
    mkdir -p "$3/bin" && cp "$0" "$3/bin/python"
fi
if [ "${1:-}" = "-m" ] && [ "${2:-}" = "pip" ] && [ "${3:-}" = "install" ] \\
    && [ -n "${FAKE_PIP_FAILS:-}" ]; then
    echo "ERROR: could not resolve" ; exit 1
fi
exit 0
"""


def _fake_python(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    fake = tmp_path / "python3"
    fake.write_text(_FAKE_PYTHON)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, PYTHON=str(fake), ONCELOG_VENV=str(tmp_path / "venv"),
               FAKE_LOG=str(tmp_path / "calls.log"), CI="")
    return fake, env


def _steps(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("oncelog: ")]


def test_test_sh_prints_each_step_and_hides_pip(tmp_path: Path) -> None:
    """Before: ~51 s of silence while pip installed the extras, then the tests."""
    _, env = _fake_python(tmp_path)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "test.sh"), "-k", "nothing"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    steps = _steps(done.stderr)
    expected = ["creating the virtual environment", "installing oncelog with extras all,dev",
                "installed in", "pip check", "ruff", "mypy", "pytest"]
    assert len(steps) == len(expected), steps
    for line, start in zip(steps, expected):
        assert line.removeprefix("oncelog: ").startswith(start), (line, start)
    assert "this can take a minute" in steps[1]
    calls = (tmp_path / "calls.log").read_text().splitlines()
    install = [c for c in calls if " -m pip install " in c]
    assert len(install) == 1 and "-e .[all,dev]" in install[0], calls
    assert calls[-1].endswith("-m pytest -n 2 --dist loadgroup -q --durations=25 -k nothing")
    # pip's own output is kept out of the terminal (it is in the venv's log)
    assert "-m pip" not in done.stderr + done.stdout
    assert "-m pip install" in (tmp_path / "venv" / ".oncelog-pip.log").read_text()
    # a second run reuses the venv and says so
    again = subprocess.run(["bash", str(ROOT / "scripts" / "venv.sh"), "all,dev"],
                           env=env, capture_output=True, text=True, timeout=60)
    assert _steps(again.stderr) == [f"oncelog: {tmp_path / 'venv'} is up to date "
                                    "(oncelog with extras all,dev)"]
    assert again.stdout.strip() == f"{tmp_path / 'venv'}/bin/python"


def test_venv_sh_shows_pip_output_when_pip_fails(tmp_path: Path) -> None:
    _, env = _fake_python(tmp_path)
    env["FAKE_PIP_FAILS"] = "1"
    done = subprocess.run(["bash", str(ROOT / "scripts" / "venv.sh"), "bench"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "ERROR: could not resolve" in done.stderr
    assert _steps(done.stderr)[-1].startswith("oncelog: pip install failed")
    assert done.stdout == ""
