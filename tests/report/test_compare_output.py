"""What a reviewer reads of a comparison in seconds: signs, the verdict's first lines, the figure's rows."""

from __future__ import annotations

import numpy as np
import pandas as pd

from moebench.report.compare import compare_runs
from moebench.report.compare_tables import latency_pairs
from moebench.report.effects import fmt_mib_delta
from moebench.report.fmt import fmt_change, fmt_pct
from moebench.report.verdict import exit_status, verdict_lines
from moebench.results.synthetic import make_row


def test_a_change_that_rounds_to_zero_prints_no_minus_sign():
    """'−0.0 %' (a memory table's device change, a chart label, a workspace delta) read as a loss; a
    figure that rounds to zero prints '+0.0' (unsigned '0.0') wherever it stands."""
    assert fmt_pct(-0.04) == "+0.0" and fmt_pct(-0.04, signed=False) == "0.0"
    assert fmt_pct(-0.004, digits=2) == "+0.00" and fmt_pct(-0.06) == "\u22120.1"
    assert fmt_change(0.9996) == "+0.0 %"
    assert fmt_change(0.9996, 0.999, 1.0004) == "+0.0 % [\u22120.1, +0.0]"
    assert fmt_mib_delta(-0.02 * 2**20) == "+0.0 MiB" and fmt_mib_delta(-1.5 * 2**20) == "\u22121.5 MiB"


def test_an_interval_that_excludes_zero_never_prints_an_end_as_zero():
    """'−0.3 % [−0.4, −0.0]' beside '~ (significant)' reads as an interval touching zero: an end
    that would print as zero takes the decimals that tell it from zero (up to three)."""
    assert fmt_change(0.997, 0.996, 0.9996) == "\u22120.30 % [\u22120.40, \u22120.04]"
    assert fmt_change(1.0002, 1.00001, 1.0004) == "+0.020 % [+0.001, +0.040]"
    assert fmt_change(0.99, 0.98, 0.995) == "\u22121.0 % [\u22122.0, \u22120.5]"  # far from zero: one decimal


INSTALL = "deep_gemm not installed: run scripts/install_deep_gemm.sh on the GPU machine"


def _skipping_runs(num_faster: int = 6, num_skipped: int = 8, num_similar: int = 0):
    """A baseline ok everywhere; a candidate faster in `num_faster` rows, like it in `num_similar`, and
    skipped in `num_skipped` (all but two for the same reason: DeepGEMM missing)."""
    base, cand = [], []
    for i in range(num_faster + num_skipped + num_similar):
        tokens = 16 * (i + 1)
        base.append(make_row("local", "torch", "experts", "none", "bf16", tokens, samples_us=np.full(20, 100.0) + i))
        if i < num_faster:
            cand.append(make_row("local", "torch", "experts", "none", "bf16", tokens, samples_us=np.full(20, 70.0) + i))
        elif i < num_faster + num_skipped:
            reason = "no GPU" if i >= num_faster + num_skipped - 2 else INSTALL
            cand.append(make_row("local", "torch", "experts", "none", "bf16", tokens, status="skipped", reason=reason))
        else:
            cand.append(dict(base[-1]))
    return pd.DataFrame(base), pd.DataFrame(cand)


def test_skipped_rows_follow_the_measured_verdict_one_line_per_reason():
    """26 skipped rows, each with the whole install-DeepGEMM message, opened the verdict ('26 skipped,
    24 faster') and pushed every faster row into '… and 42 more': the headline leads with what was
    measured, the faster rows are named, and the skipped ones get one line per reason with a count."""
    cmp = compare_runs(*_skipping_runs())
    lines = verdict_lines(cmp, *exit_status(cmp))
    assert lines[0].startswith("**Verdict (candidate vs baseline): 6 faster** in 6 rows ok on both sides"), lines[0]
    assert lines[0].endswith("; 8 skipped in candidate (no verdict) — exit 0"), lines[0]
    assert [x.split(" ", 2)[1] for x in lines[1:7]] == ["**faster**"] * 6, lines
    skipped = [x for x in lines if "skipped" in x and x.startswith("- ")]
    assert skipped == [
        f"- no verdict, skipped: 6 rows ok in baseline were skipped in candidate — {INSTALL}",
        "- no verdict, skipped: 2 rows ok in baseline were skipped in candidate — no GPU",
    ], skipped
    assert sum(INSTALL in x for x in lines) == 1 and not any("**skipped**" in x for x in lines)


def test_skipped_rows_carry_a_neutral_mark_the_legend_explains():
    """The table marked skipped rows `+`, which its legend defines as slower / broken (exit 0 all the
    same): they are marked `·`, and the legend says what that is."""
    cmp = compare_runs(*_skipping_runs())
    table = latency_pairs(cmp)
    text = table.markdown()
    marks = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ") and "tok" not in line]
    rows = [line for line in text.splitlines() if line.startswith("| ") and "| skipped |" in line]
    assert len(rows) == 8 and all(line.split("|")[1].strip() == "·" for line in rows), rows
    assert "-" in marks and "+" not in marks, marks
    assert "`·` skipped / cannot run (not measured on a side: no verdict)" in text
    # no skipped row: the legend says nothing of the mark
    assert "`·`" not in latency_pairs(compare_runs(*_skipping_runs(num_skipped=0))).markdown()


def test_the_figure_draws_measured_rows_only_and_counts_the_skipped_under_its_title():
    """comparison.png's 40 bars went to the 26 skipped rows first (a red 'skipped: skipped' each),
    dropping 10 of the 24 faster rows under a title claiming 'the changes called, then the largest':
    skipped rows are not drawn, every row called is, and a line says how many were left out."""
    from moebench.report.plots_compare import MAX_BARS, bar_rows, not_drawn_line

    cmp = compare_runs(*_skipping_runs(num_faster=30, num_skipped=30, num_similar=20))
    drawn, total = bar_rows(cmp)
    assert total == 50 and len(drawn) == MAX_BARS
    assert (drawn["verdict"] == "faster").sum() == 30 and not drawn["verdict"].isin(["skipped", "cannot run"]).any()
    assert not_drawn_line(cmp) == "not drawn: 30 rows skipped in candidate (no measurement there: no verdict)"
    assert not_drawn_line(compare_runs(*_skipping_runs(num_skipped=0))) == ""


def test_a_printed_change_stays_inside_its_panel(tmp_path):
    """A −22 % bar's label ('−22.2 % [−22.3, −22.1]', right-aligned at the bar's end) ran over the row
    names left of the axis: the panels' x range widens until every printed value lies inside."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from moebench.report.plots_compare import fit_values

    fig = Figure(figsize=(10, 2.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.barh(0, -22.0)
    ax.set_yticks([0], ["local_batched/triton_batched red=finalize ovl=dispatch quant=fp8_block · 128 tok"])
    ax.set_xlim(-25, 10)
    texts = [ax.text(-22.5, 0, "\u221222.2 % [\u221222.3, \u221222.1]", ha="right", va="center", fontsize=7.5)]

    def left_of_axis() -> float:
        fig.draw_without_rendering()
        r = fig.canvas.get_renderer()
        return ax.get_window_extent(r).x0 - texts[0].get_window_extent(r).x0

    assert left_of_axis() > 0  # as drawn before: over the row names
    fit_values(fig, [ax], texts)
    assert left_of_axis() < 0 and ax.get_xlim()[0] < -25, ax.get_xlim()


def test_a_count_of_zero_is_left_out_of_the_unmatched_line():
    """'unmatched: 0 rows only in h200x1_cold, 4 only in h200x1_hostpath': the side without any goes unsaid."""
    base, cand = _skipping_runs(num_skipped=0)
    extra = make_row("local", "torch", "experts", "none", "bf16", 4096, samples_us=np.full(20, 90.0))
    cmp = compare_runs(base, pd.concat([cand, pd.DataFrame([extra])], ignore_index=True))
    (line,) = [x for x in verdict_lines(cmp, *exit_status(cmp)) if x.startswith("- unmatched")]
    assert line == "- unmatched: 1 row only in candidate (listed below)", line


def test_the_figure_shows_both_thresholds_and_a_broken_pair_by_its_status(tmp_path, monkeypatch):
    """Every panel's x range holds both dashed thresholds whatever side the changes lie on, and a pair
    that broke is named by its status change ('broken (ok → oom)'), not a duplicated 'skipped: skipped'."""
    from moebench.report import plots_compare

    figures = []
    monkeypatch.setattr(plots_compare, "save", lambda fig, path: figures.append(fig) or path)
    rng = np.random.default_rng(0)

    def rows(scale: float) -> list[dict]:  # every change −1 %: a panel whose bars all lie left of zero
        return [
            make_row("local", "torch", "experts", "none", "bf16", t, samples_us=scale * rng.normal(100.0, 0.1, 20))
            for t in (16, 64, 256, 1024)
        ]

    base, cand = pd.DataFrame(rows(1.0)), pd.DataFrame(rows(0.99))
    cand.loc[0] = make_row("local", "torch", "experts", "none", "bf16", 16, status="oom", reason="CUDA OOM")
    plots_compare.plot_comparison(compare_runs(base, cand), tmp_path / "c.png")
    (fig,) = figures
    for ax in fig.axes:
        lo, hi = ax.get_xlim()
        assert lo < -4.76 and hi > 5.0, (lo, hi)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "broken (ok → oom)" in texts and not any("skipped" in t for t in texts), texts
