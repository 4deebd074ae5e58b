"""Entry point of the self-contained daemon bundle (``packaging/igi-daemon.spec``): ``igi-daemon [DAEMON FLAGS]``.

A frozen program has no Python interpreter to run ``-m MODULE`` or ``-c CODE``, yet the daemon starts children that
way with ``sys.executable`` (which, frozen, is this bundle): the engine worker is a ``multiprocessing`` spawn child
(``freeze_support`` runs it), a planner dry run is ``sys.executable -m igi_sdk.engine.dry_run``, a profiler probe
``sys.executable -X faulthandler -c CODE``. This entry answers those forms itself, so the bundle's own executable
serves all of them, and anything else is the daemon's command line.
"""

from __future__ import annotations

import multiprocessing
import runpy
import sys


def _interpreter_form(argv: list[str]) -> bool:
    """Run ``[-X OPT]... -m MODULE ARGS`` or ``[-X OPT]... -c CODE ARGS`` as Python would; False for other argv."""
    i = 1
    while i + 1 < len(argv) and argv[i] == "-X":  # interpreter options (faulthandler): accepted, not needed frozen
        if argv[i + 1] == "faulthandler":
            import faulthandler

            faulthandler.enable()
        i += 2
    if i + 1 >= len(argv) or argv[i] not in ("-m", "-c"):
        return False
    flag, target, rest = argv[i], argv[i + 1], argv[i + 2 :]
    if flag == "-m":
        sys.argv = [target, *rest]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = ["-c", *rest]
        exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102 - the daemon's own probe code
    return True


def main() -> None:
    multiprocessing.freeze_support()  # a spawn child (the engine worker) runs here and never returns
    if _interpreter_form(sys.argv):
        raise SystemExit(0)
    from igi_sdk.daemon.__main__ import main as daemon_main

    daemon_main()


if __name__ == "__main__":
    main()
