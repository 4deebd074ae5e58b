"""Edge: run one profiler measurement in a child process, so a crash inside llama.cpp or CUDA loses only
that measurement.

The child is started the way the benchmark's engine worker is (``multiprocessing`` "spawn": stdin on
/dev/null, stdout and stderr into a log file, faulthandler on), and the result comes back over a pipe.
A single-process ``igi profile`` that segfaults loses the whole profile and prints nothing, hence the isolation
(a crashed child is also retried once in a plain ``python -c`` child).

Load order: on the H200 host (CUDA build of llama.cpp) every model load in a process that has imported
numpy *before* llama.cpp segfaults inside ``llama_model::print_info``: its ``std::ostream`` insert is bound
to the copy of that libstdc++ code inside ``libggml-cuda.so`` (native backtrace). Importing
llama.cpp first (``ENGINE_FIRST``) avoids it, so this module and the package's ``__init__`` import neither
numpy nor pydantic, and a child imports the engine before its target. Measured there with this order:
``igi profile`` in 23 s, no term missing.
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from igi_sdk.child_log import log_tail, redirect_stdio

Outcome = tuple[dict[str, Any] | None, str | None]
_REQUEST_ENV = "IGI_PROFILE_TERM_REQUEST"
_RESULT_MARKER = "IGI_PROFILE_TERM "


def run_isolated(target: str, kwargs: dict[str, Any], *, timeout_s: float) -> Outcome:
    """Call ``target`` (``"package.module:function"``, returning a JSON-able dict) with ``kwargs`` in a child:
    a spawn-started one, and if that crashes (a signal), once more in a plain child process.

    Returns:
        (result, None) on success, or (None, reason) when the child crashed (signal), failed, timed out or
        sent no result. A crash's reason ends with the tail of the child's output (faulthandler's stack);
        when both children crashed, the reason names both.
    """
    result, why = run_in_spawned_child(target, kwargs, timeout_s=timeout_s)
    if why is None or not why.startswith("crashed"):
        return result, why
    retry, why_retry = run_in_plain_child(target, kwargs, timeout_s=timeout_s)
    if why_retry is None:
        return retry, None
    return None, f"{why}; retried in a plain child: {why_retry}"


def run_in_spawned_child(target: str, kwargs: dict[str, Any], *, timeout_s: float) -> Outcome:
    """``target(**kwargs)`` in a ``multiprocessing`` spawn child (as the benchmark's engine worker starts)."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="igi-profile-term-") as tmp:
        log_path = Path(tmp) / "child.log"
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_child_main, args=(child, target, kwargs, str(log_path)), name="igi-profile-term", daemon=True
        )
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


def run_in_plain_child(target: str, kwargs: dict[str, Any], *, timeout_s: float) -> Outcome:
    """``target(**kwargs)`` in ``python -X faulthandler -c ...`` with stdin on /dev/null, the request in the
    environment, stderr into a log file and the result on a marked stdout line."""
    env = dict(os.environ, **{_REQUEST_ENV: json.dumps({"target": target, "kwargs": kwargs})})
    code = "from igi_sdk.profiler.isolate import _plain_child_main; raise SystemExit(_plain_child_main())"
    with tempfile.TemporaryDirectory(prefix="igi-profile-term-") as tmp:
        log_path = Path(tmp) / "child.log"
        with log_path.open("wb") as log:
            try:
                proc = subprocess.run(
                    [sys.executable, "-X", "faulthandler", "-c", code],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    env=env,
                    timeout=timeout_s,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                return None, f"timed out after {timeout_s:.0f} s"
        lines = [ln for ln in proc.stdout.decode("utf-8", "replace").splitlines() if ln.startswith(_RESULT_MARKER)]
        if not lines:
            if proc.returncode < 0:
                return None, f"crashed (signal {-proc.returncode}){_tail(log_path)}"
            return None, f"no result (exit {proc.returncode}){_tail(log_path)}"
    payload = json.loads(lines[-1][len(_RESULT_MARKER) :])
    if "error" in payload:
        return None, f"{payload['error']}: {payload['message']}"
    return payload["result"], None


ENGINE_FIRST = "igi_sdk.engine.llama_engine"
"""Imported by a measurement child before its target, so llama.cpp's libraries load before numpy's and
pydantic's (the order of the engine worker and the daemon; see the module docstring)."""


def _call(target: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    module, _, func = target.partition(":")
    try:
        importlib.import_module(ENGINE_FIRST)
        return {"result": getattr(importlib.import_module(module), func)(**kwargs)}
    except Exception as exc:  # reported to the parent as the term's missing reason
        return {"error": type(exc).__name__, "message": str(exc)}


def _plain_child_main() -> int:
    request = json.loads(os.environ[_REQUEST_ENV])
    payload = _call(request["target"], request["kwargs"])
    sys.stdout.write(_RESULT_MARKER + json.dumps(payload) + "\n")
    sys.stdout.flush()
    return 0


def _tail(path: Path) -> str:
    text = log_tail(path)
    return f": {text}" if text else ""


def _child_main(conn: Connection, target: str, kwargs: dict[str, Any], log_path: str) -> None:
    redirect_stdio(log_path)
    faulthandler.enable()  # a crash writes its Python stack into the log (fd 2)
    conn.send(_call(target, kwargs))
    conn.close()
