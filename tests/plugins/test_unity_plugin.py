"""Unity (C#) plugin: builds the core library and console tests with Mono's mcs, runs them.

The console runner (plugins/unity/Tests) prints one PASS/FAIL line per test and ends with exactly
``N passed, N failed``. Conformance covers every entry of ipc/vectors; the live tests talk to a real daemon
(``running_daemon``) serving the real default model.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

REPO = Path(__file__).resolve().parents[2]
UNITY = REPO / "plugins" / "unity"
VECTORS = REPO / "ipc" / "vectors"
TESTS_EXE = UNITY / "build" / "Igi.Tests.exe"
SUMMARY = re.compile(r"(\d+) passed, (\d+) failed")
LIVE_TESTS = {
    "live:handshake", "live:status", "live:create_and_close_session", "live:generate_streams_greedy_tokens",
    "live:cancel_mid_stream", "live:set_budget_gets_budget_ack", "live:unknown_type_gets_error_reply",
    "live:invalid_value_gets_invalid_request", "live:frame_budget_helper_report_gets_a_reply",
}


@pytest.fixture(scope="module")
def tests_exe() -> Path:
    """Build plugins/unity with build.sh (fails, never skips, when Mono is missing)."""
    missing = [tool for tool in ("mcs", "mono") if shutil.which(tool) is None]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not found: the Unity plugin is built with Mono; install the Debian packages "
            "mono-mcs and mono-runtime (apt-get install mono-mcs mono-runtime), plus libzmq5 for the transport"
        )
    proc = subprocess.run([str(UNITY / "build.sh"), "--no-run"], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"build.sh failed:\n{proc.stdout}\n{proc.stderr}"
    assert TESTS_EXE.is_file()
    return TESTS_EXE


def _run(exe: Path, *args: str, timeout_s: float) -> tuple[str, dict[str, bool]]:
    proc = subprocess.run(
        ["mono", "--debug", str(exe), *args], cwd=exe.parent, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output (rc {proc.returncode}):\n{proc.stderr}"
    match = SUMMARY.fullmatch(lines[-1])
    assert match, f"last line is not 'N passed, N failed':\n{proc.stdout}\n{proc.stderr}"
    results = {}
    for line in lines:
        if line.startswith(("PASS ", "FAIL ")):
            name = line[5:].split(" (", 1)[0].split(": ", 1)[0]
            results[name] = line.startswith("PASS ")
    failed = [line for line in lines if line.startswith("FAIL ")]
    assert int(match[2]) == 0 and proc.returncode == 0 and not failed, "\n".join(failed) + "\n" + proc.stdout[-4000:]
    assert int(match[1]) == len(results)
    return proc.stdout, results


def _vector_names(file_name: str) -> list[str]:
    entries = msgpack.unpackb((VECTORS / file_name).read_bytes(), raw=False)
    return [entry["name"] for entry in entries]


def test_unity_unit_and_conformance(tests_exe: Path) -> None:
    """Codec, transport and client unit tests, and every golden vector (valid, lenient, invalid)."""
    _, results = _run(tests_exe, "--vectors", str(VECTORS), timeout_s=300)
    assert all(results.values())
    ran = {name.split(":")[2].split("->")[0] for name in results if name.startswith("conformance:") and name.count(":") >= 2}
    for file_name in ("vectors.msgpack", "lenient.msgpack", "invalid.msgpack"):
        missing = set(_vector_names(file_name)) - ran
        assert not missing, f"{file_name} entries not exercised by the C# runner: {sorted(missing)}"
    assert not any(name.startswith("live:") for name in results), "live tests must not run without a connection file"


@pytest.mark.slow
def test_unity_live_daemon(tests_exe: Path, running_daemon) -> None:  # noqa: ANN001 - fixture from tests/conftest.py
    """Handshake, sessions, greedy streaming, cancel, budgets, errors and frame stats against the real daemon."""
    _, results = _run(tests_exe, "--connection-file", str(running_daemon.connection_file), "--filter", "live:", timeout_s=900)
    assert set(results) == LIVE_TESTS


def test_unity_package_meta_files_complete() -> None:
    """Every asset of the UPM package has its .meta (git-URL installs ignore assets without one)."""
    proc = subprocess.run(
        [sys.executable, str(UNITY / "tools~" / "gen_meta.py"), "--check"], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, f"run plugins/unity/tools~/gen_meta.py:\n{proc.stdout}{proc.stderr}"
