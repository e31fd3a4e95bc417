"""One SparkSession (local[2], loopback only) for every Spark test, started on first use.

Tests outside tests/spark never load this. The session lets a task fail once and be
retried (`local[2,2]`), which the write tests rely on.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Spark tests share one xdist worker (`--dist loadgroup`): one JVM for the suite
    instead of one per worker, on a 2-core machine the cost of a whole core for a while."""
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here + os.sep):
            item.add_marker(pytest.mark.xdist_group("spark"))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers must run this venv's interpreter
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from oncelog.spark import local_session

    session, started = local_session(
        "oncelog-tests",
        "local[2,2]",
        **{"spark.default.parallelism": "2", "spark.sql.session.timeZone": "UTC"},
    )
    try:
        yield session
    finally:
        if started:
            session.stop()
