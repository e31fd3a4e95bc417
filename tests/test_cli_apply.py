"""`oncelog journals apply FILE` and `journals edit NAME`, and JournalClient.update they
rest on: specs changed in place with a diff, confirmation and an optimistic check."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from oncelog.cli import cli
from oncelog.cli.app import State
from oncelog.journal import FragmentSpec, JournalClient, JournalError, JournalNotFound, JournalSpec
from oncelog.testing.fixtures import StoreTarget

NAME = "logs/web/part-000"


@pytest.fixture
def client(local_store: StoreTarget) -> Iterator[JournalClient]:
    c = local_store.open()
    try:
        yield c
    finally:
        c.close()


def run(
    store: StoreTarget,
    *args: str,
    input: str | None = None,
    env: dict[str, str] | None = None,
    rc: int = 0,
) -> Result:
    """Invoke the CLI in-process against `store` (stdin is never a terminal here)."""
    state = State()
    try:
        result = CliRunner().invoke(
            cli, ["--store", store.url, *args], input=input, env=env, obj=state
        )
    finally:
        state.close()
    assert result.exit_code == rc, (args, result.exit_code, result.output, result.exception)
    return result


def describe_json(store: StoreTarget, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(run(store, "journals", "describe", name, "-f", "json").stdout)
    return doc


def write_spec(tmp_path: Path, doc: Any) -> str:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(doc))
    return str(path)


def make(client: JournalClient, name: str = NAME, length: int = 1 << 20) -> JournalSpec:
    return client.create(
        JournalSpec(name, {"app": "web"}, FragmentSpec(length=length), {"role": "producer"})
    )


def test_apply_creates_missing_journals(
    local_store: StoreTarget, client: JournalClient, tmp_path: Path
) -> None:
    docs = [
        {"name": "a/one", "labels": {"app": ["x"]}, "fragment": {"length": 4096}},
        {"name": "a/two"},
    ]
    out = run(local_store, "journals", "apply", write_spec(tmp_path, docs)).stdout
    assert "a/one: to create" in out and "a/two: to create" in out
    assert client.get("a/one").fragment.length == 4096
    assert client.get("a/one").labels.value("app") == "x"
    assert client.get("a/two").incarnation
    # Applying the same file again changes nothing.
    again = run(local_store, "journals", "apply", write_spec(tmp_path, docs)).stdout
    assert again.splitlines() == ["a/one: unchanged", "a/two: unchanged"]


def test_apply_diffs_and_updates_keeping_the_incarnation(
    local_store: StoreTarget, client: JournalClient, tmp_path: Path
) -> None:
    before = make(client)
    client.append(NAME, b'{"n": 1}\n')
    doc = describe_json(local_store, NAME)  # what describe prints is accepted as it is
    assert doc["head"] == 9 and "fragments" in doc and doc["incarnation"] == before.incarnation
    doc["labels"]["app"] = ["api"]
    doc["labels"]["tier"] = ["gold"]
    doc["fragment"]["length"] = 256
    path = write_spec(tmp_path, doc)

    out = run(local_store, "journals", "apply", path, "--yes").stdout
    assert f"{NAME}: to update" in out
    assert f"--- {NAME} (stored)" in out
    assert '-    "app": "web"' in out and '+    "app": "api",' in out
    assert '+    "tier": "gold"' in out
    assert '-    "length": 1048576' in out and '+    "length": 256' in out
    assert "incarnation" not in out

    after = client.get(NAME)
    assert after.incarnation == before.incarnation
    assert after.labels.value("app") == "api" and after.labels.value("tier") == "gold"
    assert after.fragment.length == 256
    assert after.owner == before.owner
    assert client.head(NAME) == 9  # the data is untouched
    assert run(local_store, "journals", "apply", path).stdout.strip() == f"{NAME}: unchanged"


def test_apply_from_stdin_with_a_list(local_store: StoreTarget, client: JournalClient) -> None:
    make(client)
    docs = json.loads(run(local_store, "journals", "list", "-f", "json").stdout)
    docs[0]["fragment"]["compression"] = "zstd"
    docs.append({"name": "new/one"})
    out = run(local_store, "journals", "apply", "-", "-y", input=json.dumps(docs)).stdout
    assert '+    "compression": "zstd",' in out
    assert client.get(NAME).fragment.compression == "zstd"
    assert client.exists("new/one")


def test_dry_run_changes_nothing(
    local_store: StoreTarget, client: JournalClient, tmp_path: Path
) -> None:
    before = make(client)
    doc = before.to_dict()
    doc["fragment"]["length"] = 512
    path = write_spec(tmp_path, [doc, {"name": "not/yet"}])
    out = run(local_store, "journals", "apply", path, "--dry-run").stdout
    assert f"{NAME}: would update" in out and "not/yet: would create" in out
    assert '+    "length": 512' in out
    assert client.get(NAME).fragment.length == 1 << 20
    assert not client.exists("not/yet")


def test_update_is_refused_without_yes_and_a_terminal(
    local_store: StoreTarget, client: JournalClient, tmp_path: Path
) -> None:
    before = make(client)
    doc = before.to_dict()
    doc["labels"]["app"] = ["api"]
    result = run(local_store, "journals", "apply", write_spec(tmp_path, doc), rc=2)
    assert "stdin is not a terminal; pass --yes" in result.output
    assert client.get(NAME) == before
    # edit refuses before opening an editor
    result = run(local_store, "journals", "edit", NAME, env={"EDITOR": "false"}, rc=2)
    assert "stdin is not a terminal; pass --yes" in result.output


def test_bad_files_are_refused_whole(
    local_store: StoreTarget, client: JournalClient, tmp_path: Path
) -> None:
    make(client)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert "is not JSON" in run(local_store, "journals", "apply", str(bad), rc=1).output
    path = write_spec(tmp_path, [{"name": "ok/one"}, {"name": NAME, "colour": "red"}])
    assert "unknown journal spec fields" in run(
        local_store, "journals", "apply", path, "-y", rc=1
    ).output
    assert not client.exists("ok/one")
    path = write_spec(tmp_path, [{"name": "ok/one"}, {"name": "ok/one"}])
    assert "more than once" in run(local_store, "journals", "apply", path, rc=2).output


def _editor(tmp_path: Path, code: str) -> dict[str, str]:
    """An $EDITOR running `code` on the file (`doc` is its JSON, written back after)."""
    script = tmp_path / "editor.py"
    script.write_text(
        "import json, sys\n"
        "path = sys.argv[1]\n"
        "doc = json.load(open(path))\n"
        f"{code}\n"
        "open(path, 'w').write(json.dumps(doc))\n"
    )
    return {"EDITOR": f"{sys.executable} {script}", "VISUAL": ""}


def test_edit_through_the_editor(
    local_store: StoreTarget, client: JournalClient, tmp_path: Path
) -> None:
    before = make(client)
    env = _editor(
        tmp_path,
        "assert 'incarnation' not in doc\n"
        "doc['labels']['app'] = ['api']\n"
        "doc['fragment']['flush_interval'] = 0.25",
    )
    out = run(local_store, "journals", "edit", NAME, "--yes", env=env).stdout
    assert '-    "app": "web"' in out and '+    "app": "api"' in out
    assert '+    "flush_interval": 0.25' in out
    after = client.get(NAME)
    assert after.labels.value("app") == "api" and after.fragment.flush_interval == 0.25
    assert after.incarnation == before.incarnation
    # An edit that changes nothing, and one that renames, change nothing.
    env = _editor(tmp_path, "pass")
    assert run(local_store, "journals", "edit", NAME, "-y", env=env).stdout.strip() == (
        f"{NAME}: unchanged"
    )
    env = _editor(tmp_path, "doc['name'] = 'other/name'")
    renamed = run(local_store, "journals", "edit", NAME, "-y", env=env, rc=1)
    assert "cannot be renamed" in renamed.output
    assert client.get(NAME) == after
    assert not client.exists("other/name")


def test_edit_refuses_a_concurrent_change(
    local_store: StoreTarget, client: JournalClient, tmp_path: Path
) -> None:
    make(client)
    # The "editor" changes the stored spec (another user) while the spec is being edited.
    code = (
        "from oncelog import open_journals\n"
        "from dataclasses import replace\n"
        f"c = open_journals({local_store.url!r})\n"
        f"s = c.get({NAME!r})\n"
        "c.update(replace(s, labels={'app': 'other'}))\n"
        "c.close()\n"
        "doc['fragment']['length'] = 4096"
    )
    result = run(local_store, "journals", "edit", NAME, "-y", env=_editor(tmp_path, code), rc=1)
    assert isinstance(result.exception, JournalError)
    assert "was changed since it was read; re-read and retry" in str(result.exception)
    spec = client.get(NAME)
    assert spec.labels.value("app") == "other" and spec.fragment.length == 1 << 20


def test_update_checks_expect_and_keeps_the_incarnation(client: JournalClient) -> None:
    with pytest.raises(JournalNotFound):
        client.update(JournalSpec("no/such"))
    old = make(client)
    read = client.get(NAME)
    other = JournalClient(client.fs, client.root)
    try:
        changed = other.update(JournalSpec(NAME, {"app": "x"}), expect=read)
    finally:
        other.close()
    assert changed.incarnation == old.incarnation
    with pytest.raises(JournalError, match="was changed since it was read"):
        client.update(JournalSpec(NAME, {"app": "y"}), expect=read)
    assert client.get(NAME).labels.value("app") == "x"
    # An expect carrying another (or no) incarnation still matches on the settings.
    stored = client.update(JournalSpec(NAME, {"app": "y"}), expect=JournalSpec(NAME, {"app": "x"}))
    assert stored.incarnation == old.incarnation == client.get(NAME).incarnation


def test_appends_after_an_update_use_the_new_fragment_length(
    local_store: StoreTarget, client: JournalClient, tmp_path: Path
) -> None:
    make(client, length=1 << 20)
    records = [b'{"n": %03d, "pad": "%s"}\n' % (i, b"x" * 36) for i in range(40)]
    client.append_many(NAME, records)
    assert len(client.fragments(NAME)) == 1

    doc = client.get(NAME).to_dict()
    doc["fragment"]["length"] = 200
    run(local_store, "journals", "apply", write_spec(tmp_path, doc), "-y")

    fresh = local_store.open()
    try:
        head = fresh.head(NAME)
        fresh.append_many(NAME, records)
        new = [f for f in fresh.fragments(NAME) if f.begin >= head]
    finally:
        fresh.close()
    assert len(new) > 5
    assert all(f.content_length < 200 + len(records[0]) for f in new)
    # The client that appended before the update picks it up once it updates itself.
    client.update(JournalSpec.from_dict({**doc, "fragment": {**doc["fragment"], "length": 100}}))
    head = client.head(NAME)
    client.append_many(NAME, records)
    assert len([f for f in client.fragments(NAME) if f.begin >= head]) > len(new)
