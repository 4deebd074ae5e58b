"""Daemon configuration: the ONE settings model (TOML file, ``IGI_*`` environment, CLI flags).

Precedence, highest first (stated here once, tested in ``tests/unit/test_config.py``):

1. CLI flags / keyword arguments (``DaemonSettings(...)``, ``load_settings(cli=...)``)
2. environment variables ``IGI_<SECTION>__<FIELD>`` (for example ``IGI_IPC__PORT=5555``)
3. the TOML file given with ``--config PATH`` (sections ``[ipc]``, ``[limits]``, ...)
4. the defaults below

Every leaf field name is unique across sections, so the CLI flag is the field name with dashes
(``--vram-budget-mib``) and ``docs/config.md`` is generated from this model by :func:`settings_reference_markdown`.
No other module reads ``os.environ`` for configuration.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from igi_sdk.files import read_regular_file
from igi_sdk.planner.placement import MAX_N_CTX, OP_OFFLOAD_MIN_BATCH, KvCacheType, Placement
from igi_sdk.policy.governor_params import GovernorParams

WEIGHT_CACHE_AUTO = "auto"
"""``engine.weight_cache_device``: the worker's first GPU device, where it has one."""

MIN_N_CTX_PER_SEQ = 64
"""Tokens each sequence's share of the context (``n_ctx / n_seq_max``) holds at least: below it no prompt beside a
reply would fit."""

_TOML_FILE: contextvars.ContextVar[Path | None] = contextvars.ContextVar("igi_toml_file", default=None)


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class IpcSettings(_Section):
    """Where the daemon listens and how it judges client liveness."""

    transport: Literal["auto", "tcp", "ipc"] = Field(
        default="auto",
        description="ZeroMQ transport: auto (ipc in a private 0700 directory on Linux and macOS, tcp elsewhere), "
        "tcp (loopback) or ipc",
    )
    zmq_mechanism: Literal["plain", "null"] = Field(
        default="plain",
        description="ZeroMQ handshake authentication: plain (a credential derived from the launch key; a peer without "
        "it is refused before it can send a message) or null (none: serves clients older than protocol 1.2)",
    )
    ip: str = Field(default="127.0.0.1", description="bind address for tcp; must be a loopback address")
    port: int = Field(
        default=0, ge=0, le=65535, description="tcp port; 0 picks a free port (written to the connection file)"
    )
    ipc_path: Path | None = Field(
        default=None,
        description="socket path for transport=ipc (default: daemon.sock in a new 0700 directory of the temp dir)",
    )
    connection_file: Path | None = Field(
        default=None,
        description="where to write the connection file (JSON, mode 0600); default: runtime dir/igi-daemon-PID.json",
    )
    replay_window_s: float = Field(
        default=300.0,
        gt=0,
        description="a message whose sent_at is further than this from the daemon's clock, or whose msg_id it saw "
        "within it, is refused as replayed, seconds",
    )
    replay_max_entries: int = Field(
        default=65536,
        ge=1,
        description="message ids the replay window remembers, stamped at or before the daemon's clock; past it the "
        "earliest-stamped is forgotten and nothing stamped at or before it is accepted",
    )
    heartbeat_interval_s: float = Field(
        default=2.0, gt=0, description="heartbeat period advertised to clients, seconds"
    )
    client_timeout_s: float = Field(
        default=10.0, gt=0, description="a client silent this long is gone: its generations are cancelled, seconds"
    )
    session_ttl_s: float = Field(
        default=60.0,
        ge=0,
        description="sessions of a gone client are kept this long for reconnection, seconds (0 = close at once)",
    )
    exit_with_pid: int | None = Field(
        default=None,
        gt=0,
        description="shut down in order (as on SIGTERM) once this process exits: the game that launched the daemon, "
        "so that a game that crashes or is killed does not leave it running (the plugins' launchers pass their own "
        "pid); a pid not running at start is an error",
    )

    @field_validator("ip")
    @classmethod
    def _loopback_only(cls, value: str) -> str:
        if value not in ("127.0.0.1", "localhost", "::1"):  # the hosts the transport binds (ipc/transport.py)
            raise ValueError(f"the daemon binds loopback only (127.0.0.1, localhost or ::1), got ip={value!r}")
        return "127.0.0.1" if value == "localhost" else value


class LimitSettings(_Section):
    """Hard limits on what a client may ask; exceeding one gets a typed too_large / busy error."""

    max_frame_bytes: int = Field(
        default=1_048_576, ge=1024, description="largest accepted header or content frame, bytes; bigger -> too_large"
    )
    max_sessions: int = Field(default=64, ge=1, description="open NPC sessions, all clients together")
    max_queue_depth: int = Field(
        default=8,
        ge=1,
        description="generate requests beyond the n_seq_max running ones (waiting for a slot), all clients together",
    )
    max_prompt_tokens: int = Field(
        default=1536,
        ge=16,
        description="tokens of one rendered prompt (history + new text); lowered to n_ctx / n_seq_max - 16 (hello announces the result)",
    )
    max_new_tokens: int = Field(
        default=512, ge=1, description="upper bound on max_tokens of one generate request, tokens"
    )
    priority_ageing_per_s: float = Field(
        default=1.0,
        ge=0.0,
        le=1000.0,
        description="priority points a queued generate request gains per second it waits, so none waits for ever behind higher priorities (0 = strict priority)",
    )
    max_session_file_bytes: int = Field(
        default=1 << 30,
        ge=1 << 16,
        description="largest session file load_session reads and save_session writes (a save leaves a KV state out rather than pass it), bytes; bigger -> too_large",
    )


class EngineSettings(_Section):
    """The model and the supervised llama.cpp worker process."""

    model: str = Field(default="default", description='GGUF path, or "default" for the embedded SmolLM2-135M-Instruct')
    mmproj: Path | None = Field(
        default=None,
        description="vision projector (mmproj GGUF) beside the model: NPCs can be shown images (docs/vision.md); none = no vision",
    )
    n_ctx: int = Field(
        default=4096, ge=64, le=MAX_N_CTX, description="context size of the worker, all sequences together, tokens"
    )
    n_threads: int | None = Field(
        default=None, ge=1, description="decode threads of the worker (none = llama.cpp default)"
    )
    worker_nice: int = Field(
        default=19,
        ge=0,
        le=19,
        description="CPU scheduling niceness of the engine worker: the game's threads run first and the LLM uses idle cycles (0 = same priority as the game)",
    )
    n_seq_max: int = Field(
        default=4,
        ge=1,
        le=64,
        description="sequences decoded together in one context (NPCs served in one batch); each gets n_ctx / n_seq_max tokens (at least 64)",
    )
    kv_cache_type: KvCacheType = Field(
        default="f16",
        description="element type of the KV cache, keys and values: q8_0 holds a token's cache in 53 % of f16's bytes "
        "(q4_0: 28 %), so a crowd's sessions leave the budget more room for weights (docs/batching.md, \"The KV "
        "cache's type\"); attention then reads quantized keys and values, and greedy replies may differ from f16's. "
        "Fixed for the daemon's life (every plan keeps it, so a budget change keeps every conversation); a session "
        "file saved under another type has its history evaluated again",
    )
    cpu_prefill_chunk_tokens: int = Field(
        default=160,
        ge=16,
        le=8192,
        description="prompt tokens one batch step evaluates where the CPU evaluates prompts: another NPC's turn waits for one such chunk, not a whole long prompt (the GPU takes n_batch)",
    )
    plan_objective: Literal["e2e", "ttft", "tps"] = Field(
        default="e2e",
        description="what the placement under the VRAM budget is chosen for: e2e (first token plus the reply), ttft (the first token first: NPCs that must start talking at once), tps (decode speed first)",
    )
    worker_start_timeout_s: float = Field(
        default=120.0, gt=0, description="time a worker may take to load the model, seconds"
    )
    always_reload: bool = Field(
        default=False,
        description="reload the model on every applied budget change, even when the placement is unchanged (tests, debugging)",
    )
    pinned_pool: bool = Field(
        default=False,
        description="keep the page-locked host memory of streamed weights across reloads (patches/llama.cpp 0003): "
        "a budget change does not pin them again, at the cost of holding up to the model file's size pinned",
    )
    weight_cache_device: str | None = Field(
        default=WEIGHT_CACHE_AUTO,
        min_length=1,
        max_length=32,
        description="keep every weight's host copy (weight_cache_host) for the worker's life and move weights between it and "
        "this device on a budget change, instead of loading the model again (patches/llama.cpp 0006; 0010 and 0011: a "
        "reclaim to 0 detaches the worker from the GPU in place, layers off the GPU keep their KV cache on the host): "
        "auto (the worker's first GPU; none: a CPU build, or CUDA hidden), a device (e.g. CUDA0) or off; off, or a "
        "device the worker lacks or a pinned copy over half the host memory available (logged as "
        "weight_cache_unavailable): every change loads the placement",
    )

    @field_validator("weight_cache_device")
    @classmethod
    def _off_is_none(cls, value: str | None) -> str | None:
        return None if value is not None and value.lower() == "off" else value

    weight_cache_host: Literal["auto", "pinned", "mapped"] = Field(
        default="auto",
        description="the host copy of the weight cache mode (weight_cache_device): pinned (page-locked for the "
        "worker's life: the fastest uploads and prompt streaming), mapped (the model file's pages, nothing "
        "page-locked: a worker starts, and a reclaim to 0 frees the device, without pinning or unpinning the model) "
        "or auto (pinned where the model takes at most half the host memory available when the worker starts, else "
        "mapped)",
    )
    host_pinning: Literal["registered", "allocated"] = Field(
        default="registered",
        description="how the worker page-locks the host memory of streamed weights and of the weight cache's pinned "
        "host copy (patches/llama.cpp 0008, Linux): registered (anonymous memory on transparent huge pages, registered "
        "with cudaHostRegister: a start pins, and an exit unpins, several times faster) or allocated (cudaMallocHost, "
        "llama.cpp's own way)",
    )
    standby_worker: bool = Field(
        default=True,
        description="on a GPU machine, keep a second worker process ready behind the one serving, of the other kind: "
        "llama.cpp loaded and its backends initialized, no model and no CUDA context; behind a worker with CUDA hidden "
        "(a budget below any GPU placement, a reclaim to 0) one with the GPU visible, in which a growth starts the GPU "
        "worker, and behind a GPU worker one with CUDA hidden, in which a reclaim to 0 starts the CPU-only worker",
    )
    op_offload_min_batch: int = Field(
        default=OP_OFFLOAD_MIN_BATCH,
        ge=1,
        le=65536,
        description="rows from which an op with weights on the host runs on the GPU, its weights streamed there "
        "(GGML_OP_OFFLOAD_MIN_BATCH of the worker; the planner plans with it): a crowd's decode step of B NPCs streams "
        "from B = this; 32 is llama.cpp's",
    )
    max_worker_restarts: int = Field(
        default=5, ge=0, description="restarts after a worker crash before the daemon gives up"
    )
    session_dir: Path | None = Field(
        default=None,
        description="where save_session writes session files (default: the cache directory, IGI_CACHE_DIR or XDG_CACHE_HOME/igi-sdk, then sessions)",
    )

    @model_validator(mode="after")
    def _every_sequence_holds_a_prompt(self) -> EngineSettings:
        if self.n_ctx // self.n_seq_max < MIN_N_CTX_PER_SEQ:
            raise ValueError(
                f"engine.n_ctx={self.n_ctx} gives each of engine.n_seq_max={self.n_seq_max} sequences "
                f"{self.n_ctx // self.n_seq_max} tokens: at least {MIN_N_CTX_PER_SEQ} each "
                f"(n_ctx >= {MIN_N_CTX_PER_SEQ * self.n_seq_max})"
            )
        return self

    def base_placement(self) -> Placement:
        """The placement fields the daemon never changes with the budget (context, sequences, threads, KV cache
        type): the base every plan of its model starts from (``daemon.budget.planner.daemon_planner``, ``igi bench
        --daemon-workload``)."""
        return Placement(
            n_ctx=self.n_ctx,
            n_seq_max=self.n_seq_max,
            n_threads=self.n_threads,
            n_threads_batch=self.n_threads,
            type_k=self.kv_cache_type,
            type_v=self.kv_cache_type,
        )


class BudgetSettings(_Section):
    """The VRAM budget and the hysteresis that keeps a jittery game from causing reload storms."""

    vram_budget_mib: int = Field(
        default=0, ge=0, description="VRAM budget at start-up, MiB (0 = CPU only until the game grants VRAM)"
    )
    grow_stable_s: float = Field(
        default=2.0, ge=0, description="a higher budget must be stable this long before it is used, seconds"
    )
    grow_min_mib: int = Field(default=256, ge=0, description="ignore growth smaller than this, MiB")
    min_grow_interval_s: float = Field(
        default=10.0, ge=0, description="at most one growth reload per this interval, seconds"
    )
    tier_down_stable_s: float = Field(
        default=10.0,
        ge=0,
        description="the NPCs generating must need a smaller batch tier this long before the daemon switches down to "
        "it (a switch up is made at once), seconds",
    )


class LogSettings(_Section):
    """Structured logs."""

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(default="INFO", description="lowest level written")
    log_format: Literal["json", "kv"] = Field(default="json", description="JSON lines or key=value lines")
    log_file: Path | None = Field(default=None, description="append logs to this file instead of stderr")


class DaemonSettings(BaseSettings):
    """Every knob of the daemon. See the module docstring for precedence.

    Example:
        >>> DaemonSettings(ipc={"port": 5555}).ipc.port
        5555
    """

    model_config = SettingsConfigDict(env_prefix="IGI_", env_nested_delimiter="__", frozen=True, extra="forbid")

    ipc: IpcSettings = Field(default_factory=IpcSettings, description="transport and liveness")
    limits: LimitSettings = Field(default_factory=LimitSettings, description="request limits")
    engine: EngineSettings = Field(default_factory=EngineSettings, description="model and worker")
    budget: BudgetSettings = Field(default_factory=BudgetSettings, description="VRAM budget policy")
    log: LogSettings = Field(default_factory=LogSettings, description="logging")
    governor: GovernorParams = Field(
        default_factory=GovernorParams,
        description="frame-rate governor's control law (docs/governor.md, Parameters)",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The precedence: init (CLI) > environment > TOML file > defaults."""
        toml_file = _TOML_FILE.get()
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if toml_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_file))
        return tuple(sources)

    @model_validator(mode="after")
    def _no_unknown_sections_in_the_environment(self) -> DaemonSettings:
        # pydantic-settings reads IGI_<SECTION>__<NAME> and refuses an unknown NAME, but skips a variable whose
        # SECTION matches none: a misspelt section would silently do nothing
        for key in os.environ:
            upper = key.upper()
            if not upper.startswith("IGI_") or "__" not in upper:
                continue
            section = upper[len("IGI_") :].split("__", 1)[0].lower()
            if section not in SECTIONS:
                raise ValueError(
                    f"environment variable {key}: no settings section {section!r} (sections: {', '.join(SECTIONS)})"
                )
        return self

    @model_validator(mode="after")
    def _prompt_fits_context(self) -> DaemonSettings:
        # only a limit the user set: the default is lowered to fit a smaller context at run time (as its description
        # says); refusing it made `igi-daemon --n-ctx 1024` fail with an error about a setting nobody gave
        if "max_prompt_tokens" not in self.limits.model_fields_set:
            return self
        if self.limits.max_prompt_tokens + 16 > self.engine.n_ctx:
            raise ValueError(
                f"limits.max_prompt_tokens={self.limits.max_prompt_tokens} leaves no room in engine.n_ctx={self.engine.n_ctx}"
            )
        return self


SECTIONS: tuple[str, ...] = ("ipc", "limits", "engine", "budget", "log", "governor")


def field_sections() -> dict[str, str]:
    """Map every leaf field name to its section (names are unique across sections)."""
    out: dict[str, str] = {}
    for section in SECTIONS:
        section_cls = DaemonSettings.model_fields[section].annotation
        for name in section_cls.model_fields:  # type: ignore[union-attr]
            if name in out:
                raise RuntimeError(f"settings field {name!r} appears in two sections")
            out[name] = section
    return out


def nest_flat(flat: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Turn ``{"port": 5555}`` (flat leaf names, e.g. from CLI flags) into ``{"ipc": {"port": 5555}}``.

    Raises:
        KeyError: a name that is not a settings field.
    """
    sections = field_sections()
    nested: dict[str, dict[str, Any]] = {}
    for name, value in flat.items():
        nested.setdefault(sections[name], {})[name] = value
    return nested


def load_settings(cli: Mapping[str, Any] | None = None, toml_file: Path | None = None) -> DaemonSettings:
    """Build the settings from flat CLI values, the environment and an optional TOML file.

    Args:
        cli: leaf field name -> value, only for flags the user actually gave.
        toml_file: path of a TOML file with ``[ipc]``, ``[limits]``, ``[engine]``, ``[budget]``, ``[log]``, ``[governor]`` tables.

    Returns:
        The validated, frozen settings.
    """
    if toml_file is not None:  # a missing or unusable file is an error, never silently the defaults
        read_regular_file(toml_file, what="config file")
    token = _TOML_FILE.set(toml_file)
    try:
        return DaemonSettings(**nest_flat(cli or {}))  # type: ignore[arg-type]  # sections as dicts
    finally:
        _TOML_FILE.reset(token)


def settings_reference_markdown() -> str:
    """The settings table of ``docs/config.md``, generated from the model."""
    lines = ["| CLI flag | environment | TOML | default | description |", "|---|---|---|---|---|"]
    for name, section in field_sections().items():
        section_cls = DaemonSettings.model_fields[section].annotation
        info = section_cls.model_fields[name]  # type: ignore[union-attr]
        default = info.get_default(call_default_factory=True)
        flag = "--" + name.replace("_", "-")
        env = f"IGI_{section.upper()}__{name.upper()}"
        lines.append(f"| `{flag}` | `{env}` | `[{section}] {name}` | `{default}` | {info.description} |")
    return "\n".join(lines) + "\n"
