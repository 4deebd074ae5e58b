"""Cold start of the daemon: process start to connection file, the bundle and ``python -m igi_sdk.daemon`` side by side.

    .venv/bin/python packaging/cold_start.py [--bundle build/bundle/igi-daemon] [--runs 5]

Each run starts the daemon with a fresh connection file (``--port 0 --n-threads 2``), waits until the file names the
new pid, then stops it with SIGTERM and waits for its exit (so runs never overlap). The two kinds alternate, run by
run, so both see the same machine load. Prints one line per run and the median of each kind, with the ratio.
The bundle runs with an environment that has no Python on PATH and no PYTHON* variable.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def one_start(cmd: list[str], env: dict[str, str], timeout_s: float = 180.0) -> float:
    """Seconds from Popen to a connection file naming the new process."""
    with tempfile.TemporaryDirectory(prefix="igi-cold-") as tmp:
        conn = Path(tmp) / "connection.json"
        started = time.perf_counter()
        proc = subprocess.Popen(
            [*cmd, "--connection-file", str(conn), "--port", "0", "--n-threads", "2"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=tmp,
        )
        try:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{cmd[0]} exited with {proc.returncode} before writing its connection file")
                try:
                    if json.loads(conn.read_text())["pid"] == proc.pid:
                        return time.perf_counter() - started
                except (OSError, ValueError, KeyError):
                    pass
                if time.perf_counter() - started > timeout_s:
                    raise TimeoutError(f"no connection file after {timeout_s} s")
                time.sleep(0.01)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            time.sleep(1.0)  # its worker exits after it


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=REPO / "build" / "bundle" / "igi-daemon")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    exe = args.bundle / ("igi-daemon.exe" if os.name == "nt" else "igi-daemon")
    bare = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k not in ("VIRTUAL_ENV", "PATH")}
    bare["PATH"] = str(Path(tempfile.gettempdir()) / "igi-no-python-on-path")
    kinds = {"bundle": ([str(exe)], bare), "python": ([sys.executable, "-m", "igi_sdk.daemon"], dict(os.environ))}
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for run in range(args.runs):
        for kind, (cmd, env) in kinds.items():
            t = one_start(cmd, env)
            times[kind].append(t)
            print(f"run {run + 1} {kind}: {t:.2f} s", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    for kind, values in times.items():
        print(
            f"{kind}: median {med[kind]:.2f} s, min {min(values):.2f} s, max {max(values):.2f} s over {len(values)} runs"
        )
    print(f"bundle / python cold start: {med['bundle'] / med['python']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
