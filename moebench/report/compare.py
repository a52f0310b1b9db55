"""Baseline vs candidate comparison, in the style of ``asv compare``.

Two runs: rows are matched on their stored combination key and token count (the key is
the hash of the combination's identity, moebench/config/spec.py), so two runs of the same sweep
on different commits line up and rows that differ in any identity field or knob never
do. Within one run, ``report/axis.py`` pairs the rows that differ in one axis only and
hands the pairs to ``compare_pairs``. A matched pair is called "slower" (or "faster")
only when

1. the p20–p80 intervals of the two rows do not overlap,
2. the ratio candidate median / baseline median passes the threshold factor
   (>= threshold, or <= 1 / threshold), and
3. where both rows carry >= ``MIN_SAMPLES`` raw samples, a two-sided Mann-Whitney U test
   on ``samples_us`` gives p < ``alpha``;

otherwise "~". A pair whose latency is no GPU time on one side gets no faster / slower
verdict (report/time_basis.py figure_basis): "host" where a side is host time (the host paced its
samples, or an older eager row was host-bound), "cpu" where both are CPU rows, which are
pipeline checks (``cpu_verdict=True``, `--cpu-verdict`, asks for the verdict anyway). The
size of a change is the ratio with a 95 % bootstrap interval of the
samples' ratio of medians (report/stats.py); a "~" pair whose interval excludes 1 and
whose p is below alpha is ``significant``: a real change not called (under the threshold,
or past it with overlapping p20–p80 intervals). Status
changes read "broken" (ok, now failed / incorrect / timeout / oom), "skipped" (ok, now
skipped), "fixed" (the reverse); "n/a" where neither side is ok. Workspace memory is
compared by the same factor, without intervals (it is deterministic).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pandas as pd

from moebench.report.clock_verdict import CLOCK_COLUMN, bounds, clock_verdict
from moebench.report.columns import (
    MEMORY_COLUMNS,
    PAIR_LATENCY_COLUMNS,
    PHASE_COLUMNS,
    PLACE_COLUMNS,
    ROW_COLUMNS,
    SHOWN_IDENTITY,
    combo_labels,
    fmt_value,
    records,
)
from moebench.report.stats import MIN_SAMPLES, bootstrap_ratios, geometric_mean, interval, mann_whitney_p, samples_of
from moebench.results import row as schema
from moebench.results.row import NO_VERDICT, Status, Verdict

__all__ = ["Comparison", "compare_runs", "compare_pairs", "mann_whitney_p", "latency_verdict", "memory_verdict"]

# what a matched row shows of its combination (the candidate's; the key makes both sides equal)
SHOWN_COLUMNS = SHOWN_IDENTITY
VERDICT_ORDER = list(Verdict)  # as the counts list them
# the host's figures: its enqueue time and the samples it paced, with their counts (results/row.py)
HOST_COLUMNS = schema.names("host", dtype="float")
# what each side of a matched pair carries: its outcome and latency cell, the row's names (less
# the knobs: the pair's own), its samples, the host's figures, memory and phases
SIDE_COLUMNS = list(
    dict.fromkeys(
        [
            *PAIR_LATENCY_COLUMNS,
            *(c for c in ROW_COLUMNS if c != "knobs"),
            "samples_us",
            *schema.names("host"),
            "analytic_peak_bytes",
            *MEMORY_COLUMNS,
            *PHASE_COLUMNS,
            *schema.names("clock"),
            *schema.names("layout"),  # what the Triton experts ran: flags.pair_ran_text
        ]
    )
)


@dataclass
class Axis:
    """A comparison along one field: `field` = a (baseline) vs b (candidate), within one run, or
    ``across`` two: the baseline run's rows with a against the candidate run's with b."""

    field: str
    a: str
    b: str
    across: bool = False

    def __str__(self) -> str:
        return f"{self.field}={self.a}:{self.b}"


@dataclass
class Comparison:
    """Result of compare_runs / compare_pairs. ``matched`` has one row per pair with the
    identity columns (the candidate's), ``base_*`` / ``cand_*`` columns (µs, bytes),
    ``ratio`` with ``ci_lo`` / ``ci_hi`` (95 % bootstrap), ``p_value``, ``significant``,
    ``verdict``, ``clock_check`` and ``clock_ratio`` (report/clock_verdict.py: the ratio with the
    candidate at the baseline's clock, where a compute-bound pair's clocks differ), ``mem_ratio``,
    ``mem_verdict``, ``dev_ratio`` and ``label``;
    ``only_baseline`` / ``only_candidate`` hold the rows without a partner."""

    matched: pd.DataFrame
    only_baseline: pd.DataFrame
    only_candidate: pd.DataFrame
    threshold: float
    alpha: float
    axis: Optional[Axis] = None
    resampled: list = field(default_factory=list, repr=False)  # per matched row: bootstrap ratios
    base_env: dict = field(default_factory=dict)
    cand_env: dict = field(default_factory=dict)
    baseline_name: str = "baseline"
    candidate_name: str = "candidate"
    pairs: list = field(default_factory=list, repr=False)  # (baseline row, candidate row) per matched row
    cpu_verdict: bool = False  # CPU pairs were given verdicts (--cpu-verdict)

    @property
    def one_run(self) -> bool:
        """Both sides rows of one run (an axis within it): one environment."""
        return self.axis is not None and not self.axis.across

    @property
    def bounds(self) -> tuple[float, float]:
        """The ratios a latency change is called past: ×threshold either way (fmt_change prints a
        figure near one with the decimals that keep it on its side)."""
        return (self.threshold, 1 / self.threshold)

    def counts(self) -> dict[str, int]:
        """Number of matched rows per verdict (all verdicts present, zeros included)."""
        vc = self.matched["verdict"].value_counts()
        return {v: int(vc.get(v, 0)) for v in VERDICT_ORDER}

    @property
    def comparable(self) -> pd.DataFrame:
        """Matched rows ok on both sides."""
        m = self.matched
        return m[(m["base_status"] == Status.OK) & (m["cand_status"] == Status.OK)]

    @property
    def judged(self) -> pd.DataFrame:
        """Matched rows ok on both sides whose figures may carry a verdict (GPU time, or CPU
        time under --cpu-verdict)."""
        m = self.comparable
        return m[~m["verdict"].isin(NO_VERDICT)]

    def geomean(self) -> tuple[float, float, float]:
        """Geometric mean of the ratios of the judged rows (ok on both sides, figures a
        verdict may rest on), with its interval."""
        ok = (
            (self.matched["base_status"] == Status.OK)
            & (self.matched["cand_status"] == Status.OK)
            & ~self.matched["verdict"].isin(NO_VERDICT)
        )
        idx = np.flatnonzero(ok.to_numpy())
        return geometric_mean(
            self.matched["ratio"].to_numpy()[idx], [self.resampled[i] for i in idx] if self.resampled else []
        )


def never_runs(row: dict) -> bool:
    """Whether a skipped row's reason is a rule of the plan its combination breaks, whatever the
    machine (config/validity.py's `check` with `Skip.rule`: a batched backend with
    reduction=experts, layouts that differ, an entry's own `Rule`, ...), rather than something a
    machine lacked (a library, GPUs, CUDA, a plugin), even where this machine lacks it too: such a
    row can never run that way, so a comparison gives it no verdict. The rule must be the reason
    the row recorded."""
    from moebench.config.spec import from_row
    from moebench.config.validity import check

    try:
        skip = check(from_row(row))
    except (KeyError, TypeError, ValueError):  # a row of an older schema or another build's entry
        return False
    return skip is not None and skip.rule and skip.reason == row.get("reason")


def _never_runs_once(row: pd.Series, cache: dict) -> bool:
    """never_runs of a candidate row, decided once per (combo_key, reason): a combination's rows
    share the Combo check judges (a 10,000-row comparison rebuilt one per skipped pair)."""
    key = (row.get("combo_key"), row.get("reason"))
    if key not in cache:
        cache[key] = never_runs(row.to_dict())
    return cache[key]


def latency_verdict(
    base: dict, cand: dict, threshold: float, alpha: float = 0.05, min_samples: int = MIN_SAMPLES
) -> tuple[Verdict, float, float]:
    """(verdict, ratio, p_value) for one matched pair of rows (dicts of row values)."""
    ratio = cand["latency_us_median"] / base["latency_us_median"] if base["latency_us_median"] else float("nan")
    b_ok, c_ok = base["status"] == Status.OK, cand["status"] == Status.OK
    if not (b_ok and c_ok):
        if b_ok:
            verdict = Verdict.SKIPPED if cand["status"] == Status.SKIPPED else Verdict.BROKEN
        else:
            verdict = Verdict.FIXED if c_ok else Verdict.NEITHER_OK
        return verdict, float("nan"), float("nan")
    bs, cs = samples_of(base["samples_us"]), samples_of(cand["samples_us"])
    p = mann_whitney_p(bs, cs) if min(len(bs), len(cs)) >= min_samples else float("nan")
    significant = not (p >= alpha)  # NaN (too few samples) defers to the intervals
    if not np.isfinite(ratio):
        return Verdict.SIMILAR, ratio, p
    if ratio >= threshold and cand["latency_us_p20"] > base["latency_us_p80"] and significant:
        return Verdict.SLOWER, ratio, p
    if ratio <= 1.0 / threshold and cand["latency_us_p80"] < base["latency_us_p20"] and significant:
        return Verdict.FASTER, ratio, p
    return Verdict.SIMILAR, ratio, p


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


def prepared_rows(df: pd.DataFrame) -> pd.DataFrame:
    """`df`'s rows (as load_run returns them: one per combo_key and tokens_per_rank), every
    shown column present."""
    df = df.copy()
    for col in SHOWN_COLUMNS + SIDE_COLUMNS + ["knobs"]:
        if col not in df.columns:
            df[col] = "" if col == "knobs" else None
    for col in MEMORY_COLUMNS + PHASE_COLUMNS + HOST_COLUMNS + ["analytic_peak_bytes"]:
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    return df.reset_index(drop=True)


def run_keys(df: pd.DataFrame) -> pd.Series:
    """combo_key and tokens as one text key per row (how two runs' rows meet)."""
    return df["combo_key"].astype(str) + "\x1f" + df["tokens_per_rank"].map(fmt_value)


def _workspace(row: dict, side: str) -> float:
    """Allocator peak if measured, else the analytic workspace (bytes)."""
    peak = row[f"{side}_workspace_bytes_peak"]
    return peak if np.isfinite(peak) else row[f"{side}_workspace_bytes_analytic"]


def basis_verdict(verdict: Verdict, base: dict, cand: dict, cpu_verdict: bool = False) -> tuple[Verdict, str]:
    """(verdict, why): a pair ok on both sides whose figures are not both GPU time gets
    "host" (a side is host time) or "cpu" (CPU rows, unless ``cpu_verdict``) instead of its
    latency verdict; other pairs keep it. ``base`` / ``cand``: row values (device included)."""
    if verdict not in (Verdict.SLOWER, Verdict.FASTER, Verdict.SIMILAR):
        return verdict, ""
    from moebench.report.time_basis import CPU, HOST, figure_basis

    (bb, bw), (cb, cw) = figure_basis(base), figure_basis(cand)
    if HOST in (bb, cb):
        return Verdict.HOST, bw if bb == HOST else cw
    if CPU in (bb, cb) and not cpu_verdict:
        return Verdict.CPU, bw if bb == CPU else cw
    return verdict, ""


def compare_pairs(
    base: pd.DataFrame,
    cand: pd.DataFrame,
    base_keys: pd.Series,
    cand_keys: pd.Series,
    threshold: float = 1.05,
    alpha: float = 0.05,
    min_samples: int = MIN_SAMPLES,
    shown: str = "cand",
    axis: Optional[Axis] = None,
    cpu_verdict: bool = False,
) -> Comparison:
    """Pair each candidate row with every baseline row of the same key (keys: one text per
    row, aligned with the frames' rows; two runs' keys are unique per side, an axis's may
    not be) and give each pair a verdict (module doc). ``shown`` names the side whose identity
    columns the matched rows show."""
    if not threshold >= 1.0:
        raise ValueError(f"threshold must be a factor >= 1 (e.g. 1.05 for 5%), got {threshold}")
    base, cand = base.reset_index(drop=True), cand.reset_index(drop=True)
    bk, ck = pd.Series(base_keys).reset_index(drop=True), pd.Series(cand_keys).reset_index(drop=True)
    by_key: dict = {}
    for i, k in enumerate(bk):
        by_key.setdefault(k, []).append(i)
    pairs = [(i, j) for j, k in enumerate(ck) for i in by_key.get(k, ())]
    bi = [p[0] for p in pairs]
    ci = [p[1] for p in pairs]
    ident = (cand if shown == "cand" else base).iloc[ci if shown == "cand" else bi]
    ident = ident[SHOWN_COLUMNS + ["knobs", "combo_key"]].reset_index(drop=True)
    b = base.iloc[bi][SIDE_COLUMNS].reset_index(drop=True).add_prefix("base_")
    c = cand.iloc[ci][SIDE_COLUMNS].reset_index(drop=True).add_prefix("cand_")
    matched = pd.concat([ident, c, b], axis=1)
    # compute-bound or not, per candidate row: only where a clock may need normalising
    clocked = CLOCK_COLUMN in cand.columns and pd.to_numeric(cand[CLOCK_COLUMN], errors="coerce").notna().any()
    bound_of = bounds(cand) if clocked else []
    judge = lambda b, c: latency_verdict(b, c, threshold, alpha, min_samples)[0]
    out, resampled = [], []
    never: dict = {}  # (combo_key, reason) -> never_runs: one Combo and check per combination
    for n, row in enumerate(records(matched)):
        side = {s: {k: row[f"{s}_{k}"] for k in SIDE_COLUMNS} for s in ("base", "cand")}
        v, r, p = latency_verdict(side["base"], side["cand"], threshold, alpha, min_samples)
        if v == Verdict.SKIPPED and _never_runs_once(cand.iloc[ci[n]], never):
            v = Verdict.CANNOT_RUN
        where = {k: row.get(k) for k in (*PLACE_COLUMNS, "tokens_per_rank")}
        v, why = basis_verdict(v, {**side["base"], **where}, {**side["cand"], **where}, cpu_verdict)
        bound = bound_of[ci[n]] if bound_of else (False, "")
        v, clock_why, clock_check, clock_ratio = clock_verdict(v, side["base"], side["cand"], threshold, judge, bound)
        why = why or clock_why
        boot = (
            bootstrap_ratios(side["base"]["samples_us"], side["cand"]["samples_us"]) if np.isfinite(r) else np.empty(0)
        )
        lo, hi = interval(boot)
        sig = bool(np.isfinite(r) and not (p >= alpha) and np.isfinite(lo) and (lo > 1.0 or hi < 1.0))
        if v in (Verdict.SLOWER, Verdict.FASTER):
            sig = True
        if v in NO_VERDICT:
            sig = False
        mv, mr = memory_verdict(_workspace(row, "base"), _workspace(row, "cand"), threshold)
        db, dc = row["base_device_bytes_peak"], row["cand_device_bytes_peak"]
        dr = dc / db if np.isfinite(db) and np.isfinite(dc) and db > 0 else float("nan")
        out.append(
            dict(
                ratio=r,
                ci_lo=lo,
                ci_hi=hi,
                p_value=p,
                significant=sig,
                verdict=v,
                no_verdict_why=why,
                clock_check=clock_check,
                clock_ratio=clock_ratio,
                mem_ratio=mr,
                mem_verdict=mv,
                dev_ratio=dr,
            )
        )
        resampled.append(boot)
    stats = pd.DataFrame(
        out,
        columns=[
            "ratio",
            "ci_lo",
            "ci_hi",
            "p_value",
            "significant",
            "verdict",
            "no_verdict_why",
            "clock_check",
            "clock_ratio",
            "mem_ratio",
            "mem_verdict",
            "dev_ratio",
        ],
    )
    matched = pd.concat([matched, stats], axis=1)
    matched["label"] = combo_labels(matched).values if len(matched) else []
    only_b = base[~bk.isin(set(ck))].reset_index(drop=True)
    only_c = cand[~ck.isin(set(bk))].reset_index(drop=True)
    return Comparison(matched, only_b, only_c, threshold, alpha, axis, resampled, pairs=pairs, cpu_verdict=cpu_verdict)


def compare_runs(
    baseline: pd.DataFrame,
    candidate: pd.DataFrame,
    threshold: float = 1.05,
    alpha: float = 0.05,
    min_samples: int = MIN_SAMPLES,
    cpu_verdict: bool = False,
) -> Comparison:
    """Match candidate rows to baseline rows on (combo_key, tokens) and give each pair a
    verdict (module doc). Both frames are as ``load_run`` returns them (µs, bytes)."""
    base, cand = prepared_rows(baseline), prepared_rows(candidate)
    return compare_pairs(
        base, cand, run_keys(base), run_keys(cand), threshold, alpha, min_samples, cpu_verdict=cpu_verdict
    )
