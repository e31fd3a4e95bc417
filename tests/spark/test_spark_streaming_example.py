"""examples/spark_streaming.py in the tests' Spark session: a streaming query run twice
from one checkpoint (trigger availableNow) delivers every committed input exactly once."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from oncelog.reading import read_committed, read_uncommitted

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_streaming.py"

pytestmark = pytest.mark.xdist_group("spark")


def load_example():
    spec = importlib.util.spec_from_file_location("spark_streaming", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_streaming_example_is_exactly_once_across_restart(
    spark, local_store, tmp_path, capsys
) -> None:
    example = load_example()
    checkpoint = tmp_path / "checkpoint"
    assert example.main(["--store", local_store.url, "--checkpoint", str(checkpoint)]) == 0
    out = capsys.readouterr().out
    assert "exactly once, none rolled back: True" in out
    assert checkpoint.is_dir()  # the restart resumed from Spark's checkpoint

    client = local_store.open()
    try:
        enriched = [env.message.doc for env in read_committed(client, example.ENRICHED)]
        ids = sorted(doc["id"] for doc in enriched)
        # Two committed transactions (0-5, 6-10) and the one open during run 1 (200, 201);
        # the rolled-back 100-103 never appear.
        assert ids == [*range(11), 200, 201]
        assert all(doc["source"] in example.CLICKS and doc["clicked_at"] for doc in enriched)
        # Two query runs wrote two (or more) micro-batches, each committed by its ACK.
        acks = [e for e in read_uncommitted(client, example.ENRICHED) if e.flags == 2]
        assert len(acks) >= 2
    finally:
        client.close()
