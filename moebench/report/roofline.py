"""Roofline floor of a row (docs/design.md): the experts' fewest bytes over the
measured copy bandwidth, or their FLOPs over the measured GEMM peak, whichever
is larger. Ceilings default to the figures measured on the H200 machine
(docs/findings/README.md, "Ceilings"); pass your own for another GPU."""
from __future__ import annotations

import pandas as pd

H200_COPY_BYTES_PER_S = 4.0e12  # device-to-device copy, read + write
H200_PEAK_FLOPS = {"bf16": 779e12, "fp8_block": 1407e12, "fp8_tensor": 1407e12}


def add_floor(df: pd.DataFrame, copy_bytes_per_s: float = H200_COPY_BYTES_PER_S, peak_flops: dict = H200_PEAK_FLOPS) -> pd.DataFrame:
    """Adds `hbm_floor_us`, `flop_floor_us`, `floor_us`, `bound` and `experts_pct_of_floor`
    (floor / experts_us * 100: 100 means the experts phase runs at the floor)."""
    out = df.copy()
    out["hbm_floor_us"] = out["expert_bytes"] / copy_bytes_per_s * 1e6
    out["flop_floor_us"] = out["expert_flops"] / out["quant"].map(peak_flops) * 1e6
    out["floor_us"] = out[["hbm_floor_us", "flop_floor_us"]].max(axis=1)
    out["bound"] = (out["hbm_floor_us"] >= out["flop_floor_us"]).map({True: "memory", False: "compute"})
    out["experts_pct_of_floor"] = out["floor_us"] / out["experts_us"] * 100
    return out
