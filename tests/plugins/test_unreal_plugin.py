"""Unreal (C++) plugin: builds the engine-independent client core with CMake + g++ and runs its tests.

``plugins/unreal/build.sh`` builds ``plugins/unreal/build/igi_tests``, whose output has one
``[  OK  ]`` / ``[ FAIL ]`` / ``[ SKIP ]`` line per test and ends with exactly ``N passed, N failed``.
Conformance covers every entry of ipc/vectors; the codec is cross-checked against msgpack-c
(libmsgpack-cxx-dev, a required prerequisite here, as in dev.sh); the live tests talk to a real daemon
(``running_daemon``) serving the real default model; the launcher tests start the self-contained daemon bundle
(``daemon_bundle``) with no Python on PATH. The Unreal wrapper itself (UObject code) needs Unreal Engine and is not
compiled here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import msgpack
import pytest

REPO = Path(__file__).resolve().parents[2]
UNREAL = REPO / "plugins" / "unreal"
VECTORS = REPO / "ipc" / "vectors"
TESTS_EXE = UNREAL / "build" / "igi_tests"
SUMMARY = re.compile(r"(\d+) passed, (\d+) failed")
RESULT = re.compile(r"\[ *(OK|FAIL|SKIP) *\] ([a-z0-9_]+)")
# The launcher against the real bundle (skipped without --bundle / IGI_DAEMON_BUNDLE).
BUNDLE_TESTS = {"bundle_is_started_killed_restarted_with_its_saved_session_and_stopped"}
LIVE_TESTS = {
    "live_handshake_reports_protocol_and_limits",
    "live_greedy_streaming_generate_is_deterministic",
    "live_cancel_mid_stream_finishes_cancelled",
    "live_set_budget_returns_budget_ack",
    "live_unknown_type_gets_error_reply",
    "live_unknown_session_maps_to_not_found",
    "live_malformed_session_id_is_refused_before_sending",
    "live_requests_after_the_daemon_is_declared_gone_fail_at_once",
    "live_status_and_frame_stats",
    "live_heartbeats_keep_connection_and_bad_key_times_out",
    "live_a_peer_without_the_handshake_credential_is_not_answered",
}
# Debian package providing each build prerequisite.
PREREQUISITES = {
    "cmake": "cmake",
    "g++": "g++",
    "pkg-config": "pkg-config",
    "/usr/include/zmq.h": "libzmq3-dev",
    "/usr/include/zmq.hpp": "cppzmq-dev",
    "/usr/include/openssl/hmac.h": "libssl-dev",
    # msgpack-c: the independent decoder of the codec cross-check test (CMake leaves that test out without it).
    "/usr/include/msgpack.hpp": "libmsgpack-cxx-dev",
}
# Offline tests that must be in the build and pass; CMake compiles the msgpack-c cross-check only when it
# finds msgpack.hpp, so its absence from the output fails here instead of going unnoticed.
REQUIRED_OFFLINE_TESTS = {
    "conformance_valid_vectors_round_trip_byte_for_byte",
    "conformance_lenient_vectors_decode_to_canonical_maps",
    "conformance_invalid_vectors_are_classified",
    "conformance_connection_files_give_endpoint_and_handshake_credential",
    "codec_output_is_read_back_by_msgpack_c",  # needs libmsgpack-cxx-dev (IGI_HAVE_MSGPACK_CXX)
    "error_codes_map_to_typed_errors_in_one_place",
    "error_code_table_matches_every_code_of_the_spec",
}


@pytest.fixture(scope="module")
def tests_exe() -> Path:
    """Build plugins/unreal with build.sh (fails, never skips, when a prerequisite is missing)."""
    missing = [
        package
        for need, package in PREREQUISITES.items()
        if (Path(need).exists() if need.startswith("/") else shutil.which(need) is not None) is False
    ]
    if missing:
        pytest.fail(
            "the Unreal plugin's C++ core needs CMake, g++, libzmq (+ cppzmq) and OpenSSL headers, and its tests "
            "msgpack-c (libmsgpack-cxx-dev); install the "
            f"Debian packages: apt-get install {' '.join(missing)}"
        )
    proc = subprocess.run(
        [str(UNREAL / "build.sh"), "--build-only"], capture_output=True, text=True, timeout=900, check=False
    )
    assert proc.returncode == 0, f"build.sh failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert TESTS_EXE.is_file()
    return TESTS_EXE


def _run(exe: Path, *args: str, timeout_s: float, env: dict[str, str] | None = None) -> tuple[str, dict[str, str]]:
    proc = subprocess.run(
        [str(exe), "--vectors", str(VECTORS), *args], capture_output=True, text=True, timeout=timeout_s, check=False,
        env=env,
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output (rc {proc.returncode}):\n{proc.stderr}"
    match = SUMMARY.fullmatch(lines[-1])
    assert match, f"last line is not 'N passed, N failed':\n{proc.stdout}\n{proc.stderr}"
    results = {m[2]: m[1] for m in map(RESULT.match, lines) if m}
    failed = [name for name, status in results.items() if status == "FAIL"]
    assert int(match[2]) == 0 and proc.returncode == 0 and not failed, f"failed: {failed}\n{proc.stdout[-6000:]}"
    assert int(match[1]) == sum(status == "OK" for status in results.values())
    return proc.stdout, results


def test_codec_units_and_conformance_against_all_golden_vectors(tests_exe: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("IGI_DAEMON_BUNDLE", "IGI_CONNECTION_FILE")}
    out, results = _run(tests_exe, timeout_s=120, env=env)
    offline = {name: status for name, status in results.items() if name not in LIVE_TESTS | BUNDLE_TESTS}
    assert offline and all(status == "OK" for status in offline.values()), offline
    missing = REQUIRED_OFFLINE_TESTS - offline.keys()
    assert not missing, f"tests left out of the build (the msgpack-c one needs libmsgpack-cxx-dev): {missing}"
    # Without a connection file the live tests say they are skipped, and why.
    assert {name for name, status in results.items() if status == "SKIP"} == LIVE_TESTS | BUNDLE_TESTS
    assert "no connection file given" in out
    # Every vector of every file was checked (the counts come from the files themselves).
    for file_name, label in (
        ("vectors.msgpack", "valid"), ("lenient.msgpack", "lenient"), ("invalid.msgpack", "invalid"),
        ("connection.msgpack", "connection"),
    ):
        n_vectors = len(msgpack.unpackb((VECTORS / file_name).read_bytes(), raw=False))
        assert f"{n_vectors} {label} vectors checked" in out, f"{file_name}: expected {n_vectors} checked\n{out}"


def test_live_against_running_daemon(tests_exe: Path, running_daemon) -> None:  # noqa: ANN001 (fixture type)
    out, results = _run(
        tests_exe, "--connection-file", str(running_daemon.connection_file), "--filter", "live_", timeout_s=300
    )
    assert results == dict.fromkeys(LIVE_TESTS, "OK"), out


def test_live_handshake_over_tcp(tests_exe: Path) -> None:
    """The default daemon listens on an ipc socket (the suite above); one started with --transport tcp is reached over
    loopback TCP with the same handshake credential."""
    from daemon_process import DaemonProcess

    daemon = DaemonProcess(["--transport", "tcp"]).start()
    assert daemon.info().transport == "tcp"
    out, results = _run(
        tests_exe, "--connection-file", str(daemon.connection_file), "--filter", "live_handshake_", timeout_s=300
    )
    assert results == {"live_handshake_reports_protocol_and_limits": "OK"}, out


def test_launcher_supervises_the_bundle_without_python(tests_exe: Path, daemon_bundle: Path, no_python_env, restart_limit_s: float) -> None:  # noqa: ANN001
    """igi::DaemonLauncher with no Python on PATH: starts the bundle, talks to it, kill -9, restart within 5 s with the
    saved session restored, stop with no process of the bundle left."""
    out, results = _run(tests_exe, "--bundle", str(daemon_bundle), "--filter", "bundle_", timeout_s=600,
                       env={**no_python_env, "IGI_RESTART_LIMIT_S": str(restart_limit_s)})
    print("\n".join(line for line in out.splitlines() if "restart after" in line))  # the measured figure
    assert results == dict.fromkeys(BUNDLE_TESTS, "OK"), out
