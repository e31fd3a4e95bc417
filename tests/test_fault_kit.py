"""The fault-injection kit (oncelog.testing.faults): the S3 proxy relays faithfully, each
fault kind happens as documented and is seen by clients with retries off, rules match and
count as specified, and the process helpers pause, resume and kill children with bounded
waits. Ends with oncelog itself appending through injected faults."""

from __future__ import annotations

import base64
import http.client
import os
import random
import signal
import socket
import sys
import threading
import time
import zlib
from typing import Any

import botocore.exceptions
import pytest
import s3fs

from oncelog.journal import JournalSpec
from oncelog.testing.faults import (
    CONDITIONAL_CONFLICT,
    INTERNAL_ERROR,
    LOST_REPLY,
    RESET,
    SERVICE_UNAVAILABLE,
    SLOW_DOWN,
    ChildTimeout,
    Fault,
    FaultKind,
    FaultRule,
    S3FaultProxy,
    crash_point,
    kill,
    kill_at_random,
    pause,
    resume,
    start_function,
    start_script,
    without_s3fs_retries,
)
from oncelog.testing.fixtures import FaultTarget

CONNECTION_ERRORS = (botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError)


def direct_client(target: FaultTarget) -> Any:
    """A boto3 client of the S3 server itself, bypassing the proxy."""
    import boto3

    options = target.server.storage_options
    return boto3.client(
        "s3",
        endpoint_url=target.server.endpoint,
        region_name=options["client_kwargs"]["region_name"],
        aws_access_key_id=options["key"],
        aws_secret_access_key=options["secret"],
    )


def stored(target: FaultTarget, key: str) -> bytes | None:
    """The object `key` of the target's bucket as the server has it, None if absent."""
    try:
        return direct_client(target).get_object(Bucket=target.bucket, Key=key)["Body"].read()
    except botocore.exceptions.ClientError as exc:
        if exc.response["Error"]["Code"] == "NoSuchKey":
            return None
        raise


def s3fs_through(target: FaultTarget, *, retries: bool = False) -> s3fs.S3FileSystem:
    options = target.storage_options if retries else target.storage_options_no_retries
    fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False, **options)
    return fs if retries else without_s3fs_retries(fs)


# -- faithful forwarding -----------------------------------------------------------------------


@pytest.mark.fault
@pytest.mark.s3
def test_s3fs_operations_pass_through_unchanged(s3_fault_proxy: FaultTarget) -> None:
    target = s3_fault_proxy
    fs = s3fs_through(target)
    b = target.bucket
    payload = bytes(range(256)) * 40
    fs.pipe_file(f"{b}/dir/one", payload)
    fs.pipe_file(f"{b}/dir/two", b"second", mode="create")
    assert stored(target, "dir/one") == payload
    assert fs.cat_file(f"{b}/dir/one") == payload
    assert fs.cat_file(f"{b}/dir/one", start=1000, end=1010) == payload[1000:1010]
    assert sorted(fs.ls(f"{b}/dir", detail=False, refresh=True)) == [
        f"{b}/dir/one",
        f"{b}/dir/two",
    ]
    with pytest.raises(FileExistsError):
        fs.pipe_file(f"{b}/dir/two", b"overwritten?", mode="create")
    assert stored(target, "dir/two") == b"second"
    fs.rm([f"{b}/dir/one", f"{b}/dir/two"])  # one DeleteObjects POST
    assert stored(target, "dir/one") is None and stored(target, "dir/two") is None

    requests = target.proxy.requests
    assert all(r.fault is None for r in requests)
    conditional = [r for r in requests if r.method == "PUT" and "if-none-match" in r.headers]
    assert [(r.key, r.headers["if-none-match"], r.status) for r in conditional] == [
        ("dir/two", "*", 200),
        ("dir/two", "*", 412),
    ]
    ranged = [r for r in requests if r.method == "GET" and "range" in r.headers]
    assert [r.headers["range"] for r in ranged] == ["bytes=1000-1009"]
    assert any(r.method == "GET" and "list-type=2" in r.query for r in requests)
    assert any(r.method == "POST" and "delete" in r.query and r.status == 200 for r in requests)
    assert target.proxy.seen == len(requests)
    assert target.proxy.errors == []


def _aws_chunked(data: bytes) -> bytes:
    """`data` as an unsigned aws-chunked body with a CRC32 trailer (what botocore sends to
    S3 over TLS)."""
    crc = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    return b"%x\r\n%s\r\n0\r\nx-amz-checksum-crc32:%s\r\n\r\n" % (len(data), data, crc.encode())


def _http_chunked(body: bytes, size: int) -> bytes:
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


@pytest.mark.fault
@pytest.mark.s3
def test_chunked_aws_chunked_put_is_forwarded_as_sent(s3_fault_proxy: FaultTarget) -> None:
    target = s3_fault_proxy
    data = b"chunked payload " * 100
    inner = _aws_chunked(data)
    wire = _http_chunked(inner, 300)
    port = int(target.proxy.endpoint.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("PUT", f"/{target.bucket}/raw/chunked", skip_accept_encoding=True)
        for name, value in [
            ("Transfer-Encoding", "chunked"),
            ("Content-Encoding", "aws-chunked"),
            ("x-amz-content-sha256", "STREAMING-UNSIGNED-PAYLOAD-TRAILER"),
            ("x-amz-decoded-content-length", str(len(data))),
            ("x-amz-trailer", "x-amz-checksum-crc32"),
        ]:
            conn.putheader(name, value)
        conn.endheaders()
        conn.send(wire)
        response = conn.getresponse()
        response.read()
    finally:
        conn.close()
    assert response.status == 200
    (request,) = target.proxy.requests
    assert request.size == len(wire)  # the framing went through untouched
    assert stored(target, "raw/chunked") == data


# -- each fault kind ---------------------------------------------------------------------------


@pytest.mark.fault
@pytest.mark.s3
@pytest.mark.parametrize(
    ("fault", "status", "code"),
    [
        (INTERNAL_ERROR, 500, "InternalError"),
        (SLOW_DOWN, 503, "SlowDown"),
        (SERVICE_UNAVAILABLE, 503, "ServiceUnavailable"),
        (CONDITIONAL_CONFLICT, 409, "ConditionalRequestConflict"),
    ],
    ids=["500", "503-slowdown", "503-unavailable", "409"],
)
def test_error_fault_is_parsed_by_botocore_and_not_applied(
    s3_fault_proxy: FaultTarget, fault: Fault, status: int, code: str
) -> None:
    target = s3_fault_proxy
    client = target.proxy.boto3_client(retries=False)
    rule = target.proxy.add_rule(FaultRule(fault, method="PUT", times=1))
    with pytest.raises(botocore.exceptions.ClientError) as info:
        client.put_object(Bucket=target.bucket, Key="k", Body=b"v", IfNoneMatch="*")
    assert info.value.response["Error"]["Code"] == code
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == status
    assert stored(target, "k") is None
    assert (rule.seen, rule.fired) == (1, 1)
    client.put_object(Bucket=target.bucket, Key="k", Body=b"v", IfNoneMatch="*")
    assert stored(target, "k") == b"v"
    assert (rule.seen, rule.fired) == (2, 1)


@pytest.mark.fault
@pytest.mark.s3
def test_error_fault_on_head_gives_the_status(s3_fault_proxy: FaultTarget) -> None:
    target = s3_fault_proxy
    client = target.proxy.boto3_client(retries=False)
    target.proxy.add_rule(FaultRule(INTERNAL_ERROR, method="HEAD", times=1))
    with pytest.raises(botocore.exceptions.ClientError) as info:
        client.head_object(Bucket=target.bucket, Key="absent")
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500


@pytest.mark.fault
@pytest.mark.s3
def test_reset_before_forwarding_leaves_the_object_absent(s3_fault_proxy: FaultTarget) -> None:
    target = s3_fault_proxy
    client = target.proxy.boto3_client(retries=False)
    rule = target.proxy.add_rule(FaultRule(RESET, method="PUT", times=1))
    with pytest.raises(CONNECTION_ERRORS):
        client.put_object(Bucket=target.bucket, Key="k", Body=b"v")
    assert stored(target, "k") is None
    assert rule.fired == 1
    assert target.proxy.requests[-1].fault is FaultKind.RESET
    assert target.proxy.requests[-1].status is None


@pytest.mark.fault
@pytest.mark.s3
def test_s3fs_needs_two_resets_to_fail_a_put(s3_fault_proxy: FaultTarget) -> None:
    """aiohttp resends an idempotent request once after a reset (see the module docstring)."""
    target = s3_fault_proxy
    fs = s3fs_through(target)
    once = target.proxy.add_rule(FaultRule(RESET, method="PUT", key="^once$", times=1))
    fs.pipe_file(f"{target.bucket}/once", b"1")
    assert (once.fired, stored(target, "once")) == (1, b"1")
    twice = target.proxy.add_rule(FaultRule(RESET, method="PUT", key="^twice$", times=2))
    with pytest.raises(CONNECTION_ERRORS):  # untranslated by s3fs
        fs.pipe_file(f"{target.bucket}/twice", b"2")
    assert (twice.fired, stored(target, "twice")) == (2, None)


@pytest.mark.fault
@pytest.mark.s3
def test_lost_reply_applies_the_write_but_the_client_gets_an_error(
    s3_fault_proxy: FaultTarget,
) -> None:
    target = s3_fault_proxy
    client = target.proxy.boto3_client(retries=False)
    target.proxy.add_rule(FaultRule(LOST_REPLY, method="PUT", key="^boto$", times=1))
    with pytest.raises(CONNECTION_ERRORS):
        client.put_object(Bucket=target.bucket, Key="boto", Body=b"applied")
    assert stored(target, "boto") == b"applied"

    # Through s3fs, aiohttp resends the conditional PUT, which finds its own object: 412.
    fs = s3fs_through(target)
    rule = target.proxy.add_rule(
        FaultRule(LOST_REPLY, method="PUT", header="If-None-Match", times=1)
    )
    with pytest.raises(FileExistsError):
        fs.pipe_file(f"{target.bucket}/claim", b"mine", mode="create")
    assert stored(target, "claim") == b"mine"
    assert rule.fired == 1
    puts = [(r.fault, r.status) for r in target.proxy.requests if r.key == "claim"]
    assert puts == [(FaultKind.LOST_REPLY, None), (None, 412)]


@pytest.mark.fault
@pytest.mark.s3
def test_truncated_body_is_an_error_not_short_data(s3_fault_proxy: FaultTarget) -> None:
    target = s3_fault_proxy
    data = os.urandom(10_000)
    direct_client(target).put_object(Bucket=target.bucket, Key="big", Body=data)
    client = target.proxy.boto3_client(retries=False)
    target.proxy.add_rule(FaultRule(Fault.truncate(), method="GET", times=1))
    with pytest.raises((*CONNECTION_ERRORS, botocore.exceptions.IncompleteReadError)):
        client.get_object(Bucket=target.bucket, Key="big")["Body"].read()

    fs = s3fs_through(target)
    rule = target.proxy.add_rule(FaultRule(Fault.truncate(keep=100), method="GET", times=1))
    with pytest.raises(Exception) as info:  # aiohttp's ClientPayloadError
        fs.cat_file(f"{target.bucket}/big")
    assert "payload" in repr(info.value).lower()
    assert rule.fired == 1
    assert fs.cat_file(f"{target.bucket}/big") == data  # rule spent: whole data again


@pytest.mark.fault
@pytest.mark.s3
def test_delay_holds_the_reply_after_applying(s3_fault_proxy: FaultTarget) -> None:
    target = s3_fault_proxy
    proxy = target.proxy
    client = proxy.boto3_client(retries=False)
    client.put_object(Bucket=target.bucket, Key="k", Body=b"v")
    proxy.add_rule(FaultRule(Fault.delay(0.4), method="GET", times=1))
    started = time.monotonic()
    assert client.get_object(Bucket=target.bucket, Key="k")["Body"].read() == b"v"
    assert time.monotonic() - started >= 0.4

    impatient = proxy.boto3_client(retries=False, read_timeout=0.2)
    proxy.add_rule(FaultRule(Fault.delay(1.0), method="PUT", times=1))
    with pytest.raises(botocore.exceptions.ReadTimeoutError):
        impatient.put_object(Bucket=target.bucket, Key="slow", Body=b"applied anyway")
    proxy.wait_seen(proxy.seen, timeout=10, answered=True)  # the delayed PUT is done
    assert proxy.requests[-1].fault is FaultKind.DELAY
    assert stored(target, "slow") == b"applied anyway"


# -- rules and counters -----------------------------------------------------------------------


@pytest.mark.fault
@pytest.mark.s3
def test_rules_match_method_key_header_query_after_and_times(
    s3_fault_proxy: FaultTarget,
) -> None:
    target = s3_fault_proxy
    proxy = target.proxy
    client = proxy.boto3_client(retries=False)
    b = target.bucket

    def put(key: str, conditional: bool = False) -> int:
        extra = {"IfNoneMatch": "*"} if conditional else {}
        try:
            client.put_object(Bucket=b, Key=key, Body=b"v", **extra)
            return 200
        except botocore.exceptions.ClientError as exc:
            return exc.response["ResponseMetadata"]["HTTPStatusCode"]

    claims = proxy.add_rule(
        FaultRule(
            INTERNAL_ERROR, method="put", key=r"^claims/", header="if-none-match", after=1, times=2
        )
    )
    assert put("claims/0", conditional=True) == 200  # `after`: the first goes through
    assert put("claims/1") == 200  # no If-None-Match
    assert put("other/1", conditional=True) == 200  # key does not match
    assert put("claims/2", conditional=True) == 500
    assert put("claims/3", conditional=True) == 500
    assert put("claims/4", conditional=True) == 200  # times spent
    assert client.get_object(Bucket=b, Key="claims/0")["Body"].read() == b"v"  # GET: no match
    assert (claims.seen, claims.fired, claims.exhausted) == (4, 2, True)

    listing = proxy.add_rule(FaultRule(SLOW_DOWN, method="GET", query=r"list-type=2", times=1))
    with pytest.raises(botocore.exceptions.ClientError) as info:
        client.list_objects_v2(Bucket=b, Prefix="claims/")
    assert info.value.response["Error"]["Code"] == "SlowDown"
    assert listing.fired == 1
    assert len(client.list_objects_v2(Bucket=b, Prefix="claims/")["Contents"]) == 3

    first, second = (
        proxy.add_rule(FaultRule(INTERNAL_ERROR, method="DELETE", times=1)),
        proxy.add_rule(FaultRule(SLOW_DOWN, method="DELETE", times=1)),
    )
    codes = []
    for _ in range(3):
        try:
            client.delete_object(Bucket=b, Key="claims/0")
            codes.append("ok")
        except botocore.exceptions.ClientError as exc:
            codes.append(exc.response["Error"]["Code"])
    assert codes == ["InternalError", "SlowDown", "ok"]  # first rule that fires wins
    assert (first.seen, second.seen) == (3, 2)

    proxy.clear()
    assert proxy.rules == []
    faults = proxy.faults
    assert [f.fault for f in faults] == [FaultKind.ERROR] * 5
    assert proxy.seen == len(proxy.requests)


@pytest.mark.fault
@pytest.mark.s3
def test_rate_is_reproducible_with_a_seed(s3_fault_proxy: FaultTarget) -> None:
    target = s3_fault_proxy
    proxy = target.proxy
    client = proxy.boto3_client(retries=False)
    client.put_object(Bucket=target.bucket, Key="k", Body=b"v")

    def run(seed: int) -> list[bool]:
        proxy.clear()
        rule = proxy.add_rule(FaultRule(INTERNAL_ERROR, method="HEAD", rate=0.3, seed=seed))
        failed = []
        for _ in range(40):
            try:
                client.head_object(Bucket=target.bucket, Key="k")
                failed.append(False)
            except botocore.exceptions.ClientError:
                failed.append(True)
        assert rule.fired == sum(failed) and rule.seen == 40
        return failed

    draws = random.Random(7)
    expected = [draws.random() < 0.3 for _ in range(40)]
    assert run(7) == expected
    assert run(7) == expected
    assert 0 < sum(expected) < 40
    assert run(8) != expected


def test_rule_arguments_are_checked() -> None:
    with pytest.raises(ValueError):
        FaultRule(RESET, rate=1.5)
    with pytest.raises(ValueError):
        FaultRule(RESET, times=-1)
    with pytest.raises(TypeError):
        FaultRule("reset")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Fault.error(200, "Fine")
    with pytest.raises(ValueError):
        S3FaultProxy("https://s3.amazonaws.com")
    assert FaultRule(RESET, method="get").matches("GET", "a/b", "", {})
    assert not FaultRule(RESET, key="^b").matches("GET", "a/b", "", {})


def _proxy_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("s3-fault-proxy")]


@pytest.mark.fault
@pytest.mark.s3
def test_stop_is_clean_and_bounded(s3_server: Any) -> None:
    s3_server.create_bucket(bucket := f"stop-{os.getpid()}-{time.monotonic_ns() % 10**9}")
    before = set(threading.enumerate())
    proxy = S3FaultProxy.for_server(s3_server).start()
    port = int(proxy.endpoint.rsplit(":", 1)[1])
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **proxy.storage_options)
    fs.pipe_file(f"{bucket}/k", b"v")  # leaves a pooled keep-alive connection open
    proxy.add_rule(FaultRule(Fault.delay(60), method="GET"))
    client = proxy.boto3_client(retries=False)
    outcome: list[BaseException] = []

    def slow_get() -> None:
        try:
            client.get_object(Bucket=bucket, Key="k")
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            outcome.append(exc)

    getter = threading.Thread(target=slow_get, daemon=True)
    getter.start()
    proxy.wait_seen(2, timeout=10)  # the PUT, then the GET now held by the delay
    started = time.monotonic()
    proxy.stop(timeout=5)
    assert time.monotonic() - started < 5
    getter.join(10)
    assert not getter.is_alive() and len(outcome) == 1
    assert isinstance(outcome[0], CONNECTION_ERRORS)
    leftover = [t for t in set(threading.enumerate()) - before if t.name.startswith("s3-fault")]
    assert leftover == []
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    proxy.stop()  # a second stop is a no-op
    assert not proxy.running


# -- oncelog through the proxy -----------------------------------------------------------------

FRAGMENT_KEY = r"/[0-9a-f]{16}-[0-9a-f]{16}-[0-9a-f]{40}\.(raw|gz|zst)$"


@pytest.mark.fault
@pytest.mark.s3
def test_append_survives_503_on_the_fragment_put(s3_fault_proxy: FaultTarget) -> None:
    target = s3_fault_proxy
    rule = target.proxy.add_rule(FaultRule(SLOW_DOWN, method="PUT", key=FRAGMENT_KEY, times=1))
    with target.open(retries=False) as client:
        assert client.fs.retries == 1  # s3fs's loop: one attempt
        client.create(JournalSpec("faults/a"))
        client.append("faults/a", b'{"a":1}\n')
        assert client.read("faults/a").read() == b'{"a":1}\n'
    assert rule.fired == 1
    fragment_puts = [
        (r.status, r.headers["amz-sdk-request"], r.headers["amz-sdk-invocation-id"])
        for r in target.proxy.requests
        if rule.matches(r.method, r.key, r.query, r.headers)
    ]
    # Two first attempts of two botocore calls (botocore numbers its own retries, attempt=2,
    # and keeps the invocation id): the retry was oncelog's appender's.
    assert [(status, attempt) for status, attempt, _ in fragment_puts] == [
        (503, "attempt=1"),
        (200, "attempt=1"),
    ]
    assert fragment_puts[0][2] != fragment_puts[1][2]
    with target.direct().open() as direct:
        assert direct.read("faults/a").read() == b'{"a":1}\n'


@pytest.mark.fault
@pytest.mark.s3
def test_append_survives_a_lost_claim_reply(s3_fault_proxy: FaultTarget) -> None:
    target = s3_fault_proxy
    rule = target.proxy.add_rule(
        FaultRule(
            LOST_REPLY, method="PUT", key=r"\.oncelog/claims/", header="If-None-Match", times=1
        )
    )
    with target.open(retries=False) as client:
        client.create(JournalSpec("faults/b"))
        result = client.append("faults/b", b"once\n")
        client.append("faults/b", b"twice\n")
        assert (result.begin, result.end) == (0, 5)
        assert client.read("faults/b").read() == b"once\ntwice\n"
    assert rule.fired == 1


# -- processes --------------------------------------------------------------------------------


def count_forever(interval: float) -> None:
    """Child: print 0, 1, 2, ... one line every `interval` seconds."""
    n = 0
    while True:
        print(n, flush=True)
        n += 1
        time.sleep(interval)


def exit_with(code: int) -> None:
    print("started", flush=True)
    sys.exit(code)


def fail_loudly() -> None:
    raise RuntimeError("child blew up on purpose")


def steps_with_crash_points(steps: int) -> None:
    for i in range(steps):
        print(f"step {i}", flush=True)
        crash_point("after-step")
    print("done", flush=True)


def block_forever() -> None:
    print("ready", flush=True)
    threading.Event().wait()


@pytest.mark.fault
def test_pause_stops_progress_and_resume_continues() -> None:
    with start_function(count_forever, (0.005,)) as child:
        first = int(child.readline(timeout=30))
        assert first == 0
        pause(child)
        written = child.drain()  # whatever it wrote before it stopped
        last = int(written[-1]) if written else first
        assert child.poll_line(timeout=0.5) is None  # stopped: no new line
        assert child.returncode is None
        resume(child)
        assert int(child.readline(timeout=10)) == last + 1  # continues where it stopped
        assert kill(child) == -signal.SIGKILL
        assert child.returncode == -signal.SIGKILL


@pytest.mark.fault
def test_exit_codes_and_stderr() -> None:
    with start_function(exit_with, (3,)) as child:
        assert child.expect("started", timeout=30) == b"started\n"
        assert child.wait(timeout=30) == 3
        assert child.readline(timeout=1) == b""  # end of output
    with start_function(exit_with, (0,)) as child:
        assert child.wait(timeout=30) == 0
    with start_function(fail_loudly) as child:
        assert child.wait(timeout=30) == 1
        assert "child blew up on purpose" in child.stderr_text()


@pytest.mark.fault
def test_crash_point_kills_at_the_named_step() -> None:
    with start_function(steps_with_crash_points, (5,), crash_at="after-step:3") as child:
        assert child.wait(timeout=30) == -signal.SIGKILL
        assert child.drain() == [b"step 0\n", b"step 1\n", b"step 2\n"]
    with start_function(steps_with_crash_points, (2,), crash_at="elsewhere") as child:
        assert child.wait(timeout=30) == 0
        assert child.drain()[-1] == b"done\n"
    crash_point("after-step")  # not armed in this process: a no-op


@pytest.mark.fault
def test_kill_at_random_is_seeded_and_kills() -> None:
    with start_function(block_forever) as child:
        child.expect("ready", timeout=30)
        pending = kill_at_random(child, seed=42, within=(0.05, 0.2))
        assert pending.delay == random.Random(42).uniform(0.05, 0.2)
        assert pending.wait(timeout=10) is True
        assert child.returncode == -signal.SIGKILL
    with start_function(block_forever) as child:
        child.expect("ready", timeout=30)
        pending = kill_at_random(child, seed=1, within=(30, 40))
        assert pending.cancel() is False
        assert child.returncode is None


@pytest.mark.fault
def test_waits_are_bounded_with_clear_errors() -> None:
    with start_function(block_forever) as child:
        child.expect("ready", timeout=30)
        with pytest.raises(ChildTimeout, match="still running"):
            child.wait(timeout=0.2)
        with pytest.raises(ChildTimeout, match="no line"):
            child.readline(timeout=0.2)
        with pytest.raises(ChildTimeout, match="'never'"):
            child.expect("never", timeout=0.2)
    assert child.returncode == -signal.SIGKILL  # leaving the block killed it


def test_start_function_refuses_what_a_child_cannot_import() -> None:
    def local() -> None:
        pass

    with pytest.raises(ValueError, match="not importable"):
        start_function(local)


@pytest.mark.fault
def test_start_script_with_arguments(tmp_path: Any) -> None:
    script = tmp_path / "echo_args.py"
    script.write_text("import sys\nprint(' '.join(sys.argv[1:]))\nsys.exit(len(sys.argv) - 1)\n")
    with start_script(script, "a", "b c") as child:
        assert child.readline(timeout=30) == b"a b c\n"
        assert child.wait(timeout=30) == 2


@pytest.mark.fault
def test_helpers_accept_plain_popen() -> None:
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pause(proc)
        resume(proc)
        assert kill(proc) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
