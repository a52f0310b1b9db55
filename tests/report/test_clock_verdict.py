"""A comparison never credits a change with the GPU's clock (report/clock_verdict.py): synthetic
pairs whose latencies differ by 8 % exactly as their median SM clocks do read "clock differs"
where compute-bound, and the same 8 % at equal clocks reads "slower"."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from moebench.report.clock_verdict import clock_tolerance
from moebench.report.compare import compare_runs
from moebench.report.verdict import verdict_lines
from moebench.results.row import NO_VERDICT, Verdict
from moebench.results.synthetic import make_row

GPU = "NVIDIA H200"  # results/ceilings/nvidia-h200: bf16 ridge ~163 FLOP/B
COMPUTE = dict(expert_flops=1e12, expert_bytes=1e9)  # 1000 FLOP/B: compute-bound
MEMORY = dict(expert_flops=1e9, expert_bytes=1e9)  # 1 FLOP/B: memory-bound


def _row(tokens: int, median: float, mhz: float | None, bound: dict, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    samples = median * (1 + 0.002 * rng.standard_normal(30))
    extra = {"sm_clock_mhz_median": mhz} if mhz is not None else {}
    return make_row(
        "local", "triton", "finalize", "none", "bf16", tokens, samples_us=samples, gpu=GPU, **bound, **extra
    )


def _compare(base_rows: list[dict], cand_rows: list[dict]):
    return compare_runs(pd.DataFrame(base_rows), pd.DataFrame(cand_rows))


def test_eight_percent_slower_at_an_eight_percent_lower_clock_is_the_clock_where_compute_bound():
    base = [_row(256, 1000.0, 1944.0, COMPUTE, 0)]
    cand = [_row(256, 1080.0, 1800.0, COMPUTE, 1)]  # 1944 / 1800 = 1.08
    r = _compare(base, cand).matched.iloc[0]
    assert r["verdict"] == Verdict.CLOCK and Verdict.CLOCK in NO_VERDICT
    assert "1944 → 1800 MHz" in r["no_verdict_why"] and "compute-bound" in r["no_verdict_why"]


def test_the_same_eight_percent_at_equal_clocks_is_slower():
    base = [_row(256, 1000.0, 1944.0, COMPUTE, 0)]
    cand = [_row(256, 1080.0, 1944.0, COMPUTE, 1)]
    r = _compare(base, cand).matched.iloc[0]
    assert r["verdict"] == Verdict.SLOWER and r["clock_check"].startswith("clocks matched")


def test_a_change_that_survives_normalising_keeps_its_verdict_and_a_memory_bound_one_does_not():
    base = [_row(256, 1000.0, 1944.0, COMPUTE, 0), _row(1024, 1000.0, 1944.0, MEMORY, 2)]
    # 20 % slower at an 8 % lower clock: 1.2 / 1.08 = 1.11 at equal clocks, still slower
    cand = [_row(256, 1200.0, 1800.0, COMPUTE, 1), _row(1024, 1200.0, 1800.0, MEMORY, 3)]
    m = _compare(base, cand).matched.set_index("tokens_per_rank")
    assert m.loc[256, "verdict"] == Verdict.SLOWER and "survives normalising" in m.loc[256, "clock_check"]
    # memory-bound: its time does not go as 1 / clock, so nothing is normalised
    assert m.loc[1024, "verdict"] == Verdict.CLOCK and "memory-bound" in m.loc[1024, "no_verdict_why"]


def test_a_side_without_clock_columns_keeps_todays_verdict_and_says_so():
    base = [_row(256, 1000.0, None, COMPUTE, 0)]  # an older run: no clock recorded
    cand = [_row(256, 1080.0, 1800.0, COMPUTE, 1)]
    cmp = _compare(base, cand)
    r = cmp.matched.iloc[0]
    assert r["verdict"] == Verdict.SLOWER and r["clock_check"] == "clock not recorded"
    lines = verdict_lines(cmp, 1, [])
    assert sum("clock not recorded" in x for x in lines) == 1
    assert "- clocks: clock not recorded in 1 row (no SM clock on a side: verdicts as before clocks were read)" in lines


def test_clocks_missing_in_some_pairs_read_as_in_all_of_them():
    """'clock not recorded in 4' beside the full sentence where every pair lacked one: one wording, counted."""
    base = [_row(256, 1000.0, 1944.0, COMPUTE, 0), _row(1024, 1000.0, None, COMPUTE, 2)]
    base += [_row(4096, 1000.0, None, COMPUTE, 4)]
    cand = [_row(t, 1000.0, 1944.0, COMPUTE, i) for i, t in ((1, 256), (3, 1024), (5, 4096))]
    (line,) = [x for x in verdict_lines(_compare(base, cand), 0, []) if x.startswith("- clocks")]
    assert line == (
        "- clocks (median SM clock of each side): matched in 1 row, clock not recorded in 2 rows "
        "(no SM clock on a side: verdicts as before clocks were read)"
    ), line
    (line,) = [x for x in verdict_lines(_compare(base[1:], cand[1:]), 0, []) if x.startswith("- clocks")]
    assert line == "- clocks: clock not recorded in 2 rows (no SM clock on a side: verdicts as before clocks were read)"


def test_the_verdict_lists_clock_pairs_apart_and_says_whether_the_clocks_matched():
    base = [_row(256, 1000.0, 1944.0, COMPUTE, 0), _row(1024, 1000.0, 1944.0, COMPUTE, 2)]
    cand = [_row(256, 1080.0, 1800.0, COMPUTE, 1), _row(1024, 1000.0, 1950.0, COMPUTE, 3)]
    cmp = _compare(base, cand)
    lines = verdict_lines(cmp, 0, [])
    apart = [x for x in lines if "the sides' GPU clocks differ" in x]
    assert len(apart) == 1 and "1 row —" in apart[0]
    clocks = [x for x in lines if x.startswith("- clocks")]
    assert clocks == [
        "- clocks (median SM clock of each side): matched in 1 row, differ in 1 row"
    ]  # no "0 kept their verdict ..." clause: a zero count says nothing
    # a clock pair carries no weight in the geometric mean: only the matched-clock row does
    assert len(cmp.judged) == 1


def test_the_headline_counts_the_judged_rows_of_those_ok_on_both_sides_and_says_why_the_rest_are_not():
    # two matched-clock rows and one whose clocks differ: all three ok on both sides, two judged
    base = [_row(t, 1000.0, 1944.0, COMPUTE, i) for i, t in enumerate((256, 1024, 4096))]
    cand = [_row(256, 1000.0, 1944.0, COMPUTE, 7), _row(1024, 1000.0, 1944.0, COMPUTE, 8)]
    cand.append(_row(4096, 1080.0, 1800.0, COMPUTE, 9))
    head = verdict_lines(_compare(base, cand), 0, [])[0]
    assert "in 2 of 3 rows ok on both sides (1 without a verdict: clocks differ; threshold ×1.05)" in head, head
    # all judged: the plain count
    head = verdict_lines(_compare(base[:2], cand[:2]), 0, [])[0]
    assert "in 2 rows ok on both sides (threshold" in head, head


@pytest.mark.parametrize("threshold, tol", [(1.05, 0.05 / 3), (1.10, 0.02), (1.03, 0.01)])
def test_the_clock_tolerance_is_two_percent_or_a_third_of_the_margin(threshold, tol):
    assert clock_tolerance(threshold) == pytest.approx(tol)


def test_the_comparison_plot_draws_a_clock_pair_as_no_verdict_not_as_no_change(monkeypatch, tmp_path):
    # session 20: mixtral's +16 % at 4096 tokens (clocks 1416 → 1365 MHz) was drawn grey, under the
    # legend "no significant change"
    from matplotlib.colors import to_hex

    from moebench.report import plots_compare

    base = [_row(256, 1000.0, 1944.0, COMPUTE, 0), _row(1024, 1000.0, 1944.0, COMPUTE, 2)]
    cand = [_row(256, 1080.0, 1800.0, COMPUTE, 1), _row(1024, 1000.0, 1944.0, COMPUTE, 3)]
    cmp = _compare(base, cand)
    assert list(cmp.matched.sort_values("tokens_per_rank")["verdict"]) == [Verdict.CLOCK, Verdict.SIMILAR]
    figs = []
    monkeypatch.setattr(plots_compare, "save", lambda fig, path: figs.append(fig) or path)
    plots_compare.plot_comparison(cmp, tmp_path / "cmp.png")
    (fig,) = figs
    bars = [(round(p.get_width()), to_hex(p.get_facecolor())) for ax in fig.axes for p in ax.patches]
    assert bars == [(8, plots_compare.NO_VERDICT_COLOR), (0, plots_compare.NO_CHANGE)]  # 256, then 1024 tokens
    labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert "no verdict (the GPU clocks differ)" in labels and "no significant change" in labels


@pytest.mark.parametrize(
    "verdicts, label",
    [
        ([Verdict.CLOCK], "no verdict (the GPU clocks differ)"),
        ([Verdict.HOST, Verdict.SIMILAR], "no verdict (host time)"),
        ([Verdict.CPU, Verdict.HOST, Verdict.CLOCK], "no verdict (host time, CPU time, the GPU clocks differ)"),
    ],
)
def test_the_no_verdict_legend_names_why(verdicts, label):
    from moebench.report.plots_compare import _no_verdict_label

    assert _no_verdict_label(pd.Series(verdicts)) == label


def test_a_normalised_pair_says_its_change_at_the_baselines_clock():
    """Session 21: mixtral's 4096-token cell kept its verdict normalised, but the figure the bound
    rests on (the change at equal clocks) had to be worked out by hand. Now the pair carries it
    (`clock_ratio`), the clocks line names each such row with it, and a pair whose verdict the
    normalising changed says it in its reason; a memory-bound or matched pair has none."""
    base = [_row(256, 1000.0, 1944.0, COMPUTE, 0), _row(1024, 1000.0, 1944.0, MEMORY, 2)]
    base += [_row(4096, 1000.0, 1944.0, COMPUTE, 4), _row(16384, 1000.0, 1944.0, COMPUTE, 6)]
    # 256: 20 % slower at a 1800 / 1944 clock = +11.1 % at equal clocks (kept: slower);
    # 4096: 8 % slower at that clock = 0.0 % at equal clocks (the verdict changes); 16384: clocks match
    cand = [_row(256, 1200.0, 1800.0, COMPUTE, 1), _row(1024, 1200.0, 1800.0, MEMORY, 3)]
    cand += [_row(4096, 1080.0, 1800.0, COMPUTE, 5), _row(16384, 1080.0, 1944.0, COMPUTE, 7)]
    cmp = _compare(base, cand)
    m = cmp.matched.set_index("tokens_per_rank")
    kept = 1200.0 * 1800.0 / 1944.0 / 1000.0
    assert m.loc[256, "clock_ratio"] == pytest.approx(kept, rel=0.01)
    assert "the verdict survives normalising: +11.1 % at the baseline's clock" in m.loc[256, "clock_check"]
    assert m.loc[4096, "verdict"] == Verdict.CLOCK and m.loc[4096, "clock_ratio"] == pytest.approx(1.0, abs=0.01)
    assert "normalised by the clocks (" in m.loc[4096, "no_verdict_why"]
    assert "at the baseline's clock) the verdict changes" in m.loc[4096, "no_verdict_why"]
    assert np.isnan(m.loc[1024, "clock_ratio"]) and np.isnan(m.loc[16384, "clock_ratio"])
    (line,) = [x for x in verdict_lines(cmp, 1, []) if x.startswith("- clocks")]
    assert line.endswith(
        "differ in 3 rows (1 kept its verdict normalised as compute-bound: tiny · 256 tok +11.1 % at the baseline's "
        "clock)"
    ), line
    # the line reads which pairs kept their verdict from the data (a clock_ratio and no `clock differs`),
    # not from the note's words: notes worded otherwise give the same line
    from moebench.report.verdict import clock_line

    reworded = cmp.matched.assign(clock_check=cmp.matched["clock_check"].str.replace("survives normalising", "held"))
    assert clock_line(replace(cmp, matched=reworded)) == clock_line(cmp) == line.removeprefix("- ")
