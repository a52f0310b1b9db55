"""What a reviewer reads first in a single run's report: the biggest wins (the fastest
combination of each model x tokens and its margin over the runner-up), what broke,
memory, and the data-quality notes; and the run's rows as one Table for csv / json.
Text from the rows enters the Markdown escaped (pair_names, md_text, md_value)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from moebench.report.clock_report import clock_notes
from moebench.report.columns import (
    LATENCY_COLUMNS,
    MEMORY_COLUMNS,
    OVERLAP_COLUMNS,
    PHASE_COLUMNS,
    ROW_COLUMNS,
    SHOWN_IDENTITY,
    WORKLOAD_COLUMNS,
    combo_columns,
    constant_caption,
    records,
)
from moebench.report.compare_tables import pair_names
from moebench.report.fastest import Timed, ranked
from moebench.report.flags import caveat_files, caveats_text, flag_summary, paced_details, row_flags, run_notes
from moebench.report.fmt import fmt_interval, fmt_mib
from moebench.report.run_tables import md_value, value_cell
from moebench.report.table import Column, Table, md_text
from moebench.report.time_basis import CPU, HOST, figure_basis
from moebench.results.row import BAD_STATUSES, Status
from moebench.util.words import agree, counted

BAD = BAD_STATUSES
TOP = 5


def _workloads(ok: pd.DataFrame) -> list[str]:
    """What a workload is here: the model, world size and simulate_ep, and every other
    identity column that is no axis (routing, seed, ...), so that the fastest is chosen
    among combinations that saw the same tokens."""
    return [c for c in (*WORKLOAD_COLUMNS, "tokens_per_rank") if c in ok.columns]


def bases(ok: pd.DataFrame) -> pd.Series:
    """figure_basis of each row: (gpu | host | cpu, why)."""
    return pd.Series([figure_basis(r) for r in records(ok)], index=ok.index, dtype=object)


def wins(df: pd.DataFrame, limit: int = TOP) -> list[str]:
    """The largest margins of a fastest combination over the runner-up of its workload, among the
    rows whose latency is GPU time (host and CPU time are never ranked): report/fastest.py's
    `ranked`, each line naming its workload where the run has several."""
    return [w.text for w in ranked(Timed.of(df))[:limit]]


def unranked_lines(df: pd.DataFrame) -> list[str]:
    """The ok rows the summary does not rank, with why: host time (named), CPU time (counted)."""
    ok = df
    ok = ok[(ok["status"] == Status.OK) & ok["latency_us_median"].notna()]
    if not len(ok):
        return []
    b = bases(ok)
    out = []
    host = ok[[x == HOST for x, _ in b]]
    if len(host):
        names = pair_names(ok).loc[host.index]
        shown = ", ".join(names.head(TOP)) + (f" (+{len(host) - TOP} more)" if len(host) > TOP else "")
        out.append(f"not ranked, host time: {counted(len(host), 'row')} — {shown}; {md_text(b.loc[host.index[0]][1])}")
    num_cpu = sum(x == CPU for x, _ in b)
    if num_cpu:
        out.append(
            f"no fastest named: {counted(num_cpu, 'ok row')} {agree(num_cpu, 'is', 'are')} CPU time "
            "(pipeline checks, not performance figures)"
        )
    return out


def memory_lines(df: pd.DataFrame) -> list[str]:
    ok = df
    ok = ok[ok["status"] == Status.OK]
    names = pair_names(ok) if len(ok) else pd.Series([], dtype=object)
    out = []
    for col, what in (("device_bytes_peak", "device peak"), ("workspace_bytes_peak", "workspace peak")):
        if col in ok.columns and ok[col].notna().any():
            i = ok[col].idxmax()
            out.append(f"largest {what}: {fmt_mib(ok.loc[i, col])} MiB ({names.loc[i]})")
    return out


def quality_lines(df: pd.DataFrame, env: dict, run_dir: Path | None, name: str = "") -> list[str]:
    """Data-quality bullets of one run: its flagged rows by flag, provenance notes."""
    rows = df
    ok = rows[rows["status"] == Status.OK]
    lines = flag_summary(row_flags(ok), pair_names(ok), details=paced_details(ok)) if len(ok) else []
    lines += clock_notes(df)  # said once: the clock or NVML not recorded
    if name:
        lines = [f"{name}: {x}" for x in lines]
    return lines + run_notes(df, env, name)


def caveats(run_dirs, root: Path | None = None) -> list[str]:
    """The caveats.md files stored with the runs (each file once)."""
    files = []
    for d in run_dirs:
        for f in caveat_files(d):
            if f not in files:
                files.append(f)
    return caveats_text(files, root)


def reviewer_summary(df: pd.DataFrame, quality: list[str]) -> list[str]:
    """Bullets: status counts with what broke, biggest wins, memory, data quality."""
    rows = df
    counts = rows["status"].value_counts()
    order = [Status.OK, Status.SKIPPED, *BAD]
    head = ", ".join(f"{int(counts[s])} {s}" for s in order if s in counts)
    # the statuses' counts share the noun: 'row' after a total of one ('1 ok row'), else 'rows'
    noun = agree(len(rows), "row", "rows")
    lines = [f"**Summary:** {head} {noun} of {counted(rows['combo_key'].nunique(), 'combination')}"]
    bad = rows[rows["status"].isin(BAD)]
    if len(bad):
        names = pair_names(rows)  # named among every row, so that the combination shows
        shown = "; ".join(f"{names.loc[i]} {md_text(r['status'])}" for i, r in bad.head(TOP).iterrows())
        lines.append(f"- broken: {shown}" + (f" (+{len(bad) - TOP} more)" if len(bad) > TOP else ""))
    lines += [f"- {w}" for w in wins(df)]
    lines += [f"- {x}" for x in unranked_lines(df)]
    lines += [f"- memory: {x}" for x in memory_lines(df)]
    if quality:
        ok = rows[rows["status"] == Status.OK]
        flagged = int(sum(bool(t) for t in row_flags(ok))) if len(ok) else 0
        of = f"; {flagged} of {counted(len(ok), 'ok row')} flagged" if flagged else ""
        lines.append(f"- data quality: {counted(len(quality), 'note')} in the report's Data quality section{of}")
    return lines


def rows_table(df: pd.DataFrame) -> Table:
    """Every row of the run (the newest per combination and tokens), its figures unrounded:
    identity, tokens, timing that ran, status, latency, phases, overlap, memory, flags."""
    rows = df
    shown = combo_columns(rows)
    keep = [
        c
        for c in SHOWN_IDENTITY
        + ROW_COLUMNS
        + LATENCY_COLUMNS
        + PHASE_COLUMNS
        + OVERLAP_COLUMNS
        + MEMORY_COLUMNS
        + ["host_enqueue_us"]
        if c in rows.columns
    ]
    data = rows[list(dict.fromkeys(keep))].copy()
    data["flags"] = row_flags(rows)
    cols = [Column(c, value_cell(c)) for c in shown]
    cols += [
        Column("tokens", lambda r: md_value(r["tokens_per_rank"]), "r"),
        Column("timing", lambda r: md_value(r.get("timing_mode"))),
        Column("status", lambda r: md_text(r["status"])),
        Column(
            "latency µs",
            lambda r: (
                "-"
                if r["status"] != Status.OK
                else fmt_interval(r["latency_us_median"], r["latency_us_p20"], r["latency_us_p80"])
            ),
            "r",
        ),
        Column("workspace peak MiB", lambda r: fmt_mib(r.get("workspace_bytes_peak", np.nan)), "r"),
        Column("flags", lambda r: " ".join(r["flags"])),
    ]
    const = constant_caption(rows)
    return Table(
        "rows",
        data.reset_index(drop=True),
        cols,
        "Times in µs: median (p20–p80)." + (f" All rows: {md_text(const)}." if const else ""),
    )
