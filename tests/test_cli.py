"""The `oncelog` command line, run as the installed console script in subprocesses against a
local-disk store and the S3 test server."""

from __future__ import annotations

import base64
import os
import pty
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from importlib.metadata import version
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from journal_support import write_pipeline_output

from oncelog.cli.params import (
    format_duration,
    merge_storage_option,
    parse_duration,
    parse_label,
    parse_size,
    parse_storage_option,
)
from oncelog.framing import CONTENT_TYPE_JSON_LINES, encode_fixed_frame
from oncelog.journal import Fragment, JournalClient, JournalSpec
from oncelog.journal.fragment import content_sum
from oncelog.message import (
    Flags,
    build_uuid,
    clock_from_unix_ns,
    get_clock,
    new_producer_id,
)
from oncelog.reading import read_committed, read_uncommitted

_FOUND = shutil.which("oncelog", path=os.path.dirname(sys.executable))
assert _FOUND, f"the oncelog console script is not installed next to {sys.executable}"
ONCELOG: str = _FOUND
TIMEOUT = 60


def _flatten(options: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in options.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        elif isinstance(value, str):
            yield f"{prefix}{key}={value}"
        else:
            yield f"{prefix}{key}:={orjson.dumps(value).decode()}"


@dataclass
class Cli:
    """Runs the console script against one store (given by the environment)."""

    target: Any
    env: dict[str, str] = field(default_factory=dict)
    _client: JournalClient | None = None

    @property
    def client(self) -> JournalClient:
        """An in-process client of the same store, to set up and check what the CLI did."""
        if self._client is None:
            self._client = self.target.open()
        return self._client

    def run(
        self, *args: str, input: bytes | None = None, rc: int = 0
    ) -> subprocess.CompletedProcess[bytes]:
        proc = subprocess.run(
            [ONCELOG, *args],
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            env=self.env,
            timeout=TIMEOUT,
        )
        assert proc.returncode == rc, (args, proc.returncode, proc.stderr.decode())
        assert b"Traceback" not in proc.stderr, proc.stderr.decode()
        return proc

    def error(self, *args: str, rc: int = 1, input: bytes | None = None) -> str:
        """Run a failing command; returns its one error line (checked to be the only one)."""
        proc = self.run(*args, rc=rc, input=input)
        lines = proc.stderr.decode().splitlines()
        assert len(lines) == 1 and lines[0].startswith("oncelog: error: "), lines
        return lines[0]

    def json(self, *args: str) -> Any:
        return orjson.loads(self.run(*args).stdout)

    def json_lines(self, *args: str) -> list[Any]:
        return [orjson.loads(line) for line in self.run(*args).stdout.splitlines()]

    def popen(self, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [ONCELOG, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env,
        )


def _env(store: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ONCELOG_", "AWS_"))}
    env.update(ONCELOG_STORE=store, **extra)
    return env


@pytest.fixture
def cli(local_store: Any) -> Iterator[Cli]:
    """The CLI on a fresh local-disk store."""
    runner = Cli(local_store, _env(local_store.url))
    yield runner
    if runner._client is not None:
        runner._client.close()


@pytest.fixture
def s3_cli(s3_store: Any) -> Iterator[Cli]:
    """The CLI on a fresh prefix of the S3 test server; options in ONCELOG_STORAGE_OPTIONS.

    Each run there costs about a second (importing s3fs alone is half of it), so the S3
    tests are few and each covers several commands."""
    options = " ".join(_flatten(s3_store.storage_options))
    runner = Cli(s3_store, _env(s3_store.url, ONCELOG_STORAGE_OPTIONS=options))
    yield runner
    if runner._client is not None:
        runner._client.close()


_PRODUCER = bytes.fromhex("0137c0ffee01")
_CLOCK = clock_from_unix_ns(1_700_000_000 * 10**9)


def lines_of(n: int, start: int = 0) -> bytes:
    """JSON lines `n` to `n + start`, each with its UUID (one producer, the clock rising with
    `n`), so that `append` keeps them byte for byte and committed reads deliver them all."""
    return b"".join(
        orjson.dumps(
            {
                "uuid": str(build_uuid(_PRODUCER, _CLOCK + i, Flags.OUTSIDE_TXN)),
                "n": i,
                "pad": "x" * (i % 7),
            }
        )
        + b"\n"
        for i in range(start, start + n)
    )


# -- the commands, on both stores --------------------------------------------------------------


def test_version_and_help() -> None:
    out = subprocess.run([ONCELOG, "--version"], capture_output=True, check=True, timeout=TIMEOUT)
    assert out.stdout.decode().strip() == f"oncelog {version('oncelog')}"
    helped = subprocess.run([ONCELOG, "--help"], capture_output=True, check=True, timeout=TIMEOUT)
    for command in ("journals", "append", "read", "fragments", "gc", "head", "groups"):
        assert f"  {command} " in helped.stdout.decode()


def test_journal_lifecycle(cli: Cli) -> None:
    created = cli.run(
        "journals",
        "create",
        "logs/web/part-000",
        "--label",
        "app=web",
        "--label",
        "app.gazette.dev/tag=a",
        "--label",
        "app.gazette.dev/tag=b",
        "--compression",
        "zstd",
        "--fragment-length",
        "1MiB",
        "--flush-interval",
        "250ms",
        "--owner-role",
        "producer",
        "--owner-address",
        "10.0.0.1:8080",
        "--owner-description",
        "web tier",
    )
    assert created.stdout == b""
    assert created.stderr.decode() == (
        f"oncelog: created a new store in directory {os.path.abspath(cli.target.url)}\n"
        "oncelog: created journal logs/web/part-000 (application/x-ndjson)\n"
    )
    cli.run("journals", "create", "logs/db/part-000", "-t", "text/csv", "-l", "app=db")
    spec = cli.client.get("logs/web/part-000")
    assert spec.labels.to_dict() == {
        "app": "web",
        "app.gazette.dev/tag": ["a", "b"],
        "content-type": CONTENT_TYPE_JSON_LINES,
    }
    assert (spec.fragment.compression, spec.fragment.length, spec.fragment.flush_interval) == (
        "zstd",
        1 << 20,
        0.25,
    )
    assert spec.owner is not None and (
        spec.owner.role,
        spec.owner.address,
        spec.owner.description,
    ) == (
        "producer",
        "10.0.0.1:8080",
        "web tier",
    )

    listed = cli.json("journals", "list", "--format", "json")
    assert [d["name"] for d in listed] == ["logs/db/part-000", "logs/web/part-000"]
    assert listed[1] == {**spec.to_dict(), "head": 0, "fragments": 0}
    table = cli.run(
        "journals", "list", "--selector", "app in (web, db), name:prefix=logs/web/"
    ).stdout.decode()
    rows = table.splitlines()
    assert rows[0].split()[:3] == ["NAME", "CONTENT-TYPE", "COMPRESSION"]
    assert len(rows) == 2 and rows[1].split()[:3] == [
        "logs/web/part-000",
        CONTENT_TYPE_JSON_LINES,
        "zstd",
    ]

    data = lines_of(50)
    cli.run("append", "logs/web/part-000", input=data)
    described = cli.json("journals", "describe", "logs/web/part-000", "-f", "json")
    frags = cli.client.fragments("logs/web/part-000")
    assert described["head"] == len(data) == cli.client.head("logs/web/part-000")
    assert described["fragments"] == {
        "count": len(frags),
        "content_bytes": len(data),
        "stored_bytes": sum(f.size for f in frags),
    }
    assert described["labels"] == spec.labels.to_dict() and described["owner"]["role"] == "producer"
    text = cli.run("journals", "describe", "logs/web/part-000").stdout.decode()
    assert f"head:            {len(data)}" in text and "flush interval:  250ms" in text

    deleted = cli.run("journals", "delete", "logs/web/part-000", "--yes")
    assert deleted.stderr.decode() == "oncelog: deleted journal logs/web/part-000\n"
    assert not cli.client.exists("logs/web/part-000")
    assert [s.name for s in cli.client.list()] == ["logs/db/part-000"]


def test_append_read_head_fragments(cli: Cli, tmp_path: Any) -> None:
    cli.client.create(JournalSpec("events", {"content-type": CONTENT_TYPE_JSON_LINES}))
    first, second = lines_of(3000), lines_of(2000, start=3000)
    path = tmp_path / "input.jsonl"
    path.write_bytes(first)
    appended = cli.run("append", "events", str(path), "--chunk-size", "16k")
    # No progress noise on a non-terminal stderr: the summary line only.
    chunks = cli.client.fragments("events")
    assert appended.stderr.decode() == (
        f"oncelog: appended 3000 frames, {len(first)} bytes ({len(first) / 1024:.4g} KiB) "
        f"in {len(chunks)} appends at offsets 0-{len(first)} of journal events\n"
    )
    assert len(chunks) == -(-len(first) // (16 << 10))  # cut at frame boundaries near 16 KiB
    assert all(f.content_length <= 16 << 10 for f in chunks)
    cli.run("append", "events", input=second)  # stdin
    everything = first + second

    assert cli.run("read", "events").stdout == everything
    assert cli.run("head", "events").stdout == f"{len(everything)}\n".encode()
    assert cli.run("read", "events", "--offset", str(len(first))).stdout == second
    assert cli.run("read", "events", "--head").stdout == b""

    docs = cli.json_lines("read", "events", "--format", "json")
    expected = list(read_uncommitted(cli.client, "events"))
    assert [d["message"] for d in docs] == [e.message.doc for e in expected]
    assert [(d["begin"], d["end"]) for d in docs] == [(e.begin, e.end) for e in expected]
    assert {d["journal"] for d in docs} == {"events"} and {d["flags"] for d in docs} == {
        "OUTSIDE_TXN"
    }

    table = (
        cli.run("read", "events", "--format", "table", "--offset", str(len(first)))
        .stdout.decode()
        .splitlines()
    )
    assert table[0].split() == ["JOURNAL", "OFFSET", "TIME", "FLAGS", "MESSAGE"]
    assert len(table) == 2001 and table[1].split()[:2] == ["events", str(len(first))]

    frags = cli.json("fragments", "events", "-f", "json")
    assert [(f["begin"], f["end"]) for f in frags] == [
        (f.begin, f.end) for f in cli.client.fragments("events")
    ]
    assert frags[-1]["end"] == len(everything) and all(f["compression"] == "none" for f in frags)
    listing = cli.run("fragments", "events").stdout.decode().splitlines()
    assert len(listing) == len(frags) + 1 and listing[1].split()[-1] == frags[0]["path"]


def test_committed_read_matches_the_library(cli: Cli) -> None:
    client = cli.client
    client.create(JournalSpec("txn", {"content-type": CONTENT_TYPE_JSON_LINES}))
    write_pipeline_output(client, "txn")

    committed = list(read_committed(client, "txn"))
    docs = cli.json_lines("read", "txn", "--committed", "--format", "json")
    assert (
        [d["message"]["n"] for d in docs] == [e.message.doc["n"] for e in committed] == [1, 2, 3, 5]
    )
    for doc, env in zip(docs, committed, strict=True):
        assert (doc["begin"], doc["end"], doc["uuid"]) == (env.begin, env.end, str(env.uuid))
        assert doc["clock"] == get_clock(uuid.UUID(doc["uuid"])) and doc["time"].endswith("Z")
        assert doc["producer"] == env.producer.hex()
    journal = cli.run("read", "txn", "--raw").stdout
    raw = cli.run("read", "txn", "--committed").stdout
    assert raw == b"".join(journal[e.begin : e.end] for e in committed)
    assert cli.run("read", "txn").stdout == raw  # committed is the default

    uncommitted = cli.json_lines("read", "txn", "--uncommitted", "--format", "json")
    assert [(d["message"].get("n"), d["flags"]) for d in uncommitted] == [
        (e.message.doc.get("n"), Flags(e.flags).name) for e in read_uncommitted(client, "txn")
    ]
    assert {"ACK_TXN", "CONTINUE_TXN", "OUTSIDE_TXN"} <= {d["flags"] for d in uncommitted}


def test_read_selector_reads_each_journal_in_turn(cli: Cli) -> None:
    for name, app in (("b/two", "x"), ("a/one", "x"), ("c/other", "y")):
        cli.client.create(JournalSpec(name, {"app": app}))
    cli.client.append("a/one", lines_of(3))
    cli.client.append("b/two", lines_of(2, start=10))
    cli.client.append("c/other", lines_of(1, start=20))
    assert cli.run("read", "--selector", "app=x").stdout == lines_of(3) + lines_of(2, start=10)
    docs = cli.json_lines("read", "-l", "app=x", "--committed", "--format", "json")
    assert [(d["journal"], d["message"]["n"]) for d in docs] == [
        ("a/one", 0),
        ("a/one", 1),
        ("a/one", 2),
        ("b/two", 10),
        ("b/two", 11),
    ]
    nothing = cli.run("read", "--selector", "app=none")
    assert nothing.stdout == b""
    assert nothing.stderr.decode() == "oncelog: warning: no journals match selector 'app=none'\n"


# -- errors --------------------------------------------------------------------------------------


def test_bad_input_is_one_error_line(cli: Cli) -> None:
    cli.client.create(JournalSpec("good", {"content-type": CONTENT_TYPE_JSON_LINES}))
    cli.client.append("good", lines_of(2))
    assert cli.error("read", "nope").startswith("oncelog: error: journal 'nope' does not exist")
    assert cli.error("append", "nope", input=b"{}\n").startswith(
        "oncelog: error: journal 'nope' does not exist"
    )

    assert cli.error("journals", "create", "x", "--label", "app", rc=2) == (
        "oncelog: error: Invalid value for '--label' / '-l': invalid label 'app': "
        "expected NAME=VALUE (see 'oncelog journals create --help')"
    )
    assert "invalid journal name 'bad//name'" in cli.error(
        "journals", "create", "bad//name", rc=2
    )
    assert "no framing for content type 'text/nope'" in cli.error(
        "journals", "create", "x", "-t", "text/nope"
    )
    assert "journal 'good' already exists" in cli.error("journals", "create", "good")
    assert not cli.client.exists("x")

    assert cli.error("gc", "good", "--grace", "1x", rc=2) == (
        "oncelog: error: Invalid value for '--grace': invalid duration '1x': expected a number "
        "with a unit ms, s, m, h, d or w (e.g. 30s, 15m, 1h, 2d, 1h30m) (see 'oncelog gc --help')"
    )
    assert "bad label selector 'app in ('" in cli.error("journals", "list", "-l", "app in (", rc=2)
    assert "--offset and --head exclude each other" in cli.error(
        "read", "good", "--offset", "1", "--head", rc=2
    )
    assert cli.error("read", "good", "--offset", "999") == (
        f"oncelog: error: offset 999 is past the write head {cli.client.head('good')} "
        "of journal good"
    )

    head = cli.client.head("good")
    bad = b'{"n": 1}\nnot json\n'
    err = cli.error("append", "good", input=bad)
    assert err == (
        "oncelog: error: invalid application/x-ndjson input for journal good: line 2 of stdin: "
        "malformed JSON: invalid literal, expected 'null' at column 1; nothing was appended"
    )
    assert "line 2 of stdin: malformed JSON: unexpected end of data at column 5" in cli.error(
        "append", "good", input=b'{"n": 1}\n{"n"'
    )
    assert cli.client.head("good") == head

    refused = cli.error("journals", "delete", "good", rc=2)
    assert refused.startswith(
        "oncelog: error: refusing to delete journal good without confirmation: "
        "stdin is not a terminal; pass --yes"
    )
    assert cli.client.exists("good")


def test_errors_outside_a_store(tmp_path: Any) -> None:
    runner = Cli(None, _env(""))
    del runner.env["ONCELOG_STORE"]
    assert runner.error("journals", "list", rc=2) == (
        "oncelog: error: no store given: pass --store URL or set ONCELOG_STORE "
        "(see 'oncelog journals list --help')"
    )
    assert "invalid storage option 'nokey'" in runner.error(
        "-s", str(tmp_path), "-o", "nokey", "journals", "list", rc=2
    )
    assert "No such command 'frobnicate'" in runner.error("frobnicate", rc=2)
    # --debug adds the traceback, and the same one error line last.
    proc = subprocess.run(
        [ONCELOG, "--debug", "--store", str(tmp_path), "head", "nope"],
        capture_output=True,
        env=runner.env,
        timeout=TIMEOUT,
    )
    err = proc.stderr.decode().splitlines()
    assert (
        proc.returncode == 1
        and err[0].startswith("Traceback")
        and err[-1].startswith("oncelog: error: journal 'nope'")
    )


def test_append_stops_at_a_bad_frame_after_whole_chunks(cli: Cli) -> None:
    cli.client.create(JournalSpec("big", {"content-type": CONTENT_TYPE_JSON_LINES}))
    good = lines_of(70_000)  # > 1 MiB: read and checked in more than one block
    assert len(good) > 1 << 20
    err = cli.error("append", "big", "--chunk-size", "256k", input=good + b"oops\n" + lines_of(5))
    assert "line 70001 of stdin: malformed JSON" in err
    head = cli.client.head("big")
    assert 0 < head <= len(good)
    line = good[:head].count(b"\n") + 1
    assert f"appended only the records before line {line}: {head} bytes" in err
    assert cli.run("read", "big").stdout == good[:head]  # whole frames only
    assert len(list(read_uncommitted(cli.client, "big"))) == good[:head].count(b"\n")


def test_other_framings_raw_appends_and_skipping(cli: Cli) -> None:
    client = cli.client
    client.create(JournalSpec("csv", {"content-type": "text/csv"}))
    client.create(JournalSpec("proto", {"content-type": "application/x-protobuf-fixed"}))
    client.create(JournalSpec("lines", {"content-type": CONTENT_TYPE_JSON_LINES}))

    an_id = str(
        build_uuid(new_producer_id(), clock_from_unix_ns(time.time_ns()), Flags.OUTSIDE_TXN)
    )
    records = f'{an_id},"multi\nline",x\r\n,plain,y\n'.encode()
    cli.run("append", "csv", input=records)
    read = [d["message"] for d in cli.json_lines("read", "csv", "--format", "json")]
    assert read[0] == [an_id, "multi\nline", "x"]  # its UUID kept
    assert read[1][1:] == ["plain", "y"] and uuid.UUID(read[1][0]).version == 1  # one made
    records = f'{an_id},"multi\nline",x\r\n{read[1][0]},plain,y\n'.encode()  # as stored
    assert cli.json_lines("read", "csv", "--format", "json", "--committed")[0]["uuid"] == an_id
    assert "truncated CSV frame" in cli.error("append", "csv", input=b'a,"open\n')
    cli.run("append", "csv", "--raw", input=b"not-a-uuid,z\n")
    assert cli.error("read", "csv", "--format", "table") == (
        f"oncelog: error: journal csv: bad message at offset {len(records)}-{len(records) + 13}: "
        "CSV field 0: not a UUID: 'not-a-uuid'"
    )

    frames = encode_fixed_frame(b"\x08\x01") + encode_fixed_frame(b"payload")
    cli.run("append", "proto", input=frames)
    docs = cli.json_lines("read", "proto", "--format", "json")
    assert [base64.b64decode(d["message"]) for d in docs] == [b"\x08\x01", b"payload"]
    assert "fixed-frame desync" in cli.error("append", "proto", input=b"garbage" + frames)
    assert "cannot read journal proto committed" in cli.error("read", "proto", "--committed")

    cli.run("append", "lines", input=lines_of(1))
    raw = cli.run("append", "lines", "--raw", input=b"not json\n")
    start = len(lines_of(1))
    assert raw.stderr.decode() == (
        f"oncelog: appended 9 bytes in 1 append at offsets {start}-{start + 9} of journal lines\n"
    )
    cli.run("append", "lines", input=lines_of(1, start=1))
    assert cli.run("read", "lines", "--raw").stdout == (
        lines_of(1) + b"not json\n" + lines_of(1, start=1)
    )
    assert cli.error("read", "lines", "--format", "json").startswith(
        f"oncelog: error: journal lines: malformed JSON frame at offset {start}-{start + 9}: "
    )
    skipped = cli.run("read", "lines", "--format", "json", "--skip-errors")
    assert [orjson.loads(x)["message"]["n"] for x in skipped.stdout.splitlines()] == [0, 1]
    assert skipped.stderr.decode().startswith(
        "oncelog: warning: skipped: journal lines: "
        f"malformed JSON frame at offset {start}-{start + 9}"
    )


def test_gazette_fragment_store(cli: Cli) -> None:
    """Fragments with no oncelog spec, as a Gazette broker leaves them, read as a journal."""
    content = lines_of(4)
    fragment = Fragment("gazette/part-000", 0, len(content), content_sum(content))
    cli.client.store.write_fragment(fragment, content)
    assert cli.run("read", "gazette/part-000").stdout == content
    docs = cli.json_lines(
        "read", "gazette/part-000", "--format", "json", "--content-type", CONTENT_TYPE_JSON_LINES
    )
    assert [d["message"]["n"] for d in docs] == [0, 1, 2, 3]
    described = cli.json("journals", "describe", "gazette/part-000", "-f", "json")
    assert (described["labels"], described["head"]) == (None, len(content))
    assert described["fragments"]["count"] == 1


def test_read_into_a_closed_pipe_is_quiet(cli: Cli) -> None:
    cli.client.create(JournalSpec("many", {"content-type": CONTENT_TYPE_JSON_LINES}))
    cli.client.append("many", lines_of(30_000))  # far more than a pipe buffer
    for fmt in ("raw", "json"):
        proc = subprocess.run(
            [
                "bash",
                "-c",
                f'"$0" read many --committed --format {fmt} | head -1; '
                'echo "status=${PIPESTATUS[0]}" >&2',
                ONCELOG,
            ],
            capture_output=True,
            env=cli.env,
            timeout=TIMEOUT,
        )
        assert proc.stderr.decode() == "status=141\n"
        first = proc.stdout.splitlines()
        doc = orjson.loads(first[0]) if len(first) == 1 else None
        assert doc is not None and doc.get("message", doc) == orjson.loads(lines_of(1))


def test_gc_deletes_only_old_unclaimed_fragments(cli: Cli) -> None:
    client = cli.client
    client.create(JournalSpec("gcme", {"content-type": CONTENT_TYPE_JSON_LINES}))
    client.append("gcme", lines_of(5))
    head = client.head("gcme")
    stray_data = lines_of(2, start=100)
    stray = Fragment("gcme", head, head + len(stray_data), content_sum(stray_data))
    client.store.write_fragment(stray, stray_data)  # written but never claimed: a lost race
    old = time.time() - 3 * 3600
    os.utime(os.path.join(cli.target.url, stray.content_path), (old, old))
    kept = cli.run("gc", "gcme", "--grace", "1d")
    assert kept.stdout == b"" and kept.stderr.decode() == (
        "oncelog: gc: deleted nothing, from 1 journal\n"
    )
    collected = cli.run("gc", "gcme", "--grace", "1h")
    assert collected.stdout.decode() == f"{stray.content_path}\n"
    assert collected.stderr.decode() == (
        "oncelog: gc: deleted 1 unclaimed fragment (left by writers that lost a race or "
        f"crashed), {len(stray_data)} B in all, from 1 journal\n"
    )
    assert [f.content_name for f in client.store.list_fragments("gcme")] == [
        f.content_name for f in client.fragments("gcme")
    ]
    assert cli.run("read", "gcme").stdout == lines_of(5)


def test_s3_store(s3_cli: Cli) -> None:
    cli, client = s3_cli, s3_cli.client
    cli.run("journals", "create", "s3/a", "-l", "app=s3", "--compression", "gzip")
    client.append("s3/a", lines_of(3))
    cli.run("append", "s3/a", input=lines_of(2, start=3))
    stray_data = lines_of(1, start=9)
    head = client.head("s3/a")
    stray = Fragment("s3/a", head, head + len(stray_data), content_sum(stray_data))
    client.store.write_fragment(stray, stray_data)  # never claimed: not part of the journal
    frags = client.fragments("s3/a")
    opts = cli.target.storage_options
    from_env = Cli(
        cli.target,
        _env(  # options from ONCELOG_S3_* and the AWS variables
            cli.target.url,
            ONCELOG_S3_ENDPOINT=opts["client_kwargs"]["endpoint_url"],
            ONCELOG_S3_REGION=opts["client_kwargs"]["region_name"],
            AWS_ACCESS_KEY_ID=opts["key"],
            AWS_SECRET_ACCESS_KEY=opts["secret"],
        ),
    )

    # Each run costs about a second of imports: run the ones that only read side by side.
    with ThreadPoolExecutor(4) as pool:
        read = pool.submit(cli.run, "read", "s3/a")
        listed = pool.submit(cli.json, "journals", "list", "-l", "app=s3", "-f", "json")
        described = pool.submit(cli.json, "journals", "describe", "s3/a", "-f", "json")
        fragments = pool.submit(cli.json, "fragments", "s3/a", "-f", "json")
        unknown = pool.submit(cli.error, "head", "s3/nope")
        env_head = pool.submit(from_env.run, "head", "s3/a")
    assert read.result().stdout == lines_of(5)
    assert [d["name"] for d in listed.result()] == ["s3/a"]
    assert int(env_head.result().stdout) == described.result()["head"] == len(lines_of(5))
    assert described.result()["fragment"]["compression"] == "gzip"
    assert described.result()["fragments"]["stored_bytes"] == sum(f.size for f in frags) > 0
    assert [f["path"] for f in fragments.result()] == [f.content_path for f in frags]
    assert unknown.result().startswith("oncelog: error: journal 's3/nope' does not exist")

    assert cli.run("gc", "s3/a", "--grace", "0s").stdout.decode() == f"{stray.content_path}\n"
    assert len(client.store.list_fragments("s3/a")) == len(frags)
    # Options given after the command instead.
    flags = [arg for option in _flatten(opts) for arg in ("-o", option)]
    after = Cli(cli.target, _env(""))
    after.run("journals", "delete", "s3/a", "--yes", "--store", cli.target.url, *flags)
    assert not client.exists("s3/a") and client.store.list_fragments("s3/a") == []


def test_consumer_groups(cli: Cli) -> None:
    from oncelog.consumer import Consumer, group_status

    client = cli.client
    client.create(JournalSpec("in/a", {"content-type": CONTENT_TYPE_JSON_LINES}))
    client.append("in/a", lines_of(4))
    seen: list[Any] = []
    consumer = Consumer(
        client, "counter", ["in/a"], lambda env, txn: seen.append(env.message.doc["n"])
    )
    consumer.run(until_idle=True)
    consumer.close()
    assert seen == [0, 1, 2, 3]
    client.append("in/a", lines_of(1, start=4))
    behind = len(lines_of(1, start=4))

    assert cli.json("groups", "list", "-f", "json") == ["counter"]
    shown = cli.json("groups", "show", "counter", "-f", "json")
    status = group_status(client, "counter")
    assert (
        shown["lag"] == status.lag == behind
        and shown["members"][0]["checkpoint"] == status.members[0].checkpoint
    )
    assert shown["members"][0]["journals"] == [
        {"journal": "in/a", "offset": len(lines_of(4)), "head": client.head("in/a"), "lag": behind,
         "messages": 1}
    ]
    table = cli.run("groups", "show", "counter").stdout.decode().splitlines()
    assert table[:3] == ["group:  counter", "shards: 1", f"lag:    {behind} bytes, 1 message"]
    assert table[-1].split()[-5:] == [
        "in/a",
        str(len(lines_of(4))),
        str(client.head("in/a")),
        str(behind),
        "1",
    ]

    assert "refusing to reset group counter without confirmation" in cli.error(
        "groups", "reset", "counter", "--to", "head", rc=2
    )
    reset = cli.run("groups", "reset", "counter", "--to", "beginning", "--yes")
    after = group_status(client, "counter")
    assert reset.stderr.decode() == (
        "oncelog: reset consumer group counter to the beginning: "
        f"checkpoint {after.members[0].checkpoint}\n"
    )
    assert [(j.offset, j.lag) for j in after.members[0].journals] == [(0, client.head("in/a"))]
    assert cli.error("groups", "show", "nope").startswith(
        "oncelog: error: consumer group 'nope' does not exist"
    )


# -- following, terminals --------------------------------------------------------------------------


class _Lines:
    """Collects a process's stdout lines in a thread, for waits with a deadline."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def take(self, count: int, timeout: float = 30) -> list[bytes]:
        deadline = time.monotonic() + timeout
        got: list[bytes] = []
        while len(got) < count:
            got.append(self.lines.get(timeout=max(deadline - time.monotonic(), 0.01)))
        return got

    def interrupt(self) -> str:
        self.proc.send_signal(signal.SIGINT)
        assert self.proc.wait(timeout=TIMEOUT) == 130
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode()


@pytest.mark.parametrize("store", ["local", "s3"])
def test_follow_tails_all_matching_journals(store: str, request: pytest.FixtureRequest) -> None:
    cli = request.getfixturevalue("cli" if store == "local" else "s3_cli")
    client = cli.client
    client.create(JournalSpec("tail/a", {"app": "t"}))
    client.create(JournalSpec("tail/b", {"app": "t"}))
    client.append("tail/a", lines_of(1, start=0))
    proc = cli.popen(
        "read", "--selector", "app=t", "-f", "--committed", "--format", "json", "--refresh", "100ms"
    )
    out = _Lines(proc)
    try:
        assert orjson.loads(out.take(1)[0])["message"]["n"] == 0
        client.append("tail/b", lines_of(1, start=1))
        client.create(JournalSpec("tail/c", {"app": "t"}))  # picked up by the next refresh
        client.append("tail/c", lines_of(1, start=2))
        client.append("tail/a", lines_of(1, start=3))
        seen = [orjson.loads(line) for line in out.take(3)]
        assert sorted((d["journal"], d["message"]["n"]) for d in seen) == [
            ("tail/a", 3),
            ("tail/b", 1),
            ("tail/c", 2),
        ]
    finally:
        err = out.interrupt()
    assert err == ""


def test_follow_from_the_head_of_one_journal(cli: Cli) -> None:
    client = cli.client
    client.create(JournalSpec("live", {"content-type": CONTENT_TYPE_JSON_LINES}))
    client.append("live", b'{"old": true}\n')
    out = _Lines(cli.popen("read", "live", "--head", "--follow"))
    try:
        # The reader starts at the head some time after launch: append until it sees one.
        sent: list[bytes] = []
        deadline = time.monotonic() + 30
        first = None
        while first is None and time.monotonic() < deadline:
            sent.append(lines_of(1, start=len(sent)))
            client.append("live", sent[-1])
            try:
                first = out.lines.get(timeout=0.2)
            except queue.Empty:
                pass
        assert first is not None and first in sent
        client.append("live", b'{"last": true}\n')
        rest = sent[sent.index(first) + 1 :] + [b'{"last": true}\n']
        assert out.take(len(rest)) == rest
    finally:
        assert out.interrupt() == ""


def _run_on_terminal(
    cli: Cli, *args: str, stdin_text: bytes = b"", stderr_tty: bool = False
) -> tuple[int, bytes, bytes]:
    """Run with stdin (or stderr) on a pseudo-terminal; returns status, stdout, terminal output."""
    master, slave = pty.openpty()
    env = dict(cli.env, COLUMNS="120", LINES="40")
    proc = subprocess.Popen(
        [ONCELOG, *args],
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=slave if stderr_tty else subprocess.PIPE,
        env=env,
    )
    os.close(slave)
    if stdin_text:
        os.write(master, stdin_text)
    chunks = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    out, err = proc.communicate(timeout=TIMEOUT)
    reader.join(timeout=TIMEOUT)
    os.close(master)
    return proc.returncode, out, b"".join(chunks) + (err or b"")


def test_delete_asks_on_a_terminal(cli: Cli) -> None:
    client = cli.client
    client.create(JournalSpec("keep", {}))
    client.append("keep", lines_of(3))
    status, _, err = _run_on_terminal(cli, "journals", "delete", "keep", stdin_text=b"n\n")
    assert status == 1 and b"Delete journal keep and its 1 fragment (" in err
    assert b"oncelog: error: did not delete journal keep: not confirmed" in err
    assert client.exists("keep") and client.head("keep") == len(lines_of(3))
    status, _, err = _run_on_terminal(cli, "journals", "delete", "keep", stdin_text=b"y\n")
    assert status == 0 and b"oncelog: deleted journal keep" in err
    assert not client.exists("keep")


def test_progress_is_drawn_only_on_a_terminal(cli: Cli, tmp_path: Any) -> None:
    cli.client.create(JournalSpec("prog", {"content-type": CONTENT_TYPE_JSON_LINES}))
    path = tmp_path / "in.jsonl"
    path.write_bytes(lines_of(20_000))
    status, _, term = _run_on_terminal(cli, "append", "prog", str(path), stderr_tty=True)
    assert status == 0 and b"append prog" in term and b"\x1b[" in term  # a drawn, then cleared, bar
    status, out, term = _run_on_terminal(cli, "read", "prog", stderr_tty=True)
    assert status == 0 and out == path.read_bytes() and b"read prog" in term, term[-500:]


# -- value parsing (in process) -------------------------------------------------------------------


@settings(max_examples=100)
@given(st.integers(min_value=0, max_value=10**7), st.sampled_from(["ms", "s", "m", "h", "d", "w"]))
def test_durations_parse_and_format(amount: int, unit: str) -> None:
    seconds = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[unit] * amount
    parsed = parse_duration(f"{amount}{unit}")
    assert parsed == timedelta(seconds=seconds)
    assert parse_duration(format_duration(parsed.total_seconds())) == parsed


def test_value_parsers() -> None:
    assert parse_duration("1h30m") == timedelta(minutes=90)
    assert parse_duration("2.5") == timedelta(seconds=2.5)
    for bad in ("", "1x", "h", "1h 30m", "-1s", "1hh"):
        with pytest.raises(ValueError, match="invalid duration"):
            parse_duration(bad)
    assert [parse_size(s) for s in ("1024", "512k", "64MiB", "1GB", "2 M")] == [
        1024,
        512 << 10,
        64 << 20,
        10**9,
        2 << 20,
    ]
    for bad in ("0", "12 parsecs", "MiB", "-1k"):
        with pytest.raises(ValueError, match="invalid size"):
            parse_size(bad)
    assert parse_label("app.gazette.dev/tag=") == ("app.gazette.dev/tag", "")
    with pytest.raises(ValueError, match="invalid label value"):
        parse_label("app=a b")
    options: dict[str, Any] = {}
    for text in (
        "key=k",
        "client_kwargs.endpoint_url=http://h:1/",
        "anon:=false",
        'config_kwargs.retries:={"max": 2}',
    ):
        merge_storage_option(options, *parse_storage_option(text))
    assert options == {
        "key": "k",
        "client_kwargs": {"endpoint_url": "http://h:1/"},
        "anon": False,
        "config_kwargs": {"retries": {"max": 2}},
    }
    for bad in ("novalue", "a..b=1", "x:=not-json"):
        with pytest.raises(ValueError, match="invalid storage option"):
            parse_storage_option(bad)
    with pytest.raises(ValueError, match="not a mapping"):
        merge_storage_option(options, ["key", "inner"], "v")
