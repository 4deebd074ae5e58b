"""The profiler's arithmetic from timings to rates: units (bytes, seconds, FLOPs in; GB/s, GFLOP/s, us out)
and the refusal to report a rate the timings cannot resolve (the version-1 profiler's 73207808 "GB/s" on the H200)."""

from __future__ import annotations

import pytest

from igi_sdk.profiler.measure import UnresolvedTerm, copy_rate_gbps, differential_rate, solve


def test_solve_recovers_bandwidth_and_per_op_overhead() -> None:
    bw, o = 40e9, 4e-6  # 40 GB/s, 4 us per op
    b_a, n_a, b_b, n_b = 1.0e6, 41, 73.2e6, 155
    t_a, t_b = b_a / bw + n_a * o, b_b / bw + n_b * o
    got_bw, got_o = solve(t_a, b_a, n_a, t_b, b_b, n_b)
    assert got_bw == pytest.approx(40.0) and got_o == pytest.approx(4.0)


def test_solve_refuses_an_overhead_bound_pair_instead_of_returning_the_byte_count() -> None:
    """GPU decode of the old timing models: per-op and per-call overhead dwarf 73 MB at ~3 TB/s. The old
    fallback divided the byte count by a 1e-9 s clamp: 73207808 bytes -> 73207808 "GB/s"."""
    with pytest.raises(UnresolvedTerm, match="byte term unresolved"):
        solve(100e-6, 1.0e6, 41, 300e-6, 73207808, 155)


def test_differential_rate_cancels_fixed_costs() -> None:
    fixed = 350e-6  # per-call + per-op cost, the same for both models (same graph)
    b_n, b_w, bw = 40e6, 520e6, 3300e9
    rate = differential_rate(b_n, fixed + b_n / bw, b_w, fixed + b_w / bw, what="VRAM bandwidth")
    assert rate / 1e9 == pytest.approx(3300.0)
    f_n, f_w, gflops = 2 * 61e6 * 512, 2 * 872e6 * 512, 160e12
    rate = differential_rate(f_n, 2e-3 + f_n / gflops, f_w, 2e-3 + f_w / gflops, what="GPU GFLOP/s")
    assert rate / 1e9 == pytest.approx(160000.0)


def test_differential_rate_refuses_noise() -> None:
    with pytest.raises(UnresolvedTerm):
        differential_rate(40e6, 400e-6, 520e6, 410e-6, what="VRAM bandwidth")  # 10 us of 410: noise
    with pytest.raises(UnresolvedTerm):
        differential_rate(40e6, 400e-6, 520e6, 390e-6, what="VRAM bandwidth")  # the larger model faster


def test_copy_rate_is_gb_per_second_of_the_extra_time() -> None:
    copied, t_resident = 490_000_000, 5.6e-3
    assert copy_rate_gbps(copied, t_resident + copied / 55e9, t_resident) == pytest.approx(55.0)
    assert copy_rate_gbps(copied, t_resident + copied / 8.4e9, t_resident) == pytest.approx(8.4)
    with pytest.raises(UnresolvedTerm):
        copy_rate_gbps(copied, t_resident, t_resident + 1e-3)
