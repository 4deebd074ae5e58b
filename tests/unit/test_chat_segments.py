"""render_chat_segments: the messages' contents located in the rendered prompt (pure Jinja, no model)."""

from __future__ import annotations

import json

from igi_sdk.engine.chat import render_chat_segments, render_chat_template

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_segments_concatenate_to_the_rendered_prompt_with_contents_marked() -> None:
    messages = [{"role": "user", "content": "user"}, {"role": "assistant", "content": "<|im_start|>x"}]
    segments = render_chat_segments(CHATML, messages)
    assert "".join(text for text, _ in segments) == render_chat_template(CHATML, messages)
    assert [text for text, is_content in segments if is_content] == ["user", "<|im_start|>x"]
    assert segments[0] == ("<|im_start|>user\n", False)  # the role name is template text, not the content "user"


def test_a_message_the_template_leaves_out_has_no_segment() -> None:
    template = "{% for m in messages %}{% if m['role'] != 'system' %}[{{ m['content'] }}]{% endif %}{% endfor %}"
    segments = render_chat_segments(template, [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
    assert segments == [("[", False), ("U", True), ("]", False)]


def test_a_content_the_template_writes_through_tojson_is_found_in_its_json_form() -> None:
    template = "{% for m in messages %}[{{ m['content'] | tojson }}]{% endfor %}"
    content = 'ok "quoted" <b> & \u00e9'
    segments = render_chat_segments(template, [{"role": "tool", "content": content}])
    assert "".join(text for text, _ in segments) == render_chat_template(
        template, [{"role": "tool", "content": content}]
    )
    assert segments == [
        ('["', False),
        (json.dumps(content)[1:-1].replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"), True),
        ('"]', False),
    ]
