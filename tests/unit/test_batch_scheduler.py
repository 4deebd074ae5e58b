"""Unit tests of the batching policy (no engine): step composition, admission order, slots, prefix cache,
and the planner-side sizing helpers."""

from __future__ import annotations

import pytest

from igi_sdk.engine.batch_compose import HoldingTextStream, Running, admission_order, compose_step
from igi_sdk.engine.batch_sizing import CPU_PREFILL_CHUNK_TOKENS, prefill_chunk_tokens, sessions_placement
from igi_sdk.engine.batch_slots import SlotTable, common_prefix
from igi_sdk.engine.batch_types import BatchRequest, RequestHandle
from igi_sdk.engine.cache_base import cache_base, detached, parked
from igi_sdk.engine.prefix_cache import PrefixCache
from igi_sdk.planner.placement import Placement

NEVER_CACHED = lambda prefix: False


def _run(
    seq_no: int,
    prompt_len: int,
    *,
    priority: int = 0,
    slot: int | None = None,
    prefill_pos: int = 0,
    pending: int | None = None,
    prefix_tokens: int = 0,
    slots: SlotTable | None = None,
) -> Running:
    prompt = list(range(100, 100 + prompt_len))
    req = BatchRequest(f"s{seq_no}", prompt, max_tokens=8, priority=priority, prefix_tokens=prefix_tokens)
    run = Running(
        req=req,
        handle=RequestHandle(f"r{seq_no}", req.session_id),
        seq_no=seq_no,
        prompt=prompt,
        t_submit=0.0,
        stream=HoldingTextStream(),
        prefill_pos=prefill_pos,
        pending=pending,
    )
    if pending is not None:
        run.handle.tokens.append(pending)  # the pending token is the last one sampled
    if slot is not None:
        table = slots or SlotTable(8)
        run.slot = table.slots[slot]
        run.slot.session_id = req.session_id
    return run


def test_decodes_go_first_then_prefill_by_priority_within_n_batch() -> None:
    slots = SlotTable(4)
    # the one decoding has the highest priority (a prompt above every decoding one goes alone: test_batch_fairness)
    decoding = _run(1, 10, priority=10, slot=0, prefill_pos=10, pending=42, slots=slots)
    decoding.handle.tokens.insert(0, 7)  # sampled and decoded a step before: the slot holds the prompt and 7
    assert decoding.held_tokens == decoding.prompt + [7]
    low = _run(2, 30, slot=1, slots=slots)
    high = _run(3, 30, priority=5, slot=2, slots=slots)
    chunks = compose_step([decoding, low, high], n_batch=16, step_no=1, prefix_cached=NEVER_CACHED)
    assert [(c.run.seq_no, len(c.tokens), c.decode) for c in chunks] == [(1, 1, True), (3, 15, False)]
    assert chunks[0].entry() == (0, [42], 11, True)  # pending token at the next position, logits wanted
    assert chunks[1].start_pos == 0 and not chunks[1].want_logits  # prompt not finished: no logits
    assert sum(len(c.tokens) for c in chunks) <= 16


def test_fifo_among_equal_prompts_and_last_prompt_chunk_wants_logits() -> None:
    slots = SlotTable(4)
    first, second = _run(1, 5, slot=0, slots=slots), _run(2, 5, slot=1, slots=slots)
    chunks = compose_step([second, first], n_batch=8, step_no=0, prefix_cached=NEVER_CACHED)
    assert [(c.run.seq_no, len(c.tokens), c.want_logits) for c in chunks] == [(1, 5, True), (2, 3, False)]


def test_running_decodes_are_never_starved_even_past_n_batch() -> None:
    slots = SlotTable(6)
    runs = [_run(i, 4, slot=i, prefill_pos=4, pending=1, slots=slots) for i in range(6)]
    served: set[int] = set()
    for step in range(3):
        chunks = compose_step(runs, n_batch=4, step_no=step, prefix_cached=NEVER_CACHED)
        assert len(chunks) == 4 and all(c.decode for c in chunks)
        served |= {c.run.seq_no for c in chunks}
    assert served == set(range(6))  # rotation reaches every sequence


def test_prefill_stops_at_an_uncached_persona_boundary() -> None:
    run = _run(1, 40, slot=0, prefix_tokens=12)
    chunks = compose_step([run], n_batch=32, step_no=0, prefix_cached=NEVER_CACHED)
    assert len(chunks[0].tokens) == 12
    cached = compose_step([run], n_batch=32, step_no=0, prefix_cached=lambda prefix: True)
    assert len(cached[0].tokens) == 32


def test_the_prompt_with_fewest_tokens_left_goes_first_within_a_priority() -> None:
    slots = SlotTable(4)
    long, short = _run(1, 100, slot=0, slots=slots), _run(2, 6, slot=1, slots=slots)
    chunks = compose_step([long, short], n_batch=64, step_no=0, prefix_cached=NEVER_CACHED)
    assert [(c.run.seq_no, len(c.tokens), c.want_logits) for c in chunks] == [(2, 6, True), (1, 58, False)]
    urgent_long = _run(3, 100, priority=10, slot=2, slots=slots)
    chunks = compose_step([short, urgent_long], n_batch=128, step_no=0, prefix_cached=NEVER_CACHED)
    assert [(c.run.seq_no, len(c.tokens)) for c in chunks] == [(3, 100), (2, 6)]  # priority still comes first


def test_chunked_prefill_cuts_a_prompt_on_the_same_grid_whatever_shares_the_step() -> None:
    slots = SlotTable(4)
    alone = _run(1, 40, slot=0, slots=slots)
    ends = []
    while alone.prefill_pos < len(alone.prompt):
        (chunk,) = compose_step([alone], n_batch=64, step_no=0, prefix_cached=NEVER_CACHED, prefill_chunk_tokens=16)
        alone.prefill_pos += len(chunk.tokens)
        ends.append(alone.prefill_pos)
    assert ends == [16, 32, 40]
    resumed = _run(2, 40, slot=1, prefill_pos=10, slots=slots)  # e.g. after a restored persona prefix
    (chunk,) = compose_step([resumed], n_batch=64, step_no=0, prefix_cached=NEVER_CACHED, prefill_chunk_tokens=16)
    assert (chunk.start_pos, len(chunk.tokens)) == (10, 6)  # back on the grid at 16


def test_chunked_prefill_bounds_prompt_tokens_not_decodes() -> None:
    slots = SlotTable(8)
    decoding = [_run(i, 4, slot=i, prefill_pos=4, pending=1, slots=slots) for i in range(3)]
    long = _run(9, 100, slot=5, slots=slots)
    chunks = compose_step([*decoding, long], n_batch=64, step_no=0, prefix_cached=NEVER_CACHED, prefill_chunk_tokens=16)
    assert [(c.run.seq_no, len(c.tokens), c.decode) for c in chunks] == [
        (0, 1, True),
        (1, 1, True),
        (2, 1, True),
        (9, 16, False),
    ]


def test_a_step_that_ends_a_short_prompt_carries_no_chunk_of_a_long_one() -> None:
    """Chunked prefill: another NPC's new turn gets its first token after one short step, not a long chunk."""
    slots = SlotTable(4)
    long, short = _run(1, 100, slot=0, prefill_pos=16, slots=slots), _run(2, 6, slot=1, slots=slots)
    chunks = compose_step([long, short], n_batch=64, step_no=0, prefix_cached=NEVER_CACHED, prefill_chunk_tokens=16)
    assert [(c.run.seq_no, len(c.tokens), c.want_logits) for c in chunks] == [(2, 6, True)]
    short.prefill_pos, short.pending = 6, 5  # the short one decodes now: the long one goes on beside it
    chunks = compose_step([long, short], n_batch=64, step_no=1, prefix_cached=NEVER_CACHED, prefill_chunk_tokens=16)
    assert [(c.run.seq_no, len(c.tokens)) for c in chunks] == [(2, 1), (1, 16)]
    urgent = _run(3, 100, priority=10, slot=2, prefill_pos=16, slots=slots)
    fresh = _run(4, 6, slot=3, slots=slots)
    chunks = compose_step([urgent, fresh], n_batch=64, step_no=0, prefix_cached=NEVER_CACHED, prefill_chunk_tokens=16)
    assert [(c.run.seq_no, len(c.tokens)) for c in chunks] == [
        (3, 16)
    ]  # a higher priority keeps its chunk; the budget is spent


def _chunk_ends(runs: list[Running], prefix_cached: object = NEVER_CACHED) -> dict[int, list[int]]:
    """Where each run's prompt is cut when ``runs`` share their steps (chunked prefill: n_batch 64, chunks of 16); a
    run whose prompt is done decodes from then on."""
    ends: dict[int, list[int]] = {run.seq_no: [] for run in runs}
    step = 0
    while any(run.prefilling for run in runs):
        for chunk in compose_step(runs, 64, step, prefix_cached, prefill_chunk_tokens=16):  # type: ignore[arg-type]
            if chunk.decode:
                continue
            chunk.run.prefill_pos += len(chunk.tokens)
            ends[chunk.run.seq_no].append(chunk.run.prefill_pos)
            if chunk.want_logits:
                chunk.run.pending = 1
                chunk.run.handle.tokens.append(1)
        step += 1
    return ends


def test_chunked_prefill_cuts_each_prompt_where_it_is_cut_alone() -> None:
    """llama.cpp's results for a sequence depend on where its prompt is cut, so a prompt is cut on the grid and at its
    persona boundary whatever shares its steps: a prompt whose chunk does not fit what is left of a step waits for
    the next one instead of being cut there, and its persona boundary cuts it even once that prefix is cached."""

    def runs() -> list[Running]:
        slots = SlotTable(8)
        return [
            _run(1, 40, slot=0, prefix_tokens=12, slots=slots),
            _run(2, 35, slot=1, prefix_tokens=20, slots=slots),
            _run(3, 50, slot=2, prefill_pos=10, slots=slots),
            _run(4, 7, slot=3, slots=slots),
            _run(5, 30, slot=4, prefix_tokens=22, slots=slots),
        ]

    alone = {}  # type: ignore[var-annotated]
    for run in runs():
        alone |= _chunk_ends([run])
    assert alone == {1: [12, 16, 32, 40], 2: [16, 20, 32, 35], 3: [16, 32, 48, 50], 4: [7], 5: [16, 22, 30]}
    assert _chunk_ends(runs()) == alone
    assert _chunk_ends(runs(), prefix_cached=lambda prefix: True) == alone


def test_prefill_chunks_are_short_only_where_the_cpu_evaluates_prompts() -> None:
    cpu_only = Placement(n_gpu_layers=0, op_offload=False, n_seq_max=4, n_batch=512)
    assert prefill_chunk_tokens(cpu_only, gpu=True) == CPU_PREFILL_CHUNK_TOKENS
    assert prefill_chunk_tokens(Placement(n_gpu_layers=-1, n_seq_max=4), gpu=False) == CPU_PREFILL_CHUNK_TOKENS
    assert prefill_chunk_tokens(Placement(n_gpu_layers=-1, n_seq_max=4, n_batch=512), gpu=True) == 512
    streamed = Placement(n_gpu_layers=0, op_offload=True, n_seq_max=4, n_batch=1024, n_ubatch=1024)
    assert prefill_chunk_tokens(streamed, gpu=True) == 1024  # op_offload streams the weights per ubatch
    # one slot or several: a prompt is cut the same way, so its greedy reply does not depend on the slots
    assert prefill_chunk_tokens(cpu_only.with_(n_seq_max=1), gpu=False) == CPU_PREFILL_CHUNK_TOKENS
    assert prefill_chunk_tokens(cpu_only, gpu=False, cpu_chunk_tokens=64) == 64
    # a weight cache's parked and detached placements: every layer assigned to the GPU, every weight and the KV cache
    # on the host, nothing streamed: the CPU computes their prompts
    gpu_base = Placement(n_gpu_layers=-1, n_seq_max=4, n_batch=512)
    assert prefill_chunk_tokens(parked(gpu_base), gpu=True) == CPU_PREFILL_CHUNK_TOKENS
    assert prefill_chunk_tokens(detached(gpu_base), gpu=True) == CPU_PREFILL_CHUNK_TOKENS
    assert prefill_chunk_tokens(cache_base(gpu_base), gpu=True) == 512  # the cache base streams its prompts
    with pytest.raises(ValueError):
        prefill_chunk_tokens(cpu_only, gpu=False, cpu_chunk_tokens=0)


def test_admission_order_is_priority_then_fifo() -> None:
    queue = [_run(1, 4), _run(2, 4, priority=5), _run(3, 4), _run(4, 4, priority=5)]
    assert [r.seq_no for r in admission_order(queue)] == [2, 4, 1, 3]


def test_slot_table_prefers_free_low_slots_then_lru_idle_not_protected() -> None:
    table = SlotTable(3)
    assert table.claimable(set()) is table.slots[0]
    for i, slot in enumerate(table.slots):
        slot.session_id, slot.last_used = f"s{i}", 10 - i
    table.slots[2].busy = True
    assert table.claimable(set()) is table.slots[1]  # least recently used idle
    assert table.claimable({"s1"}) is table.slots[0]
    assert table.claimable({"s0", "s1"}) is None
    assert table.of_session("s2") is table.slots[2]


def test_common_prefix_reuses_equal_tokens_and_image_chunks_never_unknown_positions() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([1, -5, -5, 2], [1, -5, -5, 2, 9]) == 4  # the same image chunk at the same positions
    assert common_prefix([1, -5, 2], [1, -6, 2]) == 1  # another image
    assert common_prefix([1, -1, 2], [1, -1, 2]) == 1  # a position whose token is not known is evaluated again


def test_parked_states_are_bounded_lru() -> None:
    table = SlotTable(1, max_parked_bytes=10)
    table.park("a", b"12345")
    table.park("b", b"12345")
    table.park("c", b"123")
    assert list(table.parked) == ["b", "c"] and table.parked_bytes == 8
    assert table.unpark("b") == b"12345" and table.unpark("b") is None and table.parked_bytes == 3


def test_prefix_cache_finds_the_longest_shorter_prefix_and_evicts_by_bytes() -> None:
    cache = PrefixCache(max_bytes=100)
    cache.put([1, 2, 3], b"x" * 40)
    cache.put([1, 2, 3, 4, 5], b"y" * 40)
    hit = cache.longest([1, 2, 3, 4, 5, 6])
    assert hit is not None and hit.tokens == (1, 2, 3, 4, 5)
    assert cache.longest([1, 2, 3, 4, 5]).tokens == (1, 2, 3)  # type: ignore[union-attr]  # never the whole prompt
    assert cache.longest([1, 2, 3, 9], at_least=4) is None
    cache.put([7, 8], b"z" * 40)  # 120 bytes > 100: the least recently used goes
    assert len(cache) == 2 and [1, 2, 3] in cache and [1, 2, 3, 4, 5] not in cache  # [1, 2, 3] was used last
    assert (cache.hits, cache.misses) == (2, 1)
    PrefixCache(0).put([1], b"a")  # disabled cache stores nothing
    with pytest.raises(ValueError):
        PrefixCache(-1)


def test_sessions_placement_sizes_the_context_per_session() -> None:
    placement = sessions_placement(Placement(n_batch=2), 8, 512)
    assert (placement.n_seq_max, placement.n_ctx, placement.n_batch) == (8, 4096, 8)
    assert sessions_placement(Placement(n_batch=512), 4, 1024).n_batch == 512


def test_the_daemon_setting_defaults_to_the_engine_chunk() -> None:
    from igi_sdk.config import EngineSettings

    assert EngineSettings().cpu_prefill_chunk_tokens == CPU_PREFILL_CHUNK_TOKENS


def test_the_first_byte_of_a_character_is_held() -> None:
    """Its token releases no text and holds the bytes back (``holding``): the end of the generation releases them
    as U+FFFD if the character never completes, and the worker needs an event to carry that text."""
    stream = HoldingTextStream()
    assert stream.push(b"a") == "a" and not stream.holding
    assert stream.push(b"\xc3") == "" and stream.holding  # half of "\xc3\xa9"
    assert stream.push(b"\xa9") == "\u00e9" and not stream.holding
    assert stream.push(b"\xc3") == "" and stream.holding
    assert stream.flush() == "\ufffd" and stream.text == "a\u00e9\ufffd"
