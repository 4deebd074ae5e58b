"""A conversation the model's chat template refuses (roles out of the order it enforces, a system role it does not
take) is that job's ``invalid_request``, answered by the worker, which goes on serving: a session file can carry such
turns, and the worker used to die on them, again at each of the session's generations.

The engine seam is a stand-in engine (nothing is decoded) and a stand-in template that raises as
``engine.chat.render_chat_template`` does; ``WorkerScheduler`` and the worker loop's command handling are real."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from igi_sdk.daemon.engine_process.main import _handle
from igi_sdk.daemon.engine_process.scheduler import WorkerScheduler
from igi_sdk.daemon.worker import protocol as wp


class Engine:
    placement = SimpleNamespace(n_seq_max=2)
    n_ctx_seq = 1024
    model_table = SimpleNamespace(n_embd=4)


class AlternatingTemplate:
    """Renders a token per character; refuses, as Gemma's and Mistral's templates do, roles that do not alternate."""

    def render_prompt(
        self, messages: Sequence[tuple[str, str]], images: Mapping[int, Any] | None = None, tools: str | None = None
    ) -> list[int]:
        roles = [role for role, _ in messages if role != "system"]
        if any(a == b for a, b in zip(roles, roles[1:])):
            raise ValueError("chat template error: Conversation roles must alternate user/assistant/user/assistant")
        return [1] + [5] * sum(len(text) for _, text in messages)

    def text_tokens(self, text: str) -> int:
        return len(text)

    def make_sampler(self, sampling: wp.JobSampling) -> None:
        return None


def test_a_conversation_the_template_refuses_is_the_jobs_invalid_request() -> None:
    events: list[wp.Event] = []
    worker = WorkerScheduler(AlternatingTemplate(), Engine(), events.append, max_prompt_tokens=400)  # type: ignore[arg-type]
    job = wp.Generate(
        job_id="mira-1",
        session_id="mira",
        messages=(("system", "You are Mira."), ("user", "Hello."), ("user", "Hello again.")),
        max_tokens=4,
    )
    _handle(job, worker, events.append, logging.getLogger("igi_sdk.daemon.worker"))  # returns: the worker goes on
    [failed] = events
    assert isinstance(failed, wp.Failed) and failed.job_id == "mira-1" and failed.code == "invalid_request"
    assert failed.detail == {"reason": "chat_template"} and "alternate" in failed.message
    assert not worker.has_work()
