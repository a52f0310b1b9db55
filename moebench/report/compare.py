"""Baseline vs candidate comparison, in the style of ``asv compare``.

Rows are matched on their stored combination key and token count: the key is the hash
of the combination's identity (moebench/spec.py), so two runs of the same sweep on
different commits line up and rows that differ in any identity field or knob never do. A matched pair is called
"slower" (or "faster") only when

1. the p20–p80 intervals of the two rows do not overlap,
2. the ratio candidate median / baseline median passes the threshold factor
   (>= threshold, or <= 1 / threshold), and
3. where both rows carry >= ``min_samples`` raw samples, a two-sided Mann-Whitney U test
   on ``samples_us`` gives p < ``alpha``;

otherwise "~" (no significant change). Status changes read "broken" (baseline ok,
candidate not) and "fixed" (the reverse); "n/a" where neither side is ok.
Workspace memory is compared by the same factor, without intervals (it is deterministic).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .load import IDENTITY_COLUMNS, MEMORY_COLUMNS, combo_labels, display_columns, fmt_value, latest_rows
from .tables import fmt_interval, fmt_mib, md_table

# what a matched row shows of its combination (the candidate's; the key makes both sides equal)
SHOWN_COLUMNS = [c for c in IDENTITY_COLUMNS if c not in ("schema_version", "run_id", "sweep", "combo_key")]
VERDICT_ORDER = ["broken", "slower", "faster", "fixed", "~", "n/a"]
SIDE_COLUMNS = ["status", "reason", "latency_us_median", "latency_us_p20", "latency_us_p80",
                "samples_us"] + MEMORY_COLUMNS


@dataclass
class Comparison:
    """Result of compare_runs. ``matched`` has one row per matched identity with
    ``base_*`` / ``cand_*`` columns (µs, bytes), ``ratio``, ``p_value``, ``verdict``,
    ``mem_ratio`` and ``mem_verdict``; ``only_baseline`` / ``only_candidate`` hold the
    rows without a partner."""

    matched: pd.DataFrame
    only_baseline: pd.DataFrame
    only_candidate: pd.DataFrame
    threshold: float
    alpha: float

    def counts(self) -> dict[str, int]:
        """Number of matched rows per verdict (all verdicts present, zeros included)."""
        vc = self.matched["verdict"].value_counts()
        return {v: int(vc.get(v, 0)) for v in VERDICT_ORDER}


def mann_whitney_p(a, b) -> float:
    """Two-sided Mann-Whitney U p-value (normal approximation, tie-corrected).

    Returns NaN when either side has fewer than 2 finite samples. numpy only: scipy is
    not a dependency.
    """
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    n1, n2 = len(a), len(b)
    if n1 < 2 or n2 < 2:
        return float("nan")
    x = np.concatenate([a, b])
    n = n1 + n2
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = ((ends - counts + 1 + ends) / 2.0)[inverse]  # average rank of each tie group
    u1 = ranks[:n1].sum() - n1 * (n1 + 1) / 2.0
    tie = float((counts ** 3 - counts).sum()) / (n * (n - 1))
    sigma = math.sqrt(n1 * n2 / 12.0 * ((n + 1) - tie))
    if sigma == 0:
        return 1.0
    z = max(abs(u1 - n1 * n2 / 2.0) - 0.5, 0.0) / sigma  # 0.5: continuity correction
    return math.erfc(z / math.sqrt(2.0))


def latency_verdict(base: dict, cand: dict, threshold: float, alpha: float = 0.05,
                    min_samples: int = 5) -> tuple[str, float, float]:
    """(verdict, ratio, p_value) for one matched pair of rows (dicts of row values)."""
    ratio = cand["latency_us_median"] / base["latency_us_median"] \
        if base["latency_us_median"] else float("nan")
    b_ok, c_ok = base["status"] == "ok", cand["status"] == "ok"
    if not (b_ok and c_ok):
        verdict = "broken" if b_ok else "fixed" if c_ok else "n/a"
        return verdict, float("nan"), float("nan")
    bs, cs = _samples(base["samples_us"]), _samples(cand["samples_us"])
    p = mann_whitney_p(bs, cs) if min(len(bs), len(cs)) >= min_samples else float("nan")
    significant = not (p >= alpha)  # NaN (too few samples) defers to the intervals
    if not np.isfinite(ratio):
        return "~", ratio, p
    if ratio >= threshold and cand["latency_us_p20"] > base["latency_us_p80"] and significant:
        return "slower", ratio, p
    if ratio <= 1.0 / threshold and cand["latency_us_p80"] < base["latency_us_p20"] \
            and significant:
        return "faster", ratio, p
    return "~", ratio, p


def memory_verdict(base_bytes: float, cand_bytes: float, threshold: float) -> tuple[str, float]:
    """('larger'|'smaller'|'~'|'', ratio) for workspace bytes; '' without data."""
    if not (np.isfinite(base_bytes) and np.isfinite(cand_bytes)) or base_bytes <= 0:
        return "", float("nan")
    ratio = cand_bytes / base_bytes
    if ratio >= threshold:
        return "larger", ratio
    if ratio <= 1.0 / threshold:
        return "smaller", ratio
    return "~", ratio


def _samples(value) -> np.ndarray:
    """Samples (µs) of a row as a flat float array; per-rank nested lists are flattened."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return np.empty(0)
    try:
        return np.asarray(value, dtype=float).ravel()
    except ValueError:  # ragged per-rank lists
        parts = [np.ravel(np.asarray(v, dtype=float)) for v in value]
        return np.concatenate(parts) if parts else np.empty(0)


def _keyed(df: pd.DataFrame) -> pd.DataFrame:
    """The newest row per (combo_key, tokens_per_rank), with that pair as one text key."""
    df = latest_rows(df).copy()
    if "knobs" not in df.columns:
        df["knobs"] = ""
    for col in SHOWN_COLUMNS:
        if col not in df.columns:
            df[col] = None
    df["_key"] = df["combo_key"].astype(str) + "\x1f" + df["tokens_per_rank"].map(fmt_value)
    return df.drop_duplicates("_key", keep="last")


def _workspace(row: dict, side: str) -> float:
    """Allocator peak if measured, else the analytic workspace (bytes)."""
    peak = row[f"{side}_workspace_bytes_peak"]
    return peak if np.isfinite(peak) else row[f"{side}_workspace_bytes_analytic"]


def compare_runs(baseline: pd.DataFrame, candidate: pd.DataFrame, threshold: float = 1.05,
                 alpha: float = 0.05, min_samples: int = 5) -> Comparison:
    """Match candidate rows to baseline rows and give each pair a verdict (module doc).

    Both frames are as ``load_run`` returns them (µs, bytes). ``threshold`` is the factor
    a median ratio must pass; ``alpha`` the Mann-Whitney level, applied where both rows
    have at least ``min_samples`` samples.
    """
    if not threshold >= 1.0:
        raise ValueError(f"threshold must be a factor >= 1 (e.g. 1.05 for 5%), got {threshold}")
    base, cand = _keyed(baseline), _keyed(candidate)
    keys = cand["_key"][cand["_key"].isin(set(base["_key"]))]
    b = base.set_index("_key").loc[keys.values, SIDE_COLUMNS].add_prefix("base_")
    c = cand.set_index("_key").loc[keys.values, SHOWN_COLUMNS + ["knobs", "combo_key"] + SIDE_COLUMNS]
    c = c.rename(columns={k: f"cand_{k}" for k in SIDE_COLUMNS})
    matched = pd.concat([c, b], axis=1).reset_index(drop=True)
    verdicts, ratios, ps, mverdicts, mratios = [], [], [], [], []
    for row in matched.to_dict("records"):
        side = {s: {k: row[f"{s}_{k}"] for k in SIDE_COLUMNS} for s in ("base", "cand")}
        v, r, p = latency_verdict(side["base"], side["cand"], threshold, alpha, min_samples)
        mv, mr = memory_verdict(_workspace(row, "base"), _workspace(row, "cand"), threshold)
        verdicts.append(v), ratios.append(r), ps.append(p)
        mverdicts.append(mv), mratios.append(mr)
    matched = matched.assign(ratio=ratios, p_value=ps, verdict=verdicts, mem_ratio=mratios,
                             mem_verdict=mverdicts)
    matched["label"] = combo_labels(matched).values if len(matched) else []
    only_b = base[~base["_key"].isin(set(cand["_key"]))].drop(columns="_key")
    only_c = cand[~cand["_key"].isin(set(base["_key"]))].drop(columns="_key")
    return Comparison(matched, only_b.reset_index(drop=True), only_c.reset_index(drop=True),
                      threshold, alpha)


def _order(matched: pd.DataFrame) -> pd.DataFrame:
    rank = matched["verdict"].map({v: i for i, v in enumerate(VERDICT_ORDER)})
    return matched.assign(_rank=rank, _r=-matched["ratio"].fillna(0)) \
        .sort_values(["_rank", "_r"], kind="stable").drop(columns=["_rank", "_r"])


def _fmt_side(row, side: str) -> str:
    if row[f"{side}_status"] != "ok":
        return str(row[f"{side}_status"])
    return fmt_interval(row[f"{side}_latency_us_median"], row[f"{side}_latency_us_p20"],
                        row[f"{side}_latency_us_p80"])


def latency_comparison_table(cmp: Comparison, only_changed: bool = False) -> str:
    """Matched rows, worst first: baseline and candidate median (p20–p80) µs, ratio, p.

    ``only_changed`` keeps the rows whose verdict is not "~".
    """
    m = cmp.matched
    # Rows ok on neither side (skipped in both, say) carry no comparison.
    num_na = int((m["verdict"] == "n/a").sum())
    m = m[m["verdict"] != "n/a"]
    if only_changed:
        m = m[m["verdict"] != "~"]
    note = f"\n\n{num_na} matched rows are ok on neither side (not shown)." if num_na else ""
    if not len(m):
        return ("_No significant changes._" if only_changed else "_No comparable rows._") + note
    cols = display_columns(m)
    rows = []
    for _, r in _order(m).iterrows():
        mark = {"slower": "+", "broken": "+", "faster": "-", "fixed": "-"}.get(r["verdict"], "")
        rows.append([mark] + [fmt_value(r[c]) for c in cols] + [
            fmt_value(r["tokens_per_rank"]), _fmt_side(r, "base"), _fmt_side(r, "cand"),
            "-" if not np.isfinite(r["ratio"]) else f"{r['ratio']:.3f}",
            "-" if not np.isfinite(r["p_value"]) else f"{r['p_value']:.3g}", r["verdict"]])
    headers = [""] + cols + ["tokens", "baseline µs", "candidate µs", "ratio", "p", "verdict"]
    return md_table(headers, rows, ["l"] + ["l"] * len(cols) + ["r"] * 5 + ["l"]) + note


def memory_comparison_table(cmp: Comparison) -> str:
    """Workspace (peak, else analytic) and device peak, baseline vs candidate, in MiB."""
    m = cmp.matched
    m = m[m[[f"{s}_{c}" for s in ("base", "cand") for c in MEMORY_COLUMNS]].notna().any(axis=1)]
    if not len(m):
        return "_No memory measurements to compare._"
    cols = display_columns(m)
    rows = []
    for _, r in m.iterrows():
        rows.append([fmt_value(r[c]) for c in cols] + [fmt_value(r["tokens_per_rank"])] + [
            fmt_mib(r[f"{s}_{c}"]) for c in MEMORY_COLUMNS for s in ("base", "cand")] + [
            "-" if not np.isfinite(r["mem_ratio"]) else f"{r['mem_ratio']:.3f}",
            r["mem_verdict"]])
    headers = cols + ["tokens", "ws analytic base", "ws analytic cand", "ws peak base",
                      "ws peak cand", "device base", "device cand", "ws ratio", "verdict"]
    return md_table(headers, rows, ["l"] * len(cols) + ["r"] * 8 + ["l"])


def unmatched_table(df: pd.DataFrame) -> str:
    """Rows without a partner: combination, tokens, status."""
    if not len(df):
        return "_None._"
    cols = display_columns(df)
    rows = [[fmt_value(r[c]) for c in cols] + [fmt_value(r["tokens_per_rank"]), r["status"]]
            for _, r in df.iterrows()]
    return md_table(cols + ["tokens", "status"], rows)


def summary_line(cmp: Comparison) -> str:
    """One line: counts per verdict, memory changes and unmatched rows."""
    counts = cmp.counts()
    parts = [f"{n} {v}" for v, n in counts.items() if n]
    mem = cmp.matched["mem_verdict"].value_counts()
    mem_parts = [f"{int(mem[v])} {v}" for v in ("larger", "smaller") if v in mem]
    return (f"{len(cmp.matched)} matched rows: {', '.join(parts) or 'none'}"
            f" (threshold ×{cmp.threshold:g}, p < {cmp.alpha:g}); workspace: "
            f"{', '.join(mem_parts) or 'no change'}; {len(cmp.only_baseline)} only in "
            f"baseline, {len(cmp.only_candidate)} only in candidate.")


def comparison_markdown(cmp: Comparison, baseline_name: str = "baseline",
                        candidate_name: str = "candidate", notes=()) -> str:
    """The comparison section of a PR report (markdown, headings at level 2/3);
    ``notes`` (markdown paragraphs, e.g. environments, a plot) follow the summary."""
    return "\n\n".join([
        f"## Comparison: {candidate_name} vs {baseline_name}",
        summary_line(cmp), *[n for n in notes if n],
        "### Latency", latency_comparison_table(cmp),
        "`+` slower / broken, `-` faster / fixed; ratio = candidate median / baseline "
        "median; a verdict needs separated p20–p80 intervals, the ratio past the threshold "
        "and (with samples) a Mann-Whitney p below alpha.",
        "### Workspace memory", memory_comparison_table(cmp),
        "### Only in baseline", unmatched_table(cmp.only_baseline),
        "### Only in candidate", unmatched_table(cmp.only_candidate),
    ])
