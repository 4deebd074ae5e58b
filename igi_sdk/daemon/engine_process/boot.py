"""Daemon layer (worker process): the engine worker's first code, which loads llama.cpp's library before any other
native library.

On the H200 host's CUDA build every model load segfaulted (in ``llama_model::print_info``) in a process that had
loaded another C++ library first: numpy's, and pyzmq's (docs/engine.md, "Load order"). A ``spawn`` child unpickles its
target and arguments before the target runs, importing their modules, and the worker's start (``WorkerStart``) pulls
in the ipc layer and with it pyzmq. So the supervisor spawns :func:`boot` with the start pickled to bytes
(unpickling bytes imports nothing): it turns on faulthandler, hides the GPU when asked and sets the pinned pool's cap,
how host memory is page-locked and the op_offload threshold (read by the CUDA backend), loads llama.cpp, and only then
unpickles the start and runs ``worker_main``.

A *standby* worker (``start_pickle`` None) does all of that with the GPU visible, imports the worker's own modules and
initializes llama.cpp's backends, then waits for its start on the pipe (the pickled ``WorkerStart``, sent by the
supervisor that adopts it): the interpreter's start, the imports and the library loads are done before a growth needs
a GPU worker, and no CUDA context is made until its start loads a model. The daemon going away before that (EOF) ends
it. A start onto the GPU, a standby's or not, makes the CUDA context on a thread of its own as the worker begins
(``engine.devices.warm_gpu_context``), so that it overlaps the load's first steps.

The abort flags are two C ``int``s in memory shared with the daemon (``multiprocessing.RawArray``, made by the
supervisor for each worker; indexes ``worker.protocol.STOP_ANY_STEP`` and ``STOP_REDONE_STEP``). The supervisor sets
the first before it sends an urgent ``Reload`` (a shrink) or when a reload waits too long for the step in flight, and
the second too unless that stop may spare a step done again after a stop (a growth's); llama.cpp reads the first
during a step, the second during a step done again after a stopped one (``LlamaEngine.abort_on_flag``,
patches/llama.cpp 0005), so the step in flight stops between graph nodes or scheduler splits and is undone, and the
worker clears both when it takes the reload up (``engine_process.stop_flags``).

This module imports only the standard library; ``tests/process/test_load_order.py`` checks the chain.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import sys
import time
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the module itself is imported in boot, before llama.cpp (it only sets a variable)
    from igi_sdk.engine.host_pinning import HostPinning


def enable_faulthandler() -> None:
    """A crash inside llama.cpp (SIGSEGV, SIGABRT) writes the worker's Python stack to stderr; a worker without a
    usable stderr (a windowed game's frozen daemon) goes without."""
    try:
        faulthandler.enable()
    except (RuntimeError, ValueError, OSError):  # sys.stderr None, closed, or without a file descriptor
        pass


OP_OFFLOAD_ENV = "GGML_OP_OFFLOAD_MIN_BATCH"  # planner.placement.OP_OFFLOAD_ENV: boot imports nothing heavy
"""Read once, when ggml-cuda registers its devices: the worker sets it before llama.cpp is loaded."""


def boot(
    conn: Connection,
    start_pickle: bytes | None,
    hide_gpu: bool,
    pinned_pool_model: str | None,
    op_offload_min_batch: int | None = None,
    abort_flags: Any = None,
    host_pinning: HostPinning | None = None,
) -> None:
    """The worker process's target: llama.cpp first, then ``worker_main`` with the unpickled start.

    Args:
        conn: the worker's end of the pipe.
        start_pickle: the pickled ``WorkerStart``; None: a standby, which reads it from ``conn`` once llama.cpp is
            loaded and its backends initialized (the module docstring).
        hide_gpu: ``CUDA_VISIBLE_DEVICES=""`` before llama.cpp is loaded (``WorkerStart.hide_gpu``).
        pinned_pool_model: the model file whose size caps the pinned host pool (``WorkerConfig.pinned_pool``);
            None: the pool stays as the environment sets it.
        op_offload_min_batch: ``GGML_OP_OFFLOAD_MIN_BATCH`` (``WorkerConfig.op_offload_min_batch``); None: the
            environment's.
        abort_flags: the abort flags shared with the daemon (a ``RawArray`` of two C ints; the module docstring);
            None: the steps always run to their end.
        host_pinning: how the process page-locks host memory (``WorkerConfig.host_pinning``); None: the environment's,
            else the engine's default.
    """
    enable_faulthandler()
    llama_cpp_preloaded = "llama_cpp" in sys.modules  # imported by the spawn's main module: too late to hide the GPU
    if hide_gpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    if op_offload_min_batch is not None:
        os.environ[OP_OFFLOAD_ENV] = str(op_offload_min_batch)
    if host_pinning is not None:
        from igi_sdk.engine.host_pinning import set_host_pinning

        set_host_pinning(host_pinning)
    if pinned_pool_model is not None:
        from pathlib import Path

        from igi_sdk.engine.pinned_pool import keep_pinned_memory

        keep_pinned_memory(Path(pinned_pool_model))
    import igi_sdk.engine.llama_engine  # noqa: F401  (imports llama_cpp before anything else it needs)
    from igi_sdk.daemon.engine_process.main import worker_main  # and then what the worker runs (numpy, the ipc layer)

    standby_wait_s = None
    if start_pickle is None:  # a standby: ready for a model, then waiting for one
        igi_sdk.engine.llama_engine.init_backends()
        t_wait = time.monotonic()
        try:
            start_pickle = conn.recv_bytes()
        except (EOFError, OSError):  # dropped, or the daemon went away
            return
        standby_wait_s = time.monotonic() - t_wait
    start = pickle.loads(start_pickle)
    if not start.hide_gpu and start.placement.uses_gpu():
        from igi_sdk.engine.devices import warm_gpu_context

        warm_gpu_context()  # the CUDA context made while the load opens the file (``warm_gpu_context``)
    worker_main(
        conn, start, llama_cpp_preloaded=llama_cpp_preloaded, abort_flags=abort_flags, standby_wait_s=standby_wait_s
    )
