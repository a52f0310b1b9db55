"""Capacity: how many tokens per rank fit a memory budget, per reduction placement.

For each combination (one line of rows over tokens per rank: the rows equal in every column that
names a combination in the report's tables, `runner.memory_budget` aside; a line is named by what
tells it from the others, what they all share is under the table), a least-squares line
`peak = intercept + slope * tokens` through its measured ok rows, for the allocator peak of a
forward (`workspace_bytes_peak`: what the layer allocates above what was allocated before
it) and the device-level peak (`device_bytes_peak`: weights,
buffers and the forward's peak above the context). The largest tokens per rank that fit a
budget B is floor((B - intercept) / slope) on the workspace line; with budget "free", the
GPU's memory (env.json) on the device line (the weights and buffers are its intercept). The
fit's worst residual is reported beside it: a line that does not fit its points predicts
nothing. A line through two token counts fits them exactly whatever the memory does elsewhere,
so the report says "2 points: exact by construction" there instead of a 0.0 % residual: only
three or more sizes (or capped runs) test it. Where the experts switched row layouts across
the sizes (the triton experts' `row_layout=auto`), the line goes through the points of the
largest size's layout. A combination without a GPU memory peak (a CPU run's rows have none) or
with peaks at one token count has no line: it is left out, and counted under the table; a run
with no line at all is refused (exit 2) before anything is written.

The allocations are what the layer needs; a cap on the caching allocator (and a GPU that
much smaller) also pays for the allocator's rounding and fragmentation over the timed work.
Where the rows carry it (`reserved_bytes_peak`: what the allocator reserved over the timed
samples, phases and one forward, above the bytes allocated at their start), a third line
gives that limit. The reserved bytes are at least the allocated ones, so the true limit under
a cap lies between the two lines: the reserved line is measured without a cap, where the
allocator never hands cached blocks back, so it is the cautious end. Rows measured under
`runner.memory_budget` are the confirmation of their combination's line: every ok at or below
the allocations' limit, every oom above the reserved one. They confirm the line of the layer they
ran: where none of its lines was measured with their runner settings (timing, L2 flush, traces:
how the runner measured, not what the layer allocates), they confirm its lines measured with
others, and a line under the table says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from moebench.report.columns import (
    COMBINATION_COLUMNS,
    PER_ROW_COLUMNS,
    RUNNER_COLUMNS,
    WORKLOAD_COLUMNS,
    combo_labels,
    constant_caption,
    fmt_series,
    fmt_value,
)
from moebench.report.document import report_out
from moebench.report.mdsafe import md_text
from moebench.report.table import md_table
from moebench.results.row import Status
from moebench.results.store import run_dir_of
from moebench.util.pngfile import save_figure
from moebench.util.safe_write import refuse_links, write_text
from moebench.util.words import counted

MIB = 2.0**20
CAP = "memory_budget"  # a capped row confirms the line of its combination measured without the cap
PANEL = ("model", "simulate_ep")  # a figure's panel: the layer one rank holds
PEAKS = ["workspace_bytes_peak", "device_bytes_peak"]  # what the lines go through: a GPU's, none on a CPU
REDUCTION_STYLE = {"experts": "-", "finalize": "--"}


@dataclass(frozen=True)
class Fit:
    intercept: float  # bytes
    slope: float  # bytes per token per rank
    max_residual: float  # the worst |residual| / value over the fitted points
    points: int


def fit_line(tokens, peak_bytes) -> Fit | None:
    """Least squares through (tokens, bytes); None with fewer than 2 distinct token counts."""
    t = np.asarray(tokens, dtype=float)
    y = np.asarray(peak_bytes, dtype=float)
    keep = np.isfinite(t) & np.isfinite(y)
    t, y = t[keep], y[keep]
    if len(np.unique(t)) < 2:
        return None
    slope, intercept = np.polyfit(t, y, 1)
    resid = y - (intercept + slope * t)
    rel = np.abs(resid) / np.maximum(np.abs(y), 1.0)
    return Fit(float(intercept), float(slope), float(rel.max()), int(len(t)))


def max_tokens(fit: Fit | None, budget: float) -> float:
    """Largest whole tokens per rank with intercept + slope * tokens <= budget (NaN without a fit)."""
    if fit is None or not np.isfinite(budget) or fit.slope <= 0:
        return float("nan")
    return float(max(0, np.floor((budget - fit.intercept) / fit.slope)))


def line_columns(df: pd.DataFrame) -> list[str]:
    """The columns that tell one line from another: those that name a combination in the
    report's tables (report.columns.COMBINATION_COLUMNS, less the per-row ones) that `df` has,
    less the cap (a capped row is a confirmation of its combination's line)."""
    return [c for c in COMBINATION_COLUMNS if c in df.columns and c not in PER_ROW_COLUMNS and c != CAP]


def line_keys(df: pd.DataFrame, columns: list[str]) -> pd.Series:
    """Each row's values of ``columns`` as one tuple of texts (fmt_value's: 1.0 and 1, NaN and
    None one each), the key that pairs a row with its line."""
    texts = [fmt_series(df[c]) for c in columns]
    return pd.Series(list(zip(*texts, strict=True)) if texts else [()] * len(df), index=df.index, dtype=object)


def _across(conf: pd.DataFrame, line: pd.Series, columns: list[str]) -> str:
    """The runner columns (of ``columns``) in which the capped rows ``conf`` differ from the line's
    points (one row of them, ``line``): 'l2_flush' ('' where they agree, or there are none)."""
    return ", ".join(c for c in columns if len(conf) and set(fmt_series(conf[c])) != {fmt_value(line[c])})


def _split(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ok rows measured without a cap (the lines' points) and the rows measured under one
    (runner.memory_budget: the confirmation), knobs '' where a row has none."""
    df = df.assign(knobs=df["knobs"].fillna("") if "knobs" in df else "")
    cap = pd.to_numeric(df[CAP], errors="coerce").fillna(0) if CAP in df else pd.Series(0, index=df.index)
    df[CAP] = cap
    return df[(df["status"] == Status.OK) & (cap == 0)], df[cap > 0]


def name_lines(cap: pd.DataFrame) -> pd.DataFrame:
    """``cap`` with each line's label: what tells it from the other lines of ``cap`` (combo_labels:
    only the columns that vary among them, the reduction aside: a column of its own), then the
    row layout its points ran where the combination ran two ('triton quant=bf16 (contiguous rows)')."""
    if not len(cap):
        return cap
    return cap.assign(line=combo_labels(cap, exclude=("reduction",)).to_numpy() + cap["segment"].to_numpy())


def capacity_frame(df: pd.DataFrame, budget: float | None = None, gpu_bytes: float | None = None) -> pd.DataFrame:
    """One row per combination: the two fits, the tokens that fit `budget` (bytes; workspace
    line) or, with budget None and `gpu_bytes`, the GPU's memory (device line), and the
    confirmation rows measured under runner.memory_budget, with the combination's columns
    (line_columns), the same workload's lines together and the reductions of one beside each other."""
    sweep, capped = _split(df)
    cols = line_columns(sweep)
    # capped rows confirm the line of the layer they ran: the one measured as they were, else the others
    layer = [c for c in cols if c not in RUNNER_COLUMNS]
    runner = [c for c in cols if c in RUNNER_COLUMNS]
    capped_by = dict(list(capped.groupby(line_keys(capped, cols), sort=False)))
    capped_by_layer = dict(list(capped.groupby(line_keys(capped, layer), sort=False)))
    out = []
    for key, g in sweep.groupby(line_keys(sweep, cols), sort=False):
        conf = capped_by.get(key)
        if conf is None:
            conf = capped_by_layer.get(tuple(k for c, k in zip(cols, key, strict=True) if c in layer), capped.iloc[:0])
        g, segment = _large_segment(g)
        ws = fit_line(g["tokens_per_rank"], g["workspace_bytes_peak"])
        dev = fit_line(g["tokens_per_rank"], g["device_bytes_peak"])
        res = fit_line(g["tokens_per_rank"], g["reserved_bytes_peak"]) if "reserved_bytes_peak" in g else None
        if budget is not None:
            limit, basis = max_tokens(ws, budget), "workspace"
            limit_res = max_tokens(res, budget)
        else:
            limit, basis = max_tokens(dev, gpu_bytes if gpu_bytes else float("nan")), "device"
            limit_res = float("nan")
        out.append(
            dict(
                g.iloc[0][cols].to_dict(),
                segment=segment,
                points=len(g),
                tokens_measured=f"{int(g['tokens_per_rank'].min())}–{int(g['tokens_per_rank'].max())}",
                peaks=int(g[PEAKS].notna().any(axis=1).sum()),
                ws_intercept=ws.intercept if ws else np.nan,
                ws_slope=ws.slope if ws else np.nan,
                ws_resid=ws.max_residual if ws else np.nan,
                ws_points=ws.points if ws else 0,
                dev_intercept=dev.intercept if dev else np.nan,
                dev_slope=dev.slope if dev else np.nan,
                dev_resid=dev.max_residual if dev else np.nan,
                max_tokens=limit,
                basis=basis,
                res_intercept=res.intercept if res else np.nan,
                res_slope=res.slope if res else np.nan,
                max_tokens_reserved=limit_res,
                confirmed=_confirmation(conf, limit, limit_res),
                confirmed_across=_across(conf, g.iloc[0], runner),
            )
        )
    if not out:
        return pd.DataFrame(out)
    workload = [c for c in cols if c in WORKLOAD_COLUMNS]
    order = [*workload, *(c for c in cols if c not in workload and c != "reduction"), "reduction"]
    cap = pd.DataFrame(out).sort_values(order, kind="stable", na_position="last").reset_index(drop=True)
    return name_lines(cap)


def fitted_lines(cap: pd.DataFrame, df: pd.DataFrame, run: str) -> tuple[pd.DataFrame, str]:
    """The lines of ``cap`` (capacity_frame's) that a fit went through, and a sentence saying how
    many combinations were left out and why ("" when none): without a GPU memory peak (a CPU
    run measures none) or with one at a single token count. ValueError, saying so, when none is
    left to show."""
    fitted = cap[cap["ws_slope"].notna() | cap["dev_slope"].notna()] if len(cap) else cap
    bare = cap[cap["peaks"] == 0] if len(cap) else cap
    num_one = len(cap) - len(fitted) - len(bare)
    cpu = " (it ran on the CPU, which has none)" if (df["device"].astype(str) == "cpu").all() else ""
    needs = "the capacity table fits a line through each combination's GPU memory peaks (workspace and device)"
    if not len(fitted):
        num_ok = int((df["status"] == Status.OK).sum())
        if not len(cap) or len(bare) == len(cap):
            raise ValueError(
                f"{needs}; none of the {counted(num_ok, 'ok row')} of {run_dir_of(run)} has one{cpu}: "
                "run the sweep on a GPU"
            )
        raise ValueError(
            f"{needs}, measured at two or more token counts; {run_dir_of(run)} has peaks at one token count "
            "only: sweep workload.tokens_per_rank over two or more sizes"
        )
    why = [f"{counted(len(bare), 'combination')} without a GPU memory peak{cpu}"] if len(bare) else []
    if num_one:
        why.append(f"{counted(num_one, 'combination')} with peaks at one token count (a line needs two)")
    # named again among the lines shown: a column that varies only among those left out names none
    return name_lines(fitted.reset_index(drop=True)), ("Left out: " + "; ".join(why) + ".") if why else ""


def _large_segment(g: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The points measured on the row layout the largest token count ran (`row_layout_used`):
    the triton experts' `auto` switches from gathered to contiguous rows as tokens grow, and a
    line through both layouts' points bends (one fitted bf16 line missed by 2 %). Returns the
    points and a label suffix naming the layout when the combination ran more than one."""
    if "row_layout_used" not in g or g["row_layout_used"].fillna("").nunique() < 2:
        return g, ""
    last = g.loc[g["tokens_per_rank"].idxmax(), "row_layout_used"]
    return g[g["row_layout_used"] == last], f" ({last} rows)"


def _confirmation(conf: pd.DataFrame, limit: float, limit_reserved: float = float("nan")) -> str:
    """'ok at 61440, oom at 65536' for the capped rows of one combination, checked against the
    predicted limit: ok at or below the allocations' `limit`, oom above the reserved line's
    `limit_reserved` (the allocations' limit where the rows have no reserved peak)."""
    if not len(conf):
        return ""
    lo = limit_reserved if np.isfinite(limit_reserved) else limit
    parts = [f"{r.status} at {int(r.tokens_per_rank)}" for r in conf.sort_values("tokens_per_rank").itertuples()]
    agree = (
        all(
            (r.tokens_per_rank <= limit) if r.status == Status.OK else (r.tokens_per_rank > lo)
            for r in conf.itertuples()
            if r.status in (Status.OK, Status.OOM)
        )
        if np.isfinite(limit)
        else False
    )
    return ", ".join(parts) + ("" if agree else " (disagrees with the prediction)")


def placement_ratios(cap: pd.DataFrame) -> pd.DataFrame:
    """For each combination measured with both reductions: bytes per token and tokens that fit,
    reduction=experts over reduction=finalize, of two lines equal in every other column of the
    combination (line_columns)."""
    if not len(cap):
        return pd.DataFrame()
    others = [c for c in line_columns(cap) if c != "reduction"]
    rows = []
    for _, g in cap.groupby(line_keys(cap, others), sort=False):
        by = g.set_index("reduction")
        if {"experts", "finalize"} <= set(by.index):
            assert by.index.is_unique, "one line per combination and reduction"
            e, f = by.loc["experts"], by.loc["finalize"]
            rows.append(
                dict(
                    g.iloc[0][others].to_dict(),
                    line=f.line,
                    saving_per_token=f.ws_slope - e.ws_slope,
                    slope_ratio=e.ws_slope / f.ws_slope if f.ws_slope else np.nan,
                    tokens_ratio=e.max_tokens / f.max_tokens if f.max_tokens else np.nan,
                    experts_tokens=e.max_tokens,
                    finalize_tokens=f.max_tokens,
                )
            )
    return pd.DataFrame(rows)


def _tok(v) -> str:
    return "-" if not np.isfinite(v) else f"{int(v):,}"


def _num(v: float, spec: str) -> str:
    """`v` formatted by `spec`, or "-" where a line has no fit (no device peak, say): never nan."""
    return f"{v:{spec}}" if np.isfinite(v) else "-"


def _resid(resid: float, points: int) -> str:
    """The worst residual of a fit, or why it is none: two points always lie on their line."""
    if points < 2:
        return "-"
    if points == 2:
        return "2 points: exact by construction"
    return f"{100 * resid:.1f}%" if np.isfinite(resid) else "-"


def capacity_markdown(cap: pd.DataFrame, budget_text: str) -> str:
    """The capacity section: a table per combination and one of the placement ratios."""
    if not len(cap):
        return "_No combination has ok rows at two or more token counts: nothing to fit._"
    reserved = "max_tokens_reserved" in cap and cap["max_tokens_reserved"].notna().any()
    # the labels, placements and statuses are the rows' text: escaped (moebench/report/mdsafe.py)
    rows = [
        [
            md_text(r.line),
            md_text(r.reduction),
            _num(r.ws_slope / 1024, ".1f"),
            _num(r.ws_intercept / MIB, ".0f"),
            _resid(r.ws_resid, r.ws_points),
            _num(r.dev_slope / 1024, ".1f"),
            _num(r.dev_intercept / MIB, ".0f"),
            r.tokens_measured,
            _tok(r.max_tokens),
        ]
        + ([_tok(r.max_tokens_reserved)] if reserved else [])
        + [md_text(r.confirmed) if r.confirmed else "-"]
        for r in cap.itertuples()
    ]
    head = (
        [
            "combination",
            "reduce in",
            "KiB / token",
            "intercept MiB",
            "worst resid",
            "device KiB / token",
            "device intercept MiB",
            "tokens measured",
            f"max tokens at {budget_text}" + (" (allocations)" if reserved else ""),
        ]
        + ([f"max tokens at {budget_text} (allocator reserved)"] if reserved else [])
        + ["confirmed (capped run)"]
    )
    text = md_table(head, rows, ["l", "l"] + ["r"] * (8 if reserved else 7) + ["l"])
    const = constant_caption(cap)  # what every line shares: the labels name only what tells them apart
    text += f"\n\nAll lines: {md_text(const)}." if const else ""
    across = cap["confirmed_across"][cap["confirmed_across"] != ""] if "confirmed_across" in cap else []
    if len(across):
        cols = ", ".join(dict.fromkeys(c for cs in across for c in cs.split(", ")))
        text += (
            f"\n\n{counted(len(across), 'line')} confirmed by capped rows measured with other runner settings "
            f"({md_text(cols)}) than the line's points: how the runner measured, not what the layer allocates."
        )
    ratios = placement_ratios(cap)
    if len(ratios):
        rr = [
            [
                md_text(r.line),
                _num(r.saving_per_token / 1024, ".1f"),
                _num(r.slope_ratio, ".3f"),
                _tok(r.finalize_tokens),
                _tok(r.experts_tokens),
                "-" if not np.isfinite(r.tokens_ratio) else f"{r.tokens_ratio:.2f}×",
            ]
            for r in ratios.itertuples()
        ]
        text += "\n\n" + md_table(
            [
                "combination",
                "saving KiB / token",
                "bytes ratio (experts / finalize)",
                "max tokens, finalize",
                "max tokens, experts",
                "tokens ratio",
            ],
            rr,
            ["l"] + ["r"] * 5,
        )
    return text


def plot_capacity(df: pd.DataFrame, cap: pd.DataFrame, budget: float | None, path) -> Path | None:
    """Workspace peak (GiB) vs tokens per rank, one panel per model / EP share, a line per
    combination and placement (a colour per combination, named in the legend by what tells the
    panels' lines apart; solid: reduce in the experts, dashed: in the finalize), the fit dotted,
    the budget drawn, the capped runs marked (o ok, x oom) in their combination's colour."""
    ok, capped = _split(df)
    if not len(ok) or not len(cap):
        return None
    cols = line_columns(cap)
    ok_by = dict(list(ok.groupby(line_keys(ok, cols), sort=False)))
    capped_keys, keys = line_keys(capped, cols), line_keys(cap, cols)
    # the legend names what tells a panel's lines apart: the panel's own columns are its title
    names = combo_labels(cap, exclude=(*PANEL, "reduction"), fallback="")
    colors = {name: f"C{i % 10}" for i, name in enumerate(dict.fromkeys(names))}
    color_of = {key: colors[name] for key, name in zip(keys, names, strict=True)}
    panels = list(dict.fromkeys(zip(cap["model"], cap["simulate_ep"], strict=True)))
    fig = Figure(figsize=(5.6 * len(panels), 5.6), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(panels), sharey=False))
    for ax, (model, sim) in zip(axes, panels, strict=True):
        here = (cap["model"] == model) & (cap["simulate_ep"] == sim)
        tmax = 1.0
        for r, key, name in zip(cap[here].itertuples(), keys[here], names[here], strict=True):
            g = ok_by.get(key, ok.iloc[:0]).sort_values("tokens_per_rank")
            t = g["tokens_per_rank"].to_numpy(float)
            tmax = max(tmax, float(t.max()) if len(t) else 1.0)
            ax.plot(
                t,
                g["workspace_bytes_peak"] / 2**30,
                marker="o",
                ms=3,
                color=colors[name],
                ls=REDUCTION_STYLE.get(r.reduction, "-"),
            )
            if np.isfinite(r.ws_slope):
                xs = np.array([0.0, max(tmax, r.max_tokens if np.isfinite(r.max_tokens) else 0) * 1.05])
                ax.plot(xs, (r.ws_intercept + r.ws_slope * xs) / 2**30, color=colors[name], lw=0.6, ls=":")
        on_panel = (capped["model"] == model) & (capped["simulate_ep"] == sim)
        for r, key in zip(capped[on_panel].itertuples(), capped_keys[on_panel], strict=True):
            ax.plot(
                [r.tokens_per_rank],
                [r.memory_budget / 2**30],
                marker="o" if r.status == Status.OK else "x",
                ms=7,
                mfc="none",
                color=color_of.get(key, "black"),
                ls="none",
            )
        if budget is not None:
            ax.axhline(budget / 2**30, color="black", lw=1.0)
            ax.text(
                0.01,
                budget / 2**30,
                f" budget {budget / 2**30:.0f} GiB",
                va="bottom",
                fontsize=8,
                transform=ax.get_yaxis_transform(),
            )
        sim_s = f", EP-{int(sim)} share" if sim and int(sim) > 1 else ""
        ax.set(title=f"{model}{sim_s}", xlabel="tokens per rank", ylabel="workspace peak (GiB)")
        ax.grid(True, alpha=0.3)
        # a colour per combination and a style per placement, each named once; below the panel:
        # inside it, the legend hides the lines that cross the budget
        shown = list(dict.fromkeys(n for n in names[here] if n))
        handles = [Line2D([], [], color=colors[n], marker="o", ms=3, label=n) for n in shown] + [
            Line2D([], [], color="black", ls=REDUCTION_STYLE.get(red, "-"), label=f"reduce in {red}")
            for red in dict.fromkeys(cap.loc[here, "reduction"])
        ]
        ax.legend(
            handles=handles,
            fontsize=7,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.16),
            ncols=2,
            title="dotted: fit; on the budget: o ok, x oom (capped runs); lines that coincide share their workspaces",
            title_fontsize=7,
        )
    fig.suptitle("Forward peak vs tokens per rank")
    return save_figure(fig, path)


# a budget below this is a slip (a fraction, as `tune --budget` takes, or a size that lost its unit), never a GPU's
MIN_BUDGET = 2**20


@dataclass(frozen=True)
class Budget:
    """`--budget` as given (`text`) and read: its bytes, None for 'free' (the GPU's memory)."""

    text: str
    bytes: float | None


def parse_budget(text: str) -> Budget:
    """`--budget`'s value: 'free', or a memory size ('16GiB', '80GB', '17179869184'); ValueError for
    what is no size or one below 1 MiB (the CLI parses it as argparse's type: cli/report.py)."""
    from moebench.config.compose import parse_bytes

    if text == "free":
        return Budget(text, None)
    try:
        budget = float(parse_bytes(text))
    except ValueError as e:
        raise ValueError(f"{e}, or free (the GPU's memory)") from e
    if budget < MIN_BUDGET:
        raise ValueError(
            f"{text} reads as {budget:,.0f} bytes, less than 1 MiB: give a memory size with its "
            "unit (16GiB, 80GB) or free; a fraction is `moebench tune --budget`'s"
        )
    return Budget(text, budget)


def capacity_command(run: str, given: Budget | None, out: str | None = None) -> int:
    """`moebench report RUN --capacity [--budget 16GiB|free]`: capacity.md and capacity.png in
    the report folder, the table on stdout (`given`: --budget, parse_budget's). Without --budget:
    the budget the run's capped rows used, else an error (exit 2)."""
    import sys

    from moebench.report.load import load_run, writing

    budget = given.bytes if given else None
    df, env = load_run(run)
    fitted_lines(capacity_frame(df), df, run)  # a run no line can be fit to (a CPU run's) refused before its budget
    gpu = None
    if given is None:
        budgets = sorted(
            set(pd.to_numeric(df.get("memory_budget", pd.Series(dtype=float)), errors="coerce").dropna()) - {0}
        )
        if not budgets:
            raise ValueError(
                "give --budget BYTES (e.g. 16GiB) or --budget free: this run has no rows "
                "measured under runner.memory_budget to take one from"
            )
        budget = float(budgets[0])
    elif budget is None:  # free
        gpu = env.get("gpu_memory_bytes")
        if not gpu:
            raise ValueError(
                f"--budget free needs the GPU's memory in {run_dir_of(run) / 'env.json'} (gpu_memory_bytes): "
                "this run's fingerprint lacks it; give --budget BYTES"
            )
    cap, left_out = fitted_lines(capacity_frame(df, budget, gpu), df, run)
    text_budget = f"{budget / 2**30:.1f} GiB" if budget is not None else f"the GPU's {float(gpu or 0) / 2**30:.0f} GiB"
    body = capacity_markdown(cap, text_budget) + (f"\n\n{left_out}" if left_out else "")
    root = run_dir_of(run)  # a row file's run, as `moebench report FILE` writes there (not rows/report/)
    dest = report_out(root, out)
    refuse_links(dest, ["capacity.md", "capacity.png"])  # before anything is written
    png = plot_capacity(df, cap, budget, dest / "capacity.png")
    partial = writing(df)  # a run a sweep was writing: said under the title, as report.md does
    doc = [
        f"# Capacity: {md_text(root.name)}",
        partial.markdown() if partial else "",
        f"Budget: {text_budget} ({'workspace' if budget is not None else 'device'} line).",
        body,
        f"![peak memory vs tokens per rank]({png.name})" if png else "",
        __doc__.strip(),
    ]
    write_text(dest / "capacity.md", "\n\n".join(d for d in doc if d) + "\n")
    print(doc[2] + (f" `--budget {given.text}` read as {budget:,.0f} bytes." if given and budget is not None else ""))
    print(body)
    print(f"capacity report written to {dest / 'capacity.md'}", file=sys.stderr)
    return 0
