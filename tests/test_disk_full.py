"""A full disk: appends fail with a clear error, nothing acknowledged is lost, no partial
fragment becomes part of the journal, and appends work again once there is room.

The store lives on a real 2 MiB tmpfs when this process may mount one (root, as on the
project's machines); otherwise the same scenario runs with ENOSPC injected into the local
backend's writes, so the test always runs."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import oncelog.journal.backends.local as backends
from oncelog import open_journals
from oncelog.journal import AppendFailed, JournalSpec

pytestmark = pytest.mark.fault


@pytest.fixture
def small_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str]]:
    """A directory on a 2 MiB filesystem: ("tmpfs", path) or ("injected", path)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = (
        os.geteuid() == 0
        and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)],
            capture_output=True,
            timeout=30,
        ).returncode
        == 0
    )
    if mounted:
        try:
            yield disk, "tmpfs"
        finally:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=30)
        return
    # No mount allowed: writes into the store fail with ENOSPC past 2 MiB in all.
    used = {"bytes": 0}
    real_write = os.write

    def write(fd: int, data: bytes | memoryview) -> int:
        try:
            in_store = os.readlink(f"/proc/self/fd/{fd}").startswith(str(disk))
        except OSError:
            in_store = False
        if in_store:
            if used["bytes"] + len(data) > (2 << 20):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            used["bytes"] += len(data)
        return real_write(fd, data)

    monkeypatch.setattr(backends.os, "write", write)
    yield disk, "injected"


def test_full_disk_fails_appends_cleanly_and_loses_nothing(small_disk: tuple[Path, str]) -> None:
    disk, _how = small_disk
    client = open_journals(str(disk / "store"), retry_timeout=0.5)
    client.create(JournalSpec("full/j"))
    acknowledged = [client.append("full/j", b'{"n":%d}\n' % i) for i in range(20)]
    before = client.read("full/j").read()
    head = client.head("full/j")
    assert head == acknowledged[-1].end
    with pytest.raises(AppendFailed, match=r"journal 'full/j'.*(No space|ENOSPC|Errno 28)"):
        client.append("full/j", b"x" * (3 << 20) + b"\n")
    # Nothing of the failed append is part of the journal; what was acknowledged stays.
    fresh = open_journals(str(disk / "store"))
    assert fresh.head("full/j") == head
    assert fresh.read("full/j").read() == before
    # No temporary or unclaimed debris is left taking the space.
    leftovers = [p.name for p in (disk / "store" / "full" / "j").iterdir()]
    assert all(not name.startswith(".tmp-") for name in leftovers)
    # Once there is room again (the failed append's bytes were never kept), appends work.
    after = client.append("full/j", b'{"n":"after"}\n')
    assert after.begin == head
    assert fresh.read("full/j").read() == before + b'{"n":"after"}\n'
    client.close()
    fresh.close()
