"""A pre-imported "zygote" that forks the test kit's Python child processes.

Fault tests start hundreds of short `sys.executable` children (SIGKILL sweeps, crash
points, paused processes); each would spend most of its life importing oncelog, fsspec and
pytest before doing milliseconds of work. The zygote is a single-threaded server process,
started lazily once per test process, that imports those modules once and then forks one
child per request. The children are real processes: SIGKILL, SIGSTOP and SIGCONT reach them
by pid exactly as they reach a `subprocess.Popen` child.

Protocol: the test process and the server share an AF_UNIX SOCK_SEQPACKET socket pair (the
server inherits its end). A request is one message: a pickled `(request id, argv, env,
cwd)` with the child's stdin, stdout and stderr file descriptors attached (`send_fds`). The
server forks, answers `("pid", request id, pid)` and, when the child exits,
`("exit", pid, returncode)` (negative for a signal, as subprocess reports it): the server is
the child's parent and reaps it (through a pidfd in its selector loop). One reader thread in
the test process dispatches the answers. When the test process exits its end of the socket
closes; the server then SIGKILLs the children it still has and exits.

Only argv of the shapes `[sys.executable, "-c", code, *args]`, `[sys.executable, script,
*args]` and `[sys.executable, "-m", module, *args]` go through the zygote, and only when
the child's environment agrees with the server's on every variable read at import time
(`import_time_env`); `spawn` returns None otherwise, and whenever the zygote is off
(`ONCELOG_ZYGOTE=0`), could not start, died or failed to answer in time: the caller then
starts a real process, which is always correct, just slower. Invariant: every wait on the
server is bounded, and a server that failed once is never used again by this process.
"""

from __future__ import annotations

import errno
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import IO, Any

from oncelog.errors import OncelogError

__all__ = ["ENV", "ZygoteChild", "ZygoteLost", "import_time_env", "spawn", "shutdown"]

ENV = "ONCELOG_ZYGOTE"
"""`ONCELOG_ZYGOTE=0` in the environment turns the zygote off: every child is a real spawn."""

PRELOAD = (
    "oncelog",
    "oncelog.journal",
    "oncelog.consumer",
    "oncelog.publisher",
    "oncelog.reading",
    "oncelog.testing.processes",
    "oncelog.testing.faults",
    "oncelog.testing.fixtures",
    "fsspec",
    "orjson",
    "crc32c",
    "pytest",
)
"""Modules the server imports before forking (nothing that starts threads or is fork-unsafe:
no grpc, pyspark, pyarrow, moto or boto)."""

_CALL_TIME_ENV = frozenset({"PYTHONUNBUFFERED", "ONCELOG_CRASH_AT", ENV})
"""Variables a child reads after start-up (the crash point, which `crash_point` reads at call
time), or applies itself (unbuffered stdio), so they may differ from the server's."""

_START_TIMEOUT = 60.0
_REPLY_TIMEOUT = 30.0
_MAX_MESSAGE = 1 << 20


class ZygoteLost(OncelogError, RuntimeError):
    """The zygote server died while a child it forked was running: that child's exit status is
    unknown (it can still be signalled by pid)."""


def import_time_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of `env` that can change what a Python process does while importing
    (interpreter settings, oncelog's and fsspec's switches, the locale), without those a
    child reads later. A child may come from the zygote only if these equal the server's."""
    return {
        key: value
        for key, value in env.items()
        if key not in _CALL_TIME_ENV
        and (key.startswith(("PYTHON", "ONCELOG_", "FSSPEC_", "LC_")) or key == "LANG")
    }


def _supported(argv: Sequence[str]) -> bool:
    if len(argv) < 2 or argv[0] != sys.executable:
        return False
    if argv[1] in ("-c", "-m"):
        return len(argv) >= 3
    return not argv[1].startswith("-")


# -- the test process's side ---------------------------------------------------------------


class _Exit:
    """The fate of one forked child: set once, by the reader thread."""

    __slots__ = ("done", "returncode", "lost")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.returncode: int | None = None
        self.lost = False


class ZygoteChild(subprocess.Popen[bytes]):
    """A `subprocess.Popen` of a child forked by the zygote: `pid`, `args`, `stdout`,
    `returncode`, `poll()`, `wait(timeout)` (subprocess.TimeoutExpired), `send_signal`,
    `kill`, `terminate` work as on a Popen (it is one for the type checker and for code
    taking a Popen; `communicate` is not supported). Signals go to the pid only while the
    child has not been reaped, as with Popen, so a reused pid is never hit."""

    def __init__(  # noqa: PLW0231 - Popen.__init__ would start a process
        self, args: list[str], pid: int, fate: _Exit, stdout: IO[bytes] | None
    ) -> None:
        self.args = self._argv = args
        self.pid = pid
        self.stdout = stdout
        self.stdin: IO[bytes] | None = None
        self.stderr: IO[bytes] | None = None
        self.returncode: int | None = None
        self._fate = fate

    def __repr__(self) -> str:
        return f"ZygoteChild(pid={self.pid}, returncode={self.returncode})"

    def _settle(self) -> int | None:
        if self._fate.done.is_set():
            if self._fate.lost:
                raise ZygoteLost(
                    f"the zygote server died while child {self.pid} ({self._argv[:3]!r}) ran: "
                    "its exit status is unknown"
                )
            self.returncode = self._fate.returncode
        return self.returncode

    def poll(self) -> int | None:
        """The exit code, or None while the child runs."""
        return self._settle()

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit code; subprocess.TimeoutExpired after `timeout` seconds."""
        if not self._fate.done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout if timeout is not None else 0.0)
        code = self._settle()
        assert code is not None
        return code

    def send_signal(self, sig: int) -> None:
        """Send `sig` to the child unless it has been reaped."""
        if self.returncode is None and not self._fate.done.is_set():
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass  # exited, not reaped yet: like Popen, nothing to do

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class _Client:
    """The test process's connection to its zygote server (one per process)."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        self.alive = False
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._next_id = 0
        self._pending: dict[int, tuple[threading.Event, list[Any]]] = {}
        self._fates: dict[int, _Exit] = {}
        self.env: dict[str, str] = {}

    # start-up and death

    def start(self) -> bool:
        """Start the server and wait (bounded) until it has imported `PRELOAD`; False if it
        could not (the caller falls back to real spawns)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.env = dict(os.environ)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", f"from {__name__} import _serve; _serve({theirs.fileno()})"],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=self.env,
            )
        except OSError:
            ours.close()
            return False
        finally:
            theirs.close()
        ours.settimeout(_START_TIMEOUT)
        try:
            hello = pickle.loads(ours.recv(_MAX_MESSAGE))
        except (OSError, pickle.PickleError, EOFError, ValueError):
            hello = None
        if hello != ("ready",):
            ours.close()
            self._reap_server()
            return False
        ours.settimeout(None)
        self._sock = ours
        self.alive = True
        threading.Thread(target=self._read, name="oncelog-zygote-reader", daemon=True).start()
        return True

    def _reap_server(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            try:
                self._proc.wait(10.0)
            except subprocess.TimeoutExpired:
                pass

    def _die(self) -> None:
        """Never use this server again: fail every pending request and running child."""
        with self._lock:
            self.alive = False
            pending, self._pending = self._pending, {}
            fates, self._fates = self._fates, {}
        for event, _ in pending.values():
            event.set()
        for fate in fates.values():
            fate.lost = True
            fate.done.set()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self._die()
        if self._sock is not None:
            self._sock.close()
        if self._proc is not None:
            try:
                self._proc.wait(10.0)
            except subprocess.TimeoutExpired:
                self._reap_server()

    def _read(self) -> None:
        sock = self._sock
        assert sock is not None
        while True:  # one answer per pass; ends when the server's end closes
            try:
                data = sock.recv(_MAX_MESSAGE)
                message = pickle.loads(data) if data else None
            except (OSError, pickle.PickleError, EOFError, ValueError):
                message = None
            if message is None:
                self._die()
                return
            kind = message[0]
            with self._lock:
                if kind == "pid":
                    _, request, pid = message
                    fate = self._fates[pid] = _Exit()
                    waiter = self._pending.pop(request, None)
                    if waiter is not None:
                        waiter[1].append((pid, fate))
                        waiter[0].set()
                elif kind == "error":
                    _, request, text = message
                    waiter = self._pending.pop(request, None)
                    if waiter is not None:
                        waiter[1].append(text)
                        waiter[0].set()
                elif kind == "exit":
                    _, pid, code = message
                    fate = self._fates.pop(pid, _Exit())
                    fate.returncode = code
                    fate.done.set()

    # requests

    def fork(
        self, argv: list[str], env: dict[str, str], cwd: str, fds: tuple[int, int, int]
    ) -> tuple[int, _Exit] | None:
        """Ask the server for a child; None if it cannot give one (the caller falls back)."""
        event = threading.Event()
        box: list[Any] = []
        with self._lock:
            if not self.alive:
                return None
            request = self._next_id = self._next_id + 1
            self._pending[request] = (event, box)
        message = pickle.dumps((request, argv, env, cwd))
        sock = self._sock
        assert sock is not None
        try:
            with self._send_lock:
                socket.send_fds(sock, [message], list(fds))
        except OSError as exc:
            with self._lock:
                self._pending.pop(request, None)
            if not _too_big(exc):
                self._die()
            return None
        if not event.wait(_REPLY_TIMEOUT) or not box:
            self._die()  # no answer in time: this server may be wedged, never use it again
            return None
        answer = box[0]
        if isinstance(answer, str):
            return None  # the server could not fork this one; a real spawn reports why
        pid, fate = answer
        return pid, fate


def _too_big(exc: OSError) -> bool:
    """Whether a failed send only means this request is too large for one message."""
    return exc.errno in (errno.EMSGSIZE, errno.ENOBUFS)


_client: _Client | None = None
_client_lock = threading.Lock()
_disabled = False


def _connection() -> _Client | None:
    global _client, _disabled
    with _client_lock:
        if _disabled:
            return None
        if _client is not None and _client.owner != os.getpid():
            _client = None  # a forked copy of the test process: not its server
            _disabled = True
            return None
        if _client is None:
            client = _Client()
            if not client.start():
                _disabled = True
                return None
            _client = client
        return _client if _client.alive else None


def shutdown() -> None:
    """Stop this process's zygote server (if any); later spawns start a new one."""
    global _client
    with _client_lock:
        client, _client = _client, None
    if client is not None:
        client.close()


def _kill_server_for_tests() -> int | None:
    """SIGKILL the server (tests of the fallback); returns its pid."""
    with _client_lock:
        client = _client
    if client is None or client._proc is None:
        return None
    client._proc.kill()
    client._proc.wait(10.0)
    return client._proc.pid


def spawn(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str | os.PathLike[str] | None,
    stdin: int,
    stdout: int,
    stderr: int,
    stdout_file: IO[bytes] | None = None,
) -> ZygoteChild | None:
    """Fork `argv` from the zygote with the given file descriptors as its stdin, stdout and
    stderr (the caller keeps and closes its copies) and environment `env`; `stdout_file` is
    what the handle exposes as `stdout`. None when the zygote cannot be used for it: the
    caller must then start a real process."""
    args = [os.fspath(a) for a in argv]
    if os.environ.get(ENV, "1") == "0" or env.get(ENV, "1") == "0" or not _supported(args):
        return None
    directory = os.path.abspath(os.fspath(cwd)) if cwd is not None else os.getcwd()
    if not os.path.isdir(directory):
        return None  # a real spawn raises the right error
    client = _connection()
    if client is None or import_time_env(env) != import_time_env(client.env):
        return None
    got = client.fork(args, dict(env), directory, (stdin, stdout, stderr))
    if got is None:
        return None
    pid, fate = got
    return ZygoteChild(args, pid, fate, stdout_file)


# -- the server ----------------------------------------------------------------------------


def _serve(fd: int) -> None:
    """The server's main loop (the `-c` code of the server process): import `PRELOAD`, check
    the process is single-threaded, say ready, then fork one child per request and report
    its exit; exit when the test process's end of the socket closes."""
    import importlib
    import selectors

    sock = socket.socket(fileno=fd)
    try:
        for name in PRELOAD:
            importlib.import_module(name)
        ok = threading.active_count() == 1 and hasattr(os, "pidfd_open")
    except BaseException:  # noqa: BLE001 - any failure means: no zygote
        ok = False
    if not ok:
        sock.send(pickle.dumps(("unusable",)))
        return
    sock.send(pickle.dumps(("ready",)))
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ, None)
    children: dict[int, int] = {}  # pidfd -> pid

    def answer(message: tuple[Any, ...]) -> bool:
        try:
            sock.send(pickle.dumps(message))
        except OSError:
            return False
        return True

    def finish() -> None:
        """The test process is gone: its children must not outlive it unreaped."""
        for pid in children.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    while True:  # one event per pass; returns on EOF
        for key, _ in selector.select():
            if key.data is None:
                try:
                    data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MESSAGE, 3)
                except OSError:
                    data, fds = b"", []
                if not data:
                    finish()
                    return
                request, argv, env, cwd = pickle.loads(data)
                try:
                    pid = os.fork()
                except OSError as exc:
                    for received in fds:
                        os.close(received)
                    if not answer(("error", request, f"fork failed: {exc}")):
                        finish()
                        return
                    continue
                if pid == 0:
                    selector.close()
                    for pidfd in children:
                        os.close(pidfd)
                    sock.close()
                    _child_main(argv, env, cwd, fds)  # never returns
                for received in fds:
                    os.close(received)
                pidfd = os.pidfd_open(pid)
                children[pidfd] = pid
                selector.register(pidfd, selectors.EVENT_READ, pid)
                if not answer(("pid", request, pid)):
                    finish()
                    return
            else:
                pidfd, pid = key.fd, key.data
                _, status = os.waitpid(pid, 0)  # the pidfd is readable: it has exited
                selector.unregister(pidfd)
                os.close(pidfd)
                del children[pidfd]
                if not answer(("exit", pid, os.waitstatus_to_exitcode(status))):
                    finish()
                    return


def _stdio(env: Mapping[str, str]) -> None:
    """New sys.stdin/stdout/stderr on fds 0-2 buffered as `python` would buffer them with
    this environment (unbuffered with PYTHONUNBUFFERED; stderr line-buffered otherwise)."""
    import io

    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    encoding = sys.stdout.encoding if sys.stdout is not None else "utf-8"
    errors = sys.stdout.errors if sys.stdout is not None else "strict"

    def writer(fd: int, line: bool) -> io.TextIOWrapper:
        raw = io.FileIO(fd, "w", closefd=False)
        if unbuffered:
            return io.TextIOWrapper(raw, encoding, errors, write_through=True)
        tty = raw.isatty()
        return io.TextIOWrapper(
            io.BufferedWriter(raw), encoding, "backslashreplace" if fd == 2 else errors,
            line_buffering=line or tty,
        )

    stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding, errors)
    sys.stdin = stdin
    sys.stdout = writer(1, False)
    sys.stderr = writer(2, True)
    for name in ("stdin", "stdout", "stderr"):  # what `python` starts with, as there
        setattr(sys, f"__{name}__", getattr(sys, name))


def _child_main(argv: list[str], env: dict[str, str], cwd: str, fds: list[int]) -> None:
    """Run in the forked child: take the requested stdio, directory, environment and argv,
    then run the code like `python` would, and exit with its code (never returns)."""
    code = 1
    try:
        for target, received in enumerate(fds[:3]):
            os.dup2(received, target)
        for received in fds:
            if received > 2:
                os.close(received)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        _stdio(env)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        code = _run(argv)
    finally:
        try:
            import threading as _threading

            _threading._shutdown()  # type: ignore[attr-defined]  # join non-daemon threads
        except BaseException:  # noqa: BLE001, S110
            pass
        try:
            import atexit

            atexit._run_exitfuncs()
        except BaseException:  # noqa: BLE001, S110
            pass
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()
            except BaseException:  # noqa: BLE001, S110
                pass
        os._exit(code)


def _run(argv: list[str]) -> int:
    """Run `argv[1:]` as `python` would and return the exit code."""
    import importlib
    import runpy
    import tempfile
    import traceback
    import types

    tempfile.tempdir = None  # $TMPDIR of this child, not the server's
    importlib.invalidate_caches()
    try:
        if argv[1] == "-c":
            sys.argv = ["-c", *argv[3:]]
            sys.path[0] = ""
            main = types.ModuleType("__main__")
            main.__dict__["__builtins__"] = __builtins__
            sys.modules["__main__"] = main
            exec(compile(argv[2], "<string>", "exec"), main.__dict__)  # noqa: S102
        elif argv[1] == "-m":
            sys.argv = [argv[2], *argv[3:]]  # run_module puts the module's file in argv[0]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv[1:]
            sys.path[0] = os.path.dirname(os.path.realpath(argv[1]))
            runpy.run_path(argv[1], run_name="__main__")
    except SystemExit as exc:
        return _exit_code(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 130
    except BaseException as exc:  # noqa: BLE001 - reported like the interpreter does
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__):
            tb = tb.tb_next  # the interpreter's traceback starts at the user's code
        traceback.print_exception(type(exc), exc, tb)
        return 1
    return 0


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except BaseException:  # noqa: BLE001, S110
        pass
    return 1
