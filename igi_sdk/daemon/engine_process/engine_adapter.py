"""Daemon layer (worker process): ``LlamaEngine`` with what the worker's scheduler needs beside batching.

Renders prompts with the GGUF's own chat template, makes a sampler per generation from the daemon's sampling
settings, and applies the daemon's placement overrides (context size, threads) to what the engine loads.

A template with native tool support (``structured.tool_formats``) is found at load (``tool_format``, reported in
``Ready``): a job that carries ``tools`` is rendered with them in the template's ``tools`` variable, and its ``tool``
messages (a session's tool results) go to the template as ``tool`` messages, each followed by the player's line that
came with it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

# llama.cpp is loaded before numpy (docs/engine.md, "Load order"): the other order segfaults on CUDA builds.
from igi_sdk.engine.llama_engine import LlamaEngine  # isort: skip

from igi_sdk.daemon.worker.protocol import JobSampling  # isort: skip
from igi_sdk.engine.cache_base import WeightCacheHost
from igi_sdk.engine.sampler import Sampler
from igi_sdk.ipc.values import ModelInfo
from igi_sdk.planner.placement import Placement
from igi_sdk.structured.tool_formats import (
    FORMATS,
    ROLE_TOOL,
    detect_tool_format,
    split_tool_turn,
    template_tools,
    tool_turn,
)
from igi_sdk.structured.tools import ToolSpec

if TYPE_CHECKING:
    from igi_sdk.engine.vision import EncodedImage

MIB = 1024 * 1024


class EngineAdapter:
    """The worker's engine: a ``LlamaEngine`` and the daemon-side conventions around it.

    Args:
        model_path: GGUF file.
        placement: what to load (``n_ctx`` and the threads are overridden).
        n_ctx: context size, tokens (overrides the placement's).
        n_threads: decode threads (None = llama.cpp default).
        weight_cache_device: weights as a cache of their host copy on this device (``LlamaEngine``'s).
        weight_cache_host: that host copy, pinned or mapped (``LlamaEngine``'s).
    """

    def __init__(
        self,
        model_path: str,
        placement: Placement,
        n_ctx: int,
        n_threads: int | None,
        weight_cache_device: str | None = None,
        weight_cache_host: WeightCacheHost = "pinned",
    ) -> None:
        self._overrides: dict[str, Any] = {"n_ctx": n_ctx}
        if n_threads is not None:
            self._overrides.update(n_threads=n_threads, n_threads_batch=n_threads)
        self._engine = LlamaEngine(
            model_path,
            self.overridden(placement),
            weight_cache_device=weight_cache_device,
            weight_cache_host=weight_cache_host,
        )
        self._tools_text: str | None = None
        self._tools_value: Any = None

    @property
    def llama_engine(self) -> LlamaEngine:
        """The wrapped engine (the batch scheduler drives it directly)."""
        return self._engine

    def overridden(self, placement: Placement) -> Placement:
        """``placement`` with the daemon's context size and threads: what the engine loads."""
        return placement.with_(**self._overrides)

    def model_info(self) -> tuple[ModelInfo, int]:
        """The loaded model and its file's size in bytes, for the ``Ready`` event."""
        table = self._engine.model_table
        file_bytes = Path(table.path).stat().st_size
        n_params = sum(_n_elements(t.shape) for t in table.tensors)
        info = ModelInfo(
            path=str(Path(table.path).resolve()),
            architecture=table.architecture,
            n_layer=table.n_layer,
            n_params=n_params,
            file_mib=file_bytes / MIB,
            n_ctx=self._engine.n_ctx,
        )
        return info, file_bytes

    @cached_property
    def tool_format(self) -> str | None:
        """The native tool format of the model's chat template (``structured.tool_formats``), None for the fallback:
        detected from the template's text, then confirmed by rendering a probe tool, a call and its result (a template
        that does not show the tool, or refuses the conversation, gets the fallback)."""
        name = detect_tool_format(self._engine.chat_template)
        if name is None:
            return None
        probe = ToolSpec("igi_probe_tool", "", {"type": "object"})
        tools = json.dumps(template_tools([probe]))
        call = FORMATS[name].open + '{"name": "igi_probe_tool", "' + FORMATS[name].args_key + '": {}}'
        try:
            first = self._engine.apply_chat_template(
                self._template_messages([("system", "s"), ("user", "u")]), variables=self._variables(name, tools)
            )
            self._engine.apply_chat_template(
                self._template_messages(
                    [
                        ("user", "u"),
                        ("assistant", call + FORMATS[name].close),
                        (ROLE_TOOL, tool_turn("igi_probe_tool", "ok")),
                    ]
                ),
                variables=self._variables(name, tools),
            )
        except Exception:  # a template that refuses tools or tool messages: the fallback serves it
            return None
        return name if "igi_probe_tool" in first else None

    def _variables(self, name: str | None, tools: str | None) -> dict[str, Any] | None:
        """The template variables of a native rendering (None: none)."""
        if tools is None or name is None:
            return None
        if tools != self._tools_text:  # a job's prompt window renders several times: the tools parsed once
            self._tools_text, self._tools_value = tools, json.loads(tools)
        return {"tools": self._tools_value, **FORMATS[name].variables}

    @staticmethod
    def _template_messages(messages: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
        out = []
        for role, content in messages:
            if role != ROLE_TOOL:
                out.append({"role": role, "content": content})
                continue
            try:
                _name, result, text = split_tool_turn(content)
            except ValueError:
                result, text = content, ""
            out.append({"role": ROLE_TOOL, "content": result})
            if text:
                out.append({"role": "user", "content": text})
        return out

    def render_prompt(
        self,
        messages: Sequence[tuple[str, str]],
        images: Mapping[int, EncodedImage] | None = None,
        *,
        tools: str | None = None,
    ) -> list[int]:
        """Chat-template the messages and tokenize the result (the contents as text: ``LlamaEngine.tokenize_chat``),
        with ``images[i]`` in front of message ``i``'s text (``engine.vision.render_with_images``). ``tools`` (the
        JSON of ``tool_formats.template_tools``) renders them with the template's own tool support, and ``tool``
        messages as the template's tool results."""
        variables = self._variables(self.tool_format, tools)
        if any(role == ROLE_TOOL for role, _text in messages):  # a tool turn may become two template messages
            expanded: list[tuple[str, str]] = []
            at: dict[int, EncodedImage] = {}
            for i, (role, content) in enumerate(messages):
                if images and i in images:
                    at[len(expanded)] = images[i]
                expanded += [(m["role"], m["content"]) for m in self._template_messages([(role, content)])]
            messages, images = expanded, at
        if images:
            from igi_sdk.engine.vision import render_with_images

            return render_with_images(self._engine, messages, images, variables=variables)
        return self._engine.tokenize_chat(
            [{"role": role, "content": content} for role, content in messages], variables=variables
        )

    def text_tokens(self, text: str) -> int:
        """Tokens of one message's text on its own, tokenized as text (as ``render_prompt`` tokenizes contents)."""
        return len(self._engine.tokenize(text, add_special=False, parse_special=False))

    def make_sampler(self, sampling: JobSampling) -> Sampler:
        """A sampler for one generation (seed None = random)."""
        seed = sampling.seed
        return Sampler(
            temperature=float(sampling.temperature),
            top_p=float(sampling.top_p),
            top_k=int(sampling.top_k),
            seed=random.getrandbits(32) if seed is None else int(seed),
        )

    def close(self) -> None:
        """Free the model."""
        self._engine.close()


def _n_elements(shape: Sequence[int]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n
