"""How host memory is page-locked (``engine.host_pinning``, patches/llama.cpp 0008): registered unless the environment
or the worker's configuration says otherwise, and the worker's configuration carries the daemon's setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from igi_sdk.config import DaemonSettings
from igi_sdk.daemon.worker.supervisor import worker_config_for
from igi_sdk.engine.host_pinning import REGISTER_ENV, apply_default, host_pinning, set_host_pinning


def test_registered_by_default_unless_the_environment_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REGISTER_ENV, raising=False)
    apply_default()
    assert host_pinning() == "registered"
    monkeypatch.setenv(REGISTER_ENV, "0")  # the game turned it off
    apply_default()
    assert host_pinning() == "allocated"


def test_set_host_pinning_is_what_the_backend_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REGISTER_ENV, raising=False)
    set_host_pinning("allocated")
    assert host_pinning() == "allocated"
    set_host_pinning("registered")
    assert host_pinning() == "registered"
    monkeypatch.setenv(REGISTER_ENV, "junk")  # what the patched backend's atoi reads as 0
    assert host_pinning() == "allocated"


@pytest.mark.parametrize("how", ["registered", "allocated"])
def test_the_worker_config_carries_the_setting(how: str) -> None:
    settings = DaemonSettings(engine={"host_pinning": how})
    assert worker_config_for(settings, Path("m.gguf"), 512).host_pinning == how


def test_an_unknown_way_is_refused() -> None:
    with pytest.raises(ValueError):
        DaemonSettings(engine={"host_pinning": "mlock"})
