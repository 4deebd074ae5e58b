"""Synthetic render workload: matrix multiplications sized to take a set fraction of the frame.

The CPU path stands in for a game's render thread(s). When torch with CUDA is importable, ``device="cuda"``
adds GPU kernels (a matmul per chunk, synchronised, so it counts in the frame time as GPU work would).
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

CHUNK_DIM = 192  # one chunk: a 192 x 192 float32 matmul, ~1 ms on one core of this class of machine


def cuda_available() -> bool:
    """Whether torch with a CUDA device is importable (the GPU render path)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@dataclass
class RenderWorkload:
    """Render work of one frame: ``chunks_per_frame`` matmul chunks on each of ``threads`` render threads
    (scaled for a level-load spike). A frame's work ends when every thread has finished its chunks.

    Attributes:
        chunks_per_frame: chunks per thread in one normal frame (from :meth:`calibrate`).
        chunk_ms: measured time of one chunk on one core, ms.
        device: "cpu" or "cuda".
        threads: render threads (a game's main + render threads); numpy releases the GIL in matmul.
    """

    chunks_per_frame: int
    chunk_ms: float
    device: str = "cpu"
    threads: int = 1
    _a: Any = field(default=None, repr=False)
    _b: Any = field(default=None, repr=False)
    _pool: ThreadPoolExecutor | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        rng = np.random.default_rng(0)
        a = rng.standard_normal((CHUNK_DIM, CHUNK_DIM), dtype=np.float32)
        b = rng.standard_normal((CHUNK_DIM, CHUNK_DIM), dtype=np.float32)
        if self.device == "cuda":
            import torch

            self._a, self._b = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
        else:
            self._a, self._b = a, b
        if self.threads > 1:
            self._pool = ThreadPoolExecutor(max_workers=self.threads - 1, thread_name_prefix="render")

    def _chunk(self) -> None:
        if self.device == "cuda":
            import torch

            (self._a @ self._b).sum()
            torch.cuda.synchronize()
        else:
            np.matmul(self._a, self._b)

    def _chunks(self, n: int) -> None:
        for _ in range(n):
            self._chunk()

    def run(self, scale: float = 1.0) -> None:
        """Do one frame's render work, ``scale`` x the normal amount, on every render thread."""
        n = max(1, round(self.chunks_per_frame * scale))
        helpers = [self._pool.submit(self._chunks, n) for _ in range(self.threads - 1)] if self._pool else []
        self._chunks(n)  # the calling thread is render thread 0
        for f in helpers:
            f.result()

    @classmethod
    def calibrate(
        cls,
        frame_ms: float,
        load_fraction: float,
        device: str = "cpu",
        threads: int = 1,
        rounds: int = 25,
        chunks_per_round: int = 40,
    ) -> RenderWorkload:
        """Size the work so each render thread is busy ``load_fraction`` of ``frame_ms``.

        The chunk time is measured with every render thread working at once, as in a frame: on this class of
        machine a chunk takes 10-20 % longer when both cores run one (shared caches and memory bandwidth, the
        slowest thread ending the frame), so a one-thread measurement made the render load that much heavier than
        asked. It is the median of ``rounds`` rounds of ``chunks_per_round`` chunks per thread (~0.2 s here).

        Args:
            frame_ms: the target frame time, ms.
            load_fraction: share of the frame each render thread works, 0..1.5 (above 1: the game cannot
                hold its frame rate even alone).
            device: "cpu" or "cuda".
            threads: render threads.
            rounds: timed rounds (after one warm-up round).
            chunks_per_round: chunks per thread in one round.
        """
        threads = max(1, threads)
        probe = cls(chunks_per_frame=chunks_per_round, chunk_ms=1.0, device=device, threads=threads)
        try:
            probe.run()  # warm-up: thread pool started, caches and clocks settled
            samples = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                probe.run()
                samples.append((time.perf_counter() - t0) * 1000.0 / chunks_per_round)
        finally:
            probe.close()
        chunk_ms = statistics.median(samples)
        chunks = max(1, round(frame_ms * load_fraction / chunk_ms))
        return cls(chunks_per_frame=chunks, chunk_ms=chunk_ms, device=device, threads=threads)

    def close(self) -> None:
        """Stop the helper render threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
