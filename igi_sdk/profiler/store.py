"""Edge: profiles on disk, ``cache_dir()/profiles/<machine-key>.json``, versioned."""

from __future__ import annotations

import json
import os
from pathlib import Path

from igi_sdk.files import read_cache_entry, read_regular_file, temp_beside
from igi_sdk.model_store import cache_dir
from igi_sdk.planner.profile import PROFILE_VERSION, MachineKey, Profile
from igi_sdk.profiler.machine import machine_key
from igi_sdk.profiler.measure import Progress


def profile_path(key: MachineKey) -> Path:
    """Where the profile of machine ``key`` is cached."""
    return cache_dir() / "profiles" / f"{key.slug()}.json"


def save_profile(profile: Profile) -> Path:
    """Write ``profile`` atomically to its cache path (through a temp of this writer's own); returns the path."""
    path = profile_path(profile.machine)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_beside(path)
    try:
        tmp.write_text(profile.model_dump_json(indent=2))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load_profile(key: MachineKey | None = None) -> Profile | None:
    """The cached profile of this machine (or ``key``), None if absent, unreadable (not a regular file, too large,
    another user's), not a JSON object or of another version (a version-1 profile's GPU terms came from the faulty
    measurements, so it is measured again).

    Validation re-checks every term against ``Profile``'s plausibility bounds: an implausible cached figure
    is replaced (and listed in ``missing``) on every load."""
    raw = read_cache_entry(profile_path(key or machine_key()), what="cached profile")
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("version") != PROFILE_VERSION:
            return None
        return Profile.model_validate(data)
    except ValueError:
        return None


def profile_from_file(path: Path) -> Profile:
    """A profile JSON named by the user (``--profile PATH``).

    Raises:
        OSError, InputFileError: the file cannot be read; pydantic.ValidationError: not a valid profile.
    """
    return Profile.model_validate_json(read_regular_file(path, what="profile"))


def load_or_create_profile(*, quick: bool = False, progress: Progress | None = None) -> Profile:
    """The cached profile of this machine, measuring and saving it on first use (the daemon calls this).

    A full profile is preferred; a cached quick one is used as is. A cached profile of an older version is
    measured again; a cached implausible term is repaired on load (see ``load_profile``).
    """
    from igi_sdk.profiler.build import measure_profile

    cached = load_profile()
    if cached is not None:
        return cached
    profile = measure_profile(quick=quick, progress=progress)
    save_profile(profile)
    return profile
