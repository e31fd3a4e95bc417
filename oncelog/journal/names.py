"""Validation of journal names and of relative object paths, done before any storage call.

Journal names are Gazette-style paths (`logs/pageviews/part-000`). Every component must be
non-empty, must not start with `.` (which also rules out `.`, `..` and the reserved `.oncelog`
directory, and keeps oncelog's temporary `.tmp-*` files apart from journals), and may hold only
letters, digits and `-_+.=%`. So no name can escape the store root or collide with metadata.
"""

from __future__ import annotations

from oncelog.journal.errors import InvalidJournalName, InvalidObjectPath

__all__ = ["MAX_JOURNAL_NAME_LEN", "validate_journal_name", "validate_object_path"]

MAX_JOURNAL_NAME_LEN = 512
"""Longest accepted journal name, in characters (Gazette's bound)."""

_MAX_OBJECT_PATH_LEN = 1024
_SYMBOLS = frozenset("-_+.=%")


def _bad_component(component: str) -> str | None:
    if not component:
        return "empty path component"
    if component.startswith("."):
        return f"component {component!r} starts with '.'"
    for ch in component:
        if not (ch.isalnum() or ch in _SYMBOLS):
            return f"character {ch!r} is not allowed (letters, digits and -_+.=% only)"
    return None


def validate_journal_name(name: object) -> str:
    """Return `name` if it is a valid journal name, else raise InvalidJournalName saying why."""
    if not isinstance(name, str):
        raise InvalidJournalName(f"journal name must be a str, not {type(name).__name__}: {name!r}")
    if not name:
        raise InvalidJournalName("journal name is empty")
    if len(name) > MAX_JOURNAL_NAME_LEN:
        raise InvalidJournalName(
            f"journal name is {len(name)} characters long, more than {MAX_JOURNAL_NAME_LEN}: "
            f"{name[:40]!r}..."
        )
    if name.startswith("/"):
        raise InvalidJournalName(f"journal name {name!r} starts with '/'")
    for component in name.split("/"):
        problem = _bad_component(component)
        if problem:
            raise InvalidJournalName(f"invalid journal name {name!r}: {problem}")
    return name


def validate_object_path(path: object) -> str:
    """Return `path` if it is a safe relative object path (same rules as journal names),
    else raise InvalidObjectPath."""
    if not isinstance(path, str) or not path:
        raise InvalidObjectPath(f"object path must be a non-empty str: {path!r}")
    if len(path) > _MAX_OBJECT_PATH_LEN or path.startswith("/"):
        raise InvalidObjectPath(f"object path {path[:80]!r} is too long or absolute")
    for component in path.split("/"):
        problem = _bad_component(component)
        if problem:
            raise InvalidObjectPath(f"invalid object path {path!r}: {problem}")
    return path
