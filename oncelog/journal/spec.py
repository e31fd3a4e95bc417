"""Journal specifications: name, labels, fragment policy and owner, stored as spec.json."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Mapping

import orjson

from oncelog.journal.errors import InvalidJournalSpec, UnknownCodec
from oncelog.journal.fragment import Codec
from oncelog.journal.names import validate_journal_name
from oncelog.labels import (
    CONTENT_TYPE,
    CONTENT_TYPE_JSON_LINES,
    LabelSet,
    check_single_value_labels,
)

__all__ = ["FragmentSpec", "JournalOwner", "JournalSpec", "DEFAULT_FRAGMENT_LENGTH"]

DEFAULT_FRAGMENT_LENGTH = 16 << 20
"""Default FragmentSpec.length: 16 MiB. A writer holds up to twice this in memory, and the
last fragment of a burst is written after the burst ends, so smaller keeps latency low."""

_COMPRESSIONS = {Codec.NONE: "none", Codec.GZIP: "gzip", Codec.ZSTANDARD: "zstd"}


@dataclass(frozen=True, slots=True)
class FragmentSpec:
    """How appends become fragments.

    `length`: a fragment rolls over once it holds this many bytes (an append is never split,
    so one larger append makes one larger fragment). `compression`: `none`, `gzip` or `zstd`.
    `flush_interval`: seconds (or a timedelta) an append may wait in the spool for others to
    share its fragment; 0 writes as soon as the previous write of the journal is done. A
    caller waiting on an append's result, `append()` and `flush()` never wait for it.
    """

    length: int = DEFAULT_FRAGMENT_LENGTH
    compression: str = "none"
    flush_interval: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.length, bool) or not isinstance(self.length, int) or self.length <= 0:
            raise InvalidJournalSpec(f"fragment length must be a positive int, not {self.length!r}")
        try:
            codec = Codec.from_compression(self.compression)
        except UnknownCodec as exc:
            raise InvalidJournalSpec(str(exc)) from None
        object.__setattr__(self, "compression", _COMPRESSIONS[codec])
        interval = self.flush_interval
        if isinstance(interval, timedelta):
            interval = interval.total_seconds()
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not (
            math.isfinite(interval) and interval >= 0
        ):
            raise InvalidJournalSpec(
                "flush_interval must be a finite number of seconds >= 0, "
                f"not {self.flush_interval!r}"
            )
        object.__setattr__(self, "flush_interval", float(interval))

    @property
    def codec(self) -> Codec:
        """The codec fragments are written with."""
        return Codec.from_compression(self.compression)

    def to_dict(self) -> dict[str, Any]:
        return {
            "length": self.length,
            "compression": self.compression,
            "flush_interval": self.flush_interval,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> FragmentSpec:
        unknown = set(doc) - {"length", "compression", "flush_interval"}
        if unknown:
            raise InvalidJournalSpec(f"unknown fragment spec fields {sorted(unknown)}")
        return cls(**doc)


@dataclass(frozen=True, slots=True)
class JournalOwner:
    """Who writes or serves a journal: a role (e.g. `producer`), an address, a description."""

    role: str = ""
    address: str = ""
    description: str = ""

    def __post_init__(self) -> None:
        for name in ("role", "address", "description"):
            if not isinstance(getattr(self, name), str):
                raise InvalidJournalSpec(f"owner {name} must be a str: {getattr(self, name)!r}")

    def to_dict(self) -> dict[str, str]:
        return {"role": self.role, "address": self.address, "description": self.description}


@dataclass(frozen=True, slots=True)
class JournalSpec:
    """A journal's specification. `labels` takes a LabelSet or a plain dict; its
    `content-type` label picks the framing (default `application/x-ndjson`)."""

    name: str
    labels: LabelSet = field(default_factory=LabelSet)
    fragment: FragmentSpec = field(default_factory=FragmentSpec)
    owner: JournalOwner | None = None

    def __post_init__(self) -> None:
        validate_journal_name(self.name)
        try:
            labels = LabelSet.from_value(self.labels)  # type: ignore[arg-type]
            check_single_value_labels(labels)
        except (TypeError, ValueError) as exc:
            raise InvalidJournalSpec(f"bad labels for journal {self.name!r}: {exc}") from exc
        object.__setattr__(self, "labels", labels)
        if isinstance(self.fragment, Mapping):
            object.__setattr__(self, "fragment", FragmentSpec.from_dict(self.fragment))
        elif not isinstance(self.fragment, FragmentSpec):
            raise InvalidJournalSpec(
                f"fragment of journal {self.name!r} must be a FragmentSpec: {self.fragment!r}"
            )
        if isinstance(self.owner, Mapping):
            try:
                object.__setattr__(self, "owner", JournalOwner(**self.owner))
            except TypeError as exc:
                raise InvalidJournalSpec(f"bad owner of journal {self.name!r}: {exc}") from None
        elif self.owner is not None and not isinstance(self.owner, JournalOwner):
            raise InvalidJournalSpec(
                f"owner of journal {self.name!r} must be a JournalOwner, dict or None"
            )

    @property
    def content_type(self) -> str:
        """The `content-type` label, or `application/x-ndjson` when it is absent."""
        return self.labels.value(CONTENT_TYPE) or CONTENT_TYPE_JSON_LINES

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "labels": self.labels.to_dict(),
            "fragment": self.fragment.to_dict(),
            "owner": None if self.owner is None else self.owner.to_dict(),
        }

    def to_json(self) -> bytes:
        """Serialise as the bytes of spec.json."""
        return orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> JournalSpec:
        if not isinstance(doc, Mapping) or "name" not in doc:
            raise InvalidJournalSpec(f"a journal spec document needs a name: {doc!r}")
        unknown = set(doc) - {"name", "labels", "fragment", "owner"}
        if unknown:
            raise InvalidJournalSpec(f"unknown journal spec fields {sorted(unknown)} in {doc!r}")
        return cls(
            name=doc["name"],
            labels=doc.get("labels") or {},  # type: ignore[arg-type]
            fragment=FragmentSpec.from_dict(doc.get("fragment") or {}),
            owner=doc.get("owner"),
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> JournalSpec:
        """Parse the bytes of spec.json."""
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise InvalidJournalSpec(f"spec.json is not JSON: {exc}") from None
        return cls.from_dict(doc)
