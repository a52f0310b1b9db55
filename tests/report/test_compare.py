"""moebench compare: the verdict, the exit status CI gates on, csv / json, bad input."""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pandas as pd
import pytest

from moebench import cli
from moebench.report.compare import compare_runs
from moebench.report.verdict import exit_status, verdict_lines
from moebench.results.synthetic import default_env, make_row, make_rows, write_run

NUM = re.compile(r"[+\u2212-]?\d+(?:\.\d+)?")


def _runs(tmp_path, base: pd.DataFrame, cand: pd.DataFrame, cand_env=None):
    return (str(write_run(tmp_path / "base", base)), str(write_run(tmp_path / "cand", cand, cand_env)))


def _compare(capsys, *argv):
    code = cli.main(["compare", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_10_percent_slowdown_is_flagged_and_exits_1(tmp_path, capsys):
    base, cand = _runs(tmp_path, make_rows(seed=0), make_rows(scale=1.10, seed=1))
    code, out, err = _compare(capsys, base, cand, "--out", str(tmp_path / "r"))
    assert code == 1
    first = out.splitlines()[0]
    assert first.startswith("**Verdict (cand vs base):") and "slower" in first and "exit 1" in first
    slower = [line for line in out.splitlines() if line.startswith("- **slower**")]
    assert len(slower) >= 8  # 12 rows ok on both sides; the sizes are named, not counted
    sizes = [float(NUM.findall(line.split(": ", 1)[1])[0].replace("\u2212", "-")) for line in slower]
    assert all(5 < s < 16 for s in sizes), sizes
    assert "geometric mean over 12 rows: +10" in out or "geometric mean over 12 rows: +9" in out
    assert "slower beyond ×1.05" in err
    report = (tmp_path / "r" / "report.md").read_text()
    assert report.splitlines()[2].startswith("**Verdict")  # the verdict on line 3, after the title


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_noise_the_size_of_the_rows_spread_is_not_flagged(tmp_path, capsys, seed):
    base, cand = _runs(tmp_path, make_rows(seed=0, spread=0.02), make_rows(seed=seed, spread=0.02))
    code, out, _ = _compare(capsys, base, cand, "--out", str(tmp_path / "r"))
    assert code == 0, out
    assert "no change beyond ×1.05" in out.splitlines()[0]
    cmp = compare_runs(make_rows(seed=0, spread=0.02), make_rows(seed=seed, spread=0.02))
    assert not cmp.matched["verdict"].isin(["slower", "faster"]).any()


def test_no_matched_row_is_bad_input_exit_2_and_says_why(tmp_path, capsys):
    """Runs no row of which pairs were never compared: nothing regressed, so not the 1 a CI gate
    reads as slower, but bad input (2) with one line saying what differs and what to do."""
    other = pd.DataFrame(
        [
            make_row("local", "torch", "experts", "none", "bf16", t, model="other", samples_us=np.full(20, 50.0))
            for t in (16, 64)
        ]
    )
    base, cand = _runs(tmp_path, make_rows(), other)
    code, out, err = _compare(capsys, base, cand, "--out", str(tmp_path / "r"))
    assert code == 2 and not out and not (tmp_path / "r").exists()
    assert "share no value of model only (model (tiny vs other))" in err, err
    assert err.strip().endswith(f"compare them along it: moebench compare {base} {cand} --axis model=tiny:other"), err


def test_nothing_compared_headlines_no_comparable_rows_not_no_change():
    """Runs that differ only in quant share no pair: the bold headline says nothing was compared
    (a bold "no change" reads as a pass), then why (the CLI refuses such runs, exit 2: the API's
    verdict still says so)."""

    def rows(quant):
        return pd.DataFrame(
            [make_row("local", "torch", "experts", "none", quant, t, samples_us=np.full(20, 50.0)) for t in (16, 64)]
        )

    cmp = compare_runs(rows("bf16"), rows("fp8_block"))
    cmp.baseline_name, cmp.candidate_name = "base", "cand"
    code, why = exit_status(cmp)
    first = verdict_lines(cmp, code, why)[0]
    assert code == 1 and first.startswith("**No comparable rows (cand vs base)** — exit 1: no row matched"), first
    assert "the runs share no value of quant (bf16 vs fp8_block)" in first and "no change" not in first
    code, why = exit_status(cmp, ())
    first = verdict_lines(cmp, code, why)[0]
    assert code == 0 and first.startswith("**No comparable rows (cand vs base)** — no row matched:"), first
    assert first.endswith("— exit 0")


def test_rows_ok_on_one_side_only_headline_no_comparable_rows(tmp_path, capsys):
    """Pairs matched, but none ok on both sides (here every candidate row failed): no comparable
    rows, with the status changes the headline can still name."""
    base = pd.DataFrame([make_row("local", "torch", "experts", "none", "bf16", 16, samples_us=np.full(20, 50.0))])
    cand = pd.DataFrame([make_row("local", "torch", "experts", "none", "bf16", 16, status="failed", reason="boom")])
    code, out, _ = _compare(capsys, *_runs(tmp_path, base, cand), "--out", str(tmp_path / "r"))
    first = out.splitlines()[0]
    assert code == 1 and first.startswith("**No comparable rows (cand vs base): 1 broken** — exit 1:"), first


def test_pairs_no_verdict_may_rest_on_headline_no_verdict_not_no_change():
    """Every pair ok on both sides but the candidate timed on the host: a 50 % slowdown no verdict
    may rest on must not read as "no change"."""
    cand = make_rows(scale=1.5, seed=1)
    cand["timing_mode"] = "host"
    cmp = compare_runs(make_rows(seed=0), cand)
    code, why = exit_status(cmp)
    first = verdict_lines(cmp, code, why)[0]
    assert first.startswith("**No verdict (") and "no change" not in first, first
    assert "in 0 of 12 rows ok on both sides (12 without a verdict: host time;" in first and first.endswith("exit 0")


def test_broken_and_skipped_rows(tmp_path, capsys):
    rows = [
        make_row("local", "torch", "experts", "none", "bf16", t, samples_us=np.full(20, 50.0) + t)
        for t in (16, 64, 256)
    ]
    cand = [
        dict(rows[0]),
        make_row("local", "torch", "experts", "none", "bf16", 64, status="oom", reason="CUDA OOM"),
        make_row("local", "torch", "experts", "none", "bf16", 256, status="skipped", reason="no GPU"),
    ]
    cmp = compare_runs(pd.DataFrame(rows), pd.DataFrame(cand))
    assert cmp.counts()["broken"] == 1 and cmp.counts()["skipped"] == 1
    assert exit_status(cmp) == (1, ["1 row broken (ok in the baseline, now failed/incorrect/timeout/oom)"])
    assert exit_status(cmp, ("slower",)) == (0, [])  # a broken row counts only where fail_on names it
    base, cand_dir = _runs(tmp_path, pd.DataFrame(rows), pd.DataFrame(cand))
    code, out, _ = _compare(capsys, base, cand_dir, "--out", str(tmp_path / "r"))
    assert code == 1 and "**broken** tiny · 64 tok: ok → oom: CUDA OOM" in out


def test_fail_on_tunes_what_exits_1(tmp_path, capsys):
    def rows(scale, ws):
        return pd.DataFrame(
            [
                make_row(
                    "local",
                    "torch",
                    "experts",
                    "none",
                    "bf16",
                    t,
                    samples_us=np.full(20, 50.0) * scale * np.exp(np.random.default_rng(t).normal(0, 0.01, 20)),
                    workspace_bytes_peak=ws * t,
                )
                for t in (16, 64)
            ]
        )

    base, cand = _runs(tmp_path, rows(1.0, 1e6), rows(1.0, 2e6))
    assert _compare(capsys, base, cand, "--out", str(tmp_path / "r"))[0] == 0  # memory: reported, not fatal
    code, out, err = _compare(capsys, base, cand, "--out", str(tmp_path / "r"), "--fail-on", "memory")
    assert code == 1 and "larger workspace" in err and "memory: workspace: 2 rows larger beyond ×1.05" in out
    # no peak on either side (a CPU run: peaks are CUDA only): the declared workspace, said so
    base, cand = _runs(
        tmp_path,
        rows(1.0, np.nan).assign(workspace_bytes_analytic=1e6),
        rows(1.0, np.nan).assign(workspace_bytes_analytic=2e6),
    )
    out = _compare(capsys, base, cand, "--out", str(tmp_path / "r"))[1]
    assert "memory: declared workspace (no peak measured): 2 rows larger beyond ×1.05" in out, out
    base, cand = _runs(tmp_path, rows(1.0, 1e6), rows(1.5, 1e6))
    assert _compare(capsys, base, cand, "--out", str(tmp_path / "r"))[0] == 1
    assert _compare(capsys, base, cand, "--out", str(tmp_path / "r"), "--fail-on", "none")[0] == 0
    assert _compare(capsys, base, cand, "--out", str(tmp_path / "r"), "--threshold", "1.6")[0] == 0
    code, _, err = _compare(capsys, base, cand, "--fail-on", "slowness")
    assert code == 2 and "--fail-on 'slowness'" in err


def test_environments_not_comparable_are_said_to_be(tmp_path, capsys):
    env = dict(default_env(), torch="2.10.0")
    base, cand = _runs(tmp_path, make_rows(seed=0), make_rows(seed=1), env)
    code, out, _ = _compare(capsys, base, cand, "--out", str(tmp_path / "r"))
    assert code == 0 and "environments: **not comparable** — torch: 2.11.0+cu130 → 2.10.0" in out
    code, _, err = _compare(capsys, base, cand, "--out", str(tmp_path / "r"), "--fail-on", "slower,env")
    assert code == 1 and "environments not comparable" in err
    base, cand = _runs(tmp_path, make_rows(seed=0), make_rows(seed=1))
    assert "environments: comparable (NVIDIA H200" in _compare(capsys, base, cand, "--out", str(tmp_path / "r"))[1]


def _md_rows(text: str) -> list[list[str]]:
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]


def _num(cell: str) -> float:
    return float(NUM.findall(cell)[0].replace("\u2212", "-"))


def test_csv_and_json_parse_back_to_the_markdown_numbers(tmp_path, capsys):
    base, cand = _runs(tmp_path, make_rows(seed=0), make_rows(scale=1.07, seed=1))
    out = str(tmp_path / "r")
    _, md, _ = _compare(capsys, base, cand, "--out", out)
    _, csv, _ = _compare(capsys, base, cand, "--out", out, "--format", "csv")
    _, js, _ = _compare(capsys, base, cand, "--out", out, "--format", "json")
    table = pd.read_csv(io.StringIO(csv))
    doc = json.loads(js)
    assert doc["verdict"]["exit_status"] in (0, 1) and len(doc["comparison"]) == len(table) == 12
    header = [ln for ln in md.splitlines() if ln.startswith("|")][0]
    cols = [c.strip() for c in header.strip("|").split("|")]
    cells = _md_rows(md)
    assert len(cells) == 12
    for row, rec, (_, line) in zip(cells, doc["comparison"], table.iterrows(), strict=True):
        cell = dict(zip(cols, row, strict=True))
        assert int(cell["tokens"]) == rec["tokens_per_rank"] == line["tokens_per_rank"]
        for side, name in (("base", "base µs"), ("cand", "cand µs")):
            shown = _num(cell[name])
            assert shown == pytest.approx(rec[f"{side}_latency_us_median"], rel=5e-3)
            assert line[f"{side}_latency_us_median"] == pytest.approx(rec[f"{side}_latency_us_median"])
        change, lo, hi = [float(x.replace("\u2212", "-")) for x in NUM.findall(cell["change [95 % CI]"])]
        assert change == pytest.approx(line["change_pct"], abs=0.051) and change == pytest.approx(
            rec["change_pct"], abs=0.051
        )
        assert lo == pytest.approx(rec["ci_lo_pct"], abs=0.051) and hi == pytest.approx(rec["ci_hi_pct"], abs=0.051)
        assert cell["verdict"].split()[0] == rec["verdict"] == line["verdict"]
    assert (tmp_path / "r" / "comparison.csv").read_text() == csv
    assert json.loads((tmp_path / "r" / "report.json").read_text())["verdict"] == doc["verdict"]


def test_single_run_csv_and_json_match_the_latency_table(tmp_path, capsys):
    run = str(write_run(tmp_path / "run", make_rows()))
    assert cli.main(["report", run, "--format", "csv", "--out", str(tmp_path / "r")]) == 0
    rows = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert cli.main(["report", run, "--format", "json", "--out", str(tmp_path / "r")]) == 0
    doc = json.loads(capsys.readouterr().out)
    md = (tmp_path / "r" / "report.md").read_text()
    ok = rows[rows["status"] == "ok"]
    assert len(doc["rows"]) == len(rows) == 21 and len(ok) == 12
    for _, r in ok.iterrows():
        # each median appears in the markdown latency table with ~4 significant digits
        assert f"{r['latency_us_median']:.1f}" in md or f"{r['latency_us_median']:.2f}" in md
    assert md.splitlines()[2].startswith("**Summary:** 12 ok, 6 skipped, 3 failed")


def test_bad_input_is_one_clear_line_and_exit_2(tmp_path, capsys):
    good = str(write_run(tmp_path / "good", make_rows()))
    code, _, err = _compare(capsys, good, str(tmp_path / "missing"))
    assert (
        code == 2 and len(err.strip().splitlines()) == 1 and "does not exist: pass the folder `moebench sweep`" in err
    )
    assert not (tmp_path / "missing").exists()  # refused before its report folder is made
    future = str(write_run(tmp_path / "future", make_rows().assign(schema_version=99)))
    code, _, err = _compare(capsys, good, future)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "schema_version 99" in err
    code, _, err = _compare(capsys, good, "--axis", "reduction=finalize:nowhere")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "no row has reduction=nowhere (this run has reduction = experts, finalize)" in err
    code, _, err = _compare(capsys, good, "--axis", "colour=red:blue")
    assert code == 2 and "neither an identity field" in err
    code, _, err = _compare(capsys, good, "--axis", "reduction=finalize")
    assert code == 2 and "FIELD=A:B" in err
    code, _, err = _compare(capsys, good, good, "--axis", "reduction=finalize:experts")
    assert code == 2 and "both sides are the same run" in err and "`moebench compare RUN --axis FIELD=A:B`" in err
    code, _, err = _compare(capsys, good, good, good, "--axis", "reduction=finalize:experts")
    assert code == 2 and "takes two runs" in err
    with pytest.raises(SystemExit) as e:  # argparse: an unknown option
        cli.main(["compare", good, good, "--colour"])
    assert e.value.code == 2


def test_a_comparison_report_builds_each_sides_rows_once(tmp_path, monkeypatch):
    """The pairs' flags, the latency table's and the flags' counts share one build of each side's
    rows (report/flags.py side_rows renames every pair's columns: a report built them six times)."""
    from moebench.report import flags
    from moebench.report.document import build_report

    calls, real = [], flags.side_rows

    def counted(matched, side):
        calls.append(side)
        return real(matched, side)

    monkeypatch.setattr(flags, "side_rows", counted)
    base, cand = _runs(tmp_path, make_rows(seed=0), make_rows(scale=1.10, seed=1))
    report = build_report(cand, tmp_path / "r", base)
    assert "flags" in report.path.read_text()  # the pairs' table with its flags column
    assert sorted(calls) == ["base", "cand"]


def test_a_change_near_the_threshold_prints_the_decimal_that_keeps_it_on_its_side():
    """A ratio of 1.0496 under ×1.05 read '+5.0 % [+4.9, +5.0]' beside 'significant but under ×1.05';
    near a bound a figure takes the decimals that tell it from the bound, elsewhere one."""
    from moebench.report.fmt import fmt_change

    bounds = (1.05, 1 / 1.05)
    assert fmt_change(1.0496, 1.0494, 1.0499) == "+5.0 % [+4.9, +5.0]"  # without bounds, as before
    assert fmt_change(1.0496, 1.0494, 1.0499, bounds) == "+4.96 % [+4.94, +4.99]"
    assert fmt_change(0.952, bounds=bounds) == "\u22124.80 %"  # 1/1.05 is −4.76 %
    assert fmt_change(1.04999, bounds=bounds) == "+4.999 %"
    assert fmt_change(1.049999, bounds=bounds) == "+5.000 %"  # at most three decimals
    assert fmt_change(1.05, bounds=bounds) == "+5.0 %"  # the bound itself
    assert fmt_change(1.10, 1.09, 1.11, bounds) == "+10.0 % [+9.0, +11.0]"
    rng = np.random.default_rng(0)

    def rows(scale):
        return pd.DataFrame(
            [
                make_row(
                    "local",
                    "torch",
                    "experts",
                    "none",
                    "bf16",
                    t,
                    samples_us=100 * scale * np.exp(rng.normal(0, 5e-4, 20)),
                )
                for t in (16, 64, 256)
            ]
        )

    cmp = compare_runs(rows(1.0), rows(1.0496))
    lines = verdict_lines(cmp, *exit_status(cmp))
    under = next(x for x in lines if x.startswith("- significant but under ×1.05: "))
    assert "+5.0 %" not in under and "+4.9" in under, under


def test_a_run_copied_mid_sweep_from_another_host_compares_as_it_is(tmp_path, capsys):
    """Its `.lock` names a holder on another host, which cannot be checked from here: the comparison
    reads the rows there are and gives its verdict (0 for an identical copy), and says what the lock
    names and that it may be stale, not that the run is "still being written"."""
    base, cand = _runs(tmp_path, make_rows(seed=0), make_rows(seed=0))
    lock = {"pid": 4242, "start": "1", "host": "far-node", "token": "t", "command": "moebench sweep --out c"}
    (tmp_path / "cand" / ".lock").write_text(json.dumps({**lock, "since": "2024-01-01T00:00:00+00:00"}))
    code, _, err = _compare(capsys, base, cand, "--out", str(tmp_path / "rep"))
    assert code == 0, err
    assert "its lock names pid 4242 on far-node" in err and "the lock is stale" in err, err
    assert "being written" not in err
