"""Engine layer: ``LlamaEngine``, one GGUF model and one llama_context loaded with a ``Placement``.

Loads through llama.cpp's low-level API with the placement's tensor_buft_overrides, captures llama.cpp's
log during load and context creation (``load_report``), and offers tokenization, the model's own chat
template, a low-level multi-sequence decode API, and per-sequence state that survives ``reload`` with another
placement. Generation runs on it in ``batching.BatchScheduler`` (one slot or several).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import struct
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from functools import cached_property
from pathlib import Path
from types import TracebackType
from typing import Any

import llama_cpp
import numpy as np

from igi_sdk.engine import _ggml, _log, device_release
from igi_sdk.engine import cache_base as cache_base_mod
from igi_sdk.engine.chat import render_chat_segments, render_chat_template
from igi_sdk.engine.gguf_table import read_tensor_table
from igi_sdk.engine.grammar import GrammarConstraint
from igi_sdk.engine.host_pinning import apply_default as apply_host_pinning_default
from igi_sdk.engine.load_reads import apply_default as apply_read_threads_default
from igi_sdk.engine.load_timing import LoadStages, LoadTimeline, MoveStages, load_stages, release_split
from igi_sdk.engine.pageable_uploads import apply_default as apply_bounce_threads_default
from igi_sdk.engine.params import LOAD_MODE_NONE, context_params, model_params
from igi_sdk.engine.prefetch import prefetch_abi, scheduler_env
from igi_sdk.engine.reports import LoadReport, parse_load_log
from igi_sdk.engine.sequences import BatchDecoder, BatchEntry
from igi_sdk.errors import EngineError, ModelCorruptError, MoveUndone
from igi_sdk.planner.placement import Placement
from igi_sdk.planner.tensors import ModelTable
from igi_sdk.planner.tiers import STATE_KEYS

_STATE_MAGIC = b"IGIS"
_STATE_VERSION = 1
#: The most a state's JSON header may take: its placement keys and sizes, and one token id (at most 7 digits and a
#: sign, a comma and a space) per position of the context.
_STATE_HEADER_FIXED_BYTES = 4096
_STATE_HEADER_BYTES_PER_TOKEN = 16
_STATE_KEYS = ("flash_attn", "type_k", "type_v", "n_seq_max")
#: positions of an image chunk hold a pseudo token id in -2 .. -1 - PSEUDO_TOKEN_SPAN (``vision.pseudo_token``), and a
#: position whose token is not known holds -1; a saved sequence state may carry both
PSEUDO_TOKEN_SPAN = 1 << 30
_backend_lock = threading.Lock()
_backend_ready = False


NATIVE_BEFORE_LLAMA_RISKS = ("numpy", "zmq")
"""Modules whose native libraries, loaded before llama.cpp's, made every model load segfault on the CUDA build of the
H200 host (numpy; pyzmq, whose libzmq links libstdc++) (docs/engine.md, "Load order")."""


def imported_before_llama_cpp() -> list[str]:
    """Those of ``NATIVE_BEFORE_LLAMA_RISKS`` this process imported before llama.cpp's library module."""
    names = list(sys.modules)  # insertion order: a module enters when its import starts
    if "llama_cpp.llama_cpp" not in sys.modules:
        return [name for name in NATIVE_BEFORE_LLAMA_RISKS if name in sys.modules]
    first = names.index("llama_cpp.llama_cpp")
    return [name for name in NATIVE_BEFORE_LLAMA_RISKS if name in sys.modules and names.index(name) < first]


def init_backends() -> None:
    """Initialize llama.cpp's backends now rather than at the first load, its devices enumerated (ggml-cuda reads their
    properties only: no CUDA context is made): what a standby worker does before it is given a model."""
    _backend_init()
    llama_cpp.llama_supports_gpu_offload()  # the backend registry, with its devices


def _backend_init() -> None:
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            early = imported_before_llama_cpp()
            if early and llama_cpp.llama_supports_gpu_offload():
                warnings.warn(
                    f"{', '.join(early)} imported before llama.cpp; on CUDA builds this order has crashed model "
                    "loads (import igi_sdk.engine.llama_engine first; docs/engine.md, 'Load order')",
                    RuntimeWarning,
                    stacklevel=3,
                )
            apply_host_pinning_default()
            apply_read_threads_default()
            apply_bounce_threads_default()
            llama_cpp.llama_backend_init()
            _backend_ready = True


# size_t llama_model_release_weights(struct llama_model * model, bool device_only)   (patch 0004)
_release_weights = _ggml.bind_optional("llama_model_release_weights", ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_bool])


def _as_abort_callback(fn: Any | None) -> Any | None:
    """``fn`` (a C function) as the ``ggml_abort_callback`` llama_set_abort_callback takes, or None."""
    address = None if fn is None else ctypes.cast(fn, ctypes.c_void_p).value
    return None if address is None else llama_cpp.ggml_abort_callback(address)


# bool llama_abort_on_flag(void * flag)   (patch 0005): passed to llama_set_abort_callback as the C function it is
_abort_on_flag = _as_abort_callback(_ggml.bind_optional("llama_abort_on_flag", ctypes.c_bool, [ctypes.c_void_p]))

# patch 0006:
# int64_t llama_model_cache_weights(llama_model *, const char * key, const char * const * names, int32_t n,
#                                   ggml_backend_dev_t dev)
_cache_weights = _ggml.bind_optional(
    "llama_model_cache_weights",
    ctypes.c_int64,
    [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p), ctypes.c_int32, ctypes.c_void_p],
)
# int64_t llama_model_uncache_weights(llama_model *, const char * key)
_uncache_weights = _ggml.bind_optional(
    "llama_model_uncache_weights", ctypes.c_int64, [ctypes.c_void_p, ctypes.c_char_p]
)
# void llama_context_weights_moved(llama_context *)
_context_weights_moved = _ggml.bind_optional("llama_context_weights_moved", None, [ctypes.c_void_p])
# uint32_t llama_kv_host_layers(const struct llama_context * ctx);  (patch 0011)
_kv_host_layers = _ggml.bind_optional("llama_kv_host_layers", ctypes.c_uint32, [ctypes.c_void_p])


def kv_host_layers_supported() -> bool:
    """Whether this llama.cpp build keeps the first layers' KV cache on the host whatever their device (patch 0011),
    so that the weight cache mode realizes placements that keep layers off the GPU too."""
    return _kv_host_layers is not None


_NO_WEIGHT_CACHE = "this llama.cpp build cannot cache weights (patches/llama.cpp 0006)"


def weight_cache_supported() -> bool:
    """Whether this llama.cpp build can copy a loaded model's host weights to a device and back (patch 0006)."""
    return _cache_weights is not None and _uncache_weights is not None and _context_weights_moved is not None


def weight_cache_unavailable(device: str) -> str | None:
    """Why weights cannot be cached on ``device`` in this process, or None when they can: the build lacks patch 0006,
    or ``device`` is not one of this process's ggml devices (misspelt, another machine's, or hidden by
    ``CUDA_VISIBLE_DEVICES``). "CPU" is a device too: a second host copy, what tests use on a CPU build."""
    from igi_sdk.engine.devices import device_names

    if not weight_cache_supported():
        return _NO_WEIGHT_CACHE
    names = device_names()
    if device not in names:
        return f"{device!r} is not a device of this process (devices: {', '.join(names)})"
    return None


def abort_on_flag_supported() -> bool:
    """Whether this llama.cpp build can stop a decode when a flag is set (the project's patch 0005)."""
    return _abort_on_flag is not None


def release_weights_supported() -> bool:
    """Whether this llama.cpp build can free a model's weights ahead of the model (the project's patch 0004)."""
    return _release_weights is not None


_NO_HOST_ONLY = (
    "this llama.cpp build cannot make a context on the CPU backend alone (a placement without a GPU context needs "
    "the project's patch 0010)"
)


def _take_devices_for(placement: Placement) -> bool:
    """Take the CUDA devices back (patch 0010) where ``placement`` uses them and a detach gave them away; whether it
    did."""
    if placement.gpu_context and device_release.released():
        device_release.reacquire()
        return True
    return False


def _host_only_logged(lines: Sequence[str]) -> bool:
    """Whether llama.cpp logged that the context it made is on the host only (patch 0010 read LLAMA_CONTEXT_HOST_ONLY)."""
    return any("host only: the CPU backend alone" in line for line in lines)


def _context_refused(ctx: Any, placement: Placement, lines: Sequence[str]) -> str | None:
    """Why the context llama.cpp made for ``placement`` is not the one asked for (None: it is): a build without the
    patches that read ``Placement.gpu_context`` (0010) and ``Placement.kv_host_layers`` (0011) ignores them."""
    if not placement.gpu_context and not _host_only_logged(lines):
        return _NO_HOST_ONLY
    if placement.kv_host_layers and (_kv_host_layers is None or int(_kv_host_layers(ctx)) != placement.kv_host_layers):
        return (
            f"this llama.cpp build cannot keep the KV cache of the first {placement.kv_host_layers} layers on the host "
            "(the project's patch 0011)"
        )
    return None


def _errors_of(lines: Sequence[tuple[str, str]]) -> str:
    errors = [text for level, text in lines if level == "error"]
    return "; ".join(errors[-3:]) or "no error logged"


class LlamaEngine:
    """A loaded model + context. Not thread-safe: drive it from one thread.

    Args:
        model_path: GGUF file (validated with ``read_tensor_table`` before llama.cpp sees it).
        placement: what to load where and how to size the context.
        verbose: echo llama.cpp's log to stderr.
        trace_load: record llama.cpp's load progress calls too (instead of its progress dots), so that
            ``load_stages`` splits the tensor data of a load without mmap between device and host buffers.
        weight_cache_device: keep every weight's host copy for the engine's life and realize a placement that assigns
            every layer to the GPU as a cache base plus cached weights on this device ("CUDA0"; ``engine.cache_base``),
            so that ``move_to`` another such placement moves weights (and creates the context again when its
            parameters differ) instead of loading; None: every placement is loaded as it is (the default).
        weight_cache_host: the cache base's host copy (``cache_base.WeightCacheHost``): ``"pinned"`` (the default)
            or ``"mapped"`` from the model file.

    Raises:
        ModelNotFoundError, ModelCorruptError, ModelUnsupportedError: the file cannot be used.
        PlacementRejectedError: a rule targets a device this machine cannot serve.
        EngineError: llama.cpp could not create the context.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        placement: Placement,
        *,
        verbose: bool = False,
        trace_load: bool = False,
        weight_cache_device: str | None = None,
        weight_cache_host: cache_base_mod.WeightCacheHost = "pinned",
    ) -> None:
        self._model_path = Path(model_path)
        self._weight_cache_device = weight_cache_device
        self._weight_cache_host: cache_base_mod.WeightCacheHost = weight_cache_host
        self._base: Placement | None = None
        self._cached: dict[str, tuple[int, tuple[str, ...]]] = {}  # cache_weights: key -> (bytes, names)
        self._last_move: MoveStages | None = None
        self._verbose = verbose
        self._trace_load = trace_load
        self._freed: tuple[float | None, float | None] = (None, None)
        self._abort_flag: int | None = None
        self._table = read_tensor_table(self._model_path)
        self._stack: ExitStack | None = None
        self._load(placement)

    # ---- lifecycle -------------------------------------------------------------------------------

    def _load(self, placement: Placement) -> None:
        _take_devices_for(placement)  # loaded again after a detach: the devices first
        base = self._cache_base_for(placement)
        self._load_placement(placement if base is None else base)
        self._base = base
        if base is not None:  # the weights the placement puts on the GPU, cached from the host copy
            self._placement = placement
            try:
                self._move_sets(placement)
            except BaseException:
                self.close()
                raise
        if not placement.gpu_context:  # its context computes on the CPU alone: the load's CUDA context goes
            try:
                device_release.release()
            except BaseException:
                self.close()
                raise

    def _cache_base_for(self, placement: Placement) -> Placement | None:
        if self._weight_cache_device is None or not cache_base_mod.realizable(
            self._table, placement, kv_host_layers_supported()
        ):
            return None
        return cache_base_mod.cache_base(cache_base_mod.context_form(self._table, placement), self._weight_cache_host)

    def _context_form(self, placement: Placement) -> Placement:
        """The placement a context is made with: ``placement``'s ``context_form`` on a cache base (the layers it keeps
        off the GPU with their KV cache on the host), ``placement`` itself otherwise."""
        return cache_base_mod.context_form(self._table, placement) if self._base is not None else placement

    def _load_placement(self, placement: Placement) -> None:
        _backend_init()
        mparams = model_params(placement)  # validates rules before llama.cpp sees them
        cparams = context_params(placement)
        stack = ExitStack()
        progress: list[tuple[float, float]] = []
        if self._trace_load:  # kept alive by this frame for the load

            @llama_cpp.llama_progress_callback
            def on_progress(fraction: float, _user_data: ctypes.c_void_p) -> bool:
                progress.append((time.perf_counter(), fraction))
                return True

            mparams.params.progress_callback = on_progress
        t0 = time.perf_counter()
        try:
            with _log.capture_log(echo=self._verbose) as cap:
                model = llama_cpp.llama_model_load_from_file(os.fsencode(self._model_path), mparams.params)
                t_model = time.perf_counter()
                if not model:
                    raise ModelCorruptError(f"llama.cpp could not load {self._model_path}: {_errors_of(cap.lines)}")
                stack.callback(self._free_model, model)
                t_context = time.perf_counter()
                with scheduler_env(placement):
                    ctx = llama_cpp.llama_init_from_model(model, cparams)
                t_end = time.perf_counter()
                if not ctx:
                    raise EngineError(f"llama.cpp could not create a context: {_errors_of(cap.lines)}")
                self._ctx = ctx
                stack.callback(self._free_context)
                refused = _context_refused(ctx, placement, cap.text_lines())
                if refused is not None:
                    raise EngineError(refused)
        except BaseException:
            stack.close()
            raise
        self._load_time_s = time.perf_counter() - t0
        self._timeline = LoadTimeline(
            t_start=t0,
            t_model=t_model,
            t_context=t_context,
            t_end=t_end,
            lines=cap.text_lines(),
            times=tuple(cap.times),
            progress=tuple(progress),
            mmap=mparams.params.load_mode != LOAD_MODE_NONE,
            free_context_s=self._freed[0],
            free_model_s=self._freed[1],
        )
        self._freed = (None, None)
        self._weights_released = False
        self._cached = {}  # the cached copies went with the model
        self.__dict__.pop("load_stages", None)
        self._stack = stack
        self._model, self._ctx = model, ctx
        self._set_abort_callback()
        self._n_ctx = int(llama_cpp.llama_n_ctx(ctx))
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self._placement = placement
        report = parse_load_log(cap.text_lines())
        self._load_report = report.model_copy(update={"weight_prefetch_abi": prefetch_abi()})
        self._n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        # the batch llama.cpp accepts, not the one asked for: it clamps n_batch to the requested n_ctx while it pads
        # n_ctx up (n_ctx 16 -> 256 with n_batch 16), and a larger chunk is a GGML_ASSERT that aborts the process
        self._seqs = BatchDecoder(
            ctx,
            int(llama_cpp.llama_n_batch(ctx)),
            self._n_vocab,
            int(llama_cpp.llama_n_ctx_seq(ctx)),
            placement.n_seq_max,
        )
        stack.callback(lambda: self._seqs.free())  # the current decoder (a restored context has a new one)
        self.__dict__.pop("eos_token_ids", None)

    def release_context(self) -> None:
        """Free the llama_context (KV cache, compute buffers) and keep the model's weights; every sequence's
        KV is lost (save what you need first). ``restore_context`` creates it again with the same placement.
        The VRAM this frees is where a vision encoder may run in between (``igi_sdk.planner.vision``)."""
        if self._stack is None or self._ctx is None:
            return
        self._seqs.free()
        llama_cpp.llama_free(self._ctx)
        self._ctx = None

    def restore_context(self) -> None:
        """Create the context again after ``release_context`` (same placement: saved states restore).

        Raises:
            EngineError: the engine is closed, or llama.cpp could not create the context (the engine is then
                closed).
        """
        if self._stack is None:
            raise EngineError("engine is closed")
        if self._ctx is not None:
            return
        self._create_context(self._placement)

    def _replace_context(
        self,
        placement: Placement,
        on_context_freed: Callable[[], None] | None = None,
        stages: dict[str, float | None] | None = None,
    ) -> None:
        """Free the context and make ``placement``'s, on the loaded model; ``on_context_freed`` in between. A placement
        without a GPU context (``cache_base.detached``) has the process's CUDA devices released once the old context
        is freed (nothing of ggml's is left on them then), before ``on_context_freed``, so that the call means the
        device memory is gone; any other takes them again, where they were released, after it. ``stages`` gets each
        step's seconds (``load_timing.MoveStages``' fields)."""
        times: dict[str, float | None] = {} if stages is None else stages
        t = time.perf_counter()
        self.release_context()
        times["context_free_s"] = time.perf_counter() - t
        if not placement.gpu_context:
            t = time.perf_counter()
            with _log.capture_log(echo=self._verbose) as cap:
                device_release.release()
            times["release_s"] = time.perf_counter() - t
            split = release_split(cap.text_lines())
            if split is not None:
                times["unregister_s"], times["reset_s"] = split
        if on_context_freed is not None:
            t = time.perf_counter()
            on_context_freed()
            times["on_context_freed_s"] = time.perf_counter() - t
        t = time.perf_counter()
        if _take_devices_for(placement):
            times["reacquire_s"] = time.perf_counter() - t
        t = time.perf_counter()
        self._create_context(placement, close_on_failure=False)
        times["context_s"] = time.perf_counter() - t

    def _create_context(self, placement: Placement, close_on_failure: bool = True) -> None:
        """A new context for ``placement`` on the loaded model (the engine is closed if llama.cpp cannot make it,
        unless not ``close_on_failure``: it then has no context)."""
        form = self._context_form(placement)
        with _log.capture_log(echo=self._verbose) as cap, scheduler_env(form):
            ctx = llama_cpp.llama_init_from_model(self._model, context_params(form))
        if not ctx:
            if close_on_failure:
                self.close()
            raise EngineError(f"llama.cpp could not create the context again: {_errors_of(cap.lines)}")
        refused = _context_refused(ctx, form, cap.text_lines())
        if refused is not None:
            llama_cpp.llama_free(ctx)
            if close_on_failure:
                self.close()
            raise EngineError(refused)
        self._ctx = ctx
        self._n_ctx = int(llama_cpp.llama_n_ctx(ctx))
        self._set_abort_callback()
        self._seqs = BatchDecoder(
            ctx,
            int(llama_cpp.llama_n_batch(ctx)),
            self._n_vocab,
            int(llama_cpp.llama_n_ctx_seq(ctx)),
            placement.n_seq_max,
        )

    def release_model(self) -> None:
        """Free the context and the model (all of the LLM's VRAM); ``restore_model`` loads it again with the same
        placement (the page cache makes that a re-upload, not a disk read). Save the sequences first."""
        if self._stack is not None:
            self._close_handles()
            self._freed = (None, None)  # the next load is no reload: its stages hold no frees
            self._model_released = True

    def restore_model(self) -> None:
        """Load again after ``release_model`` (or create the context again after ``release_context``).

        Raises:
            ModelCorruptError, EngineError: as the first load (the engine is then closed).
        """
        if getattr(self, "_model_released", False):
            self._model_released = False
            self._load(self._placement)
        else:
            self.restore_context()

    @property
    def context_released(self) -> bool:
        return (self._stack is not None and self._ctx is None) or getattr(self, "_model_released", False)

    def reload(self, placement: Placement, on_freed: Callable[[], None] | None = None) -> None:
        """Free the context and model, then load again with ``placement``. KV contents are lost: save the
        sequences you need first (``save_seq_state``) and restore them after. ``load_stages`` then holds the
        time of both frees too. ``on_freed`` is called between the frees and the load (all of the old placement's
        memory is released then)."""
        self._freed = (None, None)
        self._last_move = None
        self._close_handles()
        if on_freed is not None:
            on_freed()
        self._load(placement)

    def abort_on_flag(self, address: int | None) -> bool:
        """Stop a decode in flight while the C ``int`` at ``address`` is non-zero (another thread or process may set
        it: the worker's is shared with the daemon): ``decode`` then raises ``DecodeAborted`` at the next check
        (between two graph nodes on the CPU, between two scheduler splits), after llama.cpp has removed the aborted
        ubatch's positions. Kept across ``reload``. None: never.

        Returns:
            Whether the build can (the project's patch 0005); without it nothing is set and decodes run to their end.
        """
        self._abort_flag = address
        if self._ctx is not None:
            self._set_abort_callback()
        return _abort_on_flag is not None

    def _set_abort_callback(self) -> None:
        if _abort_on_flag is None or self._ctx is None:
            return
        if self._abort_flag is None:
            llama_cpp.llama_set_abort_callback(self._ctx, llama_cpp.ggml_abort_callback(0), None)
        else:
            llama_cpp.llama_set_abort_callback(self._ctx, _abort_on_flag, ctypes.c_void_p(self._abort_flag))

    def moves_in_place(self, placement: Placement) -> bool:
        """Whether ``move_to(placement)`` can realize ``placement`` on the loaded model (``weight_cache_device``
        given, the model loaded as a cache base, ``placement`` realizable on it, the sequences' states restoring in its
        context: ``planner.tiers.STATE_KEYS`` unchanged). Every cache base is the same model (``cache_base.cache_base``
        sets its layers, rules and load mode), so a realizable placement needs no other load."""
        if self._base is None or self._stack is None or self._ctx is None:
            return False
        return cache_base_mod.realizable(self._table, placement, kv_host_layers_supported()) and all(
            getattr(placement, k) == getattr(self._placement, k) for k in STATE_KEYS
        )

    def context_changes(self, placement: Placement) -> bool:
        """Whether ``move_to(placement)`` creates the context again (``engine.cache_base.context_changes``: its KV cache
        on another device, prompt streaming on or off, other batch sizes or threads), every sequence's KV cells
        lost with the old one."""
        return self.moves_in_place(placement) and cache_base_mod.context_changes(
            self._context_form(self._placement), self._context_form(placement)
        )

    def move_to(
        self,
        placement: Placement,
        on_freed: Callable[[int], None] | None = None,
        on_context_freed: Callable[[], None] | None = None,
    ) -> None:
        """Realize ``placement`` by moving weights: the sets it no longer puts on the GPU are uncached first (their
        device memory freed: ``on_freed(bytes)``), then, where ``context_changes(placement)``, the context is freed and
        made again with ``placement``'s parameters, then the new sets are cached from the host copy and the scheduler
        is made again once. The model stays; so does every sequence's KV cells unless the context was made again
        (save them in ``on_freed``, where the old context still holds them, and restore them after: the scheduler's
        ``reload`` does). ``on_context_freed`` is called once the old context is freed, before the new one is made
        (where none is made, not at all).

        A growth (a move that uncaches no set) whose device buffers or context cannot be made is undone: the sets it
        cached are uncached, the old placement's context is made again where it was replaced (the sequences' KV cells
        are then lost with it, as around any new context: restore what ``on_freed`` saved), and ``MoveUndone`` is
        raised with the engine open on the placement it had.

        Raises:
            MoveUndone: a growth could not be made and was undone (the engine computes as before).
            EngineError: not ``moves_in_place(placement)``, or a move that uncached sets, or the undoing of a growth,
                failed (the engine is then closed).
        """
        if not self.moves_in_place(placement):
            raise EngineError("this placement cannot be reached by moving weights (reload instead)")
        old = self._placement
        new_context = self.context_changes(placement)
        wanted = cache_base_mod.weight_sets(self._table, placement)
        growth = all(wanted.get(key) == names for key, (_, names) in self._cached.items())
        stages: dict[str, float | None] = {}
        self._last_move = None
        try:
            self._move_sets(
                placement, on_freed, new_context=new_context, on_context_freed=on_context_freed, stages=stages
            )
        except EngineError as exc:
            if not growth or self._stack is None:
                self.close()
                raise
            self._undo_growth(old, new_context, exc)
        except BaseException:
            self.close()
            raise
        self._placement = placement
        self._last_move = MoveStages.model_validate(stages)

    @property
    def last_move(self) -> MoveStages | None:
        """The stages of the last ``move_to``, where it succeeded (None after a load or a failed or undone move)."""
        return self._last_move

    def _undo_growth(self, old: Placement, context_made: bool, cause: EngineError) -> None:
        """Back to ``old`` after a growth failed in ``_move_sets``: its new sets uncached, ``old``'s context made again
        where the growth replaced it; raises ``MoveUndone`` (the engine is closed, and the error raised, if even that
        fails)."""
        try:
            kept = cache_base_mod.weight_sets(self._table, old)
            for key, (_, names) in list(self._cached.items()):
                if kept.get(key) != names:
                    self._uncache(key)
            if context_made:
                self._replace_context(old)
            self._weights_moved(old)
        except BaseException:
            self.close()
            raise
        raise MoveUndone(f"the growth was undone: {cause}") from cause

    def _move_sets(
        self,
        placement: Placement,
        on_freed: Callable[[int], None] | None = None,
        *,
        new_context: bool = False,
        on_context_freed: Callable[[], None] | None = None,
        stages: dict[str, float | None] | None = None,
    ) -> None:
        """Uncache the sets ``placement`` does not have (``on_freed`` with their bytes), make the context again
        (``new_context``; ``on_context_freed`` in between), cache the sets it has, reserve the graphs once; each step's
        seconds into ``stages``."""
        assert self._weight_cache_device is not None
        times: dict[str, float | None] = {} if stages is None else stages
        wanted = cache_base_mod.weight_sets(self._table, placement)
        t = time.perf_counter()
        freed = sum(self._uncache(key) for key, (_, names) in list(self._cached.items()) if wanted.get(key) != names)
        times["uncache_s"] = time.perf_counter() - t
        t = time.perf_counter()
        if on_freed is not None:
            on_freed(freed)
        times["on_freed_s"] = time.perf_counter() - t
        if new_context:
            self._replace_context(placement, on_context_freed, times)
        t = time.perf_counter()
        for key, names in wanted.items():
            if key not in self._cached:
                self._cache(key, names, self._weight_cache_device)
        times["cache_s"] = time.perf_counter() - t
        t = time.perf_counter()
        self._weights_moved(placement)
        times["reserve_s"] = time.perf_counter() - t

    def cache_weights(self, key: str, names: Sequence[str], device: str) -> int:
        """Copy the weights ``names`` (in host buffers) into one new buffer of ``device`` ("CUDA0"; "CPU" makes a
        second host copy) and compute with that copy from the next decode on; the host copy stays. ``key`` names the
        set: caching a key again first drops its old copy. ``uncache_weights(key)`` goes back to the host copy. The
        model and its context are not created again: only the scheduler's splits and compute buffers are (in this
        call), which is what lets a budget change keep the weights in host memory for the worker's life
        (docs/engine.md, "Weights as a cache of the host copy").

        Returns:
            The device buffer's bytes (0 for no names).

        Raises:
            EngineError: the build lacks patch 0006, a name is unknown, not in a host buffer (a CPU repack buffer, or
                already on a device), named twice or in another key's set (nothing changed), or the device buffer
                could not be allocated.
        """
        self._require_weights()
        size = self._cache(key, names, device)
        self._weights_moved(self._placement)
        return size

    def uncache_weights(self, key: str) -> int:
        """Compute with the host copy of ``key``'s weights again and free their device copy (``cache_weights``).

        Returns:
            The bytes freed (0 when ``key`` holds nothing).
        """
        if key not in self._cached or self._stack is None:
            return 0
        freed = self._uncache(key)
        self._weights_moved(self._placement)
        return freed

    def _cache(self, key: str, names: Sequence[str], device: str) -> int:
        from igi_sdk.engine.devices import device_handle

        if not weight_cache_supported():
            raise EngineError(_NO_WEIGHT_CACHE)
        assert _cache_weights is not None
        if key in self._cached:  # its old copy goes first, whether the new one can be made or not
            self._uncache(key)
        encoded = [name.encode() for name in names]
        array = (ctypes.c_char_p * max(1, len(encoded)))(*encoded)
        size = int(_cache_weights(self._model, key.encode(), array, len(encoded), device_handle(device)))
        if size == -1:
            raise EngineError(
                f"weights of {key!r} cannot be cached: unknown, not in a host buffer, named twice or cached already"
            )
        if size < 0:
            raise EngineError(f"could not allocate {device} memory for the weights of {key!r}")
        self._cached[key] = (size, tuple(names))
        return size

    def _uncache(self, key: str) -> int:
        assert _uncache_weights is not None
        freed = int(_uncache_weights(self._model, key.encode()))
        del self._cached[key]
        return freed

    def _weights_moved(self, placement: Placement) -> None:
        """The context's scheduler made again now (what it reads from the environment is the placement's)."""
        if _context_weights_moved is not None and self._ctx is not None:
            with scheduler_env(placement):
                _context_weights_moved(self._ctx)

    @property
    def cached_weights(self) -> Mapping[str, int]:
        """The sets of weights computed from a device copy (``cache_weights``): key -> bytes."""
        return {key: size for key, (size, _names) in self._cached.items()}

    def release_weights(self, *, device_only: bool = True) -> int:
        """Free the model's weight buffers now, ahead of a ``reload`` or ``close``: device memory goes before the
        sessions' states are saved. Afterwards only ``save_seq_state``, ``reload`` and ``close`` work; decoding
        raises ``EngineError``. ``device_only``: only the buffers not in host memory (pinned host weights and the
        file's mapping stay until the model is freed).

        Returns:
            The bytes freed; 0 on a llama.cpp build without the project's patch 0004 (nothing is freed early).
        """
        if self._stack is None or _release_weights is None:
            return 0
        if self._ctx is not None:  # no kernel of the last step may still read a weight
            llama_cpp.llama_synchronize(self._ctx)
        freed = int(_release_weights(self._model, device_only))  # the cached device copies too
        self._weights_released = True
        self._cached.clear()
        return freed

    def _free_context(self) -> None:
        t0 = time.perf_counter()
        if getattr(self, "_ctx", None) is not None:
            llama_cpp.llama_free(self._ctx)
        self._ctx = None
        self._freed = (time.perf_counter() - t0, self._freed[1])

    def _free_model(self, model: Any) -> None:
        t0 = time.perf_counter()
        llama_cpp.llama_model_free(model)
        self._freed = (self._freed[0], time.perf_counter() - t0)

    def _close_handles(self) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            stack.close()

    def close(self) -> None:
        """Free everything (idempotent)."""
        self._model_released = False
        self._close_handles()

    @property
    def closed(self) -> bool:
        return self._stack is None

    def __enter__(self) -> LlamaEngine:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def _require_open(self) -> None:
        if self._stack is None:
            raise EngineError("engine is closed")
        if self._ctx is None:
            raise EngineError("the engine's context is released (restore_context first)")

    def _require_weights(self) -> None:
        self._require_open()
        if self._weights_released:
            raise EngineError("the model's weights are released (reload first)")

    # ---- properties ------------------------------------------------------------------------------

    @property
    def model_path(self) -> Path:
        return self._model_path

    @property
    def placement(self) -> Placement:
        return self._placement

    @property
    def model_table(self) -> ModelTable:
        return self._table

    @property
    def vocab(self) -> object:
        """The model's ``llama_vocab`` pointer (for llama.cpp samplers that need it, e.g. the grammar)."""
        self._require_open()
        return self._vocab

    def grammar(self, gbnf: str) -> GrammarConstraint:
        """A fresh grammar state for one reply, over this model's vocabulary.

        Raises:
            GrammarInitError: llama.cpp could not parse the grammar.
        """
        return GrammarConstraint(self.vocab, self._n_vocab, gbnf)

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    @property
    def n_ctx(self) -> int:
        """Context size of the whole llama_context (all sequences)."""
        return self._n_ctx

    @property
    def n_ctx_seq(self) -> int:
        """Context available to one sequence (n_ctx / n_seq_max with per-sequence KV streams)."""
        return self._seqs.n_ctx_seq

    @property
    def load_report(self) -> LoadReport:
        return self._load_report

    @property
    def load_time_s(self) -> float:
        return self._load_time_s

    @cached_property
    def load_stages(self) -> LoadStages:
        """Where the last load (or ``reload``, its frees included) spent its wall time (``engine.load_timing``)."""
        return load_stages(self._timeline, self._load_report.weights_mib)

    @cached_property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every end-of-generation token of the vocabulary (EOS, EOT, <|im_end|>, ...)."""
        return tuple(t for t in range(self._n_vocab) if llama_cpp.llama_vocab_is_eog(self._vocab, t))

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    # ---- text ------------------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """Token ids of ``text``. ``add_special`` adds BOS/EOS as the model asks; ``parse_special`` turns
        control-token text such as ``<|im_start|>`` into the control token."""
        self._require_open()
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            raise EngineError(f"llama_tokenize failed ({n})")
        return list(buf[:n])

    def token_piece(self, token: int, *, special: bool = False) -> bytes:
        """The bytes of one token (may be part of a UTF-8 character); control tokens are empty unless
        ``special``."""
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, -n, 0, special)
        return buf.raw[: max(n, 0)]

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        """Text of a token list (invalid UTF-8 replaced)."""
        return b"".join(self.token_piece(t, special=special) for t in tokens).decode("utf-8", "replace")

    @cached_property
    def chat_template(self) -> str | None:
        raw = llama_cpp.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8", "replace") if raw else None

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        add_generation_prompt: bool = True,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """Render a conversation with the GGUF's own ``tokenizer.chat_template`` (``variables``: more template
        variables, ``tools`` say).

        Raises:
            ModelUnsupportedError: the model has no chat template.
            ValueError: the template rejected the messages.
        """
        bos = llama_cpp.llama_vocab_bos(self._vocab)
        eos = llama_cpp.llama_vocab_eos(self._vocab)
        piece = lambda t: self.token_piece(t, special=True).decode("utf-8", "replace") if t >= 0 else ""
        return render_chat_template(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=piece(bos),
            eos_token=piece(eos),
            variables=variables,
        )

    @cached_property
    def _control_tokens(self) -> tuple[re.Pattern[str] | None, dict[str, int]]:
        """The text of every control token of the vocabulary (what ``parse_special`` turns into a token), as one
        pattern (longest first) and a text -> id map."""
        control = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
        texts: dict[str, int] = {}
        for token in range(self._n_vocab):
            if llama_cpp.llama_vocab_get_attr(self._vocab, token) & control:
                text = self.token_piece(token, special=True).decode("utf-8", "replace")
                if text:
                    texts.setdefault(text, token)
        if not texts:
            return None, texts
        return re.compile("|".join(re.escape(t) for t in sorted(texts, key=len, reverse=True))), texts

    def tokenize_chat(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        add_generation_prompt: bool = True,
        splices: Mapping[str, Sequence[int]] | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Chat-template ``messages`` and tokenize the prompt, with BOS as the model asks (once: not again after a
        template that writes it). Only the template's own
        text is parsed for control tokens: the messages' contents are tokenized as text, so ``<|im_start|>`` in a
        player's line stays those characters and cannot open a turn of its own.

        ``splices`` maps marker strings to token lists: a marker inside a message's content is replaced by its
        tokens (an image's positions, ``igi_sdk.engine.vision.render_with_images``); the text around it is
        tokenized as content. ``variables`` are more template variables (``tools``: the template's own tool
        rendering).

        Raises:
            ModelUnsupportedError: the model has no chat template.
            ValueError: the template rejected the messages.
        """
        bos = llama_cpp.llama_vocab_bos(self._vocab)
        eos = llama_cpp.llama_vocab_eos(self._vocab)
        piece = lambda t: self.token_piece(t, special=True).decode("utf-8", "replace") if t >= 0 else ""
        segments = render_chat_segments(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=piece(bos),
            eos_token=piece(eos),
            variables=variables,
        )
        pattern, ids = self._control_tokens
        marks = re.compile("|".join(re.escape(m) for m in splices)) if splices else None
        # llama.cpp's own partition: the text is cut at each control token; each piece between is tokenized alone
        pieces: list[str | int | list[int]] = []
        text = ""
        for segment, is_content in segments:
            if is_content and marks is not None and splices:
                cursor = 0
                for match in marks.finditer(segment):
                    text += segment[cursor : match.start()]
                    pieces += [text, list(splices[match.group()])] if text else [list(splices[match.group()])]
                    text, cursor = "", match.end()
                text += segment[cursor:]
                continue
            if is_content or pattern is None:
                text += segment
                continue
            cursor = 0
            for match in pattern.finditer(segment):
                text += segment[cursor : match.start()]
                pieces += [text, ids[match.group()]] if text else [ids[match.group()]]
                text, cursor = "", match.end()
            text += segment[cursor:]
        if text:
            pieces.append(text)
        # BOS as the model asks, once: a template that writes bos_token itself (Llama 3's) has it already
        starts_with_bos = bool(pieces) and pieces[0] == bos
        tokens = [bos] if bos >= 0 and llama_cpp.llama_vocab_get_add_bos(self._vocab) and not starts_with_bos else []
        for item in pieces:
            if isinstance(item, int):
                tokens.append(item)
            elif isinstance(item, list):
                tokens += item
            else:
                tokens += self.tokenize(item, add_special=False, parse_special=False)
        if eos >= 0 and llama_cpp.llama_vocab_get_add_eos(self._vocab):
            tokens.append(eos)
        return tokens

    # ---- low-level sequence API ------------------------------------------------------------------

    def decode(self, batch: Sequence[BatchEntry]) -> dict[int, np.ndarray]:
        """Evaluate new tokens of one or more sequences in one llama_batch (split into n_batch chunks).

        Args:
            batch: ``(seq_id, tokens, start_pos, want_logits_for_last)`` per sequence; ``tokens`` go to
                positions ``start_pos, start_pos + 1, ...`` of that sequence. A seq_id appears at most once.

        Returns:
            ``{seq_id: logits}`` (float32 array of n_vocab, a copy) for entries that asked for logits.

        Raises:
            ContextFullError: a sequence would pass its context share.
            DecodeError: llama_decode returned non-zero (``.code``); earlier chunks stay in the KV cache.
        """
        self._require_weights()
        return self._seqs.decode(batch)

    def decode_embeddings(
        self, seq_id: int, embd: np.ndarray, start_pos: int, *, token: int, want_logits: bool = False
    ) -> np.ndarray | None:
        """Evaluate image embeddings (float32 (n, n_embd), from ``VisionEncoder.encode``) at positions
        ``start_pos..`` of ``seq_id``; ``token`` is the pseudo token the bookkeeping records for them.

        Returns:
            The logits after the last embedding if ``want_logits``.

        Raises:
            ContextFullError, DecodeError: as ``decode``.
        """
        self._require_weights()
        if embd.ndim != 2 or embd.shape[1] != self._table.n_embd:
            raise ValueError(
                f"embeddings of width {embd.shape[-1]} do not match the model's n_embd {self._table.n_embd}"
            )
        return self._seqs.decode_embd(seq_id, embd, start_pos, token, want_logits)

    def seq_tokens(self, seq_id: int) -> list[int]:
        """Tokens the engine knows sequence ``seq_id`` holds at positions 0.. (-1 = unknown)."""
        return list(self._seqs.tokens.get(seq_id, []))

    def seq_pos_max(self, seq_id: int) -> int:
        """Largest position of ``seq_id`` in the KV cache (-1 if empty)."""
        self._require_open()
        return self._seqs.seq_pos_max(seq_id)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Remove positions [p0, p1) of a sequence (-1 = open end); False if the memory cannot do it."""
        self._require_open()
        return self._seqs.seq_rm(seq_id, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Copy positions [p0, p1) of ``src`` into ``dst`` (shares KV cells, no recompute)."""
        self._require_open()
        self._seqs.seq_cp(src, dst, p0, p1)

    def seq_clear(self, seq_id: int) -> None:
        """Drop everything a sequence holds."""
        self._require_open()
        self._seqs.seq_clear(seq_id)

    # ---- state -----------------------------------------------------------------------------------

    def save_seq_state(self, seq_id: int, prefault: bool = True) -> bytes:
        """Serialize one sequence (its KV cells and the tokens they hold) for ``restore_seq_state``, into memory
        faulted in beforehand (``engine.prefault``; ``prefault`` False: as the copy writes it, for the benchmark's A/B).

        Raises:
            EngineError: llama.cpp refused (returned 0).
        """
        self._require_open()
        header = json.dumps(
            {
                "placement": {k: getattr(self._placement, k) for k in _STATE_KEYS},
                "n_vocab": self._n_vocab,
                "n_layer": self._table.n_layer,
                "tokens": self.seq_tokens(seq_id),
            }
        ).encode()
        prefix = _STATE_MAGIC + struct.pack("<II", _STATE_VERSION, len(header)) + header
        return self._seqs.state_get(seq_id, prefix, prefault)  # written in place after the header: no copy of the KV

    def restore_seq_state(self, seq_id: int, data: bytes) -> int:
        """Load a ``save_seq_state`` blob into ``seq_id`` (replacing what it held).

        Returns:
            The number of positions the sequence now holds.

        Raises:
            EngineError: not a state blob, saved under an incompatible placement (flash_attn, type_k,
                type_v, n_seq_max differ) or another model, or llama.cpp refused it.
        """
        self._require_open()
        if data[:4] != _STATE_MAGIC or len(data) < 12:
            raise EngineError("not a sequence state saved by LlamaEngine.save_seq_state")
        version, header_len = struct.unpack("<II", data[4:12])
        if version != _STATE_VERSION:
            raise EngineError(f"sequence state version {version} is not supported (expected {_STATE_VERSION})")
        header_limit = _STATE_HEADER_FIXED_BYTES + _STATE_HEADER_BYTES_PER_TOKEN * self._placement.n_ctx
        if header_len > header_limit:  # refused before parsing: a huge header would hold the worker for seconds
            raise EngineError(
                f"sequence state header of {header_len} bytes is more than a state of this context holds ({header_limit})"
            )
        try:  # a state is input too (a session file's): any damage to its header is a refusal, never a crash
            header = json.loads(data[12 : 12 + header_len])
            placement, tokens = header["placement"], header["tokens"]
            if not isinstance(placement, dict) or set(placement) - set(_STATE_KEYS):
                raise ValueError(f"placement keys {sorted(placement)!r}")
            if not isinstance(tokens, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and -1 - PSEUDO_TOKEN_SPAN <= t < self._n_vocab
                for t in tokens
            ):
                raise ValueError("tokens are not token ids of this vocabulary")
            saved = Placement.model_validate({**self._placement.model_dump(), **placement})
            same_model = header["n_vocab"] == self._n_vocab and header["n_layer"] == self._table.n_layer
        except (ValueError, KeyError, TypeError, RecursionError) as exc:  # JSON, UTF-8, pydantic: ValueErrors
            raise EngineError(f"sequence state header is malformed: {type(exc).__name__}: {exc}") from None
        if not saved.state_compatible_with(self._placement):
            now = {k: getattr(self._placement, k) for k in _STATE_KEYS}
            raise EngineError(
                f"sequence state was saved with {placement} and cannot be restored under {now}: "
                "flash_attn, type_k, type_v and n_seq_max must match"
            )
        if not same_model:
            raise EngineError("sequence state was saved with another model")
        self._seqs.state_set(seq_id, data, 12 + header_len, tokens)  # read in place, not sliced off (a copy)
        n_positions = self.seq_pos_max(seq_id) + 1
        if n_positions != len(tokens):  # the KV cells and the tokens they are said to hold disagree
            self.seq_clear(seq_id)
            raise EngineError(f"sequence state holds {n_positions} positions for {len(tokens)} tokens")
        return n_positions
