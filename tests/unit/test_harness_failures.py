"""How the sample harness fails: bad arguments, a daemon that does not start or dies mid-phase, Ctrl-C, a report
that is none, a missing optional tool. Without a real daemon: the phases and the calibration are faked through
the harness's own names, the daemon process is a short Python child.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"
sys.path.insert(0, str(SAMPLES))

from igi_harness.daemon_proc import DaemonProcess, HarnessDaemonError  # noqa: E402
from igi_harness.recorder import PhaseRecorder  # noqa: E402
from igi_harness.repeats import report_problems  # noqa: E402


def load_harness() -> Any:
    spec = importlib.util.spec_from_file_location("igi_harness_main_failures", SAMPLES / "harness.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --- arguments ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "flags",
    [
        ["--duration-s", "nan"],
        ["--duration-s", "inf"],
        ["--fps", "nan"],
        ["--render-load", "nan"],
        ["--spike-scale", "nan"],
        ["--spike-scale", "0"],
        ["--spike-scale", "-1"],
        ["--look-at-s", "nan"],
        ["--look-at-s", "-1"],
        ["--duration-s", "10", "--look-at-s", "10"],
        ["--daemon-threads", "-3"],
        ["--render-threads", "0"],
        ["--stats-every", "0"],
    ],
)
def test_non_finite_and_out_of_range_values_are_refused(flags: list[str]) -> None:
    harness = load_harness()
    with pytest.raises(SystemExit) as refused:
        harness.parse_args(flags)
    assert refused.value.code == 2


def test_in_range_values_pass() -> None:
    args = load_harness().parse_args(["--spike-scale", "2", "--look-at-s", "0", "--daemon-threads", "0"])
    assert args.spike_scale == 2.0 and args.look_at_s == 0.0 and args.daemon_threads == 0


# --- start-up failures: one line, exit 2, nothing started --------------------------------------------------
def _no_calibration(harness: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []

    def calibrate(*_a: Any, **_k: Any) -> Any:
        calls.append("calibrate")
        return harness.RenderWorkload(chunks_per_frame=1, chunk_ms=0.1, device="cpu", threads=1)

    monkeypatch.setattr(harness.RenderWorkload, "calibrate", calibrate)
    return calls


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--model", "/nonexistent.gguf"], "/nonexistent.gguf: no such file"),
        (["--model", "synthetic:llama_8b"], "not a synthetic preset"),
        (["--mmproj", "/nope.gguf"], "/nope.gguf: no such file"),
        (["--mmproj", "synthetic:no_such_projector"], "no such synthetic projector"),
    ],
)
def test_a_missing_model_or_projector_is_one_line_before_calibrating(
    flags: list[str], said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    harness = load_harness()
    calls = _no_calibration(harness, monkeypatch)
    assert harness.main([*flags, "--out", str(tmp_path / "out"), "--no-live"]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err
    assert calls == []


def test_an_out_that_is_a_file_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert load_harness().main(["--out", str(afile), "--no-live"]) == 2
    err = capsys.readouterr().err
    assert "afile" in err and len(err.strip().splitlines()) == 1, err


def _fake_phases(harness: Any, monkeypatch: pytest.MonkeyPatch, outcomes: list[Any]) -> list[str]:
    """Phases that finish with a recorder (errors / exit code as given) or raise the given exception."""
    ran: list[str] = []

    def run_phase(name: str, governor: bool, cfg: Any, workload: Any, on_frame: Any = None) -> PhaseRecorder:
        ran.append(name)
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        rec = PhaseRecorder(name=name, governor=governor, target_frame_ms=16.667)
        rec.errors += outcome.get("errors", [])
        rec.daemon_exit_code = outcome.get("exit_code", 0)
        return rec

    monkeypatch.setattr(harness, "run_phase", run_phase)
    monkeypatch.setattr(harness, "write_plot", lambda *_a: False)
    _no_calibration(harness, monkeypatch)
    return ran


def test_a_daemon_that_fails_to_start_is_one_line_with_its_last_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    harness = load_harness()
    err = HarnessDaemonError("daemon exited with 3 before it was ready; last line of x.stderr: bad thread count")
    _fake_phases(harness, monkeypatch, [err])
    assert harness.main(["--out", str(tmp_path), "--no-live"]) == 2
    out = capsys.readouterr()
    assert "bad thread count" in out.err and "Traceback" not in out.err + out.out
    assert "issue target" not in out.out


def test_a_daemon_that_dies_mid_run_leaves_a_partial_report_and_no_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    harness = load_harness()
    ran = _fake_phases(harness, monkeypatch, [{}, HarnessDaemonError("daemon exited with -9 while the phase ran")])
    assert harness.main(["--out", str(tmp_path), "--no-live"]) == 2
    out = capsys.readouterr()
    assert ran == ["governor_on", "governor_off"] and "issue target" not in out.out
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["complete"] is False and "-9" in report["incomplete_reason"]
    assert [ph["name"] for ph in report["phases"]] == ["governor_on"] and report["issue_target"] is None
    assert report_problems(report)  # harness_repeats.py does not count it


@pytest.mark.parametrize(
    "outcome", [{"errors": ["status: IgiTimeoutError: no reply"]}, {"exit_code": -9}], ids=["client_error", "killed"]
)
def test_a_phase_with_client_errors_or_an_abnormal_daemon_exit_gets_no_verdict(
    outcome: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    harness = load_harness()
    _fake_phases(harness, monkeypatch, [outcome, {}])
    assert harness.main(["--out", str(tmp_path), "--no-live"]) == 1
    out = capsys.readouterr()
    assert "issue target" not in out.out and "no issue-target verdict" in out.err
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["complete"] is True and report["problems"] and report["issue_target"] is None
    assert report_problems(report)


def test_a_clean_run_keeps_its_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    harness = load_harness()
    _fake_phases(harness, monkeypatch, [{}, {}])
    assert harness.main(["--out", str(tmp_path), "--no-live"]) == 0
    assert "issue target" in capsys.readouterr().out
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["problems"] == [] and report["issue_target"] is not None and not report_problems(report)


def test_ctrl_c_writes_the_finished_phases_and_exits_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    harness = load_harness()
    _fake_phases(harness, monkeypatch, [{}, KeyboardInterrupt()])
    assert harness.main(["--out", str(tmp_path), "--no-live"]) == 130
    out = capsys.readouterr()
    assert "interrupted" in out.err and "Traceback" not in out.err
    report = json.loads((tmp_path / "report.json").read_text())
    assert [ph["name"] for ph in report["phases"]] == ["governor_on"] and report["incomplete_reason"] == "interrupted"


# --- the daemon process -------------------------------------------------------------------------------------
FAKE_DAEMON = """
import json, sys, time
conn, log, mode = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "fail":
    print("starting", file=sys.stderr)
    print("error: --n-threads must be >= 0", file=sys.stderr)
    sys.exit(2)
if mode == "log_fail":
    with open(log, "w") as f:
        f.write(json.dumps({"level": "error", "event": "daemon_start_failed", "error": "not a GGUF file"}) + "\\n")
        f.write(json.dumps({"level": "info", "event": "daemon_stopped"}) + "\\n")
    sys.exit(3)
open(conn, "w").write(json.dumps({"port": 5555}))
time.sleep(60)
"""


def _fake_daemon(tmp_path: Path, mode: str) -> DaemonProcess:
    d = DaemonProcess(tmp_path / "p.connection.json", log_file=tmp_path / "p.daemon.log", start_timeout_s=20.0)
    d.args = [sys.executable, "-c", FAKE_DAEMON, str(d.connection_file), str(d.log_file), mode]
    return d


@pytest.mark.parametrize(
    ("mode", "said"),
    [("fail", "p.daemon.stderr: error: --n-threads must be >= 0"), ("log_fail", "daemon_start_failed: not a GGUF")],
)
def test_a_daemon_that_exits_at_start_says_why_in_one_line(mode: str, said: str, tmp_path: Path) -> None:
    d = _fake_daemon(tmp_path, mode)
    with pytest.raises(HarnessDaemonError) as failed:
        d.start()
    d.stop()
    assert said in str(failed.value) and "\n" not in str(failed.value)


def test_a_killed_daemon_is_noticed_and_its_connection_file_removed(tmp_path: Path) -> None:
    d = _fake_daemon(tmp_path, "serve").start()
    try:
        d.check_alive()  # running: nothing to say
        assert d.proc is not None
        d.proc.kill()  # kill -9: the daemon cannot remove its connection file
        d.proc.wait(10.0)
        with pytest.raises(HarnessDaemonError, match="exited with -9"):
            d.check_alive()
        assert d.connection_file.exists()
    finally:
        code = d.stop()
    assert code == -9 and not d.connection_file.exists()


# --- --replot -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "report",
    [{"phases": []}, {"phases": [{}]}, {"phases": [1]}, {"phases": {"a": 1}}, [], {"phases": [{"name": "x"}]}],
    ids=["empty", "empty_phase", "not_an_object", "not_a_list", "not_a_dict", "partial"],
)
def test_replot_of_a_report_of_the_wrong_shape_is_one_line_and_exit_2(
    report: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    assert load_harness().main(["--replot", str(path)]) == 2
    err = capsys.readouterr().err
    assert "not a harness report.json" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "timeline.png").exists()


def test_dev_sh_passes_the_demo_paths_absolute(tmp_path: Path) -> None:
    """dev.sh changes into the repository before it starts the harness: relative paths are the caller's."""
    functions = subprocess.run(
        ["sed", "-n", "/^abs_path()/,/^}/p;/^harness_path_args()/,/^}/p", str(ROOT / "dev.sh")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "harness_path_args()" in functions
    script = f'set -euo pipefail\nCALLER_DIR="$PWD"\n{functions}\nharness_path_args "$@"\nprintf "%s\\n" "${{HARNESS_ARGS[@]}}"'
    args = ["--out", "o", "--replot=r/report.json", "--model", "default", "--mmproj", "synthetic:smolvlm_tiny"]
    args += ["--model=m.gguf", "--out", "/abs", "--duration-s", "5"]
    out = subprocess.run(
        ["bash", "-c", script, "dev.sh", *args], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == [
        "--out",
        f"{tmp_path}/o",
        f"--replot={tmp_path}/r/report.json",
        "--model",
        "default",
        "--mmproj",
        "synthetic:smolvlm_tiny",
        f"--model={tmp_path}/m.gguf",
        "--out",
        "/abs",
        "--duration-s",
        "5",
    ]


# --- optional tools -----------------------------------------------------------------------------------------
def test_without_rich_the_harness_says_which_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "rich" or m.startswith("rich.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "rich", None)  # import rich raises ModuleNotFoundError
    monkeypatch.setitem(sys.modules, "rich.console", None)
    with pytest.raises(SystemExit) as stopped:
        load_harness()
    assert "[tools]" in str(stopped.value.code) and "rich" in str(stopped.value.code)
