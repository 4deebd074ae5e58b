"""On an NVIDIA GPU with the patched CUDA build (Linux): ``CUDA_Host`` buffers registered (patches/llama.cpp 0008,
``engine.host_pinning``) hold the same weights as ``cudaMallocHost``'s, and host weights read on several threads
(0009, ``LLAMA_LOAD_READ_THREADS``) the same as read one after another: a placement that streams its FFN weights from
the host computes the same greedy tokens all three ways, the registered blocks are anonymous memory on transparent
huge pages where the kernel offers them, and the load's allocation and read stages and the process's exit are timed
side by side (interleaved triples, printed as ratios; the results page has them). Each load runs in a child process
(llama.cpp loads there before numpy), on the synthetic 8B (written there when absent: the GPU machine has no
network).

Run: ``python3 -m pytest -o addopts='' -m gpu tests/gpu/test_gpu_host_pinning.py -s``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from igi_sdk.bench.vram import open_nvml

pytestmark = pytest.mark.gpu

CHILD = r"""
import json, sys, time
from igi_sdk.engine.llama_engine import LlamaEngine  # llama.cpp before numpy
from igi_sdk.engine.host_pinning import host_pinning
from igi_sdk.planner.placement import OverrideRule, Placement


def anon_huge_kib():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


FFN_ON_HOST = OverrideRule(pattern=r"^blk\.\d+\.ffn_(up|down|gate)\.weight$", device="CPU")
placement = Placement(n_ctx=1024, n_seq_max=1, n_gpu_layers=-1, rules=[FFN_ON_HOST], load_mode="pinned")
huge_before = anon_huge_kib()
t = time.perf_counter()
engine = LlamaEngine(sys.argv[1], placement, trace_load=True)
load_s = time.perf_counter() - t
huge_mib = (anon_huge_kib() - huge_before) / 1024
stages = engine.load_stages
tokens = engine.tokenize("The blacksmith of Oakvale said", add_special=True)
pos, reply = 0, []
for _ in range(24):
    logits = engine.decode([(0, tokens, pos, True)])[0]
    pos += len(tokens)
    tokens = [int(logits.argmax())]
    reply.append(tokens[0])
print(json.dumps({"how": host_pinning(), "read_threads": engine.load_report.host_read_threads, "load_s": load_s, "alloc_s": stages.alloc_s, "data_host_s": stages.data_host_s,
                  "host_weight_mib": stages.host_weight_mib, "anon_huge_mib": huge_mib, "reply": reply}), flush=True)
sys.stdout.close()
"""


def _thp_offered() -> bool:
    try:
        mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    return "[never]" not in mode


def _run(model: str, how: str, read_threads: str = "8") -> dict[str, object]:
    """One child: load, reply, exit; ``exit_s`` from its last line to the process reaped."""
    env = {
        **os.environ,
        "GGML_CUDA_HOST_REGISTER_ANON": "1" if how == "registered" else "0",
        "LLAMA_LOAD_READ_THREADS": read_threads,
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, model], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    t_line = time.perf_counter()
    _, err = proc.communicate(timeout=300)
    exit_s = time.perf_counter() - t_line
    assert proc.returncode == 0 and line, err[-2000:]
    result: dict[str, object] = json.loads(line)
    result["exit_s"] = exit_s
    return result


def test_registered_memory_and_threaded_reads_compute_the_same_and_are_timed() -> None:
    if open_nvml() is None:
        pytest.skip("no NVIDIA GPU visible through NVML")
    if not sys.platform.startswith("linux"):
        pytest.skip("registered host memory is Linux-only")
    from igi_sdk.bench.setup import resolve_model
    from igi_sdk.model_store import cache_dir

    model = str(resolve_model("llama_8b", cache_dir() / "bench-models", print)[0])
    # the model file is in the page cache (written there, or read by an earlier step): every arm reads from memory
    triples = [(_run(model, "allocated"), _run(model, "registered"), _run(model, "registered", "1")) for _ in range(2)]
    for allocated, registered, serial in triples:
        assert allocated["how"] == "allocated" and registered["how"] == serial["how"] == "registered"
        assert (allocated["read_threads"], registered["read_threads"], serial["read_threads"]) == (8, 8, None)
        assert registered["reply"] == allocated["reply"] == serial["reply"]
        host_mib = float(registered["host_weight_mib"])  # type: ignore[arg-type]
        assert host_mib > 1024  # the FFN weights are on the host
        if _thp_offered():
            assert float(registered["anon_huge_mib"]) >= 0.9 * host_mib  # type: ignore[arg-type]
        assert float(allocated["anon_huge_mib"]) < 0.1 * host_mib  # type: ignore[arg-type]
    keys = ("load_s", "alloc_s", "data_host_s", "exit_s")
    table = {
        k: [tuple(round(float(run[k]), 3) for run in triple) for triple in triples]  # type: ignore[arg-type]
        for k in keys
    }
    print(json.dumps({"host_weight_mib": triples[0][1]["host_weight_mib"], "allocated_registered_serial": table}))
    ratios = {
        "registered / allocated": {k: sorted(round(t[1] / t[0], 3) for t in v if t[0] > 0) for k, v in table.items()},
        "8 threads / 1": {k: sorted(round(t[1] / t[2], 3) for t in v if t[2] > 0) for k, v in table.items()},
    }
    print(json.dumps(ratios))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "host_pinning.json").write_text(
            json.dumps({"triples": triples, "ratios": ratios}, indent=1)
        )
