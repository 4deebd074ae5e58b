"""``igi profile --quick`` on this machine: measured through llama.cpp, saved and reloaded by machine key."""

from __future__ import annotations

from pathlib import Path

import pytest

from igi_sdk.planner.profile import Profile


@pytest.mark.slow
def test_quick_profile_is_measured_saved_and_reloaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IGI_CACHE_DIR", str(tmp_path))
    from igi_sdk.profiler import load_or_create_profile, load_profile, profile_path
    from igi_sdk.profiler.cli import run

    assert load_profile() is None
    assert run(["--quick", "--json"]) == 0
    profile = load_profile()
    assert isinstance(profile, Profile) and profile.source == "measured-quick"
    assert profile_path(profile.machine).is_file() and str(profile_path(profile.machine)).startswith(str(tmp_path))
    rate = profile.cpu[0]
    assert rate.decode_gbps > 0.05 and rate.gflops("q4_0") > 0.1 and profile.host_memory_gbps > 0.1
    assert load_or_create_profile() == profile  # cached: no second measurement
    assert Profile.model_validate_json(profile.model_dump_json()) == profile
