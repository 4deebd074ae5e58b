"""Fixtures of the plugin suites: the self-contained daemon bundle, built once per test run, and an environment
without Python in which the C# and C++ suites start it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def daemon_bundle() -> Path:
    """``build/bundle/igi-daemon``: built by ``packaging/build_bundle.py`` (the command ``./dev.sh bundle`` runs),
    which keeps a bundle whose inputs did not change, so both plugin suites of one run share one build."""
    proc = subprocess.run([sys.executable, str(REPO / "packaging" / "build_bundle.py")], cwd=REPO, capture_output=True,
                          text=True, timeout=1800, check=False)
    assert proc.returncode == 0, f"bundle build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    bundle = Path(proc.stdout.strip().splitlines()[-1])
    assert (bundle / ("igi-daemon.exe" if os.name == "nt" else "igi-daemon")).is_file(), proc.stderr[-3000:]
    return bundle


@pytest.fixture
def no_python_env(tmp_path: Path) -> dict[str, str]:
    """The test process's environment with an empty PATH and no Python variables: a game's machine without Python.
    Programs the suites need (mono) are started by absolute path."""
    empty = tmp_path / "path-without-python"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k not in ("VIRTUAL_ENV", "PATH")}
    env["PATH"] = str(empty)
    for name in ("python", "python3", "pip", "pip3"):
        assert shutil.which(name, path=env["PATH"]) is None
    return env


#: How long the launcher tests wait for a daemon killed with SIGKILL to serve again (new connection file). A
#: liveness bound, not the speed target: restart time is a measured figure (docs/benchmarks.md, "Daemon bundle"),
#: and a timed test at the 5 s target would fail with the host's load rather than with the launcher.
RESTART_LIMIT_S = 30.0


@pytest.fixture
def restart_limit_s() -> float:
    """The launchers' restart wait (``IGI_RESTART_LIMIT_S`` for the C# and C++ test programs)."""
    return RESTART_LIMIT_S
