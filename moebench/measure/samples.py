"""One rank's measurements of a built layer: correct first, then the timed samples (with
the ablation's interleaved samples), the phase times and the memory peaks."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.distributed as dist

from moebench.kernels.interfaces import NULL_PHASES
from moebench.kernels.modular import MoEKernel
from moebench.kernels.reference import TOLERANCE, reference_moe, rel_err
from moebench.measure import memory, timing
from moebench.measure.gpu_state import ClockWatch, probe_for
from moebench.measure.workload import cached_reference


def all_max(value: float, group, device) -> float:
    """The max of `value` over the ranks of `group` (collective); `value` on one rank."""
    if group is None:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


@dataclass(frozen=True)
class RankSync:
    """How each sample starts on this rank (timing.time_samples): None where not needed
    (one rank, or no GPU)."""

    barrier: Optional[Callable[[], None]]
    flush: Optional[timing.L2Flusher]
    align: Optional[Callable[[], None]]
    agree: Optional[Callable[[float], float]]
    device: Optional[torch.device] = None  # where the samples run (a hold precedes each on a GPU)

    def kwargs(self) -> dict:
        """As keyword arguments of timing.time_samples / time_interleaved."""
        return {"barrier": self.barrier, "flush": self.flush, "align": self.align, "agree": self.agree}


def rank_sync(group, device, l2_flush: bool = True) -> RankSync:
    """barrier / flush / align / agree on this rank of `group`, as the harness starts its
    samples (benchmarks/ use it too)."""
    flush = timing.L2Flusher(device) if device.type == "cuda" and l2_flush else None
    probe_for(device)  # the clock probe's stamps: allocated and compiled here, with the flush's buffer
    if group is None:
        return RankSync(None, flush, None, None, device)

    def barrier():
        if device.type == "cuda":
            dist.barrier(group=group, device_ids=[device.index])
        else:
            dist.barrier(group=group)

    align = None
    agree = lambda v: all_max(v, group, device)
    if device.type == "cuda":
        # a one-element all-reduce on the GPU: the ranks' devices leave it together, so
        # each sample's start event fires at the same moment on every rank
        one = torch.zeros(1, device=device)
        align = lambda: dist.all_reduce(one, group=group)
    return RankSync(barrier, flush, align, agree, device)


def check(
    kernel: MoEKernel,
    inputs,
    ref_weights,
    kept,
    shared_ref,
    quant: str,
    group,
    device,
    budget_bytes: int = 0,
    ref_key: Optional[tuple] = None,
) -> tuple[float, str]:
    """(rel_err, reason): the layer's output against the float32 reference on `inputs`, the
    max over ranks; reason is empty when within the quant's tolerance. The reference is
    computed first, outside runner.memory_budget's cap (`budget_bytes`): the layer's forward
    runs under it. `ref_key` names the workload the inputs and weights were drawn for: its
    reference is computed once per process (workload.cached_reference)."""
    x, w, ids = inputs
    compute = lambda: reference_moe(x, w, ids, ref_weights, kept, shared_ref)
    ref = compute() if ref_key is None else cached_reference(ref_key, compute, device)
    kernel.clear_workspaces()  # allocated under the cap, as in the forwards measured after it
    with memory.capped(device, budget_bytes):
        y = kernel(x, w, ids)
    err = rel_err(y, ref)
    del ref, y
    err = all_max(err if err == err else float("inf"), group, device)
    tol = TOLERANCE[quant]
    return err, ("" if err <= tol else f"rel_err {err:.3g} > {tol:g} ({quant})")


def _median(xs: list[float]) -> float:
    return timing.Samples(xs).median if xs else float("nan")


def phase_head_start(kernel: MoEKernel, fn, rec, sync: RankSync, device) -> int:
    """The hold before each phase sample on a GPU, in the spin clock's cycles (timing.lead_cycles;
    flushes that long where the run flushes L2: timing.sample_start),
    measured with the phase recorder on, whose events cost enqueue time; 0 on the CPU.
    Collective on several ranks. Call it before the timed samples: measuring idles the GPU
    for ~100 ms, which the time-based warm-up then undoes."""
    if device.type != "cuda":
        return 0
    kernel.phases = rec
    try:
        return timing.lead_cycles(fn, device, sync.agree)
    finally:
        kernel.phases = NULL_PHASES


class PaceCount:
    """Counts the samples the GPU started before the host had enqueued them (host-paced, as
    timing.Samples.host_paced counts the timed ones), for samples taken outside
    timing.time_interleaved: the phase, profiler and trace samples. `started()` once a sample's
    start (barrier, flush, hold, align) is enqueued, `enqueued()` once its callable is; off a GPU
    it counts the samples only (`host_paced` NaN: no hold, nothing to ask)."""

    def __init__(self, device: Optional[torch.device]):
        self.cuda = device is not None and device.type == "cuda"
        self.taken = 0
        self._paced = 0
        self._start: Optional[torch.cuda.Event] = None

    def started(self) -> None:
        if self.cuda:
            self._start = torch.cuda.Event()
            self._start.record()

    def enqueued(self) -> bool:
        """Whether the sample just enqueued was host-paced (the GPU already passed its start)."""
        self.taken += 1
        paced = self._start is not None and bool(self._start.query())
        self._start = None
        self._paced += paced
        return paced

    @property
    def host_paced(self) -> float:
        return float(self._paced) if self.cuda else float("nan")


@dataclass(frozen=True)
class PhaseSamples:
    """The phase forwards' medians (µs per phase), how many forwards were taken and how many of
    them the host paced (NaN off a GPU)."""

    us: dict
    taken: int = 0
    host_paced: float = float("nan")


def phase_samples(kernel: MoEKernel, fn, rec, reps: int, sync: RankSync, lead: int = 0) -> PhaseSamples:
    """Median µs per phase over `reps` forwards, each started as the timed samples are
    (barrier, flush, a hold of `lead` spin-clock cycles, align: without the hold a launch-bound
    phase would carry the host's launch latency), and how many of them the host still paced
    (PaceCount)."""
    from moebench.traces.nvtx import sample_range

    per_phase: dict[str, list[float]] = {}
    kernel.phases = rec
    count = PaceCount(sync.device)
    # with NVTX on (trace=nvtx|nsys), each forward in its `sample/<i>` range, so that an Nsight
    # Systems report of these samples gives per-sample phase figures as a torch trace does
    nvtx = getattr(rec, "_nvtx", None) is not None
    try:
        start = timing.sample_start(sync.barrier, sync.flush, sync.align, lead)
        # one forward first, not counted: after the timed samples the GPU sits idle, so the first
        # sample's hold began as soon as it was enqueued and the host, with the phase ranges on
        # for the first time, fell behind it (on an H100 every row's first phase sample of the
        # default sweep was host-paced, 1 of 10); behind this one each hold queues as the rest do
        start()
        rec.reset()
        fn()
        for i in range(reps):
            start()
            rec.reset()
            count.started()
            with sample_range(i, nvtx=True, record_function=False) if nvtx else nullcontext():
                fn()
            count.enqueued()
            for name, us in rec.durations_us().items():
                per_phase.setdefault(name, []).append(us)
    finally:
        kernel.phases = NULL_PHASES
    return PhaseSamples({name: _median(v) for name, v in per_phase.items()}, count.taken, count.host_paced)


@dataclass(frozen=True)
class Timed:
    samples_us: list
    no_shared_samples_us: Optional[list]
    shared_samples_us: Optional[list]
    phases_us: dict
    host_paced: int = 0  # of the layer's samples (timing.Samples.host_paced)
    # of the ablation's samples: the layer without its shared experts, the shared experts alone
    host_paced_no_shared: int = 0
    host_paced_shared: int = 0
    phases: PhaseSamples = field(default_factory=lambda: PhaseSamples({}))
    clock: dict = field(default_factory=dict)  # the clock group's columns (gpu_state.ClockWatch.fields)

    def paced_fields(self, cuda: bool) -> dict:
        """The row's host-paced counts (results/row.py, group "host"): NaN off a GPU (no hold) and
        where there were no such samples."""
        nan = float("nan")
        ablation = self.shared_samples_us is not None
        return {
            "host_paced_samples": float(self.host_paced) if cuda else nan,
            "host_paced_no_shared": float(self.host_paced_no_shared) if cuda and ablation else nan,
            "host_paced_shared": float(self.host_paced_shared) if cuda and ablation else nan,
            "num_phase_samples": float(self.phases.taken) if self.phases.taken else nan,
            "host_paced_phases": self.phases.host_paced if cuda and self.phases.taken else nan,
        }


def _shared_alone(kernel: MoEKernel, x: torch.Tensor) -> Callable[[], torch.Tensor]:
    """The shared experts alone, as the layer runs them: with overlap=none their down GEMM adds
    into an output (SharedExperts.add_to, here a buffer of the layer output's shape), beside
    the communication they compute their own output."""
    shared = kernel.shared
    assert shared is not None
    if kernel.shared_last:
        into = torch.zeros(x.shape[0], x.shape[1], dtype=torch.bfloat16, device=x.device)
        return lambda: shared.add_to(into, x)
    return lambda: shared(x)


def time_layer(
    kernel: MoEKernel,
    inputs,
    combo,
    sync: RankSync,
    device,
    rec,
    graph: bool,
    hold_us: Optional[float] = None,
    lap: Callable[[str], object] = lambda stage: None,
) -> Timed:
    """The layer's samples and, for the ablation, those of the layer without its shared
    experts and of the shared experts alone, interleaved; then the phase samples. On a GPU
    every sample waits behind a hold sized from `hold_us`, the host's enqueue time of one
    eager forward (timing.time_interleaved), graph replays too, so that both see the GPU
    busy alike. `lap(stage)` marks the ends of the probe, the timed samples and the phases (the
    worker's Stopwatch)."""
    x, w, ids = inputs
    fn = lambda: kernel(x, w, ids)
    fns = [fn]
    if kernel.shared is not None:
        fns += [lambda: kernel(x, w, ids, with_shared=False), _shared_alone(kernel, x)]
    lead = phase_head_start(kernel, fn, rec, sync, device) if combo.phase_reps else 0
    # (a stand-in combination without the knobs: no polling, no retakes)
    watch = ClockWatch.for_device(device, getattr(combo, "nvml_poll_ms", 0.0), getattr(combo, "drop_throttled", False))
    lap("probe")
    with watch.polling():
        timed = timing.time_interleaved(
            fns,
            device,
            combo.reps,
            combo.warmup,
            barrier=sync.barrier,
            flush=sync.flush,
            align=sync.align,
            graph=graph,
            warmup_ms=combo.warmup_ms,
            agree=sync.agree,
            hold_us=hold_us,
            probe=watch.probe,
            retake=watch.retake(),
        )
    lap("timing")
    phases = phase_samples(kernel, fn, rec, combo.phase_reps, sync, lead) if combo.phase_reps else PhaseSamples({})
    lap("phases")
    shared = kernel.shared is not None
    return Timed(
        timed[0].us,
        timed[1].us if shared else None,
        timed[2].us if shared else None,
        phases.us,
        timed[0].host_paced,
        timed[1].host_paced if shared else 0,
        timed[2].host_paced if shared else 0,
        phases,
        watch.fields(timed[0], device.type == "cuda"),
    )


def paced_mode(mode: str, host_us: float, host_paced: int, reps: int) -> str:
    """The timing mode a GPU row reports: `host` where the host set the pace of the layer's
    samples (a forward that syncs the host, whose enqueue outlasts timing.HOST_SYNCS_US, or
    more than timing.HOST_PACED_MAX of the samples started on the GPU before the host had
    enqueued them), so that its latency is never read as GPU time; else `mode`."""
    if host_us > timing.HOST_SYNCS_US or (reps and host_paced > timing.HOST_PACED_MAX * reps):
        return "host"
    return mode


def host_time_note(host_us: float, host_paced: int, reps: int) -> str:
    """Why a row's latency is host time (its timing_mode `host`)."""
    if host_us > timing.HOST_SYNCS_US:
        return (
            f"the forward syncs the host (its enqueue takes {host_us / 1e3:.1f} ms behind a busy GPU): "
            "the host paced every sample"
        )
    return (
        f"{host_paced} of {reps} samples started on the GPU before the host had enqueued them, "
        "with the hold doubled twice: the host paced them"
    )


def host_enqueue(kernel: MoEKernel, inputs, device) -> float:
    """µs the host takes to enqueue one eager forward while the GPU is busy, the median of
    five (NaN on the CPU): the host time of the layer, a figure of its own beside the GPU
    time, and what sizes the hold before each timed sample. Measure it before the timed
    samples (it idles the GPU ~100 ms, which their warm-up undoes) and outside an nsys
    capture (its spin kernels would land in the report)."""
    if device.type != "cuda":
        return float("nan")
    x, w, ids = inputs
    return timing.host_enqueue_us(lambda: kernel(x, w, ids), device)


def memory_figures(kernel: MoEKernel, fn, tokens: int, device, setup_used, baseline_used) -> dict:
    """Analytic workspace and peak, the allocator peak of one forward above what was
    allocated before it, and the device-level peak above the context baseline (bytes)."""
    out = {
        "workspace_bytes_analytic": float(kernel.workspace_bytes(tokens)),
        "analytic_peak_bytes": float(kernel.analytic_peak_bytes(tokens)),
    }
    peak = memory.forward_peak_bytes(fn, device, kernel.clear_workspaces)
    if peak is not None:
        out["workspace_bytes_peak"] = float(peak)
        if setup_used is not None and baseline_used is not None:
            out["device_bytes_peak"] = float(setup_used - baseline_used + peak)
    return out
