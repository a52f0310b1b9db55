"""Markdown tables over a run's rows (see load.load_run).

The latency table is laid out like ``torch.utils.benchmark.Compare``: one row per
combination, one column per tokens_per_rank, each cell ``median (p20–p80)`` in µs, the
fastest GPU-time combination of each workload (model, quant-independent, world size) in bold;
a cell some of whose samples the host paced carries ``‡ n/m``, a host-time one ``†``.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any, Callable

import numpy as np
import pandas as pd

from moebench.config import plugins
from moebench.report.columns import (
    MEMORY_COLUMNS,
    PHASE_COLUMNS,
    ROOFLINE_COLUMNS,
    WORKLOAD_COLUMNS,
    combo_columns,
    combo_labels,
    constant_caption,
    display_columns,
    fmt_value,
    label,
    phase_sum,
    records,
)
from moebench.report.fmt import fmt_frac, fmt_frac_interval, fmt_interval, fmt_mib, fmt_us
from moebench.report.table import md_table, md_text
from moebench.results.row import STATUSES, Status
from moebench.util.words import agree, counted

MAX_REASON_CHARS = 160


def md_value(v) -> str:
    """A value read from the rows as a markdown cell or phrase: fmt_value, escaped (md_text)."""
    text = fmt_value(v)
    return text if text == "-" else md_text(text)


def value_cell(col: str) -> Callable[[Any], str]:
    """A table cell's formatter: the row's value of `col` (md_value)."""

    def cell(row) -> str:
        return md_value(row[col])

    return cell


class Row(dict):
    """A row as a mapping, its index label as `.name`: what `iterrows` gives a table's cells, without
    building a Series per row (a 10,000-row report spent most of its tables' time there)."""

    name: Any = None

    def get(self, key, default=None) -> Any:  # Any, as Series.get: the cells' types vary by column
        return super().get(key, default)


def rows_of(df: pd.DataFrame) -> list[Row]:
    """`df`'s rows in order, each a Row."""
    out = []
    for i, rec in zip(df.index, records(df), strict=True):
        row = Row(rec)
        row.name = i
        out.append(row)
    return out


def combo_cells(row, cols: list[str]) -> list[str]:
    return [md_value(row[c]) for c in cols]


def caption(df: pd.DataFrame, unit: str) -> str:
    extra = constant_caption(df)
    return unit + (f" All rows: {md_text(extra)}." if extra else "")


def latency_table(df: pd.DataFrame) -> str:
    """Median latency (µs) with p20–p80 per combination (rows) x tokens_per_rank (cols).

    Non-ok rows show their status; combinations with no ok row are left out (the status
    summary lists them). The fastest ok cell of each workload (columns.WORKLOAD_COLUMNS: the
    model, world size, routing, ...) and token count is bold.
    """
    df = df[df["tokens_per_rank"].notna()]
    ok_keys = set(df.loc[df["status"] == Status.OK, "combo_key"])
    df = df[df["combo_key"].isin(ok_keys)]
    if not len(df):
        return "_No ok rows to tabulate._"
    tokens = sorted(int(t) for t in df["tokens_per_rank"].unique())
    cols = combo_columns(df)  # a row's, not a combination's
    # Fastest per workload: the same model and world size see the same tokens; only GPU
    # time competes (a host-time cell is marked, never bold; a cell with host-paced samples
    # competes, marked with their count)
    from moebench.report.flags import PACED_MARK_TEXT, paced_mark
    from moebench.report.time_basis import GPU, figure_basis

    ok = df[df["status"] == Status.OK]
    basis = {i: figure_basis(r)[0] for i, r in zip(ok.index, records(ok), strict=True)}
    gpu_ok = ok[[basis[i] == GPU for i in ok.index]]
    work = [c for c in WORKLOAD_COLUMNS if c in gpu_ok.columns]
    # the fastest rows, found within their groups (a lookup by key would miss: None and NaN
    # cells of an unused workload column do not match as dictionary keys)
    fastest = gpu_ok.groupby([*work, "tokens_per_rank"], dropna=False)["latency_us_median"].transform("min")
    best = set(gpu_ok.index[gpu_ok["latency_us_median"] == fastest])
    marked = bolded = paced = False
    rows = []
    recs = dict(zip(df.index, rows_of(df), strict=True))
    for _, g in df.groupby("combo_key", sort=False):
        by_t = {int(recs[i]["tokens_per_rank"]): recs[i] for i in g.index}
        cells = []
        for t in tokens:
            r = by_t.get(t)
            if r is None:
                cells.append("")
            elif r["status"] != Status.OK:
                cells.append(md_text(r["status"]))
            else:
                cell = fmt_interval(r["latency_us_median"], r["latency_us_p20"], r["latency_us_p80"])
                if basis.get(r.name) == "host":
                    cell, marked = f"{cell} †", True
                elif r.name in best:
                    cell, bolded = f"**{cell}**", True
                if basis.get(r.name) == GPU and (mark := paced_mark(r)):
                    cell, paced = f"{cell} {mark}", True
                cells.append(cell)
        rows.append(combo_cells(recs[g.index[0]], cols) + cells)
    table = md_table(cols + [str(t) for t in tokens], rows, ["l"] * len(cols) + ["r"] * len(tokens))
    # what the cells hold, and only the marks that some cell carries (CPU rows are never bold)
    text = caption(
        df,
        " ".join(
            x
            for x in [
                "Times are in microseconds (µs): median (p20–p80) over samples, max over ranks; "
                "columns are tokens per rank.",
                "Bold is the fastest GPU-time cell per workload (model, world size, routing)." if bolded else "",
                f"{PACED_MARK_TEXT}; it still competes." if paced else "",
                "† host time (the host paced the samples; see Data quality), never ranked." if marked else "",
            ]
            if x
        ),
    )
    return f"{table}\n\n{text}{timing_note(df)}"


def grid(ok: pd.DataFrame, cell) -> tuple[list[int], list[str], list[tuple]]:
    """A per-combination x tokens table's parts: (the token counts, the combination columns
    shown, [(a combination's first row, its cells: `cell(row)` per token count, '' where it
    has none)])."""
    tokens = sorted(int(t) for t in ok["tokens_per_rank"].unique())
    cols = combo_columns(ok)
    rows = []
    recs = dict(zip(ok.index, rows_of(ok), strict=True))
    for _, g in ok.groupby("combo_key", sort=False):
        by_t = {int(recs[i]["tokens_per_rank"]): recs[i] for i in g.index}
        rows.append((recs[g.index[0]], ["" if t not in by_t else cell(by_t[t]) for t in tokens]))
    return tokens, cols, rows


def host_table(df: pd.DataFrame) -> str:
    """The host's time to enqueue one eager forward (µs, median of five, behind a busy GPU)
    per combination x tokens: a figure of its own beside the GPU time. An eager layer whose
    enqueue exceeds its GPU time leaves an engine's GPU idle; '' without measurements."""
    ok = df[(df["status"] == Status.OK) & df["host_enqueue_us"].notna()] if "host_enqueue_us" in df.columns else df[:0]
    if not len(ok):
        return ""
    from moebench.report.time_basis import HOST, figure_basis

    host = {i for i, r in zip(ok.index, records(ok), strict=True) if figure_basis(r)[0] == HOST}
    tokens, cols, parts = grid(
        ok,
        lambda r: (
            f"{fmt_us(r['host_enqueue_us'])} / {fmt_us(r['latency_us_median'])}" + (" †" if r.name in host else "")
        ),
    )
    rows = [combo_cells(first, cols) + cells for first, cells in parts]
    table = md_table(cols + [str(t) for t in tokens], rows, ["l"] * len(cols) + ["r"] * len(tokens))
    return f"{table}\n\n" + caption(
        ok,
        "Host time / latency, µs: the host's enqueue of one eager forward (the GPU "
        f"kept busy) beside the row's latency. {held_caption(ok, host)}",
    )


def held_caption(ok: pd.DataFrame, host: set) -> str:
    """What the holds did for these rows, as it happened: how many rows were timed behind a hold
    before each sample, in which of them the GPU still started latency samples before the host
    had enqueued them (named, with their counts), how many sync the host (no hold), which rows
    are host time (``host``: their index), and how many were timed before the hold existed."""
    from moebench.config.limits import HOST_SYNCS_US
    from moebench.report.flags import latency_paced

    counts = (
        pd.to_numeric(ok["host_paced_samples"], errors="coerce")
        if "host_paced_samples" in ok.columns
        else pd.Series(np.nan, index=ok.index)
    )
    # a forward that syncs the host gets no hold (timing.hold_cycles: none would help)
    syncs = counts.notna() & (pd.to_numeric(ok["host_enqueue_us"], errors="coerce") > HOST_SYNCS_US)
    held = ok[counts.notna() & ~syncs]
    # as the verdict names a row (compare_tables.pair_names, which imports this module)
    labels = zip(combo_labels(ok), ok["tokens_per_rank"], strict=True)
    names = pd.Series([md_text(f"{lab} · {fmt_value(t)} tok") for lab, t in labels], index=ok.index, dtype=object)
    parts = []
    if len(held):
        paced = [i for i in held.index if counts[i] > 0]
        text = (
            f"{len(held)} of {counted(len(ok), 'row')} timed each sample behind a hold sized for the host to enqueue "
            "the forward first"
        )
        if paced:
            shown = "; ".join(f"{names[i]} ({latency_paced(ok.loc[i])})" for i in paced[:8])
            text += (
                f"; in {len(paced)} of them the GPU still started latency samples before the host had "
                f"enqueued them: {shown}" + (f" (+{len(paced) - 8} more)" if len(paced) > 8 else "")
            )
        else:
            text += "; in none did the GPU start a latency sample before the host had enqueued it"
        parts.append(text + ".")
    if syncs.any():
        num_syncing = int(syncs.sum())
        parts.append(
            f"{counted(num_syncing, 'row')} {agree(num_syncing, 'syncs', 'sync')} the host inside a forward "
            f"(enqueue over {HOST_SYNCS_US / 1e3:.0f} ms): no hold, since none could help."
        )
    if host:
        parts.append(
            f"† {counted(len(host), 'row')} host time (the host paced their samples or the layer syncs it: Data "
            "quality says why), never ranked."
        )
    if older := int(counts.isna().sum()):
        parts.append(
            f"{counted(older, 'row')} timed before each sample had its hold: their latency may read the host "
            "(Data quality)."
        )
    return " ".join(parts)


def timing_note(df: pd.DataFrame) -> str:
    """' Timing that ran: graph at 16, 64 tokens; events at 4096.' where a table's columns
    of tokens mix modes (graph timing runs events above runner.graph_max_tokens)."""
    ok = df[df["status"] == Status.OK] if "status" in df.columns else df
    if "timing_mode" not in ok.columns or ok["timing_mode"].map(fmt_value).nunique() <= 1:
        return ""
    parts = []
    for mode, g in ok.groupby(ok["timing_mode"].map(fmt_value), sort=True):
        parts.append(f"{md_text(mode)} at {', '.join(str(int(t)) for t in sorted(g['tokens_per_rank'].unique()))}")
    return f" Timing that ran (timing_mode): {'; '.join(parts)} tokens."


def status_table(df: pd.DataFrame) -> str:
    """Counts per status: rows and distinct combinations."""
    g = df.groupby("status", sort=True)
    counts = pd.DataFrame({"rows": g.size(), "combinations": g["combo_key"].nunique()})
    order = list(STATUSES)
    statuses = [s for s in order if s in counts.index] + [s for s in counts.index if s not in order]
    rows = [[md_text(s), int(counts.loc[s, "rows"]), int(counts.loc[s, "combinations"])] for s in statuses]
    rows.append(["total", len(df), df["combo_key"].nunique()])
    return md_table(["status", "rows", "combinations"], rows, ["l", "r", "r"])


def reasons_table(df: pd.DataFrame) -> str:
    """Non-ok rows grouped by (status, reason): count and the combinations concerned."""
    bad = df[df["status"] != Status.OK]
    if not len(bad):
        return "_All rows are ok._"
    rows = []
    for (status, reason), g in bad.groupby(["status", bad["reason"].fillna("")], sort=True):
        combos = sorted(
            {md_text(f"{r.backend}/{r.experts}/{r.reduction}/{r.overlap}/{r.quant}") for r in g.itertuples()}
        )
        shown = ", ".join(combos[:4]) + (f" (+{len(combos) - 4} more)" if len(combos) > 4 else "")
        text = str(reason) or "(no reason given)"
        if len(text) > MAX_REASON_CHARS:
            text = text[: MAX_REASON_CHARS - 1] + "…"
        rows.append([md_text(status), md_text(text) if reason else text, len(g), g["combo_key"].nunique(), shown])
    return md_table(
        ["status", "reason", "rows", "combinations", "backend/experts/red/ovl/quant"], rows, ["l", "l", "r", "r", "l"]
    )


def phase_table(df: pd.DataFrame) -> str:
    """Per-phase times (µs) of ok rows: prepare, dispatch, experts, weight_reduce, combine and
    the shared experts.

    'sum' is load.phase_sum: the phases, the shared experts counted where they ran outside
    a communication span (inside one, that span holds them); it can differ from the median
    end-to-end latency (gaps between phases, the launch gaps a graph replay removes).
    """
    ok = df[(df["status"] == Status.OK) & df[PHASE_COLUMNS].notna().any(axis=1)]
    if not len(ok):
        return "_No per-phase times in this run._"
    cols = display_columns(ok)
    rows = []
    for r in rows_of(ok):
        phases = [r[c] for c in PHASE_COLUMNS]
        total = phase_sum(r)
        rows.append(
            combo_cells(r, cols)
            + [md_value(r["tokens_per_rank"])]
            + [fmt_us(p) for p in phases]
            + [fmt_us(total), fmt_us(r["latency_us_median"])]
        )
    headers = cols + ["tokens"] + [c.removesuffix("_us") for c in PHASE_COLUMNS] + ["sum", "median"]
    table = md_table(headers, rows, ["l"] * len(cols) + ["r"] * (len(headers) - len(cols)))
    return f"{table}\n\n" + caption(ok, "Times are in µs.")


def memory_table(df: pd.DataFrame) -> str:
    """Workspace (analytic and allocator peak) and device peak memory in MiB, ok rows."""
    ok = df[(df["status"] == Status.OK) & df[MEMORY_COLUMNS].notna().any(axis=1)]
    if not len(ok):
        return "_No memory measurements in this run._"
    cols = display_columns(ok)
    rows = []
    for r in rows_of(ok):
        # the peak of a whole forward against what the layer declares for it:
        # workspaces + transients + the layer output (older rows: workspaces only)
        declared = r.get("analytic_peak_bytes", np.nan)
        if not (isinstance(declared, (int, float)) and np.isfinite(declared) and declared > 0):
            declared = r["workspace_bytes_analytic"]
        ratio = r["workspace_bytes_peak"] / declared if declared else np.nan
        rows.append(
            combo_cells(r, cols)
            + [md_value(r["tokens_per_rank"])]
            + [fmt_mib(r[c]) for c in MEMORY_COLUMNS]
            + ["-" if not np.isfinite(ratio) else f"{ratio:.2f}"]
        )
    headers = cols + ["tokens"] + [f"{label(c)} MiB" for c in MEMORY_COLUMNS] + ["peak / declared"]
    table = md_table(headers, rows, ["l"] * len(cols) + ["r"] * (len(headers) - len(cols)))
    return f"{table}\n\n" + caption(ok, "Memory in MiB (2^20 bytes).")


def single_rank(df: pd.DataFrame) -> pd.Series:
    """Whether each row's backend runs on one rank (local, local_batched): the registry's
    `single_rank`, or for a backend it does not know (a plugin not installed here) a world
    size of 1. Such a backend moves no data, so there is no communication to hide the shared
    experts behind: the overlap table and plot leave its rows out."""
    known: dict = {}

    def one(name, world) -> bool:
        if name not in known:
            known[name] = plugins.single_rank(name)
        if known[name] is not None:
            return known[name]
        try:
            return int(world) == 1
        except (TypeError, ValueError):
            return False

    if not len(df):
        return pd.Series([], dtype=bool)
    world = df["world_size"] if "world_size" in df.columns else pd.Series(np.nan, index=df.index)
    return pd.Series([one(b, w) for b, w in zip(df["backend"], world, strict=True)], index=df.index, dtype=bool)


def single_rank_note(rows: pd.DataFrame) -> str:
    """The line saying which rows a single-rank backend left out of the overlap figures ('' for none)."""
    if not len(rows):
        return ""
    names = ", ".join(sorted({md_text(b) for b in rows["backend"].astype(str)}))
    return (
        f"Left out: {counted(len(rows), 'row')} of single-rank backends ({names}): they have no communication to "
        "hide the shared experts behind (their ablation figures stay in the rows)."
    )


def overlap_table(df: pd.DataFrame) -> str:
    """Shared-expert overlap of ok rows with overlap != none, per tokens_per_rank; rows of
    single-rank backends left out (`single_rank`), with a line that says so.

    shared = shared experts alone (µs); exposed = latency − latency without shared experts
    (µs); overlap = clamp(1 − exposed / shared, 0, 1) with its 90 % bootstrap interval
    (overlap_fraction_lo / _hi) where the row has one; trace = the same from a trace.
    """
    rows_df = df[(df["status"] == Status.OK) & (df["overlap"].fillna("none").astype(str) != "none")]
    alone = single_rank(rows_df)
    note = single_rank_note(rows_df[alone])
    rows_df = rows_df[~alone]
    if not len(rows_df):
        empty = "_No rows with shared-expert overlap (overlap=dispatch|combine) in this run._"
        return f"{empty}\n\n{note}" if note else empty
    cols = display_columns(rows_df)
    rows = []
    for r in rows_of(rows_df):
        rows.append(
            combo_cells(r, cols)
            + [
                md_value(r["tokens_per_rank"]),
                fmt_us(r["latency_us_median"]),
                fmt_us(r["latency_no_shared_us"]),
                fmt_us(r["shared_us"]),
                fmt_us(r["shared_exposed_us"]),
                fmt_frac_interval(r["overlap_fraction"], r.get("overlap_fraction_lo"), r.get("overlap_fraction_hi")),
                fmt_frac(r["trace_overlap_fraction"]),
            ]
        )
    headers = cols + ["tokens", "latency", "no shared", "shared", "exposed", "overlap", "trace overlap"]
    table = md_table(headers, rows, ["l"] * len(cols) + ["r"] * (len(headers) - len(cols)))
    return (
        f"{table}\n\n"
        + caption(
            rows_df,
            "Times are in µs; overlap is the fraction of "
            "the shared experts' time hidden, in brackets its 90 % "
            "bootstrap interval over the samples: a figure inside it "
            "(the trace's, another run's) is within noise.",
        )
        + (f"\n\n{note}" if note else "")
    )


def traces_table(df: pd.DataFrame) -> str:
    """Which combination each trace folder holds (`traces/<combo_key>/` is named by a hash): its
    row's label, the token counts traced, the folder; '' for a run without traces."""
    from moebench.report.mdsafe import md_code

    if "trace_path" not in df.columns:
        return ""
    rows_df = df
    rows_df = rows_df[rows_df["trace_path"].fillna("").astype(str) != ""]
    if not len(rows_df):
        return ""
    rows = []
    for key, g in rows_df.groupby("combo_key", sort=True):
        label = g["label"].dropna().astype(str) if "label" in g.columns else pd.Series([], dtype=object)
        folders = sorted({str(PurePosixPath(str(p)).parent) for p in g["trace_path"]})
        tokens = ", ".join(fmt_value(t) for t in sorted(g["tokens_per_rank"].dropna().unique()))
        rows.append(
            [
                md_text(label.iloc[0]) if len(label) else md_text(key),
                md_text(tokens),
                ", ".join(md_code(f + "/") for f in folders),
            ]
        )
    return (
        md_table(["combination", "tokens", "traces"], rows)
        + "\n\n`moebench trace RUN` reads them (`--plot` draws their timelines); "
        "a folder is named by the combination's key."
    )


def roofline_table(df: pd.DataFrame, ceilings_root=None) -> str:
    """The experts phase against its roofline floor (GPU rows): floor = max(expert
    bytes / copy bandwidth, expert FLOPs / GEMM peak) with the ceilings measured on the
    row's GPU (report/roofline.py: results/ceilings/, or `ceilings_root`); `% of floor` =
    floor / experts_us (100 = at the floor). A GPU without measured ceilings gets empty
    floor columns and says so."""
    from moebench.report.roofline import add_floor, ceilings_caption

    need = set(ROOFLINE_COLUMNS)
    if not need <= set(df.columns):
        return "_No roofline figures in this run._"
    ok = df[
        (df["status"] == Status.OK)
        & (df.get("device", "cuda") == "cuda")
        & df["experts_us"].notna()
        & df["expert_bytes"].notna()
    ]
    if not len(ok):
        return "_No GPU rows with an experts phase in this run._"
    ok = add_floor(ok, ceilings_root)

    def pct(x: float) -> str:  # no ceiling measured: the cell stays empty
        return f"{x:.0f} %" if np.isfinite(x) else ""

    cols = display_columns(ok)
    rows = [
        combo_cells(r, cols)
        + [
            md_value(r["tokens_per_rank"]),
            f"{r['latency_us_median']:.1f}",
            f"{r['experts_us']:.1f}",
            f"{r['floor_us']:.1f}" if np.isfinite(r["floor_us"]) else "",
            r["bound"],
            pct(r["experts_pct_of_floor"]),
            pct(r["floor_us"] / r["latency_us_median"] * 100),
            f"{r['tflops']:.1f}",
            f"{r['hbm_gbps']:.0f}",
        ]
        for r in rows_of(ok)
    ]
    headers = cols + [
        "tokens",
        "layer µs",
        "experts µs",
        "floor µs",
        "bound",
        "% of floor",
        "layer % of floor",
        "TFLOP/s",
        "GB/s",
    ]
    table = md_table(headers, rows, ["l"] * len(cols) + ["r", "r", "r", "r", "l", "r", "r", "r", "r"])
    return f"{table}\n\n" + caption(
        ok,
        ceilings_caption(ok, ceilings_root)
        + (
            " `experts µs` comes from "
            "phase events around an eager forward (kernel durations in profiler timing mode), which include host "
            "launch gaps at small sizes; in graph timing mode compare `layer µs` (graph replays, whole layer). "
            "`layer % of floor` = floor / layer µs: a lower bound on the experts' figure, since the layer holds the "
            "experts and more (routing, prepare, finalize)."
        ),
    )
