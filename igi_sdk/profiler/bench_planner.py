"""Edge benchmark: wall time of ``plan_placement`` for the 48-layer MoE shape (``python -m igi_sdk.profiler.bench_planner``)."""

from __future__ import annotations

import statistics
import time

from igi_sdk.planner import Workload, plan_placement, reference_profile, table_from_shape
from igi_sdk.planner.shapes import REFERENCE_SHAPES


def main() -> int:
    table = table_from_shape(REFERENCE_SHAPES["qwen3_30b_a3b"])
    profile = reference_profile("h200")
    workload = Workload(prompt_tokens=1024, reply_tokens=128, n_ctx=4096)
    times = []
    for budget in (3000, 6000, 9000, 12000, 20000) * 4:
        t0 = time.perf_counter()
        plan_placement(table, budget, workload, profile)
        times.append((time.perf_counter() - t0) * 1e3)
    print(
        f"plan_placement, 48-layer MoE, {len(times)} runs: median {statistics.median(times):.1f} ms, "
        f"min {min(times):.1f} ms, max {max(times):.1f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
