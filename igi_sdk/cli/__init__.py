"""The `igi` command: a thin dispatcher to per-command modules (each exposes ``run(argv) -> int``). A command
raises bad input as one of ``igi_sdk.cli.errors.EXPECTED_ERRORS``; the dispatcher reports it in one line (exit
code 2). The command-line entry points live in this package: ``plan``, ``prepare``, ``chat``, ``fetch_model``; ``profile``,
``bench`` and ``daemon`` are their packages' own ``cli`` / ``__main__`` modules."""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("igi_sdk.cli.plan", "print the placement plan for a model under a VRAM budget"),
    "profile": ("igi_sdk.profiler.cli", "measure this machine and save its benchmark profile"),
    "bench": ("igi_sdk.bench.cli", "side-by-side benchmark: planner vs stock placements"),
    "bench-vision": ("igi_sdk.bench.vision", "one VLM image turn: VLMOpt under budgets vs stock and all-GPU"),
    "daemon": ("igi_sdk.daemon.__main__", "run the inference daemon"),
    "prepare": ("igi_sdk.cli.prepare", "plan a model's budgets once, ahead of the daemon (profile and dry runs)"),
    "chat": ("igi_sdk.cli.chat", "answer one NPC prompt in-process, streaming (no daemon)"),
    "fetch-model": ("igi_sdk.cli.fetch_model", "download and verify the embedded default model"),
}


#: Packages of the ``tools`` extra (``pip install 'igi-sdk[tools]'``): the tables and plots of some commands; the
#: daemon and the clients need none of them.
TOOLS_EXTRA = frozenset({"rich", "matplotlib"})


def usage() -> str:
    lines = ["usage: igi COMMAND [ARGS]", "", "commands:"]
    lines += [f"  {name:<12} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"igi: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    from igi_sdk.cli.errors import EXPECTED_ERRORS, report

    try:
        module = importlib.import_module(COMMANDS[name][0])
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] not in TOOLS_EXTRA:
            raise
        print(f"igi {name}: needs {exc.name}, of the tools extra: pip install 'igi-sdk[tools]'", file=sys.stderr)
        return 2
    try:
        return int(module.run(rest) or 0)
    except EXPECTED_ERRORS as exc:
        return report(f"igi {name}", exc)
