"""CSV headers name a journal's columns: `oncelog append --header` records the header's
names on the journal (label `oncelog.dev/csv-columns`), a different header later is an
error naming both, and readers use the names (`read_committed_arrow(parse=True)`).

The console script runs in subprocesses, as a user runs it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from oncelog.arrow import read_committed_arrow
from oncelog.errors import OncelogError
from oncelog.framing.csvlines import (
    CSV_COLUMNS_LABEL,
    CSVColumnsError,
    check_csv_columns,
    csv_column_labels,
    csv_columns,
    csv_record_doc,
)
from oncelog.journal import JournalSpec, open_journals
from oncelog.labels import LabelSet
from oncelog.reading import read_committed

_FOUND = shutil.which("oncelog", path=os.path.dirname(sys.executable))
assert _FOUND, f"the oncelog console script is not installed next to {sys.executable}"
ONCELOG: str = _FOUND
TIMEOUT = 60


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("ONCELOG_", "AWS_"))}


def run(*args: str, input: bytes, rc: int = 0) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run(
        [ONCELOG, *args], input=input, capture_output=True, env=_env(), timeout=TIMEOUT
    )
    assert proc.returncode == rc, (args, proc.returncode, proc.stderr.decode())
    assert b"Traceback" not in proc.stderr, proc.stderr.decode()
    return proc


def error(*args: str, input: bytes) -> str:
    """The one `oncelog: error: ...` line of a failing command."""
    lines = run(*args, input=input, rc=1).stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("oncelog: error: "), lines
    return lines[0]


@pytest.fixture
def store(tmp_path: Path) -> str:
    """A store directory with the CSV journal `c`."""
    url = str(tmp_path / "store")
    with open_journals(url) as client:
        client.create(JournalSpec("c", {"content-type": "text/csv"}))
    return url


def _columns(store: str) -> list[str] | None:
    with open_journals(store) as client:
        return csv_columns(client.get("c"))


def _head(store: str) -> int:
    with open_journals(store) as client:
        return client.head("c")


def test_a_header_names_the_columns_arrow_reads(store: str) -> None:
    run("-s", store, "append", "c", "--header", "--add-uuid-column",
        input=b'page,ms\n/a,3\n"/b,x",4\n')
    assert _columns(store) == ["uuid", "page", "ms"]
    # A detected header (first field "uuid") that matches appends; so does no header at all.
    run("-s", store, "append", "c", input=b"uuid,page,ms\n,/c,5\n")
    run("-s", store, "append", "c", "--no-header", input=b",/d,6,extra\n,/e\n")
    with open_journals(store) as client:
        table = read_committed_arrow(client, "c", parse=True)
        uuids = [str(env.message.get_uuid()) for env in read_committed(client, "c")]
    assert table.column_names[-4:] == ["uuid_key", "page", "ms", "_3"]
    assert table.select(["page", "ms", "_3"]).to_pylist() == [
        {"page": "/a", "ms": "3", "_3": None},
        {"page": "/b,x", "ms": "4", "_3": None},
        {"page": "/c", "ms": "5", "_3": None},
        {"page": "/d", "ms": "6", "_3": "extra"},
        {"page": "/e", "ms": None, "_3": None},
    ]
    assert table.column("uuid").to_pylist() == uuids  # the UUID column is `uuid`
    with open_journals(store) as client:
        only = read_committed_arrow(client, "c", parse=True, columns=["ms", "page"])
    assert only.column_names == ["ms", "page"]


def test_a_uuid_column_named_otherwise_keeps_its_name(store: str) -> None:
    run("-s", store, "append", "c", "--header", input=b"id,page\n,/a\n")
    assert _columns(store) == ["id", "page"]
    with open_journals(store) as client:
        table = read_committed_arrow(client, "c", parse=True)
    assert table.column("id").to_pylist() == table.column("uuid").to_pylist()
    assert table.column("page").to_pylist() == ["/a"]


def test_a_different_header_is_an_error_naming_both(store: str) -> None:
    run("-s", store, "append", "c", "--header", "--add-uuid-column", input=b"page,ms\n/a,3\n")
    head = _head(store)
    err = error("-s", store, "append", "c", "--header", "--add-uuid-column",
                input=b"page,seconds\n/b,4\n")
    assert "journal c" in err
    assert "['uuid', 'page', 'seconds']" in err and "['uuid', 'page', 'ms']" in err
    assert "nothing was appended" in err
    err = error("-s", store, "append", "c", input=b"uuid,ms,page\n,3,/b\n")  # detected
    assert "['uuid', 'ms', 'page']" in err and "['uuid', 'page', 'ms']" in err
    # The recorded header without its UUID column: the fix is --add-uuid-column.
    err = error("-s", store, "append", "c", "--header", input=b"page,ms\n/b,4\n")
    assert "--add-uuid-column" in err
    assert _head(store) == head and _columns(store) == ["uuid", "page", "ms"]


def test_a_header_without_a_uuid_column_suggests_add_uuid_column(store: str) -> None:
    table = b"name,age\nann,3\nbob,4\n"
    err = error("-s", store, "append", "c", "--header", input=table)
    assert "line 2 of stdin: the first field 'ann' is not a UUID" in err
    assert "pass --add-uuid-column" in err and "nothing was appended" in err
    # Nothing appended, and no columns recorded: the right command still works.
    assert _head(store) == 0 and _columns(store) is None
    run("-s", store, "append", "c", "--header", "--add-uuid-column", input=table)
    assert _columns(store) == ["uuid", "name", "age"]


def test_a_header_that_cannot_name_columns_is_refused(store: str) -> None:
    err = error("-s", store, "append", "c", "--header", input=b"id,a,a\n,1,2\n")
    assert "journal c" in err and "names column 'a' twice" in err
    err = error("-s", store, "append", "c", "--header", input=b"id,,b\n,1,2\n")
    assert "column 1 of the CSV header ['id', '', 'b'] has no name" in err
    assert _head(store) == 0 and _columns(store) is None


def test_racing_appends_with_different_headers_record_one(store: str) -> None:
    """Two appends started together with different headers: the spec update is
    conditional, so exactly one header is recorded and only its append succeeds."""
    inputs = {b"page,ms": b"page,ms\n/a,3\n", b"page,seconds": b"page,seconds\n/b,4\n"}
    procs = [
        subprocess.Popen(
            [ONCELOG, "-s", store, "append", "c", "--header", "--add-uuid-column"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(),
        )
        for _ in inputs
    ]
    results = [p.communicate(data, timeout=TIMEOUT) for p, data in zip(procs, inputs.values(),
                                                                        strict=True)]
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 1], (codes, results)
    winner = list(inputs)[codes.index(0)].decode().split(",")
    loser_err = results[codes.index(1)][1].decode()
    assert _columns(store) == ["uuid", *winner]
    assert f"journal c has the columns {['uuid', *winner]}" in loser_err
    with open_journals(store) as client:
        assert len(list(read_committed(client, "c"))) == 1


def test_parse_needs_recorded_columns(store: str) -> None:
    run("-s", store, "append", "c", input=b",/a,3\n")
    with open_journals(store) as client, pytest.raises(CSVColumnsError) as caught:
        read_committed_arrow(client, "c", parse=True)
    assert isinstance(caught.value, OncelogError) and isinstance(caught.value, ValueError)
    assert "CSV journal c records none" in str(caught.value)
    assert "oncelog append --header" in str(caught.value)


def test_column_names_round_trip_through_the_label() -> None:
    names = ["uuid", "first name", "a,b", "~x", "été", "50%", "x=y", "_1"]
    values = csv_column_labels(check_csv_columns(names, journal="j"))
    assert csv_columns(LabelSet({CSV_COLUMNS_LABEL: values}), "j") == names
    with pytest.raises(CSVColumnsError, match="journal j: label oncelog.dev/csv-columns has"):
        csv_columns(LabelSet({CSV_COLUMNS_LABEL: ["1=b", "2=c"]}), "j")
    with pytest.raises(CSVColumnsError, match="is not '<position>=<name>'"):
        csv_columns(LabelSet({CSV_COLUMNS_LABEL: ["b"]}), "j")
    assert csv_columns(LabelSet({"content-type": "text/csv"}), "j") is None
    with pytest.raises(CSVColumnsError, match="too long"):
        check_csv_columns(["uuid", "x" * 1100], journal="j")


def test_record_doc_keeps_every_field() -> None:
    columns = ["uuid", "page", "ms"]
    assert csv_record_doc(["u", "/a", "3"], columns) == {"uuid": "u", "page": "/a", "ms": "3"}
    assert csv_record_doc(["u"], columns) == {"uuid": "u"}
    assert csv_record_doc(["u", "/a", "3", "x", "y"], columns) == {
        "uuid": "u", "page": "/a", "ms": "3", "_3": "x", "_4": "y"
    }


def test_read_json_keys_records_by_the_header(store: str) -> None:
    run("-s", store, "append", "c", "--header", "--add-uuid-column",
        input=b'page,ms\n/a,3\n"/b,x",4\n')
    run("-s", store, "append", "c", "--no-header", input=b",/c,5,extra\n")
    out = run("-s", store, "read", "c", "--committed", "--format", "json", input=b"").stdout
    docs = [orjson.loads(line) for line in out.splitlines()]
    assert [d["message"] for d in docs] == [
        {"uuid": docs[0]["uuid"], "page": "/a", "ms": "3"},
        {"uuid": docs[1]["uuid"], "page": "/b,x", "ms": "4"},
        {"uuid": docs[2]["uuid"], "page": "/c", "ms": "5", "_3": "extra"},
    ]
    assert list(docs[0]["message"]) == ["uuid", "page", "ms"]  # in the header's order
