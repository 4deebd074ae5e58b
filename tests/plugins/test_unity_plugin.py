"""Unity (C#) plugin: builds the core library and console tests with Mono's mcs, runs them.

The console runner (plugins/unity/Tests) prints one PASS/FAIL line per test and ends with exactly
``N passed, N failed``. Conformance covers every entry of ipc/vectors; the live tests talk to a real daemon
(``running_daemon``) serving the real default model.
"""

from __future__ import annotations

import os
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
    "live:a_peer_without_the_handshake_credential_is_not_answered",
}

# Tests/Runtime: Unity Test Framework (NUnit) tests, run by the console runner as "nunit:<Fixture>.<Test>".
NUNIT_TESTS = {
    "nunit:DaemonLauncherUnitTests.Restart_delay_doubles_per_failure_and_is_capped",
    "nunit:DaemonLauncherUnitTests.Arguments_are_quoted_by_the_c_runtime_rules",
    "nunit:DaemonLauncherUnitTests.Log_levels_are_read_from_json_and_kv_records",
    "nunit:DaemonLauncherUnitTests.Bad_options_are_refused_with_the_field_named",
    "nunit:DaemonLauncherUnitTests.A_missing_executable_is_retried_with_backoff_then_given_up",
    "nunit:DaemonLauncherUnitTests.The_daemon_is_started_with_exit_with_pid_of_the_game_process_by_default",
    "nunit:DaemonLauncherUnitTests.ExitWithGame_false_leaves_exit_with_pid_out",
    "nunit:BundleTests.Bundle_is_started_killed_restarted_with_its_saved_session_and_stopped",
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


def _run(exe: Path, *args: str, timeout_s: float, env: dict[str, str] | None = None) -> tuple[str, dict[str, bool]]:
    mono = shutil.which("mono")
    assert mono is not None
    proc = subprocess.run(
        [mono, "--debug", str(exe), *args], cwd=exe.parent, capture_output=True, text=True, timeout=timeout_s, check=False,
        env=env,
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
    env = {k: v for k, v in os.environ.items() if k != "IGI_DAEMON_BUNDLE"}
    _, results = _run(tests_exe, "--vectors", str(VECTORS), timeout_s=300, env=env)
    assert all(results.values())
    ran = {name.split(":")[2].split("->")[0] for name in results if name.startswith("conformance:") and name.count(":") >= 2}
    for file_name in ("vectors.msgpack", "lenient.msgpack", "invalid.msgpack", "connection.msgpack"):
        missing = set(_vector_names(file_name)) - ran
        assert not missing, f"{file_name} entries not exercised by the C# runner: {sorted(missing)}"
    assert not any(name.startswith("live:") for name in results), "live tests must not run without a connection file"
    assert "nunit:BundleTests.Bundle_is_started_killed_restarted_with_its_saved_session_and_stopped" not in results


@pytest.mark.slow
def test_unity_live_daemon(tests_exe: Path, running_daemon) -> None:  # noqa: ANN001 - fixture from tests/conftest.py
    """Handshake, sessions, greedy streaming, cancel, budgets, errors and frame stats against the real daemon."""
    _, results = _run(tests_exe, "--connection-file", str(running_daemon.connection_file), "--filter", "live:", timeout_s=900)
    assert set(results) == LIVE_TESTS


@pytest.mark.slow
def test_unity_live_handshake_over_tcp(tests_exe: Path) -> None:
    """The default daemon listens on an ipc socket (the suite above); one started with --transport tcp is reached over
    loopback TCP with the same handshake credential."""
    from daemon_process import DaemonProcess

    daemon = DaemonProcess(["--transport", "tcp"]).start()
    assert daemon.info().transport == "tcp"
    _, results = _run(tests_exe, "--connection-file", str(daemon.connection_file), "--filter", "live:handshake", timeout_s=300)
    assert results == {"live:handshake": True}


@pytest.mark.slow
def test_unity_launcher_supervises_the_bundle_without_python(tests_exe: Path, daemon_bundle: Path, no_python_env, restart_limit_s: float) -> None:  # noqa: ANN001
    """The Unity Test Framework tests of the launcher (Tests/Runtime), under Mono with no Python on PATH: the bundle is
    started, talked to, killed with SIGKILL, restarted within 5 s with its saved session restored, and stopped with no
    process of it left."""
    env = {**no_python_env, "IGI_DAEMON_BUNDLE": str(daemon_bundle), "IGI_RESTART_LIMIT_S": str(restart_limit_s)}
    out, results = _run(tests_exe, "--filter", "nunit:", timeout_s=600, env=env)
    print("\n".join(line for line in out.splitlines() if "restart after" in line))  # the measured figure
    assert set(results) == NUNIT_TESTS, out
    assert "SKIP nunit:" not in out, out


def test_unity_package_meta_files_complete() -> None:
    """Every asset of the UPM package has its .meta (git-URL installs ignore assets without one)."""
    proc = subprocess.run(
        [sys.executable, str(UNITY / "tools~" / "gen_meta.py"), "--check"], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, f"run plugins/unity/tools~/gen_meta.py:\n{proc.stdout}{proc.stderr}"
