"""examples/streaming_service.py, run as a user runs it, on local disk and on S3."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from oncelog.testing.fixtures import StoreTarget

ROOT = Path(__file__).resolve().parents[2]


def test_streaming_service_example(any_store: StoreTarget) -> None:
    argv = [sys.executable, str(ROOT / "examples" / "streaming_service.py"), "--store",
            any_store.url, "--messages", "60"]
    for key, value in any_store.storage_options.items():
        argv += ["-o", f"{key}={json.dumps(value)}"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "every message exactly once: True" in proc.stdout
    assert "consumed 32 messages of vchannel orders" in proc.stdout
