"""The consumer is a composition: a `Consumer` holds one input reader and one commit
pipeline, each owning its fields and used through its methods; no mixins, and no module of
the consumer reaches into the private fields of another module's objects."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

from consumer_support import create_journals, echo_consumer, write_upstream

import oncelog.consumer
from oncelog.consumer import STAGES, CheckpointStore, Consumer
from oncelog.consumer._commit import CommitPipeline
from oncelog.consumer._input import InputReader

PACKAGE = Path(oncelog.consumer.__file__).resolve().parent
PARTS = ("core.py", "_input.py", "_commit.py", "_base.py")
"""The modules a consumer is made of."""


def _private_names(tree: ast.Module) -> set[str]:
    """Private names a module's classes define: methods, slots, and attributes assigned
    on `self`."""
    names: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and isinstance(node.ctx, ast.Store)
            ):
                names.add(node.attr)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets)
                and isinstance(node.value, ast.Tuple)
            ):
                names.update(
                    e.value for e in node.value.elts
                    if isinstance(e, ast.Constant) and isinstance(e.value, str)
                )
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def cross_module_private_uses(directory: Path) -> list[str]:
    """Uses, in one of the consumer's modules under `directory`, of a private name that
    only another of them defines, on anything but `self`/`cls` (e.g. the reader setting
    `txn._closing`, a Transaction field): one object reaching into another's fields."""
    trees = {name: ast.parse((directory / name).read_text(encoding="utf-8")) for name in PARTS}
    defined = {name: _private_names(tree) for name, tree in trees.items()}
    found = []
    for name, tree in trees.items():
        others = set().union(*(d for m, d in defined.items() if m != name)) - defined[name]
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in others
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_scan_finds_a_cross_module_private_use(tmp_path: Path) -> None:
    """Guards the scan itself: a reader setting a Transaction's private field is found."""
    for name in PARTS:
        (tmp_path / name).write_text("", encoding="utf-8")
    (tmp_path / "core.py").write_text(
        "class Transaction:\n    def __init__(self):\n        self._closing = False\n",
        encoding="utf-8",
    )
    (tmp_path / "_input.py").write_text(
        "class Reader:\n    def fill(self, txn):\n        txn._closing = True\n",
        encoding="utf-8",
    )
    assert cross_module_private_uses(tmp_path) == ["_input.py:3: txn._closing"]


def test_no_part_uses_another_parts_private_fields() -> None:
    assert cross_module_private_uses(PACKAGE) == []


def test_a_consumer_is_a_composition_not_mixins(memory_store) -> None:
    """`Consumer` has no base class but `object`; it holds one reader and one pipeline,
    which share no mutable field with it (each field has one owner)."""
    assert Consumer.__mro__ == (Consumer, object)
    assert InputReader.__mro__ == (InputReader, object)
    assert CommitPipeline.__mro__ == (CommitPipeline, object)
    client = memory_store.open()
    create_journals(client)
    consumer = echo_consumer(client)
    reader, pipeline = consumer._reader, consumer._pipeline
    assert type(reader) is InputReader and type(pipeline) is CommitPipeline
    # What the parts own (sequencer, inputs, positions, publisher, checkpoint, commits in
    # flight, fencing) is not a field of the consumer.
    for field in ("_seq", "_inputs", "_positions", "_dirty", "_carry", "_publisher",
                  "_fenced", "_jobs", "_gate", "_worker"):
        assert field not in vars(consumer), field
    consumer.close()


def test_the_hooks_tests_use_reach_the_parts(memory_store) -> None:
    """`_on_stage` set after construction reaches the reader (the handler stage) and the
    pipeline (the commit thread's stages); `_store` replaced before recovery is the one
    the pipeline claims checkpoints with."""
    client = memory_store.open()
    create_journals(client)
    write_upstream(client, seed=3, transactions=2)
    consumer = echo_consumer(client, max_messages=5)
    seen: dict[str, set[str]] = {}
    lock = threading.Lock()

    def hook(stage: str) -> None:
        with lock:
            seen.setdefault(stage, set()).add(threading.current_thread().name)

    claims: list[int] = []

    class CountingStore(CheckpointStore):
        def claim(self, cp, data=None):  # type: ignore[no-untyped-def]
            claims.append(cp.seq)
            return super().claim(cp, data)

    old = consumer._store
    consumer._store = CountingStore(old.client, old.group, old.shard, old.shards)
    consumer._on_stage = hook
    assert consumer.run(until_idle=True) >= 2
    consumer.close()
    assert set(STAGES) <= set(seen), seen
    assert seen["handler"] == {threading.current_thread().name}
    assert seen["checkpointed"] == {"oncelog-commit:echo"}
    # Recovery's claim and every commit's went through the replaced store.
    assert claims == list(range(1, consumer.checkpoint_seq + 1))
