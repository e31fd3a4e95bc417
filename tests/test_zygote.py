"""The pre-imported zygote that forks the test kit's Python children (oncelog.testing._zygote):
exit codes, signals, stdout read while the child runs, env/cwd/argv, `-c`/`-m`/script,
concurrency, and the fallback to a real spawn (turned off, an import-time variable changed,
the server killed).

A child tells where it came from by printing its parent pid: a zygote child's parent is the
server, a real spawn's is this test process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncelog import OncelogError
from oncelog.testing import _zygote
from oncelog.testing.processes import run_python, start_script

PY = sys.executable
PPID = "import os; print(os.getppid(), flush=True)"


def forked(ppid: str | bytes) -> bool:
    """Whether a child that printed `ppid` came from the zygote (not spawned by us)."""
    return int(ppid) != os.getpid()


@pytest.fixture
def fresh_zygote() -> Iterator[None]:
    """A zygote server of this test's own, stopped afterwards (so killing it harms no other
    test: the next user starts a new one)."""
    _zygote.shutdown()
    yield
    _zygote.shutdown()


def test_exit_codes_and_traceback() -> None:
    assert run_python([PY, "-c", "pass"]).returncode == 0
    assert run_python([PY, "-c", "import sys; sys.exit(3)"]).returncode == 3
    assert run_python([PY, "-c", "raise SystemExit"]).returncode == 0
    said = run_python([PY, "-c", "raise SystemExit('bad thing')"], text=True)
    assert (said.returncode, said.stderr) == (1, "bad thing\n")
    crashed = run_python([PY, "-c", "def f():\n    raise ValueError('boom')\nf()"], text=True)
    assert crashed.returncode == 1
    assert crashed.stderr.startswith("Traceback (most recent call last):\n"), crashed.stderr
    assert 'File "<string>", line 3, in <module>' in crashed.stderr
    assert crashed.stderr.endswith("ValueError: boom\n")
    assert "_zygote" not in crashed.stderr  # the interpreter's traceback, not ours
    assert forked(run_python([PY, "-c", PPID]).stdout)


def test_argv_env_cwd_and_input(tmp_path: Path) -> None:
    env = {**os.environ, "ZYGOTE_TEST_VALUE": "seven"}
    env.pop("ZYGOTE_TEST_ABSENT", None)
    code = (
        "import os, sys; print(sys.argv); print(os.getcwd()); "
        "print(os.environ['ZYGOTE_TEST_VALUE'], 'ZYGOTE_TEST_ABSENT' in os.environ); "
        "print(sys.stdin.read()); print(sys.path[0] == '')"
    )
    os.environ["ZYGOTE_TEST_ABSENT"] = "set in the parent only"
    try:
        proc = run_python([PY, "-c", code, "a", "b c"], env=env, cwd=tmp_path, input=b"fed")
    finally:
        del os.environ["ZYGOTE_TEST_ABSENT"]
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().splitlines() == [
        "['-c', 'a', 'b c']", str(tmp_path), "seven False", "fed", "True",
    ]


def test_script_and_module(tmp_path: Path) -> None:
    script = tmp_path / "tool.py"
    (tmp_path / "helper.py").write_text("WHO = 'helper beside the script'\n")
    script.write_text(
        "import os, sys\nimport helper\n"
        "print(__name__, sys.argv[1:], helper.WHO, os.getppid())\nsys.exit(int(sys.argv[1]))\n"
    )
    proc = run_python([PY, str(script), "4", "x"], text=True)
    assert proc.returncode == 4, proc.stderr
    name, rest = proc.stdout.split(" ", 1)
    assert name == "__main__"
    assert rest.startswith("['4', 'x'] helper beside the script ")
    assert forked(rest.split()[-1])

    package = tmp_path / "zygote_pkg_mod.py"
    package.write_text("import sys\nprint(__name__, sys.argv)\n")
    proc = run_python([PY, "-m", "zygote_pkg_mod", "arg"], cwd=tmp_path, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"__main__ [{str(package)!r}, 'arg']\n"


def test_timeout_kills_the_child() -> None:
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        run_python([PY, "-c", "import time; print('up', flush=True); time.sleep(60)"], timeout=2)
    assert caught.value.output in (b"", b"up\n")  # may be cut before its first line


def test_sigkill_sigstop_sigcont_and_lines_while_running(tmp_path: Path) -> None:
    script = tmp_path / "lines.py"
    script.write_text(
        "import os, sys\n"
        "print('ppid', os.getppid())\n"
        "for line in iter(sys.stdin.readline, ''):\n"
        "    pass\n"  # stdin is /dev/null: returns at once
        "print('ready')\n"
        "import time\n"
        "for i in range(600):\n"
        "    print('tick', i)\n"
        "    time.sleep(0.05)\n"
    )
    with start_script(script) as child:
        assert forked(child.readline().split()[1])
        assert child.readline() == b"ready\n"  # PYTHONUNBUFFERED: each line as printed
        assert child.readline().startswith(b"tick")
        child.pause()
        child.drain()
        assert child.poll_line(0.3) is None  # stopped: nothing more comes
        assert child.returncode is None
        child.resume()
        assert child.readline().startswith(b"tick")
        assert child.kill() == -signal.SIGKILL
        assert child.returncode == -signal.SIGKILL


def test_paused_child_resumed_then_exits(tmp_path: Path) -> None:
    go = tmp_path / "go"
    script = tmp_path / "wait.py"
    script.write_text(
        "import os, sys, time\nprint('waiting', flush=True)\n"
        "deadline = time.monotonic() + 60\n"
        f"while not os.path.exists({str(go)!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "print('done', flush=True)\nsys.exit(5)\n"
    )
    with start_script(script) as child:
        assert child.readline() == b"waiting\n"
        child.pause()
        go.touch()
        with pytest.raises(OncelogError):  # ChildTimeout: a stopped child does not go on
            child.wait(0.7)
        assert child.drain() == []
        child.resume()
        assert child.expect("done") == b"done\n"
        assert child.wait() == 5


def test_concurrent_children_from_threads() -> None:
    results: dict[int, subprocess.CompletedProcess[bytes]] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for j in range(5):
                code = f"import os, sys; print({i}, {j}, os.getppid()); sys.exit({(i + j) % 7})"
                results[i * 10 + j] = run_python([PY, "-c", code], timeout=60)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads)
    assert len(results) == 30
    for key, proc in results.items():
        i, j = divmod(key, 10)
        assert proc.returncode == (i + j) % 7, proc.stderr
        said_i, said_j, ppid = proc.stdout.split()
        assert (int(said_i), int(said_j)) == (i, j)
        assert forked(ppid)


def test_import_time_variable_falls_back() -> None:
    env = {**os.environ, "ONCELOG_ZYGOTE_TEST_SWITCH": "1", "PYTHONUNBUFFERED": "1"}
    proc = run_python([PY, "-c", PPID + "; print(os.environ['ONCELOG_ZYGOTE_TEST_SWITCH'])"],
                      env=env)
    assert proc.returncode == 0, proc.stderr
    ppid, value = proc.stdout.split()
    assert not forked(ppid) and value == b"1"
    # The crash point is read at call time: it does not need a real spawn.
    env = {**os.environ, "ONCELOG_CRASH_AT": "nowhere"}
    assert forked(run_python([PY, "-c", PPID], env=env).stdout)


def test_turned_off_falls_back(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(_zygote.ENV, "0")
    proc = run_python([PY, "-c", PPID + "; raise SystemExit(2)"])
    assert proc.returncode == 2 and not forked(proc.stdout)
    script = tmp_path / "s.py"
    script.write_text(PPID + "\n")
    with start_script(script) as child:
        assert not forked(child.readline())
        assert child.wait() == 0
    # Unsupported shapes are real spawns too.
    monkeypatch.delenv(_zygote.ENV)
    assert not forked(run_python([PY, "-S", "-c", PPID]).stdout)


@pytest.mark.usefixtures("fresh_zygote")
def test_dead_server_falls_back_and_its_children_stay_killable(tmp_path: Path) -> None:
    script = tmp_path / "sleep.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    orphan = start_script(script)
    try:
        assert orphan.readline() == b"up\n"
        assert _zygote._kill_server_for_tests() is not None
        with pytest.raises(_zygote.ZygoteLost, match=str(orphan.pid)):
            orphan.popen.wait(10.0)  # its exit status went with the server
        os.kill(orphan.pid, signal.SIGKILL)  # still reachable by pid
        assert orphan.readline() == b""  # the pipe closed: it died
    finally:
        orphan.popen.stdout.close()  # type: ignore[union-attr]
        orphan._stderr.close()
    proc = run_python([PY, "-c", PPID + "; raise SystemExit(6)"])
    assert proc.returncode == 6 and not forked(proc.stdout)
    with start_script(script) as child:
        assert child.readline() == b"up\n"
        assert child.kill() == -signal.SIGKILL
