"""examples/spark_*.py run against the S3 test server, in the tests' Spark session."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# Keep the Spark tests on one test worker (`--dist loadgroup`): one SparkSession.
pytestmark = [pytest.mark.xdist_group("spark"), pytest.mark.s3]


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_spark_pageviews_counts_committed_views_from_s3(spark, s3_server, s3_store, capsys) -> None:
    example = load_example("spark_pageviews")
    argv = ["--store", s3_store.url, "--endpoint-url", s3_server.endpoint, "--key", "testing",
            "--secret", "testing"]
    assert example.main(argv) == 0
    out = capsys.readouterr().out
    assert "match read_committed: True" in out

    client = s3_store.open()
    counts = example.counts_in_journal(client)
    assert counts == example.expected_counts(client)
    # Rolled-back and open transactions are not counted; committed ones are, once.
    assert 0 < sum(counts.values()) < example.views_published(client)
    assert all(line.split()[0] in counts for line in out.splitlines()[:-1])
    client.close()
