"""moebench compare RUN --axis FIELD=A:B: rows of one run paired through the spec."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from moebench import cli
from moebench.config.spec import IDENTITY_COLUMNS, from_row
from moebench.report.axis import compare_axis, parse_axis
from moebench.report.load import load_run
from moebench.results.synthetic import make_row, write_run

ROOT = Path(__file__).resolve().parents[2]
MEMORY_RUN = ROOT / "results" / "weight_reduce_memory"  # deepseek_v3's EP-8 share, both reductions, GPU
DEEPGEMM_RUN = ROOT / "results" / "triton_vs_deepgemm"  # triton (row_layout knob), deepgemm, torch


def _identity(row, drop) -> dict:
    return {c: str(row[c]) for c in IDENTITY_COLUMNS if c not in drop}


def test_reduction_axis_on_a_committed_gpu_run_pairs_exactly_the_rows_that_differ_in_it():
    df, _ = load_run(MEMORY_RUN)
    cmp = compare_axis(df, "reduction=finalize:experts")
    m = cmp.matched
    finalize = df[df["reduction"] == "finalize"]
    experts = df[df["reduction"] == "experts"]
    assert len(m) == len(finalize) == len(experts) == 12
    assert not len(cmp.only_baseline) and not len(cmp.only_candidate)
    by_key = df.set_index(["combo_key", "tokens_per_rank"])
    for _, r in m.iterrows():
        base = by_key.loc[(r["base_combo_key"], r["tokens_per_rank"])]
        cand = by_key.loc[(r["cand_combo_key"], r["tokens_per_rank"])]
        assert base["reduction"] == "finalize" and cand["reduction"] == "experts"
        assert _identity(base, {"reduction", "timing_mode"}) == _identity(cand, {"reduction", "timing_mode"})
        assert from_row(base.to_dict()).replace(reduction="experts").key == from_row(cand.to_dict()).key
    assert set(m["reduction"]) == {"finalize→experts"}
    assert (m["mem_verdict"] == "smaller").all()  # the experts reduce in place: no per-(token, k) rows


def test_experts_axis_drops_the_swapped_entries_knobs():
    df, _ = load_run(DEEPGEMM_RUN)
    cmp = compare_axis(df, "experts=triton:deepgemm")
    m = cmp.matched
    triton, deepgemm = df[df["experts"] == "triton"], df[df["experts"] == "deepgemm"]
    assert dict(from_row(triton.iloc[0].to_dict()).knobs).get("row_layout") == "auto"  # a knob deepgemm lacks
    assert len(m) == len(triton) == len(deepgemm) == 15
    assert set(zip(m["model"], m["tokens_per_rank"], strict=True)) == set(
        zip(triton["model"], triton["tokens_per_rank"], strict=True)
    )
    assert set(m["experts"]) == {"triton→deepgemm"}
    assert "torch" not in set(m["base_combo_key"].map(dict(zip(df["combo_key"], df["experts"], strict=True))))


def _row(experts, tokens=64, scale=1.0, **kw):
    samples = 100.0 * scale * np.exp(np.random.default_rng(tokens).normal(0, 0.01, 30))
    return make_row("local", experts, "experts", "none", "fp8_block", tokens, samples_us=samples, **kw)


def test_knob_axis_and_entries_whose_knobs_differ(tmp_path, capsys):
    rows = pd.DataFrame(
        [
            _row("triton", knobs_set={"row_layout": "gathered"}),
            _row("triton", scale=0.8, knobs_set={"row_layout": "contiguous"}),
            _row("triton", scale=0.9, knobs_set={"row_layout": "contiguous"}, seed=1),  # another seed: no partner
            _row("deepgemm", scale=0.7),
            _row("torch", scale=2.0),
        ]
    )
    df, _ = load_run(write_run(tmp_path / "run", rows))
    layout = compare_axis(df, "row_layout=gathered:contiguous")
    assert len(layout.matched) == 1 and layout.matched["verdict"].iloc[0] == "faster"
    assert len(layout.only_candidate) == 1  # the seed=1 row
    # triton -> deepgemm: row_layout is triton's knob, dropped, so both seed-0 triton rows meet the deepgemm row
    swap = compare_axis(df, "experts=triton:deepgemm")
    assert len(swap.matched) == 2 and swap.matched["cand_combo_key"].nunique() == 1
    assert sorted(swap.matched["knobs"]) == ["contiguous→-", "gathered→-"]  # each pair says which triton row
    assert len(swap.only_baseline) == 1  # the seed=1 triton row
    code = cli.main(
        ["compare", str(tmp_path / "run"), "--axis", "experts=triton:deepgemm", "--out", str(tmp_path / "r")]
    )
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("**Verdict (experts=deepgemm vs experts=triton): 2 faster")
    assert (tmp_path / "r" / "report.md").read_text().startswith("# moebench compare: run, experts triton → deepgemm")


def test_parse_axis_types_its_values():
    ax = parse_axis("num_sms=16:24")
    assert (ax.field, ax.a, ax.b) == ("num_sms", "16", "24")
    with pytest.raises(ValueError, match="FIELD=A:B"):
        parse_axis("reduction")
    with pytest.raises(ValueError, match="same value"):
        parse_axis("reduction=experts:experts")


def test_a_combination_that_can_never_run_that_way_gets_no_verdict():
    """compare --axis reduction=finalize:experts on a run with a batched backend: its rows are
    ok with finalize and skipped by a rule of the plan with experts (a batched backend weights
    and reduces in its combine). They are 'cannot run', out of the verdict's bullets and its
    count, and counted in one line; a skip the machine caused (a library missing) stays
    'skipped'."""
    from moebench.report.axis import compare_axis
    from moebench.report.verdict import exit_status, verdict_lines
    from moebench.results.synthetic import make_row

    rule = "batched backend=local_batched weights and reduces in its combine: only reduction=finalize"
    rows = [
        make_row("local_batched", "torch_batched", "finalize", "none", "bf16", 64, samples_us=[100.0] * 10),
        make_row("local_batched", "torch_batched", "experts", "none", "bf16", 64, status="skipped", reason=rule),
        make_row("local", "deepgemm", "finalize", "none", "fp8_block", 64, samples_us=[90.0] * 10),
        make_row(
            "local",
            "deepgemm",
            "experts",
            "none",
            "fp8_block",
            64,
            status="skipped",
            reason="deep_gemm is not installed",
        ),  # fmt: skip
    ]
    df = pd.DataFrame(rows)
    cmp = compare_axis(df, "reduction=finalize:experts")
    verdicts = dict(zip(cmp.matched["experts"], cmp.matched["verdict"].astype(str), strict=True))
    assert verdicts == {"torch_batched": "cannot run", "deepgemm": "skipped"}
    code, why = exit_status(cmp)
    lines = verdict_lines(cmp, code, why)
    assert lines[0].startswith("**No comparable rows (reduction=experts vs reduction=finalize): 1 skipped**")
    assert not any("torch_batched" in x and x.startswith("- **skipped**") for x in lines)
    assert any(x.startswith("- no verdict, cannot run: 1 row ") and rule in x for x in lines)


def test_cannot_run_is_a_rule_of_the_plan_not_a_reason_this_machine_shares(monkeypatch):
    """never_runs asks config/validity.py's check for Skip.rule: a row skipped by an entry's own
    Rule (the DeepGEMM experts with bf16) is 'cannot run'; one skipped because its machine lacked
    DeepGEMM stays 'skipped', even where the machine comparing lacks it too and gives the very same
    reason (no verdict must not rest on what one machine lacks)."""
    from moebench.config.validity import validate
    from moebench.kernels.experts import _deep_gemm
    from moebench.report.compare import never_runs

    monkeypatch.setattr(_deep_gemm, "load", lambda: (None, "deep_gemm not installed: how to install it"))
    rows = []
    for quant in ("bf16", "fp8_block"):
        rows.append(make_row("local", "deepgemm", "finalize", "none", quant, 64, samples_us=[90.0] * 10))
        skipped = make_row("local", "deepgemm", "experts", "none", quant, 64, status="skipped")
        rows.append({**skipped, "reason": validate(from_row(skipped))})  # the reason this machine gives too
    rule, machine = rows[1], rows[3]
    assert "need quant=fp8_block" in rule["reason"] and "deep_gemm not installed" in machine["reason"]
    assert never_runs(rule) and not never_runs(machine)
    assert not never_runs({**rule, "reason": "another build's words"})  # the row's own reason must be the rule
    cmp = compare_axis(pd.DataFrame(rows), "reduction=finalize:experts")
    verdicts = dict(zip(cmp.matched["quant"], cmp.matched["verdict"].astype(str), strict=True))
    assert verdicts == {"bf16": "cannot run", "fp8_block": "skipped"}
