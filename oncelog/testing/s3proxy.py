"""An S3 fault proxy: a misbehaving S3 in front of a real one.

Exactly-once code earns its keep when things go wrong between the client and the store, so
its tests must make them go wrong on purpose, reproducibly.

**S3FaultProxy** is an HTTP reverse proxy on 127.0.0.1 in front of any S3-compatible endpoint
(moto's server in oncelog's tests). Point s3fs (or boto3) at `proxy.endpoint` and requests
are forwarded byte for byte: method, path, query, headers (signatures and `If-None-Match`
included) and the body, chunked or aws-chunked framing kept as sent. Rules pick requests by
method, object key, query and header, and inject one of these faults instead:

- `INTERNAL_ERROR` (500 InternalError), `SLOW_DOWN` (503 SlowDown), `SERVICE_UNAVAILABLE`
  (503 ServiceUnavailable), `CONDITIONAL_CONFLICT` (409 ConditionalRequestConflict, S3's
  answer when concurrent conditional writes of one key conflict) or any `Fault.error(...)`:
  answered by the proxy with an S3 XML error body (botocore parses the code); the request
  never reaches the server, so nothing was applied.
- `RESET`: the connection is reset (TCP RST) before the request is forwarded: nothing was
  applied, the client sees a connection error.
- `LOST_REPLY`: the request is forwarded and applied, then the connection is reset instead of
  the reply. The client sees a connection error although the write happened; retrying a
  conditional PUT then gets 412. This is the fault that makes retries ambiguous.
- `Fault.delay(seconds)`: the request is forwarded and applied, and the reply is held back
  for `seconds` (a slow server; combine with client read timeouts).
- `Fault.truncate(keep)`: the request is forwarded; the reply's headers go out with the full
  Content-Length, then only `keep` bytes of the body (half by default), then the connection
  closes. A correct client reports an error instead of returning short data.

A `FaultRule` fires for the next `times` matching requests, or at a `rate` drawn from a
`random.Random(seed)` (the same requests give the same faults on every run), optionally
after letting `after` matching requests through. `rule.seen` and `rule.fired` count what it
matched and what it injected; `proxy.requests` records every request and its fault.

Example (a pytest test using the `s3_fault_proxy` fixture of `oncelog.testing.fixtures`)::

    from oncelog.journal import JournalSpec
    from oncelog.testing.faults import LOST_REPLY, FaultRule

    def test_claim_reply_lost(s3_fault_proxy):
        rule = s3_fault_proxy.proxy.add_rule(
            FaultRule(LOST_REPLY, method="PUT", key=r"\\.oncelog/claims/", times=1))
        with s3_fault_proxy.open(retries=False) as client:
            client.create(JournalSpec("a/b"))
            client.append("a/b", b"x\\n")  # the claim was made, its reply lost: still once
            assert client.read("a/b").read() == b"x\\n"
        assert rule.fired == 1

**Retries hide faults.** botocore retries 500, 503, 409-conflict and connection errors by
itself (up to 5 attempts in `standard` mode, 3 in `legacy`), so a fault injected once never
reaches the code under test. `proxy.storage_options_no_retries` (or
`without_botocore_retries(options)`) sets `config_kwargs={"retries": {"total_max_attempts": 1,
"mode": "standard"}}` (note: botocore's `max_attempts` counts retries, so `"max_attempts": 1`
still makes 2 attempts). s3fs (2026.9) then still retries in its own loop, up to
`S3FileSystem.retries` attempts (5; a class attribute, not a constructor option, so it cannot
be set through storage options), with back-off 0.1 * 1.7**i s, these failures:

- exceptions listed in `s3fs.core.S3_RETRYABLE_ERRORS`: socket timeouts, botocore
  `HTTPClientError` (e.g. `ConnectionClosedError`: the server closed the connection before
  replying, as after a truncated body), `IncompleteRead`, fsspec timeouts, unparseable
  replies and aiohttp `ClientPayloadError`;
- a `ClientError` whose text contains "SlowDown", "reduce your request rate" or
  "XAmzContentSHA256Mismatch" (so `SLOW_DOWN` is retried, `SERVICE_UNAVAILABLE` - whose
  message is S3's "Reduce your request rate." - is not).

It does not retry 500, 409 or a connection reset (aiohttp's `ClientOSError` becomes botocore's
`EndpointConnectionError`). `cat_file` nests two such loops (up to 25 attempts). Call
`without_s3fs_retries(fs)` (e.g. `without_s3fs_retries(client.fs)` for a JournalClient) to
make each call one attempt; a filesystem re-created from a pickle (in another process) has
the default again.

Below both, aiohttp (s3fs's HTTP client) resends an idempotent request - GET, HEAD, PUT,
DELETE, not POST (DeleteObjects) - once on a new connection when the connection is reset or
closed before the reply's headers arrive; nothing turns that off. Through s3fs a `RESET`
with `times=1` is therefore invisible (use `times=2` to make the call fail), and a
`LOST_REPLY` of a conditional PUT surfaces as the retry's 412 (`FileExistsError`): exactly the
ambiguity a create-if-absent protocol must resolve. boto3 (urllib3) does not resend: with
`proxy.boto3_client(retries=False)` every fault is seen once, as it happened.

The process half of the fault kit (starting, pausing and killing child processes) is
`oncelog.testing.processes`; `oncelog.testing.faults` re-exports both.
"""

from __future__ import annotations

import copy
import enum
import http.client
import os
import random
import re
import socket
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self
from urllib.parse import unquote, urlsplit
from xml.sax.saxutils import escape

__all__ = [
    "CONDITIONAL_CONFLICT",
    "INTERNAL_ERROR",
    "LOST_REPLY",
    "RESET",
    "SERVICE_UNAVAILABLE",
    "SLOW_DOWN",
    "Fault",
    "FaultKind",
    "FaultRule",
    "ProxiedRequest",
    "S3FaultProxy",
    "without_botocore_retries",
    "without_s3fs_retries",
]


# -- faults and rules ------------------------------------------------------------------------


class FaultKind(enum.Enum):
    """What the proxy does instead of relaying a request faithfully."""

    ERROR = "error"  # answer an S3 error without forwarding
    RESET = "reset"  # reset the connection without forwarding
    LOST_REPLY = "lost-reply"  # forward, then reset the connection instead of replying
    DELAY = "delay"  # forward, then hold the reply back
    TRUNCATE = "truncate"  # forward, then send a cut reply body and close


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault: its kind and parameters. Use the constants (`SLOW_DOWN`, `LOST_REPLY`, ...)
    or `Fault.error`, `Fault.delay` and `Fault.truncate`."""

    kind: FaultKind
    status: int = 0
    code: str = ""
    message: str = ""
    seconds: float = 0.0
    keep: int | None = None

    def __post_init__(self) -> None:
        if self.kind is FaultKind.ERROR and not (400 <= self.status <= 599 and self.code):
            raise ValueError("an ERROR fault needs a 4xx/5xx status and an S3 error code")
        if self.seconds < 0 or (self.keep is not None and self.keep < 0):
            raise ValueError("seconds and keep must not be negative")

    @staticmethod
    def error(status: int, code: str, message: str = "") -> Fault:
        """Answer `status` with an S3 error document carrying `code` and `message`."""
        return Fault(FaultKind.ERROR, status=status, code=code, message=message or code)

    @staticmethod
    def delay(seconds: float) -> Fault:
        """Forward the request (the server applies it), then reply `seconds` later."""
        return Fault(FaultKind.DELAY, seconds=seconds)

    @staticmethod
    def truncate(keep: int | None = None) -> Fault:
        """Forward the request, then send only `keep` bytes of the reply body (default: half;
        never all of it) after headers announcing all of it, and close the connection."""
        return Fault(FaultKind.TRUNCATE, keep=keep)


INTERNAL_ERROR = Fault.error(
    500, "InternalError", "We encountered an internal error. Please try again."
)
SLOW_DOWN = Fault.error(503, "SlowDown", "Please reduce your request rate.")
SERVICE_UNAVAILABLE = Fault.error(503, "ServiceUnavailable", "Reduce your request rate.")
CONDITIONAL_CONFLICT = Fault.error(
    409,
    "ConditionalRequestConflict",
    "A conflicting operation occurred. If using PutObject you can retry the request.",
)
RESET = Fault(FaultKind.RESET)
LOST_REPLY = Fault(FaultKind.LOST_REPLY)


@dataclass(slots=True, eq=False)
class FaultRule:
    """Inject `action` into the requests that match every given criterion.

    - `method`: HTTP method (`"PUT"`, `"GET"`, `"HEAD"`, `"POST"` (DeleteObjects),
      `"DELETE"`); None matches any.
    - `key`: regex searched (`re.search`) in the URL-decoded object key, the path after the
      bucket (`""` for bucket requests such as ListObjectsV2 and DeleteObjects).
    - `query`: regex searched in the raw query string (`r"list-type=2"`, `r"\\bdelete\\b"`).
    - `header`: the request must carry this header (case-insensitive), e.g. `"If-None-Match"`
      for the conditional PUTs of `pipe_file(..., mode="create")`.
    - `after`: let this many matching requests through before the rule can fire.
    - `times`: fire at most this many times (None: no limit).
    - `rate`: fire for this fraction of the eligible requests, drawn from
      `random.Random(seed)` (None: every eligible request). With a fixed order of requests
      the same ones fail on every run.

    `seen` counts the matching requests, `fired` the faults injected. The proxy consults its
    rules in order; the first that fires decides, later rules do not see that request.
    """

    action: Fault
    method: str | None = None
    key: str | None = None
    query: str | None = None
    header: str | None = None
    after: int = 0
    times: int | None = None
    rate: float | None = None
    seed: int = 0
    seen: int = field(default=0, init=False)
    fired: int = field(default=0, init=False)
    _key_re: re.Pattern[str] | None = field(default=None, init=False, repr=False)
    _query_re: re.Pattern[str] | None = field(default=None, init=False, repr=False)
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.action, Fault):
            raise TypeError(f"action must be a Fault, not {type(self.action).__name__}")
        if self.times is not None and self.times < 0:
            raise ValueError("times must not be negative")
        if self.after < 0:
            raise ValueError("after must not be negative")
        if self.rate is not None and not 0.0 <= self.rate <= 1.0:
            raise ValueError("rate must be within [0, 1]")
        if self.method is not None:
            self.method = self.method.upper()
        self._key_re = re.compile(self.key) if self.key is not None else None
        self._query_re = re.compile(self.query) if self.query is not None else None
        self._rng = random.Random(self.seed)

    @property
    def exhausted(self) -> bool:
        """Whether the rule has fired its `times` and will not fire again."""
        return self.times is not None and self.fired >= self.times

    def matches(self, method: str, key: str, query: str, headers: Mapping[str, str]) -> bool:
        """Whether a request meets the rule's criteria (counters and random draws untouched)."""
        if self.method is not None and method.upper() != self.method:
            return False
        if self._key_re is not None and not self._key_re.search(key):
            return False
        if self._query_re is not None and not self._query_re.search(query):
            return False
        return self.header is None or self.header.lower() in headers

    def _consider(self, method: str, key: str, query: str, headers: Mapping[str, str]) -> bool:
        """Count a request and decide whether to fire on it (call under the proxy's lock)."""
        if not self.matches(method, key, query, headers):
            return False
        self.seen += 1
        if self.seen <= self.after or self.exhausted:
            return False
        if self.rate is not None and self._rng.random() >= self.rate:
            return False
        self.fired += 1
        return True


@dataclass(frozen=True, slots=True)
class ProxiedRequest:
    """A request the proxy received: what it was and which fault, if any, it got. `status` is
    the status sent back to the client (None when the client got no reply, 502 when the
    upstream could not be reached)."""

    method: str
    bucket: str
    key: str
    query: str
    headers: Mapping[str, str]  # names lower-cased
    size: int  # bytes of request body as received (chunk framing included)
    fault: FaultKind | None
    status: int | None


# -- the proxy --------------------------------------------------------------------------------

_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"}
)
_MAX_LINE = 65536
_MAX_TRAILERS = 100


class _ClientGone(Exception):
    """The client closed its connection or sent a malformed request body."""


@dataclass(slots=True)
class _Reply:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes
    had_length: bool


_NO_RETRIES = {"total_max_attempts": 1, "mode": "standard"}
"""botocore's retry setting for one attempt per call (its `max_attempts` counts retries: 1
there means two attempts)."""


def without_botocore_retries(storage_options: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of s3fs storage options with botocore's own retries off (one attempt per call).

    s3fs keeps retrying some failures (see the module docstring); `without_s3fs_retries`
    turns that off on a filesystem instance."""
    options = copy.deepcopy(dict(storage_options))
    config = dict(options.get("config_kwargs") or {})
    config["retries"] = dict(_NO_RETRIES)
    options["config_kwargs"] = config
    return options


def without_s3fs_retries(fs: Any) -> Any:
    """Make an s3fs filesystem try each call once (`fs.retries = 1`) and return it.

    Pass `client.fs` for a JournalClient; use it with `without_botocore_retries` so a fault
    reaches the code under test instead of being retried by the libraries below it."""
    if not hasattr(type(fs), "retries"):
        raise TypeError(f"{type(fs).__name__} has no s3fs retry setting")
    fs.retries = 1
    return fs


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, proxy: S3FaultProxy, address: tuple[str, int]) -> None:
        self.proxy = proxy
        super().__init__(address, _ProxyHandler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        self.proxy._note_error(sys.exc_info()[1])


class _ProxyHandler(BaseHTTPRequestHandler):
    """One client connection: reads requests, consults the rules, relays or misbehaves."""

    protocol_version = "HTTP/1.1"
    timeout = 60.0  # an idle client connection is closed after this
    server: _Server
    _entry: ProxiedRequest | None = None  # the request being answered, until recorded

    def setup(self) -> None:
        super().setup()
        self.server.proxy._track(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        finally:
            self.server.proxy._untrack(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: tests read `proxy.requests` instead

    def _handle(self) -> None:
        proxy = self.server.proxy
        try:
            body = self._read_body()
        except (_ClientGone, OSError, ValueError):
            self.close_connection = True
            return
        split = urlsplit(self.path)
        parts = split.path.lstrip("/").split("/", 1)
        bucket = unquote(parts[0])
        key = unquote(parts[1]) if len(parts) > 1 else ""
        headers = {k.lower(): v for k, v in self.headers.items()}
        rule = proxy._choose(self.command, key, split.query, headers)
        fault = rule.action if rule is not None else None
        kind = fault.kind if fault is not None else None
        self._entry = ProxiedRequest(
            self.command, bucket, key, split.query, headers, len(body), kind, None
        )
        try:
            if fault is not None and kind is FaultKind.ERROR:
                self._send_s3_error(fault, split.path)
            elif kind is FaultKind.RESET:
                self._log(None)
                self._abort(reset=True)
            else:
                try:
                    reply = proxy._forward(self.command, self.path, self.headers.items(), body)
                except (OSError, http.client.HTTPException) as exc:
                    if proxy._stopping.is_set():  # stop() closed the upstream under us
                        self._log(None)
                        self._abort(reset=True)
                        return
                    self._send_s3_error(
                        Fault.error(502, "BadGateway", f"upstream failed: {exc!r}"), split.path
                    )
                else:
                    self._relay(reply, fault)
        except OSError:  # the client went away while we answered
            self.close_connection = True
        finally:
            self._log(None)

    def _log(self, status: int | None) -> None:
        """Record the request with the status about to be sent (once, and before the client
        can see the outcome, so a test reading `proxy.requests` after its call sees it)."""
        entry, self._entry = self._entry, None
        if entry is not None:
            self.server.proxy._record(replace(entry, status=status))

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = do_OPTIONS = _handle

    def _read_body(self) -> bytes:
        """The request body exactly as sent (chunked framing and trailers included)."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked_raw()
        length = self.headers.get("Content-Length")
        if length is None:
            return b""
        size = int(length)
        if size < 0:
            raise ValueError("negative Content-Length")
        data = self.rfile.read(size)
        if len(data) != size:
            raise _ClientGone
        return data

    def _read_line(self) -> bytes:
        line = self.rfile.readline(_MAX_LINE + 1)
        if not line.endswith(b"\n"):
            raise _ClientGone
        return line

    def _read_chunked_raw(self) -> bytes:
        raw = bytearray()
        while True:  # each pass consumes a chunk; EOF or a bad line raises
            line = self._read_line()
            raw += line
            size = int(line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                break
            chunk = self.rfile.read(size + 2)
            if len(chunk) != size + 2:
                raise _ClientGone
            raw += chunk
        for _ in range(_MAX_TRAILERS):
            line = self._read_line()
            raw += line
            if line in (b"\r\n", b"\n"):
                return bytes(raw)
        raise _ClientGone

    def _send_s3_error(self, fault: Fault, resource: str) -> None:
        request_id = f"oncelog-fault-{self.server.proxy._next_id()}"
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{escape(fault.code)}</Code><Message>{escape(fault.message)}</Message>"
            f"<Resource>{escape(resource)}</Resource><RequestId>{request_id}</RequestId></Error>"
        ).encode()
        self.send_response_only(fault.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("x-amz-request-id", request_id)
        if self.close_connection:
            self.send_header("Connection", "close")
        self._log(fault.status)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _relay(self, reply: _Reply, fault: Fault | None) -> None:
        """Send the upstream reply as the fault (LOST_REPLY, DELAY, TRUNCATE or none) says."""
        kind = fault.kind if fault is not None else None
        if kind is FaultKind.LOST_REPLY:
            self._log(None)
            self._abort(reset=True)
            return
        if (
            fault is not None
            and kind is FaultKind.DELAY
            and self.server.proxy._stopping.wait(fault.seconds)
        ):
            self._log(None)
            self._abort(reset=True)  # the proxy is stopping: do not hold its shutdown
            return
        bodiless = self.command == "HEAD" or reply.status in (204, 304) or reply.status < 200
        self.send_response_only(reply.status, reply.reason)
        for name, value in reply.headers:
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        if not reply.had_length and not bodiless:
            self.send_header("Content-Length", str(len(reply.body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self._log(reply.status)
        self.end_headers()
        if bodiless:
            return
        if fault is not None and kind is FaultKind.TRUNCATE:
            keep = len(reply.body) // 2 if fault.keep is None else fault.keep
            self.wfile.write(reply.body[: min(keep, max(len(reply.body) - 1, 0))])
            self._abort(reset=False)
            return
        self.wfile.write(reply.body)

    def _abort(self, *, reset: bool) -> None:
        """Close the client connection now: with a TCP RST (`reset`) or an orderly FIN."""
        sock = self.connection
        self.close_connection = True
        try:
            if reset:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        # Detach and close the descriptor itself: the handler's file objects hold references
        # that would otherwise delay the close until after socketserver's orderly shutdown.
        self.server.proxy._untrack(sock)
        fd = sock.detach()
        if fd >= 0:
            os.close(fd)


class S3FaultProxy:
    """A reverse proxy on 127.0.0.1 in front of the S3-compatible endpoint `upstream`,
    injecting faults chosen by rules (see the module docstring).

    `storage_options` are the s3fs options that reach the upstream (as
    `S3Server.storage_options`); the proxy's `storage_options` are the same with the
    endpoint replaced by its own. Requests must use path-style addressing
    (`http://host:port/bucket/key`, what botocore uses for an IP endpoint); the Host header
    is forwarded as the client signed it, so the upstream must not verify signatures
    against its own host name (moto does not verify them). Request and reply bodies are
    held in memory while relayed: this is test tooling, not a production proxy.

    Use it as a context manager, or `start()` and `stop()`. Threads are daemons; `stop()`
    closes client connections and returns within `timeout` seconds.
    """

    def __init__(
        self,
        upstream: str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        upstream_timeout: float = 30.0,
        history: int = 10_000,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be an http:// endpoint, not {upstream!r}")
        self.upstream = upstream
        self._upstream_host = parts.hostname
        self._upstream_port = parts.port or 80
        self._base_options = copy.deepcopy(dict(storage_options or {}))
        self.upstream_timeout = upstream_timeout
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._rules: list[FaultRule] = []
        self._requests: deque[ProxiedRequest] = deque(maxlen=history)
        self._errors: deque[BaseException] = deque(maxlen=100)
        self._seen = 0
        self._answered = 0
        self._ids = 0
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._upstreams: set[http.client.HTTPConnection] = set()
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._port = 0

    @classmethod
    def for_server(cls, server: Any, **kwargs: Any) -> S3FaultProxy:
        """A proxy in front of an `S3Server` (anything with `.endpoint` and
        `.storage_options`)."""
        return cls(server.endpoint, server.storage_options, **kwargs)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Self:
        """Listen on a free port of 127.0.0.1 and serve in a daemon thread; returns self."""
        if self._server is not None:
            raise RuntimeError("the proxy is already running")
        self._stopping.clear()
        server = _Server(self, ("127.0.0.1", 0))
        self._port = server.server_address[1]
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"s3-fault-proxy:{self._port}",
            daemon=True,
        )
        self._server, self._thread = server, thread
        thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving, close open connections (client and upstream) and wait up to `timeout`
        seconds for the threads; RuntimeError names the ones still running after that."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        deadline = time.monotonic() + timeout
        self._stopping.set()
        server.shutdown()  # returns once serve_forever notices, within its poll interval
        server.server_close()
        with self._lock:
            sockets = list(self._connections.items())
            upstreams = list(self._upstreams)
        for conn in upstreams:
            if conn.sock is not None:
                _shutdown_quietly(conn.sock)
        for sock, _ in sockets:
            _shutdown_quietly(sock)
        threads = [thread, *(t for _, t in sockets)]
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._server = self._thread = None
        alive = [t.name for t in threads if t.is_alive()]
        if alive:
            raise RuntimeError(f"S3FaultProxy threads still running after {timeout} s: {alive}")

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._server is not None

    # -- where clients connect ---------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """`http://127.0.0.1:PORT` of the running proxy."""
        if not self._port:
            raise RuntimeError("the proxy has not been started")
        return f"http://127.0.0.1:{self._port}"

    @property
    def storage_options(self) -> dict[str, Any]:
        """The upstream's s3fs storage options with the endpoint set to the proxy."""
        options = copy.deepcopy(self._base_options)
        client_kwargs = dict(options.get("client_kwargs") or {})
        client_kwargs["endpoint_url"] = self.endpoint
        options["client_kwargs"] = client_kwargs
        if "endpoint_url" in options:
            options["endpoint_url"] = self.endpoint
        return options

    @property
    def storage_options_no_retries(self) -> dict[str, Any]:
        """`storage_options` with botocore's retries off; s3fs's own loop still retries some
        errors (see the module docstring and `without_s3fs_retries`)."""
        return without_botocore_retries(self.storage_options)

    def boto3_client(self, *, retries: bool = True, read_timeout: float = 60.0) -> Any:
        """A boto3 S3 client through the proxy, with botocore's retries on or off."""
        import boto3
        from botocore.config import Config

        options = self._base_options
        client_kwargs = options.get("client_kwargs") or {}
        config: dict[str, Any] = {"read_timeout": read_timeout}
        if not retries:
            config["retries"] = dict(_NO_RETRIES)
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=client_kwargs.get("region_name", "us-east-1"),
            aws_access_key_id=options.get("key"),
            aws_secret_access_key=options.get("secret"),
            config=Config(**config),
        )

    # -- rules and observations --------------------------------------------------------------

    def add_rule(self, rule: FaultRule) -> FaultRule:
        """Add a rule after the existing ones; returns it (to read its counters later)."""
        with self._lock:
            self._rules.append(rule)
        return rule

    def remove_rule(self, rule: FaultRule) -> None:
        with self._lock:
            self._rules.remove(rule)

    def clear(self) -> None:
        """Drop every rule: requests are relayed faithfully from now on."""
        with self._lock:
            self._rules.clear()

    @property
    def rules(self) -> list[FaultRule]:
        with self._lock:
            return list(self._rules)

    @property
    def seen(self) -> int:
        """How many requests the proxy has received."""
        with self._lock:
            return self._seen

    def wait_seen(self, count: int, timeout: float = 10.0, *, answered: bool = False) -> None:
        """Wait until the proxy has received `count` requests in all (counted on arrival,
        before any fault or forwarding), or with `answered` until `count` have been dealt with
        (replied to, failed or cut off: they are in `requests`); TimeoutError after `timeout`
        seconds."""

        def done() -> bool:
            return (self._answered if answered else self._seen) >= count

        with self._arrived:
            if not self._arrived.wait_for(done, timeout):
                what = "answered" if answered else "received"
                raise TimeoutError(f"the proxy has not {what} {count} requests in {timeout} s")

    @property
    def requests(self) -> list[ProxiedRequest]:
        """The requests received (the last `history` of them), oldest first."""
        with self._lock:
            return list(self._requests)

    @property
    def faults(self) -> list[ProxiedRequest]:
        """The requests that got a fault."""
        return [r for r in self.requests if r.fault is not None]

    @property
    def errors(self) -> list[BaseException]:
        """Unexpected exceptions in the proxy's handler threads (empty when all is well)."""
        with self._lock:
            return list(self._errors)

    # -- internals ---------------------------------------------------------------------------

    def _choose(
        self, method: str, key: str, query: str, headers: Mapping[str, str]
    ) -> FaultRule | None:
        with self._lock:
            self._seen += 1
            self._arrived.notify_all()
            for rule in self._rules:
                if rule._consider(method, key, query, headers):
                    return rule
        return None

    def _record(self, request: ProxiedRequest) -> None:
        with self._lock:
            self._requests.append(request)
            self._answered += 1
            self._arrived.notify_all()

    def _note_error(self, error: BaseException | None) -> None:
        if error is not None:
            with self._lock:
                self._errors.append(error)

    def _next_id(self) -> int:
        with self._lock:
            self._ids += 1
            return self._ids

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._connections[sock] = threading.current_thread()

    def _untrack(self, sock: socket.socket) -> None:
        with self._lock:
            self._connections.pop(sock, None)

    def _forward(
        self, method: str, target: str, headers: Iterable[tuple[str, str]], body: bytes
    ) -> _Reply:
        """Send the request to the upstream as received; read its whole reply."""
        conn = http.client.HTTPConnection(
            self._upstream_host, self._upstream_port, timeout=self.upstream_timeout
        )
        with self._lock:
            self._upstreams.add(conn)
        try:
            conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                conn.putheader(name, value)
            conn.endheaders()
            if body:
                conn.send(body)
            response = conn.getresponse()
            data = response.read()
            had_length = response.getheader("Content-Length") is not None and not response.chunked
            return _Reply(response.status, response.reason, response.getheaders(), data, had_length)
        finally:
            with self._lock:
                self._upstreams.discard(conn)
            conn.close()


def _shutdown_quietly(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
