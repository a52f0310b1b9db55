"""The ablation's overlap_fraction interval (rows.overlap_interval): a 90 % bootstrap over
sample indices that keeps each interleaved (layer, layer without shared experts, shared
experts alone) triplet together, its place in every row, and how reports show it (or
render older rows without it)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from moebench.report import load_run, overlap_table, write_report
from moebench.report.fmt import fmt_frac_interval
from moebench.results import rows
from moebench.results.rank_result import RankResult
from moebench.results.synthetic import make_row, write_run
from moebench.run import plan

SHARED_US = 550.0  # the deepseek_v3 shared expert on an H200 at 4096 tokens
LAYER_US = 10000.0
TRUE_OVERLAP = 0.3  # the shared experts add 0.7 * SHARED_US to the layer


def _triplets(n=30, noise=0.001, drift=0.0, seed=0):
    """Interleaved samples (µs): layer, layer without shared experts, shared experts alone.

    ``noise`` is each sample's own relative noise; ``drift`` a relative swing (clocks,
    other tenants) that moves the three samples of one index alike."""
    rng = np.random.default_rng(seed)
    swing = 1.0 + drift * np.sin(np.arange(n) / 2.0)
    no_shared = LAYER_US * swing * (1 + noise * rng.normal(size=n))
    layer = LAYER_US * swing * (1 + noise * rng.normal(size=n)) + (1 - TRUE_OVERLAP) * SHARED_US * swing
    shared = SHARED_US * swing * (1 + noise * rng.normal(size=n))
    return layer.tolist(), no_shared.tolist(), shared.tolist()


def _combo():
    combos, _ = plan.plan(["backend=naive", "experts=torch", "model=tiny", "overlap=combine", "runner.device=cpu"])
    return combos[0]


def _row(layer, no_shared, shared, num_ranks=2):
    base = {
        "status": "ok",
        "rel_err": 1e-3,
        "samples_us": layer,
        "no_shared_samples_us": no_shared,
        "shared_samples_us": shared,
    }
    return rows.measured_row(_combo(), 8, [RankResult(rank=r, **base) for r in range(num_ranks)], {})


def test_interval_brackets_the_figure_and_is_deterministic():
    row = _row(*_triplets(noise=0.01))
    lo, frac, hi = row["overlap_fraction_lo"], row["overlap_fraction"], row["overlap_fraction_hi"]
    assert 0.0 <= lo < frac < hi <= 1.0, (lo, frac, hi)
    assert lo <= TRUE_OVERLAP <= hi
    again = _row(*_triplets(noise=0.01))  # a fixed seed: the same row twice
    assert (again["overlap_fraction_lo"], again["overlap_fraction_hi"]) == (lo, hi)
    assert rows.overlap_interval(*_triplets(noise=0.01)) == (lo, hi)


def test_interval_is_narrow_for_quiet_samples_and_wide_for_noisy_ones():
    lo, hi = rows.overlap_interval(*_triplets(noise=0.0005))
    assert hi - lo < 0.05, (lo, hi)
    lo, hi = rows.overlap_interval(*_triplets(noise=0.03))  # 300 µs of noise on a 10 ms layer
    assert hi - lo > 0.2, (lo, hi)
    assert lo <= TRUE_OVERLAP <= hi


def test_drift_that_moves_whole_triplets_does_not_widen_the_interval():
    """A ±5 % swing (±500 µs, about the shared experts' time) shared by the three samples of
    an index cancels when an index keeps its triplet; resampling each series on its own
    would read it as noise and give a wide interval."""
    layer, no_shared, shared = _triplets(noise=0.0005, drift=0.05)
    lo, hi = rows.overlap_interval(layer, no_shared, shared)
    assert hi - lo < 0.1 and lo <= TRUE_OVERLAP <= hi, (lo, hi)
    # the same samples with their pairing broken: the noise is real now
    shuffled = list(np.random.default_rng(1).permutation(no_shared))
    lo, hi = rows.overlap_interval(layer, shuffled, shared)
    assert hi - lo > 0.3, (lo, hi)


def test_interval_is_nan_without_the_ablation_or_with_few_samples():
    assert {"overlap_fraction_lo", "overlap_fraction_hi"} <= set(rows.empty_measurements())
    no_ablation = rows.measured_row(_combo(), 8, [RankResult(rank=r, samples_us=[10.0] * 8) for r in range(2)], {})
    assert math.isnan(no_ablation["overlap_fraction"])
    assert math.isnan(no_ablation["overlap_fraction_lo"]) and math.isnan(no_ablation["overlap_fraction_hi"])
    few = _row(*(s[: rows.OVERLAP_MIN_SAMPLES - 1] for s in _triplets()))
    assert not math.isnan(few["overlap_fraction"])
    assert math.isnan(few["overlap_fraction_lo"]) and math.isnan(few["overlap_fraction_hi"])
    enough = _row(*(s[: rows.OVERLAP_MIN_SAMPLES] for s in _triplets()))
    assert 0.0 <= enough["overlap_fraction_lo"] <= enough["overlap_fraction_hi"] <= 1.0
    failed = rows.outcome_row(_combo(), 8, "failed", "boom", {})
    assert math.isnan(failed["overlap_fraction_lo"]) and math.isnan(failed["overlap_fraction_hi"])


def test_interval_takes_the_max_over_ranks_per_sample():
    """The point estimate and the interval read the same aggregated samples: a rank that is
    slower without its shared experts sets latency_no_shared_us, and the interval moves with it."""
    layer, no_shared, shared = _triplets(noise=0.001)
    slow = [x + 0.5 * SHARED_US for x in no_shared]  # rank 1 hides more of the shared experts
    base = {"status": "ok", "rel_err": 1e-3, "samples_us": layer, "shared_samples_us": shared}
    row = rows.measured_row(
        _combo(),
        8,
        [
            RankResult(rank=0, **base, no_shared_samples_us=no_shared),
            RankResult(rank=1, **base, no_shared_samples_us=slow),
        ],
        {},
    )
    assert row["overlap_fraction"] == pytest.approx(TRUE_OVERLAP + 0.5, abs=0.02)
    assert row["overlap_fraction_lo"] <= row["overlap_fraction"] <= row["overlap_fraction_hi"]
    assert row["overlap_fraction_lo"] > TRUE_OVERLAP + 0.4


def test_clipped_figures_clip_their_interval():
    layer, no_shared, shared = _triplets(noise=0.001)
    hidden = [x - SHARED_US for x in layer]  # the layer is faster with its shared experts: clipped to 1
    assert rows.overlap_interval(hidden, no_shared, shared) == (1.0, 1.0)
    assert _row(hidden, no_shared, shared)["overlap_fraction"] == 1.0


# --- reports -------------------------------------------------------------------------


def _overlap_row(**kw):
    samples = 100.0 * np.exp(np.random.default_rng(0).normal(0, 0.02, 30))
    # a backend with communication (two ranks): a single-rank one has no overlap panel or table row
    return make_row(
        "naive",
        "torch",
        "experts",
        "dispatch",
        "bf16",
        64,
        samples_us=samples,
        combo_key="ovl",
        world_size=2,
        latency_us_median=110.0,
        shared_us=20.0,
        latency_no_shared_us=104.0,
        shared_exposed_us=6.0,
        overlap_fraction=0.7,
        **kw,
    )


def test_overlap_table_shows_the_interval(tmp_path):
    df, _ = load_run(
        write_run(tmp_path / "r", pd.DataFrame([_overlap_row(overlap_fraction_lo=0.551, overlap_fraction_hi=0.824)]))
    )
    table = overlap_table(df)
    assert "| 6.000 | 70% [55–82] | - |" in table
    assert "bootstrap interval" in table
    assert fmt_frac_interval(0.7, np.nan, np.nan) == "70%" and fmt_frac_interval(np.nan, 0.1, 0.2) == "-"


def test_rows_stored_without_the_interval_still_render(tmp_path):
    """Rows written before the interval existed: no such columns in their parquet files,
    alone or beside newer rows in the same run."""
    old = pd.DataFrame([_overlap_row()]).drop(columns=["overlap_fraction_lo", "overlap_fraction_hi"])
    new = pd.DataFrame([_overlap_row(overlap_fraction_lo=0.6, overlap_fraction_hi=0.8, tokens_per_rank=128)])
    old_run = write_run(tmp_path / "old", old)
    df, _ = load_run(old_run)
    assert df["overlap_fraction_lo"].isna().all() and df["overlap_fraction_hi"].isna().all()
    assert "| 6.000 | 70% | - |" in overlap_table(df)
    assert "70%" in write_report(old_run).read_text()
    (old_run / "rows" / "new.parquet").parent.mkdir(exist_ok=True)
    new.to_parquet(old_run / "rows" / "new.parquet", index=False)
    df, _ = load_run(old_run)
    table = overlap_table(df)
    assert "| 70% | - |" in table and "| 70% [60–80] | - |" in table
    report = write_report(old_run, tmp_path / "out").read_text()
    assert "70% [60–80]" in report  # the folded overlap table
    # the opening: the fraction hidden, where a backend communicates
    assert "- `overlap=dispatch` at 128 tok: hides 70% of the shared experts" in report.partition("## Everything")[0]


@pytest.mark.multiprocess
def test_cpu_run_stores_the_interval(tmp_path):
    """Two gloo ranks, overlap=combine, enough samples: the stored row carries the interval."""
    from moebench.results.store import RunStore
    from moebench.run.sweep import execute

    run_dir, _ = execute(
        [
            "backend=naive",
            "experts=torch",
            "reduction=finalize",
            "overlap=combine",
            "quant=bf16",
            "model=tiny",
            "workload.tokens_per_rank=[8]",
            "runner.reps=8",
            "runner.warmup=1",
            "runner.phase_reps=2",
            "runner.memory=false",
        ],
        None,
        str(tmp_path / "run"),
        quiet=True,
    )
    row = RunStore(run_dir).load().iloc[0]
    assert row["status"] == "ok", row["reason"]
    assert 0.0 <= row["overlap_fraction_lo"] <= row["overlap_fraction_hi"] <= 1.0
    df, _ = load_run(run_dir)
    assert "[" in overlap_table(df)
