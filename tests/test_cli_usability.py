"""What a new user runs into: mistyped stores, appends that committed readers reject,
mid-frame offsets, following with limits, and the defaults the help states. The console
script runs in subprocesses; the library's side of the same rules is checked in process."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from oncelog.journal import (
    DEFAULT_FRAGMENT_LENGTH,
    InvalidStoreURL,
    JournalError,
    JournalNotFound,
    JournalSpec,
    StoreNotFound,
    open_journals,
)
from oncelog.message import Flags, build_uuid, clock_from_unix_ns
from oncelog.reading import read_committed

_FOUND = shutil.which("oncelog", path=os.path.dirname(sys.executable))
assert _FOUND, f"the oncelog console script is not installed next to {sys.executable}"
ONCELOG: str = _FOUND
TIMEOUT = 60
ROOT = Path(__file__).resolve().parent.parent


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ONCELOG_", "AWS_"))}
    env.update(extra)
    return env


def run(
    *args: str, input: bytes | None = None, rc: int = 0, cwd: Path | None = None, **env: str
) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run(
        [ONCELOG, *args],
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
        capture_output=True,
        env=_env(**env),
        cwd=cwd,
        timeout=TIMEOUT,
    )
    assert proc.returncode == rc, (args, proc.returncode, proc.stderr.decode())
    assert b"Traceback" not in proc.stderr, proc.stderr.decode()
    return proc


def error(*args: str, rc: int = 1, input: bytes | None = None, **kw: Any) -> str:
    """The one `oncelog: error: ...` line of a failing command."""
    lines = run(*args, rc=rc, input=input, **kw).stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("oncelog: error: "), lines
    return lines[0]


def uuid_line(clock: int, **doc: Any) -> bytes:
    u = build_uuid(bytes.fromhex("0137c0ffee01"), clock, Flags.OUTSIDE_TXN)
    return orjson.dumps({"uuid": str(u), **doc}) + b"\n"


@pytest.fixture
def store(tmp_path: Path) -> str:
    """A store directory with journals `j` (JSON lines) and `c` (CSV)."""
    url = str(tmp_path / "store")
    with open_journals(url) as client:
        client.create(JournalSpec("j", {"content-type": "application/x-ndjson"}))
        client.create(JournalSpec("c", {"content-type": "text/csv"}))
    return url


# -- 1. stores that do not exist, or are not stores ---------------------------------------------


def test_a_missing_or_mistyped_store_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "does-not-exist"
    err = error("-s", str(missing), "journals", "list")
    assert f"the store directory '{missing}' does not exist" in err
    assert "oncelog journals create" in err
    assert "does not exist" in error("-s", str(missing), "read", "x")
    assert not missing.exists()

    regular = tmp_path / "some-regular-file"
    regular.write_text("hello")
    assert "is not a directory" in error("-s", str(regular), "journals", "list")

    err = error("-s", "s3:/bucket", "journals", "create", "typo/j", rc=2, cwd=tmp_path)
    assert "invalid store URL 's3:/bucket'" in err and "did you mean s3://bucket?" in err
    assert not (tmp_path / "s3:").exists()
    assert "did you mean s3://bucket?" in error("-s", "s3:bucket", "journals", "list", rc=2)
    assert "did you mean file:///x?" in error("-s", "file:/x", "journals", "list", rc=2)
    assert "fsspec knows no scheme 'nope'" in error("-s", "nope://x", "journals", "list", rc=2)


def test_journals_create_makes_a_new_store_and_says_so(tmp_path: Path) -> None:
    new = tmp_path / "new-store"
    created = run("-s", str(new), "journals", "create", "a/b")
    assert created.stderr.decode() == (
        f"oncelog: created a new store in directory {new}\n"
        "oncelog: created journal a/b (application/x-ndjson)\n"
    )
    again = run("-s", str(new), "journals", "create", "a/c")
    assert "new store" not in again.stderr.decode()
    listed = orjson.loads(run("-s", str(new), "journals", "list", "--format", "json").stdout)
    assert [d["name"] for d in listed] == ["a/b", "a/c"]


def test_open_journals_store_rules(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    client = open_journals(str(missing))
    with pytest.raises(StoreNotFound, match="does not exist"):
        client.list()
    with pytest.raises(StoreNotFound):
        client.get("a")
    with pytest.raises(JournalNotFound):  # a StoreNotFound is a JournalNotFound too
        client.head("a")
    assert issubclass(StoreNotFound, JournalError)
    assert not missing.exists()
    client.create(JournalSpec("a"))  # creating a journal makes the store
    assert [s.name for s in client.list()] == ["a"]
    client.close()

    made = tmp_path / "made"
    with open_journals(str(made), create=True) as client:
        assert made.is_dir() and client.list() == []

    regular = tmp_path / "file"
    regular.write_bytes(b"x")
    with pytest.raises(StoreNotFound, match="not a directory"):
        open_journals(str(regular))
    for url in ("s3:/bucket", "s3:bucket", "file:/x", "memory:x", "nope://x", "s3://", "s3:///b"):
        with pytest.raises(InvalidStoreURL):
            open_journals(url)
    assert issubclass(InvalidStoreURL, ValueError)
    with open_journals(str(tmp_path / "a:b")) as client:  # a path, not a URL
        assert client.root.endswith("a:b")
    with open_journals("memory://usability-fresh") as client:
        assert client.list() == []  # memory:// stores always exist


def test_a_missing_bucket_is_named(s3_server: Any) -> None:
    client = open_journals("s3://no-such-bucket-here/prefix", **s3_server.storage_options)
    with pytest.raises(StoreNotFound, match="S3 bucket 'no-such-bucket-here' does not exist"):
        client.list()
    with pytest.raises(StoreNotFound, match="no-such-bucket-here"):
        client.get("a")
    with pytest.raises(StoreNotFound, match="no-such-bucket-here"):
        client.create(JournalSpec("a"))
    client.close()


def test_missing_credentials_say_what_is_read(tmp_path: Path) -> None:
    started = time.monotonic()
    err = error(
        "-s",
        "s3://bucket/prefix",
        "-o",
        "endpoint_url=http://127.0.0.1:9",
        "journals",
        "list",
        HOME=str(tmp_path),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
    )
    assert "no usable S3 credentials" in err
    assert "AWS_ACCESS_KEY_ID" in err and "AWS_PROFILE" in err and "-o key=" in err
    assert time.monotonic() - started < 20  # not retried as if the store were down


def test_an_invalid_journal_name_is_a_usage_error(store: str) -> None:
    assert "invalid journal name 'bad//name'" in error(
        "-s", store, "journals", "create", "bad//name", rc=2
    )
    assert "journal name '/abs' starts with '/'" in error("-s", store, "read", "/abs", rc=2)


# -- 2. append publishes committed messages --------------------------------------------------


def test_append_rejects_a_bad_uuid_naming_the_line(store: str) -> None:
    bad = b'{"a": 0}\n{"uuid": "not-a-uuid", "a": 1}\n'
    err = error("-s", store, "append", "j", input=bad)
    assert err == (
        "oncelog: error: invalid application/x-ndjson input for journal j: line 2 of stdin: "
        "field 'uuid' is not a UUID: 'not-a-uuid' (leave it out or empty to have one made); "
        "nothing was appended"
    )
    random_v4 = orjson.dumps({"uuid": str(uuid.uuid4())}) + b"\n"
    assert "not a version-1 UUID" in error("-s", store, "append", "j", input=random_v4)
    assert run("-s", store, "head", "j").stdout == b"0\n"


def test_append_stamps_uuids_so_committed_reads_see_every_record(store: str) -> None:
    given = uuid_line(clock_from_unix_ns(1_700_000_000 * 10**9), a=0)
    data = given + b'{"a": 1}\n{"uuid": "", "a": 2}\n{"uuid": null, "a": 3}\n'
    appended = run("-s", store, "append", "j", input=data)
    assert "(3 given new UUIDs)" in appended.stderr.decode()
    stored = run("-s", store, "read", "j").stdout
    assert stored.startswith(given)  # a record with a UUID is kept byte for byte
    committed = [orjson.loads(x) for x in run("-s", store, "read", "j", "-c").stdout.splitlines()]
    assert [d["a"] for d in committed] == [0, 1, 2, 3]
    assert all(uuid.UUID(d["uuid"]).version == 1 for d in committed)
    with open_journals(store) as client:
        assert [e.message.doc["a"] for e in read_committed(client, "j")] == [0, 1, 2, 3]


def test_append_raw_keeps_the_bytes(store: str) -> None:
    data = b'{"uuid":"not-a-uuid","a":1}\n'
    run("-s", store, "append", "j", "--raw", input=data)
    assert run("-s", store, "read", "j", "--raw").stdout == data
    assert "--raw appends the input as it is" in error(
        "-s", store, "append", "j", "--raw", "--idempotency-key", "k", input=data, rc=2
    )


def test_csv_header_and_uuid_column(store: str) -> None:
    table = b"name,age\nann,3\nbob,4\n"
    err = error("-s", store, "append", "c", input=table)
    assert "line 1 of stdin: the first field 'name' is not a UUID" in err
    assert "pass --header" in err and "--add-uuid-column" in err
    done = run("-s", store, "append", "c", "--header", "--add-uuid-column", input=table)
    assert "line 1 of stdin is a CSV header: not appended" in done.stderr.decode()
    run("-s", store, "append", "c", input=b"uuid,name,age\n,cy,5\n")  # detected header
    rows = [
        orjson.loads(x)
        for x in run("-s", store, "read", "c", "-c", "--format", "json").stdout.splitlines()
    ]
    # The header's names, recorded by the first append, key the records.
    assert [(d["message"]["name"], d["message"]["age"]) for d in rows] == [
        ("ann", "3"), ("bob", "4"), ("cy", "5")
    ]
    assert "--header and --add-uuid-column apply to CSV journals" in error(
        "-s", store, "append", "j", "--header", input=b"{}\n", rc=2
    )


def test_idempotency_key_makes_a_retry_a_no_op(store: str) -> None:
    data = b"".join(orjson.dumps({"n": n}) + b"\n" for n in range(4))
    # A first run that died after the first two records, then two full runs.
    run(
        "-s",
        store,
        "append",
        "j",
        "--idempotency-key",
        "batch-1",
        input=data[: data.index(b'{"n":2')],
    )
    run("-s", store, "append", "j", "--idempotency-key", "batch-1", input=data)
    run("-s", store, "append", "j", "--idempotency-key", "batch-1", input=data)
    run("-s", store, "append", "j", "--idempotency-key", "batch-2", input=b'{"n": 4}\n')
    uncommitted = run("-s", store, "read", "j", "--uncommitted").stdout.splitlines()
    assert len(uncommitted) == 2 + 4 + 4 + 1
    committed = [
        orjson.loads(x)["n"] for x in run("-s", store, "read", "j", "-c").stdout.splitlines()
    ]
    assert committed == [0, 1, 2, 3, 4]
    # Without a key, a second run is a second copy.
    run("-s", store, "append", "j", input=b'{"n": 5}\n')
    run("-s", store, "append", "j", input=b'{"n": 5}\n')
    committed = [
        orjson.loads(x)["n"] for x in run("-s", store, "read", "j", "-c").stdout.splitlines()
    ]
    assert committed == [0, 1, 2, 3, 4, 5, 5]


# -- 3. the default fragment length --------------------------------------------------------


def test_the_stated_default_fragment_length_is_the_real_one() -> None:
    assert DEFAULT_FRAGMENT_LENGTH == 16 << 20
    helped = run("journals", "create", "--help").stdout.decode()
    assert "[default: 16MiB]" in " ".join(helped.split())
    cli_md = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert "`--fragment-length SIZE` (default 16MiB)" in cli_md
    assert "64MiB]" not in helped


# -- 4. offsets inside frames, conflicting content types ------------------------------------


def test_a_mid_frame_offset_is_an_error(store: str) -> None:
    data = uuid_line(clock_from_unix_ns(10**18), n=0) + uuid_line(
        clock_from_unix_ns(10**18) + 1, n=1
    )
    run("-s", store, "append", "j", input=data)
    first = data.index(b"\n") + 1
    for fmt in ("raw", "json"):
        assert error("-s", store, "read", "j", "--offset", "50", "--format", fmt) == (
            "oncelog: error: offset 50 of journal j is inside a frame, not at its start: start "
            "at a frame boundary (a 'begin' printed by --format json, or the head)"
        )
    assert run("-s", store, "read", "j", "--offset", str(first)).stdout == data[first:]
    err = error("-s", store, "read", "j", "--content-type", "text/csv", rc=2)
    assert (
        "--content-type text/csv contradicts journal j's content type application/x-ndjson" in err
    )
    assert run("-s", store, "read", "j", "--content-type", "application/x-ndjson").stdout == data


# -- 5. JSON lines input: blank lines, a missing final newline, line numbers ------------------


def test_json_lines_input_is_forgiving_and_errors_name_lines(store: str) -> None:
    run("-s", store, "append", "j", input=b'{"a": 1}\n\n   \n{"a": 2}')
    docs = [orjson.loads(x) for x in run("-s", store, "read", "j", "-c").stdout.splitlines()]
    assert [d["a"] for d in docs] == [1, 2]
    err = error("-s", store, "append", "j", input=b'{"a": 1}\n\n{"a" 2}\n')
    assert "line 3 of stdin: malformed JSON: " in err and "at column 6" in err
    assert "line 1 column 1" not in err and "at byte" not in err
    assert "line 2 of stdin: a JSON record must be an object, not list" in error(
        "-s", store, "append", "j", input=b"{}\n[1]\n"
    )


# -- 6. following with limits ----------------------------------------------------------------


def test_follow_max_messages_and_timeout(store: str) -> None:
    run("-s", store, "append", "j", input=b"".join(b'{"n": %d}\n' % n for n in range(5)))
    two = run("-s", store, "read", "j", "-n", "2").stdout.splitlines()
    assert [orjson.loads(x)["n"] for x in two] == [0, 1]
    assert len(run("-s", store, "read", "j", "-f", "--max-messages", "3").stdout.splitlines()) == 3
    started = time.monotonic()
    followed = run("-s", store, "read", "j", "-f", "--timeout", "1s", "--format", "json")
    assert 1 <= time.monotonic() - started < 30
    assert [orjson.loads(x)["message"]["n"] for x in followed.stdout.splitlines()] == [
        0,
        1,
        2,
        3,
        4,
    ]
    tailed = run("-s", store, "read", "-l", "name=j", "-f", "--timeout", "500ms", "-n", "10")
    assert len(tailed.stdout.splitlines()) == 5
    assert "--timeout ends a --follow" in error("-s", store, "read", "j", "--timeout", "1s", rc=2)


# -- 8. heads and fragment counts in listings; JSON output -----------------------------------


def test_journals_list_shows_heads_and_fragments(store: str) -> None:
    data = b'{"n": 1}\n'
    run("-s", store, "append", "j", "--raw", input=data)
    run("-s", store, "append", "j", "--raw", input=data)
    rows = run("-s", store, "journals", "list").stdout.decode().splitlines()
    assert rows[0].split()[:6] == [
        "NAME",
        "CONTENT-TYPE",
        "COMPRESSION",
        "FRAGMENT",
        "HEAD",
        "FRAGMENTS",
    ]
    assert re.split(r"\s{2,}", rows[2])[4:6] == [str(2 * len(data)), "2"]
    docs = orjson.loads(run("-s", store, "journals", "list", "--format", "json").stdout)
    assert [(d["name"], d["head"], d["fragments"]) for d in docs] == [("c", 0, 0), ("j", 18, 2)]
    assert orjson.loads(run("-s", store, "head", "j", "--format", "json").stdout) == {
        "journal": "j",
        "head": 18,
    }
