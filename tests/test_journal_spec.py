"""JournalSpec / FragmentSpec: defaults, validation, spec.json round trips."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncelog.journal import (
    Codec,
    FragmentSpec,
    InvalidJournalName,
    InvalidJournalSpec,
    JournalOwner,
    JournalSpec,
)
from oncelog.labels import LabelSet


def test_defaults() -> None:
    spec = JournalSpec("logs/a")
    assert spec.content_type == "application/x-ndjson"
    assert spec.fragment == FragmentSpec()
    assert spec.fragment.codec is Codec.NONE
    assert spec.owner is None
    assert spec.labels == LabelSet()


def test_labels_accept_dicts_and_labelsets_and_pick_the_content_type() -> None:
    from_dict = JournalSpec("a", labels={"content-type": "text/csv", "app": ["x", "y"]})
    from_set = JournalSpec("a", labels=LabelSet({"content-type": "text/csv", "app": ["y", "x"]}))
    assert from_dict == from_set
    assert from_dict.content_type == "text/csv"
    assert from_dict.labels.values("app") == ["x", "y"]


@pytest.mark.parametrize(
    ("compression", "normal"),
    [("none", "none"), ("GZIP", "gzip"), ("zstd", "zstd"), ("ZSTANDARD", "zstd"), ("raw", "none")],
)
def test_compression_names_are_normalised(compression: str, normal: str) -> None:
    assert FragmentSpec(compression=compression).compression == normal


def test_flush_interval_accepts_timedelta() -> None:
    assert FragmentSpec(flush_interval=timedelta(milliseconds=250)).flush_interval == 0.25


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"length": 0}, "positive int"),
        ({"length": -5}, "positive int"),
        ({"length": 1.5}, "positive int"),
        ({"compression": "snappy"}, "unknown compression 'snappy'"),
        ({"flush_interval": -1}, "flush_interval"),
        ({"flush_interval": float("inf")}, "flush_interval"),
        ({"flush_interval": "1s"}, "flush_interval"),
    ],
)
def test_bad_fragment_specs_are_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidJournalSpec, match=message):
        FragmentSpec(**kwargs)


def test_bad_journal_specs_are_rejected() -> None:
    with pytest.raises(InvalidJournalName):
        JournalSpec("../up")
    with pytest.raises(InvalidJournalSpec, match="content-type"):
        JournalSpec("a", labels={"content-type": ["text/csv", "application/x-ndjson"]})
    with pytest.raises(InvalidJournalSpec, match="label"):
        JournalSpec("a", labels={"bad name!": "x"})
    with pytest.raises(InvalidJournalSpec, match="owner"):
        JournalSpec("a", owner={"role": "p", "nickname": "x"})
    with pytest.raises(InvalidJournalSpec, match="FragmentSpec"):
        JournalSpec("a", fragment=42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text",
    [
        b"not json",
        b"{}",
        b'{"name": "a", "colour": "red"}',
        b'{"name": "a", "fragment": {"size": 1}}',
    ],
)
def test_bad_spec_json_is_rejected(text: bytes) -> None:
    with pytest.raises(InvalidJournalSpec):
        JournalSpec.from_json(text)


label_names = st.sampled_from(["app", "tier", "content-type", "app.gazette.dev/tag", "zone"])
label_values = st.text(alphabet="abcxyz019-_./", min_size=1, max_size=8)


@given(
    name=st.sampled_from(["a", "logs/x/part-000", "b=1/c"]),
    labels=st.dictionaries(label_names, label_values, max_size=4),
    length=st.integers(1, 2**40),
    compression=st.sampled_from(["none", "gzip", "zstd"]),
    interval=st.floats(0, 3600),
    owner=st.none()
    | st.builds(JournalOwner, st.text(max_size=5), st.text(max_size=5), st.text(max_size=20)),
)
def test_spec_json_round_trips(
    name: str,
    labels: dict,
    length: int,
    compression: str,
    interval: float,
    owner: JournalOwner | None,
) -> None:
    spec = JournalSpec(name, labels, FragmentSpec(length, compression, interval), owner)
    assert JournalSpec.from_json(spec.to_json()) == spec
