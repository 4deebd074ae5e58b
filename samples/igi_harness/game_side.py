"""The game's side of the wire: NPC conversations, frame stats, budget events, status polling.

It runs the real :class:`igi_sdk.client.AsyncClient` on a private asyncio loop in a background thread,
like a game plugin's I/O thread; the game loop thread only posts work to it and never waits on the wire.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Coroutine
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from igi_harness.npc_actions import GIVE_ITEM, SAY, NpcWorld
from igi_harness.recorder import PhaseRecorder
from igi_harness.script import NpcPlan, SceneTimes
from igi_sdk.client import AsyncClient, InvalidOutputError, InvalidToolArgumentsError
from igi_sdk.errors import IgiError
from igi_sdk.ipc.images import Image
from igi_sdk.ipc.messages import BudgetAck
from igi_sdk.ipc.values import Sampling

#: The NPC that can call ``give_item``.
MERCHANT = "Zara"
#: The frame the first NPC is shown mid-scene when the daemon serves a vision projector (raw RGB, top row first).
LOOK_SIZE = (160, 90)
LOOK_LINE = "Look at what I see right now. What do you make of it?"


def render_look_frame(width: int, height: int) -> bytes:
    """The game's view as the player sees it: a deterministic RGB8 frame (sky, ground, a few boxes, noise), drawn
    without an imaging library (``igi_sdk.bench.vision.render_frame``, the vision benchmark's frame)."""
    from igi_sdk.bench.vision import render_frame

    return render_frame(width, height)


class GameSide:
    """Wire-facing half of the simulated game (one per phase).

    Attributes:
        sleep_ms: the daemon's current ``sleep_ms_between_tokens`` (from the last frame_stats reply).
        tokens_per_frame: the daemon's current tokens-per-frame cap.
        budget_mib: the budget the game last gave the daemon (set when the request is sent, in the order the requests
            go out, so an acknowledgement arriving late cannot put an older budget back).
        last_text: the tail of the most recent NPC line (for the live view).
    """

    def __init__(
        self,
        connection_file: Path,
        rec: PhaseRecorder,
        t0: float,
        *,
        governor: bool,
        budget_mib: int,
        request_timeout_s: float = 120.0,
    ) -> None:
        self.connection_file, self.rec, self.t0 = connection_file, rec, t0
        self.governor, self.budget_mib, self.timeout_s = governor, budget_mib, request_timeout_s
        self.sleep_ms, self.tokens_per_frame = 0.0, None
        self.last_text = ""
        self.client: AsyncClient | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="igi-game-io", daemon=True)
        self._stats_in_flight = False
        self._explicit_budgets = 0  # budgets the game set itself: a reply to frame_stats sent before one is stale
        self._npc_tasks: list[asyncio.Task[None]] = []
        self._requests: dict[Future[Any], str] = {}  # frame_stats / budget requests posted by the game loop, unanswered
        self._streams: set[Any] = set()
        self._talk_end_s = 0.0
        self.world = NpcWorld()

    def now(self) -> float:
        """Seconds since the phase start."""
        return time.perf_counter() - self.t0

    def _post(self, coro: Coroutine[Any, Any, Any]) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _post_request(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        """Post a request of the game loop without waiting for it; :meth:`stop` waits for those still unanswered."""
        future = self._post(coro)
        self._requests[future] = name
        future.add_done_callback(self._request_done)

    def _request_done(self, future: Future[Any]) -> None:
        name = self._requests.pop(future, "request")
        # an IgiError is recorded by the request itself; anything else would otherwise be lost with the future
        if not future.cancelled() and (exc := future.exception()) is not None:
            self.rec.errors.append(f"{name}: {type(exc).__name__}: {exc}")

    # --- lifecycle ------------------------------------------------------------------------------------
    def connect(self, timeout_s: float = 60.0) -> None:
        """Start the I/O thread and connect (handshake) to the daemon."""
        self._thread.start()
        self.client = self._post(
            AsyncClient.connect(self.connection_file, timeout_s=timeout_s, client_name="igi-sample-harness")
        ).result(timeout_s + 5)

    def start_npcs(
        self, plans: list[NpcPlan], times: SceneTimes, max_tokens: int, *, look_at_s: float | None = None
    ) -> None:
        """Open one session per NPC and start their scripted conversations; with ``look_at_s`` (the daemon serves a
        vision projector) the first NPC's first line from then on shows it the frame the game renders."""
        self._talk_end_s = times.talk_end_s
        look_at = look_at_s

        async def start() -> None:
            assert self.client is not None
            for i, plan in enumerate(plans):
                # every NPC answers "line, emotion, action" as JSON; the merchant can also hand items over
                tools = [GIVE_ITEM] if plan.persona.name == MERCHANT else []
                sid = await self.client.create_session(
                    plan.persona.name,
                    plan.persona.system_prompt,
                    sampling=Sampling(temperature=0.7, seed=1000 + i, max_tokens=max_tokens),
                    json_schema=SAY,
                    tools=tools,
                )
                shown = look_at if i == 0 else None
                self._npc_tasks.append(asyncio.create_task(self._converse(plan, sid, max_tokens, shown)))
            self._npc_tasks.append(asyncio.create_task(self._poll_status()))

        self._post(start()).result(self.timeout_s)

    def stop(self, *, shutdown_daemon: bool = True, requests_timeout_s: float = 10.0) -> None:
        """Wait for the game loop's requests still unanswered (``requests_timeout_s`` at most; one still unanswered
        then is cancelled and recorded as an error), cancel the conversations and in-flight generations, close the
        client, stop the I/O thread."""
        pending = list(self._requests.items())
        if pending:
            _, late = concurrent.futures.wait([f for f, _ in pending], timeout=requests_timeout_s)
            for future, name in pending:
                if future in late:
                    future.cancel()
                    self.rec.errors.append(f"{name}: unanswered {requests_timeout_s:g} s after the phase ended")

        async def stop() -> None:
            for task in self._npc_tasks:
                task.cancel()
            for task in self._npc_tasks:
                with contextlib.suppress(asyncio.CancelledError, IgiError, Exception):
                    await task
            if self.client is not None:
                if shutdown_daemon:
                    with contextlib.suppress(IgiError, asyncio.TimeoutError):
                        await self.client.shutdown(timeout_s=10.0)
                await self.client.close()

        with contextlib.suppress(Exception):
            self._post(stop()).result(30.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10.0)

    # --- per frame (called from the game loop thread, never blocks) -----------------------------------
    def frame_stats(self, work_ms: float, target_ms: float) -> bool:
        """Send frame_stats unless the previous one is still unanswered; apply any budget proposal.

        Returns:
            True if this frame time was sent; False if it was not (the previous request still in flight, or
            not connected): the caller keeps it in its window and reports it with the next send.
        """
        if self._stats_in_flight or self.client is None:
            return False
        self._stats_in_flight = True
        self._post_request(self._frame_stats(work_ms, target_ms), "frame_stats")
        return True

    async def _frame_stats(self, work_ms: float, target_ms: float) -> None:
        assert self.client is not None
        explicit_budgets = self._explicit_budgets
        try:
            reply = await self.client.frame_stats(work_ms, target_ms, timeout_s=5.0)
        except IgiError as exc:
            self.rec.errors.append(f"frame_stats: {type(exc).__name__}: {exc}")
            return
        finally:
            self._stats_in_flight = False
        t = self.now()
        th = reply.throttle
        if (
            th.sleep_ms_between_tokens != self.sleep_ms
            or th.tokens_per_frame != self.tokens_per_frame
            or not self.rec.throttle
        ):
            self.sleep_ms, self.tokens_per_frame = th.sleep_ms_between_tokens, th.tokens_per_frame
            self.rec.throttle.append(
                {
                    "t_s": round(t, 4),
                    "sleep_ms_between_tokens": self.sleep_ms,
                    "tokens_per_frame": self.tokens_per_frame,
                }
            )
        if explicit_budgets != self._explicit_budgets:  # the proposal is for the budget before the game's own: dropped
            return
        if reply.proposed_budget_mib is not None and reply.proposed_budget_mib != self.budget_mib:
            self.rec.event(t, "budget_proposal", proposed_mib=reply.proposed_budget_mib, from_mib=self.budget_mib)
            await self._set_budget(reply.proposed_budget_mib, "governor proposal", "budget_accepted")

    # --- scripted budget events -----------------------------------------------------------------------
    def reclaim(self, budget_mib: int) -> None:
        """Level load: urgently take VRAM back (reclaim_request, priority path)."""

        async def go() -> None:
            assert self.client is not None
            self._explicit_budgets += 1
            self.budget_mib = budget_mib  # as it goes out: a later ack of an earlier request must not undo it
            t = self.now()
            try:
                ack = await self.client.reclaim(budget_mib, deadline_s=1.0, timeout_s=self.timeout_s)
            except IgiError as exc:
                self.rec.errors.append(f"reclaim: {type(exc).__name__}: {exc}")
                return
            self._record_ack("reclaim", t, budget_mib, ack)

        self._post_request(go(), "reclaim")

    def restore(self, budget_mib: int) -> None:
        """Level loaded: give the VRAM back (set_budget_request)."""

        async def go() -> None:
            self._explicit_budgets += 1
            await self._set_budget(budget_mib, "level loaded: restore", "restore")

        self._post_request(go(), "restore")

    async def _set_budget(self, budget_mib: int, reason: str, kind: str) -> None:
        assert self.client is not None
        self.budget_mib = budget_mib  # as it goes out: a later ack of an earlier request must not undo it
        t = self.now()
        try:
            ack = await self.client.set_budget(budget_mib, reason, timeout_s=self.timeout_s)
        except IgiError as exc:
            self.rec.errors.append(f"set_budget: {type(exc).__name__}: {exc}")
            return
        self._record_ack(kind, t, budget_mib, ack)

    def _record_ack(self, kind: str, t: float, budget_mib: int, ack: BudgetAck) -> None:
        """One budget event from its ``budget_ack`` (sent at ``t``): what was granted and measured, and how long it took.
        ``held_after_s``: seconds until the budget held (the daemon acknowledges a change once its placement is in force,
        a shrink once it measures its memory within the budget, which may be before the new placement has loaded);
        None for a growth it deferred. ``interim``: the placement in force
        is one planned before that fits, the exact plan follows (protocol 1.3)."""
        ack_after_s = round(self.now() - t, 4)
        self.rec.event(
            t,
            kind,
            budget_mib=budget_mib,
            granted_mib=ack.granted_mib,
            applied=ack.applied,
            apply_time_s=round(ack.apply_time_s, 4),
            ack_after_s=ack_after_s,
            held_after_s=ack_after_s if ack.applied else None,
            interim=bool(ack.interim),
            measured_vram_mib=ack.measured_vram_mib,
            warning=ack.warning,
        )

    # --- background tasks -----------------------------------------------------------------------------
    async def _sleep_until(self, t_s: float) -> None:
        """Sleep until the scene clock reads ``t_s``.

        The clock is re-read after every wake-up: the phase resets ``t0`` when its first frame starts, after
        the NPCs were started, so a single sleep computed against the old ``t0`` would wake early.
        """
        while (left := t_s - self.now()) > 0:
            await asyncio.sleep(left)

    async def _converse(self, plan: NpcPlan, session_id: str, max_tokens: int, look_s: float | None = None) -> None:
        assert self.client is not None
        await self._sleep_until(plan.start_s)
        i = 0
        tool_result = None  # the game's answer to the NPC's last tool call: it continues the NPC's turn
        while self.now() < self._talk_end_s:
            line = "" if tool_result is not None else plan.lines[i % len(plan.lines)]
            image = None
            if look_s is not None and tool_result is None and self.now() >= look_s:  # mid-scene: show it the frame
                look_s, line = None, LOOK_LINE
                image = Image.rgb8(render_look_frame(*LOOK_SIZE), *LOOK_SIZE)
            t_req = self.now()
            row: dict[str, Any] = {"npc": plan.persona.name, "line": line, "t_request_s": round(t_req, 4)}
            if tool_result is not None:
                row["tool_result"] = tool_result.content
            if image is not None:
                row["image"] = {"format": image.format, "width": image.width, "height": image.height}
                self.rec.event(t_req, "frame_shown", npc=plan.persona.name, width=image.width, height=image.height)
            self.rec.replies.append(row)
            stream = self.client.generate(
                session_id,
                line,
                max_tokens=max_tokens,
                tool_result=tool_result,
                image=image,
                timeout_s=self.timeout_s,
            )
            tool_result = None
            self._streams.add(stream)
            self.rec.generating += 1
            n, first, last, parts = 0, None, None, []
            try:
                async for ev in stream:
                    t = self.now()
                    first = t if first is None else first
                    last = t
                    n += 1
                    parts.append(ev.text)
                    self.rec.token_times_s.append(t)
                    self.last_text = (self.last_text + ev.text)[-80:]
                result = await stream.result()
                row.update(
                    finish_reason=result.finish_reason,
                    ttft_s=result.ttft_s,
                    tps=round(result.tps, 3),
                    text=result.text,
                    reloads_during=result.reloads_during,
                )
                if result.tool_call is not None:  # the game runs the tool, and answers with its result
                    tool_result = self.world.give_item(result.tool_call)
                    row["tool_call"] = {"name": result.tool_call.name, "arguments": result.arguments}
                elif isinstance(result.parsed, dict):  # show the line, set the face and the animation
                    row["say"] = result.parsed
                    self.world.apply_reply(plan.persona.name, result.parsed)
            except (InvalidOutputError, InvalidToolArgumentsError) as exc:
                # max_tokens ended the JSON early: nothing to show or apply (the daemon kept no turn); go on
                row.update(finish_reason="cut", error=f"{type(exc).__name__}: {exc}")
            except Exception as exc:  # IgiError from the client, or anything unexpected: record it, go on
                row.update(finish_reason="error", error=f"{type(exc).__name__}: {exc}")
                self.rec.errors.append(f"{plan.persona.name}: {type(exc).__name__}: {exc}")
            finally:
                # a reply still streaming when the phase ends is cancelled here (asyncio.CancelledError from
                # stop()): it is kept as "unfinished" with its partial client-side timing, not dropped; the
                # daemon's ttft_s / tps come only with a final reply, so they stay null
                for key, value in (
                    ("finish_reason", "unfinished"),
                    ("ttft_s", None),
                    ("tps", None),
                    ("reloads_during", None),
                    ("text", "".join(parts)),
                ):
                    row.setdefault(key, value)
                self.rec.generating -= 1
                self._streams.discard(stream)
                row.update(
                    n_tokens=n,
                    t_end_s=round(self.now(), 4),
                    client_ttft_s=None if first is None else round(first - t_req, 4),
                    client_tps=round((n - 1) / (last - first), 3) if n >= 2 and last > first else None,
                )
            self.last_text = f"{plan.persona.name}: "
            await asyncio.sleep(plan.pauses_s[i % len(plan.pauses_s)])
            i += 1

    async def _poll_status(self, period_s: float = 0.5) -> None:
        assert self.client is not None
        while True:
            try:
                st = await self.client.status(timeout_s=10.0)
                self.rec.budget.append(
                    {
                        "t_s": round(self.now(), 4),
                        "vram_budget_mib": st.vram_budget_mib,
                        "vram_used_mib": st.vram_used_mib,
                        "plan_gpu_mib": None if st.plan is None else st.plan.gpu_mib,
                        "plan_strategy": None if st.plan is None else st.plan.strategy,
                        "queue_depth": st.queue_depth,
                        "game_budget_mib": self.budget_mib,
                    }
                )
            except IgiError as exc:
                self.rec.errors.append(f"status: {type(exc).__name__}: {exc}")
            await asyncio.sleep(period_s)
