"""The llama.cpp the project builds (dev.sh): what its CPU backend was compiled with."""

from __future__ import annotations

import platform

import llama_cpp


def test_the_cpu_backend_has_no_amx_matmul() -> None:
    """llama.cpp's AMX matmul crashes in ggml_backend_amx_mul_mat on the embedded model on CPUs that have AMX
    (Xeon Sapphire Rapids), so dev.sh compiles it out; the repack paths stay."""
    info = llama_cpp.llama_print_system_info().decode()
    assert "AMX_INT8 = 1" not in info, info
    if platform.machine() == "x86_64":
        assert "REPACK = 1" in info, info
