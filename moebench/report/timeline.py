"""Timeline PNG of one trace: lanes for host threads (phase ranges; `host main thread (pid 5448)`,
a phase's parts drawn below it), gloo's collectives on their own threads (`gloo threads (pid 5448)`:
on the CPU the host's dispatch and combine last until these have arrived), the phases projected on
GPU time, and one per GPU stream in the order of their numbers (kernels; `GPU 0 stream 7`). The
legend says what a phase holds (PHASE_LEGEND: prepare's local work comes before or after the
dispatch by backend; naive quantizes after it).

Kernels are colored by the phase that launched them; communication kernels (and gloo's
collectives) are hatched with a red edge, shared-expert kernels get a thick black edge. With
`sample/<i>` ranges the plot shows one sample (the one of median duration), so
that the figure stays readable: its GPU span when it launched kernels (CPU ranges
appear only where they overlap it), else its CPU range; the x axis is µs from the
window's start. The ablation samples (`sample_noshared/<i>`, `sample_shared/<i>`) are not
drawn: they enter the overlap figures only. The kernels that take the most time in the window
(TOP_KERNELS of them, by summed duration per name) are labelled with their short names, and the
intersection of shared-expert and communication kernels is shaded across the GPU lanes, its
total in µs printed in the panel. `plot_ranks` stacks several ranks' panels on one time axis.
Uses matplotlib's Agg canvas directly (no pyplot global state).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from moebench.traces.metrics import intersect, length, union
from moebench.traces.model import HOST_COLLECTIVE_PREFIX, PHASES, Trace, lane_label, thread_label
from moebench.util.pngfile import save_figure

TOP_KERNELS = 5

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
# what a phase holds, in the legend: the host's dispatch and combine last from the send to the data
# received (a CPU run's gloo collectives run meanwhile on threads of their own), and prepare's local
# work comes before or after the dispatch by backend (naive sends bf16 and quantizes on arrival)
PHASE_LEGEND = {
    "prepare": "prepare: quantize, local ids\n(before or after dispatch)",
    "dispatch": "dispatch: send → received",
    "finalize": "finalize: weight_reduce + combine",
    "combine": "combine: send → received",
}
COMM_STYLE = ("red", "///", 1.0)  # edge, hatch, width: communication kernels and gloo collectives


def _window(trace: Trace, sample: Optional[int]):
    """(t0, t1, label, sample index) of the plotted window, µs.

    With samples: one sample (the median-duration one unless given); its GPU
    activities' span when it has any (the GPU may lag the CPU by far), else its
    CPU range. Without samples: the kernels launched inside phase ranges, else the whole trace.
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
    # no samples (an nsys report of a row's timed work): the span of the kernels launched
    # inside a phase range, so that what ran outside the layer (a timing harness's holds:
    # flushes or spin kernels; a warm-up) does not squeeze it into a corner
    phased = [k for k in trace.kernels if k.phases]
    if phased:
        return (min(k.start_us for k in phased), max(k.end_us for k in phased), "the kernels inside phase ranges", None)
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
    for ph, (s, e, _d) in sorted(spans.items(), key=lambda kv: (kv[1][2], kv[1][0])):
        row = next((i for i, used in enumerate(rows) if all(e <= a or s >= b for a, b in used)), len(rows))
        if row == len(rows):
            rows.append([])
        rows[row].append((s, e))
        out.append((ph, s, e, row))
    return out


def _kernel_style(k) -> tuple:
    """(edge color, hatch, edge width): communication hatched red, shared experts thick black."""
    if k.comm:
        return COMM_STYLE
    if k.shared:
        return "black", None, 1.5
    return "none", None, 0


def _depths(ranges) -> list:
    """Nesting depth of each range among `ranges` (one thread), by start order."""
    out: list = []
    stack: list = []
    for r in sorted(ranges, key=lambda r: (r.start_us, -r.end_us)):
        while stack and stack[-1].end_us <= r.start_us:
            stack.pop()
        out.append((r, len(stack)))
        stack.append(r)
    return out


def _unmangle(name: str) -> str:
    """`a::b` from an Itanium-mangled `_ZN1a1bI...` (the nested names' lengths prefix them)."""
    m = re.match(r"_ZN?(.*)", name)
    rest, parts = (m[1] if m else name), []
    while rest[:1].isdigit():
        n = rest[: len(rest) - len(rest.lstrip("0123456789"))]  # the length prefix
        parts.append(rest[len(n) : len(n) + int(n)])
        rest = rest[len(n) + int(n) :]
    return "::".join(parts) or name


def short_name(name: str, width: int = 30) -> str:
    """A kernel's name without namespaces, template arguments and parameters, at most `width` chars."""
    name = _unmangle(name) if name.startswith("_Z") else name
    base = re.sub(r"\s*[<(].*$", "", name.strip())  # drop templates and parameter lists
    base = base.split("::")[-1] or name
    base = base.split()[-1] if " " in base else base  # "void foo" -> "foo"
    return base if len(base) <= width else base[: width - 1] + "…"


def _top_kernels(kernels, n: int = TOP_KERNELS) -> set:
    """Names of the `n` kernels with the most summed time among `kernels`."""
    total: dict = {}
    for k in kernels:
        if k.kind == "kernel":
            total[k.name] = total.get(k.name, 0.0) + k.dur_us
    return {name for name, _ in sorted(total.items(), key=lambda kv: -kv[1])[:n]}


def _overlap(kernels) -> list:
    """Intervals (µs) where a shared-expert kernel and a communication kernel ran together."""
    shared = union((k.start_us, k.end_us) for k in kernels if k.shared)
    comm = union((k.start_us, k.end_us) for k in kernels if k.comm)
    return intersect(shared, comm)


def _select(trace: Trace, sample: Optional[int]):
    """(t0, t1, label, sample index, CPU ranges, kernels) of the plotted window (`_window`)."""
    t0, t1, label, idx = _window(trace, sample)
    inside = lambda a, b: b >= t0 and a <= t1
    # CPU ranges only where they fall in the window (on GPUs the CPU usually runs ahead): the phases
    # and the gloo collectives they wait for
    ranges = [
        r
        for r in trace.ranges
        if (r.name in PHASES or r.name.startswith(HOST_COLLECTIVE_PREFIX)) and inside(r.start_us, r.end_us)
    ]
    kernels = [
        k
        for k in trace.kernels
        if inside(k.start_us, k.end_us) and (idx is None or (k.sample in (idx, None) and k.ablation is None))
    ]
    return t0, t1, label, idx, ranges, kernels


def _lanes(ranges, kernels, t0: float, t1: float) -> list:
    """(label, [(start, dur, color, edge, hatch, lw, text, depth)], rows) per lane, x relative to t0."""
    lanes = []
    phase_ranges = [r for r in ranges if r.name in PHASES]
    for thread in sorted({r.thread for r in phase_ranges}):
        placed = _depths([r for r in phase_ranges if r.thread == thread])
        rows = max(d for _, d in placed) + 1
        # clipped to the window
        bars = [
            (
                max(r.start_us, t0) - t0,
                min(r.end_us, t1) - max(r.start_us, t0),
                PHASE_COLORS[r.name],
                "none",
                None,
                0,
                r.name,
                d,
            )
            for r, d in placed
        ]
        lanes.append((thread_label(thread), bars, rows))
    lanes += _collective_lanes([r for r in ranges if r.name.startswith(HOST_COLLECTIVE_PREFIX)], t0, t1)
    spans = _gpu_phase_spans(kernels)
    if spans:
        rows = max(d for *_, d in spans) + 1
        bars = [(s - t0, e - s, PHASE_COLORS[ph], "none", None, 0, ph, d) for ph, s, e, d in spans]
        lanes.append(("phases on GPU", bars, rows))
    top = _top_kernels(kernels)
    for dev, stream in sorted({(k.device, k.stream) for k in kernels}):  # as numbers: stream 7 before 20
        bars, labelled = [], set()
        lane = f"dev{dev}/s{stream}"
        for k in kernels:
            if k.lane != lane:
                continue
            edge, hatch, lw = _kernel_style(k)
            color = PHASE_COLORS.get(k.phase, PHASE_COLORS[None])
            # a top kernel's name on its longest bar of the lane
            text = None
            if k.name in top and k.name not in labelled:
                longest = max((j for j in kernels if j.lane == lane and j.name == k.name), key=lambda j: j.dur_us)
                if longest is k:
                    text = short_name(k.name)
                    labelled.add(k.name)
            bars.append((k.start_us - t0, max(k.dur_us, 1e-3), color, edge, hatch, lw, text, 0))
        lanes.append((lane_label(lane), bars, 1))
    return lanes


def _collective_lanes(ranges, t0: float, t1: float) -> list:
    """One lane per process of the gloo collectives among `ranges` (`gloo:<op>`, on gloo's own
    threads, one row each), drawn as communication and named by their op, clipped to the window."""
    lanes = []
    by_pid: dict = {}
    for r in ranges:
        by_pid.setdefault(r.thread.partition("/")[0], []).append(r)
    for pid, rs in sorted(by_pid.items()):
        rows = sorted({r.thread for r in rs})
        edge, hatch, lw = COMM_STYLE
        bars = [
            (
                max(r.start_us, t0) - t0,
                min(r.end_us, t1) - max(r.start_us, t0),
                "white",
                edge,
                hatch,
                lw,
                r.name[len(HOST_COLLECTIVE_PREFIX) :],
                rows.index(r.thread),
            )
            for r in rs
        ]
        lanes.append((f"gloo threads (pid {pid})", bars, len(rows)))
    return lanes


def _draw(ax, lanes, span_us: float, overlap: list, t0: float, title: str, kernel_labels: bool = True) -> None:
    """One panel: the lanes, the shaded shared ∩ communication intervals and their total (µs)."""
    y, ticks, tick_labels, has_gpu = 0.0, [], [], False
    for name, bars, rows in lanes:
        for start, dur, color, edge, hatch, lw, text, depth in bars:
            yy = y + depth  # nested ranges below their parent
            ax.broken_barh(
                [(start, dur)], (yy + 0.1, 0.8), facecolors=color, edgecolors=edge, hatch=hatch, linewidth=lw
            )
            if text and name.startswith("GPU") and kernel_labels and dur > span_us * 0.02:
                ax.text(
                    start + dur / 2,
                    yy + 0.5,
                    text,
                    ha="center",
                    va="center",
                    fontsize=6,
                    clip_on=True,
                    bbox={"facecolor": "white", "alpha": 0.6, "pad": 0.5, "edgecolor": "none"},
                )
            elif text and not name.startswith("GPU") and dur > span_us * 0.06:
                box = {"facecolor": "white", "alpha": 0.8, "pad": 0.5, "edgecolor": "none"} if hatch else None
                ax.text(start + dur / 2, yy + 0.5, text, ha="center", va="center", fontsize=7, bbox=box)
        has_gpu |= name.startswith("GPU")
        ticks.append(y + rows / 2)
        tick_labels.append(name)
        y += rows + 0.3
    if has_gpu:
        for s, e in overlap:
            ax.axvspan(s - t0, e - t0, ymin=0, ymax=1, color="#e41a1c", alpha=0.15, linewidth=0)
        ax.text(
            0.995,
            0.02,
            f"shared ∩ comm: {length(overlap):.1f} µs",
            transform=ax.transAxes,
            ha="right",
            va="bottom",
            fontsize=8,
            color="#b2182b",
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "#b2182b", "pad": 2},
        )
    ax.set_yticks(ticks)
    ax.set_yticklabels(tick_labels, fontsize=8)
    ax.set_ylim(-0.2, max(y, 1.0))
    ax.invert_yaxis()
    ax.set_xlim(0, max(span_us, 1e-3))
    ax.set_title(title, fontsize=9)


def _legend(ax, lanes: list) -> None:
    """The phases (with what each holds, PHASE_LEGEND) and the marks the drawn `lanes` use: communication
    where a GPU or gloo lane is drawn, the shared-expert kernels and their overlap where a GPU one is."""
    from matplotlib.patches import Patch

    names = [name for name, _, _ in lanes]
    gpu = any(n.startswith("GPU") for n in names)
    handles = [Patch(facecolor=PHASE_COLORS[p], label=PHASE_LEGEND.get(p, p)) for p in PHASES]
    if gpu or any(n.startswith("gloo") for n in names):
        handles.append(Patch(facecolor="white", edgecolor="red", hatch="///", label="communication"))
    if gpu:
        handles += [
            Patch(facecolor="white", edgecolor="black", linewidth=1.5, label="shared-expert kernel"),
            Patch(facecolor="#e41a1c", alpha=0.15, label="shared ∩ comm"),
        ]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False)


def why_empty(traces: list, cpu_lanes: bool = True) -> Optional[str]:
    """Why a timeline of `traces` would be an empty frame (one line), or None when it has bars to
    draw: `plot_ranks` draws GPU lanes only (cpu_lanes=False), so a CPU run's ranks draw nothing."""
    for t in traces:
        ranges, kernels = _select(t, None)[4:]
        if kernels or (cpu_lanes and ranges):
            return None
    if not any(t.kernels for t in traces):
        return (
            "no GPU kernels in the traces (a CPU run): the ranks' panels draw GPU lanes only"
            if not cpu_lanes
            else "no phase ranges and no GPU kernels in the trace"
        )
    return "no phase ranges and no GPU kernels in the plotted window"


def plot_timeline(trace: Trace, path, sample: Optional[int] = None, name: Optional[str] = None) -> Path:
    """Write the timeline PNG of `trace` to `path` and return the path (`why_empty` first: a
    trace with nothing to draw is no figure). Its title: `name` (what the trace is of: the
    combination, rank and tokens, as `moebench trace`'s heading; default the trace's file name),
    then the window drawn."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    t0, t1, label, idx, ranges, kernels = _select(trace, sample)
    lanes = _lanes(ranges, kernels, t0, t1)
    total_rows = sum(rows for _, _, rows in lanes) or 1
    fig = Figure(figsize=(13, max(2.6, 1.0 + 0.45 * total_rows + 0.3 * len(lanes))), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    _draw(ax, lanes, t1 - t0, _overlap(kernels), t0, f"{name or Path(trace.source).name} — {label}")
    ax.set_xlabel("µs from window start")
    _legend(ax, lanes)
    return save_figure(fig, path)


def plot_ranks(
    traces: list, path, labels: Optional[list] = None, sample: Optional[int] = None, title: Optional[str] = None
) -> Path:
    """Several ranks' timelines (one combination and token count) stacked on one time axis.

    Each panel shows its rank's window (the same sample index, by default the median one of the
    first rank); the x axis is µs from the earliest window start, so that the ranks line up
    (one host, one clock). CPU lanes are left out: the GPU lanes are what the ranks share, so a
    CPU run's ranks draw an empty frame (`why_empty(traces, cpu_lanes=False)` says so first).
    `title`: what the figure shows (the combination and token count), above the panels.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    labels = labels or [f"rank {i}" for i in range(len(traces))]
    first = _select(traces[0], sample)
    idx = first[3] if sample is None else sample
    picked = [first] + [
        _select(t, idx if t.sample_ranges() and idx in {i for i, _ in t.sample_ranges()} else None) for t in traces[1:]
    ]
    t0 = min(p[0] for p in picked)
    t1 = max(p[1] for p in picked)
    panels = [(_lanes([], p[5], t0, t1), p) for p in picked]
    heights = [max(1, sum(rows for _, _, rows in lanes)) + 1 for lanes, _ in panels]
    fig = Figure(figsize=(13, max(3.0, 0.45 * sum(heights) + 0.8)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    for ax, (lanes, p), name in zip(axes, panels, labels, strict=True):
        _draw(ax, lanes, t1 - t0, _overlap(p[5]), t0, f"{name} — {p[2]}")
    axes[-1].set_xlabel("µs from the earliest window start")
    if title:
        fig.suptitle(title, fontsize=10)
    _legend(axes[0], [lane for lanes, _ in panels for lane in lanes])
    return save_figure(fig, path)
