"""The README's tour runs as written and prints what it says it prints."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import oncelog

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_tour_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README has no python example"
    tour = blocks[0]
    assert len(tour.strip().splitlines()) <= 20
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(tour, "README.md", "exec"), {})
    assert out.getvalue().strip() == "[1, 2]"
    assert "# [1, 2]" in tour


def test_top_level_names() -> None:
    for name in ["open_journals", "JournalSpec", "FragmentSpec", "Envelope", "Flags", "Clock",
                 "build_uuid", "get_clock", "get_flags", "get_producer_id", "new_producer_id",
                 "JSONMessage", "CSVRecord", "Publisher", "Sequencer", "QueueOutcome",
                 "ProducerState", "read_uncommitted", "read_committed"]:
        assert hasattr(oncelog, name), name


def test_readme_opens_with_the_two_commands() -> None:
    text = README.read_text()
    commands = re.findall(r"```sh\n(.*?)```", text, re.S)
    assert commands[0].strip() == "bash scripts/demo.sh"
    assert commands[1].strip() == "bash scripts/test.sh"
    ci = (README.parent / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in ci
