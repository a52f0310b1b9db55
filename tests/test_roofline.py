"""The roofline floor of a row (docs/design.md) and its report table."""
from __future__ import annotations

import pandas as pd
import pytest

from moebench.report.roofline import add_floor
from moebench.report.tables import roofline_table


def row(**kw):
    base = dict(combo_key="k", timestamp="2026-11-30T00:00:00", status="ok", device="cuda", backend="local", experts="triton", reduction="experts", overlap="none",
                quant="bf16", model="m", world_size=1, tokens_per_rank=16, latency_us_median=500.0,
                experts_us=400.0, expert_bytes=1.2e9, expert_flops=7.79e10, tflops=1.0, hbm_gbps=3000.0)
    return base | kw


def test_floor_is_the_larger_of_bytes_and_flops():
    df = add_floor(pd.DataFrame([row(), row(expert_bytes=1e6, expert_flops=7.79e11, quant="bf16"),
                                 row(expert_bytes=1e6, expert_flops=1.407e12, quant="fp8_block")]))
    # 1.2 GB / 4.0 TB/s = 300 µs vs 7.79e10 / 779 TFLOP/s = 100 µs -> memory bound, 75 % of floor at 400 µs
    assert df.loc[0, "floor_us"] == pytest.approx(300.0) and df.loc[0, "bound"] == "memory"
    assert df.loc[0, "experts_pct_of_floor"] == pytest.approx(75.0)
    assert df.loc[1, "floor_us"] == pytest.approx(1000.0) and df.loc[1, "bound"] == "compute"
    assert df.loc[2, "floor_us"] == pytest.approx(1000.0)  # fp8 peak is 1407 TFLOP/s


def test_roofline_table_lists_gpu_rows_only():
    text = roofline_table(pd.DataFrame([row(), row(device="cpu", combo_key="c", tokens_per_rank=64)]))
    assert "75 %" in text and "memory" in text
    assert "| 75 % | 60 % |" in text  # floor 300 µs over the 500 µs layer: the layer's lower bound
    assert text.count("\n| m |") == 1 and "All rows: backend=local" in text  # constant columns: the caption
    assert "No GPU rows" in roofline_table(pd.DataFrame([row(device="cpu")]))
