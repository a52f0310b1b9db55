"""PNG plots of a run and of a comparison (matplotlib, no pyplot: safe headless).

Every function writes one PNG at ``path`` and returns that path, or returns None (and
writes nothing) when the rows hold nothing to plot, e.g. no overlap rows.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter, NullLocator

from .compare import Comparison
from .load import PHASE_COLUMNS, combo_labels, latest_rows

MIB = 1024.0 * 1024.0
LINESTYLES = ["-", "--", ":", "-."]
VERDICT_COLORS = {"slower": "tab:red", "faster": "tab:green", "~": "tab:gray"}
REDUCTION_COLORS = {"experts": "tab:blue", "finalize": "tab:orange"}
MAX_BARS = 60


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    df = latest_rows(df)
    df = df[(df["status"] == "ok") & df["tokens_per_rank"].notna()].copy()
    df["label"] = combo_labels(df).values if len(df) else []
    return df.sort_values(["label", "tokens_per_rank"], kind="stable")


def _save(fig: Figure, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def _style(i: int) -> dict:
    """Distinct colour + line style for the i-th line (10 colours x 4 styles)."""
    return {"color": f"C{i % 10}", "linestyle": LINESTYLES[(i // 10) % len(LINESTYLES)]}


def _tokens_axis(ax, tokens) -> None:
    """Log x axis of tokens per rank, ticked at the measured token counts."""
    ax.set_xscale("log")
    tokens = sorted({int(t) for t in tokens})
    if len(tokens) <= 16:
        ax.set_xticks(tokens, [str(t) for t in tokens])
        ax.xaxis.set_minor_locator(NullLocator())


def _plain_log(axis) -> None:
    """Plain numbers (60, 200) rather than 6x10^1 on a log axis, minor ticks included."""
    axis.set_major_formatter(LogFormatter(labelOnlyBase=False))
    axis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.4)))


def _legend(ax, n: int) -> None:
    if n:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def plot_latency(df: pd.DataFrame, path) -> Path | None:
    """Median latency (µs) vs tokens per rank, log-log, one line per combination, with
    its p20–p80 band."""
    ok = _ok(df)
    if not len(ok):
        return None
    fig = Figure(figsize=(9, 5))
    ax = fig.subplots()
    for i, (label, g) in enumerate(ok.groupby("label", sort=False)):
        st = _style(i)
        ax.plot(g["tokens_per_rank"], g["latency_us_median"], marker="o", ms=3, label=label,
                **st)
        ax.fill_between(g["tokens_per_rank"], g["latency_us_p20"], g["latency_us_p80"],
                        color=st["color"], alpha=0.2, lw=0)
    _tokens_axis(ax, ok["tokens_per_rank"])
    ax.set(yscale="log", xlabel="tokens per rank",
           ylabel="latency (µs, median; band p20–p80)", title="MoE layer latency")
    _plain_log(ax.yaxis)
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax, ok["label"].nunique())
    return _save(fig, path)


def _pick_tokens(tokens: list[int], max_panels: int) -> list[int]:
    if len(tokens) <= max_panels:
        return tokens
    idx = np.linspace(0, len(tokens) - 1, max_panels).round().astype(int)
    return [tokens[i] for i in sorted(set(idx))]


def plot_phases(df: pd.DataFrame, path, max_panels: int = 4) -> Path | None:
    """Stacked per-phase times (µs) per combination, one panel per tokens_per_rank
    (at most ``max_panels``, spread over the range)."""
    ok = _ok(df)
    ok = ok[ok[PHASE_COLUMNS].notna().any(axis=1)]
    if not len(ok):
        return None
    tokens = _pick_tokens(sorted(int(t) for t in ok["tokens_per_rank"].unique()), max_panels)
    labels = list(dict.fromkeys(ok["label"]))
    fig = Figure(figsize=(4.2 * len(tokens) + 3, 0.35 * len(labels) + 1.8),
                 layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(tokens), sharey=True))
    y = np.arange(len(labels))
    for ax, t in zip(axes, tokens):
        g = ok[ok["tokens_per_rank"] == t].set_index("label").reindex(labels)
        left = np.zeros(len(labels))
        for j, col in enumerate(PHASE_COLUMNS):
            width = g[col].fillna(0.0).to_numpy(dtype=float)
            ax.barh(y, width, left=left, color=f"C{j}", label=col.removesuffix("_us"))
            left += width
        ax.set(title=f"{t} tokens/rank", xlabel="µs")
        ax.grid(True, axis="x", alpha=0.3)
    axes[0].set_yticks(y, labels, fontsize=7)
    axes[0].invert_yaxis()
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.suptitle("Phase breakdown")
    return _save(fig, path)


def plot_overlap(df: pd.DataFrame, path) -> Path | None:
    """overlap_fraction (its 90 % bootstrap interval shaded, where rows have one) and
    shared_exposed_us (µs, with shared_us dashed) vs tokens per rank for rows with
    overlap = dispatch | combine."""
    ok = _ok(df)
    ok = ok[ok["overlap"].astype(str).isin(["dispatch", "combine"])]
    if not len(ok):
        return None
    fig = Figure(figsize=(12, 4.5))
    ax_frac, ax_exp = fig.subplots(1, 2)
    for i, (label, g) in enumerate(ok.groupby("label", sort=False)):
        st = _style(i)
        t = g["tokens_per_rank"]
        ax_frac.plot(t, g["overlap_fraction"], marker="o", ms=3, label=label, **st)
        if "overlap_fraction_lo" in g and g["overlap_fraction_lo"].notna().any():  # 90 % bootstrap
            ax_frac.fill_between(t, g["overlap_fraction_lo"], g["overlap_fraction_hi"], color=st["color"],
                                 alpha=0.15, lw=0)
        if g["trace_overlap_fraction"].notna().any():
            ax_frac.plot(t, g["trace_overlap_fraction"], marker="x", ls=":", color=st["color"])
        ax_exp.plot(t, g["shared_exposed_us"], marker="o", ms=3, **st)
        ax_exp.plot(t, g["shared_us"], ls="--", color=st["color"], alpha=0.5)
    for ax in (ax_frac, ax_exp):
        _tokens_axis(ax, ok["tokens_per_rank"])
    ax_frac.set(ylim=(-0.05, 1.05), xlabel="tokens per rank",
                ylabel="overlap fraction (band: 90 % interval; x: trace)", title="Shared experts hidden")
    ax_exp.set(xlabel="tokens per rank",
               ylabel="µs (solid: exposed, dashed: shared alone)",
               title="Shared-expert time exposed")
    for ax in (ax_frac, ax_exp):
        ax.grid(True, which="both", alpha=0.3)
    ax_exp.legend(*ax_frac.get_legend_handles_labels(), fontsize=7, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _save(fig, path)


def plot_workspace(df: pd.DataFrame, path) -> Path | None:
    """Workspace MiB vs tokens per rank, coloured by reduction placement (experts |
    finalize): allocator peak solid, analytic dashed; one line pair per combination."""
    ok = _ok(df)
    ok = ok[ok[["workspace_bytes_peak", "workspace_bytes_analytic"]].notna().any(axis=1)]
    if not len(ok):
        return None
    fig = Figure(figsize=(9, 5))
    ax = fig.subplots()
    for i, (label, g) in enumerate(ok.groupby("label", sort=False)):
        red = str(g["reduction"].iloc[0])
        color = REDUCTION_COLORS.get(red, f"C{2 + i % 8}")
        marker = "os^vD<>ph*"[i % 10]
        t = g["tokens_per_rank"]
        ax.plot(t, g["workspace_bytes_peak"] / MIB, color=color, marker=marker, ms=4,
                label=f"{label} (reduce in {red})")
        ax.plot(t, g["workspace_bytes_analytic"] / MIB, color=color, marker=marker, ms=3,
                ls="--", alpha=0.6)
    _tokens_axis(ax, ok["tokens_per_rank"])
    ax.set(yscale="log", xlabel="tokens per rank",
           ylabel="workspace MiB (solid: peak, dashed: analytic)",
           title="Workspace by reduction placement")
    _plain_log(ax.yaxis)
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax, ok["label"].nunique())
    return _save(fig, path)


def plot_comparison(cmp: Comparison, path) -> Path | None:
    """Horizontal bars of candidate / baseline median latency per matched ok row,
    coloured by verdict, with the threshold factor marked. At most MAX_BARS rows, the
    largest changes first."""
    m = cmp.matched[np.isfinite(cmp.matched["ratio"].astype(float))].copy()
    if not len(m):
        return None
    m["_dist"] = np.abs(np.log(m["ratio"].astype(float)))
    m = m.nlargest(MAX_BARS, "_dist").sort_values("ratio")
    names = [f"{lab} @{int(t)}" for lab, t in zip(m["label"], m["tokens_per_rank"])]
    fig = Figure(figsize=(9, 0.28 * len(m) + 1.8))
    ax = fig.subplots()
    y = np.arange(len(m))
    ax.barh(y, m["ratio"] - 1.0, left=1.0,
            color=[VERDICT_COLORS.get(v, "tab:gray") for v in m["verdict"]])
    ax.axvline(1.0, color="black", lw=0.8)
    for x in (cmp.threshold, 1.0 / cmp.threshold):
        ax.axvline(x, color="black", lw=0.6, ls="--")
    ax.set_yticks(y, names, fontsize=7)
    ax.set(xlabel="candidate / baseline median latency (red slower, green "
                                "faster, dashed: threshold)",
           title=f"Latency ratio ({len(m)} of {len(cmp.matched)} matched rows)")
    ax.grid(True, axis="x", alpha=0.3)
    return _save(fig, path)
