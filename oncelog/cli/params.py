"""Parsing of command-line values: durations, byte sizes, labels and storage options.

Each parser raises ValueError with a message naming the bad text; the click parameter types
below turn that into a usage error of the option that carried it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar, cast

import click
import orjson

__all__ = [
    "parse_duration",
    "format_duration",
    "parse_size",
    "format_size",
    "plural",
    "parse_label",
    "parse_storage_option",
    "merge_storage_option",
    "selector_option",
    "format_option",
    "DURATION",
    "SIZE",
    "LABEL",
    "STORAGE_OPTION",
]

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d|w)")
_NUMBER = re.compile(r"\d+(?:\.\d*)?|\.\d+")


def parse_duration(text: str) -> timedelta:
    """A duration such as `30s`, `15m`, `1h`, `2d`, `1h30m` or `500ms`; a bare number is seconds."""
    value = text.strip().lower()
    if _NUMBER.fullmatch(value):
        return timedelta(seconds=float(value))
    pos, seconds = 0, 0.0
    for match in _DURATION_PART.finditer(value):
        if match.start() != pos:
            break
        seconds += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if pos == 0 or pos != len(value):
        raise ValueError(
            f"invalid duration {text!r}: expected a number with a unit ms, s, m, h, d or w "
            "(e.g. 30s, 15m, 1h, 2d, 1h30m)"
        )
    return timedelta(seconds=seconds)


def format_duration(seconds: float) -> str:
    """A short form of a number of seconds that `parse_duration` reads back: `0s`, `250ms`,
    `90s`, `2h`."""
    if 0 < seconds < 1:
        return f"{_plain(seconds * 1000)}ms"
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{_plain(seconds / size)}{unit}"
    return f"{_plain(seconds)}s"


def _plain(number: float) -> str:
    """A number without exponent notation or trailing zeros."""
    return f"{number:.6f}".rstrip("0").rstrip(".")


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "kb": 1000,
    "m": 1 << 20,
    "mib": 1 << 20,
    "mb": 1000**2,
    "g": 1 << 30,
    "gib": 1 << 30,
    "gb": 1000**3,
}
_SIZE = re.compile(r"(\d+(?:\.\d*)?)\s*([a-z]*)")


def parse_size(text: str) -> int:
    """A byte count such as `1048576`, `512k`, `64MiB` or `1GB` (k/M/G and KiB/MiB/GiB are
    binary, KB/MB/GB decimal)."""
    match = _SIZE.fullmatch(text.strip().lower())
    if match is None or match.group(2) not in _SIZE_UNITS:
        raise ValueError(
            f"invalid size {text!r}: expected a number of bytes with an optional unit "
            "k, M, G, KiB, MiB, GiB, KB, MB or GB (e.g. 64MiB)"
        )
    size = int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])
    if size <= 0:
        raise ValueError(f"invalid size {text!r}: must be at least one byte")
    return size


def format_size(size: int | None) -> str:
    """A short human form of a byte count: `512 B`, `64 MiB`, `1.5 GiB`."""
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{size} B" if unit == "B" else f"{value:.4g} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """`count` and `noun`, the noun in its plural form unless count is 1: `1 fragment`,
    `0 fragments`, `3 entries` (with plural_form="entries"). Every count the command line
    prints goes through this, so that it never says "1 fragments"."""
    if count == 1:
        return f"{count} {noun}"
    return f"{count} {plural_form if plural_form is not None else noun + 's'}"


def parse_label(text: str) -> tuple[str, str]:
    """A `NAME=VALUE` label (the value may be empty), both validated by Gazette's rules."""
    from oncelog.labels import validate_label_name, validate_label_value

    name, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"invalid label {text!r}: expected NAME=VALUE")
    validate_label_name(name)
    validate_label_value(value, name)
    return name, value


_OPTION_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def parse_storage_option(text: str) -> tuple[list[str], Any]:
    """A storage option `KEY=VALUE` (a string) or `KEY:=JSON` (a JSON value, e.g. `anon:=true`);
    a dotted KEY such as `client_kwargs.region_name` sets a nested option."""
    key, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"invalid storage option {text!r}: expected KEY=VALUE or KEY:=JSON")
    parsed: Any = value
    if key.endswith(":"):
        key = key[:-1]
        try:
            parsed = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise ValueError(
                f"invalid storage option {text!r}: the value after ':=' is not JSON ({exc})"
            ) from None
    if not _OPTION_KEY.fullmatch(key):
        raise ValueError(
            f"invalid storage option {text!r}: the key must be a name or a dotted path of names"
        )
    return key.split("."), parsed


def merge_storage_option(options: dict[str, Any], path: list[str], value: Any) -> None:
    """Set `options[path[0]][path[1]]... = value`, creating nested dicts on the way."""
    target = options
    for part in path[:-1]:
        nested = target.setdefault(part, {})
        if not isinstance(nested, dict):
            raise ValueError(
                f"storage option {'.'.join(path)!r} nests inside {part!r}, which is not a mapping"
            )
        target = nested
    target[path[-1]] = value


def selector_option(text: str) -> Any:
    """A label selector given to `--selector`; a bad one is a usage error of that option."""
    from oncelog.labels import parse_selector

    try:
        return parse_selector(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--selector'") from None


_T = TypeVar("_T")


class _Parsed(click.ParamType[_T]):
    """A click type that applies one of the parsers above."""

    def __init__(self, name: str, parse: Callable[[str], _T]) -> None:
        self.name = name
        self._parse = parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> _T:
        if not isinstance(value, str):
            return cast(_T, value)  # already parsed: a default or a value passed in Python
        try:
            return self._parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = _Parsed("duration", parse_duration)
SIZE = _Parsed("size", parse_size)
LABEL = _Parsed("name=value", parse_label)
STORAGE_OPTION = _Parsed("key=value", parse_storage_option)


format_option = click.option(
    "--format", "-f", "fmt", type=click.Choice(["table", "json"]), default="table",
    show_default=True,
)
"""`--format table|json` of the commands that list or describe things."""
