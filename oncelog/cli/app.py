"""The `oncelog` command group: global options, the journal store, and errors as one line.

Every command reaches its store through `State.client()`, opened once per run from
`--store` / `ONCELOG_STORE` and the storage options. `main()` runs the group and turns any
failure into `oncelog: error: ...` on stderr and a non-zero exit status (a traceback only
with `--debug`).
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from oncelog.cli.params import STORAGE_OPTION, merge_storage_option, parse_storage_option

if TYPE_CHECKING:
    from oncelog.journal import JournalClient

__all__ = ["State", "cli", "main", "store_options", "pass_state", "EXIT_ERROR", "EXIT_USAGE"]

EXIT_ERROR = 1
"""Exit status of a command that failed (unknown journal, bad input data, store errors)."""
EXIT_USAGE = 2
"""Exit status of a command line that does not parse (bad option or value)."""
EXIT_BROKEN_PIPE = 128 + 13
"""Exit status when the reader of stdout went away (as if killed by SIGPIPE)."""
EXIT_INTERRUPTED = 128 + 2
"""Exit status after Ctrl-C (as if killed by SIGINT)."""

ENV_STORE = "ONCELOG_STORE"
ENV_STORAGE_OPTIONS = "ONCELOG_STORAGE_OPTIONS"
ENV_S3_ENDPOINT = "ONCELOG_S3_ENDPOINT"
ENV_S3_REGION = "ONCELOG_S3_REGION"


@dataclass
class State:
    """What one run of the command shares between the group and the command: the store
    URL, its storage options, `--debug`, and the client once opened."""

    store: str | None = None
    storage_options: list[tuple[list[str], Any]] = field(default_factory=list)
    debug: bool = False
    _client: JournalClient | None = None

    def options(self) -> dict[str, Any]:
        """The fsspec storage options: the S3 shorthands of the environment, then
        ONCELOG_STORAGE_OPTIONS, then each `--storage-option` in order (later ones win)."""
        options: dict[str, Any] = {}
        if (self.store or "").startswith(("s3://", "s3a://")):
            if os.environ.get(ENV_S3_ENDPOINT):
                options["endpoint_url"] = os.environ[ENV_S3_ENDPOINT]
            if os.environ.get(ENV_S3_REGION):
                options["client_kwargs"] = {"region_name": os.environ[ENV_S3_REGION]}
        for text in os.environ.get(ENV_STORAGE_OPTIONS, "").split():
            try:
                merge_storage_option(options, *parse_storage_option(text))
            except ValueError as exc:
                raise click.UsageError(f"{ENV_STORAGE_OPTIONS}: {exc}") from None
        for path, value in self.storage_options:
            merge_storage_option(options, path, value)
        return options

    def client(self) -> JournalClient:
        """The journal client of the store, opened on first use."""
        if self._client is None:
            if not self.store:
                raise click.UsageError(f"no store given: pass --store URL or set {ENV_STORE}")
            from oncelog.journal import open_journals

            self._client = open_journals(self.store, **self.options())
        return self._client

    def close(self) -> None:
        """Flush and close the client, if one was opened."""
        client, self._client = self._client, None
        if client is not None:
            client.close()


pass_state = click.make_pass_decorator(State)
"""Passes the run's State to a command callback as its first argument."""


def _set_store(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value:
        ctx.ensure_object(State).store = value


def _add_storage_options(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    if value:
        ctx.ensure_object(State).storage_options.extend(value)


F = TypeVar("F", bound=Callable[..., Any])

_STORE_HELP = (
    f"Journal store: a path, file:///dir, memory://name or s3://bucket/prefix [env {ENV_STORE}]."
)
_OPTION_HELP = (
    "fsspec storage option KEY=VALUE (a string) or KEY:=JSON; dotted keys nest, "
    f"e.g. client_kwargs.region_name=eu-west-1. Repeatable [env {ENV_STORAGE_OPTIONS}]."
)


def _store_option(envvar: str | None = None) -> Callable[[F], F]:
    return click.option(
        "--store",
        "-s",
        metavar="URL",
        envvar=envvar,
        expose_value=False,
        callback=_set_store,
        help=_STORE_HELP,
    )


_storage_option = click.option(
    "--storage-option",
    "-o",
    "storage_options",
    type=STORAGE_OPTION,
    multiple=True,
    expose_value=False,
    callback=_add_storage_options,
    help=_OPTION_HELP,
)


def store_options(func: F) -> F:
    """Accept `--store` and `--storage-option` after the command name too."""
    return _store_option()(_storage_option(func))


class _Root(click.Group):
    """The root group: maps a closed stdout and Ctrl-C to quiet exits."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            _detach_stdout()
            raise click.exceptions.Exit(EXIT_BROKEN_PIPE) from None
        except KeyboardInterrupt:
            raise click.exceptions.Exit(EXIT_INTERRUPTED) from None


def _detach_stdout() -> None:
    # Whatever is still buffered for the closed pipe goes to /dev/null, so the interpreter's
    # final flush neither fails nor prints "Exception ignored ... BrokenPipeError".
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


@click.group(cls=_Root, context_settings={"help_option_names": ["-h", "--help"]})
@_store_option(envvar=ENV_STORE)
@_storage_option
@click.option(
    "--debug",
    is_flag=True,
    envvar="ONCELOG_DEBUG",
    help="Print a traceback with errors [env ONCELOG_DEBUG=1].",
)
@click.version_option(package_name="oncelog", prog_name="oncelog", message="%(prog)s %(version)s")
@pass_state
def cli(state: State, debug: bool) -> None:
    """Manage, append to and read oncelog journals on local disk or object storage.

    Options --store and --storage-option may also follow the command name. S3 credentials
    come from the usual AWS settings (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE)
    or storage options; ONCELOG_S3_ENDPOINT and ONCELOG_S3_REGION set the endpoint and
    region of s3:// stores.
    """
    state.debug = state.debug or debug


def describe_error(exc: BaseException) -> str:
    """The one line that reports `exc`: its message, prefixed by its type when the message
    alone would not say what went wrong."""
    from oncelog.framing import FramingError
    from oncelog.journal import JournalError
    from oncelog.journal._retry import is_credentials_error

    if is_credentials_error(exc):
        return (
            f"no usable S3 credentials ({exc}): oncelog (botocore) reads AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), AWS_PROFILE with ~/.aws/credentials "
            "and ~/.aws/config, and instance or container roles; or pass -o key=... -o "
            f"secret=... (or {ENV_STORAGE_OPTIONS}); -o anon:=true reads a public bucket"
        )
    if isinstance(exc, OSError) and exc.filename and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}"
    elif isinstance(exc, KeyError) and exc.args:
        text = str(exc.args[0])
    else:
        text = str(exc)
    text = " ".join(line.strip() for line in text.splitlines() if line.strip())
    if not text or not isinstance(
        exc, (JournalError, FramingError, ValueError, LookupError, OSError)
    ):
        name = type(exc).__name__
        text = f"{name}: {text}" if text else name
    return text


def _is_usage_error(exc: BaseException) -> bool:
    """Errors in what the command line says (a bad journal name, a malformed store URL),
    found only once the library checks it: they exit with EXIT_USAGE like click's."""
    from oncelog.journal import InvalidJournalName, InvalidStoreURL

    return isinstance(exc, (InvalidJournalName, InvalidStoreURL))


def _report(text: str) -> None:
    print(f"oncelog: error: {text}", file=sys.stderr, flush=True)


def main(args: Sequence[str] | None = None) -> NoReturn:
    """Run the `oncelog` command line and exit with its status."""
    from oncelog.framing import set_gc_pausing

    # The command's process is its own: bulk decoding may pause the collector (restored
    # on return, for callers that run main() inside another program or a test).
    previous_gc_pausing = set_gc_pausing(True)
    handler = _warnings_to_stderr()
    state = State()
    code = 0
    try:
        try:
            result = cli.main(
                args=list(args) if args is not None else None,
                prog_name="oncelog",
                standalone_mode=False,
                obj=state,
            )
            if isinstance(result, int):
                code = result
        finally:
            state.close()
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except click.UsageError as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        _report(exc.format_message() + hint)
        code = exc.exit_code
    except click.ClickException as exc:
        _report(exc.format_message())
        code = exc.exit_code
    except click.Abort:
        _report("aborted")
        code = EXIT_ERROR
    except BrokenPipeError:
        _detach_stdout()
        code = EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except Exception as exc:
        if state.debug:
            traceback.print_exc()
        _report(describe_error(exc))
        code = EXIT_USAGE if _is_usage_error(exc) else EXIT_ERROR
    set_gc_pausing(previous_gc_pausing)
    if handler is not None:
        logging.getLogger("oncelog").removeHandler(handler)
    sys.exit(code)


class _WarningFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"oncelog: {record.levelname.lower()}: {record.getMessage()}"


def _warnings_to_stderr() -> logging.Handler | None:
    """Show the library's warnings (a store not answering and being retried, say) on stderr
    as the command's own (`oncelog: warning: ...`), unless the process configured logging
    itself (a program running main() inside it). Returns the handler added, if any."""
    if logging.getLogger().handlers or logging.getLogger("oncelog").handlers:
        return None
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(_WarningFormatter())
    logging.getLogger("oncelog").addHandler(handler)
    return handler
