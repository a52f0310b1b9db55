"""Timeline PNG of one trace: lanes for CPU threads (phase ranges), the phases projected
on GPU time, and one per GPU stream (kernels).

Kernels are colored by the phase that launched them; communication kernels are
hatched with a red edge, shared-expert kernels get a thick black edge. With
`sample/<i>` ranges the plot shows one sample (the one of median duration), so
that the figure stays readable: its GPU span when it launched kernels (CPU ranges
appear only where they overlap it), else its CPU range; the x axis is µs from the
window's start. The ablation samples (`sample_noshared/<i>`, `sample_shared/<i>`) are not
drawn: they enter the overlap figures only.
Uses matplotlib's Agg canvas directly (no pyplot global state).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from moebench.traces.model import PHASES, Trace

PHASE_COLORS = {
    "prepare": "#8dd3c7",
    "dispatch": "#80b1d3",
    "experts": "#fdb462",
    "weight_reduce": "#b3de69",
    "finalize": "#d9d9d9",
    "combine": "#bc80bd",
    "shared_experts": "#fb8072",
    None: "#bbbbbb",
}


def _window(trace: Trace, sample: Optional[int]):
    """(t0, t1, label, sample index) of the plotted window, µs.

    With samples: one sample (the median-duration one unless given); its GPU
    activities' span when it has any (the GPU may lag the CPU by far), else its
    CPU range. Without samples: the whole trace.
    """
    samples = trace.sample_ranges()
    if samples:
        if sample is None:
            by_dur = sorted(samples, key=lambda s: s[1].dur_us)
            idx, r = by_dur[(len(by_dur) - 1) // 2]
        else:
            match = [s for s in samples if s[0] == sample]
            if not match:
                raise ValueError(f"sample {sample} not in the trace (has {[s[0] for s in samples]})")
            idx, r = match[0]
        ks = [k for k in trace.kernels if k.sample == idx]
        if ks:
            label = f"sample {idx} of {len(samples)}, GPU time"
            return min(k.start_us for k in ks), max(k.end_us for k in ks), label, idx
        return r.start_us, r.end_us, f"sample {idx} of {len(samples)}", idx
    t0 = trace.t0_us()
    ends = [r.end_us for r in trace.ranges] + [k.end_us for k in trace.kernels]
    return t0, max(ends) if ends else t0 + 1.0, "whole trace", None


def _gpu_phase_spans(kernels) -> list:
    """(phase, first start, last end, row) of each phase over `kernels`: the phases projected on GPU time."""
    spans: dict = {}
    for k in kernels:
        for depth, ph in enumerate(k.phases):
            s, e, d = spans.get(ph, (k.start_us, k.end_us, depth))
            spans[ph] = (min(s, k.start_us), max(e, k.end_us), max(d, depth))
    # first-fit rows, parents first, so that concurrent phases (shared experts beside
    # dispatch or combine) and nested ones do not hide each other
    rows: list = []
    out = []
    for ph, (s, e, d) in sorted(spans.items(), key=lambda kv: (kv[1][2], kv[1][0])):
        row = next((i for i, used in enumerate(rows) if all(e <= a or s >= b for a, b in used)), len(rows))
        if row == len(rows):
            rows.append([])
        rows[row].append((s, e))
        out.append((ph, s, e, row))
    return out


def _kernel_style(k) -> tuple:
    """(edge color, hatch, edge width): communication hatched red, shared experts thick black."""
    if k.comm:
        return "red", "///", 1.0
    if k.shared:
        return "black", None, 1.5
    return "none", None, 0


def _depths(ranges) -> list:
    """Nesting depth of each range among `ranges` (one thread), by start order."""
    out, stack = [], []
    for r in sorted(ranges, key=lambda r: (r.start_us, -r.end_us)):
        while stack and stack[-1].end_us <= r.start_us:
            stack.pop()
        out.append((r, len(stack)))
        stack.append(r)
    return out


def plot_timeline(trace: Trace, path, sample: Optional[int] = None, title: Optional[str] = None) -> Path:
    """Write the timeline PNG of `trace` to `path` and return the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    t0, t1, label, idx = _window(trace, sample)
    inside = lambda a, b: b >= t0 and a <= t1  # noqa: E731
    # CPU ranges only where they fall in the window (on GPUs the CPU usually runs ahead)
    ranges = [r for r in trace.ranges if r.name in PHASES and inside(r.start_us, r.end_us)]
    kernels = [k for k in trace.kernels if inside(k.start_us, k.end_us)
               and (idx is None or (k.sample in (idx, None) and k.ablation is None))]

    lanes = []  # (label, [(start, dur, color, edge, hatch, lw, text, depth)], rows)
    for thread in sorted({r.thread for r in ranges}):
        placed = _depths([r for r in ranges if r.thread == thread])
        rows = max(d for _, d in placed) + 1
        # clipped to the window
        bars = [(max(r.start_us, t0) - t0, min(r.end_us, t1) - max(r.start_us, t0), PHASE_COLORS[r.name],
                 "none", None, 0, r.name, d) for r, d in placed]
        lanes.append((f"CPU {thread}", bars, rows))
    spans = _gpu_phase_spans(kernels)
    if spans:
        rows = max(d for *_, d in spans) + 1
        bars = [(s - t0, e - s, PHASE_COLORS[ph], "none", None, 0, ph, d) for ph, s, e, d in spans]
        lanes.append(("phases on GPU", bars, rows))
    for lane in sorted({k.lane for k in kernels}):
        bars = []
        for k in kernels:
            if k.lane != lane:
                continue
            edge, hatch, lw = _kernel_style(k)
            color = PHASE_COLORS.get(k.phase, PHASE_COLORS[None])
            bars.append((k.start_us - t0, max(k.dur_us, 1e-3), color, edge, hatch, lw, None, 0))
        lanes.append((f"GPU {lane}", bars, 1))

    total_rows = sum(rows for _, _, rows in lanes) or 1
    fig = Figure(figsize=(13, max(2.6, 1.0 + 0.45 * total_rows + 0.3 * len(lanes))), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    y, ticks, tick_labels = 0.0, [], []
    for name, bars, rows in lanes:
        for start, dur, color, edge, hatch, lw, text, depth in bars:
            yy = y + depth  # nested ranges below their parent
            ax.broken_barh([(start, dur)], (yy + 0.1, 0.8), facecolors=color, edgecolors=edge,
                           hatch=hatch, linewidth=lw)
            if text and dur > (t1 - t0) * 0.06:
                ax.text(start + dur / 2, yy + 0.5, text, ha="center", va="center", fontsize=7)
        ticks.append(y + rows / 2)
        tick_labels.append(name)
        y += rows + 0.3
    ax.set_yticks(ticks)
    ax.set_yticklabels(tick_labels, fontsize=8)
    ax.set_ylim(-0.2, max(y, 1.0))
    ax.invert_yaxis()
    ax.set_xlim(0, max(t1 - t0, 1e-3))
    ax.set_xlabel("µs from window start")
    ax.set_title(title or f"{Path(trace.source).name} — {label}", fontsize=9)
    handles = [Patch(facecolor=PHASE_COLORS[p], label=p) for p in PHASES]
    handles += [Patch(facecolor="white", edgecolor="red", hatch="///", label="communication"),
                Patch(facecolor="white", edgecolor="black", linewidth=1.5, label="shared-expert kernel")]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
