"""moebench.report: loading, tables, comparison verdicts, plots, the markdown report."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from moebench.cli.report import report_command
from moebench.report import (
    compare_runs,
    latency_table,
    load_run,
    mann_whitney_p,
    memory_table,
    overlap_table,
    phase_table,
    plots,
    reasons_table,
    status_table,
    write_report,
)
from moebench.results.synthetic import make_row, make_rows, synthetic_run, write_run

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MIB = 1024 * 1024


@pytest.fixture
def run_dir(tmp_path):
    return synthetic_run(tmp_path / "run")


def _row(tokens=64, scale=1.0, spread=0.02, seed=0, **kw):
    """An ok local/torch row whose samples sit around 100 µs * scale."""
    rng = np.random.default_rng(seed)
    samples = 100.0 * scale * np.exp(rng.normal(0, spread, 30))
    args = dict(backend="local", experts="torch", reduction="experts", overlap="none", quant="bf16")
    args.update(kw)
    return make_row(tokens=tokens, samples_us=samples, **args)


# --- loading -------------------------------------------------------------------------


def test_load_run_concatenates_sorts_and_reads_env(run_dir):
    df, env = load_run(run_dir)
    assert len(df) == 21 and df["combo_key"].nunique() == 7
    assert env["gpu"] == "NVIDIA H200"
    assert isinstance(df["samples_us"].iloc[0], (list, np.ndarray))
    first = df[df["combo_key"] == df["combo_key"].iloc[0]]
    assert list(first["tokens_per_rank"]) == [16, 64, 256]


def test_load_single_file_and_plain_directory(run_dir, tmp_path):
    files = sorted((run_dir / "rows").glob("*.parquet"))
    df, env = load_run(files[0])
    assert len(df) == 3 and env["gpu"] == "NVIDIA H200"  # env.json found above rows/
    plain = tmp_path / "plain"
    plain.mkdir()
    for f in files[:2]:
        (plain / f.name).write_bytes(f.read_bytes())
    df, env = load_run(plain)
    assert len(df) == 6 and env == {}
    # the run each stands for: the store's run_dir_of (report folders, env.json, the same-run check)
    from moebench.results.store import run_dir_of

    assert run_dir_of(files[0]) == run_dir_of(run_dir) == run_dir
    assert run_dir_of(plain / files[0].name) == run_dir_of(plain) == plain


def test_load_errors_name_the_problem(tmp_path, run_dir, capsys):
    with pytest.raises(ValueError, match="does not exist"):
        load_run(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no results"):
        load_run(tmp_path / "empty")
    whole = len(load_run(run_dir)[0])
    bad = run_dir / "rows" / "zz_garbage.parquet"
    bad.write_bytes(b"this is not parquet at all")
    # a torn file: one warning line naming it, the rest read (tests/results/test_torn_files.py: the sweep's side)
    assert len(load_run(run_dir)[0]) == whole
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "zz_garbage.parquet: torn row file" in err
    bad.unlink()
    pd.DataFrame({"backend": ["local"], "status": ["ok"]}).to_parquet(run_dir / "rows" / "zz_columns.parquet")
    with pytest.raises(ValueError, match=r"zz_columns.parquet: missing columns .*experts"):
        load_run(run_dir)


def test_load_fills_optional_columns(tmp_path):
    rows = pd.DataFrame(
        [
            {
                "combo_key": "k",
                "backend": "local",
                "experts": "torch",
                "reduction": "experts",
                "overlap": "none",
                "model": "tiny",
                "quant": "bf16",
                "world_size": 1,
                "tokens_per_rank": 16,
                "status": "ok",
                "latency_us_median": 10.0,
                "latency_us_p20": 9.0,
                "latency_us_p80": 11.0,
            }
        ]
    )
    (tmp_path / "rows").mkdir()
    rows.to_parquet(tmp_path / "rows" / "minimal.parquet")
    df, _ = load_run(tmp_path)
    assert np.isnan(df["workspace_bytes_peak"].iloc[0]) and df["combo_key"].notna().all()
    assert "10.00 (9.00–11.0)" in latency_table(df)
    assert "No memory" in memory_table(df)


# --- tables --------------------------------------------------------------------------


def test_latency_table_cells(tmp_path):
    rows = [
        _row(16, latency_us_median=412.3, latency_us_p20=405.0, latency_us_p80=420.0),
        _row(64, latency_us_median=41.23, latency_us_p20=40.51, latency_us_p80=42.0),
        make_row("local", "torch", "experts", "none", "bf16", 256, status="oom", reason="CUDA out of memory"),
        _row(16, experts="triton", latency_us_median=500.0, latency_us_p20=490.0, latency_us_p80=510.0, combo_key="k2"),
        make_row("local", "deepgemm", "experts", "none", "bf16", 16, status="skipped", reason="needs fp8_block"),
    ]
    df, _ = load_run(write_run(tmp_path / "r", pd.DataFrame(rows)))
    table = latency_table(df)
    assert "**412.3 (405–420)**" in table  # fastest at 16 tokens is bold
    assert "41.23 (40.5–42.0)" in table
    assert "500.0 (490–510)" in table and "**500.0" not in table
    assert "| oom |" in table  # a non-ok cell shows its status
    assert "deepgemm" not in table  # no ok row: left to the status summary
    header = table.splitlines()[0]
    assert header.endswith("| 16 | 64 | 256 |")
    assert "microseconds" in table


def test_status_and_reasons_tables(run_dir):
    df, _ = load_run(run_dir)
    st = status_table(df)
    assert "| ok | 12 | 4 |" in st and "| skipped | 6 | 2 |" in st
    assert "| failed | 3 | 1 |" in st and "| total | 21 | 7 |" in st
    rt = reasons_table(df)
    assert "deepgemm needs quant=fp8_block" in rt and "RuntimeError: boom" in rt
    assert "| skipped | layouts differ" in rt


def test_phase_memory_overlap_tables(tmp_path):
    rows = [
        _row(
            64,
            latency_us_median=100.0,
            prepare_us=10.0,
            dispatch_us=20.0,
            experts_us=50.0,
            weight_reduce_us=np.nan,
            combine_us=15.0,
            workspace_bytes_analytic=2.0 * MIB,
            workspace_bytes_peak=3.0 * MIB,
            device_bytes_peak=250.0 * MIB,
        ),
        _row(
            64,
            backend="naive",
            world_size=2,
            overlap="dispatch",
            combo_key="ovl",
            latency_us_median=110.0,
            shared_us=20.0,
            latency_no_shared_us=104.0,
            shared_exposed_us=6.0,
            overlap_fraction=0.7,
        ),
    ]
    df, _ = load_run(write_run(tmp_path / "r", pd.DataFrame(rows)))
    pt = phase_table(df)
    assert "| 10.00 | 20.00 | 50.00 | - | 15.00 | - | 95.00 | 100.0 |" in pt
    # the shared experts count in the sum where they ran outside a communication span
    seq = _row(
        64,
        combo_key="seq",
        latency_us_median=100.0,
        prepare_us=10.0,
        dispatch_us=np.nan,
        experts_us=50.0,
        weight_reduce_us=np.nan,
        combine_us=5.0,
        shared_experts_us=30.0,
    )
    inside = _row(
        64,
        overlap="combine",
        combo_key="in",
        latency_us_median=100.0,
        prepare_us=10.0,
        dispatch_us=20.0,
        experts_us=50.0,
        weight_reduce_us=np.nan,
        combine_us=35.0,
        shared_experts_us=30.0,
    )
    both, _ = load_run(write_run(tmp_path / "s", pd.DataFrame([seq, inside])))
    pt = phase_table(both)
    assert "| 10.00 | - | 50.00 | - | 5.000 | 30.00 | 95.00 | 100.0 |" in pt
    assert "| 10.00 | 20.00 | 50.00 | - | 35.00 | 30.00 | 115.0 | 100.0 |" in pt  # held by combine: 10+20+50+35
    mt = memory_table(df)
    assert "| 2.00 | 3.00 | 250.0 | 1.50 |" in mt
    ot = overlap_table(df)
    assert "| 110.0 | 104.0 | 20.00 | 6.000 | 70% | - |" in ot
    assert ot.count("\n| tiny") == 1  # only the overlap != none row (constant columns: caption)
    assert "All rows: backend=naive" in ot and "Left out" not in ot
    # a single-rank backend has no communication to hide the shared experts behind: left out, said why
    local = _row(
        64,
        overlap="dispatch",
        combo_key="lov",
        latency_us_median=110.0,
        shared_us=20.0,
        latency_no_shared_us=104.0,
        shared_exposed_us=6.0,
        overlap_fraction=0.7,
    )
    with_local, _ = load_run(write_run(tmp_path / "l", pd.DataFrame(rows + [local])))
    ot = overlap_table(with_local)
    assert ot.count("\n| tiny") == 1 and "All rows: backend=naive" in ot
    assert (
        "Left out: 1 row of single-rank backends (local): they have no communication to hide the shared experts behind"
    ) in ot
    only_local, _ = load_run(write_run(tmp_path / "o", pd.DataFrame([local])))
    assert overlap_table(only_local).startswith("_No rows with shared-expert overlap")
    assert "Left out: 1 row of" in overlap_table(only_local)


# --- comparison ----------------------------------------------------------------------


def _compare(tmp_path, cand_kw, base_kw=None, threshold=1.05):
    base = pd.DataFrame([_row(**(base_kw or {}))])
    cand = pd.DataFrame([_row(seed=1, **cand_kw)])
    return compare_runs(base, cand, threshold=threshold).matched.iloc[0]


def test_compare_verdicts(tmp_path):
    assert _compare(tmp_path, dict(scale=2.0))["verdict"] == "slower"
    assert _compare(tmp_path, dict(scale=0.5))["verdict"] == "faster"
    m = _compare(tmp_path, dict(scale=1.01))
    assert m["verdict"] == "~" and m["ratio"] == pytest.approx(1.01, abs=0.02)
    # Tight samples: the intervals separate, but 1.03 is under the 1.05 factor.
    tight = _compare(tmp_path, dict(scale=1.03, spread=0.001), dict(spread=0.001))
    assert tight["cand_latency_us_p20"] > tight["base_latency_us_p80"]
    assert tight["verdict"] == "~"
    # ... and a lower threshold factor makes it significant.
    assert _compare(tmp_path, dict(scale=1.03, spread=0.001), dict(spread=0.001), threshold=1.02)["verdict"] == "slower"
    # A 2x ratio with overlapping intervals is not significant.
    wide = _compare(tmp_path, dict(scale=2.0, latency_us_p20=50.0), dict(latency_us_p80=250.0))
    assert wide["verdict"] == "~"


def test_compare_without_samples_uses_intervals(tmp_path):
    base, cand = _row(), _row(scale=2.0)
    base["samples_us"] = cand["samples_us"] = []  # e.g. a store that kept no samples
    base, cand = pd.DataFrame([base]), pd.DataFrame([cand])
    m = compare_runs(base, cand).matched.iloc[0]
    assert np.isnan(m["p_value"]) and m["verdict"] == "slower"


def test_compare_status_changes_unmatched_and_memory(tmp_path):
    base = pd.DataFrame([_row(16, workspace_bytes_peak=4.0 * MIB), _row(64), _row(256), _row(1024)])
    cand = pd.DataFrame(
        [
            _row(16, seed=1, workspace_bytes_peak=2.0 * MIB),
            make_row("local", "torch", "experts", "none", "bf16", 64, status="failed", reason="boom"),
            _row(256, seed=1, world_size=1.0),  # float vs int still matches
            _row(4096, seed=1),
        ]
    )
    cmp = compare_runs(base, cand)
    by_t = cmp.matched.set_index("tokens_per_rank")
    assert by_t.loc[64, "verdict"] == "broken"
    assert by_t.loc[16, "mem_verdict"] == "smaller"
    assert by_t.loc[16, "mem_ratio"] == pytest.approx(0.5)
    assert by_t.loc[256, "verdict"] == "~"
    assert list(cmp.only_baseline["tokens_per_rank"]) == [1024]
    assert list(cmp.only_candidate["tokens_per_rank"]) == [4096]
    with pytest.raises(ValueError, match="threshold"):
        compare_runs(base, cand, threshold=0.9)


def test_compare_keeps_rows_apart_that_differ_only_in_knobs():
    """A run that sweeps a knob (experts.row_layout, backend.num_sms) holds rows whose
    identity columns agree: each must meet its own counterpart, none may vanish."""

    def rows(seed, scale_contiguous):  # a knob off its default is in the combo key (moebench/config/spec.py)
        return pd.DataFrame(
            [
                dict(_row(4096, seed=seed), knobs="gathered", combo_key="k-gathered"),
                dict(_row(4096, seed=seed, scale=scale_contiguous), knobs="contiguous", combo_key="k-contiguous"),
            ]
        )

    base, cand = rows(0, 2.0), rows(1, 1.0)
    m = compare_runs(base, cand).matched.set_index("knobs")
    assert len(m) == 2
    assert m.loc["gathered", "verdict"] == "~" and m.loc["contiguous", "verdict"] == "faster"


def test_mann_whitney_p():
    assert mann_whitney_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(0.0122, abs=1e-3)
    assert mann_whitney_p([1, 2, 3], [1, 2, 3]) == pytest.approx(1.0)
    assert np.isnan(mann_whitney_p([1.0], [2.0, 3.0]))


# --- plots and report ----------------------------------------------------------------


def _is_png(path):
    data = path.read_bytes()
    return len(data) > 1000 and data[:8] == PNG_SIGNATURE


def test_plots_write_pngs(run_dir, tmp_path):
    df, _ = load_run(run_dir)
    cmp = compare_runs(df, make_rows(scale=1.5, seed=2))
    assert _is_png(plots.plot_comparison(cmp, tmp_path / "cmp.png"))
    assert _is_png(plots.plot_comparison_latency(cmp, tmp_path / "cmp_latency.png"))


def test_write_report_and_command(run_dir, tmp_path, capsys):
    path = write_report(run_dir)
    assert path == run_dir / "report" / "report.md"
    text = path.read_text()
    assert "GPU 2 × NVIDIA H200 · driver 580.159.04 · CUDA 13.0" in text
    assert "torch 2.11.0+cu130" in text and "git 0123456789" in text
    assert "deep_gemm not installed" in text
    for png in ("latency.png", "phases.png", "workspace.png"):
        assert f"]({png})" in text and _is_png(run_dir / "report" / png)
    # its overlap rows are all local (one rank): no overlap panel, and the section says why
    assert "overlap.png" not in text and not (run_dir / "report" / "overlap.png").exists()
    assert "single-rank backends (local): they have no communication to hide the shared experts behind" in text
    assert text.index("## Status") < text.index("## Latency")

    cand = synthetic_run(tmp_path / "cand", scale=2.0, seed=5)
    assert report_command(None, str(run_dir), str(cand), str(tmp_path / "out"), 1.05, "md") == 1  # slower rows
    out = capsys.readouterr().out
    assert out.startswith("**Verdict") and "12 slower" in out.splitlines()[0]
    text = (tmp_path / "out" / "report.md").read_text()
    assert text.index("**Verdict") < text.index("## Latency") < text.index("## This run") < text.index("## Status")
    assert _is_png(tmp_path / "out" / "comparison.png")

    assert report_command(str(run_dir), None, None, None, 1.05, "md") == 0
    out = capsys.readouterr().out
    assert "| experts | reduction | overlap |" in out  # the ok rows are all local: backend in the caption
    assert "- broken: naive/torch red=finalize ovl=none · 16 tok failed" in out
    with pytest.raises(ValueError, match="does not exist"):
        report_command(str(tmp_path / "missing"), None, None, None, 1.05, "md")
    with pytest.raises(ValueError, match="nothing to report"):
        report_command(None, str(run_dir), None, None, 1.05, "md")
    with pytest.raises(ValueError, match="format"):
        report_command(str(run_dir), None, None, None, 1.05, "xml")


def test_a_report_is_titled_by_the_runs_path_inside_results(tmp_path):
    inside = synthetic_run(tmp_path / "results" / "ep_backends" / "deepep_ht")
    assert write_report(inside).read_text().startswith("# moebench report: ep_backends/deepep_ht\n")
    outside = synthetic_run(tmp_path / "runs" / "20261201-1200")
    assert write_report(outside).read_text().startswith("# moebench report: 20261201-1200\n")


def test_reading_a_committed_run_writes_no_tracked_file(tmp_path, monkeypatch, capsys):
    """A run under the repository's results/: report and compare go to runs/reports/ unless
    --out says otherwise, and stderr says how to update the committed report."""
    from moebench.cli import report as command
    from moebench.report import document as markdown

    results = tmp_path / "repo" / "results"
    base = synthetic_run(results / "q" / "base")
    cand = synthetic_run(results / "q" / "cand", scale=1.01, seed=3)
    monkeypatch.setattr(markdown, "committed_results", lambda: results)
    monkeypatch.chdir(tmp_path)
    assert report_command(str(cand), None, None, None, 1.05, "md") == 0
    assert (tmp_path / "runs" / "reports" / "q" / "cand" / "report" / "report.md").is_file()
    assert "--out results/q/cand/report updates the committed report" in capsys.readouterr().err
    command.compare_command([str(base), str(cand)])
    assert (tmp_path / "runs" / "reports" / "q" / "cand" / "report" / "vs-base" / "report.md").is_file()
    assert not (cand / "report").exists() and not (base / "report").exists()
    monkeypatch.setenv("MOEBENCH_RUNS", str(tmp_path / "my_runs"))  # where this user's sweeps go
    assert report_command(str(base), None, None, None, 1.05, "md") == 0
    assert (tmp_path / "my_runs" / "reports" / "q" / "base" / "report" / "report.md").is_file()
    assert report_command(str(cand), None, None, str(cand / "report"), 1.05, "md") == 0  # said explicitly
    assert (cand / "report" / "report.md").is_file()
    elsewhere = synthetic_run(tmp_path / "mine" / "run")  # not the repository's results/: beside the run
    assert report_command(str(elsewhere), None, None, None, 1.05, "md") == 0
    assert (elsewhere / "report" / "report.md").is_file()


def test_git_sha_override_wins_over_a_stale_checkout(monkeypatch):
    """A tree copied to a GPU machine may carry an old .git: MOEBENCH_GIT_SHA names what runs."""
    from moebench.run import env

    monkeypatch.setenv("MOEBENCH_GIT_SHA", "2be9ad1")
    info = env.git_info()
    assert (info["git_sha"], info["git_dirty"], info["git_tree"]) == ("2be9ad1", None, "MOEBENCH_GIT_SHA")
    monkeypatch.delenv("MOEBENCH_GIT_SHA")
    assert env.git_info()["git_sha"] != "2be9ad1"


def test_a_copied_trees_commit_wins_over_its_stale_git_in_older_env_files():
    """Older runs stored the copy's stale .git as git_sha (dirty) beside MOEBENCH_GIT_SHA."""
    from moebench.report.envinfo import env_commit, env_summary
    from moebench.report.flags import run_notes

    old = {
        "git_sha": "cb40768c241aea96a78e9b5aeb6dd19d3a2ea3f2",
        "git_dirty": True,
        "env": {"MOEBENCH_GIT_SHA": "bd66478"},
    }
    assert env_commit(old) == ("bd66478", None)
    assert "git bd66478" in env_summary(old) and "dirty" not in env_summary(old)
    df = pd.DataFrame({"git_sha": ["bd66478"]})
    assert not any("dirty" in n for n in run_notes(df, old))
    plain = {"git_sha": "cb40768c241aea96a78e9b5aeb6dd19d3a2ea3f2", "git_dirty": True, "env": {}}
    assert env_commit(plain) == (plain["git_sha"], True)
    assert "git cb40768c241a (dirty)" in env_summary(plain)
    assert any("dirty" in n for n in run_notes(df, plain))


def test_labels_tell_apart_combinations_that_differ_only_in_knobs():
    """backend.num_sms / overlap.shared_sm_carveout: labels take the stored `knobs` tags,
    and only when they vary."""
    import pandas as pd

    from moebench.report.columns import combo_labels

    base = dict(
        backend="deepep_ht",
        experts="torch",
        reduction="finalize",
        overlap="combine",
        quant="bf16",
        model="deepseek_v3",
        world_size=2,
    )
    df = pd.DataFrame([dict(base, knobs=""), dict(base, knobs="carve24 sms16")])
    labels = list(combo_labels(df))
    assert labels[0] != labels[1] and labels[1].endswith("carve24 sms16")
    assert "carve" not in " ".join(combo_labels(df.iloc[1:]))  # constant knobs stay out


def test_log_axes_label_plain_numbers_and_long_titles_wrap_inside_their_cell():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from moebench.report.plotgrid import fit_titles, grid, plain_log

    fig, axes = grid(3)
    for ax, (lo, hi) in zip(axes, [(5000, 60000), (0.02, 0.3), (800, 250000)], strict=True):
        ax.set_yscale("log")
        ax.plot([1, 2], [lo, hi])
        plain_log(ax.yaxis)
    long = "local_batched · fp8_tensor · ws=1 · torch_batched · deepseek_v2_lite · 4096 tok"
    axes[2].set_title(long)
    axes[0].set_title("short")
    heading = (
        "Latency change per row: h200x1_hostpath vs h200x1_cold "
        "(40 of 134 rows: the changes called, then the largest) — deepseek_v3"
    )
    fit_titles(fig)
    FigureCanvasAgg(fig).draw()
    labels = [t.get_text() for ax in axes for minor in (False, True) for t in ax.get_yticklabels(minor=minor)]
    assert any(labels) and not [t for t in labels if "e+" in t or "e-" in t or "\\times" in t], labels
    assert "20000" in labels and "0.1" in labels
    assert axes[0].get_title() == "short" and "\n" in axes[2].get_title()
    assert axes[2].get_title().replace("\n", " ") == long
    # the figure's title too (a comparison's, 11 inches wide): wrapped inside the figure, every word kept
    from matplotlib.figure import Figure

    for text, size in ((heading, 12), ("WWWW MMMM " * 14, 10)):  # wide glyphs too
        narrow = Figure(figsize=(11, 4))
        narrow.suptitle(text.strip(), fontsize=size)
        fit_titles(narrow)
        sup = narrow._suptitle
        assert "\n" in sup.get_text() and sup.get_text().replace("\n", " ") == text.strip()
        box = sup.get_window_extent(FigureCanvasAgg(narrow).get_renderer())
        assert box.x0 >= 0 and box.x1 <= narrow.bbox.width, (box, narrow.bbox.width)


def test_the_report_maps_each_trace_folder_to_its_combination(tmp_path):
    """`traces/<combo_key>/` is named by a hash: the report's Traces table names its combination
    by the row's label (issue #31, item 12); a run without traces has no such section."""
    from moebench.report.run_tables import traces_table

    rows = [
        _row(
            t,
            backend="naive",
            world_size=2,
            overlap="dispatch",
            combo_key="0123456789ab",
            label="naive/torch/experts/dispatch/bf16/tiny/ws2",
            trace_path=f"traces/0123456789ab/rank0_T{t}.json",
        )
        for t in (16, 64)
    ] + [_row(16, combo_key="fedcba987654", trace_path="")]
    run = write_run(tmp_path / "r", pd.DataFrame(rows))
    df, _ = load_run(run)
    table = traces_table(df)
    assert "| naive/torch/experts/dispatch/bf16/tiny/ws2 | 16, 64 | `traces/0123456789ab/` |" in table
    assert "fedcba987654" not in table
    text = write_report(run).read_text()
    assert text.index("## Shared-expert overlap") < text.index("## Traces") < text.index("## Memory")
    assert traces_table(df[df["combo_key"] == "fedcba987654"]) == ""


def test_the_fastest_cell_is_bold_when_a_workload_column_is_empty(tmp_path):
    """The rows of a run that routes synthetically hold None in the recording's columns
    (routing_file_sha256, routing_layer, ...): the fastest cell per token count is still bold
    (a lookup by key once missed, None and NaN not matching)."""
    from moebench.report.load import load_run
    from moebench.report.run_tables import latency_table
    from moebench.results.synthetic import synthetic_run

    df, _ = load_run(synthetic_run(tmp_path / "run"))
    df["routing_file_sha256"] = None  # as results/default_sweep/h200x1_held stores it
    ok = df[df["status"] == "ok"]
    table = latency_table(df)
    assert table.count("**") == 2 * ok["tokens_per_rank"].nunique(), table
    assert "Bold is the fastest" in table


def test_a_cpu_machine_is_said_to_have_no_gpu():
    """A CPU run's environment line read 'GPU cpu' (its fingerprint's gpu field) and a comparison's
    'environments: comparable (cpu, ...)': it says there is no GPU, with the cores and threads."""
    from moebench.report.envinfo import comparable_summary, env_summary

    env = {"gpu": "cpu", "gpu_count": 0, "cpu_count": 2, "cpu_threads": 1, "torch": "2.13.0+cpu"}
    line = env_summary(env)
    assert line.startswith("no GPU (CPU, 2 cores, 1 torch thread a rank) · torch 2.13.0+cpu"), line
    assert "GPU cpu" not in line
    assert comparable_summary(env) == "no GPU (CPU), torch 2.13.0+cpu"
    rows = pd.DataFrame({"gpu": ["cpu"], "git_sha": ["0123456"]})
    assert env_summary({}, rows).startswith("no GPU (CPU) · git 0123456"), env_summary({}, rows)
    gpu = env_summary({"gpu": "NVIDIA H200", "gpu_count": 2})
    assert gpu.startswith("GPU 2 × NVIDIA H200"), gpu
