"""The report's figures, one question each, titled with the answer in words and numbers
(docs/design.md, "What a report answers"):

- ``plot_effects``: what each choice does (report/effects.py): ratio on a log axis with its
  interval, one row per axis value and token count (and interacting value);
- ``plot_fastest``: latency vs tokens of the fastest few combinations and the baseline, a panel
  per workload where the run holds several (models, routings: combinations are ranked only
  against those that saw the same tokens, as the fastest-per-size lines are); where each size
  ran one combination, ``plot_alone``: its latency vs tokens, a line per workload;
- ``plot_memory``: the workspace vs tokens by reduction placement, the budget line where given.

Where the time goes (the phases) is report/phase_plot.py's; the frame they share (size, title,
the PNG) report/answer_frame.py's. Whatever the number of rows, a figure stays legible at 900 px
and within MAX_PX: past its budget it shows the rows that matter (largest effects, the fastest,
the baseline) and its caption (the returned `Figure.left_out`) says how many it left out. On a
CPU run each title says it is a pipeline check, not performance.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd
from matplotlib.figure import Figure as MplFigure

from moebench.report.answer_frame import MAX_PANELS, Figure, Labeller, finish, frame, tokens_log2, us_text
from moebench.report.effects import BAND, FASTER, SLOWER, Effect, decimals, fmt_interval, fmt_ratio
from moebench.report.fmt import fmt_mib
from moebench.report.plotgrid import LINESTYLES, plain_log
from moebench.report.workloads import spread, union_labels, workloads
from moebench.util.words import counted

MAX_EFFECT_ROWS = 28
MAX_SERIES = 6
MIB = 2.0**20


# -- what each choice does --------------------------------------------------------------------


# an effect's colour by its verdict (effects.py classify): an interval wholly below the band green,
# wholly above red, inside or across it (no difference, inconclusive) grey
EFFECT_COLORS = {FASTER: "C2", SLOWER: "C3"}
NO_CALL = "0.45"


def effect_legend(fig: MplFigure) -> None:
    """What effects.png's band and three colours mean, under the panel (inside, it hid an error bar)."""
    from matplotlib.artist import Artist
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    keys = (
        (EFFECT_COLORS[FASTER], f"{FASTER}: interval wholly below the band"),
        (EFFECT_COLORS[SLOWER], f"{SLOWER}: interval wholly above the band"),
        (NO_CALL, "no call: interval inside or across the band"),
    )
    handles: list[Artist] = [Patch(color="0.9", label=f"band: no difference (±{(BAND - 1) * 100:.0f} %)")]
    handles += [Line2D([], [], color=c, label=text, marker="o", ms=4, lw=1.4) for c, text in keys]
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=7, frameon=False)


def _effect_label(e: Effect) -> str:
    where = f" · {e.by}={e.by_value}" if e.by else ""
    return f"{e.axis}={e.value} vs {e.baseline}{where} · {e.tokens} tok"


def plot_effects(effects: list[Effect], path, cpu: bool = False) -> Figure | None:
    """Each effect as its ratio with its interval on a log axis, the no-difference band shaded;
    past MAX_EFFECT_ROWS the largest effects (by |log ratio|) are kept."""
    if not effects:
        return None
    ranked = sorted(effects, key=lambda e: -abs(math.log(e.ratio)))
    shown = ranked[:MAX_EFFECT_ROWS]
    order = {id(e): i for i, e in enumerate(effects)}
    shown.sort(key=lambda e: order[id(e)])  # the text's order: axis, value, tokens
    fig, (ax,) = frame(0.3 * len(shown) + 1.95)  # 0.35 in of it the legend's
    y = np.arange(len(shown))[::-1]
    ratio = np.array([e.ratio for e in shown])
    lo, hi = np.array([e.lo for e in shown]), np.array([e.hi for e in shown])
    colors = [EFFECT_COLORS.get(e.verdict, NO_CALL) for e in shown]
    ax.axvspan(1 / BAND, BAND, color="0.9", lw=0)
    ax.axvline(1.0, color="0.5", lw=0.8)
    ax.hlines(y, lo, hi, colors=colors, lw=1.4)
    ax.scatter(np.r_[lo, hi], np.r_[y, y], marker="|", c=colors + colors, s=40)
    ax.scatter(ratio, y, c=colors, s=22, zorder=3)
    ax.set_yticks(y, [_effect_label(e) for e in shown], fontsize=7.5)
    ax.set_xscale("log")
    span = max(1.3, float(np.nanmax(np.r_[hi, 1 / lo])) * 1.15)
    ax.set_xlim(1 / span, span)
    ticks = [t for t in (0.25, 0.33, 0.5, 0.67, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0) if 1 / span <= t <= span]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("latency ratio, value ÷ baseline (< 1: faster)\ngeometric mean over pairs, 95 % interval")
    ax.grid(True, axis="x", alpha=0.3)
    effect_legend(fig)
    top = ranked[0]
    where = f" with {top.by}={top.by_value}" if top.by else ""
    d = decimals(top.lo, top.hi)  # as the text prints it
    title = (
        f"What each choice does: {top.axis}={top.value} takes {fmt_ratio(top.ratio, d)} the latency of "
        f"{top.baseline}{where} at {top.tokens} tok {fmt_interval(top.lo, top.hi, d)} (largest effect)"
    )
    left = len(effects) - len(shown)
    note = f"{counted(left, 'smaller effect')} left out (all are in the text above)" if left else ""
    return finish(fig, path, title, cpu, note)


# -- the fastest combinations -----------------------------------------------------------------


def fastest_keys(ok: pd.DataFrame, limit: int = MAX_SERIES, baseline_key: str | None = None) -> list[str]:
    """combo_keys of the fastest combination at each token count, then by their best rank over
    the token counts, up to `limit`; the baseline's key kept (last) when it ran."""
    rank = ok.groupby("tokens_per_rank")["latency_us_median"].rank(method="first")
    best = pd.DataFrame({"key": ok["combo_key"], "rank": rank}).groupby("key")["rank"].min().sort_values(kind="stable")
    keys = list(best.index[: limit - (baseline_key is not None)])
    if baseline_key is not None and baseline_key in set(ok["combo_key"]) and baseline_key not in keys:
        keys.append(baseline_key)
    return keys


def _latency_lines(ax, sub: pd.DataFrame, keys: list[str], names: dict, tokens: list[int], styles=None) -> None:
    """A line per combination key (`styles`: its colour and line style by key, the same in every panel)."""
    for j, k in enumerate(keys):
        s = sub[sub["combo_key"] == k].sort_values("tokens_per_rank")
        st = styles[k] if styles else {"color": f"C{j}", "linestyle": "-"}
        ax.plot(s["tokens_per_rank"], s["latency_us_median"], marker="o", ms=3.5, label=names[k], **st)
        ax.fill_between(s["tokens_per_rank"], s["latency_us_p20"], s["latency_us_p80"], color=st["color"], alpha=0.15)
    tokens_log2(ax, tokens)
    ax.set_yscale("log")
    plain_log(ax.yaxis)
    ax.set_ylabel("latency µs (median, p20–p80)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", frameon=False)


def _fastest_at(ok: pd.DataFrame, label: Labeller, big: int) -> tuple[str, str]:
    """(`<label>, <µs> µs`, `, <ratio> to the next` or '') of the fastest row at `big` tokens."""
    at = ok[ok["tokens_per_rank"] == big].sort_values("latency_us_median")
    first = at.iloc[0]
    margin = (
        f", {fmt_ratio(at.iloc[1]['latency_us_median'] / first['latency_us_median'])} to the next"
        if len(at) > 1
        else ""
    )
    return f"{label(ok).loc[first.name]}, {us_text(first['latency_us_median'])} µs", margin


def _dots(ax, at: pd.DataFrame, names: dict, title: str) -> None:
    """One token count's rows as dots with p20–p80 whiskers, the fastest on top."""
    s = at.sort_values("latency_us_median")
    y = np.arange(len(s))[::-1]
    med = s["latency_us_median"].to_numpy(dtype=float)
    err = [np.maximum(med - s["latency_us_p20"], 0), np.maximum(s["latency_us_p80"] - med, 0)]
    ax.errorbar(med, y, xerr=err, fmt="o", ms=5, capsize=3, color="C0")
    ax.set_yticks(y, [names[k] for k in s["combo_key"]], fontsize=7.5)
    ax.set_title(title, fontsize=9, loc="left")
    ax.set_xlabel("latency µs (median, p20–p80)")
    ax.grid(True, axis="x", alpha=0.3)


def _plot_fastest_per_workload(groups, path, baseline_of, cpu: bool) -> Figure:
    """plot_fastest for a run of several workloads: a panel each (up to MAX_PANELS, spread over the
    models), its own fastest few and its own baseline (`baseline_of(rows)`), a combination named and
    styled alike in every panel; lines over its token counts, or dots at its largest where it has at
    most three."""
    shown = spread(groups, MAX_PANELS)
    picked = []
    for name, g in shown:
        base = baseline_of(g) if baseline_of else None
        keys = fastest_keys(g, MAX_SERIES, base)
        picked.append((name, g, keys, base))
    union = pd.concat([g[g["combo_key"].isin(keys)] for _, g, keys, _ in picked])
    labels = union_labels(union)
    label_of = labels.groupby(union["combo_key"], sort=False).first().astype(str).to_dict()
    every = sorted(set(label_of.values()))  # one style per label: 10 colours, then line styles
    style_of = {
        n: {"color": f"C{i % 10}", "linestyle": LINESTYLES[(i // 10) % len(LINESTYLES)]} for i, n in enumerate(every)
    }

    def named(rows: pd.DataFrame) -> pd.Series:  # the Labeller of every panel: one name per combination
        return rows["combo_key"].map(lambda key: label_of.get(key, str(key)))

    fig, axes = frame(0.6 + 3.0 * len(shown), nrows=len(shown))
    said, left = [], 0
    for ax, (name, g, keys, base) in zip(axes, picked, strict=True):
        sub = g[g["combo_key"].isin(keys)]
        names = {k: label_of[k] + (" (baseline)" if k == base else "") for k in keys}
        tokens = sorted(int(t) for t in g["tokens_per_rank"].unique())
        big = max(tokens)
        who, margin = _fastest_at(g, named, big)
        if len(tokens) <= 3:
            _dots(ax, sub[sub["tokens_per_rank"] == big], names, f"{name} at {big} tok: fastest {who}{margin}")
        else:
            _latency_lines(ax, sub, keys, names, tokens, {k: style_of[label_of[k]] for k in keys})
            ax.set_title(f"{name}: fastest at {big} tok {who}{margin}", fontsize=9, loc="left")
        said.append(f"{name}: {who}")
        left += g["combo_key"].nunique() - len(keys)
    title = "Fastest at each workload's largest size: " + "; ".join(said)
    notes = []
    if left > 0:
        notes.append(f"{counted(left, 'slower combination')} left out (the tables below hold every one)")
    if len(groups) > len(shown):
        notes.append(f"{len(groups) - len(shown)} of {len(groups)} workloads not drawn (the tables below hold them)")
    return finish(fig, path, title, cpu, "; ".join(notes))


def plot_fastest(ok: pd.DataFrame, label: Labeller, path, cpu: bool = False,
                 baseline_of: Callable[[pd.DataFrame], str | None] | None = None,
                 within: pd.DataFrame | None = None) -> Figure | None:  # fmt: skip
    """Median latency with p20–p80 whiskers of the fastest few combinations (and the baseline,
    `baseline_of(rows)`'s combo_key): a dot chart per token count where the run has at most three,
    else lines on log-log axes; a panel per workload where the run holds several (the fastest and
    the baseline each workload's own). Workloads are named by what varies `within` (the run's ok
    rows, as the text names them; default `ok`): the one workload of GPU-time rows among others of
    host time is named in the title."""
    if ok.empty:
        return None
    groups = workloads(ok, within)
    if len(groups) > 1:
        return _plot_fastest_per_workload(groups, path, baseline_of, cpu)
    baseline_key = baseline_of(ok) if baseline_of else None
    keys = fastest_keys(ok, MAX_SERIES, baseline_key)
    sub = ok[ok["combo_key"].isin(keys)]
    tokens = sorted(int(t) for t in ok["tokens_per_rank"].unique())
    labels = label(sub)
    names = {k: str(labels.loc[sub.index[sub["combo_key"] == k][0]]) for k in keys}
    if baseline_key in names:
        names[baseline_key] += " (baseline)"
    if len(tokens) <= 3:  # a panel per token count: a dot per combination, fastest on top
        fig, axes = frame(0.9 + (0.3 * len(keys) + 0.7) * len(tokens), nrows=len(tokens))
        for ax, t in zip(axes, tokens, strict=True):
            _dots(ax, sub[sub["tokens_per_rank"] == t], names, f"{counted(t, 'token')} per rank")
    else:
        fig, (ax,) = frame(4.6)
        _latency_lines(ax, sub, keys, names, tokens)
    big = max(tokens)
    on = f" on {groups[0][0]}" if groups[0][0] else ""
    title = "Fastest{} at {} tok: {}{}".format(on, big, *_fastest_at(ok, label, big))
    left = ok["combo_key"].nunique() - len(keys)
    note = f"{counted(left, 'slower combination')} left out (the tables below hold every one)" if left > 0 else ""
    return finish(fig, path, title, cpu, note)


def plot_alone(ok: pd.DataFrame, path, cpu: bool = False, within: pd.DataFrame | None = None) -> Figure | None:
    """Where each workload ran one combination per size (nothing to rank): its median latency with
    p20–p80 band vs tokens, a line per workload (up to MAX_SERIES, spread over the models; named
    by what varies `within`, as plot_fastest)."""
    if ok.empty:
        return None
    groups = workloads(ok, within)
    shown = spread(groups, MAX_SERIES)
    named = [(name or str(g["model"].iloc[0]), g.sort_values("tokens_per_rank")) for name, g in shown]
    rows = pd.concat([g.assign(combo_key=name) for name, g in named])
    tokens = sorted(int(t) for t in rows["tokens_per_rank"].unique())
    fig, (ax,) = frame(3.6)
    _latency_lines(ax, rows, [n for n, _ in named], {n: n for n, _ in named}, tokens)
    said = [
        f"{n} {us_text(g['latency_us_median'].iloc[0])} µs at {g['tokens_per_rank'].iloc[0]} tok"
        + (
            f" to {us_text(g['latency_us_median'].iloc[-1])} µs at {g['tokens_per_rank'].iloc[-1]} tok"
            if len(g) > 1
            else ""
        )
        for n, g in named
    ]
    left = len(groups) - len(shown)
    note = f"{left} of {len(groups)} workloads not drawn (the tables below hold them)" if left else ""
    return finish(fig, path, "Latency of the one combination per size: " + "; ".join(said), cpu, note)


# -- memory --------------------------------------------------------------------------------------


def _mib_text(mib: float) -> str:
    """MiB as a title says it: 1,211 MiB or 54 MiB, below 1 MiB its digits (0.251 MiB, not 0 MiB)."""
    return f"{mib:,.0f} MiB" if mib >= 1 else f"{fmt_mib(mib * MIB)} MiB"


def plot_memory(ws: pd.DataFrame, path, budget: float | None = None, cpu: bool = False) -> Figure | None:
    """The workspace peak of one forward vs tokens, per reduction placement (`ws`: answers.workspace_stats):
    the median over its combinations and their range; the budget as a line where one is given."""
    fig, (ax,) = frame(4.2)
    med = {}
    for j, (red, g) in enumerate(ws.groupby(level="reduction", sort=True)):
        s = g.droplevel("reduction")[["median", "min", "max"]] / MIB
        most = int(g["combinations"].max())
        ax.plot(s.index, s["median"], "o-", color=f"C{j}", label=f"reduction={red} (median of {most})")
        ax.fill_between(s.index, s["min"], s["max"], color=f"C{j}", alpha=0.15)
        med[red] = s["median"]
    if budget:
        ax.axhline(budget / MIB, color="C3", ls="--", lw=1, label=f"budget {budget / MIB:,.0f} MiB")
    tokens = sorted(int(t) for t in ws.index.get_level_values("tokens_per_rank").unique())
    tokens_log2(ax, tokens)
    ax.set_yscale("log")
    ax.set_ylabel("workspace of one forward, MiB (median, range)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", frameon=False)
    big = tokens[-1]
    what = "Declared workspace (no peak measured)" if bool(ws["declared"].any()) else "Workspace"
    at = {r: float(s.loc[big]) for r, s in med.items() if big in s.index}
    if len(at) >= 2:
        lo_r, hi_r = min(at, key=lambda r: at[r]), max(at, key=lambda r: at[r])
        versus = f"{fmt_ratio(at[lo_r] / at[hi_r])} the {_mib_text(at[hi_r])} of {hi_r}"
        title = f"{what} at {big} tok: reduction={lo_r} {_mib_text(at[lo_r])}, {versus} (medians)"
    else:
        ((r, v),) = at.items()
        title = f"{what} at {big} tok: reduction={r} {_mib_text(v)} (median)"
    return finish(fig, path, title, cpu)
