"""Daemon layer: ``igi-daemon`` / ``python -m igi_sdk.daemon`` / ``igi daemon``: parse flags, load settings, serve.

Every settings field is a flag named after it (``--vram-budget-mib``); ``--config PATH`` names a TOML file.
Precedence (flags > ``IGI_*`` environment > TOML > defaults) is defined once in ``igi_sdk.config``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from igi_sdk.config import DaemonSettings, field_sections, load_settings
from igi_sdk.daemon.logs import configure_logging
from igi_sdk.errors import IgiError


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, one flag per settings field (values are validated by the settings model)."""
    # allow_abbrev off: a misspelt flag (--vram-budget) is an error, not silently another setting
    parser = argparse.ArgumentParser(
        prog="igi-daemon", description="IGI inference daemon (see docs/daemon.md)", allow_abbrev=False
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="TOML settings file (sections ipc, limits, engine, budget, log, governor)",
    )
    for name, section in field_sections().items():
        section_cls = DaemonSettings.model_fields[section].annotation
        info = section_cls.model_fields[name]  # type: ignore[union-attr]
        default = info.get_default(call_default_factory=True)
        switch = {"nargs": "?", "const": "true"} if info.annotation is bool else {}  # --always-reload alone = true
        parser.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            default=argparse.SUPPRESS,
            metavar=name.upper(),
            # argparse formats help with %: a literal one (the governor's "14 % after 0.5 s") must be doubled
            help=f"{info.description} [{section}.{name}, default {default}]".replace("%", "%%"),
            **switch,  # type: ignore[arg-type]
        )
    return parser


def _cli_values(namespace: argparse.Namespace) -> dict[str, Any]:
    values = {k: v for k, v in vars(namespace).items() if k != "config"}
    return {k: (None if isinstance(v, str) and v.lower() == "none" else v) for k, v in values.items()}


def run(argv: list[str]) -> int:
    """Run the daemon with command-line ``argv`` (without the program name). Returns the exit code."""
    # imported here, not at the top: this module is imported again in every engine worker (the spawn's main module), and
    # the ipc layer it pulls in loads pyzmq's C++ library, which must come after llama.cpp's (docs/engine.md, "Load
    # order")
    from igi_sdk.cli.errors import EXPECTED_ERRORS, report

    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(_cli_values(args), toml_file=args.config)
        configure_logging(settings.log.log_level, settings.log.log_format, settings.log.log_file)
    except EXPECTED_ERRORS as exc:  # a bad setting, an unusable --config or --log-file
        return report("igi-daemon", exc)
    from igi_sdk.daemon.server import DaemonServer

    try:
        return DaemonServer(settings).run()
    # a --connection-file whose folder cannot be made (OSError), an endpoint that cannot be bound (EndpointError: a
    # port in use, an ipc path too long); other errors keep their traceback
    except (OSError, IgiError) as exc:
        return report("igi-daemon", exc)


def main() -> None:
    """Console-script entry point."""
    raise SystemExit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
