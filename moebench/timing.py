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
    align: Optional[Callable[[], None]] = None,
) -> Samples:
    """Time fn() `reps` times after `warmup` calls: CUDA events on a GPU, the
    monotonic clock on CPU. One GPU rank: samples are enqueued back to back
    (each after an L2 flush) and read once. Several ranks: before each sample
    a barrier (all ranks start together), then the L2 flush, then the start
    event, with no host sync in between. `around(i)` may return a context
    manager wrapping sample i (e.g. an NVTX `sample/<i>` range). `align` (e.g. a
    one-element all-reduce on the GPU) runs after the flush, so the ranks' start
    events fire together on the devices rather than when each host gets there."""
    for _ in range(warmup):
        fn()
    _sync(device)
    out: list[float] = []
    cuda = device.type == "cuda"
    if cuda and barrier is None and around is None:
        # one rank: enqueue every sample back to back and read the events once,
        # as do_bench does (no host sync between samples: the GPU never idles)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            if flush is not None:
                flush()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize(device)
        return Samples([s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)])
    if cuda:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
    for i in range(reps):
        if barrier is not None:
            barrier()  # ranks start together (NCCL's barrier also drains the GPU)
        else:
            _sync(device)
        if flush is not None:
            # the flush keeps the GPU busy while the host enqueues the sample, so
            # the host's launch latency is hidden as in do_bench (no sync after it)
            flush()
        if align is not None:
            align()
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
    align: Optional[Callable[[], None]] = None,
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
    return time_samples(graph.replay, device, reps, warmup, barrier=barrier, flush=flush, align=align)


def profile_kernels(
    fn: Callable[[], object],
    path: str,
    samples: int,
    barrier: Optional[Callable[[], None]] = None,
    flush: Optional[Callable[[], None]] = None,
) -> dict:
    """Profiler mode: kernel durations per phase, what library benchmarks report.

    Runs `samples` forwards under torch.profiler (phase ranges must be on), writes
    the trace to `path`, and returns medians over samples (µs):
    `<phase>` = busy GPU time of the kernels launched inside the phase, and
    `kernels` = {kernel name: median summed duration per sample} for the
    communication kernels (e.g. DeepEP's notify_dispatch / dispatch / combine).
    """
    from .traces.cli import load_traces
    from .traces.metrics import summarize
    from .traces.model import is_comm_kernel
    from .traces.torch_trace import capture

    def before():
        if barrier is not None:
            barrier()
        if flush is not None:
            flush()

    capture(fn, path, warmup=1, samples=samples, barrier=before)
    trace = load_traces(path)[0]
    out = {name: p.gpu_us for name, p in summarize(trace).phases.items() if p.gpu_us is not None}
    per_name: dict[str, dict[int, float]] = {}
    for k in trace.kernels:
        if k.sample is None or not is_comm_kernel(k.name):
            continue
        d = per_name.setdefault(k.name, {})
        d[k.sample] = d.get(k.sample, 0.0) + (k.end_us - k.start_us)
    out["kernels"] = {n: float(np.median(list(v.values()))) for n, v in per_name.items()}
    return out
