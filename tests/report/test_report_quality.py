"""Data-quality flags in reports, and what `moebench list` / `sweep --dry-run` say of skips."""

from __future__ import annotations

import numpy as np
import pandas as pd

from moebench import cli
from moebench.report.document import write_report
from moebench.report.flags import flags_of
from moebench.results.synthetic import make_row, write_run
from moebench.run.progress import Progress
from moebench.run.sweep import reason_groups


def _row(tokens=64, spread=0.01, **kw):
    samples = 100.0 * np.exp(np.random.default_rng(tokens).normal(0, spread, 30))
    return make_row("local", "triton", "experts", "none", "bf16", tokens, samples_us=samples, **kw)


def test_flags_of_rows():
    assert flags_of(_row()) == []
    assert "spread" in flags_of(_row(spread=0.3))
    assert flags_of(_row(host_enqueue_us=95.0)) == ["host-bound"]  # events: the host enqueues for 95 of 100 µs
    assert flags_of(_row(host_enqueue_us=20_000.0)) == ["host-sync"]
    assert flags_of(_row(timing_mode="graph", host_enqueue_us=300.0)) == []  # graph replays hide the host
    graph = _row(
        timing_mode="graph",
        prepare_us=100.0,
        experts_us=100.0,
        combine_us=0.0,
        dispatch_us=np.nan,
        weight_reduce_us=np.nan,
    )
    assert "phases≠latency" in flags_of(graph)
    ev = dict(prepare_us=40.0, experts_us=50.0, combine_us=10.0, dispatch_us=np.nan, weight_reduce_us=np.nan)
    assert "phases≠latency" not in flags_of(_row(**ev))  # events: 100 µs of phases in 100 µs
    assert "phases≠latency" not in flags_of(_row(**{**ev, "experts_us": 120.0}))  # 1.7x: overlap may do that
    assert "phases≠latency" in flags_of(_row(**{**ev, "experts_us": 900.0}))  # 9.5x, as a CPU run beside other work
    assert "phases≠latency" in flags_of(_row(**{**ev, "timing_mode": "cpu", "experts_us": 900.0}))  # a CPU row's mode
    idle = _row(
        timing_mode="profiler",
        prepare_us=5.0,
        experts_us=20.0,
        combine_us=1.0,
        dispatch_us=np.nan,
        weight_reduce_us=np.nan,
    )
    assert "gpu-idle" in flags_of(idle)
    old = _row(host_enqueue_us=np.nan)  # an older row at a decode size, timed eagerly
    assert flags_of(old) == ["eager-decode"] and flags_of(_row(4096, host_enqueue_us=np.nan)) == []
    assert flags_of(make_row("local", "torch", "experts", "none", "bf16", 16, status="failed")) == []


def test_report_carries_flags_git_sha_and_caveats(tmp_path):
    rows = pd.DataFrame([_row(16, spread=0.3, git_sha="unknown"), _row(64, host_enqueue_us=95.0, git_sha="unknown")])
    folder = tmp_path / "question"
    run = write_run(folder / "run", rows)
    (folder / "caveats.md").write_text("- the folder's caveat\n")
    (run / "caveats.md").write_text("- the run's own caveat\n")
    text = write_report(run).read_text()
    head, _, rest = text.partition("## Data quality")
    assert "**Summary:** 2 ok" in head and "data quality: 5 notes" in rest  # 2 flags, the sha, 2 caveats
    # the opening reads the notes (the flags, the sha) and counts the caveat files
    care = head.partition("## Read with care")[2]
    assert "1 row wide spread" in care and "- and 2 caveat files stored with the run in *Data quality*" in care
    assert "1 row wide spread" in rest and "1 row host-bound" in rest
    assert "git sha `unknown` names no commit" in rest
    assert rest.index("the folder's caveat") < rest.index("the run's own caveat") < rest.index("## Status")


def test_list_counts_skip_reasons_and_verbose_lists_each(capsys):
    overrides = [
        "backend=local,local_batched",
        "experts=torch,torch_batched",
        "reduction=experts",
        "overlap=none",
        "quant=bf16",
        "model=tiny",
        "runner.device=cpu",
    ]
    assert cli.main(["list", *overrides]) == 0
    out = capsys.readouterr().out
    assert "skipped, by reason (3 combinations; --verbose lists each):" in out
    assert "(and 1 more like it)" in out and "skipped local" not in out
    assert cli.main(["list", "--verbose", *overrides]) == 0
    assert capsys.readouterr().out.count("\nskipped ") == 3


def test_sweep_dry_run_lists_what_would_run(tmp_path, capsys):
    overrides = [
        "backend=local,local_batched",
        "experts=torch",
        "reduction=experts",
        "overlap=none",
        "quant=bf16",
        "model=tiny",
        "workload.tokens_per_rank=[4,8]",
        "runner.device=cpu",
    ]
    assert cli.main(["sweep", "--dry-run", "--out", str(tmp_path / "run"), *overrides]) == 0
    out = capsys.readouterr().out
    assert "would run 1 combination, 2 rows:" in out and "local/torch/experts/none/bf16/tiny  tokens 4, 8" in out
    assert "would skip 1" in out and "layouts differ" in out
    assert not (tmp_path / "run").exists()


def test_wide_spreads_are_summarised_not_printed_one_by_one():
    progress = Progress(0)
    assert progress.summary() == ""
    progress.wide += [(1.3, "a T=16"), (2.0, "b T=64"), (1.2, "c T=4")]
    text = progress.summary()
    assert text.startswith("moebench: 3 rows with a wide spread") and text.index("b T=64") < text.index("a T=16")
    progress.close()
    assert reason_groups(["x: 1", "x: 2", "x: 1", "y"]) == [(3, "x: 1 (and 1 more like it)"), (1, "y")]


def test_the_summary_names_a_fastest_only_where_the_intervals_are_apart():
    from moebench.report.summary import reviewer_summary, wins

    def row(experts, tokens, med, lo, hi):
        return make_row(
            "local",
            experts,
            "experts",
            "none",
            "bf16",
            tokens,
            latency_us_median=med,
            latency_us_p20=lo,
            latency_us_p80=hi,
            host_enqueue_us=1.0,
        )

    df = pd.DataFrame(
        [
            row("triton", 16, 100.0, 98.0, 102.0),
            row("torch", 16, 150.0, 147.0, 153.0),
            row("triton", 64, 2361.0, 2024.0, 8439.0),
            row("torch", 64, 4493.0, 4361.0, 4643.0),
        ]
    )
    lines = wins(df)
    assert lines[0].startswith("triton") and "fastest, 1.50× ahead of torch" in lines[0]  # apart: a winner
    assert "no clear fastest, 1.90× by median over torch" in lines[1] and "overlapping" in lines[1]
    summary = reviewer_summary(df, ["a note"])
    assert summary[-1].endswith("1 note in the report's Data quality section; 1 of 4 ok rows flagged")


def test_every_measured_token_count_is_labelled_crowded_ones_a_line_lower():
    """The comparison's latency axis (16 to 16384 tokens, log) left 2048 unlabelled between 1024 and
    4096: every measured count is labelled, one that would print over its neighbour a line lower."""
    from moebench.report.plotgrid import tick_labels

    t = [16, 256, 1024, 2048, 4096, 16384]
    pad = (16384 / 16) ** 0.06
    assert tick_labels(t, 16 / pad, 16384 * pad) == ["16", "256", "1024", "\n2048", "4096", "16384"]
    assert tick_labels([16, 8192, 16384], 16 / pad, 16384 * pad) == ["16", "8192", "\n16384"]
    assert tick_labels([16, 32, 64, 128, 256], 12.0, 300.0) == ["16", "32", "64", "128", "256"]
    dense = [2**i for i in range(4, 15)]  # 11 counts a factor of 2 apart
    labels = tick_labels(dense, 16 / pad, 16384 * pad)
    assert [x.strip() for x in labels] == [str(x) for x in dense] and max(x.count("\n") for x in labels) == 1


def test_a_wide_panel_keeps_its_token_labels_on_one_line():
    """A label drops a line only where its panel is too narrow to print it beside its neighbour."""
    from matplotlib.figure import Figure

    from moebench.report.plotgrid import tokens_axis

    t = [16, 256, 1024, 2048, 4096, 16384]
    wide = Figure(figsize=(9, 6)).subplots()
    narrow = Figure(figsize=(14.4, 4)).subplots(1, 3)[0]
    for ax in (wide, narrow):
        tokens_axis(ax, t)
    assert [x.get_text() for x in wide.get_xticklabels()] == [str(x) for x in t]
    assert [x.get_text() for x in narrow.get_xticklabels()] == ["16", "256", "1024", "\n2048", "4096", "16384"]
