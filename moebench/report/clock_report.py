"""What a report says of the GPU's clock and state over each row's samples (results/row.py,
group "clock"; measure/clock.py, measure/nvml.py): the rows' clock band table and one note where
the clock or NVML was not recorded. The throttled rows are named with their counts by
report/flags.py (its `throttled` flag and throttled_text, counted as the host-paced ones are)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from moebench.report.columns import combo_labels, fmt_value
from moebench.report.flags import clock_band, float_of
from moebench.report.table import md_table, md_text
from moebench.results.row import Status


def _gpu_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The ok rows that ran on a GPU (device cuda and a GPU named: synthetic rows name none)."""
    ok = df[df["status"] == Status.OK] if "status" in df.columns else df
    if "device" not in ok.columns:
        return ok[:0]
    gpu = ok["gpu"].astype(str).str.lower() if "gpu" in ok.columns else pd.Series("", index=ok.index)
    return ok[(ok["device"].astype(str) == "cuda") & ~gpu.isin(["cpu", "", "nan", "none"])]


def clock_notes(df: pd.DataFrame) -> list[str]:
    """One note where the run's GPU rows lack their clock or NVML columns (all or some of them),
    with the recorded why (`clock_note`: no probe, no NVML); none for a CPU run."""
    gpu = _gpu_rows(df)
    if not len(gpu):
        return []
    parts = []
    for col, what in (("sm_clock_mhz_median", "clock not recorded"), ("nvml_polls", "no NVML")):
        has = pd.to_numeric(gpu.get(col, pd.Series(np.nan, index=gpu.index)), errors="coerce").notna()
        if not has.all():
            parts.append(
                f"{what} in {'every GPU row' if not has.any() else f'{int((~has).sum())} of {len(gpu)} GPU rows'}"
            )
    if not parts:
        return []
    why = sorted({str(x) for x in gpu.get("clock_note", pd.Series(dtype=object)).dropna() if str(x)})
    because = f" ({md_text('; '.join(why))})" if why else " (rows from before the clock columns)"
    return [
        " / ".join(parts) + because + ": the SM clock, power and throttle reasons of those samples are unknown; "
        "compare gives them today's verdict"
    ]


def clock_table(df: pd.DataFrame) -> str:
    """Each GPU row's clock band (min–median–max SM MHz of its samples), throttled samples,
    power (median / limit W), peak temperature, memory clock and NVML's reasons; '' where no
    GPU row recorded any of them."""
    gpu = _gpu_rows(df)
    has = [
        pd.to_numeric(gpu.get(c, pd.Series(np.nan, index=gpu.index)), errors="coerce").notna()
        for c in ("sm_clock_mhz_median", "nvml_polls")
    ]
    gpu = gpu[has[0] | has[1]] if len(gpu) else gpu
    if not len(gpu):
        return ""
    names = [
        md_text(f"{lab} · {fmt_value(t)} tok") for lab, t in zip(combo_labels(gpu), gpu["tokens_per_rank"], strict=True)
    ]
    rows = []
    for name, r in zip(names, gpu.to_dict("records"), strict=True):
        n, p, lim = (
            float_of(r, "throttled_samples"),
            float_of(r, "gpu_power_w_median"),
            float_of(r, "gpu_power_limit_w"),
        )
        temp, mem = float_of(r, "gpu_temp_c_max"), float_of(r, "mem_clock_mhz_median")
        rows.append(
            [
                name,
                clock_band(r) or "-",
                f"{int(n)}" if np.isfinite(n) else "-",
                f"{p:.0f} / {lim:.0f}" if np.isfinite(p) else "-",
                f"{temp:.0f}" if np.isfinite(temp) else "-",
                f"{mem:.0f}" if np.isfinite(mem) else "-",
                md_text(str(r.get("clock_reasons") or "")) or "-",
            ]
        )
    table = md_table(
        ["row", "SM MHz min–median–max", "throttled", "power W (median / limit)", "max °C", "mem MHz", "NVML reasons"],
        rows,
        ["l", "r", "r", "r", "r", "r", "l"],
    )
    return (
        f"{table}\n\nThe SM clock each sample ran at, read in the stream before and after it (globaltimer and "
        "clock64, nvbench's method); a sample is throttled below 0.9 × its row's median clock or while NVML "
        "reported a thermal, power or sync-boost reason; NVML's figures are polled every runner.nvml_poll_ms "
        "over the samples."
    )
