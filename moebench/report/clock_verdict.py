"""A comparison never credits a change with what the GPU's clock did (docs/design.md, "Reports,
comparisons and tuning": clock in the verdict).

Each side's median SM clock (`sm_clock_mhz_median`, measure/clock.py) is compared first. Where
the two differ by more than CLOCK_TOLERANCE (2 %) or a third of the threshold's margin,
whichever is smaller, the pair's verdict is `clock differs` (Verdict.CLOCK), listed apart like
host-time pairs, unless the row is compute-bound and its verdict is the same once the
candidate's latency is scaled by the clocks' ratio (a compute-bound kernel's time goes as
1 / clock; a memory-bound one's does not, so no scaling is claimed for it). Compute-bound: the
roofline's arithmetic intensity (expert FLOPs over expert bytes) above the ridge of the row's
GPU ceilings (GEMM peak over copy bandwidth, report/roofline.py). A side without a clock
(rows from before the column, the CPU) keeps today's verdict, with the note "clock not recorded".
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from moebench.report.columns import ROOFLINE_COLUMNS
from moebench.report.fmt import fmt_change
from moebench.report.roofline import add_floor
from moebench.results import row as schema
from moebench.results.row import Verdict

CLOCK_TOLERANCE = 0.02  # sides whose median clocks differ by more than this get no plain verdict
CLOCK_COLUMN = "sm_clock_mhz_median"
NOT_RECORDED = "clock not recorded"
# the latency figures scaled by the clocks' ratio when a compute-bound pair is normalised
_SCALED = schema.names(group="latency", dtype="float")  # median, p20, p80
MEDIAN = "latency_us_median"


def clock_tolerance(threshold: float) -> float:
    """The clocks' relative difference a pair may carry and keep its verdict: 2 %, or a third
    of the threshold's margin where that is smaller (×1.05: 1.67 %)."""
    return min(CLOCK_TOLERANCE, (threshold - 1.0) / 3.0)


def _mhz(x) -> float:
    """A side's median clock (MHz) as a float; NaN where it is missing or not positive."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return float("nan")
    return v if v > 0 else float("nan")


def bounds(df: pd.DataFrame) -> list[tuple[bool, str]]:
    """Per row of `df` (a run's rows): (compute-bound, why), from the roofline (module doc)."""
    if not len(df) or "gpu" not in df.columns or "quant" not in df.columns:
        return [(False, "no roofline inputs: not treated as compute-bound")] * len(df)
    rows = df.copy()
    for c in ROOFLINE_COLUMNS:  # experts_us, expert_flops, expert_bytes
        rows[c] = pd.to_numeric(rows[c], errors="coerce").astype(float) if c in rows.columns else np.nan
    floor = add_floor(rows)
    out = []
    for (_, r), (_, f) in zip(rows.iterrows(), floor.iterrows(), strict=True):
        if not f["bound"]:
            out.append((False, "no ceiling measured for its GPU: not treated as compute-bound"))
            continue
        ai = r["expert_flops"] / r["expert_bytes"]
        ridge = f["hbm_floor_us"] / f["flop_floor_us"] * ai  # peak FLOP/s over copy bytes/s
        word = "compute" if f["bound"] == "compute" else "memory"
        out.append(
            (word == "compute", f"{word}-bound: {ai:.0f} FLOP/B against the ridge {ridge:.0f} ({f['ceilings_file']})")
        )
    return out


def clock_verdict(
    verdict: Verdict,
    base: dict,
    cand: dict,
    threshold: float,
    judge: Callable[[dict, dict], Verdict],
    bound: tuple[bool, str] = (False, ""),
) -> tuple[Verdict, str, str, float]:
    """(verdict, why it is none, note, the clock-scaled ratio) for a pair already given `verdict`:
    Verdict.CLOCK where the clocks differ past clock_tolerance and the change does not survive
    normalising (module doc); `judge(base, cand)` re-judges the normalised pair. The note says what
    was done: the clocks matched, a side's clock not recorded, or the verdict survived normalising.
    The scaled ratio (the candidate's median at the baseline's clock over the baseline's) is NaN
    unless the pair was normalised: clocks apart and compute-bound; the note or the reason gives it."""
    nan = float("nan")
    if verdict not in (Verdict.SLOWER, Verdict.FASTER, Verdict.SIMILAR):
        return verdict, "", "", nan
    cb, cc = _mhz(base.get(CLOCK_COLUMN)), _mhz(cand.get(CLOCK_COLUMN))
    if not (np.isfinite(cb) and np.isfinite(cc)):
        return verdict, "", NOT_RECORDED, nan
    ratio = cc / cb
    tol = clock_tolerance(threshold)
    clocks = f"median SM clock {cb:.0f} → {cc:.0f} MHz (×{ratio:.3f})"
    if abs(ratio - 1.0) <= tol:
        return verdict, "", f"clocks matched: {clocks}", nan
    compute, why_bound = bound
    scaled_ratio = nan
    if compute:
        scaled = dict(cand)
        for k in _SCALED:
            scaled[k] = float(cand[k]) * ratio  # the candidate at the baseline's clock
        samples = cand.get("samples_us")
        if samples is not None and len(samples):
            scaled["samples_us"] = [float(x) * ratio for x in samples]
        scaled_ratio = scaled[MEDIAN] / float(base[MEDIAN])  # (NaN where a median is)
        at = f"{fmt_change(scaled_ratio)} at the baseline's clock" if np.isfinite(scaled_ratio) else ""
        if judge(base, scaled) == verdict:
            note = f"{clocks}, beyond {tol:.1%}; the verdict survives normalising" + (f": {at}" if at else "")
            return verdict, "", f"{note} ({why_bound})", scaled_ratio
    why = f"{clocks}, beyond {tol:.1%}" + (
        f"; normalised by the clocks{f' ({at})' if at else ''} the verdict changes ({why_bound})"
        if compute
        else f"; not normalised ({why_bound or 'not compute-bound'})"
    )
    return Verdict.CLOCK, why, "", scaled_ratio
