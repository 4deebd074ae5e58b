"""The README's quickstart runs as written against a real daemon (only the connection-file path is swapped)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from daemon_process import DaemonProcess

README = Path(__file__).resolve().parents[2] / "README.md"
pytestmark = pytest.mark.timeout(180)


def test_readme_quickstart_runs(running_daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]) -> None:
    block = re.search(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert block is not None, "README has no python quickstart"
    code = block.group(1).replace('"/tmp/igi.json"', repr(str(running_daemon.connection_file)))
    exec(compile(code, "README.md", "exec"), {})  # noqa: S102 - our own README
    out = capsys.readouterr().out
    assert "TTFT" in out and len(out.splitlines()) >= 3
