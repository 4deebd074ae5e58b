"""Engine layer: render a GGUF's own ``tokenizer.chat_template`` (Jinja2, sandboxed, as HF does)."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from functools import lru_cache

from igi_sdk.errors import ModelUnsupportedError


def _raise_exception(message: str) -> None:
    raise ValueError(f"chat template error: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(template: str):  # type: ignore[no-untyped-def]  (jinja2.Template)
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


def render_chat_template(
    template: str | None,
    messages: Sequence[Mapping[str, str]],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
) -> str:
    """Render ``messages`` (``{"role", "content"}`` dicts) with a model's chat template.

    Raises:
        ModelUnsupportedError: the model has no chat template.
        ValueError: the template rejected the conversation (its ``raise_exception``) or failed to render.
    """
    if not template:
        raise ModelUnsupportedError("the model has no tokenizer.chat_template; format the prompt yourself")
    for m in messages:
        if "role" not in m or "content" not in m:
            raise ValueError(f"chat message needs 'role' and 'content': {dict(m)!r}")
    try:
        return str(_compile(template).render(
            messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
            bos_token=bos_token, eos_token=eos_token,
        ))
    except ValueError:
        raise
    except Exception as exc:  # jinja2.TemplateError and friends
        raise ValueError(f"chat template failed to render: {exc}") from exc
