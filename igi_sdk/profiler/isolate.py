"""Edge: run one profiler measurement in a child process, so a crash inside llama.cpp or CUDA loses only
that measurement (``python -m igi_sdk.profiler.isolate``; request JSON on stdin, one result line on stdout).

The first H200 run's ``igi profile`` died with SIGSEGV and no output, and the whole profile was lost; now
every llama.cpp-touching term runs here with a timeout and a crash comes back as a reason string.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from typing import Any

_RESULT_MARKER = "IGI_PROFILE_TERM "


def run_isolated(target: str, kwargs: dict[str, Any], *, timeout_s: float) -> tuple[dict[str, Any] | None, str | None]:
    """Call ``target`` (``"package.module:function"``, returning a JSON-able dict) with ``kwargs`` in a child.

    Returns:
        (result, None) on success, or (None, reason) when the child crashed (signal), failed, timed out or
        printed no result.
    """
    request = json.dumps({"target": target, "kwargs": kwargs})
    cmd = [sys.executable, "-X", "faulthandler", "-m", "igi_sdk.profiler.isolate"]  # a crash prints its Python stack
    try:
        proc = subprocess.run(cmd, input=request, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout_s:.0f} s"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_RESULT_MARKER)]
    if proc.returncode < 0:
        return None, f"crashed (signal {-proc.returncode}){_tail(proc.stderr)}"
    if not lines:
        return None, f"no result (exit {proc.returncode}){_tail(proc.stderr)}"
    payload = json.loads(lines[-1][len(_RESULT_MARKER):])
    if "error" in payload:
        return None, f"{payload['error']}: {payload['message']}"
    return payload["result"], None


def _tail(stderr: str) -> str:
    text = stderr.strip()
    return f": {text[-1500:]}" if text else ""


def _main() -> int:
    request = json.loads(sys.stdin.read())
    module, _, func = request["target"].partition(":")
    try:
        result = getattr(importlib.import_module(module), func)(**request["kwargs"])
        payload: dict[str, Any] = {"result": result}
    except Exception as exc:  # reported to the parent as the term's missing reason
        payload = {"error": type(exc).__name__, "message": str(exc)}
    sys.stdout.write(_RESULT_MARKER + json.dumps(payload) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
