"""Weights as a cache of their host copy (patch 0006, ``LlamaEngine.cache_weights``) on the real SmolLM2, CPU.

A budget change should move weights between the host copy and the GPU without loading the model again. On a CPU
build the only device is the CPU, so the copy here is a second host buffer: what is checked is the mechanism every
device shares (the weights copied whole and computed from, the host copy kept and used again, the scheduler made
again, the errors), with the replies token for token those of the model as loaded.
"""

from __future__ import annotations

import pytest

from igi_sdk.engine import BatchRequest, BatchScheduler, LlamaEngine, Sampler
from igi_sdk.engine import cache_base as cache_base_mod
from igi_sdk.engine.batch_types import RequestHandle
from igi_sdk.engine.llama_engine import weight_cache_supported, weight_cache_unavailable
from igi_sdk.errors import EngineError, MoveUndone
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.placement import OverrideRule, Placement
from igi_sdk.planner.tensors import TensorGroup

BASE = Placement(n_ctx=1024, n_batch=64, n_ubatch=32, n_seq_max=1, n_threads=2)


QUESTION = "Describe the harbour at dawn."


def _reply(eng: LlamaEngine, max_tokens: int = 16) -> list[int]:
    sched, handle = _greedy(eng, max_tokens)
    sched.run_until_idle()
    eng.seq_clear(0)
    return list(handle.tokens)


def _greedy(eng: LlamaEngine, max_tokens: int, tokens_first: int = 0) -> tuple[BatchScheduler, RequestHandle]:
    """A scheduler with a greedy reply to ``QUESTION`` submitted, stepped until it has ``tokens_first`` tokens."""
    prompt = eng.tokenize(eng.apply_chat_template([{"role": "user", "content": QUESTION}]))
    sched = BatchScheduler(eng)
    handle = sched.submit(BatchRequest("s", prompt, max_tokens=max_tokens, sampler=Sampler(temperature=0)))
    while len(handle.tokens) < tokens_first:
        sched.step()
    return sched, handle


def _groups(eng: LlamaEngine) -> dict[str, list[str]]:
    """Every layer's FFN weights, one set per layer."""
    out: dict[str, list[str]] = {}
    for t in eng.model_table.tensors:
        if t.layer is not None and t.group == TensorGroup.FFN:
            out.setdefault(f"blk.{t.layer}.ffn", []).append(t.name)
    return out


def test_the_patched_build_can_cache_weights() -> None:
    assert weight_cache_supported()  # ./dev.sh builds llama.cpp with patches/llama.cpp


def test_a_device_is_usable_for_the_cache_only_when_this_process_has_it() -> None:
    assert weight_cache_unavailable("CPU") is None
    reason = weight_cache_unavailable("CUDA7")
    assert reason is not None and "'CUDA7'" in reason and "CPU" in reason


def test_cached_weights_compute_alike_and_the_host_copy_comes_back() -> None:
    with LlamaEngine(default_model_path(), BASE) as eng:
        reference = _reply(eng)
        groups = _groups(eng)
        sizes = {t.name: t.n_bytes for t in eng.model_table.tensors}
        assert len(groups) == eng.model_table.n_layer
        for key, names in groups.items():
            size = eng.cache_weights(key, names, "CPU")
            assert sum(sizes[n] for n in names) <= size <= sum(sizes[n] for n in names) + 64 * len(names)
        assert _reply(eng) == reference  # computed from the copies
        some = sorted(groups)[: len(groups) // 2]
        held = sum(eng.cached_weights[key] for key in some)
        assert sum(eng.uncache_weights(key) for key in some) == held > 0
        assert set(eng.cached_weights) == set(groups) - set(some)
        assert _reply(eng) == reference  # half from the host copy again, half from the copies
        assert eng.uncache_weights("blk.0.nothing") == 0
        again = eng.cache_weights(some[0], groups[some[0]], "CPU")  # a key cached anew
        assert again > 0 and eng.cache_weights(some[0], groups[some[0]], "CPU") == again  # replaces its own copy
        with pytest.raises(EngineError, match="cannot be cached"):
            eng.cache_weights("other", groups[some[0]][:1], "CPU")  # already in another key's set
        with pytest.raises(EngineError, match="cannot be cached"):
            eng.cache_weights("other", ["no.such.tensor"], "CPU")
        free_name = groups[some[1]][0]  # uncached above: on the host again
        with pytest.raises(EngineError, match="cannot be cached"):
            eng.cache_weights("other", [free_name, free_name], "CPU")
        with pytest.raises(EngineError, match="no ggml device"):
            eng.cache_weights("other", groups[some[0]][:1], "NOPE0")
        assert "other" not in eng.cached_weights
        assert _reply(eng) == reference
        n_cached = sum(eng.cached_weights.values())
        freed_all = eng.release_weights(device_only=False)  # the copies go with the model's weights
        assert freed_all > n_cached and eng.cached_weights == {}


FFN_ON_HOST = OverrideRule(pattern=r"^blk\.\d+\.ffn_(up|down|gate)\.weight$", device="CPU")


def test_a_cache_base_moves_between_placements_without_loading_or_saving() -> None:
    """The engine's cache mode: a placement whose KV cache is all on the "GPU" (here the CPU device) is a cache base
    plus cached sets; a reload to another such placement moves sets, the sessions' KV cells staying in place; the
    CPU-only one (nothing on the GPU: a worker with CUDA hidden) loads as before."""
    attn_first = BASE.with_(n_gpu_layers=-1, rules=[FFN_ON_HOST])
    full = BASE.with_(n_gpu_layers=-1)
    on_host = BASE.cpu_only()
    with LlamaEngine(default_model_path(), attn_first, weight_cache_device="CPU") as unmoved:
        reference = _reply(unmoved, 24)
    with LlamaEngine(default_model_path(), on_host) as plain:
        reference_on_host = _reply(plain, 24)
    with LlamaEngine(default_model_path(), attn_first, weight_cache_device="CPU") as eng:
        assert eng.placement == attn_first and eng.cached_weights
        assert not any(key.endswith(".ffn") for key in eng.cached_weights)  # the FFN stays on the host
        sched, handle = _greedy(eng, 24, 8)
        assert eng.moves_in_place(full) and not eng.moves_in_place(on_host)
        seen: list[str] = []
        save = eng.save_seq_state
        eng.save_seq_state = lambda seq_id: seen.append("save") or save(seq_id)  # type: ignore[method-assign,func-returns-value]
        sched.reload(full, lambda stage, freed: seen.append(stage))
        assert seen == ["weights", "all"]  # nothing saved: the KV cells stayed
        assert eng.placement == full and any(key.endswith(".ffn") for key in eng.cached_weights)
        move = eng.last_move  # its stages: no context made, the FFN's sets cached
        assert move is not None and move.context_free_s is None and move.context_s is None and move.cache_s > 0
        sched.reload(attn_first, lambda stage, freed: seen.append(f"{stage}:{freed > 0}"))
        assert seen[2:] == ["weights:True", "all:False"]  # the FFN copies freed first
        sched.run_until_idle()
        assert list(handle.tokens) == reference
        del eng.save_seq_state
        sched.reload(on_host)  # nothing on the GPU: loaded as it is
        assert eng.cached_weights == {} and eng.placement == on_host and eng.last_move is None
        assert _reply(eng, 24) == reference_on_host


def test_a_move_that_changes_the_kv_cache_device_carries_the_states_through_a_new_context() -> None:
    """Parked on the host (every weight and the KV cache on the host, the process keeping its device) and back: the
    model stays, the context is made again, each session's KV cells go through host memory, and the reply goes on
    token for token."""
    full = BASE.with_(n_gpu_layers=-1)
    parked = cache_base_mod.parked(full)
    assert parked.offload_kqv is False and parked.op_offload is False and cache_base_mod.is_parked(parked)
    with LlamaEngine(default_model_path(), full, weight_cache_device="CPU") as unmoved:
        reference = _reply(unmoved, 24)
    with LlamaEngine(default_model_path(), full, weight_cache_device="CPU") as eng:
        sched, handle = _greedy(eng, 24, 6)
        assert eng.moves_in_place(parked) and eng.context_changes(parked) and not eng.context_changes(full)
        model = eng._model
        seen: list[str] = []
        save = eng.save_seq_state
        eng.save_seq_state = lambda seq_id: seen.append("save") or save(seq_id)  # type: ignore[method-assign,func-returns-value]
        sched.reload(parked, lambda stage, freed: seen.append(f"{stage}:{freed > 0}:{eng._ctx is None}"))
        # the sets freed, the states saved, the old context freed (a shrink's answer), then the new one made
        assert seen == ["weights:True:False", "save", "all:False:True"]
        assert eng.placement == parked and eng.cached_weights == {} and eng._model == model  # no load
        while len(handle.tokens) < 12:
            sched.step()
        seen.clear()
        sched.reload(full, lambda stage, freed: seen.append(f"{stage}:{freed > 0}:{eng._ctx is None}"))
        assert seen == ["weights:False:False", "save", "all:False:True"]
        assert eng.placement == full and eng.cached_weights and eng._model == model
        sched.run_until_idle()
        assert list(handle.tokens) == reference
        assert eng.moves_in_place(BASE.with_(n_gpu_layers=-1, n_batch=32))  # another batch size: a new context too
        assert not eng.moves_in_place(full.with_(n_ctx=512))  # the states would not restore: a reload


def _failing_at(monkeypatch: pytest.MonkeyPatch, key: str) -> list[str]:
    """The patched ``llama_model_cache_weights`` answers "could not allocate" (-2) for the set ``key``, as CUDA does
    when the game took the memory the budget promised; the keys it was asked for are returned, in order."""
    from igi_sdk.engine import llama_engine

    real = llama_engine._cache_weights
    asked: list[str] = []

    def cache_weights(model, set_key, names, n, device):  # type: ignore[no-untyped-def]
        asked.append(set_key.decode())
        return -2 if set_key.decode() == key else real(model, set_key, names, n, device)

    monkeypatch.setattr(llama_engine, "_cache_weights", cache_weights)
    return asked


def test_a_growth_that_cannot_get_its_device_memory_is_undone_and_the_reply_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    attn_first = BASE.with_(n_gpu_layers=-1, rules=[FFN_ON_HOST])
    full = BASE.with_(n_gpu_layers=-1)
    with LlamaEngine(default_model_path(), attn_first, weight_cache_device="CPU") as unmoved:
        reference = _reply(unmoved, 24)
    with LlamaEngine(default_model_path(), attn_first, weight_cache_device="CPU") as eng:
        before = dict(eng.cached_weights)
        sched, handle = _greedy(eng, 24, 8)
        asked = _failing_at(monkeypatch, "blk.5.ffn")
        with pytest.raises(MoveUndone, match="could not allocate CPU memory for the weights of 'blk.5.ffn'"):
            sched.reload(full)
        assert asked[-1] == "blk.5.ffn" and len(asked) > 1  # sets were cached before the one that failed
        assert not eng.closed and eng.placement == attn_first and eng.cached_weights == before
        sched.run_until_idle()
        assert list(handle.tokens) == reference


def test_a_growth_out_of_a_parked_placement_is_undone_into_its_own_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """The growth made a context of its own (the KV cache moving to the device) before a set failed: the parked
    context is made again and the sessions' states go back into it."""
    full = BASE.with_(n_gpu_layers=-1)
    parked = cache_base_mod.parked(full)
    with LlamaEngine(default_model_path(), parked, weight_cache_device="CPU") as unmoved:
        reference = _reply(unmoved, 24)
    with LlamaEngine(default_model_path(), parked, weight_cache_device="CPU") as eng:
        sched, handle = _greedy(eng, 24, 8)
        assert eng.context_changes(full)
        _failing_at(monkeypatch, "blk.5.ffn")
        seen: list[str] = []
        with pytest.raises(MoveUndone):
            sched.reload(full, lambda stage, freed: seen.append(stage))
        assert seen == ["weights", "all"]  # the parked context went before the new one was made
        assert not eng.closed and eng.placement == parked and eng.cached_weights == {}
        assert not eng.context_changes(parked)
        sched.run_until_idle()
        assert list(handle.tokens) == reference


def test_a_move_that_uncached_sets_and_then_fails_closes_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a growth: the sets it uncached are what a shrink's answer counts on, so nothing is cached back."""
    attn_on_host = OverrideRule(pattern=r"^blk\.\d+\.attn_.*\.weight$", device="CPU")
    attn_first = BASE.with_(n_gpu_layers=-1, rules=[FFN_ON_HOST])
    ffn_first = BASE.with_(n_gpu_layers=-1, rules=[attn_on_host])
    with LlamaEngine(default_model_path(), attn_first, weight_cache_device="CPU") as eng:
        assert eng.moves_in_place(ffn_first)
        _failing_at(monkeypatch, "blk.5.ffn")
        with pytest.raises(EngineError, match="could not allocate") as failure:
            eng.move_to(ffn_first)
        assert not isinstance(failure.value, MoveUndone) and eng.closed


def test_a_mapped_host_copy_moves_like_a_pinned_one() -> None:
    """``weight_cache_host="mapped"``: the cache base maps the file instead of reading it into page-locked memory, and
    the sets are cached from the mapped pages: the same moves, the parked placement of that base included, the reply
    token for token."""
    attn_first = BASE.with_(n_gpu_layers=-1, rules=[FFN_ON_HOST])
    full = BASE.with_(n_gpu_layers=-1)
    parked = cache_base_mod.parked(full, "mapped")
    assert parked.load_mode == "mmap" and cache_base_mod.is_parked(parked)
    with LlamaEngine(default_model_path(), attn_first, weight_cache_device="CPU") as unmoved:
        reference = _reply(unmoved, 24)
    with LlamaEngine(default_model_path(), attn_first, weight_cache_device="CPU", weight_cache_host="mapped") as eng:
        assert eng._base is not None and eng._base.load_mode == "mmap" and eng.cached_weights
        model = eng._model
        sched, handle = _greedy(eng, 24)
        for target, n_tokens in ((full, 6), (parked, 12), (full, 18)):
            while len(handle.tokens) < n_tokens:
                sched.step()
            assert eng.moves_in_place(target)
            sched.reload(target)
            assert eng.placement == target and eng._model == model  # moved, never loaded
        sched.run_until_idle()
        assert list(handle.tokens) == reference


def test_a_move_to_the_detached_placement_computes_on_the_host_alone_and_comes_back() -> None:
    """The detached placement (the parked one whose context is made on the CPU backend alone, patch 0010) and back,
    mid-reply: the model stays, the states go through host memory, and the reply goes on token for token. On a CPU
    build there is no CUDA device to give back (``device_release.release`` does nothing); what is checked is the
    host-only context, which the engine refuses to take on trust (llama.cpp must log it)."""
    from igi_sdk.engine import device_release

    full = BASE.with_(n_gpu_layers=-1)
    detached = cache_base_mod.detached(full)
    assert detached.gpu_context is False and not detached.uses_gpu() and cache_base_mod.is_detached(detached)
    assert cache_base_mod.on_host(detached) and not cache_base_mod.is_parked(detached)
    assert cache_base_mod.detached(full, "mapped").load_mode == "mmap"
    assert not device_release.supported() and device_release.release() is False and not device_release.released()
    with LlamaEngine(default_model_path(), full, weight_cache_device="CPU") as unmoved:
        reference = _reply(unmoved, 24)
    with LlamaEngine(default_model_path(), full, weight_cache_device="CPU") as eng:
        sched, handle = _greedy(eng, 24, 6)
        assert eng.moves_in_place(detached) and eng.context_changes(detached)
        model = eng._model
        seen: list[str] = []
        sched.reload(detached, lambda stage, freed: seen.append(f"{stage}:{eng._ctx is None}"))
        assert seen == ["weights:False", "all:True"]
        assert eng.placement == detached and eng.cached_weights == {} and eng._model == model
        move = eng.last_move  # the context freed and made again; nothing released here, so no split of it logged
        assert move is not None and move.context_free_s is not None and move.context_s is not None
        assert move.release_s is not None and move.unregister_s is None and move.reacquire_s is None
        assert move.total_s >= move.on_freed_s + move.context_s
        while len(handle.tokens) < 12:
            sched.step()
        sched.reload(full, lambda stage, freed: None)
        assert eng.placement == full and eng.cached_weights and eng._model == model
        sched.run_until_idle()
        assert list(handle.tokens) == reference


def test_an_engine_loaded_at_the_detached_placement_replies_as_the_parked_one() -> None:
    full = BASE.with_(n_gpu_layers=-1)
    with LlamaEngine(default_model_path(), cache_base_mod.parked(full), weight_cache_device="CPU") as eng:
        parked_reply = _reply(eng)
    with LlamaEngine(default_model_path(), cache_base_mod.detached(full), weight_cache_device="CPU") as eng:
        assert _reply(eng) == parked_reply


def test_a_context_without_the_gpu_is_refused_where_llama_cpp_does_not_say_it_made_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A build without patch 0010 ignores LLAMA_CONTEXT_HOST_ONLY and would make a context on the devices: the engine
    reads llama.cpp's log line instead of trusting the variable (here the line is filtered out of what it reads)."""
    from igi_sdk.engine import llama_engine

    monkeypatch.setattr(llama_engine, "_host_only_logged", lambda lines: False)
    full = BASE.with_(n_gpu_layers=-1)
    with LlamaEngine(default_model_path(), full, weight_cache_device="CPU") as eng:
        with pytest.raises(EngineError, match="patch 0010"):
            eng.move_to(cache_base_mod.detached(full))
        assert eng.closed  # a move that freed the context and could not make one closes the engine


def test_a_placement_that_keeps_layers_off_the_gpu_is_reached_with_their_kv_cache_on_the_host() -> None:
    """Patch 0011: a placement that keeps its first layers off the GPU (attention first, partially) is a cache base
    whose context keeps those layers' KV cache on the host (``cache_base.context_form``), reached by a move mid-reply
    and left again, token for token, and loaded so directly as well; llama.cpp's own count of such layers is read
    back."""
    from igi_sdk.engine.llama_engine import _kv_host_layers, kv_host_layers_supported

    assert kv_host_layers_supported() and _kv_host_layers is not None
    full = BASE.with_(n_gpu_layers=-1)
    with LlamaEngine(default_model_path(), full, weight_cache_device="CPU") as unmoved:
        reference = _reply(unmoved, 24)
        n_layer = unmoved.model_table.n_layer
    partial = BASE.with_(n_gpu_layers=n_layer // 2)
    host_layers = cache_base_mod.kv_host_layers(unmoved.model_table, partial)
    assert 0 < host_layers < n_layer
    with LlamaEngine(default_model_path(), full, weight_cache_device="CPU") as eng:
        model = eng._model
        sched, handle = _greedy(eng, 24, 6)
        assert eng.moves_in_place(partial) and eng.context_changes(partial)
        sched.reload(partial, lambda stage, freed: None)
        assert eng.placement == partial and eng._model == model  # no load
        assert int(_kv_host_layers(eng._ctx)) == host_layers
        assert set(eng.cached_weights) == set(cache_base_mod.weight_sets(eng.model_table, partial))
        while len(handle.tokens) < 12:
            sched.step()
        sched.reload(full, lambda stage, freed: None)
        assert int(_kv_host_layers(eng._ctx)) == 0
        sched.run_until_idle()
        assert list(handle.tokens) == reference
    with LlamaEngine(default_model_path(), partial, weight_cache_device="CPU") as eng:
        assert eng.moves_in_place(full) and int(_kv_host_layers(eng._ctx)) == host_layers
        assert _reply(eng, 24) == reference


def test_a_release_refused_closes_the_engine_and_a_reacquire_refused_undoes_the_growth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The seam is ``engine.device_release`` (on a CPU build there is nothing to release): a release that ggml-cuda
    refuses fails the shrink to the detached placement, whose context is already gone, so the engine closes (the
    worker then exits and its memory goes with it); a reacquire that fails undoes the growth out of the detached
    placement, which computes on as before, token for token."""
    from igi_sdk.engine import device_release

    full = BASE.with_(n_gpu_layers=-1)
    detached = cache_base_mod.detached(full)

    def refused() -> bool:
        raise EngineError("the CUDA devices cannot be released: a CUDA device buffer, backend or event is still alive")

    with LlamaEngine(default_model_path(), full, weight_cache_device="CPU") as eng:
        monkeypatch.setattr(device_release, "release", refused)
        with pytest.raises(EngineError, match="cannot be released"):
            eng.move_to(detached)
        assert eng.closed
    monkeypatch.undo()

    def reacquire_failed() -> None:
        raise EngineError("the CUDA devices cannot be taken again: a CUDA call failed")

    with LlamaEngine(default_model_path(), detached, weight_cache_device="CPU") as unmoved:
        reference = _reply(unmoved, 24)
    with LlamaEngine(default_model_path(), detached, weight_cache_device="CPU") as eng:
        sched, handle = _greedy(eng, 24, 6)
        monkeypatch.setattr(device_release, "released", lambda: True)  # as after a real release
        monkeypatch.setattr(device_release, "reacquire", reacquire_failed)
        with pytest.raises(MoveUndone):
            sched.reload(full, lambda stage, freed: None)
        assert not eng.closed and eng.placement == detached and eng.cached_weights == {}
        sched.run_until_idle()
        assert list(handle.tokens) == reference
