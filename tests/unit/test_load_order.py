"""Every process that loads a model imports llama.cpp before numpy (docs/engine.md, "Load order": the other
order segfaulted in ``llama_model::print_info`` on the CUDA build of the H200 host).

Each chain runs in a fresh interpreter: the imports a process makes up to its first model load."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CHAINS = {
    # the daemon's engine worker: spawn main module, the worker's module, then what worker_main imports to load
    "daemon worker": ["igi_sdk.daemon.__main__", "igi_sdk.daemon.worker_main", "igi_sdk.daemon.engine_adapter"],
    # the profiler's measurement child: the launcher module, the engine first, then a term module
    "profiler child": ["igi_sdk.profiler.isolate", "igi_sdk.profiler.isolate:ENGINE_FIRST", "igi_sdk.profiler.terms"],
}

PROBE = """
import importlib, json, sys
for name in json.loads(sys.argv[1]):
    module, _, attr = name.partition(":")
    mod = importlib.import_module(module)
    if attr:
        importlib.import_module(getattr(mod, attr))
names = list(sys.modules)  # insertion order: a module enters when its import starts
print(json.dumps({"llama_cpp": names.index("llama_cpp.llama_cpp") if "llama_cpp.llama_cpp" in names else None,
                  "numpy": names.index("numpy") if "numpy" in names else None}))
"""


def _order(chain: list[str]) -> dict[str, int | None]:
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(chain)], capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_llama_cpp_is_imported_before_numpy(name: str) -> None:
    order = _order(CHAINS[name])
    assert order["llama_cpp"] is not None and order["numpy"] is not None
    assert order["llama_cpp"] < order["numpy"], f"{name}: numpy was imported before llama.cpp ({order})"


def test_bench_worker_measure_imports_the_engine_first() -> None:
    """``bench.worker.measure`` runs in the worker after ``hello``; its own imports put the engine first too."""
    import inspect

    from igi_sdk.bench import worker

    src = inspect.getsource(worker.measure)
    assert src.index("igi_sdk.engine.llama_engine") < src.index("import numpy")


def test_the_probe_sees_the_wrong_order() -> None:
    """The check can fail: numpy imported first is reported as such."""
    order = _order(["numpy", "igi_sdk.engine.llama_engine"])
    assert order["numpy"] < order["llama_cpp"]


@pytest.mark.parametrize(("first", "expected"), [("numpy", True), ("igi_sdk.engine.llama_engine", False)])
def test_the_engine_knows_which_came_first(first: str, expected: bool) -> None:
    """``numpy_imported_before_llama_cpp`` (the engine warns on GPU builds when it is true)."""
    code = (f"import {first}\nfrom igi_sdk.engine.llama_engine import numpy_imported_before_llama_cpp as f\n"
            "print(f())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == str(expected)
