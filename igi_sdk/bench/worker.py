"""Bench layer: the engine worker process, and the parent's handle on it.

Every measured run happens in one long-lived child process (spawned, so the parent never holds a CUDA
context of the runs it measures). A llama.cpp abort, a segfault or a hang kills only the child: the parent
records the run as failed (exit code or signal, last lines of the child's log) and starts a new child for
the next run. Messages are JSON objects over a ``multiprocessing`` pipe (never pickle).

Worker requests: ``{"request": "hello"}`` -> devices and versions; ``{"request": "run", ...RunSpec}`` -> timings.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import time
import traceback
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypedDict, cast

from igi_sdk.child_log import log_tail, redirect_stdio
from igi_sdk.errors import IgiError

WARMUP_TOKENS = 32
"""Warm-up batch: at GGML_OP_OFFLOAD_MIN_BATCH, so op_offload, cuBLAS and the compute buffers are exercised."""


class WorkerCrashed(IgiError):
    """The engine worker died or hung during a run."""


@dataclass(frozen=True)
class RunSpec:
    """One measurement: load ``model_path`` with ``placement``, prefill ``prompt_tokens`` token ids, then
    decode ``reply_tokens`` tokens greedily (argmax, end-of-generation tokens ignored)."""

    model_path: str
    placement: dict[str, Any]
    prompt_tokens: int
    reply_tokens: int
    warmup: bool = True
    repeats: int = 1
    """Prefill + decode this many times on the one load (KV cleared between); the medians are reported."""
    crash_for_test: bool = False
    """Abort the worker (tests of crash handling only)."""


class RunTimings(TypedDict):
    """What one ``run`` request measured (the worker's reply, JSON over the pipe)."""

    load_s: float
    warmup_s: float
    ttft_s: float
    """Prefill of the prompt and the first argmax (the median over ``repeats``)."""
    decode_s: float
    ttft_runs_s: list[float]
    decode_runs_s: list[float]
    tps: float | None
    e2e_s: float
    llama_buffers_mib: dict[str, float]
    llama_weights_mib: dict[str, float]
    n_layers_offloaded: int | None
    weight_prefetch_abi: int
    weight_prefetch_slots: dict[str, int]
    weight_prefetch_slot_mib: dict[str, float]
    prefill_upload_bytes: int | None
    greedy_tokens: list[int]
    wall_s: float


class WorkerHello(TypedDict):
    """The reply to ``hello``: the devices llama.cpp sees in the worker (``DeviceInfo`` as JSON) and versions."""

    devices: list[dict[str, Any]]
    llama_cpp: str
    pid: int


def prompt_ids(n_tokens: int, n_vocab: int) -> list[int]:
    """Deterministic ordinary token ids (past the special and byte tokens of the synthetic vocabulary)."""
    span = max(n_vocab - 300, 1)
    return [(i * 7919) % span + 259 for i in range(n_tokens)]


def measure(spec: RunSpec) -> RunTimings:
    """Run one measurement in this process (the worker calls it). Returns timings and llama.cpp's report."""
    from igi_sdk.engine.llama_engine import LlamaEngine  # llama.cpp before numpy: see profiler/isolate.py
    from igi_sdk.engine.prefetch import weight_upload_bytes
    from igi_sdk.planner.placement import Placement

    # isort: split
    import numpy as np

    if spec.crash_for_test:
        os.abort()
    placement = Placement.model_validate(spec.placement)
    n_ctx_seq = placement.n_ctx // placement.n_seq_max  # the measured sequence's share of the context
    if spec.prompt_tokens + spec.reply_tokens + 1 > n_ctx_seq:
        raise ValueError(
            f"prompt {spec.prompt_tokens} + reply {spec.reply_tokens} does not fit n_ctx {placement.n_ctx}"
            f" / n_seq_max {placement.n_seq_max}"
        )
    t_start = time.perf_counter()
    engine = LlamaEngine(spec.model_path, placement)
    try:
        load_s = engine.load_time_s
        prompt = prompt_ids(spec.prompt_tokens, engine.n_vocab)
        warmup_s = 0.0
        if spec.warmup:
            t0 = time.perf_counter()
            warm = prompt[: min(WARMUP_TOKENS, len(prompt))]
            engine.decode([(0, warm, 0, True)])
            engine.decode([(0, [prompt[0]], len(warm), True)])
            engine.seq_clear(0)
            warmup_s = time.perf_counter() - t0
        ttfts, decodes, uploads = [], [], []
        tokens: list[int] = []
        for i in range(max(1, spec.repeats)):
            if i:
                engine.seq_clear(0)
            up0 = weight_upload_bytes()
            t0 = time.perf_counter()
            logits = engine.decode([(0, prompt, 0, True)])[0]
            token = int(np.argmax(logits))
            ttfts.append(time.perf_counter() - t0)
            up1 = weight_upload_bytes()
            if up0 is not None and up1 is not None:
                uploads.append(up1 - up0)
            run_tokens = [token]
            pos = len(prompt)
            t1 = time.perf_counter()
            for _ in range(spec.reply_tokens):
                logits = engine.decode([(0, [token], pos, True)])[0]
                token = int(np.argmax(logits))
                run_tokens.append(token)
                pos += 1
            decodes.append(time.perf_counter() - t1)
            tokens = tokens or run_tokens
        ttft_s, decode_s = statistics.median(ttfts), statistics.median(decodes)
        report = engine.load_report
        return {
            "load_s": round(load_s, 4),
            "warmup_s": round(warmup_s, 4),
            "ttft_s": round(ttft_s, 5),
            "decode_s": round(decode_s, 5),
            "ttft_runs_s": [round(t, 5) for t in ttfts],
            "decode_runs_s": [round(t, 5) for t in decodes],
            "tps": round(spec.reply_tokens / decode_s, 3) if decode_s > 0 and spec.reply_tokens else None,
            "e2e_s": round(ttft_s + decode_s, 5),
            "llama_buffers_mib": report.per_device_mib(),
            "llama_weights_mib": dict(report.weights_mib),
            "n_layers_offloaded": report.n_layers_offloaded,
            "weight_prefetch_abi": report.weight_prefetch_abi,
            "weight_prefetch_slots": dict(report.weight_prefetch_slots),
            "weight_prefetch_slot_mib": dict(report.weight_prefetch_slot_mib),
            "prefill_upload_bytes": int(statistics.median(uploads)) if uploads else None,
            "greedy_tokens": tokens,
            "wall_s": round(time.perf_counter() - t_start, 3),
        }
    finally:
        engine.close()


def hello() -> WorkerHello:
    """Devices llama.cpp sees in this process, and versions."""
    from importlib.metadata import PackageNotFoundError, version

    from igi_sdk.engine.devices import list_devices

    devices = [d.model_dump() for d in list_devices()]
    try:
        llama_cpp_version = version("llama_cpp_python")
    except PackageNotFoundError:  # no package metadata (llama_cpp imported from a bare source tree)
        llama_cpp_version = "unknown"
    return {"devices": devices, "llama_cpp": llama_cpp_version, "pid": os.getpid()}


def _worker_main(conn: Connection, log_path: str | None) -> None:
    if log_path:
        redirect_stdio(log_path, file_mode=0o644)
    while True:
        try:
            msg = json.loads(conn.recv_bytes())
        except EOFError:
            return
        op = msg.get("request")
        if op == "stop":
            return
        reply: dict[str, Any]
        try:
            if op == "hello":
                reply = {"ok": hello()}
            elif op == "run":
                reply = {"ok": measure(RunSpec(**msg["spec"]))}
            else:
                reply = {"error": f"unknown request {op!r}"}
        except BaseException as exc:  # noqa: BLE001  (reported to the parent, the worker lives on)
            reply = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
        conn.send_bytes(json.dumps(reply, default=str).encode())


def _tail(path: Path | None, n_chars: int = 1500) -> str:
    if path is None or not path.is_file():
        return ""
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - n_chars))
        return f.read().decode("utf-8", "replace").strip()


class Worker:
    """The parent's handle on the engine worker: (re)starts it and runs requests with a timeout.

    Args:
        log_path: the child's stdout/stderr go here (llama.cpp's messages, crash output).
        on_start: called right before each child starts (the VRAM sampler takes its idle baseline then).
    """

    def __init__(self, log_path: Path | None = None, on_start: Any = None) -> None:
        self.log_path = log_path
        self.on_start = on_start
        self._ctx = mp.get_context("spawn")
        self._proc: Any = None
        self._conn: Connection | None = None
        self.n_starts = 0

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.is_alive() else None

    def _ensure(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            return
        self._discard()
        if self.on_start is not None:
            self.on_start()
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(
            target=_worker_main,
            args=(child, str(self.log_path) if self.log_path else None),
            name="igi-bench-worker",
            daemon=True,
        )
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent
        self.n_starts += 1

    def ensure_started(self) -> int:
        """Start the child if it is not running; returns its pid."""
        self._ensure()
        assert self._proc is not None
        return int(self._proc.pid)

    def _discard(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(timeout=10)
        self._proc, self._conn = None, None

    def request(self, msg: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one request and wait for its reply.

        Returns:
            The reply's ``ok`` payload.

        Raises:
            WorkerCrashed: the child died or did not answer within ``timeout_s`` (it is killed; the next
                request starts a new one).
            IgiError: the request failed inside the child (message and traceback tail).
        """
        self._ensure()
        assert self._conn is not None and self._proc is not None
        self._conn.send_bytes(json.dumps(msg).encode())
        deadline = time.monotonic() + timeout_s
        while True:
            if self._conn.poll(0.05):
                try:
                    reply = json.loads(self._conn.recv_bytes())
                except EOFError:
                    break
                if "ok" in reply:
                    return reply["ok"]
                raise IgiError(reply["error"] + (f"\n{reply['traceback']}" if reply.get("traceback") else ""))
            if not self._proc.is_alive():
                break
            if time.monotonic() > deadline:
                self._discard()
                raise WorkerCrashed(f"engine worker did not answer within {timeout_s:.0f} s (killed)")
        self._proc.join(timeout=5)
        code = self._proc.exitcode
        self._discard()
        why = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        tail = log_tail(self.log_path)
        raise WorkerCrashed(f"engine worker died ({why})" + (f"; log tail:\n{tail}" if tail else ""))

    def hello(self, timeout_s: float) -> WorkerHello:
        """The child's devices and versions (see ``request``)."""
        return cast(WorkerHello, self.request({"request": "hello"}, timeout_s))

    def run(self, spec: RunSpec, timeout_s: float) -> RunTimings:
        """Measure ``spec`` in the child (see ``request``)."""
        return cast(RunTimings, self.request({"request": "run", "spec": asdict(spec)}, timeout_s))

    def close(self) -> None:
        """Stop the child (politely, then by force)."""
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send_bytes(b'{"request": "stop"}')
                self._proc.join(timeout=10)
            except (OSError, BrokenPipeError):
                pass
        self._discard()
