"""Journal name and object path validation."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncelog.journal import (
    MAX_JOURNAL_NAME_LEN,
    InvalidJournalName,
    JournalNotFound,
    validate_journal_name,
)
from oncelog.journal.errors import InvalidObjectPath
from oncelog.journal.names import validate_object_path

component = st.text(
    alphabet=st.sampled_from("abcxyzABC019-_+=%é"), min_size=1, max_size=12
)


@pytest.mark.parametrize(
    "name",
    ["a", "logs/pageviews/part-000", "x.y/z=1/w%20", "a+b_c-d", "ünïcode/名前", "a.b"],
)
def test_valid_names_are_returned(name: str) -> None:
    assert validate_journal_name(name) == name


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("", "empty"),
        ("../x", "starts with '.'"),
        ("a/../b", "starts with '.'"),
        ("/x", "starts with '/'"),
        ("a//b", "empty path component"),
        ("a/", "empty path component"),
        (".oncelog/claims/x", "starts with '.'"),
        ("a/.tmp-1", "starts with '.'"),
        ("a b", "' '"),
        ("a\\b", "'\\\\'"),
        ("a\nb", "'\\n'"),
        ("a:b", "':'"),
        ("x" * (MAX_JOURNAL_NAME_LEN + 1), "more than 512"),
    ],
)
def test_invalid_names_are_rejected_with_the_reason(name: str, reason: str) -> None:
    with pytest.raises(InvalidJournalName) as info:
        validate_journal_name(name)
    assert reason in str(info.value)


def test_non_string_name_is_rejected() -> None:
    with pytest.raises(InvalidJournalName, match="must be a str"):
        validate_journal_name(b"abc")  # type: ignore[arg-type]


@given(st.lists(component, min_size=1, max_size=5))
def test_names_built_from_safe_components_are_valid(parts: list[str]) -> None:
    name = "/".join(p.lstrip(".") or "x" for p in parts)
    assert validate_journal_name(name) == name


@given(st.text(max_size=40))
def test_any_text_either_validates_or_raises_invalid_name(text: str) -> None:
    try:
        validate_journal_name(text)
    except InvalidJournalName:
        return
    parts = text.split("/")
    assert all(p and not p.startswith(".") for p in parts)
    assert not text.startswith("/")


@pytest.mark.parametrize("path", ["../x", "/abs", "a//b", "", "checkpoints/../../x"])
def test_invalid_object_paths(path: str) -> None:
    with pytest.raises(InvalidObjectPath):
        validate_object_path(path)


def test_bad_names_are_rejected_before_any_storage_call(memory_store: Any) -> None:
    client = memory_store.open()
    calls: list[str] = []
    backend = client.store.backend
    for attr in ("read", "write", "create", "list_dir", "list_names_after", "walk", "delete"):
        original = getattr(backend, attr)

        def spy(*args, _name=attr, _orig=original, **kwargs):  # type: ignore[no-untyped-def]
            calls.append(_name)
            return _orig(*args, **kwargs)

        setattr(backend, attr, spy)
    for op in (
        lambda: client.get("../x"),
        lambda: client.read("/x"),
        lambda: client.append("a//b", b"x"),
        lambda: client.start_append("a/../b"),
        lambda: client.delete("../../etc"),
        lambda: client.head(".oncelog/claims/x"),
        lambda: client.fragments("a/"),
        lambda: client.gc("a//b"),
    ):
        with pytest.raises(InvalidJournalName):
            op()
    assert calls == []
    with pytest.raises(JournalNotFound):
        client.get("fine/name")
    assert calls == ["read"]
