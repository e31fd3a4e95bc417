"""The house has no circles and its layers point down (docs/architecture.md, "Layers").

Built from the source: every import a module makes at run time (at module level or inside a
function; imports under `if TYPE_CHECKING:` are annotations only and left out), resolved to
the oncelog module it loads. Two checks: no import circle, and no module importing from a
layer above its own, except the entries of `ALLOWED_UPWARD` (each with its reason).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "oncelog"

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("identity", ("oncelog.identity", "oncelog.errors", "oncelog._retry", "oncelog.labels",
                  "oncelog._extras", "oncelog._lazy")),
    ("message types", ("oncelog.message", "oncelog.producer_transaction")),
    ("framing", ("oncelog.framing", "oncelog._native", "oncelog._bulkframing")),
    ("storage", ("oncelog.journal", "oncelog.coordination")),
    ("sequencing", ("oncelog.sequencing", "oncelog.sequencer", "oncelog.reading",
                    "oncelog.merge")),
    ("producing", ("oncelog.publisher", "oncelog.transactions", "oncelog.mapping",
                   "oncelog.polled", "oncelog.intents")),
    ("applications", ("oncelog.consumer", "oncelog.spark", "oncelog.streaming", "oncelog.cli",
                      "oncelog.arrow", "oncelog.tables", "oncelog.demo", "oncelog.options")),
    ("testing", ("oncelog.testing",)),
)
"""The layers, bottom up, as docs/architecture.md lists them (a module belongs to the layer
of the longest prefix naming it). The package root, which re-exports, is above them all."""

ALLOWED_UPWARD: dict[tuple[str, str], str] = {}
"""(importer, imported) pairs allowed to point up, with why. Empty: none does."""


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _extensions() -> set[str]:
    """The C extension modules (by their sources, built or not): leaves of the graph."""
    return {
        ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts)
        for p in PACKAGE.rglob("*.c")
    }


def _imports(name: str, path: Path, modules: dict[str, Path], ext: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    type_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            type_only.update(id(sub) for stmt in node.body for sub in ast.walk(stmt))
    is_package = path.name == "__init__.py"
    deps: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_only or not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            targets = []
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.append(sub if sub in modules or sub in ext else base)
        for target in targets:
            if target in ext:
                continue  # a C extension imports nothing of oncelog
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and target.startswith("oncelog"):
                deps.add(target)
    return deps


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    ext = _extensions()
    return {name: _imports(name, path, modules, ext) for name, path in modules.items()}


def layer_of(module: str) -> int | None:
    best, level = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), i
    return level


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_every_module_has_a_layer() -> None:
    unplaced = [m for m in import_graph() if m != "oncelog" and layer_of(m) is None]
    assert not unplaced, f"modules in no layer of docs/architecture.md: {unplaced}"


def test_no_import_circle() -> None:
    assert circles(import_graph()) == []


def test_circles_are_found() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_layers_point_down() -> None:
    upward = []
    for module, deps in import_graph().items():
        if module == "oncelog":
            continue
        here = layer_of(module)
        for dep in deps:
            there = layer_of(dep)
            if dep == "oncelog" or (there is not None and here is not None and there > here):
                if (module, dep) not in ALLOWED_UPWARD:
                    upward.append(f"{module} ({LAYERS[here][0] if here is not None else '?'})"
                                  f" -> {dep}")
    assert not upward, "imports pointing up a layer:\n" + "\n".join(sorted(upward))
