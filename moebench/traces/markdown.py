"""Markdown of a trace summary (moebench trace): the phase, stream and overlap tables."""
from __future__ import annotations

from moebench.traces.metrics import METHOD_INTERSECTION, METHOD_STRETCH, TraceSummary


def _fmt(v, digits: int = 1) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


OVERLAP_HEADER = "| overlap of shared experts and communication | µs / fraction |"


def overlap_table(s: TraceSummary) -> str:
    """The overlap figures as a two-column markdown table (medians over samples; module docstring)."""
    alone = s.method == METHOD_STRETCH
    na = s.num_ablation_samples
    counts = f"{s.num_samples or 1} / {na.get('noshared', 0)} / {na.get('shared', 0)}"
    frac_label = ("stretch-aware: 1 − exposed / shared alone" if alone else
                  "plain intersection" if s.method == METHOD_INTERSECTION else "–")
    exposed_label = "window − comm alone" if alone else "shared in layer − intersection"
    rows = [
        ("samples: layer / without shared experts / shared experts alone (medians below)", counts),
        ("shared experts alone (`sample_shared`)", _fmt(s.shared_alone_us)),
        ("shared experts in the layer", _fmt(s.shared_us)),
        ("comm alone (`sample_noshared`)", _fmt(s.comm_alone_us)),
        ("comm in the layer", _fmt(s.comm_us)),
        ("comm stretch (in layer / alone)", _fmt(s.comm_stretch, 3)),
        ("window: comm ∪ shared", _fmt(s.window_us)),
        ("layer sample's GPU span (first kernel start to last end)", _fmt(s.layer_us)),
        ("intersection: comm ∩ shared", _fmt(s.overlap_us)),
        (f"exposed ({exposed_label})", _fmt(s.shared_exposed_us)),
        (f"**trace_overlap_fraction** ({frac_label})", _fmt(s.trace_overlap_fraction, 3)),
        ("intersection_fraction (intersection / shared in layer)", _fmt(s.intersection_fraction, 3)),
    ]
    lines = [OVERLAP_HEADER, "|---|---:|"] + [f"| {a} | {b} |" for a, b in rows]
    return "\n".join(lines)


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
    lines += ["", overlap_table(s)]
    for n in s.notes:
        lines.append(f"\nnote: {n}")
    return "\n".join(lines) + "\n"


# -- several ranks: communication kernels without the wait for the last rank ----------
