"""The capacity view (moebench report RUN --capacity): bytes per token from a line through the
measured peaks, the tokens per rank that fit a budget, the ratio between placements, the
capped confirmation rows, and its refusals."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from moebench import cli
from moebench.report.capacity import capacity_frame, fit_line, max_tokens, parse_budget, placement_ratios
from moebench.results.synthetic import make_row, samples_from, write_run

GIB = 2**30
TOKENS = (1024, 8192, 32768, 131072)
# (experts, reduction): (intercept, bytes per token) of the workspace peak
LINES = {
    ("triton", "experts"): (48e6, 110_000.0),
    ("triton", "finalize"): (48e6, 211_000.0),
    ("deepgemm", "experts"): (96e6, 130_000.0),
    ("deepgemm", "finalize"): (96e6, 231_000.0),
}


def _rows(noise=0.0, capped=(), reserved=None):
    """reserved: the allocator's reserved peak over the allocations (e.g. 1.03), else no column"""
    rng = np.random.default_rng(0)
    rows = []
    for (experts, reduction), (a, b) in LINES.items():
        for t in TOKENS:
            peak = (a + b * t) * (1 + noise * rng.normal())
            extra = {"reserved_bytes_peak": peak * reserved} if reserved else {}
            rows.append(
                make_row(
                    "local",
                    experts,
                    reduction,
                    "none",
                    "fp8_block",
                    t,
                    model="deepseek_v3",
                    simulate_ep=8,
                    samples_us=samples_from(100, 0.01, 5, rng),
                    workspace_bytes_peak=peak,
                    device_bytes_peak=peak + 10 * GIB,
                    **extra,
                )
            )
    for experts, reduction, t, status in capped:
        rows.append(
            make_row(
                "local",
                experts,
                reduction,
                "none",
                "fp8_block",
                t,
                model="deepseek_v3",
                simulate_ep=8,
                status=status,
                memory_budget=12 * GIB,
                samples_us=samples_from(100, 0.01, 5, rng) if status == "ok" else None,
            )
        )
    return pd.DataFrame(rows)


def test_fit_recovers_a_known_slope_and_intercept():
    f = fit_line(TOKENS, [5e6 + 3000.0 * t for t in TOKENS])
    assert f.slope == pytest.approx(3000.0) and f.intercept == pytest.approx(5e6, rel=1e-9)
    assert f.max_residual < 1e-9 and f.points == 4
    assert max_tokens(f, 5e6 + 3000.0 * 5000 + 2999) == 5000
    assert fit_line([1024], [1.0]) is None and np.isnan(max_tokens(None, 1e9))


def test_capacity_table_recovers_each_line_and_the_placement_ratio():
    cap = capacity_frame(_rows(noise=0.002), budget=12 * GIB).set_index(["experts", "reduction"])
    for key, (a, b) in LINES.items():
        assert cap.loc[key, "ws_slope"] == pytest.approx(b, rel=0.02)
        assert cap.loc[key, "max_tokens"] == pytest.approx((12 * GIB - a) / b, rel=0.03)
        assert cap.loc[key, "ws_resid"] < 0.05  # the small sizes carry the large ones' noise
    ratios = placement_ratios(cap.reset_index()).set_index("experts")
    assert ratios.loc["triton", "saving_per_token"] == pytest.approx(101_000.0, rel=0.03)
    assert ratios.loc["triton", "tokens_ratio"] == pytest.approx(211_000 / 110_000, rel=0.03)


def test_capped_rows_confirm_or_contradict_the_prediction():
    limit = (12 * GIB - 48e6) / 211_000.0  # triton, finalize: ~60 800 tokens
    good = capacity_frame(
        _rows(
            capped=[("triton", "finalize", int(limit * 0.97), "ok"), ("triton", "finalize", int(limit * 1.03), "oom")]
        ),
        12 * GIB,
    )
    row = good.set_index(["experts", "reduction"]).loc[("triton", "finalize")]
    assert (
        row["confirmed"].startswith("ok at ") and "oom at" in row["confirmed"] and "disagrees" not in row["confirmed"]
    )
    bad = capacity_frame(_rows(capped=[("triton", "finalize", int(limit * 1.2), "ok")]), 12 * GIB)
    assert "disagrees" in bad.set_index(["experts", "reduction"]).loc[("triton", "finalize"), "confirmed"]


def test_the_allocators_reserved_line_bounds_the_limit_from_below():
    """With the allocator's reserved peak in the rows (3 % over the allocations here), the limit
    under a cap lies between the reserved line's and the allocations' limits: an oom between the
    two agrees with the prediction, an oom below the reserved limit or an ok above the
    allocations' does not."""
    hi = (12 * GIB - 48e6) / 211_000.0  # triton, finalize
    lo = (12 * GIB - 48e6 * 1.03) / (211_000.0 * 1.03)

    def confirmed(t, status):
        cap = capacity_frame(_rows(capped=[("triton", "finalize", int(t), status)], reserved=1.03), 12 * GIB)
        return cap.set_index(["experts", "reduction"]).loc[("triton", "finalize")]

    row = confirmed((lo + hi) / 2, "oom")
    assert row["max_tokens_reserved"] == pytest.approx(lo, abs=1) and row["max_tokens"] == pytest.approx(hi, abs=1)
    assert "disagrees" not in row["confirmed"]
    assert "disagrees" in confirmed(lo * 0.98, "oom")["confirmed"]
    assert "disagrees" in confirmed(hi * 1.02, "ok")["confirmed"]
    assert "disagrees" not in confirmed(lo * 0.98, "ok")["confirmed"]
    from moebench.report.capacity import capacity_markdown

    text = capacity_markdown(capacity_frame(_rows(reserved=1.03), 12 * GIB), "12 GiB")
    assert "(allocator reserved)" in text and f"{int(lo):,}" in text
    assert "allocator reserved" not in capacity_markdown(capacity_frame(_rows(), 12 * GIB), "12 GiB")


def test_capacity_command_writes_the_report_and_refuses_what_it_cannot_do(tmp_path, capsys):
    run = write_run(tmp_path / "run", _rows(capped=[("triton", "experts", 100_000, "ok")]))
    assert cli.main(["report", str(run), "--capacity", "--budget", "12GiB"]) == 0
    out = capsys.readouterr().out
    assert "KiB / token" in out and "max tokens at 12.0 GiB" in out
    assert (run / "report" / "capacity.md").is_file() and (run / "report" / "capacity.png").is_file()
    assert cli.main(["report", str(run), "--capacity"]) == 0  # the capped rows' budget
    plain = write_run(tmp_path / "plain", _rows())
    assert cli.main(["report", str(plain), "--capacity"]) == 2
    assert "give --budget" in capsys.readouterr().err
    assert cli.main(["report", str(plain), "--capacity", "--budget", "free"]) == 2  # env.json has no GPU memory
    assert "--budget free needs the GPU's memory" in capsys.readouterr().err
    assert cli.main(["report", str(plain), "--capacity", "--budget", ""]) == 2  # '' is no budget given
    assert "give --budget" in capsys.readouterr().err


def _no_peak(experts, tokens, device="cuda"):
    """ok rows of one combination without a GPU memory peak (a CPU run's)"""
    return [
        make_row(
            "local",
            experts,
            "experts",
            "none",
            "bf16",
            t,
            samples_us=[50.0] * 5,
            device=device,
            workspace_bytes_peak=np.nan,
            device_bytes_peak=np.nan,
        )
        for t in tokens
    ]


def test_a_cpu_run_is_refused_in_one_line_saying_it_has_no_gpu_memory_peak(tmp_path, capsys):
    """A CPU run measures no GPU memory: one line saying what the table needs, exit 2, nothing
    written (no table of nan), whatever --budget (a missing budget is not what to fix first)."""
    run = write_run(tmp_path / "cpu", pd.DataFrame(_no_peak("torch", (16, 64), device="cpu")))
    for budget in (["--budget", "16GiB"], ["--budget", "free"], []):
        assert cli.main(["report", str(run), "--capacity", *budget]) == 2
        out = capsys.readouterr()
        assert out.out == "" and out.err.count("\n") == 1, out
        assert "GPU memory peaks" in out.err and "none of the 2 ok rows" in out.err
        assert "it ran on the CPU" in out.err and out.err.rstrip().endswith("run the sweep on a GPU")
        assert not (run / "report").exists()


def test_lines_without_a_peak_or_with_one_size_are_left_out_and_counted(tmp_path, capsys):
    rows = pd.concat([_rows(), pd.DataFrame(_no_peak("torch", (16, 64)))], ignore_index=True)
    one_size = pd.DataFrame(
        [
            make_row(
                "local",
                experts,
                reduction,
                "none",
                "bf16",
                TOKENS[0],
                model="deepseek_v3",
                simulate_ep=8,
                samples_us=[100.0] * 5,
                workspace_bytes_peak=a + b * TOKENS[0],
                device_bytes_peak=a + b * TOKENS[0] + 10 * GIB,
            )
            for (experts, reduction), (a, b) in LINES.items()
        ]
    )
    run = write_run(tmp_path / "run", rows)
    assert cli.main(["report", str(run), "--capacity", "--budget", "12GiB"]) == 0
    out = capsys.readouterr().out
    # the lines shown are named by what tells them apart; what they share, the caption under the table
    assert "nan" not in out and "torch" not in out and "| triton | experts |" in out
    assert "All lines: backend=local, overlap=none, quant=fp8_block, model=deepseek_v3" in out
    left = "Left out: 1 combination without a GPU memory peak."
    assert left in out and left in (run / "report" / "capacity.md").read_text()
    run = write_run(tmp_path / "mixed", pd.concat([rows, one_size], ignore_index=True))
    assert cli.main(["report", str(run), "--capacity", "--budget", "12GiB"]) == 0
    assert (
        "Left out: 1 combination without a GPU memory peak; 4 combinations with peaks at one token count "
        "(a line needs two)." in capsys.readouterr().out
    )
    run = write_run(tmp_path / "one", one_size)
    assert cli.main(["report", str(run), "--capacity", "--budget", "12GiB"]) == 2
    assert "has peaks at one token count only" in capsys.readouterr().err and not (run / "report").exists()


def test_a_row_file_given_writes_the_capacity_report_in_its_run_like_the_report(tmp_path, capsys):
    # one of a run's rows/*.parquet files: the run's report/ (as `moebench report FILE` writes), not rows/report/
    run = write_run(tmp_path / "run", _rows())
    one = sorted((run / "rows").glob("*.parquet"))[0]
    assert cli.main(["report", str(one), "--capacity", "--budget", "12GiB"]) == 0
    assert "# Capacity: run" in (run / "report" / "capacity.md").read_text()
    assert (run / "report" / "capacity.png").is_file() and not (run / "rows" / "report").exists()
    assert cli.main(["report", str(one)]) == 0
    assert (run / "report" / "report.md").is_file() and not (run / "rows" / "report").exists()
    assert f"{run / 'report' / 'capacity.md'}" in capsys.readouterr().err
    assert cli.main(["report", str(one), "--capacity", "--budget", "free"]) == 2  # the run's env.json, not the file's
    assert f"GPU's memory in {run / 'env.json'} (gpu_memory_bytes)" in capsys.readouterr().err


def test_the_line_goes_through_the_largest_sizes_row_layout():
    """triton's row_layout=auto runs gathered rows at small sizes and contiguous at large ones:
    a line through both bends; the capacity line uses the large sizes' layout only."""
    rng = np.random.default_rng(1)
    rows = []
    for t, layout, (a, b) in (
        (1024, "gathered", (0.0, 250_000.0)),
        (8192, "gathered", (0.0, 250_000.0)),
        (32768, "contiguous", (1e8, 385_000.0)),
        (131072, "contiguous", (1e8, 385_000.0)),
    ):
        rows.append(
            make_row(
                "local",
                "triton",
                "finalize",
                "none",
                "bf16",
                t,
                model="deepseek_v3",
                simulate_ep=8,
                samples_us=samples_from(100, 0.01, 5, rng),
                workspace_bytes_peak=a + b * t,
                device_bytes_peak=a + b * t,
                row_layout_used=layout,
            )
        )
    (cap,) = capacity_frame(pd.DataFrame(rows), budget=12 * GIB).itertuples()
    assert cap.ws_slope == pytest.approx(385_000.0) and cap.points == 2 and "contiguous rows" in cap.line
    assert cap.max_tokens == pytest.approx((12 * GIB - 1e8) / 385_000.0, abs=1)


def test_committed_capacity_rows_save_the_formula_at_every_size():
    """On the committed capacity run: reduction=experts needs T·(topk − 1)·K·2 bytes less than
    reduction=finalize, within 5 %, for every experts implementation at every measured size."""
    from pathlib import Path

    from moebench.report.load import load_run

    root = Path(__file__).resolve().parents[2] / "results" / "weight_reduce_memory"
    df = pd.concat(
        [load_run(root / name)[0].assign(run=name) for name in ("capacity_h200x1", "capacity_h200x1_confirmed")]
    )
    ok = df[(df.status == "ok") & (pd.to_numeric(df.memory_budget) == 0)]
    keys = ["model", "simulate_ep", "quant", "experts", "tokens_per_rank", "run"]
    pairs, seen = 0, set()
    for key, g in ok.groupby(keys):
        by = g.set_index("reduction")
        if not {"experts", "finalize"} <= set(by.index):
            continue
        r = by.loc["finalize"]
        formula = r.tokens_per_rank * (r.topk - 1) * r.hidden * 2
        saving = by.loc["finalize", "workspace_bytes_peak"] - by.loc["experts", "workspace_bytes_peak"]
        assert abs(saving / formula - 1) <= 0.05, (key, saving, formula)
        pairs += 1
        seen.add(key[3])
    # 4 sizes x (DeepSeek-V3's EP-8 and EP-16 shares, qwen3) x (triton bf16, and in fp8_block
    # triton, deepgemm, triton_or_deepgemm), and the confirmed run's EP-8 lines again
    assert pairs >= 48 + 16 and seen == {"triton", "deepgemm", "triton_or_deepgemm"}


def test_a_line_through_two_points_says_its_fit_is_exact_by_construction():
    """Two token counts always lie on their line: the report says so instead of a 0.0 % residual
    (six committed lines read 0.0 % that way), and gives the residual from three points on."""
    from moebench.report.capacity import capacity_markdown

    rows = _rows(noise=0.002)
    two = rows[rows["tokens_per_rank"].isin(TOKENS[2:]) & (rows["experts"] == "triton")]
    cap = capacity_frame(pd.concat([two, rows[rows["experts"] == "deepgemm"]]), 12 * GIB)
    assert sorted(cap["ws_points"]) == [2, 2, 4, 4]
    first_table = capacity_markdown(cap, "12 GiB").split("\n\n")[0].splitlines()[2:]
    resid = {tuple(c.strip() for c in ln.split("|")[1:3]): ln.split("|")[5].strip() for ln in first_table}
    assert len(resid) == 4
    for (line, _), cell in resid.items():
        if "triton" in line:
            assert cell == "2 points: exact by construction"
        else:  # four noisy points: a residual, in percent
            assert cell.endswith("%") and 0.0 <= float(cell[:-1]) < 5.0, cell


def test_committed_capacity_reports_are_what_the_command_writes_today(tmp_path):
    """results/weight_reduce_memory's capacity reports, regenerated with their recorded
    commands (the folders' about.md), match the committed capacity.md."""
    from pathlib import Path

    from moebench.report.capacity import capacity_command

    root = Path(__file__).resolve().parents[2] / "results" / "weight_reduce_memory"
    for run, budget, report in (
        ("capacity_h200x1", "12GiB", "report"),
        ("capacity_h200x1", "free", "report/free"),
        ("capacity_h200x1_confirmed", None, "report"),
    ):
        out = tmp_path / run / report
        assert capacity_command(str(root / run), parse_budget(budget) if budget else None, str(out)) == 0
        assert (out / "capacity.md").read_text() == (root / run / report / "capacity.md").read_text(), (
            f"regenerate: moebench report {root / run} --capacity"
            + (f" --budget {budget}" if budget else "")
            + f" --out {root / run / report}"
        )


def _refused_budget(budget: str, tmp_path, capsys) -> str:
    """argparse's one line (exit 2) for --budget, given before a run that is not there: refused
    while the command line is parsed, before any run is read."""
    with pytest.raises(SystemExit) as done:
        cli.main(["report", str(tmp_path / "no-such-run"), "--capacity", "--budget", budget])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("moebench report: error: argument --budget: ") and err.endswith(
        " (see moebench report --help)\n"
    ), err
    return err


@pytest.mark.parametrize("budget", ["0.15", "80", "0"])
def test_a_budget_below_a_mebibyte_is_refused_before_the_run_is_read(budget, tmp_path, capsys):
    """`tune --budget` is a fraction; `report --capacity --budget` bytes: 0.15 there read as 0 bytes
    and reported 0 tokens everywhere. Refused in one line (exit 2), before the run is read."""
    err = _refused_budget(budget, tmp_path, capsys)
    assert f"--budget: {budget} reads as" in err and "less than 1 MiB" in err, err
    assert "16GiB" in err and "tune --budget" in err


def test_a_budget_that_is_no_size_is_refused_saying_what_is(tmp_path, capsys):
    err = _refused_budget("lots", tmp_path, capsys)
    assert "'lots' is not a size" in err and "GiB" in err and "or free" in err, err
    assert parse_budget("free").bytes is None and parse_budget("16GiB").bytes == 16 * 2**30


def test_a_line_without_a_device_peak_prints_a_dash_not_nan():
    from moebench.report.capacity import capacity_markdown

    rows = _rows().assign(device_bytes_peak=np.nan)
    text = capacity_markdown(capacity_frame(rows, 12 * GIB), "12 GiB")
    assert "nan" not in text and "| - | - |" in text


# (backend, overlap, reduction): (intercept, bytes per token) of the workspace peak, triton
# fp8_block experts on DeepSeek-V3's EP-8 share: equal in everything but these three columns
COMBOS = {
    ("local", "none", "experts"): (48e6, 110_000.0),
    ("local", "none", "finalize"): (48e6, 211_000.0),
    ("deepep_ll", "none", "experts"): (300e6, 150_000.0),
    ("deepep_ll", "none", "finalize"): (300e6, 290_000.0),
    ("deepep_ll", "dispatch", "experts"): (400e6, 180_000.0),
    ("deepep_ll", "dispatch", "finalize"): (400e6, 330_000.0),
}


def _combo_rows(lines=COMBOS, capped=(), runner=None):
    """ok rows at every size of TOKENS for each of ``lines``; ``capped``: (backend, overlap,
    reduction, tokens, status) rows under a 12 GiB cap, measured with the runner settings
    ``runner`` (e.g. {"l2_flush": False}) where given"""
    rng = np.random.default_rng(2)
    common = dict(model="deepseek_v3", simulate_ep=8)
    rows = [
        make_row(
            backend,
            "triton",
            reduction,
            overlap,
            "fp8_block",
            t,
            samples_us=samples_from(100, 0.01, 5, rng),
            workspace_bytes_peak=a + b * t,
            device_bytes_peak=a + b * t + 10 * GIB,
            **common,
        )
        for (backend, overlap, reduction), (a, b) in lines.items()
        for t in TOKENS
    ]
    rows += [
        make_row(
            backend,
            "triton",
            reduction,
            overlap,
            "fp8_block",
            t,
            status=status,
            memory_budget=12 * GIB,
            samples_us=samples_from(100, 0.01, 5, rng) if status == "ok" else None,
            **common,
            **(runner or {}),
        )
        for backend, overlap, reduction, t, status in capped
    ]
    return pd.DataFrame(rows)


def test_each_backend_and_overlap_is_a_line_of_its_own():
    """Rows of two backends (or overlaps) with different peaks at the same token counts are two
    lines, each with its own slope, intercept and limit, named by what tells them apart (a line
    through both described no configuration: one of the embedded default's CPU runs pooled 18
    combinations into 2)."""
    cap = capacity_frame(_combo_rows(), 12 * GIB)
    assert len(cap) == len(COMBOS)
    by = cap.set_index(["backend", "overlap", "reduction"])
    for key, (a, b) in COMBOS.items():
        assert by.loc[key, "ws_slope"] == pytest.approx(b) and by.loc[key, "ws_intercept"] == pytest.approx(a)
        assert by.loc[key, "ws_resid"] < 1e-9 and by.loc[key, "points"] == len(TOKENS)
        assert by.loc[key, "max_tokens"] == pytest.approx((12 * GIB - a) / b, abs=1)
    # the reduction has its column: the label names the backend and the overlap, what varies
    assert by["line"].to_dict() == {
        ("local", "none", "experts"): "local ovl=none",
        ("local", "none", "finalize"): "local ovl=none",
        ("deepep_ll", "none", "experts"): "deepep_ll ovl=none",
        ("deepep_ll", "none", "finalize"): "deepep_ll ovl=none",
        ("deepep_ll", "dispatch", "experts"): "deepep_ll ovl=dispatch",
        ("deepep_ll", "dispatch", "finalize"): "deepep_ll ovl=dispatch",
    }
    # the two placements of one combination side by side
    assert list(cap["reduction"]) == ["experts", "finalize"] * 3


def test_a_placement_ratio_pairs_only_lines_equal_in_everything_but_the_reduction():
    # one backend's experts line and another's finalize line are no pair
    apart = {k: v for k, v in COMBOS.items() if k in {("local", "none", "experts"), ("deepep_ll", "none", "finalize")}}
    assert placement_ratios(capacity_frame(_combo_rows(apart), 12 * GIB)).empty
    ratios = placement_ratios(capacity_frame(_combo_rows(), 12 * GIB))
    assert len(ratios) == 3
    for r in ratios.itertuples():
        (_, e), (_, f) = COMBOS[(r.backend, r.overlap, "experts")], COMBOS[(r.backend, r.overlap, "finalize")]
        assert r.saving_per_token == pytest.approx(f - e) and r.slope_ratio == pytest.approx(e / f)


def test_capped_rows_confirm_the_line_of_their_own_combination():
    """The capped rows of one backend and overlap confirm that line only, not the other lines of
    the same experts, reduction and quant."""
    a, b = COMBOS[("deepep_ll", "dispatch", "finalize")]
    limit = (12 * GIB - a) / b
    capped = [
        ("deepep_ll", "dispatch", "finalize", int(limit * 0.97), "ok"),
        ("deepep_ll", "dispatch", "finalize", int(limit * 1.03), "oom"),
    ]
    cap = capacity_frame(_combo_rows(capped=capped), 12 * GIB)
    (r,) = cap[cap["confirmed"] != ""].itertuples()
    assert r.ws_slope == pytest.approx(b) and r.max_tokens == pytest.approx(limit, abs=1)
    assert r.confirmed == f"ok at {int(limit * 0.97)}, oom at {int(limit * 1.03)}"
    assert (r.backend, r.overlap, r.reduction) == ("deepep_ll", "dispatch", "finalize")


@pytest.mark.parametrize(
    "runner", [{"l2_flush": False}, {"timing": "events"}, {"graph_max_tokens": 64}, {"trace": "nvtx"}]
)
def test_capped_rows_measured_with_other_runner_settings_still_confirm_their_layer_s_line(runner):
    """How the runner measured (the runner role: timing, L2 flush, traces) is not what the layer
    allocates: capped rows that differ from their line's points only there confirm that line (they
    lost their cell without a word), and a line under the table says the confirmation crossed
    runner settings, naming them. Capped rows of another layer still confirm nothing."""
    from moebench.report.capacity import capacity_markdown

    a, b = COMBOS[("deepep_ll", "dispatch", "finalize")]
    limit = (12 * GIB - a) / b
    capped = [
        ("deepep_ll", "dispatch", "finalize", int(limit * 0.97), "ok"),
        ("deepep_ll", "dispatch", "finalize", int(limit * 1.03), "oom"),
    ]
    cap = capacity_frame(_combo_rows(capped=capped, runner=runner), 12 * GIB)
    (r,) = cap[cap["confirmed"] != ""].itertuples()
    assert (r.backend, r.overlap, r.reduction) == ("deepep_ll", "dispatch", "finalize")
    assert r.confirmed == f"ok at {int(limit * 0.97)}, oom at {int(limit * 1.03)}"
    (col,) = runner
    text = capacity_markdown(cap, "12 GiB")
    note = next(line for line in text.splitlines() if "other runner settings" in line)
    assert f"1 line confirmed by capped rows measured with other runner settings ({col}" in note, note
    # the same capped rows with the line's own settings: no such line
    assert "other runner settings" not in capacity_markdown(capacity_frame(_combo_rows(capped=capped), 12 * GIB), "")
    # another layer's capped rows (another seed's tokens) confirm no line, whatever the runner did
    other = capacity_frame(_combo_rows(capped=capped, runner={**runner, "seed": 7}), 12 * GIB)
    assert (other["confirmed"] == "").all()


def test_a_capped_row_with_the_line_s_own_runner_settings_is_preferred():
    """Two lines of one layer measured with different runner settings each take the capped rows
    measured as they were, not both sets."""
    rows = _combo_rows({("local", "none", "finalize"): COMBOS[("local", "none", "finalize")]})
    a, b = COMBOS[("local", "none", "finalize")]
    limit = (12 * GIB - a) / b
    events = _combo_rows({("local", "none", "finalize"): (a, b)}).assign(timing="events")
    capped_auto = _combo_rows({}, capped=[("local", "none", "finalize", int(limit * 0.97), "ok")])
    capped_events = _combo_rows(
        {}, capped=[("local", "none", "finalize", int(limit * 1.03), "oom")], runner={"timing": "events"}
    )
    cap = capacity_frame(pd.concat([rows, events, capped_auto, capped_events], ignore_index=True), 12 * GIB)
    by = cap.set_index("timing")["confirmed"].to_dict()
    assert by == {"auto": f"ok at {int(limit * 0.97)}", "events": f"oom at {int(limit * 1.03)}"}, by
