"""Engine layer, pure part: where one model load (or reload) spent its wall time, from llama.cpp's own log; and
where one move between placements of a weight cache base did (``MoveStages``).

``LlamaEngine`` timestamps every llama.cpp log line it captures (``_log.LogCapture.times``), the calls it makes
(``llama_model_load_from_file``, ``llama_init_from_model``, the frees of a reload) and, when asked
(``trace_load=True``), every call of llama.cpp's load progress callback, which llama.cpp makes before each
tensor's data with the fraction of weight bytes done. ``load_stages`` cuts that timeline at lines llama.cpp prints
at fixed points of its loader (0.3.36):

    llama_model_loader: loaded meta data ...           the file opened, GGUF header and tensor index parsed
    load_tensors: loading model tensors ...            hyper-parameters and vocabulary loaded
    load_tensors:   CUDA_Host model buffer size = ...  tensors created and placed, weight buffers allocated
    (llama_model_load_from_file returns)               tensor data read and uploaded
    llama_kv_cache: size = ...                         KV buffers allocated and cleared
    sched_reserve: reserving ...                       graphs reserved, compute buffers allocated, until
    sched_reserve: reserve took ...

Without mmap, llama.cpp loads the tensors of device buffers first (read from the file through pinned staging
buffers and uploaded), then those of host buffers (read into them), so the progress fraction where the device
buffers' bytes end splits the data stage in two. With mmap the host tensors are mapped, not copied: the data
stage is the device uploads (from the page cache) alone. This module imports only the stdlib and pydantic.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from igi_sdk.engine.reports import HOST_DEVICE, device_of_buffer

MIB = 1024 * 1024
_META = "llama_model_loader: loaded meta data"
_TENSORS = "load_tensors: loading model tensors"
_BUFFER_RE = re.compile(r"^\S+:\s+\S+ model buffer size =")
_KV_DONE = "llama_kv_cache: size ="
_RESERVE_START = "sched_reserve: reserving"
_RESERVE_END = "sched_reserve: reserve took"
_PROGRESS_EPS = 1e-4  # the progress fraction is a float: bytes a few tensors of norms may differ by


@dataclass(frozen=True)
class LoadTimeline:
    """Raw timestamps of one load (``time.perf_counter`` seconds)."""

    t_start: float  # llama_model_load_from_file called
    t_model: float  # it returned
    t_context: float  # llama_init_from_model called
    t_end: float  # it returned
    lines: Sequence[str]  # llama.cpp's log lines of the model load and the context creation, in order
    times: Sequence[float]  # when each line was complete
    progress: Sequence[tuple[float, float]] = ()  # (time, fraction of weight bytes done) per progress call
    mmap: bool = True  # the load mapped the file (load_mode mmap) rather than reading it
    free_context_s: float | None = None  # a reload: the previous context freed (KV, compute buffers)
    free_model_s: float | None = None  # a reload: the previous model freed (weight buffers, pinned memory)


class LoadStages(BaseModel):
    """One load's wall time by stage, seconds. ``None``: the stage was not seen (a line llama.cpp did not print,
    a reload's frees on a first load, the split of the data stage without ``trace_load`` or with mmap)."""

    model_config = ConfigDict(frozen=True)

    free_context_s: float | None = None
    free_model_s: float | None = None
    model_s: float  # llama_model_load_from_file, whole
    open_s: float | None = None  # file opened, GGUF metadata and tensor index parsed
    vocab_s: float | None = None  # hyper-parameters, vocabulary
    alloc_s: float | None = None  # tensors created and placed, weight buffers allocated (pinning: CUDA_Host)
    data_s: float | None = None  # tensor data read from the file (page cache) and uploaded
    data_device_s: float | None = None  # of data_s: the device buffers' tensors (read + upload)
    data_host_s: float | None = None  # of data_s: the host buffers' tensors (read into them)
    context_s: float  # llama_init_from_model, whole
    kv_s: float | None = None  # context constructed, KV buffers allocated and cleared
    reserve_s: float | None = None  # graphs reserved, compute buffers (and prefetch slots) allocated
    device_weight_mib: float = 0.0  # weights in device buffers (what the data stage uploads)
    host_weight_mib: float = 0.0  # weights in host buffers (mapped with mmap, else copied)
    mmap: bool = True

    @property
    def free_s(self) -> float | None:
        """Both frees of a reload (None on a first load)."""
        if self.free_context_s is None or self.free_model_s is None:
            return None
        return self.free_context_s + self.free_model_s

    @property
    def total_s(self) -> float:
        """Frees (a reload), model load and context creation."""
        return (self.free_s or 0.0) + self.model_s + self.context_s


def _first(lines: Sequence[str], times: Sequence[float], prefix: str, lo: float, hi: float) -> float | None:
    for line, t in zip(lines, times, strict=True):
        if lo <= t <= hi and line.startswith(prefix):
            return t
    return None


def _last_match(
    lines: Sequence[str], times: Sequence[float], pattern: re.Pattern[str], lo: float, hi: float
) -> float | None:
    found = None
    for line, t in zip(lines, times, strict=True):
        if lo <= t <= hi and pattern.match(line):
            found = t
    return found


def _span(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else max(0.0, b - a)


def load_stages(timeline: LoadTimeline, weights_mib: Mapping[str, float]) -> LoadStages:
    """Cut ``timeline`` into stages (see the module docstring); ``weights_mib`` is the load report's per buffer
    type (what splits the data stage between device and host buffers)."""
    tl = timeline
    lines, times = tl.lines, tl.times
    device_mib = sum(mib for name, mib in weights_mib.items() if device_of_buffer(name) != HOST_DEVICE)
    host_mib = sum(mib for name, mib in weights_mib.items() if device_of_buffer(name) == HOST_DEVICE)
    t_meta = _first(lines, times, _META, tl.t_start, tl.t_model)
    t_tensors = _first(lines, times, _TENSORS, tl.t_start, tl.t_model)
    t_buffers = _last_match(lines, times, _BUFFER_RE, tl.t_start, tl.t_model)
    data_device = data_host = None
    if not tl.mmap and tl.progress and t_buffers is not None:
        total = device_mib + host_mib
        device_share = device_mib / total if total > 0 else 0.0
        # the call before the first host tensor (device buffers load first without mmap), else the final one
        t_split = next((t for t, f in tl.progress if f >= device_share - _PROGRESS_EPS), tl.progress[-1][0])
        data_device = max(0.0, t_split - t_buffers) if device_mib > 0 else 0.0
        data_host = max(0.0, tl.t_model - t_split) if host_mib > 0 else 0.0
    reserve_start = _first(lines, times, _RESERVE_START, tl.t_context, tl.t_end)
    reserve_end = _first(lines, times, _RESERVE_END, tl.t_context, tl.t_end)
    return LoadStages(
        free_context_s=tl.free_context_s,
        free_model_s=tl.free_model_s,
        model_s=tl.t_model - tl.t_start,
        open_s=_span(tl.t_start, t_meta),
        vocab_s=_span(t_meta, t_tensors),
        alloc_s=_span(t_tensors, t_buffers),
        data_s=_span(t_buffers, tl.t_model),
        data_device_s=data_device,
        data_host_s=data_host,
        context_s=tl.t_end - tl.t_context,
        kv_s=_span(tl.t_context, _first(lines, times, _KV_DONE, tl.t_context, tl.t_end)),
        reserve_s=_span(reserve_start, reserve_end),
        device_weight_mib=round(device_mib, 2),
        host_weight_mib=round(host_mib, 2),
        mmap=tl.mmap,
    )


_RELEASE_RE = re.compile(
    r"unregistered ([0-9.]+) MiB of host blocks in ([0-9.]+) s, reset (\d+) CUDA contexts in ([0-9.]+) s"
)


def release_split(lines: Sequence[str]) -> tuple[float, float] | None:
    """(unregister_s, reset_s) from ggml-cuda's line of a release of the CUDA devices (patches/llama.cpp 0010:
    ``ggml_backend_cuda_release_devices: unregistered X MiB of host blocks in A s, reset N CUDA contexts in B s``), or
    None where it logged none (nothing to release, or a build that does not log it)."""
    for line in lines:
        match = _RELEASE_RE.search(line)
        if match is not None:
            return float(match.group(2)), float(match.group(4))
    return None


class MoveStages(BaseModel):
    """One move between placements of a cache base (``LlamaEngine.move_to``) by stage, seconds, in order. ``None``:
    the stage was not part of this move (the context kept, the CUDA devices neither given back nor taken again, or the
    build's ggml-cuda did not log the release's split)."""

    model_config = ConfigDict(frozen=True)

    uncache_s: float  # the sets the new placement does not have freed from the device
    on_freed_s: float  # the caller's callback (the scheduler exports every session there when the context goes)
    context_free_s: float | None = None  # the old context freed (its KV cache, compute buffers)
    release_s: float | None = None  # the CUDA devices given back (the detached placement)
    unregister_s: float | None = None  # of release_s: the host blocks unregistered
    reset_s: float | None = None  # of release_s: the primary contexts reset
    on_context_freed_s: float | None = None  # the caller's callback once the old context is freed
    reacquire_s: float | None = None  # the host blocks registered again, out of the detached placement
    context_s: float | None = None  # the new context made
    cache_s: float = 0.0  # the new sets cached (allocated and uploaded from the host copy)
    reserve_s: float = 0.0  # the scheduler made again once (graphs reserved)

    def rounded(self, ndigits: int = 4) -> dict[str, float | None]:
        """Every stage's seconds, rounded (None where the stage was not part of the move): for a log line or a
        record."""
        return {k: None if v is None else round(v, ndigits) for k, v in self.model_dump().items()}

    @property
    def total_s(self) -> float:
        parts = (self.uncache_s, self.on_freed_s, self.context_free_s, self.release_s, self.on_context_freed_s)
        rest = (self.reacquire_s, self.context_s, self.cache_s, self.reserve_s)
        return sum(p for p in (*parts, *rest) if p is not None)
