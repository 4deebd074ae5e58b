"""dry_run (no_alloc, child process) reports the buffers a real load of the same placement reports."""

from __future__ import annotations

import contextvars
import threading
from pathlib import Path

import pytest
from fakes import DryRunChildren

from igi_sdk.engine import LlamaEngine
from igi_sdk.engine.dry_run import DryRunDeferred, dry_run, dry_run_slots
from igi_sdk.errors import PlacementRejectedError
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.placement import OverrideRule, Placement


@pytest.fixture()
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("IGI_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize(
    "placement",
    [
        Placement(n_ctx=1024, n_batch=256, n_ubatch=256),
        Placement(n_ctx=2048, n_batch=512, n_ubatch=128, flash_attn=False, type_k="q8_0", n_seq_max=2),
    ],
)
def test_dry_run_equals_real_load(placement: Placement) -> None:
    path = default_model_path()
    predicted = dry_run(path, placement, use_cache=False)
    with LlamaEngine(path, placement) as eng:
        real = eng.load_report
    assert predicted.compute_mib == real.compute_mib
    assert predicted.kv_mib == real.kv_mib
    assert predicted.output_mib == real.output_mib
    assert predicted.weights_source == "tensor_table"
    assert abs(sum(predicted.weights_mib.values()) - sum(real.weights_mib.values())) < 0.05
    assert abs(predicted.device_mib("CPU") - real.device_mib("CPU")) < 0.05


def test_dry_run_cache(isolated_cache: Path) -> None:
    path = default_model_path()
    placement = Placement(n_ctx=512, n_batch=128, n_ubatch=128)
    first = dry_run(path, placement)
    files = list((isolated_cache / "dry_run").glob("*.json"))
    assert len(files) == 1
    assert dry_run(path, placement) == first
    assert dry_run(path, placement.with_(n_threads=1)) == first  # threads do not change memory: same entry
    assert len(list((isolated_cache / "dry_run").glob("*.json"))) == 1


def test_dry_run_rejects_unknown_device() -> None:
    bad = Placement(rules=(OverrideRule(pattern="ffn", device="CUDA3"),))
    with pytest.raises(PlacementRejectedError):
        dry_run(default_model_path(), bad)


def test_dry_run_slots_zero_serves_the_cache_and_defers_the_rest(isolated_cache: Path) -> None:
    path = default_model_path()
    cached = Placement(n_ctx=512, n_batch=128, n_ubatch=128)
    first = dry_run(path, cached)
    with dry_run_slots(0):
        assert dry_run(path, cached) == first  # in the disk cache: no child, allowed
        with pytest.raises(DryRunDeferred):
            dry_run(path, cached.with_(n_ctx=1024))  # would start a child (and, on CUDA, a context)
    assert not list((isolated_cache / "dry_run").glob("*.tmp"))
    dry_run(path, cached.with_(n_ctx=1024))  # limit lifted on leaving the block


def test_dry_run_slots_caps_concurrent_children(isolated_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    children = DryRunChildren(monkeypatch)
    path = default_model_path()
    placements = [Placement(n_ctx=256 * (i + 1), n_batch=128, n_ubatch=128) for i in range(4)]
    with dry_run_slots(2):  # the limit is the context's: each thread runs in a copy of it
        threads = [threading.Thread(target=contextvars.copy_context().run, args=(dry_run, path, p)) for p in placements]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert children.peak == 2
    assert len(list((isolated_cache / "dry_run").glob("*.json"))) == 4
