"""DaemonSettings: precedence CLI > env > TOML > defaults, validation, and the generated docs table."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from igi_sdk.config import (
    DaemonSettings,
    EngineSettings,
    field_sections,
    load_settings,
    nest_flat,
    settings_reference_markdown,
)

REPO = Path(__file__).resolve().parents[2]


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "igi.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_are_loopback_and_cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in field_sections():
        monkeypatch.delenv(f"IGI_{field_sections()[name].upper()}__{name.upper()}", raising=False)
    settings = load_settings()
    assert (settings.ipc.ip, settings.ipc.port, settings.budget.vram_budget_mib) == ("127.0.0.1", 0, 0)


def test_precedence_cli_over_env_over_toml_over_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toml = _toml(tmp_path, "[ipc]\nport = 1111\nclient_timeout_s = 3.5\n[budget]\ngrow_min_mib = 64\n")
    monkeypatch.setenv("IGI_IPC__PORT", "2222")
    monkeypatch.setenv("IGI_BUDGET__GROW_MIN_MIB", "128")
    settings = load_settings({"port": 3333}, toml_file=toml)
    assert settings.ipc.port == 3333  # CLI beats env and TOML
    assert settings.budget.grow_min_mib == 128  # env beats TOML
    assert settings.ipc.client_timeout_s == 3.5  # TOML beats default
    assert settings.ipc.heartbeat_interval_s == 2.0  # default
    assert load_settings(toml_file=toml).ipc.port == 2222  # env beats TOML
    monkeypatch.delenv("IGI_IPC__PORT")
    assert load_settings(toml_file=toml).ipc.port == 1111


def test_non_loopback_ip_is_refused() -> None:
    with pytest.raises(ValidationError, match="loopback"):
        DaemonSettings(ipc={"ip": "0.0.0.0"})


def test_unknown_toml_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError):
        load_settings(toml_file=_toml(tmp_path, "[ipc]\nprot = 1\n"))


@pytest.mark.parametrize("name", ["IGI_BUDGE__VRAM_BUDGET_MIB", "IGI_FOO__BAR", "igi_engin__model"])
def test_an_environment_variable_of_no_section_is_refused(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, "2048")
    with pytest.raises(ValidationError, match=name):
        load_settings()


def test_an_environment_variable_of_an_unknown_field_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IGI_BUDGET__VRAM_BUDGT_MIB", "2048")
    with pytest.raises(ValidationError):
        load_settings()


def test_prompt_limit_must_fit_context() -> None:
    with pytest.raises(ValidationError, match="n_ctx"):
        DaemonSettings(engine={"n_ctx": 512}, limits={"max_prompt_tokens": 1024})


def test_settings_are_frozen() -> None:
    settings = DaemonSettings()
    with pytest.raises(ValidationError):
        settings.ipc.port = 5  # type: ignore[misc]


def test_nest_flat_rejects_unknown_names() -> None:
    assert nest_flat({"port": 1, "model": "x"}) == {"ipc": {"port": 1}, "engine": {"model": "x"}}
    with pytest.raises(KeyError):
        nest_flat({"no_such_setting": 1})


def test_every_field_has_a_description() -> None:
    table = settings_reference_markdown()
    assert "| None |" not in table
    assert table.count("\n") == len(field_sections()) + 2


def test_docs_config_md_is_generated_from_the_model() -> None:
    assert settings_reference_markdown() in (REPO / "docs" / "config.md").read_text(encoding="utf-8")


def test_cli_boolean_flags_work_alone_and_abbreviations_are_refused() -> None:
    from igi_sdk.daemon.__main__ import _cli_values, build_parser

    parser = build_parser()
    assert load_settings(_cli_values(parser.parse_args(["--always-reload"]))).engine.always_reload is True
    assert load_settings(_cli_values(parser.parse_args(["--always-reload", "false"]))).engine.always_reload is False
    with pytest.raises(SystemExit):
        parser.parse_args(["--vram-budget", "5"])  # not --vram-budget-mib


def test_only_the_loopback_hosts_the_transport_binds_are_accepted() -> None:
    from igi_sdk.daemon.server import DaemonServer
    from igi_sdk.ipc.transport import check_endpoint

    for ip in ("127.0.0.2", "::2", "10.0.0.1"):
        with pytest.raises(ValidationError, match="loopback"):
            DaemonSettings(ipc={"ip": ip})
    for ip, endpoint in (
        ("127.0.0.1", "tcp://127.0.0.1:*"),
        ("localhost", "tcp://127.0.0.1:*"),
        ("::1", "tcp://[::1]:*"),
    ):
        server = DaemonServer(DaemonSettings(ipc={"ip": ip, "transport": "tcp"}))
        assert check_endpoint(server._endpoint()[0]) == endpoint


@pytest.mark.skipif(sys.platform not in ("linux", "darwin"), reason="auto means ipc on Linux and macOS")
def test_auto_transport_binds_a_socket_in_a_new_0700_directory() -> None:
    from igi_sdk.daemon.server import DaemonServer

    endpoint, private_dir = DaemonServer(DaemonSettings())._endpoint()
    try:
        assert private_dir is not None and endpoint == f"ipc://{private_dir / 'daemon.sock'}"
        assert stat.S_IMODE(private_dir.stat().st_mode) == 0o700
        assert [p.name for p in private_dir.iterdir()] == ["daemon.pid"]  # the owner file a later start checks
        assert len(os.fsencode(endpoint[len("ipc://") :])) <= 103  # fits sun_path on Linux and macOS
    finally:
        if private_dir is not None:
            (private_dir / "daemon.pid").unlink()
            private_dir.rmdir()


def test_a_small_context_with_the_default_prompt_limit_is_accepted() -> None:
    """The default max_prompt_tokens (1536) is lowered to fit at run time; only one the user set must fit n_ctx."""
    settings = DaemonSettings(engine={"n_ctx": 1024})
    assert settings.engine.n_ctx == 1024 and settings.limits.max_prompt_tokens == 1536


def test_the_governor_law_is_a_settings_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/governor.md's parameters reach the daemon's governor through the settings ([governor],
    IGI_GOVERNOR__*, flags), with the usual precedence."""
    from igi_sdk.daemon.__main__ import _cli_values, build_parser
    from igi_sdk.daemon.core import _make_governor

    toml = _toml(tmp_path, "[governor]\nrelax_hold_s = 2.0\nbudget_shrink_after_s = 9.0\n")
    monkeypatch.setenv("IGI_GOVERNOR__BUDGET_SHRINK_AFTER_S", "7.5")
    flags = _cli_values(build_parser().parse_args(["--relax-hold-s", "3.0"]))
    settings = load_settings(flags, toml_file=toml)
    assert (settings.governor.relax_hold_s, settings.governor.budget_shrink_after_s) == (3.0, 7.5)
    assert _make_governor(2048, settings.governor).params.relax_hold_s == 3.0
    with pytest.raises(ValidationError, match="relax_below_ratio"):  # the law's own validation applies
        DaemonSettings(governor={"relax_below_ratio": 1.0, "tighten_above_ratio": 1.0})
    with pytest.raises(ValidationError):
        load_settings(toml_file=_toml(tmp_path, "[governor]\nrelax_hold = 2.0\n"))  # a typo is an error
    # every flag's help renders (a literal % in a description broke --help)
    help_text = build_parser().format_help()
    assert "--relax-hold-s" in help_text and "14 % after 0.5 s" in help_text


def test_the_kv_cache_type_reaches_the_base_placement_every_plan_starts_from() -> None:
    """``engine.kv_cache_type`` sets the keys' and values' type of the base placement, and only the types llama.cpp's
    flash attention serves on every backend are accepted."""
    default = load_settings({}).engine.base_placement()
    assert (default.type_k, default.type_v) == ("f16", "f16")
    base = load_settings({"kv_cache_type": "q8_0"}).engine.base_placement()
    assert (base.type_k, base.type_v, base.flash_attn) == ("q8_0", "q8_0", True)
    with pytest.raises(ValidationError, match="kv_cache_type"):
        load_settings({"kv_cache_type": "q5_1"})


def test_a_context_too_small_for_its_sequences_is_refused() -> None:
    """256 tokens for 16 sequences gave each a prompt limit of 1 token: every generate was too_large."""
    with pytest.raises(ValueError, match="16 tokens: at least 64 each"):
        DaemonSettings(engine=EngineSettings(n_ctx=256, n_seq_max=16))
    assert DaemonSettings(engine=EngineSettings(n_ctx=1024, n_seq_max=16)).engine.n_seq_max == 16
