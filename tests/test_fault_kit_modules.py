"""The fault kit's layout: the S3 proxy (oncelog.testing.s3proxy) and the process kit
(oncelog.testing.processes) are separate modules, and oncelog.testing.faults re-exports every
public name of both, as the same objects, so existing imports keep working."""

from __future__ import annotations

import oncelog.testing.faults as faults
import oncelog.testing.processes as processes
import oncelog.testing.s3proxy as s3proxy


def test_faults_reexports_both_modules_unchanged() -> None:
    both = set(s3proxy.__all__) | set(processes.__all__)
    assert sorted(faults.__all__) == sorted(both - {"WRITE_METHODS"})
    for name in s3proxy.__all__:
        assert getattr(faults, name) is getattr(s3proxy, name), name
    for name in processes.__all__:
        assert getattr(faults, name) is getattr(processes, name), name
    # Public in faults before the split without being in its __all__.
    assert faults.WRITE_METHODS is processes.WRITE_METHODS
    assert "WRITE_METHODS" not in faults.__all__


def test_the_two_tools_do_not_depend_on_each_other() -> None:
    assert "S3FaultProxy" not in vars(processes) and "start_function" not in vars(s3proxy)
    assert faults.S3FaultProxy.__module__ == "oncelog.testing.s3proxy"
    assert faults.Child.__module__ == "oncelog.testing.processes"
