"""Every process that loads a model loads llama.cpp's library before numpy's and pyzmq's (docs/engine.md,
"Load order": the other order segfaulted in ``llama_model::print_info`` on the CUDA build of the H200 host).

Each chain runs in a fresh interpreter: the imports a process makes up to its first model load; the order is
judged by the engine's own ``imported_before_llama_cpp``. The daemon's worker is also checked as it really starts, in
the log of a real daemon (``worker_ready``, ``worker_load_order``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from daemon_process import DaemonProcess

CHAINS = {
    # the daemon's engine worker as spawn starts it: the main module (`python -m igi_sdk.daemon`, or the `igi` and
    # `igi-daemon` scripts' imports), the process target's module (boot), what boot imports before it unpickles the
    # start, the start's own modules, then what worker_main imports to load
    "daemon worker": [
        "igi_sdk.daemon.__main__",
        "igi_sdk.cli",
        "igi_sdk.daemon.engine_process.boot",
        "igi_sdk.engine.pinned_pool",
        "igi_sdk.engine.llama_engine",
        "igi_sdk.daemon.worker.protocol",
        "igi_sdk.daemon.engine_process.main",
        "igi_sdk.daemon.engine_process.engine_adapter",
        "igi_sdk.daemon.engine_process.scheduler",
    ],
    # the profiler's measurement child: the launcher module, the engine first, then a term module
    "profiler child": ["igi_sdk.profiler.isolate", "igi_sdk.profiler.isolate:ENGINE_FIRST", "igi_sdk.profiler.terms"],
}

BEFORE_THE_ENGINE = {
    # what the worker imports before boot loads llama.cpp: none of them may load a native library of the list
    "daemon worker": [
        "igi_sdk.daemon.__main__",
        "igi_sdk.cli",
        "igi_sdk.daemon.engine_process.boot",
        "igi_sdk.engine.pinned_pool",
    ],
}

PROBE = """
import importlib, json, sys
for name in json.loads(sys.argv[1]):
    module, _, attr = name.partition(":")
    mod = importlib.import_module(module)
    if attr:
        importlib.import_module(getattr(mod, attr))
from igi_sdk.engine.llama_engine import NATIVE_BEFORE_LLAMA_RISKS, imported_before_llama_cpp
loaded = {name: name in sys.modules for name in ("llama_cpp.llama_cpp", *NATIVE_BEFORE_LLAMA_RISKS)}
print(json.dumps({"loaded": loaded, "before": imported_before_llama_cpp()}))
"""

NATIVE_LOADED = """
import importlib, json, sys
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
print(json.dumps(sorted(n for n in ("llama_cpp", "numpy", "zmq", "msgpack") if n in sys.modules)))
"""


def _order(chain: list[str]) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(chain)], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_llama_cpp_is_loaded_before_other_native_libraries(name: str) -> None:
    order = _order(CHAINS[name])
    loaded = order["loaded"]
    assert isinstance(loaded, dict) and loaded["llama_cpp.llama_cpp"] and loaded["numpy"], f"{name}: {order}"
    assert order["before"] == [], f"{name}: imported before llama.cpp: {order['before']}"


@pytest.mark.parametrize("name", sorted(BEFORE_THE_ENGINE))
def test_nothing_before_the_engine_loads_a_native_library(name: str) -> None:
    """The spawn's main module (a console script's is imported again in each spawn child) and boot import none of them:
    the ipc layer, pulled in by the worker's start before boot existed, loaded pyzmq first, and every model load of the
    daemon's worker segfaulted on the H200."""
    out = subprocess.run(
        [sys.executable, "-c", NATIVE_LOADED, json.dumps(BEFORE_THE_ENGINE[name])],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_daemons_worker_loads_llama_cpp_first() -> None:
    """The worker of a real daemon (`python -m igi_sdk.daemon`, spawned through boot) reports the native libraries it
    had loaded before llama.cpp's: none."""
    daemon = DaemonProcess(["--worker-nice", "0"]).start()  # its priority is not what is checked here
    try:
        log = daemon.log_tail(50_000)
        assert "event=worker_ready" in log
        assert "worker_load_order" not in log
    finally:
        daemon.stop()


def test_bench_worker_measure_imports_the_engine_first() -> None:
    """``bench.worker.measure`` runs in the worker after ``hello``; its own imports put the engine first too."""
    import inspect

    from igi_sdk.bench import worker

    src = inspect.getsource(worker.measure)
    assert src.index("igi_sdk.engine.llama_engine") < src.index("import numpy")


@pytest.mark.parametrize(
    ("first", "expected"), [("numpy", ["numpy"]), ("zmq", ["zmq"]), ("igi_sdk.engine.llama_engine", [])]
)
def test_the_engine_knows_which_came_first(first: str, expected: list[str]) -> None:
    """``imported_before_llama_cpp`` (the engine warns on GPU builds when it names any); also shows the chain check
    above can fail."""
    assert _order([first, "igi_sdk.engine.llama_engine", "numpy"])["before"] == expected
