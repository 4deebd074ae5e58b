"""``processes.ProcessWatch``: whether a process taken hold of while it ran has exited since, through a pidfd where
the kernel has them and by probing the pid elsewhere (the fallback is forced here by hiding ``os.pidfd_open``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from igi_sdk import processes
from igi_sdk.processes import ProcessWatch

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX pids")

WAYS = ["pidfd", "probe"]


@pytest.fixture(params=WAYS)
def way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "pidfd" and not hasattr(os, "pidfd_open"):
        pytest.skip("no os.pidfd_open")
    if request.param == "probe":
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    return str(request.param)


def _exits_within(watch: ProcessWatch, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not watch.exited():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_running_process_has_not_exited_and_a_killed_one_has(way: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    watch = ProcessWatch.open(child.pid)
    try:
        assert (watch._pidfd is not None) == (way == "pidfd")
        assert not watch.exited() and not watch.exited()
        child.kill()
        child.wait()  # reaped: with the probe, the pid names no process now
        assert _exits_within(watch, 5.0)
        assert watch.exited()  # and stays so
    finally:
        watch.close()
        watch.close()  # closing twice is harmless


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no os.pidfd_open")
def test_a_child_not_yet_reaped_has_exited_for_the_pidfd() -> None:
    """A child not yet reaped still has its pid, which the probe cannot tell from a running process (the game is
    never the daemon's child); the pidfd sees it exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    watch = ProcessWatch.open(child.pid)
    try:
        assert _exits_within(watch, 10.0)
    finally:
        watch.close()
        child.wait()


def test_a_pid_no_process_has_is_refused_at_open(way: str) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    no_such_pid = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1 if Path("/proc").exists() else gone.pid
    for pid in (gone.pid, no_such_pid, 0, -1):
        with pytest.raises(ProcessLookupError):
            ProcessWatch.open(pid)


def test_the_probe_tells_a_reused_pid_by_its_start_time(monkeypatch: pytest.MonkeyPatch) -> None:
    if not Path("/proc/self/stat").exists():
        pytest.skip("/proc")
    monkeypatch.delattr(os, "pidfd_open", raising=False)
    watch = ProcessWatch.open(os.getpid())
    assert not watch.exited()
    start = processes.process_start_ticks(os.getpid())
    assert start is not None
    monkeypatch.setattr(processes, "process_start_ticks", lambda pid: start + 1)  # the pid went to another process
    assert watch.exited()
