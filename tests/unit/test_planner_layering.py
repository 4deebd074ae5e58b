"""The planner is pure: importing it pulls in no llama_cpp, zmq, numpy or engine module."""

from __future__ import annotations

import subprocess
import sys


def test_planner_imports_only_stdlib_and_pydantic() -> None:
    code = (
        "import sys, igi_sdk.planner, igi_sdk.planner.planner, igi_sdk.planner.baselines;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('llama_cpp', 'zmq', 'numpy', 'msgpack', 'gguf')"
        " or m.startswith(('igi_sdk.engine', 'igi_sdk.daemon', 'igi_sdk.ipc', 'igi_sdk.profiler')));"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
