"""The profile cache on disk: a file that is no usable profile is a miss (measured again), never an error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from igi_sdk.files import MAX_CACHE_ENTRY_BYTES
from igi_sdk.planner.profile import reference_profile
from igi_sdk.profiler.store import load_profile, profile_path, save_profile


@pytest.fixture()
def saved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A good profile saved in a fresh cache; returns its path."""
    monkeypatch.setenv("IGI_CACHE_DIR", str(tmp_path))
    return save_profile(reference_profile("h200"))


def test_a_saved_profile_loads_and_leaves_no_temp(saved: Path) -> None:
    profile = reference_profile("h200")
    assert load_profile(profile.machine) == profile
    assert [p.name for p in saved.parent.iterdir()] == [saved.name]


@pytest.mark.parametrize("content", [b"[]", b"null", b"1", b'"x"', b"true", b"", b"{trunc", b"\xff\xfe"])
def test_a_file_that_is_no_json_object_is_a_miss(saved: Path, content: bytes) -> None:
    saved.write_bytes(content)
    assert load_profile(reference_profile("h200").machine) is None


def test_a_directory_or_an_oversized_file_is_a_miss(saved: Path) -> None:
    key = reference_profile("h200").machine
    with saved.open("ab") as f:
        f.write(b" " * MAX_CACHE_ENTRY_BYTES)  # still valid JSON, past the bound
    assert load_profile(key) is None
    saved.unlink()
    saved.mkdir()
    assert load_profile(key) is None


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="chown to another user needs root")
def test_a_profile_of_another_user_is_a_miss(saved: Path) -> None:
    os.chown(saved, 65534, 65534)
    assert load_profile(reference_profile("h200").machine) is None
    assert profile_path(reference_profile("h200").machine) == saved
