"""VLMOpt's memory rule in the pure planner: an image turn peaks at max(encode phase, LLM), never the sum."""

from __future__ import annotations

import math

import pytest

from igi_sdk.planner.vision import (
    MIB,
    VISION_SHAPES,
    LlmMemory,
    VisionShape,
    image_turn_peak_mib,
    plan_encoder,
    projector_tensor_specs,
)

QWEN = VISION_SHAPES["qwen25vl_7b"]
TINY = VISION_SHAPES["smolvlm_tiny"]


def llm(fixed: float, weights: float, context: float) -> LlmMemory:
    return LlmMemory(fixed_mib=fixed, weights_mib=weights, context_mib=context)


def test_the_peak_is_the_larger_phase_not_the_sum() -> None:
    m = llm(600, 3000, 500)
    assert image_turn_peak_mib(m, 1500, "model") == (2100, 4100)  # encoder alone beside the CUDA context
    assert image_turn_peak_mib(m, 400, "context") == (4000, 4100)
    assert image_turn_peak_mib(m, 1500, "none") == (5600, 5600)  # stock: resident beside the whole LLM


def test_encoder_borrows_the_llm_context_when_it_fits_there() -> None:
    m = llm(600, 4200, 2000)  # a large compute buffer + KV: the tiny encoder fits in it
    plan = plan_encoder(TINY, m, vram_budget_mib=8192, gpu_available=True, n_ctx_seq=2048)
    assert (plan.device, plan.llm_release) == ("gpu", "context")
    assert plan.image_turn_peak_mib == m.total_mib  # borrowing never raises the peak


def test_encoder_runs_while_the_llm_steps_aside_when_only_the_budget_holds_it() -> None:
    m = llm(700, 2600, 600)
    plan = plan_encoder(QWEN, m, vram_budget_mib=4096, gpu_available=True, n_ctx_seq=4096)
    assert (plan.device, plan.llm_release) == ("gpu", "model")
    assert plan.image_turn_peak_mib == max(plan.encoder_gpu_mib + m.fixed_mib, m.total_mib)
    assert plan.image_turn_peak_mib <= 4096
    assert plan.image_turn_peak_mib < m.total_mib + plan.encoder_gpu_mib  # never the sum


def test_the_image_token_cap_shrinks_with_the_budget_then_the_encoder_goes_to_the_cpu() -> None:
    m = llm(700, 0, 300)
    caps = {}
    for budget in (8192, 2600, 2000):
        caps[budget] = plan_encoder(QWEN, m, vram_budget_mib=budget, gpu_available=True, n_ctx_seq=16384)
    assert caps[8192].image_max_tokens == 4096 and caps[8192].device == "gpu"
    assert caps[2600].device == "gpu" and caps[2600].image_max_tokens < 4096
    assert caps[2600].encoder_mib <= 2600 - 700
    low = caps[2000]
    assert low.device == "cpu" and low.encoder_gpu_mib == 0 and low.image_turn_peak_mib == m.total_mib
    assert low.image_max_tokens == 4096  # on the CPU the full cap stays


def test_the_cap_never_takes_more_than_half_a_sequence() -> None:
    plan = plan_encoder(QWEN, llm(700, 0, 300), vram_budget_mib=65536, gpu_available=True, n_ctx_seq=2048)
    assert plan.image_max_tokens == 1024


def test_no_gpu_means_the_cpu() -> None:
    plan = plan_encoder(QWEN, llm(0, 0, 0), vram_budget_mib=0, gpu_available=False, n_ctx_seq=4096)
    assert plan.device == "cpu" and plan.flash_attn and "no GPU" in plan.reason


def test_flash_attention_is_what_makes_720p_affordable() -> None:
    n = QWEN.image_tokens(1280, 720)
    assert n == 1196  # 1288x728 in 28 px merged patches: 46 x 26
    assert QWEN.compute_bytes(n, flash_attn=False) > 3 * QWEN.compute_bytes(n, flash_attn=True)


def test_weight_bytes_are_the_tensor_specs() -> None:
    assert TINY.weight_bytes() == sum(
        math.prod(ne) * (4 if t == "f32" else 2) for _, ne, t, _ in projector_tensor_specs(TINY)
    )
    assert 1200 < QWEN.weight_bytes() / MIB < 1400  # Qwen2.5-VL-7B's vision tower in f16: about 1.3 GB
    assert QWEN.model_copy(update={"file_weight_bytes": 5}).weight_bytes() == 5


def test_shapes_reject_nonsense() -> None:
    with pytest.raises(ValueError):
        VisionShape(
            projector_type="idefics3",
            n_layer=0,
            n_embd=64,
            n_ff=128,
            n_head=4,
            patch_size=16,
            image_size=64,
            n_merge=2,
            projection_dim=576,
        )


def test_igi_plan_shows_the_encoder_placement_and_memory(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from igi_sdk.cli.plan import run

    args = [
        "synthetic:qwen25_7b",
        "--ctx",
        "4096",
        "--prompt-tokens",
        "1400",
        "--reply-tokens",
        "64",
        "--profile",
        "reference:h200",
        "--mmproj",
        "synthetic:qwen25vl_7b",
        "--json",
    ]
    assert run([*args, "--vram-budget-mib", "4096"]) == 0
    out = json.loads(capsys.readouterr().out)
    enc, chosen = out["vision_encoder"], out["plan"]["chosen"]
    assert enc["device"] == "gpu" and enc["flash_attn"] and enc["image_turn_peak_mib"] <= 4096
    assert enc["llm_mib"] == pytest.approx(
        sum(
            chosen["memory"][k]
            for k in (
                "gpu_weights_mib",
                "gpu_kv_mib",
                "gpu_compute_mib",
                "gpu_pools_mib",
                "gpu_reserve_mib",
                "safety_margin_mib",
            )
        )
    )
    assert run([*args, "--vram-budget-mib", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["vision_encoder"]["device"] == "cpu"
    assert run(args[:-1] + ["--vram-budget-mib", "8192"]) == 0
    text = capsys.readouterr().out
    assert "vision encoder" in text and "image-turn peak" in text


def test_qwen_images_follow_mtmds_resize() -> None:
    tiny = VISION_SHAPES["qwen25vl_tiny"]
    assert tiny.resized_px(64, 64) == (84, 84)  # scaled up to 8 merged patches of 28 px: 3 x 3
    assert tiny.image_tokens(1, 1) == 9 and tiny.image_tokens(1, 4096) == 146
    assert tiny.image_tokens(640, 480, 8) == 6  # scaled down under the cap, sides floored
    with pytest.raises(ValueError, match="no pixels"):
        tiny.resized_px(0, 10)


def test_the_cap_never_falls_below_what_mtmd_accepts() -> None:
    plan = plan_encoder(QWEN, llm(700, 0, 300), vram_budget_mib=65536, gpu_available=True, n_ctx_seq=10)
    assert plan.image_max_tokens == QWEN.min_image_tokens == 8
