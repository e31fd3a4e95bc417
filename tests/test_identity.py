"""oncelog.identity and oncelog.message: identity below the framings, message types between.

`oncelog.identity` (UUID layout, clocks, flags, producer IDs, `Envelope`) imports nothing
else from oncelog; `oncelog.message` (the ready message types) imports identity but no
framing, at module level or inside a function, so `framing -> message -> framing` cannot
come back. `oncelog.message` still exports every name it always has.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import oncelog.framing.jsonlines as jsonlines
from oncelog import identity, message
from oncelog.errors import BadMessage, OncelogError
from oncelog.framing import MalformedFrame
from oncelog.message import JSONLine

PACKAGE = Path(identity.__file__).resolve().parent


def _oncelog_imports(module_file: Path) -> set[str]:
    """Every oncelog module `module_file` imports, at any depth (functions included)."""
    tree = ast.parse(module_file.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{module_file}: relative import"
            base = node.module or ""
            found.update(f"{base}.{a.name}" for a in node.names)
            found.add(base)
    return {name for name in found if name == "oncelog" or name.startswith("oncelog.")}


def test_identity_imports_nothing_else_from_oncelog() -> None:
    # But the clock's optional C state, `oncelog._bulk`: an extension that imports nothing
    # from oncelog (only orjson and time), so identity stays a leaf of the package's graph.
    assert _oncelog_imports(PACKAGE / "identity.py") <= {"oncelog._bulk", "oncelog._bulk.ClockCore"}
    imported = re.findall(r'PyImport_ImportModule\("([^"]+)"\)',
                          (PACKAGE / "_bulk.c").read_text(encoding="utf-8"))
    assert imported and not [m for m in imported if m.split(".")[0] == "oncelog"], imported


def test_message_types_import_identity_and_errors_but_no_framing() -> None:
    imports = _oncelog_imports(PACKAGE / "message.py")
    assert not [m for m in imports if m.startswith("oncelog.framing")], imports
    assert imports and all(m.startswith(("oncelog.identity", "oncelog.errors")) for m in imports)


@pytest.mark.parametrize("name", sorted(p.stem for p in (PACKAGE / "framing").glob("*.py")))
def test_framings_take_identity_from_its_home(name: str) -> None:
    imports = _oncelog_imports(PACKAGE / "framing" / f"{name}.py")
    identity_names = set(identity.__all__) | {"_NIL_FIELDS"}
    from_message = {m.rpartition(".")[2] for m in imports if m.startswith("oncelog.message.")}
    assert not from_message & identity_names, f"oncelog.framing.{name}: {from_message}"


def test_message_exports_identity_names_as_the_same_objects() -> None:
    assert set(identity.__all__) <= set(message.__all__)
    for name in identity.__all__:
        assert getattr(message, name) is getattr(identity, name), name
    for name in ("JSONMessage", "JSONLine", "CSVRecord", "ProtoMessage", "prime_ids"):
        assert getattr(message, name).__module__ == "oncelog.message", name
        assert not hasattr(identity, name), name


BAD = b'{"a":,"uuid":"00000000-0000-1000-8000-010203040506"}\n'


def test_a_malformed_json_line_is_decoded_again_by_the_json_framing() -> None:
    assert JSONLine._reparse is jsonlines._reparse_line
    line = JSONLine(BAD, journal="lazy/bad", begin=10)
    with pytest.raises(MalformedFrame) as info:
        line.doc
    err = info.value
    assert (err.journal, err.begin, err.end) == ("lazy/bad", 10, 10 + len(BAD))
    assert "lazy/bad" in str(err)
    assert isinstance(err, OncelogError)


def test_without_the_json_framing_a_malformed_line_is_a_bad_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(JSONLine, "_reparse", message._reject_line)
    line = JSONLine(b"[1, 2]\n", journal="lazy/bad2", begin=7)
    with pytest.raises(BadMessage, match="not a JSON object") as info:
        line.doc
    assert (info.value.journal, info.value.begin, info.value.end) == ("lazy/bad2", 7, 14)
    assert "journal lazy/bad2: bad message at offset 7-14" in str(info.value)
