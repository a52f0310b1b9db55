"""PNG plots of a run (matplotlib, no pyplot: safe headless), as small multiples
(report/plotgrid.py: one panel per model, and backend where it varies, at most ~8
series a panel). Comparison plots: report/plots_compare.py.

Every function writes one PNG at ``path`` and returns that path, or returns None (and
writes nothing) when the rows hold nothing to plot, e.g. no overlap rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from moebench.report.columns import PHASE_COLUMNS
from moebench.report.plotgrid import MARKERS, grid, legends, narrow_us_axis, panels, save, tokens_axis, value_axis
from moebench.report.plots_compare import plot_comparison, plot_comparison_latency  # noqa: F401  (one import for callers)
from moebench.results.row import Status

MIB = 1024.0 * 1024.0
REDUCTION_STYLES = {"experts": "-", "finalize": "--"}
PHASE_COLORS = {
    "prepare_us": "C0",
    "dispatch_us": "C1",
    "experts_us": "C2",
    "weight_reduce_us": "C3",
    "combine_us": "C4",
    "shared_experts_us": "C5",
}


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    df = df[(df["status"] == Status.OK) & df["tokens_per_rank"].notna()].copy()
    return df.sort_values(["combo_key", "tokens_per_rank"], kind="stable")


def _series(p, i, g):
    """(label, rows, style: colour and line style) of each series of panel i, in label order."""
    for lab, s in g.groupby(p.labels.loc[g.index], sort=True):
        yield lab, s.sort_values("tokens_per_rank"), p.styles[(i, lab)]


def _whiskers(mid, lo, hi) -> list:
    """errorbar's [below, above] lengths; a bound on the wrong side of the figure (rows whose
    median and interval were stored apart) or missing draws none."""
    lo, hi = np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
    return [np.nan_to_num(np.maximum(mid - lo, 0.0)), np.nan_to_num(np.maximum(hi - mid, 0.0))]


def plot_latency(df: pd.DataFrame, path) -> Path | None:
    """Median latency (µs) vs tokens per rank, log-log, a panel per model (and backend),
    one line per combination with its p20–p80 band; graph-replay points filled, events
    points hollow where a run holds both."""
    ok = _ok(df)
    if not len(ok):
        return None
    p = panels(ok)
    fig, axes = grid(len(p.groups))
    modes = set(ok["timing_mode"].dropna().astype(str)) if "timing_mode" in ok else set()
    single = ok["tokens_per_rank"].nunique() == 1
    for i, (ax, (title, g)) in enumerate(zip(axes, p.groups, strict=True)):
        series = list(_series(p, i, g))
        for j, (lab, s, st) in enumerate(series):
            t, color = s["tokens_per_rank"], st["color"]
            ax.plot(t, s["latency_us_median"], lw=1.4, label=lab, **st)
            if len(s) == 1:  # one token count: whiskers side by side instead of a band of one point
                med = s["latency_us_median"].to_numpy(dtype=float)
                ax.errorbar(
                    t * (1 + 0.06 * (j - (len(series) - 1) / 2)),
                    med,
                    yerr=_whiskers(med, s["latency_us_p20"], s["latency_us_p80"]),
                    fmt="o",
                    ms=4,
                    color=color,
                    capsize=3,
                )
                continue
            ax.fill_between(t, s["latency_us_p20"], s["latency_us_p80"], color=color, alpha=0.2, lw=0)
            if len(modes) > 1:  # hollow: events above graph_max_tokens
                for mode, pts in s.groupby(s["timing_mode"].astype(str)):
                    ax.plot(
                        pts["tokens_per_rank"],
                        pts["latency_us_median"],
                        "o",
                        ms=4,
                        color=color,
                        markerfacecolor="white" if mode == "events" else color,
                    )
            else:
                ax.plot(t, s["latency_us_median"], "o", ms=3.5, color=color)
        tokens_axis(ax, ok["tokens_per_rank"])
        ax.set(title=title, xlabel="tokens per rank")
        value_axis(
            ax,
            pd.concat([g["latency_us_p20"], g["latency_us_p80"]]),
            f"latency µs (median, {'whiskers' if single else 'band'} p20–p80)",
        )
        ax.grid(True, which="both", alpha=0.3)
    extra = []
    if len(modes) > 1:
        extra = [
            (Line2D([], [], marker="o", ls="", color="k"), "graph replays"),
            (Line2D([], [], marker="o", ls="", color="k", markerfacecolor="white"), "events (eager)"),
        ]
    legends(fig, axes, p, extra)
    fig.suptitle(p.suptitle("MoE layer latency") + (f" (timing {', '.join(sorted(modes))})" if modes else ""))
    return save(fig, path)


def _pick_tokens(tokens: list[int], max_panels: int) -> list[int]:
    if len(tokens) <= max_panels:
        return tokens
    idx = np.linspace(0, len(tokens) - 1, max_panels).round().astype(int)
    return [tokens[i] for i in sorted(set(idx))]


def plot_phases(df: pd.DataFrame, path, max_panels: int = 4) -> Path | None:
    """Stacked per-phase times (µs) per combination: a row of panels per model (and
    backend), a column per tokens_per_rank (at most ``max_panels``, spread over the
    range); a black tick marks the layer's median latency (the phases come from eager
    forwards: in graph mode the tick is the figure to read)."""
    ok = _ok(df)
    ok = ok[ok[PHASE_COLUMNS].notna().any(axis=1)]
    if not len(ok):
        return None
    tokens = _pick_tokens(sorted(int(t) for t in ok["tokens_per_rank"].unique()), max_panels)
    p = panels(ok)
    num_labels = max(p.labels.loc[g.index].nunique() for _, g in p.groups)
    fig, axes = grid(
        len(p.groups) * len(tokens),
        ncols=len(tokens),
        width=max(3.6, 8.0 / len(tokens)),
        height=0.32 * num_labels + 1.3,
    )
    for r, (title, g) in enumerate(p.groups):
        labels = sorted(set(p.labels.loc[g.index]))
        y = np.arange(len(labels))
        for c, t in enumerate(tokens):
            ax = axes[r * len(tokens) + c]
            rows = g[g["tokens_per_rank"] == t]
            if not len(rows):  # e.g. a batched backend's cap: nothing ran at this size
                ax.set_title(f"{title} · {t} tok" if title else f"{t} tok", fontsize=9)
                ax.text(0.5, 0.5, "no ok rows", ha="center", va="center", transform=ax.transAxes, color="gray")
                ax.set_xticks([]), ax.set_yticks([])
                continue
            s = rows.assign(_lab=p.labels.loc[rows.index]).drop_duplicates("_lab").set_index("_lab").reindex(labels)
            left = np.zeros(len(labels))
            # shared experts inside a communication span are in that span's bar already
            nested = (s["overlap"].isin(["dispatch", "combine"]) & s["dispatch_us"].notna()).to_numpy()
            for col in PHASE_COLUMNS:
                width = s[col].fillna(0.0).to_numpy(dtype=float)
                if col == "shared_experts_us":
                    width = np.where(nested, 0.0, width)
                ax.barh(y, width, left=left, color=PHASE_COLORS[col], label=col.removesuffix("_us"))
                left += width
            ax.plot(s["latency_us_median"], y, "|", color="black", ms=12, mew=2, label="layer latency (median)")
            for yi in y[s["latency_us_median"].isna().to_numpy()]:
                ax.text(0, yi, "  no ok row at this size", va="center", fontsize=7, color="gray")
            ax.set_title(f"{title} · {t} tok" if title else f"{t} tok", fontsize=9)
            ax.set_xlabel("µs")
            # room past the longest bar and tick (stacked bars' ends are sticky: autoscale gives no margin there)
            ends = np.concatenate([left, s["latency_us_median"].to_numpy(dtype=float)])
            if np.isfinite(ends).any() and np.nanmax(ends) > 0:
                ax.set_xlim(0, 1.05 * np.nanmax(ends))
            narrow_us_axis(ax.xaxis)
            ax.grid(True, axis="x", alpha=0.3)
            ax.set_yticks(y, labels if c == 0 else [""] * len(labels), fontsize=7)
            ax.invert_yaxis()
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncols=len(names), fontsize=8, frameon=False)
    modes = set(ok["timing_mode"].dropna().astype(str))
    what = "kernel busy time (profiler)" if modes == {"profiler"} else "phase events of eager forwards"
    fig.suptitle(p.suptitle(f"Phase breakdown: {what}"))
    return save(fig, path)


def plot_overlap(df: pd.DataFrame, path) -> Path | None:
    """Per model (and backend): overlap_fraction vs tokens per rank with its 90 %
    bootstrap band where the rows have one (and the trace's figure as x), and beside it
    shared_exposed_us (µs) with shared_us dashed; rows with overlap = dispatch | combine, less
    those of single-rank backends (tables.single_rank: no communication to overlap with)."""
    from moebench.report.run_tables import single_rank

    ok = _ok(df)
    ok = ok[ok["overlap"].astype(str).isin(["dispatch", "combine"])]
    ok = ok[~single_rank(ok)]
    if not len(ok):
        return None
    p = panels(ok)
    fig, axes = grid(2 * len(p.groups), ncols=2, width=4.8)
    has_band = ok["overlap_fraction_lo"].notna().any() if "overlap_fraction_lo" in ok else False
    has_trace = ok["trace_overlap_fraction"].notna().any()
    single = ok["tokens_per_rank"].nunique() == 1
    for i, (title, g) in enumerate(p.groups):
        ax_frac, ax_exp = axes[2 * i], axes[2 * i + 1]
        series = list(_series(p, i, g))
        for j, (lab, s, st) in enumerate(series):
            t, color = s["tokens_per_rank"], st["color"]
            if len(s) == 1:  # one token count: series side by side, so that their whiskers do not hide each other
                t = t * (1 + 0.06 * (j - (len(series) - 1) / 2))
            ax_frac.plot(t, s["overlap_fraction"], marker="o", ms=3, label=lab, **st)
            if has_band and s["overlap_fraction_lo"].notna().any():
                if len(s) > 1:  # else one point: a band draws nothing, whiskers do
                    ax_frac.fill_between(
                        t, s["overlap_fraction_lo"], s["overlap_fraction_hi"], color=color, alpha=0.18, lw=0
                    )
                else:
                    f = s["overlap_fraction"].to_numpy(dtype=float)
                    ax_frac.errorbar(
                        t,
                        f,
                        yerr=_whiskers(f, s["overlap_fraction_lo"], s["overlap_fraction_hi"]),
                        fmt="none",
                        ecolor=color,
                        alpha=0.6,
                        capsize=3,
                    )
            if s["trace_overlap_fraction"].notna().any():
                ax_frac.plot(t, s["trace_overlap_fraction"], marker="x", ls=":", color=color)
            ax_exp.plot(t, s["shared_exposed_us"], marker="o", ms=3, **st)
            ax_exp.plot(t, s["shared_us"], ls=(0, (2, 2)), marker="_", ms=10, color=color, alpha=0.6, lw=0.9)
        for ax in (ax_frac, ax_exp):
            tokens_axis(ax, ok["tokens_per_rank"])
            ax.grid(True, which="both", alpha=0.3)
            ax.set_xlabel("tokens per rank")
        ax_frac.set(ylim=(-0.05, 1.05), ylabel="overlap fraction", title=f"{title} · hidden" if title else "hidden")
        ax_exp.set(ylabel="µs", title=f"{title} · exposed" if title else "exposed")
    keys = [
        (Line2D([], [], color="k", marker="o", ms=3), "ablation figure / exposed µs"),
        (Line2D([], [], color="k", ls=(0, (2, 2)), lw=0.9, marker="_", ms=10), "shared experts alone µs"),
    ]
    if has_band:
        keys.append(
            (
                Line2D([], [], color="k", lw=6, alpha=0.18),
                "90 % bootstrap interval" + (" (whiskers at one token count)" if single else ""),
            )
        )
    if has_trace:
        keys.append((Line2D([], [], color="k", marker="x", ls=":"), "trace's figure"))
    legends(fig, axes, p, keys)
    fig.suptitle(p.suptitle("Shared experts: the fraction hidden, and the time left exposed"))
    return save(fig, path)


def plot_workspace(df: pd.DataFrame, path) -> Path | None:
    """Workspace MiB vs tokens per rank, a panel per model (and backend): allocator peak
    solid with markers, analytic dotted; colour per combination."""
    ok = _ok(df)
    ok = ok[ok[["workspace_bytes_peak", "workspace_bytes_analytic"]].notna().any(axis=1)]
    if not len(ok):
        return None
    p = panels(ok)
    fig, axes = grid(len(p.groups))
    for i, (ax, (title, g)) in enumerate(zip(axes, p.groups, strict=True)):
        for j, (lab, s, st) in enumerate(_series(p, i, g)):
            t, color = s["tokens_per_rank"], st["color"]
            ax.plot(t, s["workspace_bytes_peak"] / MIB, color=color, marker=MARKERS[j % 10], ms=4, label=lab)
            ax.plot(t, s["workspace_bytes_analytic"] / MIB, color=color, ls=":", lw=1.2, alpha=0.8, marker="_", ms=10)
        tokens_axis(ax, ok["tokens_per_rank"])
        ax.set(title=title, xlabel="tokens per rank")
        value_axis(ax, pd.concat([g["workspace_bytes_peak"], g["workspace_bytes_analytic"]]) / MIB, "workspace MiB")
        ax.grid(True, which="both", alpha=0.3)
    keys = [
        (Line2D([], [], color="k", marker="o", ms=4), "allocator peak"),
        (Line2D([], [], color="k", ls=":", marker="_", ms=10), "analytic (declared)"),
    ]
    # a key only for a figure the rows have (CPU rows: no allocator peak)
    columns = ("workspace_bytes_peak", "workspace_bytes_analytic")
    keys = [k for k, col in zip(keys, columns, strict=True) if ok[col].notna().any()]
    legends(fig, axes, p, keys)
    title = "Workspace of one forward" + (
        "" if ok["workspace_bytes_peak"].notna().any() else " (analytic: no allocator peak on these rows)"
    )
    fig.suptitle(p.suptitle(title))
    return save(fig, path)
