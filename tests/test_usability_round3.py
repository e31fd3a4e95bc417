"""Usability round three, part B, run the way a user meets each problem: an `oncelog append`
stopped by Ctrl-C says what it stored and how to append the rest exactly once; an S3
endpoint nothing listens on fails in seconds, naming it, instead of 30 s of silence; a
store that keeps failing is reported once while it is retried; errors name a store by its
path or URL."""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from oncelog.journal import JournalSpec, open_journals
from oncelog.journal._retry import WARN_AFTER, retry, tag_endpoint
from oncelog.reading import read_committed

BIN = os.path.dirname(sys.executable)
ONCELOG = os.path.join(BIN, "oncelog")
TIMEOUT = 120


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ONCELOG_", "AWS_"))}
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    env.update(extra)
    return env


def _free_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


# -- item 4: Ctrl-C in the middle of `oncelog append FILE` ------------------------------------


def test_interrupted_append_says_what_it_stored_and_how_to_finish_exactly_once(
    tmp_path: Path,
) -> None:
    store = str(tmp_path / "store")
    with open_journals(store, create=True) as client:
        client.create(JournalSpec("j", {"content-type": "application/x-ndjson"}))
    n = 172_000
    (tmp_path / "in.jsonl").write_bytes(
        b"".join(orjson.dumps({"n": i, "pad": "x" * 80}) + b"\n" for i in range(n))
    )
    proc = subprocess.Popen(
        [ONCELOG, "append", "j", "in.jsonl", "--store", store, "--chunk-size", "16KiB"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        cwd=tmp_path, env=_env(),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # Ctrl-C as at a shell
    )
    try:
        with open_journals(store) as watcher:
            deadline = time.monotonic() + 60
            while watcher.head("j") == 0:  # bounded polling: until the first append lands
                assert proc.poll() is None, "the append ended before anything was seen"
                assert time.monotonic() < deadline, "nothing appended within 60 s"
                time.sleep(0.002)
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=TIMEOUT)[1].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    stored = re.search(
        r"interrupted: appended (\d+) records, (\d+) bytes .* at offsets 0-(\d+) of journal j: "
        r"the records of lines 1-(\d+) of in\.jsonl", err,
    )
    assert stored, err
    records, size, end, last_line = map(int, stored.groups())
    assert 0 < records < n and records == last_line and size == end
    with open_journals(store) as client:  # what it says is what is stored
        assert client.head("j") == end
        assert len(list(read_committed(client, "j"))) == records
    command = re.search(r"to append the rest without duplicates, run: (.*)", err)
    assert command, err
    assert command.group(1) == (
        f"tail -n +{records + 1} in.jsonl | oncelog append j - --store {store}"
    )
    subprocess.run(["bash", "-c", command.group(1)], cwd=tmp_path, env=_env(), check=True,
                   capture_output=True, timeout=TIMEOUT)
    with open_journals(store) as client:
        got = [env.message.doc["n"] for env in read_committed(client, "j")]
    assert got == list(range(n))  # every record, exactly once, in order


# -- item 5: an S3 endpoint nothing listens on ------------------------------------------------


def test_a_refused_s3_endpoint_fails_in_seconds_naming_it(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{_free_port()}"
    started = time.monotonic()
    proc = subprocess.run(
        [ONCELOG, "journals", "list", "-s", "s3://bucket"],
        stdin=subprocess.DEVNULL, capture_output=True, timeout=TIMEOUT, cwd=tmp_path,
        env=_env(ONCELOG_S3_ENDPOINT=endpoint, AWS_ACCESS_KEY_ID="a", AWS_SECRET_ACCESS_KEY="b"),
    )
    took = time.monotonic() - started
    err = proc.stderr.decode()
    assert proc.returncode == 1, err
    assert took < 15, f"took {took:.1f} s: the whole retry budget (30 s) for a refused port"
    assert f"the store at {endpoint} refused" in err and "is anything listening there?" in err
    assert "oncelog: error: " in err and "Traceback" not in err
    assert err.count("is refusing connections") <= 1  # warned at most once


def test_a_store_retried_for_seconds_is_reported_once_naming_its_endpoint(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A library call failing transiently for longer than WARN_AFTER logs one warning
    naming the endpoint and until when it is retried, then succeeds as before."""
    start = time.monotonic()
    attempts = []

    def op() -> str:
        attempts.append(time.monotonic())
        if sum(t - start >= WARN_AFTER for t in attempts) < 3:  # two failures past WARN_AFTER
            exc = OSError("503 Service Unavailable")
            tag_endpoint(exc, "http://s3.example:9000")
            raise exc
        return "answer"

    def give_up(exc: Exception) -> None:
        raise AssertionError(f"gave up: {exc!r}")

    with caplog.at_level(logging.WARNING, logger="oncelog.journal"):
        assert retry(op, 20.0, give_up) == "answer"  # type: ignore[arg-type]
    warnings = [r.getMessage() for r in caplog.records if r.name == "oncelog.journal"]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("the store at http://s3.example:9000 is not answering; "
                                  "retrying until ")
    assert len(attempts) > 3


def test_a_store_failing_to_the_deadline_names_its_endpoint_in_the_error() -> None:
    def op() -> None:
        exc = OSError("503 Service Unavailable")
        tag_endpoint(exc, "http://s3.example:9000")
        raise exc

    class GaveUp(Exception):
        pass

    def give_up(exc: Exception) -> None:
        raise GaveUp(f"could not: {exc!r}") from exc

    with pytest.raises(GaveUp, match=r"the store at http://s3\.example:9000: OSError"):
        retry(op, 0.2, give_up)  # type: ignore[arg-type]


# -- item 6: errors name a store by its path or URL -------------------------------------------


def test_errors_name_the_store_by_its_path(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    with open_journals(store, create=True) as client:
        client.create(JournalSpec("a"))
    for args, text in (
        (["journals", "describe", "nope"], f"journal 'nope' does not exist in store {store}"),
        (["journals", "create", "a"], f"journal 'a' already exists in store {store}"),
    ):
        proc = subprocess.run([ONCELOG, *args, "-s", store], capture_output=True,
                              stdin=subprocess.DEVNULL, env=_env(), timeout=TIMEOUT)
        err = proc.stderr.decode()
        assert proc.returncode != 0 and text in err, err
        assert "JournalClient(" not in err and "local:" not in err, err


def test_a_client_repr_is_its_path_or_url(tmp_path: Path) -> None:
    with open_journals(str(tmp_path)) as local:
        assert repr(local) == f"JournalClient({str(tmp_path)!r})"
    memory = open_journals("memory://round3/x")
    try:
        assert repr(memory) == "JournalClient('memory:///round3/x')"
    finally:
        memory.close()
    with pytest.raises(Exception, match=f"the client of store {re.escape(str(tmp_path))} is"):
        local.head("a")
