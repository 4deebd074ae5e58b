"""``processes.process_age_s``: how long a process has run, from ``/proc`` (the worker's ``worker_loaded`` log line
reports its own at the start of its code)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from igi_sdk.processes import process_age_s

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="/proc")


def test_a_process_age_grows_with_its_life_and_a_missing_process_has_none() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        young = process_age_s(child.pid)
        time.sleep(0.3)
        older = process_age_s(child.pid)
        mine = process_age_s(os.getpid())
        assert young is not None and older is not None and mine is not None
        assert 0.0 <= young < older and older - young >= 0.2  # clock ticks: 10 ms
        assert mine >= older  # this test's process started before its child
    finally:
        child.kill()
        child.wait()
    assert process_age_s(int(Path("/proc/sys/kernel/pid_max").read_text()) + 1) is None
