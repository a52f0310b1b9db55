"""The opening of a run's report: the answers, on one screen (docs/design.md, "What a report
answers"). What each choice does (report/effects.py), the fastest combination per size, memory
per reduction placement, the shared experts' overlap where something can overlap, and the data
quality notes that change how to read them; then the figures that picture them
(report/answer_plots.py). The notebook draws the same through `answers()`. Every section is
there whatever the run: where it has no answer, one line says why and what would give one.

Latency here is GPU time only: host-time rows are left out of the effects and the fastest (and
counted there, with why and what would give GPU time); memory is no timing, so the workspace
reads them too. A CPU run's figures are titled as a pipeline check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from moebench.report import answer_plots as ap
from moebench.report.answer_frame import Figure
from moebench.report.columns import (
    CHOICE_COLUMNS,
    COMBINATION_COLUMNS,
    PER_ROW_COLUMNS,
    combination,
    combo_labels,
    fmt_series,
)
from moebench.report.effects import BAND, Effect, axis_effects, baseline_value, effect_lines, varying_axes
from moebench.report.fastest import Timed, fastest_section, ranked
from moebench.report.fmt import fmt_frac, fmt_mib
from moebench.report.mdsafe import md_text
from moebench.report.phase_plot import plot_phase_fastest
from moebench.report.run_tables import single_rank
from moebench.report.time_basis import CPU, GPU, HOST
from moebench.results.row import Status
from moebench.util.words import counted

# the axes whose values are choices a reader makes (the rest of the combination is the workload)
CHOICES = CHOICE_COLUMNS
CPU_CAVEAT = " (CPU: a pipeline check, not performance)"  # a section's heading on a CPU run


@dataclass
class Answers:
    """What the opening says: its Markdown lines, the effects behind them and the figures."""

    lines: list[str]
    effects: list[Effect] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    cpu: bool = False

    def markdown(self) -> str:
        """The lines as Markdown: a blank line around each heading, paragraph and figure."""
        out: list[str] = []
        for line in self.lines:
            if out and not (line.startswith("- ") and out[-1].startswith("- ")):
                out.append("")
            out.append(line)
        return "\n".join(out)


def measured(timed: Timed) -> tuple[pd.DataFrame, bool]:
    """(the ok rows whose latency is GPU time — or, in a run with none but CPU rows, CPU time —,
    whether they are CPU rows)."""
    gpu, cpu = timed.where(GPU), timed.where(CPU)
    return (gpu, False) if len(gpu) or not len(cpu) else (cpu, True)


def memory_rows(df: pd.DataFrame, cpu: bool) -> pd.DataFrame:
    """The ok rows the workspace answer reads: every GPU row, host-time ones too (a memory peak is
    no timing), or on a CPU run (`cpu`) its CPU rows."""
    ok = df[df["status"] == Status.OK]
    on_cpu = ok["device"].astype(str).eq("cpu") if "device" in ok.columns else pd.Series(False, index=ok.index)
    return ok[on_cpu == cpu]


def pair_key(df: pd.DataFrame) -> list[str]:
    """The columns a pair must share (every combination column but the per-row ones)."""
    return [c for c in COMBINATION_COLUMNS if c in df.columns and c not in PER_ROW_COLUMNS]


def baseline_key(ok: pd.DataFrame) -> str | None:
    """The combination made of every varying choice's baseline value (the fastest such), the
    reference a latency figure shows beside the fastest; None when the run has none."""
    axes = varying_axes(ok, CHOICES)
    if not axes or ok.empty:
        return None
    same = np.logical_and.reduce([fmt_series(ok[a]) == baseline_value(ok, a) for a in axes])
    rows = ok[same]
    return str(rows.loc[rows["latency_us_median"].idxmin(), "combo_key"]) if len(rows) else None


def effect_section(ok: pd.DataFrame, cpu: bool, num_host: int = 0) -> tuple[list[str], list[Effect]]:
    """What each choice does over `ok` (measured's rows), or one line why nothing is compared
    (`num_host`: the host-time rows left out)."""
    axes = varying_axes(ok, CHOICES)
    head = "## What each choice does" + (CPU_CAVEAT if cpu else "")
    if not axes:
        return [head, f"- nothing compared: {_no_effect(ok, cpu, num_host)}"], []
    effects = axis_effects(ok, axes, pair_key(ok))
    how = (
        "Latency of each value ÷ its baseline's, over the pairs of rows that differ only in that axis, read "
        "`ratio × [low, high] (n pairs)`: the geometric mean, its 95 % interval (bootstrap over the pairs "
        "and each row's samples) and the pairs; **no difference** when the interval lies inside "
        f"±{(BAND - 1) * 100:.0f} % ({1 / BAND:.3f} to {BAND:g}), "
        "**inconclusive** when it straddles that bound. Where the pairs disagree the effect is split by the "
        "axis that explains it. Baselines: finalize, overlap none, bf16, the torch experts, the local "
        "backend, default knobs where the run has them, else the most measured value."
    )
    lines = [head, how, *effect_lines(effects)]
    paired = {e.axis for e in effects}
    for axis in axes:
        if axis not in paired:
            base = baseline_value(ok, axis)
            lines.append(
                f"- `{axis}`: no pair of rows differs only in {axis} (each value ran with other "
                f"choices; baseline `{base}`): see the tables below"
            )
    return lines, effects


def _no_effect(ok: pd.DataFrame, cpu: bool, num_host: int) -> str:
    if not len(ok):
        return "no ok row is GPU time (*Fastest per size* says why)" if num_host else "no ok row has a latency"
    kind = "CPU" if cpu else "GPU-time"
    return (
        f"every choice has one value in the {kind} rows ({md_text(combination(ok.iloc[0]))}); a run that sweeps "
        "one (`reduction=experts,finalize`) shows what it does"
    )


def workspace_stats(ok: pd.DataFrame) -> pd.DataFrame | None:
    """The workspace of one forward (bytes) per (reduction, tokens_per_rank) over the rows that
    recorded one: median, min, max, how many combinations and whether it is `declared`. The
    allocator peak where any row measured one, else (a CPU run: peaks are measured on CUDA only)
    the kernels' declared workspace, as `compare`'s memory table falls back; None where no row has
    either. What the memory lines (memory_section) and answer_plots.plot_memory both read."""
    if "reduction" not in ok.columns:
        return None
    for col in ("workspace_bytes_peak", "workspace_bytes_analytic"):
        if col not in ok.columns:
            continue
        rows = ok.assign(**{col: pd.to_numeric(ok[col], errors="coerce")})
        rows = rows[rows[col] > 0]
        if len(rows):
            by = rows.groupby(["reduction", "tokens_per_rank"], sort=True)
            stats = by[col].agg(["median", "min", "max"])
            return stats.assign(combinations=by["combo_key"].nunique(), declared=col == "workspace_bytes_analytic")
    return None


def _no_peak(ok: pd.DataFrame) -> str:
    """Why the run's ok rows measured no workspace peak."""
    on_cpu = "device" in ok.columns and len(ok) and ok["device"].astype(str).eq("cpu").all()
    return (
        "workspace peaks are measured on CUDA only"
        if on_cpu
        else "no ok row recorded a workspace peak (`runner.memory=true` measures one)"
    )


def memory_section(ok: pd.DataFrame, ws: pd.DataFrame | None) -> list[str]:
    """One line per reduction placement: the workspace of one forward at the largest token
    count (median over its combinations, and its range: `ws`, workspace_stats; the declared
    workspace where no row measured a peak, said so) and the largest device peak."""
    head = "## Workspace per reduction placement"
    if ws is None:
        return [head, f"- no workspace figure: {'no row is ok' if not len(ok) else _no_peak(ok)}"]
    declared = bool(ws["declared"].any())
    big = int(ws.index.get_level_values("tokens_per_rank").max())
    at = ws.xs(big, level="tokens_per_rank")
    device = (
        ok[ok["tokens_per_rank"] == big].groupby("reduction")["device_bytes_peak"].max()
        if "device_bytes_peak" in ok
        else pd.Series(dtype=float)
    )
    lines = [head]
    if declared:
        lines.append(
            f"{_no_peak(ok)[0].upper()}{_no_peak(ok)[1:]}: the workspace below is the kernels' declared one "
            "(`workspace_bytes_analytic`), as `compare` reads where no peak was measured."
        )
    what = "declared workspace" if declared else "workspace"
    for red, s in at.iterrows():
        vs = [f"{s['median'] / at.loc[o, 'median']:.2f} × `{o}`" for o in at.index if o != red]
        dev = float(device.get(red, np.nan))
        peak = f"; device peak up to {_mib(dev)}" if np.isfinite(dev) else ""
        lines.append(
            f"- `reduction={red}` at {big} tok: {what} {_mib(s['median'])} (median of "
            f"{counted(int(s['combinations']), 'combination')}, {_mib(s['min'])}–{_mib(s['max'])})"
            + (f", {', '.join(vs)}" if vs else "")
            + peak
        )
    return lines


def _mib(nbytes: float) -> str:
    mib = float(nbytes) / 2**20
    return f"{mib:,.0f} MiB" if mib >= 100 else fmt_mib(nbytes) + " MiB"


def overlap_section(ok: pd.DataFrame, rows: pd.DataFrame | None = None, cpu: bool = False) -> list[str]:
    """The shared experts' hidden fraction where a backend communicates, over `ok` (measured's
    rows); else one line saying why there is nothing to show (`rows`: every ok row, host-time ones
    too, which say whether any overlapped). On a CPU run (`cpu`) the fractions are a pipeline check,
    as the effects are, and the section says so."""
    head = "## Shared experts hidden" + (CPU_CAVEAT if cpu else "")
    rows = ok if rows is None else rows
    if "overlap" not in rows.columns:
        return [head, "- nothing to show: the rows record no overlap"]
    if not (rows["overlap"].fillna("none").astype(str) != "none").any():
        return [head, "- no row overlapped the shared experts (overlap=none throughout)"]
    tried = ok[ok["overlap"].fillna("none").astype(str) != "none"]
    if not len(tried):
        return [head, "- nothing to show: every row that overlapped the shared experts is host time"]
    comm = tried[~single_rank(tried)]
    if not len(comm):
        names = ", ".join(sorted(set(tried["backend"].astype(str))))
        return [
            head,
            f"- nothing to show: every row ran a single-rank backend ({names}), which has no communication "
            "to hide the shared experts behind",
        ]
    lines = [head]
    for (ovl, t), g in comm.groupby(["overlap", "tokens_per_rank"], sort=True):
        frac = g["overlap_fraction"].dropna()
        if len(frac) and cpu:  # a pipeline check: that it ran, no figure to read as a finding
            lines.append(
                f"- `overlap={ovl}` at {int(t)} tok: ran, its hidden fraction recorded in {len(frac)} of "
                f"{counted(len(g), 'row')}"
            )
        elif len(frac):
            lines.append(
                f"- `overlap={ovl}` at {int(t)} tok: hides {fmt_frac(float(frac.median()))} of the shared experts "
                f"(median of {counted(len(frac), 'row')}, {fmt_frac(float(frac.min()))}–{fmt_frac(float(frac.max()))})"
            )
    if len(lines) == 1:
        return [head, "- nothing to show: no row that overlapped recorded the hidden fraction (`overlap_fraction`)"]
    if cpu:  # above the figures, as the effects' explanation is
        lines.insert(
            1,
            "CPU rows: a CPU run's overlap says nothing about a GPU's, so no fraction is quoted here: the lines "
            "check that the overlap pipeline ran (the folded *Shared-expert overlap* table holds each row's).",
        )
    return lines


def answers(
    df: pd.DataFrame,
    out: Path | None,
    quality: list[str],
    budget: float | None = None,
) -> Answers:
    """The opening's lines and, with `out`, its figures written there. `df`: the run's rows (one
    per combination and token count); `quality`: the data quality notes to show (the first few;
    the rest stay in the report's section)."""
    timed = Timed.of(df)  # each row's basis, read once
    ok, cpu = measured(timed)
    wins = ranked(timed)
    effect_lines_, effects = effect_section(ok, cpu, len(timed.where(HOST)))
    figures: list[Figure] = []

    def figure(made: Figure | None) -> list[str]:
        if made is None:
            return []
        figures.append(made)
        return [made.markdown()]

    lines = [*effect_lines_]
    if out is not None and len(ok) and effects:
        lines += figure(ap.plot_effects(effects, out / "effects.png", cpu))
    lines += fastest_section(timed, wins)
    if out is not None and wins:
        lines += figure(ap.plot_fastest(ok, combo_labels, out / "latency.png", cpu, baseline_key, within=timed.rows))
    elif out is not None and len(ok) and not cpu:  # one combination per size: its latency
        lines += figure(ap.plot_alone(ok, out / "latency.png", within=timed.rows))
    mem = memory_rows(df, cpu)  # host-time rows too: a memory peak is no timing
    ws = workspace_stats(mem)  # the workspace medians, once for the lines and the figure
    lines += memory_section(mem, ws)
    if out is not None and ws is not None:
        lines += figure(ap.plot_memory(ws, out / "workspace.png", budget, cpu=cpu))
    lines += overlap_section(ok, mem, cpu)
    lines += ["## Read with care", *(f"- {q}" for q in quality or ["no data-quality note: no row flagged"])]
    # drawn here, shown with the phase table below the answers; on a CPU, left out (phase_plot.CPU_NO_FIGURE)
    if out is not None and len(ok) and not cpu:
        figure(plot_phase_fastest(ok, combo_labels, out / "phases.png", cpu=cpu, within=timed.rows))
    return Answers(lines, effects, figures, cpu)
