"""Where the time goes, the figure beside the report's phase table (docs/design.md, "What a report
answers"): the stacked phases of the fastest combination per size and its nearest alternatives,
a panel per token count, or per workload where the run holds several (each ranked only among the
rows that saw the same tokens, as the fastest-per-size lines are), each phase in the colour the
trace timelines give it (report/timeline.py PHASE_COLORS)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure as MplFigure

from moebench.report.answer_frame import MAX_PANELS, Figure, Labeller, finish, frame
from moebench.report.columns import PHASE_COLUMNS
from moebench.report.timeline import PHASE_COLORS
from moebench.report.workloads import spread, union_labels, workloads
from moebench.util.words import counted

MAX_PHASE_ROWS = 4  # the fastest and its three nearest, per token count
# a CPU run names no fastest, and its phases (forwards of their own, each on the host's clock)
# need not add up to its latency: the figure is left out and the phase table stands alone
CPU_NO_FIGURE = (
    "_No phase figure: on a CPU no row is the fastest (CPU time is a pipeline check) and each phase is timed "
    "in forwards of its own, so the phases need not add up to the latency; the table above lists every row's._"
)
PHASES = tuple(PHASE_COLUMNS)


def _phase_panel(ax, at: pd.DataFrame, cols: list[str], label: Labeller, title: str) -> str:
    """Stacked phases of the rows `at` (fastest first, at the top), a tick at each row's median
    latency; returns the fastest's largest phase as `<phase> <n> % of the phases` ('' if none)."""
    labels = label(at)
    y = np.arange(len(at))[::-1]
    left = np.zeros(len(at))
    for c in cols:
        v = at[c].fillna(0).to_numpy(dtype=float)
        phase = c.removesuffix("_us")  # one colour a phase in every figure, the trace timelines' too
        ax.barh(y, v, left=left, color=PHASE_COLORS[phase], label=phase.replace("_", " "), height=0.6)
        left += v
    ax.plot(at["latency_us_median"], y, "|", color="k", ms=14, mew=2, label="layer latency (median)")
    ax.set_yticks(y, [str(labels.loc[i]) for i in at.index], fontsize=7.5)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("µs")
    ax.grid(True, axis="x", alpha=0.3)
    row = at.iloc[0]
    total = sum(float(row[c]) for c in cols if row[c] == row[c])
    big = max(cols, key=lambda c: float(row[c]) if row[c] == row[c] else -1)
    if total <= 0:
        return ""
    return f"{big.removesuffix('_us').replace('_', ' ')} {100 * float(row[big]) / total:.0f} % of the phases"


def _phase_legend(fig: MplFigure, axes) -> None:
    """The phases' colours, once below the panels (every panel draws the same phases)."""
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncols=len(handles), fontsize=7.5, frameon=False)


def plot_phase_fastest(
    ok: pd.DataFrame, label: Labeller, path, cpu: bool = False, within: pd.DataFrame | None = None
) -> Figure | None:
    """Stacked phase times of the fastest combination at each token count and its nearest
    alternatives (MAX_PHASE_ROWS), a panel per token count (at most MAX_PANELS, spread over
    the range); a tick marks each row's median latency. A run of several workloads gets a panel
    per workload instead (up to MAX_PANELS, spread over the models), each at its largest token count.
    Workloads are named by what varies `within` (the run's ok rows, as the text names them; default
    `ok`): the one workload of GPU-time rows among others of host time is named in the title."""
    cols = [c for c in PHASES if c in ok.columns and (pd.to_numeric(ok[c], errors="coerce") > 0).any()]
    ok = ok[ok[cols].notna().any(axis=1)] if cols else ok.iloc[:0]
    if ok.empty:
        return None
    groups = workloads(ok, within)
    if len(groups) > 1:
        shown = spread(groups, MAX_PANELS)
        fig, axes = frame(1.5 + (0.35 * MAX_PHASE_ROWS + 0.7) * len(shown), nrows=len(shown))
        ats = []
        for name, g in shown:
            big = int(g["tokens_per_rank"].max())
            ats.append(
                (name, big, g[g["tokens_per_rank"] == big].sort_values("latency_us_median").head(MAX_PHASE_ROWS))
            )
        named = union_labels(pd.concat([at for *_, at in ats]))  # a combination named alike in every panel
        said = []
        for ax, (name, big, at) in zip(axes, ats, strict=True):
            share = _phase_panel(
                ax, at, cols, lambda d: named.loc[d.index], f"{name} at {big} tok: the fastest and its nearest"
            )
            said.append(f"{name}: {share or 'no phases'} ({named.loc[at.index[0]]}, {big} tok)")
        _phase_legend(fig, axes)
        left = len(groups) - len(shown)
        note = f"{left} of {len(groups)} workloads not drawn (the tables below hold them)" if left else ""
        return finish(fig, path, "Where the time goes, the fastest of each workload: " + "; ".join(said), cpu, note)
    tokens = sorted(int(t) for t in ok["tokens_per_rank"].unique())
    if len(tokens) > MAX_PANELS:
        tokens = [tokens[i] for i in sorted(set(np.linspace(0, len(tokens) - 1, MAX_PANELS).round().astype(int)))]
    fig, axes = frame(1.5 + (0.35 * MAX_PHASE_ROWS + 0.7) * len(tokens), nrows=len(tokens))
    share, at = "", ok.iloc[:0]
    for ax, t in zip(axes, tokens, strict=True):
        at = ok[ok["tokens_per_rank"] == t].sort_values("latency_us_median").head(MAX_PHASE_ROWS)
        share = _phase_panel(ax, at, cols, label, f"{counted(t, 'token')} per rank: the fastest and its nearest")
    _phase_legend(fig, axes)
    fastest = label(ok).loc[at.index[0]]  # named among all the rows
    on = f" on {groups[0][0]}" if groups[0][0] else ""
    title = f"Where the time goes{on} at {tokens[-1]} tok: {share} of the fastest ({fastest})"
    return finish(fig, path, title, cpu)
