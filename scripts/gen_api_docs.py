"""Generate docs/api.md, the API reference, from each public module's `__all__`.

Run `python scripts/gen_api_docs.py` to rewrite docs/api.md, or with `--check` to exit
non-zero when docs/api.md differs from what would be generated (used by the tests).
The output depends only on the code (signatures and first docstring lines), so it is
deterministic.
"""

from __future__ import annotations

import argparse
import enum
import importlib
import inspect
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
API_MD = ROOT / "docs" / "api.md"

MODULES: tuple[tuple[str, str], ...] = (
    ("oncelog", "the everyday names, re-exported"),
    ("oncelog.errors", "the root of every oncelog error, and fencing"),
    ("oncelog.identity", "message identity: UUID layout, clocks, flags, producer IDs, envelopes"),
    ("oncelog.message", "ready message types, and every name of oncelog.identity re-exported"),
    ("oncelog.labels", "label sets and Gazette label selectors"),
    ("oncelog.framing", "content types and frame codecs"),
    ("oncelog.journal", "journals, fragments, stores and the journal client"),
    ("oncelog.mapping", "partition mappings"),
    ("oncelog.publisher", "committed and transactional publishing"),
    ("oncelog.producer_transaction", "one producer transaction: its UUIDs, state and keepalive"),
    ("oncelog.transactions", "transaction records: atomic commits across journals"),
    ("oncelog.sequencer", "read-committed sequencing"),
    ("oncelog.reading", "read-uncommitted and read-committed iterators"),
    ("oncelog.merge", "reading many journals as one stream"),
    ("oncelog.arrow", "read-committed journals as Arrow tables, without Spark"),
    ("oncelog.tables", "journals read as tables: columnar segments, merge-on-read, Delta export"),
    ("oncelog.consumer", "exactly-once consumers and consumer groups"),
    ("oncelog.testing", "hypothesis strategies, reference model, checks for users' tests"),
    ("oncelog.testing.faults", "fault injection: a failing S3 proxy, pausing, killing processes"),
    ("oncelog.spark", "the PySpark data source"),
    ("oncelog.streaming", "the streaming node's Python client (Produce/Consume over gRPC)"),
    ("oncelog.options", "argument parsing shared by the demo and examples (`-o KEY=VALUE`)"),
    ("oncelog.cli", "the `oncelog` command line (console script `oncelog = oncelog.cli:main`)"),
)

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _first_line(obj: Any) -> str:
    if inspect.isclass(obj):
        doc = inspect.cleandoc(obj.__dict__.get("__doc__") or "")  # not a base class's
    else:
        doc = inspect.getdoc(obj) or ""
    if isinstance(obj, enum.Enum) or not doc:
        return ""
    # The first sentence-bearing paragraph, joined onto one line.
    para = doc.strip().split("\n\n", 1)[0]
    return " ".join(line.strip() for line in para.splitlines())


def _signature(obj: Any) -> str:
    try:
        sig = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""
    return _ADDRESS.sub("", sig)


def _kind(obj: Any) -> str:
    if inspect.isclass(obj):
        if issubclass(obj, BaseException):
            return "exception"
        if issubclass(obj, enum.Enum):
            return "enum"
        if getattr(obj, "_is_protocol", False):
            return "protocol"
        return "class"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj):
        return "function"
    if type(obj).__module__ in ("typing", "types", "typing_extensions", "collections.abc"):
        return "type alias"
    if callable(obj):
        return "object"
    return "constant"


def _repr(obj: Any) -> str:
    """repr() made deterministic: sets sorted, memory addresses dropped."""
    if isinstance(obj, (set, frozenset)):
        inner = ", ".join(sorted(repr(v) for v in obj))
        text = f"{type(obj).__name__}({{{inner}}})"
    else:
        text = repr(obj)
    return _ADDRESS.sub("", text)


def _own_doc(obj: Any) -> str:
    """The docstring of a class or callable; constants only carry their type's docstring."""
    if inspect.isclass(obj) or callable(obj):
        return _first_line(obj)
    return ""


def _describe(module: ModuleType, name: str) -> str:
    obj = getattr(module, name)
    kind = _kind(obj)
    if kind == "enum":
        members = ", ".join(m.name for m in obj)  # type: ignore[attr-defined]
        head = f"`{name}` (enum: {members})"
    elif kind == "type alias":
        head = f"`{name}` (type alias) = `{_repr(obj).replace('`', '')}`"
    elif kind == "object":
        head = f"`{name}` ({type(obj).__module__.split('.')[0]} `{type(obj).__name__}`)"
    elif kind == "constant":
        value = _repr(obj)
        if len(value) > 80:
            value = value[:77] + "..."
        head = f"`{name}` = `{value}`"
    elif kind in ("class", "exception", "protocol"):
        sig = _signature(obj) if kind == "class" else ""
        head = f"`{name}{sig}` ({kind})"
    else:
        head = f"`{name}{_signature(obj)}`"
    doc = _own_doc(obj)
    home = getattr(obj, "__module__", None)
    where = ""
    elsewhere = home and home != module.__name__ and home.startswith("oncelog")
    if kind not in ("constant", "type alias") and elsewhere:
        where = f" *(from `{home}`)*"
    return f"- {head}{where}" + (f": {doc}" if doc else "")


def generate() -> str:
    """The text of docs/api.md."""
    out = [
        "# API reference",
        "",
        "<!-- Generated by scripts/gen_api_docs.py from each module's `__all__`; do not edit.",
        "     Regenerate with: .venv/bin/python scripts/gen_api_docs.py -->",
        "",
        "Every public name of oncelog: each module's `__all__`, with its signature and the first",
        "paragraph of its docstring. Concepts are explained in [concepts.md](concepts.md);",
        "start at [index.md](index.md).",
        "",
        "Modules: " + ", ".join(f"[`{m}`](#{m.replace('.', '')})" for m, _ in MODULES),
        "",
    ]
    for modname, what in MODULES:
        module = importlib.import_module(modname)
        names = list(getattr(module, "__all__", ()))
        out += [f"## {modname}", "", f"{what[0].upper()}{what[1:]}.", ""]
        out += [_describe(module, name) for name in names]
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if docs/api.md is stale")
    args = parser.parse_args(argv)
    text = generate()
    if args.check:
        current = API_MD.read_text(encoding="utf-8") if API_MD.exists() else ""
        if current != text:
            print(f"{API_MD.relative_to(ROOT)} is out of date: run scripts/gen_api_docs.py",
                  file=sys.stderr)
            return 1
        print(f"{API_MD.relative_to(ROOT)} is up to date")
        return 0
    API_MD.write_text(text, encoding="utf-8")
    print(f"wrote {API_MD.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
