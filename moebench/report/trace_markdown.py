"""Markdown of a trace summary (moebench trace): the phase, stream and overlap tables.

The phase table reads as the layer ran: phases in the order they start, each phase's parts under
it (`└`, the phase they are part of in their own column), and a legend line saying that the rows
without a part-of add up to the layer, with a sample's CPU time and GPU span beside.

A trace is a run folder's file: every name it holds (its source path, combinations, streams,
notes) enters the Markdown escaped (moebench/report/mdsafe.py). A trace with nothing to overlap (no GPU
activity, or no communication kernels: one rank) gets one line saying so instead of a table of
dashes.
"""

from __future__ import annotations

from typing import Optional

from moebench.report.mdsafe import md_code, md_text
from moebench.traces.metrics import METHOD_INTERSECTION, METHOD_STRETCH, TraceSummary
from moebench.traces.model import lane_label


def fmt_figure(v, digits: int = 1) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


OVERLAP_HEADER = "| overlap of shared experts and communication | µs / fraction |"


def overlap_table(s: TraceSummary) -> str:
    """The overlap figures as a two-column markdown table (medians over samples; module docstring)."""
    alone = s.method == METHOD_STRETCH
    na = s.num_ablation_samples
    counts = f"{s.num_samples or 1} / {na.get('noshared', 0)} / {na.get('shared', 0)}"
    frac_label = (
        "stretch-aware: 1 − exposed / shared alone"
        if alone
        else "plain intersection"
        if s.method == METHOD_INTERSECTION
        else "–"
    )
    exposed_label = "window − comm alone" if alone else "shared in layer − intersection"
    rows = [
        ("samples: layer / without shared experts / shared experts alone (medians below)", counts),
        ("shared experts alone (`sample_shared`)", fmt_figure(s.shared_alone_us)),
        ("shared experts in the layer", fmt_figure(s.shared_us)),
        ("comm alone (`sample_noshared`)", fmt_figure(s.comm_alone_us)),
        ("comm in the layer", fmt_figure(s.comm_us)),
        ("comm stretch (in layer / alone)", fmt_figure(s.comm_stretch, 3)),
        ("window: comm ∪ shared", fmt_figure(s.window_us)),
        ("layer sample's GPU span (first kernel start to last end)", fmt_figure(s.layer_us)),
        ("intersection: comm ∩ shared", fmt_figure(s.overlap_us)),
        (f"exposed ({exposed_label})", fmt_figure(s.shared_exposed_us)),
        (f"**trace_overlap_fraction** ({frac_label})", fmt_figure(s.trace_overlap_fraction, 3)),
        ("intersection_fraction (intersection / shared in layer)", fmt_figure(s.intersection_fraction, 3)),
    ]
    lines = [OVERLAP_HEADER, "|---|---:|"] + [f"| {a} | {b} |" for a, b in rows]
    return "\n".join(lines)


def no_overlap(s: TraceSummary) -> Optional[str]:
    """Why the trace holds no overlap to measure (one line), or None when it holds one: no GPU
    activity (a CPU run: the overlap is read from GPU kernels), or no communication kernels in
    the layer nor in its ablation samples (one rank, or a backend that moves no data)."""
    if s.comm_us is None and s.shared_us is None and s.comm_alone_us is None:
        na = s.num_ablation_samples
        return (
            f"overlap: none to measure — no GPU activity in the trace (a CPU run; samples: layer "
            f"{s.num_samples or 1} / without shared experts {na.get('noshared', 0)} / shared experts alone "
            f"{na.get('shared', 0)}): the overlap of the shared experts with communication is read from GPU kernels"
        )
    if not s.comm_us and not s.comm_alone_us:
        shared = f"; the shared experts took {fmt_figure(s.shared_us)} µs in the layer" if s.shared_us else ""
        return (
            "overlap: none to measure — no communication kernels in the trace (one rank, or a backend that "
            f"moves no data): nothing to hide the shared experts behind{shared}"
        )
    return None


PHASE_HEADER = "| phase | part of | cpu µs | gpu µs | ranges | kernels |"


def phase_table(s: TraceSummary) -> list:
    """The phase table's lines, in reading order (metrics: top-level phases as they start, each
    followed by its parts, marked └ with the phase they are part of), then its one-line legend: which
    rows add up to the layer, and the layer's figures to check them against."""
    lines = [PHASE_HEADER, "|---|---|---:|---:|---:|---:|"]
    for p in s.phases.values():
        name = f"└ {md_text(p.name)}" if p.parent else md_text(p.name)
        lines.append(
            f"| {name} | {md_text(p.parent) if p.parent else '–'} | {fmt_figure(p.cpu_us)} | "
            f"{fmt_figure(p.gpu_us)} | {p.num_ranges} | {p.num_kernels} |"
        )
    if not s.phases:
        return lines
    layer = [f"CPU {fmt_figure(s.layer_cpu_us)} µs"] if s.layer_cpu_us is not None else []
    layer += [f"GPU span {fmt_figure(s.layer_us)} µs"] if s.layer_us is not None else []
    per = (" — a sample: " if s.num_samples else " — the trace: ") + ", ".join(layer) if layer else ""
    gpu = " (on the GPU, overlaps too)" if s.layer_us is not None else ""
    return lines + [
        "",
        "rows in the order they start; └ part of X: inside X, its time counted in X's too; the rows "
        f"without one follow one another and add up to the layer, gaps aside{gpu}{per}",
    ]


def combos_text(keys, labels: Optional[dict] = None) -> str:
    """The trace's combinations as Markdown: each by its row's label with the key beside it, or by
    the key alone where no row names it."""
    labels = labels or {}
    return ", ".join(f"{md_text(labels[k])} ({md_text(k)})" if k in labels else md_text(k) for k in keys) or "–"


def to_markdown(
    s: TraceSummary, labels: Optional[dict] = None, title: Optional[str] = None, folder_key: Optional[str] = None
) -> str:
    """The summary as markdown tables (phases, streams, overlap). `labels` maps combination keys
    to their rows' labels (traces/cli.py combo_labels); `title` (plain text, escaped here) heads
    the section instead of the trace's path, which then follows on a line of its own;
    `folder_key`: the combination its folder names, for a trace whose ranges name none (a
    profiler-mode trace written before it opened a `combo/` range)."""
    samples = f"{s.num_samples} samples (median)" if s.num_samples else "whole trace"
    head = [f"### {md_text(title)}", "", f"trace: {md_code(s.source)}"] if title else [f"### {md_text(s.source)}"]
    combos = combos_text(s.combos, labels)
    if not s.combos and folder_key:
        combos = f"{combos_text([folder_key], labels)}, by its folder (no `combo/` range in the trace)"
    lines = head + ["", f"format: {md_text(s.fmt)}; combos: {combos}; {samples}", ""]
    lines += phase_table(s)
    if s.streams:
        lines += [
            "",
            "| stream | kernels (all samples) | busy µs | comm µs | shared µs | phases (µs) |",
            "|---|---:|---:|---:|---:|---|",
        ]
        for st in s.streams:
            ph = ", ".join(f"{md_text(k)} {v:.1f}" for k, v in sorted(st.phases.items(), key=lambda kv: -kv[1]))
            lines.append(
                f"| {md_text(lane_label(st.lane))} | {st.num_kernels} | {st.busy_us:.1f} | {st.comm_us:.1f} | "
                f"{st.shared_us:.1f} | {ph or '–'} |"
            )
    why = no_overlap(s)
    lines += ["", why or overlap_table(s)]
    for n in s.notes:
        lines.append(f"\nnote: {md_text(n)}")
    return "\n".join(lines) + "\n"


# -- several ranks: communication kernels without the wait for the last rank ----------
