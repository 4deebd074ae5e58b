"""Test helper: chat templates in the style of the tool-calling families the daemon serves natively, and synthetic
GGUFs that carry them (``igi_sdk.synthetic``: meaningless weights, a real vocabulary and template).

The templates are written for these tests: they show the tools and the tool results the way each family does
(``igi_sdk.structured.tool_formats``), and nothing else of the real ones.
"""

from __future__ import annotations

from pathlib import Path

from igi_sdk.synthetic import SyntheticShape, write_synthetic_gguf

#: Hermes / Qwen style: ChatML turns, the tools in the system turn inside <tools>, calls in <tool_call> tags, tool
#: results as user turns inside <tool_response>.
HERMES_TEMPLATE = (
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n\nYou may call a function. Its signature is within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}"
    "{{ '\\n' }}</tools>\n\n"
    "To call it, answer with a JSON object within <tool_call></tool_call> XML tags:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "{% elif messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'user' or message.role == 'assistant' %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% elif message.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
HERMES_TOKENS = (
    ("<|im_start|>", "control"),
    ("<|im_end|>", "control"),
    ("<tool_call>", "user_defined"),
    ("</tool_call>", "user_defined"),
)

#: Llama 3.1 style: header tokens, the tools as JSON in the system turn (or the first user turn), calls as
#: {"name", "parameters"}, tool results as ipython turns written through tojson.
LLAMA3_TEMPLATE = (
    "{% if not tools_in_user_message is defined %}{% set tools_in_user_message = true %}{% endif %}"
    "{% if not tools is defined %}{% set tools = none %}{% endif %}"
    "{% if messages[0].role == 'system' %}"
    "{% set system_message = messages[0].content | trim %}{% set messages = messages[1:] %}"
    "{% else %}{% set system_message = '' %}{% endif %}"
    "{{ bos_token }}<|start_header_id|>system<|end_header_id|>\n\n"
    "{% if tools is not none %}Environment: ipython\n{{ '' }}{% endif %}"
    "{% if tools is not none and not tools_in_user_message %}"
    'Respond with a function call as JSON in the format {"name": function name, "parameters": dictionary of '
    "argument name and its value}.\n\n"
    "{% for t in tools %}{{ t | tojson(indent=4) }}{{ '\\n\\n' }}{% endfor %}"
    "{% endif %}"
    "{{ system_message }}<|eot_id|>"
    "{% if tools_in_user_message and tools is not none %}"
    "{% if messages | length != 0 %}"
    "{% set first_user_message = messages[0].content | trim %}{% set messages = messages[1:] %}"
    "{% else %}{{ raise_exception('Cannot put tools in the first user message when there is none!') }}"
    "{% endif %}"
    "<|start_header_id|>user<|end_header_id|>\n\n"
    "{% for t in tools %}{{ t | tojson(indent=4) }}{{ '\\n\\n' }}{% endfor %}"
    "{{ first_user_message }}<|eot_id|>"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'tool' or message.role == 'ipython' %}"
    "<|start_header_id|>ipython<|end_header_id|>\n\n"
    "{% if message.content is mapping or message.content is iterable %}{{ message.content | tojson }}"
    "{% else %}{{ message.content }}{% endif %}<|eot_id|>"
    "{% else %}"
    "<|start_header_id|>{{ message.role }}<|end_header_id|>\n\n{{ message.content | trim }}<|eot_id|>"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
LLAMA3_TOKENS = (
    ("<|start_header_id|>", "control"),
    ("<|end_header_id|>", "control"),
    ("<|eot_id|>", "control"),
    ("<|python_tag|>", "control"),
)

#: Mistral style ([AVAILABLE_TOOLS], [TOOL_CALLS]): recognised as no native format (the fallback serves it).
MISTRAL_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}"
    "{%- if message.role == 'user' %}"
    "{%- if tools and loop.last %}[AVAILABLE_TOOLS] {{ tools | tojson }}[/AVAILABLE_TOOLS]{%- endif %}"
    "[INST] {{ message.content }}[/INST]"
    "{%- elif message.role == 'tool_calls' or message.tool_calls is defined %}"
    "[TOOL_CALLS] {{ message.tool_calls | tojson }}{{ eos_token }}"
    "{%- elif message.role == 'assistant' %}{{ message.content }}{{ eos_token }}"
    "{%- endif %}{%- endfor %}"
)

#: Spaces as whole tokens (SentencePiece's U+2581): an indented tools prompt is not three byte tokens a space.
SPACE_TOKENS = (("\u2581", "normal"), ("\u2581\u2581", "normal"), ("\u2581\u2581\u2581\u2581", "normal"))
#: A shape that loads in a moment and holds a tools prompt (the vocabulary is bytes: about a token a character).
TOOLS_SHAPE = SyntheticShape(n_layer=1, n_embd=64, n_ff=128, n_head=4, n_head_kv=2, n_vocab=512, n_ctx_train=8192)


def hermes_gguf(path: Path) -> Path:
    """A synthetic model with the Hermes-style template (its end of turn: ``<|im_end|>``)."""
    return write_synthetic_gguf(
        path,
        TOOLS_SHAPE,
        chat_template=HERMES_TEMPLATE,
        added_tokens=HERMES_TOKENS + SPACE_TOKENS,
        eos_token="<|im_end|>",
    )


def llama3_gguf(path: Path) -> Path:
    """A synthetic model with the Llama-3.1-style template (its end of turn: ``<|eot_id|>``)."""
    return write_synthetic_gguf(
        path,
        TOOLS_SHAPE,
        chat_template=LLAMA3_TEMPLATE,
        added_tokens=LLAMA3_TOKENS + SPACE_TOKENS,
        eos_token="<|eot_id|>",
    )
