"""Bad input on the command line: one line naming the error type on stderr, exit code 2, never a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from igi_sdk.cli import main as igi
from igi_sdk.daemon.__main__ import run as igi_daemon

PLAN = ["plan", "synthetic:tiny_dense", "--profile", "reference:cpu2", "--no-dry-run"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([*PLAN, "--vram-budget-mib", "-1"], "ValueError: --vram-budget-mib must be >= 0"),
        ([*PLAN, "--vram-budget-mib", "512", "--ctx", str(1 << 40)], "ValidationError: invalid Workload: n_ctx"),
        ([*PLAN, "--vram-budget-mib", "512", "--prompt-tokens", "999999"], "ValueError: prompt 999999 + reply 128"),
        (
            ["plan", "synthetic:nope", "--vram-budget-mib", "512", "--profile", "reference:cpu2"],
            "KeyError: unknown synthetic preset 'nope'",
        ),
        (
            ["plan", "/dev/zero", "--vram-budget-mib", "512", "--profile", "reference:cpu2"],
            "ModelCorruptError: model path is not a regular file",
        ),
        (
            ["plan", "", "--vram-budget-mib", "512", "--profile", "reference:cpu2"],
            "ModelNotFoundError: model path is empty",
        ),  # was "not a regular file: ." (Path("") is the current folder)
        (
            ["plan", "synthetic:tiny_dense", "--vram-budget-mib", "512", "--profile", "/dev/zero"],
            "InputFileError: profile /dev/zero is not a regular file",
        ),
        (["bench", "--merge", "--out", "/nonexistent/igi-merge"], "FileNotFoundError: no per-model results"),
    ],
)
def test_igi_reports_bad_input_in_one_line(argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert igi(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"igi {argv[0]}: {expected}"), err
    assert "\n" not in err and "Traceback" not in err


def test_profile_fifo_is_refused_without_blocking(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "profile.json"
    os.mkfifo(fifo)
    assert igi(["plan", "synthetic:tiny_dense", "--vram-budget-mib", "512", "--profile", str(fifo)]) == 2
    assert "is not a regular file" in capsys.readouterr().err


def test_results_fifo_is_refused_without_blocking(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.mkfifo(tmp_path / "bench-x.json")
    assert igi(["bench", "--merge", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("igi bench: InputFileError: results file")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--config", "/nonexistent/igi.toml"], "FileNotFoundError"),
        (["--config", "/dev/zero"], "InputFileError: config file /dev/zero is not a regular file"),
        (["--n-ctx", str(1 << 40)], "ValidationError: invalid DaemonSettings: engine.n_ctx"),
        (["--log-file", "/dev/null/igi.log"], "FileExistsError"),
        (
            ["--log-file", "/proc/version"],
            "OSError: [Errno 22] cannot open the log file /proc/version",
        ),  # named the file
    ],
)
def test_daemon_reports_bad_settings_in_one_line(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert igi_daemon(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"igi-daemon: {expected}"), err
    assert "\n" not in err


def test_fetch_model_refuses_unknown_arguments() -> None:
    with pytest.raises(SystemExit) as exc:
        igi(["fetch-model", "--bogus"])
    assert exc.value.code == 2


def test_daemon_reports_an_endpoint_it_cannot_bind_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """EndpointError (an IgiError, not an OSError) escaped as a traceback with exit code 1."""
    argv = [
        "--transport",
        "ipc",
        "--ipc-path",
        str(tmp_path / "missing" / "sock"),
        "--connection-file",
        str(tmp_path / "conn.json"),
    ]
    assert igi_daemon(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("igi-daemon: EndpointError: cannot bind"), err


def test_a_command_whose_tools_extra_is_missing_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import igi_sdk.cli as cli

    def without_rich(name: str) -> object:
        raise ModuleNotFoundError("No module named 'rich'", name="rich")

    monkeypatch.setattr(cli.importlib, "import_module", without_rich)
    assert cli.main(["plan", "default"]) == 2
    assert "pip install 'igi-sdk[tools]'" in capsys.readouterr().err
