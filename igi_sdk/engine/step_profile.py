"""Engine layer: where a continuous-batching step spends its time (for benchmarks; no cost when unused).

``StepProfile`` wraps, while its ``with`` block is open, the few calls a ``BatchScheduler`` step makes into
llama.cpp and into its per-sequence Python: ``llama_decode`` itself, the rest of ``LlamaEngine.decode`` (the
``llama_batch`` filled from Python, the logits rows copied out), the ``Sampler``'s draw, the grammar's checks, the
token's bytes. Every step's wall time goes to those buckets and the rest, the scheduler's own Python (composing
the step, bookkeeping, events), to ``scheduler``; beside them, the bytes of host weights the step uploaded to the
GPU (op_offload's streaming). The wrappers are installed on the classes and the engine instance and removed at
exit, so the hot paths carry no timing code; a benchmark process profiles one engine at a time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import llama_cpp

from igi_sdk.engine import sequences
from igi_sdk.engine.grammar import GrammarConstraint
from igi_sdk.engine.prefetch import weight_upload_bytes
from igi_sdk.engine.sampler import Sampler

if TYPE_CHECKING:
    from igi_sdk.engine.batching import BatchScheduler

BUCKETS = ("llama_decode", "batch_io", "sample", "grammar", "token_text", "scheduler")


@dataclass
class StepTimes:
    """Seconds per bucket over the steps of one kind (``BUCKETS``), with the steps and tokens they served."""

    steps: int = 0
    decode_tokens: int = 0
    prefill_tokens: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    """CPU seconds of this process (every thread) over those steps: on a machine shared with other jobs the wall
    time mostly measures them; with one llama.cpp thread the CPU time is the work."""
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))
    upload_bytes: int = 0
    """Bytes of host weights the patched scheduler uploaded to the GPU during those steps (op_offload's streaming,
    ``prefetch.weight_upload_bytes``; 0 on a stock build)."""

    def per_step_ms(self) -> dict[str, float]:
        """Milliseconds per step of each bucket."""
        n = max(self.steps, 1)
        return {k: 1000.0 * v / n for k, v in self.seconds.items()}

    def as_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "decode_tokens": self.decode_tokens,
            "prefill_tokens": self.prefill_tokens,
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "per_step_ms": self.per_step_ms(),
            "upload_mib_per_step": self.upload_bytes / max(self.steps, 1) / (1 << 20),
            "upload_gb_s": self.upload_gb_s(),
        }

    def upload_gb_s(self) -> float:
        """The uploads' rate over the time inside ``llama_decode`` (GB/s; 0 without uploads): against the PCIe
        copy rate, how far a step that streams its host weights is from being bound by the copies."""
        decode_s = self.seconds["llama_decode"]
        return self.upload_bytes / decode_s / 1e9 if decode_s > 0 else 0.0


class StepProfile:
    """Times the steps of one ``BatchScheduler``: ``decode_only`` (no prompt tokens in the step: the batched
    decode the paper's S_TG measures) and ``mixed`` (a step with prompt tokens).

    Usage::

        profile = StepProfile()
        with profile.installed(sched.engine):
            while sched.has_work():
                profile.step(sched)
        profile.decode_only.per_step_ms()
    """

    def __init__(self) -> None:
        self.decode_only = StepTimes()
        self.mixed = StepTimes()
        self._acc: dict[str, float] = dict.fromkeys(BUCKETS, 0.0)
        self._depth = 0

    def _timed(self, bucket: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        acc = self._acc

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self._depth:  # nested inside another timed call: counted there
                return fn(*args, **kwargs)
            self._depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[bucket] += time.perf_counter() - t0
                self._depth -= 1

        return wrapper

    @contextmanager
    def installed(self, engine: Any) -> Iterator[StepProfile]:
        """Wrap the timed calls for the duration of the block (``engine``: the ``LlamaEngine`` stepped)."""
        saved_decode = llama_cpp.llama_decode
        classes: list[tuple[type, str, Any]] = [
            (Sampler, "sample", Sampler.sample),
            (GrammarConstraint, "allows", GrammarConstraint.allows),
            (GrammarConstraint, "accept", GrammarConstraint.accept),
            (GrammarConstraint, "mask", GrammarConstraint.mask),
        ]
        decode_c = self._timed_inner("llama_decode", saved_decode)
        engine_decode = engine.decode
        engine_piece = engine.token_piece
        try:
            sequences.llama_cpp.llama_decode = decode_c  # type: ignore[attr-defined]
            for cls, name, fn in classes:
                setattr(cls, name, self._timed("sample" if cls is Sampler else "grammar", fn))
            engine.decode = self._timed("batch_io", engine_decode)
            engine.token_piece = self._timed("token_text", engine_piece)
            yield self
        finally:
            sequences.llama_cpp.llama_decode = saved_decode  # type: ignore[attr-defined]
            for cls, name, fn in classes:
                setattr(cls, name, fn)
            del engine.decode, engine.token_piece  # the class's methods again

    def _timed_inner(self, bucket: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """A call made inside ``LlamaEngine.decode``: its time moves from ``batch_io`` to ``bucket``."""
        acc = self._acc

        def wrapper(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                dt = time.perf_counter() - t0
                acc[bucket] += dt
                acc["batch_io"] -= dt

        return wrapper

    def step(self, sched: BatchScheduler) -> list[Any]:
        """One ``sched.step()``, its time added to the buckets of its kind."""
        before = sched.counters
        uploaded = weight_upload_bytes() or 0
        for k in self._acc:
            self._acc[k] = 0.0
        t0, c0 = time.perf_counter(), time.process_time()
        events = sched.step()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        after = sched.counters
        n_prefill = after.prefill_tokens_evaluated - before.prefill_tokens_evaluated
        n_decode = after.decode_tokens - before.decode_tokens
        if n_prefill == 0 and n_decode == 0:
            return events
        times = self.mixed if n_prefill else self.decode_only
        times.steps += 1
        times.decode_tokens += n_decode
        times.prefill_tokens += n_prefill
        times.wall_s += wall
        times.cpu_s += cpu
        times.upload_bytes += (weight_upload_bytes() or 0) - uploaded
        timed = 0.0
        for k, v in self._acc.items():
            times.seconds[k] += v
            timed += v
        times.seconds["scheduler"] += wall - timed
        return events
