"""Journal specifications: name, labels, fragment policy and owner, stored as spec.json."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Mapping, Sequence

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

__all__ = [
    "DEFAULT_FRAGMENT_LENGTH",
    "FragmentSpec",
    "JournalOwner",
    "JournalSpec",
    "format_retention",
    "parse_retention",
]

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

    `compact_after`: 0 (off) or a number of small fragments; once an appending client has
    seen that many claimed fragments past the journal's newest compaction record, a
    background thread of the client compacts the journal behind its head (see
    oncelog.journal.compaction; appends are never blocked by it). `retention`: seconds (or
    a timedelta, or a Gazette duration such as `720h`) that data is kept; 0 keeps it
    forever. `JournalClient.trim(name)` (and auto-compaction, when enabled) deletes whole
    fragments older than that, oldest first. Both are left out of spec.json while 0, so
    specs without them read and write exactly as before.
    """

    length: int = DEFAULT_FRAGMENT_LENGTH
    compression: str = "none"
    flush_interval: float = 0.0
    compact_after: int = 0
    retention: float = 0.0

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
        after = self.compact_after
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise InvalidJournalSpec(
                f"compact_after must be an int >= 0 (0: off), not {self.compact_after!r}"
            )
        object.__setattr__(self, "retention", parse_retention(self.retention))

    @property
    def codec(self) -> Codec:
        """The codec fragments are written with."""
        return Codec.from_compression(self.compression)

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "length": self.length,
            "compression": self.compression,
            "flush_interval": self.flush_interval,
        }
        # Only when set: older oncelog versions reject unknown fields.
        if self.compact_after:
            doc["compact_after"] = self.compact_after
        if self.retention:
            doc["retention"] = format_retention(self.retention)
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> FragmentSpec:
        unknown = set(doc) - {
            "length", "compression", "flush_interval", "compact_after", "retention"
        }
        if unknown:
            raise InvalidJournalSpec(f"unknown fragment spec fields {sorted(unknown)}")
        return cls(**doc)


_GO_UNITS = {
    "ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0
}
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|\u00b5s|ms|s|m|h)")


def parse_retention(value: object) -> float:
    """Seconds of a retention given as seconds (int or float), a timedelta, or a Gazette
    (Go) duration string such as `720h`, `1h30m`, `90s` or `720h0m0s`; InvalidJournalSpec
    unless finite and >= 0."""
    seconds: float
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, str):
        text, pos, seconds = value.strip(), 0, 0.0
        for match in _GO_PART.finditer(text):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _GO_UNITS[match.group(2)]
            pos = match.end()
        if text != "0" and (pos == 0 or pos != len(text)):
            raise InvalidJournalSpec(
                f"retention {value!r} is not a duration such as 720h, 1h30m or 90s"
            )
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise InvalidJournalSpec(
            f"retention must be seconds, a timedelta or a duration like '720h': {value!r}"
        )
    if not (math.isfinite(seconds) and seconds >= 0):
        raise InvalidJournalSpec(
            f"retention must be finite and >= 0 (0: keep forever), not {value!r}"
        )
    return seconds


def format_retention(seconds: float) -> str:
    """A retention in Gazette's (Go's) duration form: `720h0m0s`, `1m30s`, `1.5s`."""
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{secs + (seconds - whole):.9f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    if minutes:
        return f"{minutes}m{text}"
    return text


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


@dataclass(frozen=True, slots=True, init=False)
class JournalSpec:
    """A journal's specification. `labels` takes a LabelSet or a plain dict (stored as a
    LabelSet); its `content-type` label picks the framing (default `application/x-ndjson`).
    `fragment` and `owner` take their classes or plain dicts."""

    name: str
    labels: LabelSet = field(default_factory=LabelSet)
    fragment: FragmentSpec = field(default_factory=FragmentSpec)
    owner: JournalOwner | None = None
    incarnation: str | None = field(default=None, compare=False)
    """Set by `JournalClient.create`: a random token naming this creation of the journal.
    Claims carry it, so a journal deleted and created again under the same name is never
    read as a continuation of the old one. Not compared: two specs with the same settings
    are equal whichever creation they come from."""

    def __init__(
        self,
        name: str,
        labels: LabelSet | Mapping[str, str | Sequence[str]] | None = None,
        fragment: FragmentSpec | Mapping[str, Any] | None = None,
        owner: JournalOwner | Mapping[str, str] | None = None,
        incarnation: str | None = None,
    ) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "labels", LabelSet() if labels is None else labels)
        object.__setattr__(self, "fragment", FragmentSpec() if fragment is None else fragment)
        object.__setattr__(self, "owner", owner)
        object.__setattr__(self, "incarnation", incarnation)
        self._check()

    def _check(self) -> None:
        """Validate the fields and normalise dicts into LabelSet, FragmentSpec, JournalOwner."""
        validate_journal_name(self.name)
        try:
            labels = LabelSet.from_value(self.labels)
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
            **({} if self.incarnation is None else {"incarnation": self.incarnation}),
        }

    def to_json(self) -> bytes:
        """Serialise as the bytes of spec.json."""
        return orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> JournalSpec:
        if not isinstance(doc, Mapping) or "name" not in doc:
            raise InvalidJournalSpec(f"a journal spec document needs a name: {doc!r}")
        unknown = set(doc) - {"name", "labels", "fragment", "owner", "incarnation"}
        if unknown:
            raise InvalidJournalSpec(f"unknown journal spec fields {sorted(unknown)} in {doc!r}")
        return cls(
            name=doc["name"],
            labels=doc.get("labels") or {},
            fragment=FragmentSpec.from_dict(doc.get("fragment") or {}),
            owner=doc.get("owner"),
            incarnation=_incarnation(doc.get("incarnation")),
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> JournalSpec:
        """Parse the bytes of spec.json."""
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise InvalidJournalSpec(f"spec.json is not JSON: {exc}") from None
        return cls.from_dict(doc)


def _incarnation(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 64 or not value.isalnum():
        raise InvalidJournalSpec(f"bad journal incarnation {value!r}: expected a token")
    return value
