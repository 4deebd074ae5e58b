"""Edge: run one profiler measurement in a child process, so a crash inside llama.cpp or CUDA loses only
that measurement.

The child is started the way the benchmark's engine worker is (``multiprocessing`` "spawn": stdin on
/dev/null, stdout and stderr into a log file, faulthandler on), and the result comes back over a pipe.
History: the first H200 run's ``igi profile`` died with SIGSEGV and no output, and the whole profile was
lost, hence the isolation. Then, on the H200 hosts of the second session, every model load segfaulted (in
``llama_model_load_from_file``, all model shapes, CPU-only placements too) in children started as
``python -m igi_sdk.profiler.isolate`` with the request on a stdin pipe, while the same load succeeded
in-process, in a plain child process and in the spawn-started benchmark worker; the cause was not found
in the GPU time left, so the children are now started like that worker.
"""

from __future__ import annotations

import faulthandler
import importlib
import multiprocessing as mp
import os
import tempfile
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any


def run_isolated(target: str, kwargs: dict[str, Any], *, timeout_s: float) -> tuple[dict[str, Any] | None, str | None]:
    """Call ``target`` (``"package.module:function"``, returning a JSON-able dict) with ``kwargs`` in a child.

    Returns:
        (result, None) on success, or (None, reason) when the child crashed (signal), failed, timed out or
        sent no result. A crash's reason ends with the tail of the child's output (faulthandler's stack).
    """
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="igi-profile-term-") as tmp:
        log_path = Path(tmp) / "child.log"
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child_main, args=(child, target, kwargs, str(log_path)),
                           name="igi-profile-term", daemon=True)
        proc.start()
        child.close()
        payload = None
        try:
            if not parent.poll(timeout_s):
                proc.kill()
                proc.join(timeout=10)
                return None, f"timed out after {timeout_s:.0f} s"
            payload = parent.recv()
        except EOFError:  # the child died before sending (it may not be reaped yet: wait for its exit code)
            pass
        finally:
            parent.close()
        proc.join(timeout=10)
        if proc.is_alive():  # sent its result but hangs on the way out (a driver teardown): not our business
            proc.kill()
            proc.join(timeout=10)
        if payload is None:
            code = proc.exitcode
            if code is not None and code < 0:
                return None, f"crashed (signal {-code}){_tail(log_path)}"
            return None, f"no result (exit {code}){_tail(log_path)}"
    if "error" in payload:
        return None, f"{payload['error']}: {payload['message']}"
    return payload["result"], None


def _tail(path: Path, n_chars: int = 1500) -> str:
    try:
        text = path.read_bytes()[-n_chars:].decode("utf-8", "replace").strip()
    except OSError:
        return ""
    return f": {text}" if text else ""


def _child_main(conn: Connection, target: str, kwargs: dict[str, Any], log_path: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    faulthandler.enable()  # a crash writes its Python stack into the log (fd 2)
    module, _, func = target.partition(":")
    try:
        result = getattr(importlib.import_module(module), func)(**kwargs)
        payload: dict[str, Any] = {"result": result}
    except Exception as exc:  # reported to the parent as the term's missing reason
        payload = {"error": type(exc).__name__, "message": str(exc)}
    conn.send(payload)
    conn.close()
