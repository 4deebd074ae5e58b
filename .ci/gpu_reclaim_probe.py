"""GPU check of a reclaim to 0 MiB (device tool, after `.ci/gpu-reclaim.sh` built the CUDA llama-cpp-python).

A daemon serves the small synthetic model `smoke_dense` fully in VRAM (budget 2048 MiB); the game generates, reclaims to
0 MiB (deadline 1 s), generates again in the same session, then restores 2048 MiB. Printed per step: the ack
(applied, granted, apply time, warning, the daemon's measured VRAM), NVML's own per-process reading of the engine
worker, the status plan, and wall times. JSON to $OUT/reclaim_probe.json, the daemon log beside it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from daemon_process import DaemonProcess  # noqa: E402

from igi_sdk.bench.setup import resolve_model  # noqa: E402
from igi_sdk.client import Client  # noqa: E402
from igi_sdk.ipc.values import Sampling  # noqa: E402
from igi_sdk.model_store import cache_dir  # noqa: E402
from igi_sdk.profiler.machine import nvml_process_used_mib  # noqa: E402


def worker_vram(daemon_pid: int) -> dict[str, float | None]:
    """NVML per-process VRAM of the daemon and each child of it (the engine worker, dry-run children)."""
    out: dict[str, float | None] = {"daemon": nvml_process_used_mib(daemon_pid)}
    children = Path(f"/proc/{daemon_pid}/task/{daemon_pid}/children")
    for pid in children.read_text().split() if children.exists() else []:
        out[pid] = nvml_process_used_mib(int(pid))
    return out


def main() -> int:
    model, _shape = resolve_model("smoke_dense", cache_dir() / "bench-models", print)
    out = Path(os.environ.get("OUT", "/tmp"))
    daemon = DaemonProcess(
        ["--model", str(model), "--vram-budget-mib", "2048", "--grow-stable-s", "0", "--min-grow-interval-s", "0"]
    )
    rows: list[dict] = []
    try:
        daemon.start(timeout_s=240)
        with Client.connect(daemon.connection_file, timeout_s=120) as client:
            sid = client.create_session("Guard", "You guard the gate.", sampling=Sampling(temperature=0.0))

            def step(name: str, ack=None) -> None:
                t = time.perf_counter()
                res = client.generate(sid, f"{name}: who goes there?", max_tokens=16).result()
                st = client.status()
                row = {
                    "step": name,
                    "gen_wall_s": round(time.perf_counter() - t, 3),
                    "n_tokens": len(res.token_ids),
                    "reloads_during": res.reloads_during,
                    "strategy": st.plan.strategy if st.plan else None,
                    "status_vram_used_mib": st.vram_used_mib,
                    "budget_mib": st.vram_budget_mib,
                    "nvml_per_process_mib": worker_vram(daemon.pid),
                }
                if ack is not None:
                    row["ack"] = {
                        k: getattr(ack, k)
                        for k in (
                            "requested_mib",
                            "granted_mib",
                            "applied",
                            "cpu_fallback",
                            "apply_time_s",
                            "measured_vram_mib",
                            "warning",
                        )
                    }
                rows.append(row)
                print(json.dumps(row), flush=True)

            step("start")
            t = time.perf_counter()
            ack = client.reclaim(0, deadline_s=1.0)
            rows_ack_wall = round(time.perf_counter() - t, 3)
            step("after reclaim to 0", ack)
            rows[-1]["reclaim_wall_s"] = rows_ack_wall
            ack = client.set_budget(2048, "restore")
            time.sleep(1.0)
            step("after restore to 2048", ack)
    finally:
        daemon.stop()
        (out / "reclaim_probe.json").write_text(json.dumps(rows, indent=1))
        if daemon.log_file.is_file():
            (out / "reclaim_probe-daemon.log").write_bytes(daemon.log_file.read_bytes())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
