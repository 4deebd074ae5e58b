"""Every process that loads a model imports llama.cpp before numpy (docs/engine.md, "Load order": the other
order segfaulted in ``llama_model::print_info`` on the CUDA build of the H200 host).

Each chain runs in a fresh interpreter: the imports a process makes up to its first model load; the order is
judged by the engine's own ``numpy_imported_before_llama_cpp``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CHAINS = {
    # the daemon's engine worker: spawn main module, the worker's module, then what worker_main imports to load
    "daemon worker": [
        "igi_sdk.daemon.__main__",
        "igi_sdk.daemon.engine_process.main",
        "igi_sdk.daemon.engine_process.engine_adapter",
        "igi_sdk.daemon.engine_process.scheduler",
    ],
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
loaded = {"llama_cpp": "llama_cpp.llama_cpp" in sys.modules, "numpy": "numpy" in sys.modules}
from igi_sdk.engine.llama_engine import numpy_imported_before_llama_cpp
print(json.dumps({**loaded, "numpy_first": numpy_imported_before_llama_cpp()}))
"""


def _order(chain: list[str]) -> dict[str, bool]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(chain)], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_llama_cpp_is_imported_before_numpy(name: str) -> None:
    order = _order(CHAINS[name])
    assert order["llama_cpp"] and order["numpy"], f"{name}: the chain did not load both ({order})"
    assert not order["numpy_first"], f"{name}: numpy was imported before llama.cpp"


def test_bench_worker_measure_imports_the_engine_first() -> None:
    """``bench.worker.measure`` runs in the worker after ``hello``; its own imports put the engine first too."""
    import inspect

    from igi_sdk.bench import worker

    src = inspect.getsource(worker.measure)
    assert src.index("igi_sdk.engine.llama_engine") < src.index("import numpy")


@pytest.mark.parametrize(("first", "expected"), [("numpy", True), ("igi_sdk.engine.llama_engine", False)])
def test_the_engine_knows_which_came_first(first: str, expected: bool) -> None:
    """``numpy_imported_before_llama_cpp`` (the engine warns on GPU builds when it is true); also shows the
    chain check above can fail."""
    assert _order([first, "igi_sdk.engine.llama_engine"])["numpy_first"] is expected
