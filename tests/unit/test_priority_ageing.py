"""Priority ageing (protocol 1.4, ipc/PROTOCOL.md 6.5) in the batch's pure policy: a request ranks as its priority plus
``ageing_per_s`` points per second it has waited, for a slot (``admission_order``) and for its prompt's turn in a step
(``prefill_order``), so a request of a low priority waiting behind a stream of higher ones is served within a bounded
time; with a rate of 0 the order is strict and it is not."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from igi_sdk.engine.batch_compose import HoldingTextStream, Running, admission_order, compose_step, prefill_order
from igi_sdk.engine.batch_slots import SlotTable
from igi_sdk.engine.batch_types import BatchRequest, RequestHandle

NEVER_CACHED = lambda prefix: False


def run(
    seq_no: int,
    priority: int,
    t_submit_s: float,
    *,
    ageing_per_s: float,
    waited_s: float = 0.0,
    prompt_len: int = 100,
) -> Running:
    prompt = list(range(1000 * seq_no, 1000 * seq_no + prompt_len))
    req = BatchRequest(f"npc{seq_no}", prompt, max_tokens=8, priority=priority, waited_s=waited_s)
    return Running(
        req,
        RequestHandle(f"r{seq_no}", req.session_id),
        seq_no,
        prompt,
        t_submit_s,
        HoldingTextStream(),
        ageing_per_s=ageing_per_s,
    )


def test_a_low_priority_request_ranks_level_with_a_higher_one_queued_priority_difference_over_rate_later() -> None:
    low = run(1, 0, 0.0, ageing_per_s=1.0)
    assert admission_order([run(2, 10, 9.5, ageing_per_s=1.0), low])[0] is not low  # queued 9.5 s later: ahead
    assert admission_order([run(3, 10, 10.5, ageing_per_s=1.0), low])[0] is low  # 10.5 s later: behind
    assert low.rank(4.0) == pytest.approx(4.0)


def test_without_ageing_the_order_is_strict_priority_then_arrival() -> None:
    low = run(1, 0, 0.0, ageing_per_s=0.0)
    later = [run(2 + i, 1, 1000.0 * (i + 1), ageing_per_s=0.0) for i in range(3)]
    assert admission_order([low, *later])[-1] is low
    same = [run(10 + i, 5, 5.0 - i, ageing_per_s=0.0) for i in range(3)]  # equal priority: by submit order (seq_no)
    assert [r.seq_no for r in admission_order(same)] == [10, 11, 12]


def test_the_time_waited_before_the_submit_counts() -> None:
    # carried over a worker replacement: queued 30 s before this worker took it
    carried = run(1, 0, 100.0, ageing_per_s=1.0, waited_s=30.0)
    fresh = run(2, 20, 100.0, ageing_per_s=1.0)
    assert carried.t_queued == 70.0
    assert admission_order([fresh, carried])[0] is carried


requests = st.lists(
    st.tuples(st.integers(-100, 100), st.floats(0.0, 1000.0), st.floats(0.0, 50.0)), min_size=1, max_size=12
)


@settings(max_examples=200, deadline=None)
@given(requests, st.floats(0.01, 100.0), st.floats(0.0, 2000.0))
def test_admission_order_is_the_order_of_rank_at_any_later_time(
    specs: list[tuple[int, float, float]], ageing_per_s: float, later_s: float
) -> None:
    runs = [run(i + 1, p, t, ageing_per_s=ageing_per_s, waited_s=w) for i, (p, t, w) in enumerate(specs)]
    now_s = max(r.t_submit for r in runs) + later_s
    order = admission_order(runs)
    ranks = [r.rank(now_s) for r in order]
    for a, b in zip(ranks, ranks[1:], strict=False):  # never a lower rank before a higher one (rounding aside)
        assert a >= b - 1e-6 * max(1.0, abs(a), abs(b))


@settings(max_examples=200, deadline=None)
@given(requests, st.floats(0.01, 100.0))
def test_a_request_is_passed_only_by_requests_queued_within_its_bound(
    specs: list[tuple[int, float, float]], ageing_per_s: float
) -> None:
    # PROTOCOL.md 6.5: a request is passed only by requests accepted within (100 - its priority) / rate after it
    runs = [run(i + 1, p, t, ageing_per_s=ageing_per_s, waited_s=w) for i, (p, t, w) in enumerate(specs)]
    order = admission_order(runs)
    for i, ahead in enumerate(order):
        for behind in order[i + 1 :]:
            if ahead.t_queued > behind.t_queued:  # a later one went first
                bound = (100 - behind.req.priority) / ageing_per_s
                assert ahead.t_queued - behind.t_queued <= bound * (1 + 1e-9) + 1e-9


class Stream:
    """Two slots held by a player-facing stream (each prompt replaced by a fresh one as soon as it is in) and one
    crowd NPC's prompt of a lower priority in the third; a step every ``step_s`` seconds."""

    def __init__(self, ageing_per_s: float, step_s: float = 0.25) -> None:
        self.ageing_per_s, self.step_s = ageing_per_s, step_s
        self.slots = SlotTable(3)
        self.now_s, self.step_no, self._seq = 0.0, 0, 0
        self.high = [self._admit(10, 160) for _ in range(2)]
        self.low = self._admit(0, 160)

    def _admit(self, priority: int, prompt_len: int) -> Running:
        self._seq += 1
        r = run(self._seq, priority, self.now_s, ageing_per_s=self.ageing_per_s, prompt_len=prompt_len)
        slot = next(s for s in self.slots if s.session_id is None)
        slot.session_id, slot.busy, r.slot = r.req.session_id, True, slot
        return r

    def step(self) -> bool:
        """One step of 160 prompt tokens; whether the crowd NPC's prompt got a chunk."""
        self.step_no += 1
        chunks = compose_step([*self.high, self.low], 2048, self.step_no, NEVER_CACHED, 160, 0, now_s=self.now_s)
        self.now_s += self.step_s
        served = {id(c.run) for c in chunks}
        for i, h in enumerate(self.high):
            if id(h) in served:  # its prompt is in: the player-facing NPC's next line comes at once
                assert h.slot is not None
                h.slot.session_id, h.slot.busy = None, False
                self.high[i] = self._admit(10, 160)
        return id(self.low) in served


def test_without_ageing_a_stream_of_higher_prompts_keeps_a_lower_one_out() -> None:
    stream = Stream(ageing_per_s=0.0)
    assert not any(stream.step() for _ in range(2000))


def test_with_ageing_the_lower_prompt_goes_once_its_rank_reaches_the_higher_priority() -> None:
    stream = Stream(ageing_per_s=2.0)  # 10 points behind at 2 points per second: 5 s
    steps = next(n for n in range(1, 2000) if stream.step())
    waited_s = (steps - 1) * stream.step_s
    assert 5.0 - stream.step_s <= waited_s <= 5.0 + stream.step_s


def test_an_overdue_prompt_goes_before_shorter_ones_and_the_others_keep_their_order() -> None:
    old = run(1, 0, 0.0, ageing_per_s=1.0, prompt_len=600)
    fresh = [run(2, 10, 20.0, ageing_per_s=1.0, prompt_len=50), run(3, 10, 20.0, ageing_per_s=1.0, prompt_len=30)]
    low_short = run(4, 0, 19.0, ageing_per_s=1.0, prompt_len=10)
    order = prefill_order([*fresh, low_short, old], now_s=20.0)
    # the old prompt has waited 20 s (rank 20 >= 10): first; then the priority-10 prompts, the fewest tokens left
    # first; the crowd's short prompt, waited 1 s (rank 1), last
    assert [r.seq_no for r in order] == [1, 3, 2, 4]
    assert [r.seq_no for r in prefill_order([*fresh, low_short, old], now_s=5.0)] == [3, 2, 4, 1]
