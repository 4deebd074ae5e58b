"""Engine layer: what a placement would allocate, without allocating (llama.cpp ``no_alloc``).

llama.cpp loads the model with ``no_alloc=True`` and ``load_mode`` none (no_alloc with mmap aborts the
process), creates the context, and logs what it would allocate. In 0.3.36 the logged *compute* and
*output* buffer sizes are the real would-be sizes, but the weight and KV buffers are dummies (0 MiB), so:

- compute / output MiB: parsed from ``sched_reserve: CPU compute buffer size = ...`` (exact);
- KV MiB per device: the ``llama_kv_cache: size = ...`` summary split over the ``layer N: dev = D`` lines;
- weights MiB per device: the tensor table summed over llama.cpp's logged decisions (``layer N assigned
  to device D``, ``tensor T ... buffer type overridden to B``); ``weights_source = "tensor_table"``.

A misstep inside llama.cpp can abort the process, so the work runs in a child process
(``python -m igi_sdk.engine.dry_run --json``, request on stdin) with a timeout. Results are cached on disk
by (model file identity, placement, the llama.cpp build, the GPU and driver, ``CUDA_VISIBLE_DEVICES`` as CUDA reads
it): see ``_cache_key``. The cache only ever saves work: an entry that cannot be read is a miss, one that cannot be
written a warning.

On a CUDA build each child holds a CUDA context while it runs (618 MiB of device memory on the H200, measured
by the daemon's GPU test): a process under a VRAM budget limits them with ``dry_run_slots``.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from igi_sdk.engine.reports import MemoryReport
from igi_sdk.errors import EngineError
from igi_sdk.files import file_identity, read_cache_entry, remove_stale_temps, temp_beside
from igi_sdk.planner.placement import OP_OFFLOAD_ENV, Placement

DEFAULT_TIMEOUT_S = 120.0
_RESULT_MARKER = "IGI_DRY_RUN_RESULT "
_CACHE_VERSION = 4
"""Bumped whenever the engine's context settings change what a dry run reports: 4, the key holds the model file's
inode, device and ctime, the llama.cpp build (GPU offload, its libraries) and the GPU and driver; 3, graphs reserved
for n_outputs_max = n_seq_max; 2, the key holds ``CUDA_VISIBLE_DEVICES`` as CUDA reads it (a report made with the GPU
hidden has no device buffers)."""
_log = logging.getLogger("igi_sdk.engine.dry_run")


@dataclass(frozen=True)
class _Slots:
    """A ``dry_run_slots`` limit: ``n`` children at once, counted by ``running``."""

    n: int
    running: threading.BoundedSemaphore


_slots: contextvars.ContextVar[_Slots | None] = contextvars.ContextVar("igi_dry_run_slots", default=None)
_swept_dirs: set[Path] = set()
_swept_lock = threading.Lock()


class DryRunDeferred(Exception):  # noqa: N818  (not an error: the caller frees VRAM and asks again)
    """An uncached dry run was needed while ``dry_run_slots(0)`` was in force.

    Deliberately not an ``IgiError``: no layer may treat it as a failed dry run (which would fall back to
    estimates or to CPU-only); it reaches the caller that set the limit.
    """


@contextmanager
def dry_run_slots(n: int | None) -> Iterator[None]:
    """Limit the dry-run child processes of this planning call while the block runs.

    On a CUDA build every child creates its own CUDA context (about ``Profile.gpu.reserve_mib``, 618 MiB on
    the H200) for as long as it runs, VRAM a caller under a budget has to count. ``n`` children at most run
    at once; with ``n == 0`` a dry run that is not in the disk cache raises ``DryRunDeferred`` instead of
    starting a child; ``None`` lifts the limit.

    The limit is a context variable: it holds for the calling thread (and the tasks it starts in a copy of its
    context, as ``profiler.compute_table.prefetch_exact`` does), never for another thread planning at the same
    time, and leaving the block restores what this thread had before.
    """
    token = _slots.set(None if n is None else _Slots(n, threading.BoundedSemaphore(max(1, n))))
    try:
        yield
    finally:
        _slots.reset(token)


def _cache_key(model_path: Path, placement: Placement) -> str:
    """What a report depends on, hashed:

    - the model file: resolved path and ``files.file_identity`` (device, inode, size, mtime, ctime: a replacement
      keeping size and mtime is a new file);
    - the memory fields of the placement (not the thread counts);
    - the llama.cpp build (``_build_identity``): llama-cpp-python's version, whether it offloads to a GPU at all
      (a CPU build's report has every buffer on the CPU), its shared libraries (a rebuild with other patches or
      backends) and whether it has the weight prefetch (its staging slots are part of the compute buffer);
    - the GPU behind CUDA device 0 and its driver (NVML), and the GPUs CUDA lets the child see: a report made with
      the GPU hidden has no device buffers and is never reused with it visible;
    - ``GGML_OP_OFFLOAD_MIN_BATCH`` as the child inherits it (the threshold of a placement with none of its own).
    """
    from igi_sdk.gpu_visibility import visibility_key

    st = model_path.stat()
    memory_fields = placement.model_dump(exclude={"n_threads", "n_threads_batch"}, mode="json")
    for name, default in (("gpu_context", True), ("kv_host_layers", 0)):
        if memory_fields[name] == default:  # the keys of the placements made before these fields stay what they were
            del memory_fields[name]
    visible = visibility_key()
    ident = {
        "v": _CACHE_VERSION,
        "path": str(model_path.resolve()),
        "file": file_identity(st)._asdict(),
        "placement": memory_fields,
        "build": _build_identity(),
        "gpu": _gpu_identity(visible),
        "cuda_visible": visible,
        # the op_offload threshold a child inherits (a placement without one of its own runs with it): a host weight
        # staged for a batch of that many rows is part of the compute buffer
        "op_offload_min_batch": os.environ.get(OP_OFFLOAD_ENV),
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]


def _build_identity() -> dict[str, Any]:
    """The llama.cpp build a child would load: version, GPU offload, the weight prefetch ABI and the libraries."""
    import llama_cpp

    from igi_sdk.engine.prefetch import prefetch_abi

    return {
        "llama_cpp": llama_cpp.__version__,
        "gpu_offload": _gpu_offload(),
        "prefetch_abi": prefetch_abi(),
        "libraries": library_identity(Path(llama_cpp.llama_cpp._lib._name).parent),
    }


@functools.cache
def _gpu_offload() -> bool:
    """``llama_supports_gpu_offload()`` of the loaded build (fixed for the process: asked once). It enumerates the
    backends' devices (their properties only, no CUDA context), as resolving a GPU rule's buffer type does."""
    import llama_cpp

    return bool(llama_cpp.llama_supports_gpu_offload())


def library_identity(lib_dir: Path) -> list[tuple[str, int, int]]:
    """(name, size, mtime_ns) of every shared library in ``lib_dir`` (llama-cpp-python's ``lib``): the build the
    child loads. ``dev.sh`` rebuilding with other patches, or a CUDA build in place of a CPU one (``libggml-cuda``),
    changes it."""
    out = []
    for entry in sorted(lib_dir.iterdir()):
        if entry.suffix in (".so", ".dylib", ".dll") or ".so." in entry.name:
            info = entry.stat()
            out.append((entry.name, info.st_size, info.st_mtime_ns))
    return out


@functools.lru_cache(maxsize=8)
def _gpu_identity(visible: str) -> tuple[str, str] | None:
    """(name, driver version) of the GPU behind CUDA device 0 under ``CUDA_VISIBLE_DEVICES`` = ``visible`` (its
    ``visibility_key``), as the profiler's machine key reads it; None without NVML or a visible GPU. Kept per
    process: NVML takes milliseconds to open, and a driver is not replaced under a running process."""
    from igi_sdk.gpu_identity import nvidia_gpu

    gpu = nvidia_gpu()
    return None if gpu is None else (gpu[0], gpu[1])


def _cache_file(key: str) -> Path:
    from igi_sdk.model_store import cache_dir

    return cache_dir() / "dry_run" / f"{key}.json"


def dry_run(
    model_path: str | os.PathLike[str],
    placement: Placement,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    use_cache: bool = True,
) -> MemoryReport:
    """Memory a ``LlamaEngine(model_path, placement)`` would use, measured by llama.cpp without allocating.

    Args:
        model_path: GGUF file.
        placement: the placement to size.
        timeout_s: limit for the child process.
        use_cache: read/write the on-disk cache in ``igi_sdk.model_store.cache_dir() / "dry_run"``.

    Raises:
        ModelNotFoundError, ModelCorruptError, ModelUnsupportedError: the file cannot be used.
        PlacementRejectedError: a rule targets a device this machine cannot serve.
        EngineError: the child failed, crashed or timed out.
        DryRunDeferred: not cached, and ``dry_run_slots(0)`` is in force in this context.
    """
    from igi_sdk.engine.devices import resolve_buffer_type
    from igi_sdk.engine.gguf_table import read_tensor_table

    path = Path(model_path)
    read_tensor_table(path)  # typed model errors here, not in the child
    for rule in placement.rules:
        resolve_buffer_type(rule.device)
    cache_file = _cache_file(_cache_key(path, placement))
    if use_cache:
        _sweep_stale_temps(cache_file.parent)
        cached = _read_entry(cache_file)
        if cached is not None:
            return cached
    slots = _slots.get()
    if slots is not None and slots.n == 0:
        raise DryRunDeferred(f"dry run of {path.name} needed; no dry-run child may start now")
    request = json.dumps({"model_path": str(path), "placement": placement.model_dump(mode="json")})
    cmd = [sys.executable, "-m", "igi_sdk.engine.dry_run", "--json"]
    try:
        with slots.running if slots is not None else nullcontext():
            proc = subprocess.run(cmd, input=request, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise EngineError(f"dry run of {path} timed out after {timeout_s:.0f} s") from exc
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_RESULT_MARKER)]
    if proc.returncode != 0 or not lines:
        why = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
        raise EngineError(f"dry run of {path} failed ({why}): {proc.stderr.strip()[-800:]}")
    payload = json.loads(lines[-1][len(_RESULT_MARKER) :])
    if "error" in payload:
        raise _rebuild_error(payload["error"], payload["message"])
    report = MemoryReport.model_validate(payload["report"])
    if use_cache:
        _write_entry(cache_file, report)
    return report


def _read_entry(cache_file: Path) -> MemoryReport | None:
    """The cached report, or None (a miss): missing, unreadable, not this user's regular file, or not a report (then
    removed, if it can be)."""
    raw = read_cache_entry(cache_file, what="dry-run cache entry")
    if raw is None:
        return None
    try:
        return MemoryReport.model_validate_json(raw)
    except ValueError:
        try:
            cache_file.unlink(missing_ok=True)
        except OSError:
            pass
        return None


def _write_entry(cache_file: Path, report: MemoryReport) -> None:
    """Write ``report`` as ``cache_file`` through a temp of this writer's own; a failure (a full disk, a folder in the
    entry's place) is logged as a warning and leaves no temp: the report is good, only the cache misses it."""
    tmp = temp_beside(cache_file)
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(report.model_dump_json())
        os.replace(tmp, cache_file)
    except OSError as exc:
        _log.warning("dry-run cache entry %s not written: %s", cache_file, exc)
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def _sweep_stale_temps(folder: Path) -> None:
    """Remove the ``*.tmp`` files that killed writers left in ``folder`` (``files.remove_stale_temps``), once per
    folder and process."""
    with _swept_lock:
        if folder in _swept_dirs:
            return
        _swept_dirs.add(folder)
    remove_stale_temps(folder, "*.tmp")


def _rebuild_error(kind: str, message: str) -> Exception:
    from igi_sdk import errors

    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, errors.IgiError):
        return cls(message)
    return EngineError(f"dry run failed: {kind}: {message}")


def dry_run_in_process(model_path: str | os.PathLike[str], placement: Placement) -> MemoryReport:
    """The dry run itself, in *this* process (a llama.cpp abort kills it: prefer ``dry_run``)."""
    import llama_cpp

    from igi_sdk.engine import _log
    from igi_sdk.engine.gguf_table import read_tensor_table
    from igi_sdk.engine.params import context_params, model_params
    from igi_sdk.engine.prefetch import scheduler_env
    from igi_sdk.engine.reports import device_of_buffer, kv_mib_from_size_lines, parse_load_log
    from igi_sdk.errors import ModelCorruptError

    path = Path(model_path)
    table = read_tensor_table(path)
    mparams = model_params(placement, no_alloc=True)
    cparams = context_params(placement)
    llama_cpp.llama_backend_init()
    with _log.capture_log() as cap:
        model = llama_cpp.llama_model_load_from_file(os.fsencode(path), mparams.params)
        if not model:
            raise ModelCorruptError(f"llama.cpp could not load {path} (dry run)")
        try:
            with scheduler_env(placement):
                ctx = llama_cpp.llama_init_from_model(model, cparams)
            if not ctx:
                raise EngineError("llama.cpp could not create a context (dry run)")
            llama_cpp.llama_free(ctx)
        finally:
            llama_cpp.llama_model_free(model)
    lines = cap.text_lines()
    logged = parse_load_log(lines)
    weights: dict[str, float] = {}
    output_dev = logged.layer_devices.get(table.n_layer, "CPU")
    names = {t.name for t in table.tensors}
    for t in table.tensors:
        if t.name in logged.overridden_tensor_targets:
            dev = device_of_buffer(logged.overridden_tensor_targets[t.name])
        elif t.layer is not None:
            dev = logged.layer_devices.get(t.layer, "CPU")
        elif t.name.startswith("output"):
            dev = output_dev
        else:
            dev = "CPU"  # token_embd and other input-side tensors stay on the host
        weights[dev] = weights.get(dev, 0) + t.n_bytes
        if t.name == "token_embd.weight" and "output.weight" not in names:
            # the tied head is llama.cpp's duplicate of token_embd, on the output layer's device unless a rule
            # matching that name (it matches both copies) overrode it
            dup_dev = dev if t.name in logged.overridden_tensor_targets else output_dev
            if dup_dev != "CPU":
                weights[dup_dev] = weights.get(dup_dev, 0) + t.n_bytes
    return MemoryReport(
        weights_mib={dev: round(n / 1024 / 1024, 2) for dev, n in weights.items()},
        kv_mib=kv_mib_from_size_lines(lines),
        compute_mib=logged.compute_mib,
        output_mib=logged.output_mib,
        weights_source="tensor_table",
    )


def _main(argv: list[str]) -> int:
    """``python -m igi_sdk.engine.dry_run --json``: request JSON on stdin, one result line on stdout."""
    if argv != ["--json"]:
        print("usage: python -m igi_sdk.engine.dry_run --json  < {model_path, placement}", file=sys.stderr)
        return 2
    request = json.loads(sys.stdin.read())
    try:
        report = dry_run_in_process(request["model_path"], Placement.model_validate(request["placement"]))
        payload: dict[str, Any] = {"report": report.model_dump(mode="json")}
    except Exception as exc:  # reported to the parent as a typed error
        payload = {"error": type(exc).__name__, "message": str(exc)}
    sys.stdout.write(_RESULT_MARKER + json.dumps(payload) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
