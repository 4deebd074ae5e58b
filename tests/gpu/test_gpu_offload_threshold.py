"""On an NVIDIA GPU with the patched CUDA build: a context's own op_offload threshold (``Placement.op_offload_min_batch``,
patches/llama.cpp 0007) decides, in place of the process's 32, from how many rows a step streams its host weights to
the GPU: a decode step of 4 sequences streams them with a threshold of 4 and does not with the process's, and a lone
sequence's step streams them under neither. Counted with the patched scheduler's upload counter
(``weight_upload_bytes``), in a child process (llama.cpp loads there before numpy), on the synthetic 8B (written there
when absent: the GPU machine has no network for the default model).

Run: ``python3 -m pytest -o addopts='' -m gpu tests/gpu/test_gpu_offload_threshold.py -s``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from igi_sdk.bench.vram import open_nvml

pytestmark = pytest.mark.gpu

CHILD = r"""
import json, sys
from igi_sdk.engine.llama_engine import LlamaEngine  # llama.cpp before numpy
from igi_sdk.engine.prefetch import weight_upload_bytes
from igi_sdk.planner.placement import OverrideRule, Placement

FFN_ON_HOST = OverrideRule(pattern=r"^blk\.\d+\.ffn_(up|down|gate)\.weight$", device="CPU")
base = Placement(n_ctx=2048, n_seq_max=4, n_gpu_layers=-1, rules=[FFN_ON_HOST], load_mode="pinned")
out = {}
for threshold in (0, 4):
    engine = LlamaEngine(sys.argv[1], base.with_(op_offload_min_batch=threshold))
    prompt = engine.tokenize("The blacksmith of Oakvale said", add_special=True)
    engine.decode([(seq, prompt, 0, True) for seq in range(4)])
    pos, uploads = len(prompt), {}
    for name, seqs in (("four", [0, 1, 2, 3]), ("one", [0])):
        before = weight_upload_bytes()
        engine.decode([(seq, [42], pos, True) for seq in seqs])
        uploads[name] = weight_upload_bytes() - before
        pos += 1
    out[str(threshold)] = uploads
    engine.close()
print(json.dumps(out))
"""


def test_a_contexts_own_threshold_streams_a_four_row_step() -> None:
    if open_nvml() is None:
        pytest.skip("no NVIDIA GPU visible through NVML")
    from igi_sdk.bench.setup import resolve_model
    from igi_sdk.model_store import cache_dir

    model = str(resolve_model("llama_8b", cache_dir() / "bench-models", print)[0])
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, model], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    uploads = json.loads(proc.stdout.strip().splitlines()[-1])
    print(uploads)
    assert uploads["0"] == {"one": 0, "four": 0}  # the process's 32 rows
    assert uploads["4"]["one"] == 0
    assert uploads["4"]["four"] > 0
