"""`moebench compare` names the pairs whose sides ran different row layouts, GEMM kernels or tuned
files (`ran-differs`, with each column's two values), so a PR's reader sees what the layer ran, not
only how fast; rows without the columns (older runs) and pairs that ran the same say nothing."""

from __future__ import annotations

import numpy as np
import pandas as pd

from moebench import cli
from moebench.report.flags import pair_ran_text
from moebench.results.synthetic import make_row, write_run

TILES = "$MOEBENCH_TRITON_CONFIG_DIR/E=8,N=128,device_name=NVIDIA_H100_80GB_HBM3.json"


def _rows(gemm: str, tuned: str) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    out = []
    for tokens, layout in ((64, "gathered"), (4096, "contiguous")):
        row = make_row(
            "local",
            "triton",
            "experts",
            "none",
            "fp8_block",
            tokens,
            device="cuda",
            samples_us=100.0 * np.exp(rng.normal(0, 0.01, 30)),
            host_paced_samples=0.0,
        )
        row.update(
            row_layout_used=layout, contiguous_gemm_used=gemm if layout == "contiguous" else "", tuned_files=tuned
        )
        out.append(row)
    return pd.DataFrame(out)


def test_a_pair_that_ran_another_kernel_and_tuned_file_is_named_with_both_values(tmp_path, capsys):
    base = write_run(tmp_path / "before", _rows("gluon/gluon", ""))
    cand = write_run(tmp_path / "after", _rows("gluon_wide/gluon_wide", TILES))
    cli.main(["compare", str(base), str(cand), "--out", str(tmp_path / "r")])
    capsys.readouterr()
    text = (tmp_path / "r" / "report.md").read_text()
    line = next(x for x in text.partition("## Data quality")[2].splitlines() if "ran different" in x)
    assert line.startswith("- 2 rows the two sides ran different row layouts, GEMM kernels or tuned files")
    assert "contiguous_gemm_used `gluon/gluon` → `gluon_wide/gluon_wide`" in line
    assert line.count("tuned_files none → ") == 2
    assert text.partition("## Latency")[2].partition("\n## ")[0].count("ran-differs") == 2  # the rows' flags


def test_the_same_run_or_an_older_one_says_nothing():
    row = {"row_layout_used": "contiguous", "contiguous_gemm_used": "gluon/gluon", "tuned_files": ""}
    assert pair_ran_text(row, dict(row)) == ""
    assert pair_ran_text(row, {"row_layout_used": "contiguous"}) == ""  # a side without the columns
    assert pair_ran_text({**row, "tuned_files": None}, {**row, "tuned_files": float("nan")}) == ""
    assert pair_ran_text(row, {**row, "row_layout_used": "gathered", "contiguous_gemm_used": ""}) == (
        "row_layout_used `contiguous` → `gathered`; contiguous_gemm_used `gluon/gluon` → none"
    )
