"""Engine layer: which experts a MoE model's router activates for a prompt, read from llama.cpp's graph.

Since llama.cpp PR 15346, prompt processing with experts in host memory copies only the activated experts to the
GPU, so how widely a model routes a ubatch decides that cost. ``activated_experts`` prefills token ids on the CPU
with an eval callback that reads every ``ffn_moe_topk-<layer>`` tensor (the selected expert ids). Used to check
that synthetic models route like trained ones (``tests/integration/test_synthetic_moe_routing.py``,
a count of the experts each ubatch activated, on the H200).
"""

from __future__ import annotations

import ctypes
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import llama_cpp

from igi_sdk.engine._ggml import _attach, _bind
from igi_sdk.errors import EngineError

# const char * ggml_get_name(const struct ggml_tensor * tensor);
_get_name = _bind("ggml_get_name", ctypes.c_char_p, [ctypes.c_void_p])
# int64_t ggml_nelements(const struct ggml_tensor * tensor);
_nelements = _bind("ggml_nelements", ctypes.c_int64, [ctypes.c_void_p])
# int32_t ggml_get_i32_nd(const struct ggml_tensor * tensor, int i0, int i1, int i2, int i3);  (in libggml-cpu)
_get_i32_nd = _attach(("libggml-cpu.so.0", "libggml-cpu.so")).ggml_get_i32_nd
_get_i32_nd.restype = ctypes.c_int32
_get_i32_nd.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
TOPK_PREFIX = "ffn_moe_topk-"


def activated_experts(
    model_path: str | Path, tokens: Sequence[int], n_expert_used: int, *, n_ubatch: int = 512, n_threads: int = 2
) -> dict[tuple[int, int], set[int]]:
    """Expert ids activated per (ubatch index, layer) while prefilling ``tokens`` in ubatches of ``n_ubatch``.

    The last layer computes only the rows whose logits are wanted (one token per ubatch here), so it shows
    ``n_expert_used`` experts whatever the routing.

    Raises:
        EngineError: the model does not load or a decode fails.
    """
    used: dict[tuple[int, int], set[int]] = defaultdict(set)
    ubatch = [0]

    @llama_cpp.ggml_backend_sched_eval_callback
    def on_tensor(t: int, ask: bool, _user_data: int) -> bool:
        name = (_get_name(t) or b"").decode()
        if not name.startswith(TOPK_PREFIX):
            return not ask  # asked: not wanted; computed: go on
        if not ask:
            ids = used[(ubatch[0], int(name[len(TOPK_PREFIX) :]))]
            for tok in range(_nelements(t) // n_expert_used):
                ids.update(_get_i32_nd(t, j, tok, 0, 0) for j in range(n_expert_used))
        return True

    llama_cpp.llama_backend_init()
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), mparams)
    if not model:
        raise EngineError(f"llama.cpp could not load {model_path}")
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = len(tokens) + 16
    cparams.n_batch = cparams.n_ubatch = n_ubatch
    cparams.n_threads = cparams.n_threads_batch = n_threads
    cparams.cb_eval = on_tensor
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    try:
        if not ctx:
            raise EngineError("llama.cpp could not create a context")
        for start in range(0, len(tokens), n_ubatch):
            chunk = list(tokens[start : start + n_ubatch])
            arr = (llama_cpp.llama_token * len(chunk))(*chunk)
            if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(chunk))) != 0:
                raise EngineError(f"decode of tokens {start}..{start + len(chunk)} failed")
            ubatch[0] += 1
    finally:
        if ctx:
            llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    return dict(used)
