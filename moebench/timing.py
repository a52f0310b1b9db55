"""Timing: CUDA events (or the host clock on CPU), CUDA-graph replay, raw
samples with median / p20 / p80, an L2 flush between samples, ranks barriered
before each sample."""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

L2_FLUSH_BYTES = 256 * 2**20  # > 4x the H200's 60 MB L2


@dataclass
class Samples:
    """Raw per-sample times in µs."""

    us: list[float]

    def q(self, p: float) -> float:
        return float(np.percentile(self.us, p)) if self.us else float("nan")

    @property
    def median(self) -> float:
        return self.q(50)

    @property
    def p20(self) -> float:
        return self.q(20)

    @property
    def p80(self) -> float:
        return self.q(80)

    def warn_if_noisy(self, what: str, limit: float = 1.10) -> None:
        """Warn when p80/p20 exceeds `limit` (as torch.utils.benchmark does for IQR)."""
        if self.us and self.p20 > 0 and self.p80 / self.p20 > limit:
            warnings.warn(f"{what}: wide spread p80/p20 = {self.p80 / self.p20:.2f} over {len(self.us)} samples")


class L2Flusher:
    """Writes a buffer larger than L2 so each sample starts with a cold cache."""

    def __init__(self, device: torch.device):
        self.buf = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buf.zero_()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_samples(
    fn: Callable[[], object],
    device: torch.device,
    reps: int,
    warmup: int,
    barrier: Optional[Callable[[], None]] = None,
    flush: Optional[Callable[[], None]] = None,
    around: Optional[Callable[[int], object]] = None,
) -> Samples:
    """Time fn() `reps` times after `warmup` calls: CUDA events on a GPU, the
    monotonic clock on CPU. Before each sample: flush (L2), then barrier (all
    ranks start together). `around(i)` may return a context manager wrapping
    sample i (e.g. an NVTX `sample/<i>` range)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    out: list[float] = []
    cuda = device.type == "cuda"
    if cuda:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
    for i in range(reps):
        if flush is not None:
            flush()
        if barrier is not None:
            barrier()
        _sync(device)
        ctx = around(i) if around is not None else None
        if ctx is not None:
            ctx.__enter__()
        if cuda:
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) * 1e3)
        else:
            t0 = time.perf_counter_ns()
            fn()
            out.append((time.perf_counter_ns() - t0) / 1e3)
        if ctx is not None:
            ctx.__exit__(None, None, None)
    return Samples(out)


def time_graph(
    fn: Callable[[], object],
    device: torch.device,
    reps: int,
    warmup: int,
    barrier: Optional[Callable[[], None]] = None,
    flush: Optional[Callable[[], None]] = None,
) -> Samples:
    """Capture fn() once in a CUDA graph and time its replays (launch gaps removed)."""
    s = torch.cuda.Stream(device)
    s.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(s):  # warm up outside the capture (allocator, autotuning)
        for _ in range(max(1, warmup)):
            fn()
    torch.cuda.current_stream(device).wait_stream(s)
    _sync(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_samples(graph.replay, device, reps, warmup, barrier=barrier, flush=flush)
