"""The composition rule under a crowd (no engine): the NPC the player talks to gets its prompt in at once, alone (the
crowd's decode tokens wait for it, at most ``PRIORITY_STEPS_MAX`` steps in a row), and no NPC starves (every decode in
every other step; a long prompt among short turns within ``PREFILL_MAX_WAITS`` steps)."""

from __future__ import annotations

from igi_sdk.engine.batch_compose import (
    PREFILL_MAX_WAITS,
    PRIORITY_STEPS_MAX,
    Chunk,
    HoldingTextStream,
    Running,
    compose_step,
    note_prefill_waits,
)
from igi_sdk.engine.batch_slots import SlotTable
from igi_sdk.engine.batch_types import PRIORITY_PLAYER_FACING, BatchRequest, RequestHandle

NEVER_CACHED = lambda prefix: False
CHUNK = 160  # the CPU's prefill chunk (batch_sizing.CPU_PREFILL_CHUNK_TOKENS)


class Crowd:
    """Sequences in the slots of one context, stepped as the scheduler does (a finished prompt samples a token, a
    decoded token samples the next)."""

    def __init__(self, n_slots: int, *, n_batch: int = 2048, chunk: int | None = CHUNK) -> None:
        self.slots = SlotTable(n_slots)
        self.n_batch, self.chunk = n_batch, chunk
        self.running: list[Running] = []
        self.step_no = 0
        self.decodes_held = 0
        self._seq = 0

    def add(self, prompt_len: int, *, priority: int = 0, decoding: bool = False) -> Running:
        self._seq += 1
        prompt = list(range(1000 * self._seq, 1000 * self._seq + prompt_len))
        req = BatchRequest(f"npc{self._seq}", prompt, max_tokens=10_000, priority=priority)
        run = Running(req, RequestHandle(f"r{self._seq}", req.session_id), self._seq, prompt, 0.0, HoldingTextStream())
        slot = next(s for s in self.slots if s.session_id is None)
        slot.session_id, slot.busy, run.slot = req.session_id, True, slot
        if decoding:  # its prompt is in, a token sampled and waiting to be decoded
            run.prefill_pos, run.pending = prompt_len, 7
            run.handle.tokens.append(7)
        self.running.append(run)
        return run

    def remove(self, run: Running) -> None:
        self.running.remove(run)
        assert run.slot is not None
        run.slot.session_id, run.slot.busy = None, False

    def step(self) -> list[Chunk]:
        self.step_no += 1
        waiting = {id(r) for r in self.running if r.pending is not None}
        chunks = compose_step(self.running, self.n_batch, self.step_no, NEVER_CACHED, self.chunk, self.decodes_held)
        note_prefill_waits(self.running, chunks)
        assert sum(len(c.tokens) for c in chunks) <= self.n_batch
        decoded = {id(c.run) for c in chunks if c.decode}
        if waiting and not decoded:  # the crowd waits for a prompt of higher priority, alone in the step
            top = max(r.req.priority for r in self.running if id(r) in waiting)
            assert chunks and all(c.run.req.priority > top for c in chunks)
            self.decodes_held += 1
            assert self.decodes_held <= PRIORITY_STEPS_MAX  # no NPC starves
        else:
            assert decoded == waiting  # every sampled token decoded
            self.decodes_held = 0
        for c in chunks:
            if not c.decode:
                c.run.prefill_pos += len(c.tokens)
            if c.want_logits:  # a token sampled: decoded in the next step
                c.run.handle.tokens.append(8)
                c.run.pending = 8
        return chunks


def test_the_speaking_npc_prompt_goes_alone_and_the_crowd_talks_right_after() -> None:
    crowd = Crowd(16)
    decoding = [crowd.add(200 + 10 * i, decoding=True) for i in range(13)]
    chatter = [crowd.add(40), crowd.add(90)]  # two crowd turns still prefilling, short ones
    speaker = crowd.add(400, priority=PRIORITY_PLAYER_FACING)
    for _ in range(3):  # 400 tokens: 160 + 160 + 80, three steps of its own
        chunks = crowd.step()
        assert [c.run for c in chunks] == [speaker]
    assert not speaker.prefilling and speaker.pending is not None
    chunks = crowd.step()
    assert {id(c.run) for c in chunks if c.decode} == {id(r) for r in [*decoding, speaker]}
    crowd.step()
    assert not any(r.prefilling for r in chatter)  # and the crowd's turns right after it


def test_the_speaking_npc_prompt_takes_one_step_of_its_own_on_the_gpu() -> None:
    crowd = Crowd(16, chunk=None)
    for i in range(15):
        crowd.add(300 + i, decoding=True)
    speaker = crowd.add(889, priority=PRIORITY_PLAYER_FACING)
    assert [c.run for c in crowd.step()] == [speaker]
    assert speaker.pending is not None
    assert sum(c.decode for c in crowd.step()) == 16


def test_the_crowd_decodes_at_least_every_few_steps_of_a_long_urgent_prompt() -> None:
    crowd = Crowd(8)
    decoding = [crowd.add(100, decoding=True) for _ in range(6)]
    speaker = crowd.add(CHUNK * (2 * PRIORITY_STEPS_MAX + 1), priority=PRIORITY_PLAYER_FACING)
    decoded_at = []
    for step in range(1, 2 * PRIORITY_STEPS_MAX + 4):
        chunks = crowd.step()
        if any(c.decode for c in chunks):
            decoded_at.append(step)
            assert [c.run for c in chunks if not c.decode] in ([speaker], [])  # its chunk beside the decodes
        if not speaker.prefilling:
            break
    assert not speaker.prefilling
    assert decoded_at[0] == PRIORITY_STEPS_MAX + 1  # Crowd.step checks the held steps in a row
    assert len(decoding) == 6


def test_no_npc_starves_a_long_prompt_among_a_stream_of_short_turns() -> None:
    crowd = Crowd(16)
    decoding = [crowd.add(100, decoding=True) for _ in range(8)]
    long = crowd.add(600)
    short = [crowd.add(30) for _ in range(3)]
    served_at: list[int] = []
    for step in range(1, 41):
        chunks = crowd.step()
        assert sum(c.decode for c in chunks) >= len(decoding)
        if any(c.run is long and not c.decode for c in chunks):
            served_at.append(step)
        for run in [r for r in short if not r.prefilling]:  # a short turn answered: another NPC's comes in
            crowd.remove(run)
            short.remove(run)
            short.append(crowd.add(30))
        if not long.prefilling:
            break
    assert not long.prefilling, "the long prompt never finished among the short turns"
    gaps = [b - a for a, b in zip([0, *served_at], served_at, strict=False)]
    assert max(gaps) <= PREFILL_MAX_WAITS + 1


def test_a_starving_prompt_goes_first_among_its_priority_only() -> None:
    crowd = Crowd(4)
    long = crowd.add(600)
    long.prefill_waits = PREFILL_MAX_WAITS
    short = crowd.add(30)
    chunks = crowd.step()
    assert [c.run for c in chunks] == [long, short] or [c.run for c in chunks] == [long]
    assert long.prefill_waits == 0
    speaker = crowd.add(300, priority=PRIORITY_PLAYER_FACING)
    long.prefill_waits = PREFILL_MAX_WAITS
    chunks = crowd.step()
    assert [c.run for c in chunks if not c.decode][0] is speaker  # a higher priority still goes first


def test_more_decodes_than_a_step_holds_take_turns_n_batch_at_a_time() -> None:
    crowd = Crowd(10, n_batch=4, chunk=None)
    runs = [crowd.add(3, decoding=True) for _ in range(10)]
    waited = {id(r): 0 for r in runs}
    longest = 0
    for step_no in range(1, 41):
        chunks = compose_step(crowd.running, 4, step_no, NEVER_CACHED)
        served = {id(c.run) for c in chunks}
        assert len(served) == 4
        for r in runs:
            waited[id(r)] = 0 if id(r) in served else waited[id(r)] + 1
            longest = max(longest, waited[id(r)])
    assert longest == 2  # ceil(10 / 4) - 1
