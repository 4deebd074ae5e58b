"""The engine and the project's patched llama.cpp build: the prefetch capability is detected, the settings
reach llama.cpp only around context creation, and on a machine without a GPU a placement that asks for
staging slots loads and generates exactly like the serial one (the slots exist only on a GPU backend)."""

from __future__ import annotations

import os

import numpy as np

from igi_sdk.engine import LlamaEngine
from igi_sdk.engine.dry_run import dry_run_in_process
from igi_sdk.engine.prefetch import (
    MIN_BATCH_ENV,
    MIN_BATCH_MUL_MAT_ID_ENV,
    SLOT_MAX_MIB_ENV,
    SLOTS_ENV,
    prefetch_abi,
    scheduler_env,
    weight_upload_bytes,
)
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.placement import Placement


def test_the_build_has_the_projects_weight_prefetch() -> None:
    # ./dev.sh builds llama-cpp-python with patches/llama.cpp applied; a stock build reports 0
    # ABI 2: a scheduler's own op_offload threshold too (patch 0007)
    assert prefetch_abi() == 2, "llama-cpp-python is not the project's patched build: run ./dev.sh test"
    assert isinstance(weight_upload_bytes(), int)


def test_scheduler_env_is_set_only_inside_the_block() -> None:
    os.environ.pop(SLOTS_ENV, None)
    os.environ[SLOT_MAX_MIB_ENV] = "7"
    try:
        with scheduler_env(Placement(prefetch_slots=3, op_offload_min_batch_mul_mat_id=200, op_offload_min_batch=4)):
            assert os.environ[SLOTS_ENV] == "3"
            assert os.environ[MIN_BATCH_MUL_MAT_ID_ENV] == "200"
            assert os.environ[MIN_BATCH_ENV] == "4"
            assert SLOT_MAX_MIB_ENV not in os.environ
        assert SLOTS_ENV not in os.environ and MIN_BATCH_MUL_MAT_ID_ENV not in os.environ
        assert MIN_BATCH_ENV not in os.environ
        assert os.environ[SLOT_MAX_MIB_ENV] == "7"
    finally:
        os.environ.pop(SLOT_MAX_MIB_ENV, None)


def _greedy(placement: Placement, n: int = 24) -> tuple[list[int], LlamaEngine]:
    engine = LlamaEngine(default_model_path(), placement)
    prompt = engine.tokenize("The blacksmith of Oakvale said", add_special=True)
    logits = engine.decode([(0, prompt, 0, True)])[0]
    out, pos = [], len(prompt)
    for _ in range(n):
        token = int(np.argmax(logits))
        out.append(token)
        logits = engine.decode([(0, [token], pos, True)])[0]
        pos += 1
    return out, engine


def test_slots_change_nothing_without_a_gpu_backend() -> None:
    base = Placement(n_ctx=512, n_batch=256, n_ubatch=256)
    serial, e0 = _greedy(base)
    e0.close()
    pipelined, e1 = _greedy(base.with_(prefetch_slots=3, prefetch_slot_max_mib=64, op_offload_min_batch_mul_mat_id=64))
    try:
        assert pipelined == serial
        report = e1.load_report
        assert report.weight_prefetch_abi == prefetch_abi()
        assert report.weight_prefetch_slots == {}  # no GPU: nothing streams, no staging allocated
    finally:
        e1.close()
    assert SLOTS_ENV not in os.environ


def test_dry_run_of_a_prefetch_placement_on_the_cpu() -> None:
    base = Placement(n_ctx=512, n_batch=256, n_ubatch=256, load_mode="pinned")
    serial = dry_run_in_process(default_model_path(), base)
    pipelined = dry_run_in_process(default_model_path(), base.with_(prefetch_slots=3))
    assert pipelined.compute_mib == serial.compute_mib
