"""The fastest correct combination per token count of a results run."""
from __future__ import annotations

import pandas as pd

# what must match for two rows to compete (everything but the four axes being ranked)
GROUP = ["model", "quant", "world_size", "simulate_ep", "routing", "timing_mode", "device", "tokens_per_rank"]
SHOW = ["backend", "experts", "reduction", "overlap", "latency_us_median", "latency_us_p20", "latency_us_p80"]


def best_per_size(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, quant, world size, tokens): the `ok` combination with
    the lowest median latency, the runner-up's median and the margin (runner-up /
    best). A margin inside the p20-p80 band is not a real win."""
    ok = df[df["status"] == "ok"].sort_values("latency_us_median")
    if ok.empty:
        raise ValueError("no ok rows in this run: nothing to rank")
    group = [c for c in GROUP if c in ok.columns]
    rows = []
    for key, g in ok.groupby(group, sort=True, dropna=False):
        first = g.iloc[0]
        row = dict(zip(group, key)) | {k: first[k] for k in SHOW}
        row["runner_up_us"] = g.iloc[1]["latency_us_median"] if len(g) > 1 else float("nan")
        row["margin"] = row["runner_up_us"] / first["latency_us_median"]
        row["clear_win"] = bool(len(g) > 1 and g.iloc[1]["latency_us_p20"] > first["latency_us_p80"])
        row["candidates"] = len(g)
        rows.append(row)
    return pd.DataFrame(rows)
