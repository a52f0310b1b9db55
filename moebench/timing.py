"""Timing: CUDA events (or the host clock on CPU), CUDA-graph replay, raw
samples with median / p20 / p80, an L2 flush between samples, ranks barriered
before each sample."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import torch

L2_FLUSH_BYTES = 256 * 2**20  # > 4x the H200's 60 MB L2
NOISY_SPREAD = 1.10  # p80/p20 above this is reported as a wide spread


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

    @property
    def spread(self) -> float:
        """p80 / p20 (1.0 = no spread)."""
        return self.p80 / self.p20 if self.us and self.p20 > 0 else float("nan")


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
    align: Optional[Callable[[], None]] = None,
    graph: bool = False,
) -> Samples:
    """Time fn() `reps` times after `warmup` calls (see time_interleaved)."""
    return time_interleaved([fn], device, reps, warmup, barrier, flush, align, graph)[0]


def time_interleaved(
    fns: Sequence[Callable[[], object]],
    device: torch.device,
    reps: int,
    warmup: int,
    barrier: Optional[Callable[[], None]] = None,
    flush: Optional[Callable[[], None]] = None,
    align: Optional[Callable[[], None]] = None,
    graph: bool = False,
) -> list[Samples]:
    """Time several callables with their samples interleaved (A B C A B C ...),
    so that drift (clocks, temperature, other tenants of the host) hits them
    alike, which an ablation (the layer with and without its shared experts)
    needs; one Samples per callable, µs.

    CUDA events on a GPU, the monotonic clock on CPU. One GPU rank: samples are
    enqueued back to back, each after an L2 flush, and read once (as do_bench
    does: the GPU never idles, the host's launch latency is hidden). Several
    ranks: before each sample a barrier (all ranks start together), the L2
    flush, then `align` (e.g. a one-element all-reduce on the GPU, so that the
    ranks' start events fire together on the devices rather than when each
    host gets there), then the start event, with no host sync in between.
    graph=True captures each callable in a CUDA graph and times its replays.
    """
    if graph:
        fns = [_capture(fn, device, warmup) for fn in fns]
    for _ in range(warmup):
        for fn in fns:
            fn()
    _sync(device)
    cuda = device.type == "cuda"
    if cuda and barrier is None:
        ev = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
              for _ in fns]
        for i in range(reps):
            for j, fn in enumerate(fns):
                if flush is not None:
                    flush()
                ev[j][i][0].record()
                fn()
                ev[j][i][1].record()
        torch.cuda.synchronize(device)
        return [Samples([s.elapsed_time(e) * 1e3 for s, e in evs]) for evs in ev]
    out: list[list[float]] = [[] for _ in fns]
    if cuda:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
    for i in range(reps):
        for j, fn in enumerate(fns):
            if barrier is not None:
                barrier()  # ranks start together (NCCL's barrier also drains the GPU)
            else:
                _sync(device)
            if flush is not None:
                flush()  # keeps the GPU busy while the host enqueues the sample
            if align is not None:
                align()
            if cuda:
                start.record()
                fn()
                end.record()
                end.synchronize()
                out[j].append(start.elapsed_time(end) * 1e3)
            else:
                t0 = time.perf_counter_ns()
                fn()
                out[j].append((time.perf_counter_ns() - t0) / 1e3)
    return [Samples(o) for o in out]


def _capture(fn: Callable[[], object], device: torch.device, warmup: int) -> Callable[[], None]:
    """fn() captured once in a CUDA graph; returns its replay (launch gaps removed)."""
    s = torch.cuda.Stream(device)
    s.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(s):  # warm up outside the capture (allocator, autotuning)
        for _ in range(max(1, warmup)):
            fn()
    torch.cuda.current_stream(device).wait_stream(s)
    _sync(device)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


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
