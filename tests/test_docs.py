"""The documentation stays true: the API reference is complete and current, links
resolve, and the runnable examples of docs/concepts.md run and print what they say."""

from __future__ import annotations

import contextlib
import importlib
import io
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(ROOT / "scripts"))

import gen_api_docs  # noqa: E402

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
RUNNABLE = re.compile(r"<!-- runnable -->\s*\n```python\n(.*?)\n```", re.S)


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("module", [m for m, _ in gen_api_docs.MODULES])
def test_every_public_name_is_in_the_api_reference(module: str) -> None:
    api = (DOCS / "api.md").read_text(encoding="utf-8")
    section = api.split(f"\n## {module}\n", 1)
    assert len(section) == 2, f"docs/api.md has no section for {module}"
    body = section[1].split("\n## ", 1)[0]
    names = importlib.import_module(module).__all__
    assert names, f"{module}.__all__ is empty"
    missing = [n for n in names if not re.search(rf"^- `{re.escape(n)}[`(]", body, re.M)]
    assert not missing, f"{module}: not in docs/api.md: {missing}"


def test_api_reference_is_up_to_date() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_api_docs.py"), "--check"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout


def test_check_reports_a_stale_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "api.md"
    stale.write_text("# API reference\n", encoding="utf-8")
    monkeypatch.setattr(gen_api_docs, "API_MD", stale)
    monkeypatch.setattr(gen_api_docs, "ROOT", tmp_path)
    assert gen_api_docs.main(["--check"]) == 1
    assert gen_api_docs.main([]) == 0  # regenerates
    assert gen_api_docs.main(["--check"]) == 0


def test_generation_is_deterministic() -> None:
    assert gen_api_docs.generate() == gen_api_docs.generate()


def _anchors(md: Path) -> set[str]:
    """GitHub's anchors for the headings of a markdown file."""
    text = re.sub(r"```.*?```", "", md.read_text(encoding="utf-8"), flags=re.S)
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


@pytest.mark.parametrize("md", _markdown_files(), ids=lambda p: p.name)
def test_relative_links_point_to_existing_files(md: Path) -> None:
    text = re.sub(r"```.*?```", "", md.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # absolute URL
        path, _, anchor = target.partition("#")
        linked = (md.parent / path) if path else md
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(target)
    assert not broken, f"{md.relative_to(ROOT)}: broken links {broken}"


def test_docs_index_links_every_page() -> None:
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    linked = {t.split("#", 1)[0] for t in LINK.findall(index)}
    pages = {p.name for p in DOCS.glob("*.md")} - {"index.md"}
    assert pages <= linked, f"docs/index.md does not link {sorted(pages - linked)}"


def _expected_output(code: str) -> list[str]:
    """What a runnable block must print, by the docs' convention: a `print(...)  # text`
    line prints `text`, and `# text` lines right below a print line print more lines."""
    expected: list[str] = []
    after_print = False
    for line in code.splitlines():
        stripped = line.strip()
        if stripped.startswith("print("):
            after_print = True
            same_line = re.search(r"\)\s+# (.*)$", line)
            if same_line:
                expected.append(same_line.group(1))
        elif after_print and stripped.startswith("# "):
            expected.append(stripped[2:])
        else:
            after_print = False
    return expected


def test_concepts_runnable_examples_run_and_print_what_they_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = RUNNABLE.findall((DOCS / "concepts.md").read_text(encoding="utf-8"))
    assert len(blocks) >= 3, "docs/concepts.md lost its runnable examples"
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the examples' stores go here
    namespace: dict = {"__name__": "docs_concepts"}
    for n, code in enumerate(blocks):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"docs/concepts.md block {n}", "exec"), namespace)
        assert out.getvalue().splitlines() == _expected_output(code), f"block {n}"


BLOCK = re.compile(
    r"(?:<!-- (runnable|fragment|node)(?::[^>]*)? -->[ \t]*\n)?```python\n(.*?)\n```", re.S
)
"""A fenced Python block with its marker, if any: `<!-- runnable -->` blocks are run (in
order, sharing one namespace per page) and must print what they say; `<!-- fragment: why
-->` blocks need what a test cannot give them (S3, Spark, names defined elsewhere);
`<!-- node: ... -->` blocks are run against a streaming node (see below)."""

FENCE = re.compile(r"^(?:```|~~~)")
MARKER = re.compile(r"^<!-- (?:runnable|(?:fragment|node): \S[^>]*) -->$")
"""What the line before every fenced block of every page says: `runnable`, or why the
block is not run here (`fragment: needs an S3 bucket`, `fragment: sample output`, ...), or
`node: ...` (run against a streaming node by the test below)."""


def _fenced_blocks(md: Path) -> list[tuple[int, str, str]]:
    """Each fenced block of a page: its opening line's number, the line before it and the
    block's first line."""
    lines = md.read_text(encoding="utf-8").splitlines()
    out, inside = [], False
    for n, text in enumerate(lines):
        if FENCE.match(text):
            if not inside:
                first = lines[n + 1] if n + 1 < len(lines) else ""
                out.append((n + 1, lines[n - 1] if n else "", first))
            inside = not inside
    return out


@pytest.mark.parametrize("md", _markdown_files(), ids=lambda p: p.name)
def test_every_example_runs_or_says_why_not(md: Path) -> None:
    """Every fenced block (Python, shell, console, JSON, plain) of README.md and docs/ is run
    by this module or carries its reason not to be, so an example cannot silently rot."""
    unmarked = [
        f"line {n}: {first[:60]!r}" for n, before, first in _fenced_blocks(md)
        if not MARKER.match(before)
    ]
    assert not unmarked, (
        f"{md.relative_to(ROOT)}: blocks with neither <!-- runnable --> nor "
        f"<!-- fragment: why it is not run -->: {unmarked}"
    )


@pytest.mark.parametrize("md", _markdown_files(), ids=lambda p: p.name)
def test_every_python_block_runs_or_is_marked_a_fragment(
    md: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = BLOCK.findall(md.read_text(encoding="utf-8"))
    unmarked = [code.splitlines()[0] for marker, code in blocks if not marker]
    assert not unmarked, (
        f"{md.name}: Python blocks neither <!-- runnable --> nor <!-- fragment -->, "
        f"starting {unmarked}"
    )
    if md.name in ("concepts.md", "README.md"):
        return  # run by the test above, and by tests/test_readme.py
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"docs_{md.stem}"}
    for n, (marker, code) in enumerate(blocks):
        if marker != "runnable":
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"docs/{md.name} block {n}", "exec"), namespace)
        assert out.getvalue().splitlines() == _expected_output(code), f"{md.name} block {n}"


def test_streaming_first_example_runs_against_a_node(tmp_path: Path) -> None:
    """docs/streaming.md's `node` blocks run as written against a real node (a subprocess
    on a free loopback port standing in for 127.0.0.1:7470) and print what they say."""
    pytest.importorskip("grpc")
    blocks = [code for marker, code in BLOCK.findall(
        (DOCS / "streaming.md").read_text(encoding="utf-8")) if marker == "node"]
    assert blocks, "docs/streaming.md lost its example"
    argv = [sys.executable, "-m", "oncelog.streaming", "--store", str(tmp_path / "store"),
            "--listen", "127.0.0.1:0", "--node-id", "docs", "--tick", "3600"]
    node = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, cwd=ROOT)
    try:
        address = _listening_address(node, timeout=60.0)
        namespace: dict[str, object] = {"__name__": "docs_streaming"}
        for n, code in enumerate(blocks):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(code.replace("127.0.0.1:7470", address),
                             f"docs/streaming.md node block {n}", "exec"), namespace)
            assert out.getvalue().splitlines() == _expected_output(code), f"block {n}"
    finally:
        node.kill()
        node.wait(timeout=30)


def _listening_address(proc: subprocess.Popen[str], timeout: float) -> str:
    """The address of a node's "listening on ADDRESS" line (bounded by `timeout`)."""
    import queue
    import threading

    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no node listening within {timeout} s") from None
        if line is None:
            raise AssertionError(f"the node exited {proc.wait()} before listening")
        if line.startswith("listening on "):
            return line.split()[2]
