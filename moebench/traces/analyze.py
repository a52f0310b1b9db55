"""One-call trace figures for the worker: the overlap fraction and the `trace_*` row columns."""

from __future__ import annotations

from typing import Optional

from moebench.traces.files import load_traces
from moebench.traces.matched import matched_overlap
from moebench.traces.metrics import summarize


def trace_row(path) -> dict:
    """`TraceSummary.as_row()` of a trace file (the first process of an nsys report):
    `trace_overlap_fraction` (stretch-aware when the trace holds ablation samples, else the
    plain intersection figure; `trace_overlap_method` says which), `trace_intersection_fraction`,
    `trace_shared_us`, `trace_comm_us`, `trace_overlap_us`, `trace_window_us`,
    `trace_shared_alone_us`, `trace_comm_alone_us`, `trace_comm_stretch`, `trace_shared_stretch`,
    `trace_shared_exposed_us`, `trace_<phase>_cpu_us`, `trace_<phase>_gpu_us` (µs; None where
    absent). Raises ValueError for an unreadable file.
    """
    return summarize(load_traces(path)[0]).as_row()


def overlap_from_trace(path) -> Optional[float]:
    """`trace_overlap_fraction` of a trace file (metrics.py): with ablation samples in the trace,
    clamp(1 − (median |shared ∪ comm| − comm alone) / shared alone, 0, 1); without them the
    median over samples of |shared-expert kernels ∩ communication kernels| / |shared-expert kernels|.

    None when the trace has no shared-expert GPU kernels (CPU traces, overlap=none
    without shared experts). Raises ValueError for an unreadable file.
    """
    return trace_row(path)["trace_overlap_fraction"]


def matched_figures(paths) -> dict:
    """`trace_matched_overlap_per_rank` and `trace_wait_us_per_rank` from every rank's trace
    file of one combination and token count (in rank order), or {} when the figure is
    undefined (metrics.matched_overlap)."""
    m = matched_overlap([load_traces(p)[0] for p in paths])
    if m is None:
        return {}
    return {"trace_matched_overlap_per_rank": m.fraction_per_rank, "trace_wait_us_per_rank": m.wait_us_per_rank}
