"""``igi profile``: measure this machine and save its benchmark profile."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from igi_sdk.errors import IgiError
from igi_sdk.planner.profile import GpuProfile, Profile


def _prefetch_row(g: GpuProfile) -> str:
    """The engine build's copy/compute overlap, as the planner will use it."""
    if g.weight_prefetch_abi <= 0:
        return "no (stock llama.cpp: serial weight copies)"
    rate = f"{g.h2d_prefetch_gbps:.1f} GB/s overlapped" if g.h2d_prefetch_gbps else "copies hidden by compute"
    return f"yes (ABI {g.weight_prefetch_abi}, {rate})"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="igi profile", description="Measure this machine for the placement planner.")
    p.add_argument("--quick", action="store_true", help="one thread count, few tokens, no GPU runs (seconds)")
    p.add_argument("--threads", type=int, nargs="*", help="thread counts to measure (default: n/2 and n)")
    p.add_argument("--json", action="store_true", help="print the profile as JSON")
    p.add_argument("--show", action="store_true", help="print the cached profile without measuring")
    return p


def render(profile: Profile, console: Console) -> None:
    """A table of the profile's rates."""
    t = Table(title=f"profile {profile.machine.slug()} ({profile.source})")
    t.add_column("term")
    t.add_column("value", justify="right")
    t.add_row("host memory (1-thread numpy copy, informational)", f"{profile.host_memory_gbps:.1f} GB/s")
    for r in profile.cpu:
        t.add_row(f"CPU {r.n_threads} threads: decode weight rate", f"{r.decode_gbps:.2f} GB/s")
        t.add_row(f"CPU {r.n_threads} threads: per-op overhead", f"{r.op_overhead_us:.1f} us")
        t.add_row(f"CPU {r.n_threads} threads: KV read (attention)", f"{r.kv_read_gbps:.2f} GB/s")
        t.add_row(f"CPU {r.n_threads} threads: prefill", f"{r.gflops('q4_0'):.1f} GFLOP/s")
    if profile.gpu:
        g = profile.gpu
        for name, value in (
            ("GPU", g.name),
            ("VRAM bandwidth", f"{g.bandwidth_gbps:.0f} GB/s"),
            ("GPU prefill", f"{g.gflops:.0f} GFLOP/s"),
            ("op_offload copy pinned / pageable", f"{g.h2d_pinned_gbps:.1f} / {g.h2d_pageable_gbps:.1f} GB/s"),
            ("pipelined weight prefetch", _prefetch_row(g)),
            ("VRAM reserve", f"{g.reserve_mib} MiB"),
        ):
            t.add_row(name, value)
    else:
        t.add_row("GPU", "none")
    for r in profile.cpu:
        if r.moe_decode_efficiency != 1.0:
            t.add_row(f"CPU {r.n_threads} threads: MoE expert decode efficiency", f"{r.moe_decode_efficiency:.2f}")
    for term, why in profile.missing.items():
        t.add_row(f"[yellow]missing {term}[/yellow]", why[:80])
    console.print(t)


def run(argv: list[str]) -> int:
    """Entry point of ``igi profile``."""
    from igi_sdk.profiler.build import measure_profile
    from igi_sdk.profiler.store import load_profile, save_profile

    args = _parser().parse_args(argv)
    if any(t < 1 for t in args.threads or []):
        raise ValueError(f"--threads must be >= 1, got {args.threads}")  # before minutes of measurements fail
    console = Console(stderr=args.json)
    try:
        if args.show:
            profile = load_profile()
            if profile is None:
                console.print("no cached profile for this machine; run `igi profile`")
                return 1
        else:
            with Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            ) as bar:
                task = bar.add_task("profiling", total=None)
                profile = measure_profile(
                    quick=args.quick, thread_counts=args.threads, progress=lambda msg: bar.update(task, description=msg)
                )
            path = save_profile(profile)
            console.print(f"saved {path}")
    except IgiError as exc:
        console.print(f"[red]igi profile: {exc}[/red]")
        return 1
    if args.json:
        print(profile.model_dump_json(indent=2))
    else:
        render(profile, console)
    return 0
