"""The report's clock lines (report/clock_report.py, report/flags.py's `throttled`): each GPU
row's clock band in the details, throttled rows named with their counts, and one note where a
run's GPU rows recorded no clock or NVML."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from moebench.report.clock_report import clock_notes, clock_table
from moebench.report.document import write_report
from moebench.report.flags import flags_of, throttled_text
from moebench.results.synthetic import make_row, write_run

REPO = Path(__file__).resolve().parents[2]
CLOCKED = dict(
    sm_clock_mhz_min=1515.0,
    sm_clock_mhz_median=1900.0,
    sm_clock_mhz_max=1965.0,
    throttled_samples=3.0,
    gpu_power_w_median=690.0,
    gpu_power_limit_w=700.0,
    gpu_temp_c_max=71.0,
    mem_clock_mhz_median=3201.0,
    nvml_polls=12.0,
    clock_reasons="sw_power_cap",
)


def _row(tokens: int, **extra) -> dict:
    samples = np.full(30, 100.0 + tokens)
    return make_row(
        "local", "triton", "finalize", "none", "bf16", tokens, samples_us=samples, gpu="NVIDIA H200", **extra
    )


def test_a_throttled_row_is_flagged_and_named_with_its_count_band_and_reasons():
    row = _row(256, **CLOCKED)
    assert "throttled" in flags_of(row)
    assert throttled_text(row) == "3 of 30 samples throttled (SM 1515–1900–1965 MHz; sw_power_cap)"
    assert "throttled" not in flags_of(_row(256, **{**CLOCKED, "throttled_samples": 0.0}))


def test_the_report_shows_each_rows_clock_band_and_names_throttled_rows(tmp_path):
    run = write_run(tmp_path / "run", pd.DataFrame([_row(64, **CLOCKED), _row(256, **CLOCKED)]))
    text = write_report(run).read_text()
    assert "SM clock and GPU state" in text and "1515–1900–1965" in text and "690 / 700" in text
    quality = text.partition("<summary>Data quality</summary>")[2].partition("</details>")[0]
    assert "2 rows with throttled samples" in quality and "3 of 30 samples throttled" in quality
    assert "clock not recorded" not in text


def test_rows_without_clock_columns_get_one_note_and_no_table():
    old = pd.DataFrame([_row(64), _row(256)])  # a GPU run from before the columns
    notes = clock_notes(old)
    assert len(notes) == 1 and notes[0].startswith("clock not recorded in every GPU row / no NVML in every GPU row")
    assert clock_table(old) == ""
    # NVML absent but the clock read: the note says which, with the recorded why
    part = pd.DataFrame([_row(64, sm_clock_mhz_median=1900.0, clock_note="no NVML (nvidia-ml-py is not installed)")])
    (note,) = clock_notes(part)
    assert note.startswith("no NVML in every GPU row (no NVML (nvidia-ml-py is not installed))")
    # a CPU run or synthetic rows that name no GPU: nothing to say
    assert clock_notes(pd.DataFrame([{**_row(64), "gpu": "cpu"}])) == []


def test_a_rows_flop_floor_uses_the_peak_scaled_to_its_clock(tmp_path):
    import json

    from moebench.report.roofline import add_floor, ceilings_caption

    doc = json.loads((REPO / "results/ceilings/nvidia-h200/ceilings.json").read_text())
    doc["ceilings"]["sm_clock_mhz"] = {"copy": 1980.0, "bf16": 1800.0, "fp8": 1700.0}
    (tmp_path / "nvidia-h200").mkdir()
    (tmp_path / "nvidia-h200" / "ceilings.json").write_text(json.dumps(doc))
    compute = dict(expert_flops=1e12, expert_bytes=1e9, experts_us=2000.0)
    df = pd.DataFrame([_row(256, **compute, sm_clock_mhz_median=900.0), _row(512, **compute)])
    out = add_floor(df, tmp_path).set_index("tokens_per_rank")
    # at half the peak's clock the FLOP floor doubles; a row without a clock keeps the peak's
    assert out.loc[256, "flop_clock_scale"] == 0.5 and out.loc[512, "flop_clock_scale"] == 1.0
    assert out.loc[256, "flop_floor_us"] == pytest.approx(2 * out.loc[512, "flop_floor_us"])
    assert "ran at 1800 / 1700 MHz" in ceilings_caption(df, tmp_path)
