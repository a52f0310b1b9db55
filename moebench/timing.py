"""Timing: CUDA events (or the host clock on CPU), CUDA-graph replay, raw
samples with median / p20 / p80, an L2 flush between samples, ranks barriered
before each sample."""
from __future__ import annotations

import math
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
    warmup_ms: float = 0.0,
    agree: Optional[Callable[[float], float]] = None,
) -> Samples:
    """Time fn() `reps` times after `warmup` calls (see time_interleaved)."""
    return time_interleaved([fn], device, reps, warmup, barrier, flush, align, graph, warmup_ms, agree)[0]


def time_interleaved(
    fns: Sequence[Callable[[], object]],
    device: torch.device,
    reps: int,
    warmup: int,
    barrier: Optional[Callable[[], None]] = None,
    flush: Optional[Callable[[], None]] = None,
    align: Optional[Callable[[], None]] = None,
    graph: bool = False,
    warmup_ms: float = 0.0,
    agree: Optional[Callable[[float], float]] = None,
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
    As the barrier leaves the GPU idle, a short callable would be timed with its
    host launch latency in it (a ~50 µs shared expert read 105-250 µs over 2
    ranks): so each callable's host enqueue time is measured once behind a
    busy GPU, and the GPU gets that much head start (a spin kernel between
    `align` and the start event), unless the callable syncs the host anyway.
    graph=True captures each callable in a CUDA graph and times its replays.

    warmup_ms (GPU only): after the `warmup` calls, keep calling for about this
    long, so that sampling starts at the clock the GPU sustains under this load
    rather than at its idle boost (an H200 runs a GEMM ~10% faster in its first
    tens of ms than after ~100 ms: docs/findings/timing.md). With several ranks,
    `agree` (a max over the ranks) makes them run the same number of calls.
    """
    if graph:
        fns = [_capture(fn, device, warmup) for fn in fns]
    for _ in range(warmup):
        for fn in fns:
            fn()
    _sync(device)
    cuda = device.type == "cuda"
    lead = [0] * len(fns)
    if cuda and barrier is not None:
        # before the time-based warm-up: measuring it spins the GPU idle for 3 x 20 ms a
        # callable, long enough for the clock to climb back to its idle boost
        lead = [lead_cycles(fn, device, agree) for fn in fns]
    if warmup_ms > 0 and cuda:
        warm_for(fns, device, warmup_ms, flush, agree)
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
    # here: several ranks (barrier set) or the CPU; the barrier also drains the GPU, the
    # flush keeps it busy while the host enqueues, the spin (lead) while it enqueues fn
    starts = [sample_start(barrier, flush, align, lead[j]) for j in range(len(fns))]
    for i in range(reps):
        for j, fn in enumerate(fns):
            starts[j]()
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


_CYCLES_PER_US: dict = {}
HOST_SYNCS_US = 15_000.0  # a callable whose enqueue outlasts a 20 ms busy GPU waits on it


def back_to_back_us(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """An independent reference for a timed callable (do_bench's way): `reps` calls enqueued
    back to back between two events, no flush or host gap between them; the mean per call (µs)."""
    with torch.cuda.device(device):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(reps):
            fn()
        e.record()
        e.synchronize()
    return s.elapsed_time(e) * 1e3 / reps


def _cycles_per_us(device: torch.device) -> float:
    """Clock cycles per µs of torch.cuda._sleep's spin, measured once per device."""
    if device not in _CYCLES_PER_US:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1_000_000)
        a.record()
        torch.cuda._sleep(10_000_000)
        b.record()
        b.synchronize()
        _CYCLES_PER_US[device] = 10_000_000 / (a.elapsed_time(b) * 1e3)
    return _CYCLES_PER_US[device]


def host_enqueue_us(fn: Callable[[], object], device: torch.device, tries: int = 3) -> float:
    """Median host time of calling fn() while the GPU has ~20 ms of work queued,
    so no launch waits for the GPU: fn's pure enqueue cost. A result above
    HOST_SYNCS_US means fn waits on the GPU (e.g. reads a count back)."""
    cyc = _cycles_per_us(device)
    out = []
    for _ in range(tries):
        torch.cuda._sleep(int(20_000 * cyc))
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
        _sync(device)
    return float(np.median(out))


def lead_cycles(fn, device, agree) -> int:
    """Spin cycles to put before fn's start event (0 when fn syncs the host): the head
    start a multi-rank sample gives the GPU. Calls fn 3 times, then `agree` once (the
    same calls on every rank, whatever each measures)."""
    us = host_enqueue_us(fn, device)
    if agree is not None:
        us = agree(us)
    if us > HOST_SYNCS_US:
        return 0
    return int((1.25 * us + 20.0) * _cycles_per_us(device))



def sample_start(barrier=None, flush=None, align=None, lead: int = 0) -> Callable[[], None]:
    """What precedes each sample on several ranks, outside its timing (timed, phase,
    profiler and trace samples): the barrier, the
    L2 flush, the GPU alignment, then `lead` spin cycles of head start (lead_cycles)."""
    def start() -> None:
        if barrier is not None:
            barrier()
        if flush is not None:
            flush()
        if align is not None:
            align()
        if lead:
            torch.cuda._sleep(lead)

    return start


def warm_for(fns, device, warmup_ms: float, flush, agree) -> None:
    """Call the callables (in turn, flushing L2 as sampling will) for ~warmup_ms."""
    def one_round():
        for fn in fns:
            if flush is not None:
                flush()
            fn()

    t0 = time.perf_counter()
    one_round()
    _sync(device)
    round_ms = max((time.perf_counter() - t0) * 1e3, 1e-3)
    n = float(min(10_000, math.ceil(warmup_ms / round_ms)))
    if agree is not None:
        n = agree(n)
    for _ in range(int(n)):
        one_round()
    _sync(device)


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
