"""Crashing processes: child Python processes read with timeouts, paused and killed.

Exactly-once code earns its keep when a process dies or stalls at the worst moment, so its
tests must make that happen on purpose, reproducibly.

**Process helpers** run a function (`start_function`) or script (`start_script`) in a child
Python process with its stdout on a pipe and return a `Child`: `readline`/`poll_line`/
`expect` read that pipe with timeouts, `pause`/`resume` send SIGSTOP/SIGCONT (`pause`
returns once the kernel reports the child stopped), `kill` sends SIGKILL,
`kill_at_random(child, seed, within=(lo, hi))` SIGKILLs it at a reproducible random moment,
and `crash_point(name)` called in the child's code SIGKILLs the child exactly there when it
was started with `crash_at="name"` (or `"name:3"` for the third time it gets there). Every
wait has a timeout and raises `ChildTimeout` (with the child's stderr) when it expires.

`run_python(argv, ...)` is `subprocess.run` with captured output for a Python child. All of
them fork the child from a pre-imported zygote when they can (`oncelog.testing._zygote`;
`ONCELOG_ZYGOTE=0` turns it off), which saves the child its half second of imports.

`kill_after_writes(client, n)` makes the current process SIGKILL itself right after the
`n`-th storage write of a journal client (one of `WRITE_METHODS`), for sweeps of a crash
over every step of a protocol. The S3 half of the fault kit is `oncelog.testing.s3proxy`;
`oncelog.testing.faults` re-exports both.
"""

from __future__ import annotations

import base64
import os
import pickle
import random
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from oncelog.testing import _zygote
from oncelog.testing.errors import ChildTimeout

__all__ = [
    "CRASH_ENV",
    "WRITE_METHODS",
    "Child",
    "ChildTimeout",
    "RandomKill",
    "crash_point",
    "kill",
    "kill_after_writes",
    "kill_at_random",
    "pause",
    "resume",
    "run_python",
    "start_function",
    "start_script",
]


CRASH_ENV = "ONCELOG_CRASH_AT"
"""Environment variable read by `crash_point`: `name` or `name:N` (the N-th time)."""

_crash_hits: dict[str, int] = {}
_crash_lock = threading.Lock()


def crash_point(name: str) -> None:
    """A place where the process may die: SIGKILL itself here if `$ONCELOG_CRASH_AT` names
    this point (`name`, or `name:N` for the N-th time it is reached). A no-op otherwise, so
    production code may call it at the steps between which a crash matters."""
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    target, nth = spec, 1
    head, sep, tail = spec.rpartition(":")
    if sep and tail.isdigit():
        target, nth = head, int(tail)
    if target != name:
        return
    with _crash_lock:
        hits = _crash_hits[name] = _crash_hits.get(name, 0) + 1
    if hits == nth:
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


WRITE_METHODS = ("create", "write", "delete", "stage", "write_staged", "move")
"""The storage calls of a journal client's backend that change the store."""


def kill_after_writes(client: Any, n: int) -> Callable[[], int]:
    """Make this process SIGKILL itself right after the `n`-th storage write of `client`
    (a claim or object created, an object written, staged, renamed or deleted) took effect: a
    crash at an exact step of any protocol, counted across threads. `n` <= 0: never.

    For tests of crash recovery that sweep or draw `n` over every write a run makes.
    Returns a function giving the number of writes made so far (a full run's count bounds
    the sweep)."""
    backend = client.store.backend
    lock = threading.Lock()
    count = [0]

    def hook(call: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            result = call(*args, **kwargs)
            with lock:
                count[0] += 1
                hit = count[0] == n
            if hit:
                sys.stdout.flush()
                sys.stderr.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            return result

        return wrapped

    for method in WRITE_METHODS:
        if hasattr(backend, method):
            setattr(backend, method, hook(getattr(backend, method)))
    return lambda: count[0]


_BOOTSTRAP = """\
import base64, pickle, sys
_path, _blob = pickle.loads(base64.b64decode(sys.argv.pop(1)))
sys.path[:0] = [p for p in _path if p not in sys.path]
_func, _args, _kwargs = pickle.loads(_blob)
del _path, _blob
_func(*_args, **_kwargs)
"""
_MAX_PAYLOAD = 100_000


class Child:
    """A child Python process whose stdout is a pipe read with timeouts.

    Exit codes: 0 when the function returns, its `sys.exit` code, 1 on an uncaught exception,
    `-signal.SIGKILL` when killed. stderr goes to a temporary file (`stderr_text()`); it is
    quoted in the errors of the bounded waits. Use as a context manager: leaving it kills the
    child if it is still running.
    """

    def __init__(self, popen: subprocess.Popen[bytes], stderr: IO[bytes]) -> None:
        self.popen = popen
        self._stderr = stderr
        self._buffer = bytearray()
        self._eof = False

    def __repr__(self) -> str:
        return f"Child(pid={self.pid}, returncode={self.popen.returncode})"

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        """The exit code, or None while the child runs."""
        return self.popen.poll()

    def stderr_text(self, limit: int = 4000) -> str:
        """The last `limit` characters the child wrote to stderr."""
        try:
            self._stderr.flush()
            self._stderr.seek(0)
            return self._stderr.read().decode(errors="replace")[-limit:]
        except ValueError:  # closed
            return ""

    def _timeout(self, what: str, timeout: float) -> ChildTimeout:
        return ChildTimeout(
            f"child {self.pid}: {what} within {timeout} s; stderr:\n{self.stderr_text()}"
        )

    def _fill(self, timeout: float) -> bool:
        """Read what the pipe has, waiting up to `timeout`; False if nothing came."""
        stdout = self.popen.stdout
        assert stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(stdout.fileno(), selectors.EVENT_READ)
            if not selector.select(timeout):
                return False
        data = os.read(stdout.fileno(), 65536)
        if not data:
            self._eof = True
        self._buffer += data
        return True

    def poll_line(self, timeout: float) -> bytes | None:
        """The next line of stdout (with its newline), b"" at end of output, or None if no
        complete line came within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:  # each pass reads from the pipe or ends at the deadline
            end = self._buffer.find(b"\n")
            if end >= 0:
                line = bytes(self._buffer[: end + 1])
                del self._buffer[: end + 1]
                return line
            if self._eof:
                rest = bytes(self._buffer)
                self._buffer.clear()
                return rest
            if not self._fill(max(0.0, deadline - time.monotonic())):
                return None

    def readline(self, timeout: float = 10.0) -> bytes:
        """The next line of stdout, b"" at end of output; ChildTimeout if none comes."""
        line = self.poll_line(timeout)
        if line is None:
            raise self._timeout("no line on stdout", timeout)
        return line

    def expect(self, text: bytes | str, timeout: float = 10.0) -> bytes:
        """Read stdout lines until one contains `text` and return it; ChildTimeout if none
        does within `timeout` seconds, EOFError if the output ends first."""
        needle = text.encode() if isinstance(text, str) else text
        deadline = time.monotonic() + timeout
        while True:  # each pass consumes a line or ends
            line = self.poll_line(max(0.0, deadline - time.monotonic()))
            if line is None:
                raise self._timeout(f"no line containing {needle!r}", timeout)
            if not line:
                raise EOFError(
                    f"child {self.pid} closed stdout before printing {needle!r}; "
                    f"stderr:\n{self.stderr_text()}"
                )
            if needle in line:
                return line

    def drain(self) -> list[bytes]:
        """The complete lines already written to stdout, without waiting."""
        lines = []
        while (line := self.poll_line(0.0)) is not None and line:
            lines.append(line)
        return lines

    def wait(self, timeout: float = 10.0) -> int:
        """Wait for the child to exit and return its exit code; ChildTimeout if it does not."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise self._timeout("still running", timeout) from None

    def pause(self, timeout: float = 5.0) -> None:
        """SIGSTOP the child; on Linux, return once the kernel reports it stopped."""
        self.popen.send_signal(signal.SIGSTOP)
        stat = Path(f"/proc/{self.pid}/stat")
        if not stat.exists():
            return
        deadline = time.monotonic() + timeout
        while True:  # bounded by the deadline
            try:
                state = stat.read_text().rpartition(")")[2].split()[0]
            except (OSError, IndexError):
                return  # gone
            if state in ("T", "t", "Z", "X"):
                return
            if time.monotonic() > deadline:
                raise self._timeout(f"not stopped (state {state!r})", timeout)
            time.sleep(0.001)

    def resume(self) -> None:
        """SIGCONT the child."""
        self.popen.send_signal(signal.SIGCONT)

    def kill(self, timeout: float = 10.0) -> int:
        """SIGKILL the child (a no-op if it has exited) and return its exit code."""
        self.popen.send_signal(signal.SIGKILL)
        return self.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Kill the child if it still runs, reap it and close the pipe and stderr file."""
        try:
            if self.popen.poll() is None:
                self.kill(timeout)
        finally:
            if self.popen.stdout is not None:
                self.popen.stdout.close()
            self._stderr.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _spawn(
    argv: Sequence[str],
    env: Mapping[str, str] | None,
    cwd: str | os.PathLike[str] | None,
    crash_at: str | None,
) -> Child:
    environment = dict(os.environ if env is None else env)
    environment.setdefault("PYTHONUNBUFFERED", "1")
    if crash_at is not None:
        environment[CRASH_ENV] = crash_at
    else:
        environment.pop(CRASH_ENV, None)
    stderr = tempfile.TemporaryFile()  # noqa: SIM115 - the Child owns and closes it
    try:
        forked = _zygote_child(argv, environment, cwd, stderr)
        if forked is not None:
            return Child(forked, stderr)
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=environment,
            cwd=cwd,
            bufsize=0,
        )
    except BaseException:
        stderr.close()
        raise
    return Child(popen, stderr)


def _zygote_child(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str | os.PathLike[str] | None,
    stderr: IO[bytes],
) -> _zygote.ZygoteChild | None:
    """`argv` forked from the pre-imported zygote with stdin /dev/null, stdout a pipe (an
    unbuffered binary file, as `Popen(bufsize=0)` gives) and stderr the file `stderr`; None
    when the zygote cannot run it (then the caller spawns a real process)."""
    read_end, write_end = os.pipe()
    stdout = open(read_end, "rb", buffering=0)  # noqa: SIM115 - the handle owns it
    forked = None
    try:
        devnull = os.open(os.devnull, os.O_RDONLY)
        try:
            forked = _zygote.spawn(argv, env, cwd, devnull, write_end, stderr.fileno(), stdout)
        finally:
            os.close(devnull)
    finally:
        os.close(write_end)  # the child has its copy: EOF when it exits
        if forked is None:
            stdout.close()
    return forked


def run_python(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    input: bytes | None = None,  # noqa: A002 - the name subprocess.run uses
    text: bool = False,
) -> subprocess.CompletedProcess[Any]:
    """`subprocess.run(argv, capture_output=True, check=False, ...)` for a Python child
    (`[sys.executable, ...]`), forked from the pre-imported zygote when it can be (see
    `oncelog.testing._zygote`; `ONCELOG_ZYGOTE=0` turns it off), else a real process.

    Captures stdout and stderr (decoded if `text`); feeds `input` to stdin (else /dev/null);
    on `timeout` kills the child and raises subprocess.TimeoutExpired, like subprocess.run.
    The outcome is the same either way: only the start-up cost differs."""
    environment = dict(os.environ if env is None else env)
    with (
        tempfile.TemporaryFile() as stdin,
        tempfile.TemporaryFile() as stdout,
        tempfile.TemporaryFile() as stderr,
    ):
        if input is not None:
            stdin.write(input)
            stdin.flush()
            stdin.seek(0)
        in_fd = stdin.fileno() if input is not None else os.open(os.devnull, os.O_RDONLY)
        try:
            forked = _zygote.spawn(
                argv, environment, cwd, in_fd, stdout.fileno(), stderr.fileno()
            )
        finally:
            if input is None:
                os.close(in_fd)
        if forked is None:
            return subprocess.run(
                list(argv), env=environment, cwd=cwd, timeout=timeout, input=input,
                capture_output=True, check=False, text=text,
            )
        try:
            code = forked.wait(timeout)
        except subprocess.TimeoutExpired:
            forked.kill()
            forked.wait(10.0)
            raise subprocess.TimeoutExpired(
                list(argv), timeout or 0.0, output=_read(stdout), stderr=_read(stderr)
            ) from None
        out, err = _read(stdout), _read(stderr)
    if text:  # decoded as subprocess.run(text=True) decodes
        return subprocess.CompletedProcess(list(argv), code, _text(out), _text(err))
    return subprocess.CompletedProcess(list(argv), code, out, err)


def _text(data: bytes) -> str:
    import locale

    return data.decode(locale.getencoding()).replace("\r\n", "\n").replace("\r", "\n")


def _read(file: IO[bytes]) -> bytes:
    file.seek(0)
    return file.read()


def start_function(
    func: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    crash_at: str | None = None,
) -> Child:
    """Run `func(*args, **kwargs)` in a new `sys.executable` process.

    `func` must be importable by name in the child (a module-level function; the parent's
    `sys.path` is passed on, so test modules work), and the arguments picklable. stdout is
    unbuffered (`PYTHONUNBUFFERED=1` unless `env` sets it). `crash_at` arms `crash_point`.
    """
    module = getattr(func, "__module__", None)
    if module == "__main__" or "<locals>" in getattr(func, "__qualname__", "<locals>"):
        raise ValueError(
            f"{func!r} is not importable by name in a child process: define it at module level "
            "of an importable module, or use start_script"
        )
    blob = pickle.dumps((func, tuple(args), dict(kwargs or {})))
    payload = base64.b64encode(pickle.dumps((list(sys.path), blob))).decode()
    if len(payload) > _MAX_PAYLOAD:
        raise ValueError(
            f"arguments too large for the command line ({len(payload)} bytes encoded); "
            "pass a file name instead"
        )
    return _spawn([sys.executable, "-c", _BOOTSTRAP, payload], env, cwd, crash_at)


def start_script(
    path: str | os.PathLike[str],
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    crash_at: str | None = None,
) -> Child:
    """Run the Python script `path` with `args` in a new `sys.executable` process."""
    return _spawn([sys.executable, os.fspath(path), *args], env, cwd, crash_at)


def _child(proc: Child | subprocess.Popen[Any]) -> subprocess.Popen[Any]:
    return proc.popen if isinstance(proc, Child) else proc


def pause(proc: Child | subprocess.Popen[Any], timeout: float = 5.0) -> None:
    """SIGSTOP a process (a Child waits until the kernel reports it stopped)."""
    if isinstance(proc, Child):
        proc.pause(timeout)
    else:
        proc.send_signal(signal.SIGSTOP)


def resume(proc: Child | subprocess.Popen[Any]) -> None:
    """SIGCONT a process."""
    _child(proc).send_signal(signal.SIGCONT)


def kill(proc: Child | subprocess.Popen[Any], timeout: float = 10.0) -> int:
    """SIGKILL a process and return its exit code; ChildTimeout if it is not reaped in time."""
    if isinstance(proc, Child):
        return proc.kill(timeout)
    proc.send_signal(signal.SIGKILL)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise ChildTimeout(f"process {proc.pid} not reaped {timeout} s after SIGKILL") from None


class RandomKill:
    """A pending SIGKILL of a process at `delay` seconds after `kill_at_random` was called."""

    def __init__(self, proc: subprocess.Popen[Any], delay: float) -> None:
        self.delay = delay
        self.killed = threading.Event()
        self._proc = proc
        self._timer = threading.Timer(delay, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self.killed.set()

    def cancel(self) -> bool:
        """Cancel the kill if still pending; returns whether the kill had been sent."""
        self._timer.cancel()
        self._timer.join(5.0)
        return self.killed.is_set()

    def wait(self, timeout: float = 10.0) -> bool:
        """Wait until the timer has run (and the process exited, if it was killed); returns
        whether it was killed by this timer; ChildTimeout if the timer has not run in time."""
        deadline = time.monotonic() + timeout
        self._timer.join(timeout)
        if self._timer.is_alive():
            raise ChildTimeout(f"random kill of {self._proc.pid} not done within {timeout} s")
        if self.killed.is_set():
            try:
                self._proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise ChildTimeout(
                    f"process {self._proc.pid} not reaped within {timeout} s of SIGKILL"
                ) from None
        return self.killed.is_set()


def kill_at_random(
    proc: Child | subprocess.Popen[Any], seed: int, within: tuple[float, float] = (0.0, 1.0)
) -> RandomKill:
    """SIGKILL `proc` after a delay drawn from `random.Random(seed).uniform(*within)` (the
    same seed gives the same delay; the point in the child's work it lands on still depends
    on timing - use `crash_point` for exact places). Returns the pending `RandomKill`."""
    lo, hi = within
    if not 0.0 <= lo <= hi:
        raise ValueError(f"within must be (lo, hi) with 0 <= lo <= hi, not {within!r}")
    return RandomKill(_child(proc), random.Random(seed).uniform(lo, hi))
