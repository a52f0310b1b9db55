"""The tables of a comparison (report/compare.py): latency pairs, memory pairs, the rows
without a partner; each a report.table.Table (markdown, csv, json from the same values)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pandas as pd

from moebench.report.clock_verdict import CLOCK_COLUMN
from moebench.report.columns import (
    MEMORY_COLUMNS,
    PAIR_LATENCY_COLUMNS,
    PER_ROW_COLUMNS,
    ROW_COLUMNS,
    combo_columns,
    combo_labels,
    constant_caption,
    fmt_series,
    fmt_value,
    num_distinct,
)
from moebench.report.compare import SHOWN_COLUMNS, Comparison
from moebench.report.flags import PACED_MARK_TEXT, mark_of, pair_flags, pair_rows
from moebench.report.fmt import fmt_change, fmt_interval, fmt_mib, fmt_pct, fmt_us
from moebench.report.run_tables import md_value, value_cell
from moebench.report.stats import pct
from moebench.report.table import Column, Table, md_text
from moebench.results.row import Status, Verdict
from moebench.util.words import counted

# the table's first column: worse, better, or not measured on a side (skipped, cannot run: no verdict,
# nothing broke; the exit status passes them); the caption's legend says each that the table holds
MARKS = {
    Verdict.SLOWER: "+",
    Verdict.BROKEN: "+",
    Verdict.FASTER: "-",
    Verdict.FIXED: "-",
    Verdict.SKIPPED: "·",
    Verdict.CANNOT_RUN: "·",
}
NOT_MEASURED_MARK = "`·` skipped / cannot run (not measured on a side: no verdict)"


def pair_order(m: pd.DataFrame) -> pd.DataFrame:
    """Matched rows in combination then token order (as the run's tables list them)."""
    cols = combo_columns(m)
    keys = [fmt_series(m[c]) for c in cols]
    order = pd.DataFrame({f"k{i}": k for i, k in enumerate(keys)}).assign(_t=m["tokens_per_rank"].astype(float))
    return m.loc[order.sort_values(list(order.columns), kind="stable").index]


def pair_names(m: pd.DataFrame) -> pd.Series:
    """'triton/experts mixtral_8x7b · 256 tok': what the verdict calls a pair, as Markdown (the
    rows' text escaped: moebench/report/mdsafe.py md_text)."""
    labels = combo_labels(m)
    return pd.Series(
        [md_text(f"{lab} · {fmt_value(t)} tok") for lab, t in zip(labels, m["tokens_per_rank"], strict=True)],
        index=m.index,
        dtype=object,
    )


def _side(row: dict, side: str) -> str:
    if row[f"{side}_status"] != Status.OK:
        return md_text(row[f"{side}_status"])
    cell = fmt_interval(row[f"{side}_latency_us_median"], row[f"{side}_latency_us_p20"], row[f"{side}_latency_us_p80"])
    mark = mark_of(row[f"{side}_host_paced_samples"], row[f"{side}_num_samples"])
    return f"{cell} {mark}" if mark else cell


def _clock_cell(row) -> str:
    """'1944 → 1800': each side's median SM clock (MHz), '-' where a side has none."""
    b, c = (row[f"{s}_{CLOCK_COLUMN}"] for s in ("base", "cand"))
    return " → ".join(f"{x:.0f}" if np.isfinite(x) else "-" for x in (b, c))


def _side_cell(side: str, fmt: Callable[[Any, str], str]) -> Callable[[Any], str]:
    """A cell formatter of one side ("base" | "cand") of a pair: `fmt(row, side)`."""

    def cell(row) -> str:
        return fmt(row, side)

    return cell


def _shown(m: pd.DataFrame) -> list[str]:
    return combo_columns(m)


def latency_pairs(cmp: Comparison, flags: pd.Series | None = None) -> Table:
    """Every matched pair ok on at least one side, in combination and token order:
    baseline and candidate median (p20–p80) µs, the change with its 95 % interval, p, the
    verdict and the rows' data-quality flags (``flags``: pair_flags of every matched pair where
    the caller has them, else built here)."""
    m = cmp.matched
    m = pair_order(m[m["verdict"] != Verdict.NEITHER_OK])
    shown = _shown(m)
    data = m[[c for c in SHOWN_COLUMNS + ["knobs"] if c in m.columns]].copy()
    data["tokens_per_rank"] = m["tokens_per_rank"]
    for side in ("base", "cand"):
        for k in PAIR_LATENCY_COLUMNS:
            data[f"{side}_{k}"] = m[f"{side}_{k}"]
        data[f"{side}_num_samples"] = m[f"{side}_samples_us"].map(  # the host-paced mark's m
            lambda v: float(len(v)) if isinstance(v, (list, tuple, np.ndarray)) else np.nan
        )
    data["ratio"] = m["ratio"]
    data["change_pct"] = m["ratio"].map(pct)
    data["ci_lo_pct"] = m["ci_lo"].map(pct)
    data["ci_hi_pct"] = m["ci_hi"].map(pct)
    data["p_value"] = m["p_value"]
    data["significant"] = m["significant"]
    data["verdict"] = m["verdict"]
    data["flags"] = pair_flags(pair_rows(m)) if flags is None else flags.loc[m.index]
    data["base_combo_key"], data["cand_combo_key"] = m["base_combo_key"], m["cand_combo_key"]
    for side in ("base", "cand"):  # each side's median SM clock (report/clock_verdict.py)
        data[f"{side}_{CLOCK_COLUMN}"] = pd.to_numeric(m.get(f"{side}_{CLOCK_COLUMN}"), errors="coerce")
    # the change with the candidate at the baseline's clock, where a compute-bound pair was normalised
    data["clock_scaled_change_pct"] = pd.to_numeric(m["clock_ratio"], errors="coerce").map(pct)
    clocked = bool(len(data)) and data[[f"base_{CLOCK_COLUMN}", f"cand_{CLOCK_COLUMN}"]].notna().any().any()
    timing_varies = num_distinct(pd.concat([m["base_timing_mode"], m["cand_timing_mode"]])) > 1
    cols = [Column("", lambda r: MARKS.get(r["verdict"], ""))]
    cols += [Column(c, value_cell(c)) for c in shown]
    cols += [Column("tokens", lambda r: md_value(r["tokens_per_rank"]), "r")]
    if timing_varies:
        cols += [Column("timing", lambda r: _timing(r))]
    cols += [
        Column(f"{cmp.baseline_name} µs", lambda r: _side(r, "base"), "r"),
        Column(f"{cmp.candidate_name} µs", lambda r: _side(r, "cand"), "r"),
        *([Column("SM MHz", _clock_cell, "r")] if clocked else []),
        Column(
            "change [95 % CI]",
            lambda r: fmt_change(r["ratio"], 1 + r["ci_lo_pct"] / 100, 1 + r["ci_hi_pct"] / 100, cmp.bounds),
            "r",
        ),
        Column("p", lambda r: "-" if not np.isfinite(r["p_value"]) else f"{r['p_value']:.2g}", "r"),
        Column(
            "verdict",
            lambda r: r["verdict"] + (" (significant)" if r["verdict"] == Verdict.SIMILAR and r["significant"] else ""),
        ),
        Column("flags", lambda r: " ".join(r["flags"])),
    ]
    caption = " ".join(
        x
        for x in [
            "Times in µs: median (p20–p80). change = candidate median / baseline median − 1 with the 95 % bootstrap "
            "interval of that ratio; a verdict needs the p20–p80 intervals apart, "
            f"the ratio past ×{cmp.threshold:g} and "
            f"(with ≥ 5 samples) a Mann-Whitney p below {cmp.alpha:g}; `~ (significant)`: a real change (its "
            "interval excludes 0, p below alpha) that is not called: under the threshold, or past it with the "
            "p20–p80 intervals overlapping. `+` slower / broken, `-` faster / fixed"
            + (f", {NOT_MEASURED_MARK}." if m["verdict"].isin([Verdict.SKIPPED, Verdict.CANNOT_RUN]).any() else "."),
            f"{PACED_MARK_TEXT}."
            if any(
                mark_of(r[f"{s}_host_paced_samples"], r[f"{s}_num_samples"])
                for r in data.to_dict("records")
                for s in ("base", "cand")
            )
            else "",
            _caption_tail(m),
        ]
        if x
    )
    num_na = int((cmp.matched["verdict"] == Verdict.NEITHER_OK).sum())
    notes = [f"{num_na} matched rows are ok on neither side (not shown)."] if num_na else []
    return Table("comparison", data.reset_index(drop=True), cols, caption, "_No comparable rows._", notes)


def _timing(r: dict) -> str:
    a, b = md_value(r["base_timing_mode"]), md_value(r["cand_timing_mode"])
    return a if a == b else f"{a}→{b}"


def _caption_tail(m: pd.DataFrame) -> str:
    const = constant_caption(m.drop(columns=[c for c in PER_ROW_COLUMNS if c in m.columns]))
    modes = sorted(
        {fmt_value(v) for v in pd.concat([m["base_timing_mode"], m["cand_timing_mode"]]) if fmt_value(v) != "-"}
    )
    parts = [f"All rows: {md_text(const)}." if const else ""]
    if len(modes) == 1:
        parts.append(f"timing_mode={md_text(modes[0])} (what ran).")
    return " ".join(p for p in parts if p)


def memory_pairs(cmp: Comparison) -> Table:
    """Workspace (allocator peak, else analytic) and device peak of each pair, in MiB, with
    the change; the verdict is the workspace's by the threshold factor."""
    m = cmp.matched
    cols_mem = [f"{s}_{c}" for s in ("base", "cand") for c in MEMORY_COLUMNS]
    m = pair_order(m[m[cols_mem].notna().any(axis=1)])
    shown = _shown(m)
    data = m[[c for c in SHOWN_COLUMNS + ["knobs"] if c in m.columns]].copy()
    data["tokens_per_rank"] = m["tokens_per_rank"]
    for c in cols_mem:
        data[c] = m[c]
    data["workspace_ratio"], data["device_ratio"], data["mem_verdict"] = (
        m["mem_ratio"],
        m["dev_ratio"],
        m["mem_verdict"],
    )
    cols = [Column(c, value_cell(c)) for c in shown]
    cols += [Column("tokens", lambda r: md_value(r["tokens_per_rank"]), "r")]
    for side, name in (("base", cmp.baseline_name), ("cand", cmp.candidate_name)):
        cols.append(Column(f"workspace {name}", _side_cell(side, lambda r, s: fmt_mib(_ws(r, s))), "r"))
    cols.append(Column("workspace change", lambda r: fmt_change(r["workspace_ratio"], np.nan, np.nan), "r"))
    for side, name in (("base", cmp.baseline_name), ("cand", cmp.candidate_name)):
        cols.append(Column(f"device {name}", _side_cell(side, lambda r, s: fmt_mib(r[f"{s}_device_bytes_peak"])), "r"))
    cols += [
        Column("device change", lambda r: fmt_change(r["device_ratio"], np.nan, np.nan), "r"),
        Column("verdict", lambda r: r["mem_verdict"] or "-"),
    ]
    caption = (
        "Memory in MiB (2^20 bytes): workspace = the allocator peak of one forward (the analytic workspace "
        f"where no peak was measured), device = device memory in use at the peak; verdict by ×{cmp.threshold:g}."
        + (f" All rows: {md_text(constant_caption(m))}." if constant_caption(m) else "")
    )
    return Table("memory", data.reset_index(drop=True), cols, caption, "_No memory measurements to compare._")


def _ws(r: dict, side: str) -> float:
    peak = r[f"{side}_workspace_bytes_peak"]
    return peak if np.isfinite(peak) else r[f"{side}_workspace_bytes_analytic"]


def unmatched(df: pd.DataFrame, name: str) -> Table:
    """Rows without a partner: combination, tokens, status."""
    shown = combo_columns(df) if len(df) else []
    data = (
        df[
            [c for c in dict.fromkeys(SHOWN_COLUMNS + ROW_COLUMNS) if c in df.columns and c not in PER_ROW_COLUMNS]
        ].copy()
        if len(df)
        else pd.DataFrame()
    )
    cols = [Column(c, value_cell(c)) for c in shown]
    cols += [
        Column("tokens", lambda r: md_value(r["tokens_per_rank"]), "r"),
        Column("status", lambda r: md_text(r["status"])),
    ]
    return Table(name, data.reset_index(drop=True), cols, "", "_None._")


def memory_change_lines(cmp: Comparison, names: pd.Series, limit: int = 3) -> list[str]:
    """Workspace and device-peak changes past the threshold, largest first (verdict lines)."""
    m = cmp.matched
    out = []
    for col, what, b_col, c_col in (
        ("mem_ratio", "workspace", None, None),
        ("dev_ratio", "device peak", "base_device_bytes_peak", "cand_device_bytes_peak"),
    ):
        r = m[col].astype(float)
        hit = m[np.isfinite(r) & ((r >= cmp.threshold) | (r <= 1 / cmp.threshold))]
        if not len(hit):
            continue
        hit = hit.assign(_d=-np.abs(np.log(hit[col].astype(float)))).sort_values("_d", kind="stable")
        items = []
        for i, row in hit.head(limit).iterrows():
            rd = row.to_dict()
            b = _ws(rd, "base") if b_col is None else rd[b_col]
            c = _ws(rd, "cand") if c_col is None else rd[c_col]
            items.append(f"{names.loc[i]} {fmt_pct(pct(row[col]))} % ({fmt_mib(b)} → {fmt_mib(c)} MiB)")
        more = f" (+{len(hit) - limit} more)" if len(hit) > limit else ""
        smaller = int((hit[col] < 1).sum())
        counts = [(n, word) for n, word in ((smaller, "smaller"), (len(hit) - smaller, "larger")) if n]
        # '3 rows smaller, 1 larger', '1 row larger': the noun once, no zero count
        sides = [f"{counted(n, 'row') if i == 0 else n} {word}" for i, (n, word) in enumerate(counts)]
        peaks = [c for c in ("base_workspace_bytes_peak", "cand_workspace_bytes_peak") if c in hit.columns]
        if b_col is None and not hit[peaks].notna().any().any():  # _ws's fallback, as the report says it
            what = "declared workspace (no peak measured)"
        out.append(f"{what}: {', '.join(sides)} beyond ×{cmp.threshold:g} — " + "; ".join(items) + more)
    return out


def fmt_us_pair(b: float, c: float) -> str:
    return f"{fmt_us(b)} → {fmt_us(c)} µs"
