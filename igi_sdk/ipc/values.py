"""IPC layer: nested value objects carried inside messages (sampling, limits, model, plan, usage, throttle).

Field order is wire order: the codec writes map keys exactly in the order the fields are declared here,
which is the order ``ipc/PROTOCOL.md`` lists them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from igi_sdk.ipc.wire_types import F64, INT64_MAX, U32, U63, NonNegF64, PosInt, ToolCallId, ToolName

MAX_STOP_STRINGS = 8
#: Longest JSON Schema text (a tool's ``parameters``, a ``json_schema`` field), code points.
MAX_SCHEMA_CHARS = 16_384
#: Longest tool description, code points.
MAX_TOOL_DESCRIPTION_CHARS = 1024
#: Longest tool result content, code points.
MAX_TOOL_RESULT_CHARS = 16_384


class WireModel(BaseModel):
    """Base of every wire object: frozen, unknown keys ignored (forward compatibility)."""

    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)


class Sampling(WireModel):
    """Sampling parameters of a session or of one generation (llama.cpp sampler vocabulary).

    Example:
        >>> Sampling(temperature=0.2, seed=7).top_k
        40
    """

    temperature: F64 = Field(default=0.7, ge=0.0, le=5.0, description="0 = greedy")
    top_p: F64 = Field(default=0.95, gt=0.0, le=1.0, description="nucleus sampling mass")
    top_k: U63 = Field(default=40, description="0 = disabled")
    seed: U32 | None = Field(default=None, description="uint32 RNG seed; nil = random")
    max_tokens: PosInt = Field(default=128, description="completion tokens per generation")
    stop: tuple[str, ...] = Field(default=(), max_length=MAX_STOP_STRINGS, description="stop strings")


class Limits(WireModel):
    """Limits the daemon enforces, announced in ``hello_reply``."""

    max_frame_bytes: int = Field(
        default=1_048_576, ge=1024, le=INT64_MAX, description="largest header or content frame"
    )
    max_prompt_tokens: PosInt = Field(default=4096, description="prompt tokens per generation incl. history")
    max_sessions: PosInt = Field(default=64, description="open NPC sessions across all clients")
    max_queue_depth: PosInt = Field(default=16, description="queued generate_requests before busy")
    priority_ageing_per_s: NonNegF64 = Field(
        default=0.0,
        description="1.4: priority points a queued generate_request gains per second it waits (section 6.5); "
        "0 = strict priority (a daemon older than 1.4)",
    )


class ModelInfo(WireModel):
    """The loaded model."""

    path: str = Field(description="absolute path of the GGUF file")
    architecture: str = Field(description="GGUF general.architecture, e.g. 'llama'")
    n_layer: U63 = Field(description="number of transformer blocks")
    n_params: U63 | None = Field(default=None, description="parameter count when known")
    file_mib: NonNegF64 = Field(description="GGUF file size, MiB")
    n_ctx: U63 = Field(description="context length the model was loaded with, tokens")


class Plan(WireModel):
    """Summary of the placement plan in force (or proposed)."""

    strategy: str = Field(description="planner strategy name, e.g. 'cpu_only', 'full_gpu', 'layer_split'")
    gpu_mib: NonNegF64 = Field(description="predicted device memory, MiB")
    cpu_mib: NonNegF64 = Field(description="predicted host memory, MiB")
    n_gpu_layers: U63 | None = Field(default=None, description="llama.cpp n_gpu_layers when the strategy uses it")
    summary: str = Field(default="", description="one human-readable line")


class Throttle(WireModel):
    """How the daemon paces token generation to protect the game's frame time."""

    tokens_per_frame: U63 | None = Field(default=None, description="max tokens per game frame; nil = unlimited")
    sleep_ms_between_tokens: NonNegF64 = Field(default=0.0, description="pause between two decoded tokens, ms")


class Usage(WireModel):
    """Token counts of one generation."""

    prompt_tokens: U63 = Field(description="tokens evaluated for the prompt (incl. cached history)")
    completion_tokens: U63 = Field(description="tokens generated")


class Tool(WireModel):
    """A tool an NPC session may call: its name, what it does, and the JSON Schema of its arguments (protocol 1.1).

    Example:
        >>> Tool(name="give_item", parameters='{"type": "object"}').description
        ''
    """

    name: ToolName = Field(description="1-64 chars of [A-Za-z0-9_-], starting with a letter or '_'")
    description: str = Field(
        default="", max_length=MAX_TOOL_DESCRIPTION_CHARS, description="what the tool does, for the model"
    )
    parameters: str = Field(
        default="{}", max_length=MAX_SCHEMA_CHARS, description="JSON Schema of the arguments object, as JSON text"
    )


class ToolCall(WireModel):
    """A tool call the NPC made (``generate_reply`` with ``finish_reason = "tool_call"``, protocol 1.1)."""

    id: ToolCallId = Field(description="the call's id; the tool_result that answers it names it")
    name: ToolName = Field(description="a tool the session registered")
    arguments: str = Field(description="JSON text of the arguments, valid against the tool's parameters schema")


class ToolResult(WireModel):
    """The game's answer to a tool call, continuing the NPC's turn (``generate_request.tool_result``, protocol 1.1)."""

    call_id: ToolCallId = Field(description="id of the tool_call answered")
    name: ToolName = Field(description="the tool called")
    content: str = Field(default="", max_length=MAX_TOOL_RESULT_CHARS, description="what the tool did, for the model")
