"""PNG plots of a comparison (report/compare.py): the change per pair with its interval,
and baseline and candidate latency on the same axes, as small multiples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.legend_handler import HandlerTuple
from matplotlib.lines import Line2D

from moebench.report.answer_frame import CPU_PREFIX
from moebench.report.columns import fmt_value, records
from moebench.report.compare import Comparison
from moebench.report.compare_tables import pair_order
from moebench.report.fmt import MINUS, fmt_change
from moebench.report.plotgrid import grid, legends, panels, save, tokens_axis, value_axis
from moebench.report.stats import pct
from moebench.results.row import CHANGED_VERDICTS, NO_VERDICT, Status, Verdict
from moebench.util.words import counted

VERDICT_COLORS = {Verdict.SLOWER: "tab:red", Verdict.FASTER: "tab:green"}
UNDER_COLORS = {True: "#f4a6a6", False: "#a6dba0"}  # significant under the threshold: slower / faster
NO_CHANGE = "#b0b0b0"
# ok on both sides but no verdict may rest on the figure (the clocks differ, host or CPU time): not
# "no change", which a +16 % bar in grey would claim
NO_VERDICT_COLOR = "#c9b8e3"
NO_VERDICT_LABELS = {Verdict.CLOCK: "the GPU clocks differ", Verdict.HOST: "host time", Verdict.CPU: "CPU time"}
# a figure's budget, whatever the rows: at most 1,800 px tall at moebench's dpi (110)
MAX_BARS = 40
MAX_PANELS = 6
MAX_HEIGHT_IN = 16.0


def _bar_color(r: dict) -> str:
    if r["verdict"] in VERDICT_COLORS:
        return VERDICT_COLORS[r["verdict"]]
    if r["verdict"] == Verdict.SIMILAR and r["significant"] and np.isfinite(r["ratio"]):
        return UNDER_COLORS[r["ratio"] > 1]
    if r["verdict"] in NO_VERDICT:
        return NO_VERDICT_COLOR
    return NO_CHANGE


def _no_verdict_label(verdicts) -> str:
    """The legend's entry for the rows drawn in NO_VERDICT_COLOR: why they have no verdict."""
    why = [NO_VERDICT_LABELS[v] for v in NO_VERDICT if v in set(verdicts)]
    return "no verdict (" + ", ".join(why) + ")"


MEM_COLORS = {"larger": "tab:red", "smaller": "tab:green"}


# not measured on a side, nothing broken: counted under the latency figure's title, never drawn (a row
# of them crowded out the measured changes, and their label in red read as a failure)
NOT_MEASURED = (Verdict.SKIPPED, Verdict.CANNOT_RUN)
STATUS_COLORS = {Verdict.BROKEN: "tab:red", Verdict.FIXED: "tab:green"}  # named without a bar


def _bars_frame(cmp: Comparison, what: str):
    """The rows a bar chart draws: `_r`, `_lo`, `_hi` (ratios) and `_color` per pair."""
    m = cmp.matched[~cmp.matched["verdict"].isin([Verdict.NEITHER_OK, *NOT_MEASURED])]
    if what == "workspace":
        m = m[np.isfinite(m["mem_ratio"].astype(float))]
        return m.assign(
            _r=m["mem_ratio"], _lo=np.nan, _hi=np.nan, _color=[MEM_COLORS.get(v, NO_CHANGE) for v in m["mem_verdict"]]
        )
    return m.assign(_r=m["ratio"], _lo=m["ci_lo"], _hi=m["ci_hi"], _color=[_bar_color(r) for r in records(m)])


def not_drawn_line(cmp: Comparison) -> str:
    """'not drawn: 26 rows skipped and 2 rows cannot run in cand (...)', '' without such rows."""
    counts = cmp.counts()
    parts = [f"{counted(counts[v], 'row')} {v}" for v in NOT_MEASURED if counts[v]]
    if not parts:
        return ""
    return f"not drawn: {' and '.join(parts)} in {cmp.candidate_name} (no measurement there: no verdict)"


def most_telling(m: pd.DataFrame, limit: int) -> pd.DataFrame:
    """The `limit` pairs a reader must see first: those with a verdict that changed (broken,
    slower, faster, fixed, in that order), then the significant ones, then by the size of
    the change (`_r`, a ratio)."""
    order = {v: i for i, v in enumerate(CHANGED_VERDICTS)}
    size = np.abs(np.log(pd.to_numeric(m["_r"], errors="coerce").astype(float).fillna(1.0).clip(lower=1e-9)))
    rank = m.assign(
        _o=m["verdict"].map(order).fillna(len(order)),
        _s=~m["significant"].fillna(False).astype(bool) if "significant" in m.columns else True,
        _d=-size,
    )
    return m.loc[rank.sort_values(["_o", "_s", "_d"], kind="stable").index[:limit]]


def bar_rows(cmp: Comparison, what: str = "latency") -> tuple[pd.DataFrame, int]:
    """(the rows plot_comparison draws, in combination then token order; how many it could draw):
    at most MAX_BARS, the changes called first, then by size (most_telling; a workspace figure by
    size alone); never a row not
    measured on a side (NOT_MEASURED)."""
    m = _bars_frame(cmp, what)
    total = len(m)
    if total > MAX_BARS:  # a workspace's bars by their own size, not the pairs' latency verdicts
        ranked = m.assign(verdict=None, significant=False) if what == "workspace" else m
        m = m.loc[most_telling(ranked, MAX_BARS).index]
    return pair_order(m), total


def on_cpu(m: pd.DataFrame) -> bool:
    """Whether every pair drawn ran on the CPU: its figures are a pipeline check, and its PNGs say
    so first, as a single run's do (answer_frame.CPU_PREFIX)."""
    return bool(len(m)) and "device" in m.columns and bool((m["device"].astype(str) == "cpu").all())


def selection_words(m: pd.DataFrame, total: int, what: str = "latency") -> str:
    """' (40 of 90 rows: the 2 changes called, then the largest; in combination order)': which rows
    a figure beyond MAX_BARS kept (most_telling), as the drawn rows are, '' where it drew them all.
    A CPU run calls nothing, so its bars are 'the largest changes', never 'the changes called'."""
    if total <= len(m):
        return ""
    if what == "workspace":
        return f" ({len(m)} of {total} rows: the largest changes; in combination order)"
    called = int(m["verdict"].isin(CHANGED_VERDICTS).sum())
    sig = int((~m["verdict"].isin(CHANGED_VERDICTS) & m["significant"].fillna(False).astype(bool)).sum())
    rest = len(m) - called
    parts = [f"the {counted(called, 'change')} called"] if called else []
    if rest:
        kept = "significant ones by size" if sig >= rest else "significant, then the largest" if sig else "largest"
        parts.append(("then the " if called else "the ") + kept + ("" if called or sig else " changes"))
    return f" ({len(m)} of {total} rows: {', '.join(parts)}; in combination order)"


def legend_keys(m: pd.DataFrame, what: str) -> list[tuple[Any, str]]:
    """The legend's entries for the colours the bars drawn use, and only those (a CPU run's lilac
    bars alone had five entries, four of them colours no bar used)."""
    used = set(m.loc[np.isfinite(m["_r"].astype(float)), "_color"])
    bar = lambda color: Line2D([], [], color=color, lw=6)
    if what == "workspace":
        keys = [
            (MEM_COLORS["larger"], "larger"),
            (MEM_COLORS["smaller"], "smaller"),
            (NO_CHANGE, "within the threshold"),
        ]
        return [(bar(c), label) for c, label in keys if c in used]
    out: list[tuple[Any, str]] = [
        (bar(VERDICT_COLORS[v]), str(v)) for v in (Verdict.SLOWER, Verdict.FASTER) if VERDICT_COLORS[v] in used
    ]
    under = tuple(bar(UNDER_COLORS[b]) for b in (True, False) if UNDER_COLORS[b] in used)
    if under:
        out.append((under, "significant, no verdict (under the threshold, or noisy)"))
    if NO_CHANGE in used:
        out.append((bar(NO_CHANGE), "no significant change"))
    if NO_VERDICT_COLOR in used:
        out.append((bar(NO_VERDICT_COLOR), _no_verdict_label(m.loc[m["_color"] == NO_VERDICT_COLOR, "verdict"])))
    return out


def plot_comparison(cmp: Comparison, path, what: str = "latency") -> Path | None:
    """Horizontal bars of the change (%) per pair, a panel per model (and backend), rows in
    combination then token order, the value printed; the threshold dashed. ``what``:
    "latency" (the median's change with its 95 % interval; red slower / green faster past
    the threshold, pale where significant without a verdict, grey no change, lilac no verdict
    possible: the clocks differ, host or CPU time; broken and fixed rows named without a bar;
    skipped and cannot-run rows, not measured on a side, not drawn but counted under the title) or
    "workspace" (the allocator peak, deterministic: red larger / green smaller past the threshold).
    Beyond MAX_BARS rows: the changes called, then by size, significant first, the title saying which
    (selection_words); the legend lists the colours drawn (legend_keys); a CPU run's title says it is
    a pipeline check (on_cpu)."""
    m, total = bar_rows(cmp, what)
    if not len(m) or (what == "workspace" and not np.isfinite(m["_r"].astype(float)).any()):
        return None
    first = ("model", "backend") if total <= MAX_BARS else ()  # one panel for a selection
    p = panels(m.assign(_pair=np.arange(len(m))), series_key="_pair", max_series=10**6, first=first, fallback="")
    sizes = [len(g) for _, g in p.groups]
    height = min(0.32 * sum(sizes) + 1.1 * len(sizes) + 1.0, MAX_HEIGHT_IN)
    fig = Figure(figsize=(10, height), layout="constrained")
    axes = np.atleast_1d(fig.subplots(len(sizes), 1, squeeze=False, height_ratios=[s + 1.5 for s in sizes])).ravel()
    lo_t, hi_t = pct(1 / cmp.threshold), pct(cmp.threshold)
    finite = m[np.isfinite(m["_r"].astype(float))]
    ends = np.concatenate(
        [finite["_r"].map(pct), finite["_lo"].map(pct).dropna(), finite["_hi"].map(pct).dropna(), [lo_t, hi_t]]
    )
    left, right = min(ends.min(), lo_t), max(ends.max(), hi_t)
    span = max(right - left, 1.0)
    values: list = []  # the printed changes, kept inside their panels once laid out (fit_values)
    for ax, (title, g) in zip(axes, p.groups, strict=True):
        y = np.arange(len(g))
        names = [
            " · ".join(x for x in (p.labels.loc[i], f"{fmt_value(t)} tok") if x)
            for i, t in zip(g.index, g["tokens_per_rank"], strict=True)
        ]
        for yi, r in zip(y, records(g), strict=True):
            if not np.isfinite(r["_r"]):  # broken or fixed: the status change named, without a bar
                status = f"{r['verdict']} ({r['base_status']} → {r['cand_status']})"
                color = STATUS_COLORS.get(r["verdict"], "dimgray")
                values.append(ax.text(0.02 * span, yi, status, va="center", fontsize=8, color=color))
                continue
            x = pct(r["_r"])
            ax.barh(yi, x, color=r["_color"], height=0.7)
            lo, hi = pct(r["_lo"]), pct(r["_hi"])
            if np.isfinite(lo):
                ax.errorbar(x, yi, xerr=[[x - lo], [hi - x]], fmt="none", ecolor="black", elinewidth=1, capsize=2.5)
            text = fmt_change(r["_r"], r["_lo"], r["_hi"])
            plus = not text.startswith(MINUS)  # the side of the sign printed ('+0.0 %' of −0.01 %: right)
            edge = max(x, hi) if plus else min(x, lo)
            edge = x if not np.isfinite(edge) else edge
            values.append(
                ax.text(
                    edge + (0.02 * span if plus else -0.02 * span),
                    yi,
                    text,
                    va="center",
                    ha="left" if plus else "right",
                    fontsize=7.5,
                    bbox=dict(facecolor="white", edgecolor="none", alpha=0.75, pad=0.4),
                )
            )
        ax.axvline(0, color="black", lw=0.8)
        for xt in (lo_t, hi_t):
            ax.axvline(xt, color="black", lw=0.7, ls="--")
        ax.set_yticks(y, names, fontsize=8)
        ax.set_ylim(len(g) - 0.4, -0.6)
        ax.set_xlim(left - 0.45 * span, right + 0.45 * span)  # room for the printed values
        ax.grid(True, axis="x", alpha=0.3)
        ax.set_title(title, fontsize=9, loc="left")
    if what == "workspace":
        axes[-1].set_xlabel(
            f"change in the workspace's allocator peak, % ({cmp.candidate_name} vs "
            f"{cmp.baseline_name})\ndashed: the threshold ×{cmp.threshold:g}"
        )
        heading = "Workspace change per row"
    else:
        axes[-1].set_xlabel(
            f"change in median latency, % ({cmp.candidate_name} vs {cmp.baseline_name})\n"
            f"whiskers: 95 % bootstrap interval; dashed: the threshold ×{cmp.threshold:g}"
        )
        heading = "Latency change per row"
    if keys := legend_keys(m, what):
        fig.legend(
            [h for h, _ in keys],
            [lab for _, lab in keys],
            loc="outside lower center",
            ncols=2,
            fontsize=8,
            frameon=False,
            handler_map={tuple: HandlerTuple(ndivide=None)},
        )
    shown = selection_words(m, total, what)
    cpu = CPU_PREFIX if on_cpu(m) else ""
    title = p.suptitle(f"{cpu}{heading}: {cmp.candidate_name} vs {cmp.baseline_name}{shown}")
    under = not_drawn_line(cmp) if what == "latency" else ""
    fig.suptitle(title + (f"\n{under}" if under else ""))
    fit_values(fig, list(axes), values)
    return save(fig, path)


MARGIN_PX = 10  # between a printed value and its panel's edge (at the figure's 100 dpi: its white box, a gap)


def fit_values(fig: Figure, axes: list, texts: list, rounds: int = 4) -> None:
    """Widen the panels' common x range until every printed value lies inside its panel: a label
    beside a −22 % bar ran over the row names left of the axis."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not texts:
        return
    canvas = FigureCanvasAgg(fig)
    for _ in range(rounds):
        fig.draw_without_rendering()  # the constrained layout, as savefig will lay it out
        renderer = canvas.get_renderer()
        left_px = right_px = 0.0
        for t in texts:
            box, inside = t.get_window_extent(renderer), t.axes.get_window_extent(renderer)
            left_px = max(left_px, inside.x0 + MARGIN_PX - box.x0)
            right_px = max(right_px, box.x1 - (inside.x1 - MARGIN_PX))
        if left_px <= 0 and right_px <= 0:
            return
        lo, hi = axes[0].get_xlim()
        per_px = (hi - lo) / axes[0].get_window_extent(renderer).width
        lo, hi = lo - 1.2 * left_px * per_px * (left_px > 0), hi + 1.2 * right_px * per_px * (right_px > 0)
        for ax in axes:
            ax.set_xlim(lo, hi)


def plot_comparison_latency(cmp: Comparison, path) -> Path | None:
    """Baseline (dashed, hollow) and candidate (solid) median latency vs tokens per rank
    with their p20–p80 bands, on the same axes: a panel per model (and backend), one
    colour per combination, at most two combinations a panel."""
    m = cmp.matched
    m = m[(m["base_status"] == Status.OK) | (m["cand_status"] == Status.OK)]
    if not len(m):
        return None
    m = pair_order(m).assign(_series=lambda d: d["combo_key"].astype(str))
    p = panels(m, series_key="_series", max_series=2)  # two lines and two bands each
    total = len(p.groups)
    if total > MAX_PANELS:  # the panels holding the largest changes
        size = np.abs(np.log(pd.to_numeric(m["ratio"], errors="coerce").astype(float).fillna(1.0).clip(lower=1e-9)))
        keep = sorted(range(total), key=lambda i: -float(size.loc[p.groups[i][1].index].max()))[:MAX_PANELS]
        keep = sorted(keep)
        p.groups = [p.groups[i] for i in keep]
        p.styles = {(new, lab): st for new, old in enumerate(keep) for (i, lab), st in p.styles.items() if i == old}
    fig, axes = grid(len(p.groups))
    for i, (ax, (title, g)) in enumerate(zip(axes, p.groups, strict=True)):
        for lab, s in g.groupby(p.labels.loc[g.index], sort=True):
            color = p.color(i, lab)
            s = s.sort_values("tokens_per_rank")
            t = s["tokens_per_rank"]
            for side, ls, face in (("base", "--", "white"), ("cand", "-", color)):
                ok = s[f"{side}_status"] == Status.OK
                ax.plot(
                    t[ok],
                    s.loc[ok, f"{side}_latency_us_median"],
                    ls=ls,
                    marker="o",
                    ms=4,
                    color=color,
                    markerfacecolor=face,
                    label=lab if side == "cand" else "_" + lab,
                )
                ax.fill_between(
                    t[ok],
                    s.loc[ok, f"{side}_latency_us_p20"],
                    s.loc[ok, f"{side}_latency_us_p80"],
                    color=color,
                    alpha=0.12,
                    lw=0,
                )
        tokens_axis(ax, m["tokens_per_rank"])
        ax.set(title=title, xlabel="tokens per rank")
        value_axis(
            ax,
            pd.concat([g[f"{s}_latency_us_{q}"] for s in ("base", "cand") for q in ("p20", "p80")]),
            "latency µs (median, band p20–p80)",
        )
        ax.grid(True, which="both", alpha=0.3)
    keys = [
        (Line2D([], [], color="k", marker="o", ms=4), cmp.candidate_name),
        (Line2D([], [], color="k", ls="--", marker="o", ms=4, markerfacecolor="white"), cmp.baseline_name),
    ]
    legends(fig, axes, p, keys)
    shown = f" ({len(p.groups)} of {total} panels: the largest changes)" if total > len(p.groups) else ""
    cpu = CPU_PREFIX if on_cpu(m) else ""
    fig.suptitle(p.suptitle(f"{cpu}Latency — solid: {cmp.candidate_name}, dashed: {cmp.baseline_name}{shown}"))
    return save(fig, path)
