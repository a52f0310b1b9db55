"""Trace capture on one rank: profiler mode's kernel durations per phase, the torch trace
of a row (trace=torch), and the NVTX range that opens one nsys capture per row
(trace=nsys). Each returns what the row gets, as a dict of RankResult fields."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from moebench.kernels.interfaces import NULL_PHASES
from moebench.measure import timing
from moebench.measure.samples import PaceCount, RankSync
from moebench.util.safe_write import safe_dir


def make_recorder(device, nvtx: bool):
    from moebench.traces.nvtx import make_phase_recorder

    return make_phase_recorder(nvtx=nvtx, record_function=True, cuda_events=True, device=device)


def profile_kernels(
    fn, path: str, samples: int, sync: RankSync, device=None, pace: PaceCount | None = None, key: str | None = None
) -> dict:
    """Profiler mode: kernel durations per phase, what library benchmarks report.

    Each sample starts as a timed one does: on a GPU after the L2 flush and a hold long
    enough for the host to enqueue the forward; on several ranks after the barrier and the
    GPU alignment too, so that a communication kernel does not hold its wait for a peer that
    launched later (DeepEP's low-latency dispatch read 118 µs on one rank, 27 µs on the
    other, without them).

    Runs `samples` forwards under torch.profiler (phase ranges must be on), writes the
    trace to `path`, and returns medians over samples (µs): `<phase>` = busy GPU time of
    the kernels launched inside the phase, and `kernels` = {kernel name: median summed
    duration per sample} for the communication kernels (e.g. DeepEP's notify_dispatch /
    dispatch / combine); `pace` (PaceCount) counts the samples the host paced.
    """
    from moebench.traces.files import load_traces
    from moebench.traces.metrics import summarize
    from moebench.traces.model import is_comm_kernel
    from moebench.traces.torch_trace import capture

    cuda = device is not None and device.type == "cuda"
    lead = 0
    if cuda:
        fn()
        lead = timing.lead_cycles(fn, device, sync.agree)
    if cuda:
        timing.warm_for([fn], device, 200.0, sync.flush, sync.agree)  # the sustained clock, as timed samples see it
    capture(
        fn,
        path,
        warmup=1,
        samples=samples,
        barrier=timing.sample_start(sync.barrier, sync.flush, sync.align, lead),
        pace=pace,
        combo_key=key,  # the trace names its combination (`moebench trace`'s combos line), as trace=torch's do
    )
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


def profiled_phases(
    kernel, fn, key: str, rank: int, tokens: int, run_dir: str, reps: int, sync: RankSync, device
) -> dict:
    """Phase times from kernel durations (torch profiler), replacing the event-based ones:
    {"phases_us", "kernel_us", "profiler_trace_path", "num_phase_samples", "host_paced_phases"}
    (the profiled samples, and how many of them the host paced: NaN off a GPU)."""
    from moebench.traces import torch_trace

    path = torch_trace.trace_path(os.path.join(run_dir, "traces", "profiler"), key, rank, tokens, gzip_=True)
    safe_dir(run_dir, "traces", "profiler", key)  # real folders, never links (moebench/util/safe_write.py)
    kernel.phases = make_recorder(torch.device("cpu"), nvtx=False)  # record_function ranges only
    pace = PaceCount(device)
    try:
        prof = profile_kernels(
            fn, str(path), samples=max(3, min(reps, 20)), sync=sync, device=device, pace=pace, key=key
        )
    finally:
        kernel.phases = NULL_PHASES
    kernels = prof.pop("kernels")
    return {
        "phases_us": prof,
        "kernel_us": json.dumps(kernels, sort_keys=True),
        "profiler_trace_path": os.path.relpath(path, run_dir),
        "num_phase_samples": float(pace.taken),
        "host_paced_phases": pace.host_paced,
    }


_nsys_captures = 0  # capture ranges this rank process has opened: nsys numbers its reports in this order


@contextmanager
def nsys_capture(key: str, run_dir: str, tokens: int = 0, rank: int = 0) -> Iterator[dict]:
    """Under nsys, around the timed work of one row (the timed samples and the phase samples):
    the NVTX range that starts and ends one capture (traces/nsys.py `nsys_rank_prefix`),
    recorded in this rank process's capture manifest (traces/nsys.py `record_capture`): once the
    ranks have exited, the launcher sets the row's `trace_path` to the report that exists, or its
    `trace_error` to why there is none (traces/nsys_import.py `resolve_nsys_rows`). Yields {}:
    the row names no file before it exists."""
    global _nsys_captures
    from moebench.traces.nsys import record_capture
    from moebench.traces.nvtx import capture_range

    with capture_range(key) as api:
        if api is not None:
            _nsys_captures += 1
        record_capture(run_dir, os.getpid(), _nsys_captures if api is not None else None, key, tokens, rank, api)
        yield {}


def capture_trace(
    kernel, fn, key: str, rank: int, T: int, run_dir: str, combo, sync: RankSync, inputs=None, world_size: int = 1
) -> dict:
    """Torch trace of `combo.trace_samples` layer samples (`sample/<i>`); when the layer
    overlaps shared experts (overlap != none) and `inputs` = (x, w, ids) are given, then as
    many samples of the layer without them (`sample_noshared/<i>`: kernel(x, w, ids,
    with_shared=False)) and of the shared experts alone (`sample_shared/<i>`: kernel.shared(x),
    inside a `shared_experts` range), from which traces/metrics.py computes the stretch-aware
    `trace_overlap_fraction`. Every rank runs the same sequence, with the barrier, then the
    GPU alignment (`align`, as the timed samples have it), before each sample, outside its
    range: a rank that starts late would otherwise show up as waiting inside its peer's
    communication kernels. On a GPU each sample also starts as a timed one does: after the
    L2 flush and a hold of the slowest callable's host enqueue time (timing.lead_cycles,
    measured with the trace's ranges on), so that the trace shows the GPU's work rather than
    the host's launch gaps. With several ranks (all on
    this host: the process group rendezvous is on 127.0.0.1), rank 0 then reads every
    rank's trace and adds `trace_matched_overlap_per_rank` (traces/metrics.py: the overlap
    on communication intervals trimmed of the wait for the last rank). `num_trace_samples`
    and `host_paced_trace` count the trace's samples (its ablation samples included) and those
    the host paced (NaN off a GPU), which the trace marks too (torch_trace.capture)."""
    from moebench.traces import torch_trace

    barrier, flush, align, agree = sync.barrier, sync.flush, sync.align, sync.agree
    path = torch_trace.trace_path(os.path.join(run_dir, combo.trace_dir), key, rank, T)
    safe_dir(run_dir, *Path(combo.trace_dir).parts, key)  # real folders, never links (moebench/util/safe_write.py)
    rec = make_recorder(torch.device("cpu"), nvtx=True)  # record_function ranges only
    ablation = None
    if inputs is not None and kernel.shared is not None and kernel.overlap != "none":
        x, w, ids = inputs

        def shared_alone():
            with kernel.phases("shared_experts"):
                return kernel.shared(x)

        ablation = {"noshared": lambda: kernel(x, w, ids, with_shared=False), "shared": shared_alone}
    kernel.phases = rec
    device = sync.device if sync.device is not None and sync.device.type == "cuda" else None
    lead = 0
    try:
        if device is not None:  # collective on several ranks: the same calls on every rank
            lead = max(timing.lead_cycles(f, device, agree) for f in [fn, *(ablation or {}).values()])
    except BaseException:
        kernel.phases = NULL_PHASES
        raise

    start = timing.sample_start(barrier, flush, align, lead) if (device is not None or flush is not None) else barrier
    pace = PaceCount(device)
    try:
        torch_trace.capture(
            fn, path, samples=combo.trace_samples, combo_key=key, barrier=start, ablation=ablation, pace=pace
        )
    finally:
        kernel.phases = NULL_PHASES
    out = {
        "trace_path": os.path.relpath(path, run_dir),
        "num_trace_samples": float(pace.taken),
        "host_paced_trace": pace.host_paced,
    }
    try:
        from moebench.traces.analyze import trace_row

        row = trace_row(path)
        if row["trace_overlap_fraction"] is not None:
            out["trace_overlap_fraction"] = row["trace_overlap_fraction"]
            out["trace_overlap_method"] = row["trace_overlap_method"]
        if row["trace_intersection_fraction"] is not None:
            out["trace_intersection_fraction"] = row["trace_intersection_fraction"]
        if row.get("trace_layer_us") is not None:
            out["trace_layer_us"] = row["trace_layer_us"]
    except Exception as e:  # noqa: BLE001 (a trace we cannot parse still leaves the row, with trace_error)
        out["trace_error"] = f"{type(e).__name__}: {e}"
    if world_size > 1 and barrier is not None:
        barrier()  # every rank's trace is written
        if rank == 0:
            paths = [
                torch_trace.trace_path(os.path.join(run_dir, combo.trace_dir), key, r, T) for r in range(world_size)
            ]
            try:
                from moebench.traces.analyze import matched_figures

                out.update(matched_figures(paths))
            except Exception as e:  # noqa: BLE001 (a peer's trace missing or unreadable: the per-rank figures stay)
                out["trace_error"] = f"matched figure: {type(e).__name__}: {e}"
    return out
