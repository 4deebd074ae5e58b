"""The harness without matplotlib (a minimal machine, e.g. the GPU host): the run keeps its report, the plot is
skipped with a note, and ``--replot`` draws it later from report.json."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
sys.path.insert(0, str(SAMPLES))

from igi_harness.recorder import PhaseRecorder  # noqa: E402


def load_harness():
    spec = importlib.util.spec_from_file_location("igi_harness_main", SAMPLES / "harness.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def test_write_plot_without_matplotlib_skips_with_a_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    harness = load_harness()
    monkeypatch.setitem(sys.modules, "igi_harness.plot", None)  # import of it raises ImportError
    buf = io.StringIO()
    assert harness.write_plot([], tmp_path / "timeline.png", Console(file=buf, width=200)) is False
    assert not (tmp_path / "timeline.png").exists()
    assert "--replot" in buf.getvalue() and "report.json" in buf.getvalue()


def test_replot_reads_the_phases_of_a_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    harness = load_harness()
    seen = {}  # type: ignore[var-annotated]

    def fake_write_plot(phases, path, console):  # the drawing itself is covered by tests/integration/test_harness.py
        seen.update(phases=phases, path=path)
        return True

    monkeypatch.setattr(harness, "write_plot", fake_write_plot)
    report = tmp_path / "run" / "report.json"
    report.parent.mkdir()
    phases = [PhaseRecorder(name="governor_on", governor=True, target_frame_ms=16.667).summary()]
    report.write_text(json.dumps({"phases": phases}))
    assert harness.main(["--replot", str(report)]) == 0
    assert seen == {"phases": json.loads(json.dumps(phases)), "path": report.parent / "timeline.png"}


def test_replot_of_a_file_that_is_no_report_is_one_line_and_exit_2(tmp_path: Path) -> None:
    harness = load_harness()
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"something": 1}))
    for path in (tmp_path / "missing.json", other):
        assert harness.main(["--replot", str(path)]) == 2


def test_bad_run_values_are_refused_before_a_daemon_starts() -> None:
    harness = load_harness()
    for flags in (["--max-tokens", "0"], ["--budget-mib", "-1"]):
        with pytest.raises(SystemExit) as refused:
            harness.parse_args(flags)
        assert refused.value.code == 2
