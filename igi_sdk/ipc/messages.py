"""IPC layer: one frozen pydantic model per wire message type, and the type registry.

Field order is wire order. The ``type`` field is the discriminator; on the wire it travels in the
header only (the content map never repeats it). See ``ipc/PROTOCOL.md`` for the normative text.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BeforeValidator, Field, model_validator

from igi_sdk.ipc.error_codes import ErrorCode, parse_error_code
from igi_sdk.ipc.images import Image
from igi_sdk.ipc.values import (
    MAX_SCHEMA_CHARS,
    Limits,
    ModelInfo,
    Plan,
    Sampling,
    Throttle,
    Tool,
    ToolCall,
    ToolResult,
    Usage,
    WireModel,
)
from igi_sdk.ipc.wire_types import (
    I64,
    INT64_MAX,
    U63,
    CounterMap,
    FinishReason,
    FreeMap,
    MsgId,
    NonNegF64,
    Pct,
    PosInt,
    SessionId,
    VersionStr,
)

Kind = Literal["request", "reply", "event"]
PRIORITY_MIN, PRIORITY_MAX = -100, 100
Priority = Annotated[int, Field(ge=PRIORITY_MIN, le=PRIORITY_MAX)]
MAX_TEXT_CHARS = 65_536
#: Longest GBNF grammar text, code points (protocol 1.1).
MAX_GRAMMAR_CHARS = 65_536
#: Most tools one session registers (protocol 1.1).
MAX_TOOLS = 32
#: Most budget levels one ``set_budget_request.levels_mib`` declares (protocol 1.3).
MAX_BUDGET_LEVELS = 16
#: ``generate_request.tool_choice`` values other than a tool name (protocol 1.1); nil = "auto".
TOOL_CHOICES = ("auto", "none", "required")

GrammarText = Annotated[str, Field(min_length=1, max_length=MAX_GRAMMAR_CHARS)]
SchemaText = Annotated[str, Field(min_length=1, max_length=MAX_SCHEMA_CHARS)]
ToolChoice = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$")]


class Message(WireModel):
    """Base of every message. Subclasses set ``type`` and the class-level protocol attributes.

    Attributes:
        KIND: "request", "reply" (terminal) or "event" (non-terminal).
        REQUIRES_SESSION: the header's ``session_id`` must be set (requests about one NPC session).
        PRIORITY: served by the daemon's I/O loop immediately, never queued, never answered ``busy``.
    """

    KIND: ClassVar[Kind] = "request"
    REQUIRES_SESSION: ClassVar[bool] = False
    PRIORITY: ClassVar[bool] = False
    type: str


# --- handshake ---------------------------------------------------------------------------------------
class HelloRequest(Message):
    """First message of a client: identifies it and negotiates the protocol version."""

    type: Literal["hello_request"] = "hello_request"
    client_name: str = Field(max_length=256, description="e.g. 'unity-plugin'")
    client_version: str = Field(max_length=64, description="client software version")
    protocol_version: VersionStr = Field(description="protocol version the client speaks, 'major.minor'")
    capabilities: tuple[str, ...] = Field(
        default=(), max_length=64, description="optional features the client supports"
    )


class HelloReply(Message):
    """The daemon's answer to hello: versions, timing rules, limits and the loaded model."""

    KIND: ClassVar[Kind] = "reply"
    type: Literal["hello_reply"] = "hello_reply"
    daemon_version: str = Field(description="igi_sdk version of the daemon")
    protocol_version: VersionStr = Field(description="protocol version the daemon speaks")
    capabilities: tuple[str, ...] = Field(default=(), description="optional features the daemon supports")
    heartbeat_interval_s: NonNegF64 = Field(description="client sends heartbeat_request this often, s")
    client_timeout_s: NonNegF64 = Field(description="silence after which a peer is declared gone, s")
    limits: Limits = Field(description="limits the daemon enforces")
    model: ModelInfo | None = Field(description="loaded model, nil if none")


# --- model and budget --------------------------------------------------------------------------------
class LoadModelRequest(Message):
    """Load (or replace) the model."""

    type: Literal["load_model_request"] = "load_model_request"
    model_path: str | None = Field(default=None, description="GGUF path; nil = the embedded default model")
    n_ctx: int = Field(default=2048, ge=16, le=INT64_MAX, description="context length, tokens")
    vram_budget_mib: U63 | None = Field(default=None, description="new VRAM budget, MiB; nil = keep the current one")
    mmproj_path: str | None = Field(
        default=None, description="1.1: vision projector (mmproj GGUF) beside the model; nil = none (no vision)"
    )


class LoadModelReply(Message):
    """The model is loaded under the returned plan."""

    KIND: ClassVar[Kind] = "reply"
    type: Literal["load_model_reply"] = "load_model_reply"
    model: ModelInfo
    plan: Plan


class SetBudgetRequest(Message):
    """Change the VRAM budget the game allows the daemon."""

    type: Literal["set_budget_request"] = "set_budget_request"
    vram_budget_mib: U63 = Field(description="VRAM the game allows us, MiB (0 = CPU only)")
    reason: str = Field(default="", max_length=256, description="free text for logs, e.g. 'entering combat'")
    levels_mib: tuple[U63, ...] | None = Field(
        default=None,
        max_length=MAX_BUDGET_LEVELS,
        description="1.3: the budget levels the game will ask for, MiB, planned ahead by the daemon; "
        "nil = the levels declared before stay, [] = none",
    )


class ReclaimRequest(Message):
    """Urgently shrink VRAM use to ``vram_budget_mib`` within ``deadline_s`` (priority path)."""

    PRIORITY: ClassVar[bool] = True
    type: Literal["reclaim_request"] = "reclaim_request"
    vram_budget_mib: U63 = Field(description="VRAM the daemon may keep, MiB")
    deadline_s: NonNegF64 = Field(description="time the game can wait, s from receipt")


class BudgetAck(Message):
    """Terminal reply of set_budget_request and reclaim_request."""

    KIND: ClassVar[Kind] = "reply"
    type: Literal["budget_ack"] = "budget_ack"
    requested_mib: U63 = Field(description="the budget asked for, MiB")
    granted_mib: U63 = Field(description="the budget the daemon now honours, MiB (<= requested_mib)")
    applied: bool = Field(description="the plan is in force now (False: deferred until idle)")
    cpu_fallback: bool = Field(description="the plan runs fully on the CPU")
    plan: Plan
    predicted_ttft_s: NonNegF64 = Field(description="predicted time to first token, s")
    predicted_tps: NonNegF64 = Field(description="predicted decode speed, tokens/s")
    apply_time_s: NonNegF64 = Field(description="time spent applying the plan (reload), s")
    measured_vram_mib: NonNegF64 | None = Field(description="device memory in use after applying, MiB; nil = no GPU")
    warning: str | None = Field(default=None, description="e.g. 'deadline_missed'")
    interim: bool | None = Field(
        default=None,
        description="1.3: true = a placement planned ahead that fits the budget is in force; the exact plan for it "
        "follows in the background, without another reply; nil = false",
    )


class FrameStatsRequest(Message):
    """The game's frame timing, so the daemon can pace generation."""

    type: Literal["frame_stats_request"] = "frame_stats_request"
    frame_time_ms: NonNegF64 = Field(description="last frame time, ms")
    target_frame_time_ms: NonNegF64 = Field(description="frame time the game aims for, ms")
    free_vram_mib: NonNegF64 | None = Field(default=None, description="free device memory seen by the game, MiB")
    gpu_busy_pct: Pct | None = Field(default=None, description="GPU utilisation seen by the game, %")


class FrameStatsReply(Message):
    """The pacing the daemon applies now, and optionally a budget it would like."""

    KIND: ClassVar[Kind] = "reply"
    type: Literal["frame_stats_reply"] = "frame_stats_reply"
    throttle: Throttle
    proposed_budget_mib: U63 | None = Field(default=None, description="budget the daemon suggests, MiB; nil = none")


# --- sessions ----------------------------------------------------------------------------------------
class CreateSessionRequest(Message):
    """Open an NPC session (persona, system prompt, default sampling)."""

    type: Literal["create_session_request"] = "create_session_request"
    persona: str = Field(max_length=256, description="NPC name or role")
    system_prompt: str = Field(max_length=MAX_TEXT_CHARS, description="system message of the chat template")
    sampling: Sampling = Field(default_factory=Sampling)
    priority: Priority = Field(default=0, description="-100..100, higher is served first")
    grammar: GrammarText | None = Field(default=None, description="1.1: default GBNF grammar of the session's replies")
    json_schema: SchemaText | None = Field(
        default=None, description="1.1: default JSON Schema (JSON text) of the replies"
    )
    tools: tuple[Tool, ...] = Field(default=(), max_length=MAX_TOOLS, description="1.1: tools the NPC may call")

    @model_validator(mode="after")
    def _one_constraint_distinct_tools(self) -> CreateSessionRequest:
        _at_most_one_constraint(self.grammar, self.json_schema)
        names = [tool.name for tool in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be distinct: {names}")
        return self


class CreateSessionReply(Message):
    """The new session; its id is also in the reply header's ``session_id``."""

    KIND: ClassVar[Kind] = "reply"
    type: Literal["create_session_reply"] = "create_session_reply"
    session_id: SessionId


class CloseSessionRequest(Message):
    """Close the header's session and free its KV state."""

    REQUIRES_SESSION: ClassVar[bool] = True
    type: Literal["close_session_request"] = "close_session_request"


class CloseSessionReply(Message):
    """The session is closed."""

    KIND: ClassVar[Kind] = "reply"
    type: Literal["close_session_reply"] = "close_session_reply"


class GenerateRequest(Message):
    """One player line for the header's session; answered by token_events then generate_reply."""

    REQUIRES_SESSION: ClassVar[bool] = True
    type: Literal["generate_request"] = "generate_request"
    text: str = Field(max_length=MAX_TEXT_CHARS, description="the player's line (user turn)")
    max_tokens: PosInt | None = Field(default=None, description="nil = session default")
    sampling: Sampling | None = Field(default=None, description="nil = session default")
    priority: Priority | None = Field(default=None, description="nil = session priority")
    grammar: GrammarText | None = Field(
        default=None, description="1.1: GBNF grammar of this reply; nil = session default"
    )
    json_schema: SchemaText | None = Field(
        default=None, description="1.1: JSON Schema of this reply; nil = session default"
    )
    tool_choice: ToolChoice | None = Field(
        default=None, description="1.1: 'auto' (nil), 'none', 'required' or a tool name"
    )
    tool_result: ToolResult | None = Field(default=None, description="1.1: the game's answer to the last tool_call")
    image: Image | None = Field(default=None, description="1.1: an image the NPC is shown with this line")

    @model_validator(mode="after")
    def _one_constraint(self) -> GenerateRequest:
        _at_most_one_constraint(self.grammar, self.json_schema)
        return self


def _at_most_one_constraint(grammar: str | None, json_schema: str | None) -> None:
    if grammar is not None and json_schema is not None:
        raise ValueError("set at most one of grammar and json_schema")


class TokenEvent(Message):
    """One generated token (non-terminal)."""

    KIND: ClassVar[Kind] = "event"
    type: Literal["token_event"] = "token_event"
    index: U63 = Field(description="0-based position in this generation's output")
    text: str = Field(description="detokenized piece (may be empty when a UTF-8 sequence is incomplete)")
    token_id: I64 = Field(description="vocabulary id")


class GenerateReply(Message):
    """Terminal reply of generate_request."""

    KIND: ClassVar[Kind] = "reply"
    type: Literal["generate_reply"] = "generate_reply"
    finish_reason: FinishReason
    text: str = Field(description="the full completion (concatenation of the token texts)")
    usage: Usage
    ttft_s: NonNegF64 | None = Field(description="time to first token, s; nil if no token was produced")
    tps: NonNegF64 = Field(description="decode speed, tokens/s (0 if fewer than 2 tokens)")
    reloads_during: U63 = Field(default=0, description="model reloads (budget changes) while this generation ran")
    json_output: str | None = Field(default=None, description="1.1: the reply's JSON text, valid against the schema")
    tool_call: ToolCall | None = Field(default=None, description="1.1: the call, when finish_reason is 'tool_call'")


class CancelRequest(Message):
    """Cancel a queued or running generate_request (priority path)."""

    PRIORITY: ClassVar[bool] = True
    type: Literal["cancel_request"] = "cancel_request"
    target_msg_id: MsgId = Field(description="msg_id of the generate_request to cancel")


class CancelReply(Message):
    """Whether the target was found queued or running and is now cancelled."""

    KIND: ClassVar[Kind] = "reply"
    type: Literal["cancel_reply"] = "cancel_reply"
    cancelled: bool


class SaveSessionRequest(Message):
    """Persist the header's session (history + KV state) to a file."""

    REQUIRES_SESSION: ClassVar[bool] = True
    type: Literal["save_session_request"] = "save_session_request"
    path: str | None = Field(default=None, description="file path; nil = the daemon's sessions directory")


class SaveSessionReply(Message):
    """Where the session was saved."""

    KIND: ClassVar[Kind] = "reply"
    type: Literal["save_session_reply"] = "save_session_reply"
    path: str


class LoadSessionRequest(Message):
    """Restore a saved session as a new open session."""

    type: Literal["load_session_request"] = "load_session_request"
    path: str


class LoadSessionReply(Message):
    """The restored session."""

    KIND: ClassVar[Kind] = "reply"
    type: Literal["load_session_reply"] = "load_session_reply"
    session_id: SessionId
    n_turns: U63 = Field(description="conversation turns restored")


# --- daemon ------------------------------------------------------------------------------------------
class StatusRequest(Message):
    """Ask for the daemon's state."""

    type: Literal["status_request"] = "status_request"


class StatusReply(Message):
    """The daemon's state."""

    KIND: ClassVar[Kind] = "reply"
    type: Literal["status_reply"] = "status_reply"
    model: ModelInfo | None
    vram_budget_mib: U63 | None = Field(description="budget in force, MiB; nil = never set")
    plan: Plan | None
    vram_used_mib: NonNegF64 | None = Field(description="device memory in use, MiB; nil = no GPU")
    n_sessions: U63 = Field(description="open sessions")
    queue_depth: U63 = Field(description="generate_requests waiting for a batch slot")
    counters: CounterMap = Field(default_factory=dict, description="named counters, keys sorted")
    uptime_s: NonNegF64


class HeartbeatRequest(Message):
    """Liveness probe; answered from the I/O loop."""

    PRIORITY: ClassVar[bool] = True
    type: Literal["heartbeat_request"] = "heartbeat_request"


class HeartbeatReply(Message):
    """Liveness answer."""

    KIND: ClassVar[Kind] = "reply"
    type: Literal["heartbeat_reply"] = "heartbeat_reply"
    uptime_s: NonNegF64


class ShutdownRequest(Message):
    """Ask the daemon to cancel all work, free memory and exit."""

    type: Literal["shutdown_request"] = "shutdown_request"


class ShutdownReply(Message):
    """Sent before the daemon exits."""

    KIND: ClassVar[Kind] = "reply"
    type: Literal["shutdown_reply"] = "shutdown_reply"


class ErrorReply(Message):
    """Terminal reply of any request that failed."""

    KIND: ClassVar[Kind] = "reply"
    type: Literal["error_reply"] = "error_reply"
    code: Annotated[ErrorCode, BeforeValidator(parse_error_code)]
    message: str = Field(description="human-readable, for logs")
    detail: FreeMap | None = Field(default=None, description="structured detail, keys sorted; nil = none")
    retryable: bool = Field(default=False, description="the same request may succeed later")


Request = Annotated[
    HelloRequest
    | LoadModelRequest
    | SetBudgetRequest
    | ReclaimRequest
    | FrameStatsRequest
    | CreateSessionRequest
    | CloseSessionRequest
    | GenerateRequest
    | CancelRequest
    | SaveSessionRequest
    | LoadSessionRequest
    | StatusRequest
    | HeartbeatRequest
    | ShutdownRequest,
    Field(discriminator="type"),
]
Reply = Annotated[
    HelloReply
    | LoadModelReply
    | BudgetAck
    | FrameStatsReply
    | CreateSessionReply
    | CloseSessionReply
    | GenerateReply
    | CancelReply
    | SaveSessionReply
    | LoadSessionReply
    | StatusReply
    | HeartbeatReply
    | ShutdownReply
    | ErrorReply
    | TokenEvent,
    Field(discriminator="type"),
]

#: Every message type in spec order: wire ``type`` string -> model class.
MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.model_fields["type"].default: cls
    for cls in (
        HelloRequest,
        HelloReply,
        LoadModelRequest,
        LoadModelReply,
        SetBudgetRequest,
        ReclaimRequest,
        BudgetAck,
        FrameStatsRequest,
        FrameStatsReply,
        CreateSessionRequest,
        CreateSessionReply,
        CloseSessionRequest,
        CloseSessionReply,
        GenerateRequest,
        TokenEvent,
        GenerateReply,
        CancelRequest,
        CancelReply,
        SaveSessionRequest,
        SaveSessionReply,
        LoadSessionRequest,
        LoadSessionReply,
        StatusRequest,
        StatusReply,
        HeartbeatRequest,
        HeartbeatReply,
        ShutdownRequest,
        ShutdownReply,
        ErrorReply,
    )
}

#: Request type -> the type of its successful terminal reply (``error_reply`` can end any request).
TERMINAL_REPLY: dict[str, str] = {
    "hello_request": "hello_reply",
    "load_model_request": "load_model_reply",
    "set_budget_request": "budget_ack",
    "reclaim_request": "budget_ack",
    "frame_stats_request": "frame_stats_reply",
    "create_session_request": "create_session_reply",
    "close_session_request": "close_session_reply",
    "generate_request": "generate_reply",
    "cancel_request": "cancel_reply",
    "save_session_request": "save_session_reply",
    "load_session_request": "load_session_reply",
    "status_request": "status_reply",
    "heartbeat_request": "heartbeat_reply",
    "shutdown_request": "shutdown_reply",
}

#: Request types served on the priority path (immediately by the I/O loop, never queued, never ``busy``).
PRIORITY_TYPES: frozenset[str] = frozenset(name for name, cls in MESSAGE_TYPES.items() if cls.PRIORITY)

__all__ = [
    "BudgetAck",
    "CancelReply",
    "CancelRequest",
    "CloseSessionReply",
    "CloseSessionRequest",
    "CreateSessionReply",
    "CreateSessionRequest",
    "ErrorReply",
    "FinishReason",
    "FrameStatsReply",
    "FrameStatsRequest",
    "GenerateReply",
    "GenerateRequest",
    "HeartbeatReply",
    "HeartbeatRequest",
    "HelloReply",
    "HelloRequest",
    "Kind",
    "LoadModelReply",
    "LoadModelRequest",
    "LoadSessionReply",
    "LoadSessionRequest",
    "MESSAGE_TYPES",
    "Message",
    "PRIORITY_TYPES",
    "Reply",
    "ReclaimRequest",
    "Request",
    "SaveSessionReply",
    "SaveSessionRequest",
    "SetBudgetRequest",
    "ShutdownReply",
    "ShutdownRequest",
    "StatusReply",
    "StatusRequest",
    "TERMINAL_REPLY",
    "TOOL_CHOICES",
    "TokenEvent",
]
