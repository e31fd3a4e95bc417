"""CLI usability, round three: `read` is read-committed by default for framed journals,
errors name the offset asked for, counts are pluralised, `gc` says what it deletes, `groups
lag` / `groups status`, `journals create --retention --compact-after`, shell completion.

Every check runs the installed console script in a subprocess, as a user would."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from journal_support import write_pipeline_output

from oncelog.framing import CONTENT_TYPE_JSON_LINES, encode_fixed_frame
from oncelog.journal import Fragment, JournalClient, JournalSpec, open_journals
from oncelog.journal.fragment import content_sum
from oncelog.message import Flags, build_uuid, clock_from_unix_ns
from oncelog.reading import read_committed, read_uncommitted

_FOUND = shutil.which("oncelog", path=os.path.dirname(sys.executable))
assert _FOUND, f"the oncelog console script is not installed next to {sys.executable}"
ONCELOG: str = _FOUND
TIMEOUT = 60
ROOT = Path(__file__).resolve().parent.parent
NDJSON = {"content-type": CONTENT_TYPE_JSON_LINES}


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("ONCELOG_", "AWS_", "_ONCELOG"))
    }
    env.update(extra)
    return env


class Cli:
    """The console script against one local-disk store."""

    def __init__(self, store: str) -> None:
        self.store = store
        self.client: JournalClient = open_journals(store)

    def run(
        self, *args: str, rc: int = 0, input: bytes | None = None, **env: str
    ) -> subprocess.CompletedProcess[bytes]:
        proc = subprocess.run(
            [ONCELOG, *args],
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            env=_env(ONCELOG_STORE=self.store, **env),
            timeout=TIMEOUT,
        )
        assert proc.returncode == rc, (args, proc.returncode, proc.stderr.decode())
        assert b"Traceback" not in proc.stderr, proc.stderr.decode()
        return proc

    def out(self, *args: str) -> bytes:
        return self.run(*args).stdout

    def error(self, *args: str, rc: int = 1) -> str:
        """The one `oncelog: error: ...` line of a failing command."""
        lines = self.run(*args, rc=rc).stderr.decode().splitlines()
        assert len(lines) == 1 and lines[0].startswith("oncelog: error: "), lines
        return lines[0]

    def json_lines(self, *args: str) -> list[Any]:
        return [orjson.loads(line) for line in self.out(*args).splitlines()]


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    runner = Cli(str(tmp_path / "store"))
    yield runner
    runner.client.close()


def _pipeline_output(client: JournalClient, name: str) -> None:
    """A journal as a pipeline leaves it: committed messages, a committed transaction (with
    its ACK), a rolled-back one (pending messages plus a rollback ACK)."""
    client.create(JournalSpec(name, NDJSON))
    write_pipeline_output(client, name)


def _journal_bytes(client: JournalClient, name: str) -> bytes:
    reader = client.read(name)
    try:
        return reader.read()
    finally:
        reader.close()


# -- item 3: read is committed by default --------------------------------------------------------


def test_read_prints_committed_messages_by_default(cli: Cli) -> None:
    _pipeline_output(cli.client, "out")
    stored = _journal_bytes(cli.client, "out")
    committed = list(read_committed(cli.client, "out"))
    every = list(read_uncommitted(cli.client, "out"))
    assert len(every) > len(committed) == 4  # ACKs and the rolled-back message

    # The default: the committed messages' frames, as stored; -c says the same.
    default = cli.out("read", "out")
    assert default == b"".join(stored[e.begin : e.end] for e in committed)
    assert cli.out("read", "out", "-c") == cli.out("read", "out", "--committed") == default
    assert b"ACK_TXN" not in default and [orjson.loads(x)["n"] for x in default.splitlines()] == [
        1,
        2,
        3,
        5,
    ]
    docs = cli.json_lines("read", "out", "--format", "json")
    assert [(d["begin"], d["message"]["n"]) for d in docs] == [
        (e.begin, e.message.doc["n"]) for e in committed
    ]

    # --uncommitted: every message, ACKs included; --raw: the journal's bytes as stored.
    assert cli.out("read", "out", "--uncommitted") == stored
    assert cli.out("read", "out", "--raw") == stored
    flags = [
        d["flags"]
        for d in cli.json_lines(
            "read", "out", "--uncommitted", "-f", "--timeout", "300ms", "--format", "json"
        )
    ]
    assert flags == [Flags(e.flags).name for e in every] and "ACK_TXN" in flags
    assert "--committed and --uncommitted exclude each other" in cli.error(
        "read", "out", "-c", "--uncommitted", rc=2
    )
    assert "--raw prints the journal's bytes" in cli.error(
        "read", "out", "--raw", "--format", "json", rc=2
    )
    assert "--raw prints the journal's bytes" in cli.error("read", "out", "--raw", "-c", rc=2)

    # The other read options with the new default.
    assert [orjson.loads(x)["n"] for x in cli.out("read", "out", "-n", "3").splitlines()] == [
        1,
        2,
        3,
    ]
    third = committed[2]
    assert cli.out("read", "out", "--offset", str(third.begin)) == b"".join(
        stored[e.begin : e.end] for e in committed[2:]
    )
    assert cli.out("read", "out", "--head") == b""
    followed = cli.out("read", "out", "-f", "--timeout", "300ms")
    assert followed == default
    cli.client.create(JournalSpec("out2", {**NDJSON, "app": "p"}))
    cli.client.update(JournalSpec("out", {**NDJSON, "app": "p"}), expect=cli.client.get("out"))
    selected = cli.out("read", "-l", "app=p")
    assert selected == default
    tailed = cli.out("read", "-l", "app=p", "-f", "--timeout", "500ms", "--refresh", "100ms")
    assert sorted(tailed.splitlines()) == sorted(default.splitlines())

    helped = " ".join(cli.out("read", "--help").decode().split())
    assert "--uncommitted" in helped and "--raw" in helped
    assert "the default for journals with a framing" in helped


def test_framing_decides_the_default(cli: Cli) -> None:
    _pipeline_output(cli.client, "src")
    stored = _journal_bytes(cli.client, "src")
    committed = list(read_committed(cli.client, "src"))
    # The same bytes as a Gazette fragment store (no oncelog spec): plain bytes by default,
    # committed once --content-type gives the framing.
    cli.client.store.write_fragment(
        Fragment("gz/part-000", 0, len(stored), content_sum(stored)), stored
    )
    assert cli.out("read", "gz/part-000") == stored
    assert cli.out("read", "gz/part-000", "--content-type", CONTENT_TYPE_JSON_LINES) == b"".join(
        stored[e.begin : e.end] for e in committed
    )
    # Protobuf messages' UUIDs need their schema: every frame, said on stderr.
    cli.client.create(JournalSpec("proto", {"content-type": "application/x-protobuf-fixed"}))
    frames = encode_fixed_frame(b"\x08\x01") + encode_fixed_frame(b"payload")
    cli.client.append("proto", frames)
    proc = cli.run("read", "proto")
    assert proc.stdout == frames
    assert proc.stderr.decode() == (
        "oncelog: warning: journal proto holds protobuf messages, whose UUIDs the command "
        "line cannot see without their class (label oncelog.dev/protobuf-class): printing "
        "every message, uncommitted\n"
    )
    quiet = cli.run("read", "proto", "--uncommitted")
    assert (quiet.stdout, quiet.stderr) == (frames, b"")
    assert "cannot read journal proto committed" in cli.error("read", "proto", "-c")


# -- item 6: error texts ------------------------------------------------------------------------


def _five_fragments(cli: Cli, name: str) -> list[int]:
    cli.client.create(JournalSpec(name, NDJSON))
    clock = clock_from_unix_ns(1_700_000_000 * 10**9)
    for i in range(5):
        line = orjson.dumps(
            {"uuid": str(build_uuid(bytes.fromhex("0137c0ffee01"), clock + i, 0)), "i": i}
        )
        cli.client.append(name, line + b"\n")
    return [f.begin for f in cli.client.fragments(name)]


def test_offset_before_the_first_available_names_the_offset_asked_for(cli: Cli) -> None:
    begins = _five_fragments(cli, "t")
    first = begins[1]
    trimmed = cli.run("journals", "trim", "t", "--before", str(first), "--yes").stdout.decode()
    assert trimmed == f"t: deleted 1 fragment ({first} B) and 0 claims; first offset now {first}\n"
    asked = first - 14
    assert cli.error("read", "t", "--offset", str(asked)) == (
        f"oncelog: error: offset {asked} of journal 't' is before its first available offset "
        f"{first} (the data before was trimmed): start at {first} or later"
    )
    assert cli.error("read", "t", "--offset", "1", "--uncommitted", "--format", "json").startswith(
        "oncelog: error: offset 1 of journal 't' is before its first available offset"
    )
    # The first available offset itself is a frame boundary.
    assert len(cli.out("read", "t", "--offset", str(first)).splitlines()) == 4
    assert len(cli.out("read", "t").splitlines()) == 4


def test_counts_are_pluralised(cli: Cli) -> None:
    from oncelog.cli.params import plural

    assert [plural(n, "fragment") for n in (0, 1, 2)] == [
        "0 fragments",
        "1 fragment",
        "2 fragments",
    ]
    assert plural(1, "byte") == "1 byte" and plural(3, "entry", "entries") == "3 entries"
    begins = _five_fragments(cli, "p")
    dry = cli.out("journals", "trim", "p", "--before", str(begins[1]), "--dry-run").decode()
    assert dry.startswith("p: would delete 1 fragment (") and "and 0 claims" in dry
    compacted = cli.out("journals", "compact", "p").decode()
    assert re.fullmatch(r"p: merged 5 fragments \(\d+ B\) into 1 fragment; offsets .*\n", compacted)
    for text in (dry, compacted):
        assert not re.search(r"\b1 (fragments|claims|journals|problems|messages|records)\b", text)


def test_gc_says_what_it_deletes(cli: Cli) -> None:
    from oncelog.journal.compaction import retire

    _five_fragments(cli, "g")
    cli.out("journals", "compact", "g")  # the five small fragments are now superseded
    head = cli.client.head("g")
    stray = b'{"stray": 1}\n'
    cli.client.store.write_fragment(
        Fragment("g", head, head + len(stray), content_sum(stray)), stray
    )  # a writer that died before claiming
    # Retirement keeps the last small claim below the record, and its fragment: the
    # library says how many it would delete.
    retired = len(retire(cli.client, "g", 0, dry_run=True).fragments)
    assert retired == 4
    dry = cli.run("gc", "g", "--grace", "0s", "--dry-run")
    summary = dry.stderr.decode()
    assert summary.startswith(
        "oncelog: gc --dry-run: would delete 1 unclaimed fragment (left by writers that "
        "lost a race or crashed) and 4 fragments superseded by compaction, "
    ) and summary.endswith(" B in all, from 1 journal\n")
    assert "5 unclaimed" not in summary  # retired fragments are not called unclaimed
    assert len(dry.stdout.splitlines()) == 1 + retired
    done = cli.run("gc", "g", "--grace", "0s")
    assert "deleted 1 unclaimed fragment (left by" in done.stderr.decode()
    assert "and 4 fragments superseded by compaction" in done.stderr.decode()
    assert sorted(done.stdout.splitlines()) == sorted(dry.stdout.splitlines())
    assert (
        cli.run("gc", "g", "--grace", "0s")
        .stderr.decode()
        .startswith("oncelog: gc: deleted nothing")
    )
    helped = " ".join(cli.out("gc", "--help").decode().split())
    assert "never claimed" in helped and "superseded by compaction" in helped


def test_groups_lag_and_status(cli: Cli) -> None:
    from oncelog.consumer import Consumer

    cli.client.create(JournalSpec("in/a", NDJSON))
    cli.client.append("in/a", b'{"n": 0}\n{"n": 1}\n')
    consumer = Consumer(cli.client, "counter", ["in/a"], lambda env, txn: None)
    consumer.run(until_idle=True)
    consumer.close()
    offset = cli.client.head("in/a")
    cli.client.append("in/a", b'{"n": 2}\n')
    head = cli.client.head("in/a")

    table = cli.out("groups", "lag", "counter").decode().splitlines()
    assert table[0].split() == ["JOURNAL", "OFFSET", "HEAD", "LAG", "MESSAGES"]
    assert table[1].split() == ["in/a", str(offset), str(head), str(head - offset), "1"]
    docs = orjson.loads(cli.out("groups", "lag", "counter", "-f", "json"))
    assert docs == [
        {
            "journal": "in/a",
            "shard": None,
            "offset": offset,
            "head": head,
            "lag": head - offset,
            "messages": 1,
        }
    ]
    bytes_only = orjson.loads(
        cli.out("groups", "lag", "counter", "-f", "json", "--count-up-to", "0")
    )
    assert bytes_only[0]["messages"] is None and bytes_only[0]["lag"] == head - offset
    assert cli.out("groups", "status", "counter") == cli.out("groups", "show", "counter")
    shown = cli.out("groups", "show", "counter").decode()
    assert f"lag:    {head - offset} bytes, 1 message" in shown
    helped = cli.out("groups", "--help").decode()
    assert re.search(r"^\s+lag\s", helped, re.M) and re.search(r"^\s+status\s", helped, re.M)
    assert cli.error("groups", "lag", "nope").startswith(
        "oncelog: error: consumer group 'nope' does not exist"
    )


def test_verify_without_a_name_checks_every_journal(cli: Cli) -> None:
    for name in ("v/a", "v/b"):
        _five_fragments(cli, name)
    proc = cli.run("journals", "verify", "-f", "json")
    assert [d["journal"] for d in orjson.loads(proc.stdout)] == ["v/a", "v/b"]
    assert "10 fragments" in proc.stderr.decode() and "of 2 journals checked, 0 problems" in (
        proc.stderr.decode()
    )
    # A corrupt fragment in the second journal is found too.
    frag = cli.client.fragments("v/b")[2]
    path = Path(cli.store) / frag.content_path
    path.write_bytes(path.read_bytes().replace(b'"i"', b'"j"'))
    bad = cli.run("journals", "verify", rc=1)
    assert f"fragment {frag.content_name}" in bad.stdout.decode() and "'v/b'" in bad.stdout.decode()
    assert "1 problem\n" in bad.stderr.decode()


# -- item 9: retention and compaction settings; docs; completion ---------------------------------


def test_create_with_retention_and_compact_after(cli: Cli) -> None:
    cli.run("journals", "create", "r", "--retention", "30d", "--compact-after", "8")
    spec = cli.client.get("r")
    assert (spec.fragment.retention, spec.fragment.compact_after) == (30 * 86400.0, 8)
    fields = cli.out("journals", "describe", "r").decode()
    assert re.search(r"^retention: +30d$", fields, re.M), fields
    assert re.search(r"^compact after: +8 fragments$", fields, re.M), fields
    doc = orjson.loads(cli.out("journals", "describe", "r", "-f", "json"))
    assert doc["fragment"]["retention"] == "720h0m0s" and doc["fragment"]["compact_after"] == 8
    cli.run("journals", "create", "plain")
    plain = cli.out("journals", "describe", "plain").decode()
    assert re.search(r"^retention: +forever$", plain, re.M)
    assert re.search(r"^compact after: +off$", plain, re.M)
    # apply takes them too (from the JSON form describe prints).
    doc["fragment"].update(retention="1h0m0s", compact_after=2)
    cli.run("journals", "apply", "-", "--yes", input=orjson.dumps(doc))
    changed = cli.client.get("r").fragment
    assert (changed.retention, changed.compact_after) == (3600.0, 2)
    assert "invalid duration" in cli.error("journals", "create", "x", "--retention", "soon", rc=2)
    assert "counts fragments" in cli.error(
        "journals", "create", "x", "--compact-after", "64MiB", rc=2
    )
    assert not cli.client.exists("x")


def test_shell_completion_script(cli: Cli) -> None:
    scripts = (("bash", "complete -o"), ("zsh", "#compdef oncelog"), ("fish", "complete"))
    for shell, marker in scripts:
        proc = cli.run(**{"_ONCELOG_COMPLETE": f"{shell}_source"})
        assert marker in proc.stdout.decode() and "_ONCELOG_COMPLETE" in proc.stdout.decode()


def test_cli_docs_cover_the_commands() -> None:
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    for heading in (
        "### `journals compact",
        "### `journals trim",
        "### `serve",
        "### `export delta",
        "### `groups list`, `groups show GROUP`, `groups lag GROUP`",
    ):
        assert heading in text, heading
    assert "_ONCELOG_COMPLETE=bash_source oncelog" in text and "fish_source" in text
    assert "--retention DURATION" in text and "--compact-after N" in text
    assert "`--uncommitted`" in text and "`--raw`" in text
