"""Engine layer: render a GGUF's own ``tokenizer.chat_template`` (Jinja2, sandboxed, as HF does)."""

from __future__ import annotations

import datetime
import secrets
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from igi_sdk.errors import ModelUnsupportedError


def _raise_exception(message: str) -> None:
    raise ValueError(f"chat template error: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(template: str) -> Any:  # a jinja2.Template
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
    variables: Mapping[str, Any] | None = None,
) -> str:
    """Render ``messages`` (``{"role", "content"}`` dicts) with a model's chat template; ``variables`` are more
    template variables (``tools``, say: the template's own tool rendering).

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
        return str(
            _compile(template).render(
                **dict(variables or {}),
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=bos_token,
                eos_token=eos_token,
            )
        )
    except ValueError:
        raise
    except Exception as exc:  # jinja2.TemplateError and friends
        raise ValueError(f"chat template failed to render: {exc}") from exc


def render_chat_segments(
    template: str | None,
    messages: Sequence[Mapping[str, str]],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    variables: Mapping[str, Any] | None = None,
) -> list[tuple[str, bool]]:
    """Render ``messages`` like :func:`render_chat_template`, split into ``(text, is_content)`` segments: the
    messages' contents (``True``) between the template's own text (``False``), so a caller can tokenize the
    contents as plain text and parse control tokens only in the template's text.

    The contents are located by rendering each one as a unique placeholder; the segments hold the contents as
    given, at the positions the template put them (a template that filters a content, ``trim`` say, has its
    filter applied to the placeholder only). A content the template wrote through ``tojson`` (Llama 3.1 does, for a
    tool result) is found as its placeholder's JSON form, and its segment is the content in that form.

    Raises:
        ModelUnsupportedError: the model has no chat template.
        ValueError: the template rejected the conversation or failed to render.
    """
    contents = [str(m["content"]) for m in messages]
    tag = secrets.token_hex(6)
    marks = [f"\ue000{tag}{i}\ue001" for i in range(len(contents))]
    placeholder = [{**dict(m), "content": mark} for m, mark in zip(messages, marks, strict=True)]
    rendered = render_chat_template(
        template,
        placeholder,
        add_generation_prompt=add_generation_prompt,
        bos_token=bos_token,
        eos_token=eos_token,
        variables=variables,
    )
    segments: list[tuple[str, bool]] = []
    cursor = 0
    for mark, content in zip(marks, contents, strict=True):
        at = rendered.find(mark, cursor)
        found = mark
        if at < 0:  # written through tojson: the placeholder's characters escaped
            found = _json_inner(mark)
            at = rendered.find(found, cursor)
            content = _json_inner(content)
        if at < 0:  # the template left this message out: its text is nowhere in the prompt
            continue
        segments.append((rendered[cursor:at], False))
        segments.append((content, True))
        cursor = at + len(found)
    segments.append((rendered[cursor:], False))
    return [(text, is_content) for text, is_content in segments if text]


def _json_inner(text: str) -> str:
    """``text`` as Jinja's ``tojson`` writes a string, without the quotes."""
    from jinja2.utils import htmlsafe_json_dumps

    return str(htmlsafe_json_dumps(text))[1:-1]
