"""Per-phase durations, the stream timeline and shared/communication overlap of a `Trace`.

Definitions (all µs, per sample, then the median across samples):
- phase `cpu_us`: summed duration of the phase's CPU ranges (inclusive of nested ones);
- phase `gpu_us`: union busy time of the GPU activities launched inside any range of
  that phase (inclusive: `finalize` counts its `combine` and `weight_reduce` kernels);
- `shared_us`: union time of the shared-expert kernels (launched inside `shared_experts`);
- `comm_us`: union time of the communication kernels (NCCL, DeepEP, pplx, symm-mem);
- `overlap_us` = |shared ∩ comm|; `trace_overlap_fraction` = overlap_us / shared_us;
- `shared_exposed_us` = shared_us − overlap_us (shared-expert time not hidden by comm).
A sample is a `sample/<i>` range; without them the whole trace is one sample.
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Optional

from moebench.traces.model import PHASES, Trace


# -- interval arithmetic (µs) -------------------------------------------------
def union(intervals) -> list:
    """Merge (start, end) intervals into sorted disjoint ones."""
    out: list = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def length(disjoint) -> float:
    return float(sum(e - s for s, e in disjoint))


def intersect(a, b) -> list:
    """Intersection of two sorted disjoint interval lists."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


# -- results ------------------------------------------------------------------
@dataclass
class PhaseStats:
    """Median over samples of one phase: CPU range time and GPU kernel busy time (µs)."""

    name: str
    cpu_us: Optional[float]
    gpu_us: Optional[float]
    num_ranges: int  # per sample (median)
    num_kernels: int  # per sample (median)


@dataclass
class StreamStats:
    """One GPU stream: median over samples of its busy time (µs) and of what ran on it."""

    lane: str
    num_kernels: int  # over all samples
    busy_us: float  # union busy time per sample (median)
    comm_us: float
    shared_us: float
    phases: dict  # innermost phase -> busy µs per sample (median)


@dataclass
class TraceSummary:
    source: str
    fmt: str
    num_samples: int
    combos: list
    phases: dict  # name -> PhaseStats
    streams: list  # [StreamStats]
    shared_us: Optional[float]
    comm_us: Optional[float]
    overlap_us: Optional[float]
    trace_overlap_fraction: Optional[float]
    shared_exposed_us: Optional[float]
    per_sample: list = field(default_factory=list)  # [dict] raw per-sample figures
    notes: list = field(default_factory=list)

    def as_row(self) -> dict:
        """Flat figures for the results store (µs; fraction in [0, 1]; None where absent)."""
        row = {
            "trace_overlap_fraction": self.trace_overlap_fraction,
            "trace_shared_us": self.shared_us,
            "trace_comm_us": self.comm_us,
            "trace_overlap_us": self.overlap_us,
            "trace_shared_exposed_us": self.shared_exposed_us,
        }
        for name, p in self.phases.items():
            row[f"trace_{name}_cpu_us"] = p.cpu_us
            row[f"trace_{name}_gpu_us"] = p.gpu_us
        return row


def _median(values) -> Optional[float]:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _sample_figures(kernels: list, ranges: list) -> dict:
    fig: dict = {"phases": {}}
    for ph in PHASES:
        rs = [r for r in ranges if r.name == ph]
        ks = [k for k in kernels if ph in k.phases]
        fig["phases"][ph] = {
            "cpu_us": sum(r.dur_us for r in rs) if rs else None,
            "gpu_us": length(union((k.start_us, k.end_us) for k in ks)) if ks else None,
            "num_ranges": len(rs),
            "num_kernels": len(ks),
        }
    shared = union((k.start_us, k.end_us) for k in kernels if k.shared)
    comm = union((k.start_us, k.end_us) for k in kernels if k.comm)
    have_gpu = bool(kernels)
    shared_us, comm_us = length(shared), length(comm)
    overlap_us = length(intersect(shared, comm))
    fig["shared_us"] = shared_us if have_gpu else None
    fig["comm_us"] = comm_us if have_gpu else None
    fig["overlap_us"] = overlap_us if have_gpu else None
    fig["trace_overlap_fraction"] = overlap_us / shared_us if shared_us > 0 else None
    fig["shared_exposed_us"] = shared_us - overlap_us if have_gpu else None
    return fig


def _lane_key(lane: str) -> tuple:
    """Sort "dev<d>/s<s>" lanes numerically."""
    m = re.fullmatch(r"dev(-?\d+)/s(-?\d+)", lane)
    return (int(m.group(1)), int(m.group(2)), "") if m else (1 << 30, 0, lane)


def _stream_stats(groups: list) -> list:
    """Per-lane figures: busy/comm/shared/phase time per sample, medians across `groups` (lists of kernels)."""
    lanes = sorted({k.lane for ks in groups for k in ks}, key=_lane_key)
    out = []
    for lane in lanes:
        per = []  # per sample: (busy, comm, shared, {phase: busy})
        count = 0
        for ks in groups:
            ks = [k for k in ks if k.lane == lane]
            count += len(ks)
            iv = lambda sel: length(union((k.start_us, k.end_us) for k in ks if sel(k)))  # noqa: E731
            phases = {ph: iv(lambda k, ph=ph: k.phase == ph) for ph in PHASES}
            per.append((iv(lambda k: True), iv(lambda k: k.comm), iv(lambda k: k.shared), phases))
        phases = {ph: statistics.median(p[3][ph] for p in per) for ph in PHASES}
        out.append(
            StreamStats(
                lane=lane,
                num_kernels=count,
                busy_us=statistics.median(p[0] for p in per),
                comm_us=statistics.median(p[1] for p in per),
                shared_us=statistics.median(p[2] for p in per),
                phases={ph: v for ph, v in phases.items() if v > 0},
            )
        )
    return out


def summarize(trace: Trace) -> TraceSummary:
    """Phases, streams and overlap of an attributed trace (see the module docstring for definitions)."""
    samples = trace.sample_ranges()
    notes = list(trace.notes)
    if samples:
        groups = []
        for idx, sr in samples:
            ks = [k for k in trace.kernels if k.sample == idx]
            rs = [r for r in trace.ranges if r.name in PHASES and sr.start_us <= r.start_us <= sr.end_us]
            groups.append((idx, ks, rs))
        outside = sum(k.sample is None for k in trace.kernels)
        if outside:
            notes.append(f"{outside} GPU activities outside every sample/<i> range (warm-up?) left out")
    else:
        groups = [(None, trace.kernels, trace.phase_ranges())]
    if not trace.kernels:
        notes.append("no GPU activity in the trace: only CPU range times")
    elif not any(k.launch_us is not None for k in trace.kernels):
        notes.append("no launch records: kernels cannot be mapped to phases")

    per_sample = []
    for idx, ks, rs in groups:
        fig = _sample_figures(ks, rs)
        fig["sample"] = idx
        per_sample.append(fig)

    phases = {}
    for ph in PHASES:
        vals = [f["phases"][ph] for f in per_sample]
        if not any(v["num_ranges"] or v["num_kernels"] for v in vals):
            continue
        phases[ph] = PhaseStats(
            name=ph,
            cpu_us=_median(v["cpu_us"] for v in vals),
            gpu_us=_median(v["gpu_us"] for v in vals),
            num_ranges=int(statistics.median(v["num_ranges"] for v in vals)),
            num_kernels=int(statistics.median(v["num_kernels"] for v in vals)),
        )
    return TraceSummary(
        source=trace.source,
        fmt=trace.fmt,
        num_samples=len(samples),
        combos=trace.combos(),
        phases=phases,
        streams=_stream_stats([ks for _, ks, _ in groups]),
        shared_us=_median(f["shared_us"] for f in per_sample),
        comm_us=_median(f["comm_us"] for f in per_sample),
        overlap_us=_median(f["overlap_us"] for f in per_sample),
        trace_overlap_fraction=_median(f["trace_overlap_fraction"] for f in per_sample),
        shared_exposed_us=_median(f["shared_exposed_us"] for f in per_sample),
        per_sample=per_sample,
        notes=notes,
    )


# -- markdown -----------------------------------------------------------------
def _fmt(v, digits: int = 1) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def to_markdown(s: TraceSummary) -> str:
    """The summary as markdown tables (phases, streams, overlap)."""
    samples = f"{s.num_samples} samples (median)" if s.num_samples else "whole trace"
    lines = [f"### {s.source}", "", f"format: {s.fmt}; combos: {', '.join(s.combos) or '–'}; {samples}", ""]
    lines += ["| phase | cpu µs | gpu µs | ranges | kernels |", "|---|---:|---:|---:|---:|"]
    for p in s.phases.values():
        lines.append(f"| {p.name} | {_fmt(p.cpu_us)} | {_fmt(p.gpu_us)} | {p.num_ranges} | {p.num_kernels} |")
    if s.streams:
        lines += ["", "| stream | kernels (all samples) | busy µs | comm µs | shared µs | phases (µs) |",
                  "|---|---:|---:|---:|---:|---|"]
        for st in s.streams:
            ph = ", ".join(f"{k} {v:.1f}" for k, v in sorted(st.phases.items(), key=lambda kv: -kv[1]))
            lines.append(f"| {st.lane} | {st.num_kernels} | {st.busy_us:.1f} | {st.comm_us:.1f} | "
                         f"{st.shared_us:.1f} | {ph or '–'} |")
    lines += ["", "| shared µs | comm µs | overlap µs | trace_overlap_fraction | shared exposed µs |",
              "|---:|---:|---:|---:|---:|",
              f"| {_fmt(s.shared_us)} | {_fmt(s.comm_us)} | {_fmt(s.overlap_us)} | "
              f"{_fmt(s.trace_overlap_fraction, 3)} | {_fmt(s.shared_exposed_us)} |"]
    for n in s.notes:
        lines.append(f"\nnote: {n}")
    return "\n".join(lines) + "\n"
