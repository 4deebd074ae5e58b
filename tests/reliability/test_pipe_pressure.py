"""Reliability: a session save beside a generation larger than the worker pipe (a 400 KB image turn, a 64k-character
line), sent in one poll tick many times, beside session loads and budget changes: every request is answered once, no
hang, heartbeats stay prompt. The short form (CI); ``python -m tests.reliability.long_form pipe`` runs 200 tries."""

from __future__ import annotations

from pathlib import Path

import pytest
from daemon_process import DaemonProcess

from igi_sdk.model_store import default_model_path
from igi_sdk.synthetic_vision import write_synthetic_mmproj
from reliability.peers import p99
from reliability.pipe_pressure import save_beside_large_turns

pytestmark = pytest.mark.timeout(600)


def test_saves_beside_large_image_and_text_turns_never_hang_the_daemon(tmp_path: Path) -> None:
    default_model_path()
    mmproj = write_synthetic_mmproj(tmp_path / "mmproj.gguf", "smolvlm_tiny")
    # the worker at the daemon's priority: the test is about the pipe, and a worker at SCHED_IDLE on a machine that
    # runs other jobs may not get the CPU to answer at all
    args = ["--mmproj", str(mmproj), "--n-ctx", "2048", "--always-reload", "true", "--worker-nice", "0"]
    daemon = DaemonProcess(args).start()
    result = save_beside_large_turns(daemon, tries=16, workdir=tmp_path, images=True)
    assert result.hangs == 0 and result.tries == 16, daemon.log_tail()
    assert not result.problems, result.problems
    assert result.image_bytes > 400_000
    assert p99(result.heartbeat_ms) < 250.0, sorted(result.heartbeat_ms)[-5:]
    daemon.stop()
