"""Gazette-style labels: multi-valued LabelSets, LabelSelectors and well-known label names.

A *label* is a (name, value) pair attached to a journal; a name may carry several
values. A *selector* such as ``app=web, tier in (a, b), !paused, name:prefix=logs/``
picks the label sets it matches. Names, values, the selector syntax and its
matching rules are those of Gazette (go.gazette.dev/core, `broker/protocol`), so
labels and selectors written for a Gazette broker mean the same here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Union

from oncelog.errors import SelectorError

__all__ = [
    "CONTENT_TYPE",
    "CONTENT_TYPE_CSV",
    "CONTENT_TYPE_JSON_LINES",
    "CONTENT_TYPE_PROTOBUF_FIXED",
    "CONTENT_TYPE_RECOVERY_LOG",
    "MESSAGE_TYPE",
    "MESSAGE_SUB_TYPE",
    "TAG",
    "MANAGED_BY",
    "INSTANCE",
    "REGION",
    "SINGLE_VALUE_LABELS",
    "NAME",
    "PREFIX",
    "PREFIX_SUFFIX",
    "MIN_NAME_LENGTH",
    "MAX_NAME_LENGTH",
    "MAX_VALUE_LENGTH",
    "LabelSet",
    "LabelSelector",
    "SelectorError",
    "LabelsLike",
    "parse_selector",
    "journal_labels",
    "validate_label_name",
    "validate_label_value",
    "check_single_value_labels",
]

# -- well-known label names and values (go.gazette.dev/core/labels) -------------------

CONTENT_TYPE = "content-type"
"""The journal's MIME type; it picks the framing of its messages. Single-valued."""
CONTENT_TYPE_CSV = "text/csv"
"""RFC 4180 CSV records, one message per record."""
CONTENT_TYPE_JSON_LINES = "application/x-ndjson"
"""Newline-delimited JSON documents, one message per line."""
CONTENT_TYPE_PROTOBUF_FIXED = "application/x-protobuf-fixed"
"""Protobuf messages behind a fixed header (magic word, 4-byte little-endian length)."""
CONTENT_TYPE_RECOVERY_LOG = "application/x-gazette-recoverylog"
"""Gazette's shard recovery logs (not a message framing)."""
MESSAGE_TYPE = "app.gazette.dev/message-type"
"""The type of the journal's messages, e.g. a protobuf message name. Single-valued."""
MESSAGE_SUB_TYPE = "app.gazette.dev/message-subtype"
"""The member type, when MESSAGE_TYPE is a union. Single-valued."""
TAG = "app.gazette.dev/tag"
"""Free-form tags refining a journal; may have many values."""
MANAGED_BY = "app.gazette.dev/managed-by"
"""The tool that owns the specification. Single-valued."""
INSTANCE = "app.gazette.dev/instance"
"""The application release a specification belongs to. Single-valued."""
REGION = "app.gazette.dev/region"
"""The journal's geographic region, e.g. ``us-east-1``. Single-valued."""

SINGLE_VALUE_LABELS = frozenset(
    {CONTENT_TYPE, INSTANCE, MANAGED_BY, MESSAGE_SUB_TYPE, MESSAGE_TYPE, REGION}
)
"""Label names that may carry only one value in a journal's labels."""

NAME = "name"
"""Meta-label holding a journal's name; see `journal_labels`."""
PREFIX = "prefix"
"""Meta-label holding each ``/``-terminated prefix of a journal's name."""
PREFIX_SUFFIX = ":prefix"
"""Appended to a selector label's name, makes its values match as prefixes."""

MIN_NAME_LENGTH, MAX_NAME_LENGTH = 2, 64
"""Bounds, in UTF-8 bytes, of a label name."""
MAX_VALUE_LENGTH = 1024
"""Bound, in UTF-8 bytes, of a label value."""

# Gazette's token alphabets: Unicode letters and digits plus a few symbols. Python's
# `\w` is exactly letters, digits and `_` for str patterns.
_NAME_SYMBOLS = "-_+/."
_VALUE_SYMBOLS = "-_+/.=%"
_NAME_OK = re.compile(r"[\w\-+/.]*\Z")
_VALUE_OK = re.compile(r"[\w\-+/.=%]*\Z")
_NAME_BAD_CHAR = re.compile(r"[^\w\-+/.]")
_VALUE_BAD_CHAR = re.compile(r"[^\w\-+/.=%]")


def _byte_length(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def validate_label_name(name: str) -> None:
    """Raise ValueError unless `name` is a valid label name (Gazette's token rules).

    A name is 2 to 64 bytes of Unicode letters, digits and ``- _ + / .``.
    """
    if not isinstance(name, str):
        raise TypeError(f"label name must be a str, not {type(name).__name__} ({name!r})")
    size = _byte_length(name)
    if not MIN_NAME_LENGTH <= size <= MAX_NAME_LENGTH:
        raise ValueError(
            f"invalid label name {name!r}: length {size} byte{'' if size == 1 else 's'}, "
            f"expected {MIN_NAME_LENGTH} to {MAX_NAME_LENGTH}"
        )
    if _NAME_OK.match(name) is None:
        bad = _NAME_BAD_CHAR.search(name)
        assert bad is not None
        raise ValueError(
            f"invalid label name {name!r}: character {bad.group()!r} is not allowed "
            f"(use letters, digits and {' '.join(_NAME_SYMBOLS)})"
        )


def validate_label_value(value: str, name: str | None = None) -> None:
    """Raise ValueError unless `value` is a valid label value (Gazette's rules).

    A value is 0 to 1024 bytes of Unicode letters, digits and ``- _ + / . = %``.
    """
    where = f" of label {name!r}" if name is not None else ""
    if not isinstance(value, str):
        raise TypeError(
            f"label value{where} must be a str, not {type(value).__name__} ({value!r})"
        )
    size = _byte_length(value)
    if size > MAX_VALUE_LENGTH:
        raise ValueError(
            f"invalid label value {value[:40]!r}...{where}: length {size} bytes, "
            f"expected at most {MAX_VALUE_LENGTH}"
        )
    if _VALUE_OK.match(value) is None:
        bad = _VALUE_BAD_CHAR.search(value)
        assert bad is not None
        raise ValueError(
            f"invalid label value {value!r}{where}: character {bad.group()!r} is not allowed "
            f"(use letters, digits and {' '.join(_VALUE_SYMBOLS)})"
        )


def _validate_key(key: str, selector: bool) -> None:
    """Validate a LabelSet key: a label name, or in a selector `name:prefix`."""
    if selector and isinstance(key, str) and key.endswith(PREFIX_SUFFIX):
        validate_label_name(key[: -len(PREFIX_SUFFIX)])
        return
    if isinstance(key, str) and key.endswith(PREFIX_SUFFIX):
        raise ValueError(
            f"invalid label name {key!r}: {PREFIX_SUFFIX!r} is only valid in a LabelSelector"
        )
    validate_label_name(key)


LabelsLike = Union[
    "LabelSet", Mapping[str, Union[str, Iterable[str]]], Iterable[tuple[str, str]], None
]
"""What `LabelSet.from_value` accepts: a LabelSet, a dict of name to value(s), or pairs."""


def _collect(source: Any) -> dict[str, set[str]]:
    """Gather name -> values from a mapping or from (name, value) pairs, checking types."""
    found: dict[str, set[str]] = {}
    if isinstance(source, Mapping):
        for name, values in source.items():
            if isinstance(values, str):
                found.setdefault(name, set()).add(values)
                continue
            if not isinstance(values, Iterable) or isinstance(values, (bytes, bytearray)):
                raise TypeError(
                    f"values of label {name!r} must be a str or a list of str, "
                    f"not {type(values).__name__} ({values!r})"
                )
            values = list(values)
            if not values:
                raise ValueError(f"label {name!r} has an empty list of values")
            for value in values:
                if not isinstance(value, str):
                    raise TypeError(
                        f"value of label {name!r} must be a str, "
                        f"not {type(value).__name__} ({value!r})"
                    )
            found.setdefault(name, set()).update(values)
        return found
    if isinstance(source, (str, bytes, bytearray)) or not isinstance(source, Iterable):
        raise TypeError(
            "labels must be a LabelSet, a dict of label name to value(s) or "
            f"(name, value) pairs, not {type(source).__name__} ({source!r})"
        )
    for pair in source:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise TypeError(f"expected a (name, value) pair, got {pair!r}")
        name, value = pair
        if not isinstance(value, str):
            raise TypeError(
                f"value of label {name!r} must be a str, not {type(value).__name__} ({value!r})"
            )
        found.setdefault(name, set()).add(value)
    return found


def _freeze(found: dict[str, set[str]], selector: bool) -> dict[str, tuple[str, ...]]:
    """Validate gathered labels and return them sorted by name, values sorted and unique."""
    groups: dict[str, tuple[str, ...]] = {}
    for name in sorted(found, key=_sort_key):
        _validate_key(name, selector)
        for value in found[name]:
            validate_label_value(value, name)
        values = tuple(sorted(found[name]))
        if len(values) > 1 and values[0] == "":
            raise ValueError(
                f"label {name!r} has the empty value and other values {list(values)!r}; "
                "an empty value means 'any value' and must stand alone"
            )
        groups[name] = values
    return groups


def _sort_key(name: Any) -> Any:
    # Sorting happens before validation; keep a non-str name from raising TypeError in sort.
    return (0, name) if isinstance(name, str) else (1, repr(name))


class LabelSet:
    """An immutable set of labels: each name maps to one or more sorted, unique values.

    Build it from a dict (``{"app": "web", "tag": ["a", "b"]}``), (name, value) pairs
    or another LabelSet. It is hashable; `add`, `set`, `remove` and `merged` return
    new sets. An empty value ``""`` is allowed only as a name's sole value.
    """

    __slots__ = ("_groups", "_selector", "_hash")

    _groups: dict[str, tuple[str, ...]]
    _selector: bool
    _hash: int | None

    def __init__(self, labels: LabelsLike = None, /) -> None:
        if labels is None:
            groups: dict[str, tuple[str, ...]] = {}
        elif isinstance(labels, LabelSet):
            if labels._selector and any(k.endswith(PREFIX_SUFFIX) for k in labels._groups):
                groups = _freeze({k: set(v) for k, v in labels._groups.items()}, False)
            else:
                groups = labels._groups
        else:
            groups = _freeze(_collect(labels), False)
        self._init(groups, False)

    def _init(self, groups: dict[str, tuple[str, ...]], selector: bool) -> None:
        self._groups = groups
        self._selector = selector
        self._hash = None

    @classmethod
    def _trusted(cls, groups: dict[str, tuple[str, ...]], selector: bool) -> LabelSet:
        new = cls.__new__(cls)
        new._init(groups, selector)
        return new

    @classmethod
    def _for_selector(cls, labels: LabelsLike) -> LabelSet:
        """A LabelSet whose names may end in ':prefix' (only valid inside a LabelSelector)."""
        if isinstance(labels, LabelSet):
            source: Any = {k: set(v) for k, v in labels._groups.items()}
        elif labels is None:
            source = {}
        else:
            source = _collect(labels)
        return cls._trusted(_freeze(source, True), True)

    @classmethod
    def from_value(cls, value: LabelsLike) -> LabelSet:
        """Coerce `value` (a LabelSet, dict, pairs or None) to a LabelSet, validating it."""
        if isinstance(value, LabelSet) and not value._selector:
            return value
        return cls(value)

    # -- reading -----------------------------------------------------------------------

    def values(self, name: str) -> list[str]:
        """The sorted values of label `name`; empty if it is absent."""
        return list(self._groups.get(name, ()))

    def value(self, name: str, default: str | None = None) -> str | None:
        """The single value of label `name`, or `default` if absent.

        Raises ValueError if the label has several values.
        """
        values = self._groups.get(name)
        if values is None:
            return default
        if len(values) != 1:
            raise ValueError(
                f"label {name!r} has {len(values)} values {list(values)!r}, expected one"
            )
        return values[0]

    def names(self) -> list[str]:
        """The label names, sorted."""
        return list(self._groups)

    def to_dict(self) -> dict[str, str | list[str]]:
        """A JSON-friendly dict: a single value as a str, several as a list of str."""
        return {
            name: values[0] if len(values) == 1 else list(values)
            for name, values in self._groups.items()
        }

    # -- deriving new sets --------------------------------------------------------------

    def _with(self, name: str, values: Iterable[str]) -> LabelSet:
        found = {k: set(v) for k, v in self._groups.items()}
        found[name] = set(values)
        return self._trusted(_freeze(found, self._selector), self._selector)

    def add(self, name: str, value: str) -> LabelSet:
        """A new LabelSet with `value` added to the values of `name`."""
        return self._with(name, self._groups.get(name, ()) + (value,))

    def set(self, name: str, value: str | Iterable[str]) -> LabelSet:
        """A new LabelSet in which `name` has exactly `value` (a str or several)."""
        values = [value] if isinstance(value, str) else list(value)
        if not values:
            raise ValueError(f"label {name!r} needs at least one value")
        return self._with(name, values)

    def remove(self, name: str) -> LabelSet:
        """A new LabelSet without label `name` (unchanged if absent)."""
        if name not in self._groups:
            return self
        groups = {k: v for k, v in self._groups.items() if k != name}
        return self._trusted(groups, self._selector)

    def merged(self, other: LabelsLike) -> LabelSet:
        """A new LabelSet with every label of `other`; where both name a label, `other` wins."""
        theirs = other if isinstance(other, LabelSet) else LabelSet(other)
        if not theirs._groups:
            return self
        groups = dict(self._groups)
        groups.update(theirs._groups)
        selector = self._selector or theirs._selector
        return self._trusted({k: groups[k] for k in sorted(groups)}, selector)

    # -- protocols ----------------------------------------------------------------------

    def __contains__(self, item: object) -> bool:
        """``"name" in labels`` tests a name; ``("name", "value") in labels`` a pair."""
        if isinstance(item, tuple) and len(item) == 2:
            return item[1] in self._groups.get(item[0], ())
        return item in self._groups

    def __iter__(self) -> Iterator[tuple[str, str]]:
        for name, values in self._groups.items():
            for value in values:
                yield name, value

    def __len__(self) -> int:
        return sum(len(values) for values in self._groups.values())

    def __bool__(self) -> bool:
        return bool(self._groups)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LabelSet):
            return self._groups == other._groups
        if isinstance(other, Mapping):
            try:
                return self._groups == LabelSet._for_selector(other)._groups
            except (TypeError, ValueError):
                return False
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(tuple(self._groups.items()))
        return self._hash

    def __repr__(self) -> str:
        return f"LabelSet({self.to_dict()!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore_labelset, (tuple(self._groups.items()), self._selector))


def _restore_labelset(items: tuple[tuple[str, tuple[str, ...]], ...], selector: bool) -> LabelSet:
    return LabelSet._trusted(dict(items), selector)


def check_single_value_labels(labels: LabelsLike) -> None:
    """Raise ValueError if a label of SINGLE_VALUE_LABELS (e.g. content-type) has several values."""
    ls = LabelSet.from_value(labels)
    for name in ls.names():
        if name in SINGLE_VALUE_LABELS and len(ls._groups[name]) > 1:
            raise ValueError(
                f"label {name!r} may have only one value, has {ls.values(name)!r}"
            )


def journal_labels(name: str, labels: LabelsLike = None) -> LabelSet:
    """A journal's labels plus its meta-labels, for matching with a LabelSelector.

    Adds ``name`` (the journal name) and ``prefix`` (each ``/``-terminated prefix of
    it), as a Gazette broker does when listing journals; they override labels of the
    same names. ``name=a/b``, ``name:prefix=a/`` and ``prefix=a/`` then select by name.
    """
    meta: dict[str, str | list[str]] = {NAME: name}
    prefixes = [name[: i + 1] for i, char in enumerate(name) if char == "/"]
    if prefixes:
        meta[PREFIX] = prefixes
    return LabelSet.from_value(labels).merged(meta)


# -- selectors -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Group:
    """The compiled requirement on one label name: any value, exact values or prefixes."""

    name: str
    any: bool
    exact: frozenset[str]
    prefixes: tuple[str, ...]

    def hit(self, values: tuple[str, ...]) -> bool:
        if not values:
            return False
        if self.any:
            return True
        exact, prefixes = self.exact, self.prefixes
        for value in values:
            if value in exact or (prefixes and value.startswith(prefixes)):
                return True
        return False


def _compile(labels: LabelSet, side: str) -> tuple[_Group, ...]:
    """Group selector labels by base name: `name` and `name:prefix` form one requirement."""
    exact: dict[str, tuple[str, ...]] = {}
    prefixes: dict[str, tuple[str, ...]] = {}
    for key, values in labels._groups.items():
        if key.endswith(PREFIX_SUFFIX):
            base = key[: -len(PREFIX_SUFFIX)]
            if "" in values:
                raise ValueError(
                    f"invalid label selector: {side} label {key!r} needs a non-empty prefix value"
                )
            prefixes[base] = values
        else:
            exact[key] = values
    groups = []
    for base in sorted(set(exact) | set(prefixes)):
        values = exact.get(base, ())
        wants_any = values == ("",)
        if wants_any and base in prefixes:
            raise ValueError(
                f"invalid label selector: {side} label {base!r} is selected both with any "
                f"value and with prefixes {list(prefixes[base])!r}"
            )
        groups.append(
            _Group(
                name=base,
                any=wants_any,
                exact=frozenset(() if wants_any else values),
                prefixes=prefixes.get(base, ()),
            )
        )
    return tuple(groups)


def _render(labels: LabelSet, exclude: bool) -> list[str]:
    parts = []
    for key, values in labels._groups.items():
        if values == ("",):
            parts.append("!" + key if exclude else key)
        elif len(values) == 1 and (exclude or not values[0].startswith("=")):
            # An included value starting with '=' would read back as part of '=='.
            parts.append(f"{key}{'!=' if exclude else '='}{values[0]}")
        else:
            parts.append(f"{key}{' notin (' if exclude else ' in ('}{','.join(values)})")
    return parts


class LabelSelector:
    """Selects label sets: every `include` name must match one of its values, and no
    `exclude` name may match one of its.

    An empty value selects any value of the name; a name ending in ``:prefix``
    matches values starting with one of its values. Parse Gazette's text syntax with
    `LabelSelector.parse`; ``str(selector)`` gives a canonical text that parses back
    to an equal selector. The empty selector matches everything.
    """

    __slots__ = ("_include", "_exclude", "_inc", "_exc", "_hash")

    def __init__(self, include: LabelsLike = None, exclude: LabelsLike = None) -> None:
        self._include = LabelSet._for_selector(include)
        self._exclude = LabelSet._for_selector(exclude)
        self._inc = _compile(self._include, "include")
        self._exc = _compile(self._exclude, "exclude")
        self._hash: int | None = None

    @property
    def include(self) -> LabelSet:
        """Labels a matched set must have (names may end in ``:prefix``)."""
        return self._include

    @property
    def exclude(self) -> LabelSet:
        """Labels a matched set must not have (names may end in ``:prefix``)."""
        return self._exclude

    @classmethod
    def parse(cls, text: str) -> LabelSelector:
        """Parse Gazette's selector syntax, e.g. ``a=b, c!=d, e in (f,g), h notin (i), j, !k``.

        Raises SelectorError quoting the text and the position of the problem.
        """
        return _Parser(text).parse()

    @classmethod
    def from_value(cls, value: LabelSelector | str | None) -> LabelSelector:
        """Coerce a LabelSelector, selector text or None (select everything) to a LabelSelector."""
        if isinstance(value, LabelSelector):
            return value
        if value is None:
            return _EVERYTHING
        if isinstance(value, str):
            return cls.parse(value)
        raise TypeError(
            f"a selector must be a LabelSelector or a str, not {type(value).__name__} ({value!r})"
        )

    def matches(self, labels: LabelsLike) -> bool:
        """Whether `labels` (a LabelSet or anything LabelSet.from_value takes) is selected."""
        ls = labels if isinstance(labels, LabelSet) else LabelSet.from_value(labels)
        groups = ls._groups
        for group in self._exc:
            if group.hit(groups.get(group.name, ())):
                return False
        for group in self._inc:
            if not group.hit(groups.get(group.name, ())):
                return False
        return True

    def matches_journal(self, name: str, labels: LabelsLike = None) -> bool:
        """Whether the journal `name` with `labels` is selected, meta-labels included."""
        return self.matches(journal_labels(name, labels))

    def __str__(self) -> str:
        return ",".join(_render(self._include, False) + _render(self._exclude, True))

    def __repr__(self) -> str:
        return f"LabelSelector({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LabelSelector):
            return self._include == other._include and self._exclude == other._exclude
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash((self._include, self._exclude))
        return self._hash

    def __reduce__(self) -> tuple[Any, ...]:
        return (LabelSelector.parse, (str(self),))


def parse_selector(text: str) -> LabelSelector:
    """Parse Gazette's label selector syntax; see `LabelSelector.parse`."""
    return LabelSelector.parse(text)


# -- the selector parser -------------------------------------------------------------------

_SPACE = re.compile(r"\s*")
_NAME_TOKEN = re.compile(r"[\w\-+/.]+")
_VALUE_TOKEN = re.compile(r"[\w\-+/.=%]+")
_WORD = re.compile(r"[A-Za-z]+")


@dataclass(slots=True)
class _Term:
    key: str  # label name, with ':prefix' appended for a prefix match
    value: str  # "" means any value
    exclude: bool
    position: int  # where the term's label name starts (for error messages)
    value_position: int


class _Parser:
    """A small recursive-descent parser of selector text, remembering positions for errors."""

    def __init__(self, text: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"selector text must be a str, not {type(text).__name__} ({text!r})")
        self.text = text
        self.pos = 0
        self.terms: list[_Term] = []

    def fail(self, reason: str, position: int | None = None) -> SelectorError:
        at = self.pos if position is None else position
        if reason.startswith("expected") and at < len(self.text):
            reason += f", found {self.text[at]!r}"
        return SelectorError(self.text, reason, at)

    def skip_space(self) -> None:
        match = _SPACE.match(self.text, self.pos)
        assert match is not None
        self.pos = match.end()

    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def token(self, pattern: re.Pattern[str]) -> str:
        match = pattern.match(self.text, self.pos)
        if match is None:
            return ""
        self.pos = match.end()
        return match.group()

    def parse(self) -> LabelSelector:
        self.skip_space()
        while not self.at_end():
            self.expression()
            self.skip_space()
            if self.at_end():
                break
            if self.peek() != ",":
                raise self.fail("expected ',' or the end")
            self.pos += 1
            self.skip_space()
        return self.build()

    def expression(self) -> None:
        start = self.pos
        if self.peek() == "!":
            self.pos += 1
            self.skip_space()
            name_at = self.pos
            name = self.token(_NAME_TOKEN)
            if not name:
                raise self.fail("expected a label name after '!'")
            if self.peek() == ":":
                raise self.fail(f"{PREFIX_SUFFIX!r} needs a value, as in 'name:prefix!=value'")
            self.terms.append(_Term(name, "", True, name_at, name_at))
            return
        name = self.token(_NAME_TOKEN)
        if not name:
            raise self.fail("expected a label name or '!'")
        key = name + self.prefix_suffix()
        self.skip_space()
        char = self.peek()
        if char in ("", ","):
            if key != name:
                raise self.fail(f"{PREFIX_SUFFIX!r} needs a value, as in 'name:prefix=value'")
            self.terms.append(_Term(key, "", False, start, start))
        elif char == "=":
            self.pos += 2 if self.text.startswith("==", self.pos) else 1
            self.single_value(key, False, start)
        elif char == "!":
            if not self.text.startswith("!=", self.pos):
                raise self.fail("expected '!='")
            self.pos += 2
            self.single_value(key, True, start)
        else:
            word_at = self.pos
            word = self.token(_WORD)
            if word == "in":
                self.value_set(key, False, start)
            elif word == "notin":
                self.value_set(key, True, start)
            elif word == "not":
                self.skip_space()
                if self.token(_WORD) != "in":
                    raise self.fail("expected 'in' after 'not'")
                self.value_set(key, True, start)
            else:
                raise self.fail("expected '=', '!=', 'in', 'notin', ',' or the end", word_at)

    def prefix_suffix(self) -> str:
        if self.peek() != ":":
            return ""
        colon = self.pos
        self.pos += 1
        if self.token(_WORD) != PREFIX_SUFFIX[1:]:
            raise self.fail(f"expected {PREFIX_SUFFIX!r}", colon)
        return PREFIX_SUFFIX

    def single_value(self, key: str, exclude: bool, start: int) -> None:
        self.skip_space()
        value_at = self.pos
        value = self.token(_VALUE_TOKEN)
        if not value:
            raise self.fail("expected a value")
        self.terms.append(_Term(key, value, exclude, start, value_at))

    def value_set(self, key: str, exclude: bool, start: int) -> None:
        self.skip_space()
        if self.peek() != "(":
            raise self.fail(f"expected '(' after '{'notin' if exclude else 'in'}'")
        opened = self.pos
        self.pos += 1
        count = 0
        while True:
            self.skip_space()
            if self.at_end():
                raise self.fail("unclosed '('", opened)
            if self.peek() == ")" and count:
                self.pos += 1
                return
            value_at = self.pos
            value = self.token(_VALUE_TOKEN)
            if not value:
                if self.peek() == ")":
                    raise self.fail("empty set '()'", opened)
                raise self.fail("expected a value")
            self.terms.append(_Term(key, value, exclude, start, value_at))
            count += 1
            self.skip_space()
            if self.at_end():
                raise self.fail("unclosed '('", opened)
            char = self.peek()
            if char == ",":
                self.pos += 1
            elif char == ")":
                self.pos += 1
                return
            else:
                raise self.fail("expected ',' or ')'")

    def build(self) -> LabelSelector:
        """Check names and values, then assemble; errors point at the offending term."""
        sides: tuple[dict[str, set[str]], dict[str, set[str]]] = ({}, {})
        for term in self.terms:
            base = term.key[: -len(PREFIX_SUFFIX)] if term.key.endswith(PREFIX_SUFFIX) else term.key
            try:
                validate_label_name(base)
            except ValueError as err:
                raise self.fail(str(err), term.position) from None
            try:
                validate_label_value(term.value, base)
            except ValueError as err:
                raise self.fail(str(err), term.value_position) from None
            side = sides[term.exclude]
            # An "any value" term may not share a name with specific values or prefixes.
            exact = side.get(base, set())
            if term.value == "":
                clash = bool(exact - {""}) or bool(side.get(base + PREFIX_SUFFIX))
            else:
                clash = "" in exact
            if clash:
                raise self.fail(
                    f"label {base!r} is selected both with any value and with specific values",
                    term.position,
                )
            side.setdefault(term.key, set()).add(term.value)
        include, exclude = sides[False], sides[True]
        return LabelSelector(include, exclude)


_EVERYTHING = LabelSelector()
